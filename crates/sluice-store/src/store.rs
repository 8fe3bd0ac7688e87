use crate::clock::Clock;
use crate::layout::{Layout, ShardId};
use crate::shard::Shard;
use arc_swap::ArcSwap;
use bytes::Bytes;
use parking_lot::Mutex;
use sluice_types::key::path_covers;
use sluice_types::object::fmt_version;
use sluice_types::pool::validate_spec;
use sluice_types::{
    validate_key, Object, ObjectMeta, PoolMeta, PoolRouter, PoolSpec, PoolTable, PoolType,
    PurgeReport, PutResult, Result, SluiceError, Trace, VERSION_NONE,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How the store is set up.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub layout: Layout,
    pub max_key_bytes: usize,
    /// Where the pool table is kept (written atomically on every change).
    /// None keeps it in memory only (tests, embedded demos).
    pub pool_table_path: Option<PathBuf>,
    /// Pools created when no pool table exists yet.
    pub default_pools: Vec<PoolSpec>,
    /// Where shards of persistent pools keep their logs. None: persistent
    /// pools are not supported (creating one is `NotSupported`).
    pub persistent_dir: Option<PathBuf>,
    /// When persistent puts reach the disk.
    pub persistent_sync: sluice_log::SyncPolicy,
    /// Segment size of persistent shards' logs (they roll over past it).
    pub persistent_segment_bytes: u64,
    /// Refuse writes that store a value once the node holds this many
    /// bytes in memory (`Limits::max_memory_bytes`, see `memory_in_use`;
    /// 0: no limit).
    pub max_memory_bytes: u64,
    /// This node's id (named by `OutOfMemory`).
    pub node_id: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            layout: Layout::default(),
            max_key_bytes: 1024,
            pool_table_path: None,
            default_pools: sluice_types::pool::default_pools(),
            persistent_dir: None,
            persistent_sync: sluice_log::SyncPolicy::Always,
            persistent_segment_bytes: 64 << 20,
            max_memory_bytes: 0,
            node_id: 0,
        }
    }
}

/// What kind of delivery an observer sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryKind {
    /// A stored (ordered) put.
    Put,
    /// A trigger put: not stored, only delivered.
    TriggerPut,
    /// A remove (the object is the tombstone).
    Remove,
}

/// One delivered object, as observers (watchers, lambdas) see it.
pub struct Delivery<'a> {
    pub pool: &'a PoolMeta,
    pub shard: ShardId,
    pub object: &'a Arc<Object>,
    pub kind: DeliveryKind,
}

/// Hook point for everything that reacts to puts: watch subscriptions and
/// the lambda dispatcher. Called on the writer's thread after the object is
/// visible to readers; must not block. An error (e.g. a full upcall queue)
/// fails a trigger put, which stored nothing and can be retried; for a
/// stored put it is logged and counted by the observer, and the put stands.
pub trait DeliveryObserver: Send + Sync {
    fn on_delivery(&self, delivery: &Delivery<'_>) -> Result<()>;
}

/// What the replication log decided for a write a member applies
/// (`Store::apply_write`).
pub struct Replicated {
    /// The timestamp every replica gives it.
    pub timestamp_us: u64,
    /// Where the replication log holds the value on disk, if it does; a
    /// persistent shard's history then records only the reference (see
    /// `set_value_resolver`).
    pub at: Option<sluice_log::ValueRef>,
    /// Whether observers (lambdas, watchers) see it: not when a restarted
    /// member applies again a write it had applied before it stopped.
    pub deliver: bool,
}

/// Operation counters.
#[derive(Debug, Default)]
pub struct StoreStats {
    pub puts: AtomicU64,
    pub trigger_puts: AtomicU64,
    pub removes: AtomicU64,
    pub gets: AtomicU64,
    pub list_keys: AtomicU64,
    pub errors: AtomicU64,
}

impl StoreStats {
    pub fn snapshot(&self) -> serde_json::Value {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "puts": g(&self.puts),
            "trigger_puts": g(&self.trigger_puts),
            "removes": g(&self.removes),
            "gets": g(&self.gets),
            "list_keys": g(&self.list_keys),
            "errors": g(&self.errors),
        })
    }
}

/// The pool table with its compiled routers; replaced whole on change.
struct PoolView {
    table: PoolTable,
    routers: HashMap<String, Arc<PoolRouter>>,
}

impl PoolView {
    fn new(table: PoolTable) -> Self {
        let routers = table
            .pools
            .values()
            .map(|p| (p.pathname.clone(), Arc::new(PoolRouter::new(p.clone()))))
            .collect();
        PoolView { table, routers }
    }

    /// This view with `table`, which differs from it in pool `path` only:
    /// the other pools' routers are kept (no regex compiled again).
    fn with_change(&self, table: PoolTable, path: &str) -> Self {
        let mut routers = self.routers.clone();
        match table.pools.get(path) {
            Some(p) => routers.insert(path.to_string(), Arc::new(PoolRouter::new(p.clone()))),
            None => routers.remove(path),
        };
        PoolView { table, routers }
    }
}

/// A node's store: the pool table and the shards it hosts.
pub struct Store {
    cfg: StoreConfig,
    clock: Clock,
    pools: ArcSwap<PoolView>,
    pool_write: Mutex<()>,
    /// Where the pool table is kept (`StoreConfig::pool_table_path`).
    pool_file: Option<crate::pool_file::PoolFile>,
    shards: HashMap<ShardId, Arc<Shard>>,
    observers: ArcSwap<Vec<Arc<dyn DeliveryObserver>>>,
    pub stats: StoreStats,
    /// `StoreConfig::max_memory_bytes`, checked by `admit`.
    pub memory: crate::memory::MemoryLimit,
}

/// Where an operation on a key goes.
/// Holds the pool's router (its metadata included) by `Arc`: routing a
/// request allocates nothing.
struct Routed {
    router: Arc<PoolRouter>,
    shard: Arc<Shard>,
}

impl Routed {
    fn pool(&self) -> &PoolMeta {
        &self.router.pool
    }
}

impl Store {
    /// Opens the store: loads the pool table from `pool_table_path` when it
    /// exists, else creates the default pools.
    pub fn open(cfg: StoreConfig) -> Result<Store> {
        cfg.layout
            .validate()
            .map_err(|reason| SluiceError::Internal { reason })?;
        let clock = Clock::new();
        let mut shards = HashMap::new();
        for id in cfg.layout.all_shards() {
            let mut shard = Shard::new(id);
            if let (PoolType::Persistent, Some(dir)) = (id.pool_type, &cfg.persistent_dir) {
                recover_persistent(
                    &mut shard,
                    dir,
                    cfg.persistent_sync,
                    cfg.persistent_segment_bytes,
                    &clock,
                )?;
            }
            shards.insert(id, Arc::new(shard));
        }
        let store = Store {
            clock,
            pools: ArcSwap::from_pointee(PoolView::new(PoolTable::default())),
            pool_write: Mutex::new(()),
            pool_file: cfg
                .pool_table_path
                .as_deref()
                .map(crate::pool_file::PoolFile::new),
            shards,
            observers: ArcSwap::from_pointee(Vec::new()),
            stats: StoreStats::default(),
            memory: crate::memory::MemoryLimit::new(cfg.node_id, cfg.max_memory_bytes),
            cfg,
        };
        let loaded = match store.pool_file.as_ref().map(|f| f.load()).transpose()? {
            Some(Some(table)) => {
                store.pools.store(Arc::new(PoolView::new(table)));
                true
            }
            _ => false,
        };
        if !loaded {
            let built_in = sluice_types::pool::default_pools();
            for spec in store.cfg.default_pools.clone() {
                // The built-in `/vol` and `/trig` on a layout with no
                // subgroup of their type (`sluice place --export` writes
                // volatile subgroups only) are left out, saying so; a
                // pool the node's config names is created or refused.
                let hostable = spec
                    .pool_type
                    .is_some_and(|t| store.cfg.layout.shards_of(t, spec.subgroup_index).is_some());
                if !hostable && built_in.contains(&spec) {
                    tracing::info!(pool = %spec.pathname, "default pool not created: the layout has no subgroup of its type");
                    continue;
                }
                store.create_pool(&spec)?;
            }
        }
        Ok(store)
    }

    pub fn layout(&self) -> &Layout {
        &self.cfg.layout
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn shard(&self, id: ShardId) -> Option<&Arc<Shard>> {
        self.shards.get(&id)
    }

    pub fn shards(&self) -> impl Iterator<Item = &Arc<Shard>> {
        self.shards.values()
    }

    /// A shard this node holds, or `UnknownShard` naming it.
    fn shard_or_err(&self, shard: ShardId) -> Result<&Arc<Shard>> {
        self.shards
            .get(&shard)
            .ok_or_else(|| SluiceError::UnknownShard {
                subgroup: format!("{}/{}", shard.pool_type, shard.subgroup),
                shard: shard.shard,
            })
    }

    /// Registers an observer for every later delivery.
    pub fn add_observer(&self, obs: Arc<dyn DeliveryObserver>) {
        self.observers.rcu(|cur| {
            let mut v = (**cur).clone();
            v.push(obs.clone());
            v
        });
    }

    // ---- pools ---------------------------------------------------------

    pub fn create_pool(&self, spec: &PoolSpec) -> Result<PoolMeta> {
        self.create_pool_at(spec, self.clock.now_us())
    }

    /// `create_pool` with a given creation time (replicas applying the
    /// same replicated pool change agree on it).
    pub fn create_pool_at(&self, spec: &PoolSpec, created_us: u64) -> Result<PoolMeta> {
        if spec.pool_type == Some(PoolType::Persistent) && self.cfg.persistent_dir.is_none() {
            return Err(SluiceError::NotSupported {
                what: format!(
                    "persistent pool {:?} (persistent pools are not enabled on this node; use --type volatile)",
                    spec.pathname
                ),
            });
        }
        let (pool_type, shard_count) = validate_spec(spec, self.cfg.max_key_bytes, |t, sg| {
            self.cfg.layout.shards_of(t, sg)
        })?;
        let meta = self.change_pools(|t| t.create(spec, pool_type, shard_count, created_us))?;
        tracing::info!(pool = %meta.pathname, pool_type = %meta.pool_type, "pool created");
        Ok(meta)
    }

    pub fn remove_pool(&self, path: &str) -> Result<PoolMeta> {
        let meta = self.change_pools(|t| t.remove(path))?;
        tracing::info!(pool = %path, "pool removed (soft delete)");
        Ok(meta)
    }

    /// Applies one change to a copy of the pool table and installs it
    /// (written to disk first, when the table has a file).
    fn change_pools(
        &self,
        change: impl FnOnce(&mut PoolTable) -> Result<PoolMeta>,
    ) -> Result<PoolMeta> {
        let _g = self.pool_write.lock();
        let mut table = self.pools.load().table.clone();
        let meta = change(&mut table)?;
        self.commit_pools(table, Some(&meta.pathname))?;
        Ok(meta)
    }

    /// Deletes a removed pool's objects for good (every version of a
    /// persistent pool, from memory and disk) and then its entry in the
    /// pool table, which frees the path for a new pool. Keys of other
    /// pools inside the path stay. Interrupted, it can simply run again:
    /// the table entry goes last.
    pub fn purge_pool(&self, path: &str) -> Result<PurgeReport> {
        let (meta, inner) = self.pools.load().table.purge_scope(path)?;
        let mut total = PurgeReport::default();
        for id in self.shards_of_pool(&meta) {
            total += self.purge_shard(id, path, &inner)?;
        }
        self.drop_purged_pool(path)?;
        tracing::info!(pool = %path, keys = total.keys, versions = total.versions, bytes = total.bytes, "pool purged");
        Ok(total)
    }

    /// The last step of a purge: the removed pool leaves the table (its
    /// shards were purged), and its path is free.
    pub fn drop_purged_pool(&self, path: &str) -> Result<PoolMeta> {
        self.change_pools(|t| t.purge(path))
    }

    /// The shards a pool's keys can live on (its type and subgroup).
    pub fn shards_of_pool(&self, pool: &PoolMeta) -> Vec<ShardId> {
        let mut ids: Vec<ShardId> = self
            .shards
            .keys()
            .filter(|id| id.pool_type == pool.pool_type && id.subgroup == pool.subgroup_index)
            .copied()
            .collect();
        ids.sort_by_key(|id| id.shard);
        ids
    }

    /// Deletes from one shard every key under `prefix` but not under one
    /// of `except` (pools inside it), with all their versions; a
    /// persistent shard's history is rewritten without them. Replicas
    /// apply it in log order, with the same arguments, so they agree.
    pub fn purge_shard(
        &self,
        shard: ShardId,
        prefix: &str,
        except: &[String],
    ) -> Result<PurgeReport> {
        let s = self.shard_or_err(shard)?;
        let purged = |k: &str| path_covers(prefix, k) && !except.iter().any(|e| path_covers(e, k));
        let mut report = {
            let _w = s.write_lock.lock();
            // Writes still waiting for their group commit become visible
            // once durable: let them land first, then delete them too.
            if let Some(c) = &s.commit {
                let last = c.state.lock().pending.back().map(|o| o.meta.version);
                if let Some(v) = last {
                    group_commit(s, c, v)?;
                }
            }
            let map = s.objects.pin();
            let doomed: Vec<Arc<str>> = map
                .iter()
                .filter(|(k, _)| purged(k))
                .map(|(k, _)| k.clone())
                .collect();
            for k in &doomed {
                map.remove(k);
            }
            let keys = doomed.len() as u64;
            match &s.history {
                Some(h) => {
                    let (hk, hv) = h.lock().forget(purged).map_err(history_err)?;
                    PurgeReport {
                        keys: keys.max(hk as u64),
                        versions: hv as u64,
                        bytes: 0,
                    }
                }
                None => PurgeReport {
                    keys,
                    versions: keys,
                    bytes: 0,
                },
            }
        };
        if report.versions > 0 && s.history.is_some() {
            // Everything the history no longer indexes leaves the disk.
            report.bytes = self.compact_shard(s, |_, _, _, _| true)?.1;
        }
        Ok(report)
    }

    /// Makes `table` durable and current; `changed`: the one pool it
    /// changed (`None`: possibly any, written whole).
    fn commit_pools(&self, table: PoolTable, changed: Option<&str>) -> Result<()> {
        if let Some(f) = &self.pool_file {
            f.commit(&table, changed)?;
        }
        let view = match changed {
            Some(path) => self.pools.load().with_change(table, path),
            None => PoolView::new(table),
        };
        self.pools.store(Arc::new(view));
        Ok(())
    }

    /// Replaces the whole pool table (a replica installing a snapshot of
    /// the replicated metadata).
    pub fn replace_pool_table(&self, table: PoolTable) -> Result<()> {
        let _g = self.pool_write.lock();
        self.commit_pools(table, None)
    }

    pub fn list_pools(&self, include_deleted: bool) -> Vec<PoolMeta> {
        self.pools.load().table.list(include_deleted)
    }

    pub fn pool_table(&self) -> PoolTable {
        self.pools.load().table.clone()
    }

    pub fn pool_table_version(&self) -> u64 {
        self.pools.load().table.version
    }

    pub fn get_pool(&self, path: &str) -> Result<PoolMeta> {
        self.pools
            .load()
            .table
            .get(path)
            .cloned()
            .ok_or_else(|| SluiceError::PoolNotFound {
                pool: path.to_string(),
            })
    }

    /// The path of the pool a key belongs to, if any (metrics label
    /// requests with it; no key validation, no error).
    pub fn pool_path_of(&self, key: &str) -> Option<String> {
        self.pools
            .load()
            .table
            .pool_of(key)
            .map(|p| p.pathname.clone())
    }

    /// The pool a key belongs to (deleted pools included, flagged).
    pub fn pool_of_key(&self, key: &str) -> Result<PoolMeta> {
        validate_key(key, self.cfg.max_key_bytes)?;
        self.pools
            .load()
            .table
            .pool_of(key)
            .cloned()
            .ok_or_else(|| SluiceError::NoPool {
                key: key.to_string(),
            })
    }

    // ---- routing -------------------------------------------------------

    /// Resolves key -> live pool -> shard, checking the caller's shard when
    /// it routed itself (`claimed`), so a stale client gets `WrongShard`
    /// rather than a silent misroute.
    fn route(&self, key: &str, claimed: Option<u32>) -> Result<Routed> {
        validate_key(key, self.cfg.max_key_bytes)?;
        let view = self.pools.load();
        let pool = view.table.live_pool_of(key)?;
        let router = &view.routers[&pool.pathname];
        let shard_idx = router.shard_of(key);
        if let Some(c) = claimed {
            if c != shard_idx {
                return Err(SluiceError::WrongShard {
                    key: key.to_string(),
                    shard: c,
                    expected: shard_idx,
                    layout_version: self.cfg.layout.version,
                });
            }
        }
        let id = ShardId {
            pool_type: pool.pool_type,
            subgroup: pool.subgroup_index,
            shard: shard_idx,
        };
        let shard = self
            .shards
            .get(&id)
            .cloned()
            .ok_or_else(|| SluiceError::UnknownShard {
                subgroup: format!("{}/{}", id.pool_type, id.subgroup),
                shard: id.shard,
            })?;
        Ok(Routed {
            router: router.clone(),
            shard,
        })
    }

    /// The shard a key lives on (checking the caller's claimed shard
    /// index like every data operation does).
    pub fn shard_id_of(&self, key: &str, claimed: Option<u32>) -> Result<ShardId> {
        self.route(key, claimed).map(|r| r.shard.id)
    }

    fn require_type(r: &Routed, key: &str, op: &str, allowed: &[PoolType]) -> Result<()> {
        let pool = r.pool();
        if allowed.contains(&pool.pool_type) {
            return Ok(());
        }
        let hint = match pool.pool_type {
            PoolType::Trigger => "; trigger pools store nothing (use trigger_put)",
            PoolType::Persistent => "; persistent pools are not supported yet",
            PoolType::Volatile => "",
        };
        Err(SluiceError::WrongPoolType {
            op: op.to_string(),
            key: key.to_string(),
            pool: pool.pathname.clone(),
            pool_type: pool.pool_type.to_string(),
            hint: hint.to_string(),
        })
    }

    fn count_err<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn deliver(&self, r: &Routed, object: &Arc<Object>, kind: DeliveryKind) -> Result<()> {
        let observers = self.observers.load();
        let d = Delivery {
            pool: r.pool(),
            shard: r.shard.id,
            object,
            kind,
        };
        let mut first_err = None;
        for o in observers.iter() {
            if let Err(e) = o.on_delivery(&d) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    // ---- writes --------------------------------------------------------

    /// Stores a new version of `key`. With `expected = Some(v)`, the put
    /// only applies if the key's current version is `v` (`VERSION_NONE`:
    /// the key must not exist, or be removed).
    pub fn put(
        &self,
        key: &str,
        value: Bytes,
        expected: Option<u64>,
        shard: Option<u32>,
    ) -> Result<PutResult> {
        self.put_traced(key, value, expected, shard, None)
    }

    /// `put` carrying a latency trace on the stored object.
    pub fn put_traced(
        &self,
        key: &str,
        value: Bytes,
        expected: Option<u64>,
        shard: Option<u32>,
        trace: Option<Arc<Trace>>,
    ) -> Result<PutResult> {
        let r = self.write(key, Some(value), expected, shard, trace);
        self.count_err(r)
    }

    /// Writes a tombstone version: later gets report not-found.
    pub fn remove(
        &self,
        key: &str,
        expected: Option<u64>,
        shard: Option<u32>,
    ) -> Result<PutResult> {
        let r = self.write(key, None, expected, shard, None);
        self.count_err(r)
    }

    fn write(
        &self,
        key: &str,
        value: Option<Bytes>,
        expected: Option<u64>,
        shard: Option<u32>,
        trace: Option<Arc<Trace>>,
    ) -> Result<PutResult> {
        let r = self.route(key, shard)?;
        if let Some(v) = &value {
            self.admit(v.len())?;
        }
        self.write_routed(&r, key, value, expected, trace, None)
    }

    /// Whether a write storing `adding` more bytes may go ahead under the
    /// node's memory limit (`OutOfMemory` if not). Local writes check it
    /// here; a replicated shard's leader checks it before it proposes (a
    /// replica applying a committed write never refuses it: replicas
    /// would differ).
    pub fn admit(&self, adding: usize) -> Result<()> {
        self.memory.admit(adding)
    }

    /// Applies a replicated write to `shard` with the timestamp the
    /// replication log chose for it, so every replica stores the same
    /// version and timestamp. The pool is looked up by key (deleted pools
    /// included); the shard is taken as given. See `Replicated` for the
    /// rest.
    pub fn apply_write(
        &self,
        shard: ShardId,
        key: &str,
        value: Option<Bytes>,
        expected: Option<u64>,
        trace: Option<Arc<Trace>>,
        how: Replicated,
    ) -> Result<PutResult> {
        validate_key(key, self.cfg.max_key_bytes)?;
        let view = self.pools.load();
        // The pool table is replicated separately (another log): a member
        // may apply a shard's write before the pool's creation. The write
        // must apply the same everywhere, so it never depends on this
        // node's pool table: an unknown pool is described from the shard.
        let router = match view.table.pool_of(key) {
            Some(pool) => view.routers[&pool.pathname].clone(),
            None => Arc::new(PoolRouter::new(PoolMeta {
                pathname: key
                    .split('/')
                    .nth(1)
                    .map_or_else(|| key.to_string(), |s| format!("/{s}")),
                pool_type: shard.pool_type,
                subgroup_index: shard.subgroup,
                sharding_policy: Default::default(),
                shard_count: self
                    .cfg
                    .layout
                    .shards_of(shard.pool_type, shard.subgroup)
                    .unwrap_or(1),
                affinity_set_regex: None,
                object_locations: Default::default(),
                access_policy: Default::default(),
                retention: None,
                deleted: false,
                creation_version: 0,
                creation_timestamp_us: 0,
            })),
        };
        let r = Routed {
            router,
            shard: self.shard_or_err(shard)?.clone(),
        };
        self.clock.observe(how.timestamp_us);
        let res = self.write_routed(&r, key, value, expected, trace, Some(how));
        self.count_err(res)
    }

    /// Every latest object of a shard (tombstones included), for a
    /// replication snapshot.
    pub fn shard_objects(&self, shard: ShardId) -> Vec<Arc<Object>> {
        match self.shards.get(&shard) {
            Some(s) => s.objects.pin().values().cloned().collect(),
            None => Vec::new(),
        }
    }

    /// Replaces a shard's contents with a snapshot taken on another
    /// replica (`shard_objects`) at version `last_version`.
    pub fn install_shard(
        &self,
        shard: ShardId,
        last_version: u64,
        objects: Vec<Arc<Object>>,
    ) -> Result<()> {
        let s = self.shard_or_err(shard)?;
        let _w = s.write_lock.lock();
        let map = s.objects.pin();
        map.clear();
        let mut ts = 0;
        for o in objects {
            ts = ts.max(o.meta.timestamp_us);
            map.insert(o.key.clone(), o);
        }
        self.clock.observe(ts);
        s.visible_ts.fetch_max(ts, Ordering::AcqRel);
        s.set_last_version(last_version);
        Ok(())
    }

    fn write_routed(
        &self,
        r: &Routed,
        key: &str,
        value: Option<Bytes>,
        expected: Option<u64>,
        trace: Option<Arc<Trace>>,
        replicated: Option<Replicated>,
    ) -> Result<PutResult> {
        // A local write: this node's clock, delivered.
        let (timestamp_us, at, deliver) = match replicated {
            Some(r) => (Some(r.timestamp_us), r.at, r.deliver),
            None => (None, None, true),
        };
        let op = if value.is_some() { "put" } else { "remove" };
        Self::require_type(r, key, op, STORED)?;
        let value = value.map(owned_if_small);
        // Whether this write replaces a large value (see below).
        let mut replaced_large = false;
        let (object, kind) = {
            let _w = r.shard.write_lock.lock();
            let map = r.shard.objects.pin();
            // Under group commit the newest version of a key may still be
            // waiting for its fsync: it counts as current for this writer.
            let pending = match &r.shard.commit {
                None => None,
                Some(c) => {
                    let st = c.state.lock();
                    if let Some(f) = &st.failed {
                        return Err(SluiceError::Io {
                            reason: format!("shard {} stopped accepting writes after an fsync failure ({f}); restart the node", r.shard.id),
                        });
                    }
                    st.pending.iter().rev().find(|o| &*o.key == key).cloned()
                }
            };
            let prev = pending.as_ref().or(map.get(key));
            let live = prev.filter(|o| !o.meta.tombstone);
            let current = prev.map_or(VERSION_NONE, |o| o.meta.version);
            if let Some(exp) = expected {
                let ok = if exp == VERSION_NONE {
                    live.is_none()
                } else {
                    exp == current
                };
                if !ok {
                    return Err(SluiceError::VersionConflict {
                        key: key.to_string(),
                        expected: fmt_version(exp),
                        current: if live.is_none() && prev.is_some() {
                            format!("{} (removed)", current)
                        } else {
                            fmt_version(current)
                        },
                    });
                }
            }
            if value.is_none() && live.is_none() {
                return Err(SluiceError::NotFound {
                    key: key.to_string(),
                });
            }
            let previous_version = r.shard.last_version();
            let version = previous_version + 1;
            // Reuse the key allocation already in the map.
            let key_arc: Arc<str> = prev.map_or_else(|| Arc::from(key), |o| o.key.clone());
            let tombstone = value.is_none();
            let timestamp_us = timestamp_us.unwrap_or_else(|| self.clock.now_us());
            if let Some(h) = &r.shard.history {
                // Durable (per the sync policy) before anyone can see it.
                let mut h = h.lock();
                match (at, &value) {
                    (Some(at), Some(v)) => h.write_ref(key, version, timestamp_us, at, v.clone()),
                    _ => h.write(key, version, timestamp_us, value.clone()),
                }
                .map_err(|e| SluiceError::Io {
                    reason: format!("persisting {key} version {version}: {e}"),
                })?;
            }
            let object = Arc::new(Object {
                key: key_arc.clone(),
                meta: ObjectMeta {
                    version,
                    timestamp_us,
                    previous_version,
                    previous_version_by_key: current,
                    tombstone,
                },
                value: value.unwrap_or_default(),
                trace,
            });
            match &r.shard.commit {
                Some(c) => c.state.lock().pending.push_back(object.clone()),
                None => {
                    replaced_large = large(map.insert(key_arc, object.clone()));
                    r.shard.visible_ts.store(timestamp_us, Ordering::Release);
                }
            }
            r.shard.set_last_version(version);
            let kind = if tombstone {
                DeliveryKind::Remove
            } else {
                DeliveryKind::Put
            };
            (object, kind)
        };
        if let Some(c) = &r.shard.commit {
            group_commit(&r.shard, c, object.meta.version)?;
        }
        if replaced_large {
            free_replaced(&r.shard);
        }
        let counter = if kind == DeliveryKind::Put {
            &self.stats.puts
        } else {
            &self.stats.removes
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(key, version = object.meta.version, op, "applied");
        // Not delivered: a write a restarted member applies again.
        let delivered = match deliver {
            true => self.deliver(r, &object, kind),
            false => Ok(()),
        };
        if let Err(e) = delivered {
            // The put is stored; a lambda that could not be queued is
            // counted by the dispatcher.
            tracing::debug!(key, error = %e, "delivery after put failed");
        }
        Ok(PutResult {
            version: object.meta.version,
            timestamp_us: object.meta.timestamp_us,
        })
    }

    /// Delivers an object to observers without storing it. Works on every
    /// pool type; the object has no version (`VERSION_NONE`).
    pub fn trigger_put(&self, key: &str, value: Bytes, shard: Option<u32>) -> Result<u64> {
        self.trigger_put_traced(key, value, shard, None)
    }

    /// `trigger_put` carrying a latency trace. Fails when an observer could
    /// not take the object (e.g. the upcall queue is full): nothing was
    /// stored, so the caller may retry.
    pub fn trigger_put_traced(
        &self,
        key: &str,
        value: Bytes,
        shard: Option<u32>,
        trace: Option<Arc<Trace>>,
    ) -> Result<u64> {
        self.trigger_put_with_origin(key, value, shard, trace, None)
    }

    /// A trigger put whose object carries `origin`'s version, timestamp and
    /// previous versions (what a lambda's emit gives its output, as
    /// Cascade's emit does) instead of this node's clock and no version.
    /// Returns the timestamp the object carries.
    pub fn trigger_put_with_origin(
        &self,
        key: &str,
        value: Bytes,
        shard: Option<u32>,
        trace: Option<Arc<Trace>>,
        origin: Option<ObjectMeta>,
    ) -> Result<u64> {
        let res = (|| {
            let r = self.route(key, shard)?;
            let meta = match origin {
                Some(o) => ObjectMeta {
                    tombstone: false,
                    ..o
                },
                None => ObjectMeta {
                    version: VERSION_NONE,
                    timestamp_us: self.clock.now_us(),
                    previous_version: VERSION_NONE,
                    previous_version_by_key: VERSION_NONE,
                    tombstone: false,
                },
            };
            let ts = meta.timestamp_us;
            let object = Arc::new(Object {
                key: Arc::from(key),
                meta,
                value,
                trace,
            });
            self.stats.trigger_puts.fetch_add(1, Ordering::Relaxed);
            self.deliver(&r, &object, DeliveryKind::TriggerPut)?;
            Ok(ts)
        })();
        self.count_err(res)
    }

    // ---- reads ---------------------------------------------------------

    /// The latest version of a key, or the given version. Volatile pools
    /// retain only the latest version; asking for another is
    /// `VersionNotRetained`.
    pub fn get(&self, key: &str, version: Option<u64>, shard: Option<u32>) -> Result<Arc<Object>> {
        let res = (|| {
            let r = self.route(key, shard)?;
            Self::require_type(&r, key, "get", STORED)?;
            self.stats.gets.fetch_add(1, Ordering::Relaxed);
            let latest = r.shard.latest(key).ok_or_else(|| SluiceError::NotFound {
                key: key.to_string(),
            })?;
            if let (Some(h), Some(v)) = (&r.shard.history, version) {
                let durable = r
                    .shard
                    .commit
                    .as_ref()
                    .map_or(u64::MAX, |c| c.state.lock().durable);
                if v > durable {
                    return Err(SluiceError::VersionNotRetained {
                        key: key.to_string(),
                        reason: format!(
                            "version {v} is not committed yet (durable up to {durable})"
                        ),
                    });
                }
                if v != latest.meta.version {
                    let h = h.lock();
                    let found = h.get(key, Some(v)).map_err(history_err)?;
                    let retention = r.pool().retention.as_ref();
                    return match found {
                        Some((e, value)) => {
                            check_retained(retention, &h, key, &e)?;
                            live(Arc::new(object_of(key, e, value)), key)
                        }
                        None => Err(SluiceError::VersionNotRetained {
                            key: key.to_string(),
                            reason: match (retention, h.oldest(key)) {
                                (Some(ret), Some(o)) if v < o.version && v <= r.shard.last_version() => format!(
                                    "version {v} is not held: the pool's retention ({ret}) dropped this key's versions before {}{}",
                                    o.version,
                                    if o.prev_version_by_key == v { "" } else { ", or it was never a version of this key" }
                                ),
                                _ => format!("version {v} is not a version of this key"),
                            },
                        }),
                    };
                }
            }
            match version {
                None => live(latest, key),
                Some(v) if v == latest.meta.version => live(latest, key),
                Some(v) if v > r.shard.last_version() => Err(SluiceError::VersionNotRetained {
                    key: key.to_string(),
                    reason: format!(
                        "version {v} has not been written yet (the shard is at version {})",
                        r.shard.last_version()
                    ),
                }),
                Some(v) => Err(SluiceError::VersionNotRetained {
                    key: key.to_string(),
                    reason: format!(
                        "version {v} is not retained: volatile pool {} keeps only the latest version ({})",
                        r.pool().pathname, latest.meta.version
                    ),
                }),
            }
        })();
        self.count_err(res)
    }

    /// The version of a key that was current at `timestamp_us`.
    pub fn get_by_time(
        &self,
        key: &str,
        timestamp_us: u64,
        shard: Option<u32>,
    ) -> Result<Arc<Object>> {
        let res = (|| {
            let r = self.route(key, shard)?;
            Self::require_type(&r, key, "get_by_time", STORED)?;
            self.stats.gets.fetch_add(1, Ordering::Relaxed);
            let latest = r.shard.latest(key).ok_or_else(|| SluiceError::NotFound {
                key: key.to_string(),
            })?;
            if latest.meta.timestamp_us <= timestamp_us {
                live(latest, key)
            } else if let Some(h) = &r.shard.history {
                let h = h.lock();
                match h.get_by_time(key, timestamp_us).map_err(history_err)? {
                    Some((e, value)) => {
                        check_retained(r.pool().retention.as_ref(), &h, key, &e)?;
                        live(Arc::new(object_of(key, e, value)), key)
                    }
                    None => Err(SluiceError::NotFound {
                        key: key.to_string(),
                    }),
                }
            } else {
                Err(SluiceError::VersionNotRetained {
                    key: key.to_string(),
                    reason: format!(
                        "no retained version at {timestamp_us} µs: volatile pool {} keeps only the latest version, written at {} µs",
                        r.pool().pathname, latest.meta.timestamp_us
                    ),
                })
            }
        })();
        self.count_err(res)
    }

    /// Whether a time-indexed read at `timestamp_us` is stable, i.e. no
    /// write can still get a timestamp at or before it: the node clock has
    /// passed it and no write that took an earlier timestamp is still being
    /// applied (the shard's write lock is taken and released to drain them).
    /// Usually answered without a lock: once the shard shows a write newer
    /// than `timestamp_us`, everything before it is visible. Otherwise the
    /// writes in flight are drained, which may wait for an fsync: async
    /// callers run this off their event loop for persistent pools.
    pub fn time_is_stable(&self, key: &str, timestamp_us: u64, shard: Option<u32>) -> Result<bool> {
        if self.time_now_us() <= timestamp_us {
            return Ok(false);
        }
        let r = self.route(key, shard)?;
        if r.shard.visible_ts.load(Ordering::Acquire) > timestamp_us {
            return Ok(true);
        }
        // Writes that took a timestamp before now finish under the write
        // lock, except those still waiting for their group commit.
        let assigned = {
            let _w = r.shard.write_lock.lock();
            r.shard.last_version()
        };
        if let Some(c) = &r.shard.commit {
            let mut st = c.state.lock();
            while st.durable < assigned && st.failed.is_none() {
                c.cond.wait(&mut st);
            }
        }
        Ok(true)
    }

    /// The node's present for time reads: the wall clock, or the latest
    /// timestamp handed out (or seen from a leader) when that is ahead:
    /// every later write gets a later timestamp. After the system clock is
    /// stepped back, timestamps run ahead of the wall clock (`Clock`); a
    /// read at one of them is in the past, not an hour in the future.
    pub fn time_now_us(&self) -> u64 {
        Clock::wall_us().max(self.clock.last_us())
    }

    /// Records that every write of `shard` with a timestamp up to
    /// `timestamp_us` is visible (a replicated shard applied a time
    /// frontier: later writes get later timestamps), so time reads up to
    /// it are stable here.
    pub fn advance_visible(&self, shard: ShardId, timestamp_us: u64) {
        if let Some(s) = self.shards.get(&shard) {
            s.visible_ts.fetch_max(timestamp_us, Ordering::AcqRel);
            self.clock.observe(timestamp_us);
        }
    }

    /// Timestamp up to which every write of `shard` is visible.
    pub fn visible_ts(&self, shard: ShardId) -> u64 {
        self.shards
            .get(&shard)
            .map_or(0, |s| s.visible_ts.load(Ordering::Acquire))
    }

    /// Whether writes to `key` (and draining them for a stable time read)
    /// may wait on the disk (persistent pools): async callers should run
    /// them off their event loop.
    pub fn write_may_block(&self, key: &str) -> bool {
        self.cfg.persistent_dir.is_some()
            && self
                .pools
                .load()
                .table
                .pool_of(key)
                .is_some_and(|p| p.pool_type == PoolType::Persistent)
    }

    /// Several keys of one shard; one result per key, in order.
    pub fn multi_get(&self, keys: &[String], shard: Option<u32>) -> Vec<Result<Arc<Object>>> {
        keys.iter().map(|k| self.get(k, None, shard)).collect()
    }

    /// Keys of a pool (not of pools nested inside it), optionally under a
    /// prefix, from one shard or (`shard = None`) every shard of the pool.
    /// Removed keys are not listed. Sorted.
    pub fn list_keys(
        &self,
        pool: &str,
        prefix: Option<&str>,
        shard: Option<u32>,
    ) -> Result<Vec<String>> {
        let keys = self.list_keys_shared(pool, prefix, shard)?;
        Ok(keys.iter().map(|k| k.to_string()).collect())
    }

    /// `list_keys`, the keys shared with the store's maps (no copy of
    /// their text: a listing kept for its next pages costs 16 bytes a key).
    pub fn list_keys_shared(
        &self,
        pool: &str,
        prefix: Option<&str>,
        shard: Option<u32>,
    ) -> Result<Vec<Arc<str>>> {
        let res = (|| {
            let view = self.pools.load_full();
            let meta = match view.table.get(pool) {
                Some(p) if !p.deleted => p,
                Some(_) => {
                    return Err(SluiceError::PoolDeleted {
                        pool: pool.to_string(),
                        key: pool.to_string(),
                    })
                }
                None => {
                    return Err(SluiceError::PoolNotFound {
                        pool: pool.to_string(),
                    })
                }
            };
            if meta.pool_type == PoolType::Trigger {
                return Err(SluiceError::WrongPoolType {
                    op: "list keys of".into(),
                    key: pool.to_string(),
                    pool: pool.to_string(),
                    pool_type: meta.pool_type.to_string(),
                    hint: "; trigger pools store nothing".into(),
                });
            }
            if let Some(p) = prefix {
                if !p.starts_with(pool) {
                    return Err(SluiceError::invalid_key(
                        p,
                        format!("prefix is outside pool {pool}"),
                    ));
                }
            }
            self.stats.list_keys.fetch_add(1, Ordering::Relaxed);
            let shards: Vec<u32> = match shard {
                Some(s) => vec![s],
                None => (0..meta.shard_count).collect(),
            };
            let inside = format!("{}/", pool.trim_end_matches('/'));
            let nested = view
                .table
                .pools
                .range(inside.clone()..)
                .next()
                .is_some_and(|(p, _)| p.starts_with(&inside));
            let mut out = Vec::new();
            for s in shards {
                let id = ShardId {
                    pool_type: meta.pool_type,
                    subgroup: meta.subgroup_index,
                    shard: s,
                };
                let Some(sh) = self.shards.get(&id) else {
                    return Err(SluiceError::UnknownShard {
                        subgroup: format!("{}/{}", id.pool_type, id.subgroup),
                        shard: s,
                    });
                };
                for (k, o) in sh.objects.pin().iter() {
                    if o.meta.tombstone || !path_covers(pool, k) {
                        continue;
                    }
                    if prefix.is_some_and(|p| !k.starts_with(p)) {
                        continue;
                    }
                    // Skip keys that belong to a pool nested inside this
                    // one (looked up only where there is one: per key, the
                    // lookup was most of a large pool's listing).
                    if nested && view.table.pool_of(k).map(|p| p.pathname.as_str()) != Some(pool) {
                        continue;
                    }
                    out.push(k.clone());
                }
            }
            out.sort_unstable();
            Ok(out)
        })();
        self.count_err(res)
    }
}

/// Pool types whose objects are stored (gets, puts, removes apply).
const STORED: &[PoolType] = &[PoolType::Volatile, PoolType::Persistent];

fn history_err(e: sluice_log::HistoryError) -> SluiceError {
    SluiceError::Io {
        reason: e.to_string(),
    }
}

/// An object rebuilt from the log. Versions are dense per shard, so the
/// shard-wide previous version is `version - 1`.
fn object_of(key: &str, e: sluice_log::Entry, value: Bytes) -> Object {
    Object {
        key: Arc::from(key),
        meta: ObjectMeta {
            version: e.version,
            timestamp_us: e.timestamp_us,
            previous_version: e.version.saturating_sub(1),
            previous_version_by_key: e.prev_version_by_key,
            tombstone: e.tombstone,
        },
        value,
        trace: None,
    }
}

/// Waits until `version` is durable and visible, fsyncing for the whole
/// group when no one else is.
fn group_commit(shard: &Shard, c: &crate::shard::GroupCommit, version: u64) -> Result<()> {
    let mut st = c.state.lock();
    loop {
        if st.durable >= version {
            return Ok(());
        }
        if let Some(f) = &st.failed {
            return Err(SluiceError::Io {
                reason: format!("shard {}: fsync failed ({f}); the write was not acknowledged; restart the node", shard.id),
            });
        }
        if st.syncing {
            c.cond.wait(&mut st);
            continue;
        }
        st.syncing = true;
        let target = st.pending.back().map_or(st.durable, |o| o.meta.version);
        drop(st);
        let res = match &shard.history {
            Some(h) => {
                let seg = h.lock().active_segment();
                let mut file = c.sync_file.lock();
                if file.as_ref().map(|(s, _)| *s) != Some(seg) {
                    *file = h.lock().sync_handle().ok().map(|f| (seg, f));
                }
                match file.as_mut() {
                    Some((_, f)) => f.sync().map_err(|e| e.to_string()),
                    None => Err(format!("cannot open segment {seg} to sync it")),
                }
            }
            None => Ok(()),
        };
        st = c.state.lock();
        st.syncing = false;
        match res {
            Ok(()) => {
                let map = shard.objects.pin();
                let mut replaced_large = false;
                while st.pending.front().is_some_and(|o| o.meta.version <= target) {
                    if let Some(o) = st.pending.pop_front() {
                        shard
                            .visible_ts
                            .fetch_max(o.meta.timestamp_us, Ordering::AcqRel);
                        replaced_large |= large(map.insert(o.key.clone(), o));
                    }
                }
                drop(map);
                if replaced_large {
                    free_replaced(shard);
                }
                st.durable = st.durable.max(target);
            }
            Err(e) => {
                tracing::error!(shard = %shard.id, error = %e, "fsync failed; the shard stops accepting writes");
                st.failed = Some(e);
            }
        }
        c.cond.notify_all();
    }
}

/// Opens a persistent shard's log and rebuilds its latest objects.
fn recover_persistent(
    shard: &mut Shard,
    dir: &std::path::Path,
    sync: sluice_log::SyncPolicy,
    segment_bytes: u64,
    clock: &Clock,
) -> Result<()> {
    let id = shard.id;
    let path = dir.join(format!("sg{}-shard{}", id.subgroup, id.shard));
    // Under the batch policy the log never fsyncs by itself: the group
    // committer does, for many appends at once.
    let batch = matches!(sync, sluice_log::SyncPolicy::Batch { .. });
    let log_sync = if batch {
        sluice_log::SyncPolicy::Never
    } else {
        sync
    };
    let opts = sluice_log::LogOptions {
        sync: log_sync,
        segment_bytes_max: segment_bytes,
        // Batch: the group committer's acknowledgements need sealed
        // segments synced. Never (standalone: the OS decides; replicated:
        // the consensus log is the durable write, the history is synced
        // at snapshots): no fsync of a whole segment inside a write.
        sync_on_roll: !matches!(sync, sluice_log::SyncPolicy::Never),
    };
    let (h, rec) =
        sluice_log::History::open(&path, Arc::new(sluice_log::RealFs), opts).map_err(|e| {
            SluiceError::Io {
                reason: format!(
                    "recovering persistent shard {id} from {}: {e}",
                    path.display()
                ),
            }
        })?;
    tracing::info!(shard = %id, versions = h.last_version(), segments = rec.segments, bytes = rec.bytes, ms = rec.elapsed.as_millis() as u64, "persistent shard recovered");
    // Values by reference (replicated shards) are loaded once the
    // replica has set its resolver (`persistent_rollback`).
    if let Err(e) = load_latest(shard, &h) {
        tracing::debug!(shard = %id, error = %e, "latest objects wait for the replication log");
    }
    shard.set_last_version(h.last_version());
    if batch {
        let c = crate::shard::GroupCommit::default();
        c.state.lock().durable = h.last_version();
        shard.commit = Some(c);
    }
    clock.observe(h.last_timestamp_us());
    shard.history = Some(parking_lot::Mutex::new(h));
    Ok(())
}

/// Replaces a persistent shard's in-memory latest objects with those of
/// its history. A value that cannot be read is an error naming it (a
/// replicated shard's values by reference wait for their resolver: its
/// state machine loads them again once it has set one).
fn load_latest(shard: &Shard, h: &sluice_log::History) -> Result<()> {
    let map = shard.objects.pin();
    map.clear();
    let mut first_err = None;
    for key in h.keys() {
        match h.get(&key, None) {
            Ok(Some((e, value))) => {
                map.insert(Arc::from(key.as_str()), Arc::new(object_of(&key, e, value)));
            }
            Ok(None) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    shard
        .visible_ts
        .store(h.last_timestamp_us(), Ordering::Release);
    match first_err {
        None => Ok(()),
        Some(e) => Err(SluiceError::Io {
            reason: format!("loading the latest objects of shard {}: {e}", shard.id),
        }),
    }
}

/// Replicated persistent shards (`sluice-cluster`): the consensus log is
/// the durable write; the history is written when entries apply (without
/// an fsync of its own, `StoreConfig::persistent_sync = Never`) and
/// synced when a replication snapshot is taken. These let the state
/// machine keep the history exactly at what its snapshot and log say.
impl Store {
    fn persistent_shard(
        &self,
        shard: ShardId,
    ) -> Result<(&Arc<Shard>, &Mutex<sluice_log::History>)> {
        let s = self.shard_or_err(shard)?;
        let h = s.history.as_ref().ok_or_else(|| SluiceError::Internal {
            reason: format!(
                "shard {shard} keeps no history (persistent pools are not enabled on this node)"
            ),
        })?;
        Ok((s, h))
    }

    /// Whether `shard` keeps a history on disk.
    pub fn keeps_history(&self, shard: ShardId) -> bool {
        self.shards.get(&shard).is_some_and(|s| s.history.is_some())
    }

    /// Sets how a persistent shard's history reads values it holds by
    /// reference (`apply_write` with `at`): from the replication log's files.
    pub fn set_value_resolver(&self, shard: ShardId, r: sluice_log::Resolver) -> Result<()> {
        let (_, h) = self.persistent_shard(shard)?;
        h.lock().set_resolver(r);
        Ok(())
    }

    /// Rolls a persistent shard back to `version`: later versions leave
    /// the disk and memory; the next write gets `version + 1`; the latest
    /// objects are loaded again (values by reference need the resolver,
    /// which a replica sets just before). Returns how many versions were
    /// removed.
    pub fn persistent_rollback(&self, shard: ShardId, version: u64) -> Result<usize> {
        let (s, h) = self.persistent_shard(shard)?;
        let _w = s.write_lock.lock();
        let mut h = h.lock();
        let removed = h.truncate_after(version).map_err(|e| SluiceError::Io {
            reason: format!("rolling shard {shard} back to version {version}: {e}"),
        })?;
        load_latest(s, &h)?;
        s.set_last_version(version);
        Ok(removed)
    }

    /// The lowest segment of the replication log that a version of this
    /// persistent shard still refers to (`Ok(None)`: none does).
    pub fn min_value_segment(&self, shard: ShardId) -> Result<Option<u64>> {
        let (_, h) = self.persistent_shard(shard)?;
        let min = h.lock().min_value_segment();
        Ok(min)
    }

    /// How many of a persistent shard's versions refer to each
    /// replication log segment below `segment`
    /// (`History::value_ref_counts_below`).
    pub fn value_ref_counts_below(
        &self,
        shard: ShardId,
        segment: u64,
    ) -> Result<std::collections::BTreeMap<u64, usize>> {
        let (_, h) = self.persistent_shard(shard)?;
        let counts = h.lock().value_ref_counts_below(segment);
        Ok(counts)
    }

    /// Where the values of a persistent shard's versions that refer to
    /// one of `segments` of the replication log lie (`History::value_refs_in`).
    pub fn value_refs_in(
        &self,
        shard: ShardId,
        segments: &std::collections::BTreeSet<u64>,
    ) -> Result<Vec<sluice_log::ValueRef>> {
        let (_, h) = self.persistent_shard(shard)?;
        let refs = h.lock().value_refs_in(segments).map_err(history_err)?;
        Ok(refs)
    }

    /// fsyncs a persistent shard's history: every segment written since
    /// the last sync, without holding the history (writes go on).
    pub fn persistent_sync(&self, shard: ShardId) -> Result<()> {
        let (_, h) = self.persistent_shard(shard)?;
        let (fs, pending) = {
            let mut g = h.lock();
            (g.storage().0, g.take_unsynced())
        };
        for (i, (_, path)) in pending.iter().enumerate() {
            if let Err(e) = fs.open_append(path).and_then(|mut f| f.sync()) {
                h.lock()
                    .requeue_unsynced(pending[i..].iter().map(|(id, _)| *id));
                return Err(SluiceError::Io {
                    reason: format!("syncing shard {shard} ({}): {e}", path.display()),
                });
            }
        }
        Ok(())
    }

    /// Every version of a persistent shard up to `version`, in version
    /// order (what a replication snapshot sends a new member).
    pub fn persistent_records(&self, shard: ShardId, version: u64) -> Result<Vec<Arc<Object>>> {
        let (_, h) = self.persistent_shard(shard)?;
        let recs = h.lock().records_upto(version).map_err(history_err)?;
        Ok(recs
            .into_iter()
            .map(|(k, e, v)| Arc::new(object_of(&k, e, v)))
            .collect())
    }

    /// Replaces a persistent shard's history with `records` (from
    /// `persistent_records` on another replica) and makes it durable;
    /// the shard continues at `last_version`.
    pub fn persistent_install(
        &self,
        shard: ShardId,
        last_version: u64,
        records: &[Arc<Object>],
    ) -> Result<()> {
        let (s, h) = self.persistent_shard(shard)?;
        let _w = s.write_lock.lock();
        let mut h = h.lock();
        let io = |e: sluice_log::HistoryError| SluiceError::Io {
            reason: format!("installing a snapshot of shard {shard}: {e}"),
        };
        h.truncate_after(0).map_err(io)?;
        for o in records {
            let value = (!o.meta.tombstone).then(|| o.value.clone());
            h.write(&o.key, o.meta.version, o.meta.timestamp_us, value)
                .map_err(io)?;
        }
        h.sync().map_err(io)?;
        load_latest(s, &h)?;
        self.clock.observe(h.last_timestamp_us());
        s.set_last_version(last_version);
        Ok(())
    }
}

/// Reads honour retention at once: a version the pool's policy drops is
/// refused even while it is still on disk (the background compaction
/// reclaims it later). The newest version of a key is always kept.
fn check_retained(
    retention: Option<&sluice_types::pool::Retention>,
    h: &sluice_log::History,
    key: &str,
    e: &sluice_log::Entry,
) -> Result<()> {
    let Some(ret) = retention else { return Ok(()) };
    let (newer, bytes) = h.newer_with_bytes(key, e.version).unwrap_or((0, 0));
    if newer == 0 || ret.keeps(newer, bytes, e.timestamp_us, Clock::wall_us()) {
        return Ok(());
    }
    Err(SluiceError::VersionNotRetained {
        key: key.to_string(),
        reason: format!(
            "version {} was dropped by the pool's retention ({ret})",
            e.version
        ),
    })
}

/// What a resumed watch replays from one shard (`Store::replay`).
#[derive(Debug, Default)]
pub struct Replay {
    /// Stored versions in range, oldest first.
    pub objects: Vec<Arc<Object>>,
    /// Their value bytes.
    pub bytes: usize,
    /// Versions in range that retention dropped: how many (at least), and
    /// the lowest and highest of them known.
    pub dropped: u64,
    pub first_dropped: u64,
    pub last_dropped: u64,
}

impl Replay {
    fn drop_version(&mut self, v: u64) {
        if self.dropped == 0 || v < self.first_dropped {
            self.first_dropped = v;
        }
        self.last_dropped = self.last_dropped.max(v);
        self.dropped += 1;
    }
}

/// A range of a key's history.
pub use sluice_log::Range as HistoryRange;

impl Store {
    /// Every version of `key` in `range`, newest first (persistent pools).
    /// At most `limit` versions are read.
    pub fn history(
        &self,
        key: &str,
        range: HistoryRange,
        limit: usize,
        shard: Option<u32>,
    ) -> Result<Vec<Arc<Object>>> {
        let r = self.route(key, shard)?;
        let Some(h) = &r.shard.history else {
            return Err(SluiceError::WrongPoolType {
                op: "read the history of".into(),
                key: key.to_string(),
                pool: r.pool().pathname.clone(),
                pool_type: r.pool().pool_type.to_string(),
                hint: "; only persistent pools keep history".into(),
            });
        };
        let h = h.lock();
        let versions = h.range(key, range, limit).map_err(history_err)?;
        // Newest first: once retention drops one, it drops every older one.
        let retention = r.pool().retention.as_ref();
        Ok(versions
            .into_iter()
            .take_while(|(e, _)| check_retained(retention, &h, key, e).is_ok())
            .map(|(e, v)| Arc::new(object_of(key, e, v)))
            .collect())
    }

    /// Applies the pools' retention policies: rewrites every sealed segment
    /// of every persistent shard without the versions a policy drops. The
    /// rewrite runs without the shard's history lock (sealed segments never
    /// change); only the final swap takes it. Returns (versions dropped,
    /// bytes reclaimed).
    pub fn compact(&self) -> Result<(usize, u64)> {
        let view = self.pools.load_full();
        if !view
            .table
            .pools
            .values()
            .any(|p| p.retention.is_some() && !p.deleted)
        {
            return Ok((0, 0));
        }
        let now = Clock::wall_us();
        let (mut dropped, mut reclaimed) = (0usize, 0u64);
        for shard in self.shards.values() {
            let (d, r) = self.compact_shard(shard, |key, e, newer, bytes| {
                match view.table.pool_of(key).and_then(|p| p.retention.as_ref()) {
                    Some(r) => r.keeps(newer, bytes, e.timestamp_us, now),
                    None => true,
                }
            })?;
            dropped += d;
            reclaimed += r;
        }
        if dropped > 0 {
            tracing::info!(dropped, reclaimed_bytes = reclaimed, "retention compaction");
        }
        Ok((dropped, reclaimed))
    }

    /// Locks the given shards' writers, reads each one's last version,
    /// runs `f` with them (e.g. registers a watch) and lets writers go on: every
    /// write with a version at most the one returned was assigned before
    /// `f` ran, every later one after it.
    pub fn at_versions(
        &self,
        ids: &[ShardId],
        f: impl FnOnce(&[(ShardId, u64)]),
    ) -> Vec<(ShardId, u64)> {
        let mut ids = ids.to_vec();
        ids.sort_by_key(|id| (id.pool_type as u8, id.subgroup, id.shard));
        let shards: Vec<&Arc<Shard>> = ids.iter().filter_map(|id| self.shards.get(id)).collect();
        let _locks: Vec<_> = shards.iter().map(|s| s.write_lock.lock()).collect();
        let out: Vec<(ShardId, u64)> = shards.iter().map(|s| (s.id, s.last_version())).collect();
        f(&out);
        out
    }

    /// Every stored version under `prefix` on a persistent shard in
    /// `range` and at most version `upto`, oldest first, for a resumed
    /// watch; at most `limit` versions and `max_bytes` of values (more is
    /// an error saying which bound was passed).
    /// Versions the pool's retention drops are counted, not returned.
    pub fn replay(
        &self,
        shard: ShardId,
        prefix: &str,
        range: HistoryRange,
        upto: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Replay> {
        let (_, h) = self.persistent_shard(shard)?;
        let view = self.pools.load();
        let h = h.lock();
        let sluice_log::Changes {
            versions: entries,
            gone,
        } = h.changes(prefix, range, upto);
        if entries.len() > limit {
            return Err(SluiceError::NotSupported {
                what: format!(
                    "resuming a watch on {prefix:?} {} versions back on shard {shard} (at most {limit} are replayed; resume from a later version or time, or read the older ones with `history`)",
                    entries.len()
                ),
            });
        }
        let mut out = Replay::default();
        for (_, v) in gone {
            out.drop_version(v);
        }
        for (key, e) in entries {
            let retention = view.table.pool_of(&key).and_then(|p| p.retention.as_ref());
            if check_retained(retention, &h, &key, &e).is_err() {
                out.drop_version(e.version);
                continue;
            }
            let value = h.value(&key, &e).map_err(history_err)?;
            out.bytes += value.len();
            if out.bytes > max_bytes {
                // Stopped as soon as it is known: nothing more is read.
                return Err(SluiceError::NotSupported {
                    what: format!(
                        "resuming a watch on {prefix:?}: the replay holds more than {max_bytes} bytes (resume from a later version or time, or read the older ones with `history`)"
                    ),
                });
            }
            out.objects.push(Arc::new(object_of(&key, e, value)));
        }
        Ok(out)
    }

    /// Rewrites every sealed segment of a persistent shard without the
    /// records its history no longer indexes and the versions `keep`
    /// refuses (the newest version of a key always stays). The rewrite
    /// runs without the history lock (sealed segments never change); only
    /// each swap takes it. Returns (records dropped, bytes reclaimed).
    fn compact_shard(
        &self,
        shard: &Shard,
        keep: impl Fn(&str, &sluice_log::Entry, usize, u64) -> bool,
    ) -> Result<(usize, u64)> {
        let Some(h) = &shard.history else {
            return Ok((0, 0));
        };
        let _one = shard.compaction.lock();
        let (fs, dir, sealed, epoch) = {
            let g = h.lock();
            let (fs, dir) = g.storage();
            (
                fs,
                dir,
                g.sealed_segments().map_err(history_err)?,
                g.epoch(),
            )
        };
        let (mut dropped, mut reclaimed) = (0usize, 0u64);
        for seg in sealed {
            let kept = h.lock().compaction_plan(seg, &keep);
            let c =
                sluice_log::Log::prepare_compacted(&fs, &dir, seg, |r| kept.contains(&r.version));
            let mut g = h.lock();
            if g.epoch() != epoch {
                // The history was rolled back meanwhile (a replica
                // installing a snapshot): this plan is stale.
                sluice_log::Log::discard_compacted(&dir, seg);
                break;
            }
            let c = c.map_err(|e| SluiceError::Io {
                reason: format!("compacting shard {}: {e}", shard.id),
            })?;
            if c.dropped == 0 {
                // Nothing to reclaim: leave the segment as it is.
                sluice_log::Log::discard_compacted(&dir, seg);
                continue;
            }
            g.install_compacted(&c).map_err(history_err)?;
            dropped += c.dropped;
            reclaimed += c.bytes_before.saturating_sub(c.bytes_after);
        }
        Ok((dropped, reclaimed))
    }

    /// Keys of a persistent pool that were live at a time (sorted).
    pub fn list_keys_at_time(
        &self,
        pool: &str,
        prefix: Option<&str>,
        timestamp_us: u64,
    ) -> Result<Vec<String>> {
        self.list_keys_at(pool, prefix, |h, p| h.keys_at_time(timestamp_us, p))
    }

    /// Keys of a persistent pool that were live at a version (sorted).
    pub fn list_keys_at_version(
        &self,
        pool: &str,
        prefix: Option<&str>,
        version: u64,
    ) -> Result<Vec<String>> {
        // A version no shard of the pool has reached names no state yet:
        // refused, as a get of it is (it used to list the current keys).
        let meta = self.get_pool(pool)?;
        let latest = self
            .shards_of_pool(&meta)
            .iter()
            .filter_map(|id| self.shards.get(id))
            .map(|s| s.last_version())
            .max()
            .unwrap_or(0);
        if version > latest {
            return Err(SluiceError::VersionNotRetained {
                key: pool.to_string(),
                reason: format!(
                    "version {version} has not been written yet (the pool's shards are at version {latest} at most)"
                ),
            });
        }
        self.list_keys_at(pool, prefix, |h, p| h.keys_at_version(version, p))
    }

    fn list_keys_at(
        &self,
        pool: &str,
        prefix: Option<&str>,
        keys: impl Fn(&sluice_log::History, Option<&str>) -> Vec<String>,
    ) -> Result<Vec<String>> {
        let meta = self.get_pool(pool)?;
        let mut out = Vec::new();
        for s in 0..meta.shard_count {
            let id = ShardId {
                pool_type: meta.pool_type,
                subgroup: meta.subgroup_index,
                shard: s,
            };
            let Some(h) = self.shards.get(&id).and_then(|sh| sh.history.as_ref()) else {
                return Err(SluiceError::WrongPoolType {
                    op: "list keys at a version of".into(),
                    key: pool.to_string(),
                    pool: pool.to_string(),
                    pool_type: meta.pool_type.to_string(),
                    hint: "; only persistent pools keep history".into(),
                });
            };
            let p = prefix.unwrap_or(pool);
            out.extend(
                keys(&h.lock(), Some(p))
                    .into_iter()
                    .filter(|k| path_covers(pool, k)),
            );
        }
        out.sort_unstable();
        Ok(out)
    }
}

fn live(o: Arc<Object>, key: &str) -> Result<Arc<Object>> {
    if o.meta.tombstone {
        Err(SluiceError::NotFound {
            key: key.to_string(),
        })
    } else {
        Ok(o)
    }
}

/// Writes a file so a crash leaves either the old or the new contents.
pub(crate) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    // Each step names the file it failed on (the temporary one until the
    // rename).
    let io = |what: &str, file: &std::path::Path, e: std::io::Error| SluiceError::Io {
        reason: format!("{what} {}: {e}", file.display()),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("creating directory for", path, e))?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating", &tmp, e))?;
    f.write_all(bytes).map_err(|e| io("writing", &tmp, e))?;
    f.sync_all().map_err(|e| io("syncing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("renaming it into", path, e))?;
    Ok(())
}

/// Values below this size are copied into an allocation of their own
/// when stored (`owned_if_small`).
pub const OWN_COPY_BELOW: usize = 64 * 1024;

/// A replaced or removed value this large is reclaimed at once rather
/// than with the map's next batch (`free_replaced`).
const FREE_PROMPTLY: usize = 256 * 1024;

/// Whether what a map insert replaced holds `FREE_PROMPTLY` bytes or more.
fn large(replaced: Option<&Arc<Object>>) -> bool {
    replaced.is_some_and(|o| o.value.len() >= FREE_PROMPTLY)
}

/// Starts reclaiming what this thread's writes replaced in `shard`'s map.
/// The map frees replaced entries once a thread has retired a batch of
/// 32: up to 32 large values per thread outlived their removal, and a
/// node at its memory limit stayed refused after keys were removed. Called
/// after a large value is replaced (a fence, once per large value).
fn free_replaced(shard: &Shard) {
    papaya::Guard::flush(&shard.objects.guard());
}

/// A value as the store keeps it. A value that arrived in a connection's
/// read buffer (a slice of a 64 KiB chunk shared with the frames next to
/// it) kept the whole chunk alive for as long as it was stored: a node
/// holding 1 KB values grew to 4x the memory of the same objects once a
/// cache-like load had overwritten them (the chunks' other values gone,
/// one survivor each), and a 32 KB value held a chunk of 64 KiB from the
/// start. Below `OWN_COPY_BELOW` a value is copied (as Redis copies every
/// value under 32 KB out of its query buffer); larger ones arrive in
/// buffers sized for their frame and are kept as they are.
pub fn owned_if_small(v: Bytes) -> Bytes {
    if v.is_empty() || v.len() >= OWN_COPY_BELOW {
        v
    } else {
        Bytes::copy_from_slice(&v)
    }
}
