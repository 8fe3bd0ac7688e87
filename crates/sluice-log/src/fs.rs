//! The file-layer seam: the log touches files only through [`Fs`], so
//! tests can inject short writes, fsync failures and ENOSPC.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

/// An open segment, written at its end.
pub trait SegmentFile: Send {
    fn append(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Appends several buffers in order (one vectored write where the
    /// file system allows). On error some prefix may have been written.
    fn append_all(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        for p in parts {
            self.append(p)?;
        }
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()>;
    fn truncate(&mut self, len: u64) -> io::Result<()>;
}

pub trait Fs: Send + Sync {
    /// Files in `dir` (not recursive); creates `dir` when missing.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    fn read_all(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn read_at(&self, path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>>;
    /// Opens for appending, creating the file if needed.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn SegmentFile>>;
    /// Makes a directory entry (a new segment) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The whole file memory-mapped, when the file system supports it
    /// (`None`: the log falls back to `read_at`).
    fn map(&self, _path: &Path) -> io::Result<Option<bytes::Bytes>> {
        Ok(None)
    }
    /// Atomically replaces `to` with `from`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
}

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

struct RealFile(std::fs::File);

impl SegmentFile for RealFile {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.seek(SeekFrom::End(0))?;
        self.0.write_all(buf)
    }
    fn append_all(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        self.0.seek(SeekFrom::End(0))?;
        let (mut i, mut off) = (0, 0);
        while i < parts.len() {
            let slices: Vec<io::IoSlice<'_>> = std::iter::once(io::IoSlice::new(&parts[i][off..]))
                .chain(parts[i + 1..].iter().take(63).map(|p| io::IoSlice::new(p)))
                .collect();
            let mut n = self.0.write_vectored(&slices)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            while i < parts.len() && n >= parts[i].len() - off {
                n -= parts[i].len() - off;
                i += 1;
                off = 0;
            }
            off += n;
        }
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl Fs for RealFs {
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            out.push(e?.path());
        }
        Ok(out)
    }
    fn read_all(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    fn read_at(&self, path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut f = std::fs::File::open(path)?;
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = vec![0; len];
        f.read_exact(&mut buf)?;
        Ok(buf)
    }
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn SegmentFile>> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .open(path)?;
        Ok(Box::new(RealFile(f)))
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn map(&self, path: &Path) -> io::Result<Option<bytes::Bytes>> {
        let f = std::fs::File::open(path)?;
        // SAFETY: the log maps only sealed segments, which are never written
        // again; compaction replaces a segment by renaming a new file over
        // it, which leaves this mapping on the old, unchanged inode. Nothing
        // truncates a sealed segment while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&f)? };
        Ok(Some(bytes::Bytes::from_owner(map)))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// Faults to inject, shared with the test that arms them.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail the next append after writing only this many of its bytes.
    pub short_write: Option<usize>,
    /// Fail appends with ENOSPC once this many bytes were written in total.
    pub space_left: Option<u64>,
    /// Fail every fsync.
    pub fail_sync: bool,
    /// Make every fsync take at least this long (a slow disk).
    pub sync_delay: Option<std::time::Duration>,
    /// Fail opening (creating) files with this OS error, as a process out
    /// of descriptors does (EMFILE, 24).
    pub fail_open: Option<i32>,
    pub written: u64,
}

/// An error that leaves nothing changed and may pass: out of descriptors
/// (the process's or the system's) or of kernel memory. A log that cannot
/// open its next segment for one of these writes on in the one it has.
pub fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    )
}

/// A [`Fs`] over the real file system that injects [`Faults`].
#[derive(Clone, Default)]
pub struct FaultFs {
    pub faults: Arc<Mutex<Faults>>,
}

struct FaultFile {
    inner: Box<dyn SegmentFile>,
    faults: Arc<Mutex<Faults>>,
}

fn lock(f: &Mutex<Faults>) -> std::sync::MutexGuard<'_, Faults> {
    f.lock().unwrap_or_else(|p| p.into_inner())
}

impl SegmentFile for FaultFile {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut f = lock(&self.faults);
        if let Some(n) = f.short_write.take() {
            let n = n.min(buf.len());
            self.inner.append(&buf[..n])?;
            f.written += n as u64;
            return Err(io::Error::other("injected short write"));
        }
        if let Some(left) = f.space_left {
            if buf.len() as u64 > left {
                return Err(io::Error::from_raw_os_error(28)); // ENOSPC
            }
            f.space_left = Some(left - buf.len() as u64);
        }
        self.inner.append(buf)?;
        f.written += buf.len() as u64;
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        let (fail, delay) = {
            let f = lock(&self.faults);
            (f.fail_sync, f.sync_delay)
        };
        if fail {
            return Err(io::Error::other("injected fsync failure"));
        }
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        self.inner.sync()
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
}

impl Fs for FaultFs {
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        RealFs.list(dir)
    }
    fn read_all(&self, path: &Path) -> io::Result<Vec<u8>> {
        RealFs.read_all(path)
    }
    fn read_at(&self, path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        RealFs.read_at(path, offset, len)
    }
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn SegmentFile>> {
        if let Some(errno) = lock(&self.faults).fail_open {
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(Box::new(FaultFile {
            inner: RealFs.open_append(path)?,
            faults: self.faults.clone(),
        }))
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        RealFs.sync_dir(dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFs.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        RealFs.remove(path)
    }
}
