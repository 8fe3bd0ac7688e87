//! One pipelined connection: callers write frames under a short lock; a
//! reader task matches replies to waiting callers by request id.

use bytes::BytesMut;
use parking_lot::Mutex;
use sluice_types::{Result, SluiceError};
use sluice_wire::{FrameDecoder, OutQueue, Request, Response, ServerInfo, PROTOCOL_VERSION};
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A connection's halves: a TCP socket's, or those of TLS over one.
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;
use tokio::sync::{mpsc, oneshot, Semaphore};

pub(crate) enum Pending {
    Once(oneshot::Sender<Result<Response>>),
    /// Replies to a watch; the counter counts notices dropped because the
    /// application did not drain its queue.
    Stream(mpsc::Sender<Response>, Arc<AtomicU64>),
}

/// The socket's write half, and the bytes of frames a writer began and
/// did not finish: its caller dropped the request's future (a
/// `tokio::time::timeout` around it, a `select!`, the client's own bound
/// on a try). The next write sends them first, or a task the dropped
/// writer spawned. Half a frame followed by another request's bytes is
/// read by the node as the first frame's rest: a put whose caller gave
/// up was stored with the next put's bytes in its value.
struct Writer {
    half: WriteHalf,
    left: OutQueue,
    /// Bytes went to the socket since its last flush (TLS holds records
    /// until flushed).
    unflushed: bool,
}

/// Armed while a write is under way: dropped armed (the write's future
/// was dropped), it has a task send what is left.
struct FinishOnDrop<'a> {
    conn: &'a Conn,
    armed: bool,
}

impl Drop for FinishOnDrop<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(me) = self.conn.me.upgrade() {
            self.conn.rt.spawn(async move {
                let mut w = me.writer.lock().await;
                if me.write_out(&mut w, OutQueue::new()).await.is_err() {
                    drop(w);
                    me.fail_waiters();
                }
            });
        }
    }
}

/// Takes request `id` out of the connection's waiting requests when
/// dropped armed (a call ended without its reply: an error, a timeout, or
/// its future dropped, which before left its entry there for good when
/// the request never went out).
struct Unregister<'a> {
    conn: &'a Conn,
    id: u64,
    armed: bool,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.conn.pending.lock().remove(&self.id);
        }
    }
}

/// A value going out in parts, the next part from `at`: dropped before
/// the last part was handed to the writer (its caller gave up), it has a
/// task send the rest, so the node is not left holding the parts of a
/// request that never ends.
struct PartedSend<'a> {
    conn: &'a Conn,
    req: &'a Request,
    id: u64,
    flags: u8,
    part: usize,
    at: usize,
    done: bool,
}

impl Drop for PartedSend<'_> {
    fn drop(&mut self) {
        if self.done || self.at == 0 {
            return;
        }
        if let Some(me) = self.conn.me.upgrade() {
            let (req, id, flags, part, at) =
                (self.req.clone(), self.id, self.flags, self.part, self.at);
            self.conn.rt.spawn(async move {
                // Its errors end the connection for every waiter.
                let _ = me.send_parts(&req, id, flags, part, at).await;
            });
        }
    }
}

/// A connection to one node: requests are pipelined on it and replies,
/// which may come in any order, are matched by request id.
pub struct Conn {
    writer: tokio::sync::Mutex<Writer>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    alive: AtomicBool,
    /// Why the connection died, when the server said (e.g. too many connections).
    fatal: Mutex<Option<SluiceError>>,
    /// Keeps us under the server's announced in-flight limit.
    pub(crate) in_flight: Semaphore,
    /// Values larger than this go out in parts (0: never), so requests
    /// sent meanwhile are not stuck behind them (`ClientConfig`).
    part_bytes: std::sync::atomic::AtomicUsize,
    /// The TCP socket under the connection (open as long as `Conn` is).
    fd: std::os::fd::RawFd,
    /// Set once the reader saw the connection end (`Conn::closed`).
    closed: tokio::sync::watch::Sender<bool>,
    /// Requests are queued and written together by one task spawned
    /// after them (`set_coalesce_writes`).
    coalesce: AtomicBool,
    /// Requests sent but not yet written (coalescing only); any writer
    /// writes them out before its own frames.
    queued: Mutex<OutQueue>,
    /// A flush task is spawned and has not yet taken `queued`.
    flush_due: AtomicBool,
    /// Writes to the socket so far (`Conn::writes`).
    writes: AtomicU64,
    /// Bytes written to the socket so far (`Conn::written`).
    written: AtomicU64,
    /// Reads from the socket so far: the keepalive's sign of life.
    reads: AtomicU64,
    /// `set_watch_keepalive`, in milliseconds (0: off).
    keepalive_ms: AtomicU64,
    /// The keepalive task runs (started with the first watch).
    keepalive_on: AtomicBool,
    me: std::sync::Weak<Conn>,
    /// The runtime the connection was made on: it finishes the writes of
    /// requests dropped part-way, wherever they were dropped (a blocking
    /// call interrupted by Ctrl-C is dropped outside any runtime).
    rt: tokio::runtime::Handle,
    /// What the node said about itself in the handshake.
    pub info: ServerInfo,
}

/// `fut`'s output, or a `Timeout` naming `what` once `limit` has passed.
async fn within<T>(
    limit: Duration,
    what: impl FnOnce() -> String,
    fut: impl std::future::Future<Output = T>,
) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| SluiceError::Timeout {
            what: what(),
            after_ms: limit.as_millis() as u64,
        })
}

/// Bytes of coalesced requests a connection queues before a sender has to
/// write (and wait) itself (`Conn::queue_for_flush`).
pub const MAX_QUEUED_BYTES: usize = 1 << 20;

/// A failed write or read of the HELLO exchange. Under TLS 1.3 a node
/// refuses a client's certificate (or its lack of one) only after the
/// client's side of the TLS handshake is done, so the refusal surfaces
/// here: it then says what to pass.
fn handshake_err(addr: SocketAddr, e: std::io::Error) -> SluiceError {
    match sluice_tls::client_hint(&e) {
        Some(hint) => conn_err(format!("handshake with {addr}: {e} ({hint})")),
        None => conn_err(format!("handshake with {addr}: {e}")),
    }
}

fn conn_err(reason: impl Into<String>) -> SluiceError {
    SluiceError::Connection {
        reason: reason.into(),
    }
}

impl Conn {
    /// A plaintext connection (see `connect_with`).
    pub async fn connect(
        addr: SocketAddr,
        name: &str,
        connect_timeout: Duration,
    ) -> Result<Arc<Conn>> {
        Self::connect_with(addr, name, connect_timeout, None, None).await
    }

    /// Connects, with TLS when `tls` is given (the node's certificate must
    /// name `addr`'s IP address), and shakes hands, naming the principal
    /// `token` authenticates when one is given.
    pub async fn connect_with(
        addr: SocketAddr,
        name: &str,
        connect_timeout: Duration,
        tls: Option<&sluice_tls::ClientTls>,
        token: Option<&str>,
    ) -> Result<Arc<Conn>> {
        Self::connect_to(addr, None, name, connect_timeout, tls, token).await
    }

    /// `connect_with` to a node known by a host name (`host`, which
    /// resolved to `addr`): with TLS its certificate must name that host.
    pub async fn connect_to(
        addr: SocketAddr,
        host: Option<&str>,
        name: &str,
        connect_timeout: Duration,
        tls: Option<&sluice_tls::ClientTls>,
        token: Option<&str>,
    ) -> Result<Arc<Conn>> {
        let sock = within(
            connect_timeout,
            || format!("connecting to {addr}"),
            TcpStream::connect(addr),
        )
        .await?
        .map_err(|e| {
            conn_err(format!(
                "cannot connect to {addr}: {e} (is `sluice serve` running there?)"
            ))
        })?;
        let _ = sock.set_nodelay(true);
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
        let (mut rd, mut wr): (ReadHalf, WriteHalf) = match tls {
            None => {
                let (r, w) = sock.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(t) => {
                let ip = addr.ip().to_string();
                let server = sluice_tls::ClientTls::server_name(host.unwrap_or(&ip))
                    .map_err(|e| conn_err(e.to_string()))?;
                let handshake = sluice_tls::connect(t.config.clone(), server, sock);
                let s = within(connect_timeout, || format!("TLS handshake with {addr}"), handshake)
                    .await?
                    .map_err(|e| {
                        let hint = sluice_tls::client_hint(&e).unwrap_or(
                            "check --tls-ca is the CA that signed the node's certificate, and that the node runs with TLS",
                        );
                        conn_err(format!("TLS handshake with {addr}: {e} ({hint})"))
                    })?;
                let (r, w) = tokio::io::split(s);
                (Box::new(r), Box::new(w))
            }
        };
        // Handshake synchronously, before the reader task exists.
        let mut q = OutQueue::new();
        Request::Hello {
            protocol_version: PROTOCOL_VERSION,
            client_name: name.to_string(),
            token: token.map(str::to_string),
        }
        .encode(&mut q, 0, 0);
        async {
            wr.write_all(&q.to_bytes()).await?;
            wr.flush().await
        }
        .await
        .map_err(|e| handshake_err(addr, e))?;
        // Before the handshake we accept the largest frame a server may send.
        let decoder = FrameDecoder::new(u32::MAX, u32::MAX);
        let mut buf = BytesMut::with_capacity(4096);
        let info = within(connect_timeout, || format!("handshake with {addr}"), async {
            loop {
                if let Some(f) = decoder.decode(&mut buf).map_err(|e| match e {
                    sluice_wire::FrameError::BadMagic(_) => conn_err(format!(
                        "{addr} is not a Sluice node (it answered with something other than Sluice frames); check the address and port, and if the node runs with TLS connect with its CA (--tls-ca)"
                    )),
                    e => SluiceError::protocol(e.to_string()),
                })? {
                    return match Response::decode(f)? {
                        Response::HelloOk(info) => Ok(info),
                        Response::Error(e) => Err(e),
                        other => Err(SluiceError::protocol(format!(
                            "expected HELLO_OK, got {other:?}"
                        ))),
                    };
                }
                if rd
                    .read_buf(&mut buf)
                    .await
                    .map_err(|e| handshake_err(addr, e))?
                    == 0
                {
                    return Err(conn_err(format!(
                        "{addr} closed the connection during the handshake (if the node runs with TLS, connect with its CA: --tls-ca)"
                    )));
                }
            }
        })
        .await??;
        let conn = Arc::new_cyclic(|me| Conn {
            writer: tokio::sync::Mutex::new(Writer {
                half: wr,
                left: OutQueue::new(),
                unflushed: false,
            }),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            fatal: Mutex::new(None),
            in_flight: Semaphore::new(info.limits.max_in_flight_per_conn as usize),
            part_bytes: Default::default(),
            fd,
            closed: tokio::sync::watch::Sender::new(false),
            coalesce: AtomicBool::new(false),
            queued: Mutex::new(OutQueue::new()),
            flush_due: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            written: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            keepalive_ms: AtomicU64::new(0),
            keepalive_on: AtomicBool::new(false),
            me: me.clone(),
            rt: tokio::runtime::Handle::current(),
            info,
        });
        let decoder = FrameDecoder::new(
            conn.info.limits.max_meta_bytes.saturating_mul(2),
            conn.info.limits.max_value_bytes.saturating_mul(2),
        );
        // The reader holds the connection weakly: once every user has
        // dropped it, the write half closes, the server ends the
        // connection, and the reader sees the end and exits.
        tokio::spawn(read_loop(Arc::downgrade(&conn), rd, buf, decoder));
        Ok(conn)
    }

    /// False once the connection failed or was closed; a client then
    /// opens another.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Resolves once the server's side of the connection ends (its
    /// process died, it closed the connection, or the socket failed):
    /// `true`. Resolves `false` if this `Conn` is dropped first. It holds
    /// no reference to the connection while it waits.
    pub fn closed(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        let mut rx = self.closed.subscribe();
        async move { rx.wait_for(|c| *c).await.is_ok() }
    }

    /// Registers the waiter of request `id`, unless the connection has
    /// died: checked after the insert, because the reader marks the
    /// connection dead before it fails the waiters, so a waiter that
    /// registers as the connection ends is failed by one or the other.
    /// (Checked only before, a call whose check passed just before the
    /// server closed, and which inserted just after the reader had failed
    /// the waiters, waited for its whole timeout: a put during a node's
    /// graceful stop took the client's 1 s `attempt_timeout`.)
    fn register(&self, id: u64, waiter: Pending) -> Result<()> {
        self.pending.lock().insert(id, waiter);
        if !self.is_alive() {
            self.pending.lock().remove(&id);
            return Err(self.dead_error());
        }
        Ok(())
    }

    /// The connection is dead: every waiter fails now rather than at its
    /// timeout.
    fn fail_waiters(&self) {
        self.alive.store(false, Ordering::Release);
        let err = self.dead_error();
        for (_, p) in self.pending.lock().drain() {
            if let Pending::Once(tx) = p {
                let _ = tx.send(Err(err.clone()));
            }
        }
    }

    pub(crate) fn dead_error(&self) -> SluiceError {
        self.fatal
            .lock()
            .clone()
            .unwrap_or_else(|| conn_err("connection to the server closed"))
    }

    /// Sends values larger than `n` bytes in parts of `n` (0: whole).
    /// Parts also keep the kernel's send queue short (TCP_NOTSENT_LOWAT
    /// of two parts): otherwise megabytes of parts already handed to the
    /// socket would sit ahead of a small request as a whole value does.
    pub fn set_value_part_bytes(&self, n: usize) {
        self.part_bytes.store(n, Ordering::Relaxed);
        if n > 0 {
            let lowat = (2 * n).min(i32::MAX as usize) as libc::c_int;
            // SAFETY: `fd` is this connection's open socket (its halves
            // live as long as `self`); the option value is a c_int.
            let r = unsafe {
                libc::setsockopt(
                    self.fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NOTSENT_LOWAT,
                    (&lowat as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r != 0 {
                tracing::debug!(error = %std::io::Error::last_os_error(), "TCP_NOTSENT_LOWAT not set");
            }
        }
    }

    /// While watches are open, a connection silent for `every` sends a
    /// ping, and one silent for `every` again is given up (see
    /// `ClientConfig::watch_keepalive`); zero: never.
    pub fn set_watch_keepalive(&self, every: Duration) {
        self.keepalive_ms.store(
            every.as_millis().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// Writes the requests of one task turn together: instead of a
    /// system call (and, on loopback, the receiver's TCP work) per
    /// request, a request is queued and a task spawned after it writes
    /// everything queued by then in one go. Worth it where requests are
    /// started in bursts on one thread and that task runs right after
    /// them (the Python client's event-loop runtime); on a multi-threaded
    /// runtime another worker may run the task at once, so off by default.
    /// A write that fails then fails every waiting request.
    pub fn set_coalesce_writes(&self, on: bool) {
        self.coalesce.store(on, Ordering::Relaxed);
    }

    /// How many writes to the socket this connection has made (requests
    /// per write: how well they were coalesced).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// How far the connection's writes have got: bytes handed to the
    /// socket, and bytes the kernel still holds that the node has not
    /// acknowledged (`SIOCOUTQ`; 0 where it cannot say). A long write is
    /// moving while the first grows or the second shrinks
    /// (`NodePool::call_while_moving`): a value that fits in the socket's
    /// buffers is handed over at once and then drains at the link's pace.
    pub(crate) fn progress(&self) -> (u64, u32) {
        let mut outq: libc::c_int = 0;
        // SAFETY: an ioctl on the socket this connection owns (open as long
        // as `self`), writing one int.
        let r = unsafe { libc::ioctl(self.fd, libc::TIOCOUTQ, &mut outq) };
        let outq = if r == 0 { outq.max(0) as u32 } else { 0 };
        (self.written.load(Ordering::Relaxed), outq)
    }

    async fn send(&self, req: &Request, id: u64, flags: u8) -> Result<()> {
        let part = self.part_bytes.load(Ordering::Relaxed);
        if !req.value().is_some_and(|v| part > 0 && v.len() > part) {
            if self.coalesce.load(Ordering::Relaxed) && self.queue_for_flush(req, id, flags) {
                return Ok(());
            }
            let mut q = OutQueue::new();
            req.encode(&mut q, id, flags);
            return self.write_queue(q).await;
        }
        self.send_parts(req, id, flags, part, 0).await
    }

    /// Sends `req`'s value in parts of `part` bytes from offset `at`, then
    /// the request with the last part. The writer is taken per part:
    /// other requests go out in between.
    async fn send_parts(
        &self,
        req: &Request,
        id: u64,
        flags: u8,
        part: usize,
        at: usize,
    ) -> Result<()> {
        let value = req.value().cloned().unwrap_or_default();
        let mut s = PartedSend {
            conn: self,
            req,
            id,
            flags,
            part,
            at,
            done: false,
        };
        while value.len() - s.at > part {
            let mut q = OutQueue::new();
            sluice_wire::encode_part(&mut q, req.opcode(), id, &value.slice(s.at..s.at + part));
            let mut w = self.writer.lock().await;
            // Handed to the writer: it goes out whatever happens to us.
            s.at += part;
            if let Err(e) = self.write_locked(&mut w, q).await {
                s.done = true;
                return Err(e);
            }
        }
        let mut q = OutQueue::new();
        req.with_value(value.slice(s.at..))
            .encode(&mut q, id, flags);
        let mut w = self.writer.lock().await;
        s.done = true;
        self.write_locked(&mut w, q).await
    }

    /// Queues a request for the flush task (spawning it when none is
    /// due); `false`, queueing nothing, once `MAX_QUEUED_BYTES` wait
    /// already: the caller then writes itself, and so waits for the
    /// socket (requests that expect no reply hold no in-flight permit, so
    /// nothing else would bound the queue).
    fn queue_for_flush(&self, req: &Request, id: u64, flags: u8) -> bool {
        {
            let mut q = self.queued.lock();
            if q.len() >= MAX_QUEUED_BYTES {
                return false;
            }
            req.encode(&mut q, id, flags);
        }
        if !self.flush_due.swap(true, Ordering::AcqRel) {
            if let Some(me) = self.me.upgrade() {
                tokio::spawn(async move { me.flush().await });
            }
        }
        true
    }

    /// Writes what coalescing queued (see `set_coalesce_writes`).
    async fn flush(&self) {
        let mut w = self.writer.lock().await;
        // Cleared before taking the queue: a request queued after the take
        // spawns the next flush.
        self.flush_due.store(false, Ordering::Release);
        let q = std::mem::take(&mut *self.queued.lock());
        if self.write_out(&mut w, q).await.is_err() {
            drop(w);
            self.fail_waiters();
        }
    }

    async fn write_queue(&self, q: OutQueue) -> Result<()> {
        let mut w = self.writer.lock().await;
        self.write_locked(&mut w, q).await
    }

    /// `write_queue` with the writer taken: `q` is the writer's from the
    /// start (it goes out even if this future is dropped).
    async fn write_locked(&self, w: &mut Writer, q: OutQueue) -> Result<()> {
        let coalescing = self.coalesce.load(Ordering::Relaxed);
        if coalescing {
            // Requests queued for a flush were sent before this one.
            w.left.append(std::mem::take(&mut *self.queued.lock()));
        }
        let r = self.write_out(w, q).await;
        if r.is_err() && coalescing {
            self.fail_waiters();
        }
        r
    }

    /// Writes what a dropped writer left (`Writer::left`), then `q`. Safe
    /// to drop at any await: what is left of a frame begun goes out
    /// before any other (`FinishOnDrop`).
    async fn write_out(&self, w: &mut Writer, q: OutQueue) -> Result<()> {
        w.left.append(q);
        if w.left.is_empty() && !w.unflushed {
            // Nothing to write (an empty flush): no TLS flush either.
            return Ok(());
        }
        let mut finish = FinishOnDrop {
            conn: self,
            armed: true,
        };
        let dead = |finish: &mut FinishOnDrop| {
            finish.armed = false;
            self.alive.store(false, Ordering::Release);
            Err(self.dead_error())
        };
        while !w.left.is_empty() {
            let mut slots = [IoSlice::new(&[]); 16];
            let n = w.left.io_slices(&mut slots);
            self.writes.fetch_add(1, Ordering::Relaxed);
            match w.half.write_vectored(&slots[..n]).await {
                Ok(0) | Err(_) => return dead(&mut finish),
                Ok(k) => {
                    w.left.advance(k);
                    w.unflushed = true;
                    self.written.fetch_add(k as u64, Ordering::Relaxed);
                }
            }
        }
        // TLS: push out the records written (a no-op on TCP).
        if w.half.flush().await.is_err() {
            return dead(&mut finish);
        }
        w.unflushed = false;
        finish.armed = false;
        Ok(())
    }

    /// Sends a request and waits for its reply.
    pub async fn call(&self, req: &Request, timeout: Duration) -> Result<Response> {
        if !self.is_alive() {
            return Err(self.dead_error());
        }
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| conn_err("connection closed"))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.register(id, Pending::Once(tx))?;
        // Dropped before its reply came (its caller gave up): nobody waits
        // for the reply any more.
        let mut waiting = Unregister {
            conn: self,
            id,
            armed: true,
        };
        self.send(req, id, 0).await?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => {
                // The reader took it out of `pending`.
                waiting.armed = false;
                r
            }
            Ok(Err(_)) => Err(self.dead_error()),
            Err(_) => Err(SluiceError::Timeout {
                what: format!("a {} request (id {id})", req.name()),
                after_ms: timeout.as_millis() as u64,
            }),
        }
    }

    /// Sends a request whose replies keep coming (a watch); returns its id.
    pub(crate) async fn open_stream(
        &self,
        req: &Request,
        tx: mpsc::Sender<Response>,
        dropped: Arc<AtomicU64>,
    ) -> Result<u64> {
        if !self.is_alive() {
            return Err(self.dead_error());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.register(id, Pending::Stream(tx, dropped))?;
        if let Err(e) = self.send(req, id, 0).await {
            self.pending.lock().remove(&id);
            return Err(e);
        }
        let every = self.keepalive_ms.load(Ordering::Relaxed);
        if every > 0 && !self.keepalive_on.swap(true, Ordering::AcqRel) {
            tokio::spawn(keepalive(self.me.clone(), Duration::from_millis(every)));
        }
        Ok(id)
    }

    pub(crate) fn close_stream(&self, id: u64) {
        self.pending.lock().remove(&id);
    }

    /// Sends without waiting for (or expecting) a reply.
    pub(crate) async fn send_forget(&self, req: &Request) -> Result<()> {
        if !self.is_alive() {
            return Err(self.dead_error());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(req, id, sluice_wire::FLAG_NO_REPLY).await
    }

    /// Sends requests that expect no reply, in order, in as few writes as
    /// the socket takes (a node's consensus messages to a peer: one
    /// system call for whatever queued up meanwhile). Values are never
    /// split into parts here: the caller keeps large ones on a connection
    /// of their own.
    pub async fn send_forget_all(&self, reqs: &[Request]) -> Result<()> {
        if !self.is_alive() {
            return Err(self.dead_error());
        }
        let mut q = OutQueue::new();
        for req in reqs {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            req.encode(&mut q, id, sluice_wire::FLAG_NO_REPLY);
        }
        self.write_queue(q).await
    }
}

/// While `weak`'s connection has watches open: a ping once it has read
/// nothing for `every`, and the connection given up (its socket shut down,
/// so the reader ends it and every watch on it) when nothing comes for
/// `every` after that. Ends with the connection.
async fn keepalive(weak: std::sync::Weak<Conn>, every: Duration) {
    let Some(mut seen) = weak.upgrade().map(|c| c.reads.load(Ordering::Relaxed)) else {
        return;
    };
    let mut pinged = false;
    loop {
        tokio::time::sleep(every).await;
        let Some(conn) = weak.upgrade() else { return };
        if !conn.is_alive() {
            return;
        }
        let reads = conn.reads.load(Ordering::Relaxed);
        let watching = conn
            .pending
            .lock()
            .values()
            .any(|p| matches!(p, Pending::Stream(..)));
        if reads != seen || !watching {
            (seen, pinged) = (reads, false);
            continue;
        }
        if !pinged {
            // Its answer is a read; nobody waits for it.
            let id = conn.next_id.fetch_add(1, Ordering::Relaxed);
            let me = conn.clone();
            tokio::spawn(async move { me.send(&Request::Ping, id, 0).await });
            pinged = true;
            continue;
        }
        *conn.fatal.lock() = Some(conn_err(format!(
            "the node sent nothing for {:?}, a keepalive ping included: it is paused, hung or \
             cut off",
            every * 2
        )));
        // SAFETY: the socket stays open while `conn` (which owns it) lives.
        unsafe { libc::shutdown(conn.fd, libc::SHUT_RDWR) };
        return;
    }
}

async fn read_loop(
    weak: std::sync::Weak<Conn>,
    mut rd: ReadHalf,
    mut buf: BytesMut,
    decoder: FrameDecoder,
) {
    'outer: loop {
        // Held only while frames are dispatched, never across a read.
        let Some(conn) = weak.upgrade() else { return };
        // This task is the only writer: no read-modify-write needed.
        let reads = conn.reads.load(Ordering::Relaxed);
        conn.reads.store(reads.wrapping_add(1), Ordering::Relaxed);
        loop {
            let frame = match decoder.decode(&mut buf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    *conn.fatal.lock() = Some(SluiceError::protocol(format!(
                        "server sent a bad frame: {e}"
                    )));
                    break 'outer;
                }
            };
            let id = frame.request_id;
            let resp = Response::decode(frame);
            if id == 0 {
                // Connection-level error from the server (limits, timeouts).
                if let Ok(Response::Error(e)) = resp {
                    *conn.fatal.lock() = Some(e);
                }
                continue;
            }
            let mut pending = conn.pending.lock();
            match pending.get(&id) {
                Some(Pending::Once(_)) => {
                    if let Some(Pending::Once(tx)) = pending.remove(&id) {
                        let _ = tx.send(resp.and_then(|r| match r {
                            Response::Error(e) => Err(e),
                            other => Ok(other),
                        }));
                    }
                }
                Some(Pending::Stream(tx, dropped)) => {
                    if let Ok(r) = resp {
                        match tx.try_send(r) {
                            Ok(()) => {}
                            Err(mpsc::error::TrySendError::Full(_)) => {
                                dropped.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(mpsc::error::TrySendError::Closed(_)) => {
                                // Nobody reads it (a `watch` call dropped
                                // before its first reply, or one that timed
                                // out waiting for it): the node stops too.
                                pending.remove(&id);
                                let c = conn.clone();
                                tokio::spawn(async move {
                                    let unwatch = Request::Unwatch { watch_id: id };
                                    let _ = c.send_forget(&unwatch).await;
                                });
                            }
                        }
                    }
                }
                None => {} // the caller timed out and left
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
        if let Some(need) = decoder.needed(&buf) {
            if need > buf.capacity() {
                buf.reserve(need - buf.len());
            }
        }
        drop(conn);
        match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let Some(conn) = weak.upgrade() else { return };
    conn.closed.send_replace(true);
    conn.fail_waiters();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter that registers just after the reader failed the waiters
    /// of a connection that ended (the server closed it between a call's
    /// first check and its insert) fails at once, and is not left to wait
    /// for its timeout.
    #[tokio::test]
    async fn a_waiter_registered_as_the_connection_ends_fails_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = sluice_server::ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let server = sluice_server::Server::bind(cfg).await.unwrap();
        let addr = server.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        let c = Conn::connect(addr, "test", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(c.is_alive());
        // What the reader does when it reads the end of the connection.
        c.fail_waiters();
        let (tx, _rx) = oneshot::channel();
        let r = c.register(1, Pending::Once(tx));
        assert!(matches!(r, Err(SluiceError::Connection { .. })), "{r:?}");
        assert!(c.pending.lock().is_empty(), "no waiter left behind");
        let (tx, _rx) = mpsc::channel(1);
        let r = c.register(2, Pending::Stream(tx, Arc::default()));
        assert!(r.is_err() && c.pending.lock().is_empty());
        let _ = stop.send(());
        serving.await.unwrap();
    }
}
