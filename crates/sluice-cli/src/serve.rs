use anyhow::{Context, Result};
use sluice_server::{Server, ServerConfig};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML config file (see examples/node.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on: `127.0.0.1:7420`, `[::]:7420`, `:7420` (every
    /// interface), `localhost:7420` (a name, looked up at start); port 0
    /// picks a free port and prints it.
    #[arg(long, value_parser = sluice_server::parse_listen)]
    listen: Option<SocketAddr>,
    /// Data directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// This node's id (with --cluster: its entry in the layout's `[[nodes]]`).
    #[arg(long)]
    node_id: Option<u32>,
    /// Join the cluster described by this layout file (TOML); the node
    /// listens on its address there unless --listen says otherwise.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Data flow graphs to run from the start (Cascade reads its dfgs.json
    /// at start-up): applied on this node, or in a cluster through the
    /// metadata group once it has a leader and the graphs' pools exist.
    #[arg(long)]
    dfgs: Option<PathBuf>,
    /// Alias file for UDL names in --dfgs and in later `dfg apply`s
    /// (`<uuid> <udl>` per line; adds to the config's `[udl_aliases]`).
    #[arg(long)]
    udl_aliases: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (the config's
    /// `[metrics] listen`; off by default).
    #[arg(long, value_name = "ADDR", value_parser = sluice_server::parse_listen)]
    metrics: Option<SocketAddr>,
    /// Accept `sluice cluster cut/heal/disk-full` (dropping links to peers, a
    /// full disk): tests only.
    #[arg(long, hide = true)]
    fault_injection: bool,
}

/// The log filter when `SLUICE_LOG` is unset or empty: Sluice at info,
/// raft-rs's own lines at warn. Its info lines (three per election round
/// per group: a node cut off from its peers wrote dozens a second) say
/// what Sluice's own do once per change ("this node is now the leader",
/// "following a new leader", "no leader: election in progress").
pub const DEFAULT_LOG: &str = "info,raft=warn";

pub fn init_tracing() {
    let filter = match std::env::var("SLUICE_LOG") {
        Ok(f) if !f.trim().is_empty() => {
            tracing_subscriber::EnvFilter::try_new(f).unwrap_or_else(|e| {
                eprintln!("SLUICE_LOG: {e}; logging with {DEFAULT_LOG:?}");
                DEFAULT_LOG.into()
            })
        }
        _ => DEFAULT_LOG.into(),
    };
    // Colour only on a terminal: a log file gets plain text.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn load_config(a: &ServeArgs) -> Result<ServerConfig> {
    let mut cfg = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading config {}", p.display()))?;
            ServerConfig::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("config {}: {e}", p.display()))?
        }
        None => ServerConfig::default(),
    };
    if let Some(l) = a.listen {
        cfg.listen = l;
    }
    if let Some(d) = &a.data_dir {
        cfg.data_dir = d.clone();
    }
    if let Some(n) = a.node_id {
        cfg.node_id = n;
    }
    if let Some(p) = &a.cluster {
        cfg.cluster.layout = Some(p.clone());
    }
    if a.fault_injection {
        cfg.cluster.fault_injection = true;
    }
    if let Some(m) = a.metrics {
        cfg.metrics.listen = Some(m);
    }
    if let Some(p) = &a.udl_aliases {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        for (alias, udl) in sluice_compute::dfg::parse_aliases(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        {
            cfg.udl_aliases.insert(alias, udl);
        }
    }
    if let (Some(p), None) = (&cfg.cluster.layout, a.listen) {
        let text = std::fs::read_to_string(p)
            .with_context(|| format!("reading cluster layout {}", p.display()))?;
        let l = sluice_types::cluster::ClusterLayout::from_text(&text)
            .map_err(|e| anyhow::anyhow!("cluster layout {}: {e}", p.display()))?;
        cfg.listen = l
            .address_of(cfg.node_id)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "node {} is not in the [[nodes]] of {}",
                    cfg.node_id,
                    p.display()
                )
            })?
            .listen_addr();
    }
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    Ok(cfg)
}

/// Large values (up to 64 MiB) come from the heap rather than fresh
/// mmaps: a freed 1 MB buffer is reused instead of being returned to the
/// kernel and faulted in again page by page on the next request.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts glibc malloc parameters; called before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

pub fn run(a: ServeArgs) -> Result<()> {
    tune_allocator();
    init_tracing();
    let cfg = load_config(&a)?;
    let dfgs = match &a.dfgs {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if cfg.worker_threads > 0 {
        rt.worker_threads(cfg.worker_threads);
    }
    let rt = rt.enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        let data_dir = cfg.data_dir.clone();
        let node_id = cfg.node_id;
        let clustered = cfg.cluster.layout.is_some();
        let self_tls = crate::tls::of_node(&cfg)?;
        let grace = std::time::Duration::from_millis(cfg.timeouts.shutdown_grace_ms);
        let server = Server::bind(cfg).await?;
        if let Some(text) = dfgs {
            // A file that cannot apply fails the start, on a cluster too
            // (where it is applied once the metadata group has a leader
            // and the graphs' pools exist, and would otherwise be retried
            // for ever with one line in the log).
            let path = a
                .dfgs
                .as_deref()
                .unwrap_or(std::path::Path::new("?"))
                .display();
            let n = server
                .engine()
                .check_file(&text)
                .map_err(|e| anyhow::anyhow!("--dfgs {path}: {e}"))?;
            // Every start applies the file again: graphs that already run
            // as given (restored from the data directory, or the
            // cluster's) keep running, their lambdas not built twice or
            // restarted on every node.
            let text = sluice_compute::dfg::only_changed(&text)
                .map_err(|e| anyhow::anyhow!("--dfgs {path}: {e}"))?;
            if n == 0 {
                tracing::info!("--dfgs {path} holds no data flow graph: nothing to apply");
            } else if clustered {
                tokio::spawn(apply_at_start(server.local_addr(), text, self_tls));
            } else {
                let r = server
                    .engine()
                    .apply_report(&text)
                    .map_err(|e| anyhow::anyhow!("--dfgs {path}: {e}"))?;
                tracing::info!(graphs = ?r.ids, unchanged = ?r.unchanged, notes = ?r.notes, "graphs from --dfgs applied");
            }
        }
        // Listening before the line that scripts wait for, so a signal
        // sent as soon as they read it still stops the node in order.
        let mut stop = StopSignals::listen()?;
        // Scripts and tests read this line to learn the port.
        println!(
            "sluice: node {node_id} listening on {} (data dir {})",
            server.local_addr(),
            data_dir.display()
        );
        let _ = std::io::stdout().flush();
        let (cluster, engine) = (server.cluster(), server.engine().clone());
        server
            .run(async move {
                let which = stop.recv().await;
                tracing::info!("{which} received");
                // A second signal stops it at once.
                tokio::select! {
                    () = before_stop(cluster, engine, grace) => {},
                    which = stop.recv() => tracing::info!("{which} received again: stopping at once"),
                }
            })
            .await;
        tracing::info!("stopped");
        Ok(())
    })
}

/// What a node does on SIGINT/SIGTERM before it stops serving, while it
/// still serves (and points clients at the new leaders): a leader hands
/// its groups over; a member tells its shards' leaders it is stopping, so
/// the others take its share of the lambdas from then on, and applies
/// what they had; then the lambdas queued or running here finish (a stop
/// dropped them: acknowledged puts whose lambda never ran). The last two
/// take at most `grace` each (`timeouts.shutdown_grace_ms`).
async fn before_stop(
    cluster: Option<std::sync::Arc<sluice_server::ClusterNode>>,
    engine: std::sync::Arc<sluice_server::Engine>,
    grace: std::time::Duration,
) {
    if let Some(c) = &cluster {
        let n = c.hand_over_leadership().await;
        if n > 0 {
            tracing::info!(groups = n, "leadership handed over; stopping");
        }
        c.leave_lambdas(grace).await;
    }
    let deadline = tokio::time::Instant::now() + grace;
    let pending = engine.pending();
    if pending > 0 {
        tracing::info!(
            pending,
            "letting the lambdas queued here run before stopping"
        );
    }
    // Polled: a stop is rare, and the engine's workers are plain threads.
    while engine.pending() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let left = engine.pending();
    if left > 0 {
        tracing::warn!(
            left,
            grace_ms = grace.as_millis() as u64,
            "stopping with lambdas still queued (timeouts.shutdown_grace_ms)"
        );
    }
}

/// Applies `--dfgs` to the cluster through this node once it can: the
/// metadata group needs a leader and the graphs' pools must exist. Each
/// new reason to wait is logged once.
async fn apply_at_start(addr: SocketAddr, text: String, tls: Option<sluice_tls::ClientTls>) {
    let mut last = String::new();
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        let cfg = sluice_client::ClientConfig {
            addr: addr.to_string(),
            tls: tls.clone(),
            ..Default::default()
        };
        let r = match sluice_client::Client::connect_with(cfg).await {
            Ok(c) => c.dfg_apply(&text).await,
            Err(e) => Err(e),
        };
        match r {
            Ok(r) => {
                tracing::info!(graphs = %r["applied"], unchanged = %r["unchanged"], notes = %r["notes"], "graphs from --dfgs applied to the cluster");
                return;
            }
            // Waiting does not change a refusal by the access rules.
            Err(e @ sluice_client::SluiceError::PermissionDenied { .. }) => {
                tracing::error!(error = %e, "graphs from --dfgs not applied: the node applies them as an anonymous client, which the access rules refuse; apply them with `sluice dfg apply` as an admin");
                return;
            }
            Err(e) => {
                let why = e.to_string();
                if why != last {
                    tracing::warn!(error = %why, "graphs from --dfgs not applied yet; retrying");
                    last = why;
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(5));
    }
}

/// SIGINT and SIGTERM, listened for from the moment this is made (inside
/// a runtime), so one that comes before anything awaits `recv` is kept.
pub(crate) struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub(crate) fn listen() -> Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            int: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
            term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
        })
    }

    /// Completes on the first SIGINT or SIGTERM; says which.
    pub(crate) async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}
