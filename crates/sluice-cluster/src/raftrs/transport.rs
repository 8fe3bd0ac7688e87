//! raft-rs messages between nodes: `Transport` over the node's peer
//! connections (`network::Peers`).
//!
//! A message goes one way (`FLAG_NO_REPLY`): raft-rs's answers are
//! messages of their own. `send` never waits: it encodes the message
//! (`wire`), and queues it for its peer's lane, small or bulk by size (so
//! a heartbeat never waits behind a large value on the wire). One task per
//! lane takes whatever queued meanwhile and writes it in one go, in order.
//! A lane that is full (a peer that is gone or slow) drops the message:
//! raft-rs sends again (a heartbeat, a rejected or unanswered append).

use super::{wire, Outgoing, Transport};
use crate::network::{kind, Peers};
use parking_lot::Mutex;
use sluice_wire::Request;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Messages queued per lane before new ones are dropped.
const LANE_DEPTH: usize = 4096;

/// Messages written to a peer in one go at most.
const WRITE_BATCH: usize = 64;

/// Sends a node's raft-rs messages to its peers.
pub struct PeerTransport {
    peers: Arc<Peers>,
    /// Each node's address (the layout's).
    addresses: HashMap<u64, String>,
    /// Per (peer, bulk), the queue its task drains.
    lanes: Mutex<HashMap<(u64, bool), mpsc::Sender<Request>>>,
}

impl PeerTransport {
    pub fn new(peers: Arc<Peers>, addresses: HashMap<u64, String>) -> Arc<PeerTransport> {
        Arc::new(PeerTransport {
            peers,
            addresses,
            lanes: Mutex::default(),
        })
    }

    /// The queue of a lane, its task started on first use.
    fn lane(&self, to: u64, bulk: bool) -> Option<mpsc::Sender<Request>> {
        let mut lanes = self.lanes.lock();
        if let Some(tx) = lanes.get(&(to, bulk)) {
            return Some(tx.clone());
        }
        let addr = self.addresses.get(&to)?.clone();
        let target = u32::try_from(to).ok()?;
        let (tx, rx) = mpsc::channel(LANE_DEPTH);
        tokio::spawn(pump(self.peers.clone(), target, addr, bulk, rx));
        lanes.insert((to, bulk), tx.clone());
        Some(tx)
    }
}

impl Transport for PeerTransport {
    fn send(&self, out: Outgoing) {
        let mut body = match wire::encode(&out) {
            Ok(b) => b.into_iter(),
            Err(e) => {
                tracing::warn!(group = out.group, to = out.to, error = %e, "raft message not sent");
                return;
            }
        };
        let first = body.next().unwrap_or_default();
        let more: Vec<bytes::Bytes> = body.collect();
        let bytes = first.len() + more.iter().map(bytes::Bytes::len).sum::<usize>();
        let req = Request::Raft {
            from: self.peers.me,
            group: out.group,
            kind: kind::RAFTRS,
            body: first,
            more,
        };
        let Some(lane) = self.lane(out.to, self.peers.is_bulk(bytes)) else {
            tracing::debug!(
                group = out.group,
                to = out.to,
                "raft message for a node the layout does not name"
            );
            return;
        };
        if lane.try_send(req).is_err() {
            tracing::debug!(
                group = out.group,
                to = out.to,
                "peer lane full: raft message dropped"
            );
        }
    }
}

/// Writes a lane's messages as they come, batched.
async fn pump(
    peers: Arc<Peers>,
    target: u32,
    addr: String,
    bulk: bool,
    mut rx: mpsc::Receiver<Request>,
) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while rx.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        if let Err(e) = peers.send_oneway(target, &addr, bulk, &batch).await {
            tracing::debug!(peer = target, bulk, messages = batch.len(), error = %e, "raft messages not sent");
        }
        batch.clear();
    }
}
