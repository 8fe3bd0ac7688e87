use crate::fs::{Fs, SegmentFile};
use crate::record::{decode, is_torn_tail, Decode, Record, KEY_MAX, RECORD_HEADER};
use bytes::{Bytes, BytesMut};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"SLUICELG";
const FORMAT_VERSION: u32 = 1;
/// magic + format version + segment id + crc32c of the preceding 20 bytes.
pub const SEGMENT_HEADER: usize = 8 + 4 + 8 + 4;

/// When appends reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// fsync before an append returns (the default for persistent pools).
    Always,
    /// Appends return after the write; `sync_due` turns true once the
    /// oldest unsynced append is this old, and the caller (the group
    /// committer) calls `sync` and only then acknowledges the batch.
    Batch { max_delay: Duration },
    /// Never fsync; the OS writes back when it likes. Unsafe on power loss.
    Never,
}

#[derive(Clone, Debug)]
pub struct LogOptions {
    /// A segment rolls over once it would exceed this size.
    pub segment_bytes_max: u64,
    pub sync: SyncPolicy,
    /// fsync a segment when it is sealed (the default). Off, a sealed
    /// segment's unsynced appends stay pending until `sync` (which then
    /// syncs it too): for a history whose durability comes from elsewhere
    /// (a replicated shard's consensus log), so a roll costs no fsync of
    /// a whole segment in the middle of a write.
    pub sync_on_roll: bool,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes_max: 64 << 20,
            sync: SyncPolicy::Always,
            sync_on_roll: true,
        }
    }
}

/// Where a record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    pub segment: u64,
    pub offset: u64,
    pub len: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    // The I/O error is part of the message, not a `source`: printed
    // with its chain (`{:#}`), it would appear twice.
    #[error("{op} {file}: {error}")]
    Io {
        op: &'static str,
        file: String,
        error: std::io::Error,
    },
    #[error("{file} is corrupt at offset {offset}: {reason}; the log will not open until the file is repaired or removed")]
    Corrupt {
        file: String,
        offset: u64,
        reason: String,
    },
    #[error("record for key of {len} bytes exceeds the limit of {KEY_MAX}")]
    KeyTooLong { len: usize },
    #[error(
        "the log stopped accepting writes after an I/O error it could not undo ({0}); reopen it"
    )]
    Poisoned(String),
}

impl LogError {
    /// True for "no space left on device".
    pub fn is_disk_full(&self) -> bool {
        matches!(self, LogError::Io { error, .. } if error.raw_os_error() == Some(28))
    }
}

type Result<T> = std::result::Result<T, LogError>;

/// A compacted copy of a segment, ready to install.
#[derive(Debug)]
pub struct Compacted {
    pub id: u64,
    tmp: PathBuf,
    /// New locations of the records kept, by version.
    pub moved: Vec<(u64, Location)>,
    pub dropped: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// What opening a log found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Every record, in log order.
    pub records: Vec<(Location, Record)>,
    /// A torn tail that was cut off: (file, offset, bytes removed).
    pub truncated_tail: Option<(String, u64, u64)>,
    pub segments: usize,
    pub bytes: u64,
    pub elapsed: Duration,
}

pub struct Log {
    dir: PathBuf,
    fs: Arc<dyn Fs>,
    opts: LogOptions,
    active: Box<dyn SegmentFile>,
    active_id: u64,
    active_len: u64,
    /// Oldest append not yet fsynced (Batch/Never policies).
    unsynced_since: Option<Instant>,
    /// Sealed segments with appends not yet fsync'd (`sync_on_roll` off).
    unsynced_sealed: Vec<u64>,
    poisoned: Option<String>,
    /// Rolls put off in a row for want of descriptors or memory.
    roll_deferred: u64,
    buf: BytesMut,
    /// Memory maps of sealed segments, made on first read.
    maps: std::sync::Mutex<std::collections::HashMap<u64, Bytes>>,
}

fn seg_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("seg-{id:016x}.log"))
}

fn header(id: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(SEGMENT_HEADER);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&id.to_le_bytes());
    let crc = crc32c::crc32c(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// What is wrong with a segment (see [`scan_segment`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// An append that never finished, at the end of the newest segment:
    /// cut at open (nothing after it was acknowledged).
    Torn { offset: u64, bytes: u64 },
    /// Damage: the log refuses to open until it is repaired.
    Corrupt { offset: u64, reason: String },
}

/// What scanning one segment found: its good records, where they end, and
/// what follows them, if anything.
#[derive(Debug)]
pub struct Scan {
    pub records: Vec<(Location, Record)>,
    pub end: usize,
    pub problem: Option<Problem>,
}

/// Checks a segment's header and every record (pure: reads `data`, the
/// whole file, and changes nothing). Only the newest segment's tail may be
/// torn, and only if it looks like an append that never finished (see
/// [`is_torn_tail`]): a record that was written whole and fails its
/// checksum is damage, and may have been acknowledged.
pub fn scan_segment(data: &Bytes, id: u64, newest: bool) -> Scan {
    let mut scan = Scan {
        records: Vec::new(),
        end: 0,
        problem: None,
    };
    let len = data.len() as u64;
    if data.len() < SEGMENT_HEADER || (newest && data[..SEGMENT_HEADER].iter().all(|&b| b == 0)) {
        scan.problem = Some(if newest {
            Problem::Torn {
                offset: 0,
                bytes: len,
            }
        } else {
            Problem::Corrupt {
                offset: 0,
                reason: "segment header is truncated".into(),
            }
        });
        return scan;
    }
    if data[..SEGMENT_HEADER] != header(id)[..] {
        let version = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
        let reason = if &data[..MAGIC.len()] == MAGIC && version != FORMAT_VERSION {
            format!("segment format version {version}; this build reads version {FORMAT_VERSION}")
        } else {
            "bad segment header (magic, version, id or checksum)".to_string()
        };
        scan.problem = Some(Problem::Corrupt { offset: 0, reason });
        return scan;
    }
    let mut off = SEGMENT_HEADER;
    while off < data.len() {
        match decode(&data.slice(off..)) {
            Ok((r, n)) => {
                scan.records.push((
                    Location {
                        segment: id,
                        offset: off as u64,
                        len: n as u32,
                    },
                    r,
                ));
                off += n;
            }
            Err(e) => {
                let declared = u32::from_le_bytes(
                    data.get(off..off + 4)
                        .map_or([0; 4], |b| [b[0], b[1], b[2], b[3]]),
                ) as usize;
                let record_end = match e {
                    Decode::Short => None,
                    Decode::Bad(_) => Some(off + RECORD_HEADER + declared),
                };
                scan.problem = Some(if newest && is_torn_tail(data, 0, off, record_end) {
                    Problem::Torn {
                        offset: off as u64,
                        bytes: len - off as u64,
                    }
                } else {
                    let reason = match e {
                        Decode::Short => "record runs past the end of a sealed segment".to_string(),
                        Decode::Bad(r) if newest => format!(
                            "{r}; the record was written whole, so this is damage, not a torn write"
                        ),
                        Decode::Bad(r) => r,
                    };
                    Problem::Corrupt {
                        offset: off as u64,
                        reason,
                    }
                });
                break;
            }
        }
    }
    scan.end = off;
    scan
}

/// The segment files of the log in `dir`, oldest first, with their ids
/// (for `sluice fsck`).
pub fn segment_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let fs: Arc<dyn Fs> = Arc::new(crate::fs::RealFs);
    let ids = segment_ids(&fs, dir).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(ids.into_iter().map(|id| (id, seg_path(dir, id))).collect())
}

/// The segment ids in `dir`, ascending.
/// Saves the bytes of a torn tail next to its segment before they are
/// cut (`seg-<id>.log.torn-at-<offset>`), unless they are all zeros:
/// what recovery removes can still be looked at. Returns the file written.
fn keep_evidence(
    fs: &Arc<dyn Fs>,
    seg: &Path,
    tail: &[u8],
    offset: usize,
) -> Result<Option<PathBuf>> {
    if tail.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let mut name = seg.as_os_str().to_os_string();
    name.push(format!(".torn-at-{offset}"));
    let path = PathBuf::from(name);
    let mut f = fs.open_append(&path).map_err(io("creating", &path))?;
    f.truncate(0).map_err(io("truncating", &path))?;
    f.append(tail).map_err(io("writing", &path))?;
    f.sync().map_err(io("syncing", &path))?;
    Ok(Some(path))
}

fn segment_ids(fs: &Arc<dyn Fs>, dir: &Path) -> Result<Vec<u64>> {
    let mut ids: Vec<u64> = fs
        .list(dir)
        .map_err(io("listing", dir))?
        .into_iter()
        .filter_map(|p| {
            let n = p.file_name()?.to_str()?;
            u64::from_str_radix(n.strip_prefix("seg-")?.strip_suffix(".log")?, 16).ok()
        })
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

fn io(op: &'static str, file: &Path) -> impl FnOnce(std::io::Error) -> LogError {
    let file = file.display().to_string();
    move |error| LogError::Io { op, file, error }
}

impl Log {
    /// Opens (or creates) the log in `dir`, replaying every record.
    pub fn open(dir: &Path, fs: Arc<dyn Fs>, opts: LogOptions) -> Result<(Log, Recovered)> {
        let t0 = Instant::now();
        let ids = segment_ids(&fs, dir)?;
        // A compaction that crashed before its rename left a temporary file:
        // the original segment is intact, so the leftover is just removed.
        for p in fs.list(dir).map_err(io("listing", dir))? {
            if p.extension().is_some_and(|e| e == "compact" || e == "cut") {
                fs.remove(&p).map_err(io("removing", &p))?;
            }
        }
        let mut rec = Recovered {
            segments: ids.len(),
            ..Default::default()
        };
        let mut last_len = SEGMENT_HEADER as u64;
        for (i, &id) in ids.iter().enumerate() {
            let path = seg_path(dir, id);
            let file = path.display().to_string();
            let newest = i + 1 == ids.len();
            // Sealed segments are mapped, so recovered values reference the
            // page cache rather than a heap copy of every segment; the newest
            // is read (it may be truncated below).
            let data = if newest {
                None
            } else {
                fs.map(&path).map_err(io("mapping", &path))?
            };
            let data = match data {
                Some(d) => d,
                None => Bytes::from(fs.read_all(&path).map_err(io("reading", &path))?),
            };
            rec.bytes += data.len() as u64;
            let scan = scan_segment(&data, id, newest);
            rec.records.extend(scan.records);
            let off = match scan.problem {
                None => scan.end,
                Some(Problem::Corrupt { offset, reason }) => {
                    return Err(LogError::Corrupt {
                        file,
                        offset,
                        reason,
                    })
                }
                Some(Problem::Torn { offset, bytes }) => {
                    let off = offset as usize;
                    let evidence = keep_evidence(&fs, &path, &data[off..], off)?;
                    let mut f = fs.open_append(&path).map_err(io("opening", &path))?;
                    f.truncate(offset).map_err(io("truncating", &path))?;
                    if off < SEGMENT_HEADER {
                        // Crashed while creating the segment: start it afresh.
                        f.append(&header(id)).map_err(io("writing", &path))?;
                    }
                    f.sync().map_err(io("syncing", &path))?;
                    tracing::warn!(file = %file, offset, bytes, evidence = ?evidence, "cut a torn record at the end of the log (an append that never finished)");
                    rec.truncated_tail = Some((file.clone(), offset, bytes));
                    off.max(SEGMENT_HEADER)
                }
            };
            last_len = off as u64;
        }
        let (active_id, active_len) = match ids.last() {
            Some(&id) => (id, last_len),
            None => {
                let path = seg_path(dir, 0);
                let mut f = fs.open_append(&path).map_err(io("creating", &path))?;
                f.append(&header(0)).map_err(io("writing", &path))?;
                f.sync().map_err(io("syncing", &path))?;
                fs.sync_dir(dir).map_err(io("syncing directory", dir))?;
                (0, SEGMENT_HEADER as u64)
            }
        };
        let path = seg_path(dir, active_id);
        let active = fs.open_append(&path).map_err(io("opening", &path))?;
        rec.elapsed = t0.elapsed();
        let log = Log {
            dir: dir.to_path_buf(),
            fs,
            opts,
            active,
            active_id,
            active_len,
            unsynced_since: None,
            unsynced_sealed: Vec::new(),
            poisoned: None,
            roll_deferred: 0,
            buf: BytesMut::new(),
            maps: Default::default(),
        };
        Ok((log, rec))
    }

    /// Starts the next segment. The new file is opened first: a process
    /// out of descriptors or memory (`transient`) changes nothing, and the
    /// log writes on in the active segment, past its usual size, trying
    /// again at the next append.
    fn roll(&mut self) -> Result<()> {
        let id = self.active_id + 1;
        let path = seg_path(&self.dir, id);
        let mut f = match self.fs.open_append(&path) {
            Ok(f) => f,
            Err(e) if crate::fs::transient(&e) => {
                self.roll_deferred += 1;
                if self.roll_deferred == 1 || self.roll_deferred.is_multiple_of(10_000) {
                    tracing::warn!(
                        file = %path.display(),
                        error = %e,
                        tries = self.roll_deferred,
                        "could not start the log's next segment: writing on in this one, and trying again at the next append"
                    );
                }
                return Ok(());
            }
            Err(e) => return Err(io("creating", &path)(e)),
        };
        self.roll_deferred = 0;
        if self.opts.sync_on_roll {
            self.sync()?;
        } else if self.unsynced_since.take().is_some() {
            self.unsynced_sealed.push(self.active_id);
        }
        f.append(&header(id)).map_err(io("writing", &path))?;
        f.sync().map_err(io("syncing", &path))?;
        self.fs
            .sync_dir(&self.dir)
            .map_err(io("syncing directory", &self.dir))?;
        self.active = f;
        self.active_id = id;
        self.active_len = SEGMENT_HEADER as u64;
        Ok(())
    }

    /// Seals the active segment (when it holds any record) and starts a
    /// new one, so everything written so far can be compacted.
    pub fn seal_active(&mut self) -> Result<()> {
        if let Some(p) = &self.poisoned {
            return Err(LogError::Poisoned(p.clone()));
        }
        if self.active_len > SEGMENT_HEADER as u64 {
            self.roll()?;
        }
        Ok(())
    }

    /// Appends records as one write; returns where each landed. With
    /// `SyncPolicy::Always` they are on disk when this returns. On error
    /// nothing of this call remains in the log.
    pub fn append(&mut self, records: &[Record]) -> Result<Vec<Location>> {
        if let Some(p) = &self.poisoned {
            return Err(LogError::Poisoned(p.clone()));
        }
        if let Some(r) = records.iter().find(|r| r.key.len() > KEY_MAX) {
            return Err(LogError::KeyTooLong { len: r.key.len() });
        }
        let total: u64 = records.iter().map(|r| r.encoded_len() as u64).sum();
        if self.active_len > SEGMENT_HEADER as u64
            && self.active_len + total > self.opts.segment_bytes_max
        {
            self.roll()?;
        }
        // Record heads go into one buffer; values are written from their
        // own `Bytes` (no copy), interleaved by a vectored write.
        self.buf.clear();
        let mut locs = Vec::with_capacity(records.len());
        let mut head_ends = Vec::with_capacity(records.len());
        let mut offset = self.active_len;
        for r in records {
            r.encode_head(&mut self.buf);
            head_ends.push(self.buf.len());
            locs.push(Location {
                segment: self.active_id,
                offset,
                len: r.encoded_len() as u32,
            });
            offset += r.encoded_len() as u64;
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(records.len() * 2);
        let mut start = 0;
        for (r, end) in records.iter().zip(&head_ends) {
            parts.push(&self.buf[start..*end]);
            if !r.value.is_empty() {
                parts.push(&r.value);
            }
            start = *end;
        }
        let written = offset - self.active_len;
        let path = seg_path(&self.dir, self.active_id);
        if let Err(e) = self.active.append_all(&parts) {
            // Undo a partial write so the next append starts on a record boundary.
            if let Err(t) = self.active.truncate(self.active_len) {
                self.poisoned = Some(format!("{e}; then truncating {}: {t}", path.display()));
            }
            return Err(LogError::Io {
                op: "appending to",
                file: path.display().to_string(),
                error: e,
            });
        }
        let before = self.active_len;
        self.active_len += written;
        match self.opts.sync {
            SyncPolicy::Always => {
                if let Err(e) = self.active.sync() {
                    // The bytes may or may not be durable; they were never
                    // acknowledged, so drop them.
                    self.active_len = before;
                    if let Err(t) = self.active.truncate(before) {
                        self.poisoned = Some(format!("fsync failed ({e}); then truncating: {t}"));
                    }
                    return Err(LogError::Io {
                        op: "syncing",
                        file: path.display().to_string(),
                        error: e,
                    });
                }
            }
            SyncPolicy::Batch { .. } | SyncPolicy::Never => {
                self.unsynced_since.get_or_insert_with(Instant::now);
            }
        }
        Ok(locs)
    }

    /// Whether a `Batch` log has appends older than its delay unsynced.
    pub fn sync_due(&self) -> bool {
        match (self.opts.sync, self.unsynced_since) {
            (SyncPolicy::Batch { max_delay }, Some(t)) => t.elapsed() >= max_delay,
            _ => false,
        }
    }

    /// fsyncs the active segment (and sealed ones left unsynced).
    pub fn sync(&mut self) -> Result<()> {
        for id in std::mem::take(&mut self.unsynced_sealed) {
            let path = seg_path(&self.dir, id);
            let r = self
                .fs
                .open_append(&path)
                .and_then(|mut f| f.sync())
                .map_err(io("syncing", &path));
            if let Err(e) = r {
                self.unsynced_sealed.push(id);
                return Err(e);
            }
        }
        if self.unsynced_since.is_none() {
            return Ok(());
        }
        let path = seg_path(&self.dir, self.active_id);
        self.active.sync().map_err(io("syncing", &path))?;
        self.unsynced_since = None;
        Ok(())
    }

    /// The segments with unsynced appends, marked synced: the caller
    /// fsyncs them without holding the log (appends go on meanwhile)
    /// and hands back any it could not (`requeue_unsynced`).
    pub fn take_unsynced(&mut self) -> Vec<(u64, PathBuf)> {
        let mut ids = std::mem::take(&mut self.unsynced_sealed);
        if self.unsynced_since.take().is_some() {
            ids.push(self.active_id);
        }
        ids.into_iter()
            .map(|id| (id, seg_path(&self.dir, id)))
            .collect()
    }

    /// Marks segments unsynced again (their fsync failed).
    pub fn requeue_unsynced(&mut self, ids: impl IntoIterator<Item = u64>) {
        for id in ids {
            if id == self.active_id {
                self.unsynced_since.get_or_insert_with(Instant::now);
            } else if !self.unsynced_sealed.contains(&id) {
                self.unsynced_sealed.push(id);
            }
        }
    }

    /// Reads one record back (checksum verified). Records of sealed
    /// segments come from a memory map and their values are slices of it
    /// (no copy); the active segment is read with `read_at`.
    pub fn read(&self, loc: Location) -> Result<Record> {
        let path = seg_path(&self.dir, loc.segment);
        let corrupt = |reason: String| LogError::Corrupt {
            file: path.display().to_string(),
            offset: loc.offset,
            reason,
        };
        let (start, end) = (loc.offset as usize, loc.offset as usize + loc.len as usize);
        let mapped = if loc.segment == self.active_id {
            None
        } else {
            let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
            match maps.get(&loc.segment) {
                Some(m) => Some(m.clone()),
                None => {
                    let m = self.fs.map(&path).map_err(io("mapping", &path))?;
                    if let Some(m) = &m {
                        maps.insert(loc.segment, m.clone());
                    }
                    m
                }
            }
        };
        let data = match mapped {
            Some(m) if end <= m.len() => m.slice(start..end),
            Some(_) => {
                return Err(corrupt(
                    "record runs past the end of the mapped segment".into(),
                ))
            }
            None => Bytes::from(
                self.fs
                    .read_at(&path, loc.offset, loc.len as usize)
                    .map_err(io("reading", &path))?,
            ),
        };
        match decode(&data) {
            Ok((r, _)) => Ok(r),
            Err(Decode::Short) => Err(corrupt("record is truncated".into())),
            Err(Decode::Bad(reason)) => Err(corrupt(reason)),
        }
    }

    /// A second handle on the active segment, for a group committer to
    /// fsync without holding the log (appends continue meanwhile; fsync on
    /// any handle flushes the file).
    pub fn sync_handle(&self) -> Result<Box<dyn SegmentFile>> {
        let path = seg_path(&self.dir, self.active_id);
        self.fs.open_append(&path).map_err(io("opening", &path))
    }

    /// Writes a compacted copy of sealed segment `id` holding only the
    /// records `keep` accepts, to a temporary file; nothing visible
    /// changes until `install_compacted`. Needs no lock on the log: sealed
    /// segments never change.
    pub fn prepare_compacted(
        fs: &Arc<dyn Fs>,
        dir: &Path,
        id: u64,
        keep: impl Fn(&Record) -> bool,
    ) -> Result<Compacted> {
        let path = seg_path(dir, id);
        let data = match fs.map(&path).map_err(io("mapping", &path))? {
            Some(d) => d,
            None => Bytes::from(fs.read_all(&path).map_err(io("reading", &path))?),
        };
        let tmp = path.with_extension("compact");
        let mut out = BytesMut::from(&header(id)[..]);
        let mut moved = Vec::new();
        let mut dropped = 0usize;
        let mut off = SEGMENT_HEADER;
        while off < data.len() {
            let (r, n) = decode(&data.slice(off..)).map_err(|e| LogError::Corrupt {
                file: path.display().to_string(),
                offset: off as u64,
                reason: format!("{e:?}"),
            })?;
            if keep(&r) {
                let at = out.len() as u64;
                r.encode(&mut out);
                moved.push((
                    r.version,
                    Location {
                        segment: id,
                        offset: at,
                        len: n as u32,
                    },
                ));
            } else {
                dropped += 1;
            }
            off += n;
        }
        let mut f = fs.open_append(&tmp).map_err(io("creating", &tmp))?;
        f.truncate(0).map_err(io("truncating", &tmp))?;
        f.append(&out).map_err(io("writing", &tmp))?;
        f.sync().map_err(io("syncing", &tmp))?;
        Ok(Compacted {
            id,
            tmp,
            moved,
            dropped,
            bytes_before: data.len() as u64,
            bytes_after: out.len() as u64,
        })
    }

    /// Drops a compacted copy of segment `id` that will not be installed
    /// (nothing to reclaim, or the plan went stale).
    pub fn discard_compacted(dir: &Path, id: u64) {
        let _ = std::fs::remove_file(seg_path(dir, id).with_extension("compact"));
    }

    /// Atomically replaces the segment with its compacted copy.
    pub fn install_compacted(&self, c: &Compacted) -> Result<()> {
        if c.id == self.active_id {
            return Err(LogError::Poisoned(
                "the active segment cannot be compacted".into(),
            ));
        }
        let path = seg_path(&self.dir, c.id);
        self.fs
            .rename(&c.tmp, &path)
            .map_err(io("renaming into", &path))?;
        self.fs
            .sync_dir(&self.dir)
            .map_err(io("syncing directory", &self.dir))
    }

    /// Removes every record from (`segment`, `offset`) on, and every later
    /// segment, durably; appends continue there. Used to roll a replica's
    /// history back to what its replication snapshot covers. Later
    /// segments are unlinked (newest first) and a sealed segment that is
    /// cut is rewritten to a temporary file and renamed over the original,
    /// never truncated in place: readers may still hold values that are
    /// slices of its memory map, and the old pages stay valid that way.
    pub fn cut(&mut self, segment: u64, offset: u64) -> Result<()> {
        if let Some(p) = &self.poisoned {
            return Err(LogError::Poisoned(p.clone()));
        }
        if offset < SEGMENT_HEADER as u64 {
            return Err(LogError::Poisoned(format!(
                "cut at offset {offset} would remove the segment header"
            )));
        }
        // Newest first: a crash midway leaves a prefix of the log.
        for id in segment_ids(&self.fs, &self.dir)?
            .into_iter()
            .rev()
            .filter(|id| *id > segment)
        {
            let p = seg_path(&self.dir, id);
            self.fs.remove(&p).map_err(io("removing", &p))?;
        }
        let path = seg_path(&self.dir, segment);
        if segment == self.active_id {
            self.active
                .truncate(offset)
                .map_err(io("truncating", &path))?;
            self.active.sync().map_err(io("syncing", &path))?;
        } else {
            let prefix = self
                .fs
                .read_at(&path, 0, offset as usize)
                .map_err(io("reading", &path))?;
            if prefix.len() as u64 != offset {
                return Err(LogError::Corrupt {
                    file: path.display().to_string(),
                    offset: prefix.len() as u64,
                    reason: format!("segment ends before the cut point {offset}"),
                });
            }
            let tmp = path.with_extension("cut");
            let mut f = self.fs.open_append(&tmp).map_err(io("creating", &tmp))?;
            f.truncate(0).map_err(io("truncating", &tmp))?;
            f.append(&prefix).map_err(io("writing", &tmp))?;
            f.sync().map_err(io("syncing", &tmp))?;
            drop(f);
            self.fs
                .rename(&tmp, &path)
                .map_err(io("renaming into", &path))?;
            self.active = self.fs.open_append(&path).map_err(io("opening", &path))?;
            self.active_id = segment;
        }
        self.fs
            .sync_dir(&self.dir)
            .map_err(io("syncing directory", &self.dir))?;
        self.active_len = offset;
        self.unsynced_since = None;
        self.unsynced_sealed.retain(|id| *id < segment);
        self.maps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| *id < segment);
        Ok(())
    }

    /// Sealed (no longer written) segment ids.
    pub fn sealed_segments(&self) -> Result<Vec<u64>> {
        let mut ids = segment_ids(&self.fs, &self.dir)?;
        ids.retain(|id| *id != self.active_id);
        Ok(ids)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn fs(&self) -> &Arc<dyn Fs> {
        &self.fs
    }

    pub fn active_segment(&self) -> u64 {
        self.active_id
    }
}
