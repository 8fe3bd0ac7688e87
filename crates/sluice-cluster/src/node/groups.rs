//! Group lifecycle: starting a group's consensus core over its log and
//! state machine, snapshots when the log grows, restarting a group
//! openraft stopped, and incoming consensus messages.

use super::*;
use sluice_types::cluster::Consensus;
use sluice_types::marks::Point;

/// The file in a group's directory naming the driver its log is written by.
const DRIVER_FILE: &str = "consensus";

/// Refuses a group directory whose log another consensus driver wrote (the
/// two keep different records: a vote is not raft-rs's hard state); marks
/// a new one with `driver`. A directory from before the mark holds
/// openraft's log.
fn check_driver(dir: &std::path::Path, driver: Consensus) -> Result<(), SluiceError> {
    let name = |c: Consensus| match c {
        Consensus::Openraft => "openraft",
        Consensus::RaftRs => "raft-rs",
    };
    let file = dir.join(DRIVER_FILE);
    let io = |e: std::io::Error| SluiceError::Io {
        reason: format!("{}: {e}", file.display()),
    };
    let (found, marked) = match std::fs::read_to_string(&file) {
        Ok(s) => (s.trim().to_string(), true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let used = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some());
            let f = if used { Consensus::Openraft } else { driver };
            (name(f).to_string(), false)
        }
        Err(e) => return Err(io(e)),
    };
    if found != name(driver) {
        return Err(SluiceError::Internal {
            reason: format!(
                "{} holds a log written by the {found} consensus driver, but the layout says {}: a cluster cannot change drivers over its data (go back to consensus = \"{found}\", or start from empty data directories)",
                dir.display(),
                name(driver)
            ),
        });
    }
    if !marked {
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::write(&file, name(driver)).map_err(io)?;
    }
    Ok(())
}

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

    /// Log bytes after which group `g` takes a snapshot. A persistent
    /// shard's snapshot is small (its objects are the history on disk):
    /// taking it often keeps each history fsync short and lets the log's
    /// purged segments be recycled early.
    pub(super) fn snapshot_limit(&self, g: u64) -> u64 {
        match shard_of_group(g) {
            Some(s) if s.pool_type == PoolType::Persistent => {
                self.settings.snapshot_bytes.min(PERSISTENT_SNAPSHOT_BYTES)
            }
            _ => self.settings.snapshot_bytes,
        }
    }

    /// Asks for a snapshot when a group's log holds more than
    /// `snapshot_bytes` (at most every 100 ms).
    pub(super) fn maybe_snapshot(&self, g: &Group) {
        let Some(raft) = g.core.as_openraft() else {
            return; // raft-rs groups snapshot by themselves (`raftrs`)
        };
        let limit = self.snapshot_limit(g.id);
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
        let raft = raft.clone();
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
        let driver = self.layout.consensus;
        check_driver(&dir, driver)?;
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
        let group = match driver {
            Consensus::RaftRs => self.start_raftrs(g, log, sm)?,
            Consensus::Openraft => self.start_raft(g, log, sm).await?,
        };
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
        let mut m = raft.server_metrics();
        let group = Group::new(
            g,
            Core::Openraft {
                metrics: raft.metrics(),
                raft,
            },
            sm,
            log,
        );
        // Operators see leadership changes in the node's log (openraft's
        // own logging is off by default: it reports every failed RPC to a
        // dead peer). Watched through the server metrics, which change
        // only with the vote, role, leader or membership (the full metrics
        // change with every write: a wakeup per write for nothing).
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
                    crate::types::report_leadership(g, me, term, leader);
                    last = Some((term, leader));
                }
            }
            // The core has stopped (its metrics sender is gone).
            let old = this.upgrade();
            let why = old.as_ref().and_then(|g| g.core.openraft_stop());
            if let (Some(node), Some(old), Some(why)) = (node.and_then(|n| n.upgrade()), old, why) {
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
        if kind == crate::network::kind::RAFTRS {
            // Sent one way (`raftrs::transport`): nothing goes back.
            return self
                .deliver_raftrs(from, group, body)
                .map(|()| bytes::Bytes::new());
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
        let r = dispatch(g.core.openraft(g.id, "an openraft message")?, msg).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_directory_keeps_the_driver_that_wrote_it() {
        let d = tempfile::tempdir().unwrap();
        // A new directory is marked with the driver that opens it.
        let fresh = d.path().join("volatile-0-0");
        check_driver(&fresh, Consensus::RaftRs).unwrap();
        check_driver(&fresh, Consensus::RaftRs).unwrap();
        let e = check_driver(&fresh, Consensus::Openraft).unwrap_err();
        assert!(
            e.to_string()
                .contains("written by the raft-rs consensus driver")
                && e.to_string().contains("layout says openraft"),
            "{e}"
        );
        // A directory from before the mark holds openraft's log.
        let old = d.path().join("volatile-1-0");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join("seg-1.log"), b"x").unwrap();
        let e = check_driver(&old, Consensus::RaftRs).unwrap_err();
        assert!(
            e.to_string().contains("by the openraft consensus driver"),
            "{e}"
        );
        check_driver(&old, Consensus::Openraft).unwrap();
        assert_eq!(
            std::fs::read_to_string(old.join(DRIVER_FILE)).unwrap(),
            "openraft"
        );
    }
}
