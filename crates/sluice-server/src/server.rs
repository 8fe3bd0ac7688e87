use crate::config::ServerConfig;
use crate::conn::{serve_conn, ConnCtx};
use crate::stats::ServerStats;
use crate::watch::WatchHub;
use sluice_compute::{Engine, EngineConfig, Registry};
use sluice_store::{Store, StoreConfig};
use sluice_types::SluiceError;
use sluice_wire::{OutQueue, Response};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    // Causes are part of each message, never a `source` as well:
    // printed with its chain (`{:#}`), an error would appear twice.
    #[error("cannot listen on {addr}: {error} (is another sluice running? pick another address with --listen)")]
    Bind {
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error(transparent)]
    DataDirInUse(#[from] sluice_log::LockError),
    #[error("cannot open the store in {dir}: {error}{}", open_hint(dir, error))]
    Store { dir: String, error: SluiceError },
}

/// What a user does next when the store did not open: on a full disk,
/// free space; when a log file is damaged, the exact `sluice fsck`
/// command for this data directory.
fn open_hint(dir: &str, error: &SluiceError) -> String {
    let SluiceError::Io { reason } = error else {
        return String::new();
    };
    // ENOSPC, as std words it.
    if reason.contains("(os error 28)") {
        return format!(
            "\nthe disk holding {dir} is full: free space there (or move the data directory \
             and point --data-dir at it) and start the node again; a write that failed for \
             want of space was never acknowledged, and what was is kept"
        );
    }
    if !reason.contains(" is corrupt at offset ") {
        return String::new();
    }
    format!(
        "\n`sluice fsck --data-dir {dir}` reports every damaged file (a dry run) \
         and how to repair them (\"Corruption and repair\" in the README)"
    )
}

/// Applies retention in the background until the store is dropped.
fn spawn_compactor(store: std::sync::Weak<Store>, every: Duration) {
    let spawned = std::thread::Builder::new()
        .name("sluice-compactor".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let Some(store) = store.upgrade() else { return };
            if let Err(e) = store.compact() {
                tracing::warn!(error = %e, "retention compaction failed; will retry");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the compaction thread; retention is not applied");
    }
}

/// A bound, not yet running, node.
pub struct Server {
    listener: TcpListener,
    /// Set when `[tls]` names a certificate: every connection starts with
    /// a TLS handshake (within `timeouts.handshake_ms`).
    tls: Option<Arc<sluice_tls::rustls::ServerConfig>>,
    ctx: Arc<ConnCtx>,
    /// The data directory's lock (nodes started by `bind`), held until
    /// `run` returns.
    data_lock: Option<sluice_log::DirLock>,
}

/// The connections a node takes from its peers past the client limit:
/// four per peer (two, and room to reconnect while the old ones close),
/// at least `PEER_SLOTS`; none for a standalone node.
fn peer_slots(cluster: Option<&sluice_cluster::ClusterNode>) -> usize {
    cluster.map_or(0, |c| {
        (4 * c.node_count().saturating_sub(1)).max(PEER_SLOTS)
    })
}

/// Listens at `addr`. At `[::]` (a layout naming the node by a host
/// name, or `--listen [::]:<port>`) on IPv6 and IPv4 both, whatever
/// `net.ipv6.bindv6only` says, as Go's and Redis's listeners do; on a host
/// without IPv6 (a container with it disabled) at `0.0.0.0` instead.
pub(crate) async fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    if addr.ip() != std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) {
        return TcpListener::bind(addr).await;
    }
    let dual = || -> std::io::Result<TcpListener> {
        let sock = tokio::net::TcpSocket::new_v6()?;
        socket2::SockRef::from(&sock).set_only_v6(false)?;
        sock.set_reuseaddr(true)?;
        sock.bind(addr)?;
        sock.listen(1024)
    };
    match dual() {
        Ok(l) => Ok(l),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
            ) =>
        {
            tracing::info!(error = %e, "no IPv6 here: listening on IPv4 only");
            TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], addr.port()))).await
        }
        Err(e) => Err(e),
    }
}

/// The registry with the config's `udl_aliases`, each naming a UDL it has.
fn with_aliases(mut registry: Registry, cfg: &ServerConfig) -> Result<Registry, String> {
    for (alias, udl) in &cfg.udl_aliases {
        if registry.resolve(udl).is_none() {
            return Err(format!(
                "udl_aliases: {alias:?} names UDL {udl:?}, which this node does not have (it has {})",
                registry.names().join(", ")
            ));
        }
        registry.alias(alias, udl);
    }
    Ok(registry)
}

/// Connections a cluster node takes from its peers beyond
/// `limits.max_connections` at least (each peer opens two: requests and
/// bulk; four per peer in a larger cluster): kept from clients by
/// `fds::reserve`.
const PEER_SLOTS: usize = 64;

impl Server {
    /// Opens the store in `cfg.data_dir` and binds the listener. With
    /// `cluster.layout` set, the node joins that cluster: its shard layout
    /// comes from the layout file and its replicated shards start.
    pub async fn bind(cfg: ServerConfig) -> Result<Server, ServerError> {
        Self::bind_with_registry(cfg, sluice_udls::registry()).await
    }

    /// `bind` with your own UDLs (a registry with the built-in ones and
    /// yours: see `examples/custom-udl`): everything `sluice serve` does,
    /// a cluster included.
    pub async fn bind_with_registry(
        mut cfg: ServerConfig,
        registry: Registry,
    ) -> Result<Server, ServerError> {
        cfg.validate().map_err(ServerError::Config)?;
        // Before the logs open: room for them, and for peers, whatever
        // the clients take.
        crate::fds::limit();
        // Before anything in the directory is read: a second server on the
        // same data would recover it and then overwrite the first one's
        // acknowledged writes.
        let data_lock = sluice_log::DirLock::acquire(
            &cfg.data_dir,
            &format!(
                "sluice serve, node {}, listening on {}",
                cfg.node_id, cfg.listen
            ),
        )?;
        let cluster_layout = match &cfg.cluster.layout {
            None => None,
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    ServerError::Config(format!("reading cluster layout {}: {e}", p.display()))
                })?;
                let l = sluice_types::cluster::ClusterLayout::from_text(&text).map_err(|e| {
                    ServerError::Config(format!("cluster layout {}: {e}", p.display()))
                })?;
                let counts = l.shard_counts();
                cfg.layout = sluice_store::Layout {
                    version: l.version,
                    volatile: counts["volatile"].clone(),
                    trigger: counts["trigger"].clone(),
                    persistent: counts["persistent"].clone(),
                };
                cfg.validate().map_err(ServerError::Config)?;
                if !cfg.persistent.enabled && !l.subgroups.persistent.is_empty() {
                    return Err(ServerError::Config(format!(
                        "cluster layout {} has persistent subgroups but [persistent] enabled = false on this node; enable it or remove them from the layout",
                        p.display()
                    )));
                }
                // A replicated persistent shard's durable write is its
                // consensus log (fsync'd per `[persistent] sync`); the
                // history is written as entries apply and synced at each
                // snapshot, so a put is fsync'd once, not twice.
                cfg.cluster.sync_persistent = cfg.persistent.sync != "never";
                Some(l)
            }
        };
        // A standalone node gets one persistent shard by default; a
        // cluster's persistent shards are the layout file's.
        if cfg.persistent.enabled && cfg.layout.persistent.is_empty() && cluster_layout.is_none() {
            cfg.layout.persistent = vec![1];
        }
        let store = Store::open(StoreConfig {
            layout: cfg.layout.clone(),
            max_key_bytes: cfg.limits.max_key_bytes as usize,
            pool_table_path: Some(cfg.data_dir.join("pools.json")),
            default_pools: cfg.default_pools.clone(),
            persistent_dir: cfg
                .persistent
                .enabled
                .then(|| cfg.data_dir.join("persistent")),
            persistent_sync: if cluster_layout.is_some() {
                sluice_log::SyncPolicy::Never
            } else {
                cfg.persistent.sync_policy().map_err(ServerError::Config)?
            },
            persistent_segment_bytes: cfg.persistent.segment_bytes,
            max_memory_bytes: cfg.limits.max_memory_bytes,
            node_id: cfg.node_id,
        })
        .map_err(|error| ServerError::Store {
            dir: cfg.data_dir.display().to_string(),
            error,
        })?;
        let store = Arc::new(store);
        let cluster = match cluster_layout {
            None => None,
            Some(l) => Some(
                sluice_cluster::ClusterNode::start(
                    cfg.node_id,
                    l,
                    sluice_cluster::ClusterSettings {
                        peer_tls: cfg
                            .tls
                            .peer_config()
                            .map_err(|e| ServerError::Config(e.to_string()))?,
                        ..cfg.cluster.clone()
                    },
                    cfg.data_dir.clone(),
                    store.clone(),
                )
                .await
                .map_err(|error| ServerError::Store {
                    dir: cfg.data_dir.display().to_string(),
                    error,
                })?,
            ),
        };
        let mut server = Self::bind_node(cfg, store, registry, cluster).await?;
        let mut data_lock = data_lock;
        let node_id = server.ctx.cfg.node_id;
        if let Err(e) = data_lock.describe(&format!(
            "sluice serve, node {node_id}, listening on {}",
            server.local_addr()
        )) {
            tracing::warn!(error = %e, "cannot update the data directory's lock file");
        }
        server.data_lock = Some(data_lock);
        Ok(server)
    }

    /// Binds a listener in front of an existing store (embedded use: the
    /// demo, benchmarks, and later the lambda runtime).
    pub async fn bind_with_store(
        cfg: ServerConfig,
        store: Arc<Store>,
    ) -> Result<Server, ServerError> {
        Self::bind_with(cfg, store, sluice_udls::registry()).await
    }

    /// Binds a standalone node over a store you opened, with a custom UDL
    /// registry (`bind_with_registry` opens the store itself and can join
    /// a cluster).
    pub async fn bind_with(
        cfg: ServerConfig,
        store: Arc<Store>,
        registry: Registry,
    ) -> Result<Server, ServerError> {
        Self::bind_node(cfg, store, registry, None).await
    }

    /// Binds a node that is a member of a cluster (replicated shards,
    /// replicated pool table); see `sluice-cluster`.
    pub async fn bind_node(
        cfg: ServerConfig,
        store: Arc<Store>,
        registry: Registry,
        cluster: Option<Arc<sluice_cluster::ClusterNode>>,
    ) -> Result<Server, ServerError> {
        cfg.validate().map_err(ServerError::Config)?;
        let mut cfg = cfg;
        // Clients never take the descriptors the node needs itself, its
        // peers' connections included.
        let peer_slots = peer_slots(cluster.as_deref());
        let reserve = crate::fds::reserve(peer_slots);
        cfg.limits.max_connections =
            crate::fds::cap_connections(cfg.limits.max_connections, reserve);
        let registry = with_aliases(registry, &cfg).map_err(ServerError::Config)?;
        let listener = bind_listener(cfg.listen)
            .await
            .map_err(|error| ServerError::Bind {
                addr: cfg.listen,
                error,
            })?;
        let tls = cfg
            .tls
            .server_config()
            .map_err(|e| ServerError::Config(e.to_string()))?;
        // Before the engine builds graphs: their UDLs' series register
        // against the recorder installed here.
        if let Some(addr) = cfg.metrics.listen {
            crate::metrics::install(addr).map_err(ServerError::Config)?;
        }
        let watches = Arc::new(WatchHub::default());
        store.add_observer(watches.clone());
        if cfg.persistent.enabled {
            spawn_compactor(
                Arc::downgrade(&store),
                std::time::Duration::from_secs(cfg.persistent.compact_every_s.max(1)),
            );
        }
        let engine = Engine::start(
            &store,
            registry,
            EngineConfig {
                node_id: cfg.node_id,
                workers: cfg.compute.workers,
                queue_len: cfg.compute.queue_len,
                // A cluster's graphs live in its metadata group.
                persist_path: cluster.is_none().then(|| cfg.data_dir.join("dfgs.json")),
            },
            Some(watches.clone() as Arc<dyn sluice_compute::Publisher>),
            cluster
                .clone()
                .map(|c| c as Arc<dyn sluice_compute::Membership>),
        );
        if let Some(ex) =
            crate::otel::Exporter::start(&cfg.otel, cfg.node_id).map_err(ServerError::Config)?
        {
            tracing::info!(
                endpoint = cfg.otel.endpoint.as_deref().unwrap_or_default(),
                "exporting traces to an OpenTelemetry collector"
            );
            engine.set_hop_sink(ex);
        }
        if let Some(c) = &cluster {
            engine.set_writer(c.clone());
            engine.set_reader(c.clone());
            spawn_dfg_reconciler(c, Arc::downgrade(&engine));
            let old = cfg.data_dir.join("dfgs.json");
            if old.exists() {
                tracing::warn!(file = %old.display(), "graphs this node kept before it ran in a cluster are not loaded: a cluster's graphs are those applied through its metadata group (`sluice dfg apply` on any node)");
            }
        }
        match engine.load_persisted() {
            Ok(0) => {}
            Ok(n) => tracing::info!(graphs = n, "data flow graphs restored"),
            Err(e) => {
                tracing::warn!(error = %e, "stored data flow graphs are invalid; starting without them")
            }
        }
        let audit = crate::policy::audit::Audit::open(cfg.policy.audit_log.as_deref())
            .map_err(ServerError::Config)?;
        let policy = Arc::new(match &cluster {
            Some(_) => crate::policy::PolicyState::clustered(audit),
            None => crate::policy::PolicyState::standalone(&cfg.data_dir, audit)
                .map_err(ServerError::Config)?,
        });
        if let Some(c) = &cluster {
            spawn_policy_follower(c, Arc::downgrade(&policy));
        }
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        // Free buffers of large frames kept for reuse (`recv_pool`).
        const RECV_POOL_BYTES: usize = 64 << 20;
        let recv_pool = crate::recv_pool::RecvPool::new(RECV_POOL_BYTES, store.memory.reusable());
        let ctx = Arc::new(ConnCtx {
            conn_slots: Arc::new(Semaphore::new(cfg.limits.max_connections as usize)),
            peer_slots: Arc::new(Semaphore::new(peer_slots)),
            cfg,
            store,
            cluster,
            watches,
            engine,
            stats: ServerStats::default(),
            policy,
            recv_pool,
            listing_budget: crate::listing::Budget::new(crate::listing::BUDGET_BYTES),
            next_conn_id: AtomicU64::new(1),
            shutdown_tx,
            shutdown_rx,
        });
        crate::metrics::spawn_mirror(Arc::downgrade(&ctx));
        Ok(Server {
            listener,
            tls,
            ctx,
            data_lock: None,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.ctx.cfg.listen)
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.ctx.store
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.ctx.engine
    }

    /// The cluster this node is a member of, if any.
    pub fn cluster(&self) -> Option<Arc<sluice_cluster::ClusterNode>> {
        self.ctx.cluster.clone()
    }

    /// Serves until `shutdown` completes, then stops accepting, tells every
    /// connection to finish the requests it has read, and waits for them
    /// (at most `timeouts.shutdown_grace_ms`); a cluster member then stops
    /// its groups. (`sluice serve` hands its leaderships over inside
    /// `shutdown`, so this node serves, with hints to the new leaders,
    /// until that is done.)
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let _data_lock = self.data_lock;
        let ctx = self.ctx;
        let listener = self.listener;
        let at = listener.local_addr().unwrap_or(ctx.cfg.listen);
        if !at.ip().is_loopback() && self.tls.is_none() {
            tracing::warn!(
                addr = %at,
                "listening beyond loopback without TLS: anyone who can reach {at} can read and write every pool, apply data flow graphs and see the traffic; set [tls] (README: Security)"
            );
        }
        let mut conns = tokio::task::JoinSet::new();
        let accept_warnings = sluice_compute::throttle::LogThrottle::default();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => {
                    let (mut sock, peer) = match accepted {
                        Ok(x) => x,
                        Err(e) => {
                            // EMFILE and friends: back off instead of
                            // spinning, and say so a few times, then every
                            // 10 s, not twenty times a second.
                            if let Some(held) = accept_warnings.admit() {
                                tracing::warn!(error = %e, not_logged = held, "accept failed; connecting clients wait in the listen queue");
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let _ = sock.set_nodelay(true);
                    // Full for clients, a cluster node still takes its
                    // peers' connections (a member restarted meanwhile
                    // sends its votes and acknowledgements on connections
                    // of its own): up to `peer_slots` more, each of which
                    // must prove it is a node first.
                    let slot = match ctx.conn_slots.clone().try_acquire_owned() {
                        Ok(p) => Some((p, false)),
                        // (None on a standalone node: it has no peers.)
                        Err(_) => ctx.peer_slots.clone().try_acquire_owned().ok().map(|p| (p, true)),
                    };
                    match slot {
                        Some((permit, peers_only)) => {
                            ctx.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
                            let ctx = ctx.clone();
                            let tls = self.tls.clone();
                            conns.spawn(async move {
                                ctx.stats.connections_open.fetch_add(1, Ordering::Relaxed);
                                match tls {
                                    None => serve_conn(ctx.clone(), sock, peer, None, peers_only).await,
                                    Some(config) => {
                                        let limit = Duration::from_millis(ctx.cfg.timeouts.handshake_ms);
                                        match tokio::time::timeout(limit, sluice_tls::accept(config, sock)).await {
                                            Ok(Ok(tls)) => {
                                                let cert_name = tls
                                                    .peer_certificates()
                                                    .and_then(|c| c.first())
                                                    .and_then(sluice_tls::principal_of);
                                                serve_conn(ctx.clone(), tls, peer, cert_name, peers_only).await
                                            }
                                            Ok(Err(e)) => {
                                                ctx.stats.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
                                                tracing::info!(%peer, error = %e, "TLS handshake failed");
                                            }
                                            Err(_) => {
                                                ctx.stats.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
                                                tracing::info!(%peer, "TLS handshake timed out");
                                            }
                                        }
                                    }
                                }
                                ctx.stats.connections_open.fetch_sub(1, Ordering::Relaxed);
                                drop(permit);
                            });
                        }
                        None => {
                            ctx.stats.connections_rejected.fetch_add(1, Ordering::Relaxed);
                            let max = ctx.cfg.limits.max_connections;
                            tokio::spawn(async move {
                                let mut q = OutQueue::new();
                                Response::error(&mut q, 0, &SluiceError::TooManyConnections { max });
                                let b = q.to_bytes();
                                let _ = tokio::time::timeout(Duration::from_secs(1), sock.write_all(&b)).await;
                            });
                        }
                    }
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        // Closed now, not when the connections have drained: a client
        // connecting meanwhile is refused and tries another node (the
        // kernel would complete its handshake into a queue nobody reads,
        // and its first request would wait for its timeout).
        drop(listener);
        tracing::info!(open = conns.len(), "shutting down: draining connections");
        let _ = ctx.shutdown_tx.send(true);
        let grace = Duration::from_millis(ctx.cfg.timeouts.shutdown_grace_ms);
        let drained =
            tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(
                open = conns.len(),
                "connections still open after the grace period; closing them"
            );
            conns.abort_all();
        }
        if let Some(c) = &ctx.cluster {
            c.shutdown().await;
        }
    }
}

/// Keeps the policies in force here equal to the cluster's: at start and
/// after every metadata change (a change is in force on every node as
/// soon as it has applied the entry). Ends with the node.
fn spawn_policy_follower(
    cluster: &Arc<sluice_cluster::ClusterNode>,
    policy: std::sync::Weak<crate::policy::PolicyState>,
) {
    let mut changes = cluster.meta_changes();
    let cluster = Arc::downgrade(cluster);
    tokio::spawn(async move {
        loop {
            let (Some(c), Some(p)) = (cluster.upgrade(), policy.upgrade()) else {
                return;
            };
            p.install(c.policies());
            drop((c, p));
            if changes.changed().await.is_err() {
                return;
            }
        }
    });
}

/// Keeps the engine's graphs equal to the cluster's table: at start (the
/// metadata log replayed so far) and after every metadata change. Ends
/// with the engine.
fn spawn_dfg_reconciler(
    cluster: &Arc<sluice_cluster::ClusterNode>,
    engine: std::sync::Weak<Engine>,
) {
    let mut changes = cluster.meta_changes();
    let cluster = Arc::downgrade(cluster);
    tokio::spawn(async move {
        let mut seen: Option<std::collections::BTreeMap<String, String>> = None;
        loop {
            // The index first: the graphs read after it are at least as new.
            let Some((index, desired)) = cluster
                .upgrade()
                .map(|c| (c.meta_applied_index(), c.dfgs()))
            else {
                return;
            };
            if seen.as_ref() != Some(&desired) {
                let Some(e) = engine.upgrade() else { return };
                let d = desired.clone();
                // Building UDLs may load models or start worker processes.
                if tokio::task::spawn_blocking(move || e.reconcile(&d))
                    .await
                    .is_err()
                {
                    tracing::error!("the graph reconciler panicked; graphs stay as they were");
                }
                seen = Some(desired);
            }
            // `dfg apply` waits for this on every node.
            if let Some(c) = cluster.upgrade() {
                c.set_dfgs_reconciled(index);
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this host has IPv6 loopback (a container may not).
    fn ipv6_here() -> bool {
        std::net::TcpListener::bind("[::1]:0").is_ok()
    }

    /// `[::]` takes IPv4 and IPv6 clients both (a node named by a host name
    /// listened on IPv4 only, so a name resolving to IPv6 found nothing).
    #[tokio::test]
    async fn a_listener_at_the_ipv6_wildcard_takes_both_families() {
        let l = bind_listener("[::]:0".parse().unwrap()).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let accept = async {
            loop {
                let _ = l.accept().await;
            }
        };
        let connect = async {
            let v4 = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
            assert!(v4.is_ok(), "{v4:?}");
            if ipv6_here() {
                assert!(l.local_addr().unwrap().is_ipv6());
                let v6 = tokio::net::TcpStream::connect(("::1", port)).await;
                assert!(v6.is_ok(), "{v6:?}");
            }
        };
        tokio::select! {
            _ = accept => unreachable!(),
            _ = connect => {}
        }
        // Any other address is bound as given.
        let v4 = bind_listener("127.0.0.1:0".parse().unwrap()).await.unwrap();
        assert!(v4.local_addr().unwrap().is_ipv4());
    }

    #[test]
    fn a_store_that_did_not_open_says_what_to_do() {
        let full = SluiceError::Io {
            reason: "opening the consensus log in /d/raft/p: No space left on device (os error 28)"
                .into(),
        };
        let hint = open_hint("/d", &full);
        assert!(
            hint.contains("the disk holding /d is full: free space"),
            "{hint}"
        );
        let damaged = SluiceError::Io {
            reason: "/d/p/seg-0.log is corrupt at offset 12".into(),
        };
        assert!(open_hint("/d", &damaged).contains("`sluice fsck --data-dir /d`"));
        let other = SluiceError::Io {
            reason: "Permission denied (os error 13)".into(),
        };
        assert_eq!(open_hint("/d", &other), "");
    }
}
