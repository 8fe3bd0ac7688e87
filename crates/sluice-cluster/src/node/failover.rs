//! Fast failover after a leader's process died.
//!
//! Raft replaces a leader that stops sending heartbeats only after its
//! followers' election timeout (`election_min_ms` to `election_max_ms`,
//! randomised) has run out: 0.5 to 0.8 s with the default settings.
//! A leader that *crashed* says so sooner: its connections to this node
//! close, and nothing listens at its address any more (a connection to it
//! is refused, or reset before a byte was sent). This module acts on that
//! evidence with raft-rs's own election trigger (`campaign`, through the
//! group's driver), so the protocol stays raft-rs's and only the timing
//! changes:
//!
//! 1. every surviving voter that saw the connection close and the refusal
//!    stands for election at once, which gives up its vote for the dead
//!    leader;
//! 2. each stands again, at a higher term each time, until a leader other
//!    than the dead one is known (or `TAKE_OVER_FOR` passed: then the
//!    ordinary timers decide, as before). The pauses between candidacies
//!    are the project's jittered backoff, staggered by rank, so the
//!    survivors do not keep splitting the vote. Every survivor keeps trying because only
//!    one whose log is the most up to date can win: with only the lowest
//!    numbered one retrying (the first design), a lowest survivor that
//!    was behind kept the others from winning until the timers ran out.
//!
//! Any member found gone this way (a follower too) is also told to the
//! drivers of the groups it is a member of: a leader then counts it as
//! down at once for the lambdas dispatched to one member
//! (`raftrs/down.rs`), rather than after an election timeout of silence.
//!
//! Safety does not depend on any of this: a vote is still granted only to
//! a candidate whose log is at least as up to date, once per term. A leader
//! that is alive but unreachable (a partition, a paused process) keeps its
//! listening socket, so the probe connects and nothing happens here: the
//! timers handle it.

use super::core::Watch;
use super::{ClusterNode, Group};
use sluice_types::retry::Backoff;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first step of a survivor's backoff between candidacies (a few
/// loopback or LAN round trips), and its largest; both are scaled by the
/// survivor's rank (see `take_over`).
const RETRY_AFTER: Duration = Duration::from_millis(10);
const MAX_PERIOD: Duration = Duration::from_millis(100);
/// How long survivors keep standing before the timers decide alone.
const TAKE_OVER_FOR: Duration = Duration::from_secs(2);
/// A connection attempt, or a wait for a probe connection to be reset,
/// that takes longer than this proves nothing (the peer may be alive
/// behind a slow link).
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// What a connection attempt to a peer's address shows: that nothing
/// listens there any more, or (with what happened) that the peer may be
/// alive.
#[derive(Debug, PartialEq)]
pub(super) enum Probe {
    Gone,
    MaybeAlive(String),
}

/// Whether nothing listens at `addr` any more. A refused connection says
/// so; so does one that is reset or closed before we sent a byte, during
/// the handshake or after it: the process died with our connection in its
/// listening socket's queue (a node that lives waits for the client's
/// handshake). A connection that stays open, or an attempt that times
/// out, says the peer may be alive.
pub(super) async fn probe(addr: &sluice_types::cluster::NodeAddr) -> Probe {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    use tokio::io::AsyncReadExt;
    // A name that does not resolve (now) tells nothing for sure: the
    // election timers decide.
    let addr = match sluice_client::resolve(addr).await {
        Ok(a) => a,
        Err(e) => return Probe::MaybeAlive(e.to_string()),
    };
    let mut sock =
        match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(sock)) => sock,
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    ConnectionRefused | ConnectionReset | ConnectionAborted
                ) =>
            {
                return Probe::Gone
            }
            Ok(Err(e)) => return Probe::MaybeAlive(format!("connecting failed: {e}")),
            Err(_) => return Probe::MaybeAlive("connecting timed out".into()),
        };
    let mut byte = [0u8; 1];
    match tokio::time::timeout(PROBE_TIMEOUT, sock.read(&mut byte)).await {
        Ok(Ok(0)) => Probe::Gone,
        Ok(Err(e)) if matches!(e.kind(), ConnectionReset | ConnectionAborted) => Probe::Gone,
        Ok(Err(e)) => Probe::MaybeAlive(format!("reading failed: {e}")),
        Ok(Ok(_)) => Probe::MaybeAlive("it sent a byte".into()),
        Err(_) => Probe::MaybeAlive("the connection stayed open".into()),
    }
}

impl ClusterNode {
    /// A connection with node `peer` (one it opened and authenticated, or
    /// one this node opened to it) closed. If its process is gone, the
    /// groups it is a member of hear so (a leader leaves it out of the
    /// lambdas dispatched to one member: `raftrs/down.rs`), and those it
    /// led, where this node votes, elect a new leader now (see the
    /// module's documentation).
    pub fn peer_connection_lost(self: &Arc<Self>, peer: u32) {
        if !self.settings.fast_failover {
            return;
        }
        let dead = u64::from(peer);
        let me = u64::from(self.id);
        let shared: Vec<Arc<Group>> = self
            .groups
            .read()
            .values()
            .filter(|g| g.core.has_member(dead))
            .cloned()
            .collect();
        let led: Vec<Arc<Group>> = shared
            .iter()
            .filter(|g| g.core.leader() == Some(dead) && g.core.voters().contains(&me))
            .cloned()
            .collect();
        let Some(addr) = self.layout.address_of(peer) else {
            return;
        };
        // Both directions' connections close together: act once.
        if shared.is_empty() || !self.taking_over.lock().insert(peer) {
            return;
        }
        let node = self.clone();
        self.runtime.spawn(async move {
            if let Probe::MaybeAlive(why) = probe(&addr).await {
                if !led.is_empty() {
                    tracing::info!(
                        peer,
                        probe = %why,
                        "a connection with the leader closed, but its process may be alive: the election timers decide"
                    );
                }
                node.taking_over.lock().remove(&peer);
                return;
            }
            for g in &shared {
                g.core.handle.peer_gone(dead);
            }
            if !led.is_empty() {
                tracing::info!(
                    peer,
                    groups = led.len(),
                    "the leader's process is gone (nothing listens at its address): electing a new leader now"
                );
            }
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

/// Whether a leader other than the dead one's old leadership is known:
/// another node, or the dead node itself at a later term (it restarted and
/// won an election).
fn has_new_leader(w: &Watch, dead: u64, term: u64) -> bool {
    let (leader, now) = w.leader_term();
    leader.is_some_and(|l| l != dead || now > term)
}

/// Every survivor stands at once (which gives up its vote for the dead
/// leader), then again until a new leader is known or `TAKE_OVER_FOR`
/// passed. Between candidacies a survivor waits the project's jittered
/// backoff (`retry::Backoff`), its steps scaled by one plus its rank among
/// the survivors: the lowest numbered one usually stands first, and two
/// never keep standing in step (raft-rs's pre-vote keeps a candidacy from
/// raising the term of an election another survivor is winning). Any survivor may
/// have the most up-to-date log, and only that one can win, so every one
/// must keep trying, not just one.
async fn take_over(g: Arc<Group>, dead: u64, me: u64) {
    let rank = g
        .core
        .voters()
        .iter()
        .filter(|v| **v != dead && **v < me)
        .count() as u32;
    let mut watch = g.core.watch();
    let term = watch.leader_term().1;
    let mut backoff = Backoff::new(
        RETRY_AFTER * (1 + rank),
        MAX_PERIOD * (1 + rank),
        Instant::now() + TAKE_OVER_FOR,
    );
    let mut stood = 0;
    loop {
        if has_new_leader(&watch, dead, term) {
            return;
        }
        // Pre-vote keeps the survivors' rounds from disrupting each other.
        if !g.core.elect().await {
            return; // shutting down
        }
        stood += 1;
        let wait = async {
            while !has_new_leader(&watch, dead, term) {
                if !watch.changed().await {
                    return;
                }
            }
        };
        let Some(pause) = backoff.next_pause() else {
            tracing::info!(
                group = %crate::types::group_name(g.id),
                candidacies = stood,
                "no leader after the old one's process died; the election timers decide from here"
            );
            return;
        };
        if tokio::time::timeout(pause, wait).await.is_ok() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// An address nothing listens at: a port bound, then let go.
    fn vacant() -> std::net::SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

    #[tokio::test]
    async fn a_refused_connection_means_the_process_is_gone() {
        assert_eq!(probe(&vacant().into()).await, Probe::Gone);
    }

    /// The probe connects, then its connection is closed before a byte
    /// was sent: with a FIN (`reset == false`) or an RST.
    async fn closed_under_the_probe(reset: bool) -> Probe {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        l.set_nonblocking(true).unwrap();
        let p = tokio::spawn(async move { probe(&addr.into()).await });
        let deadline = Instant::now() + Duration::from_secs(5);
        let accepted = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < deadline => tokio::task::yield_now().await,
                Err(e) => panic!("the probe never connected: {e}"),
            }
        };
        if reset {
            // A zero linger turns the close into an RST, as when a process
            // dies with unread data on the socket.
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: a valid socket and a `linger` of the size passed.
            let rc = unsafe {
                libc::setsockopt(
                    accepted.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&linger as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0);
        }
        drop(accepted);
        drop(l);
        p.await.unwrap()
    }

    #[tokio::test]
    async fn a_connection_closed_or_reset_before_a_byte_means_the_process_is_gone() {
        assert_eq!(closed_under_the_probe(false).await, Probe::Gone);
        assert_eq!(closed_under_the_probe(true).await, Probe::Gone);
    }

    /// A live node accepts and waits for the client's handshake: the probe
    /// must not take that for a dead one.
    #[tokio::test]
    async fn a_connection_that_stays_open_means_the_peer_may_be_alive() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let hold = tokio::spawn(async move { l.accept().await.unwrap() });
        let r = probe(&addr.into()).await;
        assert!(
            matches!(r, Probe::MaybeAlive(ref why) if why.contains("stayed open")),
            "{r:?}"
        );
        drop(hold);
    }

    #[tokio::test]
    async fn a_peer_that_answers_may_be_alive() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let talk = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.write_all(b"x").await.unwrap();
            s
        });
        let r = probe(&addr.into()).await;
        assert!(
            matches!(r, Probe::MaybeAlive(ref why) if why.contains("byte")),
            "{r:?}"
        );
        drop(talk.await.unwrap());
    }
}
