//! The consensus log of one group: entries in memory, every change also
//! appended to one file (`raft.log`) so a restarted node comes back with
//! its vote, its log and its commit point.
//!
//! File format: records `len: u32 | crc32c: u32 | bincode(Record)`. A torn
//! or corrupt tail (a crash mid-append) is cut off at the last good record
//! on open. Truncations and purges are records too; when purged records
//! make up most of the file it is rewritten (new file, fsync, rename).
//!
//! Durability: with `sync = true` every append is fsync'd before openraft
//! is told it is flushed (a vote or an entry then survives power loss);
//! with `sync = false` records reach the OS page cache only, which survives
//! the process being killed but not the machine losing power. Volatile
//! shards use `false`: Cascade's volatile pools are in-memory replicated.

use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, RaftLogReader, StorageIOError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const FILE: &str = "raft.log";
/// Rewrite the file once it is this large and mostly purged records.
const REWRITE_BYTES: u64 = 64 << 20;

#[derive(Serialize, Deserialize)]
enum Record {
    Entry(Entry),
    Vote(Vote),
    Committed(Option<LogId>),
    /// Entries at and after this index were removed (a conflicting suffix).
    Truncate(u64),
    /// Entries up to this log id were purged (covered by a snapshot).
    Purge(LogId),
}

struct Disk {
    dir: PathBuf,
    file: File,
    sync: bool,
    bytes: u64,
}

#[derive(Default)]
struct Inner {
    entries: BTreeMap<u64, Entry>,
    /// Encoded size of each entry's record (what a rewrite would keep).
    sizes: BTreeMap<u64, u64>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    disk: Option<Disk>,
}

/// One group's log. Clones share the same log (openraft asks for a
/// separate reader handle).
#[derive(Clone, Default)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
}

fn io_err(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::write_logs(openraft::AnyError::error(e.to_string())).into()
}

fn encode(rec: &Record, buf: &mut Vec<u8>) -> Result<(), StorageError> {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; 8]);
    bincode::serialize_into(&mut *buf, rec).map_err(io_err)?;
    let body = &buf[start + 8..];
    let len = body.len() as u32;
    let crc = crc32c::crc32c(body);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

impl Inner {
    fn apply(&mut self, rec: Record) {
        match rec {
            Record::Entry(e) => {
                self.entries.insert(e.log_id.index, e);
            }
            Record::Vote(v) => self.vote = Some(v),
            Record::Committed(c) => self.committed = c,
            Record::Truncate(i) => {
                self.entries.split_off(&i);
                self.sizes.split_off(&i);
            }
            Record::Purge(id) => {
                self.entries = self.entries.split_off(&(id.index + 1));
                self.sizes = self.sizes.split_off(&(id.index + 1));
                self.last_purged = Some(id);
            }
        }
    }

    /// Appends records to the file (per the sync policy), noting each
    /// entry's record size.
    fn persist(&mut self, recs: &[Record]) -> Result<(), StorageError> {
        let Some(d) = &mut self.disk else {
            return Ok(());
        };
        let mut buf = Vec::new();
        for r in recs {
            let before = buf.len();
            encode(r, &mut buf)?;
            if let Record::Entry(e) = r {
                self.sizes
                    .insert(e.log_id.index, (buf.len() - before) as u64);
            }
        }
        d.file.write_all(&buf).map_err(io_err)?;
        if d.sync {
            d.file.sync_data().map_err(io_err)?;
        }
        d.bytes += buf.len() as u64;
        Ok(())
    }

    /// Rewrites the file with only what is live, once purges left it
    /// mostly dead weight.
    fn maybe_rewrite(&mut self) -> Result<(), StorageError> {
        let Some(d) = &self.disk else { return Ok(()) };
        let live: u64 = self.sizes.values().sum();
        if d.bytes < REWRITE_BYTES || live * 2 > d.bytes {
            return Ok(());
        }
        let mut buf = Vec::new();
        self.sizes.clear();
        if let Some(v) = self.vote {
            encode(&Record::Vote(v), &mut buf)?;
        }
        encode(&Record::Committed(self.committed), &mut buf)?;
        if let Some(p) = self.last_purged {
            encode(&Record::Purge(p), &mut buf)?;
        }
        for e in self.entries.values() {
            let before = buf.len();
            encode(&Record::Entry(e.clone()), &mut buf)?;
            self.sizes
                .insert(e.log_id.index, (buf.len() - before) as u64);
        }
        let tmp = d.dir.join(format!("{FILE}.tmp"));
        let path = d.dir.join(FILE);
        let mut f = File::create(&tmp).map_err(io_err)?;
        f.write_all(&buf).map_err(io_err)?;
        f.sync_all().map_err(io_err)?;
        std::fs::rename(&tmp, &path).map_err(io_err)?;
        if let Ok(dirf) = File::open(&d.dir) {
            let _ = dirf.sync_all();
        }
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_err)?;
        let sync = d.sync;
        let dir = d.dir.clone();
        self.disk = Some(Disk {
            dir,
            file,
            sync,
            bytes: buf.len() as u64,
        });
        Ok(())
    }
}

impl LogStore {
    /// A log that lives in memory only (tests).
    pub fn in_memory() -> Self {
        LogStore::default()
    }

    /// Opens (or creates) the log in `dir`, replaying what is there.
    pub fn open(dir: &Path, sync: bool) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE);
        let mut inner = Inner::default();
        let mut good = 0u64;
        if path.exists() {
            let mut data = Vec::new();
            File::open(&path)?.read_to_end(&mut data)?;
            let mut at = 0usize;
            while at + 8 <= data.len() {
                let len =
                    u32::from_le_bytes(data[at..at + 4].try_into().unwrap_or([0; 4])) as usize;
                let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap_or([0; 4]));
                let Some(body) = data.get(at + 8..at + 8 + len) else {
                    break;
                };
                if crc32c::crc32c(body) != crc {
                    break;
                }
                let Ok(rec) = bincode::deserialize::<Record>(body) else {
                    break;
                };
                if let Record::Entry(e) = &rec {
                    inner.sizes.insert(e.log_id.index, 8 + len as u64);
                }
                inner.apply(rec);
                at += 8 + len;
            }
            good = at as u64;
            if good < data.len() as u64 {
                tracing::warn!(
                    file = %path.display(),
                    kept = good,
                    dropped = data.len() as u64 - good,
                    "consensus log had a torn tail; truncated it"
                );
                OpenOptions::new().write(true).open(&path)?.set_len(good)?;
            }
        }
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        inner.disk = Some(Disk {
            dir: dir.to_path_buf(),
            file,
            sync,
            bytes: good,
        });
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    /// Index of the last entry (0 when empty).
    pub fn last_index(&self) -> u64 {
        let g = self.inner.lock();
        g.entries
            .keys()
            .next_back()
            .copied()
            .or(g.last_purged.map(|p| p.index))
            .unwrap_or(0)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let g = self.inner.lock();
        Ok(g.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let g = self.inner.lock();
        let last = g
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
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
        let mut g = self.inner.lock();
        g.persist(&[Record::Vote(*vote)])?;
        g.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.inner.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        // Not fsync'd even when the log is: a lost commit point is
        // recomputed from the leader; it only speeds up a restart.
        if let Some(d) = &mut g.disk {
            let mut buf = Vec::new();
            encode(&Record::Committed(committed), &mut buf)?;
            d.file.write_all(&buf).map_err(io_err)?;
            d.bytes += buf.len() as u64;
        }
        g.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.inner.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let recs: Vec<Record> = entries.into_iter().map(Record::Entry).collect();
        let res = {
            let mut g = self.inner.lock();
            let r = g.persist(&recs);
            if r.is_ok() {
                for rec in recs {
                    g.apply(rec);
                }
            }
            r
        };
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        g.persist(&[Record::Truncate(log_id.index)])?;
        g.apply(Record::Truncate(log_id.index));
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        g.persist(&[Record::Purge(log_id)])?;
        g.apply(Record::Purge(log_id));
        g.maybe_rewrite()
    }
}
