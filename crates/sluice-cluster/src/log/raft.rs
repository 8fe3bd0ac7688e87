//! openraft's log storage traits over `LogStore`.

use super::*;

/// Most bytes of values one replication message carries (at least one
/// entry always goes): openraft times an AppendEntries out after one
/// heartbeat interval, so a batch of large values must stay small.
const PAYLOAD_BYTES: u64 = 1 << 20;

pub(super) fn approx_size(e: &Entry) -> u64 {
    fn of(c: &crate::types::Command) -> u64 {
        match c {
            crate::types::Command::Write { key, value, .. } => {
                (key.len() + value.as_ref().map_or(0, |v| v.len()) + 64) as u64
            }
            crate::types::Command::Batch(ws) => ws
                .iter()
                .map(|w| (w.key.len() + w.value.as_ref().map_or(0, |v| v.len()) + 64) as u64)
                .sum(),
            _ => 256,
        }
    }
    match &e.payload {
        openraft::EntryPayload::Normal(c) => of(c),
        _ => 256,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let g = self.inner.lock();
        let mut out = Vec::new();
        for i in g.index.range(range).map(|(i, _)| *i) {
            out.extend(g.entry(i)?);
        }
        Ok(out)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.inner.lock().entries_upto(start, end, PAYLOAD_BYTES)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.inner.lock().vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let g = self.inner.lock();
        let last = g
            .index
            .values()
            .next_back()
            .map(|h| h.log_id)
            .or(g.last_purged);
        Ok(LogState {
            last_purged_log_id: g.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.inner.lock().record(Record::Vote(*vote))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Never fsync'd: a lost commit point is recomputed from the leader;
        // it only speeds up a restart.
        self.inner.lock().write_committed(committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.inner.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let recs: Vec<Record> = entries.into_iter().map(Record::Entry).collect();
        let marked = crate::marks::on().then(|| {
            recs.iter()
                .filter_map(Record::entry_index)
                .collect::<Vec<_>>()
        });
        let mut callback = Some(callback);
        let res = {
            let mut g = self.inner.lock();
            // A synced log completes the callback from its writer thread.
            let done = match g.writer {
                Some(_) => callback.take().map(Done::Flushed),
                None => None,
            };
            g.append_records(recs, done)
        };
        match res {
            Ok(()) => {
                if let Some(ix) = marked {
                    crate::marks::mark_all(sluice_types::marks::Point::LogAppend, 0, ix, 0);
                }
                if let Some(cb) = callback {
                    cb.io_completed(Ok(()));
                }
                Ok(())
            }
            Err(e) => {
                if let Some(cb) = callback {
                    cb.io_completed(Err(std::io::Error::other(e.to_string())));
                }
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), StorageError> {
        // Keeps `last` and everything before it.
        let from = last.map_or(0, |id| id.index + 1);
        self.inner.lock().truncate_from(from)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let floor = self
            .snapshot_floor
            .load(std::sync::atomic::Ordering::Acquire);
        let mut g = self.inner.lock();
        // Past the saved snapshot, only up to it: the rest goes with a
        // later purge (openraft reads nothing at or below what it asked
        // to purge, so holding it longer changes nothing but memory).
        let upto = if log_id.index < floor {
            Some(log_id)
        } else {
            floor
                .checked_sub(1)
                .and_then(|i| g.index.get(&i))
                .map(|h| h.log_id)
        };
        match upto {
            Some(id) if g.last_purged.is_none_or(|p| p.index < id.index) => {
                if id != log_id {
                    tracing::debug!(
                        asked = log_id.index,
                        upto = id.index,
                        "purge held back to the saved snapshot"
                    );
                }
                g.record(Record::Purge(id))?;
                g.drop_purged_segments();
            }
            _ => {}
        }
        Ok(())
    }
}
