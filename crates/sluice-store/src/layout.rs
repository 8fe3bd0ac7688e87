use serde::{Deserialize, Serialize};
use sluice_types::PoolType;
use std::fmt;

/// Which shard: (pool type, subgroup index, shard index), as in Cascade's
/// layout where each pool type has subgroups and each subgroup has shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShardId {
    pub pool_type: PoolType,
    pub subgroup: u32,
    pub shard: u32,
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.pool_type, self.subgroup, self.shard)
    }
}

/// The shard layout: for each pool type, the shard count of each subgroup.
/// A single node hosts every shard; the cluster issue assigns members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Layout {
    pub version: u64,
    /// Shard counts of the volatile subgroups, by subgroup index.
    pub volatile: Vec<u32>,
    /// Shard counts of the trigger subgroups, by subgroup index.
    pub trigger: Vec<u32>,
    /// Shard counts of the persistent subgroups, by subgroup index.
    pub persistent: Vec<u32>,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            version: 1,
            volatile: vec![1],
            trigger: vec![1],
            persistent: vec![],
        }
    }
}

impl Layout {
    pub fn subgroups(&self, t: PoolType) -> &[u32] {
        match t {
            PoolType::Volatile => &self.volatile,
            PoolType::Trigger => &self.trigger,
            PoolType::Persistent => &self.persistent,
        }
    }

    pub fn shards_of(&self, t: PoolType, subgroup: u32) -> Option<u32> {
        self.subgroups(t).get(subgroup as usize).copied()
    }

    pub fn all_shards(&self) -> Vec<ShardId> {
        let mut out = Vec::new();
        for t in [PoolType::Volatile, PoolType::Trigger, PoolType::Persistent] {
            for (sg, n) in self.subgroups(t).iter().enumerate() {
                for s in 0..*n {
                    out.push(ShardId {
                        pool_type: t,
                        subgroup: sg as u32,
                        shard: s,
                    });
                }
            }
        }
        out
    }

    /// Rejects layouts with a subgroup of zero shards, naming it.
    pub fn validate(&self) -> Result<(), String> {
        for t in [PoolType::Volatile, PoolType::Trigger, PoolType::Persistent] {
            for (sg, n) in self.subgroups(t).iter().enumerate() {
                if *n == 0 || *n > 4096 {
                    return Err(format!(
                        "layout.{t}[{sg}] has {n} shards; a subgroup has 1 to 4096 shards"
                    ));
                }
            }
        }
        Ok(())
    }
}
