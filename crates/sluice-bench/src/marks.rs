//! `sluice bench cluster --breakdown`: where one client's replicated puts
//! spent their time inside the shard, from the marks the node processes
//! record (`sluice_types::marks`): each step between two points an entry
//! passes, as a median and p90 over the phase's puts.

use anyhow::{Context, Result};
use sluice_types::marks::{Mark, Point};
use std::collections::HashMap;
use std::path::Path;

/// The steps of one put, in order: each from the first point to the
/// second, on the critical path (through the follower whose answer came
/// first, which made the entry committed with the leader's own).
pub const STEPS: [&str; 8] = [
    "leader: write asked -> entry in its log",
    "leader: in its log -> AppendEntries to the transport",
    "leader -> follower: encode, send, wake, receive, decode",
    "follower: received -> entry in its log",
    "follower: in its log -> answered",
    "follower -> leader: encode, send, wake, receive, decode",
    "leader: answer -> entry applied",
    "leader: applied -> write returned",
];

/// Every file's marks: `marks-<pid>.txt` in `dir`, one list per file.
pub fn read_dir(dir: &Path) -> Result<Vec<Vec<Mark>>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = e?.path();
        let is_marks = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("marks-") && n.ends_with(".txt"));
        if is_marks {
            let text = std::fs::read_to_string(&path)?;
            out.push(text.lines().filter_map(Mark::parse).collect());
        }
    }
    Ok(out)
}

/// The steps' durations (ns, signed: two points the same instant apart
/// in either order read as 0 or less) for every put proposed in
/// `[from_ns, to_ns]` whose marks are all there, plus each put's whole
/// time inside the shard (write asked -> returned) last.
pub fn steps(files: &[Vec<Mark>], from_ns: u64, to_ns: u64) -> Vec<[i64; STEPS.len() + 1]> {
    // Which file is the leader's (it proposed), and which node each of the
    // others is (its Recv marks name it).
    let Some(leader) = files.iter().position(|f| {
        f.iter()
            .any(|m| m.point == Point::Propose && (from_ns..=to_ns).contains(&m.ns))
    }) else {
        return Vec::new();
    };
    let node_file: HashMap<u64, usize> = files
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .filter_map(|(i, f)| {
            // Only nodes of this cluster: the files of clusters started
            // before (other shard sizes) reuse the node ids.
            f.iter()
                .find(|m| m.point == Point::Recv && (from_ns..=to_ns).contains(&m.ns))
                .map(|m| (m.node, i))
        })
        .collect();
    // (file, point, group, index, node) -> times, earliest first.
    let mut at: HashMap<(usize, Point, u64, u64, u64), Vec<u64>> = HashMap::new();
    for (i, f) in files.iter().enumerate() {
        for m in f {
            at.entry((i, m.point, m.group, m.index, m.node))
                .or_default()
                .push(m.ns);
        }
    }
    at.values_mut().for_each(|v| v.sort_unstable());
    // The first time at or after `after` (an index repeats across groups
    // in the log's marks, and across retries).
    let first = |key: (usize, Point, u64, u64, u64), after: u64| -> Option<u64> {
        at.get(&key)?.iter().copied().find(|&ns| ns >= after)
    };
    // An entry's append to a log: the raft-rs driver names the group, the
    // openraft log adapter of earlier builds did not (group 0).
    let logged_at = |file: usize, g: u64, ix: u64, after: u64| -> Option<u64> {
        [g, 0]
            .into_iter()
            .filter_map(|grp| first((file, Point::LogAppend, grp, ix, 0), after))
            .min()
    };
    let mut out = Vec::new();
    for p in files[leader]
        .iter()
        .filter(|m| m.point == Point::Propose && (from_ns..=to_ns).contains(&m.ns))
    {
        let (g, ix) = (p.group, p.index);
        let path = || -> Option<[i64; STEPS.len() + 1]> {
            let logged = logged_at(leader, g, ix, p.ns)?;
            let done = first((leader, Point::Done, g, ix, 0), p.ns)?;
            let applied = first((leader, Point::Apply, g, ix, 0), p.ns)?;
            // The follower whose answer came first.
            let (acked, n, f) = node_file
                .iter()
                .filter_map(|(&n, &f)| Some((first((leader, Point::Acked, g, ix, n), p.ns)?, n, f)))
                .min()?;
            let sent = first((leader, Point::Send, g, ix, n), p.ns)?;
            let recv = first((f, Point::Recv, g, ix, n), sent)?;
            let f_logged = logged_at(f, g, ix, recv)?;
            let replied = first((f, Point::Reply, g, ix, n), recv)?;
            let t = [
                p.ns, logged, sent, recv, f_logged, replied, acked, applied, done,
            ];
            let mut d = [0i64; STEPS.len() + 1];
            for (k, w) in t.windows(2).enumerate() {
                d[k] = w[1] as i64 - w[0] as i64;
            }
            d[STEPS.len()] = done as i64 - p.ns as i64;
            Some(d)
        };
        out.extend(path());
    }
    out
}

/// The `q` quantile of `v` (sorted here).
pub fn quantile(v: &mut [i64], q: f64) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let k = ((v.len() - 1) as f64 * q).round() as usize;
    v[k]
}

/// The breakdown as lines: each step's median and p90 in µs, then the
/// whole time inside the shard next to the client's p50 (`client_p50_us`).
pub fn report(label: &str, puts: &[[i64; STEPS.len() + 1]], client_p50_us: f64) -> Vec<String> {
    if puts.is_empty() {
        return vec![format!(
            "{label}: no put left a whole set of marks (were the nodes started with SLUICE_MARKS?)"
        )];
    }
    let us = |ns: i64| ns as f64 / 1000.0;
    let mut lines = vec![format!(
        "{label}: where the time went inside the shard, median / p90 of {} puts (µs, the nodes' own clocks):",
        puts.len()
    )];
    let mut medians = 0.0;
    for (k, name) in STEPS.iter().enumerate() {
        let mut v: Vec<i64> = puts.iter().map(|d| d[k]).collect();
        let (m, p90) = (quantile(&mut v, 0.5), quantile(&mut v, 0.9));
        medians += us(m);
        lines.push(format!("  {name:<58} {:>8.1} / {:>8.1}", us(m), us(p90)));
    }
    let mut whole: Vec<i64> = puts.iter().map(|d| d[STEPS.len()]).collect();
    let w = us(quantile(&mut whole, 0.5));
    lines.push(format!(
        "  write asked -> returned: median {w:.1} µs (the steps' medians add up to {medians:.1}); the client's p50 {client_p50_us:.1} µs, so {:.1} µs at the median is the client's request to the leader and back, and the leader's handling of it",
        client_p50_us - w
    ));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(ns: u64, point: Point, group: u64, index: u64, node: u64) -> Mark {
        Mark {
            ns,
            point,
            group,
            index,
            node,
        }
    }

    /// One put through a leader (file 0) and two followers (nodes 1 and
    /// 2, files 1 and 2), follower 2 answering first; with a meta group's
    /// log append of the same index earlier, which must not be taken.
    fn one_put(base: u64) -> Vec<Vec<Mark>> {
        let g = 5;
        let ix = 7;
        vec![
            vec![
                m(base - 500_000, Point::LogAppend, 0, ix, 0),
                m(base, Point::Propose, g, ix, 0),
                m(base + 10_000, Point::LogAppend, 0, ix, 0),
                m(base + 15_000, Point::Send, g, ix, 1),
                m(base + 20_000, Point::Send, g, ix, 2),
                m(base + 200_000, Point::Acked, g, ix, 1),
                m(base + 100_000, Point::Acked, g, ix, 2),
                m(base + 130_000, Point::Apply, g, ix, 0),
                m(base + 150_000, Point::Done, g, ix, 0),
            ],
            vec![
                m(base + 60_000, Point::Recv, g, ix, 1),
                m(base + 70_000, Point::LogAppend, 0, ix, 0),
                m(base + 80_000, Point::Reply, g, ix, 1),
            ],
            vec![
                m(base + 40_000, Point::Recv, g, ix, 2),
                m(base + 45_000, Point::LogAppend, 0, ix, 0),
                m(base + 55_000, Point::Reply, g, ix, 2),
            ],
        ]
    }

    #[test]
    fn a_put_is_followed_through_the_follower_that_answered_first() {
        let files = one_put(1_000_000_000);
        let puts = steps(&files, 0, u64::MAX);
        assert_eq!(puts.len(), 1);
        // (µs) asked 0, logged 10, sent to 2 at 20, received 40, logged
        // 45, answered 55, acked 100, applied 130, returned 150.
        let us = [10, 10, 20, 5, 10, 45, 30, 20, 150].map(|x: i64| x * 1000);
        assert_eq!(puts[0], us);
    }

    /// The raft-rs driver names the group in its log appends' marks (the
    /// openraft log adapter of earlier builds, above, did not): the same put is followed.
    #[test]
    fn log_appends_named_by_their_group_are_followed_too() {
        let mut files = one_put(1_000_000_000);
        for f in &mut files {
            for x in f.iter_mut().filter(|x| x.point == Point::LogAppend) {
                x.group = 5;
            }
        }
        let puts = steps(&files, 0, u64::MAX);
        assert_eq!(puts.len(), 1);
        let us = [10, 10, 20, 5, 10, 45, 30, 20, 150].map(|x: i64| x * 1000);
        assert_eq!(puts[0], us);
    }

    #[test]
    fn an_earlier_clusters_node_of_the_same_id_is_not_taken_for_a_follower() {
        let mut files = one_put(1_000_000_000);
        let g = 5;
        // Node 2 of a cluster that ran before (its own entry 7, long ago).
        // Last: without the window check, its Recv would name node 2.
        files.push(vec![
            m(1_000, Point::Recv, g, 7, 2),
            m(2_000, Point::LogAppend, 0, 7, 0),
            m(3_000, Point::Reply, g, 7, 2),
        ]);
        let puts = steps(&files, 999_000_000, u64::MAX);
        assert_eq!(puts.len(), 1);
        assert_eq!(puts[0][2], 20_000, "received by this cluster's node 2");
    }

    #[test]
    fn puts_outside_the_window_or_missing_a_mark_are_left_out() {
        let files = one_put(1_000_000_000);
        assert!(
            steps(&files, 0, 999_999_999).is_empty(),
            "proposed after the window"
        );
        let mut short = files.clone();
        short[0].retain(|x| x.point != Point::Done);
        assert!(steps(&short, 0, u64::MAX).is_empty(), "never returned");
        let lines = report("x", &steps(&files, 0, u64::MAX), 200.0);
        assert!(lines[0].contains("median / p90 of 1 puts"), "{lines:?}");
        assert!(
            lines.last().unwrap().contains("50.0 µs at the median"),
            "{lines:?}"
        );
        assert!(report("x", &[], 1.0)[0].contains("no put left"));
    }
}
