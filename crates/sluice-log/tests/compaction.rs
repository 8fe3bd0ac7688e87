//! Retention by compaction: sealed segments are rewritten without the
//! versions a policy drops, then swapped in atomically.

use bytes::Bytes;
use sluice_log::{History, Log, LogOptions, RealFs, SyncPolicy};
use std::sync::Arc;

/// A fresh directory, removed when dropped.
fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn opts() -> LogOptions {
    LogOptions {
        segment_bytes_max: 600,
        sync: SyncPolicy::Always,
        ..Default::default()
    }
}

fn fill(h: &mut History, versions: u64) {
    for v in 1..=versions {
        h.write(
            &format!("/p/k{}", v % 3),
            v,
            v * 10,
            Some(Bytes::from(format!("value-{v}-{}", "x".repeat(40)))),
        )
        .unwrap();
    }
}

fn compact_all(h: &mut History, keep_newer_than: usize) -> (usize, u64, u64) {
    let (fs, d) = h.storage();
    let (mut dropped, mut before, mut after) = (0, 0, 0);
    for seg in h.sealed_segments().unwrap() {
        let keep = h.compaction_plan(seg, |_, _, newer, _| newer < keep_newer_than);
        // The rewrite runs without the history (no lock held in a store).
        let c = Log::prepare_compacted(&fs, &d, seg, |r| keep.contains(&r.version)).unwrap();
        // Writes go on meanwhile, into the active segment.
        h.install_compacted(&c).unwrap();
        dropped += c.dropped;
        before += c.bytes_before;
        after += c.bytes_after;
    }
    (dropped, before, after)
}

#[test]
fn keep_last_n_versions_per_key_and_survive_reopen() {
    let _d_dir = dir();
    let d = _d_dir.path();
    let (mut h, _) = History::open(d, Arc::new(RealFs), opts()).unwrap();
    fill(&mut h, 60);
    let (dropped, before, after) = compact_all(&mut h, 2);
    assert!(
        dropped > 0 && after < before,
        "dropped {dropped}, {before} -> {after} bytes"
    );
    let check = |h: &History| {
        for k in 0..3u64 {
            let key = format!("/p/k{k}");
            let mut versions: Vec<u64> = (1..=60).filter(|v| v % 3 == k).collect();
            let newest = *versions.last().unwrap();
            let (e, v) = h.get(&key, None).unwrap().unwrap();
            assert_eq!(e.version, newest);
            assert!(v.starts_with(format!("value-{newest}-").as_bytes()));
            // The last two versions stay; older ones in sealed segments go.
            versions.reverse();
            for (i, ver) in versions.iter().enumerate() {
                let got = h.get(&key, Some(*ver)).unwrap();
                if i < 2 {
                    let (_, val) = got.unwrap_or_else(|| panic!("{key} v{ver} must be kept"));
                    assert!(val.starts_with(format!("value-{ver}-").as_bytes()));
                }
            }
            let kept: Vec<u64> = h
                .range(
                    &key,
                    sluice_log::Range::Versions {
                        from: 0,
                        to: u64::MAX,
                    },
                    usize::MAX,
                )
                .unwrap()
                .iter()
                .map(|(e, _)| e.version)
                .collect();
            assert!(
                kept.len() >= 2 && kept.windows(2).all(|w| w[0] > w[1]),
                "{key}: {kept:?}"
            );
            assert!(
                kept.len() < versions.len(),
                "{key}: old versions were dropped: {kept:?}"
            );
        }
    };
    check(&h);
    h.write("/p/k0", 61, 610, Some(Bytes::from("after compaction")))
        .unwrap();
    drop(h);
    let (h, rec) = History::open(d, Arc::new(RealFs), opts()).unwrap();
    assert!(rec.truncated_tail.is_none());
    assert_eq!(
        &h.get("/p/k0", None).unwrap().unwrap().1[..],
        b"after compaction"
    );
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_crash_before_the_swap_leaves_the_original_intact() {
    let _d_dir = dir();
    let d = _d_dir.path();
    let (mut h, _) = History::open(d, Arc::new(RealFs), opts()).unwrap();
    fill(&mut h, 30);
    let (fs, dd) = h.storage();
    let seg = h.sealed_segments().unwrap()[0];
    let c = Log::prepare_compacted(&fs, &dd, seg, |_| false).unwrap();
    assert!(c.dropped > 0);
    assert!(std::fs::read_dir(d).unwrap().any(|e| e
        .unwrap()
        .path()
        .extension()
        .is_some_and(|x| x == "compact")));
    drop(h); // "crash": never installed
    let (h, _) = History::open(d, Arc::new(RealFs), opts()).unwrap();
    assert!(
        !std::fs::read_dir(d).unwrap().any(|e| e
            .unwrap()
            .path()
            .extension()
            .is_some_and(|x| x == "compact")),
        "leftover removed"
    );
    assert_eq!(h.last_version(), 30);
    assert!(
        h.get("/p/k1", Some(1)).unwrap().is_some(),
        "nothing was dropped"
    );
    let _ = std::fs::remove_dir_all(d);
}
