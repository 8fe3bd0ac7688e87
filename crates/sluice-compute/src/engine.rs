//! The dispatcher and the upcall worker pool.

use crate::dfg::{DfgError, DfgFile, Graph, Hook, Policy, ShardDispatcher};
use crate::trie::PrefixTrie;
use crate::udl::{Context, DestMode, Emitter, Publisher, Registry, Udl, Upcall};
use arc_swap::ArcSwap;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::{json, Value};
use sluice_store::{Clock, Delivery, DeliveryKind, DeliveryObserver, ShardId, Store};
use sluice_types::{fnv1a64, Object, Result, SluiceError};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Which member of a shard this node is, for the `one` shard dispatcher.
/// A single node is member 0 of 1 for every shard.
pub trait Membership: Send + Sync {
    /// (this node's index among the shard's members that split its keys,
    /// their count) for the write being delivered now; `None` when this
    /// node takes no share of it (the write's leader counted it as down).
    fn position(&self, shard: ShardId) -> Option<(usize, usize)>;
}

struct SingleNode;
impl Membership for SingleNode {
    fn position(&self, _: ShardId) -> Option<(usize, usize)> {
        Some((0, 1))
    }
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub node_id: u32,
    /// Upcall worker threads (0: one per core).
    pub workers: usize,
    /// Upcalls queued per worker before deliveries are refused.
    pub queue_len: usize,
    /// Where applied graphs are kept across restarts.
    pub persist_path: Option<PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            node_id: 0,
            workers: 0,
            queue_len: 1024,
            persist_path: None,
        }
    }
}

/// Counters of one vertex-UDL.
#[derive(Default)]
struct EntryStats {
    calls: AtomicU64,
    /// Trigger puts announced before their value was in (`Engine::expect`).
    expected: AtomicU64,
    /// Of those, the frames read into memory the lambda lent (`landing`).
    landed: AtomicU64,
    failures: AtomicU64,
    panics: AtomicU64,
    dropped: AtomicU64,
    emitted: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// The warnings of failed (or panicked) calls and of refused upcalls.
    failures_logged: crate::throttle::LogThrottle,
    refusals_logged: crate::throttle::LogThrottle,
}

/// One UDL's series on the node's metrics endpoint (no-ops when the node
/// exports no metrics: handles registered before a recorder exists stay
/// no-ops, which is why the server installs it before building graphs).
struct EntryMetrics {
    calls: metrics::Counter,
    failures: metrics::Counter,
    dropped: metrics::Counter,
    duration: metrics::Histogram,
}

impl EntryMetrics {
    fn new(graph: &str, vertex: &str, udl: &str) -> EntryMetrics {
        let labels = [
            ("graph", graph.to_string()),
            ("vertex", vertex.to_string()),
            ("udl", udl.to_string()),
        ];
        EntryMetrics {
            calls: metrics::counter!("sluice_udl_calls_total", &labels),
            failures: metrics::counter!("sluice_udl_failures_total", &labels),
            dropped: metrics::counter!("sluice_udl_dropped_total", &labels),
            duration: metrics::histogram!("sluice_udl_duration_seconds", &labels),
        }
    }
}

/// One UDL of one vertex, instantiated.
struct Entry {
    graph: String,
    vertex: String,
    name: String,
    udl: Arc<dyn Udl>,
    policy: Policy,
    hook: Hook,
    dispatcher: ShardDispatcher,
    destinations: Vec<(String, DestMode)>,
    stats: EntryStats,
    metrics: EntryMetrics,
}

/// Whether `g` is the graph `json` (normalized, as `Graph::to_json` writes it).
fn same_json(g: &Graph, json: &str) -> bool {
    let current = g.to_json().to_string();
    current == json
}

/// A graph with its instantiated UDLs.
type Built = (Graph, Vec<Arc<Entry>>);

/// Applied graphs by id.
type Graphs = BTreeMap<String, Built>;

/// What `Engine::prepare` built: id -> (normalized JSON, UDLs).
type Staged = BTreeMap<String, (String, Vec<Arc<Entry>>)>;

/// What `Engine::apply_report` applied.
#[derive(Clone, Debug, Default)]
pub struct ApplyReport {
    pub ids: Vec<String>,
    pub notes: Vec<String>,
    /// Graphs an `only_changed` file left running as they were.
    pub unchanged: Vec<String>,
}

/// What `Engine::prepare` checked and built: each graph as (id,
/// normalized JSON), and the file's notes.
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    pub graphs: Vec<(String, String)>,
    pub notes: Vec<String>,
    /// Graphs an `only_changed` file left running as they were.
    pub unchanged: Vec<String>,
}

struct Job {
    entry: Arc<Entry>,
    object: Arc<Object>,
    pool: Arc<str>,
    enqueued_us: u64,
    enqueued_at: Instant,
}

#[derive(Default)]
struct Table {
    trie: PrefixTrie<Arc<Entry>>,
}

#[derive(Default)]
struct Stats {
    upcalls: AtomicU64,
    failures: AtomicU64,
    panics: AtomicU64,
    dropped: AtomicU64,
    /// Upcalls waiting in each worker's queue (raised before a job is
    /// sent, lowered when a worker takes it or the send fails).
    queued: Vec<AtomicU64>,
    /// Upcalls being run (raised before a taken job leaves `queued`,
    /// lowered once it is done): with `queued`, what a stop waits for.
    running: AtomicU64,
}

/// The compute engine of a node: a store observer that dispatches
/// deliveries to UDLs on upcall worker threads.
pub struct Engine {
    cfg: EngineConfig,
    ctx: Arc<Context>,
    registry: Registry,
    table: ArcSwap<Table>,
    graphs: Mutex<Graphs>,
    /// Built by `prepare`, waiting for the cluster's table (id -> JSON, UDLs).
    staged: Mutex<Staged>,
    /// Graphs of the cluster's table this node could not build (id ->
    /// JSON, reason).
    failed: Mutex<BTreeMap<String, (String, String)>>,
    workers: Vec<SyncSender<Job>>,
    rr: AtomicUsize,
    membership: Arc<dyn Membership>,
    stats: Arc<Stats>,
    /// Match + enqueue + dequeue time, per worker, in nanoseconds.
    dispatch_ns: Arc<Vec<Mutex<Histogram<u64>>>>,
}

impl Engine {
    /// Starts the worker threads and registers the engine on `store`.
    pub fn start(
        store: &Arc<Store>,
        registry: Registry,
        cfg: EngineConfig,
        publisher: Option<Arc<dyn Publisher>>,
        membership: Option<Arc<dyn Membership>>,
    ) -> Arc<Engine> {
        let n = if cfg.workers == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            cfg.workers
        };
        let ctx = Arc::new(Context::new(Arc::downgrade(store), publisher, cfg.node_id));
        let stats = Arc::new(Stats {
            queued: (0..n).map(|_| AtomicU64::new(0)).collect(),
            ..Stats::default()
        });
        let hist = || {
            Mutex::new(
                Histogram::new_with_bounds(1, 60_000_000_000, 3)
                    .expect("static histogram bounds are valid"),
            )
        };
        let dispatch_ns: Arc<Vec<Mutex<Histogram<u64>>>> =
            Arc::new((0..n).map(|_| hist()).collect());
        let mut workers = Vec::with_capacity(n);
        for id in 0..n {
            let (tx, rx) = sync_channel::<Job>(cfg.queue_len.max(1));
            workers.push(tx);
            let ctx = ctx.clone();
            let stats = stats.clone();
            let dispatch_ns = dispatch_ns.clone();
            let node_id = cfg.node_id;
            std::thread::Builder::new()
                .name(format!("sluice-upcall-{id}"))
                .spawn(move || worker_loop(id, rx, ctx, stats, dispatch_ns, node_id))
                .expect("spawning an upcall worker thread");
        }
        let engine = Arc::new(Engine {
            cfg,
            ctx,
            registry,
            table: ArcSwap::from_pointee(Table::default()),
            graphs: Mutex::new(BTreeMap::new()),
            staged: Mutex::default(),
            failed: Mutex::default(),
            workers,
            rr: AtomicUsize::new(0),
            membership: membership.unwrap_or_else(|| Arc::new(SingleNode)),
            stats,
            dispatch_ns,
        });
        store.add_observer(engine.clone());
        engine
    }

    /// Parses and checks a DFG file as `apply` would, without building its
    /// UDLs or looking at the pools (which may not exist yet when a node
    /// starts): returns how many graphs it holds.
    pub fn check_file(&self, text: &str) -> std::result::Result<usize, DfgError> {
        DfgFile::parse(text, &self.registry).map(|f| f.graphs.len())
    }

    /// Loads the graphs persisted by an earlier run, if any.
    pub fn load_persisted(&self) -> std::result::Result<usize, DfgError> {
        let Some(p) = &self.cfg.persist_path else {
            return Ok(0);
        };
        let Ok(text) = std::fs::read_to_string(p) else {
            return Ok(0);
        };
        self.apply_checked(&text, false).map(|r| r.ids.len())
    }

    /// The running graphs: id -> normalized JSON.
    fn running(&self) -> BTreeMap<String, String> {
        self.graphs
            .lock()
            .iter()
            .map(|(id, (g, _))| (id.clone(), g.to_json().to_string()))
            .collect()
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Validates a DFG file, instantiates its UDLs and swaps it in (graphs
    /// with the same id are replaced). Returns the applied ids. Nothing
    /// changes when any part is invalid.
    pub fn apply(&self, text: &str) -> std::result::Result<Vec<String>, DfgError> {
        self.apply_checked(text, true).map(|r| r.ids)
    }

    /// `apply`, also returning the file's notes (see `DfgFile::notes`).
    pub fn apply_report(&self, text: &str) -> std::result::Result<ApplyReport, DfgError> {
        self.apply_checked(text, true)
    }

    /// `apply`; `check_pools` also requires every destination to have an
    /// object pool (not when graphs are restored at start: in a cluster
    /// the pool table may still be catching up then).
    fn apply_checked(
        &self,
        text: &str,
        check_pools: bool,
    ) -> std::result::Result<ApplyReport, DfgError> {
        let running = check_pools.then(|| self.running());
        let (file, built, unchanged) = self.build(text, check_pools, running.as_ref())?;
        let mut graphs = self.graphs.lock();
        let ids: Vec<String> = built.iter().map(|(g, _)| g.id.clone()).collect();
        for (g, entries) in built {
            graphs.insert(g.id.clone(), (g, entries));
        }
        self.install(&graphs);
        tracing::info!(graphs = ?ids, "data flow graphs applied");
        Ok(ApplyReport {
            ids,
            notes: file.notes,
            unchanged,
        })
    }

    /// Parses and checks a DFG file and instantiates its UDLs, changing
    /// nothing that runs. With `running` (id -> JSON of the graphs that
    /// run now: a client's apply, not a restore) each graph is stamped
    /// with its `applied_us`, and an `only_changed` file's graphs equal
    /// to running ones are left out (returned by id).
    fn build(
        &self,
        text: &str,
        check_pools: bool,
        running: Option<&BTreeMap<String, String>>,
    ) -> std::result::Result<(DfgFile, Vec<Built>, Vec<String>), DfgError> {
        let mut file = DfgFile::parse(text, &self.registry)?;
        if check_pools && file.graphs.is_empty() {
            return Err(DfgError {
                path: "$".into(),
                reason: "the file holds no data flow graph: nothing to apply \
                         (`sluice dfg rm ID` removes a graph)"
                    .into(),
            });
        }
        let mut unchanged = Vec::new();
        if let Some(running) = running {
            let now = sluice_types::wall_us();
            let mut kept = Vec::new();
            for mut g in std::mem::take(&mut file.graphs) {
                let before = running.get(&g.id).and_then(|json| {
                    DfgFile::parse(&format!("[{json}]"), &self.registry)
                        .ok()
                        .and_then(|f| f.graphs.into_iter().next())
                });
                if file.only_changed && before.as_ref().is_some_and(|b| b.same_content(&g)) {
                    unchanged.push(g.id);
                    continue;
                }
                // Later than the graph it replaces, whatever the clock did.
                g.applied_us = now.max(before.map_or(0, |b| b.applied_us + 1));
                kept.push(g);
            }
            file.graphs = kept;
        }
        self.check_graphs(&file, check_pools)?;
        let built = self.instantiate(&file)?;
        Ok((file, built, unchanged))
    }

    /// The UDLs of every graph of `file`, created from their configs.
    fn instantiate(&self, file: &DfgFile) -> std::result::Result<Vec<Built>, DfgError> {
        let mut built = Vec::new();
        for (gi, g) in file.graphs.iter().enumerate() {
            let mut entries = Vec::new();
            for (vi, v) in g.vertices.iter().enumerate() {
                for (ui, u) in v.udls.iter().enumerate() {
                    let factory = self.registry.factory(&u.name).ok_or_else(|| DfgError {
                        path: format!("$[{gi}].graph[{vi}].user_defined_logic_list[{ui}]"),
                        reason: format!("unknown UDL {:?}", u.name),
                    })?;
                    let udl = factory
                        .create(&u.config, &self.ctx)
                        .map_err(|reason| DfgError {
                            path: format!(
                                "$[{gi}].graph[{vi}].user_defined_logic_config_list[{ui}]"
                            ),
                            reason,
                        })?;
                    entries.push(Arc::new(Entry {
                        graph: g.id.clone(),
                        vertex: v.pathname.clone(),
                        name: u.name.clone(),
                        udl,
                        policy: u.policy,
                        hook: u.hook,
                        dispatcher: u.dispatcher,
                        destinations: u.destinations.clone(),
                        stats: EntryStats::default(),
                        metrics: EntryMetrics::new(&g.id, &v.pathname, &u.name),
                    }));
                }
            }
            built.push((g.clone(), entries));
        }
        Ok(built)
    }

    /// A cluster's first half of an apply: checks the file and builds its
    /// UDLs (so a bad config fails here, on the node that was asked),
    /// keeping them staged for `reconcile`. Returns each graph in its
    /// normalized form (UDL names resolved), which the metadata group
    /// replicates to every node.
    ///
    /// `running` is the cluster's table (id -> JSON) the graphs are
    /// compared with (see `build`).
    pub fn prepare(
        &self,
        text: &str,
        running: &BTreeMap<String, String>,
    ) -> std::result::Result<Prepared, DfgError> {
        let (file, built, unchanged) = self.build(text, true, Some(running))?;
        let mut staged = self.staged.lock();
        let graphs = built
            .into_iter()
            .map(|(g, entries)| {
                let json = g.to_json().to_string();
                staged.insert(g.id.clone(), (json.clone(), entries));
                (g.id, json)
            })
            .collect();
        Ok(Prepared {
            graphs,
            notes: file.notes,
            unchanged,
        })
    }

    /// Drops what `prepare` staged for `ids` (the cluster did not take it).
    pub fn unstage(&self, ids: &[String]) {
        let mut staged = self.staged.lock();
        for id in ids {
            staged.remove(id);
        }
    }

    /// Makes the running graphs those of `desired` (id -> normalized JSON,
    /// the metadata group's table): graphs whose JSON changed are built
    /// (or taken from `prepare`) and swapped in, graphs not in it are
    /// removed. A graph this node cannot build (a UDL it lacks, a model it
    /// cannot load) is kept as failed with the reason, and the rest runs.
    pub fn reconcile(&self, desired: &BTreeMap<String, String>) {
        let mut graphs = self.graphs.lock();
        let mut failed = self.failed.lock();
        let mut changed = false;
        let stale: Vec<String> = graphs
            .keys()
            .filter(|id| !desired.contains_key(*id))
            .cloned()
            .collect();
        for id in stale {
            graphs.remove(&id);
            tracing::info!(graph = %id, "data flow graph removed");
            changed = true;
        }
        failed.retain(|id, _| desired.contains_key(id));
        for (id, json) in desired {
            if graphs.get(id).is_some_and(|(g, _)| same_json(g, json))
                || failed.get(id).is_some_and(|(j, _)| j == json)
            {
                continue;
            }
            // Checked by the node that proposed it; built here unless that
            // node was this one.
            let staged = self.staged.lock().remove(id);
            let built =
                DfgFile::parse(&format!("[{json}]"), &self.registry).and_then(|f| match staged {
                    Some((j, entries)) if j == *json => {
                        Ok(f.graphs.into_iter().next().map(|g| (g, entries)))
                    }
                    _ => self.instantiate(&f).map(|b| b.into_iter().next()),
                });
            match built {
                Ok(Some((g, entries))) => {
                    tracing::info!(graph = %id, "data flow graph applied");
                    failed.remove(id);
                    graphs.insert(id.clone(), (g, entries));
                    changed = true;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(graph = %id, error = %e, "cannot run this data flow graph on this node");
                    if graphs.remove(id).is_some() {
                        changed = true;
                    }
                    failed.insert(id.clone(), (json.clone(), e.to_string()));
                }
            }
        }
        if changed {
            self.install(&graphs);
        }
    }

    /// Rejects destinations without a pool and destinations that lead back
    /// to a vertex they came from (across every installed graph too),
    /// naming the cycle: such a graph would spin a core forever.
    fn check_graphs(&self, file: &DfgFile, check_pools: bool) -> std::result::Result<(), DfgError> {
        let store = self.ctx.store().ok();
        let mut vertices: Vec<(String, Vec<String>)> = Vec::new();
        for (gi, g) in file.graphs.iter().enumerate() {
            for (vi, v) in g.vertices.iter().enumerate() {
                let mut dests = Vec::new();
                for (ui, u) in v.udls.iter().enumerate() {
                    for (di, (d, _)) in u.destinations.iter().enumerate() {
                        if let (true, Some(store)) = (check_pools, &store) {
                            if store.pool_of_key(&crate::udl::join_key(d, "x")).is_err() {
                                return Err(DfgError {
                                    path: format!("$[{gi}].graph[{vi}].destinations[{ui}][{di}]"),
                                    reason: format!(
                                        "destination {d:?} of vertex {:?} has no object pool; create one first (sluice pools create <path> --type ...)",
                                        v.pathname
                                    ),
                                });
                            }
                        }
                        dests.push(d.clone());
                    }
                }
                vertices.push((v.pathname.clone(), dests));
            }
        }
        let replaced: Vec<&str> = file.graphs.iter().map(|g| g.id.as_str()).collect();
        for (id, (g, _)) in self.graphs.lock().iter() {
            if replaced.contains(&id.as_str()) {
                continue;
            }
            for v in &g.vertices {
                let dests = v
                    .udls
                    .iter()
                    .flat_map(|u| u.destinations.iter().map(|(d, _)| d.clone()))
                    .collect();
                vertices.push((v.pathname.clone(), dests));
            }
        }
        match crate::dfg::find_cycle(&vertices) {
            None => Ok(()),
            Some(cycle) => Err(DfgError {
                path: "$".into(),
                reason: format!(
                    "the destinations form a cycle: {}; an object would go round it forever",
                    cycle.join(" -> ")
                ),
            }),
        }
    }

    /// Removes a graph; its in-flight upcalls finish.
    pub fn remove(&self, id: &str) -> Result<()> {
        let mut graphs = self.graphs.lock();
        if graphs.remove(id).is_none() {
            return Err(SluiceError::DfgNotFound { id: id.to_string() });
        }
        self.install(&graphs);
        tracing::info!(graph = id, "data flow graph removed");
        Ok(())
    }

    fn install(&self, graphs: &Graphs) {
        let mut t = Table::default();
        for (_, entries) in graphs.values() {
            for e in entries {
                t.trie.insert(&e.vertex.clone(), e.clone());
            }
        }
        self.table.store(Arc::new(t));
        if let Some(p) = &self.cfg.persist_path {
            let all: Vec<Value> = graphs.values().map(|(g, _)| g.to_json()).collect();
            let tmp = p.with_extension("tmp");
            let res = serde_json::to_vec_pretty(&all)
                .map_err(std::io::Error::other)
                .and_then(|b| std::fs::write(&tmp, b))
                .and_then(|_| std::fs::rename(&tmp, p));
            if let Err(e) = res {
                tracing::warn!(path = %p.display(), error = %e, "cannot persist data flow graphs");
            }
        }
    }

    /// The applied graphs with per-UDL counters.
    pub fn list(&self) -> Value {
        let graphs = self.graphs.lock();
        let out: Vec<Value> = graphs
            .values()
            .map(|(g, entries)| {
                let mut j = g.to_json();
                let status: Vec<Value> = entries
                    .iter()
                    .map(|e| {
                        let s = &e.stats;
                        let mut j = json!({
                            "vertex": e.vertex,
                            "udl": e.name,
                            "calls": s.calls.load(Ordering::Relaxed),
                            "expected": s.expected.load(Ordering::Relaxed),
                            "landed": s.landed.load(Ordering::Relaxed),
                            "emitted": s.emitted.load(Ordering::Relaxed),
                            "failures": s.failures.load(Ordering::Acquire),
                            "panics": s.panics.load(Ordering::Acquire),
                            "dropped": s.dropped.load(Ordering::Relaxed),
                            "last_error": *s.last_error.lock(),
                        });
                        if let Some(c) = e.udl.counters() {
                            j["counters"] = c;
                        }
                        j
                    })
                    .collect();
                j["status"] = Value::Array(status);
                j["state"] = json!("running");
                j
            })
            .collect();
        let mut out = out;
        for (id, (text, reason)) in self.failed.lock().iter() {
            let mut j: Value = serde_json::from_str(text).unwrap_or_else(|_| json!({"id": id}));
            j["state"] = json!("failed");
            j["error"] = json!(reason);
            out.push(j);
        }
        Value::Array(out)
    }

    /// Engine counters, with the dispatch overhead (match + enqueue +
    /// dequeue) percentiles.
    /// Routes the lambdas' puts through `writer` (a cluster: replicated
    /// shards are written through their leader, not into the local store).
    pub fn set_writer(&self, writer: Arc<dyn crate::Writer>) {
        *self.ctx.writer.write() = Some(writer);
    }

    /// Routes the lambdas' reads of keys this node holds no copy of
    /// through `reader` (a cluster: to a member of the key's shard).
    /// Tells `sink` of every upcall of a traced object as it finishes
    /// (trace export; unset, an upcall pays one uncontended read lock).
    pub fn set_hop_sink(&self, sink: Arc<dyn crate::udl::HopSink>) {
        *self.ctx.hop_sink.write() = Some(sink);
    }

    pub fn set_reader(&self, reader: Arc<dyn crate::udl::Reader>) {
        *self.ctx.reader.write() = Some(reader);
    }

    pub fn stats(&self) -> Value {
        let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
            .expect("static histogram bounds are valid");
        for h in self.dispatch_ns.iter() {
            let _ = all.add(&*h.lock());
        }
        let us = |q: f64| all.value_at_quantile(q) as f64 / 1000.0;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "workers": self.workers.len(),
            "queue_len": self.cfg.queue_len,
            "graphs": self.graphs.lock().len(),
            "upcalls": g(&self.stats.upcalls),
            "failures": g(&self.stats.failures),
            "panics": g(&self.stats.panics),
            "dropped": g(&self.stats.dropped),
            "queued": self.stats.queued.iter().map(g).collect::<Vec<_>>(),
            "dispatch_overhead_us": {
                "count": all.len(),
                "p50": us(0.5),
                "p99": us(0.99),
                "p999": us(0.999),
            },
        })
    }

    /// A trigger put of `key` is arriving (its value still in transit):
    /// the lambdas of the vertices it will fire get `Udl::expect`, so a
    /// worker that sleeps can wake while the value comes in. Where `land`
    /// (the sender may trigger `key`), the first of them that lends memory
    /// for the frame (`Udl::landing`: `frame_len` bytes, the value from
    /// `value_at` on) gets it read there. Cheap and non-blocking (the
    /// connection's thread calls it).
    pub fn expect(
        &self,
        key: &str,
        frame_len: usize,
        value_at: usize,
        land: bool,
    ) -> Option<crate::landing::Landing> {
        let table = self.table.load();
        if table.trie.is_empty() {
            return None;
        }
        let mut matches = Vec::new();
        table.trie.matches(key, &mut matches);
        let mut landing = None;
        for entry in matches {
            if matches!(entry.hook, Hook::Both | Hook::Trigger) {
                entry.stats.expected.fetch_add(1, Ordering::Relaxed);
                entry.udl.expect();
                if land && landing.is_none() {
                    landing = entry.udl.landing(frame_len, value_at);
                    if landing.is_some() {
                        entry.stats.landed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        landing
    }

    /// Upcalls queued or running on this node's workers now: a node that
    /// stops waits for none to be left (`sluice serve`'s drain), so the
    /// lambdas of puts it applied run before it exits.
    pub fn pending(&self) -> u64 {
        // Queued first: a worker raises `running` before it lowers
        // `queued`, so a job moving between the two is seen in one.
        let queued: u64 = self
            .stats
            .queued
            .iter()
            .map(|q| q.load(Ordering::SeqCst))
            .sum();
        queued + self.stats.running.load(Ordering::SeqCst)
    }

    /// Clears the dispatch-overhead histograms (benchmarks call this
    /// between phases).
    pub fn reset_dispatch_stats(&self) {
        for h in self.dispatch_ns.iter() {
            h.lock().reset();
        }
    }
}

impl DeliveryObserver for Engine {
    fn on_delivery(&self, d: &Delivery<'_>) -> Result<()> {
        let table = self.table.load();
        if table.trie.is_empty() || d.kind == DeliveryKind::Remove {
            return Ok(());
        }
        let t0 = Instant::now();
        let mut matches = Vec::new();
        table.trie.matches(&d.object.key, &mut matches);
        if matches.is_empty() {
            return Ok(());
        }
        let enqueued_us = Clock::wall_us();
        let pool: Arc<str> = Arc::from(d.pool.pathname.as_str());
        let mut first_err = None;
        for entry in matches {
            let fires = matches!(
                (entry.hook, d.kind),
                (Hook::Both, _)
                    | (Hook::Trigger, DeliveryKind::TriggerPut)
                    | (Hook::Ordered, DeliveryKind::Put)
            );
            if !fires {
                continue;
            }
            // A trigger put reaches only the member it was sent to: that
            // member runs it. A stored put is applied on every replica:
            // `one` picks a single member per key.
            if entry.dispatcher == ShardDispatcher::One && d.kind != DeliveryKind::TriggerPut {
                let Some((me, n)) = self.membership.position(d.shard) else {
                    continue;
                };
                if n > 1 && (fnv1a64(d.object.key.as_bytes()) % n as u64) as usize != me {
                    continue;
                }
            }
            let n = self.workers.len();
            let w = match entry.policy {
                Policy::Stateless => self.rr.fetch_add(1, Ordering::Relaxed) % n,
                Policy::Stateful => (fnv1a64(d.object.key.as_bytes()) % n as u64) as usize,
                Policy::SingleThreaded => 0,
            };
            let job = Job {
                entry: entry.clone(),
                object: d.object.clone(),
                pool: pool.clone(),
                enqueued_us,
                enqueued_at: t0,
            };
            self.stats.queued[w].fetch_add(1, Ordering::Relaxed);
            match self.workers[w].try_send(job) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    self.stats.queued[w].fetch_sub(1, Ordering::Relaxed);
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    entry.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    entry.metrics.dropped.increment(1);
                    if let Some(held) = entry.stats.refusals_logged.admit() {
                        tracing::warn!(key = %d.object.key, vertex = %entry.vertex, udl = %entry.name, worker = w, not_logged = held, "upcall queue full; upcall refused (not_logged: refusals since the last line, each counted in `sluice dfg ls`)");
                    }
                    first_err.get_or_insert(SluiceError::Unavailable {
                        reason: format!(
                            "upcall queue of worker {w} is full ({} queued) for vertex {} ({}); slow down or retry",
                            self.cfg.queue_len, entry.vertex, entry.name
                        ),
                    });
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

fn worker_loop(
    id: usize,
    rx: Receiver<Job>,
    ctx: Arc<Context>,
    stats: Arc<Stats>,
    dispatch_ns: Arc<Vec<Mutex<Histogram<u64>>>>,
    node_id: u32,
) {
    while let Ok(job) = rx.recv() {
        stats.running.fetch_add(1, Ordering::SeqCst);
        stats.queued[id].fetch_sub(1, Ordering::SeqCst);
        let waited = job.enqueued_at.elapsed().as_nanos() as u64;
        let _ = dispatch_ns[id].lock().record(waited.max(1));
        let started_us = Clock::wall_us();
        let e = &job.entry;
        let call = Upcall {
            sender: node_id,
            pool: &job.pool,
            key: &job.object.key,
            object: &job.object,
            vertex: &e.vertex,
            worker_id: id,
        };
        let mut emitter = Emitter::new(
            &ctx,
            &e.destinations,
            &job.object,
            &e.vertex,
            job.enqueued_us,
            started_us,
        );
        stats.upcalls.fetch_add(1, Ordering::Relaxed);
        e.stats.calls.fetch_add(1, Ordering::Relaxed);
        e.metrics.calls.increment(1);
        let started = std::time::Instant::now();
        let span = tracing::debug_span!(
            "upcall",
            key = %job.object.key,
            version = job.object.meta.version,
            vertex = %e.vertex,
            udl = %e.name,
            worker = id,
            trace_id = job.object.trace.as_ref().map(|t| t.id)
        );
        let _entered = span.enter();
        let result =
            std::panic::catch_unwind(AssertUnwindSafe(|| e.udl.handle(&call, &mut emitter, &ctx)));
        e.metrics.duration.record(started.elapsed().as_secs_f64());
        e.stats
            .emitted
            .fetch_add(emitter.emitted() as u64, Ordering::Relaxed);
        let ok = matches!(result, Ok(Ok(())));
        if !ok {
            e.metrics.failures.increment(1);
        }
        if let Some(t) = job.object.trace.as_deref().filter(|t| t.is_timed()) {
            if let Some(sink) = ctx.hop_sink.read().as_ref() {
                sink.on_hop(&crate::udl::HopDone {
                    trace: t,
                    stage: &e.vertex,
                    udl: &e.name,
                    key: &job.object.key,
                    enqueued_us: job.enqueued_us,
                    started_us,
                    finished_us: Clock::wall_us(),
                    ok,
                    node_id,
                });
            }
        }
        match result {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                // The error first: whoever sees the count sees its error.
                *e.stats.last_error.lock() = Some(format!("{}: {err}", job.object.key));
                stats.failures.fetch_add(1, Ordering::Relaxed);
                e.stats.failures.fetch_add(1, Ordering::Release);
                if let Some(held) = e.stats.failures_logged.admit() {
                    tracing::warn!(key = %job.object.key, vertex = %e.vertex, udl = %e.name, graph = %e.graph, error = %err, not_logged = held, "UDL failed (not_logged: failures since the last line, each counted in `sluice dfg ls`)");
                }
            }
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".into());
                *e.stats.last_error.lock() = Some(format!("{}: panic: {msg}", job.object.key));
                stats.panics.fetch_add(1, Ordering::Relaxed);
                e.stats.panics.fetch_add(1, Ordering::Release);
                if let Some(held) = e.stats.failures_logged.admit() {
                    tracing::error!(key = %job.object.key, vertex = %e.vertex, udl = %e.name, panic = %msg, not_logged = held, "UDL panicked; worker continues (not_logged: failures since the last line, each counted in `sluice dfg ls`)");
                }
            }
        }
        stats.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Weak handle for places that must not keep the engine alive.
pub type EngineRef = Weak<Engine>;
