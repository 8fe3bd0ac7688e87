//! Shards on the raft-rs driver (`crate::raftrs`), for a layout with
//! `consensus = "raft-rs"`: starting a shard's group over its log and
//! state machine, and peers' messages handed to it as they arrive (by the
//! receiving connection itself: no task per message).

use super::*;
use crate::raftrs::{self, transport::PeerTransport, DriverSettings};

impl ClusterNode {
    /// The transport every raft-rs group of this node sends through.
    fn rs_transport(&self) -> Arc<PeerTransport> {
        self.rs_transport
            .get_or_init(|| {
                let addresses = self
                    .layout
                    .nodes
                    .iter()
                    .map(|n| (u64::from(n.id), n.address.to_string()))
                    .collect();
                PeerTransport::new(self.peers.clone(), addresses)
            })
            .clone()
    }

    /// The driver's settings from the node's `[cluster]` settings: a tick
    /// per heartbeat, elections after `election_min_ms`-`election_max_ms`
    /// (in whole ticks, at least two), snapshots as openraft's groups
    /// take them (`snapshot_every`, `snapshot_limit`).
    pub(super) fn driver_settings(&self, g: u64) -> DriverSettings {
        let hb = self.settings.heartbeat_ms.max(1);
        let ticks = |ms: u64| usize::try_from(ms.div_ceil(hb)).unwrap_or(usize::MAX);
        let min = ticks(self.settings.election_min_ms).max(2);
        DriverSettings {
            tick: Duration::from_millis(hb),
            election_ticks: (min, ticks(self.settings.election_max_ms).max(min + 1)),
            snapshot_every: self.settings.snapshot_every,
            snapshot_bytes: self.snapshot_limit(g),
            ..Default::default()
        }
    }

    /// Starts shard group `g` on the raft-rs driver, its members the
    /// layout's (or the metadata group's record of them).
    pub(super) fn start_raftrs(
        &self,
        g: u64,
        log: LogStore,
        sm: Sm,
    ) -> Result<Arc<Group>, SluiceError> {
        let voters: Vec<u64> = self.members_of(g).into_iter().map(u64::from).collect();
        let handle = raftrs::start(
            g,
            u64::from(self.id),
            &voters,
            log.clone(),
            sm.clone(),
            self.rs_transport(),
            &self.driver_settings(g),
        )
        .map_err(|e| SluiceError::Internal {
            reason: format!("starting replication group {}: {e}", group_name(g)),
        })?;
        Ok(Group::new(g, Core::RaftRs { handle, voters }, sm, log))
    }

    /// A raft-rs message from node `from` (`raftrs::transport`): decoded
    /// and handed to its group, which steps it in its next turn.
    pub fn deliver_raftrs(
        &self,
        from: u32,
        group: u64,
        body: &bytes::Bytes,
    ) -> Result<(), SluiceError> {
        if self.peers.is_blocked(from) {
            return Err(unavailable(format!(
                "link from node {from} is cut (fault injection)"
            )));
        }
        let g = self.groups.read().get(&group).cloned().ok_or_else(|| {
            SluiceError::protocol(format!(
                "a raft-rs message for group {group}, which is not here"
            ))
        })?;
        let Core::RaftRs { handle, .. } = &g.core else {
            return Err(SluiceError::protocol(format!(
                "a raft-rs message for {}, which runs on openraft here",
                group_name(group)
            )));
        };
        let (msg, commands) = raftrs::wire::decode(body)?;
        if msg.get_msg_type() == raft::eraftpb::MessageType::MsgAppend {
            g.appends_received.count(msg.entries.is_empty());
        }
        handle.deliver(msg, commands);
        Ok(())
    }
}
