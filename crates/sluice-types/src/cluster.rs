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

/// Where a node listens: `host:port`, the host an IP address
/// (`10.0.0.7`, `[fd00::7]`) or a name (`sluice-0.sluice`, a Compose
/// service). Clients and peers look a name up each time they connect
/// (`sluice_client::resolve`; nothing here does I/O), so a node that comes
/// back at another IP address (a Kubernetes pod restarted) is found there.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeAddr(String);

impl NodeAddr {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn port(&self) -> u16 {
        // Checked when made.
        self.0
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or(0)
    }

    /// The host, when it is a name (not an IP address): what a TLS
    /// certificate must name.
    pub fn host_name(&self) -> Option<&str> {
        match self.ip() {
            Some(_) => None,
            None => self.0.rsplit_once(':').map(|(h, _)| h),
        }
    }

    /// The address written as an IP address, if it is one.
    pub fn ip(&self) -> Option<SocketAddr> {
        self.0.parse().ok()
    }

    /// What a node with this address listens on (without `--listen`):
    /// the IP address itself; for a name, every interface at its port,
    /// `[::]`, which a node binds for IPv6 and IPv4 both (the name is
    /// another machine's to give: a Kubernetes Service, a Compose
    /// network, an IPv6-only cluster's DNS).
    pub fn listen_addr(&self) -> SocketAddr {
        self.ip()
            .unwrap_or_else(|| SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, self.port())))
    }
}

impl std::str::FromStr for NodeAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("address {s:?}: expected a host and a port (10.0.0.7:7420, [fd00::7]:7420, sluice-0.sluice:7420)")
        };
        if s.parse::<SocketAddr>().is_ok() {
            return Ok(NodeAddr(s.to_string()));
        }
        let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
        port.parse::<u16>().map_err(|_| bad())?;
        let name_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        if !name_ok {
            return Err(bad());
        }
        Ok(NodeAddr(s.to_string()))
    }
}

impl From<SocketAddr> for NodeAddr {
    fn from(a: SocketAddr) -> Self {
        NodeAddr(a.to_string())
    }
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for NodeAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for NodeAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub id: u32,
    pub address: NodeAddr,
    /// A name for people (e.g. the worker a plan chose).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Topology and other labels (`tier`, `zone`, `rack`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
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
            if !addrs.insert(n.address.clone()) {
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

    pub fn address_of(&self, id: u32) -> Option<NodeAddr> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .map(|n| n.address.clone())
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
    fn node_addresses_are_ip_addresses_or_host_names_with_a_port() {
        for ok in [
            "10.0.0.7:7420",
            "[fd00::7]:7420",
            "sluice-0.sluice:7420",
            "localhost:1",
        ] {
            let a: NodeAddr = ok.parse().unwrap();
            assert_eq!(a.to_string(), ok);
        }
        assert_eq!(
            "sluice-0.sluice:7421".parse::<NodeAddr>().unwrap().port(),
            7421
        );
        for bad in ["sluice-0", ":7420", "host:port", "a b:1", "host:70000"] {
            let e = bad.parse::<NodeAddr>().unwrap_err();
            assert!(e.contains("expected a host and a port"), "{bad}: {e}");
        }
        let e = ClusterLayout::from_text(
            "[[nodes]]\nid = 1\naddress = \"sluice-0\"\n[[subgroups.volatile]]\nshards = [[1]]\n",
        )
        .unwrap_err();
        assert!(e.contains("expected a host and a port"), "{e}");
        let l = ClusterLayout::from_text(
            "[[nodes]]\nid = 1\naddress = \"localhost:7420\"\n[[subgroups.volatile]]\nshards = [[1]]\n",
        )
        .unwrap();
        assert_eq!(l.nodes[0].address.host_name(), Some("localhost"));
        assert_eq!(l.nodes[0].address.listen_addr().to_string(), "[::]:7420");
        let ip: NodeAddr = "10.0.0.7:7420".parse().unwrap();
        assert_eq!(
            (ip.host_name(), ip.listen_addr().to_string()),
            (None, "10.0.0.7:7420".into())
        );
        let json = serde_json::to_string(&l.nodes[0]).unwrap();
        assert_eq!(serde_json::from_str::<NodeSpec>(&json).unwrap(), l.nodes[0]);
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
