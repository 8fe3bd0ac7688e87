//! A local cluster of `sluice serve` processes.

use anyhow::{bail, Context, Result};
use sluice_client::{Client, ClientConfig};
use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A local cluster of `sluice serve` processes, killed on drop.
pub struct Procs {
    dir: PathBuf,
    /// Volatile shards' logs (RAM-backed when /dev/shm exists), removed on drop.
    shm: PathBuf,
    layout: PathBuf,
    pub addrs: Vec<String>,
    children: Vec<Option<Child>>,
}

pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Procs {
    pub fn start(n: u32, threads: usize) -> Result<Procs> {
        Procs::start_with(n, threads, None)
    }

    /// `n` nodes, one volatile and one trigger shard on all of them; with
    /// `persistent_sync`, also one persistent shard (its consensus log on
    /// the disk under the temporary directory, synced per that policy).
    pub fn start_with(n: u32, threads: usize, persistent_sync: Option<&str>) -> Result<Procs> {
        let all: Vec<u32> = (0..n).collect();
        Procs::start_custom(n, threads, persistent_sync, &all, "")
    }

    /// `start_with`, the volatile shard on `volatile` only, and `cluster`
    /// added to each node's `[cluster]` section.
    pub fn start_custom(
        n: u32,
        threads: usize,
        persistent_sync: Option<&str>,
        volatile: &[u32],
        cluster: &str,
    ) -> Result<Procs> {
        Procs::start_layout(n, threads, persistent_sync, volatile, 1, cluster, None)
    }

    /// `n` nodes with one volatile shard on all of them, over mutual TLS
    /// (each node's certificate from `pki`; clients need the CA and
    /// `pki`'s client certificate).
    pub fn start_tls(n: u32, threads: usize, pki: &sluice_tls::DevPki) -> Result<Procs> {
        let all: Vec<u32> = (0..n).collect();
        Procs::start_layout(n, threads, None, &all, 1, "", Some(pki))
    }

    /// `start_custom` with `vol_shards` volatile shards, each on every
    /// node of `volatile`, and with `tls`, each node's `[tls]` from it.
    pub fn start_layout(
        n: u32,
        threads: usize,
        persistent_sync: Option<&str>,
        volatile: &[u32],
        vol_shards: usize,
        cluster: &str,
        tls: Option<&sluice_tls::DevPki>,
    ) -> Result<Procs> {
        // One name per cluster this process starts (two may run at once).
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("sluice-bench-cluster-{}-{k}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut addrs = Vec::new();
        let mut text = String::from("version = 1\n");
        for i in 0..n {
            let a = format!("127.0.0.1:{}", free_port()?);
            text.push_str(&format!("[[nodes]]\nid = {i}\naddress = \"{a}\"\n"));
            addrs.push(a);
        }
        let members: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let vol: Vec<String> = volatile.iter().map(|i| i.to_string()).collect();
        text.push_str(&format!(
            "[[subgroups.volatile]]\nshards = [{v}]\n[[subgroups.trigger]]\nshards = [[{m}]]\n",
            v = vec![format!("[{}]", vol.join(", ")); vol_shards.max(1)].join(", "),
            m = members.join(", ")
        ));
        if persistent_sync.is_some() {
            text.push_str(&format!(
                "[[subgroups.persistent]]\nshards = [[{}]]\n",
                members.join(", ")
            ));
        }
        let layout = dir.join("layout.toml");
        std::fs::write(&layout, text)?;
        let shm = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from(format!("/dev/shm/sluice-bench-{}-{k}", std::process::id()))
        } else {
            dir.join("volatile")
        };
        for i in 0..n {
            let tls = match tls {
                Some(pki) => pki
                    .node_section(i)
                    .context("the development CA has fewer node certificates than nodes")?,
                None => String::new(),
            };
            std::fs::write(
                dir.join(format!("node-{i}.toml")),
                format!(
                    "worker_threads = {threads}\n[persistent]\nsync = \"{}\"\n[cluster]\nvolatile_dir = \"{}\"\n{cluster}\n{tls}",
                    persistent_sync.unwrap_or("always"),
                    shm.join(format!("node-{i}")).display()
                ),
            )?;
        }
        let mut p = Procs {
            dir,
            shm,
            layout,
            addrs,
            children: Vec::new(),
        };
        for i in 0..n {
            let c = p.spawn(i)?;
            p.children.push(Some(c));
        }
        Ok(p)
    }

    fn spawn(&self, i: u32) -> Result<Child> {
        let exe = crate::harness::sluice_exe()?;
        crate::children::command(exe)
            .arg("serve")
            .arg("--config")
            .arg(self.dir.join(format!("node-{i}.toml")))
            .arg("--cluster")
            .arg(&self.layout)
            .arg("--node-id")
            .arg(i.to_string())
            .arg("--data-dir")
            .arg(self.dir.join(format!("node-{i}")))
            // The nodes' log filter: SLUICE_BENCH_NODE_LOG, else warnings.
            .env(
                "SLUICE_LOG",
                std::env::var("SLUICE_BENCH_NODE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting `sluice serve --cluster`")
    }

    /// The live node processes' ids.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().flatten().map(Child::id).collect()
    }

    pub fn kill(&mut self, i: u32) {
        if let Some(mut c) = self.children[i as usize].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self, i: u32) -> Result<()> {
        let c = self.spawn(i)?;
        self.children[i as usize] = Some(c);
        Ok(())
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.shm);
    }
}

pub async fn connect(addr: &str, timeout: Duration) -> Result<Client> {
    connect_with(addr, timeout, None).await
}

/// `connect`, over TLS with `tls`.
pub async fn connect_with(
    addr: &str,
    timeout: Duration,
    tls: Option<&sluice_tls::ClientTls>,
) -> Result<Client> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::connect_with(ClientConfig {
            addr: addr.to_string(),
            request_timeout: timeout,
            tls: tls.cloned(),
            ..Default::default()
        })
        .await
        {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => bail!("node {addr} did not come up: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Page faults (minor + major) processes `pids` have taken so far, all
/// their threads together (`/proc/PID/stat`; 0 where it cannot be read).
pub fn page_faults_of(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat_faults(&stat).1
        })
        .sum()
}

/// A `stat` file's command name and page faults (minor + major).
fn stat_faults(stat: &str) -> (&str, u64) {
    // The command name is in parentheses and may hold spaces or ')';
    // after it, state is field 3, minflt field 10, majflt field 12.
    let Some((head, rest)) = stat.rsplit_once(") ") else {
        return ("", 0);
    };
    let name = head.split_once('(').map_or("", |(_, n)| n);
    let f: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
    (
        name,
        f.get(7).copied().unwrap_or(0) + f.get(9).copied().unwrap_or(0),
    )
}

/// The thread of a mapped log that maps and pre-faults the next segment
/// (`sluice-cluster`'s `log::disk`): its faults are what keeps them off
/// the write path. Its name as the kernel keeps it: `sluice-log-spare`
/// cut to 15 bytes.
pub const SPARE_THREAD: &str = "sluice-log-spar";

/// Page faults of processes so far: all their threads together, and
/// each live thread's (`/proc/PID/task/TID/stat`).
#[derive(Debug, Default, Clone)]
pub struct Faults {
    pub all: u64,
    threads: HashMap<(u32, u32), (String, u64)>,
}

impl Faults {
    pub fn of(pids: &[u32]) -> Faults {
        let mut threads = HashMap::new();
        for &pid in pids {
            let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for t in dir.flatten() {
                let Some(tid) = t.file_name().to_str().and_then(|n| n.parse().ok()) else {
                    continue;
                };
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                let (name, n) = stat_faults(&stat);
                threads.insert((pid, tid), (name.to_string(), n));
            }
        }
        Faults {
            all: page_faults_of(pids),
            threads,
        }
    }

    /// Faults since `before` on the write path: those of every thread
    /// alive now but the spare-segment preparer ([`SPARE_THREAD`]),
    /// counted from zero for a thread that started since. (A thread that
    /// ended in between is not counted: the nodes' runtime threads live
    /// as long as the node.)
    pub fn on_path_since(&self, before: &Faults) -> u64 {
        self.threads
            .iter()
            .filter(|(_, (name, _))| name != SPARE_THREAD)
            .map(|(k, (_, n))| n.saturating_sub(before.threads.get(k).map_or(0, |(_, b)| *b)))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_name_and_faults() {
        // minflt 1234 (field 10), majflt 5 (field 12); a name with ") ".
        let stat = "42 (odd) name) S 1 42 42 0 -1 4194560 1234 0 5 0 7 3 0 0 20 0 1 0";
        assert_eq!(stat_faults(stat), ("odd) name", 1239));
        assert_eq!(stat_faults("garbage"), ("", 0));
    }

    /// The write path's faults leave the spare-segment preparer out and
    /// count a new thread from zero.
    #[test]
    fn faults_on_the_write_path_leave_the_spare_preparer_out() {
        let at = |ts: &[(u32, &str, u64)]| Faults {
            all: ts.iter().map(|t| t.2).sum(),
            threads: ts
                .iter()
                .map(|&(tid, n, f)| ((1, tid), (n.to_string(), f)))
                .collect(),
        };
        let before = at(&[(10, "tokio-rt-worker", 100), (11, SPARE_THREAD, 5000)]);
        let after = at(&[
            (10, "tokio-rt-worker", 130),
            (11, SPARE_THREAD, 14000),
            (12, "tokio-rt-worker", 7),
        ]);
        assert_eq!(after.on_path_since(&before), 37);
        // This process's own threads are there to be read.
        let me = Faults::of(&[std::process::id()]);
        assert!(me.all > 0 && !me.threads.is_empty());
    }
}
