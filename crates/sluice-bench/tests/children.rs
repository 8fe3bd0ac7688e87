//! A benchmark killed outright (SIGKILL, as `timeout -s KILL` does) takes
//! its children with it, and the next benchmark removes the temporary
//! directories the killed one left.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BENCH: &str = env!("CARGO_BIN_EXE_sluice-bench");

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` runs (a zombie nobody has reaped yet counts as ended).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let state = s.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

#[cfg(target_os = "linux")]
#[test]
fn a_killed_benchmark_ends_its_children_and_the_next_one_sweeps_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    // What a benchmark whose process is gone left behind, and what is not
    // a benchmark's.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let stale = tmp.path().join(format!("sluice-bench-cluster-{dead}-3"));
    std::fs::create_dir_all(stale.join("node-0")).unwrap();
    let other = tmp.path().join("sluice-bench-base");
    std::fs::create_dir_all(&other).unwrap();

    // The Python side of `sluice bench python`, stood in for by a script
    // that says its pid and stays.
    let pidfile = tmp.path().join("child.pid");
    let script = tmp.path().join("python");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho $$ > {}\nexec sleep 60\n",
            pidfile.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

    let mut bench = Command::new(BENCH)
        .args(["python", "--server", "127.0.0.1:9", "--python"])
        .arg(&script)
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the child's pid", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
    });
    let child: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(running(child));
    assert!(!stale.exists(), "the stale directory is still there");
    assert!(
        other.exists(),
        "a directory that is no benchmark's was removed"
    );

    bench.kill().unwrap();
    bench.wait().unwrap();
    wait_until("the child to end with the benchmark", || !running(child));
    assert!(Path::new(&other).exists());
}
