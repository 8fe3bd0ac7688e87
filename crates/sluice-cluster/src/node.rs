//! A node's side of the cluster: the replication groups it is a member
//! of, the write and read paths through them, membership changes, status,
//! and fault injection.

use crate::log::{LogOptions, LogStore};
use crate::network::{dispatch, NetFactory, Peers};
use crate::sm::{MetaState, Sm};
use crate::types::{
    group_name, group_of, parse_shard, shard_of_group, Applied, Command, MetaCommand, Raft,
    META_GROUP,
};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, RaftMetrics, ServerState};
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
use tokio::sync::watch;

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
    /// How long a write may wait to be committed before the client gets
    /// `Unavailable` (e.g. the shard lost its majority).
    pub write_timeout_ms: u64,
    /// Take a snapshot (and drop older log entries) every this many entries...
    pub snapshot_every: u64,
    /// ... or once the entries held since the last one exceed this many
    /// bytes (bounds a shard's log memory with large values).
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
    /// Accept `cluster cut/heal` (dropping links to chosen peers). Tests only.
    pub fault_injection: bool,
    /// The file holding the key cluster peers authenticate with. Default:
    /// `cluster.key` next to the layout file (made by the first node that
    /// starts when missing).
    pub key_file: Option<PathBuf>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            layout: None,
            heartbeat_ms: 50,
            election_min_ms: 200,
            election_max_ms: 400,
            write_timeout_ms: 3000,
            snapshot_every: 10_000,
            snapshot_bytes: 256 << 20,
            volatile_dir: None,
            sync_persistent: true,
            fault_injection: false,
            key_file: None,
        }
    }
}

/// One replication group hosted here.
pub struct Group {
    pub id: u64,
    pub raft: Raft,
    metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
    sm: Sm,
    log: LogStore,
    /// When this node last asked for a snapshot because the log grew large.
    snapshot_asked: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Puts waiting to be proposed together (see `ClusterNode::propose_write`).
    batch: parking_lot::Mutex<Batcher>,
}

/// A put waiting for its turn, and where its result goes.
type Queued = (
    Command,
    tokio::sync::oneshot::Sender<Result<Applied, SluiceError>>,
);

/// Proposals of one group's puts. openraft writes (and, for persistent
/// shards, fsyncs) each proposal before it takes the next, so puts that
/// arrive while earlier ones are in flight wait here and then go as one
/// `Command::Batch`: one log entry, one fsync. At most
/// `BATCHES_IN_FLIGHT` proposers run; a put that finds them all busy is
/// left in the queue for them (they drain it before they stop).
#[derive(Default)]
struct Batcher {
    queue: std::collections::VecDeque<Queued>,
    proposers: usize,
}

/// Log bytes after which a persistent shard takes a snapshot (at most
/// `ClusterSettings::snapshot_bytes`).
const PERSISTENT_SNAPSHOT_BYTES: u64 = 64 << 20;

/// At most this many puts, or this many bytes of values, per batch (at
/// least one put goes). Large values gain nothing from sharing an entry
/// (1 MB puts at 16 clients: 0.73× redis `WAIT 2` with a 1 MiB cap, 0.36×
/// to 0.47× with 4 MiB, where batches of four 1 MB values went out as one
/// message).
const BATCH_PUTS: usize = 256;
const BATCH_BYTES: usize = 1 << 20;
/// Proposers at once: one being appended while another is replicated.
const BATCHES_IN_FLIGHT: usize = 2;

impl Batcher {
    /// Takes the puts at the head of the queue that fit one batch; with
    /// none left, this proposer stops (under the same lock as the check a
    /// new put makes, so no put is left without a proposer).
    fn take(&mut self) -> Vec<Queued> {
        let mut bytes = 0;
        let mut out = Vec::new();
        while let Some((cmd, _)) = self.queue.front() {
            let size = match cmd {
                Command::Write { key, value, .. } => {
                    key.len() + value.as_ref().map_or(0, |v| v.len())
                }
                _ => 0,
            };
            if !out.is_empty() && (out.len() >= BATCH_PUTS || bytes + size > BATCH_BYTES) {
                break;
            }
            bytes += size;
            out.extend(self.queue.pop_front());
        }
        if out.is_empty() {
            self.proposers -= 1;
        }
        out
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
    raft_cfg: Arc<openraft::Config>,
    store: Arc<Store>,
    peers: Arc<Peers>,
    meta: Arc<RwLock<MetaState>>,
    groups: RwLock<HashMap<u64, Arc<Group>>>,
    creating: tokio::sync::Mutex<()>,
    /// For lambdas' puts, which run on plain threads.
    runtime: tokio::runtime::Handle,
    /// Request ids of this node's own forwarded writes (`client` is random
    /// per process, so a restarted node never reuses one).
    writer_id: u64,
    writer_seq: std::sync::atomic::AtomicU64,
    /// This node itself, for tasks it spawns (set once by `start`).
    me: std::sync::OnceLock<std::sync::Weak<ClusterNode>>,
    /// When each group was last started again (`on_group_stopped`).
    restarts: parking_lot::Mutex<HashMap<u64, Vec<std::time::Instant>>>,
    /// Groups whose stop was asked for by fault injection, to be started
    /// again (tests of `on_group_stopped`).
    restart_requested: parking_lot::Mutex<std::collections::HashSet<u64>>,
}

/// How often a group stopped by openraft is started again, at most.
const RESTARTS_PER_MINUTE: usize = 3;

fn unavailable(reason: String) -> SluiceError {
    SluiceError::Unavailable { reason }
}

/// An admin command (`Request::Cluster`).
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Admin {
    Status,
    Info,
    AddMember {
        shard: String,
        node: u32,
    },
    RemoveMember {
        shard: String,
        node: u32,
    },
    Cut {
        peers: Vec<u32>,
    },
    Heal,
    /// Fault injection: stop this node's consensus core of `shard` as
    /// openraft stops one on its own bug (the node starts it again).
    StopGroup {
        shard: String,
    },
    /// Internal: record a shard's members (sent to the metadata leader).
    SetMembers {
        group: u64,
        members: Vec<u32>,
    },
    /// Internal: the metadata leader's read index (after confirming its
    /// leadership), so a lagging node can catch up before answering.
    MetaReadIndex,
    /// Internal: commit a time frontier after `timestamp_us` in `group`
    /// (sent to its leader); answers the frontier's log index.
    TimeBarrier {
        group: u64,
        timestamp_us: u64,
    },
    /// Internal: replicate a purge of a removed pool's keys in `group`
    /// (sent to its leader); answers what it deleted there.
    PurgeShard {
        group: u64,
        prefix: String,
        except: Vec<String>,
    },
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
        let raft_cfg = openraft::Config {
            cluster_name: "sluice".into(),
            heartbeat_interval: settings.heartbeat_ms,
            election_timeout_min: settings.election_min_ms,
            election_timeout_max: settings.election_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(settings.snapshot_every),
            // Keep some log behind a snapshot for followers slightly
            // behind; a newcomer further back gets the snapshot.
            max_in_snapshot_log_to_keep: (settings.snapshot_every / 2).min(256),
            ..Default::default()
        }
        .validate()
        .map_err(|e| SluiceError::Internal {
            reason: format!("cluster settings: {e}"),
        })?;
        let key = cluster_key(&settings)?;
        let volatile_root = volatile_root(&settings, &data_dir);
        let volatile_lock = sluice_log::DirLock::acquire(
            &volatile_root,
            &format!("sluice node {id}, data dir {}", data_dir.display()),
        )
        .map_err(|e| SluiceError::Internal {
            reason: format!("volatile log directory: {e}"),
        })?;
        let node = Arc::new(ClusterNode {
            id,
            volatile_root,
            _volatile_lock: volatile_lock,
            meta: Arc::new(RwLock::new(MetaState::from_layout(&layout))),
            peers: Arc::new(Peers::new(id, Duration::from_millis(500), key.clone())),
            key,
            layout,
            settings,
            data_dir,
            raft_cfg: Arc::new(raft_cfg),
            store,
            groups: RwLock::default(),
            creating: tokio::sync::Mutex::new(()),
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
            restarts: Default::default(),
            restart_requested: Default::default(),
        });
        let _ = node.me.set(Arc::downgrade(&node));
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
            let group = node.ensure_group(g).await?;
            let members: Vec<u32> = if g == META_GROUP {
                node.layout.nodes.iter().map(|n| n.id).collect()
            } else {
                node.meta
                    .read()
                    .members
                    .get(&g)
                    .cloned()
                    .unwrap_or_default()
            };
            if members.iter().min() == Some(&id)
                && !group.raft.is_initialized().await.unwrap_or(true)
            {
                let init: BTreeMap<u64, BasicNode> = members
                    .iter()
                    .filter_map(|m| {
                        node.layout
                            .address_of(*m)
                            .map(|a| (u64::from(*m), BasicNode::new(a)))
                    })
                    .collect();
                if let Err(e) = group.raft.initialize(init).await {
                    tracing::debug!(group = %group_name(g), error = %e, "initialise skipped");
                }
            }
        }
        Ok(node)
    }

    fn group_dir(&self, g: u64) -> PathBuf {
        let name = group_name(g).replace('/', "-");
        match shard_of_group(g) {
            Some(s) if s.pool_type == PoolType::Volatile => self.volatile_root.join(name),
            _ => self.data_dir.join("raft").join(name),
        }
    }

    /// Asks for a snapshot when a group's log holds more than
    /// `snapshot_bytes` (at most every 100 ms).
    fn maybe_snapshot(&self, g: &Group) {
        // A persistent shard's snapshot is small (its objects are the
        // history on disk): taking it often keeps each history fsync
        // short and lets the log's purged segments be recycled early.
        let limit = match shard_of_group(g.id) {
            Some(s) if s.pool_type == PoolType::Persistent => {
                self.settings.snapshot_bytes.min(PERSISTENT_SNAPSHOT_BYTES)
            }
            _ => self.settings.snapshot_bytes,
        };
        if g.log.held_bytes() <= limit {
            return; // the common case, one lock and a load
        }
        let mut asked = g.snapshot_asked.lock();
        if asked.is_some_and(|t| t.elapsed() < Duration::from_millis(100))
            || g.log
                .bytes_beyond(self.raft_cfg.max_in_snapshot_log_to_keep)
                <= limit
        {
            return;
        }
        *asked = Some(std::time::Instant::now());
        let raft = g.raft.clone();
        tokio::spawn(async move {
            let _ = raft.trigger().snapshot().await;
        });
    }

    /// The group, creating it (empty) when a leader first contacts this
    /// node about a group it just joined.
    async fn ensure_group(&self, g: u64) -> Result<Arc<Group>, SluiceError> {
        if let Some(x) = self.groups.read().get(&g) {
            return Ok(x.clone());
        }
        let _c = self.creating.lock().await;
        if let Some(x) = self.groups.read().get(&g) {
            return Ok(x.clone());
        }
        if g != META_GROUP {
            let s = shard_of_group(g)
                .filter(|s| self.store.shard(*s).is_some())
                .ok_or_else(|| SluiceError::protocol(format!("no such replication group {g}")))?;
            tracing::debug!(shard = %s, "opening replication group");
        }
        let dir = self.group_dir(g);
        let sync = shard_of_group(g).is_some_and(|s| s.pool_type == PoolType::Persistent)
            && self.settings.sync_persistent;
        let io = |e: std::io::Error| SluiceError::Io {
            reason: format!("opening the consensus log in {}: {e}", dir.display()),
        };
        // A persistent shard's log keeps its purged segments: the history
        // refers to the values in them.
        let keep = shard_of_group(g).is_some_and(|s| s.pool_type == PoolType::Persistent);
        let mapped = shard_of_group(g).is_some_and(|s| s.pool_type == PoolType::Volatile);
        let log = LogStore::open_with(
            &dir,
            LogOptions {
                sync,
                keep,
                mapped,
                faults: None,
            },
        )
        .map_err(io)?;
        let sm = Sm::open(
            g,
            self.store.clone(),
            self.meta.clone(),
            Some(dir.clone()),
            sync,
            Some(log.clone()),
        )
        .map_err(|e| SluiceError::Io {
            reason: format!("restoring the snapshot in {}: {e}", dir.display()),
        })?;
        let group = self.start_raft(g, log, sm).await?;
        self.groups.write().insert(g, group.clone());
        Ok(group)
    }

    /// Starts the consensus core of group `g` over its log and state
    /// machine, and a task that reports its leadership changes and
    /// watches for it to stop (see `on_group_stopped`).
    async fn start_raft(&self, g: u64, log: LogStore, sm: Sm) -> Result<Arc<Group>, SluiceError> {
        let raft = Raft::new(
            u64::from(self.id),
            self.raft_cfg.clone(),
            NetFactory {
                peers: self.peers.clone(),
                group: g,
            },
            log.clone(),
            sm.clone(),
        )
        .await
        .map_err(|e| SluiceError::Internal {
            reason: format!("starting replication group {}: {e}", group_name(g)),
        })?;
        let group = Arc::new(Group {
            id: g,
            metrics: raft.metrics(),
            raft,
            sm,
            log,
            snapshot_asked: parking_lot::Mutex::new(None),
            batch: Default::default(),
        });
        // Operators see leadership changes in the node's log (openraft's
        // own logging is off by default: it reports every failed RPC to a
        // dead peer).
        let mut m = group.raft.metrics();
        let me = u64::from(self.id);
        let node = self.me.get().cloned();
        let this = Arc::downgrade(&group);
        tokio::spawn(async move {
            let mut last: Option<(u64, Option<u64>)> = None;
            while m.changed().await.is_ok() {
                let (term, leader) = {
                    let x = m.borrow();
                    (x.current_term, x.current_leader)
                };
                if last != Some((term, leader)) {
                    match leader {
                        Some(l) if l == me => {
                            tracing::info!(group = %group_name(g), term, "this node is now the leader")
                        }
                        Some(l) => {
                            tracing::info!(group = %group_name(g), term, leader = l, "following a new leader")
                        }
                        None => {
                            tracing::info!(group = %group_name(g), term, "no leader: election in progress")
                        }
                    }
                    last = Some((term, leader));
                }
            }
            // The core has stopped (its metrics sender is gone).
            let why = m.borrow().running_state.clone();
            if let (Some(node), Some(old), Err(why)) =
                (node.and_then(|n| n.upgrade()), this.upgrade(), why)
            {
                node.on_group_stopped(old, why).await;
            }
        });
        Ok(group)
    }

    /// A group's consensus core stopped. openraft 0.9 stops a core with
    /// "replication channel closed" when, after a higher vote ended a
    /// replication stream, it hands that stream a snapshot to send: a bug
    /// of its own, nothing wrong with this node's disk. Such a group is
    /// started again on the same log and state machine (both intact in
    /// memory, as the stopped core left them), at most
    /// `RESTARTS_PER_MINUTE` times a minute. Any other stop (a failed
    /// disk write, a panic, a shutdown) stays: the node serves the group
    /// again only after a restart re-reads and checks its files.
    fn on_group_stopped(
        self: Arc<Self>,
        old: Arc<Group>,
        why: openraft::error::Fatal<u64>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        // Boxed: starting a group spawns the task that calls this.
        Box::pin(async move { self.restart_stopped(old, why).await })
    }

    async fn restart_stopped(&self, old: Arc<Group>, why: openraft::error::Fatal<u64>) {
        let g = old.id;
        let requested = self.restart_requested.lock().remove(&g);
        let openraft_bug = why.to_string().contains("replication channel closed");
        if !(openraft_bug || requested && matches!(why, openraft::error::Fatal::Stopped)) {
            if !matches!(why, openraft::error::Fatal::Stopped) {
                tracing::error!(group = %group_name(g), error = %why, "replication group stopped on this node; it serves again after a restart (check the disk: `sluice fsck`)");
            }
            return;
        }
        {
            let mut recent = self.restarts.lock();
            let times = recent.entry(g).or_default();
            times.retain(|t| t.elapsed() < Duration::from_secs(60));
            if times.len() >= RESTARTS_PER_MINUTE {
                tracing::error!(group = %group_name(g), error = %why, "replication group stopped again; not restarting it (more than {RESTARTS_PER_MINUTE} restarts in a minute)");
                return;
            }
            times.push(std::time::Instant::now());
        }
        tracing::warn!(group = %group_name(g), error = %why, "replication group stopped; starting it again on its log and state");
        match self.start_raft(g, old.log.clone(), old.sm.clone()).await {
            Ok(group) => {
                let mut gs = self.groups.write();
                if gs.get(&g).is_some_and(|x| Arc::ptr_eq(x, &old)) {
                    gs.insert(g, group);
                }
            }
            Err(e) => {
                tracing::error!(group = %group_name(g), error = %e, "could not start the replication group again")
            }
        }
    }

    /// Handles a consensus message from a peer.
    pub async fn handle_raft(
        &self,
        from: u32,
        group: u64,
        kind: u8,
        body: &bytes::Bytes,
    ) -> Result<bytes::Bytes, SluiceError> {
        if self.peers.is_blocked(from) {
            return Err(unavailable(format!(
                "link from node {from} is cut (fault injection)"
            )));
        }
        let g = self.ensure_group(group).await?;
        let r = dispatch(&g.raft, kind, body).await;
        // Followers bound their logs by bytes too (openraft's own policy
        // counts entries only): else they snapshot rarely, and a rare
        // persistent snapshot syncs a large history at once.
        self.maybe_snapshot(&g);
        r
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
        let in_config = group
            .metrics
            .borrow()
            .membership_config
            .membership()
            .get_node(&u64::from(self.id))
            .is_some();
        if !in_config {
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

    /// The group's leader as this node knows it, except that this node
    /// does not name itself unless a quorum acknowledged it within an
    /// election timeout (`election_max_ms`): a leader cut off from its
    /// peers, or one restarted with a vote of an old term, answers
    /// `NotLeader` without a hint so clients move on to other members.
    fn leader_of(&self, g: &Group) -> Option<u64> {
        let me = u64::from(self.id);
        let m = g.metrics.borrow();
        // On every write: no allocation, one short lock.
        let confirmed = m.current_leader != Some(me)
            || self.peers.acks.quorum_within(
                g.id,
                m.membership_config.membership().voter_ids(),
                me,
                Duration::from_millis(self.settings.election_max_ms),
            );
        m.current_leader.filter(|_| confirmed)
    }

    async fn propose(&self, g: &Group, cmd: Command) -> Result<Applied, SluiceError> {
        self.propose_at(g, cmd).await.map(|(_, a)| a)
    }

    /// `propose`, also returning the entry's log index.
    async fn propose_at(&self, g: &Group, cmd: Command) -> Result<(u64, Applied), SluiceError> {
        self.check_leader(g)?;
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        match tokio::time::timeout(t, g.raft.client_write(cmd)).await {
            Err(_) => Err(unavailable(format!(
                "shard {}: the write was not committed within {} ms; the shard may have lost its majority (outcome unknown: retry with the same request id)",
                group_name(g.id),
                t.as_millis()
            ))),
            Ok(Ok(r)) => Ok((r.log_id.index, r.data)),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(self.not_leader(g.id, f.leader_id))
            }
            // A storage error (a failed write or fsync of the log) stops
            // this replica's group for good: the other members elect a
            // leader and serve on; this node serves the shard again only
            // after a restart re-reads and checks its files.
            Ok(Err(RaftError::Fatal(f))) => Err(unavailable(format!(
                "shard {}: stopped on node {} ({f}); the other members serve it, and this node only after a restart (check its disk: `sluice fsck`)",
                group_name(g.id),
                self.id
            ))),
            Ok(Err(e)) => Err(unavailable(format!(
                "shard {}: {e}",
                group_name(g.id)
            ))),
        }
    }

    /// Proposes a put with whatever other puts are waiting (see
    /// `Batcher`). A put that finds a free proposer slot proposes the
    /// queue's head itself (a lone put goes at once, as it is); if puts
    /// queued up meanwhile, a task takes the slot over and drains them.
    /// A put that finds every slot busy waits for a proposer to take it.
    async fn propose_write(&self, g: &Arc<Group>, cmd: Command) -> Result<Applied, SluiceError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let propose = {
            let mut b = g.batch.lock();
            b.queue.push_back((cmd, tx));
            let free = b.proposers < BATCHES_IN_FLIGHT;
            b.proposers += usize::from(free);
            free
        };
        if propose && self.propose_batch(g).await {
            let more = {
                let mut b = g.batch.lock();
                let more = !b.queue.is_empty();
                b.proposers -= usize::from(!more);
                more
            };
            if more {
                match self.me.get().and_then(std::sync::Weak::upgrade) {
                    Some(node) => {
                        let g = g.clone();
                        tokio::spawn(async move { while node.propose_batch(&g).await {} });
                    }
                    // Shutting down: this proposer drains what is left.
                    None => while self.propose_batch(g).await {},
                }
            }
        }
        rx.await.map_err(|_| SluiceError::Internal {
            reason: "a batched write was dropped before it was proposed".into(),
        })?
    }

    /// Proposes one batch from the head of the queue and hands every put
    /// its result; false (and the slot given up) when the queue is empty.
    async fn propose_batch(&self, g: &Group) -> bool {
        let taken = g.batch.lock().take();
        if taken.is_empty() {
            return false;
        }
        let (mut cmds, txs): (Vec<Command>, Vec<_>) = taken.into_iter().unzip();
        let cmd = match cmds.len() {
            1 => cmds.remove(0),
            // Only puts and removes are queued here.
            _ => Command::Batch(cmds.into_iter().filter_map(Command::into_batched).collect()),
        };
        let n = txs.len();
        match self.propose(g, cmd).await {
            Ok(Applied::Batch(rs)) if rs.len() == n => {
                for (tx, r) in txs.into_iter().zip(rs) {
                    let _ = tx.send(Ok(r));
                }
            }
            Ok(r) if n == 1 => {
                txs.into_iter().for_each(|tx| drop(tx.send(Ok(r.clone()))));
            }
            Ok(other) => {
                let e = SluiceError::Internal {
                    reason: format!("unexpected apply result for a batch of {n}: {other:?}"),
                };
                txs.into_iter().for_each(|tx| drop(tx.send(Err(e.clone()))));
            }
            Err(e) => txs.into_iter().for_each(|tx| drop(tx.send(Err(e.clone())))),
        }
        true
    }

    /// Replicates a put (`value: Some`) or remove: answered once a
    /// majority of the shard has it and this leader applied it.
    #[allow(clippy::too_many_arguments)]
    pub async fn write(
        &self,
        shard: ShardId,
        key: String,
        value: Option<bytes::Bytes>,
        expected: Option<u64>,
        req_id: Option<ReqId>,
        trace: Option<Trace>,
    ) -> Result<PutResult, SluiceError> {
        let g = self.local(shard)?;
        let cmd = Command::Write {
            key,
            value,
            expected,
            timestamp_us: self.store.clock().now_us(),
            req_id,
            trace,
        };
        let applied = self.propose_write(&g, cmd).await;
        self.maybe_snapshot(&g);
        match applied? {
            Applied::Put(r) => r.map_err(|e| Applied::decode_err(&e)),
            other => Err(SluiceError::Internal {
                reason: format!("unexpected apply result {other:?}"),
            }),
        }
    }

    /// A put from inside the node (a lambda's emit) to a replicated shard:
    /// proposed here when this node leads the shard, else forwarded to the
    /// leader (following hints, trying members while none is known). One
    /// request id across retries: applied once.
    pub async fn write_anywhere(
        &self,
        shard: ShardId,
        key: String,
        value: bytes::Bytes,
        trace: Option<Trace>,
    ) -> Result<PutResult, SluiceError> {
        let g = group_of(shard).ok_or_else(|| SluiceError::Internal {
            reason: format!("shard {shard} is not replicated"),
        })?;
        let req_id = Some(ReqId {
            client: self.writer_id,
            seq: self
                .writer_seq
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        });
        let req = sluice_wire::Request::Put {
            key: key.clone(),
            shard: Some(shard.shard),
            expected: None,
            value: value.clone(),
            trace: trace.clone(),
            req_id,
        };
        self.at_leader(
            g,
            || {
                self.write(
                    shard,
                    key.clone(),
                    Some(value.clone()),
                    None,
                    req_id,
                    trace.clone(),
                )
            },
            &req,
            |r| match r {
                sluice_wire::Response::PutOk(p) => Ok(p),
                other => Err(SluiceError::protocol(format!(
                    "unexpected reply to a forwarded put: {other:?}"
                ))),
            },
        )
        .await
    }

    /// Runs an operation on `group`'s leader: `here()` when this node
    /// leads it, else `req` sent to the leader, its reply read by `reply`.
    /// Follows leader hints, and tries the members in turn while none is
    /// known, until the write timeout.
    async fn at_leader<T, H, F>(
        &self,
        group: u64,
        mut here: H,
        req: &sluice_wire::Request,
        reply: impl Fn(sluice_wire::Response) -> Result<T, SluiceError>,
    ) -> Result<T, SluiceError>
    where
        H: FnMut() -> F,
        F: std::future::Future<Output = Result<T, SluiceError>>,
    {
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let deadline = tokio::time::Instant::now() + t;
        let mut backoff = sluice_types::retry::Backoff::for_leader(deadline.into_std());
        let mut hint: Option<u32> = None;
        let mut attempt = 0usize;
        loop {
            let known = self
                .groups
                .read()
                .get(&group)
                .and_then(|x| x.metrics.borrow().current_leader)
                .map(|l| l as u32);
            let members = self.members_of(group);
            let target = hint
                .or(known)
                .or_else(|| (!members.is_empty()).then(|| members[attempt % members.len()]));
            attempt += 1;
            let r = match target {
                Some(l) if l == self.id => here().await,
                Some(l) => match self.layout.address_of(l) {
                    Some(addr) => self
                        .peers
                        .request(l, &addr.to_string(), req, t)
                        .await
                        .and_then(&reply),
                    None => Err(self.not_leader(group, None)),
                },
                None => Err(self.not_leader(group, None)),
            };
            hint = None;
            match r {
                Err(SluiceError::NotLeader { leader, .. })
                    if tokio::time::Instant::now() < deadline =>
                {
                    hint = leader;
                    if hint.is_none() {
                        tokio::time::sleep(backoff.next_pause().unwrap_or_default()).await;
                    }
                }
                Err(SluiceError::Connection { .. } | SluiceError::Unavailable { .. })
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(backoff.next_pause().unwrap_or_default()).await
                }
                other => return other,
            }
        }
    }

    /// A stable read may be served here: this node is a member of the
    /// shard and has applied at least `min_version` (the newest version
    /// the client's session has seen).
    pub fn check_read(&self, shard: ShardId, min_version: Option<u64>) -> Result<(), SluiceError> {
        if !self.replicates(shard) {
            return Ok(());
        }
        self.local(shard)?;
        if let Some(want) = min_version {
            let applied = self.store.shard(shard).map_or(0, |s| s.last_version());
            if applied < want {
                return Err(SluiceError::ReplicaBehind {
                    shard: shard.to_string(),
                    node: self.id,
                    applied,
                    wanted: want,
                });
            }
        }
        Ok(())
    }

    /// Waits until a linearizable read may be served here: this node is
    /// the leader (confirmed by a quorum now) and has applied everything
    /// committed before the read arrived.
    pub async fn read_barrier(&self, shard: ShardId) -> Result<(), SluiceError> {
        let g = self.local(shard)?;
        self.check_leader(&g)?;
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        match tokio::time::timeout(t, g.raft.ensure_linearizable()).await {
            Err(_) => Err(unavailable(format!(
                "shard {}: leadership not confirmed within {} ms (no quorum?)",
                group_name(g.id),
                t.as_millis()
            ))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                Err(self.not_leader(g.id, f.leader_id))
            }
            Ok(Err(e)) => Err(unavailable(format!("shard {}: {e}", group_name(g.id)))),
        }
    }

    /// Waits until a read of `shard` at `timestamp_us` (already in the
    /// past) is stable on this member: no write it applies from now on
    /// can get a timestamp at or before it. Answered at once when this
    /// member has applied a write (or frontier) after that time; else the
    /// leader commits a time frontier (`Command::Tick`, stamped with its
    /// clock, which is past `timestamp_us`) and this member waits until it
    /// has applied it. Every entry before the frontier in the log is
    /// applied by then, and every later one is stamped above it.
    /// Assumes the members' clocks agree to within the time a new leader
    /// takes to be elected (one machine, or NTP).
    pub async fn time_barrier(&self, shard: ShardId, timestamp_us: u64) -> Result<(), SluiceError> {
        let g = self.local(shard)?;
        if self.store.visible_ts(shard) > timestamp_us {
            return Ok(());
        }
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let leader = g.metrics.borrow().current_leader.map(|l| l as u32);
        let index = match leader {
            Some(l) if l == self.id => self.tick(&g, timestamp_us).await?,
            Some(l) => {
                let addr = self
                    .layout
                    .address_of(l)
                    .ok_or_else(|| self.not_leader(g.id, None))?;
                let req = sluice_wire::Request::Cluster {
                    command:
                        json!({"op": "time_barrier", "group": g.id, "timestamp_us": timestamp_us})
                            .to_string(),
                };
                match self.peers.request(l, &addr.to_string(), &req, t).await? {
                    sluice_wire::Response::Json(j) => serde_json::from_str::<serde_json::Value>(&j)
                        .ok()
                        .and_then(|v| v["index"].as_u64())
                        .ok_or_else(|| {
                            SluiceError::protocol(format!("bad reply to a time barrier: {j}"))
                        })?,
                    other => {
                        return Err(SluiceError::protocol(format!(
                            "unexpected reply to a time barrier: {other:?}"
                        )))
                    }
                }
            }
            None => return Err(self.not_leader(g.id, None)),
        };
        g.raft
            .wait(Some(t))
            .applied_index_at_least(Some(index), "time barrier")
            .await
            .map(|_| ())
            .map_err(|e| unavailable(format!("shard {}: time barrier: {e}", group_name(g.id))))
    }

    /// Leader side of `time_barrier`: commits a frontier stamped after
    /// `timestamp_us`; returns its log index.
    async fn tick(&self, g: &Group, timestamp_us: u64) -> Result<u64, SluiceError> {
        let mut now = self.store.clock().now_us();
        // Members ask only once the time has passed on their clock; more
        // than a write timeout ahead of ours is a bad request, not a wait.
        let slack = self.settings.write_timeout_ms * 1000;
        if timestamp_us > now.saturating_add(slack) {
            return Err(unavailable(format!(
                "time frontier at {timestamp_us} µs refused: {} ms ahead of this leader's clock (at most {} ms: the clocks disagree)",
                (timestamp_us - now) / 1000,
                self.settings.write_timeout_ms
            )));
        }
        while now <= timestamp_us {
            tokio::time::sleep(Duration::from_micros(timestamp_us + 1 - now)).await;
            now = self.store.clock().now_us();
        }
        let (index, _) = self
            .propose_at(g, Command::Tick { timestamp_us: now })
            .await?;
        Ok(index)
    }

    /// A replicated pool table change (through the metadata group).
    pub async fn meta_write(&self, cmd: MetaCommand) -> Result<String, SluiceError> {
        let g = self.local_group(META_GROUP)?;
        let json = serde_json::to_string(&cmd).map_err(|e| SluiceError::Internal {
            reason: e.to_string(),
        })?;
        match self.propose(&g, Command::Meta(json)).await? {
            Applied::Meta(r) => r.map_err(|e| Applied::decode_err(&e)),
            other => Err(SluiceError::Internal {
                reason: format!("unexpected apply result {other:?}"),
            }),
        }
    }

    /// Purges a removed pool everywhere: each of its shards deletes the
    /// pool's keys through its own log (every member, in log order), then
    /// the metadata group drops the pool and frees the path. Interrupted,
    /// it can run again (the pool stays removed until the last step).
    pub async fn purge_pool(&self, path: &str) -> Result<PurgeReport, SluiceError> {
        self.meta_catch_up().await?;
        let (meta, except) = self.store.pool_table().purge_scope(path)?;
        let mut total = PurgeReport::default();
        for shard in self.store.shards_of_pool(&meta) {
            if let Some(g) = group_of(shard) {
                total += self.purge_shard(g, path, &except).await?;
            }
        }
        self.meta_write(MetaCommand::PoolPurge {
            path: path.to_string(),
        })
        .await?;
        tracing::info!(pool = %path, keys = total.keys, versions = total.versions, bytes = total.bytes, "pool purged");
        Ok(total)
    }

    /// One shard's part of `purge_pool`, proposed by its leader (here or
    /// forwarded, following leader hints until the write timeout).
    async fn purge_shard(
        &self,
        group: u64,
        prefix: &str,
        except: &[String],
    ) -> Result<PurgeReport, SluiceError> {
        let req = sluice_wire::Request::Cluster {
            command:
                json!({"op": "purge_shard", "group": group, "prefix": prefix, "except": except})
                    .to_string(),
        };
        self.at_leader(
            group,
            || async {
                let g = self.local_group(group)?;
                self.propose_purge(&g, prefix.to_string(), except.to_vec())
                    .await
            },
            &req,
            |r| match r {
                sluice_wire::Response::Json(j) => serde_json::from_str(&j).map_err(|e| {
                    SluiceError::protocol(format!("bad reply to a shard purge ({e}): {j}"))
                }),
                other => Err(SluiceError::protocol(format!(
                    "unexpected reply to a shard purge: {other:?}"
                ))),
            },
        )
        .await
    }

    /// Leader side of a shard purge: first catches up with the metadata
    /// group (so this leader sees the pool removed and refuses writes to
    /// it from now on), then replicates the purge.
    async fn propose_purge(
        &self,
        g: &Group,
        prefix: String,
        except: Vec<String>,
    ) -> Result<PurgeReport, SluiceError> {
        self.meta_catch_up().await?;
        match self
            .propose_at(g, Command::Purge { prefix, except })
            .await?
        {
            (_, Applied::Purged(r)) => r.map_err(|e| Applied::decode_err(&e)),
            (_, other) => Err(SluiceError::Internal {
                reason: format!("unexpected apply result {other:?}"),
            }),
        }
    }

    /// Brings this node's pool table and membership up to date with the
    /// metadata leader (everything committed before the call), e.g. before
    /// telling a client that a key has no pool: a client may have learned
    /// of a new pool from a node further ahead.
    pub async fn meta_catch_up(&self) -> Result<(), SluiceError> {
        let g = self.local_group(META_GROUP)?;
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let leader = g.metrics.borrow().current_leader.map(|l| l as u32);
        let index = match leader {
            Some(l) if l == self.id => return Ok(()),
            Some(l) => {
                let addr = self
                    .layout
                    .address_of(l)
                    .ok_or_else(|| self.not_leader(META_GROUP, None))?;
                let req = sluice_wire::Request::Cluster {
                    command: json!({"op": "meta_read_index"}).to_string(),
                };
                match self.peers.request(l, &addr.to_string(), &req, t).await? {
                    sluice_wire::Response::Json(j) => serde_json::from_str::<serde_json::Value>(&j)
                        .ok()
                        .and_then(|v| v["index"].as_u64())
                        .unwrap_or(0),
                    other => {
                        return Err(SluiceError::protocol(format!(
                            "unexpected reply to a metadata read index: {other:?}"
                        )))
                    }
                }
            }
            None => return Err(self.not_leader(META_GROUP, None)),
        };
        g.raft
            .wait(Some(t))
            .applied_index_at_least(Some(index), "metadata catch-up")
            .await
            .map(|_| ())
            .map_err(|e| unavailable(format!("metadata catch-up: {e}")))
    }

    /// The metadata epoch: bumped by every replicated pool or membership
    /// change this node has applied.
    pub fn epoch(&self) -> u64 {
        self.meta.read().epoch
    }

    /// Whether `key` is this cluster's key (constant time: a client
    /// cannot learn it byte by byte from timings).
    pub fn peer_key_matches(&self, key: &str) -> bool {
        let (a, b) = (self.key.as_bytes(), key.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// Runs an admin command (JSON, `{"op": ...}`). `from_peer`: the
    /// connection authenticated as a cluster peer; the internal operations
    /// (`set_members`, `time_barrier`, `meta_read_index`) need it.
    pub async fn admin(
        &self,
        command: &str,
        from_peer: bool,
    ) -> Result<serde_json::Value, SluiceError> {
        let cmd: Admin = serde_json::from_str(command)
            .map_err(|e| SluiceError::invalid_argument("cluster command", e.to_string()))?;
        if !from_peer
            && matches!(
                cmd,
                Admin::SetMembers { .. }
                    | Admin::TimeBarrier { .. }
                    | Admin::MetaReadIndex
                    | Admin::PurgeShard { .. }
            )
        {
            return Err(SluiceError::Forbidden {
                what: "an internal cluster operation from a client connection".into(),
            });
        }
        match cmd {
            Admin::Status => Ok(self.status()),
            Admin::Info => Ok(self.info()),
            Admin::AddMember { shard, node } => self.add_member(&shard, node).await,
            Admin::RemoveMember { shard, node } => self.remove_member(&shard, node).await,
            Admin::Cut { .. } | Admin::Heal | Admin::StopGroup { .. }
                if !self.settings.fault_injection =>
            {
                Err(SluiceError::NotSupported {
                    what: "fault injection on this node (start it with [cluster] fault_injection = true)".into(),
                })
            }
            Admin::Cut { peers } => {
                self.peers.cut(&peers);
                tracing::warn!(?peers, "fault injection: links cut");
                Ok(json!({"node": self.id, "cut": self.peers.blocked()}))
            }
            Admin::MetaReadIndex => {
                let g = self.local_group(META_GROUP)?;
                self.check_leader(&g)?;
                let t = Duration::from_millis(self.settings.write_timeout_ms);
                match tokio::time::timeout(t, g.raft.ensure_linearizable()).await {
                    Ok(Ok(id)) => Ok(json!({"index": id.map_or(0, |l| l.index)})),
                    Ok(Err(e)) => Err(unavailable(format!("metadata read index: {e}"))),
                    Err(_) => Err(unavailable("metadata read index timed out".into())),
                }
            }
            Admin::TimeBarrier {
                group,
                timestamp_us,
            } => {
                let g = self.local_group(group)?;
                let index = self.tick(&g, timestamp_us).await?;
                Ok(json!({ "index": index }))
            }
            Admin::PurgeShard {
                group,
                prefix,
                except,
            } => {
                let g = self.local_group(group)?;
                let r = self.propose_purge(&g, prefix, except).await?;
                serde_json::to_value(r).map_err(|e| SluiceError::Internal {
                    reason: e.to_string(),
                })
            }
            Admin::SetMembers { group, members } => self
                .meta_write(MetaCommand::SetMembers { group, members })
                .await
                .map(|_| json!({})),
            Admin::StopGroup { shard } => {
                let g = self.local(parse_shard(&shard)?)?;
                self.restart_requested.lock().insert(g.id);
                tracing::warn!(shard, "fault injection: consensus core stopped");
                let _ = g.raft.shutdown().await;
                Ok(json!({"node": self.id, "stopped": shard}))
            }
            Admin::Heal => {
                self.peers.heal();
                tracing::warn!("fault injection: links healed");
                Ok(json!({"node": self.id, "cut": []}))
            }
        }
    }

    fn voters(g: &Group) -> BTreeSet<u64> {
        g.metrics
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    async fn change(
        &self,
        shard: &str,
        node: u32,
        add: bool,
    ) -> Result<serde_json::Value, SluiceError> {
        let s = parse_shard(shard)?;
        let g = self.local(s)?;
        self.check_leader(&g)?;
        let addr = self.layout.address_of(node).ok_or_else(|| {
            SluiceError::invalid_argument(
                format!("node {node}"),
                "it is not in the layout's [[nodes]]",
            )
        })?;
        let mut voters = Self::voters(&g);
        let api = |e: RaftError<u64, ClientWriteError<u64, BasicNode>>| match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                self.not_leader(g.id, f.leader_id)
            }
            e => unavailable(format!("membership change of {shard}: {e}")),
        };
        if add {
            if voters.contains(&u64::from(node)) {
                return Err(SluiceError::invalid_argument(
                    format!("node {node}"),
                    format!("it is already a member of {shard}"),
                ));
            }
            // Blocks until the newcomer has caught up (log or snapshot).
            g.raft
                .add_learner(u64::from(node), BasicNode::new(addr), true)
                .await
                .map_err(api)?;
            voters.insert(u64::from(node));
        } else {
            if !voters.remove(&u64::from(node)) {
                return Err(SluiceError::invalid_argument(
                    format!("node {node}"),
                    format!("it is not a member of {shard}"),
                ));
            }
            if voters.is_empty() {
                return Err(SluiceError::invalid_argument(
                    format!("node {node}"),
                    format!("it is the last member of {shard}, which cannot be removed"),
                ));
            }
        }
        g.raft
            .change_membership(voters.clone(), false)
            .await
            .map_err(api)?;
        let members: Vec<u32> = voters.iter().map(|v| *v as u32).collect();
        self.record_members(g.id, &members).await?;
        Ok(json!({"shard": shard, "members": members}))
    }

    /// Records a shard's new members in the metadata group, through its
    /// leader wherever that is.
    async fn record_members(&self, group: u64, members: &[u32]) -> Result<(), SluiceError> {
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let deadline = tokio::time::Instant::now() + t;
        let mut backoff = sluice_types::retry::Backoff::for_leader(deadline.into_std());
        let cmd = json!({"op": "set_members", "group": group, "members": members});
        loop {
            let leader = self
                .groups
                .read()
                .get(&META_GROUP)
                .and_then(|m| m.metrics.borrow().current_leader);
            let r = match leader.map(|l| l as u32) {
                Some(l) if l == self.id => self
                    .meta_write(MetaCommand::SetMembers {
                        group,
                        members: members.to_vec(),
                    })
                    .await
                    .map(|_| ()),
                Some(l) => match self.layout.address_of(l) {
                    Some(addr) => self
                        .peers
                        .request(
                            l,
                            &addr.to_string(),
                            &sluice_wire::Request::Cluster {
                                command: cmd.to_string(),
                            },
                            t,
                        )
                        .await
                        .map(|_| ()),
                    None => Err(self.not_leader(META_GROUP, None)),
                },
                None => Err(self.not_leader(META_GROUP, None)),
            };
            match r {
                Err(SluiceError::NotLeader { .. }) | Err(SluiceError::Connection { .. })
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(backoff.next_pause().unwrap_or_default()).await
                }
                other => return other,
            }
        }
    }

    async fn add_member(&self, shard: &str, node: u32) -> Result<serde_json::Value, SluiceError> {
        self.change(shard, node, true).await
    }

    async fn remove_member(
        &self,
        shard: &str,
        node: u32,
    ) -> Result<serde_json::Value, SluiceError> {
        self.change(shard, node, false).await
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
        let list: Vec<serde_json::Value> = ids
            .iter()
            .map(|g| {
                let x = &groups[g];
                let leader = self.leader_of(x);
                let m = x.metrics.borrow();
                let last = m.last_log_index.unwrap_or(0);
                let lag: BTreeMap<String, u64> = m
                    .replication
                    .as_ref()
                    .map(|r| {
                        r.iter()
                            .filter(|(id, _)| **id != u64::from(self.id))
                            .map(|(id, matched)| {
                                (
                                    id.to_string(),
                                    last.saturating_sub(matched.map_or(0, |l| l.index)),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let version = shard_of_group(*g)
                    .and_then(|s| self.store.shard(s))
                    .map(|s| s.last_version());
                let (built, installed) = x.sm.snapshot_counts();
                let me = u64::from(self.id);
                let membership = m.membership_config.membership();
                // A node taken out of a group keeps its copy (and openraft
                // calls it a follower or learner): it is no member.
                let member = membership.voter_ids().any(|v| v == me)
                    || membership.learner_ids().any(|l| l == me);
                json!({
                    "group": group_name(*g),
                    "snapshot_index": m.snapshot.map(|l| l.index),
                    "snapshots_built": built,
                    "snapshots_installed": installed,
                    "role": match m.state {
                        ServerState::Follower | ServerState::Learner if !member => "removed",
                        ServerState::Leader if leader == Some(u64::from(self.id)) => "leader",
                        // openraft still holds the role, but no quorum
                        // has acknowledged it lately.
                        ServerState::Leader => "leader_without_quorum",
                        ServerState::Follower => "follower",
                        ServerState::Candidate => "candidate",
                        ServerState::Learner => "learner",
                        ServerState::Shutdown => "shutdown",
                    },
                    "term": m.current_term,
                    "leader": leader,
                    "voters": m.membership_config.membership().voter_ids().collect::<Vec<_>>(),
                    "last_log_index": last,
                    "applied_index": x.sm.applied_index(),
                    "applied_version": version,
                    "lag": lag,
                })
            })
            .collect();
        json!({
            "node": self.id,
            "epoch": self.epoch(),
            "cut": self.peers.blocked(),
            "groups": list,
        })
    }

    /// Stops every group (graceful shutdown).
    pub async fn shutdown(&self) {
        let groups: Vec<Arc<Group>> = self.groups.read().values().cloned().collect();
        for g in groups {
            let _ = g.raft.shutdown().await;
        }
    }
}

/// Free bytes of the file system holding `p` (`None` when unknown).
fn free_bytes(p: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path; `st` is a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
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
        // Upcalls run on plain threads: block this one, not the runtime.
        Some(match tokio::runtime::Handle::try_current() {
            Ok(_) => Err(SluiceError::Internal {
                reason: "a replicated put from inside the async runtime must use write_anywhere"
                    .into(),
            }),
            Err(_) => self.runtime.block_on(fut),
        })
    }
}

/// Which member runs a lambda dispatched to one member (`one`): members
/// split keys by hash, so each key's upcall runs once per shard.
impl sluice_compute::Membership for ClusterNode {
    fn position(&self, shard: ShardId) -> (usize, usize) {
        let members = match group_of(shard) {
            Some(g) => self.members_of(g),
            None => self
                .layout
                .subgroups
                .trigger
                .get(shard.subgroup as usize)
                .and_then(|sg| sg.shards.get(shard.shard as usize))
                .cloned()
                .unwrap_or_default(),
        };
        match members.iter().position(|m| *m == self.id) {
            Some(i) => (i, members.len()),
            None => (0, 1),
        }
    }
}

/// The directory of volatile shards' logs (see `ClusterSettings::volatile_dir`).
fn volatile_root(settings: &ClusterSettings, data_dir: &std::path::Path) -> PathBuf {
    if let Some(d) = &settings.volatile_dir {
        return d.clone();
    }
    let shm = std::path::Path::new("/dev/shm");
    if free_bytes(shm).is_some_and(|b| b >= 1 << 30) {
        let abs = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
        return shm.join(format!(
            "sluice-{:016x}",
            sluice_types::fnv1a64(abs.to_string_lossy().as_bytes())
        ));
    }
    data_dir.join("raft-volatile")
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
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let mut raw = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut raw))
            .map_err(|e| err("making", e))?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_key_is_made_once_next_to_the_layout_and_a_short_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let settings = ClusterSettings {
            layout: Some(d.path().join("layout.toml")),
            ..Default::default()
        };
        let k1 = cluster_key(&settings).unwrap();
        assert_eq!(k1.len(), 64, "32 random bytes, hex");
        // Every node reading the same file gets the same key.
        assert_eq!(cluster_key(&settings).unwrap(), k1);
        let short = d.path().join("short.key");
        std::fs::write(&short, "abc\n").unwrap();
        let e = cluster_key(&ClusterSettings {
            key_file: Some(short),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("too short"), "{e}");
        let e = cluster_key(&ClusterSettings::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("key_file"), "{e}");
    }
}
