//! Key -> shard routing, shared by the client (which routes) and the server
//! (which checks the client routed correctly).

use crate::pool::PoolMeta;
use regex::Regex;

/// 64-bit FNV-1a. Stable across processes, versions and platforms, which a
/// placement hash must be (std's SipHash is randomly keyed per process).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A pool's compiled routing policy. Build once per pool, reuse per key.
#[derive(Clone, Debug)]
pub struct PoolRouter {
    pub pool: PoolMeta,
    affinity: Option<Regex>,
}

impl PoolRouter {
    /// Compiles the pool's affinity regex. Pools are validated at creation,
    /// so a regex that no longer compiles (a table written by another build)
    /// degrades to whole-key hashing rather than failing every request.
    pub fn new(pool: PoolMeta) -> Self {
        let affinity = pool
            .affinity_set_regex
            .as_deref()
            .and_then(|r| Regex::new(r).ok());
        PoolRouter { pool, affinity }
    }

    /// The affinity key: the first match of the pool's regex, or the whole
    /// key when the pool has no regex or it does not match.
    pub fn affinity_key<'k>(&self, key: &'k str) -> &'k str {
        match &self.affinity {
            Some(re) => re.find(key).map_or(key, |m| m.as_str()),
            None => key,
        }
    }

    /// The shard that owns `key`: a pinned location, else the hash of the
    /// affinity key modulo the pool's shard count.
    pub fn shard_of(&self, key: &str) -> u32 {
        if let Some(s) = self.pool.object_locations.get(key) {
            return *s;
        }
        let n = u64::from(self.pool.shard_count.max(1));
        (fnv1a64(self.affinity_key(key).as_bytes()) % n) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{PoolSpec, PoolTable, PoolType};

    fn router(regex: Option<&str>, shards: u32) -> PoolRouter {
        let mut t = PoolTable::default();
        let spec = PoolSpec {
            pathname: "/positions".into(),
            pool_type: Some(PoolType::Volatile),
            affinity_set_regex: regex.map(str::to_string),
            object_locations: [("/positions/pinned".to_string(), 3)].into(),
            ..Default::default()
        };
        PoolRouter::new(t.create(&spec, PoolType::Volatile, shards, 0).unwrap())
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn affinity_groups_related_keys() {
        let r = router(Some("/[a-zA-Z0-9]+_[0-9]+_"), 16);
        assert_eq!(r.affinity_key("/positions/little3_7_42"), "/little3_7_");
        assert_eq!(
            r.shard_of("/positions/little3_7_42"),
            r.shard_of("/positions/little3_7_99")
        );
        assert_eq!(r.affinity_key("/positions/nomatch"), "/positions/nomatch");
        assert_eq!(r.shard_of("/positions/pinned"), 3);
    }

    #[test]
    fn no_regex_hashes_whole_key() {
        let r = router(None, 8);
        let k = "/positions/x";
        assert_eq!(r.shard_of(k), (fnv1a64(k.as_bytes()) % 8) as u32);
    }
}
