//! What a client knows about a cluster: nodes, each shard's members and
//! leader hints, and its session's newest version per shard; plus a pool
//! of connections per node.

use crate::conn::Conn;
use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use serde::Deserialize;
use sluice_types::cluster::NodeSpec;
use sluice_types::{PoolType, Result, SluiceError};
use sluice_wire::{Request, Response};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Connections to one node: `n` pipelined connections used round-robin,
/// each reconnected on demand.
pub(crate) struct NodePool {
    pub(crate) addr: SocketAddr,
    slots: Vec<ArcSwapOption<Conn>>,
    reconnect: tokio::sync::Mutex<()>,
    rr: AtomicUsize,
    name: String,
    connect_timeout: Duration,
}

impl NodePool {
    pub(crate) fn new(addr: SocketAddr, n: usize, name: &str, connect_timeout: Duration) -> Self {
        NodePool {
            addr,
            slots: (0..n.max(1)).map(|_| ArcSwapOption::empty()).collect(),
            reconnect: tokio::sync::Mutex::new(()),
            rr: AtomicUsize::new(0),
            name: name.to_string(),
            connect_timeout,
        }
    }

    pub(crate) fn fill(&self, i: usize, c: Arc<Conn>) {
        self.slots[i].store(Some(c));
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// A live connection, reconnecting a dead slot on demand.
    pub(crate) async fn conn(&self) -> Result<Arc<Conn>> {
        let i = self.rr.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        if let Some(c) = self.slots[i].load_full() {
            if c.is_alive() {
                return Ok(c);
            }
        }
        let _g = self.reconnect.lock().await;
        if let Some(c) = self.slots[i].load_full() {
            if c.is_alive() {
                return Ok(c);
            }
        }
        let c = Conn::connect(self.addr, &self.name, self.connect_timeout).await?;
        self.slots[i].store(Some(c.clone()));
        Ok(c)
    }

    pub(crate) async fn call(&self, req: &Request, timeout: Duration) -> Result<Response> {
        self.conn().await?.call(req, timeout).await
    }
}

#[derive(Deserialize)]
struct ShardInfo {
    members: Vec<u32>,
    leader: Option<u64>,
}

#[derive(Deserialize)]
struct Info {
    epoch: u64,
    nodes: Vec<NodeSpec>,
    shards: HashMap<String, ShardInfo>,
    trigger: Vec<Vec<Vec<u32>>>,
    meta_leader: Option<u64>,
}

/// A shard as the client routes to it.
pub(crate) struct ShardView {
    pub(crate) name: String,
    pub(crate) members: Vec<u32>,
}

/// A snapshot of the cluster as some node described it.
pub(crate) struct ClusterView {
    pub(crate) epoch: u64,
    pub(crate) nodes: HashMap<u32, SocketAddr>,
    /// Every shard (replicated and trigger): its name (`volatile/0/1`)
    /// and members, built once so routing a request allocates nothing.
    shards: HashMap<(PoolType, u32, u32), ShardView>,
    /// Last known leader of each shard (`meta` for the metadata group).
    pub(crate) leaders: Mutex<HashMap<String, u32>>,
    /// The newest version this session has seen per shard: reads never
    /// go back in time.
    pub(crate) seen: Mutex<HashMap<String, u64>>,
}

impl ClusterView {
    pub(crate) fn parse(json: &str) -> Result<ClusterView> {
        let i: Info = serde_json::from_str(json)
            .map_err(|e| SluiceError::protocol(format!("bad cluster info: {e}")))?;
        let mut leaders: HashMap<String, u32> = i
            .shards
            .iter()
            .filter_map(|(k, s)| s.leader.map(|l| (k.clone(), l as u32)))
            .collect();
        if let Some(l) = i.meta_leader {
            leaders.insert("meta".into(), l as u32);
        }
        let mut shards = HashMap::new();
        for (name, info) in i.shards {
            let mut parts = name.split('/');
            let t = match parts.next() {
                Some("volatile") => PoolType::Volatile,
                Some("persistent") => PoolType::Persistent,
                _ => continue,
            };
            let (Some(Ok(g)), Some(Ok(s))) = (
                parts.next().map(str::parse::<u32>),
                parts.next().map(str::parse::<u32>),
            ) else {
                continue;
            };
            shards.insert(
                (t, g, s),
                ShardView {
                    name,
                    members: info.members,
                },
            );
        }
        for (g, sg) in i.trigger.into_iter().enumerate() {
            for (s, members) in sg.into_iter().enumerate() {
                let (g, s) = (g as u32, s as u32);
                let name = format!("{}/{g}/{s}", PoolType::Trigger);
                shards.insert((PoolType::Trigger, g, s), ShardView { name, members });
            }
        }
        Ok(ClusterView {
            epoch: i.epoch,
            nodes: i.nodes.iter().map(|n| (n.id, n.address)).collect(),
            shards,
            leaders: Mutex::new(leaders),
            seen: Mutex::default(),
        })
    }

    /// The shard's name and members (`None`: not in the layout).
    pub(crate) fn shard(&self, t: PoolType, subgroup: u32, shard: u32) -> Option<&ShardView> {
        self.shards.get(&(t, subgroup, shard))
    }

    pub(crate) fn leader(&self, shard: &str) -> Option<u32> {
        self.leaders.lock().get(shard).copied()
    }

    pub(crate) fn set_leader(&self, shard: &str, node: u32) {
        let mut l = self.leaders.lock();
        match l.get_mut(shard) {
            Some(e) => *e = node,
            None => {
                l.insert(shard.to_string(), node);
            }
        }
    }

    pub(crate) fn saw(&self, shard: &str, version: u64) {
        if version == sluice_types::VERSION_NONE {
            return;
        }
        let mut s = self.seen.lock();
        match s.get_mut(shard) {
            Some(e) => *e = (*e).max(version),
            None => {
                s.insert(shard.to_string(), version);
            }
        }
    }

    pub(crate) fn seen(&self, shard: &str) -> Option<u64> {
        self.seen.lock().get(shard).copied()
    }
}
