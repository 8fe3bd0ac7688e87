//! The consensus log of one group: every change appended to segment
//! files (`seg-<n>.log`) so a restarted node comes back with its vote,
//! its log and its commit point; the newest entries (up to
//! `MEM_TAIL_BYTES`) also kept in memory, where replication and apply
//! find them. Older entries are read back from their segment when asked
//! for (a follower catching up). Keeping the tail short matters for
//! large values: a follower's entries are slices of the frames they
//! arrived in, and holding hundreds of megabytes of frames until the next
//! snapshot made every new frame land on freshly faulted pages.
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
//! Durability: with `sync = true` every append is fsync'd before openraft
//! is told it is flushed (a vote or an entry then survives power loss);
//! such a log's files are written only by its writer thread, which writes
//! what was queued, fsyncs once for all of it and then tells openraft (the
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

use crate::chunks::{entry_values, io_slices, write_all_vectored, ChunkWriter, Part, BY_REFERENCE};
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use bytes::Bytes;
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

/// A segment rolls over past this size.
const SEGMENT_BYTES: u64 = 32 << 20;

#[derive(Serialize, Deserialize)]
enum Record {
    Entry(Entry),
    Vote(Vote),
    Committed(Option<LogId>),
    /// Entries at and after this index were removed (a conflicting suffix).
    Truncate(u64),
    /// Entries up to this log id were purged (covered by a snapshot).
    Purge(LogId),
    /// The end of a sealed segment of a mapped log: what follows is stale
    /// (its file is not cut to length, which would drop pages the next
    /// use of the file needs again).
    Seal,
}

/// A sealed segment: its number and the highest entry index it holds.
struct Sealed {
    seq: u64,
    max_index: u64,
    /// Mapped logs: the segment's mapping, kept for when the file is
    /// recycled (beyond the sealed length it must not be touched).
    map: Option<memmap2::MmapMut>,
}

/// A mapped log's segment files are this long while written (a record
/// that does not fit goes through `write(2)` past the mapping).
const MAP_BYTES: u64 = SEGMENT_BYTES + (4 << 20);

/// Reserves `len` bytes of blocks for `file` (extending it). On tmpfs
/// this allocates the pages: a mapped segment's are all there before it
/// is written through its mapping, so a full filesystem is an error from
/// here, never a SIGBUS on a store into the mapping.
fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open file descriptor; no memory is passed.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) } {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Copies `slices` into `map` at `at` (the caller checked they fit).
fn copy_into(map: &mut [u8], mut at: usize, slices: &[std::io::IoSlice<'_>]) {
    for s in slices {
        map[at..at + s.len()].copy_from_slice(s);
        at += s.len();
    }
}

/// Segment files ready for reuse, with their mappings (mapped logs);
/// shared with the thread that prepares one ahead.
type Spares = Arc<Mutex<Vec<(PathBuf, Option<memmap2::MmapMut>)>>>;

/// Makes `path` a segment file of `MAP_BYTES` whose pages all exist
/// (`allocate`) and are mapped (`MAP_POPULATE`): what a fresh file's first appends would
/// otherwise fault in one page at a time, on the put's path.
fn prepare_spare(path: &Path) -> std::io::Result<memmap2::MmapMut> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)?;
    allocate(&f, MAP_BYTES)?;
    // SAFETY: the file is a spare of this log, in a directory only this
    // log uses, and is never shrunk while mapped: as a segment it ends at
    // a seal record (only a log being opened cuts its newest segment, and
    // that one has no mapping).
    unsafe {
        memmap2::MmapOptions::new()
            .len(MAP_BYTES as usize)
            .populate()
            .map_mut(&f)
    }
}

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

/// Checks the injected faults before the writer touches the disk.
fn injected(
    faults: &Option<Arc<std::sync::Mutex<sluice_log::Faults>>>,
    write_bytes: Option<usize>,
) -> std::io::Result<()> {
    let Some(f) = faults else { return Ok(()) };
    let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
    match write_bytes {
        None if f.fail_sync => Err(std::io::Error::other("injected fsync failure")),
        Some(n) => match f.space_left {
            Some(left) if n as u64 > left => Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(left) => {
                f.space_left = Some(left - n as u64);
                Ok(())
            }
            None => Ok(()),
        },
        None => Ok(()),
    }
}

struct Disk {
    dir: PathBuf,
    file: File,
    seq: u64,
    /// Highest entry index written to the active segment.
    max_index: u64,
    sealed: Vec<Sealed>,
    /// Purged segment files kept for reuse: overwriting pages a file
    /// already has is much cheaper than growing a file (page allocation).
    /// Mapped logs keep each file's mapping with it.
    free: Spares,
    /// Mapped logs: a thread is preparing a spare segment.
    preparing: Arc<std::sync::atomic::AtomicBool>,
    sync: bool,
    /// Mapped log: the active segment's mapping (`MAP_BYTES`).
    map: Option<memmap2::MmapMut>,
    mapped: bool,
    /// Purged segments are kept (renamed `kept-<n>.log`): a persistent
    /// shard's history points into them for its values.
    keep: bool,
    /// Synced logs: the handle the writer thread writes and syncs through
    /// (this side never writes a synced log's files itself).
    shared: Arc<File>,
    bytes: u64,
}

/// What completes when a synced write is on disk.
enum Done {
    /// openraft's callback for an append.
    Flushed(LogFlushed<TypeConfig>),
    /// A caller blocked until its record is durable (vote, truncation,
    /// purge).
    Wait(std::sync::mpsc::SyncSender<Result<(), String>>),
}

impl Done {
    fn complete(self, res: &Result<(), String>) {
        match self {
            Done::Flushed(cb) => cb.log_io_completed(res.clone().map_err(std::io::Error::other)),
            Done::Wait(tx) => {
                let _ = tx.send(res.clone());
            }
        }
    }
}

/// Work for a synced log's writer thread, in log order.
enum IoJob {
    /// Records encoded by `encode_parts`: written, then fsync'd.
    Write {
        file: Arc<File>,
        buf: Vec<u8>,
        parts: Vec<Part>,
        /// Highest entry index written to this segment so far.
        max_index: u64,
        done: Option<Done>,
    },
    /// The active segment was sealed at `old_len`; `new` starts with `head`.
    Roll {
        old: Arc<File>,
        old_len: u64,
        new: Arc<File>,
        head: Vec<u8>,
    },
}

/// Extends `file` to `len` bytes of zeros, written (not a sparse hole:
/// the blocks must exist) and synced.
fn preallocate(file: &File, len: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let zeros = vec![0u8; 1 << 20];
    let mut at = file.metadata()?.len();
    while at < len {
        let n = zeros.len().min((len - at) as usize);
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_all()
}

/// The writer thread of a synced log (persistent shards). openraft's
/// `append` only encodes and queues: this thread writes the records, then
/// fsyncs once for everything queued meanwhile (group commit), then tells
/// openraft. So the leader replicates an entry while its own copy is
/// written and synced, and no consensus task ever waits on the disk (a
/// write racing an fsync of the same file can stall for most of it).
fn writer(
    rx: std::sync::mpsc::Receiver<IoJob>,
    written: Arc<std::sync::atomic::AtomicU64>,
    faults: Option<Arc<std::sync::Mutex<sluice_log::Faults>>>,
) {
    // After a failed write or fsync the kernel may have dropped the dirty
    // pages: a later fsync that succeeds proves nothing about them, so
    // nothing written after may be reported durable. Every later job
    // fails with the first error; openraft stops the group on it, and a
    // restart (which re-reads and checks the files) is the way back.
    let mut failed: Option<String> = None;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while let Ok(j) = rx.try_recv() {
            batch.push(j);
        }
        let mut res: Result<(), String> = match &failed {
            Some(e) => Err(format!(
                "the consensus log stopped accepting writes after an I/O error ({e}); restart the node"
            )),
            None => Ok(()),
        };
        let mut dirty: Vec<Arc<File>> = Vec::new();
        let mut max_index = 0;
        let mut dones = Vec::new();
        for job in batch {
            if res.is_err() {
                if let IoJob::Write { done, .. } = job {
                    dones.extend(done);
                }
                continue;
            }
            let (r, file) = match job {
                IoJob::Write {
                    file,
                    buf,
                    parts,
                    max_index: m,
                    done,
                } => {
                    dones.extend(done);
                    max_index = max_index.max(m);
                    let mut slices = io_slices(&buf, &parts);
                    let len = slices.iter().map(|s| s.len()).sum();
                    let r = injected(&faults, Some(len))
                        .and_then(|()| write_all_vectored(&mut &*file, &mut slices));
                    (r, file)
                }
                IoJob::Roll {
                    old,
                    old_len,
                    new,
                    head,
                } => {
                    // A sealed segment ends exactly at its last record (a
                    // recycled file may hold stale bytes beyond it).
                    let r = old.set_len(old_len).and_then(|()| (&*new).write_all(&head));
                    (r, new)
                }
            };
            if !dirty.iter().any(|f| Arc::ptr_eq(f, &file)) {
                dirty.push(file);
            }
            if let Err(e) = r {
                res = Err(format!("writing the consensus log: {e}"));
            }
        }
        if res.is_ok() {
            for f in &dirty {
                if let Err(e) = injected(&faults, None).and_then(|()| f.sync_data()) {
                    res = Err(format!("fsync of the consensus log failed: {e}"));
                    break;
                }
            }
        }
        match &res {
            Ok(()) => {
                written.fetch_max(max_index, std::sync::atomic::Ordering::AcqRel);
            }
            Err(e) => {
                if failed.is_none() {
                    tracing::error!(error = %e, "consensus log I/O failed; this log accepts no more writes until the node restarts");
                    failed = Some(e.clone());
                }
            }
        }
        for d in dones {
            d.complete(&res);
        }
    }
}

/// Purged segment files kept for reuse: enough for what one purge lets go
/// at the default `snapshot_bytes` (256 MiB; the log grows on while the
/// snapshot is built, to about twice that), so a busy group writes into
/// pages its files already have. The files are the group's peak log size,
/// held rather than handed back and allocated again.
const FREE_SEGMENTS: usize = 16;

/// Bytes of the newest entries kept in memory (at least one entry).
const MEM_TAIL_BYTES: u64 = 16 << 20;

/// Where an entry's record lies: segment, offset of its header, body
/// length.
#[derive(Clone, Copy, Debug)]
struct Loc {
    seq: u64,
    offset: u64,
    len: u32,
}

/// What is known of every entry the log holds, in memory or not.
#[derive(Clone, Copy, Debug)]
struct Held {
    log_id: LogId,
    size: u64,
    loc: Option<Loc>,
}

/// The files `<prefix><n>.log` in `dir`, by number.
fn numbered(dir: &Path, prefix: &str) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            let seq = n.strip_prefix(prefix)?.strip_suffix(".log")?.parse().ok()?;
            Some((seq, e.path()))
        })
        .collect();
    out.sort_unstable();
    Ok(out)
}

fn seg_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("seg-{seq:08}.log"))
}

#[derive(Default)]
struct Inner {
    /// The newest entries (all of them when there is no disk).
    entries: BTreeMap<u64, Entry>,
    /// Bytes of `entries`.
    mem_bytes: u64,
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
}

/// One group's log. Clones share the same log (openraft asks for a
/// separate reader handle).
#[derive(Clone, Default)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    /// One past the last log index the state machine's saved snapshot
    /// covers (0: no snapshot saved; `u64::MAX` while no state machine
    /// has said: nothing is kept on disk). A purge never goes past it: openraft 0.9 purges the log
    /// right after it hands a leader's snapshot to the state machine,
    /// before that snapshot is saved, and a crash in between left a log
    /// purged past the snapshot on disk (the restart then panicked).
    snapshot_floor: Arc<std::sync::atomic::AtomicU64>,
}

fn io_err(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::write_logs(openraft::AnyError::error(e.to_string())).into()
}

/// The checksum of a record body, seeded with its segment's number: a
/// stale record left in a recycled segment file never passes as current.
fn checksum(seq: u64, body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&seq.to_le_bytes()), body)
}

/// Appends one record, `len | crc32c | bincode`, to `buf` and `parts`:
/// copied into `buf` except `values` (large values it holds), which are
/// referenced. Returns the body length.
fn encode_parts(
    rec: &Record,
    values: &[Bytes],
    seq: u64,
    buf: &mut Vec<u8>,
    parts: &mut Vec<Part>,
) -> Result<u32, StorageError> {
    // Header placeholder, then the body.
    let start = buf.len();
    let mut w = ChunkWriter::new(buf, values);
    w.buf.extend_from_slice(&[0u8; 8]);
    bincode::serialize_into(&mut w, rec).map_err(io_err)?;
    let rparts = w.finish();
    let mut crc = crc32c::crc32c(&seq.to_le_bytes());
    let mut len = 0usize;
    for p in &rparts {
        let bytes: &[u8] = match p {
            Part::Own(rg) => &buf[rg.start.max(start + 8)..rg.end],
            Part::Ref(v) => v,
        };
        crc = crc32c::crc32c_append(crc, bytes);
        len += bytes.len();
    }
    buf[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    for p in rparts {
        match (parts.last_mut(), p) {
            // Adjacent copies: one slice.
            (Some(Part::Own(prev)), Part::Own(rg)) if prev.end == rg.start => prev.end = rg.end,
            (_, p) => parts.push(p),
        }
    }
    Ok(len as u32)
}

/// Appends one small record (no value referenced) to `buf`.
fn encode(rec: &Record, buf: &mut Vec<u8>, seq: u64) -> Result<(), StorageError> {
    encode_parts(rec, &[], seq, buf, &mut Vec::new()).map(|_| ())
}

/// Every segment starts with this header: `SLUICERL | format version
/// u32 | segment number u64 | crc32c of the preceding 20 bytes u32`, so
/// a file of another format (an older or newer Sluice, or not a log at
/// all) is refused by name instead of being misread.
pub const SEGMENT_HEADER: usize = 24;
const SEGMENT_MAGIC: &[u8; 8] = b"SLUICERL";
/// The record format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

fn segment_header(seq: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c(&h[..20]);
    h[20..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What the start of a segment file holds.
enum Header {
    Good,
    /// Shorter than a header, or zeros: a segment whose creation did not
    /// finish.
    Missing,
    Bad(String),
}

fn check_header(data: &[u8], seq: u64) -> Header {
    let Some(h) = data.get(..SEGMENT_HEADER) else {
        return Header::Missing;
    };
    if h.iter().all(|&b| b == 0) {
        return Header::Missing;
    }
    if &h[..8] != SEGMENT_MAGIC {
        return Header::Bad(
            "no segment header (a log written by Sluice before format version 1, or not a Sluice consensus log)".into(),
        );
    }
    let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if h != segment_header(seq) && crc32c::crc32c(&h[..20]).to_le_bytes() == h[20..] {
        if version != FORMAT_VERSION {
            return Header::Bad(format!(
                "format version {version}; this build reads version {FORMAT_VERSION} (run the Sluice that wrote it, or restore this member from its peers)"
            ));
        }
        return Header::Bad("the header names another segment number".into());
    }
    if h != segment_header(seq) {
        return Header::Bad("the segment header fails its checksum".into());
    }
    Header::Good
}

/// Decodes the records of one segment after its header; returns them
/// with their locations, and the length of the good prefix (`None`: the
/// header is missing).
/// Decoded records with their locations, and where the good prefix ends
/// (`None`: the segment has no header).
type Decoded = (Vec<(Record, Loc)>, Option<usize>);

fn decode_all(data: &[u8], seq: u64) -> std::io::Result<Decoded> {
    match check_header(data, seq) {
        Header::Good => {
            let (recs, good) = decode_records(data, seq, SEGMENT_HEADER);
            Ok((recs, Some(good)))
        }
        Header::Missing => Ok((Vec::new(), None)),
        Header::Bad(reason) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("consensus log segment {seq}: {reason}"),
        )),
    }
}

/// Decodes records from `data[start..]`; returns them with their
/// locations (offsets into `data`), and where the good prefix ends.
fn decode_records(data: &[u8], seq: u64, start: usize) -> (Vec<(Record, Loc)>, usize) {
    let mut out = Vec::new();
    let mut at = start;
    while at + 8 <= data.len() {
        let len = u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize;
        let crc = u32::from_le_bytes([data[at + 4], data[at + 5], data[at + 6], data[at + 7]]);
        let Some(body) = data.get(at + 8..at + 8 + len) else {
            break;
        };
        if checksum(seq, body) != crc {
            break;
        }
        let Ok(rec) = bincode::deserialize::<Record>(body) else {
            break;
        };
        out.push((
            rec,
            Loc {
                seq,
                offset: at as u64,
                len: len as u32,
            },
        ));
        at += 8 + len;
    }
    (out, at)
}

/// Saves the non-zero part of a synced log's torn tail next to its
/// segment (`seg-<n>.log.torn-at-<offset>`) before it is cut.
/// What follows a segment's last good record.
pub enum Tail {
    /// Nothing (or a sealed mapped segment's stale bytes after its seal).
    Clean,
    /// What a crash leaves: cut at open.
    Cut,
    /// Damage: the log refuses to open.
    Corrupt(String),
}

/// One segment checked: its good records, where they end, what follows.
pub struct Scan {
    recs: Vec<(Record, Loc)>,
    pub good: usize,
    pub tail: Tail,
}

impl Scan {
    pub fn records(&self) -> usize {
        self.recs.len()
    }
}

/// Checks a segment (`data`, the whole file) without changing it. Only
/// the newest segment's tail may be cut. A synced log's file is
/// preallocated with zeros and never recycled: what a crash leaves past
/// its last record is an append that did not finish (zeros from a sector
/// boundary on), while a complete record that fails its checksum was
/// written whole and fsync'd, so it may have been acknowledged: damage.
/// An unsynced log lives in RAM or the page cache, where a record cut by
/// a kill mid-copy, or a recycled file's stale bytes, are what follows
/// the last good record.
pub fn scan_segment(
    data: &[u8],
    seq: u64,
    sync: bool,
    last: bool,
    path: &Path,
) -> std::io::Result<Scan> {
    let (recs, good) = decode_all(data, seq).map_err(|e| named(path, e))?;
    let good = match good {
        Some(g) => g,
        // The only segment, created but never written: started afresh
        // (its header is written at open).
        None if last => 0,
        None => {
            return Ok(Scan {
                recs,
                good: 0,
                tail: Tail::Corrupt("a sealed segment has no header".into()),
            })
        }
    };
    // A mapped log's sealed segment ends at its seal record.
    let sealed_here = matches!(recs.last(), Some((Record::Seal, _)));
    let tail = if good == data.len() || (!last && sealed_here) {
        Tail::Clean
    } else if !last {
        Tail::Corrupt("a record written whole fails its checksum".into())
    } else if sync {
        let t = &data[good..];
        let record_end = (t.len() >= 8)
            .then(|| 8 + u32::from_le_bytes([t[0], t[1], t[2], t[3]]) as usize)
            .filter(|&end| end <= t.len());
        if sluice_log::is_torn_tail(t, good as u64, 0, record_end) {
            Tail::Cut
        } else {
            Tail::Corrupt(
                "the last record was written whole and fails its checksum: damage, not a torn write"
                    .into(),
            )
        }
    } else {
        Tail::Cut
    };
    Ok(Scan { recs, good, tail })
}

/// The segment files of the log in `dir` (live and kept), oldest first.
pub fn segment_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = numbered(dir, "seg-")?;
    out.extend(numbered(dir, "kept-")?);
    out.sort();
    Ok(out)
}

/// An error that names the file it is about.
fn named(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn keep_torn_evidence(seg: &Path, offset: usize, tail: &[u8]) -> std::io::Result<()> {
    let Some(last) = tail.iter().rposition(|&b| b != 0) else {
        return Ok(());
    };
    let mut name = seg.as_os_str().to_os_string();
    name.push(format!(".torn-at-{offset}"));
    let path = PathBuf::from(name);
    std::fs::write(&path, &tail[..=last])?;
    File::open(&path)?.sync_all()?;
    tracing::warn!(file = %seg.display(), offset, evidence = %path.display(), "consensus log: cut a torn append");
    Ok(())
}

/// Reads an entry back from its segment, checking its checksum.
fn read_entry(dir: &Path, loc: Loc) -> Result<Entry, StorageError> {
    use std::os::unix::fs::FileExt;
    let path = seg_path(dir, loc.seq);
    let read_err = |e: String| -> StorageError {
        StorageIOError::read_logs(openraft::AnyError::error(format!(
            "consensus log {} at offset {}: {e}",
            path.display(),
            loc.offset
        )))
        .into()
    };
    let f = File::open(&path).map_err(|e| read_err(e.to_string()))?;
    let mut buf = vec![0u8; 8 + loc.len as usize];
    f.read_exact_at(&mut buf, loc.offset)
        .map_err(|e| read_err(e.to_string()))?;
    let (recs, _) = decode_records(&buf, loc.seq, 0);
    match recs.into_iter().next() {
        Some((Record::Entry(e), _)) => Ok(e),
        _ => Err(read_err("not the entry recorded there".into())),
    }
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

    /// Entry `i`, from memory or read back from disk.
    fn entry(&self, i: u64) -> Result<Option<Entry>, StorageError> {
        if let Some(e) = self.entries.get(&i) {
            return Ok(Some(e.clone()));
        }
        match (self.index.get(&i).and_then(|h| h.loc), &self.disk) {
            (Some(loc), Some(d)) => read_entry(&d.dir, loc).map(Some),
            _ => Ok(None),
        }
    }

    /// Appends records to the active segment (per the sync policy),
    /// rolling over to a new segment first when it is full; returns where
    /// each record went (nothing without a disk).
    fn persist(&mut self, recs: &[Record]) -> Result<Vec<Loc>, StorageError> {
        if self.writer.is_some() {
            // Durable before returning: queue, then wait for the writer.
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let locs = self.persist_with(recs, Some(Done::Wait(tx)))?;
            return match crate::rt::blocking(|| rx.recv()) {
                Ok(Ok(())) => Ok(locs),
                Ok(Err(e)) => Err(io_err(std::io::Error::other(e))),
                Err(_) => Err(io_err(std::io::Error::other(
                    "the log writer thread is gone",
                ))),
            };
        }
        self.persist_with(recs, None)
    }

    /// Appends records: written here (unsynced logs), or queued for the
    /// writer thread of a synced log, which completes `done` once they are
    /// on disk. Returns where each record goes.
    fn persist_with(
        &mut self,
        recs: &[Record],
        done: Option<Done>,
    ) -> Result<Vec<Loc>, StorageError> {
        if self.disk.as_ref().is_some_and(|d| d.bytes >= SEGMENT_BYTES) {
            self.roll()?;
        }
        let Some(d) = &mut self.disk else {
            return Ok(Vec::new());
        };
        // Queued buffers belong to the writer thread: no reuse.
        let mut buf = match self.writer {
            Some(_) => Vec::new(),
            None => std::mem::take(&mut self.scratch),
        };
        buf.clear();
        let mut parts: Vec<Part> = Vec::new();
        let mut locs = Vec::with_capacity(recs.len());
        let mut offset = d.bytes;
        for r in recs {
            let values = match r {
                Record::Entry(e) => entry_values(e, BY_REFERENCE),
                _ => Vec::new(),
            };
            let len = encode_parts(r, &values, d.seq, &mut buf, &mut parts)?;
            locs.push(Loc {
                seq: d.seq,
                offset,
                len,
            });
            offset += 8 + len as u64;
            if let Record::Entry(e) = r {
                d.max_index = d.max_index.max(e.log_id.index);
            }
        }
        if let Some((tx, _)) = &self.writer {
            d.bytes = offset;
            let job = IoJob::Write {
                file: d.shared.clone(),
                buf,
                parts,
                max_index: d.max_index,
                done,
            };
            return match tx.send(job) {
                Ok(()) => Ok(locs),
                Err(_) => Err(io_err(std::io::Error::other(
                    "the log writer thread is gone",
                ))),
            };
        }
        let mut slices = io_slices(&buf, &parts);
        d.write_tail(&mut slices).map_err(io_err)?;
        drop(slices);
        if d.bytes < SEGMENT_BYTES / 2 && offset >= SEGMENT_BYTES / 2 {
            // Half full: time to have the next segment's file ready.
            d.prepare_ahead();
        }
        if d.sync {
            d.file.sync_data().map_err(io_err)?;
        }
        d.bytes = offset;
        // Keep up to 8 MiB around for the next append.
        if buf.capacity() <= 8 << 20 {
            self.scratch = buf;
        }
        Ok(locs)
    }

    /// Persists one record, then applies it.
    fn record(&mut self, rec: Record) -> Result<(), StorageError> {
        let loc = self.persist(std::slice::from_ref(&rec))?.pop();
        self.apply(rec, loc);
        Ok(())
    }

    /// Seals the active segment and starts the next one with the current
    /// vote, commit point and purge point.
    fn roll(&mut self) -> Result<(), StorageError> {
        let Some(d) = &mut self.disk else {
            return Ok(());
        };
        let seq = d.seq + 1;
        let mut head = segment_header(seq).to_vec();
        if let Some(v) = self.vote {
            encode(&Record::Vote(v), &mut head, seq)?;
        }
        encode(&Record::Committed(self.committed), &mut head, seq)?;
        if let Some(p) = self.last_purged {
            encode(&Record::Purge(p), &mut head, seq)?;
        }
        let queued = self.writer.as_ref().map(|(tx, _)| tx.clone());
        if d.mapped {
            let mut seal = Vec::new();
            encode(&Record::Seal, &mut seal, d.seq)?;
            d.write_tail(&mut [std::io::IoSlice::new(&seal)])
                .map_err(io_err)?;
        } else if queued.is_none() {
            // A sealed segment ends exactly at its last record (a recycled
            // file may hold stale bytes beyond it).
            d.file.set_len(d.bytes).map_err(io_err)?;
        }
        let path = seg_path(&d.dir, seq);
        let spare = {
            let mut free = d.free.lock();
            // A mapped file first (its pages are there and mapped).
            let i = free.iter().rposition(|(_, m)| m.is_some());
            i.or(free.len().checked_sub(1)).map(|i| free.swap_remove(i))
        };
        let reuse = match spare {
            Some((old, m)) => {
                std::fs::rename(&old, &path).map_err(io_err)?;
                m
            }
            None => None,
        };
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(false) // a recycled file: overwritten in place
            .read(true) // mapped logs map it shared
            .write(true)
            .open(&path)
            .map_err(io_err)?;
        if d.sync {
            // The new name must survive a crash; its contents are synced
            // with the records that follow.
            if let Ok(dirf) = File::open(&d.dir) {
                let _ = dirf.sync_all();
            }
        }
        if d.sync && f.metadata().map_err(io_err)?.len() == 0 {
            // A fresh file: reserve its blocks (much cheaper than writing
            // zeros; an fdatasync then only converts extents).
            if let Err(e) = allocate(&f, SEGMENT_BYTES) {
                tracing::debug!(error = %e, "posix_fallocate of a new log segment failed");
            }
        }
        let new = Arc::new(f.try_clone().map_err(io_err)?);
        let map = match queued {
            Some(tx) => {
                tx.send(IoJob::Roll {
                    old: d.shared.clone(),
                    old_len: d.bytes,
                    new: new.clone(),
                    head: head.clone(),
                })
                .map_err(|_| io_err(std::io::Error::other("the log writer thread is gone")))?;
                None
            }
            // A mapped log maps the segment only when its file came with a
            // mapping (a spare allocated and mapped off this path); else it
            // is written with write(2) until the next roll.
            None => match reuse.filter(|m| m.len() as u64 == MAP_BYTES) {
                Some(mut m) => {
                    m[..head.len()].copy_from_slice(&head);
                    Some(m)
                }
                None => {
                    f.write_all(&head).map_err(io_err)?;
                    if d.sync {
                        f.sync_all().map_err(io_err)?;
                    }
                    None
                }
            },
        };
        d.shared = new;
        let old = std::mem::replace(&mut d.map, map);
        d.sealed.push(Sealed {
            seq: d.seq,
            max_index: d.max_index,
            map: old,
        });
        d.file = f;
        d.seq = seq;
        d.bytes = head.len() as u64;
        d.prepare_ahead();
        Ok(())
    }

    /// Deletes sealed segments whose entries are all purged.
    fn drop_purged_segments(&mut self) {
        let upto = self.last_purged.map_or(0, |p| p.index);
        let Some(d) = &mut self.disk else { return };
        let (dir, keep) = (&d.dir, d.keep);
        let mut free = d.free.lock();
        d.sealed.retain_mut(|s| {
            if s.max_index > upto {
                return true;
            }
            let path = seg_path(dir, s.seq);
            if keep {
                // Out of the log (not scanned at open), still readable.
                if let Err(e) = std::fs::rename(&path, kept_path(dir, s.seq)) {
                    tracing::error!(file = %path.display(), error = %e, "could not set a purged segment aside");
                }
                return false;
            }
            let spare = dir.join(format!("free-{:08}.log", s.seq));
            if free.len() < FREE_SEGMENTS && std::fs::rename(&path, &spare).is_ok() {
                free.push((spare, s.map.take()));
            } else {
                let _ = std::fs::remove_file(&path);
            }
            false
        });
    }
}

impl Disk {
    /// Writes `slices` at the end of the active segment (`bytes`, which
    /// the caller then advances) of an unsynced log: copied into the
    /// mapping where they fit, else written to the file.
    fn write_tail(&mut self, slices: &mut [std::io::IoSlice<'_>]) -> std::io::Result<()> {
        let len: usize = slices.iter().map(|s| s.len()).sum();
        match &mut self.map {
            Some(m) if self.bytes as usize + len <= m.len() => {
                copy_into(m, self.bytes as usize, slices);
                Ok(())
            }
            _ => {
                if self.mapped {
                    // The file's position is stale after copies into the map.
                    std::io::Seek::seek(&mut self.file, std::io::SeekFrom::Start(self.bytes))?;
                }
                write_all_vectored(&mut self.file, slices)
            }
        }
    }

    /// Mapped logs: unless a mapped spare is ready, makes one on a thread
    /// of its own (a free file found at open is mapped, else a new file is
    /// made), so the next roll finds a segment whose pages exist and are
    /// mapped. A busy group that has not yet cycled through its files so
    /// stays one segment ahead.
    fn prepare_ahead(&self) {
        use std::sync::atomic::Ordering;
        if !self.mapped
            || self.free.lock().iter().any(|(_, m)| m.is_some())
            || self.preparing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (free, preparing) = (self.free.clone(), self.preparing.clone());
        let fresh = self.dir.join(format!("free-next-{:08}.log", self.seq));
        let spawned = std::thread::Builder::new()
            .name("sluice-log-spare".into())
            .spawn(move || {
                let path = {
                    let mut f = free.lock();
                    if f.iter().any(|(_, m)| m.is_some()) {
                        None
                    } else {
                        match f.iter().position(|(_, m)| m.is_none()) {
                            Some(i) => Some(f.swap_remove(i).0),
                            None => Some(fresh),
                        }
                    }
                };
                if let Some(path) = path {
                    match prepare_spare(&path) {
                        Ok(m) => free.lock().push((path, Some(m))),
                        Err(e) => {
                            tracing::debug!(file = %path.display(), error = %e, "could not prepare a spare log segment");
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                }
                preparing.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.preparing.store(false, Ordering::Release);
        }
    }
}

/// Where a purged segment of a keeping log goes.
fn kept_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("kept-{seq:08}.log"))
}

/// Values shorter than this are copied into a persistent shard's history
/// rather than referenced (a reference is 20 bytes).
pub const MIN_REF: usize = 64;

/// A counting sink for bincode that notes where each expected value's
/// bytes start (the values come in encoding order; matched by address and
/// length, so a value that appears twice is told apart by order).
struct Positions<'a> {
    values: &'a [Bytes],
    next: usize,
    at: u64,
    found: Vec<u64>,
}

impl Write for Positions<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        if let Some(v) = self.values.get(self.next) {
            if v.as_ptr() == data.as_ptr() && v.len() == data.len() {
                self.found.push(self.at);
                self.next += 1;
            }
        }
        self.at += data.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads `at` from a keeping log's segment files in `dir` (the live
/// segment or, once purged, the kept one).
pub fn read_value(dir: &Path, at: &sluice_store::ValueRef) -> std::io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let f = match File::open(seg_path(dir, at.segment)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            File::open(kept_path(dir, at.segment))?
        }
        Err(e) => return Err(e),
    };
    let mut buf = vec![0u8; at.len as usize];
    f.read_exact_at(&mut buf, at.offset)?;
    Ok(Bytes::from(buf))
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

    /// Where the values of entry `e` of at least `MIN_REF` bytes lie in
    /// this log's files (in encoding order), when `e` is the entry this
    /// log holds at its index.
    pub fn value_refs(&self, e: &Entry) -> Option<Vec<sluice_store::ValueRef>> {
        let values = entry_values(e, MIN_REF);
        if values.is_empty() {
            return Some(Vec::new());
        }
        let loc = {
            let g = self.inner.lock();
            let h = g.index.get(&e.log_id.index)?;
            if h.log_id != e.log_id {
                return None;
            }
            h.loc?
        };
        // bincode writes `Record::Entry(e)` as the variant index (u32, 0)
        // then `e`: counting from 4 needs no copy of the entry.
        let mut p = Positions {
            values: &values,
            next: 0,
            at: 4,
            found: Vec::new(),
        };
        bincode::serialize_into(&mut p, e).ok()?;
        if p.found.len() != values.len() {
            return None;
        }
        Some(
            p.found
                .iter()
                .zip(&values)
                .map(|(pos, v)| sluice_store::ValueRef {
                    segment: loc.seq,
                    offset: loc.offset + 8 + pos,
                    len: v.len() as u32,
                })
                .collect(),
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
        for (seq, path) in numbered(&dir, "kept-")? {
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
        let free: Vec<(PathBuf, Option<memmap2::MmapMut>)> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("free-"))
            })
            .map(|p| (p, None))
            .collect();
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
                            "consensus log {} is corrupt at offset {good} ({reason}); refusing to start. Repair this member from its peers: see `sluice fsck` and \"Corruption and repair\" in the README",
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
                .spawn(move || writer(rx, w, faults))?;
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
            preparing: Arc::default(),
            sync,
            bytes,
        });
        inner.drop_purged_segments();
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
            snapshot_floor: Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
        })
    }

    /// Where the state machine records the last index its saved
    /// snapshot covers (see `snapshot_floor`).
    pub fn snapshot_floor(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.snapshot_floor.clone()
    }

    /// Purges everything the saved snapshot `upto` covers, if the log
    /// still holds it (at open: a purge held back by `snapshot_floor` may
    /// have left entries the member never received missing between the
    /// purge point and the snapshot, and openraft refuses a log with a
    /// gap).
    pub fn purge_covered(&self, upto: LogId) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        if g.last_purged.is_some_and(|p| p.index >= upto.index) {
            return Ok(());
        }
        g.record(Record::Purge(upto))?;
        g.drop_purged_segments();
        Ok(())
    }

    /// Bytes of entries held in memory (not yet covered by a snapshot).
    pub fn held_bytes(&self) -> u64 {
        self.inner.lock().held_bytes
    }

    /// Bytes of entries held in memory beyond the newest `keep` (what a
    /// snapshot now would let go: openraft keeps `keep` entries after one).
    pub fn bytes_beyond(&self, keep: u64) -> u64 {
        let g = self.inner.lock();
        let newest: u64 = g
            .index
            .values()
            .rev()
            .take(keep as usize)
            .map(|h| h.size)
            .sum();
        g.held_bytes.saturating_sub(newest)
    }
}

/// Most bytes of values one replication message carries (at least one
/// entry always goes): openraft times an AppendEntries out after one
/// heartbeat interval, so a batch of large values must stay small.
const PAYLOAD_BYTES: u64 = 1 << 20;

fn approx_size(e: &Entry) -> u64 {
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
        let g = self.inner.lock();
        let mut out = Vec::new();
        let mut bytes = 0;
        for (i, h) in g.index.range(start..end) {
            bytes += h.size;
            if !out.is_empty() && bytes > PAYLOAD_BYTES {
                break;
            }
            out.extend(g.entry(*i)?);
        }
        Ok(out)
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

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.inner.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        // Never fsync'd: a lost commit point is recomputed from the leader;
        // it only speeds up a restart. A synced log keeps it in memory
        // (written at the head of each new segment): a record per commit
        // would cost its writer an fsync that entries then queue behind.
        let synced = g.writer.is_some();
        if let (false, Some(d)) = (synced, &mut g.disk) {
            let mut buf = Vec::new();
            encode(&Record::Committed(committed), &mut buf, d.seq)?;
            d.write_tail(&mut [std::io::IoSlice::new(&buf)])
                .map_err(io_err)?;
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
        let mut callback = Some(callback);
        let res = {
            let mut g = self.inner.lock();
            // A synced log completes the callback from its writer thread.
            let done = match g.writer {
                Some(_) => callback.take().map(Done::Flushed),
                None => None,
            };
            g.persist_with(&recs, done).map(|locs| {
                let mut locs = locs.into_iter();
                for rec in recs {
                    let loc = locs.next();
                    g.apply(rec, loc);
                }
            })
        };
        match res {
            Ok(()) => {
                if let Some(cb) = callback {
                    cb.log_io_completed(Ok(()));
                }
                Ok(())
            }
            Err(e) => {
                if let Some(cb) = callback {
                    cb.log_io_completed(Err(std::io::Error::other(e.to_string())));
                }
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        g.record(Record::Truncate(log_id.index))?;
        // Everything queued before is written by now (the truncation was
        // waited for): entries from here on are new and not written yet.
        if let Some((_, w)) = &g.writer {
            w.fetch_min(
                log_id.index.saturating_sub(1),
                std::sync::atomic::Ordering::AcqRel,
            );
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Command;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn lid(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn entry(term: u64, index: u64, size: usize) -> Entry {
        Entry {
            log_id: lid(term, index),
            payload: EntryPayload::Normal(Command::Write {
                key: format!("/vol/{index}"),
                value: Some(bytes::Bytes::from(vec![index as u8; size])),
                expected: None,
                timestamp_us: index,
                req_id: None,
                trace: None,
            }),
        }
    }

    /// Appends in batches of 4 (as openraft would), so segments roll.
    fn append(l: &mut Inner, es: Vec<Entry>) {
        let mut es = es.into_iter().peekable();
        while es.peek().is_some() {
            let recs: Vec<Record> = es.by_ref().take(4).map(Record::Entry).collect();
            let locs = l.persist(&recs).unwrap();
            for (r, loc) in recs.into_iter().zip(locs) {
                l.apply(r, Some(loc));
            }
        }
    }

    fn reopen(dir: &Path) -> Inner {
        let s = LogStore::open(dir, false).unwrap();
        Arc::try_unwrap(s.inner).ok().unwrap().into_inner()
    }

    /// Issue #14 (found by the chaos run): openraft purged the log up to
    /// a leader's snapshot before the state machine had saved it; killed
    /// in between, the member restarted with a log purged past its saved
    /// snapshot and openraft panicked. A purge now stops at the snapshot
    /// the state machine says is saved, and catches up with a later one.
    #[tokio::test]
    async fn a_purge_never_passes_the_saved_snapshot() {
        let d = tempfile::tempdir().unwrap();
        let mut s = LogStore::open(d.path(), false).unwrap();
        append(
            &mut s.inner.lock(),
            (1..=40).map(|i| entry(1, i, 10)).collect(),
        );
        let floor = s.snapshot_floor();
        floor.store(0, std::sync::atomic::Ordering::Release); // nothing saved yet
        s.purge(lid(1, 30)).await.unwrap();
        assert_eq!(s.get_log_state().await.unwrap().last_purged_log_id, None);
        floor.store(11, std::sync::atomic::Ordering::Release); // saved up to 10
        s.purge(lid(1, 30)).await.unwrap();
        assert_eq!(
            s.get_log_state().await.unwrap().last_purged_log_id,
            Some(lid(1, 10))
        );
        drop(s);
        let g = reopen(d.path());
        assert_eq!(g.last_purged, Some(lid(1, 10)), "held back on disk too");
        assert_eq!(g.index.keys().next(), Some(&11));
        let mut s = LogStore::open(d.path(), false).unwrap();
        s.snapshot_floor()
            .store(36, std::sync::atomic::Ordering::Release);
        s.purge(lid(1, 30)).await.unwrap();
        assert_eq!(
            s.get_log_state().await.unwrap().last_purged_log_id,
            Some(lid(1, 30))
        );
        // A member that installed a leader's snapshot (up to 60) and then
        // received entries after it: the held-back purge left a gap (41 to
        // 60 never arrived). Opening over the saved snapshot purges what
        // it covers, gap included: the log is contiguous again.
        append(
            &mut s.inner.lock(),
            (61..=70).map(|i| entry(2, i, 10)).collect(),
        );
        drop(s);
        let s = LogStore::open(d.path(), false).unwrap();
        s.purge_covered(lid(2, 60)).unwrap();
        let g = s.inner.lock();
        assert_eq!(g.last_purged, Some(lid(2, 60)));
        assert_eq!(
            g.index.keys().copied().collect::<Vec<_>>(),
            (61..=70).collect::<Vec<_>>()
        );
    }

    #[test]
    fn vote_entries_truncation_and_purge_survive_reopen_across_segments() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = LogStore::open(d.path(), false).unwrap();
            let mut g = s.inner.lock();
            g.record(Record::Vote(Vote::new(3, 1))).unwrap();
            // 1 MiB values: several 32 MiB segments.
            append(&mut g, (1..=80).map(|i| entry(1, i, 1 << 20)).collect());
            g.record(Record::Truncate(71)).unwrap();
            append(&mut g, (71..=75).map(|i| entry(2, i, 10)).collect());
            g.record(Record::Purge(lid(1, 64))).unwrap();
            g.drop_purged_segments();
        }
        let segs = std::fs::read_dir(d.path()).unwrap().count();
        let g = reopen(d.path());
        assert_eq!(g.vote, Some(Vote::new(3, 1)));
        assert_eq!(g.last_purged, Some(lid(1, 64)));
        assert_eq!(g.index.keys().next(), Some(&65));
        assert_eq!(g.index.keys().next_back(), Some(&75));
        assert_eq!(
            g.index[&72].log_id,
            lid(2, 72),
            "the truncated suffix was replaced"
        );
        assert_eq!(g.index[&70].log_id, lid(1, 70));
        assert_eq!(g.entry(70).unwrap().unwrap().log_id, lid(1, 70));
        assert!(segs < 4, "purged segments were deleted ({segs} left)");
    }

    #[test]
    fn a_synced_log_survives_reopen_across_preallocated_segments_and_an_unfinished_roll() {
        let d = tempfile::tempdir().unwrap();
        let last_seq = {
            let s = LogStore::open(d.path(), true).unwrap();
            let len = std::fs::metadata(seg_path(d.path(), 1)).unwrap().len();
            assert!(
                len >= SEGMENT_BYTES,
                "the first segment is preallocated ({len} bytes)"
            );
            let mut g = s.inner.lock();
            // Through the writer thread: each call returns once durable.
            g.record(Record::Vote(Vote::new(3, 1))).unwrap();
            append(&mut g, (1..=80).map(|i| entry(1, i, 1 << 20)).collect());
            g.record(Record::Truncate(71)).unwrap();
            append(&mut g, (71..=75).map(|i| entry(2, i, 10)).collect());
            let seq = g.disk.as_ref().unwrap().seq;
            assert!(seq >= 3, "segments rolled ({seq})");
            seq
        };
        // A crash in the middle of a roll: the next segment exists but
        // holds no record yet (zeros of a preallocated file).
        let next = seg_path(d.path(), last_seq + 1);
        std::fs::write(&next, vec![0u8; 4096]).unwrap();
        let g = reopen(d.path());
        assert!(!next.exists(), "the unfinished segment was removed");
        assert_eq!(g.vote, Some(Vote::new(3, 1)));
        assert_eq!(g.index.keys().next_back(), Some(&75));
        assert_eq!(
            g.index[&72].log_id,
            lid(2, 72),
            "the truncated suffix was replaced"
        );
        assert_eq!(g.entry(3).unwrap().unwrap().log_id, lid(1, 3));
        assert_eq!(g.entry(70).unwrap().unwrap().log_id, lid(1, 70));
    }

    /// Issue #14: in a synced (fsync'd, preallocated) log a flipped byte
    /// in the last complete record is damage to an acknowledged entry:
    /// the open refuses, naming file and offset, and cuts nothing; an
    /// append whose last sectors never landed (zeros) is cut, its bytes
    /// kept next to the segment.
    #[test]
    fn a_synced_log_refuses_a_damaged_last_record_and_cuts_a_torn_one() {
        let d = tempfile::tempdir().unwrap();
        let last = {
            let s = LogStore::open(d.path(), true).unwrap();
            let mut g = s.inner.lock();
            append(&mut g, (1..=3).map(|i| entry(1, i, 3000)).collect());
            g.index[&3].loc.unwrap()
        };
        let seg = seg_path(d.path(), 1);
        let pristine = std::fs::read(&seg).unwrap();
        let end = (last.offset + 8 + u64::from(last.len)) as usize;
        assert!(
            pristine[end..].iter().all(|&b| b == 0),
            "preallocated zeros"
        );
        let mut damaged = pristine.clone();
        damaged[end - 10] ^= 0x01;
        std::fs::write(&seg, &damaged).unwrap();
        let e = LogStore::open(d.path(), true).err().unwrap().to_string();
        assert!(e.contains("seg-00000001.log"), "{e}");
        assert!(e.contains(&format!("offset {}", last.offset)), "{e}");
        assert_eq!(std::fs::read(&seg).unwrap(), damaged, "nothing was cut");
        // The same record with everything after its first sector boundary
        // still zero: an append that never finished.
        let mut torn = pristine.clone();
        let boundary = (last.offset as usize / 512 + 1) * 512;
        torn[boundary..end].fill(0);
        std::fs::write(&seg, &torn).unwrap();
        let g = Arc::try_unwrap(LogStore::open(d.path(), true).unwrap().inner)
            .ok()
            .unwrap()
            .into_inner();
        assert_eq!(g.index.keys().next_back(), Some(&2), "entry 3 was cut");
        let evidence = std::fs::read(format!("{}.torn-at-{}", seg.display(), last.offset)).unwrap();
        assert_eq!(evidence, torn[last.offset as usize..boundary]);
    }

    /// Issue #14: after a failed fsync nothing may be reported durable,
    /// not even once fsync works again (the kernel may have dropped the
    /// dirty pages): the writer fails every later write with the first
    /// error until the log is reopened.
    #[test]
    fn after_a_failed_fsync_a_synced_log_acknowledges_nothing_until_reopened() {
        let d = tempfile::tempdir().unwrap();
        let faults = Arc::new(std::sync::Mutex::new(sluice_log::Faults::default()));
        let opts = LogOptions {
            sync: true,
            faults: Some(faults.clone()),
            ..LogOptions::default()
        };
        let s = LogStore::open_with(d.path(), opts.clone()).unwrap();
        let mut g = s.inner.lock();
        append(&mut g, vec![entry(1, 1, 100)]);
        g.record(Record::Vote(Vote::new(2, 1))).unwrap();
        faults.lock().unwrap().fail_sync = true;
        let e = g.record(Record::Vote(Vote::new(3, 1))).unwrap_err();
        assert!(e.to_string().contains("fsync"), "{e}");
        faults.lock().unwrap().fail_sync = false;
        let e = g.record(Record::Vote(Vote::new(4, 1))).unwrap_err();
        assert!(e.to_string().contains("stopped accepting writes"), "{e}");
        let recs = vec![Record::Entry(entry(1, 2, 100))];
        let e = g.persist(&recs).err().unwrap();
        assert!(e.to_string().contains("stopped accepting writes"), "{e}");
        drop(g);
        drop(s);
        // Reopened (a restart): the files are checked again and writes go on.
        let s = LogStore::open_with(d.path(), opts).unwrap();
        let mut g = s.inner.lock();
        assert_eq!(g.index.keys().next_back(), Some(&1));
        g.record(Record::Vote(Vote::new(5, 1))).unwrap();
    }

    /// A full disk is an error, and stops the log the same way.
    #[test]
    fn a_full_disk_fails_the_append_and_stops_the_synced_log() {
        let d = tempfile::tempdir().unwrap();
        let faults = Arc::new(std::sync::Mutex::new(sluice_log::Faults {
            space_left: Some(1000),
            ..Default::default()
        }));
        let s = LogStore::open_with(
            d.path(),
            LogOptions {
                sync: true,
                faults: Some(faults),
                ..LogOptions::default()
            },
        )
        .unwrap();
        let mut g = s.inner.lock();
        let recs = vec![Record::Entry(entry(1, 1, 4000))];
        let e = g.persist(&recs).err().unwrap();
        assert!(e.to_string().contains("No space left"), "{e}");
        let e = g.record(Record::Vote(Vote::new(2, 1))).unwrap_err();
        assert!(e.to_string().contains("stopped accepting writes"), "{e}");
    }

    #[test]
    fn a_keeping_log_sets_purged_segments_aside_and_reclaims_only_unreferenced_ones() {
        let d = tempfile::tempdir().unwrap();
        let s = keeping(d.path());
        {
            let mut g = s.inner.lock();
            append(&mut g, (1..=100).map(|i| entry(1, i, 1 << 20)).collect());
            g.record(Record::Purge(lid(1, 99))).unwrap();
            g.drop_purged_segments();
            assert!(
                g.disk.as_ref().unwrap().free.lock().is_empty(),
                "nothing recycled"
            );
        }
        let kept = |d: &Path| -> Vec<u64> {
            numbered(d, "kept-")
                .unwrap()
                .into_iter()
                .map(|(s, _)| s)
                .collect()
        };
        let all = kept(d.path());
        assert!(all.len() >= 2, "purged segments set aside: {all:?}");
        // A value in a kept segment is still readable where it was written.
        let e = entry(1, 3, 1 << 20);
        let at = s.value_refs(&e);
        assert!(at.is_none(), "entry 3 was purged: no live location");
        // Everything below the lowest referenced segment goes, the rest stays.
        let (files, _) = s.drop_kept_below(Some(all[1])).unwrap();
        assert_eq!(files, 1);
        assert_eq!(kept(d.path()), all[1..].to_vec());
        s.drop_kept_below(None).unwrap();
        assert!(kept(d.path()).is_empty());
        // A reopened keeping log does not scan them back in.
        drop(s);
        let g = reopen(d.path());
        assert_eq!(g.index.keys().next(), Some(&100));
    }

    #[test]
    fn value_refs_point_at_the_value_bytes_in_the_segment() {
        let d = tempfile::tempdir().unwrap();
        let s = keeping(d.path());
        let e = Entry {
            log_id: lid(1, 1),
            payload: EntryPayload::Normal(Command::Batch(vec![
                crate::types::BatchedWrite {
                    key: "/p/a".into(),
                    value: Some(bytes::Bytes::from(vec![1u8; 100])),
                    expected: None,
                    timestamp_us: 1,
                    req_id: None,
                    trace: None,
                },
                crate::types::BatchedWrite {
                    key: "/p/small".into(),
                    value: Some(bytes::Bytes::from_static(b"tiny")),
                    expected: None,
                    timestamp_us: 2,
                    req_id: None,
                    trace: None,
                },
                crate::types::BatchedWrite {
                    key: "/p/b".into(),
                    value: Some(bytes::Bytes::from(vec![2u8; 70_000])),
                    expected: None,
                    timestamp_us: 3,
                    req_id: None,
                    trace: None,
                },
            ])),
        };
        append(&mut s.inner.lock(), vec![e.clone()]);
        let refs = s.value_refs(&e).unwrap();
        assert_eq!(refs.len(), 2, "values under MIN_REF are not referenced");
        assert_eq!(read_value(d.path(), &refs[0]).unwrap(), vec![1u8; 100]);
        assert_eq!(read_value(d.path(), &refs[1]).unwrap(), vec![2u8; 70_000]);
        // Another entry at that index (a different term) has no location.
        let mut other = e.clone();
        other.log_id = lid(2, 1);
        assert!(s.value_refs(&other).is_none());
    }

    #[test]
    fn purged_segment_files_are_recycled_and_their_stale_records_ignored() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = LogStore::open(d.path(), false).unwrap();
            let mut g = s.inner.lock();
            append(&mut g, (1..=100).map(|i| entry(1, i, 1 << 20)).collect());
            g.record(Record::Purge(lid(1, 99))).unwrap();
            g.drop_purged_segments();
            let spare = g.disk.as_ref().unwrap().free.lock().len();
            assert!(spare >= 2, "{spare} purged segments kept");
            // The next segments reuse those files (full of old records).
            append(&mut g, (101..=170).map(|i| entry(2, i, 1 << 20)).collect());
            assert!(g.disk.as_ref().unwrap().free.lock().len() < spare);
        }
        let g = reopen(d.path());
        assert_eq!(g.index.len(), 71, "entries 100..=170, nothing stale");
        assert_eq!(g.index[&170].log_id, lid(2, 170));
        assert_eq!(g.entry(100).unwrap().unwrap().log_id, lid(1, 100));
    }

    #[test]
    fn only_the_newest_entries_stay_in_memory_and_older_ones_read_back_from_disk() {
        let d = tempfile::tempdir().unwrap();
        let s = LogStore::open(d.path(), false).unwrap();
        append(
            &mut s.inner.lock(),
            (1..=60).map(|i| entry(1, i, 1 << 20)).collect(),
        );
        {
            let g = s.inner.lock();
            assert!(g.mem_bytes <= MEM_TAIL_BYTES, "{}", g.mem_bytes);
            assert!(g.entries.len() < 20 && g.entries.contains_key(&60));
            assert_eq!(g.index.len(), 60);
            assert!(g.held_bytes > 60 << 20);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut r = s.clone();
        let got = rt.block_on(r.try_get_log_entries(1..=60)).unwrap();
        assert_eq!(got.len(), 60);
        for (i, e) in got.iter().enumerate() {
            let want = entry(1, i as u64 + 1, 1 << 20);
            assert_eq!(e.log_id, want.log_id);
            match (&e.payload, &want.payload) {
                (
                    EntryPayload::Normal(Command::Write {
                        value: a, key: ka, ..
                    }),
                    EntryPayload::Normal(Command::Write {
                        value: b, key: kb, ..
                    }),
                ) => assert!(a == b && ka == kb, "entry {} read back intact", i + 1),
                _ => panic!("not a write"),
            }
        }
        // A batch for a lagging follower starts on disk.
        let batch = rt.block_on(r.limited_get_log_entries(3, 61)).unwrap();
        assert_eq!(batch.first().map(|e| e.log_id.index), Some(3));
    }

    #[test]
    fn an_evicted_entry_that_fails_its_checksum_is_an_error_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let s = LogStore::open(d.path(), false).unwrap();
        append(
            &mut s.inner.lock(),
            (1..=30).map(|i| entry(1, i, 1 << 20)).collect(),
        );
        let loc = {
            let g = s.inner.lock();
            assert!(!g.entries.contains_key(&1), "entry 1 left memory");
            g.index[&1].loc.unwrap()
        };
        let seg = seg_path(d.path(), loc.seq);
        let mut data = std::fs::read(&seg).unwrap();
        data[loc.offset as usize + 100] ^= 0xff;
        std::fs::write(&seg, &data).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut r = s.clone();
        let e = rt.block_on(r.try_get_log_entries(1..=2)).err().unwrap();
        assert!(e.to_string().contains("seg-00000001.log"), "{e}");
        // Entries still in memory are unaffected.
        assert_eq!(
            rt.block_on(r.try_get_log_entries(30..=30)).unwrap().len(),
            1
        );
    }

    #[test]
    fn a_torn_tail_is_cut_and_older_corruption_refuses_to_open() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = LogStore::open(d.path(), false).unwrap();
            append(
                &mut s.inner.lock(),
                (1..=3).map(|i| entry(1, i, 100)).collect(),
            );
        }
        let seg = seg_path(d.path(), 1);
        let len = std::fs::metadata(&seg).unwrap().len();
        // A crash mid-append: half a record at the end.
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.set_len(len - 20).unwrap();
        let g = reopen(d.path());
        assert_eq!(g.index.len(), 2);
        drop(g);
        // Corruption in a sealed segment is an error naming the file.
        let mut data = std::fs::read(&seg).unwrap();
        data[SEGMENT_HEADER + 12] ^= 0xff;
        std::fs::write(&seg, &data).unwrap();
        // (A newer segment with a record: an empty one would be a roll
        // that never finished, and segment 1 the newest again.)
        let mut head = segment_header(2).to_vec();
        encode(&Record::Committed(None), &mut head, 2).unwrap();
        std::fs::write(seg_path(d.path(), 2), &head).unwrap();
        let e = LogStore::open(d.path(), false).err().unwrap();
        assert!(e.to_string().contains("seg-00000001.log"), "{e}");
        assert!(
            e.to_string().contains("offset 24"),
            "the first record's offset: {e}"
        );
    }

    /// Issue #14: segments carry a header with a format version, so a log
    /// of another format is refused by name instead of being misread.
    #[test]
    fn a_segment_of_another_format_or_without_a_header_is_refused() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = LogStore::open(d.path(), false).unwrap();
            append(&mut s.inner.lock(), vec![entry(1, 1, 10)]);
        }
        let seg = seg_path(d.path(), 1);
        let good = std::fs::read(&seg).unwrap();
        assert_eq!(&good[..8], b"SLUICERL");
        // A newer format.
        let mut newer = good.clone();
        newer[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&newer[..20]);
        newer[20..24].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&seg, &newer).unwrap();
        let e = LogStore::open(d.path(), false).err().unwrap().to_string();
        assert!(
            e.contains("seg-00000001.log") && e.contains("format version 2"),
            "{e}"
        );
        // A log as older builds wrote it: records from the first byte.
        std::fs::write(&seg, &good[SEGMENT_HEADER..]).unwrap();
        let e = LogStore::open(d.path(), false).err().unwrap().to_string();
        assert!(
            e.contains("seg-00000001.log") && e.contains("no segment header"),
            "{e}"
        );
        // Neither was changed.
        assert_eq!(std::fs::read(&seg).unwrap(), &good[SEGMENT_HEADER..]);
        std::fs::write(&seg, &good).unwrap();
        assert_eq!(reopen(d.path()).index.len(), 1);
    }

    fn keeping(dir: &Path) -> LogStore {
        let opts = LogOptions {
            keep: true,
            ..LogOptions::default()
        };
        LogStore::open_with(dir, opts).unwrap()
    }

    fn mapped(dir: &Path) -> LogStore {
        let opts = LogOptions {
            mapped: true,
            ..LogOptions::default()
        };
        LogStore::open_with(dir, opts).unwrap()
    }

    /// Waits (bounded) until a mapped spare segment is ready.
    fn spare_ready(g: &Inner) -> bool {
        let free = g.disk.as_ref().unwrap().free.clone();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if free.lock().iter().any(|(_, m)| m.is_some()) {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }

    #[test]
    fn a_mapped_log_writes_through_a_prepared_mapping_and_reopens_intact() {
        let d = tempfile::tempdir().unwrap();
        {
            let mut s = mapped(d.path());
            s.inner
                .lock()
                .record(Record::Vote(Vote::new(3, 1)))
                .unwrap();
            let mut g = s.inner.lock();
            // Half a segment in: a spare is prepared; the roll maps it.
            append(&mut g, (1..=20).map(|i| entry(1, i, 1 << 20)).collect());
            assert!(spare_ready(&g), "a spare segment was prepared");
            append(&mut g, (21..=40).map(|i| entry(1, i, 1 << 20)).collect());
            let dk = g.disk.as_ref().unwrap();
            assert!(
                dk.seq == 2 && dk.map.is_some(),
                "rolled into the mapped spare"
            );
            drop(g);
            // The commit point is written at the end like any record.
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(s.save_committed(Some(lid(1, 40)))).unwrap();
            let mut g = s.inner.lock();
            // Up to 1 MiB short of a full segment (no roll yet)...
            let left = SEGMENT_BYTES - g.disk.as_ref().unwrap().bytes;
            append(&mut g, vec![entry(1, 41, (left - (1 << 20)) as usize)]);
            // ... then more than the rest of the mapping: through write(2).
            append(&mut g, vec![entry(1, 42, 6 << 20)]);
            let active = std::fs::metadata(seg_path(d.path(), 2)).unwrap().len();
            assert!(active > MAP_BYTES, "written past the mapping ({active})");
            g.record(Record::Truncate(42)).unwrap();
            append(&mut g, (42..=46).map(|i| entry(2, i, 10)).collect());
            assert!(g.disk.as_ref().unwrap().seq >= 3, "segments rolled");
        }
        // Unmapped or mapped, the same records come back.
        for g in [reopen(d.path()), {
            let s = mapped(d.path());
            Arc::try_unwrap(s.inner).ok().unwrap().into_inner()
        }] {
            assert_eq!(g.vote, Some(Vote::new(3, 1)));
            assert_eq!(g.committed, Some(lid(1, 40)));
            assert_eq!(g.index.len(), 46);
            assert_eq!(
                g.index[&42].log_id,
                lid(2, 42),
                "the truncated entry was replaced"
            );
            assert_eq!(g.index[&41].log_id, lid(1, 41));
            let e = g.entry(38).unwrap().unwrap();
            assert_eq!(e.log_id, lid(1, 38));
            assert_eq!(entry_values(&e, 1), entry_values(&entry(1, 38, 1 << 20), 1));
        }
        // Corruption before a seal still refuses the open, naming the file.
        let seg = seg_path(d.path(), 2);
        let mut data = std::fs::read(&seg).unwrap();
        data[4096] ^= 0xff;
        std::fs::write(&seg, &data).unwrap();
        let e = LogStore::open(d.path(), false).err().unwrap();
        assert!(e.to_string().contains("seg-00000002.log"), "{e}");
    }

    #[test]
    fn a_mapped_log_recycles_files_with_their_mappings() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = mapped(d.path());
            let mut g = s.inner.lock();
            append(&mut g, (1..=20).map(|i| entry(1, i, 1 << 20)).collect());
            assert!(spare_ready(&g));
            append(&mut g, (21..=70).map(|i| entry(1, i, 1 << 20)).collect());
            // Segment 2 was mapped: sealed, it is not cut (its pages stay).
            let len = std::fs::metadata(seg_path(d.path(), 2)).unwrap().len();
            assert_eq!(len, MAP_BYTES, "a sealed mapped segment keeps its pages");
            g.record(Record::Purge(lid(1, 69))).unwrap();
            g.drop_purged_segments();
            {
                let free = g.disk.as_ref().unwrap().free.lock();
                assert!(free.len() >= 2, "purged segments kept for reuse");
                assert!(
                    free.iter().any(|(_, m)| m.is_some()),
                    "one with its mapping"
                );
            }
            // The next segments overwrite those files (old records inside).
            append(&mut g, (71..=130).map(|i| entry(2, i, 1 << 20)).collect());
        }
        // A torn record at the end of the newest segment (a kill mid-copy).
        let newest = numbered(d.path(), "seg-").unwrap().last().unwrap().0;
        let g = reopen(d.path());
        let at = g.index[&130].loc.unwrap();
        assert_eq!(at.seq, newest);
        drop(g);
        {
            use std::os::unix::fs::FileExt;
            let f = OpenOptions::new()
                .write(true)
                .open(seg_path(d.path(), newest))
                .unwrap();
            f.write_all_at(&[0xab; 64], at.offset + 8 + 1000).unwrap();
        }
        let g = reopen(d.path());
        assert_eq!(g.index.keys().next(), Some(&70));
        assert_eq!(
            g.index.keys().next_back(),
            Some(&129),
            "the torn entry was cut, nothing stale came back"
        );
        assert_eq!(g.entry(71).unwrap().unwrap().log_id, lid(2, 71));
    }

    #[test]
    fn a_roll_without_a_ready_spare_goes_on_unmapped_and_the_next_maps_one() {
        use std::sync::atomic::Ordering;
        let d = tempfile::tempdir().unwrap();
        let s = mapped(d.path());
        let mut g = s.inner.lock();
        // As if a preparation were under way that has not finished.
        g.disk
            .as_ref()
            .unwrap()
            .preparing
            .store(true, Ordering::Release);
        append(&mut g, (1..=40).map(|i| entry(1, i, 1 << 20)).collect());
        let dk = g.disk.as_ref().unwrap();
        assert!(
            dk.seq == 2 && dk.map.is_none(),
            "no allocation on the put's path"
        );
        dk.preparing.store(false, Ordering::Release);
        dk.prepare_ahead();
        assert!(spare_ready(&g));
        append(&mut g, (41..=75).map(|i| entry(1, i, 1 << 20)).collect());
        let dk = g.disk.as_ref().unwrap();
        assert!(
            dk.seq == 3 && dk.map.is_some(),
            "the next roll maps the spare"
        );
        drop(g);
        let g = reopen(d.path());
        assert_eq!(g.index.len(), 75);
        assert_eq!(g.entry(50).unwrap().unwrap().log_id, lid(1, 50));
    }

    #[test]
    fn a_spare_that_cannot_be_prepared_is_dropped_and_the_log_writes_on() {
        use std::sync::atomic::Ordering;
        let d = tempfile::tempdir().unwrap();
        let s = mapped(d.path());
        // A spare file that cannot be opened for writing: a directory.
        let bad = d.path().join("free-00000009.log");
        std::fs::create_dir(&bad).unwrap();
        let mut g = s.inner.lock();
        let dk = g.disk.as_ref().unwrap();
        dk.free.lock().push((bad.clone(), None));
        dk.prepare_ahead();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while dk.preparing.load(Ordering::Acquire) {
            assert!(
                std::time::Instant::now() < deadline,
                "the preparation never ended"
            );
            std::thread::yield_now();
        }
        assert!(dk.free.lock().is_empty(), "the failed spare left the list");
        // Appends go on across a roll (into a spare prepared meanwhile, or
        // an unmapped segment).
        append(&mut g, (1..=40).map(|i| entry(1, i, 1 << 20)).collect());
        assert_eq!(g.disk.as_ref().unwrap().seq, 2);
        drop(g);
        drop(s);
        std::fs::remove_dir(&bad).unwrap();
        let g = reopen(d.path());
        assert_eq!(g.index.len(), 40);
        assert_eq!(g.entry(36).unwrap().unwrap().log_id, lid(1, 36));
    }

    #[test]
    fn replication_batches_stop_at_the_byte_budget_but_never_send_nothing() {
        let s = LogStore::default();
        {
            let mut g = s.inner.lock();
            for i in 1..=10 {
                g.apply(Record::Entry(entry(1, i, 3 << 20)), None);
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut r = s.clone();
        let got = rt.block_on(r.limited_get_log_entries(1, 11)).unwrap();
        assert_eq!(got.len(), 1, "3 MiB + 3 MiB exceeds the budget");
        let mut small = LogStore::default();
        for i in 1..=10 {
            small
                .inner
                .lock()
                .apply(Record::Entry(entry(1, i, 10)), None);
        }
        assert_eq!(
            rt.block_on(small.limited_get_log_entries(1, 11))
                .unwrap()
                .len(),
            10
        );
    }
}
