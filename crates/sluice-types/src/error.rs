//! The typed error every Sluice layer returns and the wire carries.
//!
//! Each variant names the offending value and, where there is one, what to do.

use serde::{Deserialize, Serialize};

pub type Result<T, E = SluiceError> = std::result::Result<T, E>;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum SluiceError {
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },
    #[error("no object pool covers key {key:?}; create one with `sluice pools create <path> --type volatile` (or persistent, trigger)")]
    NoPool { key: String },
    #[error(
        "object pool {pool:?} (for key {key:?}) is deleted; its objects stay stored until `sluice pools purge {pool}`, after which the path can be created again"
    )]
    PoolDeleted { pool: String, key: String },
    #[error("object pool {pool:?} already exists")]
    PoolExists { pool: String },
    #[error("object pool {pool:?} not found")]
    PoolNotFound { pool: String },
    #[error("invalid object pool {pool:?}: {reason}")]
    InvalidPool { pool: String, reason: String },
    #[error("cannot {op} key {key:?}: pool {pool:?} is a {pool_type} pool{hint}")]
    WrongPoolType {
        op: String,
        key: String,
        pool: String,
        pool_type: String,
        hint: String,
    },
    #[error("{what}: not supported")]
    NotSupported { what: String },
    /// A request only cluster peers may send (consensus messages, internal
    /// operations), on a connection that has not authenticated as one.
    #[error("{what} is refused: only a cluster peer that authenticated with the cluster key may send it")]
    Forbidden { what: String },
    #[error("key {key:?} not found")]
    NotFound { key: String },
    /// A connection that names no principal (or a bad or revoked token)
    /// where the node's policies require one.
    #[error("not authenticated: {reason}")]
    Unauthenticated { reason: String },
    #[error("permission denied: principal {principal:?} may not {op} on {pool:?} (needs {perm}; `sluice policy ls` shows the access rules)")]
    PermissionDenied {
        principal: String,
        op: String,
        pool: String,
        perm: String,
    },
    #[error("rate limited: principal {principal:?} is over policy {policy:?}; retry after {retry_after_ms} ms")]
    RateLimited {
        principal: String,
        policy: String,
        retry_after_ms: u64,
    },
    #[error("key {key:?}: {reason}")]
    VersionNotRetained { key: String, reason: String },
    /// A stream item's payload was fetched after the recording node's
    /// retention dropped it (EdgeServe's payload timeout).
    /// (Its payload was version `version` of `/edge/<topic>/<source>`.)
    #[error("payload of stream item {topic}/{stream_source} #{seq} (recorded at {ts_us} µs, version {version} on its recording node) expired: {reason}")]
    PayloadExpired {
        topic: String,
        stream_source: String,
        seq: u64,
        ts_us: u64,
        version: u64,
        reason: String,
    },
    #[error("conditional write on key {key:?} rejected: expected version {expected}, current version is {current}")]
    VersionConflict {
        key: String,
        expected: String,
        current: String,
    },
    #[error("value of {size} bytes exceeds the limit of {max} bytes (server setting limits.max_value_bytes)")]
    ValueTooLarge { size: u64, max: u64 },
    #[error("node {node} holds {in_use} bytes in memory, at its limit of {max} bytes (server setting limits.max_memory_bytes): writes that store a value are refused until memory is freed (remove keys, purge pools, set a persistent pool's retention) or the limit is raised; reads and removes go on")]
    OutOfMemory { node: u32, in_use: u64, max: u64 },
    #[error("request metadata of {size} bytes exceeds the limit of {max} bytes")]
    MetaTooLarge { size: u64, max: u64 },
    #[error("{count} keys in one multi-get exceed the limit of {max}")]
    TooManyKeys { count: u64, max: u64 },
    #[error("more than {max} requests in flight on this connection; wait for replies before sending more")]
    TooManyInFlight { max: u32 },
    #[error("server is at its limit of {max} connections; retry later")]
    TooManyConnections { max: u32 },
    #[error("more than {max} watches on this connection")]
    TooManyWatches { max: u32 },
    #[error("key {key:?} belongs to shard {expected}, not shard {shard} (layout version {layout_version}); refresh the pool table")]
    WrongShard {
        key: String,
        shard: u32,
        expected: u32,
        layout_version: u64,
    },
    #[error("shard {shard} of subgroup {subgroup} is not hosted on this node")]
    UnknownShard { subgroup: String, shard: u32 },
    #[error("shard {shard}: node {node} is not its leader ({hint})")]
    NotLeader {
        shard: String,
        node: u32,
        leader: Option<u32>,
        leader_address: Option<String>,
        hint: String,
    },
    #[error("{}", not_member_text(shard, *node, members))]
    NotMember {
        shard: String,
        node: u32,
        members: Vec<u32>,
    },
    #[error("shard {shard} on node {node} has applied up to version {applied}, older than version {wanted} this session has seen; retry on another member")]
    ReplicaBehind {
        shard: String,
        node: u32,
        applied: u64,
        wanted: u64,
    },
    #[error("invalid data flow graph at {path}: {reason}")]
    InvalidDfg { path: String, reason: String },
    #[error("protocol error: {reason}")]
    Protocol { reason: String },
    /// A request well formed on the wire whose argument is wrong (a shard
    /// name, a member, a command): what it is, and why.
    #[error("invalid {what}: {reason}")]
    InvalidArgument { what: String, reason: String },
    #[error("data flow graph {id:?} not found (`sluice dfg ls` lists the applied ones)")]
    DfgNotFound { id: String },
    #[error("{what} timed out after {after_ms} ms")]
    Timeout { what: String, after_ms: u64 },
    #[error("connection error: {reason}")]
    Connection { reason: String },
    #[error("unavailable: {reason}")]
    Unavailable { reason: String },
    #[error("I/O error: {reason}")]
    Io { reason: String },
    #[error("internal error: {reason}")]
    Internal { reason: String },
}

impl SluiceError {
    pub fn invalid_key(key: &str, reason: impl Into<String>) -> Self {
        SluiceError::InvalidKey {
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    pub fn invalid_argument(what: impl Into<String>, reason: impl Into<String>) -> Self {
        SluiceError::InvalidArgument {
            what: what.into(),
            reason: reason.into(),
        }
    }

    pub fn protocol(reason: impl Into<String>) -> Self {
        SluiceError::Protocol {
            reason: reason.into(),
        }
    }

    /// True when a client may retry the same request after refreshing its
    /// cached pool table (the cache was stale, not the request wrong).
    pub fn is_stale_routing(&self) -> bool {
        matches!(
            self,
            SluiceError::WrongShard { .. } | SluiceError::NoPool { .. }
        )
    }
}

impl From<std::io::Error> for SluiceError {
    fn from(e: std::io::Error) -> Self {
        SluiceError::Io {
            reason: e.to_string(),
        }
    }
}

/// `NotMember`'s message: where the shard lives, or that no node this one
/// knows of hosts it (a shard name that is not in the layout).
fn not_member_text(shard: &str, node: u32, members: &[u32]) -> String {
    if members.is_empty() {
        format!("shard {shard} is not hosted on node {node}, nor on any node it knows of (`sluice cluster status` lists the shards)")
    } else {
        format!("shard {shard} is not hosted on node {node}; its members are {members:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard no node hosts said "its members are []"; a refusal that is
    /// for good (a watch resumed on a volatile pool, a cluster command on a
    /// standalone node) said "not supported yet".
    #[test]
    fn refusals_say_what_holds() {
        let e = SluiceError::NotMember {
            shard: "volatile/9/9".into(),
            node: 0,
            members: vec![],
        };
        let m = e.to_string();
        assert!(
            !m.contains("[]") && m.contains("sluice cluster status"),
            "{m}"
        );
        let e = SluiceError::NotMember {
            shard: "volatile/0/0".into(),
            node: 3,
            members: vec![0, 1],
        };
        assert!(e.to_string().ends_with("its members are [0, 1]"), "{e}");
        let e = SluiceError::NotSupported {
            what: "cluster commands on a standalone node".into(),
        };
        assert_eq!(
            e.to_string(),
            "cluster commands on a standalone node: not supported"
        );
    }

    /// A removed pool's error said "recreate it with `sluice pools
    /// create`", which is refused while the removed pool holds objects:
    /// it names the purge that frees the path.
    #[test]
    fn a_removed_pool_names_the_purge() {
        let e = SluiceError::PoolDeleted {
            pool: "/h".into(),
            key: "/h/a".into(),
        };
        let m = e.to_string();
        assert!(
            m.contains("`sluice pools purge /h`") && !m.contains("recreate it with"),
            "{m}"
        );
    }
}
