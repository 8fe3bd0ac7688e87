//! Helpers shared by the CLI's process tests.

#![allow(dead_code)] // each test binary uses some of these

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Whether `python3` runs here (the Python lambdas' tests skip without it).
pub fn python3_present() -> bool {
    Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A base port with `n` free consecutive ports after it on 127.0.0.1
/// (bound then released; the nodes bind them next). Each call draws
/// another candidate, so tests running together do not pick the same.
/// The ports lie below the kernel's ephemeral range: between the check
/// and the node's bind, any outgoing connection on the machine may be
/// given a port from that range (which once took a node's port in CI).
pub fn free_base(n: u16) -> u16 {
    let below = ephemeral_low().saturating_sub(n).max(10_001);
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut seed = (std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15)
        .wrapping_add(call.wrapping_mul(0x2545_f491_4f6c_dd1d));
    for _ in 0..200 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let base = 10_000 + (seed >> 33) as u16 % (below - 10_000);
        if (0..n).all(|i| TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], base + i))).is_ok()) {
            return base;
        }
    }
    panic!("no {n} free consecutive ports");
}

/// The first port of the kernel's ephemeral range (Linux's default where
/// it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A `sluice serve` process; killed (and its directory removed) when
/// dropped.
pub struct Node {
    pub child: Child,
    pub addr: String,
    pub dir: PathBuf,
    pub lines: mpsc::Receiver<String>,
    /// What it printed before it listened.
    pub before: Vec<String>,
}

/// A fresh directory that outlives this call (node processes and the
/// `Node` that removes it when dropped own it from here).
pub fn temp_dir(tag: &str) -> PathBuf {
    tempfile::Builder::new()
        .prefix(&format!("sluice-cli-{tag}-"))
        .tempdir()
        .unwrap()
        .keep()
}

/// Starts `sluice serve` with `args` in `cwd` and waits (bounded) for its
/// "listening on" line.
pub fn spawn_node(cwd: &Path, args: &[&str]) -> Result<Node, String> {
    spawn_node_env(cwd, args, &[])
}

/// `spawn_node` with these environment variables set.
pub fn spawn_node_env(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Node, String> {
    spawn_node_with(cwd, args, env, None)
}

/// `spawn_node_env` in a process that may open at most `nofile` files
/// (soft and hard limit: `ulimit -n`), when given.
pub fn spawn_node_with(
    cwd: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    nofile: Option<u64>,
) -> Result<Node, String> {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve").args(args).envs(env.iter().copied());
    if let Some(n) = nofile {
        use std::os::unix::process::CommandExt;
        // SAFETY: only setrlimit, async-signal-safe, runs in the child.
        unsafe {
            cmd.pre_exec(move || {
                let r = libc::rlimit {
                    rlim_cur: n as libc::rlim_t,
                    rlim_max: n as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    spawn_node_cmd(cwd, cmd)
}

/// Starts `cmd`, a command that runs `sluice serve` (or execs it), in
/// `cwd`, and waits (bounded) for its "listening on" line.
pub fn spawn_node_cmd(cwd: &Path, mut cmd: Command) -> Result<Node, String> {
    cmd.current_dir(cwd)
        .env("SLUICE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx2.send(format!("stderr: {l}"));
        }
    });
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) if l.contains("listening on") => {
                let addr = l
                    .split("listening on ")
                    .nth(1)
                    .unwrap()
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .to_string();
                return Ok(Node {
                    child,
                    addr,
                    dir: cwd.to_path_buf(),
                    lines: rx,
                    before: seen,
                });
            }
            Ok(l) => seen.push(l),
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().unwrap();
                return Err(format!("node did not start ({status}): {seen:?}"));
            }
        }
    }
}

pub fn start_node() -> Node {
    let dir = temp_dir("node");
    spawn_node(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
        ],
    )
    .unwrap()
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// CLI commands against a node.
impl Node {
    pub fn sluice(&self, args: &[&str]) -> Output {
        self.sluice_stdin(args, None)
    }

    pub fn sluice_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut c = Command::new(BIN)
            .arg("--addr")
            .arg(&self.addr)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = c.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s).unwrap();
        }
        drop(input);
        c.wait_with_output().unwrap()
    }

    /// Runs a command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.sluice(args);
        assert!(
            o.status.success(),
            "sluice {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// Runs a command that must fail; returns its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.sluice(args);
        assert!(
            !o.status.success(),
            "sluice {args:?} should fail: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        String::from_utf8(o.stderr).unwrap()
    }
}
