//! Requests and responses, and their encoding into frames.

use crate::codec::{MetaReader, MetaWriter};
use crate::frame::{write_header, Frame, HEADER_LEN};
use crate::out::OutQueue;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sluice_types::{
    Hop, Limits, ObjectMeta, PoolMeta, PoolSpec, PutResult, ReqId, SluiceError, Trace,
    TRACE_HOPS_MAX,
};

/// Opcodes.
pub mod op {
    pub const HELLO: u8 = 0x01;
    pub const PING: u8 = 0x02;
    pub const PUT: u8 = 0x03;
    pub const TRIGGER_PUT: u8 = 0x04;
    pub const REMOVE: u8 = 0x05;
    pub const GET: u8 = 0x06;
    pub const GET_BY_TIME: u8 = 0x07;
    pub const GET_SIZE: u8 = 0x08;
    pub const LIST_KEYS: u8 = 0x09;
    pub const MULTI_GET: u8 = 0x0A;
    pub const POOL_CREATE: u8 = 0x0B;
    pub const POOL_REMOVE: u8 = 0x0C;
    pub const POOL_LIST: u8 = 0x0D;
    pub const POOL_GET: u8 = 0x0E;
    pub const POOL_OF_KEY: u8 = 0x0F;
    pub const WATCH: u8 = 0x10;
    pub const UNWATCH: u8 = 0x11;
    pub const STATS: u8 = 0x12;
    pub const DFG_APPLY: u8 = 0x13;
    pub const DFG_LIST: u8 = 0x14;
    pub const DFG_REMOVE: u8 = 0x15;
    pub const HISTORY: u8 = 0x16;
    pub const LIST_KEYS_AT: u8 = 0x17;
    /// Node to node: one consensus message (value: its encoded body).
    pub const RAFT: u8 = 0x18;
    /// Cluster administration (JSON command; answered with JSON).
    pub const CLUSTER: u8 = 0x19;
    /// Node to node: authenticate the connection as a cluster peer.
    pub const PEER_AUTH: u8 = 0x1A;
    pub const POOL_PURGE: u8 = 0x1B;
    /// Policies and principals (JSON command; answered with JSON).
    pub const POLICY: u8 = 0x1C;

    pub const HELLO_OK: u8 = 0x81;
    pub const PONG: u8 = 0x82;
    pub const PUT_OK: u8 = 0x83;
    pub const OBJECT: u8 = 0x84;
    pub const SIZE: u8 = 0x85;
    pub const KEYS: u8 = 0x86;
    pub const OBJECTS: u8 = 0x87;
    pub const POOL: u8 = 0x88;
    pub const POOLS: u8 = 0x89;
    pub const WATCH_OK: u8 = 0x8A;
    pub const NOTIFY: u8 = 0x8B;
    pub const OK: u8 = 0x8C;
    pub const STATS_OK: u8 = 0x8D;
    pub const JSON: u8 = 0x8E;
    /// An opaque binary body (consensus replies).
    pub const RAW: u8 = 0x8F;
    pub const ERROR: u8 = 0xFF;
}

/// What the server announces at connect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub protocol_version: u16,
    pub node_id: u32,
    pub limits: Limits,
    pub layout_version: u64,
    pub pool_table_version: u64,
}

/// An object on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireObject {
    pub key: String,
    pub meta: ObjectMeta,
    pub value: Bytes,
    pub trace: Option<Trace>,
}

/// An object to encode, borrowed from wherever it lives (the store's
/// `Arc<Object>`, a `WireObject`).
#[derive(Clone, Copy)]
pub struct ObjRef<'a> {
    pub key: &'a str,
    pub meta: &'a ObjectMeta,
    pub value: &'a Bytes,
    pub trace: Option<&'a Trace>,
}

impl<'a> ObjRef<'a> {
    pub fn of(o: &'a sluice_types::Object) -> Self {
        ObjRef {
            key: &o.key,
            meta: &o.meta,
            value: &o.value,
            trace: o.trace.as_deref(),
        }
    }
}

/// Which delivery a watch notification reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryKindWire {
    Put = 1,
    TriggerPut = 2,
    Remove = 3,
    /// The watcher fell behind and `meta.version` notifications were dropped.
    Lagged = 4,
    /// Published by a `notify` lambda.
    Notify = 5,
}

impl DeliveryKindWire {
    fn from_u8(v: u8) -> Result<Self, SluiceError> {
        Ok(match v {
            1 => Self::Put,
            2 => Self::TriggerPut,
            3 => Self::Remove,
            4 => Self::Lagged,
            5 => Self::Notify,
            x => return Err(SluiceError::protocol(format!("unknown delivery kind {x}"))),
        })
    }
}

/// Where a resumed watch starts: every stored version at or after a
/// version (numbered per shard) or a time (µs since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchFrom {
    Version(u64),
    Time(u64),
}

/// `shard` is `None` when the client leaves routing to the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Hello {
        protocol_version: u16,
        client_name: String,
        /// A bearer token naming the connection's principal (`sluice auth
        /// create`); encoded only when set.
        token: Option<String>,
    },
    /// Sent by a node right after `Hello` on its connections to peers:
    /// proves it holds the cluster key, so the connection may carry
    /// consensus messages and internal operations (answered `Ok`).
    PeerAuth {
        node: u32,
        key: String,
    },
    Ping,
    Put {
        key: String,
        shard: Option<u32>,
        expected: Option<u64>,
        value: Bytes,
        trace: Option<Trace>,
        /// Makes a retry of this put idempotent on replicated shards.
        req_id: Option<ReqId>,
    },
    TriggerPut {
        key: String,
        shard: Option<u32>,
        value: Bytes,
        trace: Option<Trace>,
        /// The version, timestamp and previous versions the object carries
        /// (a lambda's emit forwarded by its node, as Cascade's emit sets
        /// them); `None`: the receiving node stamps it. Encoded only when
        /// set, after the trace.
        origin: Option<ObjectMeta>,
    },
    Remove {
        key: String,
        shard: Option<u32>,
        expected: Option<u64>,
        req_id: Option<ReqId>,
    },
    /// `min_version`: answer only once this replica has applied the
    /// shard up to that version (a client's session never goes back in
    /// time); `linearizable`: confirm leadership first (leader only).
    Get {
        key: String,
        shard: Option<u32>,
        version: Option<u64>,
        min_version: Option<u64>,
        linearizable: bool,
    },
    /// The version current at `timestamp_us`. Unless `unstable`, a
    /// timestamp that is not yet stable (in the future, or with writes in
    /// flight before it) waits up to `wait_ms` so the answer never changes
    /// later; 0 means fail at once instead of waiting.
    GetByTime {
        key: String,
        shard: Option<u32>,
        timestamp_us: u64,
        wait_ms: u32,
        unstable: bool,
    },
    GetSize {
        key: String,
        shard: Option<u32>,
        version: Option<u64>,
        timestamp_us: Option<u64>,
    },
    /// A page of a pool's keys: the smallest after `after`, sorted (the
    /// node bounds a page's size; `Response::Keys` says if more follow).
    ListKeys {
        pool: String,
        prefix: Option<String>,
        shard: Option<u32>,
        after: Option<String>,
    },
    MultiGet {
        shard: Option<u32>,
        keys: Vec<String>,
    },
    /// `req_id` (here and on the other metadata changes): set by a
    /// cluster client, the same on each retry of one call, so that a
    /// change whose reply was lost (its leader died) is made once and its
    /// retry answered as the first attempt was.
    PoolCreate {
        spec: PoolSpec,
        req_id: Option<ReqId>,
    },
    PoolRemove {
        path: String,
        req_id: Option<ReqId>,
    },
    /// Deletes a removed pool's objects for good and frees its path.
    PoolPurge {
        path: String,
        req_id: Option<ReqId>,
    },
    PoolList {
        include_deleted: bool,
    },
    PoolGet {
        path: String,
    },
    PoolOfKey {
        key: String,
    },
    Watch {
        prefix: String,
        /// Replay what a persistent pool stored from this point before
        /// the live notifications (a watcher resuming after a reconnect).
        from: Option<WatchFrom>,
    },
    Unwatch {
        watch_id: u64,
    },
    Stats,
    /// Apply a data flow graph file (JSON text, `dfgs.json` shape).
    DfgApply {
        text: String,
    },
    DfgList,
    DfgRemove {
        id: String,
        req_id: Option<ReqId>,
    },
    /// Versions of a key, newest first: `by_time` selects timestamps
    /// instead of versions for `from..=to`; at most `limit` per reply (page
    /// on by asking again with `to` below the oldest returned).
    History {
        key: String,
        shard: Option<u32>,
        by_time: bool,
        from: u64,
        to: u64,
        limit: u32,
    },
    /// Keys of a persistent pool live at a version (or a time), paged as
    /// `ListKeys` is.
    ListKeysAt {
        pool: String,
        prefix: Option<String>,
        by_time: bool,
        at: u64,
        after: Option<String>,
    },
    /// Node to node: a consensus message for replication group `group`,
    /// sent by node `from` (`kind` says which; `body` is its encoding).
    /// A sender may split the encoding: `more` goes out right after
    /// `body`, each chunk by reference (large values are not copied into
    /// one buffer); the receiver gets it all as one `body`, `more` empty.
    Raft {
        from: u32,
        group: u64,
        kind: u8,
        body: Bytes,
        more: Vec<Bytes>,
    },
    /// Cluster administration and status (a JSON command).
    Cluster {
        command: String,
    },
    /// Policies and principals: list, set, remove, create and revoke
    /// tokens (a JSON command, `{"op": ...}`; answered with JSON).
    Policy {
        command: String,
        req_id: Option<ReqId>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    HelloOk(ServerInfo),
    Pong,
    PutOk(PutResult),
    Object(WireObject),
    Size(u64),
    /// A page of keys; `more`: ask again after the last one.
    Keys {
        keys: Vec<String>,
        more: bool,
    },
    /// Multi-get results (one per key asked, in order) or a page of
    /// history. `more`: the node held back the rest to bound the reply's
    /// size: the results cover only the first keys asked (ask again for
    /// the others), or older versions follow (ask below the oldest).
    Objects {
        items: Vec<Result<WireObject, SluiceError>>,
        more: bool,
    },
    Pool(PoolMeta),
    Pools(Vec<PoolMeta>),
    WatchOk {
        watch_id: u64,
    },
    Notify {
        kind: DeliveryKindWire,
        object: WireObject,
    },
    Ok,
    Stats(String),
    /// A JSON document (DFG listings and apply results).
    Json(String),
    /// An opaque binary body (consensus replies).
    Raw(Bytes),
    Error(SluiceError),
}

const SHARD_ANY: u32 = u32::MAX;

fn shard_enc(s: Option<u32>) -> u32 {
    s.unwrap_or(SHARD_ANY)
}
fn shard_dec(s: u32) -> Option<u32> {
    (s != SHARD_ANY).then_some(s)
}

fn json<T: Serialize>(v: &T) -> String {
    // Serialising our own plain structs cannot fail.
    serde_json::to_string(v)
        .unwrap_or_else(|e| format!("{{\"error\":\"internal\",\"reason\":\"{e}\"}}"))
}

fn from_json<T: for<'de> Deserialize<'de>>(s: &str) -> Result<T, SluiceError> {
    serde_json::from_str(s).map_err(|e| SluiceError::protocol(format!("bad JSON body: {e}")))
}

/// Encodes one frame: header, then metadata written by `meta`, then value.
fn frame(
    out: &mut OutQueue,
    opcode: u8,
    flags: u8,
    request_id: u64,
    value: Option<&Bytes>,
    meta: impl FnOnce(&mut MetaWriter),
) {
    frame_parts(out, opcode, flags, request_id, value, &[], meta)
}

/// [`frame`] whose value is `value` followed by the chunks `more`, each
/// queued by reference when large.
fn frame_parts(
    out: &mut OutQueue,
    opcode: u8,
    flags: u8,
    request_id: u64,
    value: Option<&Bytes>,
    more: &[Bytes],
    meta: impl FnOnce(&mut MetaWriter),
) {
    let buf = out.buf();
    let start = buf.len();
    write_header(buf, opcode, flags, request_id, 0, 0);
    meta(&mut MetaWriter(buf));
    let meta_len = buf.len() - start - HEADER_LEN;
    let value_len = value.map_or(0, |v| v.len()) + more.iter().map(Bytes::len).sum::<usize>();
    buf[start + 4..start + 8].copy_from_slice(&(meta_len as u32).to_le_bytes());
    buf[start + 8..start + 12].copy_from_slice(&(value_len as u32).to_le_bytes());
    for v in value.into_iter().chain(more) {
        out.push_value(v);
    }
}

fn write_trace(w: &mut MetaWriter, t: Option<&Trace>) {
    match t {
        None => {
            w.u8(0);
        }
        Some(t) => {
            w.u8(1)
                .u64(t.id)
                .u64(t.client_sent_us)
                .u32(t.hops.len() as u32);
            for h in &t.hops {
                w.str(&h.stage)
                    .u64(h.enqueued_us)
                    .u64(h.started_us)
                    .u64(h.emitted_us);
            }
            w.u32(t.emit_depth);
        }
    }
}

fn read_trace(r: &mut MetaReader) -> Result<Option<Trace>, SluiceError> {
    if !r.bool()? {
        return Ok(None);
    }
    let id = r.u64()?;
    let client_sent_us = r.u64()?;
    let n = r.u32()? as usize;
    if n > TRACE_HOPS_MAX {
        return Err(SluiceError::protocol(format!(
            "trace has {n} hops, the limit is {TRACE_HOPS_MAX}"
        )));
    }
    let mut hops = Vec::with_capacity(n);
    for _ in 0..n {
        hops.push(Hop {
            stage: r.str()?,
            enqueued_us: r.u64()?,
            started_us: r.u64()?,
            emitted_us: r.u64()?,
        });
    }
    let emit_depth = r.u32()?;
    Ok(Some(Trace {
        id,
        client_sent_us,
        hops,
        emit_depth,
    }))
}

fn write_req_id(w: &mut MetaWriter, id: &Option<ReqId>) {
    match id {
        None => {
            w.u8(0);
        }
        Some(id) => {
            w.u8(1).u64(id.client).u64(id.seq);
        }
    }
}

fn read_req_id(r: &mut MetaReader) -> Result<Option<ReqId>, SluiceError> {
    if !r.bool()? {
        return Ok(None);
    }
    Ok(Some(ReqId {
        client: r.u64()?,
        seq: r.u64()?,
    }))
}

/// An optional request id at the end of a metadata change: absent (not
/// even its flag) without one, so a frame from a client that sends none
/// is the one an earlier node decodes.
fn write_trailing_req_id(w: &mut MetaWriter, id: &Option<ReqId>) {
    if id.is_some() {
        write_req_id(w, id);
    }
}

fn read_trailing_req_id(r: &mut MetaReader) -> Result<Option<ReqId>, SluiceError> {
    if r.at_end() {
        return Ok(None);
    }
    read_req_id(r)
}

fn write_obj_meta(w: &mut MetaWriter, o: &ObjRef<'_>) {
    let m = o.meta;
    w.str(o.key)
        .u64(m.version)
        .u64(m.timestamp_us)
        .u64(m.previous_version)
        .u64(m.previous_version_by_key)
        .u8(m.tombstone as u8);
    write_trace(w, o.trace);
}

fn read_obj_meta(r: &mut MetaReader) -> Result<(String, ObjectMeta, Option<Trace>), SluiceError> {
    let key = r.str()?;
    let meta = ObjectMeta {
        version: r.u64()?,
        timestamp_us: r.u64()?,
        previous_version: r.u64()?,
        previous_version_by_key: r.u64()?,
        tombstone: r.bool()?,
    };
    let trace = read_trace(r)?;
    Ok((key, meta, trace))
}

/// Encodes an object response straight from the stored parts, so the
/// server never builds an intermediate `WireObject`.
pub fn encode_object(
    out: &mut OutQueue,
    request_id: u64,
    opcode: u8,
    prefix: Option<u8>,
    o: &ObjRef<'_>,
) {
    frame(out, opcode, 0, request_id, Some(o.value), |w| {
        if let Some(p) = prefix {
            w.u8(p);
        }
        write_obj_meta(w, o);
    });
}

impl WireObject {
    pub fn as_ref(&self) -> ObjRef<'_> {
        ObjRef {
            key: &self.key,
            meta: &self.meta,
            value: &self.value,
            trace: self.trace.as_ref(),
        }
    }
}

impl Request {
    /// The request's name in metrics and logs (`put`, `get`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "hello",
            Request::PeerAuth { .. } => "peer_auth",
            Request::Ping => "ping",
            Request::Put { .. } => "put",
            Request::TriggerPut { .. } => "trigger_put",
            Request::Remove { .. } => "remove",
            Request::Get { .. } => "get",
            Request::GetByTime { .. } => "get_by_time",
            Request::GetSize { .. } => "get_size",
            Request::ListKeys { .. } => "list_keys",
            Request::MultiGet { .. } => "multi_get",
            Request::PoolCreate { .. } => "pool_create",
            Request::PoolRemove { .. } => "pool_remove",
            Request::PoolPurge { .. } => "pool_purge",
            Request::PoolList { .. } => "pool_list",
            Request::PoolGet { .. } => "pool_get",
            Request::PoolOfKey { .. } => "pool_of_key",
            Request::Watch { .. } => "watch",
            Request::Unwatch { .. } => "unwatch",
            Request::Stats => "stats",
            Request::DfgApply { .. } => "dfg_apply",
            Request::DfgList => "dfg_list",
            Request::DfgRemove { .. } => "dfg_remove",
            Request::History { .. } => "history",
            Request::ListKeysAt { .. } => "list_keys_at",
            Request::Raft { .. } => "raft",
            Request::Cluster { .. } => "cluster",
            Request::Policy { .. } => "policy",
        }
    }

    /// A get of `key`'s latest version, routed by the node, as any member
    /// has it (a stable read, no session floor).
    pub fn get_latest(key: impl Into<String>) -> Request {
        Request::Get {
            key: key.into(),
            shard: None,
            version: None,
            min_version: None,
            linearizable: false,
        }
    }

    /// The value a write carries (puts and trigger puts).
    pub fn value(&self) -> Option<&Bytes> {
        match self {
            Request::Put { value, .. } | Request::TriggerPut { value, .. } => Some(value),
            _ => None,
        }
    }

    /// This write with `v` as its value (the last part of a value sent in
    /// parts); other requests as they are.
    pub fn with_value(&self, v: Bytes) -> Request {
        let mut r = self.clone();
        if let Request::Put { value, .. } | Request::TriggerPut { value, .. } = &mut r {
            *value = v;
        }
        r
    }

    /// The object key a request reads or writes, for requests about one
    /// object (metrics label them with the key's pool).
    pub fn object_key(&self) -> Option<&str> {
        match self {
            Request::Put { key, .. }
            | Request::TriggerPut { key, .. }
            | Request::Remove { key, .. }
            | Request::Get { key, .. }
            | Request::GetByTime { key, .. }
            | Request::GetSize { key, .. }
            | Request::History { key, .. } => Some(key),
            _ => None,
        }
    }

    pub fn opcode(&self) -> u8 {
        match self {
            Request::Hello { .. } => op::HELLO,
            Request::PeerAuth { .. } => op::PEER_AUTH,
            Request::Ping => op::PING,
            Request::Put { .. } => op::PUT,
            Request::TriggerPut { .. } => op::TRIGGER_PUT,
            Request::Remove { .. } => op::REMOVE,
            Request::Get { .. } => op::GET,
            Request::GetByTime { .. } => op::GET_BY_TIME,
            Request::GetSize { .. } => op::GET_SIZE,
            Request::ListKeys { .. } => op::LIST_KEYS,
            Request::MultiGet { .. } => op::MULTI_GET,
            Request::PoolCreate { .. } => op::POOL_CREATE,
            Request::PoolRemove { .. } => op::POOL_REMOVE,
            Request::PoolPurge { .. } => op::POOL_PURGE,
            Request::PoolList { .. } => op::POOL_LIST,
            Request::PoolGet { .. } => op::POOL_GET,
            Request::PoolOfKey { .. } => op::POOL_OF_KEY,
            Request::Watch { .. } => op::WATCH,
            Request::Unwatch { .. } => op::UNWATCH,
            Request::Stats => op::STATS,
            Request::DfgApply { .. } => op::DFG_APPLY,
            Request::DfgList => op::DFG_LIST,
            Request::DfgRemove { .. } => op::DFG_REMOVE,
            Request::History { .. } => op::HISTORY,
            Request::ListKeysAt { .. } => op::LIST_KEYS_AT,
            Request::Raft { .. } => op::RAFT,
            Request::Cluster { .. } => op::CLUSTER,
            Request::Policy { .. } => op::POLICY,
        }
    }

    pub fn encode(&self, out: &mut OutQueue, request_id: u64, flags: u8) {
        let opc = self.opcode();
        match self {
            Request::Hello {
                protocol_version,
                client_name,
                token,
            } => frame(out, opc, flags, request_id, None, |w| {
                w.u16(*protocol_version).str(client_name);
                if let Some(t) = token {
                    w.str(t);
                }
            }),
            Request::PeerAuth { node, key } => frame(out, opc, flags, request_id, None, |w| {
                w.u32(*node).str(key);
            }),
            Request::Ping | Request::Stats | Request::DfgList => {
                frame(out, opc, flags, request_id, None, |_| {})
            }
            Request::DfgApply { text } => frame(out, opc, flags, request_id, None, |w| {
                w.str(text);
            }),
            Request::DfgRemove { id, req_id } => frame(out, opc, flags, request_id, None, |w| {
                w.str(id);
                write_trailing_req_id(w, req_id);
            }),
            Request::History {
                key,
                shard,
                by_time,
                from,
                to,
                limit,
            } => frame(out, opc, flags, request_id, None, |w| {
                w.str(key)
                    .u32(shard_enc(*shard))
                    .u8(*by_time as u8)
                    .u64(*from)
                    .u64(*to)
                    .u32(*limit);
            }),
            Request::ListKeysAt {
                pool,
                prefix,
                by_time,
                at,
                after,
            } => frame(out, opc, flags, request_id, None, |w| {
                w.str(pool)
                    .opt_str(prefix.as_deref())
                    .u8(*by_time as u8)
                    .u64(*at);
                // Only when set: a listing's first page reads the same
                // to a node from before paging.
                if after.is_some() {
                    w.opt_str(after.as_deref());
                }
            }),
            Request::Put {
                key,
                shard,
                expected,
                value,
                trace,
                req_id,
            } => frame(out, opc, flags, request_id, Some(value), |w| {
                w.str(key).u32(shard_enc(*shard)).opt_u64(*expected);
                write_trace(w, trace.as_ref());
                write_req_id(w, req_id);
            }),
            Request::TriggerPut {
                key,
                shard,
                value,
                trace,
                origin,
            } => frame(out, opc, flags, request_id, Some(value), |w| {
                w.str(key).u32(shard_enc(*shard));
                write_trace(w, trace.as_ref());
                if let Some(o) = origin {
                    w.u8(1)
                        .u64(o.version)
                        .u64(o.timestamp_us)
                        .u64(o.previous_version)
                        .u64(o.previous_version_by_key);
                }
            }),
            Request::Remove {
                key,
                shard,
                expected,
                req_id,
            } => frame(out, opc, flags, request_id, None, |w| {
                w.str(key).u32(shard_enc(*shard)).opt_u64(*expected);
                write_req_id(w, req_id);
            }),
            Request::Get {
                key,
                shard,
                version,
                min_version,
                linearizable,
            } => frame(out, opc, flags, request_id, None, |w| {
                w.str(key)
                    .u32(shard_enc(*shard))
                    .opt_u64(*version)
                    .opt_u64(*min_version)
                    .u8(*linearizable as u8);
            }),
            Request::Raft {
                from,
                group,
                kind,
                body,
                more,
            } => frame_parts(out, opc, flags, request_id, Some(body), more, |w| {
                w.u32(*from).u64(*group).u8(*kind);
            }),
            Request::Cluster { command } => frame(out, opc, flags, request_id, None, |w| {
                w.str(command);
            }),
            Request::Policy { command, req_id } => frame(out, opc, flags, request_id, None, |w| {
                w.str(command);
                write_trailing_req_id(w, req_id);
            }),
            Request::GetByTime {
                key,
                shard,
                timestamp_us,
                wait_ms,
                unstable,
            } => frame(out, opc, flags, request_id, None, |w| {
                w.str(key)
                    .u32(shard_enc(*shard))
                    .u64(*timestamp_us)
                    .u32(*wait_ms)
                    .u8(*unstable as u8);
            }),
            Request::GetSize {
                key,
                shard,
                version,
                timestamp_us,
            } => frame(out, opc, flags, request_id, None, |w| {
                w.str(key)
                    .u32(shard_enc(*shard))
                    .opt_u64(*version)
                    .opt_u64(*timestamp_us);
            }),
            Request::ListKeys {
                pool,
                prefix,
                shard,
                after,
            } => frame(out, opc, flags, request_id, None, |w| {
                w.str(pool)
                    .opt_str(prefix.as_deref())
                    .u32(shard_enc(*shard));
                if after.is_some() {
                    w.opt_str(after.as_deref());
                }
            }),
            Request::MultiGet { shard, keys } => frame(out, opc, flags, request_id, None, |w| {
                w.u32(shard_enc(*shard)).u32(keys.len() as u32);
                for k in keys {
                    w.str(k);
                }
            }),
            Request::PoolCreate { spec, req_id } => frame(out, opc, flags, request_id, None, |w| {
                w.str(&json(spec));
                write_trailing_req_id(w, req_id);
            }),
            Request::PoolRemove { path, req_id } | Request::PoolPurge { path, req_id } => {
                frame(out, opc, flags, request_id, None, |w| {
                    w.str(path);
                    write_trailing_req_id(w, req_id);
                })
            }
            Request::PoolGet { path } => frame(out, opc, flags, request_id, None, |w| {
                w.str(path);
            }),
            Request::PoolList { include_deleted } => {
                frame(out, opc, flags, request_id, None, |w| {
                    w.u8(*include_deleted as u8);
                })
            }
            Request::PoolOfKey { key } => frame(out, opc, flags, request_id, None, |w| {
                w.str(key);
            }),
            Request::Watch { prefix, from } => frame(out, opc, flags, request_id, None, |w| {
                w.str(prefix);
                match from {
                    None => w.u8(0),
                    Some(WatchFrom::Version(v)) => w.u8(1).u64(*v),
                    Some(WatchFrom::Time(t)) => w.u8(2).u64(*t),
                };
            }),
            Request::Unwatch { watch_id } => frame(out, opc, flags, request_id, None, |w| {
                w.u64(*watch_id);
            }),
        }
    }

    /// Decodes a request frame. Requests without a value must not carry one.
    pub fn decode(f: Frame) -> Result<Request, SluiceError> {
        let mut r = MetaReader::new(f.meta);
        let has_value = matches!(f.opcode, op::PUT | op::TRIGGER_PUT | op::RAFT);
        if !has_value && !f.value.is_empty() {
            return Err(SluiceError::protocol(format!(
                "opcode {:#04x} carries no value, got {} value bytes",
                f.opcode,
                f.value.len()
            )));
        }
        let req = match f.opcode {
            op::HELLO => Request::Hello {
                protocol_version: r.u16()?,
                client_name: r.str()?,
                token: if r.at_end() { None } else { Some(r.str()?) },
            },
            op::PEER_AUTH => Request::PeerAuth {
                node: r.u32()?,
                key: r.str()?,
            },
            op::PING => Request::Ping,
            op::STATS => Request::Stats,
            op::DFG_APPLY => Request::DfgApply { text: r.str()? },
            op::DFG_LIST => Request::DfgList,
            op::DFG_REMOVE => Request::DfgRemove {
                id: r.str()?,
                req_id: read_trailing_req_id(&mut r)?,
            },
            op::HISTORY => Request::History {
                key: r.str()?,
                shard: shard_dec(r.u32()?),
                by_time: r.bool()?,
                from: r.u64()?,
                to: r.u64()?,
                limit: r.u32()?,
            },
            op::LIST_KEYS_AT => Request::ListKeysAt {
                pool: r.str()?,
                prefix: r.opt_str()?,
                by_time: r.bool()?,
                at: r.u64()?,
                after: if r.at_end() { None } else { r.opt_str()? },
            },
            op::PUT => Request::Put {
                key: r.str()?,
                shard: shard_dec(r.u32()?),
                expected: r.opt_u64()?,
                trace: read_trace(&mut r)?,
                req_id: read_req_id(&mut r)?,
                value: f.value,
            },
            op::TRIGGER_PUT => Request::TriggerPut {
                key: r.str()?,
                shard: shard_dec(r.u32()?),
                trace: read_trace(&mut r)?,
                origin: if r.at_end() {
                    None
                } else if r.bool()? {
                    Some(ObjectMeta {
                        version: r.u64()?,
                        timestamp_us: r.u64()?,
                        previous_version: r.u64()?,
                        previous_version_by_key: r.u64()?,
                        tombstone: false,
                    })
                } else {
                    None
                },
                value: f.value,
            },
            op::REMOVE => Request::Remove {
                key: r.str()?,
                shard: shard_dec(r.u32()?),
                expected: r.opt_u64()?,
                req_id: read_req_id(&mut r)?,
            },
            op::GET => Request::Get {
                key: r.str()?,
                shard: shard_dec(r.u32()?),
                version: r.opt_u64()?,
                min_version: r.opt_u64()?,
                linearizable: r.bool()?,
            },
            op::RAFT => Request::Raft {
                from: r.u32()?,
                group: r.u64()?,
                kind: r.u8()?,
                body: f.value,
                more: Vec::new(),
            },
            op::CLUSTER => Request::Cluster { command: r.str()? },
            op::POLICY => Request::Policy {
                command: r.str()?,
                req_id: read_trailing_req_id(&mut r)?,
            },
            op::GET_BY_TIME => Request::GetByTime {
                key: r.str()?,
                shard: shard_dec(r.u32()?),
                timestamp_us: r.u64()?,
                wait_ms: r.u32()?,
                unstable: r.bool()?,
            },
            op::GET_SIZE => Request::GetSize {
                key: r.str()?,
                shard: shard_dec(r.u32()?),
                version: r.opt_u64()?,
                timestamp_us: r.opt_u64()?,
            },
            op::LIST_KEYS => Request::ListKeys {
                pool: r.str()?,
                prefix: r.opt_str()?,
                shard: shard_dec(r.u32()?),
                after: if r.at_end() { None } else { r.opt_str()? },
            },
            op::MULTI_GET => {
                let shard = shard_dec(r.u32()?);
                let n = r.u32()? as usize;
                // Each key costs at least its 4-byte length prefix: bound the
                // allocation by what the metadata can actually hold.
                let mut keys = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    keys.push(r.str()?);
                }
                Request::MultiGet { shard, keys }
            }
            op::POOL_CREATE => Request::PoolCreate {
                spec: from_json(&r.str()?)?,
                req_id: read_trailing_req_id(&mut r)?,
            },
            op::POOL_REMOVE => Request::PoolRemove {
                path: r.str()?,
                req_id: read_trailing_req_id(&mut r)?,
            },
            op::POOL_PURGE => Request::PoolPurge {
                path: r.str()?,
                req_id: read_trailing_req_id(&mut r)?,
            },
            op::POOL_LIST => Request::PoolList {
                include_deleted: r.bool()?,
            },
            op::POOL_GET => Request::PoolGet { path: r.str()? },
            op::POOL_OF_KEY => Request::PoolOfKey { key: r.str()? },
            op::WATCH => Request::Watch {
                prefix: r.str()?,
                from: match r.u8()? {
                    0 => None,
                    1 => Some(WatchFrom::Version(r.u64()?)),
                    2 => Some(WatchFrom::Time(r.u64()?)),
                    t => {
                        return Err(SluiceError::protocol(format!(
                            "bad watch resume kind {t} (0 none, 1 version, 2 time)"
                        )))
                    }
                },
            },
            op::UNWATCH => Request::Unwatch { watch_id: r.u64()? },
            other => {
                return Err(SluiceError::protocol(format!(
                    "unknown request opcode {other:#04x}"
                )))
            }
        };
        r.finish()?;
        Ok(req)
    }
}

impl Response {
    pub fn encode(&self, out: &mut OutQueue, request_id: u64) {
        match self {
            Response::HelloOk(info) => frame(out, op::HELLO_OK, 0, request_id, None, |w| {
                w.str(&json(info));
            }),
            Response::Pong => frame(out, op::PONG, 0, request_id, None, |_| {}),
            Response::Ok => frame(out, op::OK, 0, request_id, None, |_| {}),
            Response::PutOk(p) => Self::put_ok(out, request_id, p),
            Response::Object(o) => encode_object(out, request_id, op::OBJECT, None, &o.as_ref()),
            Response::Notify { kind, object } => encode_object(
                out,
                request_id,
                op::NOTIFY,
                Some(*kind as u8),
                &object.as_ref(),
            ),
            Response::Size(n) => frame(out, op::SIZE, 0, request_id, None, |w| {
                w.u64(*n);
            }),
            Response::Keys { keys, more } => frame(out, op::KEYS, 0, request_id, None, |w| {
                w.u32(keys.len() as u32);
                for k in keys {
                    w.str(k);
                }
                // Only when set: a client from before paging reads the
                // replies it could read before.
                if *more {
                    w.u8(1);
                }
            }),
            Response::Objects { items, more } => {
                let parts: Vec<MultiGetItem<'_>> = items
                    .iter()
                    .map(|i| match i {
                        Ok(o) => MultiGetItem::Found(o.as_ref()),
                        Err(e) => MultiGetItem::Failed(e),
                    })
                    .collect();
                encode_objects(out, request_id, &parts, *more);
            }
            Response::Pool(p) => frame(out, op::POOL, 0, request_id, None, |w| {
                w.str(&json(p));
            }),
            Response::Pools(p) => frame(out, op::POOLS, 0, request_id, None, |w| {
                w.str(&json(p));
            }),
            Response::WatchOk { watch_id } => frame(out, op::WATCH_OK, 0, request_id, None, |w| {
                w.u64(*watch_id);
            }),
            Response::Json(s) => frame(out, op::JSON, 0, request_id, None, |w| {
                w.str(s);
            }),
            Response::Stats(s) => frame(out, op::STATS_OK, 0, request_id, None, |w| {
                w.str(s);
            }),
            Response::Raw(b) => frame(out, op::RAW, 0, request_id, Some(b), |_| {}),
            Response::Error(e) => Self::error(out, request_id, e),
        }
    }

    pub fn put_ok(out: &mut OutQueue, request_id: u64, p: &PutResult) {
        frame(out, op::PUT_OK, 0, request_id, None, |w| {
            w.u64(p.version).u64(p.timestamp_us);
        });
    }

    pub fn error(out: &mut OutQueue, request_id: u64, e: &SluiceError) {
        frame(out, op::ERROR, 0, request_id, None, |w| {
            w.str(&json(e));
        });
    }

    pub fn decode(f: Frame) -> Result<Response, SluiceError> {
        let mut r = MetaReader::new(f.meta);
        let has_value = matches!(f.opcode, op::OBJECT | op::NOTIFY | op::OBJECTS | op::RAW);
        if !has_value && !f.value.is_empty() {
            return Err(SluiceError::protocol(format!(
                "response {:#04x} carries no value, got {} value bytes",
                f.opcode,
                f.value.len()
            )));
        }
        let resp = match f.opcode {
            op::HELLO_OK => Response::HelloOk(from_json(&r.str()?)?),
            op::PONG => Response::Pong,
            op::OK => Response::Ok,
            op::PUT_OK => Response::PutOk(PutResult {
                version: r.u64()?,
                timestamp_us: r.u64()?,
            }),
            op::OBJECT => {
                let (key, meta, trace) = read_obj_meta(&mut r)?;
                Response::Object(WireObject {
                    key,
                    meta,
                    value: f.value,
                    trace,
                })
            }
            op::NOTIFY => {
                let kind = DeliveryKindWire::from_u8(r.u8()?)?;
                let (key, meta, trace) = read_obj_meta(&mut r)?;
                Response::Notify {
                    kind,
                    object: WireObject {
                        key,
                        meta,
                        value: f.value,
                        trace,
                    },
                }
            }
            op::SIZE => Response::Size(r.u64()?),
            op::KEYS => {
                let n = r.u32()? as usize;
                let mut keys = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    keys.push(r.str()?);
                }
                let more = !r.at_end() && r.bool()?;
                Response::Keys { keys, more }
            }
            op::OBJECTS => {
                let n = r.u32()? as usize;
                let mut items = Vec::with_capacity(n.min(1 << 16));
                let mut value = f.value;
                for _ in 0..n {
                    if r.bool()? {
                        let (key, meta, trace) = read_obj_meta(&mut r)?;
                        let len = r.u64()?;
                        if len > value.len() as u64 {
                            return Err(SluiceError::protocol(
                                "multi-get value lengths exceed the value section",
                            ));
                        }
                        items.push(Ok(WireObject {
                            key,
                            meta,
                            value: value.split_to(len as usize),
                            trace,
                        }));
                    } else {
                        items.push(Err(from_json(&r.str()?)?));
                    }
                }
                if !value.is_empty() {
                    return Err(SluiceError::protocol(
                        "multi-get value section has trailing bytes",
                    ));
                }
                let more = !r.at_end() && r.bool()?;
                Response::Objects { items, more }
            }
            op::POOL => Response::Pool(from_json(&r.str()?)?),
            op::POOLS => Response::Pools(from_json(&r.str()?)?),
            op::WATCH_OK => Response::WatchOk { watch_id: r.u64()? },
            op::STATS_OK => Response::Stats(r.str()?),
            op::JSON => Response::Json(r.str()?),
            op::RAW => Response::Raw(f.value),
            op::ERROR => Response::Error(from_json(&r.str()?)?),
            other => {
                return Err(SluiceError::protocol(format!(
                    "unknown response opcode {other:#04x}"
                )))
            }
        };
        r.finish()?;
        Ok(resp)
    }
}

/// One entry of a multi-get reply, borrowed from wherever it lives.
pub enum MultiGetItem<'a> {
    Found(ObjRef<'a>),
    Failed(&'a SluiceError),
}

/// Encodes a multi-get reply: per item either the object or its error.
/// Values follow in order, unencoded.
pub fn encode_objects(out: &mut OutQueue, request_id: u64, items: &[MultiGetItem<'_>], more: bool) {
    let total: usize = items
        .iter()
        .map(|i| match i {
            MultiGetItem::Found(o) => o.value.len(),
            MultiGetItem::Failed(_) => 0,
        })
        .sum();
    let buf = out.buf();
    let start = buf.len();
    write_header(buf, op::OBJECTS, 0, request_id, 0, 0);
    {
        let mut w = MetaWriter(buf);
        w.u32(items.len() as u32);
        for item in items {
            match item {
                MultiGetItem::Found(o) => {
                    w.u8(1);
                    write_obj_meta(&mut w, o);
                    w.u64(o.value.len() as u64);
                }
                MultiGetItem::Failed(e) => {
                    w.u8(0).str(&json(*e));
                }
            }
        }
        if more {
            w.u8(1);
        }
    }
    let meta_len = buf.len() - start - HEADER_LEN;
    buf[start + 4..start + 8].copy_from_slice(&(meta_len as u32).to_le_bytes());
    buf[start + 8..start + 12].copy_from_slice(&(total as u32).to_le_bytes());
    for item in items {
        if let MultiGetItem::Found(o) = item {
            out.push_value(o.value);
        }
    }
}
