//! etcd, the peer of replicated fsync'd puts in `sluice bench persistent`:
//! a 3-member cluster of Debian's `etcd` (package etcd-server; its leader
//! found with `etcdctl`, package etcd-client) on loopback,
//! driven through its native gRPC API (`etcdserverpb.KV/Put` over HTTP/2,
//! one connection per client, the `PutRequest` protobuf encoded by hand:
//! field 1 key, field 2 value), so its numbers carry no gateway or JSON
//! cost. Requests go to the leader, as Sluice's client sends puts to the
//! shard's leader.

use crate::harness::Op;
use crate::procs::free_port;
use anyhow::{bail, Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A 3-member etcd cluster, killed and removed on drop.
pub struct Etcd {
    children: Vec<Child>,
    /// Client URLs (host:port), by member.
    pub clients: Vec<String>,
    dir: PathBuf,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Checks that etcd and etcdctl are installed. The leader is found with
/// etcdctl: without it the cluster forms but is never seen to (a wait of
/// 30 s that said nothing of why).
pub fn require_etcd() -> Result<()> {
    crate::children::require_tools(
        &[("etcd", "--version"), ("etcdctl", "version")],
        "install the Debian packages etcd-server and etcd-client, or pass --no-etcd",
    )
}

/// Starts three etcd members with their data under `dir` (the same disk
/// Sluice's logs use) and waits until a put succeeds.
pub fn start_etcd(dir: PathBuf) -> Result<Etcd> {
    require_etcd()?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let peers: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let clients: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let initial: Vec<String> = peers
        .iter()
        .enumerate()
        .map(|(i, p)| format!("e{i}=http://127.0.0.1:{p}"))
        .collect();
    let mut children = Vec::new();
    for i in 0..3 {
        let log = std::fs::File::create(dir.join(format!("e{i}.log")))?;
        let child = crate::children::command("etcd")
            .args([
                "--name",
                &format!("e{i}"),
                "--data-dir",
                &dir.join(format!("e{i}")).to_string_lossy(),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", peers[i]),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", peers[i]),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{}", clients[i]),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{}", clients[i]),
                "--initial-cluster",
                &initial.join(","),
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "sluice-bench",
                // 1 MB values (etcd's default request limit is 1.5 MiB).
                "--max-request-bytes",
                "16777216",
                "--quota-backend-bytes",
                "8589934592",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting etcd (install the Debian package etcd-server, or pass --no-etcd)")?;
        children.push(child);
    }
    Ok(Etcd {
        children,
        clients: clients.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
        dir,
    })
}

impl Etcd {
    /// The client address of the current leader, once the cluster takes
    /// puts (asked with `etcdctl endpoint status`).
    pub async fn leader(&self) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args([
                    "--endpoints",
                    &self.clients.join(","),
                    "endpoint",
                    "status",
                    "-w",
                    "json",
                ])
                .output();
            if let Ok(o) = out {
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&o.stdout) {
                    let leader = v.as_array().and_then(|a| {
                        a.iter().find(|e| {
                            let s = &e["Status"];
                            s["leader"].as_u64().is_some()
                                && s["leader"] == s["header"]["member_id"]
                        })
                    });
                    if let Some(l) = leader.and_then(|l| l["Endpoint"].as_str()) {
                        let addr = l.trim_start_matches("http://").to_string();
                        let mut op = EtcdOp::connect(&addr, "/ready", 16).await?;
                        if op.call(0).await.is_ok() {
                            return Ok(addr);
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd cluster had no leader taking puts within 30 s (logs in {})",
                    self.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Encodes a protobuf length-delimited field.
fn field(buf: &mut BytesMut, tag: u8, data: &[u8]) {
    buf.put_u8(tag);
    let mut n = data.len() as u64;
    while n >= 0x80 {
        buf.put_u8((n as u8) | 0x80);
        n >>= 7;
    }
    buf.put_u8(n as u8);
    buf.put_slice(data);
}

/// A gRPC message frame holding `PutRequest { key, value }`.
fn put_frame(key: &[u8], value: &[u8]) -> Bytes {
    let mut msg = BytesMut::with_capacity(key.len() + value.len() + 16);
    field(&mut msg, 0x0a, key);
    field(&mut msg, 0x12, value);
    let mut out = BytesMut::with_capacity(msg.len() + 5);
    out.put_u8(0); // not compressed
    out.put_u32(msg.len() as u32);
    out.put_slice(&msg);
    out.freeze()
}

/// One client: an HTTP/2 connection to an etcd member, putting `size`-byte
/// values under 64 keys of `prefix` in turn (bodies encoded up front).
#[derive(Clone)]
pub struct EtcdOp {
    send: h2::client::SendRequest<Bytes>,
    authority: String,
    bodies: Arc<Vec<Bytes>>,
}

impl EtcdOp {
    pub async fn connect(addr: &str, prefix: &str, size: usize) -> Result<EtcdOp> {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to etcd at {addr}"))?;
        tcp.set_nodelay(true)?;
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(16 << 20)
            .initial_connection_window_size(16 << 20)
            .handshake(tcp)
            .await
            .context("HTTP/2 handshake with etcd")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let value = vec![b'e'; size];
        let bodies = (0..64)
            .map(|i| put_frame(format!("{prefix}/{i}").as_bytes(), &value))
            .collect();
        Ok(EtcdOp {
            send,
            authority: addr.to_string(),
            bodies: Arc::new(bodies),
        })
    }
}

impl Op for EtcdOp {
    async fn call(&mut self, i: u64) -> Result<()> {
        let body = self.bodies[(i % 64) as usize].clone();
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{}/etcdserverpb.KV/Put", self.authority))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        let mut send = self.send.clone().ready().await?;
        let (resp, mut stream) = send.send_request(req, false)?;
        stream.reserve_capacity(body.len());
        stream.send_data(body, true)?;
        let resp = resp.await?;
        if resp.status() != http::StatusCode::OK {
            bail!("etcd put: HTTP status {}", resp.status());
        }
        // A trailers-only reply carries grpc-status in the headers.
        let head_status = resp
            .headers()
            .get("grpc-status")
            .map(|v| v.as_bytes().to_vec());
        let mut body = resp.into_body();
        while let Some(d) = body.data().await {
            let d = d?;
            let _ = body.flow_control().release_capacity(d.len());
        }
        let status = match head_status {
            Some(s) => Some(s),
            None => body
                .trailers()
                .await?
                .and_then(|t| t.get("grpc-status").map(|v| v.as_bytes().to_vec())),
        };
        match status.as_deref() {
            Some(b"0") => Ok(()),
            other => bail!(
                "etcd put failed: grpc-status {:?}",
                other.map(String::from_utf8_lossy)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_frames_are_grpc_framed_protobuf() {
        let f = put_frame(b"/k", &[7u8; 200]);
        assert_eq!(f[0], 0);
        let len = u32::from_be_bytes([f[1], f[2], f[3], f[4]]) as usize;
        assert_eq!(len, f.len() - 5);
        // key: tag 1, length 2; value: tag 2, varint 200 = 0xc8 0x01.
        assert_eq!(&f[5..9], &[0x0a, 2, b'/', b'k']);
        assert_eq!(&f[9..12], &[0x12, 0xc8, 0x01]);
        assert_eq!(f.len(), 12 + 200);
    }
}
