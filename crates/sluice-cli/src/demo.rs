//! `sluice demo`: the smart-farming-style pipeline of the Cascade paper on
//! real data. An embedded node hosts three lambda stages:
//!
//! 1. `/demo/frames` — `onnx` filter (logistic regression): is this a usable
//!    digit image? Usable frames go on to stage 2; others are recorded as
//!    `unusable` in `/demo/results`.
//! 2. `/demo/digits` — `onnx` classifier (MLP 64-32-10), emits the digit.
//! 3. `/demo/labels` — `relay` into the volatile pool `/demo/results`.
//!
//! Images are scikit-learn's bundled handwritten digits (held-out 20%) plus
//! synthetic unusable frames; the models were trained by
//! `scripts/train_demo_models.py` and are embedded in the binary, so nothing
//! is downloaded. The demo streams the images at a fixed rate, checks the
//! pipeline's accuracy against the models' offline accuracy, and prints a
//! per-stage latency breakdown (transfer, queueing, compute, forward) from
//! the traces the objects carry, also written as an SVG chart.

use anyhow::{bail, Context as _, Result};
use bytes::Bytes;
use sluice_client::{Client, PoolSpec, PoolType};
use sluice_server::{Server, ServerConfig};
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const FILTER_ONNX: &[u8] = include_bytes!("../../../demo/filter.onnx");
const CLASSIFIER_ONNX: &[u8] = include_bytes!("../../../demo/classifier.onnx");
const IMAGES: &[u8] = include_bytes!("../../../demo/images.f32");
const LABELS: &[u8] = include_bytes!("../../../demo/labels.i8");
const OFFLINE: &str = include_str!("../../../demo/offline_metrics.json");

const STAGES: [&str; 3] = ["/demo/frames", "/demo/digits", "/demo/labels"];

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Frames per second streamed into the pipeline (at least 1).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    rate: u64,
    /// How many of the held-out frames to stream, at least 1 (default: all).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    images: Option<u64>,
    /// Where to write the latency breakdown chart.
    #[arg(long, default_value = "sluice-demo-latency.svg")]
    svg: PathBuf,
    /// Exit with an error unless the pipeline's accuracy equals the
    /// models' offline accuracy (CI runs this).
    #[arg(long)]
    check: bool,
}

pub fn dfg_json() -> String {
    serde_json::json!([{
        "id": "digits-demo",
        "desc": "filter -> classify -> store (sklearn digits)",
        "graph": [
            {
                "pathname": STAGES[0],
                "user_defined_logic_list": ["onnx"],
                "user_defined_logic_config_list": [{
                    "model_key": "/models/filter", "input_shape": [1, 64], "mode": "gate", "threshold": 0.5,
                    "reject_destination": "/demo/results", "reject_value": "unusable"
                }],
                "user_defined_logic_hook_list": ["trigger"],
                "destinations": [{ "/demo/digits": "trigger_put" }]
            },
            {
                "pathname": STAGES[1],
                "user_defined_logic_list": ["onnx"],
                "user_defined_logic_config_list": [{ "model_key": "/models/classifier", "input_shape": [1, 64], "mode": "argmax" }],
                "user_defined_logic_hook_list": ["trigger"],
                "destinations": [{ "/demo/labels": "trigger_put" }]
            },
            {
                "pathname": STAGES[2],
                "user_defined_logic_list": ["relay"],
                "user_defined_logic_hook_list": ["trigger"],
                "destinations": [{ "/demo/results": "put" }]
            }
        ]
    }])
    .to_string()
}

pub fn run(a: DemoArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(demo(a))
}

/// Per-stage latency components, in µs.
#[derive(Default)]
struct Breakdown {
    transfer: Vec<u64>,
    queue: Vec<u64>,
    compute: Vec<u64>,
    forward: Vec<u64>,
}

fn pct(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

async fn demo(a: DemoArgs) -> Result<()> {
    let offline: serde_json::Value = serde_json::from_str(OFFLINE)?;
    let n_all = IMAGES.len() / (64 * 4);
    let n = a.images.map_or(n_all, |i| i as usize).min(n_all);
    let dir = std::env::temp_dir().join(format!("sluice-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.clone(),
        ..Default::default()
    };
    let server = Server::bind(cfg).await?;
    let addr = server.local_addr().to_string();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(server.run(async {
        let _ = stop_rx.await;
    }));
    println!("== embedded node on {addr}");
    let c = Client::connect(&addr).await?;
    install_pipeline(&c).await?;

    let mut watch = c.watch("/demo/results").await?;
    let rate = a.rate;
    println!(
        "== streaming {n} held-out frames at {rate}/s ({} digits + unusable frames)",
        offline["digits"]
    );
    let tty = std::io::stderr().is_terminal();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let sender = {
        let c = c.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for i in 0..n {
                tokio::time::sleep_until(start + interval * i as u32).await;
                let img = Bytes::from_static(&IMAGES[i * 256..(i + 1) * 256]);
                c.trigger_put_traced(&format!("/demo/frames/{i:05}"), img, i as u64)
                    .await?;
            }
            Ok::<_, sluice_client::SluiceError>(())
        })
    };
    let t0 = Instant::now();
    let mut results: HashMap<usize, (String, Option<sluice_client::Object>)> = HashMap::new();
    let mut e2e_us = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60) + interval * n as u32;
    while results.len() < n {
        let note = tokio::time::timeout_at(deadline, watch.next())
            .await
            .map_err(|_| anyhow::anyhow!("timed out: {} of {n} results arrived", results.len()))?
            .context("connection closed")?;
        let Some(idx) = note
            .object
            .key
            .rsplit('/')
            .next()
            .and_then(|s| s.parse::<usize>().ok())
        else {
            continue;
        };
        if let Some(t) = &note.object.trace {
            e2e_us.push(sluice_client::wall_us().saturating_sub(t.client_sent_us));
        }
        results.insert(
            idx,
            (
                String::from_utf8_lossy(&note.object.value).into_owned(),
                Some(note.object),
            ),
        );
        if results.len().is_multiple_of(20) || results.len() == n {
            let frac = results.len() as f64 / n as f64;
            if tty {
                eprint!(
                    "\r  [{:<30}] {:>5}/{n} results",
                    "#".repeat((frac * 30.0) as usize),
                    results.len()
                );
            }
        }
    }
    if tty {
        eprintln!();
    }
    sender.await??;
    let wall = t0.elapsed();

    let correct = accuracy(&results, &offline, n);
    let p50s = latency_breakdown(&results, &mut e2e_us, n, wall);
    write_svg(&a.svg, &p50s).with_context(|| format!("writing {}", a.svg.display()))?;
    println!("== chart written to {}", a.svg.display());
    let st = c.stats().await?;
    println!(
        "== compute: {} upcalls, {} failures, {} panics, dispatch overhead p50 {} µs",
        st["compute"]["upcalls"],
        st["compute"]["failures"],
        st["compute"]["panics"],
        st["compute"]["dispatch_overhead_us"]["p50"]
    );
    let _ = stop_tx.send(());
    let _ = node.await;
    let _ = std::fs::remove_dir_all(dir);
    let expected = offline["offline_pipeline_correct"].as_u64().unwrap_or(0) as usize;
    if a.check && n == n_all && correct != expected {
        bail!("pipeline accuracy {correct}/{n} differs from the offline accuracy {expected}/{n}");
    }
    println!("demo finished");
    Ok(())
}

/// The demo's pools, its two models (uploaded as objects) and its data
/// flow graph.
async fn install_pipeline(c: &Client) -> Result<()> {
    for (path, t) in [
        ("/models", PoolType::Volatile),
        ("/demo/results", PoolType::Volatile),
        ("/demo/frames", PoolType::Trigger),
        ("/demo/digits", PoolType::Trigger),
        ("/demo/labels", PoolType::Trigger),
    ] {
        c.create_pool(PoolSpec {
            pathname: path.into(),
            pool_type: Some(t),
            ..Default::default()
        })
        .await?;
    }
    c.put("/models/filter", Bytes::from_static(FILTER_ONNX))
        .await?;
    c.put("/models/classifier", Bytes::from_static(CLASSIFIER_ONNX))
        .await?;
    println!(
        "== models uploaded as objects: /models/filter ({} B), /models/classifier ({} B)",
        FILTER_ONNX.len(),
        CLASSIFIER_ONNX.len()
    );
    c.dfg_apply(&dfg_json())
        .await
        .context("deploying the demo data flow graph")?;
    println!(
        "== data flow graph deployed: {} -> {} -> {} -> /demo/results",
        STAGES[0], STAGES[1], STAGES[2]
    );
    Ok(())
}

/// Prints the pipeline's accuracy next to the models' offline accuracy
/// on the same frames; returns how many frames it got right.
fn accuracy(
    results: &HashMap<usize, (String, Option<sluice_client::Object>)>,
    offline: &serde_json::Value,
    n: usize,
) -> usize {
    // Accuracy, with the offline definition.
    let mut correct = 0;
    for (i, (v, _)) in results {
        let label = LABELS[*i] as i8;
        let ok = if label < 0 {
            v == "unusable"
        } else {
            v.parse::<i64>().ok() == Some(i64::from(label))
        };
        correct += ok as usize;
    }
    let acc = correct as f64 / n as f64;
    println!(
        "== accuracy {:.4} ({correct}/{n} correct); offline accuracy of the models on the same frames {:.4} ({}/{})",
        acc,
        offline["offline_pipeline_accuracy"].as_f64().unwrap_or(0.0),
        offline["offline_pipeline_correct"],
        offline["images"]
    );
    correct
}

/// Prints each stage's latency (transfer, queueing, compute, forward: p50
/// and p99) from the results' traces, and the end-to-end latency; returns
/// the p50s per stage for the chart.
fn latency_breakdown(
    results: &HashMap<usize, (String, Option<sluice_client::Object>)>,
    e2e_us: &mut [u64],
    n: usize,
    wall: Duration,
) -> Vec<[u64; 4]> {
    // Latency breakdown from the traces.
    let mut stages: Vec<Breakdown> = (0..3).map(|_| Breakdown::default()).collect();
    for (_, obj) in results.values() {
        let Some(o) = obj else { continue };
        let Some(t) = &o.trace else { continue };
        for (h, hop) in t.hops.iter().enumerate() {
            let Some(si) = STAGES.iter().position(|s| *s == hop.stage) else {
                continue;
            };
            let b = &mut stages[si];
            if h == 0 {
                b.transfer
                    .push(hop.enqueued_us.saturating_sub(t.client_sent_us));
            }
            b.queue.push(hop.started_us.saturating_sub(hop.enqueued_us));
            b.compute
                .push(hop.emitted_us.saturating_sub(hop.started_us));
            let next = t
                .hops
                .get(h + 1)
                .map_or(o.meta.timestamp_us, |n| n.enqueued_us);
            b.forward.push(next.saturating_sub(hop.emitted_us));
        }
    }
    println!(
        "== latency breakdown per stage (µs, p50 / p99), {} frames in {:.2} s",
        n,
        wall.as_secs_f64()
    );
    println!(
        "{:<16} {:>15} {:>15} {:>15} {:>15}",
        "stage", "transfer", "queueing", "compute", "forward"
    );
    let mut p50s = Vec::new();
    for (si, b) in stages.iter_mut().enumerate() {
        let f = |v: &mut Vec<u64>| (pct(v, 0.5), pct(v, 0.99));
        let (t, q, cmp, fw) = (
            f(&mut b.transfer),
            f(&mut b.queue),
            f(&mut b.compute),
            f(&mut b.forward),
        );
        let cell = |(p50, p99): (u64, u64), has: bool| {
            if has {
                format!("{p50:>7} / {p99:<6}")
            } else {
                format!("{:>7}   {:<6}", "-", "")
            }
        };
        println!(
            "{:<16} {} {} {} {}",
            STAGES[si],
            cell(t, !b.transfer.is_empty()),
            cell(q, !b.queue.is_empty()),
            cell(cmp, !b.compute.is_empty()),
            cell(fw, !b.forward.is_empty())
        );
        p50s.push([t.0, q.0, cmp.0, fw.0]);
    }
    println!(
        "end to end (client send -> result notification): p50 {} µs, p99 {} µs",
        pct(e2e_us, 0.5),
        pct(&mut e2e_us.to_vec(), 0.99)
    );
    p50s
}

/// A stacked horizontal bar per stage of the p50 components (Fig. 10a style).
fn write_svg(path: &PathBuf, p50s: &[[u64; 4]]) -> std::io::Result<()> {
    let names = ["transfer", "queueing", "compute", "forward"];
    let colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"];
    let max: u64 = p50s
        .iter()
        .map(|r| r.iter().sum::<u64>())
        .max()
        .unwrap_or(1)
        .max(1);
    let (w, left, bar_h) = (760.0, 140.0, 34.0);
    let scale = (w - left - 40.0) / max as f64;
    let h = 90.0 + p50s.len() as f64 * (bar_h + 16.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\" font-size=\"15\">Sluice demo pipeline: p50 latency per stage (µs)</text>\n"
    );
    for (i, row) in p50s.iter().enumerate() {
        let y = 40.0 + i as f64 * (bar_h + 16.0);
        s += &format!(
            "<text x=\"10\" y=\"{}\">{}</text>\n",
            y + bar_h / 2.0 + 4.0,
            STAGES[i]
        );
        let mut x = left;
        for (k, v) in row.iter().enumerate() {
            let bw = *v as f64 * scale;
            s += &format!("<rect x=\"{x:.1}\" y=\"{y}\" width=\"{bw:.1}\" height=\"{bar_h}\" fill=\"{}\"><title>{} {} µs</title></rect>\n", colors[k], names[k], v);
            x += bw;
        }
        s += &format!(
            "<text x=\"{:.1}\" y=\"{}\">{} µs</text>\n",
            x + 6.0,
            y + bar_h / 2.0 + 4.0,
            row.iter().sum::<u64>()
        );
    }
    let ly = h - 24.0;
    for (k, n) in names.iter().enumerate() {
        let x = left + k as f64 * 120.0;
        s += &format!("<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{n}</text>\n", ly - 10.0, colors[k], x + 16.0, ly);
    }
    s += "</svg>\n";
    let mut f = std::fs::File::create(path)?;
    f.write_all(s.as_bytes())
}
