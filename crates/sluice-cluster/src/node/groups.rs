//! Group lifecycle: starting a group's consensus core over its log and
//! state machine, and incoming consensus messages.

use super::*;

/// The file in a group's directory naming the driver its log is written by.
const DRIVER_FILE: &str = "consensus";

/// Refuses a group directory whose log another consensus driver wrote:
/// openraft, before it was removed (its records are not raft-rs's: a vote
/// is not a hard state). A directory from before the mark holds
/// openraft's log. Marks a new one.
fn check_driver(dir: &std::path::Path) -> Result<(), SluiceError> {
    const OURS: &str = "raft-rs";
    let file = dir.join(DRIVER_FILE);
    let io = |e: std::io::Error| SluiceError::Io {
        reason: format!("{}: {e}", file.display()),
    };
    let found = match std::fs::read_to_string(&file) {
        Ok(s) => Some(s.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let used = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some());
            used.then(|| "openraft".to_string())
        }
        Err(e) => return Err(io(e)),
    };
    match found {
        Some(f) if f == OURS => Ok(()),
        Some(f) => Err(SluiceError::Internal {
            reason: format!(
                "{} holds a log written by the {f} consensus driver, which this Sluice does not have (every group runs on raft-rs): start this cluster from empty data directories",
                dir.display()
            ),
        }),
        None => {
            std::fs::create_dir_all(dir).map_err(io)?;
            std::fs::write(&file, OURS).map_err(io)
        }
    }
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
        let sync = synced(g, self.settings.sync_persistent);
        let io = |e: std::io::Error| SluiceError::Io {
            reason: format!("opening the consensus log in {}: {e}", dir.display()),
        };
        check_driver(&dir)?;
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
                faults: self
                    .settings
                    .fault_injection
                    .then(|| self.disk_faults.clone()),
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
        let group = self.start_raftrs(g, log, sm)?;
        self.groups.write().insert(g, group.clone());
        Ok(group)
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
        Err(SluiceError::protocol(format!(
            "peer message of kind {kind}: not a raft-rs message or a broadcast chunk"
        )))
    }
}

/// Whether group `g`'s log and snapshot are fsync'd (with group commit):
/// persistent shards', and the metadata group's (pools, graphs, policies,
/// members: Raft's safety assumes a vote or an entry a member
/// acknowledged survives its machine's crash, and these writes are rare),
/// unless the node was told never to sync (`[persistent] sync = "never"`).
/// Volatile shards' logs live in RAM: they survive a process's crash, not
/// the machine's.
pub(super) fn synced(g: u64, sync_persistent: bool) -> bool {
    let persistent = match shard_of_group(g) {
        Some(s) => s.pool_type == PoolType::Persistent,
        None => g == META_GROUP,
    };
    persistent && sync_persistent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_directory_keeps_the_driver_that_wrote_it() {
        let d = tempfile::tempdir().unwrap();
        // A new directory is marked with the driver that opens it.
        let fresh = d.path().join("volatile-0-0");
        check_driver(&fresh).unwrap();
        check_driver(&fresh).unwrap();
        assert_eq!(
            std::fs::read_to_string(fresh.join(DRIVER_FILE)).unwrap(),
            "raft-rs"
        );
        // One openraft wrote, marked or from before the mark, is refused.
        let marked = d.path().join("volatile-2-0");
        std::fs::create_dir_all(&marked).unwrap();
        std::fs::write(marked.join(DRIVER_FILE), "openraft").unwrap();
        let old = d.path().join("volatile-1-0");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join("seg-1.log"), b"x").unwrap();
        for dir in [marked, old] {
            let e = check_driver(&dir).unwrap_err().to_string();
            assert!(
                e.contains("written by the openraft consensus driver")
                    && e.contains("start this cluster from empty data directories"),
                "{e}"
            );
        }
    }
}
