//! Persistent pools at the store level (issue #6 groundwork; the server
//! does not enable them yet).

use bytes::Bytes;
use sluice_store::{HistoryRange, Layout, Store, StoreConfig};
use sluice_types::{PoolSpec, PoolType, SluiceError, VERSION_NONE};

mod common;

/// A fresh directory, removed when dropped.
fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn open(d: &std::path::Path) -> Store {
    let s = Store::open(StoreConfig {
        layout: Layout {
            version: 1,
            volatile: vec![1],
            trigger: vec![1],
            persistent: vec![2],
        },
        pool_table_path: Some(d.join("pools.json")),
        persistent_dir: Some(d.join("persistent")),
        ..Default::default()
    })
    .unwrap();
    let _ = s.create_pool(&PoolSpec {
        pathname: "/p".into(),
        pool_type: Some(PoolType::Persistent),
        ..Default::default()
    });
    s
}

fn b(x: &str) -> Bytes {
    Bytes::copy_from_slice(x.as_bytes())
}

#[test]
fn persistent_pools_are_refused_unless_enabled() {
    let s = Store::open(StoreConfig::default()).unwrap();
    let e = s
        .create_pool(&PoolSpec {
            pathname: "/p".into(),
            pool_type: Some(PoolType::Persistent),
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(e, SluiceError::NotSupported { .. }), "{e}");
}

#[test]
fn every_version_survives_a_restart_with_time_reads_and_history() {
    let _d_dir = dir();
    let d = _d_dir.path();
    let (v1, v2, v3, t1, t2, t3);
    {
        let s = open(d);
        let r1 = s.put("/p/a", b("one"), None, None).unwrap();
        let r2 = s.put("/p/a", b("two"), Some(r1.version), None).unwrap();
        s.put("/p/b", b("other"), None, None).unwrap();
        let r3 = s.remove("/p/a", None, None).unwrap();
        (v1, v2, v3, t1, t2, t3) = (
            r1.version,
            r2.version,
            r3.version,
            r1.timestamp_us,
            r2.timestamp_us,
            r3.timestamp_us,
        );
    }
    let s = open(d);
    // Latest: removed; history intact.
    assert!(matches!(
        s.get("/p/a", None, None),
        Err(SluiceError::NotFound { .. })
    ));
    assert_eq!(s.get("/p/a", Some(v1), None).unwrap().value, b("one"));
    let o2 = s.get("/p/a", Some(v2), None).unwrap();
    assert_eq!(
        (o2.value.clone(), o2.meta.previous_version_by_key),
        (b("two"), v1)
    );
    assert_eq!(s.get_by_time("/p/a", t1, None).unwrap().value, b("one"));
    assert_eq!(s.get_by_time("/p/a", t2, None).unwrap().value, b("two"));
    assert!(
        matches!(
            s.get_by_time("/p/a", t3, None),
            Err(SluiceError::NotFound { .. })
        ),
        "removed at t3"
    );
    assert!(
        matches!(
            s.get_by_time("/p/a", t1 - 1, None),
            Err(SluiceError::NotFound { .. })
        ),
        "not yet written"
    );
    let hist: Vec<u64> = s
        .history(
            "/p/a",
            HistoryRange::Versions {
                from: 0,
                to: u64::MAX,
            },
            usize::MAX,
            None,
        )
        .unwrap()
        .iter()
        .map(|o| o.meta.version)
        .collect();
    assert_eq!(hist, vec![v3, v2, v1], "newest first, tombstone included");
    assert_eq!(
        s.list_keys_at_version("/p", None, v2).unwrap(),
        vec!["/p/a", "/p/b"]
    );
    assert_eq!(
        s.list_keys_at_version("/p", None, v3).unwrap(),
        vec!["/p/b"]
    );
    assert_eq!(s.list_keys("/p", None, None).unwrap(), vec!["/p/b"]);
    // A bounded read takes the newest versions only.
    let two: Vec<u64> = s
        .history(
            "/p/a",
            HistoryRange::Versions {
                from: 0,
                to: u64::MAX,
            },
            2,
            None,
        )
        .unwrap()
        .iter()
        .map(|o| o.meta.version)
        .collect();
    assert_eq!(two, vec![v3, v2]);
    // The chain and the clock continue after the restart.
    let r4 = s.put("/p/a", b("back"), Some(VERSION_NONE), None).unwrap();
    assert!(r4.timestamp_us > t3);
    assert_eq!(
        s.get("/p/a", None, None)
            .unwrap()
            .meta
            .previous_version_by_key,
        v3
    );
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn history_is_only_for_persistent_pools() {
    let _d_dir = dir();
    let d = _d_dir.path();
    let s = open(d);
    s.put("/vol/x", b("v"), None, None).unwrap();
    let e = s
        .history(
            "/vol/x",
            HistoryRange::Versions { from: 0, to: 9 },
            usize::MAX,
            None,
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("only persistent pools keep history"),
        "{e}"
    );
    let e = s.list_keys_at_version("/vol", None, 1).unwrap_err();
    assert!(
        e.to_string().contains("only persistent pools keep history"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn retention_drops_old_versions_of_its_pool_only() {
    use sluice_types::pool::Retention;
    let _d_dir = dir();
    let d = _d_dir.path();
    let s = one_shard_store(d, 1024);
    let e = s
        .create_pool(&PoolSpec {
            pathname: "/v".into(),
            pool_type: Some(PoolType::Volatile),
            retention: Some(Retention {
                keep_versions: Some(2),
                keep_for_s: None,
                keep_bytes: None,
            }),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("retention applies to persistent pools"),
        "{e}"
    );
    s.create_pool(&PoolSpec {
        pathname: "/keep2".into(),
        pool_type: Some(PoolType::Persistent),
        retention: Some(Retention {
            keep_versions: Some(2),
            keep_for_s: None,
            keep_bytes: None,
        }),
        ..Default::default()
    })
    .unwrap();
    s.create_pool(&PoolSpec {
        pathname: "/all".into(),
        pool_type: Some(PoolType::Persistent),
        ..Default::default()
    })
    .unwrap();
    let mut versions: Vec<(String, u64)> = Vec::new();
    for i in 0..60 {
        for key in ["/keep2/k", "/all/k"] {
            let r = s
                .put(
                    key,
                    Bytes::from(format!("{key}-{i}-{}", "y".repeat(30))),
                    None,
                    None,
                )
                .unwrap();
            versions.push((key.to_string(), r.version));
        }
    }
    let (dropped, reclaimed) = s.compact().unwrap();
    assert!(
        dropped > 0 && reclaimed > 0,
        "dropped {dropped}, reclaimed {reclaimed}"
    );
    let hist = |k: &str| {
        s.history(
            k,
            HistoryRange::Versions {
                from: 0,
                to: u64::MAX,
            },
            usize::MAX,
            None,
        )
        .unwrap()
        .len()
    };
    assert!(hist("/keep2/k") < 60, "old versions of /keep2 are gone");
    assert!(hist("/keep2/k") >= 2);
    assert_eq!(
        hist("/all/k"),
        60,
        "a pool without retention keeps everything"
    );
    assert!(s
        .get("/keep2/k", None, None)
        .unwrap()
        .value
        .starts_with(b"/keep2/k-59-"));
    let _ = std::fs::remove_dir_all(d);
}

/// Issue #14: reads honour retention at once, not when a segment is
/// compacted: a version past the policy is refused ("dropped by the pool's
/// retention") while still on disk, history ranges stop at it, and after
/// compaction a dropped version says so too.
#[test]
fn reads_honour_retention_before_compaction_and_name_it() {
    use sluice_types::pool::Retention;
    let _d_dir = dir();
    let d = _d_dir.path();
    let s = one_shard_store(d, 256);
    s.create_pool(&PoolSpec {
        pathname: "/r".into(),
        pool_type: Some(PoolType::Persistent),
        retention: Some(Retention {
            keep_versions: Some(3),
            keep_for_s: None,
            keep_bytes: None,
        }),
        ..Default::default()
    })
    .unwrap();
    let puts: Vec<_> = (0..6)
        .map(|i| {
            s.put("/r/k", Bytes::from(format!("v{i}")), None, None)
                .unwrap()
        })
        .collect();
    let versions: Vec<u64> = puts.iter().map(|p| p.version).collect();
    // Nothing was compacted yet, but the oldest three versions are past
    // the policy.
    let e = s.get("/r/k", Some(versions[1]), None).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "version {} was dropped by the pool's retention (keeps 3 versions per key)",
            versions[1]
        )),
        "{msg}"
    );
    assert_eq!(
        s.get("/r/k", Some(versions[3]), None).unwrap().value,
        Bytes::from("v3")
    );
    let all = s
        .history(
            "/r/k",
            HistoryRange::Versions {
                from: 0,
                to: u64::MAX,
            },
            usize::MAX,
            None,
        )
        .unwrap();
    let held: Vec<u64> = all.iter().map(|o| o.meta.version).collect();
    assert_eq!(held, vec![versions[5], versions[4], versions[3]]);
    // By time: the version current at the first put's time is dropped.
    let e = s
        .get_by_time("/r/k", puts[0].timestamp_us, None)
        .unwrap_err();
    assert!(
        e.to_string().contains("dropped by the pool's retention"),
        "{e}"
    );
    // Compacted away: the error still says why.
    let (dropped, _) = s.compact().unwrap();
    assert!(
        dropped > 0,
        "segments of 256 bytes were sealed and compacted"
    );
    let e = s.get("/r/k", Some(versions[0]), None).unwrap_err();
    assert!(
        e.to_string()
            .contains("the pool's retention (keeps 3 versions per key) dropped"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(d);
}

/// Every file under `d`, concatenated (to look for bytes on disk).
fn disk_bytes(d: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(disk_bytes(&p));
        } else {
            out.extend(std::fs::read(&p).unwrap());
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A purged persistent pool's versions leave memory and disk: nothing of
/// them comes back after a restart, and a new pool at the path is empty.
#[test]
fn purge_deletes_a_persistent_pools_history_for_good() {
    let _d_dir = dir();
    let d = _d_dir.path();
    {
        let s = open(d);
        s.create_pool(&PoolSpec {
            pathname: "/q".into(),
            pool_type: Some(PoolType::Persistent),
            ..Default::default()
        })
        .unwrap();
        for i in 0..50 {
            s.put(
                &format!("/p/k{}", i % 5),
                b(&format!("secret-{i}")),
                None,
                None,
            )
            .unwrap();
            s.put("/q/stay", b(&format!("kept-{i}")), None, None)
                .unwrap();
        }
        s.remove_pool("/p").unwrap();
        assert!(contains(&disk_bytes(d), b"secret-7"));
        let r = s.purge_pool("/p").unwrap();
        assert_eq!((r.keys, r.versions), (5, 50));
        assert!(r.bytes > 0, "{r:?}");
        assert!(
            !contains(&disk_bytes(d), b"secret-"),
            "purged values are still on disk"
        );
    }
    let s = open(d); // re-creates /p (persistent): it must start empty
    let p = s.get_pool("/p").unwrap();
    assert!(!p.deleted);
    for k in 0..5 {
        let e = s.get(&format!("/p/k{k}"), None, None).unwrap_err();
        assert!(matches!(e, SluiceError::NotFound { .. }), "{e}");
    }
    let all = |key| {
        let every = HistoryRange::Versions {
            from: 0,
            to: u64::MAX,
        };
        s.history(key, every, 100, None).unwrap()
    };
    assert!(all("/p/k1").is_empty());
    // The other pool of the same shards kept every version.
    let h = all("/q/stay");
    assert_eq!(h.len(), 50);
    assert_eq!(s.get("/q/stay", None, None).unwrap().value, b("kept-49"));
    let _ = std::fs::remove_dir_all(d);
}

/// A resumed watch's replay is bounded in versions and in bytes; past
/// either bound it is refused, saying which, rather than buffering it all.
#[test]
fn a_replay_is_refused_past_its_bounds() {
    let _d = dir();
    let s = open(_d.path());
    for _ in 0..5 {
        s.put("/p/k", Bytes::from(vec![b'x'; 100]), None, None)
            .unwrap();
    }
    let shard = s.shard_id_of("/p/k", None).unwrap();
    let all = HistoryRange::Versions {
        from: 0,
        to: u64::MAX,
    };
    let upto = s.shard(shard).unwrap().last_version();
    let r = s.replay(shard, "/p", all, upto, 5, 500).unwrap();
    assert_eq!((r.objects.len(), r.bytes), (5, 500));
    let e = s.replay(shard, "/p", all, upto, 4, 500).unwrap_err();
    assert!(e.to_string().contains("5 versions back"), "{e}");
    let e = s.replay(shard, "/p", all, upto, 5, 499).unwrap_err();
    assert!(e.to_string().contains("more than 499 bytes"), "{e}");
}

/// Issue #18 (a stream's payload budget): `keep_bytes` keeps versions
/// while they and the newer versions of their key hold at most that many
/// bytes; older ones are refused at once and compacted away later.
#[test]
fn retention_by_bytes_keeps_the_newest_within_the_budget() {
    use sluice_types::pool::Retention;
    let _d_dir = dir();
    let d = _d_dir.path();
    let s = one_shard_store(d, 4096);
    s.create_pool(&PoolSpec {
        pathname: "/b".into(),
        pool_type: Some(PoolType::Persistent),
        retention: Retention::of(None, None, Some(3000)),
        ..Default::default()
    })
    .unwrap();
    // 20 versions of 1000-byte values: about two fit the 3000-byte budget
    // with their record headers, never fewer than one.
    let versions: Vec<u64> = (0..20)
        .map(|i| {
            s.put("/b/k", Bytes::from(vec![i as u8; 1000]), None, None)
                .unwrap()
                .version
        })
        .collect();
    let kept: Vec<u64> = versions
        .iter()
        .copied()
        .filter(|v| s.get("/b/k", Some(*v), None).is_ok())
        .collect();
    assert!(
        (1..=2).contains(&kept.len()) && kept.last() == versions.last(),
        "kept {kept:?} of {versions:?}"
    );
    let e = s.get("/b/k", Some(versions[0]), None).unwrap_err();
    assert!(e.to_string().contains("keeps 3000 bytes per key"), "{e}");
    let (dropped, _) = s.compact().unwrap();
    assert!(dropped >= 10, "compaction dropped {dropped}");
    assert_eq!(
        s.get("/b/k", None, None).unwrap().value,
        Bytes::from(vec![19u8; 1000])
    );
}

/// A store of one shard per pool type, persistent shards in `d` with
/// segments of `segment_bytes`.
fn one_shard_store(d: &std::path::Path, segment_bytes: u64) -> Store {
    Store::open(StoreConfig {
        layout: Layout {
            version: 1,
            volatile: vec![1],
            trigger: vec![1],
            persistent: vec![1],
        },
        persistent_dir: Some(d.join("persistent")),
        persistent_segment_bytes: segment_bytes,
        ..Default::default()
    })
    .unwrap()
}

/// As on a volatile pool (`a_large_value_is_freed_when_its_key_is_overwritten_or_removed`),
/// under group commit too: the objects an fsync makes visible replace
/// the latest ones there, and a large one replaced is freed at once.
#[test]
fn a_large_latest_value_is_freed_when_group_commit_replaces_it() {
    use std::sync::atomic::Ordering;
    let d = dir();
    let s = Store::open(StoreConfig {
        layout: Layout {
            version: 1,
            volatile: vec![1],
            trigger: vec![1],
            persistent: vec![1],
        },
        persistent_dir: Some(d.path().join("persistent")),
        persistent_sync: sluice_log::SyncPolicy::Batch {
            max_delay: std::time::Duration::ZERO,
        },
        ..Default::default()
    })
    .unwrap();
    s.create_pool(&PoolSpec {
        pathname: "/p".into(),
        pool_type: Some(PoolType::Persistent),
        ..Default::default()
    })
    .unwrap();
    let (big, freed) = common::watched_value();
    s.put("/p/big", big, None, None).unwrap();
    s.put("/p/big", Bytes::from(vec![8; 1 << 20]), None, None)
        .unwrap();
    assert!(
        freed.load(Ordering::SeqCst),
        "the replaced latest value is freed"
    );
}

/// After the system clock is stepped back (an NTP step, a VM restored),
/// a node's timestamps run ahead of the wall clock, strictly increasing
/// (`Clock`); simulated here by a clock that has seen a timestamp an hour
/// ahead. A read at the time of a version written since is a read of the
/// past, stable at once. (Before: not stable until the wall clock had
/// caught up, an hour later, so a node refused such reads with "not
/// stable yet" for the hour.)
#[test]
fn time_reads_stay_stable_when_the_wall_clock_is_behind_the_nodes_timestamps() {
    let _d_dir = dir();
    let s = open(_d_dir.path());
    let hour_ahead = sluice_types::wall_us() + 3_600_000_000;
    s.clock().observe(hour_ahead);
    let r1 = s.put("/p/k", b("one"), None, None).unwrap();
    let r2 = s.put("/p/k", b("two"), None, None).unwrap();
    assert!(r1.timestamp_us > hour_ahead && r2.timestamp_us > r1.timestamp_us);
    assert!(s.time_now_us() >= r2.timestamp_us);
    assert!(s.time_is_stable("/p/k", r1.timestamp_us, None).unwrap());
    assert_eq!(
        s.get_by_time("/p/k", r1.timestamp_us, None).unwrap().value,
        b("one")
    );
    // Still not stable: a time no timestamp has reached yet.
    assert!(!s
        .time_is_stable("/p/k", s.time_now_us() + 1_000_000, None)
        .unwrap());
}
