//! What the benchmarks measure and compare with: Sluice's client, a raw
//! loopback TCP exchange, and redis-server (RESP by hand).

use crate::harness::Op;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use sluice_client::Client;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone)]
pub struct SluiceOp {
    pub client: Client,
    pub op: &'static str,
    pub value: Bytes,
    pub prefix: String,
}

pub const KEYS_PER_SIZE: u64 = 64;

/// `n` clients (a connection each) doing `op` ("put", "get" or
/// "trigger_put") with `size`-byte values; for gets, the keys they read
/// are written first.
pub async fn sluice_ops(
    cfg: &sluice_client::ClientConfig,
    op: &'static str,
    size: usize,
    n: usize,
) -> Result<Vec<SluiceOp>> {
    let mut v = Vec::new();
    for c in 0..n {
        let client = Client::connect_with(cfg.clone()).await?;
        let prefix = match op {
            "put" => format!("/vol/bench/put/{size}/{c}"),
            "get" => format!("/vol/bench/{size}"),
            _ => format!("/trig/bench/{size}"),
        };
        v.push(SluiceOp {
            client,
            op,
            value: Bytes::from(vec![b'x'; size]),
            prefix,
        });
    }
    if op == "get" {
        for i in 0..KEYS_PER_SIZE {
            v[0].client
                .put(
                    &format!("/vol/bench/{size}/{i}"),
                    Bytes::from(vec![b'x'; size]),
                )
                .await?;
        }
    }
    Ok(v)
}

impl Op for SluiceOp {
    async fn call(&mut self, i: u64) -> Result<()> {
        let key = format!("{}/{}", self.prefix, i % KEYS_PER_SIZE);
        match self.op {
            "put" => self
                .client
                .put(&key, self.value.clone())
                .await
                .map(|_| ())?,
            "get" => {
                let o = self.client.get(&key).await?;
                if o.value.len() != self.value.len() {
                    bail!("short read");
                }
            }
            _ => self
                .client
                .trigger_put(&key, self.value.clone())
                .await
                .map(|_| ())?,
        }
        Ok(())
    }
}

/// Raw loopback TCP: send `req` bytes, read `resp` bytes back.
pub struct RawOp {
    sock: tokio::net::TcpStream,
    req: Vec<u8>,
    resp: Vec<u8>,
}

impl Op for RawOp {
    async fn call(&mut self, _i: u64) -> Result<()> {
        self.sock.write_all(&self.req).await?;
        self.sock.read_exact(&mut self.resp).await?;
        Ok(())
    }
}

/// Echo-like server for the baseline: reads an 8-byte header
/// (request length, response length), the request, then writes the response.
pub fn baseline_server() -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let _ = s.set_nodelay(true);
                let mut buf = vec![0u8; 1 << 16];
                let mut out: Vec<u8> = Vec::new();
                loop {
                    let mut hdr = [0u8; 8];
                    if s.read_exact(&mut hdr).is_err() {
                        return;
                    }
                    let req = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
                    let resp = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
                    let mut left = req;
                    while left > 0 {
                        let n = left.min(buf.len());
                        if s.read_exact(&mut buf[..n]).is_err() {
                            return;
                        }
                        left -= n;
                    }
                    out.resize(resp, 7);
                    if s.write_all(&out).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

pub async fn raw_op(addr: SocketAddr, req_payload: usize, resp_len: usize) -> Result<RawOp> {
    let sock = tokio::net::TcpStream::connect(addr).await?;
    sock.set_nodelay(true)?;
    let mut req = Vec::with_capacity(8 + req_payload);
    req.extend_from_slice(&(req_payload as u32).to_le_bytes());
    req.extend_from_slice(&(resp_len as u32).to_le_bytes());
    req.resize(8 + req_payload, 1);
    Ok(RawOp {
        sock,
        req,
        resp: vec![0; resp_len],
    })
}

/// A minimal RESP client for SET/GET against redis-server.
pub struct RedisOp {
    /// Replies are read through a buffer: reading them a byte per system
    /// call (as this client did until 2026-11-27) cost Redis's side of
    /// every comparison nine `recv`s per `SET` + `WAIT`.
    sock: tokio::io::BufReader<tokio::net::TcpStream>,
    op: &'static str,
    value: Vec<u8>,
    prefix: String,
    buf: Vec<u8>,
    /// After each SET, `WAIT <n> 0`: return once n replicas have it.
    pub wait_replicas: Option<u32>,
}

impl RedisOp {
    async fn read_reply(&mut self) -> Result<()> {
        // Replies: +OK\r\n, or $<len>\r\n<data>\r\n.
        self.buf.clear();
        let mut byte = [0u8; 1];
        loop {
            self.sock.read_exact(&mut byte).await?;
            self.buf.push(byte[0]);
            if self.buf.ends_with(b"\r\n") {
                break;
            }
        }
        match self.buf[0] {
            b'+' | b':' => Ok(()),
            b'$' => {
                let n: i64 = std::str::from_utf8(&self.buf[1..self.buf.len() - 2])?.parse()?;
                if n < 0 {
                    bail!("redis: nil");
                }
                let mut data = vec![0u8; n as usize + 2];
                self.sock.read_exact(&mut data).await?;
                Ok(())
            }
            _ => bail!("redis error: {}", String::from_utf8_lossy(&self.buf)),
        }
    }
}

impl Op for RedisOp {
    async fn call(&mut self, i: u64) -> Result<()> {
        let key = format!("{}/{}", self.prefix, i % KEYS_PER_SIZE);
        let mut cmd = Vec::with_capacity(self.value.len() + 64);
        if self.op == "put" {
            write!(
                cmd,
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n",
                key.len(),
                self.value.len()
            )?;
            cmd.extend_from_slice(&self.value);
            cmd.extend_from_slice(b"\r\n");
        } else {
            write!(cmd, "*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len())?;
        }
        if let (Some(n), "put") = (self.wait_replicas, self.op) {
            write!(
                cmd,
                "*3\r\n$4\r\nWAIT\r\n${}\r\n{n}\r\n$1\r\n0\r\n",
                n.to_string().len()
            )?;
        }
        self.sock.write_all(&cmd).await?;
        self.read_reply().await?;
        if let (Some(n), "put") = (self.wait_replicas, self.op) {
            // `:<replicas>`: fewer than asked means it was not replicated.
            self.read_reply().await?;
            let got: u32 = std::str::from_utf8(&self.buf[1..self.buf.len() - 2])?.parse()?;
            if got < n {
                bail!("redis WAIT: only {got} of {n} replicas acknowledged");
            }
        }
        Ok(())
    }
}

pub async fn redis_op(addr: &str, op: &'static str, size: usize) -> Result<RedisOp> {
    let sock = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to redis at {addr}"))?;
    sock.set_nodelay(true)?;
    Ok(RedisOp {
        sock: tokio::io::BufReader::with_capacity(64 * 1024, sock),
        op,
        value: vec![b'x'; size],
        prefix: format!("/bench/{size}"),
        buf: Vec::new(),
        wait_replicas: None,
    })
}

// ---------------------------------------------------------------- core
