use bytes::Bytes;
use proptest::prelude::*;
use sluice_store::{Delivery, DeliveryKind, DeliveryObserver, Layout, Store, StoreConfig};
use sluice_types::{PoolSpec, PoolType, SluiceError, VERSION_NONE};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

mod common;

fn store_with_shards(shards: u32) -> Store {
    Store::open(StoreConfig {
        layout: Layout {
            version: 1,
            volatile: vec![shards],
            trigger: vec![1],
            persistent: vec![],
        },
        ..Default::default()
    })
    .unwrap()
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// A replicated write at `timestamp_us`, delivered to observers.
fn at(timestamp_us: u64) -> sluice_store::Replicated {
    sluice_store::Replicated {
        timestamp_us,
        at: None,
        deliver: true,
    }
}

#[test]
fn put_get_versions_and_chains() {
    let s = store_with_shards(1);
    let r1 = s.put("/vol/a", b("1"), None, None).unwrap();
    let r2 = s.put("/vol/b", b("2"), None, None).unwrap();
    let r3 = s.put("/vol/a", b("3"), None, None).unwrap();
    assert_eq!((r1.version, r2.version, r3.version), (1, 2, 3));
    assert!(r1.timestamp_us < r2.timestamp_us && r2.timestamp_us < r3.timestamp_us);
    let a = s.get("/vol/a", None, None).unwrap();
    assert_eq!(a.value, b("3"));
    assert_eq!(a.meta.previous_version, 2);
    assert_eq!(a.meta.previous_version_by_key, 1);
    assert_eq!(
        s.get("/vol/b", None, None)
            .unwrap()
            .meta
            .previous_version_by_key,
        VERSION_NONE
    );
    assert_eq!(s.get("/vol/a", Some(3), None).unwrap().value, b("3"));
    let e = s.get("/vol/a", Some(1), None).unwrap_err();
    assert!(matches!(e, SluiceError::VersionNotRetained { .. }), "{e}");
    let e = s.get("/vol/a", Some(99), None).unwrap_err();
    assert!(e.to_string().contains("not been written yet"), "{e}");
}

/// Whether `part` lies inside `whole`'s bytes.
fn within(part: &Bytes, whole: &Bytes) -> bool {
    let (p, w) = (part.as_ptr() as usize, whole.as_ptr() as usize);
    p >= w && p < w + whole.len()
}

/// A stored value must not keep the buffer it arrived in: a 1 KB value
/// sliced from a connection's 64 KiB read chunk held the chunk (and with
/// it the memory of every frame read next to it) for as long as it was
/// stored, so a node's memory grew to 4x its objects' once most of them
/// had been overwritten. A small value is copied; a large one, in a
/// buffer of its own, is kept without a copy.
#[test]
fn a_small_stored_value_does_not_keep_the_buffer_it_came_in() {
    let s = store_with_shards(1);
    let chunk = Bytes::from(vec![7u8; 64 * 1024]);
    s.put("/vol/small", chunk.slice(100..1124), None, None)
        .unwrap();
    let got = s.get("/vol/small", None, None).unwrap().value.clone();
    assert_eq!(got.len(), 1024);
    assert!(got.iter().all(|&x| x == 7));
    assert!(
        !within(&got, &chunk),
        "the 1 KB value still points into the 64 KiB chunk"
    );

    let big = Bytes::from(vec![8u8; sluice_store::OWN_COPY_BELOW + 100]);
    let value = big.slice(100..);
    s.put("/vol/big", value.clone(), None, None).unwrap();
    let got = s.get("/vol/big", None, None).unwrap().value.clone();
    assert_eq!(got.as_ptr(), value.as_ptr(), "a large value is not copied");
}

#[test]
fn conditional_put_reports_current_version() {
    let s = store_with_shards(1);
    s.put("/vol/k", b("a"), Some(VERSION_NONE), None).unwrap();
    let e = s
        .put("/vol/k", b("b"), Some(VERSION_NONE), None)
        .unwrap_err();
    assert_eq!(
        e,
        SluiceError::VersionConflict {
            key: "/vol/k".into(),
            expected: "none".into(),
            current: "1".into()
        }
    );
    let e = s.put("/vol/k", b("b"), Some(7), None).unwrap_err();
    assert!(e.to_string().contains("current version is 1"), "{e}");
    let ok = s.put("/vol/k", b("b"), Some(1), None).unwrap();
    assert_eq!(ok.version, 2);
}

#[test]
fn remove_writes_tombstone() {
    let s = store_with_shards(1);
    s.put("/vol/k", b("a"), None, None).unwrap();
    let rm = s.remove("/vol/k", None, None).unwrap();
    assert_eq!(rm.version, 2);
    assert!(matches!(
        s.get("/vol/k", None, None),
        Err(SluiceError::NotFound { .. })
    ));
    assert!(matches!(
        s.remove("/vol/k", None, None),
        Err(SluiceError::NotFound { .. })
    ));
    assert!(s.list_keys("/vol", None, None).unwrap().is_empty());
    // "must not exist" holds again after a remove; the chain continues.
    let r = s.put("/vol/k", b("c"), Some(VERSION_NONE), None).unwrap();
    assert_eq!(
        s.get("/vol/k", None, None)
            .unwrap()
            .meta
            .previous_version_by_key,
        2
    );
    assert_eq!(r.version, 3);
}

#[test]
fn pool_errors_name_key_and_pool() {
    let s = store_with_shards(1);
    let e = s.put("/nope/k", b("a"), None, None).unwrap_err();
    assert!(matches!(&e, SluiceError::NoPool { key } if key == "/nope/k"));
    let e = s.put("/trig/k", b("a"), None, None).unwrap_err();
    assert!(
        e.to_string().contains("/trig") && e.to_string().contains("trigger_put"),
        "{e}"
    );
    let e = s.get("/trig/k", None, None).unwrap_err();
    assert!(matches!(e, SluiceError::WrongPoolType { .. }));
    s.remove_pool("/vol").unwrap();
    let e = s.get("/vol/k", None, None).unwrap_err();
    assert!(
        matches!(&e, SluiceError::PoolDeleted { pool, .. } if pool == "/vol"),
        "{e}"
    );
    let e = s
        .create_pool(&PoolSpec {
            pathname: "/p".into(),
            pool_type: Some(PoolType::Persistent),
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(e, SluiceError::NotSupported { .. }));
    assert!(s.list_pools(false).iter().all(|p| p.pathname != "/p"));
    let e = s.put("vol/x", b("a"), None, None).unwrap_err();
    assert!(matches!(e, SluiceError::InvalidKey { .. }));
}

#[test]
fn list_keys_excludes_nested_pools_and_filters_prefix() {
    let s = store_with_shards(4);
    s.create_pool(&PoolSpec {
        pathname: "/vol/inner".into(),
        pool_type: Some(PoolType::Volatile),
        ..Default::default()
    })
    .unwrap();
    for k in ["/vol/a1", "/vol/a2", "/vol/b", "/vol/inner/x"] {
        s.put(k, b("v"), None, None).unwrap();
    }
    assert_eq!(
        s.list_keys("/vol", None, None).unwrap(),
        vec!["/vol/a1", "/vol/a2", "/vol/b"]
    );
    assert_eq!(
        s.list_keys("/vol", Some("/vol/a"), None).unwrap(),
        vec!["/vol/a1", "/vol/a2"]
    );
    assert_eq!(
        s.list_keys("/vol/inner", None, None).unwrap(),
        vec!["/vol/inner/x"]
    );
    assert!(matches!(
        s.list_keys("/nope", None, None),
        Err(SluiceError::PoolNotFound { .. })
    ));
}

#[test]
fn wrong_shard_is_detected() {
    let s = store_with_shards(4);
    let pool = s.get_pool("/vol").unwrap();
    let right = sluice_types::PoolRouter::new(pool).shard_of("/vol/x");
    let wrong = (right + 1) % 4;
    s.put("/vol/x", b("v"), None, Some(right)).unwrap();
    let e = s.get("/vol/x", None, Some(wrong)).unwrap_err();
    assert!(matches!(e, SluiceError::WrongShard { expected, .. } if expected == right));
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(String, DeliveryKind, u64)>>);
impl DeliveryObserver for Recorder {
    fn on_delivery(&self, d: &Delivery<'_>) -> sluice_types::Result<()> {
        self.0
            .lock()
            .unwrap()
            .push((d.object.key.to_string(), d.kind, d.object.meta.version));
        Ok(())
    }
}

#[test]
fn observers_see_puts_triggers_and_removes() {
    let s = store_with_shards(1);
    let rec = Arc::new(Recorder::default());
    s.add_observer(rec.clone());
    s.put("/vol/a", b("1"), None, None).unwrap();
    s.trigger_put("/trig/t", b("x"), None).unwrap();
    s.trigger_put("/vol/a", b("y"), None).unwrap();
    s.remove("/vol/a", None, None).unwrap();
    let got = rec.0.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![
            ("/vol/a".into(), DeliveryKind::Put, 1),
            ("/trig/t".into(), DeliveryKind::TriggerPut, VERSION_NONE),
            ("/vol/a".into(), DeliveryKind::TriggerPut, VERSION_NONE),
            ("/vol/a".into(), DeliveryKind::Remove, 2),
        ]
    );
    // A trigger put stored nothing.
    assert_eq!(
        s.get("/vol/a", None, None).unwrap_err(),
        SluiceError::NotFound {
            key: "/vol/a".into()
        }
    );
}

#[test]
fn pool_table_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pools.json");
    let cfg = StoreConfig {
        pool_table_path: Some(path.clone()),
        ..Default::default()
    };
    {
        let s = Store::open(cfg.clone()).unwrap();
        s.create_pool(&PoolSpec {
            pathname: "/x".into(),
            pool_type: Some(PoolType::Volatile),
            ..Default::default()
        })
        .unwrap();
        s.remove_pool("/vol").unwrap();
    }
    let s = Store::open(cfg).unwrap();
    let names: Vec<_> = s
        .list_pools(true)
        .into_iter()
        .map(|p| (p.pathname, p.deleted))
        .collect();
    assert_eq!(
        names,
        vec![
            ("/trig".into(), false),
            ("/vol".into(), true),
            ("/x".into(), false)
        ]
    );
    std::fs::write(&path, b"{ not json").unwrap();
    let e = Store::open(StoreConfig {
        pool_table_path: Some(path),
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("corrupt"), "{e}");
}

/// A pool change whose log line cannot be written (a full disk: the log
/// here is `/dev/full`) is refused naming the file, and the table stays
/// as it was, in memory and on disk; once the disk has room the change
/// goes through and loads back.
#[cfg(target_os = "linux")]
#[test]
fn a_pool_change_the_disk_refuses_is_not_made() {
    if !std::path::Path::new("/dev/full").exists() {
        return; // no full device to stand for a full disk here
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        pool_table_path: Some(dir.path().join("pools.json")),
        ..Default::default()
    };
    let spec = |p: &str| PoolSpec {
        pathname: p.into(),
        pool_type: Some(PoolType::Volatile),
        ..Default::default()
    };
    let log = dir.path().join("pools.log");
    {
        let s = Store::open(cfg.clone()).unwrap();
        s.create_pool(&spec("/a")).unwrap();
        let kept = std::fs::read(&log).unwrap();
        std::fs::rename(&log, dir.path().join("aside")).unwrap();
        std::os::unix::fs::symlink("/dev/full", &log).unwrap();
        let e = s.create_pool(&spec("/b")).unwrap_err();
        assert!(
            matches!(&e, SluiceError::Io { reason } if reason.contains("appending to") && reason.contains("pools.log")),
            "{e}"
        );
        assert!(s.get_pool("/b").is_err(), "not made in memory");
        std::fs::remove_file(&log).unwrap();
        std::fs::rename(dir.path().join("aside"), &log).unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), kept, "nor on disk");
        s.create_pool(&spec("/b")).unwrap();
    }
    let s = Store::open(cfg).unwrap();
    assert!(s.get_pool("/a").is_ok() && s.get_pool("/b").is_ok());
}

#[test]
fn readers_never_see_torn_versions_under_concurrent_writes() {
    let s = Arc::new(store_with_shards(1));
    s.put("/vol/k", Bytes::from(vec![0u8; 256]), None, None)
        .unwrap();
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            for i in 1..=20_000u32 {
                let byte = (i % 251) as u8;
                s.put("/vol/k", Bytes::from(vec![byte; 256]), None, None)
                    .unwrap();
            }
        })
    };
    let mut last = 0;
    while !writer.is_finished() {
        let o = s.get("/vol/k", None, None).unwrap();
        let first = o.value[0];
        assert!(o.value.iter().all(|b| *b == first), "torn value");
        assert!(o.meta.version >= last, "version went backwards");
        last = o.meta.version;
    }
    writer.join().unwrap();
}

proptest! {
    /// Random puts and removes across keys and shards: versions are dense
    /// and increasing per shard, and each key's previous_version_by_key is
    /// the version the model saw last.
    #[test]
    fn version_chains_match_model(ops in proptest::collection::vec((0u8..6, any::<bool>()), 1..200)) {
        let s = store_with_shards(3);
        let router = sluice_types::PoolRouter::new(s.get_pool("/vol").unwrap());
        let mut last_by_key: HashMap<String, (u64, bool)> = HashMap::new();
        let mut last_by_shard: HashMap<u32, u64> = HashMap::new();
        for (k, is_remove) in ops {
            let key = format!("/vol/k{k}");
            let shard = router.shard_of(&key);
            let live = last_by_key.get(&key).is_some_and(|(_, l)| *l);
            let res = if is_remove { s.remove(&key, None, None) } else { s.put(&key, Bytes::from(key.clone()), None, None) };
            if is_remove && !live {
                let is_nf = matches!(res, Err(SluiceError::NotFound { .. }));
                prop_assert!(is_nf);
                continue;
            }
            let r = res.unwrap();
            let expected_version = last_by_shard.get(&shard).copied().unwrap_or(0) + 1;
            prop_assert_eq!(r.version, expected_version);
            last_by_shard.insert(shard, r.version);
            let prev = last_by_key.get(&key).map_or(VERSION_NONE, |(v, _)| *v);
            last_by_key.insert(key.clone(), (r.version, !is_remove));
            if !is_remove {
                let o = s.get(&key, None, None).unwrap();
                prop_assert_eq!(o.meta.previous_version_by_key, prev);
                prop_assert_eq!(o.meta.previous_version, r.version - 1);
            }
        }
        let listed = s.list_keys("/vol", None, None).unwrap();
        let mut live: Vec<_> = last_by_key.iter().filter(|(_, (_, l))| *l).map(|(k, _)| k.clone()).collect();
        live.sort();
        prop_assert_eq!(listed, live);
    }
}

/// A replicated write names its shard and timestamp; a member that has not
/// yet applied the pool's creation (the pool table is another log) stores
/// it exactly as a member that has.
#[test]
fn replicated_writes_apply_the_same_with_or_without_the_pool() {
    let shard = sluice_store::ShardId {
        pool_type: PoolType::Volatile,
        subgroup: 0,
        shard: 1,
    };
    let behind = store_with_shards(2);
    let ahead = store_with_shards(2);
    ahead
        .create_pool(&PoolSpec {
            pathname: "/late".into(),
            pool_type: Some(PoolType::Volatile),
            ..Default::default()
        })
        .unwrap();
    for s in [&behind, &ahead] {
        let r1 = s
            .apply_write(shard, "/late/k", Some(b("v1")), None, None, at(100))
            .unwrap();
        let r2 = s
            .apply_write(
                shard,
                "/late/k",
                Some(b("v2")),
                Some(r1.version),
                None,
                at(90),
            )
            .unwrap();
        assert_eq!((r1.version, r2.version), (1, 2));
        assert_eq!(
            (r1.timestamp_us, r2.timestamp_us),
            (100, 90),
            "as the log says"
        );
        let objs = s.shard_objects(shard);
        assert_eq!(objs.len(), 1);
        assert_eq!(objs[0].value, b("v2"));
        assert_eq!(objs[0].meta.previous_version_by_key, 1);
    }
}

/// A write a restarted member applies again (it had applied it before it
/// stopped) is stored but not delivered: its lambdas ran then, and must not
/// run twice.
#[test]
fn a_replicated_write_applied_again_is_stored_but_not_delivered() {
    let s = store_with_shards(1);
    let rec = Arc::new(Recorder::default());
    s.add_observer(rec.clone());
    let shard = sluice_store::ShardId {
        pool_type: PoolType::Volatile,
        subgroup: 0,
        shard: 0,
    };
    let again = sluice_store::Replicated {
        deliver: false,
        ..at(100)
    };
    s.apply_write(shard, "/vol/a", Some(b("1")), None, None, again)
        .unwrap();
    s.apply_write(
        shard,
        "/vol/a",
        None,
        None,
        None,
        sluice_store::Replicated {
            deliver: false,
            ..at(101)
        },
    )
    .unwrap();
    s.apply_write(shard, "/vol/b", Some(b("2")), None, None, at(102))
        .unwrap();
    assert_eq!(s.shard_objects(shard).len(), 2, "both writes stored");
    assert_eq!(
        *rec.0.lock().unwrap(),
        vec![("/vol/b".to_string(), DeliveryKind::Put, 3)],
        "only the new write is delivered"
    );
}

/// The defect: `pools rm` then `pools create` on the same path revived the
/// removed pool's objects. A new pool must start empty: creating over a
/// removed pool is refused until `purge` deletes its objects.
#[test]
fn a_pool_created_again_at_a_removed_path_starts_empty() {
    let s = store_with_shards(2);
    let spec = |t| PoolSpec {
        pathname: "/r".into(),
        pool_type: Some(t),
        ..Default::default()
    };
    s.create_pool(&spec(PoolType::Volatile)).unwrap();
    s.create_pool(&PoolSpec {
        pathname: "/r/inner".into(),
        pool_type: Some(PoolType::Volatile),
        ..Default::default()
    })
    .unwrap();
    for i in 0..20 {
        s.put(&format!("/r/k{i}"), b("old"), None, None).unwrap();
    }
    s.put("/r/inner/x", b("kept"), None, None).unwrap();
    s.remove_pool("/r").unwrap();
    let e = s.create_pool(&spec(PoolType::Volatile)).unwrap_err();
    assert!(e.to_string().contains("sluice pools purge /r"), "{e}");
    let e = s.create_pool(&spec(PoolType::Trigger)).unwrap_err();
    assert!(e.to_string().contains("still holds its objects"), "{e}");

    let r = s.purge_pool("/r").unwrap();
    assert_eq!((r.keys, r.versions), (20, 20));
    assert!(s.list_pools(true).iter().all(|p| p.pathname != "/r"));
    s.create_pool(&spec(PoolType::Volatile)).unwrap();
    for i in 0..20 {
        let e = s.get(&format!("/r/k{i}"), None, None).unwrap_err();
        assert!(matches!(e, SluiceError::NotFound { .. }), "{e}");
    }
    assert!(s.list_keys("/r", None, None).unwrap().is_empty());
    // A pool inside the purged path keeps its keys.
    assert_eq!(s.get("/r/inner/x", None, None).unwrap().value, b("kept"));
    // Only a removed pool can be purged; a missing one is named.
    let e = s.purge_pool("/r").unwrap_err();
    assert!(e.to_string().contains("remove it first"), "{e}");
    let e = s.purge_pool("/nope").unwrap_err();
    assert!(matches!(e, SluiceError::PoolNotFound { .. }), "{e}");
}

/// A large value is freed when its key is overwritten or removed: the
/// shard's map freed what writes replaced 32 entries per thread at a
/// time, so up to 32 large values per thread outlived their keys (and a
/// node at its memory limit stayed refused after keys were removed).
#[test]
fn a_large_value_is_freed_when_its_key_is_overwritten_or_removed() {
    use std::sync::atomic::Ordering;
    let s = store_with_shards(1);
    let ((one, first), (two, second)) = (common::watched_value(), common::watched_value());
    s.put("/vol/big", one, None, None).unwrap();
    s.put("/vol/big", two, None, None).unwrap();
    assert!(
        first.load(Ordering::SeqCst),
        "the overwritten value is freed"
    );
    assert!(!second.load(Ordering::SeqCst));
    s.remove("/vol/big", None, None).unwrap();
    assert!(second.load(Ordering::SeqCst), "the removed value is freed");
}
