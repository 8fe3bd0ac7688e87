//! The node's memory limit (`Limits::max_memory_bytes`, Redis's
//! `maxmemory` with `noeviction`): the memory the process holds
//! (`memory_in_use`), sampled by a thread of its own, against the limit;
//! a write that stores a value is refused past it
//! (`SluiceError::OutOfMemory`), reads and removes go on. Without it, a
//! node filled past the machine's memory is killed by the kernel, and in
//! a cluster every replica of a shard holds the same objects: they are
//! killed together.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_types::SluiceError;

/// How often the memory in use is read (a put does not read it: that
/// costs a file read and a walk of the allocator's arenas).
const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// A node's memory limit.
pub struct MemoryLimit {
    node: u32,
    max: u64,
    /// The bytes in use last sampled, less `reusable` (0 where they cannot
    /// be read: only a value larger than the limit is refused there).
    in_use: Arc<AtomicU64>,
    /// Bytes the allocator counts in use that hold no data and serve the
    /// next writes (the server's free receive buffers): not counted.
    reusable: Arc<AtomicU64>,
    /// Writes refused for memory.
    pub refused: AtomicU64,
}

impl MemoryLimit {
    /// A limit of `max` bytes (0: none) for node `node`; samples until
    /// dropped.
    pub fn new(node: u32, max: u64) -> MemoryLimit {
        let in_use = Arc::new(AtomicU64::new(0));
        let reusable = Arc::new(AtomicU64::new(0));
        if max == 0 {
            if let Some(w) = no_limit_warning(memory_ceiling()) {
                tracing::warn!("{w}");
            }
        }
        if max > 0 {
            match memory_in_use() {
                Some(now) => {
                    if let Some(w) = limit_warning(max, now, memory_ceiling()) {
                        tracing::warn!("{w}");
                    }
                    in_use.store(now, Ordering::Relaxed);
                    sample_until_dropped(Arc::downgrade(&in_use), reusable.clone());
                }
                None => tracing::warn!(
                    "limits.max_memory_bytes is set, but this system does not report the memory a process holds: only values larger than the limit are refused"
                ),
            }
        }
        MemoryLimit {
            node,
            max,
            in_use,
            reusable,
            refused: AtomicU64::new(0),
        }
    }

    /// Where the owner of buffers kept for reuse keeps their total bytes
    /// up to date (they are not counted against the limit).
    pub fn reusable(&self) -> Arc<AtomicU64> {
        self.reusable.clone()
    }

    /// Whether a write storing `adding` more bytes may go ahead.
    pub fn admit(&self, adding: usize) -> Result<(), SluiceError> {
        if !self.limited() {
            return Ok(());
        }
        let in_use = self.in_use.load(Ordering::Relaxed);
        if in_use.saturating_add(adding as u64) <= self.max {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(SluiceError::OutOfMemory {
            node: self.node,
            in_use,
            max: self.max,
        })
    }

    /// Whether there is a limit (writes then go through `admit`).
    pub fn limited(&self) -> bool {
        self.max > 0
    }

    /// (bytes in use, the limit; 0 for none), for reports: sampled under
    /// a limit, read now without one (nothing samples then).
    pub fn in_use_and_limit(&self) -> (u64, u64) {
        match self.max {
            0 => (memory_in_use().unwrap_or(0), 0),
            max => (self.in_use.load(Ordering::Relaxed), max),
        }
    }
}

/// What is wrong with a limit of `max` bytes for a node holding
/// `in_use` at start under `ceiling` (`memory_ceiling`), if anything.
fn limit_warning(max: u64, in_use: u64, ceiling: Option<Ceiling>) -> Option<String> {
    if max <= in_use {
        return Some(format!(
            "limits.max_memory_bytes = {max} is below the {in_use} bytes the node holds at start: every write that stores a value will be refused"
        ));
    }
    match ceiling {
        Some(c) if max > c.bytes => Some(format!(
            "limits.max_memory_bytes = {max} is above {} ({} bytes): the kernel may kill the node before the limit refuses a write",
            c.what(),
            c.bytes
        )),
        _ => None,
    }
}

/// Without a limit of its own, a node under a control group's (a
/// container's `--memory`, a Kubernetes limit, a unit's `MemoryMax`) is
/// killed by the kernel when its objects reach it: said at start.
fn no_limit_warning(ceiling: Option<Ceiling>) -> Option<String> {
    let c = ceiling.filter(|c| c.cgroup)?;
    Some(format!(
        "this node may use {} bytes ({}) and limits.max_memory_bytes is not set: once its objects fill that, the kernel kills it (and the replicas of a shard hold the same objects); set limits.max_memory_bytes below it (e.g. {}) to have writes refused instead",
        c.bytes,
        c.what(),
        c.bytes / 10 * 8
    ))
}

/// The memory the node may use, and whether a control group's limit
/// (below the machine's memory) sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ceiling {
    bytes: u64,
    cgroup: bool,
}

impl Ceiling {
    fn what(&self) -> &'static str {
        if self.cgroup {
            "the memory limit of its control group (a container's or a unit's)"
        } else {
            "this machine's memory"
        }
    }
}

/// The machine's memory, or its control group's limit where lower.
fn memory_ceiling() -> Option<Ceiling> {
    let physical = physical_memory();
    let own = std::fs::read_to_string("/proc/self/cgroup").ok();
    let group = own.and_then(|c| cgroup_limit(std::path::Path::new("/sys/fs/cgroup"), &c));
    match (physical, group) {
        (Some(p), Some(g)) if g < p => Some(Ceiling {
            bytes: g,
            cgroup: true,
        }),
        (None, Some(g)) => Some(Ceiling {
            bytes: g,
            cgroup: true,
        }),
        (p, _) => p.map(|bytes| Ceiling {
            bytes,
            cgroup: false,
        }),
    }
}

/// The lowest memory limit on this process's control group and its
/// ancestors under `root` (the cgroup file system), from the process's
/// `/proc/self/cgroup` text: v2's `memory.max`, v1's
/// `memory.limit_in_bytes` (its "no limit" is a number near 2^63).
fn cgroup_limit(root: &std::path::Path, proc_cgroup: &str) -> Option<u64> {
    let mut lowest: Option<u64> = None;
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (base, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        // The group and each ancestor (inside a container: its root).
        let mut at = Some(std::path::Path::new(path.trim_start_matches('/')));
        while let Some(p) = at {
            if let Ok(text) = std::fs::read_to_string(base.join(p).join(file)) {
                if let Ok(n) = text.trim().parse::<u64>() {
                    if n < 1 << 60 {
                        lowest = Some(lowest.map_or(n, |l| l.min(n)));
                    }
                }
            }
            at = p.parent();
        }
    }
    lowest
}

/// The machine's physical memory.
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page > 0).then(|| pages as u64 * page as u64)
}

fn sample_until_dropped(in_use: Weak<AtomicU64>, reusable: Arc<AtomicU64>) {
    let spawned = std::thread::Builder::new()
        .name("sluice-memory".into())
        .spawn(move || loop {
            std::thread::sleep(SAMPLE_EVERY);
            let Some(r) = in_use.upgrade() else { return };
            if let Some(now) = memory_in_use() {
                r.store(
                    now.saturating_sub(reusable.load(Ordering::Relaxed)),
                    Ordering::Relaxed,
                );
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the memory sampling thread; limits.max_memory_bytes is checked against the memory at start only");
    }
}

/// The memory this process holds for data, as Redis's `used_memory`
/// counts it: what its allocator has handed out and not had back (glibc's
/// `mallinfo2`: arena bytes in use and large chunks mapped on their own),
/// plus its shared pages (a volatile shard's log in tmpfs, mapped). Not
/// its resident set: memory freed by removing keys stays resident in the
/// allocator's arenas, where the next writes reuse it, and a limit on the
/// resident set would refuse them for good. Elsewhere than glibc, the
/// resident anonymous and shared pages. `None` where neither is known.
pub fn memory_in_use() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok();
    let shmem = status.as_deref().and_then(|s| status_kb(s, "RssShmem:"));
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: a plain C call that takes no arguments and returns a
        // struct by value; glibc walks its arenas under their locks.
        let m = unsafe { libc::mallinfo2() };
        Some(m.uordblks as u64 + m.hblkhd as u64 + shmem.unwrap_or(0))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        Some(status_kb(status.as_deref()?, "RssAnon:")? + shmem.unwrap_or(0))
    }
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_kb(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container's memory limit (cgroup v2 and v1, set on the group or
    /// an ancestor) is what the node may use; v1's "no limit" is none.
    #[test]
    fn a_control_groups_memory_limit_is_found() {
        let root = tempfile::tempdir().unwrap();
        let put = |rel: &str, text: &str| {
            let p = root.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        put("system.slice/memory.max", "2147483648\n");
        put("system.slice/sluice.service/memory.max", "max\n");
        assert_eq!(
            cgroup_limit(root.path(), "0::/system.slice/sluice.service\n"),
            Some(2 << 30)
        );
        put("memory/docker/abc/memory.limit_in_bytes", "1073741824\n");
        put("memory/memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(
            cgroup_limit(
                root.path(),
                "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n"
            ),
            Some(1 << 30)
        );
        assert_eq!(cgroup_limit(root.path(), "4:memory:/\n"), None);
        assert_eq!(cgroup_limit(root.path(), "0::/elsewhere\n"), None);
    }

    /// One test (tests run side by side in one process: another holding
    /// memory meanwhile would move this one's baseline).
    #[test]
    fn writes_past_the_limit_are_refused_saying_so() {
        let status = "Name:\tsluice\nVmRSS:\t  900 kB\nRssAnon:\t  300 kB\nRssShmem:\t  100 kB\n";
        assert_eq!(status_kb(status, "RssAnon:"), Some(300 * 1024));
        assert_eq!(status_kb(status, "RssFile:"), None);
        // A limit that refuses everything, or that the kernel beats.
        let machine = Some(Ceiling {
            bytes: 100,
            cgroup: false,
        });
        assert!(limit_warning(10, 20, machine).unwrap().contains("below"));
        assert!(limit_warning(200, 20, machine)
            .unwrap()
            .contains("above this machine's memory"));
        assert_eq!(limit_warning(50, 20, machine), None);
        let group = Some(Ceiling {
            bytes: 100,
            cgroup: true,
        });
        assert!(limit_warning(200, 20, group)
            .unwrap()
            .contains("control group"));
        assert_eq!(no_limit_warning(machine), None);
        assert!(no_limit_warning(group).unwrap().contains("e.g. 80"));
        assert!(physical_memory().is_some_and(|p| p > 1 << 20));
        let none = MemoryLimit::new(1, 0);
        none.admit(usize::MAX).unwrap();
        // Where the system says (Linux): this process's, which grows with
        // what it holds, and the limit follows it.
        let Some(now) = memory_in_use() else { return };
        let l = MemoryLimit::new(7, now + (32 << 20));
        l.admit(1 << 20).unwrap();
        let e = l.admit(64 << 20).unwrap_err();
        match &e {
            SluiceError::OutOfMemory { node: 7, max, .. } => assert_eq!(*max, now + (32 << 20)),
            other => panic!("{other:?}"),
        }
        let m = e.to_string();
        assert!(
            m.contains("limits.max_memory_bytes") && m.contains("reads and removes go on"),
            "{m}"
        );
        assert_eq!(l.refused.load(Ordering::Relaxed), 1);
        let held = std::hint::black_box(vec![1u8; 64 << 20]);
        assert!(memory_in_use().unwrap() >= now + (60 << 20));
        let until = |refused: bool, what: &str| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while l.admit(0).is_err() != refused {
                assert!(std::time::Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        until(true, "the sampler never saw 64 MB more");
        // Buffers kept for reuse are not counted: the same 64 MB, as such.
        l.reusable().store(64 << 20, Ordering::Relaxed);
        until(false, "buffers kept for reuse still counted");
        l.admit(1 << 20).unwrap();
        l.reusable().store(0, Ordering::Relaxed);
        until(true, "the 64 MB no longer kept for reuse not counted again");
        // Given back (a removed key's value), it counts no more: writes
        // go on (a resident-set limit refused them for good, the
        // allocator keeping the pages for the next ones).
        drop(held);
        until(false, "64 MB given back still counted");
    }
}
