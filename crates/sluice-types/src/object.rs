//! Objects and their version metadata.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// "No version": the key has never been written, or the object did not go
/// through a shard's version sequence (a trigger put). In a conditional put,
/// expecting `VERSION_NONE` means "the key must not exist".
pub const VERSION_NONE: u64 = u64::MAX;

/// Version metadata of one object version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// Position in the shard's version sequence; strictly increasing per shard.
    pub version: u64,
    /// Microseconds since the Unix epoch; never goes backwards on a node.
    pub timestamp_us: u64,
    /// The shard's version before this one (shard-wide chain).
    pub previous_version: u64,
    /// This key's version before this one, or `VERSION_NONE`.
    pub previous_version_by_key: u64,
    /// True for the version a remove wrote.
    pub tombstone: bool,
}

/// One version of one object. The value is shared, never copied: it is the
/// slice of the socket read buffer the put arrived in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub key: Arc<str>,
    pub meta: ObjectMeta,
    pub value: Bytes,
    /// Latency trace, when the writer asked for one (pipelines, benchmarks).
    pub trace: Option<Arc<Trace>>,
}

/// A latency trace carried by an object through a pipeline: when the
/// client sent it, then one hop per stage (lambda) it went through. All
/// times are microseconds since the Unix epoch on the node's clock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// 0: not a latency trace, only the emit depth below.
    pub id: u64,
    pub client_sent_us: u64,
    pub hops: Vec<Hop>,
    /// How many lambda emits led to this object (0: a client wrote it).
    /// Bounded by `EMIT_DEPTH_MAX`, so lambdas that emit to each other's
    /// keys in a cycle stop instead of spinning forever.
    #[serde(default)]
    pub emit_depth: u32,
}

impl Trace {
    /// The trace of an object emitted from one carrying `parent`: only the
    /// depth when `parent` is no latency trace.
    pub fn depth_only(emit_depth: u32) -> Trace {
        Trace {
            emit_depth,
            ..Trace::default()
        }
    }

    /// True when this is a latency trace (a client asked for one).
    pub fn is_timed(&self) -> bool {
        self.id != 0
    }
}

/// One stage of a traced pipeline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hop {
    /// The vertex (pathname) that ran.
    pub stage: String,
    /// Delivered to the stage's dispatcher and queued.
    pub enqueued_us: u64,
    /// Picked up by an upcall worker.
    pub started_us: u64,
    /// The lambda emitted its output (end of compute).
    pub emitted_us: u64,
}

/// Upper bound on hops kept in a trace (a cycle in a data flow graph must
/// not grow objects without limit).
pub const TRACE_HOPS_MAX: usize = 64;

/// Upper bound on chained lambda emits (see `Trace::emit_depth`): deeper
/// than any real pipeline, small enough that a cycle stops at once.
pub const EMIT_DEPTH_MAX: u32 = 64;

/// What a successful put or remove returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutResult {
    pub version: u64,
    pub timestamp_us: u64,
}

/// Identifies one logical write of one client, so a retried put (after a
/// timeout or a leader change) is applied once: `client` is random per
/// client instance, `seq` increases per write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReqId {
    pub client: u64,
    pub seq: u64,
}

/// Formats a version for humans: `VERSION_NONE` reads as "none".
pub fn fmt_version(v: u64) -> String {
    if v == VERSION_NONE {
        "none".to_string()
    } else {
        v.to_string()
    }
}
