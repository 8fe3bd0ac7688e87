//! The consensus type configuration, the replicated commands, and group ids.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sluice_store::ShardId;
use sluice_types::{PoolType, PurgeReport, PutResult, ReqId, SluiceError, Trace};

/// One write to a replicated group's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A put (`value: Some`) or remove (`None`) on a data shard. The
    /// timestamp is the proposing leader's clock; replicas raise it to
    /// stay strictly increasing in log order, so they all agree on it.
    Write {
        key: String,
        value: Option<Bytes>,
        expected: Option<u64>,
        timestamp_us: u64,
        req_id: Option<ReqId>,
        trace: Option<Trace>,
    },
    /// A metadata change (`MetaCommand` as JSON; rare, so readability
    /// wins over size).
    Meta(String),
    /// A time frontier for a data shard: every write applied after this
    /// entry gets a timestamp above `timestamp_us` (the proposing leader's
    /// clock, already past the time a reader asked about), so once a
    /// member has applied it, reads at earlier times can no longer change
    /// there (see `ClusterNode::time_barrier`).
    Tick { timestamp_us: u64 },
    /// Writes proposed together (puts that arrived while earlier ones were
    /// being replicated): one log entry, one fsync, applied in order,
    /// each with its own version and result. Its own element type, so a
    /// batch never holds a batch: a peer's message decodes to a fixed
    /// depth whatever it contains.
    Batch(Vec<BatchedWrite>),
    /// Deletes every key under `prefix` (a removed pool's path) but not
    /// under one of `except` (pools inside it), with all their versions
    /// (`Store::purge_shard`).
    Purge { prefix: String, except: Vec<String> },
    /// Writes (one or more, applied as a `Batch`) proposed while the
    /// leader counted these members of the shard as down (not heard from
    /// within an election timeout, or their process gone, or not yet
    /// caught up): a lambda dispatched to one member (`one`) runs on one
    /// of the others, so a member that is down does not take its share
    /// of the shard's keys with it. Proposed only while some member is
    /// down: a log without one is written as before. (Last: a variant's
    /// tag is its place, and logs written before it decode as they were.)
    Without {
        down: Vec<u32>,
        writes: Vec<BatchedWrite>,
    },
}

/// A short description for logs (keys and sizes, never values).
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Write { key, value, .. } => match value {
                Some(v) => write!(f, "put {key} ({} bytes)", v.len()),
                None => write!(f, "remove {key}"),
            },
            Command::Meta(m) => write!(f, "meta {} bytes", m.len()),
            Command::Tick { timestamp_us } => write!(f, "tick {timestamp_us}"),
            Command::Batch(ws) => write!(f, "batch of {} writes", ws.len()),
            Command::Purge { prefix, .. } => write!(f, "purge {prefix}"),
            Command::Without { down, writes } => {
                write!(f, "batch of {} writes without {down:?}", writes.len())
            }
        }
    }
}

/// One write of a `Command::Batch`: the fields of `Command::Write`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchedWrite {
    pub key: String,
    pub value: Option<Bytes>,
    pub expected: Option<u64>,
    pub timestamp_us: u64,
    pub req_id: Option<ReqId>,
    pub trace: Option<Trace>,
}

/// At most this many writes, or this many bytes of keys and values, go
/// in one `Command::Batch` (at least one write goes), whichever consensus
/// driver batches them. Large values gain nothing from sharing an entry
/// (1 MB puts at 16 clients: 0.73× redis `WAIT 2` with a 1 MiB cap, 0.36×
/// to 0.47× with 4 MiB, where batches of four 1 MB values went out as one
/// message).
pub const BATCH_WRITES: usize = 256;
pub const BATCH_BYTES: usize = 1 << 20;

/// How many writes at the head of a queue go in one batch, given their
/// sizes (`BatchedWrite::bytes`) in queue order: at least one, unless the
/// queue is empty.
pub fn batch_len(sizes: impl IntoIterator<Item = usize>) -> usize {
    let (mut n, mut bytes) = (0, 0);
    for size in sizes {
        if n > 0 && (n >= BATCH_WRITES || bytes + size > BATCH_BYTES) {
            break;
        }
        bytes += size;
        n += 1;
    }
    n
}

impl BatchedWrite {
    /// The bytes of its key and value (what a batch is bounded by).
    pub fn bytes(&self) -> usize {
        self.key.len() + self.value.as_ref().map_or(0, Bytes::len)
    }
}

impl From<BatchedWrite> for Command {
    fn from(w: BatchedWrite) -> Command {
        Command::Write {
            key: w.key,
            value: w.value,
            expected: w.expected,
            timestamp_us: w.timestamp_us,
            req_id: w.req_id,
            trace: w.trace,
        }
    }
}

impl Command {
    /// The writes of a batch (of either kind), borrowed; none for a lone
    /// write and any other command.
    pub fn batched(&self) -> &[BatchedWrite] {
        match self {
            Command::Batch(ws) | Command::Without { writes: ws, .. } => ws,
            _ => &[],
        }
    }

    /// A write as a batch element (`None` for anything but a write).
    pub fn into_batched(self) -> Option<BatchedWrite> {
        match self {
            Command::Write {
                key,
                value,
                expected,
                timestamp_us,
                req_id,
                trace,
            } => Some(BatchedWrite {
                key,
                value,
                expected,
                timestamp_us,
                req_id,
                trace,
            }),
            _ => None,
        }
    }
}

/// A metadata change as the metadata log holds it (`Command::Meta`, as
/// JSON): the change and, for one a client asked for, its request id, so
/// that a retry of a change already made (its reply lost with its
/// leader) is answered with the first result instead of being made
/// again. Entries from before the id was kept decode with none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaEntry {
    #[serde(flatten)]
    pub cmd: MetaCommand,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub req_id: Option<ReqId>,
}

/// A metadata change, applied by every node in log order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MetaCommand {
    PoolCreate {
        spec: sluice_types::PoolSpec,
        created_us: u64,
    },
    PoolRemove {
        path: String,
    },
    /// Drops a removed pool whose shards were purged (`PoolTable::purge`).
    PoolPurge {
        path: String,
        /// What the shards' purges deleted: the change's result when
        /// given (so a client's retry of the purge is answered with it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        report: Option<PurgeReport>,
    },
    /// The members of a shard after a membership change (what clients
    /// route by).
    SetMembers {
        group: u64,
        members: Vec<u32>,
    },
    /// Data flow graphs to run on every node: (id, normalized JSON),
    /// replacing graphs with the same id.
    DfgSet {
        graphs: Vec<(String, String)>,
    },
    DfgRemove {
        id: String,
    },
    /// A change to the policies every node enforces.
    Policy {
        change: sluice_types::policy::PolicyChange,
    },
}

/// What applying a command produced. Errors travel as JSON text because
/// `SluiceError` is an internally tagged enum (binary formats cannot
/// decode those).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    Put(Result<PutResult, String>),
    Meta(Result<String, String>),
    None,
    /// One result per command of a `Command::Batch`.
    Batch(Vec<Applied>),
    Purged(Result<sluice_types::PurgeReport, String>),
}

impl Applied {
    pub fn err(e: &SluiceError) -> String {
        serde_json::to_string(e).unwrap_or_else(|_| e.to_string())
    }

    pub fn decode_err(s: &str) -> SluiceError {
        serde_json::from_str(s).unwrap_or_else(|_| SluiceError::Internal {
            reason: s.to_string(),
        })
    }
}

/// A leader's id: the term and the node that led it. Entries carry the
/// one that proposed them (`LogId`); a member's vote names the one it
/// granted. The field layout is the one openraft 0.9/0.10 gave its
/// default (`leader_id_adv`) type, so logs and snapshots written by
/// earlier builds decode unchanged (`records_keep_their_encoding`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct LeaderId {
    pub term: u64,
    pub node_id: u64,
}

/// The leader id an entry was committed under (the same type).
pub type CommittedLeaderId = LeaderId;

impl LeaderId {
    pub fn new(term: u64, node_id: u64) -> Self {
        LeaderId { term, node_id }
    }
}

/// A log entry's place: its proposer's leader id and its index.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct LogId {
    pub leader_id: LeaderId,
    pub index: u64,
}

impl LogId {
    pub fn new(leader_id: LeaderId, index: u64) -> Self {
        LogId { leader_id, index }
    }

    pub fn term(&self) -> u64 {
        self.leader_id.term
    }
}

/// A member's vote (raft-rs's hard state keeps the term and the vote;
/// `committed` is the form earlier logs wrote, kept for their layout).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vote {
    pub leader_id: LeaderId,
    pub committed: bool,
}

impl Vote {
    pub fn new(term: u64, node_id: u64) -> Self {
        Vote {
            leader_id: LeaderId::new(term, node_id),
            committed: false,
        }
    }
}

/// A node's entry in a `Membership`: its address (unused by the raft-rs
/// driver, which routes by the layout; kept for the stored layout).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BasicNode {
    pub addr: String,
}

impl Default for BasicNode {
    fn default() -> Self {
        BasicNode {
            addr: "localhost".into(),
        }
    }
}

/// A group's configuration as the log and snapshots store it: the voter
/// sets (one; a joint configuration had two) and every member, voters
/// and learners.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    configs: Vec<std::collections::BTreeSet<u64>>,
    nodes: std::collections::BTreeMap<u64, BasicNode>,
}

impl Membership {
    /// `voters` and `learners`, each with a default node.
    pub fn new(
        voters: std::collections::BTreeSet<u64>,
        learners: impl IntoIterator<Item = u64>,
    ) -> Self {
        let nodes = voters
            .iter()
            .copied()
            .chain(learners)
            .map(|n| (n, BasicNode::default()))
            .collect();
        Membership {
            configs: vec![voters],
            nodes,
        }
    }

    /// Every voter of every voter set.
    pub fn voter_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.configs
            .iter()
            .flatten()
            .copied()
            .collect::<std::collections::BTreeSet<u64>>()
            .into_iter()
    }

    /// The members that do not vote.
    pub fn learner_ids(&self) -> impl Iterator<Item = u64> + '_ {
        let voters: std::collections::BTreeSet<u64> = self.voter_ids().collect();
        self.nodes
            .keys()
            .copied()
            .filter(move |n| !voters.contains(n))
    }
}

/// The latest membership applied, and the entry it came in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMembership {
    log_id: Option<LogId>,
    membership: Membership,
}

impl StoredMembership {
    pub fn new(log_id: Option<LogId>, membership: Membership) -> Self {
        StoredMembership { log_id, membership }
    }

    pub fn log_id(&self) -> &Option<LogId> {
        &self.log_id
    }

    pub fn membership(&self) -> &Membership {
        &self.membership
    }
}

/// What a snapshot covers: the last entry in it and the membership then.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub last_log_id: Option<LogId>,
    pub last_membership: StoredMembership,
    /// Always empty: the slot earlier snapshot files have (a positional
    /// encoding cannot skip it).
    #[serde(default)]
    snapshot_id: String,
}

impl SnapshotMeta {
    pub fn new(last_log_id: Option<LogId>, last_membership: StoredMembership) -> Self {
        SnapshotMeta {
            last_log_id,
            last_membership,
            snapshot_id: String::new(),
        }
    }
}

/// What a log entry holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryPayload {
    /// A new leader's first entry (raft-rs's empty entry).
    Blank,
    Normal(Command),
    /// A configuration change; the configuration after it.
    Membership(Membership),
}

/// One log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub log_id: LogId,
    pub payload: EntryPayload,
}

/// What the storage code reports.
pub type StorageError = std::io::Error;

/// The metadata group (pool table and shard membership): every node of
/// the layout is a member.
pub const META_GROUP: u64 = 0;

/// The replication group of a data shard. Trigger shards are not
/// replicated and have no group.
pub fn group_of(s: ShardId) -> Option<u64> {
    let t = match s.pool_type {
        PoolType::Volatile => 1u64,
        PoolType::Persistent => 2,
        PoolType::Trigger => return None,
    };
    Some((t << 56) | (u64::from(s.subgroup) << 28) | u64::from(s.shard))
}

/// The shard of a group id (`None` for the metadata group and for ids
/// that name no shard).
pub fn shard_of_group(g: u64) -> Option<ShardId> {
    let pool_type = match g >> 56 {
        1 => PoolType::Volatile,
        2 => PoolType::Persistent,
        _ => return None,
    };
    let subgroup = ((g >> 28) & ((1 << 28) - 1)) as u32;
    let shard = (g & ((1 << 28) - 1)) as u32;
    Some(ShardId {
        pool_type,
        subgroup,
        shard,
    })
}

/// Human name of a group: `meta` or the shard (`volatile/0/1`).
pub fn group_name(g: u64) -> String {
    match shard_of_group(g) {
        Some(s) => s.to_string(),
        None if g == META_GROUP => "meta".into(),
        None => format!("group-{g}"),
    }
}

/// Parses `volatile/0/1` (pool type / subgroup / shard).
pub fn parse_shard(s: &str) -> Result<ShardId, SluiceError> {
    let bad = || SluiceError::InvalidArgument {
        what: format!("shard {s:?}"),
        reason: "expected <volatile|persistent>/<subgroup>/<shard>, e.g. volatile/0/0".into(),
    };
    let mut it = s.split('/');
    let (Some(t), Some(g), Some(i), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(bad());
    };
    let pool_type = match t {
        "volatile" => PoolType::Volatile,
        "persistent" => PoolType::Persistent,
        _ => return Err(bad()),
    };
    Ok(ShardId {
        pool_type,
        subgroup: g.parse().map_err(|_| bad())?,
        shard: i.parse().map_err(|_| bad())?,
    })
}

/// Tells operators (the node's log) who leads group `g` now, as member
/// `me` sees it in `term`.
pub fn report_leadership(g: u64, me: u64, term: u64, leader: Option<u64>) {
    match leader {
        Some(l) if l == me => {
            tracing::info!(group = %group_name(g), term, "this node is now the leader")
        }
        Some(l) => {
            tracing::info!(group = %group_name(g), term, leader = l, "following a new leader")
        }
        None => tracing::info!(group = %group_name(g), term, "no leader: election in progress"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_round_trip_and_never_collide_with_meta() {
        for pool_type in [PoolType::Volatile, PoolType::Persistent] {
            for subgroup in [0, 1, 77] {
                for shard in [0, 1, 4095] {
                    let s = ShardId {
                        pool_type,
                        subgroup,
                        shard,
                    };
                    let g = group_of(s).unwrap();
                    assert_ne!(g, META_GROUP);
                    assert_eq!(shard_of_group(g), Some(s));
                    assert_eq!(parse_shard(&group_name(g)).unwrap(), s);
                }
            }
        }
        let t = ShardId {
            pool_type: PoolType::Trigger,
            subgroup: 0,
            shard: 0,
        };
        assert_eq!(group_of(t), None);
        let e = parse_shard("trigger/0/0").unwrap_err();
        assert!(
            e.to_string().starts_with("invalid shard \"trigger/0/0\""),
            "{e}"
        );
        assert!(parse_shard("volatile/x/0").is_err());
    }

    #[test]
    fn commands_survive_the_binary_codec() {
        let c = Command::Write {
            key: "/vol/a".into(),
            value: Some(Bytes::from_static(b"xyz")),
            expected: Some(3),
            timestamp_us: 9,
            req_id: Some(ReqId { client: 1, seq: 2 }),
            trace: None,
        };
        let b = bincode::serialize(&c).unwrap();
        assert_eq!(bincode::deserialize::<Command>(&b).unwrap(), c);
        let a = Applied::Put(Err(Applied::err(&SluiceError::NotFound {
            key: "k".into(),
        })));
        let b = bincode::serialize(&a).unwrap();
        let Applied::Put(Err(e)) = bincode::deserialize::<Applied>(&b).unwrap() else {
            panic!()
        };
        assert_eq!(
            Applied::decode_err(&e),
            SluiceError::NotFound { key: "k".into() }
        );
    }
}
