//! Node-to-node transport for every group: per peer, one pipelined Sluice
//! connection carries the small consensus messages of all groups
//! (`Request::Raft { group, kind, body }`) and a second one those of
//! `[cluster] peer_bulk_bytes` (default `BULK_BYTES`) and more, with fault injection (links cut on demand) for
//! tests.

use crate::chunks::large_values;
use crate::types::Entry;
use crate::types::TypeConfig;
use bytes::Bytes;
use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::BasicNode;
use openraft_legacy::network_v1::{
    Adapter, ChunkedSnapshotReceiver, InstallSnapshotError, InstallSnapshotRequest,
    InstallSnapshotResponse, RaftNetwork,
};
use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_client::Conn;
use sluice_types::marks::Point;
use sluice_types::SluiceError;
use sluice_wire::{Request, Response};
use std::collections::{HashMap, HashSet};
use std::io::Cursor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Message kinds in `Request::Raft`.
pub mod kind {
    /// A chunk of a broadcast (`node::broadcast`), not a consensus message.
    pub const BCAST_CHUNK: u8 = 100;
    pub const APPEND: u8 = 1;
    pub const VOTE: u8 = 2;
    pub const SNAPSHOT: u8 = 3;
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
    /// When peers last acknowledged this node's leadership, per group.
    pub acks: Acks,
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
}

/// When each peer last acknowledged this node as a group's leader: an
/// append-entries reply that was not a higher vote, or a granted vote. A
/// leader whose quorum has not acknowledged it lately has probably been
/// cut off and replaced: it must not keep telling clients it leads.
#[derive(Default)]
pub struct Acks(Mutex<HashMap<(u64, u64), std::time::Instant>>);

impl Acks {
    fn record(&self, group: u64, peer: u64) {
        self.0
            .lock()
            .insert((group, peer), std::time::Instant::now());
    }

    /// Whether a majority of `voters` (this node `me` counts as itself)
    /// acknowledged this node within `within`.
    pub fn quorum_within(
        &self,
        group: u64,
        voters: impl IntoIterator<Item = u64>,
        me: u64,
        within: Duration,
    ) -> bool {
        let now = std::time::Instant::now();
        let acks = self.0.lock();
        let (mut total, mut fresh) = (0usize, 0usize);
        for v in voters {
            total += 1;
            if v == me
                || acks
                    .get(&(group, v))
                    .is_some_and(|t| now.saturating_duration_since(*t) <= within)
            {
                fresh += 1;
            }
        }
        fresh * 2 > total
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

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
            acks: Acks::default(),
            on_lost: std::sync::OnceLock::new(),
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
        let sa: SocketAddr = addr.parse().map_err(|e| SluiceError::Connection {
            reason: format!("node {target} has a bad address {addr:?}: {e}"),
        })?;
        let c = Conn::connect_with(
            sa,
            &format!("sluice-node-{}", self.me),
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
        match c.call(&auth, self.connect_timeout).await? {
            Response::Ok => {}
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

    /// Sends one consensus message (its encoding in chunks, sent back to
    /// back) and returns the peer's reply body.
    pub async fn call(
        &self,
        target: u32,
        addr: &str,
        group: u64,
        kind: u8,
        body: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<Bytes, SluiceError> {
        let mut parts = body.into_iter();
        let req = Request::Raft {
            from: self.me,
            group,
            kind,
            body: parts.next().unwrap_or_default(),
            more: parts.collect(),
        };
        match self.request(target, addr, &req, timeout).await? {
            Response::Raw(b) => Ok(b),
            other => Err(SluiceError::protocol(format!(
                "unexpected reply to a consensus message: {other:?}"
            ))),
        }
    }
}

/// Makes a per-target client for one group.
pub struct NetFactory {
    pub peers: Arc<Peers>,
    pub group: u64,
    /// How long a replication stream holds a commit-only AppendEntries
    /// for entries to carry it (`Net`; zero: never).
    pub commit_hold: Duration,
}

pub struct NetClient {
    peers: Arc<Peers>,
    group: u64,
    target: u64,
    addr: String,
}

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = Net;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Self::Network {
        Net {
            inner: NetClient {
                peers: self.peers.clone(),
                group: self.group,
                target,
                addr: node.addr.clone(),
            }
            .into_v2(),
            commit_hold: self.commit_hold,
        }
    }
}

type Req = AppendEntriesRequest<TypeConfig>;

/// One group's messages to one peer. Every call is openraft-legacy's v1
/// adapter over `NetClient` (snapshots go in chunks, so a large one never
/// has to be one message), except replication streams: after a commit,
/// openraft sends each follower an AppendEntries without entries that
/// only carries the new commit index, and the follower wakes up twice per
/// write (the entry, then its commit). Here a stream holds such a request
/// up to `commit_hold`; when entries follow meanwhile, only they go (their
/// `leader_commit` is at least the held one's), and their answer answers
/// both (see `hold_commit_only`).
pub struct Net {
    inner: Adapter<TypeConfig, NetClient, Cursor<Vec<u8>>>,
    commit_hold: Duration,
}

/// Whether `next` may go in place of the entry-less `held`: same leader,
/// and a success for `next` proves the follower holds `held`'s
/// `prev_log_id` (a follower that matches up to `next`'s last entry holds
/// every entry before it, `next.prev_log_id` and so `held.prev_log_id`
/// included), and it carries a commit index at least as new.
fn supersedes(next: &Req, held: &Req) -> bool {
    next.vote == held.vote
        && next.prev_log_id >= held.prev_log_id
        && next.leader_commit >= held.leader_commit
}

/// The request to send next, given the stream's next one `req`: an
/// entry-less `req` is held for up to `hold` while `input` yields requests
/// that supersede it, until one brings entries. Returns the request to
/// send and one taken from `input` that must go after it.
///
/// openraft counts a follower's answer as acknowledging every request in
/// flight up to the log id it matches (`InflightAppendQueue::drain_acked`),
/// so the one answer covers the held request too; its heartbeat progress
/// is dated from when the held request was made, earlier than the real
/// send, so the leader's lease only comes out shorter. A stream that ends
/// (a heartbeat is a stream of one request) or a hold that runs out sends
/// the held request as it is.
async fn hold_commit_only<S>(mut req: Req, input: &mut S, hold: Duration) -> (Req, Option<Req>)
where
    S: futures_util::Stream<Item = Req> + futures_util::stream::FusedStream + Unpin,
{
    use futures_util::StreamExt;
    if hold.is_zero() || !req.entries.is_empty() {
        return (req, None);
    }
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        match tokio::time::timeout_at(deadline, input.next()).await {
            Ok(Some(next)) if supersedes(&next, &req) => {
                req = next;
                if !req.entries.is_empty() {
                    return (req, None);
                }
            }
            Ok(Some(next)) => return (req, Some(next)),
            Ok(None) | Err(_) => return (req, None),
        }
    }
}

impl openraft::network::v2::RaftNetworkV2<TypeConfig> for Net {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: Req,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.inner.append_entries(rpc, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.inner.vote(rpc, option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: openraft::alias::VoteOf<TypeConfig>,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, Self::SnapshotData>,
        cancel: impl std::future::Future<Output = openraft::error::ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<
        openraft::raft::SnapshotResponse<TypeConfig>,
        openraft::error::StreamingError<TypeConfig>,
    > {
        self.inner
            .full_snapshot(vote, snapshot, cancel, option)
            .await
    }

    async fn transfer_leader(
        &mut self,
        req: openraft::raft::TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<openraft::raft::TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.inner.transfer_leader(req, option).await
    }

    fn backoff(&self) -> Option<openraft::network::Backoff> {
        self.inner.backoff()
    }

    /// openraft's sequential stream (one request in flight; the next is
    /// taken from `input` once the answer is in), with `hold_commit_only`
    /// in front of each send.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> openraft::base::BoxFuture<
        's,
        Result<
            openraft::base::BoxStream<
                's,
                Result<openraft::raft::StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>,
            >,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: futures_util::Stream<Item = Req> + Send + Unpin + 'static,
    {
        use futures_util::StreamExt;
        let hold = self.commit_hold;
        let net = &mut self.inner;
        let state = Some((net, input.fuse(), None::<Req>));
        let stream = futures_util::stream::unfold(state, move |state| {
            let option = option.clone();
            async move {
                let (net, mut input, pending) = state?;
                let first = match pending {
                    Some(r) => r,
                    None => input.next().await?,
                };
                let (req, pending) = hold_commit_only(first, &mut input, hold).await;
                let prev = req.prev_log_id;
                let last = req.entries.last().map(|e| e.log_id).or(prev);
                match net.append_entries(req, option).await {
                    Ok(resp) => {
                        let res = resp.into_stream_result(prev, last);
                        // A conflict, a higher vote or a partial success
                        // ends the stream; openraft starts another.
                        let go_on = res.as_ref().is_ok_and(|m| *m == last);
                        Some((Ok(res), go_on.then_some((net, input, pending))))
                    }
                    Err(e) => Some((Err(e), None)),
                }
            }
        });
        Box::pin(async move { Ok(Box::pin(stream) as openraft::base::BoxStream<'s, _>) })
    }
}

type RpcErr<E = openraft::error::Infallible> = RPCError<TypeConfig, RaftError<TypeConfig, E>>;

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

impl NetClient {
    async fn rpc<Req: Serialize, Resp: DeserializeOwned, E>(
        &self,
        kind: u8,
        req: &Req,
        values: &[Bytes],
        option: &RPCOption,
    ) -> Result<Resp, RpcErr<E>>
    where
        E: std::error::Error + DeserializeOwned,
    {
        let body =
            encode_chunks(req, values).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = self
            .peers
            .call(
                self.target as u32,
                &self.addr,
                self.group,
                kind,
                body,
                option.hard_ttl(),
            )
            .await
            .map_err(|e| match e {
                SluiceError::Timeout { .. } => {
                    RPCError::Network(NetworkError::new(&Msg(e.to_string())))
                }
                other => RPCError::Unreachable(Unreachable::new(&Msg(other.to_string()))),
            })?;
        let res: Result<Resp, RaftError<TypeConfig, E>> =
            decode_peer(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for NetClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RpcErr> {
        if rpc.entries.is_empty() {
            // A new commit index (or a heartbeat): the commit that woke
            // this also woke the tasks that apply it and answer clients;
            // let them run first, so a client's reply is not sent after
            // every follower's commit message.
            tokio::task::yield_now().await;
        }
        let values = large_values(&rpc.entries);
        let marked = crate::marks::on().then(|| entry_indexes(&rpc.entries));
        if let Some(ix) = &marked {
            crate::marks::mark_all(Point::Send, self.group, ix.iter().copied(), self.target);
        }
        let r: AppendEntriesResponse<TypeConfig> =
            self.rpc(kind::APPEND, &rpc, &values, &option).await?;
        if let Some(ix) = marked {
            crate::marks::mark_all(Point::Acked, self.group, ix, self.target);
        }
        if !matches!(r, AppendEntriesResponse::HigherVote(_)) {
            self.peers.acks.record(self.group, self.target);
        }
        Ok(r)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<TypeConfig>, RpcErr<InstallSnapshotError>> {
        self.rpc(kind::SNAPSHOT, &rpc, &[], &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcErr> {
        let r: VoteResponse<TypeConfig> = self.rpc(kind::VOTE, &rpc, &[], &option).await?;
        if r.vote_granted {
            self.peers.acks.record(self.group, self.target);
        }
        Ok(r)
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // Retry an unreachable peer quickly: it is usually a restart.
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(100)))
    }
}

/// Borrowed mirrors of `AppendEntriesRequest` / `Entry` / `Command`
/// (same fields, same order, so the same binary layout): decoding them
/// lets each value be a slice of the received frame instead of a copy.
pub(crate) mod borrowed {
    use crate::types::{Command, Entry, LogId, Vote};
    use bytes::Bytes;
    use openraft::EntryPayload;
    use serde::Deserialize;
    use sluice_types::{ReqId, Trace};

    #[derive(Deserialize)]
    pub struct AppendRef<'a> {
        pub vote: Vote,
        pub prev_log_id: Option<LogId>,
        #[serde(borrow)]
        pub entries: Vec<EntryRef<'a>>,
        pub leader_commit: Option<LogId>,
    }

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
        Tick { timestamp_us: u64 },
        Batch(#[serde(borrow)] Vec<WriteRef<'a>>),
        Purge { prefix: String, except: Vec<String> },
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

/// A consensus message as a peer sent it.
pub enum PeerMessage {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// Decodes a consensus message of `kind` (values of appended entries are
/// slices of `body`, not copies).
pub fn decode_message(kind: u8, body: &Bytes) -> Result<PeerMessage, SluiceError> {
    let bad = |e: bincode::Error| SluiceError::protocol(format!("bad consensus message: {e}"));
    match kind {
        kind::APPEND => {
            let r: borrowed::AppendRef<'_> = decode_peer(body).map_err(bad)?;
            Ok(PeerMessage::Append(AppendEntriesRequest {
                vote: r.vote,
                prev_log_id: r.prev_log_id,
                entries: r.entries.into_iter().map(|e| e.into_entry(body)).collect(),
                leader_commit: r.leader_commit,
            }))
        }
        kind::VOTE => Ok(PeerMessage::Vote(decode_peer(body).map_err(bad)?)),
        kind::SNAPSHOT => Ok(PeerMessage::Snapshot(decode_peer(body).map_err(bad)?)),
        k => Err(SluiceError::protocol(format!(
            "unknown consensus message kind {k}"
        ))),
    }
}

/// The log indexes of `entries` (for `marks`).
pub fn entry_indexes(entries: &[Entry]) -> Vec<u64> {
    entries.iter().map(|e| e.log_id.index).collect()
}

/// Runs a consensus message (`decode_message`) addressed to `raft`, and
/// encodes the reply (the receiving half of `NetClient::rpc`).
pub async fn dispatch(raft: &crate::types::Raft, msg: PeerMessage) -> Result<Bytes, SluiceError> {
    fn enc<T: Serialize>(v: &T) -> Result<Bytes, SluiceError> {
        bincode::serialize(v)
            .map(Bytes::from)
            .map_err(|e| SluiceError::Internal {
                reason: e.to_string(),
            })
    }
    match msg {
        PeerMessage::Append(req) => enc(&raft.append_entries(req).await),
        PeerMessage::Vote(req) => enc(&raft.vote(req).await),
        PeerMessage::Snapshot(req) => enc(&raft.install_snapshot(req).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Command, CommittedLeaderId, Entry, LogId, Membership, Vote};
    use openraft::vote::RaftLeaderId;
    use openraft::EntryPayload;
    use std::collections::BTreeSet;

    /// Requests compared by their contents (openraft's type has no `==`).
    fn d<T: std::fmt::Debug>(x: &T) -> String {
        format!("{x:?}")
    }

    fn append(term: u64, prev: Option<u64>, entries: &[u64], commit: Option<u64>) -> Req {
        let lid = |i| LogId::new(CommittedLeaderId::new(term, 1), i);
        AppendEntriesRequest {
            vote: Vote::new_committed(term, 1),
            prev_log_id: prev.map(lid),
            entries: entries
                .iter()
                .map(|i| Entry {
                    log_id: lid(*i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
            leader_commit: commit.map(lid),
        }
    }

    /// The commit-only request (commit 5 after entry 5) is not sent: the
    /// entries that follow (6) carry it, and a newer commit-only request
    /// met on the way is folded in too.
    #[tokio::test]
    async fn entries_that_follow_a_commit_only_request_carry_its_commit() {
        use futures_util::StreamExt;
        let mut input = futures_util::stream::iter(vec![
            append(2, Some(5), &[], Some(6)),
            append(2, Some(5), &[6], Some(6)),
        ])
        .chain(futures_util::stream::pending())
        .fuse();
        let held = append(2, Some(5), &[], Some(5));
        let (req, pending) = hold_commit_only(held, &mut input, Duration::from_secs(60)).await;
        assert_eq!(
            d(&(req, pending)),
            d(&(append(2, Some(5), &[6], Some(6)), None::<Req>))
        );
    }

    /// A request with entries goes at once; so does a commit-only one when
    /// its stream ends (a heartbeat is a stream of one request).
    #[tokio::test]
    async fn entries_and_the_last_request_of_a_stream_are_not_held() {
        use futures_util::StreamExt;
        let mut never = futures_util::stream::pending().fuse();
        let e = append(2, Some(5), &[6], Some(5));
        let (req, pending) = hold_commit_only(e.clone(), &mut never, Duration::from_secs(60)).await;
        assert_eq!(d(&(req, pending)), d(&(e, None::<Req>)));
        let hb = append(2, Some(5), &[], Some(5));
        let mut one = futures_util::stream::empty().fuse();
        let (req, pending) = hold_commit_only(hb.clone(), &mut one, Duration::from_secs(60)).await;
        assert_eq!(d(&(req, pending)), d(&(hb, None::<Req>)));
    }

    /// A request that cannot stand for the held one (another leader's, or
    /// one that starts before it) is sent after it, not in its place.
    #[tokio::test]
    async fn a_request_that_proves_less_is_sent_after_the_held_one() {
        use futures_util::StreamExt;
        let held = append(2, Some(5), &[], Some(5));
        for next in [
            append(3, Some(5), &[6], Some(5)),
            append(2, Some(4), &[5, 6], Some(5)),
            append(2, Some(5), &[6], Some(4)),
        ] {
            let mut input = futures_util::stream::iter(vec![next.clone()]).fuse();
            let (req, pending) =
                hold_commit_only(held.clone(), &mut input, Duration::from_secs(60)).await;
            assert_eq!(d(&(req, pending)), d(&(held.clone(), Some(next))));
        }
    }

    /// With nothing to carry it, the held request goes once the hold ends.
    #[tokio::test]
    async fn a_commit_only_request_goes_alone_when_the_hold_ends() {
        use futures_util::StreamExt;
        let mut never = futures_util::stream::pending().fuse();
        let held = append(2, Some(5), &[], Some(5));
        let t = std::time::Instant::now();
        let (req, pending) =
            hold_commit_only(held.clone(), &mut never, Duration::from_millis(20)).await;
        assert_eq!(d(&(req, pending)), d(&(held.clone(), None::<Req>)));
        assert!(t.elapsed() >= Duration::from_millis(20));
        let (req, _) = hold_commit_only(held.clone(), &mut never, Duration::ZERO).await;
        assert_eq!(d(&req), d(&held), "zero: never held");
    }

    /// The chunks are bincode's bytes; the copied part is one buffer of
    /// exactly its size, and every value from `chunks::BY_REFERENCE` up (the
    /// 10 KB ones too) is referenced, not copied.
    #[test]
    fn an_encoded_append_is_bincode_in_one_buffer_sized_up_front() {
        use crate::chunks::tests::put;
        let req: Req = AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(put(1, 0).log_id),
            entries: (2..18)
                .map(|i| put(i, 10_240))
                .chain([put(18, 100_000)])
                .collect(),
            leader_commit: Some(put(1, 0).log_id),
        };
        let values = large_values(&req.entries);
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
            kind: kind::APPEND,
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
    fn borrowed_append_decoding_matches_the_owned_layout_and_shares_the_frame() {
        let lid = |i| LogId::new(CommittedLeaderId::new(2, 1), i);
        let value = Bytes::from(vec![7u8; 4096]);
        let req: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(lid(4)),
            entries: vec![
                Entry {
                    log_id: lid(5),
                    payload: EntryPayload::Blank,
                },
                Entry {
                    log_id: lid(6),
                    payload: EntryPayload::Membership(Membership::new_with_defaults(
                        vec![BTreeSet::from([1, 2, 3])],
                        [1, 2, 3],
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
            ],
            leader_commit: Some(lid(6)),
        };
        let frame = Bytes::from(bincode::serialize(&req).unwrap());
        let r: borrowed::AppendRef<'_> = bincode::deserialize(&frame).unwrap();
        assert_eq!(r.vote, req.vote);
        assert_eq!(r.prev_log_id, req.prev_log_id);
        assert_eq!(r.leader_commit, req.leader_commit);
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
    }
}
