//! Fast failover after a leader's process died.
//!
//! openraft replaces a leader that stops sending heartbeats only after
//! its followers' leader lease (`election_max_ms`) and then a random
//! election timeout have run out: 0.5 to 0.8 s with the default settings.
//! A leader that *crashed* says so sooner: its connections to this node
//! close, and nothing listens at its address any more (a connection to it
//! is refused, or reset before a byte was sent). This module acts on that
//! evidence with openraft's own election trigger (`Raft::trigger().elect(false)`),
//! so the protocol stays openraft's and only the timing changes:
//!
//! 1. every surviving voter that saw the connection close and the refusal
//!    stands for election once, which gives up its vote for the dead leader
//!    (a vote for itself is not a leader's lease, so it no longer refuses
//!    other candidates);
//! 2. the lowest numbered survivor stands again, at a higher term each
//!    time, until a leader other than the dead one is known (or a few tries
//!    passed: then the ordinary timers decide, as before).
//!
//! Safety does not depend on any of this: a vote is still granted only to
//! a candidate whose log is at least as up to date, once per term. A leader
//! that is alive but unreachable (a partition, a paused process) keeps its
//! listening socket, so the probe connects and nothing happens here: the
//! timers handle it.

use super::{ClusterNode, Group, TypeConfig};
use openraft::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::time::Duration;

/// How long the lowest numbered survivor waits for a leader after each
/// candidacy before it stands again (a few loopback or LAN round trips).
const RETRY_AFTER: Duration = Duration::from_millis(10);
/// Candidacies of the lowest numbered survivor before the timers take over.
const TRIES: usize = 10;
/// A connection attempt, or a wait for a probe connection to be reset,
/// that takes longer than this proves nothing (the peer may be alive
/// behind a slow link).
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Whether nothing listens at `addr` any more. A refused connection says
/// so; so does one that opens and is then reset or closed before we sent
/// a byte: the process died with our connection still in its listening
/// socket's queue (a node that lives waits for the client's handshake).
/// A connection that stays open, or an attempt that times out, says the
/// peer may be alive.
async fn process_gone(addr: std::net::SocketAddr) -> bool {
    use tokio::io::AsyncReadExt;
    let mut sock =
        match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(sock)) => sock,
            Ok(Err(e)) => return e.kind() == std::io::ErrorKind::ConnectionRefused,
            Err(_) => return false,
        };
    let mut byte = [0u8; 1];
    match tokio::time::timeout(PROBE_TIMEOUT, sock.read(&mut byte)).await {
        Ok(Ok(0)) => true,
        Ok(Err(e)) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
        ),
        _ => false,
    }
}

impl ClusterNode {
    /// A connection with node `peer` (one it opened and authenticated, or
    /// one this node opened to it) closed. If `peer` led groups this node
    /// votes in and its process is gone, those groups elect a new leader
    /// now (see the module's documentation).
    pub fn peer_connection_lost(self: &Arc<Self>, peer: u32) {
        if !self.settings.fast_failover {
            return;
        }
        let dead = u64::from(peer);
        let me = u64::from(self.id);
        let led: Vec<Arc<Group>> = self
            .groups
            .read()
            .values()
            .filter(|g| {
                let m = g.metrics.borrow_watched();
                m.current_leader == Some(dead)
                    && m.membership_config
                        .membership()
                        .voter_ids()
                        .any(|v| v == me)
            })
            .cloned()
            .collect();
        let Some(addr) = self.layout.address_of(peer) else {
            return;
        };
        // Both directions' connections close together: act once.
        if led.is_empty() || !self.taking_over.lock().insert(peer) {
            return;
        }
        let node = self.clone();
        self.runtime.spawn(async move {
            if !process_gone(addr).await {
                node.taking_over.lock().remove(&peer);
                return;
            }
            tracing::info!(
                peer,
                groups = led.len(),
                "the leader's process is gone (nothing listens at its address): electing a new leader now"
            );
            let tasks: Vec<_> = led
                .into_iter()
                .map(|g| tokio::spawn(take_over(g, dead, me)))
                .collect();
            for t in tasks {
                let _ = t.await;
            }
            node.taking_over.lock().remove(&peer);
        });
    }
}

/// Step 1 for every survivor, step 2 for the lowest numbered one.
async fn take_over(g: Arc<Group>, dead: u64, me: u64) {
    let lowest = g
        .metrics
        .borrow_watched()
        .membership_config
        .membership()
        .voter_ids()
        .filter(|v| *v != dead)
        .min();
    let mut metrics = g.metrics.clone();
    let has_new_leader =
        |m: &openraft::RaftMetrics<TypeConfig>| m.current_leader.is_some_and(|l| l != dead);
    let tries = if lowest == Some(me) { TRIES } else { 1 };
    for _ in 0..tries {
        if has_new_leader(&metrics.borrow_watched()) {
            return;
        }
        if g.raft.trigger().elect(false).await.is_err() {
            return; // shutting down
        }
        let wait = async {
            while !has_new_leader(&metrics.borrow_watched()) {
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(RETRY_AFTER, wait).await;
    }
}
