use crate::cluster::{Attempts, ClusterView, Hint, NodePool, ShardView};
use crate::conn::Conn;
use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use sluice_types::cluster::NodeAddr;
use sluice_types::cluster::{MemberSelection, Selector};
use sluice_types::retry::{follow_leader, Step};
use sluice_types::{
    validate_key, Object, PoolMeta, PoolRouter, PoolSpec, PoolTable, PutResult, Result,
    SluiceError, Trace,
};
use sluice_types::{PoolType, ReqId};
use sluice_wire::{DeliveryKindWire, Request, Response, ServerInfo, WireObject};
use std::collections::{BTreeMap, HashMap};
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How a client connects.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port` of a Sluice node, or several comma-separated (seeds:
    /// the first that answers is used; in a cluster any one will do, the
    /// client learns the others from it).
    pub addr: String,
    /// Connections kept open to the node; requests are spread across them.
    pub connections: usize,
    /// How long one TCP (and TLS) connect with its handshake may take
    /// (default 3 s).
    pub connect_timeout: Duration,
    /// How long a request may wait for its reply.
    pub request_timeout: Duration,
    /// In a cluster, how long one try at one member may go without
    /// progress (connect and handshake included) before the request moves
    /// on to another member: a paused or cut-off leader costs one try, not
    /// the whole request. A large value keeps its try while its bytes are
    /// still being taken by the node, however long that takes; the reply
    /// then has about this long.
    pub attempt_timeout: Duration,
    /// Sent in the handshake; shows in server logs.
    pub client_name: String,
    /// Which member of a replicated shard serves reads (cluster only;
    /// writes always go to the shard's leader).
    pub member_selection: MemberSelection,
    /// TLS to the nodes (a node with `[tls]` accepts nothing else): the CA
    /// to trust, and a client certificate where nodes require one.
    pub tls: Option<sluice_tls::ClientTls>,
    /// A bearer token (`sluice auth create`): the principal this client
    /// acts as where nodes enforce policies.
    pub token: Option<String>,
    /// Send values larger than this in parts of this size, so small
    /// requests on the same connection go out between the parts instead of
    /// queueing behind the whole value (QoS; README: Security). Costs the
    /// node one copy of such values. `None` (the default): whole.
    pub value_part_bytes: Option<usize>,
    /// Requests started together go out in one write per connection
    /// (`Conn::set_coalesce_writes`): for a client whose requests start in
    /// bursts on a single-threaded runtime. Off by default.
    pub coalesce_writes: bool,
    /// A connection with watches open that has read nothing for this long
    /// asks the node for a ping, and is given up (its watches end with a
    /// `Connection` error saying why) when nothing comes for as long
    /// again: a node paused, hung or cut off without its connections
    /// closing would otherwise leave a watch waiting forever. Zero: never.
    /// Default 5 s.
    pub watch_keepalive: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            addr: format!("127.0.0.1:{}", 7420),
            connections: 1,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(1),
            client_name: "sluice-client".into(),
            member_selection: MemberSelection::RoundRobin,
            tls: None,
            token: None,
            value_part_bytes: None,
            coalesce_writes: false,
            watch_keepalive: Duration::from_secs(5),
        }
    }
}

/// A watch notification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// What happened: a put, a trigger put, a remove, a lambda's notify,
    /// or `Lagged` (see `object`).
    pub kind: DeliveryKindWire,
    /// For `Lagged`, `object.meta.version` counts the notifications lost
    /// because this watcher fell behind, and the value is JSON: `dropped`,
    /// `where` (`server`: its queue for this connection was full, with
    /// `first_version`, `last_version`, `first_timestamp_us`,
    /// `last_timestamp_us` of what was lost; `client`: this side's buffer
    /// was full).
    pub object: Object,
}

/// A stream of notifications for keys under a prefix. Dropping it (or
/// calling [`Watch::cancel`]) ends the subscription.
pub struct Watch {
    pub(crate) rx: mpsc::Receiver<Response>,
    pub(crate) id: u64,
    pub(crate) conn: Arc<Conn>,
    pub(crate) dropped: Arc<AtomicU64>,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    /// Runtime to send the unwatch from when the watch is dropped.
    pub(crate) handle: tokio::runtime::Handle,
    pub(crate) cancelled: bool,
}

impl Watch {
    /// The next notification; `None` when the connection closed.
    pub async fn next(&mut self) -> Option<Notification> {
        loop {
            // Notices this side's buffer had no room for are reported
            // before the next one: no loss goes unannounced.
            let lost = self.dropped.swap(0, Ordering::AcqRel);
            if lost > 0 {
                return Some(Notification {
                    kind: DeliveryKindWire::Lagged,
                    object: Object {
                        key: Arc::from(self.prefix.as_str()),
                        meta: sluice_types::ObjectMeta {
                            version: lost,
                            timestamp_us: 0,
                            previous_version: sluice_types::VERSION_NONE,
                            previous_version_by_key: sluice_types::VERSION_NONE,
                            tombstone: false,
                        },
                        value: Bytes::from(format!(r#"{{"dropped":{lost},"where":"client"}}"#)),
                        trace: None,
                    },
                });
            }
            match self.rx.recv().await? {
                Response::Notify { kind, object } => {
                    return Some(Notification {
                        kind,
                        object: to_object(object),
                    })
                }
                _ => continue, // the WATCH_OK reply
            }
        }
    }

    /// Why the watch ended, once `next` returned `None`: `Some` when its
    /// connection was lost (the node died, or the link), `None` when it
    /// was cancelled or is still open.
    pub fn lost(&self) -> Option<SluiceError> {
        if self.cancelled || self.conn.is_alive() {
            return None;
        }
        let why = match self.conn.dead_error() {
            SluiceError::Connection { reason } => reason,
            other => other.to_string(),
        };
        Some(SluiceError::Connection {
            reason: format!(
                "the watch on {:?} ended: {why}; watch again through another node (a persistent \
                 pool's watch can start from the last version seen, missing nothing)",
                self.prefix
            ),
        })
    }

    /// Notifications dropped on this side because they were not read fast
    /// enough and not yet reported by `next` (as a `Lagged` notification).
    pub fn dropped_locally(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Ends the subscription on the server.
    pub async fn cancel(mut self) -> Result<()> {
        self.cancelled = true;
        self.conn.close_stream(self.id);
        self.conn
            .call(&Request::Unwatch { watch_id: self.id }, self.timeout)
            .await
            .map(|_| ())
    }
}

impl Drop for Watch {
    /// Dropping a watch also ends it on the server, so the node stops
    /// pushing (possibly large) notifications nobody reads.
    fn drop(&mut self) {
        self.conn.close_stream(self.id);
        if !self.cancelled {
            let conn = self.conn.clone();
            let id = self.id;
            self.handle.spawn(async move {
                let _ = conn.send_forget(&Request::Unwatch { watch_id: id }).await;
            });
        }
    }
}

struct PoolCache {
    table: PoolTable,
    routers: HashMap<String, PoolRouter>,
}

struct Inner {
    cfg: ClientConfig,
    /// The node the client was pointed at.
    home: NodePool,
    pools: ArcSwap<PoolCache>,
    info: ServerInfo,
    /// Set when the node is part of a cluster.
    cluster: ArcSwapOption<ClusterView>,
    /// Connections to the other nodes of the cluster, by node id.
    nodes: parking_lot::Mutex<HashMap<u32, Arc<NodePool>>>,
    selector: Selector,
    /// Random per client: with `seq`, makes every write's request id.
    client_id: u64,
    seq: AtomicU64,
}

/// What a request does, which decides the member it goes to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    /// Puts and removes: the shard's leader.
    Write,
    /// Reads: any member, by the member selection policy.
    Read,
    /// Linearizable reads: the leader.
    Leader,
}

/// An async Sluice client. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// Whether a seed address names its port: `host:port`, `[v6]:port`; a
/// bare host (`10.0.0.5`, `node-1`, `[::1]`) gets the default port, as
/// redis-cli's `-h` alone does.
fn has_port(seed: &str) -> bool {
    match seed.strip_prefix('[') {
        Some(v6) => v6.contains("]:"),
        None => seed.contains(':') && seed.matches(':').count() == 1,
    }
}

/// `seed` (a host without a port) with the default port.
fn with_default_port(seed: &str) -> String {
    let port = sluice_types::DEFAULT_PORT;
    match seed.contains(':') && !seed.starts_with('[') {
        true => format!("[{seed}]:{port}"), // a bare IPv6 address
        false => format!("{seed}:{port}"),
    }
}

/// Connects to the first of the config's seed addresses (`addr` is one
/// `host:port` or several, comma-separated, like etcdctl's `--endpoints`)
/// that answers; the cluster view learned from it names every other node.
async fn connect_seed(cfg: &ClientConfig) -> Result<(NodeAddr, Arc<Conn>)> {
    let seeds: Vec<&str> = cfg
        .addr
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if seeds.is_empty() {
        return Err(SluiceError::Connection {
            reason: format!("no address in {:?}", cfg.addr),
        });
    }
    for (t, what) in [
        (cfg.request_timeout, "request timeout"),
        (cfg.connect_timeout, "connect timeout"),
    ] {
        if t.is_zero() {
            return Err(SluiceError::invalid_argument(
                "client config",
                format!("a {what} of 0 ends every attempt at once: give more than 0"),
            ));
        }
    }
    let mut failures = Vec::new();
    for seed in &seeds {
        let with_port;
        let seed: &str = match has_port(seed) {
            true => seed,
            false => {
                with_port = with_default_port(seed);
                &with_port
            }
        };
        let addr = match seed.to_socket_addrs().map(|mut a| a.next()) {
            Ok(Some(a)) => a,
            Ok(None) => {
                failures.push(format!("{seed}: resolves to nothing"));
                continue;
            }
            Err(e) => {
                failures.push(format!("{seed}: bad address: {e}"));
                continue;
            }
        };
        // Reconnects look a name up again; TLS checks the name.
        let named: NodeAddr = seed.parse().unwrap_or_else(|_| addr.into());
        match Conn::connect_to(
            addr,
            named.host_name(),
            &cfg.client_name,
            cfg.connect_timeout,
            cfg.tls.as_ref(),
            cfg.token.as_deref(),
        )
        .await
        {
            Ok(c) => return Ok((named, c)),
            // A node that answered and refused who we are speaks for the
            // cluster (a node that does not know a token checks with the
            // metadata leader before it refuses one).
            Err(e) if seeds.len() == 1 || matches!(e, SluiceError::Unauthenticated { .. }) => {
                return Err(e)
            }
            Err(e) => failures.push(format!("{seed}: {e}")),
        }
    }
    Err(SluiceError::Connection {
        reason: format!(
            "cannot reach any of the {} seed addresses ({}); is a node running? start one with sluice serve",
            seeds.len(),
            failures.join("; ")
        ),
    })
}

fn new_trace(id: u64) -> Trace {
    Trace {
        id,
        client_sent_us: sluice_types::wall_us(),
        hops: Vec::new(),
        emit_depth: 0,
    }
}

fn to_object(o: WireObject) -> Object {
    Object {
        key: Arc::from(o.key),
        meta: o.meta,
        value: o.value,
        trace: o.trace.map(Arc::new),
    }
}

/// The error of a request that found no leader (or no member able to
/// answer) before its deadline: each member's last answer, and what it
/// takes.
fn no_leader_in_time(
    shard: &str,
    members: &[u32],
    timeout: Duration,
    answers: &BTreeMap<u32, String>,
) -> SluiceError {
    let said: Vec<String> = members
        .iter()
        .map(|m| match answers.get(m) {
            Some(a) => format!("node {m}: {a}"),
            None => format!("node {m}: not tried"),
        })
        .collect();
    let majority = members.len() / 2 + 1;
    let reason = format!(
        "shard {shard} served no request within {} ms: {}. Writes and reads at the leader need a \
         leader, which needs {majority} of its {} members up and connected",
        timeout.as_millis(),
        said.join("; "),
        members.len()
    );
    SluiceError::Unavailable { reason }
}

fn fnv(s: &str) -> u64 {
    sluice_types::fnv1a64(s.as_bytes())
}

fn unexpected(r: Response) -> SluiceError {
    SluiceError::protocol(format!("unexpected reply {r:?}"))
}

impl Client {
    /// Connects to `addr` (`host:port`) with default settings.
    pub async fn connect(addr: &str) -> Result<Client> {
        Self::connect_with(ClientConfig {
            addr: addr.to_string(),
            ..Default::default()
        })
        .await
    }

    /// Connects with these settings: to the first seed of `cfg.addr` that
    /// answers, then (in a cluster) learns the members and their shards.
    pub async fn connect_with(cfg: ClientConfig) -> Result<Client> {
        let (addr, first) = connect_seed(&cfg).await?;
        let n = cfg.connections.max(1);
        let home = NodePool::new(addr.clone(), n, &cfg);
        let info = first.info.clone();
        home.fill(0, first);
        for i in 1..home.len() {
            home.fill(
                i,
                Conn::connect_to(
                    crate::cluster::resolve(&addr).await?,
                    addr.host_name(),
                    &cfg.client_name,
                    cfg.connect_timeout,
                    cfg.tls.as_ref(),
                    cfg.token.as_deref(),
                )
                .await?,
            );
        }
        // Deduplication of retried writes relies on client ids never
        // colliding, which a clock and a pid do not promise.
        let client_id = sluice_types::random_u64();
        let client = Client {
            inner: Arc::new(Inner {
                cfg,
                home,
                pools: ArcSwap::from_pointee(PoolCache {
                    table: PoolTable::default(),
                    routers: HashMap::new(),
                }),
                info,
                cluster: ArcSwapOption::empty(),
                nodes: Default::default(),
                selector: Selector::new(client_id),
                client_id,
                seq: AtomicU64::new(1),
            }),
        };
        client.refresh_cluster().await?;
        client.refresh_pools().await?;
        Ok(client)
    }

    /// Reloads the cluster description (members, leaders) from the home
    /// node (another when it cannot be reached); a single node has none.
    pub async fn refresh_cluster(&self) -> Result<()> {
        let cmd = Request::Cluster {
            command: r#"{"op":"info"}"#.into(),
        };
        match self.any_node_call(&cmd, false).await {
            Ok(Response::Json(s)) => {
                let view = ClusterView::parse(&s)?;
                if let Some(old) = self.inner.cluster.load_full() {
                    // The session's monotonic-read floor survives a refresh.
                    *view.seen.lock() = old.seen.lock().clone();
                }
                self.inner.cluster.store(Some(Arc::new(view)));
                Ok(())
            }
            Ok(other) => Err(unexpected(other)),
            Err(SluiceError::NotSupported { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether the node is part of a cluster, and its metadata epoch.
    pub fn cluster_epoch(&self) -> Option<u64> {
        self.inner.cluster.load().as_ref().map(|c| c.epoch)
    }

    /// Runs a cluster administration command (JSON `{"op": ...}`: `status`,
    /// `info`, `add_member`, `remove_member`, `cut`, `heal`) on the home
    /// node, or on `node` when given. Membership changes go to the
    /// shard's leader, following leader hints.
    pub async fn cluster_command(
        &self,
        command: serde_json::Value,
        node: Option<u32>,
    ) -> Result<serde_json::Value> {
        let req = Request::Cluster {
            command: command.to_string(),
        };
        let deadline = Instant::now() + self.inner.cfg.request_timeout;
        // A membership change sent to a node outside the shard: the
        // answer names the members, asked in turn (as hints).
        let r = follow_leader(deadline, |hint| {
            let target = hint.or(node);
            let req = &req;
            async move {
                let r = self.call_at(target, req).await;
                // Only a command for no particular node follows hints.
                let step = match &r {
                    _ if node.is_some() => Step::Done,
                    Err(SluiceError::NotLeader {
                        leader: Some(l), ..
                    }) => Step::Follow(*l),
                    Err(SluiceError::NotMember { members, .. }) if !members.is_empty() => {
                        let next = target
                            .and_then(|t| members.iter().position(|m| *m == t))
                            .map_or(0, |i| i + 1);
                        Step::Follow(members[next % members.len()])
                    }
                    // A leader named by a member that has not yet seen it
                    // die (a membership change of a dead member's shard):
                    // once an election has had time, ask again.
                    Err(SluiceError::NotLeader { .. }) => Step::Pause,
                    Err(SluiceError::Connection { .. }) if target != node => Step::Pause,
                    _ => Step::Done,
                };
                (r, step)
            }
        })
        .await;
        match r? {
            Response::Json(s) => {
                serde_json::from_str(&s).map_err(|e| SluiceError::protocol(e.to_string()))
            }
            other => Err(unexpected(other)),
        }
    }

    fn node_pool(&self, node: u32) -> Result<Arc<NodePool>> {
        if let Some(p) = self.inner.nodes.lock().get(&node) {
            return Ok(p.clone());
        }
        let view = self.inner.cluster.load_full();
        let addr = view
            .as_ref()
            .and_then(|v| v.nodes.get(&node).cloned())
            .ok_or_else(|| SluiceError::Connection {
                reason: format!("node {node} is not in the cluster layout"),
            })?;
        let cfg = &self.inner.cfg;
        let pool = Arc::new(NodePool::new(addr, cfg.connections, cfg));
        self.inner.nodes.lock().insert(node, pool.clone());
        Ok(pool)
    }

    fn next_req_id(&self) -> Option<ReqId> {
        self.inner.cluster.load().as_ref()?;
        Some(ReqId {
            client: self.inner.client_id,
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Sends `req` for shard `shard` of a pool to the right member of a
    /// cluster: the leader for writes (following leader hints), a member
    /// by the selection policy for reads; retries on another member while
    /// a shard elects a leader or a member is down, until the request
    /// timeout. Writes carry a request id, so a retry applies once.
    async fn cluster_call(
        &self,
        view: &ClusterView,
        (t, subgroup, shard): (PoolType, u32, u32),
        key: &str,
        class: Class,
        req: &Request,
    ) -> Result<Response> {
        let Some(ShardView { name, members }) = view
            .shard(t, subgroup, shard)
            .filter(|s| !s.members.is_empty())
        else {
            return Err(SluiceError::UnknownShard {
                subgroup: format!("{t}/{subgroup}"),
                shard,
            });
        };
        let replicated = t != PoolType::Trigger;
        let class = if replicated { class } else { Class::Read };
        // Only a get changes: it carries the session's floor for the shard.
        let patched;
        let req = match (req, view.seen(name)) {
            (Request::Get { .. }, Some(seen)) => {
                let mut r = req.clone();
                if let Request::Get { min_version, .. } = &mut r {
                    *min_version = Some(seen);
                }
                patched = r;
                &patched
            }
            _ => req,
        };
        let deadline = Instant::now() + self.inner.cfg.request_timeout;
        // What the tries so far taught (see `Attempts`: a leader hint at a
        // member that failed us is believed again once an election would
        // have ended), and how many timed out. Never locked across an
        // await.
        let state =
            parking_lot::Mutex::new((Attempts::new(members, self.inner.cfg.attempt_timeout), 0u32));
        let state = &state;
        // What each member last answered, for the error when no try
        // reached a leader before the deadline.
        let answers = parking_lot::Mutex::new(BTreeMap::<u32, String>::new());
        let answers = &answers;
        let res = follow_leader(deadline, |_| {
            let (target, per_try) = {
                let (tries, timeouts) = &mut *state.lock();
                tries.prepare();
                let target = match class {
                    Class::Write | Class::Leader => Ok(tries.leader_target(view.leader(name))),
                    Class::Read if tries.made() == 0 => self
                        .inner
                        .selector
                        .select(self.inner.cfg.member_selection, members, fnv(name), key)
                        .map_err(|reason| SluiceError::Connection { reason }),
                    Class::Read if tries.read_at_leader() => {
                        Ok(tries.leader_target(view.leader(name)))
                    }
                    Class::Read => Ok(tries.next_member()),
                };
                tries.begin();
                let left = deadline.saturating_duration_since(Instant::now());
                // Writes and leader reads bound each try (a paused or
                // cut-off leader costs one try, not the request); each
                // timeout gives the next try longer, so a slow but healthy
                // leader (a large value, a busy disk) still gets its answer
                // through. Stable reads may wait by design (time reads,
                // catch-up): no bound.
                let per_try = match class {
                    Class::Write | Class::Leader => {
                        left.min(self.inner.cfg.attempt_timeout * (1 + *timeouts))
                    }
                    Class::Read => left,
                }
                .max(Duration::from_millis(1));
                (target, per_try)
            };
            async move {
                let target = match target {
                    Ok(t) => t,
                    Err(e) => return (Err((e, false)), Step::Done),
                };
                let res = match self.node_pool(target) {
                    Ok(p) => match p.call_while_moving(req, per_try).await {
                        Some(r) => r,
                        None => Err(SluiceError::Timeout {
                            what: format!("request to node {target}"),
                            after_ms: per_try.as_millis() as u64,
                        }),
                    },
                    Err(e) => Err(e),
                };
                if let Err(e) = &res {
                    answers.lock().insert(target, e.to_string());
                }
                let (tries, timeouts) = &mut *state.lock();
                let mut stale = false;
                let retry = match &res {
                    Ok(Response::PutOk(p)) => {
                        view.saw(name, p.version);
                        // Only the leader commits a write: remember it
                        // (a read that finds a follower behind goes there).
                        if class == Class::Write && view.leader(name) != Some(target) {
                            view.set_leader(name, target);
                        }
                        false
                    }
                    Ok(Response::Object(o)) => {
                        view.saw(name, o.meta.version);
                        false
                    }
                    Err(SluiceError::NotLeader {
                        leader: Some(l), ..
                    }) => {
                        match tries.hinted(target, *l, Instant::now()) {
                            Hint::Follow(l) => view.set_leader(name, l),
                            Hint::Stale => {
                                view.leaders.lock().remove(name);
                                stale = true;
                            }
                        }
                        true
                    }
                    Err(SluiceError::NotLeader { .. }) => {
                        tries.skip(target);
                        view.leaders.lock().remove(name);
                        true
                    }
                    Err(SluiceError::Connection { .. }) | Err(SluiceError::Timeout { .. }) => {
                        *timeouts += u32::from(matches!(res, Err(SluiceError::Timeout { .. })));
                        tries.failed(target, Instant::now());
                        view.leaders.lock().remove(name);
                        true
                    }
                    // The shard may have lost its majority here, or this
                    // member stopped its group: try the others (their hints
                    // lead to a new leader) rather than this one again.
                    Err(SluiceError::Unavailable { .. }) if replicated => {
                        tries.failed(target, Instant::now());
                        view.leaders.lock().remove(name);
                        true
                    }
                    // The member names other members than we know: our
                    // view is stale, so the caller learns the membership
                    // and tries again (asking the members we know until
                    // the timeout would never reach the new ones).
                    Err(SluiceError::NotMember {
                        members: theirs, ..
                    }) if !theirs.is_empty() && !same_members(theirs, members) => false,
                    Err(SluiceError::ReplicaBehind { .. }) => {
                        tries.behind(target);
                        true
                    }
                    Err(SluiceError::NotMember { .. }) => {
                        tries.skip(target);
                        true
                    }
                    _ => false,
                };
                let step = match retry {
                    false => Step::Done,
                    // Every member tried, or one named a leader that just
                    // failed us: give an election time to finish.
                    true if tries.round_done() || stale => Step::Pause,
                    true => Step::Again,
                };
                (res.map_err(|e| (e, retry)), step)
            }
        })
        .await;
        match res {
            Ok(r) => Ok(r),
            // Out of time, every try sent elsewhere: say what each member
            // answered, not only the last one ("cannot connect to node 2"
            // when the shard has lost its majority).
            Err((_, true)) if answers.lock().len() > 1 => Err(no_leader_in_time(
                name,
                members,
                self.inner.cfg.request_timeout,
                &answers.lock(),
            )),
            Err((e, _)) => Err(e),
        }
    }

    /// What the server announced at connect (limits, layout version).
    pub fn server_info(&self) -> &ServerInfo {
        &self.inner.info
    }

    /// A live connection to the home node.
    async fn conn(&self) -> Result<Arc<Conn>> {
        self.inner.home.conn().await
    }

    /// `req` sent to `node`, or to the home node.
    async fn call_at(&self, node: Option<u32>, req: &Request) -> Result<Response> {
        match node {
            Some(n) => {
                self.node_pool(n)?
                    .call(req, self.inner.cfg.request_timeout)
                    .await
            }
            None => self.call(req).await,
        }
    }

    async fn call(&self, req: &Request) -> Result<Response> {
        self.inner
            .home
            .call(req, self.inner.cfg.request_timeout)
            .await
    }

    /// A request any node answers (the pool table, the cluster's
    /// description): standalone, the node; in a cluster the metadata
    /// leader first when `leader_first` and one is known (it has every
    /// committed change), else the home node, and while those cannot be
    /// reached each other node in turn (each try bounded by
    /// `attempt_timeout`), so one node down, the home node or the leader
    /// that just died, does not fail it. An answer, an error included
    /// (`NoPool`), is final.
    async fn any_node_call(&self, req: &Request, leader_first: bool) -> Result<Response> {
        let Some(view) = self.inner.cluster.load_full() else {
            return self.call(req).await;
        };
        let unreachable = |r: &Result<Response>| {
            matches!(
                r,
                Err(SluiceError::Connection { .. }
                    | SluiceError::Timeout { .. }
                    | SluiceError::Unavailable { .. }
                    | SluiceError::TooManyConnections { .. })
            )
        };
        let per_try = self.inner.cfg.attempt_timeout;
        let home = self.inner.info.node_id;
        let leader = view.leader("meta").filter(|l| leader_first && *l != home);
        let mut others: Vec<u32> = view.nodes.keys().copied().collect();
        others.sort_unstable();
        others.retain(|n| *n != home && Some(*n) != leader);
        // Each node once, in that order (`None`: the home node).
        let order = leader
            .map(Some)
            .into_iter()
            .chain([None])
            .chain(others.into_iter().map(Some));
        let mut got = Err(SluiceError::Connection {
            reason: "no node to ask".into(),
        });
        for node in order {
            got = match node {
                None => self.inner.home.call(req, per_try).await,
                Some(n) => match self.node_pool(n) {
                    Ok(p) => p.call(req, per_try).await,
                    Err(e) => Err(e),
                },
            };
            if !unreachable(&got) {
                break;
            }
        }
        got
    }

    /// Reloads the cached pool table from the server (in a cluster, from
    /// the metadata leader when known: it has every committed change;
    /// else, or when it does not answer, from the home node, then from
    /// each other node in turn, so one node down does not fail it).
    pub async fn refresh_pools(&self) -> Result<()> {
        let req = Request::PoolList {
            include_deleted: true,
        };
        let reply = self.any_node_call(&req, true).await?;
        let pools = match reply {
            Response::Pools(p) => p,
            other => return Err(unexpected(other)),
        };
        let mut table = PoolTable::default();
        let mut routers = HashMap::new();
        for p in pools {
            routers.insert(p.pathname.clone(), PoolRouter::new(p.clone()));
            table.pools.insert(p.pathname.clone(), p);
        }
        self.inner
            .pools
            .store(Arc::new(PoolCache { table, routers }));
        Ok(())
    }

    /// (pool type, subgroup, shard) of `key` according to the cached pool
    /// table; refreshes the cache once when the key's pool is unknown or
    /// deleted.
    async fn route_full(&self, key: &str) -> Result<(PoolType, u32, u32)> {
        validate_key(key, self.inner.info.limits.max_key_bytes as usize)?;
        for attempt in 0..2 {
            let cache = self.inner.pools.load();
            match cache.table.live_pool_of(key) {
                Ok(p) => {
                    return Ok((
                        p.pool_type,
                        p.subgroup_index,
                        cache.routers[&p.pathname].shard_of(key),
                    ))
                }
                Err(e @ SluiceError::NoPool { .. }) if attempt == 1 => {
                    drop(cache);
                    return Box::pin(self.route_by_asking(key, e)).await;
                }
                Err(e) if attempt == 1 => return Err(e),
                Err(_) => {
                    drop(cache);
                    // Boxed, as every rare path on the way of a request:
                    // the request's future then stays small (see
                    // `NodePool::conn`).
                    Box::pin(self.refresh_pools()).await?;
                }
            }
        }
        unreachable!("the loop returns on its second pass")
    }

    /// In a cluster, a key whose pool the refreshed table still lacks:
    /// that table may come from a node that had not applied the pool yet
    /// (the metadata leader had just died), so the cluster is asked (a
    /// node catches up with the metadata leader before it says no) and a
    /// pool it names is added to the table. Standalone, or when no pool
    /// covers the key, `no_pool` is the answer.
    async fn route_by_asking(
        &self,
        key: &str,
        no_pool: SluiceError,
    ) -> Result<(PoolType, u32, u32)> {
        if self.inner.cluster.load().is_none() {
            return Err(no_pool);
        }
        let req = Request::PoolOfKey {
            key: key.to_string(),
        };
        let p = match self.any_node_call(&req, true).await {
            Ok(Response::Pool(p)) if !p.deleted => p,
            Ok(Response::Pool(_)) | Err(SluiceError::NoPool { .. }) => return Err(no_pool),
            Ok(other) => return Err(unexpected(other)),
            Err(e) => return Err(e),
        };
        // Routed here (a rare path: the router is built again in the
        // cache, which a concurrent refresh may replace meanwhile).
        let place = (
            p.pool_type,
            p.subgroup_index,
            PoolRouter::new(p.clone()).shard_of(key),
        );
        self.cache_pool(&p.pathname, Some(p.clone()));
        Ok(place)
    }

    /// Puts pool `path` into the cached pool table as `pool` describes it
    /// (`None`: takes it out), the rest of the table as it was.
    fn cache_pool(&self, path: &str, pool: Option<PoolMeta>) {
        let cache = self.inner.pools.load();
        let mut table = cache.table.clone();
        let mut routers = cache.routers.clone();
        match pool {
            Some(p) => {
                routers.insert(path.to_string(), PoolRouter::new(p.clone()));
                table.pools.insert(path.to_string(), p);
            }
            None => {
                routers.remove(path);
                table.pools.remove(path);
            }
        }
        self.inner
            .pools
            .store(Arc::new(PoolCache { table, routers }));
    }

    /// Routes `key`, runs `make(shard)`, and on a stale-routing error
    /// refreshes the pool table and retries once (the server applied nothing).
    async fn routed(&self, key: &str, make: impl Fn(u32) -> Request) -> Result<Response> {
        self.routed_as(key, Class::Read, make).await
    }

    /// `routed` for a request of class `class` (which member of a
    /// replicated shard it goes to).
    async fn routed_as(
        &self,
        key: &str,
        class: Class,
        make: impl Fn(u32) -> Request,
    ) -> Result<Response> {
        let place = self.route_full(key).await?;
        match self.placed_call(place, key, class, &make(place.2)).await {
            Err(e) if e.is_stale_routing() => {
                Box::pin(async {
                    self.refresh_pools().await?;
                    let place = self.route_full(key).await?;
                    self.placed_call(place, key, class, &make(place.2)).await
                })
                .await
            }
            other => other,
        }
    }

    /// Sends a request for a known shard: to the home node, or in a
    /// cluster to the member `class` calls for.
    async fn placed_call(
        &self,
        place: (PoolType, u32, u32),
        key: &str,
        class: Class,
        req: &Request,
    ) -> Result<Response> {
        match self.inner.cluster.load_full() {
            None => self.call(req).await,
            Some(view) => {
                let r = self.cluster_call(&view, place, key, class, req).await;
                if let Err(SluiceError::NotMember { .. }) = &r {
                    // Membership changed since we looked: learn it and retry once.
                    return Box::pin(async {
                        self.refresh_cluster().await?;
                        match self.inner.cluster.load_full() {
                            Some(view) => self.cluster_call(&view, place, key, class, req).await,
                            None => r,
                        }
                    })
                    .await;
                }
                r
            }
        }
    }

    fn check_value(&self, value: &Bytes) -> Result<()> {
        let max = u64::from(self.inner.info.limits.max_value_bytes);
        if value.len() as u64 > max {
            return Err(SluiceError::ValueTooLarge {
                size: value.len() as u64,
                max,
            });
        }
        Ok(())
    }

    async fn put_inner(
        &self,
        key: &str,
        value: Bytes,
        expected: Option<u64>,
        trace: Option<Trace>,
    ) -> Result<PutResult> {
        self.check_value(&value)?;
        let req_id = self.next_req_id();
        let r = self.routed_as(key, Class::Write, |shard| Request::Put {
            key: key.to_string(),
            shard: Some(shard),
            expected,
            value: value.clone(),
            trace: trace.clone(),
            req_id,
        });
        match r.await? {
            Response::PutOk(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }

    /// Stores a new version; returns its version and timestamp.
    pub async fn put(&self, key: &str, value: impl Into<Bytes>) -> Result<PutResult> {
        self.put_inner(key, value.into(), None, None).await
    }

    /// A put that starts a latency trace (id `trace_id`, sent now): every
    /// lambda stage the object flows through adds a hop, and the objects it
    /// produces carry the trace on.
    pub async fn put_traced(
        &self,
        key: &str,
        value: impl Into<Bytes>,
        trace_id: u64,
    ) -> Result<PutResult> {
        self.put_inner(key, value.into(), None, Some(new_trace(trace_id)))
            .await
    }

    /// Stores a new version only if the key's current version is
    /// `expected_version` (`VERSION_NONE`: only if the key does not exist).
    /// Otherwise fails with `VersionConflict`, which names the current version.
    pub async fn put_if_version(
        &self,
        key: &str,
        value: impl Into<Bytes>,
        expected_version: u64,
    ) -> Result<PutResult> {
        self.put_inner(key, value.into(), Some(expected_version), None)
            .await
    }

    /// Sends a put and returns once it is written to the socket; the server
    /// sends no reply, so a failure is only visible in the server's log.
    pub async fn put_and_forget(&self, key: &str, value: impl Into<Bytes>) -> Result<()> {
        let value = value.into();
        self.check_value(&value)?;
        let (t, subgroup, shard) = self.route_full(key).await?;
        let req = Request::Put {
            key: key.to_string(),
            shard: Some(shard),
            expected: None,
            value,
            trace: None,
            req_id: self.next_req_id(),
        };
        let conn = match self.inner.cluster.load_full() {
            None => self.conn().await?,
            Some(view) => {
                // Best effort: to the last known leader, else the first member.
                let target = view
                    .shard(t, subgroup, shard)
                    .and_then(|s| view.leader(&s.name).or(s.members.first().copied()))
                    .ok_or_else(|| SluiceError::UnknownShard {
                        subgroup: format!("{t}/{subgroup}"),
                        shard,
                    })?;
                self.node_pool(target)?.conn().await?
            }
        };
        conn.send_forget(&req).await
    }

    /// Fires lambdas and watchers for `key` without storing anything;
    /// returns the delivery timestamp.
    pub async fn trigger_put(&self, key: &str, value: impl Into<Bytes>) -> Result<u64> {
        self.trigger_put_inner(key, value.into(), None).await
    }

    /// A trigger put that starts a latency trace (see `put_traced`).
    pub async fn trigger_put_traced(
        &self,
        key: &str,
        value: impl Into<Bytes>,
        trace_id: u64,
    ) -> Result<u64> {
        self.trigger_put_inner(key, value.into(), Some(new_trace(trace_id)))
            .await
    }

    async fn trigger_put_inner(
        &self,
        key: &str,
        value: Bytes,
        trace: Option<Trace>,
    ) -> Result<u64> {
        self.check_value(&value)?;
        match self
            .routed(key, |shard| Request::TriggerPut {
                key: key.to_string(),
                shard: Some(shard),
                value: value.clone(),
                trace: trace.clone(),
                origin: None,
            })
            .await?
        {
            Response::PutOk(p) => Ok(p.timestamp_us),
            other => Err(unexpected(other)),
        }
    }

    /// Writes a tombstone: later gets of `key` report not found.
    pub async fn remove(&self, key: &str) -> Result<PutResult> {
        self.remove_inner(key, None).await
    }

    /// Removes only if the key's current version is `expected_version`.
    pub async fn remove_if_version(&self, key: &str, expected_version: u64) -> Result<PutResult> {
        self.remove_inner(key, Some(expected_version)).await
    }

    async fn remove_inner(&self, key: &str, expected: Option<u64>) -> Result<PutResult> {
        let req_id = self.next_req_id();
        match self
            .routed_as(key, Class::Write, |shard| Request::Remove {
                key: key.to_string(),
                shard: Some(shard),
                expected,
                req_id,
            })
            .await?
        {
            Response::PutOk(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }

    async fn object(&self, key: &str, make: impl Fn(u32) -> Request) -> Result<Object> {
        self.object_as(key, Class::Read, make).await
    }

    async fn object_as(
        &self,
        key: &str,
        class: Class,
        make: impl Fn(u32) -> Request,
    ) -> Result<Object> {
        match self.routed_as(key, class, make).await? {
            Response::Object(o) => Ok(to_object(o)),
            other => Err(unexpected(other)),
        }
    }

    /// The latest version of `key`. In a cluster this is a *stable* read:
    /// any member may answer with committed data, never older than what
    /// this client has already seen of the shard.
    pub async fn get(&self, key: &str) -> Result<Object> {
        self.object(key, |shard| Request::Get {
            key: key.to_string(),
            shard: Some(shard),
            version: None,
            min_version: None,
            linearizable: false,
        })
        .await
    }

    /// The latest version of `key`, *linearizable*: served by the shard's
    /// leader after it confirmed its leadership with a quorum, so it
    /// reflects every write acknowledged before the call. (Same as `get`
    /// on a single node.)
    pub async fn get_linearizable(&self, key: &str) -> Result<Object> {
        self.object_as(key, Class::Leader, |shard| Request::Get {
            key: key.to_string(),
            shard: Some(shard),
            version: None,
            min_version: None,
            linearizable: true,
        })
        .await
    }

    /// A specific version of `key`.
    pub async fn get_version(&self, key: &str, version: u64) -> Result<Object> {
        self.object(key, |shard| Request::Get {
            key: key.to_string(),
            shard: Some(shard),
            version: Some(version),
            min_version: None,
            linearizable: false,
        })
        .await
    }

    /// The version of `key` current at `timestamp_us` (µs since the
    /// epoch). A timestamp that is not stable yet (in the future) waits for
    /// it, up to the request timeout, so the answer never changes later.
    pub async fn get_by_time(&self, key: &str, timestamp_us: u64) -> Result<Object> {
        let wait_ms = self
            .inner
            .cfg
            .request_timeout
            .as_millis()
            .saturating_sub(100)
            .min(u32::MAX as u128) as u32;
        self.get_by_time_with(key, timestamp_us, wait_ms, false)
            .await
    }

    /// `get_by_time` with an explicit wait (`0`: fail at once when the
    /// timestamp is not stable yet) or, `unstable`, no wait at all: the
    /// answer for a future timestamp may then change.
    pub async fn get_by_time_with(
        &self,
        key: &str,
        timestamp_us: u64,
        wait_ms: u32,
        unstable: bool,
    ) -> Result<Object> {
        self.object(key, |shard| Request::GetByTime {
            key: key.to_string(),
            shard: Some(shard),
            timestamp_us,
            wait_ms,
            unstable,
        })
        .await
    }

    /// Size in bytes of the latest version (or of `version`, or of the
    /// version current at `timestamp_us`) without transferring the value.
    pub async fn get_size(
        &self,
        key: &str,
        version: Option<u64>,
        timestamp_us: Option<u64>,
    ) -> Result<u64> {
        match self
            .routed(key, |shard| Request::GetSize {
                key: key.to_string(),
                shard: Some(shard),
                version,
                timestamp_us,
            })
            .await?
        {
            Response::Size(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// Keys of `pool` (optionally under `prefix`), gathered from every
    /// shard, sorted. Each shard is read a page at a time (a node answers
    /// at most `KEYS_PAGE_BYTES` of keys a request), so a pool of any size
    /// can be listed.
    pub async fn list_keys(&self, pool: &str, prefix: Option<&str>) -> Result<Vec<String>> {
        let mut meta = self.inner.pools.load().table.get(pool).cloned();
        if meta.is_none() {
            self.refresh_pools().await?;
            meta = self.inner.pools.load().table.get(pool).cloned();
        }
        let Some(meta) = meta else {
            return Err(SluiceError::PoolNotFound {
                pool: pool.to_string(),
            });
        };
        let mut calls = Vec::new();
        for shard in 0..meta.shard_count.max(1) {
            let (c, pool, prefix) = (self.clone(), pool.to_string(), prefix.map(str::to_string));
            let place = (meta.pool_type, meta.subgroup_index, shard);
            calls.push(tokio::spawn(async move {
                c.paged_keys(
                    |after| Request::ListKeys {
                        pool: pool.clone(),
                        prefix: prefix.clone(),
                        shard: Some(shard),
                        after,
                    },
                    Some(place),
                )
                .await
            }));
        }
        let mut keys = Vec::new();
        for c in calls {
            keys.extend(c.await.map_err(|e| SluiceError::Internal {
                reason: e.to_string(),
            })??);
        }
        keys.sort_unstable();
        Ok(keys)
    }

    /// Every page of a listing: `req(after)` asks for the keys after the
    /// last one received until the node says no more follow. `place`: the
    /// shard to ask (else the connected node).
    async fn paged_keys(
        &self,
        req: impl Fn(Option<String>) -> Request,
        place: Option<(PoolType, u32, u32)>,
    ) -> Result<Vec<String>> {
        let mut keys: Vec<String> = Vec::new();
        loop {
            let r = req(keys.last().cloned());
            let rep = match place {
                Some(place) => self.placed_call(place, "", Class::Read, &r).await?,
                None => self.call(&r).await?,
            };
            match rep {
                Response::Keys { keys: page, more } => {
                    // A page that adds nothing ends the listing (a node
                    // that said more but sent none would loop forever).
                    let progressed = !page.is_empty();
                    keys.extend(page);
                    if !more || !progressed {
                        return Ok(keys);
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    /// The latest versions of several keys: one request per shard involved,
    /// sent concurrently; one result per key, in the order given. A node
    /// answers as many as fit in one reply (64 MiB of values) and the
    /// rest are asked for again, so large values can be fetched together.
    pub async fn multi_get(&self, keys: &[&str]) -> Result<Vec<Result<Object>>> {
        let mut by_shard: HashMap<(PoolType, u32, u32), Vec<usize>> = HashMap::new();
        let mut out: Vec<Option<Result<Object>>> = vec![None; keys.len()];
        for (i, k) in keys.iter().enumerate() {
            match self.route_full(k).await {
                Ok(s) => by_shard.entry(s).or_default().push(i),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let mut calls = Vec::new();
        for (place, idx) in by_shard {
            let wanted: Vec<String> = idx.iter().map(|i| keys[*i].to_string()).collect();
            let c = self.clone();
            calls.push((
                idx,
                tokio::spawn(async move { c.multi_get_shard(place, wanted).await }),
            ));
        }
        for (idx, call) in calls {
            let items = call.await.map_err(|e| SluiceError::Internal {
                reason: e.to_string(),
            })??;
            for (i, item) in idx.into_iter().zip(items) {
                out[i] = Some(item.map(to_object));
            }
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(SluiceError::Internal {
                        reason: "missing multi-get result".into(),
                    })
                })
            })
            .collect())
    }

    /// `keys` of one shard, in requests no larger than a node takes,
    /// asking again for those a reply held back.
    async fn multi_get_shard(
        &self,
        place: (PoolType, u32, u32),
        keys: Vec<String>,
    ) -> Result<Vec<Result<WireObject>>> {
        let limits = &self.inner.info.limits;
        let mut got = Vec::with_capacity(keys.len());
        while got.len() < keys.len() {
            // As many keys as one request may carry (a count and half
            // the metadata a node accepts; one at least).
            let (mut n, mut bytes) = (0, 0);
            for k in &keys[got.len()..] {
                bytes += k.len() + 8;
                if n > 0
                    && (n >= limits.max_multi_get_keys as usize
                        || bytes > limits.max_meta_bytes as usize / 2)
                {
                    break;
                }
                n += 1;
            }
            let req = Request::MultiGet {
                shard: Some(place.2),
                keys: keys[got.len()..got.len() + n].to_vec(),
            };
            let asked = n;
            match self.placed_call(place, "", Class::Leader, &req).await? {
                Response::Objects { items, more }
                    if items.len() == asked
                        || (more && !items.is_empty() && items.len() < asked) =>
                {
                    got.extend(items)
                }
                Response::Objects { items, .. } => {
                    return Err(SluiceError::protocol(format!(
                        "multi-get asked for {asked} keys, got {}",
                        items.len()
                    )))
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(got)
    }

    async fn pool_call(&self, req: Request) -> Result<PoolMeta> {
        let r = match (&req, self.inner.cluster.load_full()) {
            (Request::PoolCreate { .. } | Request::PoolRemove { .. }, Some(view)) => {
                self.meta_call(&view, &req).await
            }
            _ => self.any_node_call(&req, true).await,
        };
        match r? {
            Response::Pool(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }

    /// A replicated metadata change: to the metadata group's leader,
    /// following leader hints and retrying while it is elected. The
    /// request carries one request id for all its tries (the caller sets
    /// it), so a change whose reply was lost is made once and its retry
    /// answered as the first try was.
    async fn meta_call(&self, view: &ClusterView, req: &Request) -> Result<Response> {
        let deadline = Instant::now() + self.inner.cfg.request_timeout;
        // With no leader known: the home node first, then each node in
        // turn (the home node may be the leader that died); one that is
        // not the leader names it.
        let mut ids: Vec<u32> = view.nodes.keys().copied().collect();
        ids.sort_unstable();
        let mut blind = 0usize;
        follow_leader(deadline, |hint| {
            if let Some(l) = hint {
                view.set_leader("meta", l);
            }
            let leader = view.leader("meta").or_else(|| {
                blind += 1;
                match blind {
                    1 => None,
                    k => ids.get((k - 2) % ids.len().max(1)).copied(),
                }
            });
            async move {
                let r = self.call_at(leader, req).await;
                let step = match &r {
                    Err(SluiceError::NotLeader {
                        leader: Some(l), ..
                    }) => Step::Follow(*l),
                    // A leader that died or stopped with the change in
                    // flight: its outcome is unknown, and the retry (under
                    // the same request id) is answered as it was.
                    Err(
                        SluiceError::NotLeader { .. }
                        | SluiceError::Connection { .. }
                        | SluiceError::Unavailable { .. },
                    ) => {
                        view.leaders.lock().remove("meta");
                        Step::Pause
                    }
                    // The node asked holds no metadata replica: ask one
                    // that does; when it cannot name them yet (it has not
                    // learned the metadata group's members, just after
                    // start), learn the leader afresh and try again.
                    Err(SluiceError::NotMember { members, .. }) => match members.first() {
                        Some(m) => Step::Follow(*m),
                        None => {
                            view.leaders.lock().remove("meta");
                            if self.refresh_cluster().await.is_ok() {
                                let known = self.inner.cluster.load_full();
                                if let Some(l) = known.and_then(|v| v.leader("meta")) {
                                    view.set_leader("meta", l);
                                }
                            }
                            Step::Pause
                        }
                    },
                    _ => Step::Done,
                };
                (r, step)
            }
        })
        .await
    }

    /// Creates an object pool.
    pub async fn create_pool(&self, spec: PoolSpec) -> Result<PoolMeta> {
        let req_id = self.next_req_id();
        let p = self.pool_call(Request::PoolCreate { spec, req_id }).await?;
        self.cache_pool(&p.pathname, Some(p.clone()));
        Ok(p)
    }

    /// Soft-deletes a pool (it stays listed with `deleted = true`).
    pub async fn remove_pool(&self, path: &str) -> Result<PoolMeta> {
        let p = self
            .pool_call(Request::PoolRemove {
                path: path.to_string(),
                req_id: self.next_req_id(),
            })
            .await?;
        self.cache_pool(&p.pathname, Some(p.clone()));
        Ok(p)
    }

    /// Deletes a removed pool's objects for good (every version of a
    /// persistent pool, on every replica) and frees its path for a new
    /// pool. Refused for a live pool.
    pub async fn purge_pool(&self, path: &str) -> Result<sluice_types::PurgeReport> {
        let req = Request::PoolPurge {
            path: path.to_string(),
            req_id: self.next_req_id(),
        };
        let r = match self.inner.cluster.load_full() {
            Some(view) => self.meta_call(&view, &req).await,
            None => self.call(&req).await,
        };
        let report = match r? {
            Response::Json(j) => serde_json::from_str(&j).map_err(|e| {
                SluiceError::protocol(format!("bad reply to a pool purge ({e}): {j}"))
            })?,
            other => return Err(unexpected(other)),
        };
        self.cache_pool(path, None);
        Ok(report)
    }

    /// The pool at `path` (`NoPool` when there is none).
    pub async fn get_pool(&self, path: &str) -> Result<PoolMeta> {
        self.pool_call(Request::PoolGet {
            path: path.to_string(),
        })
        .await
    }

    /// The pool `key` belongs to.
    pub async fn pool_of_key(&self, key: &str) -> Result<PoolMeta> {
        self.pool_call(Request::PoolOfKey {
            key: key.to_string(),
        })
        .await
    }

    /// Every pool, and with `include_deleted` those removed but not yet
    /// purged.
    pub async fn list_pools(&self, include_deleted: bool) -> Result<Vec<PoolMeta>> {
        match self
            .any_node_call(&Request::PoolList { include_deleted }, true)
            .await?
        {
            Response::Pools(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }

    /// Subscribes to every delivery (put, trigger put, remove) of keys under `prefix`.
    pub async fn watch(&self, prefix: &str) -> Result<Watch> {
        self.watch_with(prefix, None).await
    }

    /// A watch on a persistent pool that first replays every stored
    /// version under `prefix` from `from` on (in version order per shard),
    /// then goes on live with nothing missed or repeated in between: a
    /// watcher resumes after a reconnect from the version (or time) after
    /// the last one it saw. Versions the pool's retention already dropped
    /// are reported as one `Lagged` notice first.
    pub async fn watch_from(&self, prefix: &str, from: sluice_wire::WatchFrom) -> Result<Watch> {
        self.watch_with(prefix, Some(from)).await
    }

    /// A node bounds the watches of one connection
    /// (`limits.max_watches_per_conn`); a client with more watches than
    /// its pooled connections hold opens connections for watches only,
    /// each shared by later watches while it has room.
    async fn watch_with(
        &self,
        prefix: &str,
        from: Option<sluice_wire::WatchFrom>,
    ) -> Result<Watch> {
        let home = &self.inner.home;
        // The newest connection for watches is the likeliest to have room.
        let conns = std::iter::once(self.conn().await?).chain(home.watch_conns().into_iter().rev());
        for conn in conns {
            match self.watch_on(conn, prefix, from).await {
                Err(SluiceError::TooManyWatches { .. }) => continue,
                done => return done,
            }
        }
        // A node whose limit is 0 refuses this one too.
        self.watch_on(home.connect_for_watches().await?, prefix, from)
            .await
    }

    async fn watch_on(
        &self,
        conn: Arc<Conn>,
        prefix: &str,
        from: Option<sluice_wire::WatchFrom>,
    ) -> Result<Watch> {
        let (tx, mut rx) = mpsc::channel(sluice_server_queue_len());
        let dropped = Arc::new(AtomicU64::new(0));
        let id = conn
            .open_stream(
                &Request::Watch {
                    prefix: prefix.to_string(),
                    from,
                },
                tx,
                dropped.clone(),
            )
            .await?;
        // The first reply says whether the watch was accepted.
        let first = tokio::time::timeout(self.inner.cfg.request_timeout, rx.recv())
            .await
            .map_err(|_| SluiceError::Timeout {
                what: "watch".into(),
                after_ms: self.inner.cfg.request_timeout.as_millis() as u64,
            })?;
        match first {
            Some(Response::WatchOk { .. }) => Ok(Watch {
                rx,
                id,
                conn,
                dropped,
                prefix: prefix.to_string(),
                timeout: self.inner.cfg.request_timeout,
                handle: tokio::runtime::Handle::current(),
                cancelled: false,
            }),
            Some(Response::Error(e)) => {
                conn.close_stream(id);
                Err(e)
            }
            Some(other) => Err(unexpected(other)),
            None => Err(SluiceError::Connection {
                reason: "connection closed while opening the watch".into(),
            }),
        }
    }

    /// Round trip time of a PING.
    pub async fn ping(&self) -> Result<Duration> {
        let t = Instant::now();
        match self.call(&Request::Ping).await? {
            Response::Pong => Ok(t.elapsed()),
            other => Err(unexpected(other)),
        }
    }

    /// Versions of `key` (persistent pools), newest first: versions
    /// `from..=to`, or timestamps `from..=to` when `by_time`. The node
    /// replies in pages of at most `page` versions; this walks every page
    /// (each value held in memory: `history_page` takes one page at a
    /// time).
    pub async fn history(
        &self,
        key: &str,
        by_time: bool,
        from: u64,
        to: u64,
        page: u32,
    ) -> Result<Vec<Object>> {
        let mut out = Vec::new();
        let mut to = to;
        loop {
            let (items, more) = self.history_page(key, by_time, from, to, page).await?;
            out.extend(items);
            let Some(last) = out.last() else { break };
            let next_to = if by_time {
                last.meta.timestamp_us
            } else {
                last.meta.version
            };
            if !more || next_to <= from || next_to == 0 {
                break;
            }
            // Versions and (node-monotonic) timestamps are unique per
            // shard, so the next page ends just below the oldest returned.
            to = next_to - 1;
        }
        Ok(out)
    }

    /// One page of `history`: the newest at most `limit` versions of
    /// `key` in `from..=to` (versions, or timestamps when `by_time`),
    /// newest first, and whether older ones may follow (a page is also
    /// cut at 64 MiB of values, and at the node's page limit, 1024). The
    /// next page ends just below the oldest returned.
    pub async fn history_page(
        &self,
        key: &str,
        by_time: bool,
        from: u64,
        to: u64,
        limit: u32,
    ) -> Result<(Vec<Object>, bool)> {
        if from > to {
            let what = if by_time {
                "time range"
            } else {
                "version range"
            };
            return Err(SluiceError::invalid_argument(
                format!("history {what} of key {key:?}"),
                format!("it starts at {from}, after its end {to} (both bounds are inclusive)"),
            ));
        }
        let req = |shard| Request::History {
            key: key.to_string(),
            shard: Some(shard),
            by_time,
            from,
            to,
            limit: limit.max(1),
        };
        match self.routed(key, req).await? {
            Response::Objects { items, more } => Ok((
                items
                    .into_iter()
                    .map(|i| i.map(to_object))
                    .collect::<Result<_>>()?,
                more,
            )),
            other => Err(unexpected(other)),
        }
    }

    /// Keys of a persistent pool live at a version (or, `by_time`, at a
    /// timestamp in µs).
    pub async fn list_keys_at(
        &self,
        pool: &str,
        prefix: Option<&str>,
        by_time: bool,
        at: u64,
    ) -> Result<Vec<String>> {
        self.paged_keys(
            |after| Request::ListKeysAt {
                pool: pool.to_string(),
                prefix: prefix.map(str::to_string),
                by_time,
                at,
                after,
            },
            None,
        )
        .await
    }

    /// Applies a data flow graph file (`dfgs.json` shape) on the node;
    /// returns `{"applied": [ids]}`. An invalid file changes nothing and
    /// fails with `InvalidDfg` naming the JSON path of the bad field.
    /// Sends the latest version of `key` to the nodes `to` (`None`: every
    /// other node) of the cluster, pipelined along `fanout` chains ordered
    /// by topology; each receiver keeps it for its lambdas. The report
    /// gives each node's outcome and the order's boundary crossings.
    pub async fn broadcast(
        &self,
        key: &str,
        to: Option<&[u32]>,
        fanout: usize,
    ) -> Result<serde_json::Value> {
        let mut cmd = serde_json::json!({"op": "broadcast", "key": key, "fanout": fanout});
        if let Some(t) = to {
            cmd["to"] = serde_json::json!(t);
        }
        self.cluster_command(cmd, None).await
    }

    /// Applies data flow graphs (a `dfgs.json` document). In a cluster
    /// the answer comes once every node runs them, or, with the nodes
    /// still behind listed in `pending_nodes`, after 3 s for a node that
    /// does not answer and at the client's request timeout for one still
    /// building them (`wait_dfgs_pending`).
    pub async fn dfg_apply(&self, text: &str) -> Result<serde_json::Value> {
        let req = Request::DfgApply {
            text: text.to_string(),
        };
        match self.inner.cluster.load_full() {
            // A cluster's graphs go through its metadata group.
            Some(view) => {
                let started = Instant::now();
                let mut r = json_of(self.meta_call(&view, &req).await?)?;
                self.wait_dfgs_pending(&mut r, started + self.inner.cfg.request_timeout)
                    .await;
                Ok(r)
            }
            None => self.json_call(&req).await,
        }
    }

    /// After a cluster's `dfg apply` answered with nodes still behind
    /// (`pending_nodes`: the node waits a few seconds at most, for one
    /// that is down): waits on, until `deadline` (the client's request
    /// timeout from the call's start), for those that answer and are
    /// still building the graphs (a Python lambda whose imports or model
    /// take seconds to load), so that the call returns once they run
    /// them, as a standalone node's does. A node that does not answer is
    /// left at once. `pending_nodes` is updated to the nodes still behind.
    async fn wait_dfgs_pending(&self, r: &mut serde_json::Value, deadline: Instant) {
        const POLL: Duration = Duration::from_millis(20);
        const ASK_FOR_AT_MOST: Duration = Duration::from_millis(500);
        let Some(index) = r["index"].as_u64() else {
            return; // a node from before the index was in the answer
        };
        let mut waiting: Vec<u32> = r["pending_nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect();
        let mut gone = Vec::new();
        let ask = Request::Cluster {
            command: serde_json::json!({"op": "dfgs_reconciled"}).to_string(),
        };
        while !waiting.is_empty() && Instant::now() < deadline {
            let mut behind = Vec::new();
            for n in waiting {
                let at = tokio::time::timeout(ASK_FOR_AT_MOST, self.call_at(Some(n), &ask)).await;
                match at {
                    Ok(Ok(Response::Json(j))) => {
                        let reached = serde_json::from_str::<serde_json::Value>(&j)
                            .ok()
                            .and_then(|v| v["index"].as_u64())
                            .is_some_and(|at| at >= index);
                        if !reached {
                            behind.push(n);
                        }
                    }
                    _ => gone.push(n),
                }
            }
            waiting = behind;
            if !waiting.is_empty() {
                tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())))
                    .await;
            }
        }
        waiting.extend(gone);
        waiting.sort_unstable();
        r["pending_nodes"] = serde_json::json!(waiting);
    }

    /// A policy command (`{"op": "ls" | "whoami" | "set" | "rm" |
    /// "auth_create" | "auth_revoke" | "auth_roles" | "require_auth",
    /// ...}`, see `sluice policy --help`). Changes go through a cluster's
    /// metadata group; listings come from the node this client talks to.
    pub async fn policy(&self, command: serde_json::Value) -> Result<serde_json::Value> {
        let read_only = matches!(command["op"].as_str(), Some("ls" | "whoami"));
        let req = Request::Policy {
            command: command.to_string(),
            req_id: if read_only { None } else { self.next_req_id() },
        };
        match self.inner.cluster.load_full() {
            Some(view) if !read_only => json_of(self.meta_call(&view, &req).await?),
            _ => self.json_call(&req).await,
        }
    }

    /// The graphs applied on the node, with per-UDL counters (and, in a
    /// cluster, graphs this node could not run, with the reason).
    pub async fn dfg_list(&self) -> Result<serde_json::Value> {
        self.json_call(&Request::DfgList).await
    }

    /// `dfg_list` of every node of the cluster (of the one node when not
    /// in a cluster), by node id: a node that does not answer has its
    /// error instead.
    pub async fn dfg_list_nodes(&self) -> Result<Vec<(u32, Result<serde_json::Value>)>> {
        let Some(view) = self.inner.cluster.load_full() else {
            let node = self.server_info().node_id;
            return Ok(vec![(node, self.dfg_list().await)]);
        };
        let mut ids: Vec<u32> = view.nodes.keys().copied().collect();
        ids.sort_unstable();
        let mut out = Vec::with_capacity(ids.len());
        for n in ids {
            let r = match self.call_at(Some(n), &Request::DfgList).await {
                Ok(r) => json_of(r),
                Err(e) => Err(e),
            };
            out.push((n, r));
        }
        Ok(out)
    }

    /// Removes a graph (from every node of a cluster); its in-flight
    /// upcalls finish.
    pub async fn dfg_remove(&self, id: &str) -> Result<()> {
        let req = Request::DfgRemove {
            id: id.to_string(),
            req_id: self.next_req_id(),
        };
        let r = match self.inner.cluster.load_full() {
            Some(view) => self.meta_call(&view, &req).await?,
            None => self.call(&req).await?,
        };
        match r {
            Response::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn json_call(&self, req: &Request) -> Result<serde_json::Value> {
        json_of(self.call(req).await?)
    }

    /// Server counters as JSON.
    pub async fn stats(&self) -> Result<serde_json::Value> {
        match self.call(&Request::Stats).await? {
            Response::Stats(s) => {
                serde_json::from_str(&s).map_err(|e| SluiceError::protocol(e.to_string()))
            }
            other => Err(unexpected(other)),
        }
    }
}

/// Client-side queue for one watch; matches the server's per-connection queue.
fn sluice_server_queue_len() -> usize {
    4096
}

/// The JSON document a `Response::Json` carries.
fn json_of(r: Response) -> Result<serde_json::Value> {
    match r {
        Response::Json(s) => {
            serde_json::from_str(&s).map_err(|e| SluiceError::protocol(e.to_string()))
        }
        other => Err(unexpected(other)),
    }
}

/// Whether two member lists name the same nodes, in any order.
fn same_members(a: &[u32], b: &[u32]) -> bool {
    use std::collections::BTreeSet;
    a.iter().collect::<BTreeSet<_>>() == b.iter().collect::<BTreeSet<_>>()
}

#[cfg(test)]
mod tests {
    /// A seed without a port gets the default one (it was "invalid
    /// socket address"), and one with a port keeps it.
    #[test]
    fn seeds_without_a_port_get_the_default_port() {
        for (seed, want) in [
            ("10.0.0.5", "10.0.0.5:7420"),
            ("node-1", "node-1:7420"),
            ("[::1]", "[::1]:7420"),
            ("::1", "[::1]:7420"),
            ("fe80::2", "[fe80::2]:7420"),
        ] {
            assert!(!super::has_port(seed), "{seed}");
            assert_eq!(super::with_default_port(seed), want);
        }
        for seed in ["10.0.0.5:7000", "node-1:1", "[::1]:9"] {
            assert!(super::has_port(seed), "{seed}");
        }
    }

    #[test]
    fn member_lists_compare_as_sets() {
        assert!(super::same_members(&[4, 5], &[5, 4]));
        assert!(super::same_members(&[5], &[5, 5]));
        assert!(!super::same_members(&[4], &[4, 5]));
        assert!(!super::same_members(&[4, 5], &[5]));
    }

    /// Client ids come from the OS's random source: distinct per client
    /// (deduplication of retried writes is keyed by them).
    #[test]
    fn client_ids_are_distinct() {
        let ids: std::collections::HashSet<u64> =
            (0..10_000).map(|_| sluice_types::random_u64()).collect();
        assert_eq!(ids.len(), 10_000);
    }
}
