//! `sluice bench broadcast` (issue #21): one object sent from node 0 to
//! N receivers (real node processes), every node's outgoing link limited to
//! the same bandwidth (`[cluster] broadcast_egress_mbps`, shared by all
//! the chunks a node sends, as a network interface is): a pipelined chain
//! (fanout 1), a binary tree (fanout 2), and the one-to-each baseline
//! (fanout N: node 0 sends the whole object to every receiver itself),
//! next to a single transfer (N = 1) in the same run.

use crate::procs::{connect, Procs};
use anyhow::{Context, Result};
use serde_json::json;
use std::time::Duration;

#[derive(clap::Args)]
pub struct BroadcastBenchArgs {
    /// Object size in MB (at most the nodes' value limit, 64 MB by default).
    #[arg(long, default_value_t = 64)]
    pub mb: usize,
    /// Receivers: 1 (a single transfer) up to this many.
    #[arg(long, default_value_t = 8)]
    pub max_nodes: u32,
    /// Every node's outgoing bandwidth for broadcast chunks, MB/s.
    #[arg(long, default_value_t = 200)]
    pub mbps: u64,
    #[arg(long, default_value_t = 1024)]
    pub chunk_kb: usize,
}

pub fn run(a: BroadcastBenchArgs, json_out: bool) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let n = a.max_nodes + 1;
    eprintln!(
        "broadcast: {} node processes, {} MB object on node 0, every node sending at {} MB/s",
        n, a.mb, a.mbps
    );
    let procs = Procs::start_custom(
        n,
        1,
        None,
        &[0],
        &format!("broadcast_egress_mbps = {}", a.mbps),
    )?;
    let addr = procs.addrs[0].clone();
    rt.block_on(async move {
        let c = connect(&addr, Duration::from_secs(600)).await?;
        let value: Vec<u8> = (0..a.mb << 20).map(|i| ((i * 2654435761usize) >> 13) as u8).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match c.put("/vol/model", value.clone()).await {
                Ok(_) => break,
                Err(
                    e @ (sluice_client::SluiceError::Unavailable { .. }
                    | sluice_client::SluiceError::NotLeader { .. }
                    | sluice_client::SluiceError::Connection { .. }),
                ) if std::time::Instant::now() < deadline => {
                    eprintln!("waiting for the cluster: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e).context("putting the object"),
            }
        }
        let mut rows = Vec::new();
        let single = time(&c, &[1], 1, a.chunk_kb).await?;
        eprintln!("single transfer to 1 node: {single:.0} ms");
        for k in 2..=a.max_nodes {
            let to: Vec<u32> = (1..=k).collect();
            let chain = time(&c, &to, 1, a.chunk_kb).await?;
            let tree = time(&c, &to, 2, a.chunk_kb).await?;
            let each = time(&c, &to, k as usize, a.chunk_kb).await?;
            eprintln!(
                "N={k}: chain {chain:.0} ms ({:.2}x single), tree {tree:.0} ms ({:.2}x), one-to-each {each:.0} ms ({:.2}x); one-to-each / chain {:.2}",
                chain / single,
                tree / single,
                each / single,
                each / chain
            );
            rows.push(json!({"n": k, "chain_ms": chain, "tree_ms": tree, "one_to_each_ms": each,
                "chain_vs_single": chain / single, "one_to_each_vs_chain": each / chain}));
        }
        let report = json!({"mb": a.mb, "mbps": a.mbps, "chunk_kb": a.chunk_kb,
            "single_ms": single, "rows": rows});
        if json_out {
            println!("{report}");
        } else {
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Ok::<_, anyhow::Error>(())
    })?;
    drop(procs);
    Ok(())
}

/// One broadcast's time in ms (the sending node's own measure), failing
/// when a receiver did not get the object.
async fn time(
    c: &sluice_client::Client,
    to: &[u32],
    fanout: usize,
    chunk_kb: usize,
) -> Result<f64> {
    let r = c
        .cluster_command(
            json!({"op": "broadcast", "key": "/vol/model", "to": to, "fanout": fanout, "chunk_kb": chunk_kb}),
            Some(0),
        )
        .await?;
    anyhow::ensure!(
        r["ok"].as_u64() == Some(to.len() as u64),
        "not every receiver got the object: {r}"
    );
    Ok(r["elapsed_ms"].as_f64().unwrap_or(0.0))
}
