//! `sluice bench policy`: the managed data path's policies measured
//! (issue #19), each next to its baseline in the same run:
//! - `overhead`: access rules and a rate limit enabled but never
//!   triggered, against an open node (two node processes in turns);
//! - `qos`: mRPC's Table 3.4: a latency-sensitive client (32 B gets, one
//!   in flight) next to a bandwidth-sensitive one (32 KB puts, 64 in
//!   flight) on one node, without and with the QoS policy, the
//!   machine's floor: the small client next to a raw loopback stream,
//!   and the node's CPU per phase (what the small client's requests
//!   leave the bulk one);
//! - `live`: a rate limit added and then removed under load on a 3-node
//!   cluster, as ops/s over time (mRPC's Fig. 3.7).

use crate::harness::{closed_loop, cpu_time, fmt_size, hist, report, row, ChildNode, Row};
use crate::peers::sluice_ops;
use anyhow::{Context, Result};
use bytes::Bytes;
use serde_json::json;
use sluice_client::{Client, ClientConfig, SluiceError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone)]
pub struct PolicyArgs {
    /// Which experiment: overhead, qos, conn, live, or all.
    #[arg(long, default_value = "all")]
    pub what: String,
    /// Length of each measurement phase.
    #[arg(long, default_value_t = 2000)]
    pub duration_ms: u64,
    /// Rounds (overhead and qos).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Concurrent clients in the overhead's throughput phase.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// The QoS node's tokio worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub node_threads: usize,
}

pub fn run(a: PolicyArgs, json: bool) -> Result<()> {
    let all = a.what == "all";
    anyhow::ensure!(
        all || ["overhead", "qos", "conn", "live"].contains(&a.what.as_str()),
        "--what {:?}: use overhead, qos, conn, live or all",
        a.what
    );
    if all || a.what == "overhead" {
        overhead(&a, json)?;
    }
    if all || a.what == "qos" {
        qos(&a, json)?;
    }
    if all || a.what == "conn" {
        one_connection(&a, json)?;
    }
    if all || a.what == "live" {
        live(&a, json)?;
    }
    Ok(())
}

fn rt(threads: usize) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?)
}

/// A policy command on `addr` (as `token`), for setting experiments up.
async fn policy(
    addr: &str,
    token: Option<&str>,
    cmd: serde_json::Value,
) -> Result<serde_json::Value> {
    let c = Client::connect_with(ClientConfig {
        addr: addr.into(),
        token: token.map(str::to_string),
        ..Default::default()
    })
    .await?;
    Ok(c.policy(cmd).await?)
}

fn set(name: &str, rule: serde_json::Value) -> serde_json::Value {
    json!({"op": "set", "name": name, "rule": rule})
}

/// Access rules and a rate limit that never triggers, next to an open node.
fn overhead(a: &PolicyArgs, json: bool) -> Result<()> {
    let open = ChildNode::start(&[])?;
    let policed = ChildNode::start(&[])?;
    let r = rt(2)?;
    let token = r.block_on(async {
        let t = policy(&policed.addr, None, json!({"op": "auth_create", "name": "bench", "roles": ["bench"]}))
            .await?["token"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let tok = Some(t.as_str());
        policy(&policed.addr, tok, set("bench-all", json!({"kind": "access", "who": {"role": "bench"}, "pool": "/", "allow": ["read", "write", "trigger", "watch", "admin"]}))).await?;
        policy(&policed.addr, tok, set("others-read", json!({"kind": "access", "who": "anyone", "pool": "/public", "allow": ["read"]}))).await?;
        policy(&policed.addr, tok, set("bench-rate", json!({"kind": "rate", "who": {"role": "bench"}, "ops_per_s": 100_000_000u64, "bytes_per_s": 100_000_000_000u64, "max_delay_ms": 100}))).await?;
        anyhow::Ok(t)
    })?;
    drop(r);
    eprintln!(
        "sluice bench policy overhead: open node {}, policed node {} (2 access rules, 1 rate limit, token), {} rounds",
        open.addr, policed.addr, a.rounds
    );
    let dur = Duration::from_millis(a.duration_ms);
    let size = 10240;
    let mut rows = Vec::new();
    // Node CPU time per request in the many-client phases: (target, op, µs).
    let mut cpu: Vec<(&str, &str, f64)> = Vec::new();
    for _ in 0..a.rounds.max(1) {
        for (target, node, tok) in [
            ("open", &open, None),
            ("policed", &policed, Some(token.clone())),
        ] {
            let addr = &node.addr;
            let cfg = ClientConfig {
                addr: addr.clone(),
                token: tok,
                ..Default::default()
            };
            for op in ["put", "get"] {
                for n in [1, a.clients] {
                    let r = if n == 1 {
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()?
                    } else {
                        rt(2)?
                    };
                    let w = r.block_on(sluice_ops(&cfg, op, size, n))?;
                    let cpu0 = cpu_time(node.pid())?;
                    let res = r.block_on(closed_loop(
                        w,
                        dur,
                        format!("{target} {op} {} c={n}", fmt_size(size)),
                    ));
                    if n > 1 {
                        let used = cpu_time(node.pid())?.saturating_sub(cpu0);
                        let per_op = used.as_secs_f64() * 1e6 / res.0.len().max(1) as f64;
                        cpu.push((target, op, per_op));
                    }
                    rows.push(row(target, op, size, "closed", n, (&res.0, res.1, res.2)));
                }
            }
        }
    }
    report(&rows, json, None)?;
    if !json {
        let med = |t: &str, op: &str, n: usize, f: fn(&Row) -> f64| {
            median(
                rows.iter()
                    .filter(|r| r.target == t && r.op == op && r.clients == n)
                    .map(f),
            )
        };
        println!(
            "\npolicies enabled, not triggered, next to an open node (medians of {} rounds):",
            a.rounds
        );
        for op in ["put", "get"] {
            let p = med("policed", op, 1, |r| r.p50_us) / med("open", op, 1, |r| r.p50_us);
            let t = med("policed", op, a.clients, |r| r.ops_per_s)
                / med("open", op, a.clients, |r| r.ops_per_s);
            let c = |t: &str| median(cpu.iter().filter(|x| x.0 == t && x.1 == op).map(|x| x.2));
            println!(
                "  {op} 10 KB: p50 {p:.3}x, throughput ({} clients) {t:.3}x (target: within 2%); node CPU per request {:.2} vs {:.2} µs ({:.3}x)",
                a.clients,
                c("policed"),
                c("open"),
                c("policed") / c("open")
            );
        }
    }
    Ok(())
}

fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// What one QoS phase measured.
struct QosPhase {
    small: Option<Row>,
    bulk_ops_per_s: Option<f64>,
    /// The node's CPU over the phase, in cores (CPU seconds per second).
    node_cores: f64,
    /// The node's CPU seconds over the phase.
    node_cpu_s: f64,
}

impl QosPhase {
    /// The node's CPU seconds per request of the small client, where it
    /// was the only load (`None` without its requests).
    fn node_cpu_per_small_s(&self) -> Option<f64> {
        let ops = self.small.as_ref()?.count;
        (ops > 0).then(|| self.node_cpu_s / ops as f64)
    }
}

/// About how much of its throughput alone the bulk client can keep when
/// the small client's requests take their share of the node first: the
/// node's CPU per small request (from the small client alone, where the
/// node does nothing else) times the small client's rate next to the
/// bulk one, out of what the node used for the bulk client alone. An
/// estimate, not a bound: a request to an idle node also pays the
/// node's wake-up, which a busy one does not. `None` where a phase is
/// missing.
fn bulk_estimate(alone: &QosPhase, bulk_alone: &QosPhase, with: &QosPhase) -> Option<f64> {
    let per_small_s = alone.node_cpu_per_small_s()?;
    if bulk_alone.node_cores <= 0.0 {
        return None;
    }
    let small_cores = with.small.as_ref()?.ops_per_s * per_small_s;
    Some((1.0 - small_cores / bulk_alone.node_cores).max(0.0))
}

/// mRPC Table 3.4 on one node: phases small alone, bulk alone, both
/// without QoS, both with QoS; then the small client next to a raw
/// loopback stream carrying 0.9x the bulk client's bytes, the floor the
/// machine sets.
fn qos(a: &PolicyArgs, json: bool) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("sluice-bench-qos-")
        .tempdir()?;
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, format!("worker_threads = {}\n", a.node_threads))?;
    let node = ChildNode::start(&["--config", cfg.to_str().unwrap_or_default()])?;
    let addr = node.addr.clone();
    eprintln!(
        "sluice bench policy qos: node {addr}, {} rounds of 5 phases",
        a.rounds
    );
    let dur = Duration::from_millis(a.duration_ms);
    let mut rows = Vec::new();
    let mut summary: Vec<(&str, f64, f64)> = Vec::new();
    let pid = node.pid();
    for _ in 0..a.rounds.max(1) {
        let alone = qos_phase(&addr, pid, dur, true, Load::None)?;
        let bulk_alone = qos_phase(&addr, pid, dur, false, Load::Bulk)?;
        let mixed = qos_phase(&addr, pid, dur, true, Load::Bulk)?;
        let r = rt(1)?;
        r.block_on(policy(
            &addr,
            None,
            set("qos", json!({"kind": "qos", "small_bytes": 4096})),
        ))?;
        let with_qos = qos_phase(&addr, pid, dur, true, Load::Bulk)?;
        r.block_on(policy(&addr, None, json!({"op": "rm", "name": "qos"})))?;
        let base_p99 = alone.small.as_ref().map_or(f64::NAN, |r| r.p99_us);
        let base_bulk = bulk_alone.bulk_ops_per_s.unwrap_or(f64::NAN);
        // The machine's floor: the bytes the target asks the bulk client
        // to keep moving (0.9x its rate alone), moved by a raw loopback
        // stream that asks nothing of the node, next to the small client.
        let floor = qos_phase(
            &addr,
            pid,
            dur,
            true,
            Load::Raw(0.9 * base_bulk * (32 << 10) as f64),
        )?;
        for (label, ph) in [
            ("alone", &alone),
            ("bulk alone", &bulk_alone),
            ("no QoS", &mixed),
            ("QoS", &with_qos),
            ("raw stream", &floor),
        ] {
            if let Some(s) = &ph.small {
                let mut s = s.clone();
                s.target = format!("small {label}");
                rows.push(s);
            }
            if let Some(b) = ph.bulk_ops_per_s {
                let mut r = row_of_rate(&format!("bulk {label}"), 32 << 10, b);
                r.clients = 64;
                rows.push(r);
            }
        }
        let estimate = bulk_estimate(&alone, &bulk_alone, &with_qos).unwrap_or(f64::NAN);
        summary.push(("estimate", f64::NAN, estimate));
        let get_cpu_us = alone.node_cpu_per_small_s().map_or(f64::NAN, |s| s * 1e6);
        summary.push(("get cpu", f64::NAN, get_cpu_us));
        summary.push(("bulk cores", f64::NAN, bulk_alone.node_cores));
        summary.push(("QoS cores", f64::NAN, with_qos.node_cores));
        for (label, ph) in [("no QoS", &mixed), ("QoS", &with_qos), ("floor", &floor)] {
            summary.push((
                label,
                ph.small.as_ref().map_or(f64::NAN, |r| r.p99_us) / base_p99,
                ph.bulk_ops_per_s.unwrap_or(f64::NAN) / base_bulk,
            ));
        }
    }
    report(&rows, json, None)?;
    if !json {
        println!("\nmRPC Table 3.4 (medians of {} rounds): small client's p99 / its unloaded p99, bulk throughput / bulk alone", a.rounds);
        for label in ["no QoS", "QoS"] {
            let p = median(summary.iter().filter(|s| s.0 == label).map(|s| s.1));
            let t = median(summary.iter().filter(|s| s.0 == label).map(|s| s.2));
            println!("  {label:>6}: small p99 {p:.2}x (target with QoS <= 1.5x), bulk throughput {t:.2}x (target with QoS >= 0.9x)");
        }
        let p = median(summary.iter().filter(|s| s.0 == "floor").map(|s| s.1));
        let t = median(summary.iter().filter(|s| s.0 == "floor").map(|s| s.2));
        println!("   floor: small p99 {p:.2}x next to a raw loopback stream (no node work) moving {t:.2}x the bulk client's bytes alone: no QoS in the node can do better than this");
        let of = |l: &str| median(summary.iter().filter(|s| s.0 == l).map(|s| s.2));
        println!(
            "   node CPU: {:.2} cores for the bulk client alone, {:.2} with QoS; a small get takes {:.1} µs of it (small client alone, wake-ups included), so at their rate with QoS the gets leave the bulk client about {:.2}x (where the node is what limits the bulk client alone: ~1 core per worker thread)",
            of("bulk cores"),
            of("QoS cores"),
            of("get cpu"),
            of("estimate")
        );
    }
    Ok(())
}

/// The load next to the small client in a QoS phase.
enum Load {
    None,
    /// The bulk client: 32 KB puts, 64 in flight on one connection, in
    /// another thread and runtime.
    Bulk,
    /// A raw loopback TCP stream of 32 KB writes at this many bytes/s
    /// between two threads of this process (no node involved).
    Raw(f64),
}

/// One phase: the small client (32 B gets, one in flight, its own thread
/// and runtime) if `small`, next to `load`, for `dur`. The load's rate is
/// in 32 KB puts (or their worth of bytes) per second.
fn qos_phase(
    addr: &str,
    node_pid: u32,
    dur: Duration,
    small: bool,
    load: Load,
) -> Result<QosPhase> {
    let (cpu0, t0) = (cpu_time(node_pid)?, Instant::now());
    let cfg = ClientConfig {
        addr: addr.into(),
        ..Default::default()
    };
    let raw = match load {
        Load::Raw(rate) => Some(raw_stream(rate, dur)?),
        _ => None,
    };
    let bulk_thread = matches!(load, Load::Bulk).then(|| {
        let cfg = cfg.clone();
        std::thread::spawn(move || -> Result<f64> {
            let r = rt(1)?;
            r.block_on(async {
                let c = Client::connect_with(cfg).await?;
                let ops = Arc::new(AtomicU64::new(0));
                let stop = Arc::new(AtomicBool::new(false));
                let value = Bytes::from(vec![b'b'; 32 << 10]);
                let t0 = Instant::now();
                let mut tasks = Vec::new();
                for w in 0..64u64 {
                    let (c, ops, stop, value) =
                        (c.clone(), ops.clone(), stop.clone(), value.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut i = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            if c.put(&format!("/vol/bulk/{w}/{}", i % 16), value.clone())
                                .await
                                .is_ok()
                            {
                                ops.fetch_add(1, Ordering::Relaxed);
                            }
                            i += 1;
                        }
                    }));
                }
                tokio::time::sleep(dur).await;
                stop.store(true, Ordering::Relaxed);
                let n = ops.load(Ordering::Relaxed);
                let took = t0.elapsed();
                for t in tasks {
                    let _ = t.await;
                }
                anyhow::Ok(n as f64 / took.as_secs_f64())
            })
        })
    });
    let small_row = if small {
        let r = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let w = r.block_on(sluice_ops(&cfg, "get", 32, 1))?;
        // Let the bulk client reach its steady state first.
        std::thread::sleep(Duration::from_millis(200));
        let res = r.block_on(closed_loop(
            w,
            dur.saturating_sub(Duration::from_millis(400)),
            "small 32 B gets".into(),
        ));
        Some(row("small", "get", 32, "closed", 1, (&res.0, res.1, res.2)))
    } else {
        None
    };
    let bulk_ops_per_s = match (bulk_thread, raw) {
        (Some(t), _) => Some(
            t.join()
                .map_err(|_| anyhow::anyhow!("the bulk client panicked"))??,
        ),
        // The stream's rate in bulk puts' worth of bytes.
        (None, Some(t)) => Some(
            t.join()
                .map_err(|_| anyhow::anyhow!("the raw stream panicked"))??
                / (32 << 10) as f64,
        ),
        (None, None) => None,
    };
    let node_cpu_s = cpu_time(node_pid)?.saturating_sub(cpu0).as_secs_f64();
    Ok(QosPhase {
        small: small_row,
        bulk_ops_per_s,
        node_cores: node_cpu_s / t0.elapsed().as_secs_f64(),
        node_cpu_s,
    })
}

/// A raw loopback TCP stream for `dur`: a thread writes 32 KB at a time,
/// paced to `rate` bytes/s, and another reads and drops them. Returns the
/// sender's thread, which answers the rate reached.
fn raw_stream(rate: f64, dur: Duration) -> Result<std::thread::JoinHandle<Result<f64>>> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let to = listener.local_addr()?;
    std::thread::spawn(move || -> Result<()> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 64 << 10];
        while s.read(&mut buf)? > 0 {}
        Ok(())
    });
    let mut out = std::net::TcpStream::connect(to)?;
    out.set_nodelay(true)?;
    Ok(std::thread::spawn(move || -> Result<f64> {
        let chunk = vec![b'r'; 32 << 10];
        let t0 = Instant::now();
        let mut sent = 0f64;
        while t0.elapsed() < dur {
            // Ahead of the pace: wait for it (the stream's own pacing).
            let due = Duration::from_secs_f64(sent / rate);
            if let Some(ahead) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(ahead);
            }
            out.write_all(&chunk)?;
            sent += chunk.len() as f64;
        }
        Ok(sent / t0.elapsed().as_secs_f64())
    }))
}

/// Small gets (one in flight) on the connection that also carries 1 MB
/// puts (4 in flight), with the values sent whole and in 64 KB parts
/// (`ClientConfig::value_part_bytes`), next to the gets alone.
fn one_connection(a: &PolicyArgs, json: bool) -> Result<()> {
    let node = ChildNode::start(&[])?;
    eprintln!(
        "sluice bench policy conn: node {}, {} rounds",
        node.addr, a.rounds
    );
    let dur = Duration::from_millis(a.duration_ms);
    let mut rows = Vec::new();
    for _ in 0..a.rounds.max(1) {
        for (label, parts, bulk) in [
            ("gets alone", None, false),
            ("whole 1 MB puts", None, true),
            ("1 MB puts in 64 KB parts", Some(64 << 10), true),
        ] {
            let r = rt(2)?;
            let (small, puts) = r.block_on(async {
                let c = Client::connect_with(ClientConfig {
                    addr: node.addr.clone(),
                    connections: 1,
                    value_part_bytes: parts,
                    ..Default::default()
                })
                .await?;
                c.put("/vol/conn/small", Bytes::from_static(b"s")).await?;
                let stop = Arc::new(AtomicBool::new(false));
                let puts = Arc::new(AtomicU64::new(0));
                let mut tasks = Vec::new();
                for w in 0..if bulk { 4 } else { 0 } {
                    let (c, stop, puts) = (c.clone(), stop.clone(), puts.clone());
                    tasks.push(tokio::spawn(async move {
                        let v = Bytes::from(vec![b'b'; 1 << 20]);
                        while !stop.load(Ordering::Relaxed) {
                            if c.put(&format!("/vol/conn/big/{w}"), v.clone())
                                .await
                                .is_ok()
                            {
                                puts.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }));
                }
                let mut h = hist();
                let t0 = Instant::now();
                while t0.elapsed() < dur {
                    let t = Instant::now();
                    c.get("/vol/conn/small").await?;
                    let _ = h.record(t.elapsed().as_nanos() as u64);
                }
                stop.store(true, Ordering::Relaxed);
                for t in tasks {
                    let _ = t.await;
                }
                anyhow::Ok((
                    h,
                    puts.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64(),
                ))
            })?;
            let mut row = row(label, "get", 32, "closed", 1, (&small, dur, 0));
            row.ops_per_s = small.len() as f64 / dur.as_secs_f64();
            rows.push(row);
            if bulk {
                let mut b = row_of_rate(&format!("{label}: puts"), 1 << 20, puts);
                b.clients = 4;
                rows.push(b);
            }
        }
    }
    report(&rows, json, None)?;
    Ok(())
}

/// A row that carries only a rate (ops/s).
fn row_of_rate(target: &str, size: usize, ops_per_s: f64) -> Row {
    let mut r = row(
        target,
        "put",
        size,
        "closed",
        1,
        (&hist(), Duration::from_secs(1), 0),
    );
    r.ops_per_s = ops_per_s;
    r
}

/// A rate limit added, then removed, under load on a 3-node cluster:
/// ops/s per 100 ms, and how long after each command returned the
/// change was in force on the node serving the load.
fn live(a: &PolicyArgs, json: bool) -> Result<()> {
    let procs = crate::procs::Procs::start(3, 0)?;
    let (load_addr, admin_addr) = (procs.addrs[1].clone(), procs.addrs[2].clone());
    let r = rt(2)?;
    let limit = 2000u64;
    let phase = Duration::from_millis(a.duration_ms.max(1000));
    let out = r.block_on(async {
        let c = crate::procs::connect(&load_addr, Duration::from_secs(5)).await?;
        c.put("/vol/live/k", Bytes::from_static(b"x")).await?;
        // Gets straight to one node, so one node's limit is what shows.
        let conns: Vec<_> = conns_to(&load_addr, 8).await?;
        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let events: Arc<parking_lot::Mutex<Vec<(u64, u8)>>> = Arc::default();
        let mut tasks = Vec::new();
        for conn in conns {
            let (stop, events) = (stop.clone(), events.clone());
            tasks.push(tokio::spawn(async move {
                let req = sluice_wire::Request::get_latest("/vol/live/k");
                let mut local = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let kind = match conn.call(&req, Duration::from_secs(5)).await {
                        Ok(_) => 0u8,
                        Err(SluiceError::RateLimited { .. }) => 1,
                        Err(_) => 2,
                    };
                    local.push((start.elapsed().as_micros() as u64, kind));
                }
                events.lock().extend(local);
            }));
        }
        tokio::time::sleep(phase).await;
        policy(&admin_addr, None, set("live", json!({"kind": "rate", "who": "anyone", "pool": "/vol/live", "ops_per_s": limit, "max_delay_ms": 0}))).await?;
        let set_at = start.elapsed().as_micros() as u64;
        tokio::time::sleep(phase).await;
        policy(&admin_addr, None, json!({"op": "rm", "name": "live"})).await?;
        let rm_at = start.elapsed().as_micros() as u64;
        tokio::time::sleep(phase).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        let ev = std::mem::take(&mut *events.lock());
        anyhow::Ok((ev, set_at, rm_at))
    })?;
    let (mut ev, set_at, rm_at) = out;
    ev.sort_unstable();
    let bucket_us = 100_000u64;
    let end = ev.last().map_or(0, |e| e.0);
    let mut series = Vec::new();
    for b in 0..=end / bucket_us {
        let inb = ev.iter().filter(|e| e.0 / bucket_us == b);
        let (mut ok, mut lim, mut err) = (0u64, 0u64, 0u64);
        for e in inb {
            match e.1 {
                0 => ok += 1,
                1 => lim += 1,
                _ => err += 1,
            }
        }
        series.push(
            json!({"t_ms": b * 100, "ok_per_s": ok * 10, "limited_per_s": lim * 10, "failed": err}),
        );
    }
    let first_limited = ev
        .iter()
        .find(|e| e.1 == 1 && e.0 >= set_at.saturating_sub(bucket_us))
        .map(|e| e.0);
    let last_limited = ev.iter().rev().find(|e| e.1 == 1).map(|e| e.0);
    let failed = ev.iter().filter(|e| e.1 == 2).count();
    // In force when the admitted rate first falls to the limit: the first
    // refusal after the command returned (or before it: the leader and
    // this node applied it while the reply was on its way).
    let took_effect_ms = first_limited.map(|t| t.saturating_sub(set_at) as f64 / 1000.0);
    let lifted_ms = last_limited.map(|t| t.saturating_sub(rm_at) as f64 / 1000.0);
    let doc = json!({
        "limit_ops_per_s": limit,
        "set_at_ms": set_at / 1000, "removed_at_ms": rm_at / 1000,
        "took_effect_ms": took_effect_ms, "lifted_ms": lifted_ms,
        "failed_other_than_limited": failed, "series": series,
    });
    if json {
        println!("{doc}");
    } else {
        println!("\nlive rate limit ({limit} ops/s on the serving node) set through another node of a 3-node cluster:");
        println!("  t_ms  ok/s  limited/s");
        for s in &series {
            println!(
                "  {:>5} {:>6} {:>6}",
                s["t_ms"], s["ok_per_s"], s["limited_per_s"]
            );
        }
        println!(
            "set at {} ms, in force after {:.1} ms; removed at {} ms, lifted after {:.1} ms; failed requests other than limited: {failed}",
            set_at / 1000,
            took_effect_ms.unwrap_or(f64::NAN),
            rm_at / 1000,
            lifted_ms.unwrap_or(f64::NAN)
        );
    }
    Ok(())
}

async fn conns_to(addr: &str, n: usize) -> Result<Vec<Arc<sluice_client::Conn>>> {
    let sa: std::net::SocketAddr = addr.parse().context("node address")?;
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(sluice_client::Conn::connect(sa, "bench-live", Duration::from_secs(3)).await?);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(ops_per_s: f64, count: u64) -> Row {
        let mut r = row_of_rate("small", 32, ops_per_s);
        r.count = count;
        r
    }

    fn phase(small: Option<Row>, node_cores: f64, node_cpu_s: f64) -> QosPhase {
        QosPhase {
            small,
            bulk_ops_per_s: None,
            node_cores,
            node_cpu_s,
        }
    }

    #[test]
    fn the_bulk_estimate_takes_the_small_gets_share_out_of_the_node() {
        // 10,000 gets took 0.2 s of node CPU: 20 µs each. At 5,000 gets/s
        // next to the bulk client they take 0.1 of a core, out of the one
        // core the node spent on the bulk client alone.
        let alone = phase(Some(small(20_000.0, 10_000)), 0.13, 0.2);
        let bulk_alone = phase(None, 1.0, 1.5);
        let with = phase(Some(small(5_000.0, 7_500)), 1.0, 1.5);
        let e = bulk_estimate(&alone, &bulk_alone, &with).unwrap();
        assert!((e - 0.9).abs() < 1e-9, "{e}");
        // Gets that would take more than the node had: nothing left.
        let busy = phase(Some(small(60_000.0, 90_000)), 1.0, 1.5);
        assert_eq!(bulk_estimate(&alone, &bulk_alone, &busy), Some(0.0));
        // Without the small client's phases, or a node that did nothing,
        // there is no estimate.
        assert_eq!(bulk_estimate(&bulk_alone, &bulk_alone, &with), None);
        assert_eq!(bulk_estimate(&alone, &phase(None, 0.0, 0.0), &with), None);
        let none = phase(Some(small(0.0, 0)), 0.0, 0.0);
        assert_eq!(bulk_estimate(&none, &bulk_alone, &with), None);
    }
}
