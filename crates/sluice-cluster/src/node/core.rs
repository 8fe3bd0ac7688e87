//! A group's consensus core as the node uses it: the raft-rs driver
//! (`crate::raftrs`, the default), or openraft's `Raft` (a layout with
//! `consensus = "openraft"`).
//! Leadership, writes, read indexes and waits go through `Core` whatever
//! drives the group; what only openraft does here yet (fault injection's
//! stopped core and its restart) asks `Core::openraft`. Membership changes go to each core in its own way
//! (`admin::change`).

use super::*;
use openraft::error::Fatal;
use openraft::vote::RaftLeaderId;

/// A group's consensus core.
pub(crate) enum Core {
    Openraft { raft: Raft, metrics: MetricsRx },
    RaftRs { handle: crate::raftrs::GroupHandle },
}

/// Why a write or read index failed, from either core.
pub(crate) enum CoreError {
    /// This member does not lead (the leader it knows, if any).
    NotLeader(Option<u64>),
    /// The core has stopped (a failed log write, an fsync error).
    Stopped(String),
    /// Anything else (a leader change mid-write: outcome unknown).
    Other(String),
}

impl From<RaftError<TypeConfig, ClientWriteError<TypeConfig>>> for CoreError {
    fn from(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Self {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                CoreError::NotLeader(f.leader_id)
            }
            RaftError::Fatal(f) => CoreError::Stopped(f.to_string()),
            e => CoreError::Other(e.to_string()),
        }
    }
}

impl From<RaftError<TypeConfig, LinearizableReadError<TypeConfig>>> for CoreError {
    fn from(e: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>) -> Self {
        match e {
            RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => {
                CoreError::NotLeader(f.leader_id)
            }
            RaftError::Fatal(f) => CoreError::Stopped(f.to_string()),
            e => CoreError::Other(e.to_string()),
        }
    }
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
pub(crate) enum Watch {
    Openraft(MetricsRx),
    RaftRs(tokio::sync::watch::Receiver<crate::raftrs::GroupStatus>),
}

impl Watch {
    /// The leader known and the current term.
    pub(crate) fn leader_term(&self) -> (Option<u64>, u64) {
        match self {
            Watch::Openraft(m) => {
                let m = m.borrow_watched();
                (m.current_leader, m.current_term)
            }
            Watch::RaftRs(s) => {
                let s = s.borrow();
                (s.leader, s.term)
            }
        }
    }

    /// The vote this member holds (term, candidate, committed), where the
    /// core reports it (openraft).
    pub(crate) fn vote(&self) -> Option<(u64, u64, bool)> {
        match self {
            Watch::Openraft(m) => {
                let m = m.borrow_watched();
                let id = m.vote.leader_id();
                Some((id.term(), *id.node_id(), m.vote.is_committed()))
            }
            Watch::RaftRs(_) => None,
        }
    }

    /// Waits for a change; `false` once the core is gone.
    pub(crate) async fn changed(&mut self) -> bool {
        match self {
            Watch::Openraft(m) => m.changed().await.is_ok(),
            Watch::RaftRs(s) => s.changed().await.is_ok(),
        }
    }
}

impl Core {
    /// The leader this member knows of.
    pub(crate) fn leader(&self) -> Option<u64> {
        match self {
            Core::Openraft { metrics, .. } => metrics.borrow_watched().current_leader,
            Core::RaftRs { handle, .. } => handle.borrow_status().leader,
        }
    }

    pub(crate) fn watch(&self) -> Watch {
        match self {
            Core::Openraft { metrics, .. } => Watch::Openraft(metrics.clone()),
            Core::RaftRs { handle, .. } => Watch::RaftRs(handle.status()),
        }
    }

    /// The voting members.
    pub(crate) fn voters(&self) -> BTreeSet<u64> {
        match self {
            Core::Openraft { metrics, .. } => metrics
                .borrow_watched()
                .membership_config
                .membership()
                .voter_ids()
                .collect(),
            Core::RaftRs { handle } => handle.borrow_status().members.voters.clone(),
        }
    }

    /// Whether `node` is in the group's configuration (a voter, or one
    /// of openraft's learners).
    pub(crate) fn has_member(&self, node: u64) -> bool {
        match self {
            Core::Openraft { metrics, .. } => metrics
                .borrow_watched()
                .membership_config
                .membership()
                .get_node(&node)
                .is_some(),
            Core::RaftRs { handle } => handle.borrow_status().members.contains(node),
        }
    }

    /// The openraft core, if openraft drives the group.
    pub(crate) fn as_openraft(&self) -> Option<&Raft> {
        match self {
            Core::Openraft { raft, .. } => Some(raft),
            Core::RaftRs { .. } => None,
        }
    }

    /// The openraft core, for what only it does here yet; else
    /// `NotSupported` naming `what`.
    pub(crate) fn openraft(&self, g: u64, what: &str) -> Result<&Raft, SluiceError> {
        self.as_openraft().ok_or_else(|| SluiceError::NotSupported {
            what: format!(
                "{what} on shard {}, which runs on the raft-rs driver (not built for it yet)",
                group_name(g)
            ),
        })
    }

    /// Proposes a command; its log index and result once applied here.
    pub(crate) async fn write(&self, cmd: Command) -> Result<(u64, Applied), CoreError> {
        match self {
            Core::Openraft { raft, .. } => {
                let r = raft.client_write(cmd).await?;
                Ok((r.log_id.index, r.data))
            }
            Core::RaftRs { handle, .. } => Ok(handle.propose(cmd).await?),
        }
    }

    /// Waits until a linearizable read may be served here: a quorum
    /// confirmed this member leads, and it has applied everything
    /// committed before the call.
    pub(crate) async fn read_index(&self) -> Result<(), CoreError> {
        match self {
            Core::Openraft { raft, .. } => {
                raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex)
                    .await?;
                Ok(())
            }
            Core::RaftRs { handle, .. } => {
                let index = handle.read_index().await?;
                Ok(handle.wait_applied(index).await?)
            }
        }
    }

    /// The read index for a reader elsewhere: the commit index at which a
    /// quorum confirmed this member leads. The reader waits to apply up to
    /// it (`wait_applied`); the followers hear of that commit now.
    pub(crate) async fn leader_read_index(&self) -> Result<u64, CoreError> {
        match self {
            Core::Openraft { raft, .. } => {
                let id = raft
                    .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
                    .await?;
                let _ = raft.trigger().heartbeat().await;
                Ok(id.index())
            }
            Core::RaftRs { handle, .. } => Ok(handle.read_index().await?),
        }
    }

    /// Waits (at most `t`) until this member has applied `index`.
    pub(crate) async fn wait_applied(
        &self,
        index: u64,
        t: Duration,
        what: &'static str,
    ) -> Result<(), String> {
        match self {
            Core::Openraft { raft, .. } => raft
                .wait(Some(t))
                .applied_index_at_least(Some(index), what)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Core::RaftRs { handle, .. } => {
                match tokio::time::timeout(t, handle.wait_applied(index)).await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err(format!(
                        "{what}: index {index} not applied within {} ms",
                        t.as_millis()
                    )),
                }
            }
        }
    }

    /// Tells the followers the commit index now (openraft holds it back
    /// for up to `commit_hold_us`; raft-rs sends it at once anyway).
    pub(crate) async fn heartbeat(&self) {
        if let Some(raft) = self.as_openraft() {
            let _ = raft.trigger().heartbeat().await;
        }
    }

    /// Stands for election now; `false` once the core is shutting down.
    pub(crate) async fn elect(&self) -> bool {
        match self {
            Core::Openraft { raft, .. } => raft.trigger().elect(false).await.is_ok(),
            Core::RaftRs { handle, .. } => {
                handle.campaign();
                handle.borrow_status().stopped.is_none()
            }
        }
    }

    pub(crate) async fn shutdown(&self) {
        match self {
            Core::Openraft { raft, .. } => {
                let _ = raft.shutdown().await;
            }
            Core::RaftRs { handle, .. } => handle.stop(),
        }
    }

    /// Why openraft stopped the core, once it has.
    pub(crate) fn openraft_stop(&self) -> Option<Fatal<TypeConfig>> {
        match self {
            Core::Openraft { metrics, .. } => metrics.borrow_watched().running_state.clone().err(),
            Core::RaftRs { .. } => None,
        }
    }
}
