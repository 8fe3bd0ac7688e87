//! Object pools: path prefixes with a type, a placement and a policy.

use crate::error::{Result, SluiceError};
use crate::key::{path_covers, validate_key};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// How a pool keeps its objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolType {
    /// Latest version of each key, in memory.
    Volatile,
    /// Every version, on disk (issue "Persistent pools").
    Persistent,
    /// Nothing stored: a put only fires lambdas and watchers.
    Trigger,
}

impl PoolType {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolType::Volatile => "volatile",
            PoolType::Persistent => "persistent",
            PoolType::Trigger => "trigger",
        }
    }
}

impl fmt::Display for PoolType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PoolType {
    /// `s` as the type of the pool at `pool` (named in the error).
    pub fn parse_for(pool: &str, s: &str) -> Result<Self> {
        match s {
            "volatile" => Ok(PoolType::Volatile),
            "persistent" => Ok(PoolType::Persistent),
            "trigger" => Ok(PoolType::Trigger),
            other => Err(SluiceError::InvalidPool {
                pool: pool.to_string(),
                reason: format!("unknown pool type {other:?}; use volatile, persistent or trigger"),
            }),
        }
    }
}

/// How keys map to shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardingPolicy {
    /// hash(affinity key or key) mod shard count.
    #[default]
    Hash,
}

/// Kept for the formats that carry it (pool tables, replicated pool
/// changes): always empty. Access to a pool is not a setting of the pool
/// but rules per principal or role (`sluice policy set access ... --pool`,
/// enforced by every node); a pool created with a `mode` is refused, as it
/// would have promised a protection it does not give.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessPolicy {
    #[serde(default)]
    pub mode: String,
}

/// How much history a persistent pool keeps. The newest version of every
/// key is always kept; older ones go when any limit says so.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Keep at most this many versions per key.
    #[serde(default)]
    pub keep_versions: Option<u32>,
    /// Keep versions written in the last this-many seconds.
    #[serde(default)]
    pub keep_for_s: Option<u64>,
    /// Keep versions while the newer versions of their key hold at most
    /// this many bytes (a stream's payload budget per source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_bytes: Option<u64>,
}

impl std::fmt::Display for Retention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.keep_versions {
            parts.push(format!("{n} versions per key"));
        }
        if let Some(s) = self.keep_for_s {
            parts.push(format!("versions of the last {s} s"));
        }
        if let Some(b) = self.keep_bytes {
            parts.push(format!("{b} bytes per key"));
        }
        if parts.is_empty() {
            f.write_str("keeps every version")
        } else {
            write!(f, "keeps {}", parts.join(", "))
        }
    }
}

impl Retention {
    /// A policy from optional limits; `None` when no limit is set (every
    /// version kept).
    pub fn of(
        keep_versions: Option<u32>,
        keep_for_s: Option<u64>,
        keep_bytes: Option<u64>,
    ) -> Option<Retention> {
        (keep_versions.is_some() || keep_for_s.is_some() || keep_bytes.is_some()).then_some(
            Retention {
                keep_versions,
                keep_for_s,
                keep_bytes,
            },
        )
    }

    /// Whether a version with `newer` newer versions of its key (holding
    /// `newer_bytes` with it), written at `timestamp_us`, is kept at time
    /// `now_us`.
    pub fn keeps(&self, newer: usize, newer_bytes: u64, timestamp_us: u64, now_us: u64) -> bool {
        self.keep_versions.is_none_or(|n| newer < n as usize)
            && self.keep_bytes.is_none_or(|b| newer_bytes <= b)
            && self
                .keep_for_s
                .is_none_or(|s| timestamp_us.saturating_add(s.saturating_mul(1_000_000)) >= now_us)
    }
}

/// What a user asks for when creating a pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    pub pathname: String,
    pub pool_type: Option<PoolType>,
    #[serde(default)]
    pub subgroup_index: u32,
    #[serde(default)]
    pub affinity_set_regex: Option<String>,
    /// Pinned keys: key -> shard index.
    #[serde(default)]
    pub object_locations: BTreeMap<String, u32>,
    #[serde(default)]
    pub access_policy: AccessPolicy,
    /// Persistent pools only: how much history to keep (default: all).
    #[serde(default)]
    pub retention: Option<Retention>,
}

/// A pool as the pool table holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMeta {
    pub pathname: String,
    pub pool_type: PoolType,
    pub subgroup_index: u32,
    pub sharding_policy: ShardingPolicy,
    /// Number of shards of the pool's subgroup at creation.
    pub shard_count: u32,
    pub affinity_set_regex: Option<String>,
    pub object_locations: BTreeMap<String, u32>,
    pub access_policy: AccessPolicy,
    /// How much history a persistent pool keeps.
    #[serde(default)]
    pub retention: Option<Retention>,
    pub deleted: bool,
    /// Pool table version at which this pool was created.
    pub creation_version: u64,
    pub creation_timestamp_us: u64,
}

impl PoolMeta {
    /// The pool as users read it (`pools show --json`, Python's
    /// `get_object_pool`): its fields, less the always-empty
    /// `access_policy` (access is given by `sluice policy` rules).
    pub fn to_json(&self) -> serde_json::Value {
        let mut j = serde_json::to_value(self).unwrap_or_default();
        if self.access_policy.mode.is_empty() {
            if let Some(m) = j.as_object_mut() {
                m.remove("access_policy");
            }
        }
        j
    }
}

/// The pools a fresh node creates: `/vol` (volatile) and `/trig` (trigger).
pub fn default_pools() -> Vec<PoolSpec> {
    [("/vol", PoolType::Volatile), ("/trig", PoolType::Trigger)]
        .into_iter()
        .map(|(path, t)| PoolSpec {
            pathname: path.into(),
            pool_type: Some(t),
            ..Default::default()
        })
        .collect()
}

/// Checks a pool spec against the layout: the pool's subgroup must exist and
/// pinned locations must name existing shards. `shards_of_subgroup` returns
/// the number of shards of a (type, subgroup) or None when there is no such
/// subgroup.
pub fn validate_spec(
    spec: &PoolSpec,
    max_key_bytes: usize,
    shards_of_subgroup: impl Fn(PoolType, u32) -> Option<u32>,
) -> Result<(PoolType, u32)> {
    let invalid = |reason: String| SluiceError::InvalidPool {
        pool: spec.pathname.clone(),
        reason,
    };
    validate_key(&spec.pathname, max_key_bytes).map_err(|e| invalid(e.to_string()))?;
    let pool_type = spec
        .pool_type
        .ok_or_else(|| invalid("pool_type is required".into()))?;
    if !spec.access_policy.mode.is_empty() {
        return Err(invalid(format!(
            "access_policy mode {:?} is not a pool setting in Sluice: access is given by rules per principal or role, e.g. `sluice policy set access NAME --who alice --pool {} --allow read` (README: Security); leave access_policy out",
            spec.access_policy.mode, spec.pathname
        )));
    }
    if let Some(re) = &spec.affinity_set_regex {
        regex::Regex::new(re)
            .map_err(|e| invalid(format!("affinity_set_regex {re:?} does not compile: {e}")))?;
    }
    if let Some(r) = &spec.retention {
        if pool_type != PoolType::Persistent {
            return Err(invalid(format!(
                "retention applies to persistent pools; {pool_type} pools keep no history"
            )));
        }
        if r.keep_versions == Some(0) {
            return Err(invalid(
                "retention.keep_versions must be at least 1 (the newest version is always kept)"
                    .into(),
            ));
        }
    }
    let shards = shards_of_subgroup(pool_type, spec.subgroup_index).ok_or_else(|| {
        invalid(format!(
            "the layout has no {pool_type} subgroup {}",
            spec.subgroup_index
        ))
    })?;
    for (key, shard) in &spec.object_locations {
        validate_key(key, max_key_bytes).map_err(|e| invalid(format!("object_locations: {e}")))?;
        if !path_covers(&spec.pathname, key) {
            return Err(invalid(format!(
                "object_locations key {key:?} is outside the pool"
            )));
        }
        if *shard >= shards {
            return Err(invalid(format!(
                "object_locations pins {key:?} to shard {shard}, but the subgroup has {shards} shards"
            )));
        }
    }
    Ok((pool_type, shards))
}

/// What purging a removed pool deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeReport {
    /// Keys deleted (counted once per shard replica that held them).
    pub keys: u64,
    /// Versions deleted: every version of a persistent pool's keys, one
    /// per key elsewhere.
    pub versions: u64,
    /// Bytes of history segments given back to the file system.
    pub bytes: u64,
}

impl std::ops::AddAssign for PurgeReport {
    fn add_assign(&mut self, o: PurgeReport) {
        self.keys += o.keys;
        self.versions += o.versions;
        self.bytes += o.bytes;
    }
}

/// The pool table: every pool ever created, deleted ones included.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolTable {
    /// Bumped by every create and remove.
    pub version: u64,
    pub pools: BTreeMap<String, PoolMeta>,
}

impl PoolTable {
    /// The pool of a key: the longest pool path that covers it. A deleted
    /// pool still resolves (so the error can say it is deleted).
    pub fn pool_of(&self, key: &str) -> Option<&PoolMeta> {
        // Walk the key's own prefixes from longest to shortest: O(depth) lookups.
        let mut end = key.len();
        loop {
            if let Some(p) = self.pools.get(&key[..end]) {
                return Some(p);
            }
            match key[..end].rfind('/') {
                Some(0) | None => return None,
                Some(i) => end = i,
            }
        }
    }

    /// Like `pool_of`, but a missing or deleted pool is an error naming the key.
    pub fn live_pool_of(&self, key: &str) -> Result<&PoolMeta> {
        match self.pool_of(key) {
            None => Err(SluiceError::NoPool {
                key: key.to_string(),
            }),
            Some(p) if p.deleted => Err(SluiceError::PoolDeleted {
                pool: p.pathname.clone(),
                key: key.to_string(),
            }),
            Some(p) => Ok(p),
        }
    }

    pub fn get(&self, path: &str) -> Option<&PoolMeta> {
        self.pools.get(path)
    }

    pub fn list(&self, include_deleted: bool) -> Vec<PoolMeta> {
        self.pools
            .values()
            .filter(|p| include_deleted || !p.deleted)
            .cloned()
            .collect()
    }

    /// Inserts a new pool (or revives a deleted one at the same path).
    pub fn create(
        &mut self,
        spec: &PoolSpec,
        pool_type: PoolType,
        shard_count: u32,
        now_us: u64,
    ) -> Result<PoolMeta> {
        match self.pools.get(&spec.pathname) {
            Some(existing) if !existing.deleted => {
                return Err(SluiceError::PoolExists {
                    pool: spec.pathname.clone(),
                })
            }
            // A new pool starts empty: the removed pool's objects are still
            // stored under this path until they are purged.
            Some(_) => {
                return Err(SluiceError::InvalidPool {
                    pool: spec.pathname.clone(),
                    reason: format!(
                        "a removed pool at this path still holds its objects; `sluice pools purge {}` deletes them for good, then the path is free",
                        spec.pathname
                    ),
                })
            }
            None => {}
        }
        self.version += 1;
        let meta = PoolMeta {
            pathname: spec.pathname.clone(),
            pool_type,
            subgroup_index: spec.subgroup_index,
            sharding_policy: ShardingPolicy::Hash,
            shard_count,
            affinity_set_regex: spec.affinity_set_regex.clone(),
            object_locations: spec.object_locations.clone(),
            access_policy: spec.access_policy.clone(),
            retention: spec.retention.clone(),
            deleted: false,
            creation_version: self.version,
            creation_timestamp_us: now_us,
        };
        self.pools.insert(spec.pathname.clone(), meta.clone());
        Ok(meta)
    }

    /// What purging the removed pool at `path` deletes: its metadata and
    /// the paths of the other pools inside it, whose keys stay (a key
    /// belongs to the longest pool path that covers it).
    pub fn purge_scope(&self, path: &str) -> Result<(PoolMeta, Vec<String>)> {
        let p = self
            .pools
            .get(path)
            .ok_or_else(|| SluiceError::PoolNotFound {
                pool: path.to_string(),
            })?;
        if !p.deleted {
            return Err(SluiceError::InvalidPool {
                pool: path.to_string(),
                reason: format!(
                    "the pool is live; remove it first (`sluice pools rm {path}`), then purge it"
                ),
            });
        }
        let inner = self
            .pools
            .keys()
            .filter(|q| q.as_str() != path && path_covers(path, q))
            .cloned()
            .collect();
        Ok((p.clone(), inner))
    }

    /// Drops a removed pool from the table once its objects are purged:
    /// the path is free for a new pool.
    pub fn purge(&mut self, path: &str) -> Result<PoolMeta> {
        let (meta, _) = self.purge_scope(path)?;
        self.pools.remove(path);
        self.version += 1;
        Ok(meta)
    }

    /// Soft delete: the pool stays in the table with `deleted = true`.
    pub fn remove(&mut self, path: &str) -> Result<PoolMeta> {
        match self.pools.get_mut(path) {
            Some(p) if !p.deleted => {
                p.deleted = true;
                let out = p.clone();
                self.version += 1;
                Ok(out)
            }
            _ => Err(SluiceError::PoolNotFound {
                pool: path.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(paths: &[&str]) -> PoolTable {
        let mut t = PoolTable::default();
        for p in paths {
            let spec = PoolSpec {
                pathname: p.to_string(),
                pool_type: Some(PoolType::Volatile),
                ..Default::default()
            };
            t.create(&spec, PoolType::Volatile, 1, 0).unwrap();
        }
        t
    }

    #[test]
    fn longest_prefix_wins_on_segment_boundaries() {
        let t = table(&["/a", "/a/b", "/ab"]);
        assert_eq!(t.pool_of("/a/x").unwrap().pathname, "/a");
        assert_eq!(t.pool_of("/a/b/x").unwrap().pathname, "/a/b");
        assert_eq!(t.pool_of("/a/bc").unwrap().pathname, "/a");
        assert_eq!(t.pool_of("/ab/x").unwrap().pathname, "/ab");
        assert!(t.pool_of("/zz/x").is_none());
    }

    #[test]
    fn deleted_pool_is_reported_and_can_be_recreated() {
        let mut t = table(&["/a"]);
        t.remove("/a").unwrap();
        let e = t.live_pool_of("/a/k").unwrap_err();
        assert!(matches!(e, SluiceError::PoolDeleted { .. }), "{e}");
        assert!(matches!(
            t.remove("/a"),
            Err(SluiceError::PoolNotFound { .. })
        ));
        assert_eq!(t.list(false).len(), 0);
        assert_eq!(t.list(true).len(), 1);
        let spec = PoolSpec {
            pathname: "/a".into(),
            pool_type: Some(PoolType::Volatile),
            ..Default::default()
        };
        // Its objects are still stored: a new pool there is refused until
        // they are purged.
        let e = t.create(&spec, PoolType::Volatile, 1, 5).unwrap_err();
        assert!(e.to_string().contains("sluice pools purge /a"), "{e}");
        t.purge("/a").unwrap();
        assert!(t.get("/a").is_none());
        assert!(matches!(
            t.purge("/a"),
            Err(SluiceError::PoolNotFound { .. })
        ));
        let p = t.create(&spec, PoolType::Volatile, 1, 5).unwrap();
        assert!(!p.deleted);
        assert_eq!(p.creation_version, 4);
        assert!(matches!(
            t.create(&spec, PoolType::Volatile, 1, 5),
            Err(SluiceError::PoolExists { .. })
        ));
    }

    #[test]
    fn purge_takes_removed_pools_only_and_spares_pools_inside() {
        let mut t = table(&["/a", "/a/b", "/ab"]);
        let e = t.purge("/a").unwrap_err();
        assert!(e.to_string().contains("the pool is live"), "{e}");
        t.remove("/a").unwrap();
        let (meta, inner) = t.purge_scope("/a").unwrap();
        assert_eq!(meta.pathname, "/a");
        assert_eq!(inner, vec!["/a/b".to_string()]);
    }

    #[test]
    fn spec_validation_names_the_problem() {
        let shards = |t: PoolType, sg: u32| (t != PoolType::Persistent && sg == 0).then_some(2);
        let mut spec = PoolSpec {
            pathname: "/p".into(),
            pool_type: Some(PoolType::Persistent),
            ..Default::default()
        };
        let e = validate_spec(&spec, 1024, shards).unwrap_err();
        assert!(e.to_string().contains("no persistent subgroup 0"), "{e}");
        spec.pool_type = Some(PoolType::Volatile);
        spec.affinity_set_regex = Some("([".into());
        assert!(validate_spec(&spec, 1024, shards)
            .unwrap_err()
            .to_string()
            .contains("does not compile"));
        spec.affinity_set_regex = None;
        spec.subgroup_index = 3;
        assert!(validate_spec(&spec, 1024, shards)
            .unwrap_err()
            .to_string()
            .contains("no volatile subgroup 3"));
        spec.subgroup_index = 0;
        spec.object_locations.insert("/p/k".into(), 2);
        assert!(validate_spec(&spec, 1024, shards)
            .unwrap_err()
            .to_string()
            .contains("has 2 shards"));
        spec.object_locations.clear();
        spec.object_locations.insert("/q/k".into(), 0);
        assert!(validate_spec(&spec, 1024, shards)
            .unwrap_err()
            .to_string()
            .contains("outside the pool"));
        spec.object_locations.clear();
        // A per-pool access mode was taken and did nothing: the pool was
        // as open as any other.
        spec.access_policy.mode = "private".into();
        let e = validate_spec(&spec, 1024, shards).unwrap_err().to_string();
        assert!(
            e.contains("access_policy mode \"private\"") && e.contains("sluice policy set access"),
            "{e}"
        );
        spec.access_policy.mode.clear();
        spec.pathname = "p".into();
        assert!(validate_spec(&spec, 1024, shards)
            .unwrap_err()
            .to_string()
            .contains("start with '/'"));
    }
}
