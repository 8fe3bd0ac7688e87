//! `sluice bench cluster`: replicated volatile puts and stable /
//! linearizable gets on shards of 1, 3 and 5 real node processes, failover
//! time after SIGKILL of the leader, next to redis-server with two
//! replicas (`SET` + `WAIT 2 0`) and the loopback TCP round trip, all
//! measured in the same run.

use crate::harness::{closed_loop, fmt_size, report, row, Op, Row};
use crate::peers::{baseline_server, raw_op, redis_op, SluiceOp};
use crate::procs::{connect, free_port, Faults, Procs};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use sluice_client::{Client, SluiceError};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone)]
pub struct ClusterBenchArgs {
    /// Shard sizes (members per shard; one node process per member).
    #[arg(long, value_delimiter = ',', default_value = "1,3,5")]
    shard_sizes: Vec<u32>,
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "10240,1048576")]
    sizes: Vec<usize>,
    /// Concurrent clients in the throughput phase.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Length of each measurement phase.
    #[arg(long, default_value_t = 2000)]
    duration_ms: u64,
    /// Leader kills per shard size of 3 or more (failover time).
    #[arg(long, default_value_t = 3)]
    failovers: u32,
    /// Skip the redis-server comparison.
    #[arg(long)]
    no_redis: bool,
    /// After the usual phases, the put phases of the shard of 3 and of
    /// Redis (`WAIT 2`) again, taking turns: this many slices each of
    /// `duration-ms / turns` (0: not run). On a machine whose speed drifts
    /// from phase to phase (a shared VM), the two are then measured over
    /// the same stretch of time.
    #[arg(long, default_value_t = 4)]
    turns: u32,
    /// Seconds of saturated writes (the throughput phase's clients with
    /// 10 KB values, plus two with 1 MB values) on shards of 3 or more,
    /// counting the elections they cause (there should be none).
    #[arg(long, default_value_t = 0)]
    saturated_s: u64,
    /// Seconds per phase of the head-of-line measurement (0: skipped): a
    /// cluster of three nodes with two volatile shards; one client's 10 KB
    /// puts to one shard, alone and while two clients put 1 MB values to
    /// the other. Compare `--cluster-config "peer_bulk_bytes = 0"` (one
    /// connection per peer for everything).
    #[arg(long, default_value_t = 0)]
    interference_s: u64,
    /// Nodes run with `fast_failover = false`: a dead leader is replaced
    /// by the election timers only (the comparison for failover times).
    #[arg(long)]
    no_fast_failover: bool,
    /// TOML lines added to every node's `[cluster]` section (e.g.
    /// "snapshot_bytes = 1073741824"), to measure a setting.
    #[arg(long, default_value = "")]
    cluster_config: String,
    /// Tokio worker threads per node (0: one per core). Nodes of a real
    /// cluster have a machine each; co-located on one small machine they
    /// compete for its cores.
    #[arg(long, default_value_t = 0)]
    node_threads: usize,
    /// Also show where the one-client puts spent their time inside each
    /// shard of 2 or more, step by step (the nodes record marks: `SLUICE_MARKS`).
    #[arg(long)]
    breakdown: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The leader of the volatile shard as `c`'s node knows it.
async fn leader(c: &Client) -> Result<Option<u32>> {
    let info = c
        .cluster_command(serde_json::json!({"op": "info"}), None)
        .await?;
    Ok(info["shards"]["volatile/0/0"]["leader"]
        .as_u64()
        .map(|l| l as u32))
}

pub(crate) async fn wait_leader(c: &Client) -> Result<u32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(l) = leader(c).await? {
            if c.put("/vol/ready", "x").await.is_ok() {
                return Ok(l);
            }
        }
        if Instant::now() > deadline {
            bail!("no leader after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Clone)]
struct LinOp(SluiceOp);

impl Op for LinOp {
    async fn call(&mut self, i: u64) -> Result<()> {
        let key = format!("{}/{}", self.0.prefix, i % 64);
        let o = self.0.client.get_linearizable(&key).await?;
        if o.value.len() != self.0.value.len() {
            bail!("short read");
        }
        Ok(())
    }
}

/// A put and then a stable get of the same key by the same client (read
/// your writes): the get goes to the members in turn and must see the
/// put, so a follower that has not applied it yet costs a second try.
#[derive(Clone)]
struct PutThenGet(SluiceOp);

impl Op for PutThenGet {
    async fn call(&mut self, i: u64) -> Result<()> {
        let key = format!("{}/{}", self.0.prefix, i % 64);
        self.0.client.put(&key, self.0.value.clone()).await?;
        let o = self.0.client.get(&key).await?;
        if o.value.len() != self.0.value.len() {
            bail!("short read");
        }
        Ok(())
    }
}

/// The members' page-fault count a third into a phase of length `dur`
/// (the first third warms the log, the pools and the allocator up).
fn steady_faults(procs: &Procs, dur: Duration) -> tokio::task::JoinHandle<Faults> {
    let pids = procs.pids();
    tokio::spawn(async move {
        tokio::time::sleep(dur / 3).await;
        Faults::of(&pids)
    })
}

/// Page faults per operation over the last two thirds of a phase: the
/// faults since `start`'s count over the operations at the phase's rate,
/// of all threads, and of those on the write path (all but the log's
/// spare-segment preparer, `Faults::on_path_since`).
async fn faults_per_op(
    procs: &Procs,
    start: tokio::task::JoinHandle<Faults>,
    r: &(hdrhistogram::Histogram<u64>, Duration, u64),
    dur: Duration,
) -> (f64, f64) {
    let end = Faults::of(&procs.pids());
    let start = start.await.unwrap_or_else(|_| end.clone());
    let rate = r.0.len() as f64 / r.1.as_secs_f64();
    let ops = (rate * dur.as_secs_f64() * 2.0 / 3.0).max(1.0);
    (
        end.all.saturating_sub(start.all) as f64 / ops,
        end.on_path_since(&start) as f64 / ops,
    )
}

/// The mode of rows whose phases took turns (`taking_turns`).
const TURNS: &str = "turns";

/// Two targets' closed-loop phases taking turns: `turns` slices of
/// `dur / turns` each, A then B, their histograms, times and errors
/// added up (the workers are made anew for each slice).
async fn taking_turns<A, B, FB>(
    turns: u32,
    dur: Duration,
    label: &str,
    mut a: impl FnMut() -> Vec<A>,
    mut b: impl FnMut() -> FB,
) -> Result<[(hdrhistogram::Histogram<u64>, Duration, u64); 2]>
where
    A: Op,
    B: Op,
    FB: std::future::Future<Output = Result<Vec<B>>>,
{
    let slice = dur / turns.max(1);
    let mut sums = [
        (crate::harness::hist(), Duration::ZERO, 0),
        (crate::harness::hist(), Duration::ZERO, 0),
    ];
    let add = |sum: &mut (hdrhistogram::Histogram<u64>, Duration, u64),
               r: (hdrhistogram::Histogram<u64>, Duration, u64)| {
        let _ = sum.0.add(&r.0);
        sum.1 += r.1;
        sum.2 += r.2;
    };
    for t in 1..=turns {
        let r = closed_loop(a(), slice, format!("turn {t}/{turns}: sluice {label}")).await;
        add(&mut sums[0], r);
        let r = closed_loop(
            b().await?,
            slice,
            format!("turn {t}/{turns}: redis {label}"),
        )
        .await;
        add(&mut sums[1], r);
    }
    Ok(sums)
}

/// CPU time each of `pids` has used so far (zero where unreadable).
fn cpu_of(pids: &[u32]) -> Vec<Duration> {
    pids.iter()
        .map(|p| crate::harness::cpu_time(*p).unwrap_or_default())
        .collect()
}

/// µs of CPU each process spent per operation of a phase: its CPU time
/// from `before` to now over the phase's `ops`.
fn cpu_per_op(pids: &[u32], before: &[Duration], ops: u64) -> Vec<f64> {
    cpu_of(pids)
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b).as_secs_f64() * 1e6 / ops.max(1) as f64)
        .collect()
}

/// Per-process CPU per put of a many-client phase: the primary's (the
/// shard's leader, redis's master) first, then each replica's.
struct CpuPerPut {
    who: String,
    size: usize,
    us: Vec<f64>,
}

/// Node `c`'s groups, from its `cluster status`.
async fn groups(c: &Client) -> Result<Vec<serde_json::Value>> {
    let st = c
        .cluster_command(serde_json::json!({"op": "status"}), None)
        .await?;
    Ok(st["groups"].as_array().cloned().unwrap_or_default())
}

/// The volatile shard's entry in node `c`'s `cluster status`.
async fn shard_status(c: &Client) -> Result<serde_json::Value> {
    let g = groups(c).await?;
    Ok(g.into_iter()
        .find(|g| g["group"] == "volatile/0/0")
        .unwrap_or_default())
}

/// Waits until restarted node `l` follows the shard's leader and has
/// applied everything `probe`'s node had (a member back in service, as
/// before the kill, so each kill is measured from the same state).
async fn caught_up(procs: &Procs, l: u32, probe: &Client) -> Result<()> {
    let target = shard_status(probe).await?["applied_index"]
        .as_u64()
        .unwrap_or(0);
    let back = connect(&procs.addrs[l as usize], Duration::from_secs(10)).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = shard_status(&back).await?;
        let follows = s["role"] == "follower" && s["leader"].as_u64().is_some();
        if follows && s["applied_index"].as_u64().unwrap_or(0) >= target {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("node {l} did not catch up within 30 s after its restart: {s}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Each Raft group's term on each node (`cluster status`).
async fn terms(procs: &Procs) -> Result<std::collections::BTreeMap<(usize, String), u64>> {
    let mut out = std::collections::BTreeMap::new();
    for (i, addr) in procs.addrs.iter().enumerate() {
        let c = connect(addr, Duration::from_secs(10)).await?;
        for g in groups(&c).await? {
            let name = g["group"].as_str().unwrap_or_default().to_string();
            out.insert((i, name), g["term"].as_u64().unwrap_or(0));
        }
    }
    Ok(out)
}

struct Saturated {
    elections: u64,
    ops_per_s: f64,
    errors: u64,
}

/// Writes as fast as the clients can for `saturated_s` seconds and counts
/// the elections meanwhile: the largest term increase of any group on any
/// node (a false election under load shows as a new term).
async fn saturated(procs: &Procs, a: &ClusterBenchArgs) -> Result<Saturated> {
    let before = terms(procs).await?;
    let mut ws = Vec::new();
    for i in 0..a.clients + 2 {
        let size = if i < a.clients { 10_240 } else { 1 << 20 };
        ws.push(SluiceOp {
            client: connect(&procs.addrs[0], Duration::from_secs(10)).await?,
            op: "put",
            value: Bytes::from(vec![b's'; size]),
            prefix: format!("/vol/saturated/{size}"),
        });
    }
    let label = format!("saturated writes, {} s", a.saturated_s);
    let (h, took, errors) = closed_loop(ws, Duration::from_secs(a.saturated_s), label).await;
    let after = terms(procs).await?;
    let elections = after
        .iter()
        .map(|(k, t)| t.saturating_sub(before.get(k).copied().unwrap_or(*t)))
        .max()
        .unwrap_or(0);
    Ok(Saturated {
        elections,
        ops_per_s: h.len() as f64 / took.as_secs_f64(),
        errors,
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// redis-server as a master with two replicas on free loopback ports.
struct Redis {
    children: Vec<Child>,
    master: String,
    dir: PathBuf,
}

impl Drop for Redis {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_redis() -> Result<Redis> {
    // Replication makes the master write an RDB file for each replica's
    // full sync: keep it out of the working directory.
    let dir = std::env::temp_dir().join(format!("sluice-bench-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let start = |port: u16, replica_of: Option<u16>| -> Result<Child> {
        let mut cmd = crate::children::command("redis-server");
        cmd.current_dir(&dir);
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        if let Some(m) = replica_of {
            cmd.args(["--replicaof", "127.0.0.1", &m.to_string()]);
        }
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(
            "starting redis-server (install the Debian package redis-server, or pass --no-redis)",
        )
    };
    let mp = free_port()?;
    let mut children = vec![start(mp, None)?];
    for _ in 0..2 {
        children.push(start(free_port()?, Some(mp))?);
    }
    let r = Redis {
        children,
        master: format!("127.0.0.1:{mp}"),
        dir,
    };
    // Ready once the master reports both replicas online.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new("redis-cli")
            .args(["-p", &mp.to_string(), "info", "replication"])
            .output();
        if let Ok(o) = out {
            let s = String::from_utf8_lossy(&o.stdout);
            if s.contains("connected_slaves:2") && s.matches("state=online").count() == 2 {
                return Ok(r);
            }
        }
        if Instant::now() > deadline {
            bail!("redis replicas did not come online within 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn run(a: ClusterBenchArgs, json: bool) -> Result<()> {
    if !a.no_redis {
        // Readiness is read with redis-cli (`INFO replication`).
        crate::children::require_tools(
            &[("redis-server", "--version"), ("redis-cli", "--version")],
            "install the Debian packages redis-server and redis-tools, or pass --no-redis",
        )?;
    }
    // The node processes this starts inherit the variable (set before any
    // thread of this process starts).
    let marks_dir = a
        .breakdown
        .then(|| std::env::temp_dir().join(format!("sluice-bench-marks-{}", std::process::id())));
    if let Some(d) = &marks_dir {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d)?;
        std::env::set_var(sluice_types::marks::ENV, d);
    }
    // The one-client put phases to break down: label, window (ns), p50 (µs).
    let mut windows: Vec<(String, u64, u64, f64)> = Vec::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let dur = Duration::from_millis(a.duration_ms);
    let mut rows: Vec<Row> = Vec::new();
    let mut failover_ms: Vec<(u32, Vec<f64>, Vec<f64>)> = Vec::new();
    let mut spurious: Vec<(u32, Saturated)> = Vec::new();
    // (shard size, value size, clients, page faults per put on all
    // members: all threads, the write path's)
    let mut faults: Vec<(u32, usize, usize, (f64, f64))> = Vec::new();
    let mut cpus: Vec<CpuPerPut> = Vec::new();
    let base = baseline_server()?;
    // Up from the start: the phases that take turns with the shard of 3
    // need it beside the shard.
    let redis = if a.no_redis {
        None
    } else {
        Some(start_redis()?)
    };
    rt.block_on(async {
        for &size in &a.sizes {
            // Loopback: a put-shaped and a get-shaped round trip.
            for (op, req, resp) in [("put", size, 16), ("get_stable", 64, size)] {
                let w = vec![raw_op(base, req, resp).await?];
                let r = closed_loop(w, dur, format!("loopback {op} {}", fmt_size(size))).await;
                rows.push(row("loopback", op, size, "closed", 1, (&r.0, r.1, r.2)));
            }
        }
        for &n in &a.shard_sizes {
            eprintln!("shard of {n}: starting {n} node processes");
            let all: Vec<u32> = (0..n).collect();
            let mut settings = a.cluster_config.clone();
            if a.no_fast_failover {
                settings.push_str("\nfast_failover = false");
            }
            let mut procs = Procs::start_custom(n, a.node_threads, None, &all, &settings)?;
            let c0 = connect(&procs.addrs[0], Duration::from_secs(10)).await?;
            wait_leader(&c0).await?;
            let target = format!("sluice-r{n}");
            for &size in &a.sizes {
                let value = Bytes::from(vec![b'x'; size]);
                let op = |client: Client, op: &'static str| SluiceOp {
                    client,
                    op,
                    value: value.clone(),
                    prefix: format!("/vol/bench/{size}"),
                };
                let f = steady_faults(&procs, dur);
                let from = sluice_types::wall_us() * 1000;
                let r = closed_loop(vec![op(c0.clone(), "put")], dur, format!("{target} put {} c=1", fmt_size(size))).await;
                let to = sluice_types::wall_us() * 1000;
                faults.push((n, size, 1, faults_per_op(&procs, f, &r, dur).await));
                rows.push(row(&target, "put", size, "closed", 1, (&r.0, r.1, r.2)));
                // A shard of one replicates nothing to break down.
                if marks_dir.is_some() && n > 1 {
                    let p50 = r.0.value_at_quantile(0.5) as f64 / 1000.0;
                    windows.push((format!("{target} put {} c=1", fmt_size(size)), from, to, p50));
                }
                let mut ws = Vec::new();
                for _ in 0..a.clients {
                    ws.push(op(connect(&procs.addrs[0], Duration::from_secs(10)).await?, "put"));
                }
                // The leader's CPU first: the one-thread leader bounds
                // this phase, as redis's master bounds redis's. Asked now,
                // not when the shard started: earlier phases may have
                // moved it.
                let leader_ix = wait_leader(&c0).await? as usize;
                let mut pids = procs.pids();
                let last = pids.len().saturating_sub(1);
                pids.swap(0, leader_ix.min(last));
                let cpu = cpu_of(&pids);
                let f = steady_faults(&procs, dur);
                let r = closed_loop(ws, dur, format!("{target} put {} c={}", fmt_size(size), a.clients)).await;
                cpus.push(CpuPerPut { who: target.clone(), size, us: cpu_per_op(&pids, &cpu, r.0.len()) });
                faults.push((n, size, a.clients, faults_per_op(&procs, f, &r, dur).await));
                rows.push(row(&target, "put", size, "closed", a.clients, (&r.0, r.1, r.2)));
                let r = closed_loop(vec![op(c0.clone(), "get")], dur, format!("{target} stable get {}", fmt_size(size))).await;
                rows.push(row(&target, "get_stable", size, "closed", 1, (&r.0, r.1, r.2)));
                let r = closed_loop(vec![LinOp(op(c0.clone(), "get"))], dur, format!("{target} linearizable get {}", fmt_size(size))).await;
                rows.push(row(&target, "get_linearizable", size, "closed", 1, (&r.0, r.1, r.2)));
                let r = closed_loop(vec![PutThenGet(op(c0.clone(), "put"))], dur, format!("{target} put then get {}", fmt_size(size))).await;
                rows.push(row(&target, "put_then_get", size, "closed", 1, (&r.0, r.1, r.2)));
                if let (Some(redis), true) = (&redis, n == 3 && a.turns > 0) {
                    let mut clients = vec![c0.clone()];
                    for _ in 1..a.clients {
                        clients.push(connect(&procs.addrs[0], Duration::from_secs(10)).await?);
                    }
                    for c in [1, a.clients] {
                        let [s, r] = taking_turns(a.turns, dur, &format!("put {} c={c}", fmt_size(size)), || {
                            clients.iter().take(c).map(|cl| op(cl.clone(), "put")).collect()
                        }, || async {
                            let mut ws = Vec::new();
                            for _ in 0..c {
                                let mut w = redis_op(&redis.master, "put", size).await?;
                                w.wait_replicas = Some(2);
                                ws.push(w);
                            }
                            Ok(ws)
                        })
                        .await?;
                        rows.push(row(&target, "put", size, TURNS, c, (&s.0, s.1, s.2)));
                        rows.push(row("redis-w2", "put", size, TURNS, c, (&r.0, r.1, r.2)));
                    }
                }
            }
            if n >= 3 {
                let mut times = Vec::new();
                let mut elections = Vec::new();
                for k in 0..a.failovers {
                    let l = wait_leader(&c0).await?;
                    let probe_node = (0..n).find(|i| *i != l).unwrap_or(0);
                    let probe = connect(&procs.addrs[probe_node as usize], Duration::from_millis(500)).await?;
                    let t = Instant::now();
                    procs.kill(l);
                    // Time until a survivor knows a new leader...
                    let elected = loop {
                        if let Ok(Some(n)) = leader(&probe).await {
                            if n != l {
                                break t.elapsed();
                            }
                        }
                        if t.elapsed() > Duration::from_secs(30) {
                            bail!("no new leader within 30 s");
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    };
                    // ... and until a put is acknowledged again.
                    loop {
                        match probe.put(&format!("/vol/failover/{k}"), "x").await {
                            Ok(_) => break,
                            Err(SluiceError::ValueTooLarge { .. }) => bail!("unexpected"),
                            Err(_) if t.elapsed() < Duration::from_secs(30) => {}
                            Err(e) => bail!("no new leader within 30 s: {e}"),
                        }
                    }
                    let ms = t.elapsed().as_secs_f64() * 1000.0;
                    eprintln!(
                        "  failover {k}: leader {l} killed; new leader known after {:.0} ms, writes acknowledged again after {ms:.0} ms",
                        elected.as_secs_f64() * 1000.0
                    );
                    times.push(ms);
                    elections.push(elected.as_secs_f64() * 1000.0);
                    procs.restart(l)?;
                    caught_up(&procs, l, &probe).await?;
                }
                failover_ms.push((n, times, elections));
            }
            if n >= 3 && a.saturated_s > 0 {
                spurious.push((n, saturated(&procs, &a).await?));
            }
            drop(c0);
        }
        if a.interference_s > 0 {
            interference(&a, &mut rows).await?;
        }
        if let Some(redis) = &redis {
            for &size in &a.sizes {
                let mut w = redis_op(&redis.master, "put", size).await?;
                w.wait_replicas = Some(2);
                let r = closed_loop(vec![w], dur, format!("redis WAIT 2 put {}", fmt_size(size))).await;
                rows.push(row("redis-w2", "put", size, "closed", 1, (&r.0, r.1, r.2)));
                let mut ws = Vec::new();
                for _ in 0..a.clients {
                    let mut w = redis_op(&redis.master, "put", size).await?;
                    w.wait_replicas = Some(2);
                    ws.push(w);
                }
                let pids: Vec<u32> = redis.children.iter().map(Child::id).collect();
                let cpu = cpu_of(&pids);
                let r = closed_loop(ws, dur, format!("redis WAIT 2 put {} c={}", fmt_size(size), a.clients)).await;
                cpus.push(CpuPerPut { who: "redis-w2".into(), size, us: cpu_per_op(&pids, &cpu, r.0.len()) });
                rows.push(row("redis-w2", "put", size, "closed", a.clients, (&r.0, r.1, r.2)));
            }
        }
        Ok::<(), anyhow::Error>(())
    })?;
    report(&rows, json, a.out.as_deref())?;
    // Read once every phase is over: the nodes wrote each window's marks
    // out (every 100 ms) long before they stopped.
    let mut breakdowns: Vec<String> = Vec::new();
    if let Some(d) = &marks_dir {
        let files = crate::marks::read_dir(d)?;
        for (label, from, to, p50) in &windows {
            breakdowns.extend(crate::marks::report(
                label,
                &crate::marks::steps(&files, *from, *to),
                *p50,
            ));
        }
        let _ = std::fs::remove_dir_all(d);
    }
    if json {
        return Ok(());
    }
    for line in &breakdowns {
        println!("{line}");
    }
    for (n, mut t, mut e) in failover_ms {
        let max = t.iter().copied().fold(0.0, f64::max);
        println!(
            "failover, shard of {n}: new leader known after median {:.0} ms; writes acknowledged again after median {:.0} ms, max {max:.0} ms ({} leader kills)",
            median(&mut e),
            median(&mut t),
            t.len()
        );
    }
    for (n, size, c, (f, path)) in faults {
        println!(
            "page faults per put, shard of {n}, {} c={c}: {f:.2} (all members together, last two thirds of the phase); on the write path {path:.2} (every thread but the log's spare-segment preparer)",
            fmt_size(size)
        );
    }
    for (n, s) in spurious {
        println!(
            "saturated, shard of {n}: {} elections in {} s of writes at {:.0} ops/s ({} failed requests; target 0 elections)",
            s.elections, a.saturated_s, s.ops_per_s, s.errors
        );
    }
    for c in &cpus {
        let replicas: Vec<String> = c.us.iter().skip(1).map(|u| format!("{u:.1}")).collect();
        let replicas = if replicas.is_empty() {
            "none".to_string()
        } else {
            format!("{} µs", replicas.join(" / "))
        };
        println!(
            "CPU per put, {} {} c={}: primary {:.1} µs, replicas {replicas}",
            c.who,
            fmt_size(c.size),
            a.clients,
            c.us.first().copied().unwrap_or(f64::NAN),
        );
    }
    for &size in &a.sizes {
        let primary = |who: &str| {
            cpus.iter()
                .find(|c| c.who == who && c.size == size)
                .and_then(|c| c.us.first().copied())
        };
        if let (Some(s), Some(r)) = (primary("sluice-r3"), primary("redis-w2")) {
            println!(
                "3-replica put {} c={}: leader CPU per put {:.2}x redis master's (what bounds one-thread nodes' throughput)",
                fmt_size(size),
                a.clients,
                s / r
            );
        }
    }
    let find_in = |mode: &str, t: &str, op: &str, size: usize, c: usize| {
        rows.iter().find(|r| {
            r.mode == mode && r.target == t && r.op == op && r.size == size && r.clients == c
        })
    };
    let find = |t: &str, op: &str, size: usize, c: usize| find_in("closed", t, op, size, c);
    if let (Some(alone), Some(beside)) = (
        find("sluice-2shard", "put_alone", 10_240, 1),
        find("sluice-2shard", "put_beside_1MB", 10_240, 1),
    ) {
        println!(
            "head-of-line: 10KB put to one shard beside 1 MB puts to another, p50 {:.1} / p99 {:.1} µs against {:.1} / {:.1} µs alone = {:.2}x / {:.2}x",
            beside.p50_us,
            beside.p99_us,
            alone.p50_us,
            alone.p99_us,
            beside.p50_us / alone.p50_us,
            beside.p99_us / alone.p99_us
        );
    }
    for &size in &a.sizes {
        if let (Some(s), Some(r)) = (
            find("sluice-r3", "put", size, 1),
            find("redis-w2", "put", size, 1),
        ) {
            println!(
                "3-replica put {} p50: sluice {:.1} µs / redis WAIT 2 {:.1} µs = {:.2}x (goal <= 1.0x)",
                fmt_size(size),
                s.p50_us,
                r.p50_us,
                s.p50_us / r.p50_us
            );
        }
        if let (Some(s), Some(r)) = (
            find("sluice-r3", "put", size, a.clients),
            find("redis-w2", "put", size, a.clients),
        ) {
            println!(
                "3-replica put {} c={}: throughput {:.2}x redis WAIT 2 (goal >= 1.0x)",
                fmt_size(size),
                a.clients,
                s.ops_per_s / r.ops_per_s
            );
        }
        if let (Some(s), Some(r)) = (
            find_in(TURNS, "sluice-r3", "put", size, 1),
            find_in(TURNS, "redis-w2", "put", size, 1),
        ) {
            println!(
                "3-replica put {} p50, taking turns ({} each): sluice {:.1} µs / redis WAIT 2 {:.1} µs = {:.2}x (goal <= 1.0x)",
                fmt_size(size),
                a.turns,
                s.p50_us,
                r.p50_us,
                s.p50_us / r.p50_us
            );
        }
        if let (Some(s), Some(r)) = (
            find_in(TURNS, "sluice-r3", "put", size, a.clients),
            find_in(TURNS, "redis-w2", "put", size, a.clients),
        ) {
            println!(
                "3-replica put {} c={}, taking turns ({} each): throughput {:.2}x redis WAIT 2 (goal >= 1.0x)",
                fmt_size(size),
                a.clients,
                a.turns,
                s.ops_per_s / r.ops_per_s
            );
        }
        if let (Some(s), Some(l)) = (
            find("sluice-r3", "get_stable", size, 1),
            find("loopback", "get_stable", size, 1),
        ) {
            println!(
                "3-replica stable get {} p50: {:.2}x the loopback round trip (target <= 1.5x)",
                fmt_size(size),
                s.p50_us / l.p50_us
            );
        }
    }
    Ok(())
}

/// Puts to a fixed set of keys (all of one shard).
struct KeyedPut {
    client: Client,
    keys: std::sync::Arc<Vec<String>>,
    value: Bytes,
}

impl Op for KeyedPut {
    async fn call(&mut self, i: u64) -> Result<()> {
        let key = &self.keys[i as usize % self.keys.len()];
        self.client.put(key, self.value.clone()).await?;
        Ok(())
    }
}

/// `n` keys under `prefix` that land on shard `shard` of a pool of
/// `shards` shards (no affinity regex).
fn keys_on_shard(prefix: &str, shard: u64, shards: u64, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .filter(|k| sluice_client::fnv1a64(k.as_bytes()) % shards == shard)
        .take(n)
        .collect()
}

/// Head-of-line blocking between shards on shared peer connections: one
/// client's 10 KB puts to shard 0 of three nodes, alone and while two
/// clients put 1 MB values to shard 1 on the same nodes (rows
/// `sluice-2shard`).
async fn interference(a: &ClusterBenchArgs, rows: &mut Vec<Row>) -> Result<()> {
    let dur = Duration::from_secs(a.interference_s);
    eprintln!("two shards on three nodes: 10 KB puts to one, beside 1 MB puts to the other");
    let procs = Procs::start_layout(
        3,
        a.node_threads,
        None,
        &[0, 1, 2],
        2,
        &a.cluster_config,
        None,
    )?;
    let c = connect(&procs.addrs[0], Duration::from_secs(10)).await?;
    let small = std::sync::Arc::new(keys_on_shard("/vol/hol/small/", 0, 2, 64));
    let big = std::sync::Arc::new(keys_on_shard("/vol/hol/big/", 1, 2, 64));
    // Both shards have a leader and take writes.
    let deadline = Instant::now() + Duration::from_secs(30);
    for key in [&small[0], &big[0]] {
        while c.put(key, "x").await.is_err() {
            if Instant::now() > deadline {
                bail!("shard of {key} took no write within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let put = |client: Client, keys: &std::sync::Arc<Vec<String>>, size: usize| KeyedPut {
        client,
        keys: keys.clone(),
        value: Bytes::from(vec![b'h'; size]),
    };
    // One client's 10 KB puts to shard 0, as row `op`.
    let small_phase = |op: &'static str, label: &'static str| {
        let w = put(c.clone(), &small, 10_240);
        async move {
            let r = closed_loop(vec![w], dur, label.into()).await;
            row("sluice-2shard", op, 10_240, "closed", 1, (&r.0, r.1, r.2))
        }
    };
    rows.push(small_phase("put_alone", "10KB puts to shard 0, alone").await);
    let mut bg = Vec::new();
    for _ in 0..2 {
        bg.push(put(
            connect(&procs.addrs[0], Duration::from_secs(10)).await?,
            &big,
            1 << 20,
        ));
    }
    // The background runs a little longer, so it covers the whole phase.
    let bg = tokio::spawn(closed_loop(
        bg,
        dur + Duration::from_millis(300),
        "1MB puts to shard 1".into(),
    ));
    rows.push(
        small_phase(
            "put_beside_1MB",
            "10KB puts to shard 0, beside 1MB puts to shard 1",
        )
        .await,
    );
    let b = bg.await?;
    rows.push(row(
        "sluice-2shard",
        "put_1MB_beside",
        1 << 20,
        "closed",
        2,
        (&b.0, b.1, b.2),
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// An operation that notes which target ran it.
    struct Note(&'static str, Arc<Mutex<Vec<&'static str>>>);

    impl Op for Note {
        async fn call(&mut self, _: u64) -> Result<()> {
            self.1.lock().unwrap().push(self.0);
            tokio::time::sleep(Duration::from_micros(200)).await;
            Ok(())
        }
    }

    /// The targets take turns, A first, and each one's slices add up: its
    /// histogram holds every operation it ran, its time is its slices'.
    #[tokio::test]
    async fn targets_take_turns_and_their_slices_add_up() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (la, lb) = (log.clone(), log.clone());
        let [a, b] = taking_turns(
            3,
            Duration::from_millis(60),
            "test",
            || vec![Note("a", la.clone()), Note("a", la.clone())],
            || {
                let lb = lb.clone();
                async move { Ok(vec![Note("b", lb)]) }
            },
        )
        .await
        .unwrap();
        let log = log.lock().unwrap().clone();
        let mut runs = log.clone();
        runs.dedup();
        assert_eq!(
            runs,
            ["a", "b", "a", "b", "a", "b"],
            "three turns each, A first"
        );
        let count = |t| log.iter().filter(|&&x| x == t).count() as u64;
        assert_eq!(a.0.len(), count("a"));
        assert_eq!(b.0.len(), count("b"));
        assert!(a.1 >= Duration::from_millis(60) && b.1 >= Duration::from_millis(60));
        assert_eq!((a.2, b.2), (0, 0));
    }
}
