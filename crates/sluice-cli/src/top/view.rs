//! What `sluice top` shows, computed from two scrapes of a node taken an
//! interval apart: rates and latency quantiles over that interval (from
//! the histograms' bucket counts, as Prometheus' `histogram_quantile`
//! does), plus the Raft groups as they are now.

use super::scrape::Sample;
use serde::Serialize;
use std::collections::BTreeMap;

/// One operation (or one lambda) over the interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Rate {
    pub name: String,
    /// Calls per second over the interval.
    pub per_s: f64,
    /// Calls since the node started.
    pub total: u64,
    /// Latency quantiles over the interval, µs (none without calls).
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// One Raft group hosted on the node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Group {
    pub group: String,
    pub role: String,
    pub term: u64,
    pub apply_lag: u64,
    /// On a leader: the follower furthest behind, in entries.
    pub max_follower_lag: u64,
    /// On a leader: the members it counts as down.
    pub members_down: u64,
}

/// One node's view.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeView {
    pub addr: String,
    pub ops: Vec<Rate>,
    /// Pools by requests per second, busiest first.
    pub pools: Vec<Rate>,
    /// Lambdas (vertex and UDL) by calls per second, busiest first.
    pub lambdas: Vec<Rate>,
    pub received_bytes_per_s: f64,
    pub sent_bytes_per_s: f64,
    pub connections: u64,
    /// Memory in use, the node's limit (0: none) and writes refused for
    /// it per second.
    pub memory_bytes: u64,
    pub memory_limit: u64,
    pub memory_refused_per_s: f64,
    pub groups: Vec<Group>,
}

/// How many pools and lambdas a view lists.
pub const TOP_N: usize = 10;

/// Histogram series of one family, grouped by the labels that are not
/// `le`: bucket upper bounds with cumulative counts, and the count.
#[derive(Default, Clone)]
struct Hist {
    buckets: Vec<(f64, f64)>,
    count: f64,
}

fn histograms(samples: &[Sample], family: &str, key: &[&str]) -> BTreeMap<String, Hist> {
    let mut out: BTreeMap<String, Hist> = BTreeMap::new();
    let id = |s: &Sample| key.iter().map(|k| s.label(k)).collect::<Vec<_>>().join(" ");
    for s in samples {
        if let Some(suffix) = s.name.strip_prefix(family) {
            match suffix {
                "_bucket" => {
                    let le = match s.label("le") {
                        "+Inf" => f64::INFINITY,
                        v => v.parse().unwrap_or(f64::INFINITY),
                    };
                    out.entry(id(s)).or_default().buckets.push((le, s.value));
                }
                "_count" => out.entry(id(s)).or_default().count += s.value,
                _ => {}
            }
        }
    }
    for h in out.values_mut() {
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The `q` quantile (seconds) of what was recorded between `before` and
/// `after`: linear within the bucket that holds it, as Prometheus does;
/// the largest finite bound when it falls in the last bucket.
fn quantile(before: Option<&Hist>, after: &Hist, q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .buckets
        .iter()
        .map(|&(le, c)| {
            let was = before
                .and_then(|b| b.buckets.iter().find(|x| x.0 == le))
                .map_or(0.0, |x| x.1);
            (le, (c - was).max(0.0))
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in &delta {
        if c >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let within = if c > prev.1 {
                (rank - prev.1) / (c - prev.1)
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * within);
        }
        prev = (le, c);
    }
    Some(prev.0)
}

/// Rates of one histogram family by `key` labels, busiest first.
fn rates(before: &[Sample], after: &[Sample], family: &str, key: &[&str], secs: f64) -> Vec<Rate> {
    let b = histograms(before, family, key);
    let a = histograms(after, family, key);
    let mut out: Vec<Rate> = a
        .iter()
        .map(|(name, h)| {
            let was = b.get(name).map_or(0.0, |x| x.count);
            Rate {
                name: name.clone(),
                per_s: (h.count - was).max(0.0) / secs,
                total: h.count as u64,
                p50_us: quantile(b.get(name), h, 0.5).map(|s| s * 1e6),
                p99_us: quantile(b.get(name), h, 0.99).map(|s| s * 1e6),
            }
        })
        .collect();
    out.sort_by(|x, y| y.per_s.total_cmp(&x.per_s).then(x.name.cmp(&y.name)));
    out
}

fn value(samples: &[Sample], name: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

/// The view of one node from two scrapes `secs` apart.
pub fn node_view(addr: &str, before: &[Sample], after: &[Sample], secs: f64) -> NodeView {
    let secs = secs.max(1e-3);
    let per_s = |name: &str| (value(after, name) - value(before, name)).max(0.0) / secs;
    let family = "sluice_request_duration_seconds";
    let mut pools = rates(before, after, family, &["pool"], secs);
    pools.retain(|p| !p.name.is_empty());
    pools.truncate(TOP_N);
    let mut lambdas = rates(
        before,
        after,
        "sluice_udl_duration_seconds",
        &["vertex", "udl"],
        secs,
    );
    lambdas.truncate(TOP_N);
    NodeView {
        addr: addr.to_string(),
        ops: rates(before, after, family, &["op"], secs),
        pools,
        lambdas,
        received_bytes_per_s: per_s("sluice_received_bytes_total"),
        sent_bytes_per_s: per_s("sluice_sent_bytes_total"),
        connections: value(after, "sluice_connections_open") as u64,
        memory_bytes: value(after, "sluice_memory_in_use_bytes") as u64,
        memory_limit: value(after, "sluice_memory_limit_bytes") as u64,
        memory_refused_per_s: per_s("sluice_memory_refused_writes_total"),
        groups: groups(after),
    }
}

fn groups(samples: &[Sample]) -> Vec<Group> {
    let mut g: BTreeMap<String, Group> = BTreeMap::new();
    for s in samples {
        let name = s.label("group");
        if name.is_empty() {
            continue;
        }
        let e = g.entry(name.to_string()).or_insert_with(|| Group {
            group: name.to_string(),
            ..Group::default()
        });
        match s.name.as_str() {
            "sluice_raft_role" if s.value >= 1.0 => e.role = s.label("role").to_string(),
            "sluice_raft_term" => e.term = s.value as u64,
            "sluice_raft_apply_lag_entries" => e.apply_lag = s.value as u64,
            "sluice_raft_follower_lag_entries" => {
                e.max_follower_lag = e.max_follower_lag.max(s.value as u64)
            }
            "sluice_raft_members_down" => e.members_down = s.value as u64,
            _ => {}
        }
    }
    g.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::super::scrape::parse;
    use super::*;

    fn scrape(puts: u64, fast: u64, slow: u64, bytes: u64) -> Vec<Sample> {
        // `fast` puts within 50 µs, `slow` ones within 1 ms.
        parse(&format!(
            "sluice_request_duration_seconds_bucket{{op=\"put\",pool=\"/vol\",le=\"0.00005\"}} {fast}\n\
             sluice_request_duration_seconds_bucket{{op=\"put\",pool=\"/vol\",le=\"0.001\"}} {}\n\
             sluice_request_duration_seconds_bucket{{op=\"put\",pool=\"/vol\",le=\"+Inf\"}} {puts}\n\
             sluice_request_duration_seconds_count{{op=\"put\",pool=\"/vol\"}} {puts}\n\
             sluice_received_bytes_total {bytes}\n\
             sluice_connections_open 3\n\
             sluice_memory_in_use_bytes 52428800\n\
             sluice_memory_limit_bytes 104857600\n\
             sluice_memory_refused_writes_total {bytes}\n\
             sluice_raft_role{{group=\"meta\",role=\"leader\"}} 1\n\
             sluice_raft_role{{group=\"meta\",role=\"follower\"}} 0\n\
             sluice_raft_term{{group=\"meta\"}} 4\n\
             sluice_raft_follower_lag_entries{{group=\"meta\",peer=\"2\"}} 3\n\
             sluice_raft_follower_lag_entries{{group=\"meta\",peer=\"3\"}} 9\n\
             sluice_raft_members_down{{group=\"meta\"}} 1\n",
            fast + slow
        ))
    }

    #[test]
    fn rates_and_quantiles_cover_only_the_interval() {
        // Before: 100 puts, all fast. Then 100 more in 2 s: 90 fast, 10 slow.
        let v = node_view(
            "n",
            &scrape(100, 100, 0, 1000),
            &scrape(200, 190, 10, 5000),
            2.0,
        );
        let put = &v.ops[0];
        assert_eq!(
            (put.name.as_str(), put.per_s, put.total),
            ("put", 50.0, 200)
        );
        // The median of the interval lies in the first bucket: half of 90
        // calls of 0-50 µs, linear within it.
        let p50 = put.p50_us.unwrap();
        assert!((p50 - 50.0 * 50.0 / 90.0).abs() < 1e-6, "{p50}");
        // The 99th is among the 10 slow calls, between 50 µs and 1 ms.
        let p99 = put.p99_us.unwrap();
        assert!(p99 > 50.0 && p99 <= 1000.0, "{p99}");
        assert_eq!(v.pools[0].name, "/vol");
        assert_eq!(v.received_bytes_per_s, 2000.0);
        assert_eq!(v.connections, 3);
        assert_eq!((v.memory_bytes, v.memory_limit), (50 << 20, 100 << 20));
        assert_eq!(v.memory_refused_per_s, 2000.0);
        assert_eq!(
            v.groups,
            vec![Group {
                group: "meta".into(),
                role: "leader".into(),
                term: 4,
                apply_lag: 0,
                max_follower_lag: 9,
                members_down: 1
            }]
        );
    }

    #[test]
    fn no_calls_in_the_interval_means_no_quantiles() {
        let s = scrape(100, 100, 0, 0);
        let v = node_view("n", &s, &s, 1.0);
        assert_eq!(v.ops[0].per_s, 0.0);
        assert_eq!(v.ops[0].p50_us, None);
    }
}
