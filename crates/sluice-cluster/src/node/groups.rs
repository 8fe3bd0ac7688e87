//! Group lifecycle: starting a group's consensus core over its log and
//! state machine, snapshots when the log grows, restarting a group
//! openraft stopped, and incoming consensus messages.

use super::*;
use sluice_types::marks::Point;

/// Log bytes after which a persistent shard takes a snapshot (at most
/// `ClusterSettings::snapshot_bytes`).
const PERSISTENT_SNAPSHOT_BYTES: u64 = 64 << 20;

impl ClusterNode {
    pub(super) fn group_dir(&self, g: u64) -> PathBuf {
        let name = group_name(g).replace('/', "-");
        match shard_of_group(g) {
            Some(s) if s.pool_type == PoolType::Volatile => self.volatile_root.join(name),
            _ => self.data_dir.join("raft").join(name),
        }
    }

    /// Asks for a snapshot when a group's log holds more than
    /// `snapshot_bytes` (at most every 100 ms).
    pub(super) fn maybe_snapshot(&self, g: &Group) {
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
    pub(super) async fn ensure_group(&self, g: u64) -> Result<Arc<Group>, SluiceError> {
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
    pub(super) async fn start_raft(
        &self,
        g: u64,
        log: LogStore,
        sm: Sm,
    ) -> Result<Arc<Group>, SluiceError> {
        let raft = Raft::new(
            u64::from(self.id),
            self.raft_cfg.clone(),
            NetFactory {
                peers: self.peers.clone(),
                group: g,
                commit_hold: Duration::from_micros(self.settings.commit_hold_us),
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
            appends_received: Default::default(),
        });
        // Operators see leadership changes in the node's log (openraft's
        // own logging is off by default: it reports every failed RPC to a
        // dead peer). Watched through the server metrics, which change
        // only with the vote, role, leader or membership (the full metrics
        // change with every write: a wakeup per write for nothing).
        let mut m = group.raft.server_metrics();
        let group_metrics = group.metrics.clone();
        let me = u64::from(self.id);
        let node = self.me.get().cloned();
        let this = Arc::downgrade(&group);
        tokio::spawn(async move {
            let mut last: Option<(u64, Option<u64>)> = None;
            while m.changed().await.is_ok() {
                let (term, leader) = {
                    let x = m.borrow_watched();
                    (x.vote.leader_id.term, x.current_leader)
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
            let why = group_metrics.borrow_watched().running_state.clone();
            if let (Some(node), Some(old), Err(why)) =
                (node.and_then(|n| n.upgrade()), this.upgrade(), why)
            {
                node.on_group_stopped(old, why).await;
            }
        });
        Ok(group)
    }

    /// A group's consensus core stopped. openraft (seen with 0.9) stops a core with
    /// "replication channel closed" when, after a higher vote ended a
    /// replication stream, it hands that stream a snapshot to send: a bug
    /// of its own, nothing wrong with this node's disk. Such a group is
    /// started again on the same log and state machine (both intact in
    /// memory, as the stopped core left them), at most
    /// `RESTARTS_PER_MINUTE` times a minute. Any other stop (a failed
    /// disk write, a panic, a shutdown) stays: the node serves the group
    /// again only after a restart re-reads and checks its files.
    pub(super) fn on_group_stopped(
        self: Arc<Self>,
        old: Arc<Group>,
        why: openraft::error::Fatal<TypeConfig>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        // Boxed: starting a group spawns the task that calls this.
        Box::pin(async move { self.restart_stopped(old, why).await })
    }

    pub(super) async fn restart_stopped(
        &self,
        old: Arc<Group>,
        why: openraft::error::Fatal<TypeConfig>,
    ) {
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
        if kind == crate::network::kind::BCAST_CHUNK {
            return self.on_chunk(body).await;
        }
        let g = self.ensure_group(group).await?;
        let msg = crate::network::decode_message(kind, body)?;
        let mut marked = None;
        if let crate::network::PeerMessage::Append(a) = &msg {
            g.appends_received.count(a.entries.is_empty());
            if crate::marks::on() {
                let ix = crate::network::entry_indexes(&a.entries);
                crate::marks::mark_all(Point::Recv, group, ix.iter().copied(), self.id.into());
                marked = Some(ix);
            }
        }
        let r = dispatch(&g.raft, msg).await;
        if let Some(ix) = marked {
            crate::marks::mark_all(Point::Reply, group, ix, self.id.into());
        }
        // Followers bound their logs by bytes too (openraft's own policy
        // counts entries only): else they snapshot rarely, and a rare
        // persistent snapshot syncs a large history at once.
        self.maybe_snapshot(&g);
        r
    }
}
