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

/// The file in a volatile root naming the data directory it belongs to
/// (its canonical path), so that a root whose data directory was removed
/// can be told from one whose node is only stopped (`sweep_orphans`).
pub(super) const OWNER_FILE: &str = "data_dir";

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

/// Is `name` a volatile root's as `volatile_root` names them by default
/// (`sluice-` and 16 hex digits)?
fn default_root_name(name: &str) -> bool {
    name.strip_prefix("sluice-")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A volatile root `sweep_orphans` removed.
#[derive(Debug)]
pub(super) struct Orphan {
    pub root: PathBuf,
    /// The data directory it belonged to, gone.
    pub data_dir: PathBuf,
    /// What its files held (in RAM, under /dev/shm).
    pub bytes: u64,
}

/// Removes the volatile roots next to `root` (when `root` has a default
/// name) that belonged to data directories since removed: a root outlives
/// its node by design (a restarted node finds its volatile logs there),
/// so after `rm -rf` of a stopped or killed node's data directory its logs
/// held their RAM (tens of MiB a shard, as much as the shard's objects)
/// until the machine rebooted. Removed only when no process holds the
/// root's lock and the data directory its `OWNER_FILE` names is gone;
/// roots without that file (made before it existed) and those whose data
/// directory still exists are left alone. Never fails: what it cannot
/// remove is logged and kept.
pub(super) fn sweep_orphans(root: &Path) -> Vec<Orphan> {
    let mut swept = Vec::new();
    let own = root.file_name().and_then(|n| n.to_str());
    let (Some(base), true) = (root.parent(), own.is_some_and(default_root_name)) else {
        return swept;
    };
    let Ok(entries) = std::fs::read_dir(base) else {
        return swept;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        if path == root || !name.to_str().is_some_and(default_root_name) {
            continue;
        }
        // Held by a running node (or not a root): left alone. The lock is
        // kept while its files go, so no node starts on them meanwhile.
        let Ok(_lock) = sluice_log::DirLock::acquire(&path, "sluice node sweeping orphans") else {
            continue;
        };
        let Some(data_dir) = std::fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .map(|t| PathBuf::from(t.trim_end_matches('\n')))
            .filter(|d| d.is_absolute())
        else {
            continue;
        };
        if data_dir.exists() {
            continue;
        }
        let bytes = bytes_in(&path);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => swept.push(Orphan {
                root: path,
                data_dir,
                bytes,
            }),
            Err(err) => tracing::warn!(root = %path.display(), %err,
                "could not remove the volatile logs of a removed data directory"),
        }
    }
    swept
}

/// Bytes the files under `dir` occupy (their blocks).
fn bytes_in(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => bytes_in(&e.path()),
                Ok(m) => m.blocks() * 512,
                Err(_) => 0,
            })
            .sum()
    })
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
        let name = e.file_name();
        if name != sluice_log::LOCK_FILE && name != PAIR_FILE && name != OWNER_FILE {
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
    let owner = std::fs::canonicalize(data_dir).map_err(|e| err("resolving", data_dir, e))?;
    let owner = format!("{}\n", owner.display());
    let path = root.join(OWNER_FILE);
    if std::fs::read_to_string(&path).ok().as_deref() != Some(owner.as_str()) {
        std::fs::write(&path, owner).map_err(|e| err("writing", &path, e))?;
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

    /// A root paired with a data directory names it, so that it can be
    /// found again once that directory is gone.
    #[test]
    fn a_paired_root_names_its_data_directory() {
        let (_base, data, root) = data_and_root();
        assert!(!pair(&root, &data).unwrap());
        let owner = std::fs::read_to_string(root.join(OWNER_FILE)).unwrap();
        assert_eq!(
            owner.trim_end(),
            std::fs::canonicalize(&data).unwrap().display().to_string()
        );
    }

    /// Next to a default-named root, the roots whose data directory is
    /// gone and whose lock is free are removed; a root held by a node, one
    /// whose data directory exists, one that names none, anything not
    /// named as a root, and roots next to a root named otherwise are kept.
    #[test]
    fn roots_of_removed_data_directories_are_swept_and_the_others_kept() {
        let base = tempfile::tempdir().unwrap();
        let shm = base.path().join("shm");
        let root = |hex: &str, owner: Option<&Path>| {
            let r = shm.join(format!("sluice-{hex}"));
            std::fs::create_dir_all(r.join("volatile-0-0")).unwrap();
            std::fs::write(r.join("volatile-0-0/seg-00000001.log"), vec![7u8; 64 << 10]).unwrap();
            std::fs::write(r.join(sluice_log::LOCK_FILE), b"pid 1").unwrap();
            if let Some(o) = owner {
                std::fs::write(r.join(OWNER_FILE), format!("{}\n", o.display())).unwrap();
            }
            r
        };
        let gone = base.path().join("removed-data");
        let here = base.path().join("data");
        std::fs::create_dir_all(&here).unwrap();
        let mine = root("000000000000000a", Some(&here));
        let orphan = root("000000000000000b", Some(&gone));
        let held = root("000000000000000c", Some(&gone));
        let lock = sluice_log::DirLock::acquire(&held, "another node").unwrap();
        let owned = root("000000000000000d", Some(&here));
        let unnamed = root("000000000000000e", None);
        let other = shm.join("sluice-py-1-2");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join(OWNER_FILE), format!("{}\n", gone.display())).unwrap();

        // A root named otherwise (a `volatile_dir` of the operator's) sweeps nothing.
        assert!(sweep_orphans(&shm.join("volatile")).is_empty());
        assert!(orphan.exists());

        let swept = sweep_orphans(&mine);
        assert_eq!(swept.len(), 1, "{swept:?}");
        assert_eq!(swept[0].root, orphan);
        assert_eq!(swept[0].data_dir, gone);
        assert!(swept[0].bytes >= 64 << 10, "{swept:?}");
        assert!(!orphan.exists());
        for kept in [&mine, &held, &owned, &unnamed, &other] {
            assert!(kept.exists(), "{}", kept.display());
        }
        // Its holder gone, the held one goes too.
        drop(lock);
        let swept = sweep_orphans(&mine);
        assert_eq!(swept.len(), 1, "{swept:?}");
        assert!(!held.exists());
    }
}
