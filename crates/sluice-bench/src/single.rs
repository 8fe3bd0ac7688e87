//! Benchmarks of one node: core operations, memory, planner, lambda
//! pipelines and persistent pools.

use crate::harness::*;
use crate::peers::*;
use crate::{CoreArgs, MemoryArgs, PersistentArgs, PipelineArgs, PlanBenchArgs};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use sluice_client::{Client, ClientConfig};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

pub fn core(a: CoreArgs, json: bool) -> Result<()> {
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
            let cfg = ClientConfig {
                addr: addr.clone(),
                client_name: "bench".into(),
                ..Default::default()
            };
            let mk_clients = |rt: &tokio::runtime::Runtime, n: usize| -> Result<Vec<SluiceOp>> {
                rt.block_on(sluice_ops(&cfg, op, size, n))
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

pub fn memory(m: MemoryArgs, json: bool) -> Result<()> {
    // A standalone node, or a volatile shard of `replicas` node processes
    // (the RSS is then the largest member's).
    let (node, cluster) = if m.replicas > 1 {
        (None, Some(crate::procs::Procs::start(m.replicas, 1)?))
    } else {
        (Some(ChildNode::start(&[])?), None)
    };
    let (addr, pids) = match (&node, &cluster) {
        (Some(n), _) => (n.addr.clone(), vec![n.pid()]),
        (_, Some(c)) => (c.addrs[0].clone(), c.pids()),
        _ => unreachable!("one of the two was started"),
    };
    let rss = || -> Result<u64> {
        pids.iter()
            .map(|&p| rss_kib(p))
            .try_fold(0, |m, r| Ok(m.max(r?)))
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if cluster.is_some() {
        rt.block_on(crate::procs::connect(&addr, Duration::from_secs(10)))?;
    }
    let before = rss()?;
    let t0 = Instant::now();
    let what = format!("put {} x {}", m.objects, fmt_size(m.size));
    rt.block_on(put_keys(&addr, &what, m.objects, m.objects, m.size, None))?;
    let load_s = t0.elapsed().as_secs_f64();
    let after = rss()?;
    let per_obj = (after.saturating_sub(before) as f64 * 1024.0) / m.objects as f64;
    // Then as a cache is written: each put a new value for a random key.
    let overwritten = if m.overwrites > 0.0 {
        let puts = (m.objects as f64 * m.overwrites) as u64;
        let what = format!("overwrite {puts} x {}", fmt_size(m.size));
        rt.block_on(put_keys(&addr, &what, puts, m.objects, m.size, Some(7)))?;
        Some(rss()?)
    } else {
        None
    };
    let per_obj_after =
        overwritten.map(|kib| (kib.saturating_sub(before) as f64 * 1024.0) / m.objects as f64);
    let v = serde_json::json!({
        "objects": m.objects,
        "replicas": m.replicas,
        "value_bytes": m.size,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "rss_after_gib": after as f64 / (1024.0 * 1024.0),
        "bytes_per_object": per_obj,
        "overhead_bytes_per_object": per_obj - m.size as f64,
        "load_seconds": load_s,
        "overwrites_per_object": m.overwrites,
        "rss_after_overwrites_kib": overwritten,
        "bytes_per_object_after_overwrites": per_obj_after,
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
        if let (Some(kib), Some(per)) = (overwritten, per_obj_after) {
            println!(
                "after {} overwrites per object (random keys): node RSS {:.3} GiB, {per:.0} B/object ({:.2}x the load's)",
                m.overwrites,
                kib as f64 / (1024.0 * 1024.0),
                per / per_obj
            );
        }
    }
    Ok(())
}

/// `puts` puts of `size` bytes over 4 connections, 64 in flight each, to
/// keys `/vol/mem/<i>` for i below `keys`: in order, or (`seed`) random.
async fn put_keys(
    addr: &str,
    what: &str,
    puts: u64,
    keys: u64,
    size: usize,
    seed: Option<u64>,
) -> Result<()> {
    let ops = Arc::new(AtomicU64::new(0));
    let _p = Progress::start(what.to_string(), Duration::from_secs(30), ops.clone());
    let clients = 4u64;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = Client::connect(addr).await?;
        let ops = ops.clone();
        tasks.push(tokio::spawn(async move {
            let value = Bytes::from(vec![b'm'; size]);
            let mut rng = seed.map(|s| (s + c).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut inflight = tokio::task::JoinSet::new();
            let mut n = c;
            while n < puts {
                let i = match rng.as_mut() {
                    Some(x) => {
                        *x ^= *x << 13;
                        *x ^= *x >> 7;
                        *x ^= *x << 17;
                        *x % keys
                    }
                    None => n,
                };
                let (cl, v) = (client.clone(), value.clone());
                inflight.spawn(async move { cl.put(&format!("/vol/mem/{i:08}"), v).await });
                if inflight.len() >= 64 {
                    if let Some(r) = inflight.join_next().await {
                        r??;
                    }
                }
                ops.fetch_add(1, Ordering::Relaxed);
                n += clients;
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
    Ok(())
}

// ---------------------------------------------------------------- plan

pub fn plan_bench(a: PlanBenchArgs, json: bool) -> Result<()> {
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
                    // The heuristics' time (the exact search is budgeted
                    // separately; see `sluice plan`).
                    exact_budget: None,
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

pub fn pipeline_bench(a: PipelineArgs, json: bool) -> Result<()> {
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

/// The median latency (µs) of a 10 KB append + fdatasync when `writers`
/// threads do it at once, each to its own preallocated file under `dir`:
/// with two or three, what the members of a 3-replica persistent shard
/// pay when their log writes overlap on this machine's one disk.
fn fsync_floor_us(dir: &std::path::Path, writers: usize) -> Result<f64> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    const RECORD: usize = 10 * 1024;
    const WRITES: usize = 1000;
    std::fs::create_dir_all(dir)?;
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let path = dir.join(format!("fsync-floor-{w}.bin"));
            std::thread::spawn(move || -> Result<Vec<f64>> {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .read(true)
                    .write(true)
                    .open(&path)?;
                // SAFETY: a valid descriptor of a file we own.
                let rc = unsafe {
                    libc::posix_fallocate(f.as_raw_fd(), 0, (RECORD * WRITES) as libc::off_t)
                };
                if rc != 0 {
                    anyhow::bail!("fallocate {}: error {rc}", path.display());
                }
                f.sync_all()?;
                let buf = vec![0x5au8; RECORD];
                let mut lat = Vec::with_capacity(WRITES);
                for i in 0..WRITES {
                    let t = Instant::now();
                    f.write_all_at(&buf, (i * RECORD) as u64)?;
                    f.sync_data()?;
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
                drop(f);
                let _ = std::fs::remove_file(&path);
                Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        all.extend(
            t.join()
                .map_err(|_| anyhow::anyhow!("fsync floor thread panicked"))??,
        );
    }
    all.sort_by(f64::total_cmp);
    Ok(all[all.len() / 2])
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

pub fn persistent_bench(a: PersistentArgs, json: bool) -> Result<()> {
    if !a.no_etcd {
        crate::etcd::require_etcd()?;
    }
    let dur = Duration::from_millis(a.duration_ms);
    let base = std::env::temp_dir().join(format!("sluice-bench-persistent-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let disk = disk_fsync_bandwidth(&base, dur)?;
    // (one writer, two at once): fdatasync'd 10 KB appends, p50 µs.
    let mut floor: Option<(f64, f64)> = None;
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
                        let at = sluice_client::wall_us() - age_ms * 1000;
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
        let procs = crate::procs::Procs::start_custom(
            3,
            a.node_threads,
            Some(&a.cluster_sync),
            &[0, 1, 2],
            &a.cluster_config,
        )?;
        let addr = procs.addrs[0].clone();
        rt.block_on(async {
            let c = crate::procs::connect(&addr, Duration::from_secs(10)).await?;
            let c = create_persistent_pool(c).await?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while let Err(e) = c.put("/p/ready", "x").await {
                if Instant::now() > deadline {
                    anyhow::bail!("the persistent shard took no put within 30 s: {e}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            put_phases(&mut rows, "sluice-r3", &addr, &c, &a, dur).await?;
            // The same path without an fsync: a volatile 3-replica put on
            // the same nodes (for the floor below).
            let op = crate::peers::SluiceOp {
                client: c.clone(),
                op: "put",
                value: bytes::Bytes::from(vec![b'v'; 10 * 1024]),
                prefix: "/vol/floor".into(),
            };
            let r = closed_loop(vec![op], dur, "volatile put 10KB on the same nodes".into()).await;
            rows.push(row(
                "sluice-r3-volatile",
                "put",
                10 * 1024,
                "closed",
                1,
                (&r.0, r.1, r.2),
            ));
            Ok::<_, anyhow::Error>(())
        })?;
        drop(procs);
        floor = Some((
            fsync_floor_us(&base.join("floor"), 1)?,
            fsync_floor_us(&base.join("floor"), 2)?,
        ));
    }
    if !a.no_etcd {
        eprintln!("etcd: starting a 3-member cluster");
        let etcd = crate::etcd::start_etcd(base.join("etcd"))?;
        rt.block_on(async {
            let leader = etcd.leader().await?;
            for &size in &a.sizes {
                let op =
                    crate::etcd::EtcdOp::connect(&leader, &format!("/lat/{size}"), size).await?;
                let r =
                    closed_loop(vec![op], dur, format!("etcd put {} c=1", fmt_size(size))).await;
                rows.push(row("etcd-r3", "put", size, "closed", 1, (&r.0, r.1, r.2)));
                let mut ws = Vec::new();
                for i in 0..a.clients {
                    ws.push(
                        crate::etcd::EtcdOp::connect(&leader, &format!("/tput/{size}/{i}"), size)
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
                &serde_json::json!({"disk_fsync_mib_s": disk, "disk_fsync_mib_s_after": disk_after, "puts": rows, "get_by_time": time_rows, "recovery": recovery, "fsync_floor_us": floor.map(|(one, two)| serde_json::json!({"one_writer": one, "two_writers": two}))})
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
                    " (issue #20's goal <= 0.5x; #6's target <= 1x)"
                } else {
                    " (issue #20's goal <= 0.7x)"
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
                    " (issue #20's goal >= 3x; #6's target >= 2x)"
                } else {
                    ""
                }
            );
        }
    }
    if let (Some((one, two)), Some(v), Some(e)) = (
        floor,
        find("sluice-r3-volatile", 10 * 1024, 1),
        find("etcd-r3", 10 * 1024, 1),
    ) {
        let f = v.p50_us + two;
        println!(
            "floor of a 3-replica persistent put 10KB here: a volatile 3-replica put ({:.1} µs p50) + two overlapping fdatasync'd 10 KB appends ({two:.1} µs p50; one alone {one:.1} µs) = {f:.1} µs = {:.2}x etcd",
            v.p50_us,
            f / e.p50_us
        );
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
