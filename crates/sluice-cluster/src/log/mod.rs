//! The consensus log of one group: every change appended to segment
//! files (`seg-<n>.log`) so a restarted node comes back with its vote,
//! its log and its commit point; the newest entries (up to
//! `MEM_TAIL_BYTES`, and up to `MEM_NEEDED_BYTES` of those a raft-rs
//! member still needs: not applied, or not on every live follower) also
//! kept in memory, where replication and apply find them. Older entries
//! are read back from their segment when asked for (a follower catching
//! up: one copy of the record, its values slices of it); raft-rs's own
//! reads take heads from the index and read nothing. Keeping the tail
//! short matters for large values: a follower's entries are slices of
//! the frames they arrived in, and holding hundreds of megabytes of
//! frames until the next snapshot made every new frame land on freshly
//! faulted pages.
//!
//! Format: records `len: u32 | crc32c: u32 | bincode(Record)`. A torn
//! tail of the newest segment (a crash mid-append) is cut off at the last
//! good record on open; in a synced log only what an unfinished append
//! leaves counts as torn (`sluice_log::is_torn_tail`), and a damaged
//! complete record refuses the open like a bad record in an older segment,
//! naming the file and offset. Truncations and purges are
//! records too. A segment rolls over at `SEGMENT_BYTES` and starts with
//! the current vote, commit point and purge point, so a segment whose
//! entries are all purged (covered by a snapshot) is simply deleted.
//!
//! Durability: with `sync = true` every append is fsync'd before the
//! driver is told it is durable (a vote or an entry then survives power
//! loss); such a log's files are written only by its writer thread, which
//! writes what was queued, fsyncs once for all of it and then tells the
//! driver (the
//! leader sends an entry to followers while its own copy is being
//! written; appends arriving meanwhile share one fsync);
//! with `sync = false` records reach the OS page cache only, which survives
//! the process being killed but not the machine losing power. Volatile
//! shards use `false`, in a RAM-backed directory (see `ClusterSettings`),
//! and map their segments (`LogOptions::mapped`): an append is then a
//! copy into pages the file already has. A segment's mapping lives as
//! long as its file, recycled files included, so once a group has cycled
//! through its files appends take no page faults. A roll maps the next
//! segment only if a spare is ready (prepared on a thread of its own from
//! half a segment on); else that segment is written with `write(2)` (a `write(2)` into tmpfs
//! costs about three times a copy into mapped pages, faulting a page in
//! about eight times).
//!
//! Where things are: `format` (records, segment headers, decoding and
//! checking a segment, file names), `disk` (the segment files: appends,
//! rolling over, sealing, purging, mapped spares), `writer` (a synced
//! log's writer thread), `values` (where a persistent shard's values lie
//! in the files), `direct` (what the raft-rs driver, `crate::raftrs`,
//! asks of it); this file holds the
//! in-memory tail, the index of every entry, and opening a log.

mod direct;
mod disk;
mod format;
#[cfg(test)]
mod tests;
mod values;
mod writer;

pub(crate) use direct::Head;
use disk::{preallocate, Disk, Sealed, FREE_SEGMENTS};
use format::*;
pub use format::{scan_segment, segment_files, Scan, Tail, FORMAT_VERSION, SEGMENT_HEADER};
pub use values::{read_value, MIN_REF};
use writer::{writer, Done, IoJob};

use crate::chunks::{entry_values, io_slices, write_all_vectored, ChunkWriter, Part, BY_REFERENCE};
use crate::types::{Entry, LogId, StorageError, Vote};
use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A segment rolls over past this size.
const SEGMENT_BYTES: u64 = 32 << 20;

/// How a log keeps its files.
#[derive(Clone, Debug, Default)]
pub struct LogOptions {
    /// fsync every append before it counts (persistent shards).
    pub sync: bool,
    /// Set purged segments aside (`kept-<n>.log`) instead of deleting or
    /// reusing them: a persistent shard's history refers to them.
    pub keep: bool,
    /// Write the segments through shared mappings (volatile shards, whose
    /// log lives in tmpfs). Ignored with `sync` or `keep`.
    pub mapped: bool,
    /// Faults a synced log's writer injects (tests): `fail_sync` fails
    /// its fsyncs, `space_left` its writes with ENOSPC (the seam
    /// `sluice-log`'s `FaultFs` gives the history).
    pub faults: Option<Arc<std::sync::Mutex<sluice_log::Faults>>>,
}

/// Bytes of the newest entries kept in memory (at least one entry)...
const MEM_TAIL_BYTES: u64 = 16 << 20;
/// ... and, of entries still needed (`LogStore::set_needed_after`: not
/// yet applied, or a leader's not yet on every live follower), up to
/// this many: apply and replication read them next, and an entry the
/// tail let go is read back and copied from its segment (16 puts of 1 MB
/// in flight fill the tail above; a leader that read each 1 MB entry
/// back for a follower a little behind fell further behind with every
/// read, and 16-client 1 MB puts stalled for seconds).
const MEM_NEEDED_BYTES: u64 = 4 * MEM_TAIL_BYTES;

/// What is known of every entry the log holds, in memory or not.
#[derive(Clone, Copy, Debug)]
struct Held {
    log_id: LogId,
    size: u64,
    loc: Option<Loc>,
    kind: Kind,
}

/// An entry's payload, by kind: what raft-rs asks of an entry besides
/// its id (`LogStore::heads_in`), known without reading its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Normal,
    Blank,
    Membership,
}

impl Kind {
    pub(crate) fn of(e: &Entry) -> Kind {
        match e.payload {
            crate::types::EntryPayload::Normal(_) => Kind::Normal,
            crate::types::EntryPayload::Blank => Kind::Blank,
            crate::types::EntryPayload::Membership(_) => Kind::Membership,
        }
    }
}

#[derive(Default)]
struct Inner {
    /// Kept segments punched (`punch_kept`): how many held versions
    /// referred to each then (one is punched again once fewer do).
    punched: std::collections::HashMap<u64, usize>,
    /// The newest entries (all of them when there is no disk).
    entries: BTreeMap<u64, Entry>,
    /// Bytes of `entries`.
    mem_bytes: u64,
    /// Entries after this one are still needed, where the log is told
    /// (`LogStore::set_needed_after`; the raft-rs driver tells it).
    needed_after: Option<u64>,
    /// Every entry the log holds.
    index: BTreeMap<u64, Held>,
    /// Bytes of the entries held (what a snapshot would let go).
    held_bytes: u64,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    disk: Option<Disk>,
    /// Synced logs: the writer thread's queue, and the highest entry index
    /// it has written (entries above it stay in memory).
    writer: Option<(
        std::sync::mpsc::Sender<IoJob>,
        Arc<std::sync::atomic::AtomicU64>,
    )>,
    /// Reused encode buffer: a large append costs no fresh allocation
    /// (and no page faults).
    scratch: Vec<u8>,
    /// The most bytes of entries one append took (tests).
    #[cfg(test)]
    largest_append: u64,
}

/// One group's log. Clones share the same log (the driver's task and
/// the state machine, which reads values back, hold one each).
#[derive(Clone, Default)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
}

fn io_err(e: impl std::fmt::Display) -> StorageError {
    std::io::Error::other(format!("writing the consensus log: {e}"))
}

impl Inner {
    /// Applies a record to the in-memory state; `loc` is where it was
    /// written (None without a disk).
    fn apply(&mut self, rec: Record, loc: Option<Loc>) {
        match rec {
            Record::Entry(e) => {
                let size = approx_size(&e);
                let i = e.log_id.index;
                let held = Held {
                    log_id: e.log_id,
                    size,
                    loc,
                    kind: Kind::of(&e),
                };
                self.held_bytes += size;
                if let Some(old) = self.index.insert(i, held) {
                    self.held_bytes = self.held_bytes.saturating_sub(old.size);
                }
                self.mem_bytes += size;
                if let Some(old) = self.entries.insert(i, e) {
                    self.mem_bytes = self.mem_bytes.saturating_sub(approx_size(&old));
                }
                self.trim_memory();
            }
            Record::Vote(v) => self.vote = Some(v),
            Record::Committed(c) => self.committed = c,
            Record::Seal => {}
            Record::Truncate(i) => {
                let (index, entries) = (self.index.split_off(&i), self.entries.split_off(&i));
                self.forget(index, entries);
            }
            Record::Purge(id) => {
                let index = self.index.split_off(&(id.index + 1));
                let entries = self.entries.split_off(&(id.index + 1));
                let gone_index = std::mem::replace(&mut self.index, index);
                let gone_entries = std::mem::replace(&mut self.entries, entries);
                self.forget(gone_index, gone_entries);
                self.last_purged = Some(id);
            }
        }
    }

    fn forget(&mut self, index: BTreeMap<u64, Held>, entries: BTreeMap<u64, Entry>) {
        for h in index.values() {
            self.held_bytes = self.held_bytes.saturating_sub(h.size);
        }
        for e in entries.values() {
            self.mem_bytes = self.mem_bytes.saturating_sub(approx_size(e));
        }
    }

    /// Lets the oldest in-memory entries go (they stay on disk) while the
    /// tail is over its budget.
    fn trim_memory(&mut self) {
        while self.mem_bytes > MEM_TAIL_BYTES && self.entries.len() > 1 {
            let Some((&i, _)) = self.entries.first_key_value() else {
                break;
            };
            if self.needed_after.is_some_and(|a| i > a) && self.mem_bytes <= MEM_NEEDED_BYTES {
                break; // still needed: read next
            }
            if self.index.get(&i).and_then(|h| h.loc).is_none() {
                break; // no disk copy: keep it
            }
            if let Some((_, w)) = &self.writer {
                if i > w.load(std::sync::atomic::Ordering::Acquire) {
                    break; // queued for the writer thread, not written yet
                }
            }
            if let Some(e) = self.entries.remove(&i) {
                self.mem_bytes = self.mem_bytes.saturating_sub(approx_size(&e));
            }
        }
    }

    /// Persists records (`persist_with`: a synced log's writer completes
    /// `done`), then applies them with where each went.
    fn append_records(
        &mut self,
        recs: Vec<Record>,
        done: Option<Done>,
    ) -> Result<(), StorageError> {
        let mut locs = self.persist_with(&recs, done)?.into_iter();
        for rec in recs {
            let loc = locs.next();
            self.apply(rec, loc);
        }
        Ok(())
    }

    /// What the index holds of entries `start..end`, stopping once their
    /// values pass `max_bytes` (at least one entry goes).
    fn held_upto(
        &self,
        start: u64,
        end: u64,
        max_bytes: u64,
    ) -> impl Iterator<Item = (u64, &Held)> + '_ {
        let (mut bytes, mut first) = (0u64, true);
        self.index
            .range(start..end)
            .take_while(move |(_, h)| {
                bytes = bytes.saturating_add(h.size);
                let go = first || bytes <= max_bytes;
                first = false;
                go
            })
            .map(|(i, h)| (*i, h))
    }

    /// Entries `start..end`, stopping once their values pass `max_bytes`
    /// (at least one entry goes).
    fn entries_upto(
        &self,
        start: u64,
        end: u64,
        max_bytes: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        let mut out = Vec::new();
        for (i, _) in self.held_upto(start, end, max_bytes) {
            out.extend(self.entry(i)?);
        }
        Ok(out)
    }

    /// Entry `i`, from memory or read back from disk.
    fn entry(&self, i: u64) -> Result<Option<Entry>, StorageError> {
        if let Some(e) = self.entries.get(&i) {
            return Ok(Some(e.clone()));
        }
        match (self.index.get(&i).and_then(|h| h.loc), &self.disk) {
            (Some(loc), Some(d)) => match read_entry(&d.dir, loc)? {
                // Never hand out another entry than the one asked for.
                e if e.log_id.index == i => Ok(Some(e)),
                e => Err(io_err(std::io::Error::other(format!(
                    "the consensus log holds entry {} where entry {i} was written (segment {}, offset {})",
                    e.log_id.index, loc.seq, loc.offset
                )))),
            },
            _ => Ok(None),
        }
    }
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, replaying its segments.
    pub fn open(dir: &Path, sync: bool) -> std::io::Result<Self> {
        Self::open_with(
            dir,
            LogOptions {
                sync,
                ..LogOptions::default()
            },
        )
    }

    /// Deletes kept segments below `min` (all of them for `None`): what a
    /// persistent shard's history no longer refers to (versions dropped
    /// by retention). Returns (files, bytes) deleted.
    pub fn drop_kept_below(&self, min: Option<u64>) -> std::io::Result<(usize, u64)> {
        let dir = match &self.inner.lock().disk {
            Some(d) if d.keep => d.dir.clone(),
            _ => return Ok((0, 0)),
        };
        let (mut files, mut bytes) = (0, 0);
        let mut kept = numbered(&dir, "kept-")?;
        kept.extend(numbered(&dir, "values-")?);
        for (seq, path) in kept {
            if min.is_none_or(|m| seq < m) {
                bytes += std::fs::metadata(&path).map_or(0, |m| m.len());
                std::fs::remove_file(&path)?;
                files += 1;
            }
        }
        Ok((files, bytes))
    }

    /// `open`, with the options of `opts` (see `LogOptions`).
    pub fn open_with(dir: &Path, opts: LogOptions) -> std::io::Result<Self> {
        let LogOptions {
            sync, keep, faults, ..
        } = opts.clone();
        let mapped = opts.mapped && !sync && !keep;
        std::fs::create_dir_all(dir)?;
        let mut seqs: Vec<u64> = numbered(dir, "seg-")?.into_iter().map(|(s, _)| s).collect();
        let mut free: Vec<(PathBuf, Option<memmap2::MmapMut>)> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("free-"))
            })
            .map(|p| (p, None))
            .collect();
        if sync {
            // Spares of a log that was not synced before (the metadata
            // group's, until 2026-12-07): a synced log recycles nothing
            // (`drop_purged_segments`).
            for (p, _) in free.drain(..) {
                std::fs::remove_file(&p)?;
            }
        }
        let mut inner = Inner::default();
        // A newest segment without a single valid record is a roll that
        // did not finish (its head, which always holds the commit point,
        // was never written): it goes, and the one before is the newest
        // again (its tail past the last record is then cut below).
        while seqs.len() > 1 {
            let path = seg_path(dir, seqs[seqs.len() - 1]);
            let mut data = Vec::new();
            File::open(&path)?.read_to_end(&mut data)?;
            if !decode_all(&data, seqs[seqs.len() - 1])
                .map_err(|e| named(&path, e))?
                .0
                .is_empty()
            {
                break;
            }
            tracing::debug!(file = %path.display(), "consensus log: removing a segment left by an unfinished roll");
            std::fs::remove_file(&path)?;
            seqs.pop();
        }
        let mut sealed = Vec::new();
        let (mut seq, mut bytes, mut max_index) = (0u64, 0u64, 0u64);
        for (i, s) in seqs.iter().enumerate() {
            let path = seg_path(dir, *s);
            let mut data = Vec::new();
            File::open(&path)?.read_to_end(&mut data)?;
            let last = i + 1 == seqs.len();
            let Scan { recs, good, tail } = scan_segment(&data, *s, sync, last, &path)?;
            match tail {
                Tail::Clean => {}
                Tail::Corrupt(reason) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "consensus log {} is corrupt at offset {good} ({reason}); refusing to start: this member is to be repaired from its peers",
                            path.display()
                        ),
                    ))
                }
                Tail::Cut => {
                    if sync {
                        keep_torn_evidence(&path, good, &data[good..])?;
                    }
                    // A record cut by a crash, or stale bytes of a recycled file.
                    tracing::debug!(
                        file = %path.display(),
                        kept = good,
                        dropped = data.len() - good,
                        "consensus log: cut after the last valid record"
                    );
                    OpenOptions::new()
                        .write(true)
                        .open(&path)?
                        .set_len(good as u64)?;
                }
            }
            let mut seg_max = 0;
            for (rec, loc) in recs {
                if let Record::Entry(e) = &rec {
                    seg_max = seg_max.max(e.log_id.index);
                }
                inner.apply(rec, Some(loc));
            }
            if last {
                (seq, bytes, max_index) = (*s, good as u64, seg_max);
            } else {
                sealed.push(Sealed {
                    seq: *s,
                    max_index: seg_max,
                    map: None,
                });
            }
        }
        if seqs.is_empty() {
            seq = 1;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false) // cut to its valid length above
            .read(true)
            .write(true)
            .open(seg_path(dir, seq))?;
        if bytes < SEGMENT_HEADER as u64 {
            use std::os::unix::fs::FileExt;
            file.set_len(0)?;
            file.write_all_at(&segment_header(seq), 0)?;
            file.sync_all()?;
            bytes = SEGMENT_HEADER as u64;
        }
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(bytes))?;
        if sync && file.metadata()?.len() < SEGMENT_BYTES {
            // fdatasync of blocks a file already has needs no journal
            // commit: about half the cost of one that grows the file.
            // Later segments are purged ones, recycled (a persistent
            // group snapshots every `PERSISTENT_SNAPSHOT_BYTES`, so that
            // starts early); zero-filling every new segment in the
            // background doubled the disk writes and hurt tail latency.
            preallocate(&file, SEGMENT_BYTES)?;
        }
        if sync {
            let (tx, rx) = std::sync::mpsc::channel();
            // Everything recovered is on disk already.
            let recovered = inner.index.last_key_value().map_or(0, |(i, _)| *i);
            let written = Arc::new(std::sync::atomic::AtomicU64::new(recovered));
            let w = written.clone();
            std::thread::Builder::new()
                .name("sluice-log-writer".into())
                .spawn({
                    let faults = faults.clone();
                    move || writer(rx, w, faults)
                })?;
            inner.writer = Some((tx, written));
        }
        inner.disk = Some(Disk {
            keep,
            // The segment found here is written with write(2); the next
            // roll maps a spare prepared meanwhile.
            map: None,
            mapped,
            dir: dir.to_path_buf(),
            shared: Arc::new(file.try_clone()?),
            file,
            seq,
            max_index,
            sealed,
            free: Arc::new(Mutex::new(free)),
            spares: FREE_SEGMENTS,
            preparing: Arc::default(),
            sync,
            bytes,
            roll_deferred: 0,
            faults,
        });
        inner.drop_purged_segments();
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    /// Purges everything the saved snapshot `upto` covers, if the log
    /// still holds it (after a snapshot is saved, and at open: a member
    /// that installed a leader's snapshot may hold entries after it with
    /// the ones it never received missing between its purge point and
    /// the snapshot; the purge leaves the log contiguous again).
    pub fn purge_covered(&self, upto: LogId) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        if g.last_purged.is_some_and(|p| p.index >= upto.index) {
            return Ok(());
        }
        g.record(Record::Purge(upto))?;
        g.drop_purged_segments();
        Ok(())
    }

    /// Keeps at most `n` purged segment files for reuse (at least one; at
    /// most `FREE_SEGMENTS`), handing back those beyond it now: a group
    /// whose log stays small needs few, and each is a segment's worth of
    /// disk (of memory, on tmpfs).
    pub fn set_spares(&self, n: usize) {
        let mut g = self.inner.lock();
        if let Some(d) = &mut g.disk {
            d.spares = n.clamp(1, FREE_SEGMENTS);
        }
        g.drop_purged_segments();
    }

    /// How many purged segment files are kept for reuse at most.
    pub fn spare_limit(&self) -> usize {
        self.inner.lock().disk.as_ref().map_or(0, |d| d.spares)
    }

    /// The purged segment files kept for reuse now.
    pub fn spare_count(&self) -> usize {
        self.inner
            .lock()
            .disk
            .as_ref()
            .map_or(0, |d| d.free.lock().len())
    }

    /// How many spare segments a log that grows to `bytes` at most needs:
    /// what one purge lets go, twice over (the log grows on while a
    /// snapshot is built), at least two.
    pub fn spares_for(bytes: u64) -> usize {
        let segments = bytes.saturating_mul(2).div_ceil(SEGMENT_BYTES) as usize;
        segments.clamp(2, FREE_SEGMENTS)
    }

    /// Bytes of entries held in memory (not yet covered by a snapshot).
    pub fn held_bytes(&self) -> u64 {
        self.inner.lock().held_bytes
    }

    /// Bytes of entries held in memory beyond the newest `keep` (what a
    /// snapshot now would let go: the driver keeps `keep` entries after one).
    pub fn bytes_beyond(&self, keep: u64) -> u64 {
        self.bytes_beyond_kept(keep, u64::MAX)
    }

    /// `bytes_beyond`, keeping of the newest `keep` entries only as many
    /// as hold at most `max_bytes` together.
    pub fn bytes_beyond_kept(&self, keep: u64, max_bytes: u64) -> u64 {
        let g = self.inner.lock();
        let newest = kept_bytes(g.index.values().rev(), keep, max_bytes).1;
        g.held_bytes.saturating_sub(newest)
    }

    /// How many entries at and before `upto` a snapshot at `upto` keeps
    /// behind it: of the newest `keep` of them, as many as hold at most
    /// `max_bytes` together.
    pub fn kept_behind(&self, upto: u64, keep: u64, max_bytes: u64) -> u64 {
        let g = self.inner.lock();
        kept_bytes(
            g.index.range(..=upto).map(|(_, h)| h).rev(),
            keep,
            max_bytes,
        )
        .0
    }
}

/// Of `newest_first` (entries, newest first), how many of the first
/// `keep` fit in `max_bytes` together, and their bytes.
fn kept_bytes<'a>(
    newest_first: impl Iterator<Item = &'a Held>,
    keep: u64,
    max_bytes: u64,
) -> (u64, u64) {
    let (mut n, mut bytes) = (0, 0u64);
    for h in newest_first.take(keep as usize) {
        if bytes.saturating_add(h.size) > max_bytes {
            break;
        }
        bytes += h.size;
        n += 1;
    }
    (n, bytes)
}

/// About how much memory an entry holds (what the in-memory tail counts).
fn approx_size(e: &Entry) -> u64 {
    fn of(c: &crate::types::Command) -> u64 {
        match c {
            crate::types::Command::Write { key, value, .. } => {
                (key.len() + value.as_ref().map_or(0, |v| v.len()) + 64) as u64
            }
            c @ (crate::types::Command::Batch(_) | crate::types::Command::Without { .. }) => c
                .batched()
                .iter()
                .map(|w| (w.key.len() + w.value.as_ref().map_or(0, |v| v.len()) + 64) as u64)
                .sum(),
            _ => 256,
        }
    }
    match &e.payload {
        crate::types::EntryPayload::Normal(c) => of(c),
        _ => 256,
    }
}
