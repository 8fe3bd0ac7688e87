//! A log's segment files: rolling over, sealing, purging (kept, reused
//! or deleted), and for mapped logs the spare files prepared ahead.

use super::*;

/// A sealed segment: its number and the highest entry index it holds.
pub(super) struct Sealed {
    pub(super) seq: u64,
    pub(super) max_index: u64,
    /// Mapped logs: the segment's mapping, kept for when the file is
    /// recycled (beyond the sealed length it must not be touched).
    pub(super) map: Option<memmap2::MmapMut>,
}

/// A mapped log's segment files are this long while written (a record
/// that does not fit goes through `write(2)` past the mapping).
pub(super) const MAP_BYTES: u64 = SEGMENT_BYTES + (4 << 20);

/// Reserves `len` bytes of blocks for `file` (extending it). On tmpfs
/// this allocates the pages: a mapped segment's are all there before it
/// is written through its mapping, so a full filesystem is an error from
/// here, never a SIGBUS on a store into the mapping.
pub(super) fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open file descriptor; no memory is passed.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) } {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Copies `slices` into `map` at `at` (the caller checked they fit).
pub(super) fn copy_into(map: &mut [u8], mut at: usize, slices: &[std::io::IoSlice<'_>]) {
    for s in slices {
        map[at..at + s.len()].copy_from_slice(s);
        at += s.len();
    }
}

/// Segment files ready for reuse, with their mappings (mapped logs);
/// shared with the thread that prepares one ahead.
pub(super) type Spares = Arc<Mutex<Vec<(PathBuf, Option<memmap2::MmapMut>)>>>;

/// Makes `path` a segment file of `MAP_BYTES` whose pages all exist
/// (`allocate`) and are mapped (`populate`): what a fresh file's first
/// appends would otherwise fault in one page at a time, on the put's path.
pub(super) fn prepare_spare(path: &Path) -> std::io::Result<memmap2::MmapMut> {
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
    let mut map = unsafe {
        memmap2::MmapOptions::new()
            .len(MAP_BYTES as usize)
            .map_mut(&f)?
    };
    populate(&mut map)?;
    Ok(map)
}

/// How much of a mapping `populate` maps per call.
const POPULATE_CHUNK: usize = 256 << 10;

/// Maps every page of `map` writable, `POPULATE_CHUNK` at a time. One
/// `MAP_POPULATE` of a whole segment holds the process's memory-map lock
/// until the last page is in (up to 230 ms on a busy 2-core machine), and
/// every thread that needs that lock meanwhile (malloc growing a heap or
/// mapping a large buffer, as a 1 MB put does) waits behind it: puts
/// stalled for as long. In chunks, such a thread waits for one chunk at
/// most. Kernels without `MADV_POPULATE_WRITE` (before Linux 5.14) take a
/// write to each page instead, a fault at a time.
pub(super) fn populate(map: &mut memmap2::MmapMut) -> std::io::Result<()> {
    #[allow(unused_mut)] // advanced on Linux only
    let mut at = 0;
    #[cfg(target_os = "linux")]
    while at < map.len() {
        let n = POPULATE_CHUNK.min(map.len() - at);
        match map.advise_range(memmap2::Advice::PopulateWrite, at, n) {
            Ok(()) => at += n,
            // No MADV_POPULATE_WRITE here: the rest a page at a time.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => return Err(e),
        }
    }
    touch(&mut map[at..]);
    Ok(())
}

/// Maps each page of `bytes` writable by writing one byte of it back
/// unchanged (`populate` where the kernel has no `MADV_POPULATE_WRITE`).
pub(super) fn touch(bytes: &mut [u8]) {
    for page in (0..bytes.len()).step_by(4096) {
        let p: *mut u8 = &mut bytes[page];
        // SAFETY: `p` points into `bytes`, borrowed mutably here; the byte
        // is written back unchanged.
        unsafe { std::ptr::write_volatile(p, std::ptr::read_volatile(p)) };
    }
}

pub(super) struct Disk {
    pub(super) dir: PathBuf,
    pub(super) file: File,
    pub(super) seq: u64,
    /// Highest entry index written to the active segment.
    pub(super) max_index: u64,
    pub(super) sealed: Vec<Sealed>,
    /// Purged segment files kept for reuse: overwriting pages a file
    /// already has is much cheaper than growing a file (page allocation).
    /// Mapped logs keep each file's mapping with it.
    pub(super) free: Spares,
    /// How many of those are kept at most (`FREE_SEGMENTS` until told).
    pub(super) spares: usize,
    /// Mapped logs: a thread is preparing a spare segment.
    pub(super) preparing: Arc<std::sync::atomic::AtomicBool>,
    pub(super) sync: bool,
    /// Mapped log: the active segment's mapping (`MAP_BYTES`).
    pub(super) map: Option<memmap2::MmapMut>,
    pub(super) mapped: bool,
    /// Purged segments are kept (renamed `kept-<n>.log`): a persistent
    /// shard's history points into them for its values.
    pub(super) keep: bool,
    /// Synced logs: the handle the writer thread writes and syncs through
    /// (this side never writes a synced log's files itself).
    pub(super) shared: Arc<File>,
    pub(super) bytes: u64,
    /// Rolls put off in a row for want of descriptors or memory.
    pub(super) roll_deferred: u64,
    /// Faults to inject (tests): `fail_open` fails the next segment's open.
    pub(super) faults: Option<Arc<std::sync::Mutex<sluice_log::Faults>>>,
}

/// Extends `file` to `len` bytes of zeros, written (not a sparse hole:
/// the blocks must exist) and synced.
pub(super) fn preallocate(file: &File, len: u64) -> std::io::Result<()> {
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

/// Purged segment files kept for reuse at most (`Disk::spares`, until
/// the log is told how large it grows: `LogStore::set_spares`): enough
/// for what one purge lets go at the default `snapshot_bytes` (256 MiB;
/// the log grows on while the snapshot is built, to about twice that), so
/// a busy group writes into pages its files already have. The files are
/// the group's peak log size, held rather than handed back and allocated
/// again.
pub(super) const FREE_SEGMENTS: usize = 16;

impl Inner {
    /// Appends records to the active segment (per the sync policy),
    /// rolling over to a new segment first when it is full; returns where
    /// each record went (nothing without a disk).
    pub(super) fn persist(&mut self, recs: &[Record]) -> Result<Vec<Loc>, StorageError> {
        if self.writer.is_some() {
            // Durable before returning: queue, then wait for the writer.
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let locs = self.persist_with(recs, Some(Done::Wait(tx)))?;
            return wait_durable(rx).map(|()| locs);
        }
        self.persist_with(recs, None)
    }

    /// Appends records: written here (unsynced logs), or queued for the
    /// writer thread of a synced log, which completes `done` once they are
    /// on disk. Returns where each record goes.
    pub(super) fn persist_with(
        &mut self,
        recs: &[Record],
        done: Option<Done>,
    ) -> Result<Vec<Loc>, StorageError> {
        if self.disk.as_ref().is_some_and(|d| d.bytes >= SEGMENT_BYTES) {
            // Deferred (out of descriptors): this segment takes the records.
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
            let len = encode_parts(r, &record_values(r), d.seq, &mut buf, &mut parts)?;
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
    pub(super) fn record(&mut self, rec: Record) -> Result<(), StorageError> {
        let loc = self.persist(std::slice::from_ref(&rec))?.pop();
        self.apply(rec, loc);
        Ok(())
    }

    /// Seals the active segment and starts the next one with the current
    /// vote, commit point and purge point. `Ok(false)`: the next segment's
    /// file could not be opened for want of descriptors or memory
    /// (`transient`); nothing changed, and the log writes on in the
    /// segment it has (a segment may exceed `SEGMENT_BYTES`: it is read
    /// by offset) until a later append rolls it.
    pub(super) fn roll(&mut self) -> Result<bool, StorageError> {
        let Some(d) = &mut self.disk else {
            return Ok(true);
        };
        let seq = d.seq + 1;
        let path = seg_path(&d.dir, seq);
        let spare = {
            let mut free = d.free.lock();
            // A mapped file first (its pages are there and mapped).
            let i = free.iter().rposition(|(_, m)| m.is_some());
            i.or(free.len().checked_sub(1)).map(|i| free.swap_remove(i))
        };
        // The next file first, opened under the name it has (a spare's is
        // changed below): until then nothing is sealed or renamed.
        let opened = (|| {
            if let Some(errno) = d.faults.as_ref().and_then(|f| f.lock().ok()?.fail_open) {
                return Err(std::io::Error::from_raw_os_error(errno));
            }
            let f = OpenOptions::new()
                .create(true)
                .truncate(false) // a recycled file: overwritten in place
                .read(true) // mapped logs map it shared
                .write(true)
                .open(spare.as_ref().map_or(&path, |(old, _)| old))?;
            let new = f.try_clone()?;
            Ok((f, new))
        })();
        let (mut f, new) = match opened {
            Ok(x) => x,
            Err(e) => {
                if let Some(s) = spare {
                    d.free.lock().push(s);
                }
                if !sluice_log::transient(&e) {
                    return Err(io_err(e));
                }
                d.roll_deferred += 1;
                if d.roll_deferred == 1 || d.roll_deferred.is_multiple_of(10_000) {
                    tracing::warn!(
                        dir = %d.dir.display(),
                        error = %e,
                        segment_mib = d.bytes >> 20,
                        tries = d.roll_deferred,
                        "could not start the log's next segment: writing on in this one, and trying again at the next append"
                    );
                }
                return Ok(false);
            }
        };
        if d.roll_deferred > 0 {
            tracing::info!(dir = %d.dir.display(), tries = d.roll_deferred, segment_mib = d.bytes >> 20, "started the log's next segment");
            d.roll_deferred = 0;
        }
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
        let reuse = match spare {
            Some((old, m)) => {
                std::fs::rename(&old, &path).map_err(io_err)?;
                m
            }
            None => None,
        };
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
        let new = Arc::new(new);
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
        Ok(true)
    }

    /// Deletes sealed segments whose entries are all purged.
    pub(super) fn drop_purged_segments(&mut self) {
        let upto = self.last_purged.map_or(0, |p| p.index);
        let Some(d) = &mut self.disk else { return };
        let (dir, keep) = (&d.dir, d.keep);
        let mut free = d.free.lock();
        // Beyond the number kept (lowered since): handed back.
        while free.len() > d.spares {
            if let Some((path, _map)) = free.pop() {
                let _ = std::fs::remove_file(&path);
            }
        }
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
            // A synced log's segments are never recycled: past their last
            // record they hold zeros, which is how an open tells a torn
            // append from damage (`scan_segment`).
            if !d.sync && free.len() < d.spares && std::fs::rename(&path, &spare).is_ok() {
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
    pub(super) fn write_tail(
        &mut self,
        slices: &mut [std::io::IoSlice<'_>],
    ) -> std::io::Result<()> {
        let len: usize = slices.iter().map(|s| s.len()).sum();
        match &mut self.map {
            Some(m) if self.bytes as usize + len <= m.len() => {
                copy_into(m, self.bytes as usize, slices);
                Ok(())
            }
            _ => {
                if self.map.is_some() {
                    // The file's position is stale after copies into the
                    // map. A segment without one was only ever written
                    // through the file: its position is `bytes` already.
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
    pub(super) fn prepare_ahead(&self) {
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

/// Waits (blocking) until the writer thread reports the records a
/// `Done::Wait` was queued with durable.
pub(super) fn wait_durable(
    rx: std::sync::mpsc::Receiver<Result<(), String>>,
) -> Result<(), StorageError> {
    match crate::rt::blocking(|| rx.recv()) {
        Ok(r) => r.map_err(|e| io_err(std::io::Error::other(e))),
        Err(_) => Err(io_err(std::io::Error::other(
            "the log writer thread is gone",
        ))),
    }
}

impl Inner {
    /// Removes the entries at and after `from` (a truncation record).
    pub(super) fn truncate_from(&mut self, from: u64) -> Result<(), StorageError> {
        self.record(Record::Truncate(from))?;
        // Everything queued before is written by now (the truncation was
        // waited for): entries from here on are new and not written yet.
        if let Some((_, w)) = &self.writer {
            w.fetch_min(from.saturating_sub(1), std::sync::atomic::Ordering::AcqRel);
        }
        Ok(())
    }

    /// Records the commit point: written to an unsynced log's tail, kept
    /// in memory by a synced one (written at the head of each segment: a
    /// record per commit would cost its writer an fsync that entries then
    /// queue behind).
    pub(super) fn write_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let synced = self.writer.is_some();
        if let (false, Some(d)) = (synced, &mut self.disk) {
            let mut buf = Vec::new();
            encode(&Record::Committed(committed), &mut buf, d.seq)?;
            d.write_tail(&mut [std::io::IoSlice::new(&buf)])
                .map_err(io_err)?;
            d.bytes += buf.len() as u64;
        }
        self.committed = committed;
        Ok(())
    }
}
