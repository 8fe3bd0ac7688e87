//! `sluice bench streams` (issue #18): EdgeServe's evaluation shapes on
//! real node processes: a broker node holding the topics and edge nodes
//! recording payloads (standalone `sluice serve` processes, persistent
//! pools with `sync = "never"`: sensor data kept for its retention, not
//! for power loss, as EdgeServe keeps it in memory).
//!
//! 1. `routing`: lazy vs eager working time with large frames and 0, 50
//!    and 90% of frames skipped by the target frequency (Fig. 7).
//! 2. `link`: the consumer's link to the broker limited in bandwidth (a
//!    pacing proxy in front of the broker; lazy fetches go to the edge
//!    node directly): eager degrades, lazy does not (Table 1).
//! 3. `publish`: producer-side latency of publishing vs size, lazy and
//!    eager (Fig. 4/5), and the break-even `auto` routing measures.
//!
//! The decentralized-ensemble experiment (Table 2) needs trained models
//! and a dataset: it is the runnable example `examples/streams/ensemble.py`.

use crate::harness::{hist, ChildNode};
use anyhow::{Context, Result};
use bytes::Bytes;
use serde_json::json;
use sluice_client::Client;
use sluice_streams::topic::{Fetcher, Keep, Producer, Routing, Subscriber};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args, Clone)]
pub struct StreamsBenchArgs {
    /// Frame size in MB for the routing and link experiments.
    #[arg(long, default_value_t = 4)]
    pub frame_mb: usize,
    /// Frames per run.
    #[arg(long, default_value_t = 40)]
    pub frames: u64,
    /// Broker link limits for the link experiment, MB/s (0: unlimited).
    #[arg(long, value_delimiter = ',', default_value = "0,400,100,25")]
    pub link_mbps: Vec<u64>,
    /// Publishes per size in the publish experiment.
    #[arg(long, default_value_t = 30)]
    pub reps: usize,
    /// Run only these experiments (routing, link, publish).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

fn start_node(config: &std::path::Path) -> Result<ChildNode> {
    ChildNode::start(&["--config", config.to_str().context("config path")?])
}

pub fn run(a: StreamsBenchArgs, json_out: bool) -> Result<()> {
    let cfg =
        std::env::temp_dir().join(format!("sluice-bench-streams-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[persistent]\nsync = \"never\"\n")?;
    let broker = start_node(&cfg)?;
    let edge = start_node(&cfg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let want = |x: &str| a.only.is_empty() || a.only.iter().any(|o| o == x);
    let mut report = serde_json::Map::new();
    rt.block_on(async {
        let b = Client::connect(&broker.addr).await?;
        if want("routing") {
            report.insert(
                "routing".into(),
                routing(&a, &b, &broker.addr, &edge.addr).await?,
            );
        }
        if want("link") {
            report.insert("link".into(), link(&a, &b, &broker.addr, &edge.addr).await?);
        }
        if want("publish") {
            report.insert("publish".into(), publish(&a, &b, &edge.addr).await?);
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let _ = std::fs::remove_file(&cfg);
    let report = serde_json::Value::Object(report);
    if json_out {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

fn frame(mb: usize, i: u64) -> Bytes {
    let mut v = vec![(i % 251) as u8; mb << 20];
    v[..8].copy_from_slice(&i.to_le_bytes());
    Bytes::from(v)
}

/// Publishes `frames` frames on a fresh topic; the producer's time (s).
async fn record(
    b: &Client,
    edge: &str,
    topic: &str,
    routing: Routing,
    a: &StreamsBenchArgs,
) -> Result<f64> {
    let mut p = Producer::new(b.clone(), edge, topic, "cam", routing, Keep::default()).await?;
    let frames: Vec<Bytes> = (0..a.frames).map(|i| frame(a.frame_mb, i)).collect();
    let start = Instant::now();
    for (i, f) in frames.into_iter().enumerate() {
        p.publish(Some(i as u64 + 1), f).await?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// The consumer's working time (s) to go through the recorded topic,
/// using one frame in `every` (the rest skipped by the target frequency:
/// their lazy payloads are never fetched), and the bytes it moved.
async fn consume(broker: &Client, topic: &str, frames: u64, every: u64) -> Result<(f64, u64)> {
    let start = Instant::now();
    let mut sub = Subscriber::new(broker, topic, Some(0)).await?;
    let mut f = Fetcher::default();
    for _ in 0..frames {
        let h = tokio::time::timeout(Duration::from_secs(60), sub.next())
            .await
            .context("a header within 60 s")?
            .context("the subscription ended")??;
        if h.seq % every == 0 {
            let p = f.fetch(&h).await?;
            anyhow::ensure!(
                p[..8] == h.seq.to_le_bytes(),
                "frame {} is not its own",
                h.seq
            );
        }
    }
    Ok((
        start.elapsed().as_secs_f64(),
        sub.received_bytes + f.fetched_bytes,
    ))
}

async fn routing(
    a: &StreamsBenchArgs,
    b: &Client,
    broker: &str,
    edge: &str,
) -> Result<serde_json::Value> {
    let mut rows = Vec::new();
    for (skip, every) in [(0, 1u64), (50, 2), (90, 10)] {
        let mut t = serde_json::Map::new();
        for (name, routing) in [("eager", Routing::Eager), ("lazy", Routing::Lazy)] {
            let topic = format!("fig7-{name}-{skip}");
            let produce = record(b, edge, &topic, routing, a).await?;
            let consumer = Client::connect(broker).await?;
            let (work, moved) = consume(&consumer, &topic, a.frames, every).await?;
            t.insert(
                name.into(),
                json!({"producer_s": produce, "consumer_s": work, "consumer_mb": moved as f64 / 1e6}),
            );
        }
        let ratio = t["eager"]["consumer_s"].as_f64().unwrap_or(0.0)
            / t["lazy"]["consumer_s"].as_f64().unwrap_or(1.0).max(1e-9);
        eprintln!(
            "routing: {skip}% skipped, {} x {} MB: consumer eager {:.3} s, lazy {:.3} s: lazy {ratio:.2}x less",
            a.frames, a.frame_mb, t["eager"]["consumer_s"], t["lazy"]["consumer_s"]
        );
        rows.push(json!({"skipped_pct": skip, "eager": t["eager"], "lazy": t["lazy"], "eager_over_lazy": ratio}));
    }
    Ok(json!({"frames": a.frames, "frame_mb": a.frame_mb, "rows": rows}))
}

/// A TCP proxy to `target` whose every byte (both ways, all connections
/// together) is paced to `mbps` MB/s, like one network link.
async fn paced_proxy(target: String, mbps: u64) -> Result<String> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?.to_string();
    let next_free = Arc::new(parking_lot::Mutex::new(Instant::now()));
    tokio::spawn(async move {
        while let Ok((inbound, _)) = l.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
                continue;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            tokio::spawn(pace(ri, wo, mbps, next_free.clone()));
            tokio::spawn(pace(ro, wi, mbps, next_free.clone()));
        }
    });
    Ok(addr)
}

async fn pace(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mbps: u64,
    next_free: Arc<parking_lot::Mutex<Instant>>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let send_at = {
            let mut g = next_free.lock();
            let start = (*g).max(Instant::now());
            *g = start + Duration::from_secs_f64(n as f64 / (mbps as f64 * 1e6));
            *g
        };
        // Timers tick in milliseconds: a link runs ahead by at most one,
        // so its average rate is the one asked for.
        if send_at > Instant::now() + Duration::from_millis(1) {
            tokio::time::sleep_until((send_at - Duration::from_millis(1)).into()).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn link(
    a: &StreamsBenchArgs,
    b: &Client,
    broker: &str,
    edge: &str,
) -> Result<serde_json::Value> {
    // Every frame used: what lazy saves here is only the broker link.
    let frames = a.frames.min(20);
    let mut topics = Vec::new();
    for (name, routing) in [("eager", Routing::Eager), ("lazy", Routing::Lazy)] {
        let topic = format!("table1-{name}");
        record(
            b,
            edge,
            &topic,
            routing,
            &StreamsBenchArgs {
                frames,
                ..a.clone()
            },
        )
        .await?;
        topics.push((name, topic));
    }
    let mut rows = Vec::new();
    for &mbps in &a.link_mbps {
        let via = if mbps == 0 {
            broker.to_string()
        } else {
            paced_proxy(broker.to_string(), mbps).await?
        };
        let c = Client::connect(&via).await?;
        let mut r = json!({"link_mbps": mbps});
        for (name, topic) in &topics {
            let (work, _) = consume(&c, topic, frames, 1).await?;
            r[*name] = json!({"consumer_s": work, "frames_per_s": frames as f64 / work});
        }
        eprintln!(
            "link: broker link {}: eager {:.1} frames/s, lazy {:.1} frames/s",
            if mbps == 0 {
                "unlimited".to_string()
            } else {
                format!("{mbps} MB/s")
            },
            r["eager"]["frames_per_s"],
            r["lazy"]["frames_per_s"]
        );
        rows.push(r);
    }
    Ok(json!({"frames": frames, "frame_mb": a.frame_mb, "rows": rows}))
}

async fn publish(a: &StreamsBenchArgs, b: &Client, edge: &str) -> Result<serde_json::Value> {
    let sizes: [u64; 7] = [
        256,
        4 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        4 << 20,
        16 << 20,
    ];
    let mut rows = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let mut r = json!({"bytes": size});
        for (name, routing) in [("eager", Routing::Eager), ("lazy", Routing::Lazy)] {
            let topic = format!("fig4-{i}-{name}");
            let mut p = Producer::new(
                b.clone(),
                edge,
                &topic,
                "s",
                routing,
                Keep {
                    for_s: 60,
                    bytes: Some(64 << 20),
                },
            )
            .await?;
            let payload = Bytes::from(vec![7u8; size as usize]);
            let mut h = hist();
            for _ in 0..a.reps {
                let t = Instant::now();
                p.publish(None, payload.clone()).await?;
                h.record(t.elapsed().as_micros() as u64)?;
            }
            r[name] =
                json!({"p50_us": h.value_at_quantile(0.5), "p99_us": h.value_at_quantile(0.99)});
        }
        eprintln!(
            "publish: {:>9} B: eager p50 {} µs, lazy p50 {} µs",
            size, r["eager"]["p50_us"], r["lazy"]["p50_us"]
        );
        rows.push(r);
    }
    let mut p = Producer::new(
        b.clone(),
        edge,
        "fig4-auto",
        "s",
        Routing::Lazy,
        Keep::default(),
    )
    .await?;
    let be = p
        .calibrate(
            &[1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20],
            7,
        )
        .await?;
    eprintln!(
        "publish: measured lazy/eager break-even (publish + read + fetch of a used item): {}",
        be.bytes
            .map_or("none (eager faster at every size)".into(), |b| format!(
                "{b} bytes"
            ))
    );
    // Where the producer alone stops paying for lazy's second put.
    let producer_side = rows
        .iter()
        .find(|r| r["lazy"]["p50_us"].as_u64() <= r["eager"]["p50_us"].as_u64())
        .map(|r| r["bytes"].clone());
    eprintln!("publish: producer-side break-even (lazy p50 <= eager p50): {producer_side:?}");
    Ok(json!({"rows": rows, "break_even": be, "producer_break_even_bytes": producer_side}))
}
