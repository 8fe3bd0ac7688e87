//! The log as the raft-rs driver (`crate::raftrs`) uses it, called
//! directly from the group's task. Terms and indexes are raft-rs's; an entry's leader
//! id carries its term (the node id in it is 0: raft-rs entries record
//! only the term), and the vote record holds raft-rs's hard state
//! (`Vote::new(term, voted_for)`, raft-rs ids, 0 for none).

use super::*;

/// What `LogStore::bounds` reports: raft-rs's first and last index (an
/// empty log is `first = last + 1`), and the id of the last purged entry
/// (what a snapshot covers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) first: u64,
    pub(crate) last: u64,
    pub(crate) purged: Option<LogId>,
}

/// An entry as `LogStore::heads_in` gives it.
#[derive(Clone, Debug)]
pub(crate) enum Head {
    /// A data entry or a blank: its id and kind (values not read).
    Id(LogId, Kind),
    /// A membership entry, whole.
    Whole(Entry),
}

impl LogStore {
    /// The log's first and last index and its purge point.
    pub(crate) fn bounds(&self) -> Bounds {
        let g = self.inner.lock();
        let purged_to = g.last_purged.map_or(0, |p| p.index);
        let last = g.index.keys().next_back().copied().unwrap_or(purged_to);
        Bounds {
            first: purged_to + 1,
            last,
            purged: g.last_purged,
        }
    }

    /// A snapshot up to `id` was installed: every entry goes (those
    /// after it too: the leader's log from there on replaces them), and
    /// the log starts after `id`.
    pub(crate) fn reset_to_snapshot(&self, id: LogId) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        if g.index
            .keys()
            .next_back()
            .is_some_and(|&last| last > id.index)
        {
            g.truncate_from(id.index + 1)?;
        }
        g.record(Record::Purge(id))?;
        g.drop_purged_segments();
        Ok(())
    }

    /// The id of entry `i`, if the log holds it (or purged exactly up to it).
    pub(crate) fn log_id_at(&self, i: u64) -> Option<LogId> {
        let g = self.inner.lock();
        g.index
            .get(&i)
            .map(|h| h.log_id)
            .or(g.last_purged.filter(|p| p.index == i))
    }

    /// The heads of entries `lo..hi` (as many as `entries_in` would
    /// give): a data entry's or a blank's id and kind from the index, so
    /// raft-rs's own reads of its log (for the entries it commits, and
    /// for what it checks) never read or copy values back from a segment
    /// (a 1 MB entry past the in-memory tail was read whole, then
    /// dropped but for its term); a membership entry whole.
    pub(crate) fn heads_in(
        &self,
        lo: u64,
        hi: u64,
        max_bytes: u64,
    ) -> Result<Vec<Head>, StorageError> {
        let g = self.inner.lock();
        let mut out = Vec::new();
        for (i, h) in g.held_upto(lo, hi, max_bytes) {
            out.push(match h.kind {
                Kind::Membership => match g.entry(i)? {
                    Some(e) => Head::Whole(e),
                    None => break,
                },
                kind => Head::Id(h.log_id, kind),
            });
        }
        Ok(out)
    }

    /// Entries up to `index` are done with (applied, and a leader's on
    /// every live follower): the in-memory tail may let them go; those
    /// after it it keeps (up to `MEM_NEEDED_BYTES`).
    pub(crate) fn set_needed_after(&self, index: u64) {
        let mut g = self.inner.lock();
        if g.needed_after != Some(index) {
            g.needed_after = Some(index);
            g.trim_memory();
        }
    }

    /// Entries `lo..hi`, stopping once their values pass `max_bytes`
    /// (at least one entry is always returned).
    pub(crate) fn entries_in(
        &self,
        lo: u64,
        hi: u64,
        max_bytes: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.inner.lock().entries_upto(lo, hi, max_bytes)
    }

    /// Appends `entries` (consecutive), first removing whatever the log
    /// holds at and after the first of them (a suffix a new leader
    /// overwrote). Durable when it returns, per the log's sync policy.
    pub(crate) fn append_now(&self, entries: Vec<Entry>) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        if g.writer.is_none() {
            return g.append_entries(entries, None);
        }
        // Queued for the writer, then waited for without the lock.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        g.append_entries(entries, Some(Done::Wait(tx)))?;
        drop(g);
        super::disk::wait_durable(rx)
    }

    /// The most bytes of entries one append took.
    #[cfg(test)]
    pub(crate) fn largest_append(&self) -> u64 {
        self.inner.lock().largest_append
    }

    /// Whether appends are fsync'd by the writer thread (a synced log):
    /// then `append_then` reports durability later.
    pub(crate) fn is_synced(&self) -> bool {
        self.inner.lock().writer.is_some()
    }

    /// `append_now` for a synced log without waiting for the disk: the
    /// entries are readable at once, and `done` is called from the writer
    /// thread once they are durable (or with why not). Any other log
    /// writes them here and calls `done` before returning.
    pub(crate) fn append_then(
        &self,
        entries: Vec<Entry>,
        done: Box<dyn FnOnce(Result<(), String>) + Send>,
    ) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        if g.writer.is_some() {
            return g.append_entries(entries, Some(Done::Notify(done)));
        }
        let r = g.append_entries(entries, None);
        drop(g);
        done(r.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        r
    }

    /// Records raft-rs's term and vote (durable when it returns).
    pub(crate) fn save_hard_state(&self, term: u64, vote: u64) -> Result<(), StorageError> {
        let v = Vote::new(term, vote);
        let mut g = self.inner.lock();
        if g.vote != Some(v) {
            g.record(Record::Vote(v))?;
        }
        Ok(())
    }

    /// The saved term and vote: (0, 0) for a new log.
    pub(crate) fn hard_state(&self) -> (u64, u64) {
        self.inner
            .lock()
            .vote
            .map_or((0, 0), |v| (v.leader_id.term, v.leader_id.node_id))
    }

    /// Records the commit index (never fsync'd: a lost
    /// commit point is learnt again from the leader).
    pub(crate) fn save_commit(&self, index: u64) -> Result<(), StorageError> {
        let Some(id) = self.log_id_at(index) else {
            return Ok(());
        };
        let mut g = self.inner.lock();
        if g.committed.is_some_and(|c| c.index >= index) {
            return Ok(());
        }
        g.write_committed(Some(id))
    }

    /// The recorded commit index (0: none).
    pub(crate) fn commit_index(&self) -> u64 {
        self.inner.lock().committed.map_or(0, |c| c.index)
    }
}

impl Inner {
    /// Appends consecutive entries after removing whatever the log holds
    /// at and after the first of them; a synced log's writer completes
    /// `done` (with nothing to append, it completes at once).
    fn append_entries(
        &mut self,
        entries: Vec<Entry>,
        done: Option<Done>,
    ) -> Result<(), StorageError> {
        let Some(first) = entries.first().map(|e| e.log_id.index) else {
            if let Some(d) = done {
                d.complete(&Ok(()));
            }
            return Ok(());
        };
        #[cfg(test)]
        {
            let bytes = entries.iter().map(approx_size).sum::<u64>();
            self.largest_append = self.largest_append.max(bytes);
        }
        if self.index.range(first..).next().is_some() {
            self.truncate_from(first)?;
        }
        self.append_records(entries.into_iter().map(Record::Entry).collect(), done)
    }
}
