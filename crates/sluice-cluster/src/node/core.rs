//! A group's consensus core as the node uses it: a handle on its raft-rs
//! driver (`crate::raftrs`). Leadership, writes, read indexes and waits go
//! through `Core`; membership changes through `admin::change`.

use super::*;

/// A group's consensus core.
pub(crate) struct Core {
    pub(crate) handle: crate::raftrs::GroupHandle,
}

/// Why a write or read index failed.
pub(crate) enum CoreError {
    /// This member does not lead (the leader it knows, if any).
    NotLeader(Option<u64>),
    /// The core has stopped (a failed log write, an fsync error).
    Stopped(String),
    /// Anything else (a leader change mid-write: outcome unknown).
    Other(String),
}

impl From<crate::raftrs::DriverError> for CoreError {
    fn from(e: crate::raftrs::DriverError) -> Self {
        use crate::raftrs::DriverError as D;
        match e {
            D::NotLeader { leader, .. } => CoreError::NotLeader(leader),
            D::Stopped { reason, .. } => CoreError::Stopped(reason),
            e => CoreError::Other(e.to_string()),
        }
    }
}

/// A group's leadership as its core reports it, for waits (`failover`).
pub(crate) struct Watch(tokio::sync::watch::Receiver<crate::raftrs::GroupStatus>);

impl Watch {
    /// The leader known and the current term.
    pub(crate) fn leader_term(&self) -> (Option<u64>, u64) {
        let s = self.0.borrow();
        (s.leader, s.term)
    }

    /// Waits for a change; `false` once the core is gone.
    pub(crate) async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}

impl Core {
    /// The leader this member knows of. A stopped member knows none: what
    /// it last saw may be itself, and a request it took as that leader
    /// would fail; told there is no leader here, clients and peers ask
    /// the other members, who elect one.
    pub(crate) fn leader(&self) -> Option<u64> {
        let st = self.handle.borrow_status();
        st.leader.filter(|_| st.stopped.is_none())
    }

    pub(crate) fn watch(&self) -> Watch {
        Watch(self.handle.status())
    }

    /// The voting members.
    pub(crate) fn voters(&self) -> BTreeSet<u64> {
        self.handle.borrow_status().members.voters.clone()
    }

    /// Whether `node` is in the group's configuration (a voter or a
    /// learner).
    pub(crate) fn has_member(&self, node: u64) -> bool {
        self.handle.borrow_status().members.contains(node)
    }

    /// Proposes a command; its log index and result once applied here.
    pub(crate) async fn write(&self, cmd: Command) -> Result<(u64, Applied), CoreError> {
        Ok(self.handle.propose(cmd).await?)
    }

    /// Waits until a linearizable read may be served here: a quorum
    /// confirmed this member leads, and it has applied everything
    /// committed before the call.
    pub(crate) async fn read_index(&self) -> Result<(), CoreError> {
        let handle = &self.handle;
        let index = handle.read_index().await?;
        Ok(handle.wait_applied(index).await?)
    }

    /// The read index for a reader elsewhere: the commit index at which a
    /// quorum confirmed this member leads. The reader waits to apply up to
    /// it (`wait_applied`); the followers hear of that commit now.
    pub(crate) async fn leader_read_index(&self) -> Result<u64, CoreError> {
        Ok(self.handle.read_index().await?)
    }

    /// Waits (at most `t`) until this member has applied `index`.
    pub(crate) async fn wait_applied(
        &self,
        index: u64,
        t: Duration,
        what: &'static str,
    ) -> Result<(), String> {
        match tokio::time::timeout(t, self.handle.wait_applied(index)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "{what}: index {index} not applied within {} ms",
                t.as_millis()
            )),
        }
    }

    /// Stands for election now; `false` once the core is shutting down.
    pub(crate) async fn elect(&self) -> bool {
        let handle = &self.handle;
        handle.campaign();
        handle.borrow_status().stopped.is_none()
    }

    pub(crate) async fn shutdown(&self) {
        self.handle.stop()
    }
}
