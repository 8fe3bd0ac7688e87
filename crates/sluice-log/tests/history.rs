//! The versioned history against a brute-force model, across reopen.

use bytes::Bytes;
use proptest::prelude::*;
use sluice_log::{History, LogOptions, Range, RealFs, SyncPolicy};
use std::sync::Arc;

#[derive(Clone, Debug)]
struct W {
    key: String,
    version: u64,
    ts: u64,
    value: Option<Vec<u8>>,
}

/// A fresh directory, removed when dropped.
fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// The model's answer: newest write to `key` satisfying `pred`.
fn newest<'a>(ws: &'a [W], key: &str, pred: impl Fn(&W) -> bool) -> Option<&'a W> {
    ws.iter().filter(|w| w.key == key && pred(w)).last()
}

/// Writes `(key number, remove, time step, value)` ops as versions 1, 2,
/// ...; returns the model of what was written.
fn write_ops(h: &mut History, ops: Vec<(u8, bool, u64, Vec<u8>)>) -> Vec<W> {
    let mut ws = Vec::new();
    let mut ts = 0;
    for (i, (k, remove, dt, v)) in ops.into_iter().enumerate() {
        ts += dt;
        let w = W {
            key: format!("/p/k{k}"),
            version: i as u64 + 1,
            ts,
            value: (!remove).then_some(v),
        };
        h.write(&w.key, w.version, w.ts, w.value.clone().map(Bytes::from))
            .unwrap();
        ws.push(w);
    }
    ws
}

fn check(h: &History, ws: &[W], probes: &[(u8, u64)]) -> Result<(), TestCaseError> {
    let keys: Vec<String> = (0..4).map(|k| format!("/p/k{k}")).collect();
    for key in &keys {
        let got = h
            .get(key, None)
            .unwrap()
            .map(|(e, v)| (e.version, e.tombstone, v));
        let want = newest(ws, key, |_| true).map(|w| {
            (
                w.version,
                w.value.is_none(),
                Bytes::from(w.value.clone().unwrap_or_default()),
            )
        });
        prop_assert_eq!(got, want);
    }
    for &(k, x) in probes {
        let key = &keys[k as usize % 4];
        // By version.
        let got = h.get(key, Some(x)).unwrap().map(|(e, _)| e.version);
        let want = ws
            .iter()
            .find(|w| &w.key == key && w.version == x)
            .map(|w| w.version);
        prop_assert_eq!(got, want);
        // By time.
        let got = h.get_by_time(key, x).unwrap().map(|(e, v)| (e.version, v));
        let want = newest(ws, key, |w| w.ts <= x)
            .map(|w| (w.version, Bytes::from(w.value.clone().unwrap_or_default())));
        prop_assert_eq!(got, want);
        // Ranges, newest first.
        let (lo, hi) = (x / 2, x);
        let got: Vec<u64> = h
            .range(key, Range::Versions { from: lo, to: hi }, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(e, _)| e.version)
            .collect();
        let want: Vec<u64> = ws
            .iter()
            .rev()
            .filter(|w| &w.key == key && (lo..=hi).contains(&w.version))
            .map(|w| w.version)
            .collect();
        prop_assert_eq!(got, want);
        let got: Vec<u64> = h
            .range(key, Range::Times { from: lo, to: hi }, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(e, _)| e.version)
            .collect();
        let want: Vec<u64> = ws
            .iter()
            .rev()
            .filter(|w| &w.key == key && (lo..=hi).contains(&w.ts))
            .map(|w| w.version)
            .collect();
        prop_assert_eq!(got, want);
        // Keys live at a version.
        let got = h.keys_at_version(x, None);
        let mut want: Vec<String> = keys
            .iter()
            .filter(|k| newest(ws, k, |w| w.version <= x).is_some_and(|w| w.value.is_some()))
            .cloned()
            .collect();
        want.sort();
        prop_assert_eq!(got, want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn history_matches_model_before_and_after_reopen(
        ops in proptest::collection::vec((0u8..4, any::<bool>(), 0u64..5, proptest::collection::vec(any::<u8>(), 0..40)), 1..80),
        probes in proptest::collection::vec((any::<u8>(), 0u64..200), 1..20),
    ) {
        let _d_dir = dir();
        let d = _d_dir.path();
        let opts = LogOptions { segment_bytes_max: 2048, sync: SyncPolicy::Never, ..Default::default() };
        let (mut h, _) = History::open(d, Arc::new(RealFs), opts.clone()).unwrap();
        let ws = write_ops(&mut h, ops);
        check(&h, &ws, &probes)?;
        h.sync().unwrap();
        drop(h);
        let (h, rec) = History::open(d, Arc::new(RealFs), opts).unwrap();
        prop_assert_eq!(rec.records.len(), 0, "records were moved into the indexes");
        check(&h, &ws, &probes)?;
        prop_assert_eq!(h.last_version(), ws.len() as u64);
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn versions_and_timestamps_must_move_forward() {
    let _d_dir = dir();
    let d = _d_dir.path();
    let (mut h, _) = History::open(d, Arc::new(RealFs), LogOptions::default()).unwrap();
    h.write("/p/a", 5, 100, Some(Bytes::from("x"))).unwrap();
    let e = h.write("/p/a", 5, 101, Some(Bytes::from("y"))).unwrap_err();
    assert!(
        e.to_string()
            .contains("version 5 is not above the last version 5"),
        "{e}"
    );
    let e = h.write("/p/a", 6, 99, Some(Bytes::from("y"))).unwrap_err();
    assert!(e.to_string().contains("must not go backwards"), "{e}");
    let en = h.write("/p/a", 6, 100, None).unwrap();
    assert!(en.tombstone && en.prev_version_by_key == 5);
    assert_eq!(h.key_of_version(6), Some("/p/a"));
    let _ = std::fs::remove_dir_all(d);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// A replica rolls its history back to its snapshot's version and
    /// writes on from there: the history equals the model of the kept
    /// prefix plus the new writes, before and after reopen, whichever
    /// segment the cut falls in (segments are tiny here).
    #[test]
    fn truncate_after_then_write_on_matches_model(
        ops in proptest::collection::vec((0u8..4, any::<bool>(), 0u64..5, proptest::collection::vec(any::<u8>(), 0..40)), 1..80),
        cut in 0usize..90,
        more in proptest::collection::vec((0u8..4, proptest::collection::vec(any::<u8>(), 0..40)), 0..20),
        probes in proptest::collection::vec((any::<u8>(), 0u64..200), 1..20),
    ) {
        let _d_dir = dir();
        let d = _d_dir.path();
        let opts = LogOptions { segment_bytes_max: 2048, sync: SyncPolicy::Never, ..Default::default() };
        let (mut h, _) = History::open(d, Arc::new(RealFs), opts.clone()).unwrap();
        let mut ws = write_ops(&mut h, ops);
        let cut = cut.min(ws.len());
        let epoch = h.epoch();
        let removed = h.truncate_after(cut as u64).unwrap();
        prop_assert_eq!(removed, ws.len() - cut);
        prop_assert_eq!(h.epoch() != epoch, removed > 0);
        ws.truncate(cut);
        prop_assert_eq!(h.last_version(), cut as u64);
        check(&h, &ws, &probes)?;
        let first_ts = ws.last().map_or(0, |w| w.ts) + 1;
        for (ts, (k, v)) in (first_ts..).zip(more) {
            let w = W { key: format!("/p/k{k}"), version: ws.len() as u64 + 1, ts, value: Some(v) };
            h.write(&w.key, w.version, w.ts, w.value.clone().map(Bytes::from)).unwrap();
            ws.push(w);
        }
        check(&h, &ws, &probes)?;
        let all = h.records_upto(u64::MAX).unwrap();
        prop_assert_eq!(all.iter().map(|(_, e, _)| e.version).collect::<Vec<_>>(), (1..=ws.len() as u64).collect::<Vec<_>>());
        for ((k, e, v), w) in all.iter().zip(&ws) {
            prop_assert_eq!(k, &w.key);
            prop_assert_eq!(e.tombstone, w.value.is_none());
            prop_assert_eq!(v.as_ref(), w.value.as_deref().unwrap_or_default());
        }
        drop(h);
        let (h, _) = History::open(d, Arc::new(RealFs), opts).unwrap();
        check(&h, &ws, &probes)?;
        prop_assert_eq!(h.last_version(), ws.len() as u64);
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn values_by_reference_are_read_through_the_resolver() {
    use sluice_log::ValueRef;
    let _d_dir = dir();
    let d = _d_dir.path();
    // Values "live elsewhere": a map from (segment, offset) to bytes.
    let outside: Arc<std::collections::HashMap<(u64, u64), Bytes>> = Arc::new(
        (1..=3u64)
            .map(|v| ((7, v * 100), Bytes::from(format!("value-{v}"))))
            .collect(),
    );
    let resolver = |m: Arc<std::collections::HashMap<(u64, u64), Bytes>>| -> sluice_log::Resolver {
        Arc::new(move |at: &ValueRef| {
            m.get(&(at.segment, at.offset))
                .cloned()
                .ok_or_else(|| std::io::Error::other("not there"))
        })
    };
    let at = |v: u64| ValueRef {
        segment: 7,
        offset: v * 100,
        len: format!("value-{v}").len() as u32,
    };
    let opts = LogOptions {
        segment_bytes_max: 2048,
        sync: SyncPolicy::Never,
        ..Default::default()
    };
    {
        let (mut h, _) = History::open(d, Arc::new(RealFs), opts.clone()).unwrap();
        h.set_resolver(resolver(outside.clone()));
        for v in 1..=3u64 {
            h.write_ref("/p/k", v, v * 10, at(v), outside[&(7, v * 100)].clone())
                .unwrap();
        }
        assert_eq!(h.min_value_segment(), Some(7), "what the values live in");
        // The newest from memory, older ones through the resolver.
        assert_eq!(h.get("/p/k", None).unwrap().unwrap().1, "value-3");
        assert_eq!(h.get("/p/k", Some(1)).unwrap().unwrap().1, "value-1");
        assert_eq!(h.get_by_time("/p/k", 25).unwrap().unwrap().1, "value-2");
        // Rolling back re-reads the new newest value.
        h.truncate_after(2).unwrap();
        assert_eq!(h.get("/p/k", None).unwrap().unwrap().1, "value-2");
        let all = h.records_upto(u64::MAX).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].2, "value-1");
    }
    // Reopened without a resolver: values by reference are an error that
    // names the key and version, never a wrong value.
    let (mut h, _) = History::open(d, Arc::new(RealFs), opts).unwrap();
    let e = h.get("/p/k", None).unwrap_err().to_string();
    assert!(
        e.contains("/p/k") && e.contains("version 2") && e.contains("no resolver"),
        "{e}"
    );
    h.set_resolver(resolver(outside));
    assert_eq!(h.get("/p/k", None).unwrap().unwrap().1, "value-2");
    let _ = std::fs::remove_dir_all(d);
}
