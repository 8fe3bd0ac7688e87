//! What a client knows about a cluster: nodes, each shard's members and
//! leader hints, and its session's newest version per shard; plus a pool
//! of connections per node.

use crate::conn::Conn;
use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use serde::Deserialize;
use sluice_types::cluster::{NodeAddr, NodeSpec};
use sluice_types::{PoolType, Result, SluiceError};
use sluice_wire::{Request, Response};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Connections to one node: `n` pipelined connections used round-robin,
/// each reconnected on demand.
pub(crate) struct NodePool {
    /// Looked up at each connection made (a name may move).
    pub(crate) addr: NodeAddr,
    slots: Vec<ArcSwapOption<Conn>>,
    reconnect: tokio::sync::Mutex<()>,
    rr: AtomicUsize,
    name: String,
    connect_timeout: Duration,
    tls: Option<sluice_tls::ClientTls>,
    token: Option<String>,
    part_bytes: usize,
    coalesce: bool,
    keepalive: Duration,
    /// Connections opened for watches once the pooled ones were full of
    /// them; each lives while a watch on it does.
    watch_conns: Mutex<Vec<std::sync::Weak<Conn>>>,
}

/// The address a node's `host:port` stands for now: an IP address as it
/// is, a name looked up (each connection made: a Kubernetes pod that
/// came back at another IP address is found there).
pub async fn resolve(addr: &NodeAddr) -> Result<SocketAddr> {
    if let Some(a) = addr.ip() {
        return Ok(a);
    }
    match tokio::net::lookup_host(addr.as_str()).await {
        // IPv4 first: `localhost` is often ::1 first, and a node given
        // `--listen` with an IPv4 address takes IPv4 only (one named by a
        // host name listens on IPv6 and IPv4 both: `NodeAddr::listen_addr`).
        Ok(found) => {
            let mut found: Vec<SocketAddr> = found.collect();
            found.sort_by_key(|a| !a.is_ipv4());
            found
                .first()
                .copied()
                .ok_or_else(|| SluiceError::Connection {
                    reason: format!("{addr} resolves to no address"),
                })
        }
        Err(e) => Err(SluiceError::Connection {
            reason: format!("looking up {addr}: {e}"),
        }),
    }
}

impl NodePool {
    pub(crate) fn new(addr: NodeAddr, n: usize, cfg: &crate::ClientConfig) -> Self {
        NodePool {
            addr,
            slots: (0..n.max(1)).map(|_| ArcSwapOption::empty()).collect(),
            reconnect: tokio::sync::Mutex::new(()),
            rr: AtomicUsize::new(0),
            name: cfg.client_name.clone(),
            connect_timeout: cfg.connect_timeout,
            tls: cfg.tls.clone(),
            token: cfg.token.clone(),
            part_bytes: cfg.value_part_bytes.unwrap_or(0),
            coalesce: cfg.coalesce_writes,
            keepalive: cfg.watch_keepalive,
            watch_conns: Mutex::new(Vec::new()),
        }
    }

    /// The live connections opened for watches (see `connect_for_watches`).
    pub(crate) fn watch_conns(&self) -> Vec<Arc<Conn>> {
        let mut live = Vec::new();
        self.watch_conns.lock().retain(|w| match w.upgrade() {
            Some(c) if c.is_alive() => {
                live.push(c);
                true
            }
            _ => false,
        });
        live
    }

    /// A new connection for watches beyond what the pooled connections
    /// may hold (a node bounds the watches per connection).
    pub(crate) async fn connect_for_watches(&self) -> Result<Arc<Conn>> {
        let c = self.open().await?;
        self.watch_conns.lock().push(Arc::downgrade(&c));
        Ok(c)
    }

    async fn open(&self) -> Result<Arc<Conn>> {
        let c = Conn::connect_to(
            resolve(&self.addr).await?,
            self.addr.host_name(),
            &self.name,
            self.connect_timeout,
            self.tls.as_ref(),
            self.token.as_deref(),
        )
        .await?;
        self.tune(&c);
        Ok(c)
    }

    /// Sets up a new connection as the client's config says.
    fn tune(&self, c: &Conn) {
        c.set_value_part_bytes(self.part_bytes);
        c.set_coalesce_writes(self.coalesce);
        c.set_watch_keepalive(self.keepalive);
    }

    pub(crate) fn fill(&self, i: usize, c: Arc<Conn>) {
        self.tune(&c);
        self.slots[i].store(Some(c));
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// A live connection, reconnecting a dead slot on demand.
    pub(crate) async fn conn(&self) -> Result<Arc<Conn>> {
        let i = self.rr.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        if let Some(c) = self.slots[i].load_full() {
            if c.is_alive() {
                return Ok(c);
            }
        }
        // Boxed: a connect (handshake, TLS) is a future of kilobytes, and
        // every call's future would otherwise carry its space, to be moved
        // and copied with it on each request.
        Box::pin(self.reconnect(i)).await
    }

    async fn reconnect(&self, i: usize) -> Result<Arc<Conn>> {
        let _g = self.reconnect.lock().await;
        if let Some(c) = self.slots[i].load_full() {
            if c.is_alive() {
                return Ok(c);
            }
        }
        let c = self.open().await?;
        self.slots[i].store(Some(c.clone()));
        Ok(c)
    }

    pub(crate) async fn call(&self, req: &Request, timeout: Duration) -> Result<Response> {
        self.conn().await?.call(req, timeout).await
    }

    /// `call` as one try of a request that may go elsewhere next: `None`
    /// once `bound` passes with nothing moving: no connection within it,
    /// no byte written to the connection or taken by the node for as long
    /// while some are still on their way (`Conn::progress`), or no reply
    /// within about a bound once the node has taken them all. A large value keeps its try while it is being written,
    /// however long that takes: bounded as a whole,
    /// a try cut such a value short (its frame still finished by the
    /// connection) and the next sent it again, each try longer than the
    /// last, and a value of a few seconds' bandwidth took the whole
    /// request timeout. A paused or cut-off node still costs one `bound`:
    /// its socket takes nothing once its buffers are full.
    pub(crate) async fn call_while_moving(
        &self,
        req: &Request,
        bound: Duration,
    ) -> Option<Result<Response>> {
        let conn = match tokio::time::timeout(bound, self.conn()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Some(Err(e)),
            Err(_) => return None,
        };
        // The bound is kept here, from the last progress.
        let call = conn.call(req, Duration::from_secs(24 * 3600));
        tokio::pin!(call);
        let mut seen = conn.progress();
        let mut until = tokio::time::Instant::now() + bound;
        loop {
            tokio::select! {
                r = &mut call => return Some(r),
                _ = tokio::time::sleep_until(until) => {
                    // Bytes still on their way, and moving since the last
                    // look. (A small request is taken by the node's
                    // kernel at once, even from a paused node: one bound,
                    // as before.)
                    let now = conn.progress();
                    let moved = now.0 != seen.0 || now.1 < seen.1;
                    if now.1 == 0 || !moved {
                        return None;
                    }
                    seen = now;
                    until = tokio::time::Instant::now() + bound;
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct ShardInfo {
    members: Vec<u32>,
    leader: Option<u64>,
}

#[derive(Deserialize)]
struct Info {
    epoch: u64,
    nodes: Vec<NodeSpec>,
    shards: HashMap<String, ShardInfo>,
    trigger: Vec<Vec<Vec<u32>>>,
    meta_leader: Option<u64>,
}

/// A shard as the client routes to it.
pub(crate) struct ShardView {
    pub(crate) name: String,
    pub(crate) members: Vec<u32>,
}

/// A snapshot of the cluster as some node described it.
pub(crate) struct ClusterView {
    pub(crate) epoch: u64,
    pub(crate) nodes: HashMap<u32, NodeAddr>,
    /// Every shard (replicated and trigger): its name (`volatile/0/1`)
    /// and members, built once so routing a request allocates nothing.
    shards: HashMap<(PoolType, u32, u32), ShardView>,
    /// Last known leader of each shard (`meta` for the metadata group).
    pub(crate) leaders: Mutex<HashMap<String, u32>>,
    /// The newest version this session has seen per shard: reads never
    /// go back in time.
    pub(crate) seen: Mutex<HashMap<String, u64>>,
}

impl ClusterView {
    pub(crate) fn parse(json: &str) -> Result<ClusterView> {
        let i: Info = serde_json::from_str(json)
            .map_err(|e| SluiceError::protocol(format!("bad cluster info: {e}")))?;
        let mut leaders: HashMap<String, u32> = i
            .shards
            .iter()
            .filter_map(|(k, s)| s.leader.map(|l| (k.clone(), l as u32)))
            .collect();
        if let Some(l) = i.meta_leader {
            leaders.insert("meta".into(), l as u32);
        }
        let mut shards = HashMap::new();
        for (name, info) in i.shards {
            let mut parts = name.split('/');
            let t = match parts.next() {
                Some("volatile") => PoolType::Volatile,
                Some("persistent") => PoolType::Persistent,
                _ => continue,
            };
            let (Some(Ok(g)), Some(Ok(s))) = (
                parts.next().map(str::parse::<u32>),
                parts.next().map(str::parse::<u32>),
            ) else {
                continue;
            };
            shards.insert(
                (t, g, s),
                ShardView {
                    name,
                    members: info.members,
                },
            );
        }
        for (g, sg) in i.trigger.into_iter().enumerate() {
            for (s, members) in sg.into_iter().enumerate() {
                let (g, s) = (g as u32, s as u32);
                let name = format!("{}/{g}/{s}", PoolType::Trigger);
                shards.insert((PoolType::Trigger, g, s), ShardView { name, members });
            }
        }
        Ok(ClusterView {
            epoch: i.epoch,
            nodes: i.nodes.iter().map(|n| (n.id, n.address.clone())).collect(),
            shards,
            leaders: Mutex::new(leaders),
            seen: Mutex::default(),
        })
    }

    /// The shard's name and members (`None`: not in the layout).
    pub(crate) fn shard(&self, t: PoolType, subgroup: u32, shard: u32) -> Option<&ShardView> {
        self.shards.get(&(t, subgroup, shard))
    }

    pub(crate) fn leader(&self, shard: &str) -> Option<u32> {
        self.leaders.lock().get(shard).copied()
    }

    pub(crate) fn set_leader(&self, shard: &str, node: u32) {
        let mut l = self.leaders.lock();
        match l.get_mut(shard) {
            Some(e) => *e = node,
            None => {
                l.insert(shard.to_string(), node);
            }
        }
    }

    pub(crate) fn saw(&self, shard: &str, version: u64) {
        if version == sluice_types::VERSION_NONE {
            return;
        }
        let mut s = self.seen.lock();
        match s.get_mut(shard) {
            Some(e) => *e = (*e).max(version),
            None => {
                s.insert(shard.to_string(), version);
            }
        }
    }

    pub(crate) fn seen(&self, shard: &str) -> Option<u64> {
        self.seen.lock().get(shard).copied()
    }
}

/// Which member each try of one request goes to, and what the replies so
/// far taught: members that failed us (timed out, refused the connection,
/// were unavailable) are not tried again while others remain, and a leader
/// hint that names one of them is believed only after `settle` has passed
/// since it failed. Right after a leader is paused or cut off, the others
/// still name it until their election ends; following that hint straight
/// back would cost a whole (doubled) try against a member that cannot
/// answer. After `settle` the hint is followed: the leader was slow, not
/// gone.
pub(crate) struct Attempts<'a> {
    members: &'a [u32],
    attempt: usize,
    avoid: Option<u32>,
    failed: Vec<(u32, std::time::Instant)>,
    settle: Duration,
    /// A member answered that it has not applied what this client saw:
    /// the shard's leader, which applied every write it acknowledged, is
    /// the member most likely to have (see `behind`).
    to_leader: bool,
}

/// What to do with a leader hint.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hint {
    /// Go to the named leader next.
    Follow(u32),
    /// The hint names a member that failed us moments ago: ask another
    /// member after a pause (an election is probably under way).
    Stale,
}

impl<'a> Attempts<'a> {
    pub(crate) fn new(members: &'a [u32], settle: Duration) -> Self {
        Attempts {
            members,
            attempt: 0,
            avoid: None,
            failed: Vec::new(),
            settle,
            to_leader: false,
        }
    }

    /// How many tries were made.
    pub(crate) fn made(&self) -> usize {
        self.attempt
    }

    fn has_failed(&self, m: u32) -> bool {
        self.failed.iter().any(|(f, _)| *f == m)
    }

    /// The next member to try when no leader is to be followed: round
    /// robin, skipping the ones that failed and the one just tried.
    pub(crate) fn next_member(&self) -> u32 {
        let n = self.members.len();
        (0..n)
            .map(|i| self.members[(self.attempt + i) % n])
            .find(|m| !self.has_failed(*m) && Some(*m) != self.avoid)
            .unwrap_or(self.members[self.attempt % n])
    }

    /// The target of a try that goes to the leader: the cached one unless
    /// it failed or was just tried, else the next member.
    pub(crate) fn leader_target(&self, cached: Option<u32>) -> u32 {
        cached
            .filter(|l| Some(*l) != self.avoid && !self.has_failed(*l))
            .unwrap_or_else(|| self.next_member())
    }

    /// Before choosing a try's target: when every member failed once,
    /// start over rather than give up.
    pub(crate) fn prepare(&mut self) {
        if self.failed.len() >= self.members.len() {
            self.failed.clear();
        }
    }

    /// Counts a try (after choosing its target).
    pub(crate) fn begin(&mut self) {
        self.attempt += 1;
    }

    /// `target` answered with a leader hint naming `leader`.
    pub(crate) fn hinted(&mut self, target: u32, leader: u32, now: std::time::Instant) -> Hint {
        match self.failed.iter().position(|(f, _)| *f == leader) {
            Some(i) if now.saturating_duration_since(self.failed[i].1) < self.settle => {
                self.avoid = Some(target);
                Hint::Stale
            }
            Some(i) => {
                self.failed.swap_remove(i);
                self.avoid = None;
                Hint::Follow(leader)
            }
            None => {
                self.avoid = None;
                Hint::Follow(leader)
            }
        }
    }

    /// `target` cannot serve this (not the leader and no hint, behind, not
    /// a member): try another one next.
    pub(crate) fn skip(&mut self, target: u32) {
        self.avoid = Some(target);
    }

    /// `target` has not applied the newest version this client saw of the
    /// shard (`ReplicaBehind`): a read tries the leader next (followers
    /// learn of a commit after the leader, by a message's way), then the
    /// others.
    pub(crate) fn behind(&mut self, target: u32) {
        self.avoid = Some(target);
        self.to_leader = true;
    }

    /// Whether the next try of a read goes to the leader (`behind`).
    pub(crate) fn read_at_leader(&self) -> bool {
        self.to_leader
    }

    /// `target` failed us (timeout, connection, unavailable).
    pub(crate) fn failed(&mut self, target: u32, now: std::time::Instant) {
        self.avoid = Some(target);
        if !self.has_failed(target) {
            self.failed.push((target, now));
        }
    }

    /// Whether every member has been tried (time to pause for an
    /// election before the next round).
    pub(crate) fn round_done(&self) -> bool {
        self.attempt >= self.members.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The failover defect: a paused leader (1) timed out; member 2, whose
    /// election has not ended, still names 1. The hint must not send the
    /// next try straight back to 1: member 3 is asked instead, and its
    /// hint at the new leader is followed.
    #[test]
    fn a_hint_at_a_member_that_just_failed_is_not_followed() {
        let members = [1, 2, 3];
        let mut a = Attempts::new(&members, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(a.leader_target(Some(1)), 1);
        a.begin();
        a.failed(1, t0);
        assert_eq!(a.leader_target(None), 2);
        a.begin();
        assert_eq!(
            a.hinted(2, 1, t0 + Duration::from_millis(5)),
            Hint::Stale,
            "member 1 timed out 5 ms ago"
        );
        // The cached leader is still 1 elsewhere: not chosen.
        assert_eq!(a.leader_target(Some(1)), 3);
        a.begin();
        assert_eq!(
            a.hinted(3, 3, t0 + Duration::from_millis(10)),
            Hint::Follow(3)
        );
        assert_eq!(a.leader_target(Some(3)), 3);
    }

    /// A leader that was only slow: once `settle` has passed since it
    /// failed, the others' hints at it are followed again.
    #[test]
    fn a_hint_at_a_failed_member_is_followed_after_settle() {
        let members = [1, 2, 3];
        let mut a = Attempts::new(&members, Duration::from_secs(1));
        let t0 = Instant::now();
        a.begin();
        a.failed(1, t0);
        a.begin();
        assert_eq!(
            a.hinted(2, 1, t0 + Duration::from_millis(1001)),
            Hint::Follow(1)
        );
        assert_eq!(a.leader_target(Some(1)), 1);
    }

    /// When every member failed, the list starts over rather than every
    /// try going to the same member.
    #[test]
    fn everyone_failed_starts_over() {
        let members = [1, 2];
        let mut a = Attempts::new(&members, Duration::from_secs(1));
        let t0 = Instant::now();
        a.begin();
        a.failed(1, t0);
        assert_eq!(a.next_member(), 2);
        a.begin();
        a.failed(2, t0);
        assert!(a.round_done());
        a.prepare();
        assert!(a.failed.is_empty());
    }

    /// A read that found member 2 behind goes to the leader (3) next, not
    /// to the next member in turn (1, another follower that may be as far
    /// behind); with no leader known, to the next member.
    #[test]
    fn a_read_that_found_a_member_behind_asks_the_leader_next() {
        let members = [1, 2, 3];
        let mut a = Attempts::new(&members, Duration::from_secs(1));
        a.begin();
        assert!(!a.read_at_leader());
        a.behind(2);
        assert!(a.read_at_leader());
        assert_eq!(a.leader_target(Some(3)), 3);
        assert_ne!(a.leader_target(None), 2, "not the member that was behind");
        // A leader hint at the member that was behind is not followed
        // back to it.
        assert_eq!(a.leader_target(Some(2)), a.next_member());
    }
}

/// `NodePool::call_while_moving` through a proxy that passes the client's
/// bytes on at a set rate (or not at all), to a real node.
#[cfg(test)]
mod moving {
    use super::*;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A node on a free port, and a proxy in front of it passing what the
    /// client sends at `rate` bytes a second (0: nothing once the first
    /// `free` bytes, the handshake, went through); replies pass freely.
    async fn node_behind(rate: u64, free: u64) -> (std::net::SocketAddr, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let node = sluice_server::Server::bind(sluice_server::ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let to = node.local_addr();
        tokio::spawn(node.run(std::future::pending()));
        // A small receive window, as over a slow link: what the proxy has
        // not passed on stays in the client's socket, unacknowledged.
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(32 << 10).unwrap();
        sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let proxy = sock.listen(16).unwrap();
        let at = proxy.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((client, _)) = proxy.accept().await {
                let server = tokio::net::TcpStream::connect(to).await.unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                tokio::spawn(async move {
                    let passed = AtomicU64::new(0);
                    let mut buf = vec![0u8; 16 << 10];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if passed.fetch_add(n as u64, Ordering::Relaxed) >= free {
                            match rate {
                                0 => std::future::pending::<()>().await,
                                r => {
                                    tokio::time::sleep(Duration::from_micros(
                                        n as u64 * 1_000_000 / r,
                                    ))
                                    .await
                                }
                            }
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (at, dir)
    }

    fn put(bytes: usize) -> Request {
        Request::Put {
            key: "/vol/moving".into(),
            shard: None,
            expected: None,
            value: Bytes::from(vec![7u8; bytes]),
            trace: None,
            req_id: None,
        }
    }

    /// 3 MB at 2 MB/s: a second and a half of writing, tries of 400 ms
    /// (room for a busy machine's pauses). The try goes on while bytes
    /// move. (Bounded as a whole, as tries were, it ended after 400 ms,
    /// the value a quarter sent.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_lasts_while_its_request_is_being_written() {
        let (at, _dir) = node_behind(2 << 20, 64 << 10).await;
        let pool = NodePool::new(NodeAddr::from(at), 1, &crate::ClientConfig::default());
        let t0 = std::time::Instant::now();
        let r = pool
            .call_while_moving(&put(3 << 20), Duration::from_millis(400))
            .await;
        assert!(matches!(r, Some(Ok(Response::PutOk(_)))), "{r:?}");
        assert!(
            t0.elapsed() >= Duration::from_millis(1000),
            "{:?}",
            t0.elapsed()
        );
    }

    /// A node whose link takes nothing more (paused, cut off) still ends
    /// the try after one bound without progress.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_whose_request_stops_moving_ends_after_its_bound() {
        let (at, _dir) = node_behind(0, 64 << 10).await;
        let pool = NodePool::new(NodeAddr::from(at), 1, &crate::ClientConfig::default());
        let t0 = std::time::Instant::now();
        let r = pool
            .call_while_moving(&put(32 << 20), Duration::from_millis(200))
            .await;
        assert!(r.is_none(), "{r:?}");
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
}
