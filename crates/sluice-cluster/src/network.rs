//! Node-to-node transport for every group: per peer, one pipelined Sluice
//! connection carries the small consensus messages of all groups
//! (`Request::Raft { group, kind, body }`) and a second one those of
//! `[cluster] peer_bulk_bytes` (default `BULK_BYTES`) and more, with fault injection (links cut on demand) for
//! tests.

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use sluice_client::Conn;
use sluice_types::SluiceError;
use sluice_wire::{Request, Response};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How a node names itself in the HELLO of its connections to peers
/// (then its id): a node full of clients still takes these, and they must
/// authenticate next (`Request::PeerAuth`).
pub const PEER_CLIENT_PREFIX: &str = "sluice-node-";

/// Message kinds in `Request::Raft`.
pub mod kind {
    /// A chunk of a broadcast (`node::broadcast`), not a consensus message.
    pub const BCAST_CHUNK: u8 = 100;
    // 1 to 3 were openraft's append, vote and snapshot messages.
    /// A raft-rs message and its entries' commands (`raftrs::wire`).
    pub const RAFTRS: u8 = 4;
}

/// A consensus message of this many bytes or more goes on a peer's bulk
/// connection (see `Peers::conns`).
pub const BULK_BYTES: usize = 64 * 1024;

/// A connection to a peer: (peer, bulk).
type Lane = (u32, bool);

/// The connections to the other nodes, shared by every group.
pub struct Peers {
    pub me: u32,
    /// Per peer, one connection for small messages and one for large
    /// consensus messages (`BULK_BYTES` and more), so a heartbeat, a vote
    /// or another group's small append never waits on the wire behind a
    /// large value.
    conns: Mutex<HashMap<Lane, Arc<Conn>>>,
    /// One connect at a time per peer (a dead peer's connect timeout
    /// never holds up reconnecting to a live one).
    connecting: Mutex<HashMap<Lane, Arc<tokio::sync::Mutex<()>>>>,
    /// Links cut by fault injection (both directions).
    blocked: RwLock<HashSet<u32>>,
    connect_timeout: Duration,
    /// The cluster key this node authenticates with (`Request::PeerAuth`).
    key: String,
    /// TLS to peers (the node's own certificate presented), when on.
    tls: Option<sluice_tls::ClientTls>,
    /// Called with a peer's id when a connection to it ends (set once by
    /// the node: `ClusterNode::peer_connection_lost`).
    on_lost: std::sync::OnceLock<Arc<dyn Fn(u32) + Send + Sync>>,
    /// Consensus messages of this many bytes or more take the bulk
    /// connection (`BULK_BYTES` unless set; 0: none does).
    bulk_bytes: std::sync::atomic::AtomicUsize,
    /// Peers that refused this node's cluster key: when they last did
    /// (no new connection is tried for `REFUSED_BACKOFF` after it) and
    /// when it was last logged (`REFUSAL_LOG_EVERY`).
    refused: Mutex<HashMap<u32, Refused>>,
}

struct Refused {
    at: std::time::Instant,
    logged: std::time::Instant,
}

/// After a peer refused this node's cluster key, how long no connection
/// to it is tried (each try was a connection and a handshake per
/// consensus message: dozens a second, each logged on both sides).
const REFUSED_BACKOFF: Duration = Duration::from_secs(1);

/// How often a refusal (or a refused peer) is logged at most.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(30);

impl Peers {
    /// Sets the size from which consensus messages take the bulk
    /// connection (0: every message goes on the small one).
    pub fn set_bulk_bytes(&self, bytes: usize) {
        self.bulk_bytes
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn new(
        me: u32,
        connect_timeout: Duration,
        key: String,
        tls: Option<sluice_tls::ClientTls>,
    ) -> Self {
        Peers {
            key,
            tls,
            bulk_bytes: std::sync::atomic::AtomicUsize::new(BULK_BYTES),
            me,
            conns: Mutex::default(),
            connecting: Mutex::default(),
            blocked: RwLock::default(),
            connect_timeout,
            on_lost: std::sync::OnceLock::new(),
            refused: Mutex::default(),
        }
    }

    /// Whether `target` refused this node's key less than
    /// `REFUSED_BACKOFF` ago: then no new connection is tried yet.
    fn refused_recently(&self, target: u32) -> Option<SluiceError> {
        let refused = self.refused.lock();
        let r = refused.get(&target)?;
        (r.at.elapsed() < REFUSED_BACKOFF).then(|| SluiceError::Forbidden {
            what: format!(
                "a connection to node {target}: it refused this node's cluster key {} ms ago",
                r.at.elapsed().as_millis()
            ),
        })
    }

    /// Notes that `target` (at `addr`) refused this node's key; logs it
    /// once every `REFUSAL_LOG_EVERY`.
    fn note_refusal(&self, target: u32, addr: &str) {
        let now = std::time::Instant::now();
        let mut refused = self.refused.lock();
        let log = match refused.get_mut(&target) {
            Some(r) => {
                r.at = now;
                let due = r.logged.elapsed() >= REFUSAL_LOG_EVERY;
                if due {
                    r.logged = now;
                }
                due
            }
            None => {
                refused.insert(
                    target,
                    Refused {
                        at: now,
                        logged: now,
                    },
                );
                true
            }
        };
        if log {
            tracing::warn!(
                peer = target,
                %addr,
                "node {target} refused this node's cluster key: every node of a cluster needs the same key \
                 (the file cluster.key next to the layout, or [cluster] key_file); copy it from a node \
                 of the cluster and restart this one"
            );
        }
    }

    /// What to call when a connection to a peer ends (once; later calls
    /// are ignored).
    pub fn on_connection_lost(&self, f: impl Fn(u32) + Send + Sync + 'static) {
        let _ = self.on_lost.set(Arc::new(f));
    }

    pub fn is_blocked(&self, peer: u32) -> bool {
        self.blocked.read().contains(&peer)
    }

    /// Cuts the links to `peers` (fault injection); `heal` restores all.
    pub fn cut(&self, peers: &[u32]) {
        let mut b = self.blocked.write();
        b.extend(peers.iter().copied());
        let mut c = self.conns.lock();
        for p in peers {
            c.remove(&(*p, false));
            c.remove(&(*p, true));
        }
    }

    pub fn heal(&self) {
        self.blocked.write().clear();
    }

    pub fn blocked(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.blocked.read().iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// The peers that refused this node's cluster key at their last
    /// handshake (within the last `REFUSAL_LOG_EVERY`), by id.
    pub fn refusing(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .refused
            .lock()
            .iter()
            .filter(|(_, r)| r.at.elapsed() < REFUSAL_LOG_EVERY)
            .map(|(id, _)| *id)
            .collect();
        v.sort_unstable();
        v
    }

    /// The open connections to peers: (peer, bulk), sorted.
    pub fn connections(&self) -> Vec<(u32, bool)> {
        let mut v: Vec<(u32, bool)> = self
            .conns
            .lock()
            .iter()
            .filter(|(_, c)| c.is_alive())
            .map(|(k, _)| *k)
            .collect();
        v.sort_unstable();
        v
    }

    async fn conn(&self, target: u32, addr: &str, bulk: bool) -> Result<Arc<Conn>, SluiceError> {
        let key = (target, bulk);
        if let Some(c) = self.conns.lock().get(&key) {
            if c.is_alive() {
                return Ok(c.clone());
            }
        }
        let gate = self.connecting.lock().entry(key).or_default().clone();
        let _g = gate.lock().await;
        if let Some(c) = self.conns.lock().get(&key) {
            if c.is_alive() {
                return Ok(c.clone());
            }
        }
        if let Some(e) = self.refused_recently(target) {
            return Err(e);
        }
        let node_addr: sluice_types::cluster::NodeAddr =
            addr.parse().map_err(|e| SluiceError::Connection {
                reason: format!("node {target} has a bad address: {e}"),
            })?;
        // Looked up at each connection: a node that came back at another
        // IP address under its name is found there.
        let sa = sluice_client::resolve(&node_addr).await?;
        let c = Conn::connect_to(
            sa,
            node_addr.host_name(),
            &format!("{PEER_CLIENT_PREFIX}{}", self.me),
            self.connect_timeout,
            self.tls.as_ref(),
            None,
        )
        .await?;
        // Only an authenticated connection may carry consensus messages.
        let auth = Request::PeerAuth {
            node: self.me,
            key: self.key.clone(),
        };
        let answer = c.call(&auth, self.connect_timeout).await;
        if let Err(SluiceError::Forbidden { .. }) = &answer {
            self.note_refusal(target, addr);
        }
        match answer? {
            Response::Ok => {
                self.refused.lock().remove(&target);
            }
            other => {
                return Err(SluiceError::protocol(format!(
                    "node {target} answered the peer handshake with {other:?}"
                )))
            }
        }
        self.conns.lock().insert(key, c.clone());
        if let Some(f) = self.on_lost.get().cloned() {
            let closed = c.closed();
            tokio::spawn(async move {
                if closed.await {
                    f(target);
                }
            });
        }
        Ok(c)
    }

    /// Sends any request to a peer (e.g. a metadata change to the
    /// metadata group's leader).
    pub async fn request(
        &self,
        target: u32,
        addr: &str,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, SluiceError> {
        if self.is_blocked(target) {
            return Err(SluiceError::Unavailable {
                reason: format!("link to node {target} is cut (fault injection)"),
            });
        }
        // Large consensus messages (entries with values, snapshot and
        // broadcast chunks) take the bulk connection. Each of their senders
        // waits for a message's reply before it sends the next, so nothing
        // is reordered. Forwarded client requests stay on one connection,
        // in the order their client sent them.
        let bulk = self.takes_bulk(req);
        self.conn(target, addr, bulk)
            .await?
            .call(req, timeout)
            .await
    }

    /// Whether `req` goes on the bulk connection: a consensus message of
    /// `bulk_bytes` or more.
    fn takes_bulk(&self, req: &Request) -> bool {
        match req {
            Request::Raft { body, more, .. } => {
                self.is_bulk(body.len() + more.iter().map(Bytes::len).sum::<usize>())
            }
            _ => false,
        }
    }

    /// Whether a consensus message of `bytes` goes on the bulk connection.
    pub fn is_bulk(&self, bytes: usize) -> bool {
        let at = self.bulk_bytes.load(std::sync::atomic::Ordering::Relaxed);
        at > 0 && bytes >= at
    }

    /// Sends requests that expect no reply (raft-rs's consensus messages)
    /// to a peer, in order, on its small or its bulk connection.
    pub async fn send_oneway(
        &self,
        target: u32,
        addr: &str,
        bulk: bool,
        reqs: &[Request],
    ) -> Result<(), SluiceError> {
        if self.is_blocked(target) {
            return Err(SluiceError::Unavailable {
                reason: format!("link to node {target} is cut (fault injection)"),
            });
        }
        self.conn(target, addr, bulk)
            .await?
            .send_forget_all(reqs)
            .await
    }
}

/// Encodes `msg` with bincode; the `values` it contains (by reference)
/// become chunks of their own, sent without being copied. The copied part
/// is sized first (bincode's `serialized_size` adds lengths, copying
/// nothing), so a batch of small values is copied once, not again at
/// every doubling of a growing buffer.
pub(crate) fn encode_chunks<T: Serialize>(
    msg: &T,
    values: &[Bytes],
) -> bincode::Result<Vec<Bytes>> {
    let (buf, parts) = crate::chunks::encode_sized(msg, values)?;
    Ok(crate::chunks::into_bytes(buf, parts))
}

/// Borrowed mirrors of `Entry` / `Command` (same fields, same order, so
/// the same binary layout): decoding them lets each value be a slice of
/// the received frame (or of a record read back from the log) instead of
/// a copy.
pub(crate) mod borrowed {
    use crate::types::{Command, Entry, EntryPayload, LogId};
    use bytes::Bytes;
    use serde::Deserialize;
    use sluice_types::{ReqId, Trace};

    #[derive(Deserialize)]
    pub struct EntryRef<'a> {
        log_id: LogId,
        #[serde(borrow)]
        payload: PayloadRef<'a>,
    }

    #[derive(Deserialize)]
    enum PayloadRef<'a> {
        Blank,
        Normal(#[serde(borrow)] CommandRef<'a>),
        Membership(crate::types::Membership),
    }

    #[derive(Deserialize)]
    pub(crate) enum CommandRef<'a> {
        // bincode writes a struct variant's fields right after its tag,
        // exactly as a newtype variant holding a struct of the same
        // fields: one borrowed mirror serves a write and a batch element.
        Write(#[serde(borrow)] WriteRef<'a>),
        Meta(String),
        Tick {
            timestamp_us: u64,
        },
        Batch(#[serde(borrow)] Vec<WriteRef<'a>>),
        Purge {
            prefix: String,
            except: Vec<String>,
        },
        Without {
            down: Vec<u32>,
            #[serde(borrow)]
            writes: Vec<WriteRef<'a>>,
        },
    }

    #[derive(Deserialize)]
    pub(crate) struct WriteRef<'a> {
        key: String,
        #[serde(borrow)]
        value: Option<&'a [u8]>,
        expected: Option<u64>,
        timestamp_us: u64,
        req_id: Option<ReqId>,
        trace: Option<Trace>,
    }

    impl WriteRef<'_> {
        /// The write, its value sliced out of `frame` (no copy).
        fn into_write(self, frame: &Bytes) -> crate::types::BatchedWrite {
            crate::types::BatchedWrite {
                key: self.key,
                value: self.value.map(|v| frame.slice_ref(v)),
                expected: self.expected,
                timestamp_us: self.timestamp_us,
                req_id: self.req_id,
                trace: self.trace,
            }
        }
    }

    impl CommandRef<'_> {
        /// The command, its values sliced out of `frame` (no copy).
        pub(crate) fn into_command(self, frame: &Bytes) -> Command {
            match self {
                CommandRef::Meta(j) => Command::Meta(j),
                CommandRef::Tick { timestamp_us } => Command::Tick { timestamp_us },
                CommandRef::Batch(ws) => {
                    Command::Batch(ws.into_iter().map(|w| w.into_write(frame)).collect())
                }
                CommandRef::Write(w) => w.into_write(frame).into(),
                CommandRef::Purge { prefix, except } => Command::Purge { prefix, except },
                CommandRef::Without { down, writes } => Command::Without {
                    down,
                    writes: writes.into_iter().map(|w| w.into_write(frame)).collect(),
                },
            }
        }
    }

    impl EntryRef<'_> {
        /// The entry, its value sliced out of `frame` (no copy).
        pub fn into_entry(self, frame: &Bytes) -> Entry {
            let payload = match self.payload {
                PayloadRef::Blank => EntryPayload::Blank,
                PayloadRef::Membership(m) => EntryPayload::Membership(m),
                PayloadRef::Normal(c) => EntryPayload::Normal(c.into_command(frame)),
            };
            Entry {
                log_id: self.log_id,
                payload,
            }
        }
    }
}

/// Decodes a peer's message or reply. Bounded: it never reads, or
/// allocates for, more than the message holds (a length prefix beyond it
/// is an error, not an allocation), and the message types are flat (a
/// batch holds writes, never batches), so no input exhausts memory or the
/// stack; a bad message is an error for that message only.
pub fn decode_peer<'a, T: serde::Deserialize<'a>>(b: &'a [u8]) -> bincode::Result<T> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(b.len() as u64)
        .deserialize(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Command, CommittedLeaderId, Entry, EntryPayload, LogId, Membership};
    use serde::Deserialize;
    use std::collections::BTreeSet;

    /// Entries inside a message, as a log record or a peer's message
    /// holds them.
    #[derive(Serialize)]
    struct Req {
        entries: Vec<Entry>,
        commit: Option<LogId>,
    }

    #[derive(Deserialize)]
    struct ReqRef<'a> {
        #[serde(borrow)]
        entries: Vec<borrowed::EntryRef<'a>>,
        commit: Option<LogId>,
    }

    /// The chunks are bincode's bytes; the copied part is one buffer of
    /// exactly its size, and every value from `chunks::BY_REFERENCE` up (the
    /// 10 KB ones too) is referenced, not copied.
    #[test]
    fn encoded_entries_are_bincode_in_one_buffer_sized_up_front() {
        use crate::chunks::{large_values, tests::put};
        let req: Vec<Entry> = (2..18)
            .map(|i| put(i, 10_240))
            .chain([put(18, 100_000)])
            .collect();
        let values = large_values(&req);
        assert_eq!(values.len(), 17);
        let chunks = encode_chunks(&req, &values).unwrap();
        assert_eq!(chunks.concat(), bincode::serialize(&req).unwrap());
        for v in &values {
            assert!(
                chunks.iter().any(|c| c.as_ptr() == v.as_ptr()),
                "a {} byte value is referenced",
                v.len()
            );
        }
        let (buf, _) = crate::chunks::encode_sized(&req, &values).unwrap();
        let referenced = 16 * 10_240 + 100_000;
        assert_eq!(
            buf.len(),
            bincode::serialize(&req).unwrap().len() - referenced
        );
        assert_eq!(buf.capacity(), buf.len(), "sized once, never grown");
    }

    #[test]
    fn large_consensus_messages_take_the_bulk_connection_unless_it_is_off() {
        let peers = Peers::new(1, Duration::from_millis(100), "k".into(), None);
        let raft = |head: usize, chunk: usize| Request::Raft {
            from: 1,
            group: 0,
            kind: kind::RAFTRS,
            body: Bytes::from(vec![0u8; head]),
            more: vec![Bytes::from(vec![0u8; chunk])],
        };
        assert!(!peers.takes_bulk(&raft(100, 0)));
        assert!(!peers.takes_bulk(&raft(100, BULK_BYTES - 101)));
        // The message's whole size counts, its chunks included.
        assert!(peers.takes_bulk(&raft(100, BULK_BYTES - 100)));
        let forwarded = Request::Cluster {
            command: "x".repeat(BULK_BYTES),
        };
        assert!(
            !peers.takes_bulk(&forwarded),
            "client requests stay in order"
        );
        peers.set_bulk_bytes(0);
        assert!(!peers.takes_bulk(&raft(100, 1 << 20)));
        peers.set_bulk_bytes(1000);
        assert!(peers.takes_bulk(&raft(500, 500)));
    }

    #[test]
    fn borrowed_entry_decoding_matches_the_owned_layout_and_shares_the_frame() {
        let lid = |i| LogId::new(CommittedLeaderId::new(2, 1), i);
        let value = Bytes::from(vec![7u8; 4096]);
        let req = Req {
            entries: vec![
                Entry {
                    log_id: lid(5),
                    payload: EntryPayload::Blank,
                },
                Entry {
                    log_id: lid(6),
                    payload: EntryPayload::Membership(Membership::new(
                        BTreeSet::from([1, 2, 3]),
                        [4],
                    )),
                },
                Entry {
                    log_id: lid(7),
                    payload: EntryPayload::Normal(Command::Write {
                        key: "/vol/a".into(),
                        value: Some(value.clone()),
                        expected: Some(3),
                        timestamp_us: 9,
                        req_id: Some(sluice_types::ReqId { client: 1, seq: 2 }),
                        trace: None,
                    }),
                },
                Entry {
                    log_id: lid(8),
                    payload: EntryPayload::Normal(Command::Meta("{}".into())),
                },
                Entry {
                    log_id: lid(9),
                    payload: EntryPayload::Normal(Command::Tick { timestamp_us: 11 }),
                },
                Entry {
                    log_id: lid(10),
                    payload: EntryPayload::Normal(Command::Batch(vec![
                        crate::types::BatchedWrite {
                            key: "/p/b".into(),
                            value: Some(value.clone()),
                            expected: None,
                            timestamp_us: 12,
                            req_id: Some(sluice_types::ReqId { client: 1, seq: 3 }),
                            trace: None,
                        },
                        crate::types::BatchedWrite {
                            key: "/p/c".into(),
                            value: None,
                            expected: Some(1),
                            timestamp_us: 13,
                            req_id: None,
                            trace: None,
                        },
                    ])),
                },
                Entry {
                    log_id: lid(11),
                    payload: EntryPayload::Normal(Command::Without {
                        down: vec![3],
                        writes: vec![crate::types::BatchedWrite {
                            key: "/p/d".into(),
                            value: Some(value.clone()),
                            expected: None,
                            timestamp_us: 14,
                            req_id: None,
                            trace: None,
                        }],
                    }),
                },
            ],
            commit: Some(lid(6)),
        };
        let frame = Bytes::from(bincode::serialize(&req).unwrap());
        let r: ReqRef<'_> = bincode::deserialize(&frame).unwrap();
        assert_eq!(r.commit, req.commit);
        let entries: Vec<Entry> = r
            .entries
            .into_iter()
            .map(|e| e.into_entry(&frame))
            .collect();
        assert_eq!(
            bincode::serialize(&entries).unwrap(),
            bincode::serialize(&req.entries).unwrap()
        );
        let EntryPayload::Normal(Command::Write { value: Some(v), .. }) = &entries[2].payload
        else {
            panic!()
        };
        let range = frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len();
        assert!(
            range.contains(&(v.as_ptr() as usize)),
            "the value is a slice of the frame"
        );
        let EntryPayload::Normal(Command::Batch(cmds)) = &entries[5].payload else {
            panic!()
        };
        let Some(v) = &cmds[0].value else { panic!() };
        assert!(
            range.contains(&(v.as_ptr() as usize)),
            "a batched value is a slice of the frame too"
        );
        let EntryPayload::Normal(Command::Without { down, writes }) = &entries[6].payload else {
            panic!()
        };
        assert_eq!(down, &[3]);
        let Some(v) = &writes[0].value else { panic!() };
        assert!(range.contains(&(v.as_ptr() as usize)));
    }
}
