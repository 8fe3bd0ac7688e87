//! The second consensus driver (issue #20): a group's Raft core is TiKV's
//! I/O-free `raft` crate (raft-rs), driven by one task that owns it and
//! takes everything through one channel: proposals, peers' messages,
//! ticks. On each `Ready` the task sends the messages (a leader's before
//! its own append, so the followers' writes overlap it), appends the new
//! entries to the group's `LogStore`, saves the hard state, applies the
//! committed entries with the state machine (`Sm`) and answers each
//! proposal by its log index. No hand-off between tasks on a put's way:
//! what `experiments/raft-floor` measured at Redis `WAIT`'s latency and
//! throughput, where openraft's task structure (the driver before this
//! one) cost about twice (ARCHITECTURE.md, "Consensus library").
//!
//! Commands never pass through raft-rs: its entries carry a one-byte
//! marker (`DATA_COMMAND`), the command stays in our log (values by
//! reference), and a message's commands travel
//! beside it (`Outgoing::commands`, one per marked entry, in order). A
//! command between its arrival and its append waits in `pending`. Writes
//! proposed in one turn of the task (those that queued while it was busy)
//! go as one entry (`Command::Batch`, bounded as `node/write`'s batches:
//! `types::batch_len`),
//! each answered with its own result.
//!
//! A synced log (a persistent shard's) is fsync'd by its writer thread
//! while the task goes on (raft-rs's asynchronous ready): the task hands
//! the entries over, keeps the ready's answers (`held`) and tells raft-rs
//! how far the log is durable when the writer reports (`persisted`), so a
//! leader replicates while its own copy is written and appends arriving
//! meanwhile share the next fsync.
//!
//! Snapshots: a member builds one off its task once enough was applied
//! (`maybe_snapshot`), then purges its log up to it; a follower the
//! leader's log no longer covers is sent the saved snapshot
//! (`storage::RaftLog::snapshot`) and installs it (`install_snapshot`).
//!
//! Elections, replication, commit, apply, restarts from the log, a
//! leader's proposals failed when it steps down, read index, leadership
//! transfer, snapshots, membership changes (`change_members`: the whole
//! configuration in each change's context, applied as single changes:
//! `apply_members`); messages on the peer wire (`wire`) through the node's
//! peer connections (`transport`), a group's queue of them bounded
//! (`Inbox`). Every replication group runs on it (`node/rs.rs`). Which
//! members a leader counts as down for lambdas: `down`; a member that
//! starts with nothing (or lost entries it had acknowledged): `lost`.

mod down;
mod logger;
mod lost;
mod storage;
#[cfg(test)]
mod tests;
pub mod transport;
pub mod wire;

use crate::log::LogStore;
use crate::sm::Sm;
use crate::types::{Applied, Command, Entry, EntryPayload, LogId};
use raft::eraftpb::{self, MessageType};
use raft::{RawNode, StateRole};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use storage::RaftLog;
use tokio::sync::{mpsc, oneshot, watch};

pub use lost::LostState;
pub use raft::eraftpb::Message as RaftMessage;

/// An entry's data in raft-rs's log: our log holds its command.
const DATA_COMMAND: u8 = 1;

/// raft-rs's id of a member (raft-rs reserves 0; Sluice's node ids start
/// at 0).
pub fn raft_id(node: u64) -> u64 {
    node + 1
}

/// The member of a raft-rs id (`None` for 0: nobody).
fn node_of(id: u64) -> Option<u64> {
    id.checked_sub(1)
}

/// A message for a peer: raft-rs's message and the commands of its
/// entries (one per entry whose data is `DATA_COMMAND`, in order).
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub group: u64,
    /// The member it goes to.
    pub to: u64,
    pub msg: RaftMessage,
    pub commands: Vec<Command>,
}

/// Where a group's messages go (the peer transport; tests route them in
/// process). Never blocks: a message that cannot go is dropped, and
/// raft-rs sends again.
pub trait Transport: Send + Sync + 'static {
    fn send(&self, out: Outgoing);
}

/// Timing and limits of a group.
#[derive(Clone, Debug)]
pub struct DriverSettings {
    /// One tick of raft-rs's clock: the leader's heartbeat interval.
    pub tick: Duration,
    /// A follower that hears nothing for a random number of ticks in
    /// `election_ticks` starts an election.
    pub election_ticks: (usize, usize),
    /// Most bytes of values one append message carries (one entry always
    /// goes).
    pub max_bytes_per_msg: u64,
    /// A leader tells followers of a new commit index only with its next
    /// append or heartbeat (raft-rs's `skip_bcast_commit`): half the
    /// messages per write, but a follower applies a write up to a
    /// heartbeat later when no other write follows it.
    pub skip_bcast_commit: bool,
    /// Append messages a leader keeps in flight to one follower: fewer
    /// means larger messages under load (entries queue while one is in
    /// flight), more means less waiting on a fast link. Each carries up
    /// to `max_bytes_per_msg` of values, so this also bounds what a
    /// leader reads back from its log in one turn for a follower behind
    /// (32: 32 MiB of 1 MB entries; with 256, a leader elected while a
    /// follower was far behind read a quarter of a gigabyte back before
    /// its next heartbeat).
    pub max_inflight_msgs: usize,
    /// A member snapshots its state machine and purges its log once this
    /// many entries were applied since its last snapshot...
    pub snapshot_every: u64,
    /// ... or once its log holds more than this many bytes beyond the
    /// entries kept after a snapshot...
    pub snapshot_bytes: u64,
    /// ... or, sooner, once it holds more than `SNAPSHOT_GROWTH` times its
    /// last snapshot's size, or this many bytes if that is larger: a
    /// member whose state is small keeps a log a few times its state's
    /// size rather than `snapshot_bytes` of it (as Redis rewrites its
    /// append-only file once it has grown by a set ratio). A volatile
    /// shard's log lives in memory, and its recycled segments need no
    /// fresh pages.
    pub snapshot_min_bytes: u64,
    /// A member that starts with nothing neither votes nor stands until
    /// it has caught up or is told to (`lost.rs`). A node sets it; off,
    /// such a member votes at once.
    pub guard_lost_state: bool,
}

impl Default for DriverSettings {
    /// `ClusterSettings`' default timing (heartbeat 50 ms, elections
    /// after 200-400 ms).
    fn default() -> Self {
        DriverSettings {
            tick: Duration::from_millis(50),
            election_ticks: (4, 8),
            max_bytes_per_msg: 1 << 20,
            skip_bcast_commit: false,
            max_inflight_msgs: 32,
            snapshot_every: 10_000,
            snapshot_bytes: 256 << 20,
            snapshot_min_bytes: 32 << 20,
            guard_lost_state: false,
        }
    }
}

/// A snapshot copies the whole state: taken once the log holds this many
/// times the last one's size (or more), snapshots cost at most a quarter
/// of what the log takes in when the same keys are overwritten, the
/// worst case (`DriverSettings::snapshot_min_bytes`).
const SNAPSHOT_GROWTH: u64 = 4;

/// A leader counts a follower as live (keeps in memory, and does not
/// purge, the entries it has yet to take) while it has heard from it
/// within this many of the longest election timeout. Not raft-rs's
/// `recent_active`: check-quorum clears that for every follower once per
/// election timeout, and until each answers again a follower merely
/// behind under load looked gone: the memory tail let go of the entries
/// it was about to need (the leader read them back from its segments for
/// it), and a snapshot purged past them (the follower was sent the whole
/// state). Both were in the 1 MB 16-client stall.
const LIVE_TIMEOUTS: usize = 4;

/// Why a proposal was not applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    #[error("not the leader of group {group} (leader: {})", leader.map_or("unknown".into(), |l| format!("node {l}")))]
    NotLeader { group: u64, leader: Option<u64> },
    #[error("group {group}: the leader changed before the write was applied here (outcome unknown: retry with the same request id)")]
    LeaderChanged { group: u64, leader: Option<u64> },
    #[error("group {group} stopped: {reason}")]
    Stopped { group: u64, reason: String },
    /// Applying an entry gave a result that does not fit its proposal
    /// (the group goes on).
    #[error("group {group}: {reason}")]
    Unexpected { group: u64, reason: String },
    /// A membership change that cannot be made now (the group goes on).
    #[error("membership change of group {group} refused: {reason}")]
    Refused { group: u64, reason: String },
}

/// What a group's members and callers can see of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupStatus {
    pub leader: Option<u64>,
    pub term: u64,
    pub is_leader: bool,
    /// The commit index and the index applied to the state machine.
    pub commit: u64,
    pub applied: u64,
    /// Set once the group has stopped (a storage or apply error), with why.
    pub stopped: Option<String>,
    /// The configuration this member has applied (Sluice node ids).
    pub members: Members,
    /// On a leader, the members it counts as down for lambdas dispatched
    /// to one member (`down.rs`), Sluice node ids.
    pub down: Vec<u32>,
    /// A member that started with nothing and holds back its vote
    /// (`lost.rs`).
    pub lost: LostState,
}

/// A group's configuration: the members that vote, and the learners
/// (members that receive the log but do not vote yet: a newcomer while it
/// catches up).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Members {
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
}

impl Members {
    /// Whether `node` is in the configuration (a voter or a learner).
    pub fn contains(&self, node: u64) -> bool {
        self.voters.contains(&node) || self.learners.contains(&node)
    }

    /// The configuration after `change` (`None`: it changes nothing).
    fn after(&self, change: MemberChange) -> Option<Members> {
        let mut m = self.clone();
        let changed = match change {
            MemberChange::AddLearner(n) => !m.voters.contains(&n) && m.learners.insert(n),
            MemberChange::Promote(n) => {
                m.learners.remove(&n);
                m.voters.insert(n)
            }
            MemberChange::Remove(n) => m.voters.remove(&n) | m.learners.remove(&n),
        };
        changed.then_some(m)
    }

    /// Our log's form of it (a membership entry's payload: the state
    /// machine keeps the latest in its snapshots).
    pub(crate) fn to_membership(&self) -> crate::types::Membership {
        crate::types::Membership::new(self.voters.clone(), self.learners.iter().copied())
    }

    pub(crate) fn of_membership(m: &crate::types::Membership) -> Members {
        Members {
            voters: m.voter_ids().collect(),
            learners: m.learner_ids().collect(),
        }
    }

    /// raft-rs's form of it.
    fn conf_state(&self) -> eraftpb::ConfState {
        eraftpb::ConfState {
            voters: self.voters.iter().map(|&v| raft_id(v)).collect(),
            learners: self.learners.iter().map(|&l| raft_id(l)).collect(),
            ..Default::default()
        }
    }

    fn of_conf_state(cs: &eraftpb::ConfState) -> Members {
        Members {
            voters: cs.voters.iter().filter_map(|&v| node_of(v)).collect(),
            learners: cs.learners.iter().filter_map(|&l| node_of(l)).collect(),
        }
    }
}

/// One step of a membership change: a newcomer joins as a learner, is
/// promoted once it has caught up, and any member can be removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberChange {
    AddLearner(u64),
    Promote(u64),
    Remove(u64),
}

/// A proposal's answer: its log index and what applying it produced.
type Reply = oneshot::Sender<Result<(u64, Applied), DriverError>>;

/// Who waits for a proposed entry: one proposal, or the writes of a
/// `Command::Batch` the task made of proposals that arrived together.
enum Waiting {
    One(Reply),
    Batch(Vec<Reply>),
}

impl Waiting {
    fn fail(self, e: DriverError) {
        match self {
            Waiting::One(r) => drop(r.send(Err(e))),
            Waiting::Batch(rs) => rs.into_iter().for_each(|r| drop(r.send(Err(e.clone())))),
        }
    }

    /// Hands each waiter its result (a batch's, one per write).
    fn answer(self, group: u64, index: u64, applied: Applied) {
        match (self, applied) {
            (Waiting::One(r), a) => drop(r.send(Ok((index, a)))),
            (Waiting::Batch(rs), Applied::Batch(results)) if results.len() == rs.len() => {
                for (r, a) in rs.into_iter().zip(results) {
                    let _ = r.send(Ok((index, a)));
                }
            }
            (w, other) => w.fail(DriverError::Unexpected {
                group,
                reason: format!("entry {index}: unexpected result for a batch: {other:?}"),
            }),
        }
    }
}

/// A read index: the commit index once a quorum confirmed this member
/// still leads.
type ReadReply = oneshot::Sender<Result<u64, DriverError>>;

enum Input {
    Propose(Command, Reply),
    /// A peer's message, its commands and its size (`Inbox`).
    Peer(Box<RaftMessage>, Vec<Command>, usize),
    Campaign,
    /// Hand leadership to this member (`transfer_leader`).
    Transfer(u64),
    ReadIndex(ReadReply),
    /// A synced log's writer made the entries of `Ready` number `.0`
    /// durable (or failed to).
    Persisted(u64, Result<(), String>),
    /// Shut the group down (the node stops).
    Stop,
    /// Member (Sluice node id) found gone: its connection closed and
    /// nothing listens at its address (`peer_gone`).
    Gone(u64),
    /// Member (Sluice node id) is stopping (`leaving`): answered with the
    /// last log index on a leader.
    Leaving(u64, ReadReply),
    /// A snapshot built off the task is saved, up to this entry (or it
    /// failed).
    Snapshotted(Result<Option<LogId>, String>),
    /// A step of a membership change (answered once applied here).
    Change(MemberChange, Reply),
    /// The node's verdict on a member that started with nothing.
    Lost(LostState),
}

impl Input {
    /// The size of a peer's message (0 for anything else).
    fn peer_bytes(&self) -> usize {
        match self {
            Input::Peer(_, _, bytes) => *bytes,
            _ => 0,
        }
    }
}

/// A turn takes in at most this many bytes of peers' messages (at least
/// one message): a follower that fell behind appends what it was sent in
/// pieces, answering and ticking between them, not in one write of
/// everything queued (a quarter of a second for 256 MB of 1 MB entries,
/// in which the node's other groups waited and its leader's election
/// timeout ran out).
const TURN_BYTES: usize = 8 << 20;

/// A snapshot sent to a follower that has not answered within this is
/// reported failed, and raft-rs sends one again (a lost message would
/// otherwise leave the follower waiting for good).
const SNAPSHOT_ANSWER: Duration = Duration::from_secs(10);

/// Why a group stopped when it was asked to.
const SHUT_DOWN: &str = "shut down";

/// A running group: how to reach its task.
#[derive(Clone)]
pub struct GroupHandle {
    group: u64,
    tx: mpsc::UnboundedSender<Input>,
    inbox: Arc<Inbox>,
    status: watch::Receiver<GroupStatus>,
    /// `matched`, updated by the task every tick.
    matched: Matched,
}

/// The bound on a group's queue of peers' messages, in messages and in
/// bytes. Proposals are bounded by the clients' in-flight limits, and
/// peers' appends by raft-rs's flow control (`max_inflight_msgs` per
/// follower); this bounds the rest (a task that fell behind, a peer that
/// sends too much), dropping messages raft-rs sends again.
pub struct Inbox {
    messages: AtomicUsize,
    bytes: AtomicUsize,
    max_messages: usize,
    max_bytes: usize,
    dropped: AtomicU64,
}

impl Inbox {
    pub fn new(max_messages: usize, max_bytes: usize) -> Inbox {
        Inbox {
            messages: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            max_messages,
            max_bytes,
            dropped: AtomicU64::new(0),
        }
    }

    /// Room for a message of `bytes`, taken; `false` (and counted as
    /// dropped) when the queue is at its bound. A message larger than the
    /// byte bound goes when the queue is empty.
    fn take(&self, bytes: usize) -> bool {
        let n = self.messages.fetch_add(1, Ordering::AcqRel);
        let b = self.bytes.fetch_add(bytes, Ordering::AcqRel);
        if n >= self.max_messages || (n > 0 && b + bytes > self.max_bytes) {
            self.release(bytes);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// A message taken from the queue.
    fn release(&self, bytes: usize) {
        self.messages.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Peers' messages a group queues at most (`Inbox`).
const INBOX_MESSAGES: usize = 4096;
/// ... and their bytes.
const INBOX_BYTES: usize = 256 << 20;

/// A leader's view of how far each member's log matches its own.
type Matched = std::sync::Arc<parking_lot::Mutex<BTreeMap<u64, u64>>>;

impl GroupHandle {
    /// Why the group's task is gone.
    fn stopped(&self) -> DriverError {
        DriverError::Stopped {
            group: self.group,
            reason: self
                .status
                .borrow()
                .stopped
                .clone()
                .unwrap_or_else(|| "its task ended".into()),
        }
    }

    /// Proposes a command; answers once this member has applied it, with
    /// its log index (or why not).
    pub async fn propose(&self, cmd: Command) -> Result<(u64, Applied), DriverError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Input::Propose(cmd, tx))
            .map_err(|_| self.stopped())?;
        rx.await.map_err(|_| self.stopped())?
    }

    /// A read index (raft's linearizable read, as etcd's): the leader's
    /// commit index once a quorum has confirmed, after the ask, that this
    /// member still leads. A read that then waits until this member has
    /// applied it (`wait_applied`) sees every write acknowledged before
    /// the ask. Asks arriving together share one round of heartbeats.
    pub async fn read_index(&self) -> Result<u64, DriverError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Input::ReadIndex(tx))
            .map_err(|_| self.stopped())?;
        rx.await.map_err(|_| self.stopped())?
    }

    /// Waits until this member has applied `index` (or has stopped).
    pub async fn wait_applied(&self, index: u64) -> Result<(), DriverError> {
        let mut rx = self.status.clone();
        let st = rx
            .wait_for(|s| s.applied >= index || s.stopped.is_some())
            .await
            .map_err(|_| self.stopped())?;
        match &st.stopped {
            Some(reason) if st.applied < index => Err(DriverError::Stopped {
                group: self.group,
                reason: reason.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Hands the group a peer's message (from the transport).
    /// `bytes`: the message's size on the wire. A group whose task has
    /// fallen behind (its queue of peers' messages at `Inbox`'s bound)
    /// drops it, and says so (`false`): raft-rs sends again, and the
    /// node's memory stays bounded whatever its peers send.
    pub fn deliver(&self, msg: RaftMessage, commands: Vec<Command>, bytes: usize) -> bool {
        if !self.inbox.take(bytes) {
            return false;
        }
        if self
            .tx
            .send(Input::Peer(Box::new(msg), commands, bytes))
            .is_err()
        {
            self.inbox.release(bytes);
        }
        true
    }

    /// Peers' messages dropped because the group's queue was full.
    pub fn peer_messages_dropped(&self) -> u64 {
        self.inbox.dropped.load(Ordering::Relaxed)
    }

    /// Starts an election now (a leader known to be gone).
    pub fn campaign(&self) {
        let _ = self.tx.send(Input::Campaign);
    }

    /// A member that started with nothing may vote (`VoteOnly`), or vote
    /// and stand (`No`): see `lost.rs`.
    pub fn lost_state(&self, to: LostState) {
        let _ = self.tx.send(Input::Lost(to));
    }

    /// Member `node`'s process is gone (its connection closed and nothing
    /// listens at its address): a leader counts it as down until it hears
    /// from it again (`down.rs`).
    pub fn peer_gone(&self, node: u64) {
        let _ = self.tx.send(Input::Gone(node));
    }

    /// Member `node` is stopping: a leader counts it as down from its next
    /// write on (`down.rs`) and answers its last log index (what the
    /// member applies before it stops, so it runs the lambdas of every
    /// write that names it); a follower answers `NotLeader`.
    pub async fn leaving(&self, node: u64) -> Result<u64, DriverError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Input::Leaving(node, tx))
            .map_err(|_| self.stopped())?;
        rx.await.map_err(|_| self.stopped())?
    }

    /// Asks this member, if it leads, to hand leadership to member `to`
    /// (raft's leadership transfer: once `to`'s log has caught up it is
    /// told to start an election at once; proposals meanwhile are refused
    /// as `NotLeader`, and a transfer that does not finish within an
    /// election timeout is abandoned). A follower ignores it.
    pub fn transfer_leader(&self, to: u64) {
        let _ = self.tx.send(Input::Transfer(to));
    }

    /// The group's status, updated as it changes.
    pub fn status(&self) -> watch::Receiver<GroupStatus> {
        self.status.clone()
    }

    /// The group's status now (no allocation: for every write's checks).
    pub fn borrow_status(&self) -> watch::Ref<'_, GroupStatus> {
        self.status.borrow()
    }

    /// Proposes one step of a membership change (only a leader takes
    /// one, and only once the last has been applied); answers with its
    /// log index once this member has applied it (the status's
    /// `members` shows the new configuration by then).
    pub async fn change_members(&self, change: MemberChange) -> Result<u64, DriverError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Input::Change(change, tx))
            .map_err(|_| self.stopped())?;
        rx.await
            .map_err(|_| self.stopped())?
            .map(|(index, _)| index)
    }

    /// The index up to which each member's log matches this leader's, as
    /// of the last tick (empty on a follower).
    pub fn matched(&self) -> BTreeMap<u64, u64> {
        self.matched.lock().clone()
    }

    /// Shuts the group down: what it holds fails as `Stopped`, and it
    /// takes nothing more.
    pub fn stop(&self) {
        let _ = self.tx.send(Input::Stop);
    }
}

/// Starts group `group` on member `me`, over `log` (opened, possibly with
/// entries from before a restart) and `sm`. The configuration is the one
/// the state machine's snapshot holds, else `voters` (Sluice node ids:
/// the group's first members, or the latest the node knows of); the
/// membership changes in the log after it are applied again as the log
/// is. A member outside it (a newcomer, or one removed) does not stand
/// for election; it learns the configuration from the leader's log or
/// snapshot. Must be called within a tokio runtime.
pub fn start(
    group: u64,
    me: u64,
    voters: &[u64],
    log: LogStore,
    sm: Sm,
    transport: std::sync::Arc<dyn Transport>,
    settings: &DriverSettings,
) -> Result<GroupHandle, DriverError> {
    let stopped = |reason: String| DriverError::Stopped { group, reason };
    let members = sm
        .membership()
        .map(|m| Members::of_membership(&m))
        .unwrap_or_else(|| Members {
            voters: voters.iter().copied().collect(),
            learners: BTreeSet::new(),
        });
    if !members.contains(me) {
        tracing::info!(group = %crate::types::group_name(group), ?members, "not a member yet: waiting for the leader's log or snapshot");
    }
    let cfg = raft::Config {
        id: raft_id(me),
        heartbeat_tick: 1,
        election_tick: settings.election_ticks.0,
        min_election_tick: settings.election_ticks.0,
        max_election_tick: settings.election_ticks.1,
        applied: sm.applied_index(),
        max_size_per_msg: settings.max_bytes_per_msg,
        max_inflight_msgs: settings.max_inflight_msgs,
        // Off: raft-rs 0.7 merges new entries into a queued append without
        // entries (a commit notice) under that one's index, and the
        // follower then refuses the append (seen under 1 MB puts). The
        // transport writes a peer's queued messages in one go anyway.
        batch_append: false,
        check_quorum: true,
        pre_vote: true,
        skip_bcast_commit: settings.skip_bcast_commit,
        ..Default::default()
    };
    let store = RaftLog {
        sm: sm.clone(),
        log: log.clone(),
        members: members.clone(),
        snapshot_wanted: Default::default(),
    };
    let raw = RawNode::new(&cfg, store, &logger::for_group(group))
        .map_err(|e| stopped(format!("starting raft: {e}")))?;
    let snap_index = sm.snapshot_index();
    let snapshot_size = sm.snapshot_bytes();
    // Nothing at all, where a member must have had something: it may have
    // lost it (`lost.rs`).
    let lost = match settings.guard_lost_state
        && log.hard_state() == (0, 0)
        && log.bounds().last == 0
        && snap_index == 0
        && members.voters.contains(&me)
        && members.voters.len() > 1
    {
        true => LostState::Hold,
        false => LostState::No,
    };
    if lost == LostState::Hold {
        sm.hold_reads();
        tracing::info!(group = %crate::types::group_name(group), "started with no state: votes once caught up from a leader, or once a majority of the members are found to have none either");
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let (status_tx, status) = watch::channel(GroupStatus {
        members,
        lost,
        ..Default::default()
    });
    let status_tx = std::sync::Arc::new(status_tx);
    let on_panic = status_tx.clone();
    let matched = Matched::default();
    let inbox = Arc::new(Inbox::new(INBOX_MESSAGES, INBOX_BYTES));
    let driver = Driver {
        group,
        raw,
        synced: log.is_synced(),
        log,
        sm,
        transport,
        pending: HashMap::new(),
        proposals: BTreeMap::new(),
        writes: Vec::new(),
        transferring: Vec::new(),
        transferring_since: None,
        status: status_tx,
        was_leader: false,
        inbox: tx.downgrade(),
        asked_reads: Vec::new(),
        reads: HashMap::new(),
        next_read: 0,
        writing: VecDeque::new(),
        held: VecDeque::new(),
        last_ready: 0,
        snap_index,
        snapshotting: false,
        snapshots_sent: HashMap::new(),
        heard: HashMap::new(),
        gone: HashMap::new(),
        leaving: HashMap::new(),
        down: Vec::new(),
        lost,
        quiet_pending: lost == LostState::Hold,
        live_for: settings.tick * (settings.election_ticks.1 * LIVE_TIMEOUTS) as u32,
        snapshot_every: settings.snapshot_every.max(1),
        snapshot_bytes: settings.snapshot_bytes,
        snapshot_min_bytes: settings.snapshot_min_bytes,
        max_bytes_per_msg: settings.max_bytes_per_msg,
        snapshot_size,
        peers_inbox: inbox.clone(),
        matched: matched.clone(),
        to_answer: Default::default(),
    };
    driver.size_spares();
    let task = tokio::spawn(driver.run(rx, settings.tick));
    // A panic in raft-rs (an invariant it checks) ends the task: the group
    // stops with the reason, as on a storage error, instead of leaving its
    // callers waiting.
    tokio::spawn(async move {
        if let Err(e) = task.await {
            if e.is_panic() {
                let reason = format!("the raft core panicked: {e}");
                tracing::error!(group = %crate::types::group_name(group), %reason, "raft group stopped");
                on_panic.send_modify(|s| s.stopped = Some(reason));
            }
        }
    });
    Ok(GroupHandle {
        group,
        tx,
        inbox,
        status,
        matched,
    })
}

/// The task that owns a group's raft-rs core.
struct Driver {
    group: u64,
    raw: RawNode<RaftLog>,
    log: LogStore,
    sm: Sm,
    transport: std::sync::Arc<dyn Transport>,
    /// Commands of entries raft-rs holds but our log does not yet, by
    /// index, with their term: this member's proposals and what peers
    /// sent. Emptied after every `Ready` (all of it is appended by then).
    pending: HashMap<u64, (u64, Command)>,
    /// This member's proposals by log index, with their term.
    proposals: BTreeMap<u64, (u64, Waiting)>,
    /// Writes proposed since the last turn: proposed together as one
    /// entry (`Command::Batch`) when the turn ends.
    writes: Vec<(crate::types::BatchedWrite, Reply)>,
    /// Proposals made while this leader hands its leadership over (raft-rs
    /// drops them meanwhile): proposed once the transfer is given up, or
    /// refused naming the new leader once it is done (`after_transfer`),
    /// so their clients go straight there.
    transferring: Vec<(Command, Waiting)>,
    /// When the oldest of `transferring` came.
    transferring_since: Option<std::time::Instant>,
    status: std::sync::Arc<watch::Sender<GroupStatus>>,
    was_leader: bool,
    /// A synced log: appends are fsync'd by its writer thread while this
    /// task goes on (raft-rs's asynchronous ready).
    synced: bool,
    /// This task's own channel, for the writer thread's reports (weak: the
    /// group still stops once every handle is gone).
    inbox: mpsc::WeakUnboundedSender<Input>,
    /// Numbers of the readies whose entries the writer has not yet made
    /// durable, oldest first.
    writing: VecDeque<u64>,
    /// Messages that may go only once their ready is durable (a
    /// follower's answers), by ready number.
    held: VecDeque<(u64, Vec<RaftMessage>)>,
    /// The number of the latest ready.
    last_ready: u64,
    /// The last entry the saved snapshot covers.
    snap_index: u64,
    /// A snapshot is being built (off the task).
    snapshotting: bool,
    /// Followers sent a snapshot they have not yet answered, since when.
    snapshots_sent: HashMap<u64, std::time::Instant>,
    /// When each peer was last heard from (any message).
    heard: HashMap<u64, std::time::Instant>,
    /// When each peer's process was last found gone (`Input::Gone`).
    gone: HashMap<u64, std::time::Instant>,
    /// Peers that said they are stopping, and when (`Input::Leaving`).
    leaving: HashMap<u64, std::time::Instant>,
    /// The members counted as down as of the last turn (`down.rs`): the
    /// writes proposed now name them.
    down: Vec<u32>,
    /// Started with nothing: holds back its vote (`lost.rs`).
    lost: LostState,
    /// Started with nothing and no leader's append seen yet (`lost.rs`).
    quiet_pending: bool,
    /// A follower heard from within this long is live (`LIVE_TIMEOUTS`
    /// of the longest election timeout).
    live_for: Duration,
    snapshot_every: u64,
    snapshot_bytes: u64,
    snapshot_min_bytes: u64,
    /// Most bytes of values one append carries (`split_append`).
    max_bytes_per_msg: u64,
    /// The size of the saved snapshot (0: none yet).
    snapshot_size: u64,
    matched: Matched,
    /// The bound on peers' messages queued for this task.
    peers_inbox: Arc<Inbox>,
    /// Entries of appends this follower took and has yet to answer, for
    /// marks (`SLUICE_MARKS`) only.
    to_answer: parking_lot::Mutex<Vec<u64>>,
    /// Read index asks not yet handed to raft-rs (they go together, once
    /// this leader has committed an entry of its term).
    asked_reads: Vec<ReadReply>,
    /// Read index asks handed to raft-rs, by the context they went with.
    reads: HashMap<u64, Vec<ReadReply>>,
    next_read: u64,
}

impl Driver {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Input>, tick: Duration) {
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let res = tokio::select! {
                biased;
                input = rx.recv() => {
                    let Some(input) = input else {
                        // Every handle is gone: the group shuts down.
                        self.fail_all(|group| DriverError::Stopped {
                            group,
                            reason: SHUT_DOWN.into(),
                        });
                        self.status.send_modify(|s| s.stopped = Some(SHUT_DOWN.into()));
                        return;
                    };
                    // What is already queued goes into the same Ready, up
                    // to `TURN_BYTES` of peers' messages.
                    let mut bytes = input.peer_bytes();
                    let mut res = self.handle(input);
                    while bytes < TURN_BYTES {
                        let (Ok(()), Ok(input)) = (&res, rx.try_recv()) else { break };
                        bytes += input.peer_bytes();
                        res = self.handle(input);
                    }
                    res
                }
                _ = ticks.tick() => {
                    // Holding back: no election of its own.
                    if self.lost == LostState::No {
                        self.raw.tick();
                    }
                    self.check_snapshots_sent();
                    self.publish_matched();
                    Ok(())
                }
            };
            if let Err(reason) = res.and_then(|()| self.turn()) {
                if reason != SHUT_DOWN {
                    tracing::error!(group = %crate::types::group_name(self.group), %reason, "raft group stopped");
                }
                let r = reason.clone();
                self.fail_all(move |group| DriverError::Stopped {
                    group,
                    reason: r.clone(),
                });
                self.status.send_modify(|s| s.stopped = Some(reason));
                // Refuse what comes after; the handle reports the reason.
                return;
            }
            self.publish();
        }
    }

    /// After a batch of inputs: read asks, then the ready; once more if
    /// that ready committed this leader's first entry of its term and
    /// read asks were waiting for it.
    fn turn(&mut self) -> Result<(), String> {
        self.after_transfer();
        self.propose_writes();
        self.ask_reads();
        self.on_ready()?;
        if !self.asked_reads.is_empty() && self.raw.raft.commit_to_current_term() {
            self.ask_reads();
            self.on_ready()?;
        }
        self.log.set_needed_after(self.done_with());
        self.maybe_snapshot();
        Ok(())
    }

    /// The last entry this member is done with: applied, and on a
    /// leader also on every live follower (one gone, not heard from
    /// within `live_for`, does not hold the log's memory; it reads back
    /// from the segments).
    fn done_with(&self) -> u64 {
        let applied = self.raw.raft.raft_log.applied;
        self.slowest_live_follower()
            .map_or(applied, |m| m.min(applied))
    }

    /// On a leader, the least any live follower (heard from within
    /// `live_for`) has matched; `None` on a follower or with none live.
    fn slowest_live_follower(&self) -> Option<u64> {
        if self.raw.raft.state != StateRole::Leader {
            return None;
        }
        let (me, now) = (self.raw.raft.id, std::time::Instant::now());
        let live = |id: &u64| {
            self.heard
                .get(id)
                .is_some_and(|t| now.duration_since(*t) <= self.live_for)
        };
        self.raw
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| **id != me && live(id))
            .map(|(_, pr)| pr.matched)
            .min()
    }

    fn leader(&self) -> Option<u64> {
        node_of(self.raw.raft.leader_id)
    }

    fn handle(&mut self, input: Input) -> Result<(), String> {
        match input {
            Input::Propose(cmd, reply) => self.propose(cmd, reply),
            Input::Peer(msg, commands, bytes) => {
                self.peers_inbox.release(bytes);
                self.step(*msg, commands)
            }
            Input::Campaign if self.lost != LostState::No => {}
            Input::Campaign => {
                if let Err(e) = self.raw.campaign() {
                    tracing::debug!(group = self.group, error = %e, "campaign refused");
                }
            }
            Input::Transfer(to) => {
                if self.raw.raft.state == StateRole::Leader {
                    self.raw.transfer_leader(raft_id(to));
                }
            }
            Input::ReadIndex(reply) => {
                if self.raw.raft.state == StateRole::Leader {
                    self.asked_reads.push(reply);
                } else {
                    let _ = reply.send(Err(DriverError::NotLeader {
                        group: self.group,
                        leader: self.leader(),
                    }));
                }
            }
            Input::Persisted(n, res) => {
                res.map_err(|e| format!("the log's writer: {e}"))?;
                self.persisted(n);
            }
            Input::Stop => return Err(SHUT_DOWN.into()),
            Input::Gone(node) => {
                self.note_gone(node);
                self.down = self.down_members();
            }
            Input::Leaving(node, reply) => {
                let r = self.note_leaving(node);
                self.down = self.down_members();
                let _ = reply.send(r);
            }
            Input::Snapshotted(res) => self.snapshotted(res),
            Input::Change(change, reply) => {
                self.propose_writes();
                self.propose_change(change, reply);
            }
            Input::Lost(to) => self.set_lost(to),
        }
        Ok(())
    }

    /// The writer made ready `n` durable (and every ready before it):
    /// raft-rs learns how far the log is durable, and the answers held
    /// for those readies go.
    fn persisted(&mut self, n: u64) {
        while self.writing.front().is_some_and(|&w| w <= n) {
            self.writing.pop_front();
        }
        // Readies without entries are durable once those before them are.
        let through = match self.writing.front() {
            Some(&w) => w - 1,
            None => self.last_ready,
        };
        self.raw.on_persist_ready(through);
        while self.held.front().is_some_and(|(r, _)| *r <= through) {
            if let Some((_, msgs)) = self.held.pop_front() {
                self.send(msgs);
            }
        }
    }

    /// A proposal: a write waits for the others of this turn (see
    /// `propose_writes`); anything else goes at once, after them.
    fn propose(&mut self, cmd: Command, reply: Reply) {
        match cmd {
            Command::Write { .. } => {
                if let Some(w) = cmd.into_batched() {
                    self.writes.push((w, reply));
                }
            }
            other => {
                self.propose_writes();
                self.propose_entry(other, Waiting::One(reply));
            }
        }
    }

    /// Proposes the writes of this turn: one entry for those that fit a
    /// batch (`types::batch_len`), a lone write as itself.
    fn propose_writes(&mut self) {
        let mut writes = std::mem::take(&mut self.writes);
        while !writes.is_empty() {
            let n = crate::types::batch_len(writes.iter().map(|(w, _)| w.bytes()));
            let (mut batch, mut replies): (Vec<_>, Vec<_>) = writes.drain(..n).unzip();
            if batch.len() == 1 {
                let (w, r) = (batch.remove(0), replies.remove(0));
                self.propose_entry(w.into(), Waiting::One(r));
            } else {
                self.propose_entry(Command::Batch(batch), Waiting::Batch(replies));
            }
        }
    }

    fn propose_entry(&mut self, cmd: Command, waiting: Waiting) {
        let not_leader = DriverError::NotLeader {
            group: self.group,
            leader: self.leader(),
        };
        if self.raw.raft.state != StateRole::Leader {
            waiting.fail(not_leader);
            return;
        }
        let (cmd, waiting) = self.without_down(cmd, waiting);
        match self.raw.propose(Vec::new(), vec![DATA_COMMAND]) {
            Ok(()) => {
                let index = self.raw.raft.raft_log.last_index();
                let term = self.raw.raft.term;
                self.pending.insert(index, (term, cmd));
                self.proposals.insert(index, (term, waiting));
            }
            // A leader transferring its leadership drops proposals: they
            // wait for the outcome.
            Err(_) if self.raw.raft.lead_transferee.is_some() => {
                self.transferring_since
                    .get_or_insert_with(std::time::Instant::now);
                self.transferring.push((cmd, waiting))
            }
            Err(_) => waiting.fail(not_leader),
        }
    }

    /// Once a leadership transfer is over: what was proposed meanwhile is
    /// proposed now, or refused with the new leader's name. (The member
    /// named stands for election first, so this one may know no leader
    /// for a moment: the proposals wait for it, at most the longest
    /// election timeout; then they are refused with no leader named and
    /// their clients ask the other members.)
    fn after_transfer(&mut self) {
        let r = &self.raw.raft;
        let longest_election = self.live_for / LIVE_TIMEOUTS as u32;
        let waited = self
            .transferring_since
            .is_some_and(|t| t.elapsed() >= longest_election);
        if self.transferring.is_empty()
            || r.lead_transferee.is_some()
            || (r.leader_id == raft::INVALID_ID && !waited)
        {
            return;
        }
        self.transferring_since = None;
        for (cmd, waiting) in std::mem::take(&mut self.transferring) {
            self.propose_entry(cmd, waiting);
        }
    }

    /// Proposes one step of a membership change: a ConfChangeV2 entry
    /// whose context is the whole configuration after it (`conf_data`).
    fn propose_change(&mut self, change: MemberChange, reply: Reply) {
        use eraftpb::ConfChangeType as T;
        let refuse = |reason: &str| DriverError::Refused {
            group: self.group,
            reason: reason.into(),
        };
        if self.raw.raft.state != StateRole::Leader {
            let _ = reply.send(Err(DriverError::NotLeader {
                group: self.group,
                leader: self.leader(),
            }));
            return;
        }
        let now = self.status.borrow().members.clone();
        let Some(after) = now.after(change) else {
            let _ = reply.send(Err(refuse("it changes nothing")));
            return;
        };
        if after.voters.is_empty() {
            let _ = reply.send(Err(refuse("it would leave the group without a voter")));
            return;
        }
        if self.raw.raft.has_pending_conf() {
            let _ = reply.send(Err(refuse(
                "the previous membership change is not applied yet; try again",
            )));
            return;
        }
        let (ty, node) = match change {
            MemberChange::AddLearner(n) => (T::AddLearnerNode, n),
            MemberChange::Promote(n) => (T::AddNode, n),
            MemberChange::Remove(n) => (T::RemoveNode, n),
        };
        let mut single = eraftpb::ConfChangeSingle::default();
        single.set_change_type(ty);
        single.node_id = raft_id(node);
        let cc = conf_change(&after, vec![single]);
        let before = self.raw.raft.raft_log.last_index();
        let proposed = self.raw.propose_conf_change(Vec::new(), cc);
        let index = self.raw.raft.raft_log.last_index();
        // raft-rs turns a change it will not make into an empty entry.
        let kept = self
            .raw
            .raft
            .raft_log
            .unstable
            .entries
            .last()
            .is_some_and(|e| e.index == index && is_conf_change(e));
        match proposed {
            Ok(()) if index > before && kept => {
                tracing::info!(group = %crate::types::group_name(self.group), ?change, index, "membership change proposed");
                let term = self.raw.raft.term;
                self.proposals.insert(index, (term, Waiting::One(reply)));
            }
            Ok(()) => {
                let _ = reply.send(Err(refuse("raft-rs did not take it (see the node's log)")));
            }
            // A leader transferring its leadership drops proposals.
            Err(_) => {
                let _ = reply.send(Err(DriverError::NotLeader {
                    group: self.group,
                    leader: self.leader(),
                }));
            }
        }
    }

    /// Makes raft-rs's configuration `want`, one simple change at a time
    /// (as raft-rs restores a configuration): from the configuration
    /// before the entry that named it, the one step proposed; on a
    /// member that started elsewhere (a newcomer replaying the log from
    /// its start, a member restarted with a later configuration) what it
    /// takes to get there, or nothing.
    fn apply_members(&mut self, want: &Members) -> Result<(), String> {
        use eraftpb::ConfChangeType as T;
        let have = Members::of_conf_state(&self.raw.raft.prs().conf().to_conf_state());
        let mut steps: Vec<(T, u64)> = Vec::new();
        steps.extend(
            want.voters
                .difference(&have.voters)
                .map(|&n| (T::AddNode, n)),
        );
        steps.extend(
            want.learners
                .iter()
                .filter(|n| !have.learners.contains(n) && !want.voters.contains(n))
                .map(|&n| (T::AddLearnerNode, n)),
        );
        steps.extend(
            have.voters
                .union(&have.learners)
                .filter(|n| !want.contains(**n))
                .map(|&n| (T::RemoveNode, n)),
        );
        for (ty, n) in steps {
            let mut cc = eraftpb::ConfChange::default();
            cc.set_change_type(ty);
            cc.node_id = raft_id(n);
            self.raw
                .apply_conf_change(&cc)
                .map_err(|e| format!("applying a membership change ({ty:?} of node {n}): {e}"))?;
        }
        self.publish_members();
        // A leader taken out of the voters hands its leadership to the
        // voter furthest along (raft-rs would go on leading without a vote).
        let r = &self.raw.raft;
        if r.state == StateRole::Leader && !r.prs().conf().voters().contains(r.id) {
            let next = r
                .prs()
                .iter()
                .filter(|(id, _)| r.prs().conf().voters().contains(**id))
                .max_by_key(|(_, pr)| pr.matched)
                .map(|(id, _)| *id);
            if let Some(to) = next {
                tracing::info!(group = %crate::types::group_name(self.group), to = ?node_of(to), "this leader is no longer a voter: handing its leadership over");
                self.raw.transfer_leader(to);
            }
        }
        Ok(())
    }

    /// Publishes how far each member's log matches (a leader's view).
    fn publish_matched(&self) {
        let mut m = self.matched.lock();
        m.clear();
        if self.raw.raft.state == StateRole::Leader {
            for (id, pr) in self.raw.raft.prs().iter() {
                if let Some(n) = node_of(*id) {
                    m.insert(n, pr.matched);
                }
            }
        }
    }

    /// Publishes the configuration raft-rs holds now.
    fn publish_members(&self) {
        let now = Members::of_conf_state(&self.raw.raft.prs().conf().to_conf_state());
        self.status.send_if_modified(|s| {
            let changed = s.members != now;
            s.members = now;
            changed
        });
    }

    /// A peer's message: its commands are held for the entries they
    /// belong to, then raft-rs steps it.
    fn step(&mut self, mut msg: RaftMessage, commands: Vec<Command>) {
        if self.held_back(&msg) {
            return;
        }
        // raft-rs panics on an append whose entries do not follow its
        // index one by one: a peer's message must not stop this node.
        let contiguous = msg
            .entries
            .iter()
            .enumerate()
            .all(|(i, e)| e.index == msg.index + 1 + i as u64);
        if !contiguous {
            tracing::warn!(
                group = self.group,
                from = msg.from,
                index = msg.index,
                entries = ?msg.entries.iter().map(|e| e.index).collect::<Vec<_>>(),
                "a peer's append whose entries do not follow its index; dropped"
            );
            return;
        }
        let marked = msg
            .entries
            .iter()
            .filter(|e| e.data == [DATA_COMMAND])
            .count();
        if marked != commands.len() {
            tracing::warn!(
                group = self.group,
                from = msg.from,
                entries = marked,
                commands = commands.len(),
                "a peer's message with commands that do not match its entries; dropped"
            );
            return;
        }
        if crate::marks::on() {
            self.mark_step(&msg);
        }
        let mut commands = commands.into_iter();
        for e in msg.entries.iter().filter(|e| e.data == [DATA_COMMAND]) {
            if let Some(c) = commands.next() {
                self.pending.insert(e.index, (e.term, c));
            }
        }
        self.heard.insert(msg.from, std::time::Instant::now());
        if let Some(tell) = self.behind_heartbeat(&mut msg) {
            self.send(vec![tell]);
        }
        self.forgotten(&msg);
        self.first_append(&msg);
        if let Err(e) = self.raw.step(msg) {
            tracing::debug!(group = self.group, error = %e, "message not stepped");
        }
    }

    /// Marks (`SLUICE_MARKS`) of a peer's message: on a leader, a
    /// follower's acknowledgement of the entries past what it had
    /// matched; on a follower, the entries of an append it will answer.
    fn mark_step(&mut self, msg: &RaftMessage) {
        use sluice_types::marks::Point;
        match msg.get_msg_type() {
            MessageType::MsgAppendResponse if !msg.reject => {
                let from = msg.from;
                if let Some(pr) = self.raw.raft.prs().get(from) {
                    let ix = pr.matched + 1..=msg.index;
                    crate::marks::mark_all(
                        Point::Acked,
                        self.group,
                        ix,
                        node_of(from).unwrap_or(0),
                    );
                }
            }
            MessageType::MsgAppend => {
                self.to_answer
                    .lock()
                    .extend(msg.entries.iter().map(|e| e.index));
            }
            _ => {}
        }
    }

    /// Our entry for raft-rs's `e`, whose command is pending.
    fn ours_pending(&mut self, e: &eraftpb::Entry) -> Result<Entry, String> {
        let log_id = LogId::new(crate::types::CommittedLeaderId::new(e.term, 0), e.index);
        if is_conf_change(e) {
            let m = members_of_conf_change(&e.data)
                .map_err(|why| format!("entry {}: {why}", e.index))?;
            return Ok(Entry {
                log_id,
                payload: EntryPayload::Membership(m.to_membership()),
            });
        }
        let payload = match e.data.as_slice() {
            [] => EntryPayload::Blank,
            [DATA_COMMAND] => match self.pending.remove(&e.index) {
                Some((term, cmd)) if term == e.term => EntryPayload::Normal(cmd),
                _ => {
                    return Err(format!(
                        "entry {} (term {}) to append has no command",
                        e.index, e.term
                    ))
                }
            },
            _ => {
                return Err(format!(
                    "entry {} holds data this driver does not write ({} bytes)",
                    e.index,
                    e.data.len()
                ))
            }
        };
        Ok(Entry { log_id, payload })
    }

    /// The commands of the marked entries of a message: from `pending`
    /// (not appended yet), the rest read from the log in one go.
    fn commands_of(&self, entries: &[eraftpb::Entry]) -> Result<Vec<Command>, String> {
        let pending = |e: &eraftpb::Entry| {
            self.pending
                .get(&e.index)
                .filter(|(term, _)| *term == e.term)
                .map(|(_, c)| c)
        };
        let marked: Vec<&eraftpb::Entry> = entries
            .iter()
            .filter(|e| e.data == [DATA_COMMAND])
            .collect();
        let appended: Vec<u64> = marked
            .iter()
            .filter(|e| pending(e).is_none())
            .map(|e| e.index)
            .collect();
        let logged: HashMap<u64, Entry> = match (appended.first(), appended.last()) {
            (Some(&lo), Some(&hi)) => self
                .log
                .entries_in(lo, hi + 1, u64::MAX)
                .map_err(|err| err.to_string())?
                .into_iter()
                .map(|e| (e.log_id.index, e))
                .collect(),
            _ => HashMap::new(),
        };
        let found = |e: &eraftpb::Entry| match logged.get(&e.index) {
            Some(Entry {
                log_id,
                payload: EntryPayload::Normal(c),
            }) if log_id.leader_id.term == e.term => Some(c),
            _ => None,
        };
        marked
            .iter()
            .map(|e| {
                pending(e).or_else(|| found(e)).cloned().ok_or_else(|| {
                    format!(
                        "no command for entry {} (term {}) in the log",
                        e.index, e.term
                    )
                })
            })
            .collect()
    }

    /// Marks (`SLUICE_MARKS`) of a message going out: an append's
    /// entries sent to a follower; a follower's answer to the appends it
    /// took.
    fn mark_send(&self, msg: &RaftMessage, to: u64) {
        use sluice_types::marks::Point;
        match msg.get_msg_type() {
            MessageType::MsgAppend => crate::marks::mark_all(
                Point::Send,
                self.group,
                msg.entries.iter().map(|e| e.index),
                to,
            ),
            MessageType::MsgAppendResponse if !msg.reject => {
                let me = node_of(self.raw.raft.id).unwrap_or(0);
                let mut answered = self.to_answer.lock();
                let ix: Vec<u64> = answered
                    .iter()
                    .copied()
                    .filter(|i| *i <= msg.index)
                    .collect();
                answered.retain(|i| *i > msg.index);
                crate::marks::mark_all(Point::Reply, self.group, ix, me);
            }
            _ => {}
        }
    }

    fn send(&self, msgs: Vec<RaftMessage>) {
        for msg in msgs {
            let Some(to) = node_of(msg.to) else { continue };
            if crate::marks::on() {
                self.mark_send(&msg, to);
            }
            if msg.get_msg_type() != MessageType::MsgAppend {
                self.transport.send(Outgoing {
                    group: self.group,
                    to,
                    msg,
                    commands: Vec::new(),
                });
                continue;
            }
            let commands = match self.commands_of(&msg.entries) {
                Ok(c) => c,
                Err(e) => {
                    // raft-rs sends again once it hears back.
                    tracing::warn!(group = self.group, to, error = %e, "append not sent");
                    continue;
                }
            };
            for (msg, commands) in split_append(msg, commands, self.max_bytes_per_msg) {
                self.transport.send(Outgoing {
                    group: self.group,
                    to,
                    msg,
                    commands,
                });
            }
        }
    }

    /// Applies committed entries (in the log by now) and answers this
    /// member's proposals among them.
    fn apply(&mut self, committed: Vec<eraftpb::Entry>) -> Result<(), String> {
        let (Some(first), Some(last)) = (committed.first(), committed.last()) else {
            return Ok(());
        };
        let ours = self
            .log
            .entries_in(first.index, last.index + 1, u64::MAX)
            .map_err(|e| format!("reading committed entries: {e}"))?;
        let matches = ours.len() == committed.len()
            && ours
                .iter()
                .zip(&committed)
                .all(|(o, c)| o.log_id.index == c.index && o.log_id.leader_id.term == c.term);
        if !matches {
            return Err(format!(
                "the log does not hold committed entries {}..={} as raft-rs has them",
                first.index, last.index
            ));
        }
        let changes: Vec<Members> = ours
            .iter()
            .filter_map(|e| match &e.payload {
                EntryPayload::Membership(m) => Some(Members::of_membership(m)),
                _ => None,
            })
            .collect();
        let results = self
            .sm
            .apply_entries(ours.into_iter())
            .map_err(|e| format!("applying: {e}"))?;
        // Entries apply in order, and a leader proposes a change only once
        // the last is applied: at most one per batch but for a member
        // catching up, for which the last one counts.
        for m in &changes {
            self.apply_members(m)?;
        }
        for (e, r) in committed.iter().zip(results) {
            // Anything older was overwritten by another leader's entry.
            let older = self.proposals.split_off(&e.index);
            let older = std::mem::replace(&mut self.proposals, older);
            for (_, (_, waiting)) in older {
                waiting.fail(self.leader_changed());
            }
            if let Some((term, waiting)) = self.proposals.remove(&e.index) {
                if term == e.term {
                    waiting.answer(self.group, e.index, r);
                } else {
                    waiting.fail(self.leader_changed());
                }
            }
        }
        Ok(())
    }

    /// Hands the waiting read asks to raft-rs as one read index, once
    /// this leader has committed an entry of its own term (raft-rs ignores
    /// a read index before that).
    fn ask_reads(&mut self) {
        if self.asked_reads.is_empty() || !self.raw.raft.commit_to_current_term() {
            return;
        }
        self.next_read += 1;
        let id = self.next_read;
        self.reads.insert(id, std::mem::take(&mut self.asked_reads));
        self.raw.read_index(id.to_le_bytes().to_vec());
    }

    /// Answers the read asks raft-rs has confirmed.
    fn answer_reads(&mut self, states: Vec<raft::ReadState>) {
        for rs in states {
            let id = <[u8; 8]>::try_from(rs.request_ctx.as_slice()).map(u64::from_le_bytes);
            for reply in id
                .ok()
                .and_then(|id| self.reads.remove(&id))
                .unwrap_or_default()
            {
                let _ = reply.send(Ok(rs.index));
            }
        }
    }

    fn leader_changed(&self) -> DriverError {
        DriverError::LeaderChanged {
            group: self.group,
            leader: self.leader(),
        }
    }

    /// Fails every proposal and read ask this member holds.
    fn fail_all(&mut self, err: impl Fn(u64) -> DriverError) {
        for (_, (_, waiting)) in std::mem::take(&mut self.proposals) {
            waiting.fail(err(self.group));
        }
        for (_, reply) in std::mem::take(&mut self.writes) {
            let _ = reply.send(Err(err(self.group)));
        }
        for (_, waiting) in std::mem::take(&mut self.transferring) {
            waiting.fail(err(self.group));
        }
        let reads = std::mem::take(&mut self.reads).into_values().flatten();
        for reply in reads.chain(std::mem::take(&mut self.asked_reads)) {
            let _ = reply.send(Err(err(self.group)));
        }
    }

    fn on_ready(&mut self) -> Result<(), String> {
        if !self.raw.has_ready() {
            self.pending.clear();
            return Ok(());
        }
        let mut rd = self.raw.ready();
        self.last_ready = rd.number();
        self.answer_reads(rd.take_read_states());
        // A leader's messages go before its own append.
        self.send(rd.take_messages());
        let snapshot = !rd.snapshot().is_empty();
        if snapshot {
            self.install_snapshot(rd.snapshot())?;
            if self.synced {
                // Installing it waited for the log's writer (its purge
                // record is written in queue order, durably): the entries
                // of every earlier ready are durable too.
                self.writing.clear();
                while let Some((_, msgs)) = self.held.pop_front() {
                    self.send(msgs);
                }
            }
        }
        self.apply(rd.take_committed_entries())?;
        let entries = rd
            .take_entries()
            .iter()
            .map(|e| self.ours_pending(e))
            .collect::<Result<Vec<_>, _>>()?;
        // Everything raft-rs held is in the log from here on.
        self.pending.clear();
        // A ready with a snapshot goes the synchronous way below: raft-rs
        // may apply up to the snapshot only once it knows it persisted
        // (`advance` tells it; with the asynchronous ready, the task
        // applied at once and raft-rs panicked: "applied(601) is out of
        // range [prev_applied(8), min(committed(601), persisted(8))]",
        // found by the chaos run).
        if self.synced && !snapshot && (!entries.is_empty() || !self.writing.is_empty()) {
            // A synced log: the writer fsyncs while this task goes on; the
            // ready's answers wait for it (and for the readies before).
            if !entries.is_empty() {
                let (n, inbox) = (rd.number(), self.inbox.clone());
                let done = Box::new(move |res| {
                    if let Some(tx) = inbox.upgrade() {
                        let _ = tx.send(Input::Persisted(n, res));
                    }
                });
                let marked = self.appended_indexes(&entries);
                self.log
                    .append_then(entries, done)
                    .map_err(|e| format!("appending to the log: {e}"))?;
                Self::mark_appended(self.group, marked);
                self.writing.push_back(n);
            }
            self.save_hard_state(rd.hs())?;
            self.held
                .push_back((rd.number(), rd.take_persisted_messages()));
            self.raw.advance_append_async(rd);
            self.raw.advance_apply();
            return Ok(());
        }
        if !entries.is_empty() {
            let marked = self.appended_indexes(&entries);
            self.log
                .append_now(entries)
                .map_err(|e| format!("appending to the log: {e}"))?;
            Self::mark_appended(self.group, marked);
        }
        self.save_hard_state(rd.hs())?;
        self.send(rd.take_persisted_messages());
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.log
                .save_commit(commit)
                .map_err(|e| format!("saving the commit point: {e}"))?;
        }
        self.send(light.take_messages());
        self.apply(light.take_committed_entries())?;
        self.raw.advance_apply();
        Ok(())
    }

    /// The indexes of entries to append, where marks are recorded.
    fn appended_indexes(&self, entries: &[Entry]) -> Option<Vec<u64>> {
        crate::marks::on().then(|| entries.iter().map(|e| e.log_id.index).collect())
    }

    fn mark_appended(group: u64, marked: Option<Vec<u64>>) {
        if let Some(ix) = marked {
            crate::marks::mark_all(sluice_types::marks::Point::LogAppend, group, ix, 0);
        }
    }

    /// Entries kept in the log behind a snapshot, for followers a little
    /// behind (half the snapshot interval, at most 256)...
    fn keep_behind(&self) -> u64 {
        (self.snapshot_every / 2).min(256)
    }

    /// ... and of those only as many as hold `snapshot_min_bytes` (or
    /// `snapshot_bytes`, if smaller) together: 256 entries of 1 MB would
    /// be 256 MB of memory kept for a volatile shard's follower that was
    /// gone.
    fn keep_behind_bytes(&self) -> u64 {
        self.snapshot_min_bytes.min(self.snapshot_bytes)
    }

    /// The log's bytes beyond which a snapshot is taken: `SNAPSHOT_GROWTH`
    /// times the saved snapshot's size, at least `snapshot_min_bytes`, at
    /// most `snapshot_bytes`.
    fn log_limit(&self) -> u64 {
        self.snapshot_size
            .saturating_mul(SNAPSHOT_GROWTH)
            .max(self.snapshot_min_bytes)
            .min(self.snapshot_bytes)
    }

    /// The log keeps as many purged segments for reuse as it needs at
    /// its largest (`log_limit` plus what a snapshot keeps behind it), not
    /// a fixed number: a group whose state is small would otherwise hold
    /// up to 16 idle segments (576 MiB of tmpfs for a volatile shard).
    fn size_spares(&self) {
        let most = self.log_limit().saturating_add(self.keep_behind_bytes());
        self.log.set_spares(crate::log::LogStore::spares_for(most));
    }

    /// Builds a snapshot off the task once `snapshot_every` entries were
    /// applied since the last, or the log holds more than `log_limit`
    /// beyond what a snapshot keeps; `snapshotted` purges the log when it
    /// is saved.
    fn maybe_snapshot(&mut self) {
        let since = self
            .raw
            .raft
            .raft_log
            .applied
            .saturating_sub(self.snap_index);
        // Every turn: the log's total first (one load), the entries kept
        // behind a snapshot walked only past it.
        let limit = self.log_limit();
        let small = || {
            self.log.held_bytes() <= limit
                || self
                    .log
                    .bytes_beyond_kept(self.keep_behind(), self.keep_behind_bytes())
                    <= limit
        };
        let wanted = || {
            self.raw
                .raft
                .raft_log
                .store
                .snapshot_wanted
                .swap(false, std::sync::atomic::Ordering::Relaxed)
        };
        if self.snapshotting || since == 0 || since < self.snapshot_every && small() && !wanted() {
            return;
        }
        self.snapshotting = true;
        let (sm, inbox) = (self.sm.clone(), self.inbox.clone());
        tokio::task::spawn_blocking(move || {
            let res = sm
                .build()
                .map(|s| s.meta.last_log_id)
                .map_err(|e| e.to_string());
            if let Some(tx) = inbox.upgrade() {
                let _ = tx.send(Input::Snapshotted(res));
            }
        });
    }

    /// A snapshot is saved: the log is purged up to it, less the entries
    /// kept behind it. A failed one leaves the log as it is (the next
    /// turn tries again).
    fn snapshotted(&mut self, res: Result<Option<LogId>, String>) {
        self.snapshotting = false;
        match res {
            Ok(Some(id)) => {
                self.snap_index = self.snap_index.max(id.index);
                self.snapshot_size = self.sm.snapshot_bytes();
                self.size_spares();
                let kept =
                    self.log
                        .kept_behind(id.index, self.keep_behind(), self.keep_behind_bytes());
                let mut upto = id.index.saturating_sub(kept);
                // A leader keeps what its live followers have yet to take
                // (as TiKV's leaders compact to the slowest follower): a
                // snapshot is for one that was gone (not heard from
                // within `live_for`), not for one merely behind under load.
                if let Some(slowest) = self.slowest_live_follower() {
                    upto = upto.min(slowest);
                }
                let Some(upto) = self.log.log_id_at(upto).filter(|_| upto > 0) else {
                    return;
                };
                if let Err(e) = self.log.purge_covered(upto) {
                    tracing::warn!(group = %crate::types::group_name(self.group), error = %e, "purging the log after a snapshot failed");
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(group = %crate::types::group_name(self.group), error = %e, "a snapshot failed; the log is kept")
            }
        }
    }

    /// A snapshot from the leader: the state machine takes it, and the
    /// log starts after it.
    fn install_snapshot(&mut self, s: &eraftpb::Snapshot) -> Result<(), String> {
        let m = s.get_metadata();
        let id = LogId::new(crate::types::CommittedLeaderId::new(m.term, 0), m.index);
        let members = Members::of_conf_state(m.get_conf_state());
        let meta = crate::types::SnapshotMeta::new(
            Some(id),
            crate::types::StoredMembership::new(Some(id), members.to_membership()),
        );
        self.sm
            .install(&meta, s.data.clone())
            .map_err(|e| format!("installing a snapshot: {e}"))?;
        self.log
            .reset_to_snapshot(id)
            .map_err(|e| format!("starting the log after a snapshot: {e}"))?;
        self.snap_index = id.index;
        // The state's size, for `log_limit`, as if this member had built it.
        self.snapshot_size = s.data.len() as u64;
        self.size_spares();
        self.publish_members();
        Ok(())
    }

    /// A leader's followers that were sent a snapshot and have not
    /// answered within `SNAPSHOT_ANSWER`: reported failed, so raft-rs
    /// sends again.
    fn check_snapshots_sent(&mut self) {
        if self.raw.raft.state != StateRole::Leader {
            self.snapshots_sent.clear();
            return;
        }
        let waiting: Vec<u64> = self
            .raw
            .raft
            .prs()
            .iter()
            .filter(|(_, pr)| pr.state == raft::ProgressState::Snapshot)
            .map(|(id, _)| *id)
            .collect();
        self.snapshots_sent.retain(|id, _| waiting.contains(id));
        let now = std::time::Instant::now();
        for id in waiting {
            let since = *self.snapshots_sent.entry(id).or_insert(now);
            if now.duration_since(since) > SNAPSHOT_ANSWER {
                tracing::info!(group = %crate::types::group_name(self.group), to = ?node_of(id), "a snapshot sent was not answered; sending again");
                self.raw.report_snapshot(id, raft::SnapshotStatus::Failure);
                self.snapshots_sent.remove(&id);
            }
        }
    }

    /// Saves a ready's hard state: a new term or vote durably (in a
    /// synced log it waits for the writer), the commit point as the log
    /// keeps it.
    fn save_hard_state(&self, hs: Option<&eraftpb::HardState>) -> Result<(), String> {
        let Some(hs) = hs else { return Ok(()) };
        self.log
            .save_hard_state(hs.term, hs.vote)
            .map_err(|e| format!("saving the vote: {e}"))?;
        self.log
            .save_commit(hs.commit)
            .map_err(|e| format!("saving the commit point: {e}"))
    }

    /// Publishes the status; a leader that stepped down fails the
    /// proposals it still held (another leader may or may not commit
    /// them: their outcome is unknown) and its read asks.
    fn publish(&mut self) {
        self.check_caught_up();
        let r = &self.raw.raft;
        let is_leader = r.state == StateRole::Leader;
        let now = GroupStatus {
            leader: self.leader(),
            term: r.term,
            is_leader,
            commit: r.raft_log.committed,
            applied: r.raft_log.applied,
            stopped: None,
            // Published as it changes (`publish_members`).
            members: Members::default(),
            down: self.down_members(),
            lost: self.lost,
        };
        self.down.clone_from(&now.down);
        if self.was_leader && !is_leader {
            let leader = now.leader;
            // Proposals held for a transfer were never proposed: they
            // wait for the new leader's name (`after_transfer`).
            let held = std::mem::take(&mut self.transferring);
            self.fail_all(|group| DriverError::LeaderChanged { group, leader });
            self.transferring = held;
        }
        self.was_leader = is_leader;
        let seen = {
            let s = self.status.borrow();
            (s.term, s.leader)
        };
        if let (true, Some(me)) = (seen != (now.term, now.leader), node_of(self.raw.raft.id)) {
            crate::types::report_leadership(self.group, me, now.term, now.leader);
        }
        self.status.send_if_modified(|s| {
            let changed = (
                s.leader,
                s.term,
                s.is_leader,
                s.commit,
                s.applied,
                &s.down,
                s.lost,
            ) != (
                now.leader,
                now.term,
                now.is_leader,
                now.commit,
                now.applied,
                &now.down,
                now.lost,
            ) || s.stopped.is_some();
            let members = std::mem::take(&mut s.members);
            *s = GroupStatus { members, ..now };
            changed
        });
    }
}

/// An append whose entries carry more than `max` bytes of values, as
/// consecutive appends of at most `max` each (one entry at least), in
/// order: each names the entry before its first (`index`, `log_term`),
/// as a follower checks, and keeps the commit index (a follower commits
/// no further than the entries it has). raft-rs sizes entries by its own
/// encoding, a byte or so each (the values travel beside it), so one
/// append of a busy turn held every large write of it, and a follower
/// read frames of as many megabytes as there were 1 MB writes: buffers
/// of every size, which its receive pool could not reuse (each new one
/// faulted in), and an entry appended only once all had arrived.
fn split_append(
    msg: RaftMessage,
    commands: Vec<Command>,
    max: u64,
) -> Vec<(RaftMessage, Vec<Command>)> {
    use crate::chunks::value_bytes;
    if msg.entries.len() < 2 || commands.iter().map(value_bytes).sum::<u64>() <= max {
        return vec![(msg, commands)];
    }
    let mut head = msg;
    let entries = std::mem::take(&mut head.entries);
    let mut commands = commands.into_iter();
    let mut parts: Vec<(RaftMessage, Vec<Command>)> = Vec::new();
    // A part done: the head's fields, following entry `after` (index,
    // term).
    let mut part = |after: (u64, u64), entries, cmds| {
        let mut m = head.clone();
        (m.index, m.log_term, m.entries) = (after.0, after.1, entries);
        parts.push((m, cmds));
    };
    // The part being filled: the entry it follows, its entries, their
    // commands and values' bytes.
    let mut after = (head.index, head.log_term);
    let (mut cur, mut cur_cmds, mut cur_bytes) = (Vec::<eraftpb::Entry>::new(), Vec::new(), 0u64);
    for e in entries {
        let cmd = (e.data == [DATA_COMMAND])
            .then(|| commands.next())
            .flatten();
        let b = cmd.as_ref().map_or(0, value_bytes);
        if let Some(last) = cur.last().filter(|_| cur_bytes + b > max) {
            let next_after = (last.index, last.term);
            part(
                after,
                std::mem::take(&mut cur),
                std::mem::take(&mut cur_cmds),
            );
            (after, cur_bytes) = (next_after, 0);
        }
        cur_bytes += b;
        cur_cmds.extend(cmd);
        cur.push(e);
    }
    part(after, cur, cur_cmds);
    parts
}

/// Whether raft-rs's entry is a membership change.
fn is_conf_change(e: &eraftpb::Entry) -> bool {
    matches!(
        e.get_entry_type(),
        eraftpb::EntryType::EntryConfChange | eraftpb::EntryType::EntryConfChangeV2
    )
}

/// A membership change as raft-rs takes it: its `changes` (what raft-rs
/// checks when it is proposed) and, as its context, the whole
/// configuration after it (what every member applies: `apply_members`).
fn conf_change(after: &Members, changes: Vec<eraftpb::ConfChangeSingle>) -> eraftpb::ConfChangeV2 {
    eraftpb::ConfChangeV2 {
        changes,
        context: bincode::serialize(after).unwrap_or_default(),
        ..Default::default()
    }
}

/// raft-rs's data of a membership change entry in our log (`storage`):
/// the configuration after it.
fn conf_change_data(after: &Members) -> Vec<u8> {
    prost::Message::encode_to_vec(&conf_change(after, Vec::new()))
}

/// The configuration a membership change entry's data names.
fn members_of_conf_change(data: &[u8]) -> Result<Members, String> {
    let cc = <eraftpb::ConfChangeV2 as prost::Message>::decode(data)
        .map_err(|e| format!("a membership change that does not decode: {e}"))?;
    use bincode::Options;
    let m: Members = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(64 << 10)
        .deserialize(&cc.context)
        .map_err(|e| format!("a membership change without its configuration: {e}"))?;
    if m.voters.is_empty() {
        return Err("a membership change that leaves no voter".into());
    }
    Ok(m)
}
