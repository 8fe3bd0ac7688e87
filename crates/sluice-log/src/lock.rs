//! An exclusive lock on a directory, so two processes never open the same
//! data at once (they would overwrite each other's acknowledged writes).
//!
//! The lock is an advisory `flock(2)` on `<dir>/LOCK`, taken before
//! anything in the directory is read. The kernel drops it when the process
//! dies, so a crash never leaves a stale lock behind; the file's contents
//! (the holder's pid and what it is) only serve the error message of the
//! process that is refused.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Why a directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{dir} is in use by another process ({holder}); stop it first, or give this one another directory")]
    Held { dir: PathBuf, holder: String },
    #[error("cannot lock {dir}: {error}")]
    Io { dir: PathBuf, error: io::Error },
}

/// Held for as long as the value lives; dropping it (or the process
/// ending) releases the directory.
#[derive(Debug)]
pub struct DirLock {
    dir: PathBuf,
    file: File,
}

/// The name of the lock file inside a locked directory.
pub const LOCK_FILE: &str = "LOCK";

impl DirLock {
    /// Creates `dir` if needed and locks it. `holder` describes this
    /// process to whoever is refused later (e.g. "sluice serve on
    /// 127.0.0.1:7420"); the pid is added.
    pub fn acquire(dir: &Path, holder: &str) -> Result<DirLock, LockError> {
        let io_err = |error| LockError::Io {
            dir: dir.to_path_buf(),
            error,
        };
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join(LOCK_FILE))
            .map_err(io_err)?;
        // SAFETY: flock on a file descriptor this function owns.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = match text.trim() {
                    "" => "holder unknown".to_string(),
                    t => t.to_string(),
                };
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    holder,
                });
            }
            return Err(io_err(err));
        }
        let mut lock = DirLock {
            dir: dir.to_path_buf(),
            file,
        };
        lock.describe(holder).map_err(io_err)?;
        Ok(lock)
    }

    /// Rewrites what a refused process is told about the holder (e.g. once
    /// the real listening address is known).
    pub fn describe(&mut self, holder: &str) -> io::Result<()> {
        let me = format!("pid {}: {holder}\n", std::process::id());
        self.file.set_len(0)?;
        self.file.seek(SeekFrom::Start(0))?;
        self.file.write_all(me.as_bytes())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The pid of the live process that holds `dir`'s lock, if one does (as
/// its lock file names it). Takes nothing: a probe with a shared lock,
/// dropped at once, fails only while an exclusive holder lives, so the
/// pid read then is that holder's, never a stale one.
pub fn lock_holder(dir: &Path) -> Option<u32> {
    let mut file = File::open(dir.join(LOCK_FILE)).ok()?;
    // SAFETY: flock on a file descriptor this function owns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EWOULDBLOCK) {
        return None; // free (the probe's lock ends with `file`)
    }
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.strip_prefix("pid ")?
        .split(':')
        .next()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_freed_on_drop() {
        let dir = std::env::temp_dir().join(format!("sluice-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = DirLock::acquire(&dir, "first holder").unwrap();
        // flock locks belong to the open file description, so a second
        // open in the same process is refused just like another process.
        match DirLock::acquire(&dir, "second") {
            Err(LockError::Held { dir: d, holder }) => {
                assert_eq!(d, dir);
                assert!(holder.contains("first holder"), "{holder}");
                assert!(holder.contains(&std::process::id().to_string()), "{holder}");
            }
            other => panic!("expected Held, got {other:?}"),
        }
        assert_eq!(lock_holder(&dir), Some(std::process::id()));
        drop(first);
        assert_eq!(lock_holder(&dir), None, "free once dropped");
        let again = DirLock::acquire(&dir, "third").unwrap();
        assert_eq!(again.dir(), dir);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
