//! `sluice bench`: latency (HDR histograms: p50/p99/p999) and throughput of
//! put / get / trigger_put, closed-loop with N clients and open-loop at a
//! fixed rate, each next to a raw loopback TCP baseline measured in the same
//! run (and optionally next to redis-server with the same harness).

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::Serialize;
use sluice_client::{Client, ClientConfig};
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: Option<BenchWhat>,
    #[command(flatten)]
    core: CoreArgs,
}

#[derive(clap::Subcommand)]
enum BenchWhat {
    /// put/get/trigger_put latency and throughput (the default).
    Core(CoreArgs),
    /// RSS of a node holding many objects.
    Memory(MemoryArgs),
    /// Optimizer time of `sluice plan` on generated instances.
    Plan(PlanBenchArgs),
    /// No-op lambda pipelines of 1..4 relay stages (Cascade's Fig. 7).
    Pipeline(PipelineArgs),
    /// Persistent pools (preview): durable puts, time reads, recovery.
    Persistent(PersistentArgs),
    /// Replicated shards of 1, 3 and 5 nodes (real processes) next to
    /// redis-server with two replicas and WAIT 2, and failover time.
    Cluster(crate::bench_cluster::ClusterBenchArgs),
}

#[derive(clap::Args, Clone)]
pub struct PersistentArgs {
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "10240,1048576")]
    sizes: Vec<usize>,
    /// Length of each measurement phase.
    #[arg(long, default_value_t = 2000)]
    duration_ms: u64,
    /// Concurrent clients in the throughput phase.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Size of the log written for the recovery measurement, in MiB.
    #[arg(long, default_value_t = 1024)]
    recovery_mib: u64,
    /// Shard sizes: 1 is a standalone node (every sync policy), 3 a
    /// cluster of three node processes replicating one persistent shard.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    shard_sizes: Vec<u32>,
    /// `[persistent] sync` of the 3-node cluster (in a cluster, `always`
    /// and `batch` both fsync the consensus log through its group-commit
    /// thread; `never` leaves it to the OS).
    #[arg(long, default_value = "always")]
    cluster_sync: String,
    /// Skip the 3-member etcd comparison.
    #[arg(long)]
    no_etcd: bool,
    /// Tokio worker threads per cluster node (0: one per core).
    #[arg(long, default_value_t = 0)]
    node_threads: usize,
}

#[derive(clap::Args, Clone)]
pub struct PipelineArgs {
    /// Benchmark this running node instead of starting one.
    #[arg(long)]
    server: Option<String>,
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "10240,1048576")]
    sizes: Vec<usize>,
    /// Most relay stages.
    #[arg(long, default_value_t = 4)]
    max_stages: usize,
    /// Length of each measurement phase.
    #[arg(long, default_value_t = 1500)]
    duration_ms: u64,
    /// Requests in flight in the throughput phase.
    #[arg(long, default_value_t = 32)]
    window: usize,
}

#[derive(clap::Args, Clone)]
pub struct PlanBenchArgs {
    /// Worker counts to generate (the paper's small..xlarge).
    #[arg(long, value_delimiter = ',', default_value = "5,9,15,30")]
    workers: Vec<usize>,
    /// Instances per size.
    #[arg(long, default_value_t = 20)]
    instances: u64,
    /// Run the exhaustive search up to this many workers, for the optimality gap.
    #[arg(long, default_value_t = 9)]
    exhaustive_max_workers: usize,
}

#[derive(clap::Args, Clone)]
pub struct CoreArgs {
    /// Benchmark this running node instead of starting one.
    #[arg(long)]
    server: Option<String>,
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1024,10240,1048576")]
    sizes: Vec<usize>,
    /// Operations to measure: put, get, trigger.
    #[arg(long, value_delimiter = ',', default_value = "put,get,trigger")]
    ops: Vec<String>,
    /// Concurrent clients (one connection each) in the throughput phase.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Length of each measurement phase.
    #[arg(long, default_value_t = 2000)]
    duration_ms: u64,
    /// Open-loop rate in ops/s (0: half the closed-loop single-client rate).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Also measure redis-server at this address (SET/GET) with the same harness.
    #[arg(long)]
    redis: Option<String>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(clap::Args, Clone)]
pub struct MemoryArgs {
    #[arg(long, default_value_t = 1_000_000)]
    objects: u64,
    #[arg(long, default_value_t = 1024)]
    size: usize,
}

pub fn run(a: BenchArgs, _addr: &str, json: bool) -> Result<()> {
    match a.what {
        Some(BenchWhat::Memory(m)) => memory(m, json),
        Some(BenchWhat::Plan(p)) => plan_bench(p, json),
        Some(BenchWhat::Pipeline(p)) => pipeline_bench(p, json),
        Some(BenchWhat::Persistent(p)) => persistent_bench(p, json),
        Some(BenchWhat::Cluster(c)) => crate::bench_cluster::run(c, json),
        Some(BenchWhat::Core(c)) => core(c, json),
        None => core(a.core, json),
    }
}

// ---------------------------------------------------------------- helpers

/// A `sluice serve` child process on a free port, killed on drop.
pub struct ChildNode {
    child: Child,
    pub addr: String,
    dir: std::path::PathBuf,
    remove_dir: bool,
}

impl ChildNode {
    /// A node on a fresh temporary data directory, removed on drop.
    pub fn start(extra: &[&str]) -> Result<ChildNode> {
        use std::sync::atomic::AtomicU32;
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sluice-bench-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let mut n = Self::start_in(dir, extra)?;
        n.remove_dir = true;
        Ok(n)
    }

    /// A node on `dir`, which it leaves in place (restarts reuse it).
    pub fn start_in(dir: std::path::PathBuf, extra: &[&str]) -> Result<ChildNode> {
        let exe = std::env::current_exe().context("finding the sluice binary")?;
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .args(extra)
            .env("SLUICE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting `sluice serve`")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .with_context(|| format!("unexpected first line from sluice serve: {line:?}"))?
            .to_string();
        Ok(ChildNode {
            child,
            addr,
            dir,
            remove_dir: false,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.remove_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One line of progress on stderr: redrawn when stderr is a terminal,
/// printed once per phase otherwise.
struct Progress {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(label: String, total: Duration, ops: Arc<AtomicU64>) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let tty = std::io::stderr().is_terminal();
        if !tty {
            eprintln!("  running {label} for {} ms", total.as_millis());
        }
        let s = stop.clone();
        let handle = tty.then(|| {
            std::thread::spawn(move || {
                let t0 = Instant::now();
                while !s.load(Ordering::Relaxed) {
                    let frac = (t0.elapsed().as_secs_f64() / total.as_secs_f64()).min(1.0);
                    let bar = "#".repeat((frac * 30.0) as usize);
                    eprint!(
                        "\r  {label:<40} [{bar:<30}] {:>3.0}% {:>9} ops",
                        frac * 100.0,
                        ops.load(Ordering::Relaxed)
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
                eprint!("\r{:100}\r", "");
            })
        });
        Progress { stop, handle }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

pub(crate) fn hist() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

#[derive(Serialize, Clone, Debug)]
pub struct Row {
    pub target: String,
    pub op: String,
    pub size: usize,
    pub mode: String,
    pub clients: usize,
    pub ops_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub count: u64,
    pub errors: u64,
    /// Open loop only: how late the pacer issued operations (p99).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pacing_lag_p99_us: Option<f64>,
}

pub(crate) fn row(
    target: &str,
    op: &str,
    size: usize,
    mode: &str,
    clients: usize,
    (h, elapsed, errors): (&Histogram<u64>, Duration, u64),
) -> Row {
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Row {
        target: target.into(),
        op: op.into(),
        size,
        mode: mode.into(),
        clients,
        ops_per_s: h.len() as f64 / elapsed.as_secs_f64(),
        p50_us: us(0.5),
        p99_us: us(0.99),
        p999_us: us(0.999),
        count: h.len(),
        errors,
        pacing_lag_p99_us: None,
    }
}

/// Something that does one operation per call.
pub(crate) trait Op: Send + 'static {
    fn call(&mut self, i: u64) -> impl std::future::Future<Output = Result<()>> + Send;
}

/// Runs `clients` closed-loop workers for `dur`.
pub(crate) async fn closed_loop<O: Op>(
    mut workers: Vec<O>,
    dur: Duration,
    label: String,
) -> (Histogram<u64>, Duration, u64) {
    let ops = Arc::new(AtomicU64::new(0));
    let _p = Progress::start(label, dur, ops.clone());
    let start = Instant::now();
    let deadline = start + dur;
    let mut tasks = Vec::new();
    for mut w in workers.drain(..) {
        let ops = ops.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = hist();
            let mut errors = 0u64;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                match w.call(i).await {
                    Ok(()) => {
                        let _ = h.record(t.elapsed().as_nanos() as u64);
                    }
                    Err(_) => errors += 1,
                }
                i += 1;
                ops.fetch_add(1, Ordering::Relaxed);
            }
            (h, errors)
        }));
    }
    let mut all = hist();
    let mut errors = 0;
    for t in tasks {
        if let Ok((h, e)) = t.await {
            let _ = all.add(&h);
            errors += e;
        }
    }
    (all, start.elapsed(), errors)
}

/// Issues operations at a fixed rate regardless of completions (open
/// loop). A pacer thread holds the schedule with OS sleeps (tokio's timer
/// ticks at 1 ms, too coarse for 10k ops/s); each operation is timed from
/// the moment it is issued, and how late the pacer issued it is reported
/// separately (`pacing_lag_p99_us`), so a schedule that slipped is visible.
async fn open_loop<O: Op + Clone + Sync>(
    worker: O,
    rate: u64,
    dur: Duration,
    label: String,
) -> (Histogram<u64>, Duration, u64, f64) {
    let ops = Arc::new(AtomicU64::new(0));
    let _p = Progress::start(label, dur, ops.clone());
    let n = (rate as f64 * dur.as_secs_f64()) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let (tick_tx, mut tick_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let start = Instant::now();
    let pacer = std::thread::spawn(move || {
        let mut lag = hist();
        for i in 0..n {
            let intended = start + interval * i as u32;
            let now = Instant::now();
            if intended > now {
                std::thread::sleep(intended - now);
            }
            let _ = lag.record(intended.elapsed().as_nanos() as u64 + 1);
            if tick_tx.send(i).is_err() {
                break;
            }
        }
        lag
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let errors = Arc::new(AtomicU64::new(0));
    // Bound outstanding operations: past this the system is saturated and
    // further sends count as errors rather than piling up without limit.
    let slots = Arc::new(tokio::sync::Semaphore::new(4096));
    while let Some(i) = tick_rx.recv().await {
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let mut w = worker.clone();
        let tx = tx.clone();
        let errors = errors.clone();
        let ops = ops.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            match w.call(i).await {
                Ok(()) => {
                    let _ = tx.send(t.elapsed().as_nanos() as u64);
                }
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            ops.fetch_add(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    drop(tx);
    let mut h = hist();
    while let Some(v) = rx.recv().await {
        let _ = h.record(v);
    }
    let lag = pacer
        .join()
        .map(|l| l.value_at_quantile(0.99) as f64 / 1000.0)
        .unwrap_or(f64::NAN);
    (h, start.elapsed(), errors.load(Ordering::Relaxed), lag)
}

// ---------------------------------------------------------------- workers

#[derive(Clone)]
pub(crate) struct SluiceOp {
    pub(crate) client: Client,
    pub(crate) op: &'static str,
    pub(crate) value: Bytes,
    pub(crate) prefix: String,
}

const KEYS_PER_SIZE: u64 = 64;

impl Op for SluiceOp {
    async fn call(&mut self, i: u64) -> Result<()> {
        let key = format!("{}/{}", self.prefix, i % KEYS_PER_SIZE);
        match self.op {
            "put" => self
                .client
                .put(&key, self.value.clone())
                .await
                .map(|_| ())?,
            "get" => {
                let o = self.client.get(&key).await?;
                if o.value.len() != self.value.len() {
                    bail!("short read");
                }
            }
            _ => self
                .client
                .trigger_put(&key, self.value.clone())
                .await
                .map(|_| ())?,
        }
        Ok(())
    }
}

/// Raw loopback TCP: send `req` bytes, read `resp` bytes back.
pub(crate) struct RawOp {
    sock: tokio::net::TcpStream,
    req: Vec<u8>,
    resp: Vec<u8>,
}

impl Op for RawOp {
    async fn call(&mut self, _i: u64) -> Result<()> {
        self.sock.write_all(&self.req).await?;
        self.sock.read_exact(&mut self.resp).await?;
        Ok(())
    }
}

/// Echo-like server for the baseline: reads an 8-byte header
/// (request length, response length), the request, then writes the response.
pub(crate) fn baseline_server() -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let _ = s.set_nodelay(true);
                let mut buf = vec![0u8; 1 << 16];
                let mut out: Vec<u8> = Vec::new();
                loop {
                    let mut hdr = [0u8; 8];
                    if s.read_exact(&mut hdr).is_err() {
                        return;
                    }
                    let req = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
                    let resp = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
                    let mut left = req;
                    while left > 0 {
                        let n = left.min(buf.len());
                        if s.read_exact(&mut buf[..n]).is_err() {
                            return;
                        }
                        left -= n;
                    }
                    out.resize(resp, 7);
                    if s.write_all(&out).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

pub(crate) async fn raw_op(addr: SocketAddr, req_payload: usize, resp_len: usize) -> Result<RawOp> {
    let sock = tokio::net::TcpStream::connect(addr).await?;
    sock.set_nodelay(true)?;
    let mut req = Vec::with_capacity(8 + req_payload);
    req.extend_from_slice(&(req_payload as u32).to_le_bytes());
    req.extend_from_slice(&(resp_len as u32).to_le_bytes());
    req.resize(8 + req_payload, 1);
    Ok(RawOp {
        sock,
        req,
        resp: vec![0; resp_len],
    })
}

/// A minimal RESP client for SET/GET against redis-server.
pub(crate) struct RedisOp {
    sock: tokio::net::TcpStream,
    op: &'static str,
    value: Vec<u8>,
    prefix: String,
    buf: Vec<u8>,
    /// After each SET, `WAIT <n> 0`: return once n replicas have it.
    pub(crate) wait_replicas: Option<u32>,
}

impl RedisOp {
    async fn read_reply(&mut self) -> Result<()> {
        // Replies: +OK\r\n, or $<len>\r\n<data>\r\n.
        self.buf.clear();
        let mut byte = [0u8; 1];
        loop {
            self.sock.read_exact(&mut byte).await?;
            self.buf.push(byte[0]);
            if self.buf.ends_with(b"\r\n") {
                break;
            }
        }
        match self.buf[0] {
            b'+' | b':' => Ok(()),
            b'$' => {
                let n: i64 = std::str::from_utf8(&self.buf[1..self.buf.len() - 2])?.parse()?;
                if n < 0 {
                    bail!("redis: nil");
                }
                let mut data = vec![0u8; n as usize + 2];
                self.sock.read_exact(&mut data).await?;
                Ok(())
            }
            _ => bail!("redis error: {}", String::from_utf8_lossy(&self.buf)),
        }
    }
}

impl Op for RedisOp {
    async fn call(&mut self, i: u64) -> Result<()> {
        let key = format!("{}/{}", self.prefix, i % KEYS_PER_SIZE);
        let mut cmd = Vec::with_capacity(self.value.len() + 64);
        if self.op == "put" {
            write!(
                cmd,
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n",
                key.len(),
                self.value.len()
            )?;
            cmd.extend_from_slice(&self.value);
            cmd.extend_from_slice(b"\r\n");
        } else {
            write!(cmd, "*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len())?;
        }
        if let (Some(n), "put") = (self.wait_replicas, self.op) {
            write!(
                cmd,
                "*3\r\n$4\r\nWAIT\r\n${}\r\n{n}\r\n$1\r\n0\r\n",
                n.to_string().len()
            )?;
        }
        self.sock.write_all(&cmd).await?;
        self.read_reply().await?;
        if let (Some(n), "put") = (self.wait_replicas, self.op) {
            // `:<replicas>`: fewer than asked means it was not replicated.
            self.read_reply().await?;
            let got: u32 = std::str::from_utf8(&self.buf[1..self.buf.len() - 2])?.parse()?;
            if got < n {
                bail!("redis WAIT: only {got} of {n} replicas acknowledged");
            }
        }
        Ok(())
    }
}

pub(crate) async fn redis_op(addr: &str, op: &'static str, size: usize) -> Result<RedisOp> {
    let sock = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to redis at {addr}"))?;
    sock.set_nodelay(true)?;
    Ok(RedisOp {
        sock,
        op,
        value: vec![b'x'; size],
        prefix: format!("/bench/{size}"),
        buf: Vec::new(),
        wait_replicas: None,
    })
}

// ---------------------------------------------------------------- core

pub(crate) fn fmt_size(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}MB", n >> 20)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}KB", n >> 10)
    } else {
        format!("{n}B")
    }
}

/// The node to benchmark: `--server ADDR`, or a fresh `sluice serve` child
/// (kept alive as long as the returned handle).
fn node_or_server(server: &Option<String>) -> Result<(Option<ChildNode>, String)> {
    match server {
        Some(addr) => Ok((None, addr.clone())),
        None => {
            let n = ChildNode::start(&[])?;
            let addr = n.addr.clone();
            Ok((Some(n), addr))
        }
    }
}

fn core(a: CoreArgs, json: bool) -> Result<()> {
    let (node, addr) = node_or_server(&a.server)?;
    let base = baseline_server()?;
    let dur = Duration::from_millis(a.duration_ms);
    eprintln!(
        "sluice bench: node {addr}, baseline loopback echo {base}, {} ms per phase",
        a.duration_ms
    );
    let mut rows: Vec<Row> = Vec::new();
    for &size in &a.sizes {
        for op in &a.ops {
            let op: &'static str = match op.as_str() {
                "put" => "put",
                "get" => "get",
                "trigger" | "trigger_put" => "trigger_put",
                other => bail!("unknown op {other:?}; use put, get, trigger"),
            };
            // Request/response payloads of the equivalent raw exchange.
            let (req, resp) = if op == "get" { (32, size) } else { (size, 16) };
            let label = |what: &str, c: usize| format!("{op} {} {what} c={c}", fmt_size(size));
            // Latency: one client, current-thread runtime (no cross-thread wakeups
            // on either side of the comparison).
            let rt1 = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let rtn = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let mk_clients = |rt: &tokio::runtime::Runtime, n: usize| -> Result<Vec<SluiceOp>> {
                rt.block_on(async {
                    let mut v = Vec::new();
                    for c in 0..n {
                        let client = Client::connect_with(ClientConfig {
                            addr: addr.clone(),
                            client_name: "bench".into(),
                            ..Default::default()
                        })
                        .await?;
                        let prefix = if op == "put" {
                            format!("/vol/bench/put/{size}/{c}")
                        } else if op == "get" {
                            format!("/vol/bench/{size}")
                        } else {
                            format!("/trig/bench/{size}")
                        };
                        v.push(SluiceOp {
                            client,
                            op,
                            value: Bytes::from(vec![b'x'; size]),
                            prefix,
                        });
                    }
                    if op == "get" {
                        for i in 0..KEYS_PER_SIZE {
                            v[0].client
                                .put(
                                    &format!("/vol/bench/{size}/{i}"),
                                    Bytes::from(vec![b'x'; size]),
                                )
                                .await?;
                        }
                    }
                    Ok::<_, anyhow::Error>(v)
                })
            };
            let w = mk_clients(&rt1, 1)?;
            let one = w[0].clone();
            let (h, el, e) = rt1.block_on(closed_loop(w, dur, label("closed", 1)));
            let lat = row("sluice", op, size, "closed", 1, (&h, el, e));
            let rb = rt1.block_on(async { raw_op(base, req, resp).await })?;
            let (h, el, e) = rt1.block_on(closed_loop(
                vec![rb],
                dur,
                format!("baseline {} closed c=1", fmt_size(size)),
            ));
            let blat = row("loopback", op, size, "closed", 1, (&h, el, e));
            // Open loop at a fixed rate.
            let rate = if a.rate > 0 {
                a.rate
            } else {
                ((lat.ops_per_s / 2.0) as u64).max(10)
            };
            let (h, el, e, lag) = rt1.block_on(open_loop(
                one,
                rate,
                dur,
                format!("{op} {} open {rate}/s", fmt_size(size)),
            ));
            let mut open = row(
                "sluice",
                op,
                size,
                &format!("open@{rate}/s"),
                1,
                (&h, el, e),
            );
            open.ops_per_s = h.len() as f64 / dur.as_secs_f64();
            open.pacing_lag_p99_us = Some(lag);
            drop(rt1);
            // Throughput: N clients, one connection each.
            let w = mk_clients(&rtn, a.clients)?;
            let (h, el, e) = rtn.block_on(closed_loop(w, dur, label("closed", a.clients)));
            let thr = row("sluice", op, size, "closed", a.clients, (&h, el, e));
            let rbs = rtn.block_on(async {
                let mut v = Vec::new();
                for _ in 0..a.clients {
                    v.push(raw_op(base, req, resp).await?);
                }
                Ok::<_, anyhow::Error>(v)
            })?;
            let (h, el, e) = rtn.block_on(closed_loop(
                rbs,
                dur,
                format!("baseline {} closed c={}", fmt_size(size), a.clients),
            ));
            let bthr = row("loopback", op, size, "closed", a.clients, (&h, el, e));
            rows.extend([lat, blat, open, thr, bthr]);
            if let (Some(r), "put" | "get") = (&a.redis, op) {
                let redis_ops = |n: usize, rt: &tokio::runtime::Runtime| {
                    rt.block_on(async {
                        let mut v = Vec::new();
                        for _ in 0..n {
                            v.push(redis_op(r, op, size).await?);
                        }
                        if op == "get" {
                            let mut w = redis_op(r, "put", size).await?;
                            for i in 0..KEYS_PER_SIZE {
                                w.call(i).await?;
                            }
                        }
                        Ok::<_, anyhow::Error>(v)
                    })
                };
                let rt1 = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let w = redis_ops(1, &rt1)?;
                let (h, el, e) = rt1.block_on(closed_loop(
                    w,
                    dur,
                    format!("redis {op} {} c=1", fmt_size(size)),
                ));
                rows.push(row("redis", op, size, "closed", 1, (&h, el, e)));
                let w = redis_ops(a.clients, &rtn)?;
                let (h, el, e) = rtn.block_on(closed_loop(
                    w,
                    dur,
                    format!("redis {op} {} c={}", fmt_size(size), a.clients),
                ));
                rows.push(row("redis", op, size, "closed", a.clients, (&h, el, e)));
            }
        }
    }
    report(&rows, json, a.out.as_deref())?;
    drop(node);
    Ok(())
}

pub(crate) fn report(rows: &[Row], json: bool, out: Option<&std::path::Path>) -> Result<()> {
    if let Some(p) = out {
        std::fs::write(p, serde_json::to_vec_pretty(rows)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(rows)?);
        return Ok(());
    }
    println!(
        "{:<9} {:<12} {:>6} {:<14} {:>3} {:>11} {:>9} {:>9} {:>9} {:>7} {:>9}",
        "target",
        "op",
        "size",
        "mode",
        "c",
        "ops/s",
        "p50 µs",
        "p99 µs",
        "p999 µs",
        "errors",
        "vs base"
    );
    for r in rows {
        // Ratio to the loopback row of the same op, size and client count.
        let base = rows.iter().find(|b| {
            b.target == "loopback" && b.op == r.op && b.size == r.size && b.clients == r.clients
        });
        let ratio = match base {
            Some(b) if r.target != "loopback" && r.clients == 1 => {
                format!("{:.2}x p50", r.p50_us / b.p50_us)
            }
            Some(b) if r.target != "loopback" => format!("{:.2}x tput", r.ops_per_s / b.ops_per_s),
            _ => String::new(),
        };
        println!(
            "{:<9} {:<12} {:>6} {:<14} {:>3} {:>11.0} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>9}",
            r.target,
            r.op,
            fmt_size(r.size),
            r.mode,
            r.clients,
            r.ops_per_s,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.errors,
            ratio
        );
    }
    for r in rows.iter().filter(|r| r.pacing_lag_p99_us.is_some()) {
        println!(
            "open loop {} {} at {}: pacing lag p99 {:.1} µs",
            r.op,
            fmt_size(r.size),
            r.mode,
            r.pacing_lag_p99_us.unwrap_or(0.0)
        );
    }
    for r in rows.iter().filter(|r| r.target == "redis" && r.clients > 1) {
        if let Some(s) = rows.iter().find(|s| {
            s.target == "sluice" && s.op == r.op && s.size == r.size && s.clients == r.clients
        }) {
            println!(
                "sluice/redis {} {} c={}: throughput {:.2}x, p50 {:.2}x",
                r.op,
                fmt_size(r.size),
                r.clients,
                s.ops_per_s / r.ops_per_s,
                s.p50_us / r.p50_us
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- memory

fn rss_kib(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .context("no VmRSS in /proc status")
}

fn memory(m: MemoryArgs, json: bool) -> Result<()> {
    let node = ChildNode::start(&[])?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let before = rss_kib(node.pid())?;
    let ops = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let clients = 4u64;
    rt.block_on(async {
        let _p = Progress::start(
            format!("put {} x {}", m.objects, fmt_size(m.size)),
            Duration::from_secs(30),
            ops.clone(),
        );
        let mut tasks = Vec::new();
        for c in 0..clients {
            let client = Client::connect(&node.addr).await?;
            let ops = ops.clone();
            let (n, size) = (m.objects, m.size);
            tasks.push(tokio::spawn(async move {
                let value = Bytes::from(vec![b'm'; size]);
                let mut i = c;
                let mut inflight = tokio::task::JoinSet::new();
                while i < n {
                    let cl = client.clone();
                    let v = value.clone();
                    inflight.spawn(async move { cl.put(&format!("/vol/mem/{i:08}"), v).await });
                    if inflight.len() >= 64 {
                        if let Some(r) = inflight.join_next().await {
                            r??;
                        }
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                    i += clients;
                }
                while let Some(r) = inflight.join_next().await {
                    r??;
                }
                Ok::<_, anyhow::Error>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let load_s = t0.elapsed().as_secs_f64();
    let after = rss_kib(node.pid())?;
    let per_obj = (after.saturating_sub(before) as f64 * 1024.0) / m.objects as f64;
    let v = serde_json::json!({
        "objects": m.objects,
        "value_bytes": m.size,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "rss_after_gib": after as f64 / (1024.0 * 1024.0),
        "bytes_per_object": per_obj,
        "overhead_bytes_per_object": per_obj - m.size as f64,
        "load_seconds": load_s,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{} objects of {}: node RSS {:.3} GiB ({} KiB before), {:.0} B/object ({:.0} B overhead), loaded in {:.1} s",
            m.objects,
            fmt_size(m.size),
            after as f64 / (1024.0 * 1024.0),
            before,
            per_obj,
            per_obj - m.size as f64,
            load_s
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- plan

fn plan_bench(a: PlanBenchArgs, json: bool) -> Result<()> {
    use sluice_plan::gen::{generate, GenSpec};
    use sluice_plan::{plan_all, PlanOptions};
    let mut out = Vec::new();
    if !json {
        println!(
            "{:>7} {:>9} {:>9} {:>12} {:>12} {:>12} {:>14} {:>12}",
            "workers",
            "instances",
            "feasible",
            "plan p50 ms",
            "plan max ms",
            "exh. p50 ms",
            "gap to opt p50",
            "gap max"
        );
    }
    for &w in &a.workers {
        let mut times = Vec::new();
        let mut ex_times = Vec::new();
        let mut gaps = Vec::new();
        let mut feasible = 0;
        for seed in 1..=a.instances {
            // Three operators for the smallest infrastructure, five otherwise.
            let spec = GenSpec {
                workers: w,
                tiers: if w >= 9 { 3 } else { 2 },
                first_layer: if w < 9 { 1 } else { 2 },
                middle_layer: true,
                variants: 3,
            };
            let p = generate(seed, &spec);
            let exhaustive = w <= a.exhaustive_max_workers;
            let t = Instant::now();
            let r = plan_all(
                &p,
                &PlanOptions {
                    seed,
                    exhaustive: false,
                },
            );
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            let Ok(r) = r else { continue };
            feasible += 1;
            if exhaustive {
                let t = Instant::now();
                if let Ok(Some(o)) = sluice_plan::exhaustive::optimum(&p, Some(r.plan.total_cost))
                    .map(|o| o.or(Some(r.plan.clone())))
                {
                    gaps.push(r.plan.total_cost / o.total_cost - 1.0);
                }
                ex_times.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let max = |v: &Vec<f64>| v.iter().copied().fold(f64::NAN, f64::max);
        let row = serde_json::json!({
            "workers": w,
            "instances": a.instances,
            "feasible": feasible,
            "plan_ms_p50": med(&mut times),
            "plan_ms_max": max(&times),
            "exhaustive_ms_p50": med(&mut ex_times),
            "gap_to_optimum_p50": med(&mut gaps),
            "gap_to_optimum_max": max(&gaps),
        });
        if !json {
            let f = |k: &str, scale: f64, unit: &str| match row[k].as_f64() {
                Some(x) if x.is_finite() => format!("{:.2}{unit}", x * scale),
                _ => "-".to_string(),
            };
            println!(
                "{:>7} {:>9} {:>9} {:>12} {:>12} {:>12} {:>14} {:>12}",
                w,
                a.instances,
                feasible,
                f("plan_ms_p50", 1.0, ""),
                f("plan_ms_max", 1.0, ""),
                f("exhaustive_ms_p50", 1.0, ""),
                f("gap_to_optimum_p50", 100.0, "%"),
                f("gap_to_optimum_max", 100.0, "%")
            );
        }
        out.push(row);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

// ---------------------------------------------------------------- pipeline

/// DFG of `stages` relays: /bench/{mode}/s0 -> s1 -> ... -> s{stages}.
fn relay_chain(mode: &str, stages: usize) -> String {
    let dest_mode = if mode == "put" { "put" } else { "trigger_put" };
    let verts: Vec<serde_json::Value> = (0..stages)
        .map(|i| {
            serde_json::json!({
                "pathname": format!("/bench/{mode}/s{i}"),
                "user_defined_logic_list": ["relay"],
                "destinations": [{ format!("/bench/{mode}/s{}", i + 1): dest_mode }]
            })
        })
        .collect();
    serde_json::json!([{ "id": "bench-pipeline", "graph": verts }]).to_string()
}

fn pipeline_bench(a: PipelineArgs, json: bool) -> Result<()> {
    use sluice_client::{PoolSpec, PoolType};
    let (node, addr) = node_or_server(&a.server)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dur = Duration::from_millis(a.duration_ms);
    let mut rows = Vec::new();
    rt.block_on(async {
        let c = Client::connect(&addr).await?;
        // Stage pools: trigger pools for the trigger-put chain, volatile
        // pools for the put chain (the first hop is always a trigger put).
        for i in 0..=a.max_stages {
            for (mode, t) in [("trigger", PoolType::Trigger), ("put", if i == 0 { PoolType::Trigger } else { PoolType::Volatile })] {
                let spec = PoolSpec { pathname: format!("/bench/{mode}/s{i}"), pool_type: Some(t), ..Default::default() };
                match c.create_pool(spec).await {
                    Ok(_) | Err(sluice_client::SluiceError::PoolExists { .. }) => {}
                    Err(e) => return Err(anyhow::Error::from(e)),
                }
            }
        }
        let mut dispatch_10k = None;
        for &size in &a.sizes {
            let value = Bytes::from(vec![b'p'; size]);
            for mode in ["trigger", "put"] {
                for stages in 0..=a.max_stages {
                    if stages == 0 && mode == "put" {
                        continue; // the 0-stage baseline is the same for both
                    }
                    if stages > 0 {
                        c.dfg_apply(&relay_chain(mode, stages)).await?;
                    } else {
                        let _ = c.dfg_remove("bench-pipeline").await;
                    }
                    let input = format!("/bench/{mode}/s0/x");
                    let mut watch = c.watch(&format!("/bench/{mode}/s{stages}")).await?;
                    // Warm up (model-free, but lets caches and buffers settle).
                    for _ in 0..20 {
                        c.trigger_put(&input, value.clone()).await?;
                        watch.next().await.context("watch closed")?;
                    }
                    // Latency: one at a time.
                    let ops = Arc::new(AtomicU64::new(0));
                    let _p = Progress::start(format!("pipeline {mode} {} stages={stages}", fmt_size(size)), dur, ops.clone());
                    let mut h = hist();
                    let t0 = Instant::now();
                    while t0.elapsed() < dur {
                        let t = Instant::now();
                        c.trigger_put(&input, value.clone()).await?;
                        watch.next().await.context("watch closed")?;
                        let _ = h.record(t.elapsed().as_nanos() as u64);
                        ops.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(_p);
                    // Throughput: keep `window` objects in the pipeline.
                    let t1 = Instant::now();
                    let mut sent = 0u64;
                    let mut done = 0u64;
                    while t1.elapsed() < dur {
                        while sent - done < a.window as u64 {
                            c.trigger_put(&input, value.clone()).await?;
                            sent += 1;
                        }
                        watch.next().await.context("watch closed")?;
                        done += 1;
                    }
                    let tput = done as f64 / t1.elapsed().as_secs_f64();
                    while done < sent {
                        watch.next().await.context("watch closed")?;
                        done += 1;
                    }
                    watch.cancel().await?;
                    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                    rows.push(serde_json::json!({
                        "size": size, "link": mode, "stages": stages,
                        "p50_us": us(0.5), "p99_us": us(0.99), "p999_us": us(0.999),
                        "count": h.len(), "max_tput_per_s": tput,
                    }));
                }
            }
            if size == 10240 {
                let st = c.stats().await?;
                dispatch_10k = Some(st["compute"]["dispatch_overhead_us"].clone());
            }
        }
        let _ = c.dfg_remove("bench-pipeline").await;
        if json {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({"rows": rows, "dispatch_overhead_10kb_us": dispatch_10k}))?);
            return Ok(());
        }
        println!("{:>6} {:<8} {:>6} {:>10} {:>10} {:>10} {:>12} {:>16}", "size", "link", "stages", "p50 µs", "p99 µs", "p999 µs", "max tput/s", "stage adds ×base");
        for r in &rows {
            let size = r["size"].as_u64().unwrap_or(0) as usize;
            let stages = r["stages"].as_u64().unwrap_or(0);
            let base = rows.iter().find(|b| b["size"] == r["size"] && b["stages"] == 0).and_then(|b| b["p50_us"].as_f64()).unwrap_or(f64::NAN);
            let prev = rows
                .iter()
                .find(|b| b["size"] == r["size"] && b["stages"].as_u64() == Some(stages.saturating_sub(1)) && (stages == 1 || b["link"] == r["link"]))
                .and_then(|b| b["p50_us"].as_f64())
                .unwrap_or(f64::NAN);
            let adds = if stages == 0 { "(baseline)".to_string() } else { format!("{:.2}", (r["p50_us"].as_f64().unwrap_or(0.0) - prev) / base) };
            println!(
                "{:>6} {:<8} {:>6} {:>10.1} {:>10.1} {:>10.1} {:>12.0} {:>16}",
                fmt_size(size),
                r["link"].as_str().unwrap_or(""),
                stages,
                r["p50_us"].as_f64().unwrap_or(0.0),
                r["p99_us"].as_f64().unwrap_or(0.0),
                r["p999_us"].as_f64().unwrap_or(0.0),
                r["max_tput_per_s"].as_f64().unwrap_or(0.0),
                adds
            );
        }
        if let Some(d) = dispatch_10k {
            println!("dispatch overhead (match + enqueue + dequeue) over the 10KB runs: p50 {} µs, p99 {} µs ({} upcalls)", d["p50"], d["p99"], d["count"]);
        }
        Ok(())
    })?;
    drop(node);
    Ok(())
}

// ---------------------------------------------------------------- persistent

/// Sequential fsync'd write bandwidth of the disk under `dir` (MiB/s):
/// 1 MiB writes, each followed by fdatasync, for `dur`.
fn disk_fsync_bandwidth(dir: &std::path::Path, dur: Duration) -> Result<f64> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("disk-baseline.bin");
    let mut f = std::fs::File::create(&path)?;
    let buf = vec![0x5au8; 1 << 20];
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < dur {
        f.write_all(&buf)?;
        f.sync_data()?;
        n += 1;
    }
    let mib_s = n as f64 / t0.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(mib_s)
}

fn persistent_node(dir: &std::path::Path, sync: &str) -> Result<ChildNode> {
    std::fs::create_dir_all(dir)?;
    let cfg = dir.join("node.toml");
    std::fs::write(
        &cfg,
        format!("[persistent]\nenabled = true\nsync = \"{sync}\"\n"),
    )?;
    let cfg = cfg.to_string_lossy().into_owned();
    ChildNode::start_in(dir.join("data"), &["--config", &cfg])
}

/// Put latency (one client) and throughput (`a.clients` clients, each
/// with its own connections to `addr`) at every size, as rows of `target`.
async fn put_phases(
    rows: &mut Vec<Row>,
    target: &str,
    addr: &str,
    c: &Client,
    a: &PersistentArgs,
    dur: Duration,
) -> Result<()> {
    for &size in &a.sizes {
        let mk = |prefix: String, client: Client| SluiceOp {
            client,
            op: "put",
            value: Bytes::from(vec![b'd'; size]),
            prefix,
        };
        let (h, el, e) = closed_loop(
            vec![mk(format!("/p/{target}/lat/{size}"), c.clone())],
            dur,
            format!("persistent put {} {target} c=1", fmt_size(size)),
        )
        .await;
        rows.push(row(target, "put", size, "closed", 1, (&h, el, e)));
        let mut ws = Vec::new();
        for i in 0..a.clients {
            ws.push(mk(
                format!("/p/{target}/tput/{size}/{i}"),
                Client::connect(addr).await?,
            ));
        }
        let (h, el, e) = closed_loop(
            ws,
            dur,
            format!("persistent put {} {target} c={}", fmt_size(size), a.clients),
        )
        .await;
        rows.push(row(target, "put", size, "closed", a.clients, (&h, el, e)));
    }
    Ok(())
}

/// A client of the node at `addr`, with the persistent pool `/p` created.
async fn client_with_persistent_pool(addr: &str) -> Result<Client> {
    create_persistent_pool(Client::connect(addr).await?).await
}

/// Creates the persistent pool `/p` through `c`.
async fn create_persistent_pool(c: Client) -> Result<Client> {
    use sluice_client::{PoolSpec, PoolType};
    c.create_pool(PoolSpec {
        pathname: "/p".into(),
        pool_type: Some(PoolType::Persistent),
        ..Default::default()
    })
    .await?;
    Ok(c)
}

fn persistent_bench(a: PersistentArgs, json: bool) -> Result<()> {
    let dur = Duration::from_millis(a.duration_ms);
    let base = std::env::temp_dir().join(format!("sluice-bench-persistent-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let disk = disk_fsync_bandwidth(&base, dur)?;
    eprintln!("disk: sequential 1 MiB writes with fdatasync: {disk:.1} MiB/s");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows: Vec<Row> = Vec::new();
    let mut time_rows = Vec::new();
    let mut disk_after: Option<f64> = None;
    let single = if a.shard_sizes.contains(&1) {
        &["always", "batch", "never"][..]
    } else {
        &[]
    };
    for &sync in single {
        let dir = base.join(sync);
        let node = persistent_node(&dir, sync)?;
        let addr = node.addr.clone();
        rt.block_on(async {
            let c = client_with_persistent_pool(&addr).await?;
            put_phases(&mut rows, &format!("sluice/{sync}"), &addr, &c, &a, dur).await?;
            if sync == "always" {
                // Time reads: a key written every 5 ms for 11 s, then reads
                // at 100 ms, 1 s and 10 s in the past.
                let t0 = Instant::now();
                let mut i = 0u64;
                let ops = Arc::new(AtomicU64::new(0));
                let _p = Progress::start(
                    "writing 11 s of history".into(),
                    Duration::from_secs(11),
                    ops.clone(),
                );
                while t0.elapsed() < Duration::from_secs(11) {
                    c.put("/p/clock", Bytes::from(i.to_string())).await?;
                    i += 1;
                    ops.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                drop(_p);
                for age_ms in [100u64, 1000, 10_000] {
                    let mut h = hist();
                    for _ in 0..2000 {
                        let at = sluice_store::Clock::wall_us() - age_ms * 1000;
                        let t = Instant::now();
                        c.get_by_time("/p/clock", at).await?;
                        let _ = h.record(t.elapsed().as_nanos() as u64);
                    }
                    time_rows.push(serde_json::json!({
                        "age_ms": age_ms,
                        "p50_us": h.value_at_quantile(0.5) as f64 / 1000.0,
                        "p99_us": h.value_at_quantile(0.99) as f64 / 1000.0,
                    }));
                }
            }
            Ok::<_, anyhow::Error>(())
        })?;
        drop(node);
        if sync == "always" {
            // This VM's disk drifts within minutes: measure it again right
            // after the fsync'd phases it is compared with.
            disk_after = Some(disk_fsync_bandwidth(&base, dur)?);
        }
    }
    if a.shard_sizes.contains(&3) {
        eprintln!(
            "shard of 3: starting 3 node processes (persistent shard, sync = {})",
            a.cluster_sync
        );
        let procs =
            crate::bench_cluster::Procs::start_with(3, a.node_threads, Some(&a.cluster_sync))?;
        let addr = procs.addrs[0].clone();
        rt.block_on(async {
            let c = crate::bench_cluster::connect(&addr, Duration::from_secs(10)).await?;
            let c = create_persistent_pool(c).await?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while let Err(e) = c.put("/p/ready", "x").await {
                if Instant::now() > deadline {
                    anyhow::bail!("the persistent shard took no put within 30 s: {e}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            put_phases(&mut rows, "sluice-r3", &addr, &c, &a, dur).await
        })?;
        drop(procs);
    }
    if !a.no_etcd {
        eprintln!("etcd: starting a 3-member cluster");
        let etcd = crate::bench_etcd::start_etcd(base.join("etcd"))?;
        rt.block_on(async {
            let leader = etcd.leader().await?;
            for &size in &a.sizes {
                let op = crate::bench_etcd::EtcdOp::connect(&leader, &format!("/lat/{size}"), size)
                    .await?;
                let r =
                    closed_loop(vec![op], dur, format!("etcd put {} c=1", fmt_size(size))).await;
                rows.push(row("etcd-r3", "put", size, "closed", 1, (&r.0, r.1, r.2)));
                let mut ws = Vec::new();
                for i in 0..a.clients {
                    ws.push(
                        crate::bench_etcd::EtcdOp::connect(
                            &leader,
                            &format!("/tput/{size}/{i}"),
                            size,
                        )
                        .await?,
                    );
                }
                let r = closed_loop(
                    ws,
                    dur,
                    format!("etcd put {} c={}", fmt_size(size), a.clients),
                )
                .await;
                rows.push(row(
                    "etcd-r3",
                    "put",
                    size,
                    "closed",
                    a.clients,
                    (&r.0, r.1, r.2),
                ));
            }
            Ok::<_, anyhow::Error>(())
        })?;
        drop(etcd);
    }
    // Recovery: a log of `recovery_mib` MiB of 1 MiB values, then a restart.
    let recovery = {
        let dir = base.join("recovery");
        let node = persistent_node(&dir, "never")?;
        let addr = node.addr.clone();
        rt.block_on(async {
            let c = client_with_persistent_pool(&addr).await?;
            let v = Bytes::from(vec![b'r'; 1 << 20]);
            for i in 0..a.recovery_mib {
                c.put(&format!("/p/r{}", i % 64), v.clone()).await?;
            }
            Ok::<_, anyhow::Error>(())
        })?;
        drop(node); // SIGKILL
        let t = Instant::now();
        let node = persistent_node(&dir, "never")?;
        let secs = t.elapsed().as_secs_f64();
        drop(node);
        serde_json::json!({"log_mib": a.recovery_mib, "restart_to_listening_s": secs, "s_per_gib": secs * 1024.0 / a.recovery_mib as f64})
    };
    let _ = std::fs::remove_dir_all(&base);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"disk_fsync_mib_s": disk, "disk_fsync_mib_s_after": disk_after, "puts": rows, "get_by_time": time_rows, "recovery": recovery})
            )?
        );
        return Ok(());
    }
    println!("disk baseline (same run): sequential 1 MiB writes + fdatasync = {disk:.1} MiB/s");
    if let Some(after) = disk_after {
        println!("disk baseline again after the sync=always phases: {after:.1} MiB/s");
    }
    println!(
        "{:<16} {:>6} {:>4} {:>10} {:>9} {:>9} {:>9} {:>12}",
        "target", "size", "c", "ops/s", "p50 µs", "p99 µs", "p999 µs", "MiB/s"
    );
    for r in &rows {
        let mib = r.ops_per_s * r.size as f64 / (1 << 20) as f64;
        println!(
            "{:<16} {:>6} {:>4} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>12.1}",
            r.target,
            fmt_size(r.size),
            r.clients,
            r.ops_per_s,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            mib
        );
    }
    if let Some(r) = rows
        .iter()
        .find(|r| r.target == "sluice/always" && r.size == 1 << 20 && r.clients > 1)
    {
        let reference = disk_after.map_or(disk, |after| (disk + after) / 2.0);
        println!(
            "1 MiB fsync'd put throughput (sync=always, c={}) = {:.0}% of the disk's fsync'd sequential bandwidth ({reference:.1} MiB/s, the mean of the two baselines; target >= 70%)",
            r.clients,
            100.0 * r.ops_per_s / reference
        );
    }
    let find = |t: &str, size: usize, c: usize| {
        rows.iter()
            .find(|r| r.target == t && r.size == size && r.clients == c)
    };
    for &size in &a.sizes {
        if let (Some(s), Some(e)) = (find("sluice-r3", size, 1), find("etcd-r3", size, 1)) {
            println!(
                "3-replica persistent put {} p50: sluice {:.1} µs / etcd {:.1} µs = {:.2}x{}",
                fmt_size(size),
                s.p50_us,
                e.p50_us,
                s.p50_us / e.p50_us,
                if size == 10 * 1024 {
                    " (target <= 1x)"
                } else {
                    ""
                }
            );
        }
        if let (Some(s), Some(e)) = (
            find("sluice-r3", size, a.clients),
            find("etcd-r3", size, a.clients),
        ) {
            println!(
                "3-replica persistent put {} c={}: throughput {:.0} / {:.0} ops/s = {:.2}x etcd{}",
                fmt_size(size),
                a.clients,
                s.ops_per_s,
                e.ops_per_s,
                s.ops_per_s / e.ops_per_s,
                if size == 10 * 1024 && a.clients == 16 {
                    " (target >= 2x)"
                } else {
                    ""
                }
            );
        }
    }
    for t in &time_rows {
        println!(
            "get_by_time {} ms in the past: p50 {} µs, p99 {} µs",
            t["age_ms"], t["p50_us"], t["p99_us"]
        );
    }
    println!(
        "recovery: {} MiB log, restart to listening in {:.2} s ({:.2} s per GiB)",
        recovery["log_mib"],
        recovery["restart_to_listening_s"].as_f64().unwrap_or(0.0),
        recovery["s_per_gib"].as_f64().unwrap_or(0.0)
    );
    Ok(())
}
