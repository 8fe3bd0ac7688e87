//! A TLS stream over any async byte stream, on rustls' unbuffered API.
//!
//! Why not `tokio_rustls`: its streams sit on rustls' buffered
//! connections, which copy every received record from the socket's buffer
//! into rustls' own (growing it 4 KB at a time with zero-filling and
//! shrinking it again when empty) and every sent record into a fresh
//! allocation. Here the socket is read straight into one receive buffer
//! that rustls decrypts in place, and records are sealed straight into one
//! send buffer; both buffers live as long as the connection
//! (BENCHMARKS.md: "TLS next to plaintext").
//!
//! The protocol is all rustls': this module only moves bytes between the
//! socket and rustls' states (`process_tls_records`), in the order rustls
//! asks for them.

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, UnbufferedStatus, WriteTraffic,
};
use rustls::{ClientConfig, CommonState, ServerConfig};
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The receive buffer: one `recv` takes several 10 KB messages, and it
/// always has room for a whole record (at most 16 KB and its framing).
const RX_BYTES: usize = 64 * 1024;

/// The most the receive buffer grows to while rustls joins a handshake
/// message: rustls takes those up to 64 KB, which with their records'
/// headers fit in twice the buffer (a guard: rustls refuses a longer one
/// first).
const MAX_RX_BYTES: usize = 2 * RX_BYTES;

/// Plaintext bytes of one record (TLS's limit).
const MAX_RECORD_PLAIN: usize = 16 * 1024;

/// Sealed bytes a writer may leave unsent before it waits for the socket
/// (the send buffer grows to about this much and a record more).
const TX_HIGH: usize = 128 * 1024;

/// What the send buffer grows to by doubling: `TX_HIGH` and the records
/// one write may seal past it.
const TX_CAP: usize = TX_HIGH + 2 * MAX_RECORD_PLAIN;

/// One side of an unbuffered rustls connection.
pub trait Side: Send + Unpin + 'static {
    type Data;
    fn process<'c, 'i>(&'c mut self, rx: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn state(&self) -> &CommonState;
}

/// `Side` for a client's or a server's connection: the same two calls,
/// which rustls defines on each type separately.
macro_rules! side {
    ($conn:ty, $data:ty) => {
        impl Side for $conn {
            type Data = $data;
            fn process<'c, 'i>(
                &'c mut self,
                rx: &'i mut [u8],
            ) -> UnbufferedStatus<'c, 'i, Self::Data> {
                self.process_tls_records(rx)
            }
            fn state(&self) -> &CommonState {
                self
            }
        }
    };
}

side!(UnbufferedClientConnection, ClientConnectionData);
side!(UnbufferedServerConnection, ServerConnectionData);

/// A client's TLS stream.
pub type ClientStream<IO> = TlsStream<IO, UnbufferedClientConnection>;
/// A node's TLS stream, as accepted.
pub type ServerStream<IO> = TlsStream<IO, UnbufferedServerConnection>;

/// Runs a client's handshake over `io` with the server `name`.
pub async fn connect<IO: AsyncRead + AsyncWrite + Unpin>(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    io: IO,
) -> io::Result<ClientStream<IO>> {
    let conn = UnbufferedClientConnection::new(config, name).map_err(invalid)?;
    TlsStream::handshake(conn, io).await
}

/// Runs a node's side of the handshake over an accepted `io`.
pub async fn accept<IO: AsyncRead + AsyncWrite + Unpin>(
    config: Arc<ServerConfig>,
    io: IO,
) -> io::Result<ServerStream<IO>> {
    let conn = UnbufferedServerConnection::new(config).map_err(invalid)?;
    TlsStream::handshake(conn, io).await
}

/// What `pump` writes once rustls lets it.
enum Write<'a, 'b> {
    Nothing,
    /// Up to this many bytes of these slices.
    Data(&'a [IoSlice<'b>], usize),
    CloseNotify,
    /// A TLS 1.3 key update (ours, asking the peer for theirs too).
    KeyUpdate,
}

/// Where `pump` stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// rustls needs more bytes from the peer to go on with its handshake.
    NeedData,
    /// Records may be sent; received ones are all decrypted.
    Writable,
    /// Both sides sent close_notify.
    Closed,
}

/// Bytes on their way out, and decrypted bytes a reader has not taken.
#[derive(Default)]
struct Bufs {
    /// Sealed records: `tx[tx_pos..tx_end]` is still to be sent. Kept
    /// initialized to its length, so sealing never zero-fills.
    tx: Vec<u8>,
    tx_pos: usize,
    tx_end: usize,
    /// Small slices of one write gathered into one record.
    stage: Vec<u8>,
    /// Decrypted bytes that did not fit the reader's buffer.
    plain: Vec<u8>,
    plain_pos: usize,
}

impl Bufs {
    fn unsent(&self) -> usize {
        self.tx_end - self.tx_pos
    }

    /// Room for `n` more sealed bytes at `tx_end`.
    fn reserve(&mut self, n: usize) {
        if self.tx_pos == self.tx_end {
            self.tx_pos = 0;
            self.tx_end = 0;
        }
        if self.tx.len() - self.tx_end < n {
            if self.tx_pos > 0 {
                self.tx.copy_within(self.tx_pos..self.tx_end, 0);
                self.tx_end -= self.tx_pos;
                self.tx_pos = 0;
            }
            // Doubling, but not past what `TX_HIGH` lets one write leave.
            let want = (self.tx_end + n)
                .max((self.tx.len() * 2).min(TX_CAP))
                .max(4096);
            self.tx.resize(want, 0);
        }
    }

    /// Hands a record's plaintext to the reader's buffer, keeping what
    /// does not fit.
    fn deliver(&mut self, payload: &[u8], out: &mut Option<&mut ReadBuf<'_>>) {
        let mut rest = payload;
        if let Some(out) = out.as_deref_mut() {
            if self.plain_pos == self.plain.len() {
                let k = rest.len().min(out.remaining());
                out.put_slice(&rest[..k]);
                rest = &rest[k..];
            }
        }
        self.plain.extend_from_slice(rest);
    }

    /// Copies kept plaintext into `out`; whether there was any.
    fn take_plain(&mut self, out: &mut ReadBuf<'_>) -> bool {
        if self.plain_pos == self.plain.len() {
            return false;
        }
        let k = (self.plain.len() - self.plain_pos).min(out.remaining());
        out.put_slice(&self.plain[self.plain_pos..self.plain_pos + k]);
        self.plain_pos += k;
        if self.plain_pos == self.plain.len() {
            self.plain.clear();
            self.plain_pos = 0;
        }
        true
    }

    /// Seals `data` into one or more records at the end of `tx`.
    fn seal<D>(&mut self, w: &mut WriteTraffic<'_, D>, data: &[u8]) -> io::Result<()> {
        let mut need = data.len() + 64;
        loop {
            self.reserve(need);
            match w.encrypt(data, &mut self.tx[self.tx_end..]) {
                Ok(n) => {
                    self.tx_end += n;
                    return Ok(());
                }
                Err(EncryptError::InsufficientSize(e)) => need = e.required_size,
                Err(e) => return Err(io::Error::other(e.to_string())),
            }
        }
    }

    /// Seals up to `budget` bytes of `data`; how many bytes it took.
    /// Slices that fit one record together (a frame's header and its
    /// value) are gathered first, so they travel as one record; a slice
    /// with nothing to gather it with is sealed from where it is.
    fn seal_slices<D>(
        &mut self,
        w: &mut WriteTraffic<'_, D>,
        data: &[IoSlice<'_>],
        budget: usize,
    ) -> io::Result<usize> {
        let mut taken = 0;
        let mut stage = std::mem::take(&mut self.stage);
        stage.clear();
        let mut parts = data
            .iter()
            .scan(budget, |left, s| {
                let k = s.len().min(*left);
                *left -= k;
                Some(&s[..k])
            })
            .filter(|s| !s.is_empty())
            .peekable();
        while let Some(s) = parts.next() {
            taken += s.len();
            if !stage.is_empty() && stage.len() + s.len() > MAX_RECORD_PLAIN {
                self.seal(w, &stage)?;
                stage.clear();
            }
            let gather = !stage.is_empty()
                || parts
                    .peek()
                    .is_some_and(|n| s.len() + n.len() <= MAX_RECORD_PLAIN);
            if gather {
                stage.extend_from_slice(s);
            } else {
                self.seal(w, s)?;
            }
        }
        if !stage.is_empty() {
            self.seal(w, &stage)?;
        }
        self.stage = stage;
        Ok(taken)
    }

    /// Encodes a handshake or alert record rustls has ready.
    fn encode<D>(&mut self, e: &mut rustls::unbuffered::EncodeTlsData<'_, D>) -> io::Result<()> {
        let mut need = 4096;
        loop {
            self.reserve(need);
            match e.encode(&mut self.tx[self.tx_end..]) {
                Ok(n) => {
                    self.tx_end += n;
                    return Ok(());
                }
                Err(EncodeError::InsufficientSize(s)) => need = s.required_size,
                Err(e) => return Err(io::Error::other(e.to_string())),
            }
        }
    }
}

/// TLS over `IO`, driven by rustls' unbuffered connection `C`.
pub struct TlsStream<IO, C: Side> {
    io: IO,
    conn: C,
    /// Received bytes: `rx[rx_start..rx_end]` is not yet processed.
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    bufs: Bufs,
    /// The peer sent close_notify: reads end here.
    peer_closed: bool,
    /// We queued our close_notify: no more writes.
    close_sent: bool,
    /// What the stream failed with: every later call fails the same way.
    failed: Option<(io::ErrorKind, String)>,
}

impl<IO: AsyncRead + AsyncWrite + Unpin, C: Side> TlsStream<IO, C> {
    async fn handshake(conn: C, io: IO) -> io::Result<Self> {
        let mut s = TlsStream {
            io,
            conn,
            rx: vec![0u8; RX_BYTES],
            rx_start: 0,
            rx_end: 0,
            bufs: Bufs::default(),
            peer_closed: false,
            close_sent: false,
            failed: None,
        };
        loop {
            let next = match s.pump(None, Write::Nothing) {
                Ok((next, _)) => next,
                Err(e) => {
                    s.send_alert().await;
                    return Err(e);
                }
            };
            poll_fn(|cx| s.poll_send(cx)).await?;
            match next {
                Next::Writable if !s.conn.state().is_handshaking() => return Ok(s),
                Next::Closed => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the peer closed the connection during the TLS handshake",
                    ))
                }
                _ => {
                    if poll_fn(|cx| s.poll_fill(cx)).await? == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the peer closed the connection during the TLS handshake",
                        ));
                    }
                }
            }
        }
    }

    /// The certificates the peer presented (a client's, on a node with
    /// mutual TLS), its own first.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        self.conn.state().peer_certificates()
    }

    /// Sends a TLS 1.3 key update now (the peer answers with its own):
    /// later records on both sides use new keys. rustls also does this on
    /// its own before a key has sealed too many records.
    pub async fn update_keys(&mut self) -> io::Result<()> {
        self.pump(None, Write::KeyUpdate)?;
        poll_fn(|cx| self.poll_send(cx)).await
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The underlying stream, for tests that write past TLS.
    #[cfg(test)]
    pub(crate) fn into_io(self) -> IO {
        self.io
    }

    /// After a failed handshake: sends the alert rustls queued, if any,
    /// so the peer learns why (e.g. `CertificateRequired`).
    async fn send_alert(&mut self) {
        // Only what is queued: processing the received bytes again after
        // an error would meet the same error (and alert twice).
        while self.conn.state().wants_write() {
            let UnbufferedStatus { state, .. } =
                self.conn.process(&mut self.rx[self.rx_start..self.rx_end]);
            let Ok(ConnectionState::EncodeTlsData(mut e)) = state else {
                break;
            };
            if self.bufs.encode(&mut e).is_err() {
                break;
            }
        }
        let _ = tokio::time::timeout(
            std::time::Duration::from_millis(100),
            poll_fn(|cx| self.poll_send(cx)),
        )
        .await;
    }

    /// Runs rustls over the received bytes until it needs more of them or
    /// lets us write: decrypted data goes to `out` (what does not fit is
    /// kept), handshake and alert records to the send buffer, and once
    /// writing is allowed `write` is done (up to `budget` bytes of data
    /// sealed). Returns where it stopped and how many bytes of data it
    /// took. After an error every call fails the same way, without
    /// asking rustls again (the same bytes would fail the same way).
    fn pump(
        &mut self,
        out: Option<&mut ReadBuf<'_>>,
        write: Write<'_, '_>,
    ) -> io::Result<(Next, usize)> {
        if let Some((kind, why)) = &self.failed {
            return Err(io::Error::new(*kind, why.clone()));
        }
        self.pump_once(out, write).inspect_err(|e| {
            self.failed = Some((e.kind(), e.to_string()));
        })
    }

    fn pump_once(
        &mut self,
        mut out: Option<&mut ReadBuf<'_>>,
        mut write: Write<'_, '_>,
    ) -> io::Result<(Next, usize)> {
        let mut taken = 0;
        loop {
            let UnbufferedStatus { discard, state } =
                self.conn.process(&mut self.rx[self.rx_start..self.rx_end]);
            let state = match state {
                Ok(s) => s,
                Err(e) => {
                    self.discard(discard);
                    return Err(invalid(e));
                }
            };
            let next = match state {
                ConnectionState::ReadTraffic(mut r) => {
                    while let Some(rec) = r.next_record() {
                        let rec = rec.map_err(invalid)?;
                        self.bufs.deliver(rec.payload, &mut out);
                    }
                    None
                }
                ConnectionState::EncodeTlsData(mut e) => {
                    self.bufs.encode(&mut e)?;
                    None
                }
                // Queued in order ahead of anything sealed later; sent
                // before this stream next waits on the peer.
                ConnectionState::TransmitTlsData(t) => {
                    t.done();
                    None
                }
                ConnectionState::BlockedHandshake => Some(Next::NeedData),
                ConnectionState::WriteTraffic(mut w) => {
                    match std::mem::replace(&mut write, Write::Nothing) {
                        Write::Nothing => Some(Next::Writable),
                        Write::Data(data, budget) => {
                            taken = self.bufs.seal_slices(&mut w, data, budget)?;
                            Some(Next::Writable)
                        }
                        Write::CloseNotify => {
                            self.bufs.reserve(64);
                            let b = &mut self.bufs;
                            let n = w
                                .queue_close_notify(&mut b.tx[b.tx_end..])
                                .map_err(|e| io::Error::other(e.to_string()))?;
                            b.tx_end += n;
                            Some(Next::Writable)
                        }
                        Write::KeyUpdate => {
                            w.refresh_traffic_keys().map_err(invalid)?;
                            // Its record comes out of the next step.
                            None
                        }
                    }
                }
                ConnectionState::PeerClosed => {
                    self.peer_closed = true;
                    None
                }
                ConnectionState::Closed => {
                    self.peer_closed = true;
                    Some(Next::Closed)
                }
                other => {
                    return Err(io::Error::other(format!(
                        "unexpected TLS state {other:?} (0-RTT data is not accepted)"
                    )))
                }
            };
            self.discard(discard);
            if let Some(n) = next {
                return Ok((n, taken));
            }
        }
    }

    /// Drops `n` processed bytes from the front of the received ones, as
    /// rustls asks after each step (it reads the rest where it left them).
    fn discard(&mut self, n: usize) {
        self.rx_start += n;
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        }
    }

    /// Reads more bytes from the peer; 0 at its end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rx_start > 0 && self.rx.len() - self.rx_end < MAX_RECORD_PLAIN + 512 {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        if self.rx_end == self.rx.len() {
            // A handshake message longer than the buffer (a long
            // certificate chain): rustls joins it in place.
            if self.rx.len() >= MAX_RX_BYTES {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a TLS message longer than {MAX_RX_BYTES} bytes"),
                )));
            }
            self.rx.resize(self.rx.len() * 2, 0);
        }
        let mut buf = ReadBuf::new(&mut self.rx[self.rx_end..]);
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf))?;
        let n = buf.filled().len();
        self.rx_end += n;
        Poll::Ready(Ok(n))
    }

    /// Sends every sealed byte.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.bufs.tx_pos < self.bufs.tx_end {
            let b = &self.bufs.tx[self.bufs.tx_pos..self.bufs.tx_end];
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, b))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.bufs.tx_pos += n;
        }
        self.bufs.tx_pos = 0;
        self.bufs.tx_end = 0;
        Poll::Ready(Ok(()))
    }

    fn write_slices(
        &mut self,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.bufs.unsent() >= TX_HIGH {
            ready!(self.poll_send(cx))?;
        }
        if self.close_sent {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "write after the TLS stream was shut down",
            )));
        }
        let len: usize = data.iter().map(|s| s.len()).sum();
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        // Bounded so the send buffer stays near `TX_HIGH` however much
        // one call hands over.
        let budget = len.min(TX_HIGH - self.bufs.unsent());
        match self.pump(None, Write::Data(data, budget))? {
            (Next::Writable, n) => {
                // On its way now, as on a TCP stream (a caller that
                // flushes next finds nothing left). What the socket does
                // not take yet waits for the next write or flush; an
                // error there comes back from them.
                let _ = self.poll_send(cx);
                Poll::Ready(Ok(n))
            }
            (Next::Closed, _) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the TLS connection is closed",
            ))),
            (Next::NeedData, _) => Poll::Ready(Err(io::Error::other("TLS handshake not complete"))),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin, C: Side> AsyncRead for TlsStream<IO, C> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.bufs.take_plain(out) || this.peer_closed {
                return Poll::Ready(Ok(()));
            }
            let before = out.filled().len();
            let (next, _) = this.pump(Some(&mut *out), Write::Nothing)?;
            if this.bufs.unsent() > 0 {
                // Records rustls answered with (a key update, tickets):
                // on their way now; the next write or flush finishes them.
                if let Poll::Ready(Err(e)) = this.poll_send(cx) {
                    return Poll::Ready(Err(e));
                }
            }
            if out.filled().len() > before || this.peer_closed || next == Next::Closed {
                return Poll::Ready(Ok(()));
            }
            if ready!(this.poll_fill(cx))? == 0 {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection without a TLS close_notify",
                )));
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin, C: Side> AsyncWrite for TlsStream<IO, C> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_slices(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_slices(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent {
            this.pump(None, Write::CloseNotify)?;
            this.close_sent = true;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}
