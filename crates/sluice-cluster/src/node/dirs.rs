//! Where a node keeps its volatile shards' logs, and the pairing that
//! ties them to one data directory.
//!
//! The volatile root outlives the process (a RAM-backed directory under
//! `/dev/shm`, named after the data directory's path), but not the data
//! directory's removal: a node started on an emptied (or new) data
//! directory at the same path must not pick up the logs an earlier node
//! left there. It did: after `rm -rf data`, a restarted node served the
//! volatile objects, versions and Raft state of its predecessor. So the
//! data directory and the volatile root each hold the same random id
//! (`PAIR_FILE`), and a root whose id is not its data directory's is
//! emptied before any log in it is opened.

use super::ClusterSettings;
use sluice_types::SluiceError;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The file in the data directory and in the volatile root holding their
/// shared id.
pub(super) const PAIR_FILE: &str = "volatile.pair";

/// The directory of volatile shards' logs (see `ClusterSettings::volatile_dir`).
pub(super) fn volatile_root(settings: &ClusterSettings, data_dir: &Path) -> PathBuf {
    if let Some(d) = &settings.volatile_dir {
        return d.clone();
    }
    let shm = Path::new("/dev/shm");
    if free_bytes(shm).is_some_and(|b| b >= 1 << 30) {
        let abs = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
        return shm.join(format!(
            "sluice-{:016x}",
            sluice_types::fnv1a64(abs.to_string_lossy().as_bytes())
        ));
    }
    data_dir.join("raft-volatile")
}

/// Free bytes of the file system holding `p` (`None` when unknown).
fn free_bytes(p: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path; `st` is a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// `n` random bytes from the kernel, as hex.
pub(super) fn random_hex(n: usize) -> std::io::Result<String> {
    let mut raw = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

fn read_pair(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(PAIR_FILE)).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

/// Writes `dir`'s pair file whole and durably (aside, synced, renamed
/// into place, the directory synced: a data directory that lost its id
/// in a power cut would take its root for another's).
fn write_pair(dir: &Path, id: &str) -> std::io::Result<()> {
    let tmp = dir.join(format!("{PAIR_FILE}.tmp"));
    std::fs::write(&tmp, format!("{id}\n"))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, dir.join(PAIR_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Pairs `root` (locked by the caller) with `data_dir`: a root that
/// belongs to another data directory, the one removed from this path
/// before, is emptied (but its lock file). Returns whether it was.
///
/// A data directory and a root without ids are a node from before the
/// pairing, paired as they are, when the data directory holds the other
/// groups' logs (`raft/`, made when a cluster node first starts there);
/// without them the data directory is new, and the root a removed one's.
/// The data directory's id is written first, so a crash between the two
/// writes leaves a root without an id, which is then paired, never
/// emptied.
pub(super) fn pair(root: &Path, data_dir: &Path) -> Result<bool, SluiceError> {
    let err = |what: &str, p: &Path, e: std::io::Error| SluiceError::Io {
        reason: format!("{what} {}: {e}", p.display()),
    };
    let mine = read_pair(data_dir);
    let theirs = read_pair(root);
    let stale = match (&mine, &theirs) {
        (Some(a), Some(b)) => a != b,
        // A data directory without an id next to a root with one: the
        // data directory was made afresh.
        (None, Some(_)) => true,
        (None, None) => !data_dir.join("raft").exists(),
        (Some(_), None) => false,
    };
    // What the root holds besides its lock and id: nothing on a first
    // start (then there is nothing to empty, and nothing to say).
    let mut leftovers = Vec::new();
    for e in std::fs::read_dir(root).map_err(|e| err("reading", root, e))? {
        let e = e.map_err(|e| err("reading", root, e))?;
        if e.file_name() != sluice_log::LOCK_FILE && e.file_name() != PAIR_FILE {
            leftovers.push(e);
        }
    }
    let stale = stale && !leftovers.is_empty();
    if stale {
        for e in leftovers {
            let p = e.path();
            let removed = if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            removed.map_err(|e| err("removing", &p, e))?;
        }
        tracing::warn!(
            root = %root.display(),
            data_dir = %data_dir.display(),
            "volatile logs left by an earlier node whose data directory was at this path: removed"
        );
    }
    let id = match mine {
        Some(id) => id,
        None => {
            let id = random_hex(8).map_err(|e| err("making an id for", data_dir, e))?;
            write_pair(data_dir, &id).map_err(|e| err("writing", data_dir, e))?;
            id
        }
    };
    if theirs.as_deref() != Some(id.as_str()) {
        write_pair(root, &id).map_err(|e| err("writing", root, e))?;
    }
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory holding a data directory and a volatile root
    /// with its lock file, as a starting node has them.
    fn data_and_root() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let base = tempfile::tempdir().unwrap();
        let (data, root) = (base.path().join("data"), base.path().join("root"));
        for d in [&data, &root] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(root.join(sluice_log::LOCK_FILE), b"pid 1").unwrap();
        (base, data, root)
    }

    /// A first start (a new data directory, a new root holding only its
    /// lock) empties nothing and says nothing: it warned of "volatile logs
    /// left by an earlier node" on every fresh node.
    #[test]
    fn a_first_start_empties_nothing() {
        let (_base, data, root) = data_and_root();
        assert!(!pair(&root, &data).unwrap());
        assert_eq!(read_pair(&root), read_pair(&data));
        assert!(read_pair(&root).is_some());
    }

    /// A root paired with a data directory that was then removed and made
    /// again is emptied; with the same data directory it is kept.
    #[test]
    fn a_root_left_by_a_removed_data_directory_is_emptied() {
        let (_base, data, root) = data_and_root();
        let log = root.join("volatile-0-0");
        std::fs::create_dir_all(&log).unwrap();
        std::fs::write(log.join("seg-00000001.log"), b"entries").unwrap();

        // A node from before the pairing (its data directory holds the
        // other groups' logs): kept, paired.
        std::fs::create_dir_all(data.join("raft/meta")).unwrap();
        assert!(!pair(&root, &data).unwrap());
        assert!(log.join("seg-00000001.log").exists());
        assert_eq!(read_pair(&root), read_pair(&data));
        // A restart: kept.
        assert!(!pair(&root, &data).unwrap());
        assert!(log.exists());

        // The data directory removed and made again: the root is emptied
        // but for its lock, and paired with the new directory.
        std::fs::remove_dir_all(&data).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        assert!(pair(&root, &data).unwrap());
        assert!(!log.exists());
        assert!(root.join(sluice_log::LOCK_FILE).exists());
        assert_eq!(read_pair(&root), read_pair(&data));

        // A new data directory next to a root from before the pairing:
        // emptied (the root is a removed data directory's).
        std::fs::create_dir_all(&log).unwrap();
        std::fs::remove_file(root.join(PAIR_FILE)).unwrap();
        std::fs::remove_dir_all(&data).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        assert!(pair(&root, &data).unwrap());
        assert!(!log.exists());

        // Another data directory's root: emptied too.
        std::fs::create_dir_all(&log).unwrap();
        write_pair(&root, "0123456789abcdef").unwrap();
        assert!(pair(&root, &data).unwrap());
        assert!(!log.exists());

        // A root made afresh (a reboot emptied /dev/shm): paired, nothing
        // to remove.
        std::fs::remove_file(root.join(PAIR_FILE)).unwrap();
        assert!(!pair(&root, &data).unwrap());
        assert_eq!(read_pair(&root), read_pair(&data));
    }
}
