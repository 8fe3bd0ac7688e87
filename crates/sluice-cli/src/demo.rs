//! `sluice demo`: starts an embedded node and runs a short workload that
//! shows the object model: versions, conditional puts, triggers and watches,
//! and a small latency sample.

use anyhow::Result;
use sluice_client::{Client, PoolSpec, PoolType, SluiceError, VERSION_NONE};
use sluice_server::{Server, ServerConfig};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Objects streamed through the watch stage.
    #[arg(long, default_value_t = 2000)]
    objects: u64,
}

pub fn run(a: DemoArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(demo(a))
}

async fn demo(a: DemoArgs) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("sluice-demo-{}", std::process::id()));
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
    println!("== embedded node on {addr} (pools /vol volatile, /trig trigger)");
    let c = Client::connect(&addr).await?;

    println!("== versions");
    let v1 = c.put("/vol/sensor/1", "21.5C").await?;
    let v2 = c.put("/vol/sensor/1", "21.7C").await?;
    let o = c.get("/vol/sensor/1").await?;
    println!(
        "put twice -> versions {} and {}; get returns {:?} (version {}, previous_version_by_key {})",
        v1.version,
        v2.version,
        String::from_utf8_lossy(&o.value),
        o.meta.version,
        o.meta.previous_version_by_key
    );

    println!("== optimistic concurrency");
    match c
        .put_if_version("/vol/sensor/1", "stale writer", v1.version)
        .await
    {
        Err(e @ SluiceError::VersionConflict { .. }) => {
            println!("conditional put on an old version is rejected: {e}")
        }
        other => anyhow::bail!("expected a version conflict, got {other:?}"),
    }
    c.put_if_version("/vol/sensor/2", "created once", VERSION_NONE)
        .await?;
    println!("put-if-absent created /vol/sensor/2");

    println!("== a two-stage stream: trigger puts -> watcher stage -> volatile results");
    c.create_pool(PoolSpec {
        pathname: "/results".into(),
        pool_type: Some(PoolType::Volatile),
        ..Default::default()
    })
    .await?;
    let mut frames = c.watch("/trig/frames").await?;
    let stage_client = c.clone();
    let n = a.objects;
    let stage = tokio::spawn(async move {
        let mut lat = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let Some(note) = frames.next().await else {
                break;
            };
            let sent_us: u64 = String::from_utf8_lossy(&note.object.value)
                .parse()
                .unwrap_or(0);
            let now_us = sluice_store::Clock::wall_us();
            lat.push(now_us.saturating_sub(sent_us));
            // The "model": count the digits of the payload.
            let out = format!("{} digits", note.object.value.len());
            let key = note.object.key.replacen("/trig/frames", "/results", 1);
            if stage_client.put(&key, out).await.is_err() {
                break;
            }
        }
        lat
    });
    let t0 = Instant::now();
    for i in 0..n {
        c.trigger_put(
            &format!("/trig/frames/{i:05}"),
            sluice_store::Clock::wall_us().to_string(),
        )
        .await?;
    }
    let mut lat = tokio::time::timeout(Duration::from_secs(30), stage).await??;
    let elapsed = t0.elapsed();
    lat.sort_unstable();
    let pct = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0)
    };
    let stored = c.list_keys("/results", None).await?.len();
    println!(
        "{n} frames through the stage in {:.0} ms ({:.0}/s); trigger->stage latency p50 {} µs, p99 {} µs; {stored} results stored",
        elapsed.as_secs_f64() * 1000.0,
        n as f64 / elapsed.as_secs_f64(),
        pct(0.5),
        pct(0.99)
    );
    if stored as u64 != n {
        anyhow::bail!("expected {n} results, found {stored}");
    }
    let st = c.stats().await?;
    println!("== node counters: {}", st["store"]);
    let _ = stop_tx.send(());
    let _ = node.await;
    let _ = std::fs::remove_dir_all(dir);
    println!("demo finished");
    Ok(())
}
