//! The harness every benchmark shares: node processes, HDR histograms,
//! closed- and open-loop drivers, progress output and the report.

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::io::{BufRead, BufReader, IsTerminal};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
        let exe = crate::harness::sluice_exe()?;
        let mut child = crate::children::command(exe)
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
pub struct Progress {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    pub fn start(label: String, total: Duration, ops: Arc<AtomicU64>) -> Progress {
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

pub fn hist() -> Histogram<u64> {
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

pub fn row(
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
pub trait Op: Send + 'static {
    fn call(&mut self, i: u64) -> impl std::future::Future<Output = Result<()>> + Send;
}

/// Runs `clients` closed-loop workers for `dur`.
pub async fn closed_loop<O: Op>(
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
pub async fn open_loop<O: Op + Clone + Sync>(
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

pub fn fmt_size(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}MB", n >> 20)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}KB", n >> 10)
    } else {
        format!("{n}B")
    }
}

pub fn report(rows: &[Row], json: bool, out: Option<&std::path::Path>) -> Result<()> {
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

/// CPU time a process has used (all threads, user and system), from
/// /proc (clock ticks, 10 ms each on Linux's usual 100 Hz).
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) close with ')'.
    let rest = s.rsplit_once(')').map(|x| x.1).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after ')'.
    Ok(Duration::from_millis((ticks(11) + ticks(12)) * 10))
}

pub fn rss_kib(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .context("no VmRSS in /proc status")
}

/// The `sluice` binary the benchmarks start nodes with: `SLUICE_BIN`
/// (`sluice bench` sets it to itself), else the one next to this binary.
pub fn sluice_exe() -> Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_BIN") {
        return Ok(p.into());
    }
    let me = std::env::current_exe().context("finding this binary")?;
    let p = me.with_file_name("sluice");
    anyhow::ensure!(
        p.exists(),
        "no `sluice` binary next to {} (build it: `cargo build --release -p sluice-cli`, or set SLUICE_BIN)",
        me.display()
    );
    Ok(p)
}
