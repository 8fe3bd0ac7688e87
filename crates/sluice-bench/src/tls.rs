//! `sluice bench tls`: the cost of TLS, next to plaintext in the same run.
//! Two node processes (one with `[tls]` from a development CA, one
//! without); every phase runs on the plaintext node and right after on
//! the TLS node, round after round, and the summary is the median of the
//! pairs' ratios, so the machine's drift hits both sides of each ratio:
//! put and get of one size, one client closed loop (p50, p99) and N
//! clients (throughput). `--replicated`: two 3-node clusters instead,
//! the TLS one with mutual TLS among its nodes (the consensus traffic)
//! and for its clients.

use crate::cluster::wait_leader;
use crate::harness::{closed_loop, fmt_size, report, row, ChildNode, Row};
use crate::peers::{sluice_ops, SluiceOp};
use crate::procs::{connect_with, Procs};
use anyhow::Result;
use sluice_client::ClientConfig;
use std::time::Duration;

#[derive(clap::Args, Clone)]
pub struct TlsArgs {
    /// Value size in bytes.
    #[arg(long, default_value_t = 10240)]
    pub size: usize,
    /// Concurrent clients (one connection each) in the throughput phase.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Length of each measurement phase.
    #[arg(long, default_value_t = 1500)]
    pub duration_ms: u64,
    /// Rounds (each measures every phase on both nodes, back to back).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Two 3-node clusters instead of two nodes: one plaintext, one with
    /// mutual TLS among its nodes and for its clients; a put then crosses
    /// three TLS links (client to leader, leader to each follower).
    #[arg(long)]
    pub replicated: bool,
    /// Tokio worker threads per node of the `--replicated` clusters (six
    /// processes share this machine's cores).
    #[arg(long, default_value_t = 1)]
    pub node_threads: usize,
}

async fn clients(
    addr: &str,
    tls: Option<&sluice_tls::ClientTls>,
    op: &'static str,
    size: usize,
    n: usize,
) -> Result<Vec<SluiceOp>> {
    let cfg = ClientConfig {
        addr: addr.to_string(),
        client_name: "bench-tls".into(),
        tls: tls.cloned(),
        ..Default::default()
    };
    sluice_ops(&cfg, op, size, n).await
}

/// One phase on one node: `n` clients (one connection each) closed loop.
fn phase(
    target: &str,
    addr: &str,
    tls: Option<&sluice_tls::ClientTls>,
    op: &'static str,
    n: usize,
    a: &TlsArgs,
) -> Result<Row> {
    let rt = if n == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
    };
    let w = rt.block_on(clients(addr, tls, op, a.size, n))?;
    let label = format!("{target} {op} {} c={n}", fmt_size(a.size));
    let r = rt.block_on(closed_loop(w, Duration::from_millis(a.duration_ms), label));
    Ok(row(target, op, a.size, "closed", n, (&r.0, r.1, r.2)))
}

/// One round: each phase (put and get; one client, then many) on the
/// plaintext node and right after on the TLS node, so the two figures
/// of a pair see the same machine.
fn round(plain: &str, secure: &str, tls: &sluice_tls::ClientTls, a: &TlsArgs) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for op in ["put", "get"] {
        for n in [1, a.clients] {
            rows.push(phase("plaintext", plain, None, op, n, a)?);
            rows.push(phase("tls", secure, Some(tls), op, n, a)?);
        }
    }
    Ok(rows)
}

pub fn run(a: TlsArgs, json: bool) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("sluice-bench-tls-")
        .tempdir()?;
    // The nodes (kept until the end) and what clients connect with.
    let (_nodes, plain, secure, tls): (Box<dyn std::any::Any>, String, String, _) = if a.replicated
    {
        let pki = sluice_tls::make_dev_pki(dir.path(), 3, sluice_tls::Validity::default())?;
        let plain = Procs::start_custom(3, a.node_threads, None, &[0, 1, 2], "")?;
        let secure = Procs::start_tls(3, a.node_threads, &pki)?;
        let tls = sluice_tls::ClientTls::new(&pki.ca, Some((&pki.client_cert, &pki.client_key)))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            for (addr, t) in [(&plain.addrs[0], None), (&secure.addrs[0], Some(&tls))] {
                let c = connect_with(addr, Duration::from_secs(10), t).await?;
                wait_leader(&c).await?;
            }
            anyhow::Ok(())
        })?;
        let (p, s) = (plain.addrs[0].clone(), secure.addrs[0].clone());
        (Box::new((plain, secure)), p, s, tls)
    } else {
        let pki = sluice_tls::make_dev_pki(dir.path(), 1, sluice_tls::Validity::default())?;
        let cfg = dir.path().join("tls.toml");
        std::fs::write(
            &cfg,
            format!(
                "[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
                pki.nodes[0].0.display(),
                pki.nodes[0].1.display()
            ),
        )?;
        let secure = ChildNode::start(&["--config", cfg.to_str().unwrap_or_default()])?;
        let plain = ChildNode::start(&[])?;
        let tls = sluice_tls::ClientTls::new(&pki.ca, None)?;
        let (p, s) = (plain.addr.clone(), secure.addr.clone());
        (Box::new((plain, secure)), p, s, tls)
    };
    eprintln!(
        "sluice bench tls: {} {secure}, plaintext {plain}, {} rounds of {} ms phases",
        if a.replicated {
            "3-node clusters (a volatile shard on all three): mutual TLS"
        } else {
            "TLS node"
        },
        a.rounds,
        a.duration_ms
    );
    let mut rows = Vec::new();
    for _ in 0..a.rounds.max(1) {
        rows.extend(round(&plain, &secure, &tls, &a)?);
    }
    report(&rows, json, None)?;
    if !json {
        summary(&rows, a.clients);
        // A replicated put's value crosses three links, each sealing and
        // opening it once; a get is served by the node asked.
        let links = |op: &str| {
            if a.replicated && op == "put" {
                3.0
            } else {
                1.0
            }
        };
        crypto_bound(&rows, a.size, a.clients, links)?;
    }
    Ok(())
}

/// AES-128-GCM (what Sluice's TLS prefers, `sluice-tls`) sealing on
/// one core of this machine, bytes/s: the cipher's own cost, measured in
/// the same run (ring, as rustls uses it).
fn aes_gcm_bytes_per_s(size: usize) -> Result<f64> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
    let key = LessSafeKey::new(
        UnboundKey::new(&AES_128_GCM, &[7u8; 16]).map_err(|_| anyhow::anyhow!("AES key"))?,
    );
    let mut buf = vec![0u8; size];
    let t0 = std::time::Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_millis(300) {
        let nonce = Nonce::assume_unique_for_key([(n % 251) as u8; 12]);
        let tag = key
            .seal_in_place_separate_tag(nonce, Aad::empty(), &mut buf)
            .map_err(|_| anyhow::anyhow!("AES seal"))?;
        let _ = std::hint::black_box(tag);
        n += 1;
    }
    Ok(n as f64 * size as f64 / t0.elapsed().as_secs_f64())
}

/// What TLS must cost in throughput when the clients and the node share
/// this machine's cores: each op's value is encrypted once and decrypted
/// once (open costs what seal does), on top of the CPU a plaintext op
/// takes (all cores over plaintext ops/s, the cores being saturated).
fn crypto_bound(
    rows: &[Row],
    size: usize,
    clients: usize,
    links: impl Fn(&str) -> f64,
) -> Result<()> {
    let rate = aes_gcm_bytes_per_s(size)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let crypto_s = 2.0 * size as f64 / rate;
    println!(
        "AES-128-GCM on this machine: {:.2} GB/s per core, {:.2} µs of crypto per {} op (sealed and opened once)",
        rate / 1e9,
        crypto_s * 1e6,
        fmt_size(size)
    );
    for op in ["put", "get"] {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|r| r.target == "plaintext" && r.op == op && r.clients == clients)
            .map(|r| r.ops_per_s)
            .collect();
        v.sort_by(f64::total_cmp);
        let Some(plain) = v.get(v.len() / 2).copied() else {
            continue;
        };
        let cpu_per_op = cores / plain;
        let crypto = crypto_s * links(op);
        println!(
            "{op}: with {cores} cores saturated by plaintext at {plain:.0} ops/s ({:.1} µs of CPU per op), TLS ({} link(s) per op) can reach at most {:.2}x of it here",
            cpu_per_op * 1e6,
            links(op),
            cpu_per_op / (cpu_per_op + crypto)
        );
    }
    Ok(())
}

/// Medians over the rounds, and TLS against plaintext: the median of
/// each round's ratio (a pair measured back to back), which drift
/// between rounds does not move as it moves the ratio of two medians.
fn summary(rows: &[Row], clients: usize) {
    let pick = |target: &str, op: &str, c: usize, f: fn(&Row) -> f64| -> Vec<f64> {
        rows.iter()
            .filter(|r| r.target == target && r.op == op && r.clients == c)
            .map(f)
            .collect()
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let ratios = |op: &str, c: usize, f: fn(&Row) -> f64| -> Vec<f64> {
        let (t, p) = (pick("tls", op, c, f), pick("plaintext", op, c, f));
        t.iter().zip(&p).map(|(t, p)| t / p).collect()
    };
    for op in ["put", "get"] {
        let p50 = |t| median(pick(t, op, 1, |r| r.p50_us));
        let tput = |t| median(pick(t, op, clients, |r| r.ops_per_s));
        let each = ratios(op, clients, |r| r.ops_per_s);
        println!(
            "{op}: p50 TLS {:.1} µs / plaintext {:.1} µs, median of the rounds' ratios {:.2}x (target <= 1.2x); {clients} clients TLS {:.0} / plaintext {:.0} ops/s, median of the rounds' ratios {:.2}x (target >= 0.8x; rounds: {})",
            p50("tls"),
            p50("plaintext"),
            median(ratios(op, 1, |r| r.p50_us)),
            tput("tls"),
            tput("plaintext"),
            median(each.clone()),
            each.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
        );
    }
}
