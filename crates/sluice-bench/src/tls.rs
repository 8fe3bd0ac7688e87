//! `sluice bench tls`: the cost of TLS, next to plaintext in the same run.
//! Two node processes (one with `[tls]` from a development CA, one
//! without), measured in turns, round after round, so the machine's drift
//! hits both: put and get of one size, one client closed loop (p50, p99)
//! and N clients (throughput).

use crate::harness::{closed_loop, fmt_size, report, row, ChildNode, Row};
use crate::peers::{sluice_ops, SluiceOp};
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
    /// Rounds (each measures both nodes, in turns).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
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

/// One node, one round: p50 with one client and throughput with many,
/// for put and get.
fn measure(
    target: &str,
    addr: &str,
    tls: Option<&sluice_tls::ClientTls>,
    a: &TlsArgs,
) -> Result<Vec<Row>> {
    let dur = Duration::from_millis(a.duration_ms);
    let mut rows = Vec::new();
    for op in ["put", "get"] {
        let rt1 = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let w = rt1.block_on(clients(addr, tls, op, a.size, 1))?;
        let label = format!("{target} {op} {} c=1", fmt_size(a.size));
        let r = rt1.block_on(closed_loop(w, dur, label));
        rows.push(row(target, op, a.size, "closed", 1, (&r.0, r.1, r.2)));
        drop(rt1);
        let rtn = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let w = rtn.block_on(clients(addr, tls, op, a.size, a.clients))?;
        let label = format!("{target} {op} {} c={}", fmt_size(a.size), a.clients);
        let r = rtn.block_on(closed_loop(w, dur, label));
        rows.push(row(
            target,
            op,
            a.size,
            "closed",
            a.clients,
            (&r.0, r.1, r.2),
        ));
    }
    Ok(rows)
}

pub fn run(a: TlsArgs, json: bool) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("sluice-bench-tls-")
        .tempdir()?;
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
    eprintln!(
        "sluice bench tls: TLS node {}, plaintext node {}, {} rounds of {} ms phases",
        secure.addr, plain.addr, a.rounds, a.duration_ms
    );
    let mut rows = Vec::new();
    for _ in 0..a.rounds.max(1) {
        rows.extend(measure("plaintext", &plain.addr, None, &a)?);
        rows.extend(measure("tls", &secure.addr, Some(&tls), &a)?);
    }
    report(&rows, json, None)?;
    if !json {
        summary(&rows, a.clients);
    }
    Ok(())
}

/// Medians over the rounds, and TLS against plaintext.
fn summary(rows: &[Row], clients: usize) {
    let median = |target: &str, op: &str, c: usize, f: fn(&Row) -> f64| {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|r| r.target == target && r.op == op && r.clients == c)
            .map(f)
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    for op in ["put", "get"] {
        let p50 = |t| median(t, op, 1, |r| r.p50_us);
        let tput = |t| median(t, op, clients, |r| r.ops_per_s);
        println!(
            "{op}: p50 TLS {:.1} µs / plaintext {:.1} µs = {:.2}x (target <= 1.2x); {clients} clients TLS {:.0} / plaintext {:.0} ops/s = {:.2}x (target >= 0.8x)",
            p50("tls"),
            p50("plaintext"),
            p50("tls") / p50("plaintext"),
            tput("tls"),
            tput("plaintext"),
            tput("tls") / tput("plaintext"),
        );
    }
}
