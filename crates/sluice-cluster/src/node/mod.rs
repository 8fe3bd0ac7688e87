//! A node's side of the cluster: the replication groups it is a member
//! of, the write and read paths through them, membership changes, status,
//! and fault injection.
//!
//! Where things are: `groups` (starting, snapshotting and restarting a
//! group, incoming consensus messages), `write` (batched proposals,
//! forwarding to the leader), `read` (read checks and barriers), `meta`
//! (pool table changes, purges, metadata catch-up), `admin` (status,
//! membership changes, fault injection, peers' internal operations),
//! `broadcast` (large objects to many nodes along topology-ordered chains),
//! `failover` (an election at once when a leader's process is gone); this
//! file holds the node, its settings, routing to a group, and what it
//! tells clients (`info`, `status`).

mod admin;
pub mod broadcast;
mod core;
mod dirs;
mod failover;
mod groups;
mod meta;
mod read;
mod rs;
#[cfg(test)]
mod tests;
mod write;

use self::core::{Core, CoreError};
use write::Batcher;

use crate::log::{LogOptions, LogStore};
use crate::network::Peers;
use crate::sm::{MetaCell, MetaState, Sm};
use crate::types::{
    group_name, group_of, parse_shard, shard_of_group, Applied, Command, MetaCommand, MetaEntry,
    META_GROUP,
};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sluice_store::{ShardId, Store};
use sluice_types::cluster::ClusterLayout;
use sluice_types::{PoolType, PurgeReport, PutResult, ReqId, SluiceError, Trace};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Cluster settings of one node (`[cluster]` in the node's config).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// The cluster layout file (TOML: nodes, and per pool type the
    /// subgroups' shards with their member node ids). Unset: standalone.
    pub layout: Option<PathBuf>,
    /// Leader heartbeat interval.
    pub heartbeat_ms: u64,
    /// A follower that hears no leader for a random time in this range
    /// starts an election (how fast a dead leader is replaced).
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// When a connection with a group's leader closes and nothing listens
    /// at its address any more (its process died), elect a new leader at
    /// once instead of waiting for the timers above (`node/failover.rs`).
    /// A leader that is alive but unreachable is left to the timers.
    pub fast_failover: bool,
    /// Consensus messages of this many bytes or more (entries with large
    /// values, snapshot and broadcast chunks) go to a peer on a second
    /// connection, so small ones never queue behind them on the wire.
    /// 0: one connection per peer for everything.
    pub peer_bulk_bytes: usize,
    /// How long a write may wait to be committed before the client gets
    /// `Unavailable` (e.g. the shard lost its majority).
    pub write_timeout_ms: u64,
    /// How long `add-member` waits for a newcomer to catch up with the
    /// shard's log (or its snapshot) before it gives up on promoting it:
    /// the newcomer stays a learner, and `add-member` again promotes it
    /// once it has caught up (raft-rs groups).
    pub catch_up_wait_ms: u64,
    /// Take a snapshot (and drop older log entries) every this many entries...
    pub snapshot_every: u64,
    /// ... or once the entries held since the last one exceed this many
    /// bytes (bounds a shard's log memory with large values). raft-rs
    /// groups snapshot sooner: once the log holds more than four times
    /// the last snapshot's size, or 32 MiB if that is larger
    /// (`DriverSettings::snapshot_min_bytes`).
    pub snapshot_bytes: u64,
    /// Where volatile shards keep their consensus log and snapshots.
    /// Default: a RAM-backed directory (/dev/shm) when it has room, so
    /// volatile data survives a process crash but costs no disk writes;
    /// else the data directory.
    pub volatile_dir: Option<PathBuf>,
    /// fsync the consensus log of persistent shards before acknowledging.
    /// Not a setting of its own: a node sets it from `[persistent] sync`
    /// (anything but `never` syncs).
    #[serde(skip)]
    pub sync_persistent: bool,
    /// Accept `cluster cut/heal/disk-full` (dropping links to chosen peers,
    /// failing synced log writes as on a full disk). Tests only.
    pub fault_injection: bool,
    /// The file holding the key cluster peers authenticate with. Default:
    /// `cluster.key` next to the layout file (made by the first node that
    /// starts when missing).
    pub key_file: Option<PathBuf>,
    /// TLS to peers: set by the server from its `[tls]` (not a setting of
    /// its own).
    #[serde(skip)]
    pub peer_tls: Option<sluice_tls::ClientTls>,
    /// Bandwidth of this node's outgoing broadcast chunks in MB/s (0: no
    /// limit): every chunk it sends, on any link, shares it, as a network
    /// interface's would (`sluice bench broadcast`).
    pub broadcast_egress_mbps: u64,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            layout: None,
            heartbeat_ms: 50,
            election_min_ms: 200,
            election_max_ms: 400,
            fast_failover: true,
            peer_bulk_bytes: crate::network::BULK_BYTES,
            write_timeout_ms: 3000,
            catch_up_wait_ms: 600_000,
            snapshot_every: 10_000,
            snapshot_bytes: 256 << 20,
            volatile_dir: None,
            sync_persistent: true,
            fault_injection: false,
            key_file: None,
            peer_tls: None,
            broadcast_egress_mbps: 0,
        }
    }
}

/// One replication group hosted here.
pub struct Group {
    pub id: u64,
    pub(crate) core: Core,
    sm: Sm,
    log: LogStore,
    /// Puts waiting to be proposed together (see `ClusterNode::propose_write`).
    batch: parking_lot::Mutex<Batcher>,
    /// AppendEntries this member received from its leaders.
    appends_received: AppendCounts,
}

impl Group {
    /// Group `id` on its consensus core, state machine and log.
    fn new(id: u64, core: Core, sm: Sm, log: LogStore) -> Arc<Group> {
        Arc::new(Group {
            id,
            core,
            sm,
            log,
            batch: Default::default(),
            appends_received: Default::default(),
        })
    }
}

/// Appends received from the leader (raft-rs's `MsgAppend`): with
/// entries, and without (a new commit index that no entries carried).
#[derive(Default)]
pub(crate) struct AppendCounts {
    with_entries: std::sync::atomic::AtomicU64,
    without: std::sync::atomic::AtomicU64,
}

impl AppendCounts {
    fn count(&self, empty: bool) {
        let c = if empty {
            &self.without
        } else {
            &self.with_entries
        };
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.with_entries.load(Relaxed), self.without.load(Relaxed))
    }
}

/// This node's membership in the cluster.
pub struct ClusterNode {
    id: u32,
    layout: ClusterLayout,
    settings: ClusterSettings,
    data_dir: PathBuf,
    /// Where volatile shards' logs live (see `ClusterSettings::volatile_dir`),
    /// decided once at start, and locked like the data directory: two
    /// processes on one log would overwrite each other's entries.
    volatile_root: PathBuf,
    _volatile_lock: sluice_log::DirLock,
    /// The cluster key peers authenticate with (see `cluster_key`).
    key: String,
    store: Arc<Store>,
    peers: Arc<Peers>,
    meta: Arc<MetaCell>,
    groups: RwLock<HashMap<u64, Arc<Group>>>,
    creating: tokio::sync::Mutex<()>,
    /// Groups being started on a peer's first raft-rs message (one start
    /// at a time per group, whatever else the peer sends meanwhile).
    starting: parking_lot::Mutex<BTreeSet<u64>>,
    /// For lambdas' puts, which run on plain threads.
    runtime: tokio::runtime::Handle,
    /// Request ids of this node's own forwarded writes (`client` is random
    /// per process, so a restarted node never reuses one).
    writer_id: u64,
    writer_seq: std::sync::atomic::AtomicU64,
    /// This node itself, for tasks it spawns (set once by `start`).
    me: std::sync::OnceLock<std::sync::Weak<ClusterNode>>,
    /// Broadcasts in progress here and the objects they delivered.
    bcast: broadcast::Broadcasts,
    /// Faults every synced consensus log of this node injects (nodes
    /// started with `fault_injection`): `Admin::DiskFull` fills the disk.
    disk_faults: Arc<std::sync::Mutex<sluice_log::Faults>>,
    /// Peers whose death this node is acting on (`failover`).
    taking_over: parking_lot::Mutex<std::collections::HashSet<u32>>,
    /// Members of trigger shards a forwarded trigger put could not reach,
    /// and when (`forward_trigger_put`: tried last for a while).
    unreached: parking_lot::Mutex<HashMap<u32, std::time::Instant>>,
    /// When a refused handshake of each claimed peer was last logged.
    refusals_logged: parking_lot::Mutex<HashMap<u32, std::time::Instant>>,
    /// The metadata log index whose data flow graphs this node's engine
    /// runs (set by the server's graph reconciler; `dfgs_reconciled`).
    dfgs_reconciled: std::sync::atomic::AtomicU64,
    /// Where raft-rs groups' messages go (made with the first such group).
    rs_transport: std::sync::OnceLock<Arc<crate::raftrs::transport::PeerTransport>>,
}

fn unavailable(reason: String) -> SluiceError {
    SluiceError::Unavailable { reason }
}

impl ClusterNode {
    /// Starts (or restarts) this node's groups: the metadata group, every
    /// shard the layout or its own disk says it is a member of. The lowest
    /// numbered member of a group that was never initialised initialises it.
    pub async fn start(
        id: u32,
        layout: ClusterLayout,
        settings: ClusterSettings,
        data_dir: PathBuf,
        store: Arc<Store>,
    ) -> Result<Arc<ClusterNode>, SluiceError> {
        layout
            .validate()
            .map_err(|reason| SluiceError::Internal { reason })?;
        if layout.address_of(id).is_none() {
            return Err(SluiceError::Internal {
                reason: format!("node id {id} is not in the layout's [[nodes]]"),
            });
        }
        let key = cluster_key(&settings)?;
        let volatile_root = dirs::volatile_root(&settings, &data_dir);
        let volatile_lock = sluice_log::DirLock::acquire(
            &volatile_root,
            &format!("sluice node {id}, data dir {}", data_dir.display()),
        )
        .map_err(|e| SluiceError::Internal {
            reason: format!("volatile log directory: {e}"),
        })?;
        dirs::pair(&volatile_root, &data_dir)?;
        for o in dirs::sweep_orphans(&volatile_root) {
            tracing::warn!(
                root = %o.root.display(),
                data_dir = %o.data_dir.display(),
                freed_mib = format!("{:.1}", o.bytes as f64 / (1u64 << 20) as f64),
                "removed the volatile logs of a data directory that no longer exists"
            );
        }
        let node = Arc::new(ClusterNode {
            id,
            volatile_root,
            _volatile_lock: volatile_lock,
            meta: Arc::new(MetaCell::new(MetaState::from_layout(&layout))),
            peers: Arc::new(Peers::new(
                id,
                Duration::from_millis(500),
                key.clone(),
                settings.peer_tls.clone(),
            )),
            key,
            layout,
            settings,
            data_dir,
            store,
            groups: RwLock::default(),
            creating: tokio::sync::Mutex::new(()),
            starting: Default::default(),
            runtime: tokio::runtime::Handle::current(),
            writer_id: sluice_types::fnv1a64(
                format!(
                    "{id}-{}-{:?}",
                    std::process::id(),
                    std::time::SystemTime::now()
                )
                .as_bytes(),
            ),
            writer_seq: std::sync::atomic::AtomicU64::new(1),
            me: std::sync::OnceLock::new(),
            taking_over: Default::default(),
            unreached: Default::default(),
            refusals_logged: Default::default(),
            dfgs_reconciled: Default::default(),
            bcast: Default::default(),
            disk_faults: Arc::default(),
            rs_transport: Default::default(),
        });
        let _ = node.me.set(Arc::downgrade(&node));
        node.peers.set_bulk_bytes(node.settings.peer_bulk_bytes);
        let weak = Arc::downgrade(&node);
        node.peers.on_connection_lost(move |peer| {
            if let Some(n) = weak.upgrade() {
                n.peer_connection_lost(peer);
            }
        });
        node.check_layout_step().await?;
        let mut wanted: BTreeSet<u64> = BTreeSet::from([META_GROUP]);
        for (g, members) in node.meta.read().members.clone() {
            if members.contains(&id) {
                wanted.insert(g);
            }
        }
        let roots = [node.data_dir.join("raft"), node.volatile_root.clone()];
        // Groups this node joined at runtime (membership changes) have a
        // directory but are not in the layout file.
        for e in roots
            .iter()
            .filter_map(|r| std::fs::read_dir(r).ok())
            .flat_map(|rd| rd.flatten())
        {
            let name = e.file_name().to_string_lossy().replace('-', "/");
            if let Some(g) = parse_shard(&name).ok().and_then(group_of) {
                wanted.insert(g);
            }
        }
        for g in wanted {
            // raft-rs groups start from the layout's members.
            node.ensure_group(g).await?;
        }
        Ok(node)
    }
    /// Is this shard replicated (volatile and persistent shards are)?
    pub fn replicates(&self, shard: ShardId) -> bool {
        group_of(shard).is_some()
    }

    fn members_of(&self, g: u64) -> Vec<u32> {
        self.meta
            .read()
            .members
            .get(&g)
            .cloned()
            .unwrap_or_default()
    }

    fn local(&self, shard: ShardId) -> Result<Arc<Group>, SluiceError> {
        let g = group_of(shard).ok_or_else(|| SluiceError::Internal {
            reason: format!("shard {shard} is not replicated"),
        })?;
        self.local_group(g)
    }

    fn local_group(&self, g: u64) -> Result<Arc<Group>, SluiceError> {
        let not_member = || SluiceError::NotMember {
            shard: group_name(g),
            node: self.id,
            members: self.members_of(g),
        };
        let group = self.groups.read().get(&g).cloned().ok_or_else(not_member)?;
        if !group.core.has_member(u64::from(self.id)) {
            return Err(not_member());
        }
        Ok(group)
    }

    fn not_leader(&self, g: u64, leader: Option<u64>) -> SluiceError {
        let leader = leader.map(|l| l as u32).filter(|l| *l != self.id);
        let leader_address = leader
            .and_then(|l| self.layout.address_of(l))
            .map(|a| a.to_string());
        SluiceError::NotLeader {
            shard: group_name(g),
            node: self.id,
            hint: match (&leader, &leader_address) {
                (Some(l), Some(a)) => format!("the leader is node {l} at {a}"),
                _ => "no leader known yet: an election may be in progress or the shard has no quorum; retry".into(),
            },
            leader,
            leader_address,
        }
    }

    fn check_leader(&self, g: &Group) -> Result<(), SluiceError> {
        let leader = self.leader_of(g);
        if leader != Some(u64::from(self.id)) {
            return Err(self.not_leader(g.id, leader));
        }
        Ok(())
    }

    /// The group's leader as this node knows it. A leader cut off from
    /// its peers steps down on its own within an election timeout
    /// (raft-rs's check-quorum), so clients move on to other members.
    fn leader_of(&self, g: &Group) -> Option<u64> {
        g.core.leader()
    }

    /// How many nodes the layout names (this one included).
    pub fn node_count(&self) -> usize {
        self.layout.nodes.len()
    }

    /// The metadata epoch: bumped by every replicated pool or membership
    /// change this node has applied.
    pub fn epoch(&self) -> u64 {
        self.meta.read().epoch
    }

    /// Whether `key` is this cluster's key (constant time: a client
    /// cannot learn it byte by byte from timings).
    /// Whether a refused peer handshake claiming to be `node` is to be
    /// logged now: once every `REFUSAL_LOG_EVERY` per claimed node (a
    /// node with another key tries again and again).
    pub fn log_refused_peer(&self, node: u32) -> bool {
        // Claims of ids the layout does not have share one slot: anyone
        // may send a handshake, and one per id would grow the map (and
        // the log) without bound.
        let slot = match self.layout.address_of(node) {
            Some(_) => node,
            None => u32::MAX,
        };
        let mut last = self.refusals_logged.lock();
        match last.get(&slot) {
            Some(t) if t.elapsed() < crate::network::REFUSAL_LOG_EVERY => false,
            _ => {
                last.insert(slot, std::time::Instant::now());
                true
            }
        }
    }

    pub fn peer_key_matches(&self, key: &str) -> bool {
        let (a, b) = (self.key.as_bytes(), key.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
    /// What clients route by: nodes, each replicated shard's members and
    /// (where this node knows it) leader, and the metadata epoch.
    pub fn info(&self) -> serde_json::Value {
        let groups = self.groups.read();
        let meta = self.meta.read();
        let leader = |g: u64| groups.get(&g).and_then(|x| self.leader_of(x));
        let shards: serde_json::Map<String, serde_json::Value> = meta
            .members
            .iter()
            .map(|(g, m)| (group_name(*g), json!({"members": m, "leader": leader(*g)})))
            .collect();
        json!({
            "node": self.id,
            "epoch": meta.epoch,
            "nodes": self.layout.nodes,
            "shards": shards,
            "trigger": self.layout.subgroups.trigger.iter().map(|sg| &sg.shards).collect::<Vec<_>>(),
            "meta_leader": leader(META_GROUP),
        })
    }

    /// Every group hosted here: role, term, leader, log and applied
    /// positions, and (on a leader) each follower's lag in entries.
    pub fn status(&self) -> serde_json::Value {
        let groups = self.groups.read();
        let mut ids: Vec<u64> = groups.keys().copied().collect();
        ids.sort_unstable();
        let list: Vec<serde_json::Value> =
            ids.iter().map(|g| self.group_status(&groups[g])).collect();
        let conns: Vec<serde_json::Value> = self
            .peers
            .connections()
            .into_iter()
            .map(|(node, bulk)| json!({"node": node, "lane": if bulk { "bulk" } else { "small" }}))
            .collect();
        json!({
            "node": self.id,
            "epoch": self.epoch(),
            "cut": self.peers.blocked(),
            "peer_connections": conns,
            "peers_refusing_key": self.peers.refusing(),
            "groups": list,
        })
    }

    /// One group's line of `status`.
    fn group_status(&self, x: &Group) -> serde_json::Value {
        let leader = self.leader_of(x);
        let version = shard_of_group(x.id)
            .and_then(|s| self.store.shard(s))
            .map(|s| s.last_version());
        let (built, installed) = x.sm.snapshot_counts();
        let appends = x.appends_received.get();
        let me = u64::from(self.id);
        let handle = &x.core.handle;
        let st = handle.borrow_status().clone();
        let last = x.log.bounds().last;
        // How far each follower's log is behind the leader's. A stopped
        // member knows neither its leader (`Core::leader`) nor this (what
        // it last saw would mislead).
        let lag: BTreeMap<String, u64> = handle
            .matched()
            .into_iter()
            .filter(|(n, _)| *n != me && st.stopped.is_none())
            .map(|(n, matched)| (n.to_string(), last.saturating_sub(matched)))
            .collect();
        let m = &st.members;
        json!({
            "group": group_name(x.id),
            "snapshots_built": built,
            "snapshots_installed": installed,
            "snapshot_bytes": x.sm.snapshot_bytes(),
            "leader": leader,
            "voters": x.core.voters(),
            "applied_index": x.sm.applied_index(),
            "applied_version": version,
            "appends_with_entries": appends.0,
            "appends_without_entries": appends.1,
            "consensus": "raft-rs",
            "snapshot_index": x.sm.snapshot_index(),
            "role": match (&st.stopped, st.is_leader, st.leader) {
                (Some(_), ..) => "shutdown",
                (None, true, _) => "leader",
                // Taken out of the group: it keeps its copy.
                _ if !m.contains(me) && !m.voters.is_empty() => "removed",
                _ if m.learners.contains(&me) => "learner",
                (None, false, Some(_)) => "follower",
                // No leader known: an election is under way.
                (None, false, None) => "candidate",
            },
            "learners": m.learners,
            "stopped": st.stopped,
            "term": st.term,
            "last_log_index": last,
            "commit_index": st.commit,
            "lag": lag,
            // On a leader: members it counts as down, which take no share
            // of the lambdas dispatched to one member (`raftrs/down.rs`).
            "down": st.down,
            // Started with nothing, it holds back its vote until caught up
            // (`raftrs/lost.rs`): `lost_state` "hold" or "vote_only" then,
            // "no" otherwise.
            "state_lost": st.lost != crate::raftrs::LostState::No,
            "lost_state": st.lost.as_str(),
            "peer_messages_dropped": handle.peer_messages_dropped(),
        })
    }

    /// Stops every group (graceful shutdown).
    pub async fn shutdown(&self) {
        let groups: Vec<Arc<Group>> = self.groups.read().values().cloned().collect();
        for g in groups {
            g.core.shutdown().await;
        }
    }
}

/// Lambdas' puts to replicated shards go through the shard's leader.
impl sluice_compute::Writer for ClusterNode {
    fn put(
        &self,
        key: &str,
        value: bytes::Bytes,
        trace: Option<Arc<Trace>>,
    ) -> Option<Result<PutResult, SluiceError>> {
        let shard = match self.store.shard_id_of(key, None) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        if !self.replicates(shard) {
            return None;
        }
        let fut = self.write_anywhere(shard, key.to_string(), value, trace.map(|t| (*t).clone()));
        Some(self.block_for_upcall("a replicated put (use write_anywhere)", fut))
    }

    fn trigger_put(
        &self,
        key: &str,
        value: bytes::Bytes,
        trace: Option<Arc<Trace>>,
        origin: Option<sluice_types::ObjectMeta>,
    ) -> Option<Result<u64, SluiceError>> {
        let shard = match self.store.shard_id_of(key, None) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        if shard.pool_type != PoolType::Trigger {
            return None;
        }
        let members = self.trigger_members(shard);
        if members.is_empty() || members.contains(&self.id) {
            return None;
        }
        let req = sluice_wire::Request::TriggerPut {
            key: key.to_string(),
            shard: Some(shard.shard),
            value,
            trace: trace.map(|t| (*t).clone()),
            origin,
        };
        let fut = self.forward_trigger_put(&members, key, &req);
        Some(self.block_for_upcall("a forwarded trigger put", fut))
    }
}

impl ClusterNode {
    /// The members the layout gives a trigger shard (not replicated, so not
    /// in the metadata group's table).
    fn trigger_members(&self, shard: ShardId) -> Vec<u32> {
        self.layout
            .subgroups
            .trigger
            .get(shard.subgroup as usize)
            .and_then(|sg| sg.shards.get(shard.shard as usize))
            .cloned()
            .unwrap_or_default()
    }

    /// Runs `fut` for a lambda: upcalls run on plain threads, so this one
    /// blocks, not the runtime (called from the runtime, it is an error).
    fn block_for_upcall<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, SluiceError>>,
    ) -> Result<T, SluiceError> {
        match tokio::runtime::Handle::try_current() {
            Ok(_) => Err(SluiceError::Internal {
                reason: format!("{what} from inside the async runtime"),
            }),
            Err(_) => self.runtime.block_on(fut),
        }
    }
}

/// A lambda's read of a key on a replicated shard this node is not a
/// member of goes to the shard's members (the leader it knows first, then
/// the others), as a client's read would.
impl sluice_compute::Reader for ClusterNode {
    fn get(
        &self,
        key: &str,
        at: sluice_compute::ReadAt,
    ) -> Option<Result<Arc<sluice_types::Object>, SluiceError>> {
        let shard = match self.store.shard_id_of(key, None) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        let g = group_of(shard)?;
        let members = self.members_of(g);
        if members.contains(&self.id) {
            return None; // this node's replica
        }
        let cached = self.bcast.received.read().get(key).cloned();
        if let Some(c) = cached {
            match at {
                sluice_compute::ReadAt::Version(v) if v == c.meta.version => return Some(Ok(c)),
                sluice_compute::ReadAt::Latest => {
                    // A broadcast copy serves the latest read while a
                    // member says no newer version exists (a small
                    // question, not the object again).
                    let ask = self.latest_version_remote(g, members.clone(), key.to_string());
                    if self.block_for_upcall("a version check", ask).ok() == Some(c.meta.version) {
                        return Some(Ok(c));
                    }
                }
                _ => {}
            }
        }
        let fut = self.read_remote(g, members, key.to_string(), shard.shard, at, false);
        Some(self.block_for_upcall("a lambda's remote read", fut))
    }

    fn holds(&self, key: &str) -> bool {
        match self.store.shard_id_of(key, None).ok().and_then(group_of) {
            Some(g) => self.members_of(g).contains(&self.id),
            None => true,
        }
    }
}

/// Which member runs a lambda dispatched to one member (`one`): members
/// split keys by hash, so each key's upcall runs once per shard; those
/// the write's leader counted as down take no share (`raftrs/down.rs`).
impl sluice_compute::Membership for ClusterNode {
    fn position(&self, shard: ShardId) -> Option<(usize, usize)> {
        let g = group_of(shard);
        let members = match g {
            Some(g) => self.members_of(g),
            None => self.trigger_members(shard),
        };
        if !members.contains(&self.id) {
            return Some((0, 1));
        }
        let split = |down: &[u32]| {
            let mut up = members.iter().filter(|m| !down.contains(m));
            let n = up.clone().count();
            up.position(|m| *m == self.id).map(|i| (i, n))
        };
        // Called as a write is delivered, on the thread applying it: the
        // state machine holds the entry's list of members down meanwhile.
        let groups = self.groups.read();
        match g.and_then(|g| groups.get(&g)) {
            Some(group) => group.sm.with_down(split),
            None => split(&[]),
        }
    }
}

/// The key cluster peers authenticate with: `[cluster] key_file`, else
/// `cluster.key` next to the layout file, created (32 random bytes, hex,
/// mode 0600) by the first node that starts when missing. Every node of a
/// cluster must have the same file (copy it with the layout).
fn cluster_key(settings: &ClusterSettings) -> Result<String, SluiceError> {
    let path = match (&settings.key_file, &settings.layout) {
        (Some(k), _) => k.clone(),
        (None, Some(l)) => l
            .parent()
            .map_or_else(|| PathBuf::from("cluster.key"), |d| d.join("cluster.key")),
        (None, None) => {
            return Err(SluiceError::Internal {
                reason: "a cluster node needs a key: set [cluster] key_file or layout".into(),
            })
        }
    };
    let err = |what: &str, e: std::io::Error| SluiceError::Io {
        reason: format!("{what} the cluster key {}: {e}", path.display()),
    };
    if !path.exists() {
        use std::os::unix::fs::OpenOptionsExt;
        let hex = dirs::random_hex(32).map_err(|e| err("making", e))?;
        // Written aside, then linked into place: a node starting at the
        // same time reads a whole key or makes its own link fail.
        let tmp = path.with_extension(format!("key.{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| err("writing", e))?;
        std::io::Write::write_all(&mut f, format!("{hex}\n").as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| err("writing", e))?;
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                tracing::info!(file = %path.display(), "created the cluster key; copy it to every node with the layout")
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err("creating", e)),
        }
    }
    let key = std::fs::read_to_string(&path).map_err(|e| err("reading", e))?;
    let key = key.trim().to_string();
    if key.len() < 16 {
        return Err(SluiceError::Internal {
            reason: format!(
                "the cluster key in {} is too short ({} characters; at least 16)",
                path.display(),
                key.len()
            ),
        });
    }
    Ok(key)
}
