//! `sluice top`: a live view of nodes from their Prometheus endpoints
//! (`serve --metrics`): operations per second with p50/p99, the busiest
//! pools and lambdas, bytes, connections, and each Raft group's role,
//! term and lag; refreshed in place on a terminal.
//!
//! `scrape` reads an endpoint, `view` computes what is shown from two
//! scrapes, and `render` (here) is the one place that writes it.

mod scrape;
mod view;

use anyhow::{bail, Result};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use view::{NodeView, Rate};

#[derive(clap::Args)]
pub struct TopArgs {
    /// The nodes' metrics addresses (host:port, comma-separated): what
    /// each was started with as `--metrics` (or `[metrics] listen`).
    /// Default: those of the nodes `sluice dev --metrics-base` runs from
    /// this directory.
    #[arg(long, value_delimiter = ',', value_name = "ADDR")]
    metrics: Vec<String>,
    /// Refresh every this many milliseconds (the rates cover that interval).
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Print one view (over one interval) and exit.
    #[arg(long)]
    once: bool,
}

/// The metrics addresses `sluice dev --metrics-base` left in this
/// directory, if it runs here.
fn dev_metrics() -> Option<Vec<String>> {
    let text = std::fs::read_to_string(crate::DEV_METRICS).ok()?;
    let addrs: Vec<String> = text.split_whitespace().map(str::to_string).collect();
    (!addrs.is_empty()).then_some(addrs)
}

/// How long one scrape may take: the refresh interval, within these (a
/// node answers in milliseconds; one that does not is shown as silent
/// without holding the view back much longer than a refresh).
const SCRAPE_TIMEOUT_MIN: Duration = Duration::from_secs(1);
const SCRAPE_TIMEOUT_MAX: Duration = Duration::from_secs(3);

pub fn run(mut a: TopArgs, json: bool) -> Result<()> {
    if a.interval_ms == 0 {
        bail!("--interval-ms must be at least 1");
    }
    if a.metrics.is_empty() {
        a.metrics = dev_metrics().ok_or_else(|| {
            anyhow::anyhow!(
                "no --metrics: give the nodes' metrics addresses (each node's `serve --metrics ADDR` or `[metrics] listen`); from the directory where `sluice dev --metrics-base PORT` runs, top finds them by itself"
            )
        })?;
    }
    let interval = Duration::from_millis(a.interval_ms);
    let timeout = interval.clamp(SCRAPE_TIMEOUT_MIN, SCRAPE_TIMEOUT_MAX);
    let in_place = !a.once && !json && std::io::stdout().is_terminal();
    let mut last = scrape_all(&a.metrics, timeout);
    let mut at = Instant::now();
    loop {
        std::thread::sleep(interval.saturating_sub(at.elapsed()));
        let now = scrape_all(&a.metrics, timeout);
        let secs = at.elapsed().as_secs_f64();
        at = Instant::now();
        let views: Vec<Result<NodeView, String>> = a
            .metrics
            .iter()
            .zip(last.iter().zip(now.iter()))
            .map(|(addr, (b, n))| match (b, n) {
                (Ok(b), Ok(n)) => Ok(view::node_view(addr, b, n, secs)),
                (_, Err(e)) | (Err(e), _) => Err(format!("{addr}: {e}")),
            })
            .collect();
        if a.once && views.iter().all(|v| v.is_err()) {
            if let Some(e) = views.iter().find_map(|v| v.as_ref().err()) {
                bail!("{e}");
            }
        }
        let out = if json {
            json_of(&views) + "\n"
        } else {
            render(&views, a.interval_ms)
        };
        let mut stdout = std::io::stdout().lock();
        if in_place {
            // Home and clear: the view replaces the last one.
            write!(stdout, "\x1b[H\x1b[2J")?;
        }
        stdout.write_all(out.as_bytes())?;
        stdout.flush()?;
        if a.once {
            return Ok(());
        }
        last = now;
    }
}

/// Every node's scrape, side by side: a node that does not answer costs
/// the view one timeout, not one per node behind it.
fn scrape_all(addrs: &[String], timeout: Duration) -> Vec<Result<Vec<scrape::Sample>, String>> {
    std::thread::scope(|s| {
        let each: Vec<_> = addrs
            .iter()
            .map(|a| {
                s.spawn(move || {
                    scrape::fetch(a, timeout)
                        .map(|t| scrape::parse(&t))
                        .map_err(|e| format!("{e:#}"))
                })
            })
            .collect();
        each.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("the scrape panicked".to_string()))
            })
            .collect()
    })
}

fn json_of(views: &[Result<NodeView, String>]) -> String {
    let v: Vec<serde_json::Value> = views
        .iter()
        .map(|v| match v {
            Ok(v) => serde_json::to_value(v).unwrap_or_default(),
            Err(e) => serde_json::json!({ "error": e }),
        })
        .collect();
    serde_json::Value::Array(v).to_string()
}

fn us(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x >= 10_000.0 => format!("{:.1}ms", x / 1000.0),
        Some(x) => format!("{x:.0}µs"),
    }
}

fn bytes_per_s(b: f64) -> String {
    match b {
        b if b >= 1e9 => format!("{:.1} GB/s", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB/s", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kB/s", b / 1e3),
        b => format!("{b:.0} B/s"),
    }
}

/// A node's memory in use, of its limit where it has one, and the
/// writes it refuses for it.
fn memory(v: &NodeView) -> String {
    let mib = |b: u64| format!("{:.0} MiB", b as f64 / f64::from(1 << 20));
    let mut m = mib(v.memory_bytes);
    if v.memory_limit > 0 {
        m = format!("{m} of {}", mib(v.memory_limit));
    }
    if v.memory_refused_per_s > 0.0 {
        m = format!("{m} (refusing {:.0} writes/s)", v.memory_refused_per_s);
    }
    m
}

fn rate_rows(out: &mut String, title: &str, rows: &[Rate]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  {title:<36} {:>10} {:>9} {:>9} {:>12}",
        "/s", "p50", "p99", "total"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "  {:<36} {:>10.1} {:>9} {:>9} {:>12}",
            r.name,
            r.per_s,
            us(r.p50_us),
            us(r.p99_us),
            r.total
        );
    }
}

/// The text view: one block per node.
fn render(views: &[Result<NodeView, String>], interval_ms: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "sluice top: {} node(s), rates over {interval_ms} ms (Ctrl-C quits)",
        views.len()
    );
    for v in views {
        let _ = writeln!(out);
        let v = match v {
            Ok(v) => v,
            Err(e) => {
                let _ = writeln!(out, "{e}");
                continue;
            }
        };
        let _ = writeln!(
            out,
            "{}  connections {}  in {}  out {}  memory {}",
            v.addr,
            v.connections,
            bytes_per_s(v.received_bytes_per_s),
            bytes_per_s(v.sent_bytes_per_s),
            memory(v)
        );
        let busy: Vec<Rate> = v.ops.iter().filter(|r| r.per_s > 0.0).cloned().collect();
        if busy.is_empty() {
            let _ = writeln!(out, "  (no requests in the interval)");
        }
        rate_rows(&mut out, "operation", &busy);
        rate_rows(&mut out, "pool", &v.pools);
        rate_rows(&mut out, "lambda (vertex udl)", &v.lambdas);
        if !v.groups.is_empty() {
            let _ = writeln!(
                out,
                "  {:<36} {:>22} {:>6} {:>10} {:>13} {:>5}",
                "raft group", "role", "term", "apply lag", "follower lag", "down"
            );
            for g in &v.groups {
                let _ = writeln!(
                    out,
                    "  {:<36} {:>22} {:>6} {:>10} {:>13} {:>5}",
                    g.group, g.role, g.term, g.apply_lag, g.max_follower_lag, g.members_down
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_shown_with_its_limit_and_refusals() {
        let mut v = NodeView {
            memory_bytes: 50 << 20,
            ..NodeView::default()
        };
        assert_eq!(memory(&v), "50 MiB");
        v.memory_limit = 100 << 20;
        v.memory_refused_per_s = 12.0;
        assert_eq!(memory(&v), "50 MiB of 100 MiB (refusing 12 writes/s)");
    }

    /// Two nodes that never answer cost one timeout, not two (scraped one
    /// after the other, each paused node added its timeout to every
    /// refresh: 6 s for `top --once` with one node stopped).
    #[test]
    fn silent_nodes_are_waited_for_side_by_side() {
        let silent: Vec<std::net::TcpListener> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs: Vec<String> = silent
            .iter()
            .map(|l| l.local_addr().unwrap().to_string())
            .collect();
        let t0 = Instant::now();
        let got = scrape_all(&addrs, Duration::from_millis(800));
        let took = t0.elapsed();
        assert!(
            got.iter()
                .all(|r| r.as_ref().is_err_and(|e| e.contains("no answer"))),
            "{got:?}"
        );
        assert!(took < Duration::from_millis(1500), "{took:?}");
    }
}
