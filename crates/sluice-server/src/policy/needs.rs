//! What each kind of request needs: the one table access control reads.
//! The match is exhaustive, so a new kind of request does not compile
//! until it says what it needs.

use sluice_types::policy::Perm;
use sluice_wire::Request;

/// What a request needs before it runs.
#[derive(Debug, PartialEq, Eq)]
pub enum Need<'a> {
    /// Nothing: the handshake, pings, ending a watch.
    Nothing,
    /// Any principal the node accepted: the pool table and cluster view a
    /// client routes by.
    Connected,
    /// Only a cluster peer (consensus messages; refused elsewhere too).
    Node,
    /// A permission on the pool of a key, or on a pool or prefix.
    On(Perm, &'a str),
    /// A permission on every key listed.
    OnEach(Perm, &'a [String]),
}

/// The path that stands for node-wide operations (graphs, statistics,
/// policies): `admin` on `/`.
pub const ROOT: &str = "/";

/// Cluster commands that only read the cluster's state (clients route
/// by them); every other one is administration.
const CLUSTER_READS: [&str; 3] = ["status", "info", "broadcast_status"];

/// Policy commands that only show a principal what it is or the rules.
const POLICY_READS: [&str; 2] = ["whoami", "ls"];

pub fn needs(req: &Request) -> Need<'_> {
    use Perm::*;
    match req {
        Request::Hello { .. } | Request::Ping | Request::Unwatch { .. } => Need::Nothing,
        Request::PeerAuth { .. } => Need::Nothing,
        Request::Raft { .. } => Need::Node,
        Request::Put { key, .. } | Request::Remove { key, .. } => Need::On(Write, key),
        Request::TriggerPut { key, .. } => Need::On(Trigger, key),
        Request::Get { key, .. }
        | Request::GetByTime { key, .. }
        | Request::GetSize { key, .. }
        | Request::History { key, .. } => Need::On(Read, key),
        Request::MultiGet { keys, .. } => Need::OnEach(Read, keys),
        Request::ListKeys { pool, .. } | Request::ListKeysAt { pool, .. } => Need::On(Read, pool),
        Request::Watch { prefix, .. } => Need::On(Watch, prefix),
        Request::PoolCreate { spec, .. } => Need::On(Admin, &spec.pathname),
        Request::PoolRemove { path, .. } | Request::PoolPurge { path, .. } => Need::On(Admin, path),
        Request::PoolList { .. } | Request::PoolGet { .. } | Request::PoolOfKey { .. } => {
            Need::Connected
        }
        Request::Stats
        | Request::DfgApply { .. }
        | Request::DfgList
        | Request::DfgRemove { .. } => Need::On(Admin, ROOT),
        Request::Cluster { command } => match op_of(command) {
            Some(op) if CLUSTER_READS.contains(&op.as_str()) => Need::Connected,
            _ => Need::On(Admin, ROOT),
        },
        Request::Policy { command, .. } => match op_of(command) {
            Some(op) if POLICY_READS.contains(&op.as_str()) => Need::Connected,
            _ => Need::On(Admin, ROOT),
        },
    }
}

/// The `op` of a JSON command (rare requests: parsing is fine here).
fn op_of(command: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(command).ok()?;
    v["op"].as_str().map(str::to_string)
}
