//! Which members a leader counts as down, for lambdas dispatched to one
//! member of a shard (`one`).
//!
//! Every member applies a shard's writes, and each runs such a lambda for
//! its share of the keys (by key hash over the members). A member that is
//! down would take its share with it: those puts were acknowledged and
//! stored, but their lambdas ran only once it came back and caught up
//! from the log, and never if it did not (or caught up from a snapshot).
//! So the leader names the members it counts as down in the entry that
//! carries the writes (`Command::Without`), and every member applying it
//! splits the keys over the others. The split is in the log, so all
//! members agree on it, whatever each of them knows of the others: a key
//! runs on exactly one member that applies the entry (Derecho's view
//! change, which Cascade relies on, per entry rather than per view).
//!
//! Down: not heard from within the longest election timeout, or its
//! process found gone since it was last heard from (a closed connection
//! and nothing listening at its address: `ClusterNode::peer_connection_lost`),
//! or stopping (it said so: `ClusterNode::leave_lambdas`; until its
//! process is found gone, or `LEAVING_FOR`), or not replicating (raft-rs's progress probing for where its log
//! matches, or sending it a snapshot: it may be far behind, and its share
//! would wait for it to catch up). A member back and caught up counts
//! again from the next entry on.
//!
//! What is left: writes proposed between a member's death and the leader
//! noticing (milliseconds when its process died, an election timeout
//! when its machine did) still name it, and their lambdas run when it
//! comes back through the log, as before; a member that applied a write
//! and died before its lambda ran does not run it again (at most once,
//! as in Cascade).

use super::{node_of, Driver, DriverError, Waiting, LIVE_TIMEOUTS};
use crate::types::Command;
use raft::{ProgressState, StateRole};
use std::time::{Duration, Instant};

/// A member that said it is stopping counts as down at most this long
/// (its process found gone ends it sooner; with fast failover off, a
/// member restarted meanwhile takes its share again after this).
const LEAVING_FOR: Duration = Duration::from_secs(60);

impl Driver {
    /// On a leader, the other members counted as down now (Sluice node
    /// ids, ascending); none on a follower.
    pub(super) fn down_members(&self) -> Vec<u32> {
        if self.raw.raft.state != StateRole::Leader {
            return Vec::new();
        }
        let (me, now) = (self.raw.raft.id, Instant::now());
        let within = self.live_for / LIVE_TIMEOUTS as u32;
        let up = |id: &u64, state: ProgressState| {
            let heard = self.heard.get(id);
            let recently = heard.is_some_and(|t| now.duration_since(*t) <= within);
            let gone_since = matches!((self.gone.get(id), heard), (Some(g), Some(h)) if g >= h);
            let leaving = self
                .leaving
                .get(id)
                .is_some_and(|t| now.duration_since(*t) < LEAVING_FOR);
            recently && !gone_since && !leaving && state == ProgressState::Replicate
        };
        let mut down: Vec<u32> = self
            .raw
            .raft
            .prs()
            .iter()
            .filter(|(id, pr)| **id != me && !up(id, pr.state))
            .filter_map(|(id, _)| node_of(*id).and_then(|n| u32::try_from(n).ok()))
            .collect();
        down.sort_unstable();
        down
    }

    /// Member `node`'s process was found gone (its connection closed and
    /// nothing listens at its address): down until heard from again.
    pub(super) fn note_gone(&mut self, node: u64) {
        let id = super::raft_id(node);
        self.gone.insert(id, Instant::now());
        // Stopped: once back, it is heard from again and counts.
        self.leaving.remove(&id);
    }

    /// Member `node` said it is stopping: on a leader, down from the next
    /// write on; the last log index, which it applies before it stops.
    pub(super) fn note_leaving(&mut self, node: u64) -> Result<u64, DriverError> {
        if self.raw.raft.state != StateRole::Leader {
            return Err(DriverError::NotLeader {
                group: self.group,
                leader: self.leader(),
            });
        }
        self.leaving.insert(super::raft_id(node), Instant::now());
        Ok(self.raw.raft.raft_log.last_index())
    }

    /// Writes (a lone one or a batch) proposed while members are down go
    /// as `Command::Without`, naming them (a lone write becomes a batch of
    /// one, answered as one); anything else as it is.
    pub(super) fn without_down(&self, cmd: Command, waiting: Waiting) -> (Command, Waiting) {
        if self.down.is_empty() {
            return (cmd, waiting);
        }
        let down = self.down.clone();
        match (cmd, waiting) {
            (Command::Batch(writes), w) => (Command::Without { down, writes }, w),
            (w @ Command::Write { .. }, Waiting::One(r)) => (
                Command::Without {
                    down,
                    writes: w.into_batched().into_iter().collect(),
                },
                Waiting::Batch(vec![r]),
            ),
            other => other,
        }
    }
}
