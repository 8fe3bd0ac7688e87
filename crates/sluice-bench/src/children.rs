//! The processes a benchmark starts (nodes, Redis, etcd, Python) end with
//! it, however it ends; and what an earlier benchmark left behind when it
//! was killed (its temporary directories, its volatile logs in
//! `/dev/shm`) is removed when the next one starts.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// A command for a child of this benchmark. On Linux the kernel sends the
/// child SIGTERM when the thread that started it ends
/// (`PR_SET_PDEATHSIG`): so a benchmark stopped by a signal (`timeout`,
/// a closed terminal, SIGKILL) leaves no nodes holding ports. The
/// benchmarks start their children from the main thread, which lives as
/// long as the process.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; nothing else runs between
        // fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}

/// Checks before a benchmark starts that the peer system's programs it
/// will run are installed: `tools` are (program, an argument that makes it
/// print its version and exit). A missing one is an error naming it and
/// `hint` (what to install, or the flag that skips that comparison), so
/// a long run does not measure Sluice and then stop at the peer's start
/// without printing anything.
pub fn require_tools(tools: &[(&str, &str)], hint: &str) -> anyhow::Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(t, arg)| Command::new(t).arg(arg).output().is_err())
        .map(|(t, _)| *t)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{} not found ({hint})", missing.join(" and "))
    }
}

/// The process id in the name of a file or directory a benchmark makes
/// (`sluice-bench-<pid>-<n>`, `sluice-bench-<kind>-<pid>[-<n>]`,
/// `sluice-bench-streams-<pid>.toml`), or `None` for any other name.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("sluice-bench-")?;
    let rest = ["persistent-", "redis-", "cluster-", "streams-", "marks-"]
        .iter()
        .find_map(|k| rest.strip_prefix(k))
        .unwrap_or(rest);
    let rest = rest.strip_suffix(".toml").unwrap_or(rest);
    let mut parts = rest.split('-');
    let pid = parts.next()?;
    let tail_ok = match (parts.next(), parts.next()) {
        (None, _) => true,
        (Some(n), None) => !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        _ => false,
    };
    let numeric = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (tail_ok && numeric && !pid.starts_with('0'))
        .then(|| pid.parse().ok())
        .flatten()
}

/// Removes what benchmarks whose process is gone left in `dirs`: entries
/// named as `owner_pid` reads, whose process no longer exists. Returns
/// how many it removed. (`alive` sees this PID namespace: benchmarks in
/// other containers must not share the temporary directory.)
pub fn sweep_in(dirs: &[&Path], alive: impl Fn(u32) -> bool) -> usize {
    let mut removed = 0;
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(owner_pid) else {
                continue;
            };
            if alive(pid) {
                continue;
            }
            let p = e.path();
            let r = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            if r.is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// `sweep_in` over the temporary directory and `/dev/shm`, saying what it
/// did.
pub fn sweep_stale() {
    let tmp = std::env::temp_dir();
    let n = sweep_in(&[&tmp, Path::new("/dev/shm")], |pid| {
        Path::new(&format!("/proc/{pid}")).exists()
    });
    if n > 0 {
        eprintln!("removed {n} temporary file(s) left by benchmarks that were killed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_benchmark_files_give_their_process() {
        for (name, pid) in [
            ("sluice-bench-4242-0", Some(4242)),
            ("sluice-bench-4242-17", Some(4242)),
            ("sluice-bench-cluster-4242-3", Some(4242)),
            ("sluice-bench-persistent-4242", Some(4242)),
            ("sluice-bench-redis-4242", Some(4242)),
            ("sluice-bench-marks-4242", Some(4242)),
            ("sluice-bench-streams-4242.toml", Some(4242)),
            // Anything else is somebody else's.
            ("sluice-bench-base", None),
            ("sluice-bench-09", None),
            ("sluice-bench-4242-x", None),
            ("sluice-bench-4242-1-2", None),
            ("sluice-bench-tls-abc", None),
            ("sluice-4242", None),
        ] {
            assert_eq!(owner_pid(name), pid, "{name}");
        }
    }

    #[test]
    fn a_missing_peer_program_is_named_with_the_hint() {
        require_tools(&[("sh", "-c")], "never shown").unwrap();
        let e = require_tools(
            &[("sh", "-c"), ("sluice-no-such-program", "--version")],
            "install it, or pass --no-it",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "sluice-no-such-program not found (install it, or pass --no-it)"
        );
    }

    #[test]
    fn only_what_a_gone_benchmark_left_is_removed() {
        let d = tempfile::tempdir().unwrap();
        for n in [
            "sluice-bench-111-0",
            "sluice-bench-cluster-222-3",
            "sluice-bench-streams-111.toml",
            "sluice-bench-base",
        ] {
            if n.ends_with(".toml") {
                std::fs::write(d.path().join(n), "x").unwrap();
            } else {
                std::fs::create_dir_all(d.path().join(n).join("node-0")).unwrap();
            }
        }
        // 222 is alive; 111 is gone.
        let removed = sweep_in(&[d.path()], |pid| pid == 222);
        assert_eq!(removed, 2);
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["sluice-bench-base", "sluice-bench-cluster-222-3"]);
    }
}
