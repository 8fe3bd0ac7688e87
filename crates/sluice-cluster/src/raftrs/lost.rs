//! A member that starts with nothing (no term, no vote, no log, no
//! snapshot) may have lost what it had: a volatile shard's log lives in
//! `/dev/shm`, which a reboot empties; an operator may wipe a data
//! directory and start the node again. Raft counts on a member keeping
//! what it acknowledged and the vote it gave: one that forgot them can
//! vote for a member that lacks writes it had acknowledged, and that
//! member, elected, overwrites them everywhere. (Three members, the third
//! cut off; a put acknowledged by the leader and the second; the second
//! rebooted and the leader cut off in turn: the third, asking the empty
//! second, was elected without the put, and the put was gone for good.)
//!
//! So such a member (with `DriverSettings::guard_lost_state`, which a
//! node sets) starts out holding back (`LostState::Hold`): it neither
//! votes nor stands for election until it has caught up from a leader,
//! which it knows once its commit point is an entry of the current term
//! (all that was committed before is then in its log). The node asks the
//! group's other voters what they hold (`ClusterNode::watch_lost_state`)
//! and tells it (`GroupHandle::lost_state`) when that is not coming:
//!
//! - a majority (itself included) holds nothing and none that answered
//!   holds anything: the group is new, or every member lost its state (a
//!   whole cluster rebooted: a volatile shard's data is gone), so it goes
//!   on as a new member would (`LostState::No`);
//! - a majority holds nothing but some member holds a log: it votes but
//!   does not stand (`LostState::VoteOnly`), so the member with the log is
//!   elected rather than an empty one.
//!
//! Otherwise it waits for a leader: a shard that lost a majority of its
//! members' state, or whose members with state are down, stays without a
//! leader until they are back, rather than elect one that lost writes.

use super::{Driver, MessageType, RaftMessage};

/// Whether a member that started with nothing may vote and stand, from
/// the least held back to the most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum LostState {
    /// It had state, has caught up, or was told to go on.
    #[default]
    No,
    /// Votes, does not stand.
    VoteOnly,
    /// Neither votes nor stands.
    Hold,
}

impl LostState {
    pub fn as_str(self) -> &'static str {
        match self {
            LostState::No => "no",
            LostState::Hold => "hold",
            LostState::VoteOnly => "vote_only",
        }
    }
}

impl Driver {
    /// Whether `msg` is one this member does not take while it holds back.
    pub(super) fn held_back(&self, msg: &RaftMessage) -> bool {
        let vote = matches!(
            msg.get_msg_type(),
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
        );
        match self.lost {
            LostState::No => false,
            LostState::Hold => vote || msg.get_msg_type() == MessageType::MsgTimeoutNow,
            LostState::VoteOnly => msg.get_msg_type() == MessageType::MsgTimeoutNow,
        }
    }

    /// A leader's heartbeat names a commit point past the end of this
    /// member's log: the leader counts entries this member acknowledged
    /// and no longer has (it lost them: started with nothing, or its log's
    /// tail was cut). raft-rs panics on such a heartbeat, and with no new
    /// write the leader would never send them again: the commit point is
    /// taken back to the log's end, and the leader is told where that is
    /// (a rejected append naming it, which `forgotten` reads). Returns the
    /// message to send.
    pub(super) fn behind_heartbeat(&mut self, msg: &mut RaftMessage) -> Option<RaftMessage> {
        let last = self.raw.raft.raft_log.last_index();
        if msg.get_msg_type() != MessageType::MsgHeartbeat || msg.commit <= last {
            return None;
        }
        tracing::info!(group = %crate::types::group_name(self.group), from = msg.from, commit = msg.commit, last, "the leader counts entries this member no longer has; asking for them again");
        let mut tell = RaftMessage::default();
        tell.set_msg_type(MessageType::MsgAppendResponse);
        (tell.to, tell.from, tell.term) = (msg.from, self.raw.raft.id, msg.term);
        (tell.reject, tell.index, tell.reject_hint) = (true, msg.commit, last);
        msg.commit = last;
        Some(tell)
    }

    /// On a leader: a follower's rejected append whose log ends before
    /// what it had acknowledged (`behind_heartbeat`): its progress starts
    /// over from there, so its next heartbeat answer brings it the entries
    /// again (raft-rs never moves a follower's match point back itself).
    pub(super) fn forgotten(&mut self, msg: &RaftMessage) {
        if msg.get_msg_type() != MessageType::MsgAppendResponse
            || !msg.reject
            || self.raw.raft.state != raft::StateRole::Leader
        {
            return;
        }
        let Some(pr) = self.raw.raft.mut_prs().get_mut(msg.from) else {
            return;
        };
        if msg.reject_hint < pr.matched {
            tracing::warn!(group = %crate::types::group_name(self.group), member = ?super::node_of(msg.from), had = pr.matched, has = msg.reject_hint, "a member lost entries it had acknowledged; sending them again");
            pr.matched = msg.reject_hint;
            pr.become_probe();
        }
    }

    /// The first append from a leader to a member that started with
    /// nothing names the commit point it catches up to: it may have
    /// applied up to there before (its lambdas ran then), so it applies up
    /// to there without delivering (`Sm::quiet_through`). (A volatile
    /// member rebooted re-ran its share of every write still in its
    /// leader's log.)
    pub(super) fn first_append(&mut self, msg: &RaftMessage) {
        if self.quiet_pending
            && msg.get_msg_type() == MessageType::MsgAppend
            && msg.term >= self.raw.raft.term
        {
            self.quiet_pending = false;
            self.sm.quiet_through(msg.commit);
        }
    }

    /// After a turn: holding back ends once this member has caught up
    /// from a leader (its commit point is an entry of the current term).
    pub(super) fn check_caught_up(&mut self) {
        if self.lost == LostState::No || self.raw.raft.leader_id == raft::INVALID_ID {
            return;
        }
        let log = &self.raw.raft.raft_log;
        if log.committed > 0 && log.term(log.committed).ok() == Some(self.raw.raft.term) {
            tracing::info!(group = %crate::types::group_name(self.group), commit = log.committed, "started with no state; caught up from the leader, votes again");
            self.lost = LostState::No;
            // Caught up from a snapshot alone: no append said how far.
            self.sm.release_reads();
        }
    }

    /// The node's verdict (`GroupHandle::lost_state`): only ever less held
    /// back than now.
    pub(super) fn set_lost(&mut self, to: LostState) {
        if to < self.lost {
            tracing::info!(group = %crate::types::group_name(self.group), to = to.as_str(), "started with no state, as a majority of the members did");
            self.lost = to;
            if to == LostState::No {
                self.sm.release_reads();
            }
        }
    }
}
