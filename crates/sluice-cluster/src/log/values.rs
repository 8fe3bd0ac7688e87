//! Where a persistent shard's values lie in its log files (its history
//! refers to them instead of copying them), and reading them back.

use super::*;

/// Values shorter than this are copied into a persistent shard's history
/// rather than referenced (a reference is 20 bytes).
pub const MIN_REF: usize = 64;

/// A counting sink for bincode that notes where each expected value's
/// bytes start (the values come in encoding order; matched by address and
/// length, so a value that appears twice is told apart by order).
pub(super) struct Positions<'a> {
    pub(super) values: &'a [Bytes],
    pub(super) next: usize,
    pub(super) at: u64,
    pub(super) found: Vec<u64>,
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

/// A kept segment once the bytes no version refers to were punched out
/// of it (`LogStore::punch_kept`): no longer a log (its records are gone
/// but for the values still referred to), so nothing scans it as one.
pub(super) fn values_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("values-{seq:08}.log"))
}

/// Reads `at` from a keeping log's segment files in `dir` (the live
/// segment or, once purged, the kept one, or what punching left of it).
pub fn read_value(dir: &Path, at: &sluice_store::ValueRef) -> std::io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let mut f = None;
    for path in [
        seg_path(dir, at.segment),
        kept_path(dir, at.segment),
        values_path(dir, at.segment),
    ] {
        match File::open(&path) {
            Ok(file) => {
                f = Some(file);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let f = f.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "segment {} of {} (live, kept or punched)",
                at.segment,
                dir.display()
            ),
        )
    })?;
    let mut buf = vec![0u8; at.len as usize];
    f.read_exact_at(&mut buf, at.offset)?;
    Ok(Bytes::from(buf))
}

impl LogStore {
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

    /// The oldest segment of the live log (`None`: not a log on disk):
    /// the kept segments are below it.
    pub fn first_live_segment(&self) -> Option<u64> {
        let dir = self.inner.lock().disk.as_ref()?.dir.clone();
        numbered(&dir, "seg-").ok()?.first().map(|(s, _)| *s)
    }

    /// Punches out of kept segments the bytes no held version's value
    /// covers, so a version kept for long (a key written once) holds its
    /// value's pages, not the whole segment. `counts`: how many held
    /// versions refer to each segment below the live log; a segment is
    /// punched when it is newly kept, or once fewer versions refer to it
    /// than at its last punch, so a shard that drops nothing reads each
    /// segment's records once, not at every snapshot. `refs_of` gives where
    /// the values in the segments to punch lie. The file becomes
    /// `values-<n>.log`, read by `read_value` alone. Returns (files
    /// punched, bytes freed on disk).
    pub fn punch_kept(
        &self,
        counts: &BTreeMap<u64, usize>,
        refs_of: impl FnOnce(
            &std::collections::BTreeSet<u64>,
        ) -> std::io::Result<Vec<sluice_store::ValueRef>>,
    ) -> std::io::Result<(usize, u64)> {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::io::AsRawFd;
        const PAGE: u64 = 4096;
        let (dir, done) = {
            let g = self.inner.lock();
            match &g.disk {
                Some(d) if d.keep => (d.dir.clone(), g.punched.clone()),
                _ => return Ok((0, 0)),
            }
        };
        let mut files = numbered(&dir, "kept-")?;
        files.extend(numbered(&dir, "values-")?);
        let now = |seq: &u64| counts.get(seq).copied().unwrap_or(0);
        files.retain(|(seq, path)| {
            let newly_kept = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("kept-"));
            newly_kept || done.get(seq).is_none_or(|c| now(seq) < *c)
        });
        if files.is_empty() {
            return Ok((0, 0));
        }
        let due: std::collections::BTreeSet<u64> = files.iter().map(|(s, _)| *s).collect();
        let refs = refs_of(&due)?;
        let (mut punched, mut freed) = (0usize, 0u64);
        for (seq, path) in files {
            let mut keep: Vec<(u64, u64)> = refs
                .iter()
                .filter(|r| r.segment == seq)
                .map(|r| (r.offset, r.offset + u64::from(r.len)))
                .collect();
            keep.sort_unstable();
            // Renamed first: a crash while punching leaves a file nothing
            // reads as a log (fsck would call a punched log damaged).
            let target = values_path(&dir, seq);
            if path != target {
                std::fs::rename(&path, &target)?;
            }
            let f = OpenOptions::new().write(true).open(&target)?;
            let before = f.metadata()?.blocks() * 512;
            let len = f.metadata()?.len();
            let mut at = 0u64;
            for (start, end) in keep.into_iter().chain([(len, len)]) {
                // The hole between what is kept, in whole pages.
                let (a, b) = (at.div_ceil(PAGE) * PAGE, start / PAGE * PAGE);
                if b > a {
                    // SAFETY: fallocate on a descriptor this function owns.
                    let rc = unsafe {
                        libc::fallocate(
                            f.as_raw_fd(),
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            a as libc::off_t,
                            (b - a) as libc::off_t,
                        )
                    };
                    if rc != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                at = at.max(end);
            }
            f.sync_all()?;
            let after = f.metadata()?.blocks() * 512;
            punched += 1;
            freed += before.saturating_sub(after);
            self.inner.lock().punched.insert(seq, now(&seq));
        }
        Ok((punched, freed))
    }
}
