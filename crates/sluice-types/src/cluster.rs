//! The cluster layout and member selection: what `sluice serve --cluster`
//! loads and `sluice-cluster` builds its replication groups from.
//!
//! A layout names the nodes and, per pool type, the subgroups and their
//! shards, each shard a list of member node ids (Cascade's layout.json
//! `reserved_node_ids_by_shard`):
//!
//! ```toml
//! [[nodes]]
//! id = 0
//! address = "127.0.0.1:7420"
//!
//! [[subgroups.volatile]]
//! shards = [[0, 1, 2], [1, 2, 3]]
//! ```

use crate::routing::fnv1a64;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub id: u32,
    #[serde(deserialize_with = "ip_and_port")]
    pub address: SocketAddr,
    /// A name for people (e.g. the worker a plan chose).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Topology and other labels (`tier`, `zone`, `rack`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A node's address: an IP address and a port. A host name says so
/// (the TOML parser's "invalid socket address syntax" did not).
fn ip_and_port<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    if !d.is_human_readable() {
        // Binary encodings (bincode) carry it as serde encodes it.
        return SocketAddr::deserialize(d);
    }
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "address {s:?}: expected an IP address and a port (10.0.0.7:7420, [fd00::7]:7420); host names are not resolved, so give each node's IP address"
        ))
    })
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubgroupSpec {
    /// Member node ids of each shard.
    pub shards: Vec<Vec<u32>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subgroups {
    #[serde(default)]
    pub volatile: Vec<SubgroupSpec>,
    #[serde(default)]
    pub persistent: Vec<SubgroupSpec>,
    #[serde(default)]
    pub trigger: Vec<SubgroupSpec>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterLayout {
    #[serde(default = "one")]
    pub version: u64,
    /// The consensus driver of the replication groups (the shards' and
    /// the metadata group's). Every node of a cluster reads it from the
    /// same layout, so all agree.
    #[serde(default, skip_serializing_if = "Consensus::is_default")]
    pub consensus: Consensus,
    pub nodes: Vec<NodeSpec>,
    #[serde(default)]
    pub subgroups: Subgroups,
}

fn one() -> u64 {
    1
}

/// Which consensus library drives the replication groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Consensus {
    /// openraft, the driver before raft-rs, removed on 2026-11-28: a
    /// layout naming it is refused with a message saying so (`validate`).
    #[serde(rename = "openraft")]
    Openraft,
    /// TiKV's raft-rs, driven by one task per group (`sluice-cluster`'s
    /// `raftrs`): the default.
    #[default]
    #[serde(rename = "raft-rs")]
    RaftRs,
}

/// Why a layout with `consensus = "openraft"` is refused.
pub const OPENRAFT_REMOVED: &str = "consensus = \"openraft\": this Sluice runs every replication group on raft-rs; the openraft driver was removed (ARCHITECTURE.md, \"Consensus library\"). Drop the line; data directories openraft wrote cannot be opened by raft-rs, so such a cluster starts from empty ones";

impl Consensus {
    fn is_default(&self) -> bool {
        *self == Consensus::RaftRs
    }
}

impl ClusterLayout {
    /// Parses and validates a layout; errors name the offending entry.
    pub fn from_toml(text: &str) -> Result<ClusterLayout, String> {
        let l: ClusterLayout = toml::from_str(text).map_err(|e| e.to_string())?;
        l.validate()?;
        Ok(l)
    }

    /// A layout file's text: Sluice's TOML, or Cascade's `layout.json`
    /// (see `cascade_layout`; node `n` at 127.0.0.1:7420 + `n`: use
    /// `sluice layout import --base` for other addresses).
    pub fn from_text(text: &str) -> Result<ClusterLayout, String> {
        if crate::cascade_layout::is_cascade_json(text) {
            let base = SocketAddr::from(([127, 0, 0, 1], 7420));
            crate::cascade_layout::import(text, base)
                .map(|i| i.layout)
                .map_err(|e| format!("Cascade layout.json: {e}"))
        } else {
            Self::from_toml(text)
        }
    }

    /// The layout as TOML (what `from_toml` reads).
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string(self).map_err(|e| e.to_string())
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.consensus == Consensus::Openraft {
            return Err(OPENRAFT_REMOVED.into());
        }
        if self.nodes.is_empty() {
            return Err("nodes: a layout needs at least one node".into());
        }
        let mut ids = HashSet::new();
        let mut addrs = HashSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !ids.insert(n.id) {
                return Err(format!("nodes[{i}]: node id {} appears twice", n.id));
            }
            if !addrs.insert(n.address) {
                return Err(format!(
                    "nodes[{i}]: address {} is used by two nodes",
                    n.address
                ));
            }
        }
        for (kind, sgs) in [
            ("volatile", &self.subgroups.volatile),
            ("persistent", &self.subgroups.persistent),
            ("trigger", &self.subgroups.trigger),
        ] {
            for (g, sg) in sgs.iter().enumerate() {
                if sg.shards.is_empty() {
                    return Err(format!(
                        "subgroups.{kind}[{g}].shards: a subgroup needs at least one shard"
                    ));
                }
                for (s, members) in sg.shards.iter().enumerate() {
                    let at = format!("subgroups.{kind}[{g}].shards[{s}]");
                    if members.is_empty() {
                        return Err(format!("{at}: a shard needs at least one member"));
                    }
                    let mut seen = HashSet::new();
                    for m in members {
                        if !ids.contains(m) {
                            return Err(format!("{at}: node {m} is not in [[nodes]]"));
                        }
                        if !seen.insert(m) {
                            return Err(format!("{at}: node {m} is listed twice"));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    pub fn address_of(&self, id: u32) -> Option<SocketAddr> {
        self.nodes.iter().find(|n| n.id == id).map(|n| n.address)
    }

    /// Shards per subgroup, by pool type name, for the store's layout.
    pub fn shard_counts(&self) -> BTreeMap<&'static str, Vec<u32>> {
        let c = |v: &Vec<SubgroupSpec>| v.iter().map(|s| s.shards.len() as u32).collect();
        BTreeMap::from([
            ("volatile", c(&self.subgroups.volatile)),
            ("persistent", c(&self.subgroups.persistent)),
            ("trigger", c(&self.subgroups.trigger)),
        ])
    }
}

/// Which member of a shard a client sends a request to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberSelection {
    /// Rotate over the members (the default).
    RoundRobin,
    /// A random member per request.
    Random,
    /// A random member chosen once per client and shard, then kept.
    FixedRandom,
    FirstMember,
    LastMember,
    /// The member chosen by the key's hash: a key always goes to the same member.
    KeyHashing,
    /// This node, which must be a member.
    UserSpecified(u32),
}

/// Per-client state of member selection (round-robin counter, random
/// stream, fixed choices).
#[derive(Debug)]
pub struct Selector {
    counter: AtomicU64,
    rng: AtomicU64,
    /// FixedRandom choices, by shard identity.
    fixed: std::sync::Mutex<std::collections::HashMap<u64, usize>>,
}

impl Selector {
    pub fn new(seed: u64) -> Self {
        Selector {
            counter: AtomicU64::new(0),
            rng: AtomicU64::new(seed | 1),
            fixed: Default::default(),
        }
    }

    fn next_random(&self) -> u64 {
        // xorshift64*, advanced atomically.
        let mut x = self.rng.load(Ordering::Relaxed);
        loop {
            let mut y = x;
            y ^= y >> 12;
            y ^= y << 25;
            y ^= y >> 27;
            match self
                .rng
                .compare_exchange_weak(x, y, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return y.wrapping_mul(0x2545_F491_4F6C_DD1D),
                Err(cur) => x = cur,
            }
        }
    }

    /// Picks a member of `members` (a shard's member list, `shard_key`
    /// identifying the shard) for `key`.
    pub fn select(
        &self,
        policy: MemberSelection,
        members: &[u32],
        shard_key: u64,
        key: &str,
    ) -> Result<u32, String> {
        if members.is_empty() {
            return Err("the shard has no members".into());
        }
        let n = members.len();
        let i = match policy {
            MemberSelection::RoundRobin => {
                (self.counter.fetch_add(1, Ordering::Relaxed) % n as u64) as usize
            }
            MemberSelection::Random => (self.next_random() % n as u64) as usize,
            MemberSelection::FixedRandom => {
                let mut fixed = self.fixed.lock().unwrap_or_else(|p| p.into_inner());
                let pick = *fixed
                    .entry(shard_key)
                    .or_insert_with(|| (self.next_random() % n as u64) as usize);
                pick.min(n - 1)
            }
            MemberSelection::FirstMember => 0,
            MemberSelection::LastMember => n - 1,
            MemberSelection::KeyHashing => (fnv1a64(key.as_bytes()) % n as u64) as usize,
            MemberSelection::UserSpecified(id) => {
                return members.contains(&id).then_some(id).ok_or_else(|| {
                    format!("node {id} is not a member of this shard (members {members:?})")
                });
            }
        };
        Ok(members[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_name_for_an_address_says_what_is_expected() {
        let e = ClusterLayout::from_text(
            "[[nodes]]\nid = 1\naddress = \"sluice-0.sluice:7420\"\n[[subgroups.volatile]]\nshards = [[1]]\n",
        )
        .unwrap_err();
        assert!(e.contains("host names are not resolved"), "{e}");
        let spec = NodeSpec {
            id: 1,
            address: "10.0.0.7:7420".parse().unwrap(),
            name: None,
            labels: BTreeMap::new(),
        };
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<NodeSpec>(&json).unwrap(), spec);
    }

    const GOOD: &str = r#"
[[nodes]]
id = 0
address = "127.0.0.1:7420"
[[nodes]]
id = 1
address = "127.0.0.2:7420"
[[nodes]]
id = 2
address = "127.0.0.3:7420"

[[subgroups.volatile]]
shards = [[0, 1, 2], [1, 2]]
[[subgroups.trigger]]
shards = [[0], [1], [2]]
"#;

    #[test]
    fn parses_and_counts_shards() {
        let l = ClusterLayout::from_toml(GOOD).unwrap();
        assert_eq!(l.nodes.len(), 3);
        assert_eq!(l.shard_counts()["volatile"], vec![2]);
        assert_eq!(l.shard_counts()["trigger"], vec![3]);
        assert_eq!(l.address_of(1).unwrap().to_string(), "127.0.0.2:7420");
    }

    #[test]
    fn the_consensus_driver_is_raft_rs_and_a_layout_naming_openraft_is_refused() {
        let l = ClusterLayout::from_toml(GOOD).unwrap();
        assert_eq!(l.consensus, Consensus::RaftRs);
        assert!(!l.to_toml().unwrap().contains("consensus"));
        let named = ClusterLayout::from_toml(&format!("consensus = \"raft-rs\"\n{GOOD}")).unwrap();
        assert_eq!(named, l);
        // The driver before it is gone, and a layout naming it says so.
        let e = ClusterLayout::from_toml(&format!("consensus = \"openraft\"\n{GOOD}")).unwrap_err();
        assert!(e.contains("openraft driver was removed"), "{e}");
        let e = ClusterLayout::from_toml(&format!("consensus = \"paxos\"\n{GOOD}")).unwrap_err();
        assert!(e.contains("openraft") && e.contains("raft-rs"), "{e}");
    }

    #[test]
    fn validation_names_the_offending_entry() {
        let bad = |from: &str, to: &str| {
            ClusterLayout::from_toml(&GOOD.replacen(from, to, 1)).unwrap_err()
        };
        assert!(bad(
            "shards = [[0, 1, 2], [1, 2]]",
            "shards = [[0, 1, 2], [1, 7]]"
        )
        .contains("subgroups.volatile[0].shards[1]: node 7 is not in [[nodes]]"));
        assert!(bad("shards = [[0, 1, 2], [1, 2]]", "shards = [[0, 1, 1]]")
            .contains("subgroups.volatile[0].shards[0]: node 1 is listed twice"));
        assert!(bad("shards = [[0], [1], [2]]", "shards = [[0], []]")
            .contains("subgroups.trigger[0].shards[1]: a shard needs at least one member"));
        assert!(bad("id = 1", "id = 0").contains("nodes[1]: node id 0 appears twice"));
        assert!(
            bad("127.0.0.2:7420", "127.0.0.1:7420").contains("nodes[1]: address 127.0.0.1:7420")
        );
        assert!(bad("address = \"127.0.0.3:7420\"", "address = \"nowhere\"").contains("address"));
        assert!(bad("[[subgroups.trigger]]", "[[subgroups.trigger]]\nbogus = 1").contains("bogus"));
    }

    #[test]
    fn member_selection_policies() {
        let s = Selector::new(42);
        let m = [10, 11, 12];
        let rr: Vec<u32> = (0..6)
            .map(|_| s.select(MemberSelection::RoundRobin, &m, 0, "k").unwrap())
            .collect();
        assert_eq!(rr, vec![10, 11, 12, 10, 11, 12]);
        assert_eq!(
            s.select(MemberSelection::FirstMember, &m, 0, "k").unwrap(),
            10
        );
        assert_eq!(
            s.select(MemberSelection::LastMember, &m, 0, "k").unwrap(),
            12
        );
        let h = s
            .select(MemberSelection::KeyHashing, &m, 0, "/p/key")
            .unwrap();
        assert!((0..10).all(|_| s
            .select(MemberSelection::KeyHashing, &m, 0, "/p/key")
            .unwrap()
            == h));
        let f = s.select(MemberSelection::FixedRandom, &m, 7, "a").unwrap();
        assert!((0..10).all(|i| s
            .select(MemberSelection::FixedRandom, &m, 7, &i.to_string())
            .unwrap()
            == f));
        let spread: HashSet<u32> = (0..200)
            .map(|_| s.select(MemberSelection::Random, &m, 0, "k").unwrap())
            .collect();
        assert_eq!(spread.len(), 3, "random reaches every member");
        assert_eq!(
            s.select(MemberSelection::UserSpecified(11), &m, 0, "k")
                .unwrap(),
            11
        );
        assert!(s
            .select(MemberSelection::UserSpecified(99), &m, 0, "k")
            .unwrap_err()
            .contains("not a member"));
        assert!(s.select(MemberSelection::RoundRobin, &[], 0, "k").is_err());
    }
}
