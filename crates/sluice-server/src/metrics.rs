//! The node's Prometheus endpoint (`[metrics] listen`, `serve --metrics`):
//! the `metrics` facade with `metrics-exporter-prometheus` serving
//! `GET /metrics` on its own listener.
//!
//! Two kinds of series:
//! - recorded where things happen: each request's latency and count by
//!   operation and pool (`sluice_request_duration_seconds`), bytes in and
//!   out, and each UDL's calls, failures, drops and latency (recorded by
//!   the engine, `sluice_udl_*`);
//! - mirrored once a second from counters the node keeps anyway
//!   (connections, watches, store operations, shards, and each Raft
//!   group's role, term, log and applied positions and follower lag), so
//!   the data path pays nothing more for them.
//!
//! Off by default, and then free: every recording site first checks one
//! static (`handles()`), and handles registered before a recorder exists
//! are no-ops (which is why `install` runs before a node builds graphs).

use crate::conn::ConnCtx;
use metrics::{counter, gauge, histogram, Counter};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// Latency buckets, seconds: 10 µs to 10 s (the data path lives in the
/// tens of µs, consensus and large values in ms).
const BUCKETS_S: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How often the mirrored series are refreshed.
const MIRROR_EVERY: Duration = Duration::from_secs(1);

/// Series recorded on the data path, registered once.
pub struct Handles {
    received_bytes: Counter,
    sent_bytes: Counter,
}

/// Where this process's endpoint listens, once installed.
static INSTALLED: OnceLock<(SocketAddr, Handles)> = OnceLock::new();

/// The data path's handles, when this process exports metrics.
#[inline]
pub fn handles() -> Option<&'static Handles> {
    INSTALLED.get().map(|(_, h)| h)
}

/// Starts the endpoint on `addr` (inside a tokio runtime). One per
/// process: a second node in the same process asking for another
/// address gets an error saying so; asking for the same one is fine.
pub fn install(addr: SocketAddr) -> Result<(), String> {
    if let Some((at, _)) = INSTALLED.get() {
        return if *at == addr {
            Ok(())
        } else {
            Err(format!(
                "metrics.listen = {addr}: this process already exports metrics on {at} (one endpoint per process)"
            ))
        };
    }
    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS_S)
        .map_err(|e| format!("metrics: {e}"))?
        .build()
        .map_err(|e| format!("metrics.listen = {addr}: {e}"))?;
    metrics::set_global_recorder(recorder).map_err(|e| format!("metrics.listen = {addr}: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = exporter.await {
            tracing::error!(error = ?e, "the metrics endpoint stopped");
        }
    });
    describe();
    let handles = Handles {
        received_bytes: counter!("sluice_received_bytes_total"),
        sent_bytes: counter!("sluice_sent_bytes_total"),
    };
    let _ = INSTALLED.set((addr, handles));
    tracing::info!(%addr, "metrics endpoint: GET /metrics");
    Ok(())
}

/// The HELP lines (units in the names, as Prometheus names them).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        "sluice_request_duration_seconds",
        "Requests by operation and by the pool of their key: time on this node from decoding to the reply"
    );
    describe_counter!(
        "sluice_policy_refusals_total",
        "Requests refused by a policy, by kind (permission_denied, rate_limited, unauthenticated), operation and principal"
    );
    describe_counter!(
        "sluice_rate_limit_delays_total",
        "Requests a rate limit held back (then ran)"
    );
    describe_histogram!(
        "sluice_rate_limit_delay_seconds",
        "How long a rate limit held a request back"
    );
    describe_counter!(
        "sluice_received_bytes_total",
        "Bytes read from clients and peers"
    );
    describe_counter!(
        "sluice_sent_bytes_total",
        "Bytes written to clients and peers"
    );
    describe_gauge!(
        "sluice_connections_open",
        "Open connections (clients and peers)"
    );
    describe_counter!("sluice_connections_accepted_total", "Connections accepted");
    describe_counter!(
        "sluice_connections_rejected_total",
        "Connections refused at limits.max_connections"
    );
    describe_counter!(
        "sluice_protocol_errors_total",
        "Malformed requests answered with an error"
    );
    describe_counter!(
        "sluice_tls_handshake_failures_total",
        "Connections dropped in their TLS handshake (wrong CA, no client certificate, timeout)"
    );
    describe_gauge!("sluice_watches", "Open watches");
    describe_memory();
    describe_counter!("sluice_store_operations_total", "Store operations by kind");
    describe_counter!("sluice_store_errors_total", "Store operations that failed");
    describe_gauge!("sluice_shard_keys", "Keys per shard hosted here");
    describe_gauge!(
        "sluice_shard_last_version",
        "Newest version per shard hosted here"
    );
    describe_counter!("sluice_upcalls_total", "Lambda upcalls run on this node");
    describe_counter!(
        "sluice_upcall_failures_total",
        "Lambda upcalls that returned an error"
    );
    describe_counter!("sluice_upcall_panics_total", "Lambda upcalls that panicked");
    describe_counter!(
        "sluice_upcalls_dropped_total",
        "Upcalls refused because a worker's queue was full (compute.queue_len)"
    );
    describe_gauge!("sluice_graphs", "Data flow graphs running here");
    describe_gauge!(
        "sluice_upcall_queue_depth",
        "Upcalls waiting per worker thread (bounded by compute.queue_len)"
    );
    describe_counter!("sluice_udl_calls_total", "Calls per UDL of each vertex");
    describe_counter!(
        "sluice_udl_failures_total",
        "Failed or panicked calls per UDL"
    );
    describe_counter!(
        "sluice_udl_dropped_total",
        "Upcalls per UDL dropped at a full queue"
    );
    describe_histogram!(
        "sluice_udl_duration_seconds",
        "Time in each UDL's handler per call"
    );
    describe_raft();
}

/// The Raft groups' series' HELP lines (`describe`).
fn describe_raft() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        "sluice_raft_role",
        "1 for the role each Raft group hosted here has"
    );
    describe_gauge!("sluice_raft_term", "Each Raft group's current term");
    describe_gauge!(
        "sluice_raft_last_log_index",
        "Each Raft group's last log index here"
    );
    describe_gauge!(
        "sluice_raft_applied_index",
        "Each Raft group's applied index here"
    );
    describe_gauge!(
        "sluice_raft_apply_lag_entries",
        "Entries logged here but not applied yet"
    );
    describe_gauge!(
        "sluice_raft_follower_lag_entries",
        "On a leader: entries each follower has yet to match"
    );
    describe_gauge!(
        "sluice_raft_members_down",
        "On a leader: members it counts as down (their share of one-dispatched lambdas runs on the others)"
    );
    describe_gauge!(
        "sluice_raft_state_lost",
        "1 while this member, back with no state (a reboot, a wiped data directory), holds its vote back until a leader catches it up"
    );
    describe_counter!(
        "sluice_raft_snapshots_built_total",
        "Snapshots built per group"
    );
    describe_counter!(
        "sluice_raft_snapshots_installed_total",
        "Snapshots installed per group"
    );
    describe_gauge!(
        "sluice_raft_snapshot_bytes",
        "Size of the snapshot each group holds here"
    );
}

/// The memory series' HELP lines (`describe`).
fn describe_memory() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        "sluice_memory_in_use_bytes",
        "Memory the node holds: the allocator's bytes in use plus shared pages (what limits.max_memory_bytes is checked against)"
    );
    describe_gauge!(
        "sluice_memory_limit_bytes",
        "limits.max_memory_bytes (0: no limit)"
    );
    describe_counter!(
        "sluice_memory_refused_writes_total",
        "Writes refused with OutOfMemory"
    );
}

/// Bytes read from clients and peers.
#[inline]
pub fn received(n: usize) {
    if let Some(h) = handles() {
        h.received_bytes.increment(n as u64);
    }
}

/// Bytes written to clients and peers.
#[inline]
pub fn sent(n: usize) {
    if let Some(h) = handles() {
        h.sent_bytes.increment(n as u64);
    }
}

/// A request done: its latency on this node (from decoding it to queueing
/// its reply), by operation and by the pool of its key ("" for requests
/// about no one object).
pub fn request(op: &'static str, pool: String, took: Duration) {
    histogram!("sluice_request_duration_seconds", "op" => op, "pool" => pool)
        .record(took.as_secs_f64());
}

/// A request held back by a rate limit for `d`.
pub fn rate_limit_delay(d: Duration) {
    if handles().is_some() {
        counter!("sluice_rate_limit_delays_total").increment(1);
        histogram!("sluice_rate_limit_delay_seconds").record(d.as_secs_f64());
    }
}

/// Refreshes the mirrored series every second while the node lives.
pub fn spawn_mirror(ctx: Weak<ConnCtx>) {
    if handles().is_none() {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(MIRROR_EVERY);
        loop {
            tick.tick().await;
            let Some(ctx) = ctx.upgrade() else { return };
            mirror(&ctx);
        }
    });
}

fn mirror(ctx: &Arc<ConnCtx>) {
    let s = &ctx.stats;
    let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    gauge!("sluice_connections_open").set(g(&s.connections_open) as f64);
    counter!("sluice_connections_accepted_total").absolute(g(&s.connections_accepted));
    counter!("sluice_connections_rejected_total").absolute(g(&s.connections_rejected));
    counter!("sluice_protocol_errors_total").absolute(g(&s.protocol_errors));
    counter!("sluice_tls_handshake_failures_total").absolute(g(&s.tls_handshake_failures));
    gauge!("sluice_watches").set(ctx.watches.len() as f64);
    let store = &ctx.store;
    let (in_use, limit) = store.memory.in_use_and_limit();
    gauge!("sluice_memory_in_use_bytes").set(in_use as f64);
    gauge!("sluice_memory_limit_bytes").set(limit as f64);
    counter!("sluice_memory_refused_writes_total").absolute(g(&store.memory.refused));
    let st = &store.stats;
    for (op, a) in [
        ("put", &st.puts),
        ("trigger_put", &st.trigger_puts),
        ("remove", &st.removes),
        ("get", &st.gets),
        ("list_keys", &st.list_keys),
    ] {
        counter!("sluice_store_operations_total", "op" => op).absolute(g(a));
    }
    counter!("sluice_store_errors_total").absolute(g(&st.errors));
    for sh in store.shards() {
        let shard = sh.id.to_string();
        gauge!("sluice_shard_keys", "shard" => shard.clone()).set(sh.len() as f64);
        gauge!("sluice_shard_last_version", "shard" => shard).set(sh.last_version() as f64);
    }
    let e = ctx.engine.stats();
    let n = |k: &str| e[k].as_u64().unwrap_or(0);
    counter!("sluice_upcalls_total").absolute(n("upcalls"));
    counter!("sluice_upcall_failures_total").absolute(n("failures"));
    counter!("sluice_upcall_panics_total").absolute(n("panics"));
    counter!("sluice_upcalls_dropped_total").absolute(n("dropped"));
    gauge!("sluice_graphs").set(n("graphs") as f64);
    if let Some(q) = e["queued"].as_array() {
        for (w, depth) in q.iter().enumerate() {
            gauge!("sluice_upcall_queue_depth", "worker" => w.to_string())
                .set(depth.as_u64().unwrap_or(0) as f64);
        }
    }
    if let Some(c) = &ctx.cluster {
        mirror_raft(&c.status());
    }
}

/// Each Raft group hosted here, from the node's status (`sluice cluster
/// status` shows the same).
fn mirror_raft(status: &serde_json::Value) {
    const ROLES: &[&str] = &[
        "leader",
        "follower",
        "candidate",
        "learner",
        "removed",
        "shutdown",
    ];
    let Some(groups) = status["groups"].as_array() else {
        return;
    };
    for grp in groups {
        let group = grp["group"].as_str().unwrap_or("?").to_string();
        let role = grp["role"].as_str().unwrap_or("");
        for r in ROLES {
            gauge!("sluice_raft_role", "group" => group.clone(), "role" => *r).set(if *r == role {
                1.0
            } else {
                0.0
            });
        }
        let u = |k: &str| grp[k].as_u64().unwrap_or(0);
        gauge!("sluice_raft_term", "group" => group.clone()).set(u("term") as f64);
        gauge!("sluice_raft_last_log_index", "group" => group.clone())
            .set(u("last_log_index") as f64);
        gauge!("sluice_raft_applied_index", "group" => group.clone())
            .set(u("applied_index") as f64);
        gauge!("sluice_raft_apply_lag_entries", "group" => group.clone())
            .set(u("last_log_index").saturating_sub(u("applied_index")) as f64);
        counter!("sluice_raft_snapshots_built_total", "group" => group.clone())
            .absolute(u("snapshots_built"));
        counter!("sluice_raft_snapshots_installed_total", "group" => group.clone())
            .absolute(u("snapshots_installed"));
        gauge!("sluice_raft_snapshot_bytes", "group" => group.clone())
            .set(u("snapshot_bytes") as f64);
        gauge!("sluice_raft_members_down", "group" => group.clone())
            .set(grp["down"].as_array().map_or(0, Vec::len) as f64);
        gauge!("sluice_raft_state_lost", "group" => group.clone())
            .set(if grp["state_lost"] == true { 1.0 } else { 0.0 });
        if let Some(lag) = grp["lag"].as_object() {
            for (peer, entries) in lag {
                gauge!("sluice_raft_follower_lag_entries", "group" => group.clone(), "peer" => peer.clone())
                    .set(entries.as_u64().unwrap_or(0) as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_groups_become_role_term_position_and_lag_gauges() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let status = serde_json::json!({
            "node": 1,
            "groups": [
                {"group": "meta", "role": "leader", "term": 7, "last_log_index": 120,
                 "applied_index": 118, "snapshots_built": 2, "snapshots_installed": 0,
                 "snapshot_bytes": 4096,
                 "lag": {"2": 0, "3": 5}, "down": [3]},
                {"group": "volatile/0/0", "role": "follower", "term": 3,
                 "last_log_index": 40, "applied_index": 40, "lag": {}, "state_lost": true}
            ]
        });
        metrics::with_local_recorder(&recorder, || mirror_raft(&status));
        let text = handle.render();
        for line in [
            r#"sluice_raft_role{group="meta",role="leader"} 1"#,
            r#"sluice_raft_role{group="meta",role="follower"} 0"#,
            r#"sluice_raft_role{group="volatile/0/0",role="follower"} 1"#,
            r#"sluice_raft_role{group="volatile/0/0",role="leader"} 0"#,
            r#"sluice_raft_term{group="meta"} 7"#,
            r#"sluice_raft_apply_lag_entries{group="meta"} 2"#,
            r#"sluice_raft_apply_lag_entries{group="volatile/0/0"} 0"#,
            r#"sluice_raft_follower_lag_entries{group="meta",peer="3"} 5"#,
            r#"sluice_raft_members_down{group="meta"} 1"#,
            r#"sluice_raft_members_down{group="volatile/0/0"} 0"#,
            r#"sluice_raft_state_lost{group="volatile/0/0"} 1"#,
            r#"sluice_raft_state_lost{group="meta"} 0"#,
            r#"sluice_raft_snapshots_built_total{group="meta"} 2"#,
            r#"sluice_raft_snapshot_bytes{group="meta"} 4096"#,
            r#"sluice_raft_snapshot_bytes{group="volatile/0/0"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
    }

    /// Every series the Grafana dashboard queries is one this module
    /// describes (a renamed metric must take the dashboard along).
    #[test]
    fn the_dashboard_queries_only_series_the_node_exports() {
        let described: Vec<String> = include_str!("metrics.rs")
            .split("describe_")
            .skip(1)
            .filter_map(|s| s.split('"').nth(1).map(str::to_string))
            .filter(|n| n.starts_with("sluice_"))
            .collect();
        assert!(described.len() > 20, "{described:?}");
        let dash: serde_json::Value =
            serde_json::from_str(include_str!("../../../deploy/grafana/sluice.json")).unwrap();
        let mut exprs = 0;
        for panel in dash["panels"].as_array().unwrap() {
            for t in panel["targets"].as_array().unwrap() {
                let e = t["expr"].as_str().unwrap();
                exprs += 1;
                for name in e
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("sluice_"))
                {
                    let base = ["_bucket", "_count", "_sum"]
                        .iter()
                        .find_map(|s| name.strip_suffix(s))
                        .unwrap_or(name);
                    assert!(
                        described.iter().any(|d| d == base),
                        "the dashboard queries {name}, which the node does not export"
                    );
                }
            }
        }
        assert!(exprs >= 10);
    }

    #[test]
    fn a_second_endpoint_in_one_process_is_refused_by_name() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            drop(l);
            install(addr).unwrap();
            install(addr).unwrap(); // the same address again: fine
            let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
            let e = install(other).unwrap_err();
            assert!(
                e.contains("already exports metrics on") && e.contains(&addr.to_string()),
                "{e}"
            );
            assert!(handles().is_some());
        });
    }
}
