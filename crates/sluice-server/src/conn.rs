use crate::config::ServerConfig;
use crate::listing::What;
use crate::recv_pool::LargeBuf;
use crate::stats::ServerStats;
use crate::watch::{Notice, WatchHub, WATCH_QUEUE_LEN};
use bytes::BytesMut;
use sluice_cluster::rt::blocking as off_event_loop;
use sluice_store::Store;
use sluice_types::{SluiceError, VERSION_NONE};
use sluice_wire::{
    encode_object, encode_objects, op, Frame, FrameDecoder, FrameError, ObjRef, OutQueue, Request,
    Response, ServerInfo, FLAG_NO_REPLY, PROTOCOL_VERSION,
};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch, Semaphore};

/// Most versions, and value bytes, a resumed watch replays.
const REPLAY_MAX: usize = 100_000;
const REPLAY_BYTES_MAX: usize = 256 << 20;

/// Most versions one history reply carries (clients page for more).
const HISTORY_PAGE_MAX: u32 = 1024;

/// Most bytes of keys one listing reply carries (clients page for more):
/// half the 8 MiB of metadata a client accepts. A pool's keys went in one
/// reply, and past about 180,000 keys of 40 bytes it was a frame larger
/// than that: `ls` of a large pool failed with a protocol error.
pub const KEYS_PAGE_BYTES: usize = 4 << 20;

/// Most value bytes one multi-get or history reply carries (at least one
/// object, however large): the rest is left for the client to ask again.
/// A reply of every value asked for could pass what a client accepts in
/// one frame (`max_value_bytes`): an `mget` of 150 values of 1 MB failed
/// with "server sent a bad frame".
const REPLY_VALUE_BYTES: usize = 64 << 20;

fn reply_budget(limits: &sluice_types::Limits) -> usize {
    REPLY_VALUE_BYTES.min(limits.max_value_bytes as usize)
}

/// How many of the leading objects of these sizes fit in `budget` bytes
/// (one at least, when there is one).
fn within_budget(sizes: impl Iterator<Item = usize>, budget: usize) -> usize {
    let mut used = 0usize;
    let mut n = 0;
    for size in sizes {
        used = used.saturating_add(size);
        if n > 0 && used > budget {
            break;
        }
        n += 1;
    }
    n
}

/// Read buffer growth step; a frame larger than this gets one exact
/// reservation once its header is in.
const READ_CHUNK: usize = 64 * 1024;

pub struct ConnCtx {
    pub cfg: ServerConfig,
    pub store: Arc<Store>,
    /// Set when this node is part of a cluster (replicated shards).
    pub cluster: Option<Arc<sluice_cluster::ClusterNode>>,
    pub watches: Arc<WatchHub>,
    pub engine: Arc<sluice_compute::Engine>,
    pub stats: ServerStats,
    /// Access rules, rate limits, QoS and principals in force here.
    pub policy: Arc<crate::policy::PolicyState>,
    /// Recycled buffers that large frames are read into.
    pub recv_pool: Arc<crate::recv_pool::RecvPool>,
    /// What the connections' listings in progress may hold together.
    pub listing_budget: crate::listing::Budget,
    pub conn_slots: Arc<Semaphore>,
    /// A cluster node's room for its peers' connections once clients
    /// fill `conn_slots`.
    pub peer_slots: Arc<Semaphore>,
    pub next_conn_id: AtomicU64,
    pub shutdown_tx: watch::Sender<bool>,
    pub shutdown_rx: watch::Receiver<bool>,
}

/// Why a connection ends.
enum Close {
    Eof,
    Shutdown,
    Io(std::io::Error),
    /// Send this error (to this request id), then close.
    Fatal(u64, Box<SluiceError>),
}

struct Conn {
    id: u64,
    ctx: Arc<ConnCtx>,
    decoder: FrameDecoder,
    out: OutQueue,
    notify_tx: mpsc::Sender<Notice>,
    /// Replies computed later (time reads waiting for stability).
    deferred_tx: mpsc::Sender<Deferred>,
    deferred_in_flight: Arc<std::sync::atomic::AtomicUsize>,
    handshaken: bool,
    /// Accepted past `limits.max_connections` as a peer's (a cluster
    /// node's connections are never refused for its clients' sake): it
    /// must say it is a node in its HELLO and prove it with `PeerAuth`
    /// next, or it is told the node is full and closed.
    peers_only: bool,
    /// The node this connection authenticated as (`Request::PeerAuth`):
    /// only then may it carry consensus messages and internal operations.
    peer: Option<u32>,
    /// Where the connection comes from (for the audit log).
    addr: SocketAddr,
    /// The principal a verified client certificate names.
    cert_name: Option<String>,
    /// Who the connection acts as (set by the handshake).
    principal: crate::policy::Principal,
    /// The policies in force for `principal`, rebuilt when they change.
    view: crate::policy::View,
    /// QoS: a bulk request held back while small ones are served.
    held: Option<Frame>,
    /// QoS: small requests decoded since the last flush (`Gate::done`).
    small_pending: usize,
    /// QoS: bulk value bytes executed since this connection last yielded.
    bulk_turn_bytes: usize,
    /// Values arriving in parts (`FLAG_PART`), by request id.
    parts: std::collections::HashMap<u64, Partial>,
    /// Bytes held in `parts`.
    parts_bytes: usize,
    /// Listings in progress, each sorted once for all its pages.
    listings: crate::listing::Listings,
    /// Set while re-running a request after a metadata catch-up (no second catch-up).
    retried_after_catch_up: bool,
    /// A HELLO waits for a metadata catch-up (`hello`).
    hello_deferred: bool,
    /// The request being executed, when metrics are exported: its name,
    /// its key's pool and when it was decoded. A deferred request takes
    /// it along and records it when its reply is ready.
    timing: Option<Timing>,
}

type Timing = (&'static str, String, std::time::Instant);

/// A value arriving in parts: what came so far, or why it is refused (the
/// request's final frame is answered with that error).
enum Partial {
    Bytes(BytesMut),
    Refused(SluiceError),
}

/// A reply computed off the connection's task.
enum Reply {
    Object(Result<Arc<sluice_types::Object>, SluiceError>),
    Put(Result<sluice_types::PutResult, SluiceError>),
    Resp(Result<Response, SluiceError>),
    /// Run this request again (after a metadata catch-up).
    Retry(Box<Request>, bool),
    /// Run this request now (its rate-limit delay is over).
    Run(Box<Request>, bool),
}

type Deferred = (u64, Reply);

/// A connection's byte stream: a TCP socket, or TLS over one.
pub trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

/// Serves one connection; `cert_name`: the principal its verified client
/// certificate names, if it presented one.
pub async fn serve_conn<S: Stream>(
    ctx: Arc<ConnCtx>,
    mut sock: S,
    peer: SocketAddr,
    cert_name: Option<String>,
    peers_only: bool,
) {
    let id = ctx.next_conn_id.fetch_add(1, Ordering::Relaxed);
    let (notify_tx, mut notify_rx) = mpsc::channel(WATCH_QUEUE_LEN);
    let (deferred_tx, mut deferred_rx) =
        mpsc::channel(ctx.cfg.limits.max_in_flight_per_conn as usize);
    let limits = &ctx.cfg.limits;
    let mut conn = Conn {
        id,
        decoder: FrameDecoder::new(limits.max_meta_bytes, limits.max_value_bytes),
        out: OutQueue::zero_copy(),
        notify_tx,
        deferred_tx,
        deferred_in_flight: Arc::default(),
        handshaken: false,
        peers_only,
        peer: None,
        addr: peer,
        cert_name,
        principal: crate::policy::Principal::anonymous(),
        view: crate::policy::View::none(),
        held: None,
        small_pending: 0,
        bulk_turn_bytes: 0,
        parts: Default::default(),
        parts_bytes: 0,
        listings: crate::listing::Listings::new(ctx.listing_budget.clone()),
        retried_after_catch_up: false,
        hello_deferred: false,
        timing: None,
        ctx: ctx.clone(),
    };
    let span = tracing::debug_span!("conn", id, %peer);
    let _e = span.enter();
    let reason = conn.run(&mut sock, &mut notify_rx, &mut deferred_rx).await;
    ctx.policy.gate.done(conn.small_pending);
    if let (Some(node), Some(cl), false) = (
        conn.peer,
        ctx.cluster.as_ref(),
        matches!(reason, Close::Shutdown),
    ) {
        // A peer's connection closed: if it was a leader that crashed,
        // its groups elect a new one now (`ClusterNode::peer_connection_lost`).
        cl.peer_connection_lost(node);
    }
    match reason {
        Close::Eof | Close::Shutdown => tracing::debug!("connection closed"),
        Close::Io(e) => tracing::debug!(error = %e, "connection I/O error"),
        Close::Fatal(rid, e) => {
            ctx.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
            tracing::info!(error = %e, "closing connection after a protocol error");
            conn.out = OutQueue::zero_copy();
            Response::error(&mut conn.out, rid, &e);
            let _ =
                tokio::time::timeout(Duration::from_secs(1), flush(&mut sock, &mut conn.out)).await;
        }
    }
    ctx.watches.remove_conn(id);
}

async fn flush<S: Stream>(sock: &mut S, out: &mut OutQueue) -> std::io::Result<()> {
    if !out.is_empty() {
        crate::metrics::sent(out.len());
    }
    while !out.is_empty() {
        let mut slots = [IoSlice::new(&[]); 256];
        let n = out.io_slices(&mut slots);
        let written = sock.write_vectored(&slots[..n]).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        out.advance(written);
    }
    // TLS: push out the records written (a no-op on TCP).
    sock.flush().await
}

/// Where a request goes on a cluster node (`Conn::replicated_shard`).
enum Route {
    /// A key of this replicated shard.
    Shard(sluice_store::ShardId),
    /// No key: a cluster or pool command, or served as on any node.
    Unkeyed,
    /// Served by the local handlers as it is.
    Local,
    /// Answered (an error) or dropped (no reply wanted).
    Replied,
    /// A pool this node may not have applied yet: catch up, run again.
    CatchUp,
}

impl Conn {
    async fn run<S: Stream>(
        &mut self,
        sock: &mut S,
        notify_rx: &mut mpsc::Receiver<Notice>,
        deferred_rx: &mut mpsc::Receiver<Deferred>,
    ) -> Close {
        let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
        let mut shutdown = self.ctx.shutdown_rx.clone();
        let t = &self.ctx.cfg.timeouts;
        let handshake = Duration::from_millis(t.handshake_ms);
        let frame_to = Duration::from_millis(t.frame_ms);
        let idle = (t.idle_ms > 0).then(|| Duration::from_millis(t.idle_ms));
        let started = tokio::time::Instant::now();
        // When the first byte of the (still partial) frame at the head of
        // the buffer arrived: the whole frame is due `frame_ms` after it,
        // however slowly it trickles in.
        let mut frame_started: Option<tokio::time::Instant> = None;
        // A large frame being read into a buffer of its own, and its size.
        let mut large: Option<(LargeBuf, usize)> = None;
        loop {
            if self.held.is_some() {
                // QoS: a bulk request waits (bounded) for the node's small
                // requests, then this connection goes on where it stopped.
                if let Err(e) = self.flush_out(sock).await {
                    return Close::Io(e);
                }
                self.ctx.policy.gate.hold_bulk().await;
                self.bulk_turn_bytes = 0;
                if let Err(c) = self.process(&mut rbuf) {
                    return c;
                }
                if let Err(e) = self.flush_out(sock).await {
                    return Close::Io(e);
                }
                continue;
            }
            self.make_room(&mut rbuf, &mut large);
            // A partial frame must complete promptly; an idle connection may wait.
            let now = tokio::time::Instant::now();
            // A connection taken for a peer holds its slot only as long as
            // a handshake may take, until it proves it is one.
            let deadline = if !self.handshaken || (self.peers_only && self.peer.is_none()) {
                Some((started + handshake).saturating_duration_since(now))
            } else if let Some(fs) = frame_started {
                Some((fs + frame_to).saturating_duration_since(now))
            } else {
                idle
            };
            let read = async {
                let io = async {
                    match large.as_mut() {
                        Some((buf, need)) => {
                            let room = *need - buf.len();
                            buf.read_from(sock, room).await
                        }
                        None => sock.read_buf(&mut rbuf).await,
                    }
                };
                match deadline {
                    Some(d) => tokio::time::timeout(d, io).await.ok(),
                    None => Some(io.await),
                }
            };
            tokio::select! {
                biased;
                _ = shutdown.changed() => return Close::Shutdown,
                r = read => match r {
                    None => {
                        let what = if self.handshaken { "reading a frame" } else { "handshake" };
                        let after_ms = if self.handshaken { frame_to } else { handshake }.as_millis() as u64;
                        if self.handshaken && rbuf.is_empty() && large.is_none() {
                            return Close::Eof; // idle timeout
                        }
                        return Close::Fatal(0, Box::new(SluiceError::Timeout { what: what.into(), after_ms }));
                    }
                    Some(Ok(0)) => {
                        return if rbuf.is_empty() && large.is_none() { Close::Eof } else {
                            Close::Io(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed mid-frame"))
                        };
                    }
                    Some(Ok(n)) => {
                        crate::metrics::received(n);
                        if let Err(c) = self.after_read(&mut rbuf, &mut large, &mut frame_started) {
                            return c;
                        }
                    }
                    Some(Err(e)) => return Close::Io(e),
                },
                Some((rid, rep)) = deferred_rx.recv() => if let Err(c) = self.deliver(rid, rep) {
                    return c;
                },
                Some(n) = notify_rx.recv() => {
                    self.encode_notice(n);
                    while let Ok(n) = notify_rx.try_recv() {
                        self.encode_notice(n);
                        if self.out.len() > READ_CHUNK { break; }
                    }
                    // Losses are reported after what was queued before them.
                    for n in self.ctx.watches.take_lost(self.id) {
                        self.encode_notice(n);
                    }
                }
            }
            if let Err(e) = self.flush_out(sock).await {
                return Close::Io(e);
            }
        }
    }

    /// Makes room for the next read: a large frame whose header is in gets
    /// a buffer of its own, which takes over the part already read: one a
    /// lambda it triggers lent (`Udl::landing`, a Python worker's shared
    /// memory), else a recycled one (`recv_pool`); a smaller frame an
    /// exact reservation; else another chunk.
    fn make_room(&self, rbuf: &mut BytesMut, large: &mut Option<(LargeBuf, usize)>) {
        let need = self.decoder.needed(rbuf).unwrap_or(0);
        if large.is_none() && need >= crate::recv_pool::LARGE_FRAME && rbuf.len() < need {
            // A large trigger put: its lambdas' workers can wake while the
            // value comes in (a Python worker's wake-up then costs nothing).
            // Only once the connection said who it is, and only a sender
            // that may trigger the key gets its bytes into a lambda's memory.
            let mut landing = None;
            if let Some(key) = sluice_wire::trigger_put_key(rbuf).filter(|_| self.handshaken) {
                // A view older than the policies (a rule or token changed
                // since this connection's last request) lands nothing.
                let land = !self.view.stale(&self.ctx.policy)
                    && self.view.may(sluice_types::policy::Perm::Trigger, key);
                let value_at = self.decoder.value_at(rbuf).unwrap_or(need);
                landing = self.ctx.engine.expect(key, need, value_at, land);
            }
            let mut buf = match landing {
                Some(l) if l.capacity() >= need => LargeBuf::Landing(l),
                _ => LargeBuf::Pooled(self.ctx.recv_pool.take(need)),
            };
            buf.put_slice(rbuf);
            rbuf.clear();
            *large = Some((buf, need));
        } else if need > rbuf.capacity() {
            rbuf.reserve(need - rbuf.len());
        } else if rbuf.capacity() - rbuf.len() < 4096 {
            rbuf.reserve(READ_CHUNK);
        }
    }

    /// After bytes came in: a large frame that is now whole is decoded from
    /// its own buffer; then every whole frame in `rbuf` is handled. Keeps
    /// `frame_started` on the first byte of a frame still partial.
    fn after_read(
        &mut self,
        rbuf: &mut BytesMut,
        large: &mut Option<(LargeBuf, usize)>,
        frame_started: &mut Option<tokio::time::Instant>,
    ) -> Result<(), Close> {
        match large.take() {
            Some((buf, need)) if buf.len() == need => {
                let whole = match buf {
                    LargeBuf::Pooled(b) => self.ctx.recv_pool.wrap(b),
                    LargeBuf::Landing(l) => l.into_bytes(),
                };
                match self.decoder.decode_whole(whole) {
                    // Handled as if just decoded (QoS included).
                    Ok(f) => self.held = Some(f),
                    Err(e) => return Err(Close::Fatal(e.request_id(), Box::new(frame_error(e)))),
                }
            }
            partial => *large = partial,
        }
        if large.is_some() {
            frame_started.get_or_insert_with(tokio::time::Instant::now);
            return Ok(());
        }
        let decoded = self.process(rbuf)?;
        if rbuf.is_empty() {
            *frame_started = None;
        } else if decoded > 0 || frame_started.is_none() {
            *frame_started = Some(tokio::time::Instant::now());
        }
        Ok(())
    }

    /// A deferred request's reply, or the request to run again.
    fn deliver(&mut self, rid: u64, rep: Reply) -> Result<(), Close> {
        match rep {
            Reply::Object(r) => reply_object(&mut self.out, rid, r),
            Reply::Put(Ok(p)) => Response::put_ok(&mut self.out, rid, &p),
            Reply::Resp(Ok(r)) => r.encode(&mut self.out, rid),
            Reply::Put(Err(e)) | Reply::Resp(Err(e)) => Response::error(&mut self.out, rid, &e),
            Reply::Retry(req, no_reply) => {
                self.retried_after_catch_up = true;
                let r = if matches!(*req, Request::Hello { .. }) {
                    self.hello(rid, *req)
                } else {
                    self.execute(rid, no_reply, *req);
                    Ok(())
                };
                self.retried_after_catch_up = false;
                return r;
            }
            Reply::Run(req, no_reply) => self.execute(rid, no_reply, *req),
        }
        Ok(())
    }

    /// Writes what is queued; the small requests it answers are done.
    async fn flush_out<S: Stream>(&mut self, sock: &mut S) -> std::io::Result<()> {
        let r = flush(sock, &mut self.out).await;
        self.ctx
            .policy
            .gate
            .done(std::mem::take(&mut self.small_pending));
        r
    }

    /// QoS: whether `frame` is bulk and must wait for the node's small
    /// requests (or for this connection's turn to end); counts it either
    /// way. Every turn runs at least one bulk request.
    fn qos_hold(&mut self, frame: &Frame) -> bool {
        let Some(q) = self.view.qos else {
            return false;
        };
        let gate = &self.ctx.policy.gate;
        if q.priority || frame.value.len() as u64 <= q.small_bytes {
            gate.begin();
            self.small_pending += 1;
            return false;
        }
        if self.bulk_turn_bytes > 0
            && (self.bulk_turn_bytes >= crate::policy::qos::BULK_TURN_BYTES
                || gate.waiting(self.small_pending))
        {
            return true;
        }
        self.bulk_turn_bytes += frame.value.len();
        false
    }

    /// Registers a watch that resumes on a persistent pool at `from`
    /// and returns what it replays: a loss report for versions retention
    /// dropped, then every stored version in range, oldest first.
    fn resume_watch(
        &self,
        rid: u64,
        prefix: &str,
        from: sluice_wire::WatchFrom,
    ) -> Result<Vec<Notice>, SluiceError> {
        let store = &*self.ctx.store;
        if prefix == "/" {
            return Err(SluiceError::NotSupported {
                what: "resuming a watch on every key (\"/\") from a version or time: a replay reads one persistent pool's history; watch that pool's prefix".into(),
            });
        }
        let pool = store.pool_of_key(prefix.trim_end_matches('/'))?;
        if pool.deleted {
            return Err(SluiceError::PoolDeleted {
                pool: pool.pathname,
                key: prefix.to_string(),
            });
        }
        if pool.pool_type != sluice_types::PoolType::Persistent {
            return Err(SluiceError::NotSupported {
                what: format!(
                    "resuming a watch from a version or time on {} (a {} pool {}; only persistent pools keep the history a watch can resume from)",
                    pool.pathname,
                    pool.pool_type,
                    if pool.pool_type == sluice_types::PoolType::Trigger {
                        "stores nothing"
                    } else {
                        "keeps only the latest version of each key"
                    }
                ),
            });
        }
        let range = match from {
            sluice_wire::WatchFrom::Version(v) => sluice_store::HistoryRange::Versions {
                from: v,
                to: u64::MAX,
            },
            sluice_wire::WatchFrom::Time(t) => sluice_store::HistoryRange::Times {
                from: t,
                to: u64::MAX,
            },
        };
        let watches = &self.ctx.watches;
        let cut = store.at_versions(&store.shards_of_pool(&pool), |cut| {
            watches.add_resumed(
                self.id,
                rid,
                prefix.to_string(),
                self.notify_tx.clone(),
                cut.to_vec(),
            )
        });
        let mut objects = Vec::new();
        let mut lost = crate::watch::Lost::default();
        let mut bytes = 0usize;
        for (shard, upto) in cut {
            let r = store.replay(
                shard,
                prefix,
                range,
                upto,
                REPLAY_MAX - objects.len(),
                REPLAY_BYTES_MAX - bytes,
            );
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    watches.remove(self.id, rid);
                    return Err(e);
                }
            };
            bytes += r.bytes;
            lost.merge_range(r.dropped, r.first_dropped, r.last_dropped);
            objects.extend(r.objects);
        }
        // Shards interleave by time; each shard's versions stay in order.
        objects.sort_by_key(|o| (o.meta.timestamp_us, o.meta.version));
        let mut out = Vec::with_capacity(objects.len() + 1);
        if lost.count > 0 {
            out.push(lost.notice_from(rid, prefix, "retention"));
        }
        out.extend(objects.into_iter().map(|o| Notice {
            watch_id: rid,
            kind: if o.meta.tombstone {
                sluice_wire::DeliveryKindWire::Remove
            } else {
                sluice_wire::DeliveryKindWire::Put
            },
            object: o,
        }));
        Ok(out)
    }

    fn encode_notice(&mut self, n: Notice) {
        let r = ObjRef::of(&n.object);
        encode_object(
            &mut self.out,
            n.watch_id,
            op::NOTIFY,
            Some(n.kind as u8),
            &r,
        );
    }

    /// Decodes and executes every whole frame in `rbuf`.
    /// Returns how many frames it decoded.
    fn process(&mut self, rbuf: &mut BytesMut) -> Result<usize, Close> {
        let max_in_flight = self.ctx.cfg.limits.max_in_flight_per_conn as usize;
        let mut in_batch = 0usize;
        loop {
            let frame = match self.held.take() {
                Some(f) => f,
                None => match self.decoder.decode(rbuf) {
                    Ok(Some(f)) => f,
                    Ok(None) => return Ok(in_batch),
                    Err(e) => return Err(Close::Fatal(e.request_id(), Box::new(frame_error(e)))),
                },
            };
            if self.qos_hold(&frame) {
                self.held = Some(frame);
                return Ok(in_batch);
            }
            if frame.flags & sluice_wire::FLAG_PART != 0 {
                self.add_part(frame);
                continue;
            }
            let Some(frame) = self.join_parts(frame) else {
                continue;
            };
            self.ctx.stats.requests.fetch_add(1, Ordering::Relaxed);
            in_batch += 1;
            if in_batch > max_in_flight {
                Response::error(
                    &mut self.out,
                    frame.request_id,
                    &SluiceError::TooManyInFlight {
                        max: max_in_flight as u32,
                    },
                );
                continue;
            }
            self.handle(frame)?;
        }
    }

    /// Keeps a part of a value that arrives in parts, within bounds: one
    /// value's parts at most `max_value_bytes`, all of a connection's at
    /// most twice that, at most `max_in_flight_per_conn` values at once.
    fn add_part(&mut self, frame: Frame) {
        let limits = &self.ctx.cfg.limits;
        let (max_value, max_values) = (
            limits.max_value_bytes as usize,
            limits.max_in_flight_per_conn as usize,
        );
        let n = frame.value.len();
        if !self.parts.contains_key(&frame.request_id) && self.parts.len() >= max_values {
            let e = SluiceError::TooManyInFlight {
                max: max_values as u32,
            };
            self.parts.insert(frame.request_id, Partial::Refused(e));
            return;
        }
        let total = self.parts_bytes;
        let entry = self
            .parts
            .entry(frame.request_id)
            .or_insert_with(|| Partial::Bytes(BytesMut::new()));
        let Partial::Bytes(buf) = entry else { return };
        let refusal = if buf.len() + n > max_value {
            Some(SluiceError::ValueTooLarge {
                size: (buf.len() + n) as u64,
                max: max_value as u64,
            })
        } else if total + n > 2 * max_value {
            Some(SluiceError::Unavailable {
                reason: format!(
                    "more than {} bytes of values in parts on this connection; wait for replies",
                    2 * max_value
                ),
            })
        } else {
            None
        };
        match refusal {
            Some(e) => {
                self.parts_bytes -= buf.len();
                *entry = Partial::Refused(e);
            }
            None => {
                buf.extend_from_slice(&frame.value);
                self.parts_bytes += n;
            }
        }
    }

    /// The request's frame with its whole value when parts came before it
    /// (`None`: the value was refused, and the request answered so).
    fn join_parts(&mut self, mut frame: Frame) -> Option<Frame> {
        if self.parts.is_empty() {
            return Some(frame);
        }
        let Some(p) = self.parts.remove(&frame.request_id) else {
            return Some(frame);
        };
        match p {
            Partial::Refused(e) => {
                Response::error(&mut self.out, frame.request_id, &e);
                return None;
            }
            Partial::Bytes(mut buf) => {
                self.parts_bytes -= buf.len();
                let max = self.ctx.cfg.limits.max_value_bytes as usize;
                if buf.len() + frame.value.len() > max {
                    let e = SluiceError::ValueTooLarge {
                        size: (buf.len() + frame.value.len()) as u64,
                        max: max as u64,
                    };
                    Response::error(&mut self.out, frame.request_id, &e);
                    return None;
                }
                buf.extend_from_slice(&frame.value);
                frame.value = buf.freeze();
            }
        }
        Some(frame)
    }

    fn handle(&mut self, frame: Frame) -> Result<(), Close> {
        let rid = frame.request_id;
        let no_reply = frame.flags & FLAG_NO_REPLY != 0;
        let req = match Request::decode(frame) {
            Ok(r) => r,
            // The frame boundary is intact, so the connection survives.
            Err(e) => {
                self.ctx
                    .stats
                    .protocol_errors
                    .fetch_add(1, Ordering::Relaxed);
                Response::error(&mut self.out, rid, &e);
                return Ok(());
            }
        };
        if !self.handshaken {
            if self.hello_deferred {
                return Err(Close::Fatal(
                    rid,
                    Box::new(SluiceError::protocol(
                        "nothing may follow HELLO before its answer",
                    )),
                ));
            }
            return self.hello(rid, req);
        }
        // Taken beyond the client limit for a peer: a node proves it is
        // one at once, anything else is told the node is full.
        if self.peers_only && self.peer.is_none() && !matches!(req, Request::PeerAuth { .. }) {
            return Err(Close::Fatal(rid, Box::new(self.full())));
        }
        // Nodes (peers that proved the cluster key) are not policed.
        let req = if self.peer.is_none() {
            match self.admit(rid, no_reply, req) {
                Some(r) => r,
                None => return Ok(()),
            }
        } else {
            req
        };
        if crate::metrics::handles().is_some() {
            let pool = req
                .object_key()
                .and_then(|k| self.ctx.store.pool_path_of(k))
                .unwrap_or_default();
            self.timing = Some((req.name(), pool, std::time::Instant::now()));
        }
        self.execute(rid, no_reply, req);
        if let Some((op, pool, t0)) = self.timing.take() {
            crate::metrics::request(op, pool, t0.elapsed());
        }
        Ok(())
    }

    /// What a client beyond the connection limit is told.
    fn full(&self) -> SluiceError {
        SluiceError::TooManyConnections {
            max: self.ctx.cfg.limits.max_connections,
        }
    }

    /// The handshake: checks the protocol version and who the client is.
    /// A token this node does not know may be one the cluster created an
    /// instant ago through another node: the node then catches up with the
    /// metadata leader and checks it once more before refusing it.
    fn hello(&mut self, rid: u64, req: Request) -> Result<(), Close> {
        let Request::Hello {
            protocol_version,
            client_name,
            token,
        } = &req
        else {
            return Err(Close::Fatal(
                rid,
                Box::new(SluiceError::protocol(
                    "the first request on a connection must be HELLO",
                )),
            ));
        };
        if self.peers_only && !client_name.starts_with(sluice_cluster::PEER_CLIENT_PREFIX) {
            return Err(Close::Fatal(rid, Box::new(self.full())));
        }
        if *protocol_version != PROTOCOL_VERSION {
            return Err(Close::Fatal(
                rid, Box::new(SluiceError::protocol(format!(
                    "client speaks protocol version {protocol_version}, this server speaks {PROTOCOL_VERSION}; upgrade the older side"
                )),)));
        }
        let policy = self.ctx.policy.clone();
        if let Err(e) = policy
            .authenticate(token.as_deref(), self.cert_name.as_deref())
            .map(|p| self.principal = p)
        {
            let unknown_token = matches!(e, SluiceError::Unauthenticated { .. }) && token.is_some();
            if let Some(cl) = self
                .ctx
                .cluster
                .clone()
                .filter(|_| unknown_token && !self.retried_after_catch_up)
            {
                self.hello_deferred = true;
                self.defer(rid, false, async move {
                    match cl.meta_catch_up().await {
                        // In force here now, not when the follower task runs.
                        Ok(()) => policy.install(cl.policies()),
                        Err(e) => tracing::info!(error = %e, "metadata catch-up for an unknown token failed"),
                    }
                    Reply::Retry(Box::new(req), false)
                });
                return Ok(());
            }
            let who = self
                .cert_name
                .as_deref()
                .unwrap_or(crate::policy::ANONYMOUS);
            policy.audit.refused(who, "hello", self.addr, &e);
            return Err(Close::Fatal(rid, Box::new(e)));
        }
        self.hello_deferred = false;
        self.view = policy.view(&self.principal);
        tracing::debug!(client = %client_name, principal = %self.principal.name, "handshake");
        self.handshaken = true;
        let info = ServerInfo {
            protocol_version: PROTOCOL_VERSION,
            node_id: self.ctx.cfg.node_id,
            limits: self.ctx.cfg.limits.clone(),
            layout_version: self.ctx.store.layout().version,
            pool_table_version: self.ctx.store.pool_table_version(),
        };
        Response::HelloOk(info).encode(&mut self.out, rid);
        Ok(())
    }

    /// Checks a request against the policies: returns it when it may run
    /// now; answers a refusal, or runs it later (a rate limit's delay).
    fn admit(&mut self, rid: u64, no_reply: bool, req: Request) -> Option<Request> {
        use crate::policy::Admit;
        let policy = &self.ctx.policy;
        if self.view.stale(policy) {
            self.view = policy.view(&self.principal);
        }
        let bytes = req.value().map_or(0, |v| v.len() as u64);
        let store = &self.ctx.store;
        match self
            .view
            .admit(&self.principal, &req, bytes, |k| store.pool_path_of(k))
        {
            Admit::Run => Some(req),
            Admit::Refuse(e) => {
                policy
                    .audit
                    .refused(&self.principal.name, req.name(), self.addr, &e);
                Response::error(&mut self.out, rid, &e);
                None
            }
            Admit::After(d) => {
                crate::metrics::rate_limit_delay(d);
                self.defer(rid, no_reply, async move {
                    tokio::time::sleep(d).await;
                    Reply::Run(Box::new(req), no_reply)
                });
                None
            }
        }
    }

    /// Catches up with the metadata leader, then executes `req` again on a
    /// private connection context (its reply still goes to this client).
    fn defer_retry(
        &mut self,
        rid: u64,
        no_reply: bool,
        req: Request,
        ctx: Arc<ConnCtx>,
    ) -> Option<Request> {
        let Some(cl) = ctx.cluster.clone() else {
            return Some(req);
        };
        let node = ctx.cfg.node_id;
        self.defer(rid, no_reply, async move {
            match cl.meta_catch_up().await {
                Ok(()) => Reply::Retry(Box::new(req), no_reply),
                // What is known here may lack the pool: saying "no pool"
                // would deny one that exists. The client retries this.
                Err(e) => Reply::Resp(Err(SluiceError::Unavailable {
                    reason: format!(
                        "node {node} cannot tell whether a pool covers this request: its pool table may be behind and the metadata leader did not answer ({e})"
                    ),
                })),
            }
        });
        None
    }

    /// Answers `rid` later with what `fut` yields, without holding up this
    /// connection's other requests (bounded like pipelined requests).
    fn defer(
        &mut self,
        rid: u64,
        no_reply: bool,
        fut: impl std::future::Future<Output = Reply> + Send + 'static,
    ) {
        let max = self.ctx.cfg.limits.max_in_flight_per_conn;
        if self.deferred_in_flight.load(Ordering::Relaxed) >= max as usize {
            return Response::error(&mut self.out, rid, &SluiceError::TooManyInFlight { max });
        }
        self.deferred_in_flight.fetch_add(1, Ordering::Relaxed);
        let (tx, count) = (self.deferred_tx.clone(), self.deferred_in_flight.clone());
        let timing = self.timing.take();
        tokio::spawn(async move {
            let r = fut.await;
            if let Some((op, pool, t0)) = timing {
                crate::metrics::request(op, pool, t0.elapsed());
            }
            if !no_reply || matches!(r, Reply::Retry(..) | Reply::Run(..)) {
                let _ = tx.send((rid, r)).await;
            }
            count.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// In a cluster: requests that need consensus (replicated writes,
    /// linearizable reads, pool changes, consensus messages, admin) are
    /// handled here and answered later; reads of a replicated shard are
    /// checked (member, session floor) and left to the local path.
    /// Returns the request back when the local path should run it.
    fn execute_clustered(&mut self, rid: u64, no_reply: bool, req: Request) -> Option<Request> {
        let Some(cl) = self.ctx.cluster.clone() else {
            return match req {
                Request::Raft { .. } | Request::Cluster { .. } | Request::PeerAuth { .. } => {
                    // Name the command (`broadcast`, `status`, ...) a user sent.
                    let op = match &req {
                        Request::Cluster { command } => {
                            serde_json::from_str::<serde_json::Value>(command)
                                .ok()
                                .and_then(|c| c.get("op")?.as_str().map(|o| format!("`{o}`: ")))
                        }
                        _ => None,
                    };
                    Response::error(
                        &mut self.out,
                        rid,
                        &SluiceError::NotSupported {
                            what: format!(
                                "{}cluster commands on a standalone node (start nodes with --cluster; \
                                 `sluice dev --nodes 3` starts a local cluster)",
                                op.unwrap_or_default()
                            ),
                        },
                    );
                    None
                }
                r => Some(r),
            };
        };
        match self.replicated_shard(&cl, rid, no_reply, &req) {
            Route::Shard(sid) => self.execute_replicated(cl, sid, rid, no_reply, req),
            Route::Unkeyed => self.execute_cluster_control(cl, rid, no_reply, req),
            Route::Local => Some(req),
            Route::Replied => None,
            Route::CatchUp => self.defer_retry(rid, no_reply, req, self.ctx.clone()),
        }
    }

    /// Routes a request's key once: every decision on a cluster node
    /// starts from its shard.
    fn replicated_shard(
        &mut self,
        cl: &sluice_cluster::ClusterNode,
        rid: u64,
        no_reply: bool,
        req: &Request,
    ) -> Route {
        let store = &self.ctx.store;
        // A client that did not find a key's pool (or a pool) in the
        // table it has asks here: a pool this node has not applied yet
        // must not be denied (caught up with first, as for a key below).
        let missing = match req {
            Request::PoolOfKey { key } => store.pool_of_key(key).is_err(),
            Request::PoolGet { path } => store.get_pool(path).is_err(),
            _ => false,
        };
        if missing && !self.retried_after_catch_up {
            return Route::CatchUp;
        }
        let keyed = match req {
            Request::Put { key, shard, .. }
            | Request::Remove { key, shard, .. }
            | Request::Get { key, shard, .. }
            | Request::TriggerPut { key, shard, .. }
            | Request::GetByTime { key, shard, .. }
            | Request::GetSize { key, shard, .. }
            | Request::History { key, shard, .. } => Some((key.as_str(), *shard)),
            Request::MultiGet { shard, keys } => keys.first().map(|k| (k.as_str(), *shard)),
            Request::ListKeys {
                pool,
                shard: Some(s),
                ..
            } => {
                // A shard of a pool: checked like a key of that shard.
                let sid = store.get_pool(pool).ok().map(|p| sluice_store::ShardId {
                    pool_type: p.pool_type,
                    subgroup: p.subgroup_index,
                    shard: *s,
                });
                return match sid.map(|sid| cl.check_read(sid, None)) {
                    Some(Err(e)) => {
                        Response::error(&mut self.out, rid, &e);
                        Route::Replied
                    }
                    _ => Route::Local,
                };
            }
            _ => None,
        };
        match keyed.map(|(key, shard)| store.shard_id_of(key, shard)) {
            None => Route::Unkeyed,
            Some(Ok(sid)) if cl.replicates(sid) => Route::Shard(sid),
            Some(Ok(_)) => Route::Local,
            // A key with no pool here may belong to a pool this node has
            // not applied yet: catch up with the metadata leader, then run
            // the request again (once).
            Some(Err(SluiceError::NoPool { .. } | SluiceError::WrongShard { .. }))
                if !self.retried_after_catch_up =>
            {
                Route::CatchUp
            }
            Some(Err(e)) if no_reply => {
                tracing::debug!(error = %e, "request without reply failed");
                Route::Replied
            }
            Some(Err(e)) => {
                Response::error(&mut self.out, rid, &e);
                Route::Replied
            }
        }
    }

    /// A keyed request of a replicated shard: writes through its log,
    /// linearizable and stable time reads through barriers, other reads
    /// only from a member that has applied what the session has seen.
    /// Returns what the local handlers serve.
    fn execute_replicated(
        &mut self,
        cl: Arc<sluice_cluster::ClusterNode>,
        sid: sluice_store::ShardId,
        rid: u64,
        no_reply: bool,
        req: Request,
    ) -> Option<Request> {
        let store = self.ctx.store.clone();
        match req {
            Request::Put {
                key,
                expected,
                value,
                trace,
                req_id,
                ..
            } => self.defer(rid, no_reply, async move {
                Reply::Put(
                    cl.write(sid, key, Some(value), expected, req_id, trace)
                        .await,
                )
            }),
            Request::Remove {
                key,
                expected,
                req_id,
                ..
            } => self.defer(rid, no_reply, async move {
                Reply::Put(cl.write(sid, key, None, expected, req_id, None).await)
            }),
            Request::Get {
                key,
                shard,
                version,
                linearizable: true,
                ..
            } => self.defer(rid, no_reply, async move {
                Reply::Object(match cl.read_barrier(sid).await {
                    Ok(()) => store.get(&key, version, shard),
                    Err(e) => Err(e),
                })
            }),
            Request::GetByTime {
                key,
                shard,
                timestamp_us,
                wait_ms,
                unstable: false,
            } => self.stable_time_read(cl, sid, rid, no_reply, (key, shard, timestamp_us, wait_ms)),
            r @ (Request::Get { .. }
            | Request::GetByTime { .. }
            | Request::GetSize { .. }
            | Request::History { .. }
            | Request::MultiGet { .. }) => {
                let min_version = match &r {
                    Request::Get { min_version, .. } => *min_version,
                    _ => None,
                };
                match cl.check_read(sid, min_version) {
                    Ok(()) => return Some(r),
                    Err(e) => Response::error(&mut self.out, rid, &e),
                }
            }
            r => return Some(r),
        }
        None
    }

    /// A stable time read of a replicated shard: once the time has
    /// passed, a time frontier through the leader (see
    /// `ClusterNode::time_barrier`), then the local read.
    fn stable_time_read(
        &mut self,
        cl: Arc<sluice_cluster::ClusterNode>,
        sid: sluice_store::ShardId,
        rid: u64,
        no_reply: bool,
        (key, shard, timestamp_us, wait_ms): (String, Option<u32>, u64, u32),
    ) {
        let store = self.ctx.store.clone();
        let ahead = Duration::from_micros(timestamp_us.saturating_sub(store.time_now_us()));
        let checked = cl.check_read(sid, None).and_then(|()| {
            if ahead > Duration::from_millis(u64::from(wait_ms)) {
                Err(not_stable_yet(timestamp_us, ahead, wait_ms))
            } else {
                Ok(())
            }
        });
        match checked {
            Err(e) => Response::error(&mut self.out, rid, &e),
            Ok(()) => self.defer(rid, no_reply, async move {
                if !ahead.is_zero() {
                    tokio::time::sleep(ahead + Duration::from_micros(1)).await;
                }
                Reply::Object(match cl.time_barrier(sid, timestamp_us).await {
                    Ok(()) => store.get_by_time(&key, timestamp_us, shard),
                    Err(e) => Err(e),
                })
            }),
        }
    }

    /// A consensus message from a peer (`Request::Raft`, authenticated).
    /// raft-rs's go one way and are handed to their group here, in the
    /// order they arrived, without a task of their own; a broadcast
    /// chunk is a request answered when it has been handled.
    fn consensus_message(
        &mut self,
        cl: Arc<sluice_cluster::ClusterNode>,
        rid: u64,
        no_reply: bool,
        (from, group, kind, body): (u32, u64, u8, bytes::Bytes),
    ) {
        if kind == sluice_cluster::network::kind::RAFTRS && no_reply {
            if let Err(e) = cl.deliver_raftrs(from, group, &body) {
                tracing::debug!(conn = self.id, from, group, error = %e, "raft-rs message dropped");
            }
            return;
        }
        self.defer(rid, no_reply, async move {
            Reply::Resp(
                cl.handle_raft(from, group, kind, &body)
                    .await
                    .map(Response::Raw),
            )
        })
    }

    /// What only a cluster node does: the peer handshake, consensus
    /// messages (peers only), pool changes through the metadata group,
    /// admin commands. Returns what the local handlers serve.
    fn execute_cluster_control(
        &mut self,
        cl: Arc<sluice_cluster::ClusterNode>,
        rid: u64,
        no_reply: bool,
        req: Request,
    ) -> Option<Request> {
        let store = self.ctx.store.clone();
        match req {
            Request::PeerAuth { node, key } => {
                if cl.peer_key_matches(&key) {
                    self.peer = Some(node);
                    Response::Ok.encode(&mut self.out, rid);
                } else {
                    if cl.log_refused_peer(node) {
                        tracing::warn!(
                            conn = self.id,
                            claimed = node,
                            from = %self.addr,
                            "peer handshake with a wrong cluster key refused: node {node} has another \
                             key than this node's (cluster.key next to the layout, or [cluster] key_file); \
                             copy this cluster's key to it (logged once every 30 s per node)"
                        );
                    }
                    Response::error(
                        &mut self.out,
                        rid,
                        &SluiceError::Forbidden {
                            what: format!("the peer handshake of node {node} (wrong cluster key)"),
                        },
                    );
                }
            }
            Request::Raft { .. } if self.peer.is_none() => Response::error(
                &mut self.out,
                rid,
                &SluiceError::Forbidden {
                    what: "a consensus message from a client connection".into(),
                },
            ),
            Request::PoolCreate { spec, req_id } => {
                let created_us = store.clock().now_us();
                let create = sluice_cluster::MetaCommand::PoolCreate { spec, created_us };
                self.defer(rid, no_reply, async move {
                    Reply::Resp(
                        cl.meta_write_at(create, req_id)
                            .await
                            .and_then(|(_, j)| pool_reply(&j)),
                    )
                })
            }
            Request::PoolPurge { path, req_id } => self.defer(rid, no_reply, async move {
                Reply::Resp(cl.purge_pool(&path, req_id).await.and_then(|r| {
                    serde_json::to_string(&r).map(Response::Json).map_err(|e| {
                        SluiceError::Internal {
                            reason: e.to_string(),
                        }
                    })
                }))
            }),
            // Graphs run on every node: checked and built here (the
            // metadata leader), then replicated through the metadata group;
            // each node's reconciler swaps them in.
            Request::DfgApply { text } => {
                let engine = self.ctx.engine.clone();
                self.defer(rid, no_reply, async move {
                    Reply::Resp(dfg_apply_clustered(cl, engine, text).await)
                })
            }
            Request::DfgRemove { id, req_id } => self.defer(rid, no_reply, async move {
                let r = cl
                    .meta_write_at(sluice_cluster::MetaCommand::DfgRemove { id }, req_id)
                    .await;
                if let Ok((index, _)) = &r {
                    // As for `dfg apply`: back once every node has let
                    // the graph go (or the wait is over).
                    cl.wait_dfgs_everywhere(*index, DFG_SETTLE).await;
                }
                Reply::Resp(r.map(|_| Response::Ok))
            }),
            Request::PoolRemove { path, req_id } => self.defer(rid, no_reply, async move {
                Reply::Resp(
                    cl.remove_pool(&path, req_id)
                        .await
                        .and_then(|j| pool_reply(&j)),
                )
            }),
            Request::Raft {
                from,
                group,
                kind,
                body,
                ..
            } => self.consensus_message(cl, rid, no_reply, (from, group, kind, body)),
            Request::Cluster { command } => {
                let from_peer = self.peer.is_some();
                self.defer(rid, no_reply, async move {
                    Reply::Resp(
                        cl.admin(&command, from_peer)
                            .await
                            .map(|v| Response::Json(v.to_string())),
                    )
                })
            }
            r => return Some(r),
        }
        None
    }

    fn execute(&mut self, rid: u64, no_reply: bool, req: Request) {
        let Some(req) = self.execute_clustered(rid, no_reply, req) else {
            return;
        };
        // One handler per kind of request (the match is exhaustive).
        match &req {
            Request::Hello { .. }
            | Request::Ping
            | Request::Put { .. }
            | Request::TriggerPut { .. }
            | Request::Remove { .. } => self.exec_session_and_writes(rid, no_reply, req),
            Request::Get { .. } | Request::GetByTime { .. } | Request::GetSize { .. } => {
                self.exec_point_reads(rid, no_reply, req)
            }
            Request::ListKeys { .. }
            | Request::MultiGet { .. }
            | Request::History { .. }
            | Request::ListKeysAt { .. } => self.exec_range_reads(rid, no_reply, req),
            Request::PoolCreate { .. }
            | Request::PoolRemove { .. }
            | Request::PoolList { .. }
            | Request::PoolGet { .. }
            | Request::PoolOfKey { .. }
            | Request::PoolPurge { .. } => self.exec_pools(rid, no_reply, req),
            Request::Watch { .. }
            | Request::Unwatch { .. }
            | Request::DfgApply { .. }
            | Request::DfgList
            | Request::DfgRemove { .. }
            | Request::Stats
            | Request::Raft { .. }
            | Request::Cluster { .. }
            | Request::PeerAuth { .. } => self.exec_node(rid, no_reply, req),
            Request::Policy { .. } => self.exec_policy(rid, no_reply, req),
        }
    }

    /// The handshake twice, pings, and writes: put, trigger put, remove.
    fn exec_session_and_writes(&mut self, rid: u64, no_reply: bool, req: Request) {
        let store = &*self.ctx.store;
        let out = &mut self.out;
        let reply_err = |out: &mut OutQueue, e: &SluiceError| Response::error(out, rid, e);
        match req {
            Request::Hello { .. } => reply_err(out, &SluiceError::protocol("HELLO sent twice")),
            Request::Ping => Response::Pong.encode(out, rid),
            Request::Put {
                key,
                shard,
                expected,
                value,
                trace,
                ..
            } => {
                let span = tracing::trace_span!("put", key = %key);
                let _e = span.enter();
                let put = || store.put_traced(&key, value, expected, shard, trace.map(Arc::new));
                // A durable put waits for an fsync (alone or in a group):
                // let the runtime move other connections to another worker
                // meanwhile, and let many such puts share one fsync.
                let res = if store.write_may_block(&key) {
                    off_event_loop(put)
                } else {
                    put()
                };
                match res {
                    Ok(p) if !no_reply => Response::put_ok(out, rid, &p),
                    Ok(_) => {}
                    Err(e) if no_reply => {
                        tracing::debug!(key = %key, error = %e, "put_and_forget failed")
                    }
                    Err(e) => reply_err(out, &e),
                }
            }
            Request::TriggerPut {
                key,
                shard,
                value,
                trace,
                origin,
            } => {
                match store.trigger_put_with_origin(&key, value, shard, trace.map(Arc::new), origin)
                {
                    Ok(ts) if !no_reply => Response::put_ok(
                        out,
                        rid,
                        &sluice_types::PutResult {
                            version: VERSION_NONE,
                            timestamp_us: ts,
                        },
                    ),
                    Ok(_) => {}
                    Err(e) if no_reply => {
                        tracing::debug!(key = %key, error = %e, "trigger_put failed")
                    }
                    Err(e) => reply_err(out, &e),
                }
            }
            Request::Remove {
                key,
                shard,
                expected,
                ..
            } => match if store.write_may_block(&key) {
                off_event_loop(|| store.remove(&key, expected, shard))
            } else {
                store.remove(&key, expected, shard)
            } {
                Ok(p) => Response::put_ok(out, rid, &p),
                Err(e) => reply_err(out, &e),
            },
            other => self.misrouted(rid, &other),
        }
    }

    /// Reads of one key: latest or by version, by time, its size.
    fn exec_point_reads(&mut self, rid: u64, _no_reply: bool, req: Request) {
        let store = &*self.ctx.store;
        let out = &mut self.out;
        let limits = &self.ctx.cfg.limits;
        let reply_err = |out: &mut OutQueue, e: &SluiceError| Response::error(out, rid, e);
        match req {
            Request::Get {
                key,
                shard,
                version,
                ..
            } => reply_object(out, rid, store.get(&key, version, shard)),
            Request::GetByTime {
                key,
                shard,
                timestamp_us,
                wait_ms,
                unstable,
            } => {
                let stable =
                    unstable || stable_now(store, &key, timestamp_us, shard).unwrap_or(true);
                if stable {
                    return reply_object(out, rid, store.get_by_time(&key, timestamp_us, shard));
                }
                let wait = Duration::from_micros(timestamp_us.saturating_sub(store.time_now_us()));
                if wait > Duration::from_millis(u64::from(wait_ms)) {
                    return reply_err(out, &not_stable_yet(timestamp_us, wait, wait_ms));
                }
                if self.deferred_in_flight.load(Ordering::Relaxed)
                    >= limits.max_in_flight_per_conn as usize
                {
                    return reply_err(
                        out,
                        &SluiceError::TooManyInFlight {
                            max: limits.max_in_flight_per_conn,
                        },
                    );
                }
                // Answer later, without holding up this connection's other requests.
                self.deferred_in_flight.fetch_add(1, Ordering::Relaxed);
                let (store, tx, count) = (
                    self.ctx.store.clone(),
                    self.deferred_tx.clone(),
                    self.deferred_in_flight.clone(),
                );
                tokio::spawn(async move {
                    tokio::time::sleep(wait + Duration::from_micros(1)).await;
                    let mut r = stable_now(&store, &key, timestamp_us, shard);
                    while matches!(r, Ok(false)) {
                        tokio::time::sleep(Duration::from_micros(50)).await;
                        r = stable_now(&store, &key, timestamp_us, shard);
                    }
                    let res = r.and_then(|_| store.get_by_time(&key, timestamp_us, shard));
                    let _ = tx.send((rid, Reply::Object(res))).await;
                    count.fetch_sub(1, Ordering::Relaxed);
                });
            }
            Request::GetSize {
                key,
                shard,
                version,
                timestamp_us,
            } => {
                let r = match timestamp_us {
                    Some(ts) => store.get_by_time(&key, ts, shard),
                    None => store.get(&key, version, shard),
                };
                match r {
                    Ok(o) => Response::Size(o.value.len() as u64).encode(out, rid),
                    Err(e) => reply_err(out, &e),
                }
            }
            other => self.misrouted(rid, &other),
        }
    }

    /// Reads of many keys or versions: listings (a page of at most
    /// `KEYS_PAGE_BYTES` of keys each), multi-get, history.
    fn exec_range_reads(&mut self, rid: u64, _no_reply: bool, req: Request) {
        let store = &*self.ctx.store;
        let out = &mut self.out;
        let limits = &self.ctx.cfg.limits;
        let reply_err = |out: &mut OutQueue, e: &SluiceError| Response::error(out, rid, e);
        match req {
            Request::ListKeys { .. } | Request::ListKeysAt { .. } => self.exec_listing(rid, req),
            Request::MultiGet { shard, keys } => {
                if keys.len() > limits.max_multi_get_keys as usize {
                    return reply_err(
                        out,
                        &SluiceError::TooManyKeys {
                            count: keys.len() as u64,
                            max: limits.max_multi_get_keys.into(),
                        },
                    );
                }
                let results = store.multi_get(&keys, shard);
                let budget = reply_budget(limits);
                let n = within_budget(
                    results
                        .iter()
                        .map(|r| r.as_ref().map_or(0, |o| o.value.len())),
                    budget,
                );
                let items: Vec<_> = results[..n]
                    .iter()
                    .map(|r| match r {
                        Ok(o) => sluice_wire::MultiGetItem::Found(ObjRef::of(o)),
                        Err(e) => sluice_wire::MultiGetItem::Failed(e),
                    })
                    .collect();
                encode_objects(out, rid, &items, n < results.len());
            }
            // Control-plane writes fsync the pool table or load models: off the event loop.
            Request::History {
                key,
                shard,
                by_time,
                from,
                to,
                limit,
            } => {
                let range = if by_time {
                    sluice_store::HistoryRange::Times { from, to }
                } else {
                    sluice_store::HistoryRange::Versions { from, to }
                };
                let limit = limit.clamp(1, HISTORY_PAGE_MAX) as usize;
                match store.history(&key, range, limit, shard) {
                    Ok(versions) => {
                        let budget = reply_budget(limits);
                        let n = within_budget(versions.iter().map(|o| o.value.len()), budget);
                        let items: Vec<_> = versions[..n]
                            .iter()
                            .map(|o| sluice_wire::MultiGetItem::Found(ObjRef::of(o)))
                            .collect();
                        // Older versions may follow a full or a cut page.
                        let more = n < versions.len() || n == limit;
                        encode_objects(out, rid, &items, more);
                    }
                    Err(e) => reply_err(out, &e),
                }
            }
            other => self.misrouted(rid, &other),
        }
    }

    /// A page of a listing (`ListKeys`, `ListKeysAt`): the connection's
    /// `listings` sorts a listing's keys once, for all its pages.
    fn exec_listing(&mut self, rid: u64, req: Request) {
        let store = &*self.ctx.store;
        let out = &mut self.out;
        let reply_err = |out: &mut OutQueue, e: &SluiceError| Response::error(out, rid, e);
        match req {
            Request::ListKeys {
                pool,
                prefix,
                shard,
                after,
            } => {
                let what = What {
                    pool,
                    prefix,
                    shard,
                    at: None,
                };
                // A large pool's sort takes a while: off the event loop.
                let all = || {
                    off_event_loop(|| {
                        store.list_keys_shared(&what.pool, what.prefix.as_deref(), what.shard)
                    })
                };
                match self
                    .listings
                    .page(what.clone(), after.as_deref(), KEYS_PAGE_BYTES, all)
                {
                    Ok((keys, more)) => Response::Keys { keys, more }.encode(out, rid),
                    Err(e) => reply_err(out, &e),
                }
            }
            Request::ListKeysAt {
                pool,
                prefix,
                by_time,
                at,
                after,
            } => {
                let what = What {
                    pool,
                    prefix,
                    shard: None,
                    at: Some((by_time, at)),
                };
                let all = || {
                    let (pool, prefix) = (&what.pool, what.prefix.as_deref());
                    off_event_loop(|| {
                        let keys = if by_time {
                            store.list_keys_at_time(pool, prefix, at)
                        } else {
                            store.list_keys_at_version(pool, prefix, at)
                        }?;
                        Ok(keys.into_iter().map(Arc::from).collect())
                    })
                };
                match self
                    .listings
                    .page(what.clone(), after.as_deref(), KEYS_PAGE_BYTES, all)
                {
                    Ok((keys, more)) => Response::Keys { keys, more }.encode(out, rid),
                    Err(e) => reply_err(out, &e),
                }
            }
            other => self.misrouted(rid, &other),
        }
    }

    /// Pool management.
    fn exec_pools(&mut self, rid: u64, _no_reply: bool, req: Request) {
        let store = &*self.ctx.store;
        let out = &mut self.out;
        let reply_err = |out: &mut OutQueue, e: &SluiceError| Response::error(out, rid, e);
        match req {
            Request::PoolCreate { spec, .. } => match off_event_loop(|| store.create_pool(&spec)) {
                Ok(p) => Response::Pool(p).encode(out, rid),
                Err(e) => reply_err(out, &e),
            },
            Request::PoolRemove { path, .. } => match off_event_loop(|| store.remove_pool(&path)) {
                Ok(p) => Response::Pool(p).encode(out, rid),
                Err(e) => reply_err(out, &e),
            },
            Request::PoolList { include_deleted } => {
                Response::Pools(store.list_pools(include_deleted)).encode(out, rid)
            }
            Request::PoolGet { path } => match store.get_pool(&path) {
                Ok(p) => Response::Pool(p).encode(out, rid),
                Err(e) => reply_err(out, &e),
            },
            Request::PoolOfKey { key } => match store.pool_of_key(&key) {
                Ok(p) => Response::Pool(p).encode(out, rid),
                Err(e) => reply_err(out, &e),
            },
            Request::PoolPurge { path, .. } => match off_event_loop(|| store.purge_pool(&path)) {
                Ok(r) => {
                    Response::Json(serde_json::to_string(&r).unwrap_or_default()).encode(out, rid)
                }
                Err(e) => reply_err(out, &e),
            },
            other => self.misrouted(rid, &other),
        }
    }

    /// Policies and principals: listings from this node's copy; changes
    /// through the metadata group (a cluster) or kept by this node.
    fn exec_policy(&mut self, rid: u64, no_reply: bool, req: Request) {
        use crate::policy::commands::{prepare, Step};
        let Request::Policy { command, req_id } = req else {
            return;
        };
        let policy = self.ctx.policy.clone();
        let (change, reply) = match prepare(&policy, &self.principal, &command) {
            Err(e) => return Response::error(&mut self.out, rid, &e),
            Ok(Step::Answer(v)) => return Response::Json(v.to_string()).encode(&mut self.out, rid),
            Ok(Step::Change { change, reply }) => (change, reply),
        };
        let Some(cl) = self.ctx.cluster.clone() else {
            // The document is fsynced: off the event loop.
            let r = off_event_loop(|| policy.apply_local(change));
            return match r {
                Some(Ok(())) => Response::Json(reply.to_string()).encode(&mut self.out, rid),
                Some(Err(e)) => Response::error(&mut self.out, rid, &e),
                None => Response::error(
                    &mut self.out,
                    rid,
                    &SluiceError::Internal {
                        reason: "a standalone node without its policy file".into(),
                    },
                ),
            };
        };
        self.defer(rid, no_reply, async move {
            let new_token = match &change {
                sluice_types::policy::PolicyChange::AddToken { name, principal } => {
                    Some((name.clone(), principal.token_sha256.clone()))
                }
                _ => None,
            };
            let r = cl
                .meta_write_at(sluice_cluster::MetaCommand::Policy { change }, req_id)
                .await
                .and_then(|_| {
                    // In force here at once; other nodes as they apply it.
                    let now = cl.policies();
                    let made = new_token
                        .map_or(Ok(()), |(name, hash)| token_made_here(&now, &name, &hash));
                    policy.install(now);
                    made.map(|()| Response::Json(reply.to_string()))
                });
            Reply::Resp(r)
        });
    }

    /// Watches, data flow graphs, counters, and what only a cluster node serves.
    fn exec_node(&mut self, rid: u64, _no_reply: bool, req: Request) {
        let store = &*self.ctx.store;
        let out = &mut self.out;
        let limits = &self.ctx.cfg.limits;
        let reply_err = |out: &mut OutQueue, e: &SluiceError| Response::error(out, rid, e);
        match req {
            Request::Raft { .. } | Request::Cluster { .. } | Request::PeerAuth { .. } => {
                unreachable!("handled by execute_clustered")
            }
            Request::Policy { .. } => unreachable!("handled by exec_policy"),
            Request::Watch { prefix, from } => {
                let max = limits.max_watches_per_conn;
                if self.ctx.watches.count_for(self.id) >= max as usize {
                    return reply_err(out, &SluiceError::TooManyWatches { max });
                }
                if let Err(e) =
                    sluice_types::validate_prefix(&prefix, limits.max_key_bytes as usize)
                {
                    return reply_err(out, &e);
                }
                let Some(from) = from else {
                    // Reply before registering so WATCH_OK precedes the first notice.
                    Response::WatchOk { watch_id: rid }.encode(out, rid);
                    self.ctx
                        .watches
                        .add(self.id, rid, prefix, self.notify_tx.clone());
                    return;
                };
                // Registered before the replay is read: the notices of
                // live writes wait in the channel until this returns, so
                // WATCH_OK, then the replay, then they go out in order.
                match off_event_loop(|| self.resume_watch(rid, &prefix, from)) {
                    Ok(notices) => {
                        Response::WatchOk { watch_id: rid }.encode(&mut self.out, rid);
                        for n in notices {
                            self.encode_notice(n);
                        }
                    }
                    Err(e) => Response::error(&mut self.out, rid, &e),
                }
            }
            Request::Unwatch { watch_id } => {
                if self.ctx.watches.remove(self.id, watch_id) {
                    Response::Ok.encode(out, rid)
                } else {
                    reply_err(
                        out,
                        &SluiceError::NotFound {
                            key: format!("watch {watch_id}"),
                        },
                    )
                }
            }
            Request::DfgApply { text } => {
                match off_event_loop(|| self.ctx.engine.apply_report(&text)) {
                    Ok(r) => Response::Json(
                        serde_json::json!({ "applied": r.ids, "notes": r.notes, "unchanged": r.unchanged }).to_string(),
                    )
                    .encode(out, rid),
                    Err(e) => reply_err(
                        out,
                        &SluiceError::InvalidDfg {
                            path: e.path,
                            reason: e.reason,
                        },
                    ),
                }
            }
            Request::DfgList => Response::Json(self.ctx.engine.list().to_string()).encode(out, rid),
            Request::DfgRemove { id, .. } => match off_event_loop(|| self.ctx.engine.remove(&id)) {
                Ok(()) => Response::Ok.encode(out, rid),
                Err(e) => reply_err(out, &e),
            },
            Request::Stats => {
                let s = &self.ctx.stats;
                let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
                let shards: Vec<_> = store
                    .shards()
                    .map(|sh| serde_json::json!({"shard": sh.id.to_string(), "keys": sh.len(), "last_version": sh.last_version()}))
                    .collect();
                let (in_use, max_memory) = store.memory.in_use_and_limit();
                let v = serde_json::json!({
                    "node_id": self.ctx.cfg.node_id,
                    "store": store.stats.snapshot(),
                    "memory": {
                        "in_use_bytes": in_use,
                        "max_bytes": max_memory,
                        "refused_writes": store.memory.refused.load(Ordering::Relaxed),
                    },
                    "shards": shards,
                    "connections": {
                        "open": g(&s.connections_open),
                        "accepted": g(&s.connections_accepted),
                        "rejected": g(&s.connections_rejected),
                    },
                    "requests": g(&s.requests),
                    "protocol_errors": g(&s.protocol_errors),
                    "watches": self.ctx.watches.len(),
                    "compute": self.ctx.engine.stats(),
                });
                Response::Stats(v.to_string()).encode(out, rid)
            }
            other => self.misrouted(rid, &other),
        }
    }

    /// A request handed to a handler of another kind (a bug of the
    /// dispatch in `execute`): the client gets an internal error.
    fn misrouted(&mut self, rid: u64, req: &Request) {
        Response::error(
            &mut self.out,
            rid,
            &SluiceError::Internal {
                reason: format!("request {:#04x} reached the wrong handler", req.opcode()),
            },
        )
    }
}

/// A time read asked about a time further ahead than it may wait.
fn not_stable_yet(timestamp_us: u64, ahead: Duration, wait_ms: u32) -> SluiceError {
    SluiceError::Unavailable {
        reason: format!(
            "timestamp {timestamp_us} is {} ms in the future and not stable yet (this read may wait {wait_ms} ms: \
             its client's timeout); give the read a longer timeout, or read it unstable (CLI: --unstable; \
             Python: stable=False)",
            ahead.as_millis()
        ),
    }
}

/// `Store::time_is_stable`, off the event loop when the drain may wait for
/// an fsync (persistent pools).
fn stable_now(
    store: &Store,
    key: &str,
    timestamp_us: u64,
    shard: Option<u32>,
) -> Result<bool, SluiceError> {
    let check = || store.time_is_stable(key, timestamp_us, shard);
    if store.write_may_block(key) {
        off_event_loop(check)
    } else {
        check()
    }
}

fn reply_object(out: &mut OutQueue, rid: u64, r: Result<Arc<sluice_types::Object>, SluiceError>) {
    match r {
        Ok(o) => encode_object(out, rid, op::OBJECT, None, &ObjRef::of(&o)),
        Err(e) => Response::error(out, rid, &e),
    }
}

/// `dfg apply` on a cluster node: at the metadata leader, check and build
/// the graphs (staged for this node's reconciler), then replicate them.
async fn dfg_apply_clustered(
    cl: Arc<sluice_cluster::ClusterNode>,
    engine: Arc<sluice_compute::Engine>,
    text: String,
) -> Result<Response, SluiceError> {
    cl.check_meta_leader()?;
    // Destinations are checked against the pool table: bring it up to date.
    cl.meta_catch_up().await?;
    let e = engine.clone();
    let running = cl.dfgs();
    let prepared = tokio::task::spawn_blocking(move || e.prepare(&text, &running))
        .await
        .map_err(|e| SluiceError::Internal {
            reason: format!("building the graphs: {e}"),
        })?
        .map_err(|e| SluiceError::InvalidDfg {
            path: e.path,
            reason: e.reason,
        })?;
    let ids: Vec<String> = prepared.graphs.iter().map(|(id, _)| id.clone()).collect();
    if ids.is_empty() {
        // An `only_changed` file whose graphs all run as given.
        return Ok(Response::Json(
            serde_json::json!({"applied": ids, "notes": prepared.notes, "unchanged": prepared.unchanged, "cluster": true, "pending_nodes": []}).to_string(),
        ));
    }
    let index = match cl
        .meta_write_at(
            sluice_cluster::MetaCommand::DfgSet {
                graphs: prepared.graphs,
            },
            None,
        )
        .await
    {
        Ok((index, _)) => index,
        Err(e) => {
            engine.unstage(&ids);
            return Err(e);
        }
    };
    // Committed; back once every node runs the graphs, so a put that
    // follows reaches them wherever it is applied. A node that does not
    // confirm in time (down, cut off) runs them when it catches up.
    let pending = cl.wait_dfgs_everywhere(index, DFG_SETTLE).await;
    Ok(Response::Json(
        serde_json::json!({"applied": ids, "notes": prepared.notes, "unchanged": prepared.unchanged, "cluster": true, "pending_nodes": pending, "index": index}).to_string(),
    ))
}

/// How long `dfg apply` / `dfg rm` on a cluster wait for every node to
/// run the change before they answer (naming the nodes still behind).
const DFG_SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// After a cluster's `auth create`: whether the token now stored for
/// `name` is the one this node made (and is about to show, once). When it
/// is not, this call was a client's retry of a create that was made
/// before, its reply (the only copy of its token) lost with its leader:
/// the retry is answered as applied, but the token in this reply would not
/// work, so it is refused, saying what to do.
fn token_made_here(
    now: &sluice_types::policy::Policies,
    name: &str,
    hash: &str,
) -> Result<(), SluiceError> {
    match now.tokens.get(name) {
        Some(t) if t.token_sha256 != hash => Err(SluiceError::InvalidArgument {
            what: format!("principal {name:?}"),
            reason: format!(
                "it got its token from an earlier try of this request, whose reply (the only copy of the token) was lost with the metadata leader: revoke it (`sluice auth revoke {name}`) and create it again"
            ),
        }),
        _ => Ok(()),
    }
}

fn pool_reply(json: &str) -> Result<Response, SluiceError> {
    serde_json::from_str(json)
        .map(Response::Pool)
        .map_err(|e| SluiceError::Internal {
            reason: format!("bad pool in a metadata reply: {e}"),
        })
}

fn frame_error(e: FrameError) -> SluiceError {
    match e {
        FrameError::TooLarge {
            meta_len,
            value_len,
            max_meta,
            max_value,
            ..
        } => {
            if value_len > max_value {
                SluiceError::ValueTooLarge {
                    size: value_len,
                    max: max_value,
                }
            } else {
                SluiceError::MetaTooLarge {
                    size: meta_len,
                    max: max_meta,
                }
            }
        }
        other => SluiceError::protocol(other.to_string()),
    }
}
