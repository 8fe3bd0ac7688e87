//! Node-to-node transport for every group: one pipelined Sluice
//! connection per peer carries the consensus messages of all groups
//! (`Request::Raft { group, kind, body }`), with fault injection (links
//! cut on demand) for tests.

use crate::types::TypeConfig;
use bytes::Bytes;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_client::Conn;
use sluice_types::SluiceError;
use sluice_wire::{Request, Response};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Message kinds in `Request::Raft`.
pub mod kind {
    pub const APPEND: u8 = 1;
    pub const VOTE: u8 = 2;
    pub const SNAPSHOT: u8 = 3;
}

/// The connections to the other nodes, shared by every group.
pub struct Peers {
    pub me: u32,
    conns: Mutex<HashMap<u32, Arc<Conn>>>,
    connecting: tokio::sync::Mutex<()>,
    /// Links cut by fault injection (both directions).
    blocked: RwLock<HashSet<u32>>,
    connect_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

impl Peers {
    pub fn new(me: u32, connect_timeout: Duration) -> Self {
        Peers {
            me,
            conns: Mutex::default(),
            connecting: tokio::sync::Mutex::new(()),
            blocked: RwLock::default(),
            connect_timeout,
        }
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
            c.remove(p);
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

    async fn conn(&self, target: u32, addr: &str) -> Result<Arc<Conn>, SluiceError> {
        if let Some(c) = self.conns.lock().get(&target) {
            if c.is_alive() {
                return Ok(c.clone());
            }
        }
        let _g = self.connecting.lock().await;
        if let Some(c) = self.conns.lock().get(&target) {
            if c.is_alive() {
                return Ok(c.clone());
            }
        }
        let sa: SocketAddr = addr.parse().map_err(|e| SluiceError::Connection {
            reason: format!("node {target} has a bad address {addr:?}: {e}"),
        })?;
        let c = Conn::connect(
            sa,
            &format!("sluice-node-{}", self.me),
            self.connect_timeout,
        )
        .await?;
        self.conns.lock().insert(target, c.clone());
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
        self.conn(target, addr).await?.call(req, timeout).await
    }

    /// Sends one consensus message and returns the peer's reply body.
    pub async fn call(
        &self,
        target: u32,
        addr: &str,
        group: u64,
        kind: u8,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes, SluiceError> {
        if self.is_blocked(target) {
            return Err(SluiceError::Unavailable {
                reason: format!("link to node {target} is cut (fault injection)"),
            });
        }
        let conn = self.conn(target, addr).await?;
        let req = Request::Raft {
            from: self.me,
            group,
            kind,
            body: Bytes::from(body),
        };
        match conn.call(&req, timeout).await? {
            Response::Raw(b) => Ok(b),
            Response::Error(e) => Err(e),
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
}

pub struct NetClient {
    peers: Arc<Peers>,
    group: u64,
    target: u64,
    addr: String,
}

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = NetClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> NetClient {
        NetClient {
            peers: self.peers.clone(),
            group: self.group,
            target,
            addr: node.addr.clone(),
        }
    }
}

type RpcErr<E> = RPCError<u64, BasicNode, RaftError<u64, E>>;

impl NetClient {
    async fn rpc<Req: Serialize, Resp: DeserializeOwned, E>(
        &self,
        kind: u8,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RpcErr<E>>
    where
        E: std::error::Error + DeserializeOwned,
    {
        let body = bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
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
        let res: Result<Resp, RaftError<u64, E>> =
            bincode::deserialize(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for NetClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcErr<openraft::error::Infallible>> {
        self.rpc(kind::APPEND, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcErr<InstallSnapshotError>> {
        self.rpc(kind::SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RpcErr<openraft::error::Infallible>> {
        self.rpc(kind::VOTE, &rpc, &option).await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // Retry an unreachable peer quickly: it is usually a restart.
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(100)))
    }
}

/// Decodes a consensus message addressed to `raft`, runs it, and encodes
/// the reply (the receiving half of `NetClient::rpc`).
pub async fn dispatch(
    raft: &crate::types::Raft,
    kind: u8,
    body: &[u8],
) -> Result<Bytes, SluiceError> {
    fn dec<T: DeserializeOwned>(b: &[u8]) -> Result<T, SluiceError> {
        bincode::deserialize(b)
            .map_err(|e| SluiceError::protocol(format!("bad consensus message: {e}")))
    }
    fn enc<T: Serialize>(v: &T) -> Result<Bytes, SluiceError> {
        bincode::serialize(v)
            .map(Bytes::from)
            .map_err(|e| SluiceError::Internal {
                reason: e.to_string(),
            })
    }
    match kind {
        kind::APPEND => enc(&raft.append_entries(dec(body)?).await),
        kind::VOTE => enc(&raft.vote(dec::<VoteRequest<u64>>(body)?).await),
        kind::SNAPSHOT => enc(&raft.install_snapshot(dec(body)?).await),
        k => Err(SluiceError::protocol(format!(
            "unknown consensus message kind {k}"
        ))),
    }
}
