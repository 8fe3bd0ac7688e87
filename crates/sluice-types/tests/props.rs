use proptest::prelude::*;
use sluice_types::key::path_covers;
use sluice_types::{validate_key, PoolRouter, PoolSpec, PoolTable, PoolType};

fn path() -> impl Strategy<Value = String> {
    // Few distinct segments so pools and keys overlap often.
    proptest::collection::vec(
        prop_oneof![Just("a"), Just("b"), Just("ab"), Just("c")],
        1..4,
    )
    .prop_map(|segs| format!("/{}", segs.join("/")))
}

proptest! {
    /// The pool of a key is the longest pool path that covers it on a
    /// segment boundary (checked against a brute-force scan).
    #[test]
    fn pool_of_is_longest_covering_prefix(pools in proptest::collection::btree_set(path(), 0..6), key in path()) {
        let mut t = PoolTable::default();
        for p in &pools {
            let spec = PoolSpec { pathname: p.clone(), pool_type: Some(PoolType::Volatile), ..Default::default() };
            t.create(&spec, PoolType::Volatile, 1, 0).unwrap();
        }
        let expected = pools.iter().filter(|p| path_covers(p, &key)).max_by_key(|p| p.len());
        prop_assert_eq!(t.pool_of(&key).map(|p| &p.pathname), expected);
    }

    /// Shards are always in range, stable, and equal for keys that share an
    /// affinity key.
    #[test]
    fn shard_in_range_and_affinity_respected(shards in 1u32..64, a in "[a-z]{1,6}", n in 0u32..1000, m in 0u32..1000) {
        let mut t = PoolTable::default();
        let spec = PoolSpec {
            pathname: "/p".into(),
            pool_type: Some(PoolType::Volatile),
            affinity_set_regex: Some("/[a-z]+_[0-9]+_".into()),
            ..Default::default()
        };
        let r = PoolRouter::new(t.create(&spec, PoolType::Volatile, shards, 0).unwrap());
        let k1 = format!("/p/{a}_{n}_x{m}");
        let k2 = format!("/p/{a}_{n}_y");
        prop_assert!(r.shard_of(&k1) < shards);
        prop_assert_eq!(r.shard_of(&k1), r.shard_of(&k2));
        prop_assert_eq!(r.shard_of(&k1), r.shard_of(&k1.clone()));
    }

    /// validate_key accepts exactly the absolute paths with non-empty,
    /// control-free segments.
    #[test]
    fn key_validation_matches_definition(s in "[/a-z\\n]{0,12}") {
        let ok = s.starts_with('/') && s.len() > 1 && s[1..].split('/').all(|seg| !seg.is_empty()) && !s.contains('\n');
        prop_assert_eq!(validate_key(&s, 1024).is_ok(), ok, "{:?}", s);
    }
}

/// The SYSTOR'25 affinity-grouping paper's Table 1 keys (fixture file next
/// to this test): each key maps to the listed affinity key.
#[test]
fn systor_table1_affinity_keys() {
    let text = include_str!("data/affinity_table1.tsv");
    let mut rows = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 4, "bad fixture line {line:?}");
        let (pool, regex, key, affinity) = (cols[0], cols[1], cols[2], cols[3]);
        let mut t = PoolTable::default();
        let spec = PoolSpec {
            pathname: pool.into(),
            pool_type: Some(PoolType::Volatile),
            affinity_set_regex: (regex != "-").then(|| regex.to_string()),
            ..Default::default()
        };
        let r = PoolRouter::new(t.create(&spec, PoolType::Volatile, 8, 0).unwrap());
        assert_eq!(r.affinity_key(key), affinity, "{key} with {regex}");
        rows += 1;
    }
    assert_eq!(rows, 5);
}
