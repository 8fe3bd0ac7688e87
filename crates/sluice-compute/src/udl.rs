//! The UDL API: what a lambda sees and what it can do.

use bytes::Bytes;
use serde_json::Value;
use sluice_store::Store;
use sluice_types::{
    Hop, Object, ObjectMeta, PutResult, SluiceError, Trace, EMIT_DEPTH_MAX, TRACE_HOPS_MAX,
};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// Pushes objects to watching clients (the server's watch hub); what a
/// lambda's `publish` reaches.
pub trait Publisher: Send + Sync {
    fn publish(&self, object: &Arc<Object>);
}

/// Why a UDL call failed. Counted, logged with the key, kept as the
/// vertex's `last_error`; never fatal to the worker.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UdlError {
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Store(#[from] SluiceError),
}

/// One upcall: the object that triggered it and where it came from.
pub struct Upcall<'a> {
    /// Node that delivered the object (this node).
    pub sender: u32,
    /// Pathname of the object's pool.
    pub pool: &'a str,
    pub key: &'a str,
    pub object: &'a Arc<Object>,
    /// The vertex (prefix) that matched.
    pub vertex: &'a str,
    /// Index of the upcall worker thread running this call.
    pub worker_id: usize,
}

impl Upcall<'_> {
    /// The key below the vertex's pathname (`/v/x/1` under `/v` → `/x/1`),
    /// the natural suffix to emit under.
    pub fn key_suffix(&self) -> &str {
        self.key.strip_prefix(self.vertex).unwrap_or(self.key)
    }
}

/// A user-defined lambda. `handle` runs on an upcall worker thread; it may
/// block briefly (inference) but should not wait on other upcalls.
pub trait Udl: Send + Sync {
    fn handle(
        &self,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        ctx: &Context,
    ) -> Result<(), UdlError>;

    /// A trigger put for this lambda's vertex is arriving: its key is in,
    /// its (large) value still on the way. A lambda that runs elsewhere
    /// may wake its worker now, so that the call finds it ready. Called on
    /// the connection's thread: it must not block. A hint only: the put
    /// may still fail, or reach another member.
    fn expect(&self) {}

    /// The same trigger put, `frame_len` bytes in all with its value
    /// `value_at` bytes in: memory this lambda lends for the frame to be
    /// read into (`crate::landing`), so that its value needs no copy to
    /// reach the lambda; `None` (the default) to have it read into the
    /// node's own buffers. Called on the connection's thread, after
    /// `expect`, only where the connection may trigger the key: it must
    /// not block.
    fn landing(&self, _frame_len: usize, _value_at: usize) -> Option<crate::landing::Landing> {
        None
    }

    /// Counters of this lambda's own, shown with the vertex's (`sluice dfg
    /// list`): a JSON object, or `None` (the default) for none. Must not
    /// block (a call may be running).
    fn counters(&self) -> Option<serde_json::Value> {
        None
    }
}

/// Builds a UDL instance from its vertex config.
pub trait UdlFactory: Send + Sync {
    fn create(&self, config: &Value, ctx: &Context) -> Result<Arc<dyn Udl>, String>;
}

impl<F> UdlFactory for F
where
    F: Fn(&Value, &Context) -> Result<Arc<dyn Udl>, String> + Send + Sync,
{
    fn create(&self, config: &Value, ctx: &Context) -> Result<Arc<dyn Udl>, String> {
        self(config, ctx)
    }
}

/// UDLs by name (and Cascade UUID aliases). A node is built with a registry;
/// add your own UDLs with `register` (see `examples/custom-udl`).
#[derive(Clone, Default)]
pub struct Registry {
    factories: HashMap<String, Arc<dyn UdlFactory>>,
    aliases: HashMap<String, String>,
    /// UDLs whose code runs in worker processes (Cascade's
    /// `execution_environment` mode `process` is accepted for them).
    out_of_process: std::collections::HashSet<String>,
}

impl Registry {
    pub fn register(&mut self, name: &str, factory: impl UdlFactory + 'static) -> &mut Self {
        self.factories.insert(name.to_string(), Arc::new(factory));
        self
    }

    /// Maps a Cascade UDL UUID (or any other name) to a registered name.
    pub fn alias(&mut self, alias: &str, name: &str) -> &mut Self {
        self.aliases.insert(alias.to_string(), name.to_string());
        self
    }

    /// Marks `name` as running its code in worker processes, not in the
    /// node's own (what Cascade calls the `process` execution environment).
    pub fn runs_out_of_process(&mut self, name: &str) -> &mut Self {
        self.out_of_process.insert(name.to_string());
        self
    }

    pub fn is_out_of_process(&self, name: &str) -> bool {
        self.out_of_process.contains(name)
    }

    /// The registered name for `name_or_alias`, if any.
    pub fn resolve(&self, name_or_alias: &str) -> Option<&str> {
        let n = self
            .aliases
            .get(name_or_alias)
            .map_or(name_or_alias, String::as_str);
        self.factories.get_key_value(n).map(|(k, _)| k.as_str())
    }

    pub fn factory(&self, name: &str) -> Option<&Arc<dyn UdlFactory>> {
        self.factories.get(name)
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.factories.keys().cloned().collect();
        v.sort();
        v
    }
}

/// What a UDL can do with the store: gets of objects on this node return
/// the stored `Arc<Object>` (the bytes are shared, not copied or
/// deserialized); in a cluster, keys this node holds no replica of are read
/// from a member of their shard (`Reader`), and puts to replicated shards
/// and trigger puts to other nodes' shards go through the node (`Writer`).
pub struct Context {
    pub(crate) store: Weak<Store>,
    pub(crate) publisher: Option<Arc<dyn Publisher>>,
    pub(crate) writer: parking_lot::RwLock<Option<Arc<dyn Writer>>>,
    pub(crate) reader: parking_lot::RwLock<Option<Arc<dyn Reader>>>,
    /// Told of every traced upcall (trace export), when set.
    pub(crate) hop_sink: parking_lot::RwLock<Option<Arc<dyn HopSink>>>,
    pub node_id: u32,
}

/// One upcall of a traced object, finished: what a trace exporter turns
/// into a span (`Engine::set_hop_sink`).
pub struct HopDone<'a> {
    /// The input's trace (its hops: the stages before this one).
    pub trace: &'a Trace,
    pub stage: &'a str,
    pub udl: &'a str,
    pub key: &'a str,
    pub enqueued_us: u64,
    pub started_us: u64,
    pub finished_us: u64,
    pub ok: bool,
    pub node_id: u32,
}

/// Receives each traced upcall as it finishes, on the upcall thread: must
/// not block (queue and return).
pub trait HopSink: Send + Sync {
    fn on_hop(&self, hop: &HopDone<'_>);
}

/// Which version a lambda's read asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadAt {
    Latest,
    Version(u64),
    /// The version current at this time (µs).
    Time(u64),
}

/// Where a lambda's reads of keys this node holds no copy of go when the
/// node is part of a cluster: to a member of the key's shard, routed as a
/// client's read is. Returns `None` for keys it leaves to the local store
/// (shards this node is a member of, trigger pools).
pub trait Reader: Send + Sync {
    fn get(&self, key: &str, at: ReadAt) -> Option<Result<Arc<Object>, SluiceError>>;
    /// Whether this node keeps a copy of `key` (reads of it are local).
    fn holds(&self, key: &str) -> bool;
}

/// Where a lambda's puts go when the node is part of a cluster: a put to
/// a replicated shard must go through that shard's leader (and its log),
/// not straight into this node's copy. Returns `None` for keys it leaves
/// to the local store (e.g. trigger pools).
pub trait Writer: Send + Sync {
    fn put(
        &self,
        key: &str,
        value: Bytes,
        trace: Option<Arc<Trace>>,
    ) -> Option<Result<PutResult, SluiceError>>;

    /// A trigger put to a shard of another node (a trigger shard this node
    /// is not a member of) goes to a member, so the lambdas run where the
    /// layout places the shard. Returns the put's timestamp; `None` for
    /// keys delivered here.
    fn trigger_put(
        &self,
        _key: &str,
        _value: Bytes,
        _trace: Option<Arc<Trace>>,
        _origin: Option<ObjectMeta>,
    ) -> Option<Result<u64, SluiceError>> {
        None
    }
}

impl Context {
    pub fn new(store: Weak<Store>, publisher: Option<Arc<dyn Publisher>>, node_id: u32) -> Self {
        Context {
            store,
            publisher,
            writer: parking_lot::RwLock::new(None),
            reader: parking_lot::RwLock::new(None),
            hop_sink: parking_lot::RwLock::new(None),
            node_id,
        }
    }

    /// Whether reads of `key` are served by this node's own copy (always,
    /// outside a cluster): what a lambda may use to decide how often to
    /// check a remote object for a new version.
    pub fn holds(&self, key: &str) -> bool {
        self.reader.read().as_ref().is_none_or(|r| r.holds(key))
    }

    /// A read through the cluster's reader (when set and it takes the key),
    /// else from this node's store.
    fn read(&self, key: &str, at: ReadAt) -> Result<Arc<Object>, SluiceError> {
        let reader = self.reader.read().clone();
        if let Some(r) = reader.and_then(|r| r.get(key, at)) {
            return r;
        }
        let store = self.store()?;
        match at {
            ReadAt::Latest => store.get(key, None, None),
            ReadAt::Version(v) => store.get(key, Some(v), None),
            ReadAt::Time(t) => store.get_by_time(key, t, None),
        }
    }

    pub(crate) fn store(&self) -> Result<Arc<Store>, SluiceError> {
        self.store
            .upgrade()
            .ok_or_else(|| SluiceError::Unavailable {
                reason: "the node is shutting down".into(),
            })
    }

    /// The latest version of `key`: from this node's copy when it holds
    /// one (shared bytes, no copy), else, in a cluster, from a member of
    /// the key's shard.
    pub fn get(&self, key: &str) -> Result<Arc<Object>, SluiceError> {
        self.read(key, ReadAt::Latest)
    }

    /// A specific version of `key` (persistent pools keep them all).
    pub fn get_version(&self, key: &str, version: u64) -> Result<Arc<Object>, SluiceError> {
        self.read(key, ReadAt::Version(version))
    }

    /// The version of `key` current at `timestamp_us`.
    pub fn get_by_time(&self, key: &str, timestamp_us: u64) -> Result<Arc<Object>, SluiceError> {
        self.read(key, ReadAt::Time(timestamp_us))
    }

    pub fn put(&self, key: &str, value: Bytes) -> Result<PutResult, SluiceError> {
        self.put_traced(key, value, None)
    }

    fn put_traced(
        &self,
        key: &str,
        value: Bytes,
        trace: Option<Arc<Trace>>,
    ) -> Result<PutResult, SluiceError> {
        let writer = self.writer.read().clone();
        if let Some(w) = writer {
            if let Some(r) = w.put(key, value.clone(), trace.clone()) {
                return r;
            }
        }
        self.store()?.put_traced(key, value, None, None, trace)
    }

    pub fn trigger_put(&self, key: &str, value: Bytes) -> Result<u64, SluiceError> {
        self.trigger_put_traced(key, value, None, None)
    }

    fn trigger_put_traced(
        &self,
        key: &str,
        value: Bytes,
        trace: Option<Arc<Trace>>,
        origin: Option<ObjectMeta>,
    ) -> Result<u64, SluiceError> {
        let writer = self.writer.read().clone();
        if let Some(w) = writer {
            if let Some(r) = w.trigger_put(key, value.clone(), trace.clone(), origin) {
                return r;
            }
        }
        self.store()?
            .trigger_put_with_origin(key, value, None, trace, origin)
    }

    pub fn list_keys(&self, pool: &str, prefix: Option<&str>) -> Result<Vec<String>, SluiceError> {
        self.store()?.list_keys(pool, prefix, None)
    }

    /// Pushes an object to the clients watching its key's prefix.
    pub fn publish(&self, object: &Arc<Object>) {
        if let Some(p) = &self.publisher {
            p.publish(object);
        }
    }
}

/// How an emitted object is written at a destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DestMode {
    Put,
    TriggerPut,
}

/// Sends a UDL's outputs onward. Every emit goes to each destination of the
/// vertex; the new object carries the input's trace plus this stage's hop.
pub struct Emitter<'a> {
    ctx: &'a Context,
    destinations: &'a [(String, DestMode)],
    source: &'a Arc<Object>,
    stage: &'a str,
    enqueued_us: u64,
    started_us: u64,
    emitted: usize,
}

/// Joins a destination pathname and a key suffix with exactly one '/'.
pub fn join_key(dest: &str, suffix: &str) -> String {
    match (dest.ends_with('/'), suffix.starts_with('/')) {
        (true, true) => format!("{dest}{}", &suffix[1..]),
        (false, false) if !suffix.is_empty() => format!("{dest}/{suffix}"),
        _ => format!("{dest}{suffix}"),
    }
}

impl<'a> Emitter<'a> {
    pub fn new(
        ctx: &'a Context,
        destinations: &'a [(String, DestMode)],
        source: &'a Arc<Object>,
        stage: &'a str,
        enqueued_us: u64,
        started_us: u64,
    ) -> Self {
        Emitter {
            ctx,
            destinations,
            source,
            stage,
            enqueued_us,
            started_us,
            emitted: 0,
        }
    }

    /// How many objects this call emitted.
    pub fn emitted(&self) -> usize {
        self.emitted
    }

    /// The trace of an object emitted from the source: its latency trace
    /// plus this hop, and one more emit of depth (always carried, so a
    /// cycle of lambdas is cut at `EMIT_DEPTH_MAX`).
    fn next_trace(&self, key: &str) -> Result<Option<Arc<Trace>>, UdlError> {
        let depth = self.source.trace.as_ref().map_or(0, |t| t.emit_depth);
        if depth >= EMIT_DEPTH_MAX {
            return Err(UdlError::Failed(format!(
                "emit to {key} refused: the object {} went through {depth} lambda emits (limit {EMIT_DEPTH_MAX}); do lambdas emit to each other's keys in a cycle?",
                self.source.key
            )));
        }
        let Some(t) = self.source.trace.as_ref().filter(|t| t.is_timed()) else {
            return Ok(Some(Arc::new(Trace::depth_only(depth + 1))));
        };
        Ok(Some({
            let mut t = (**t).clone();
            t.emit_depth = depth + 1;
            if t.hops.len() < TRACE_HOPS_MAX {
                t.hops.push(Hop {
                    stage: self.stage.to_string(),
                    enqueued_us: self.enqueued_us,
                    started_us: self.started_us,
                    emitted_us: sluice_store::Clock::wall_us(),
                });
            }
            Arc::new(t)
        }))
    }

    /// Emits `value` under `key_suffix` to every destination of the vertex.
    ///
    /// What reaches a `trigger_put` destination carries the input's version,
    /// timestamp and previous versions, as Cascade's emit passes them on
    /// (`emit_with_meta` sets others); a `put` destination stores a new
    /// version with the store's own version and timestamp, as Cascade's
    /// stores do.
    pub fn emit(&mut self, key_suffix: &str, value: Bytes) -> Result<(), UdlError> {
        let meta = self.source.meta;
        self.emit_with_meta(key_suffix, value, meta)
    }

    /// `emit` with the version, timestamp and previous versions the output
    /// carries to `trigger_put` destinations (Cascade's `emit(key, version,
    /// timestamp_us, previous_version, previous_version_by_key, blob)`).
    pub fn emit_with_meta(
        &mut self,
        key_suffix: &str,
        value: Bytes,
        meta: ObjectMeta,
    ) -> Result<(), UdlError> {
        let trace = self.next_trace(key_suffix)?;
        let dests = self.destinations;
        for (dest, mode) in dests {
            self.write(dest, *mode, key_suffix, value.clone(), trace.clone(), meta)?;
        }
        Ok(())
    }

    /// Emits to one explicit destination (for UDLs that route, like the
    /// onnx gate's reject path). On this node it is a direct store call:
    /// no network, and `value` is shared, not copied.
    pub fn emit_to(
        &mut self,
        dest: &str,
        mode: DestMode,
        key_suffix: &str,
        value: Bytes,
    ) -> Result<(), UdlError> {
        let trace = self.next_trace(&join_key(dest, key_suffix))?;
        let meta = self.source.meta;
        self.write(dest, mode, key_suffix, value, trace, meta)
    }

    fn write(
        &mut self,
        dest: &str,
        mode: DestMode,
        key_suffix: &str,
        value: Bytes,
        trace: Option<Arc<Trace>>,
        meta: ObjectMeta,
    ) -> Result<(), UdlError> {
        let key = join_key(dest, key_suffix);
        match mode {
            DestMode::Put => {
                self.ctx.put_traced(&key, value, trace)?;
            }
            DestMode::TriggerPut => {
                let origin = ObjectMeta {
                    tombstone: false,
                    ..meta
                };
                self.ctx
                    .trigger_put_traced(&key, value, trace, Some(origin))?;
            }
        }
        self.emitted += 1;
        Ok(())
    }

    /// A new object derived from the input (same trace plus this hop), for
    /// UDLs that publish rather than put.
    pub fn derive(&self, key: &str, value: Bytes) -> Arc<Object> {
        Arc::new(Object {
            key: Arc::from(key),
            meta: self.source.meta,
            value,
            // A published object triggers nothing: the depth limit is moot.
            trace: self
                .next_trace(key)
                .unwrap_or_else(|_| self.source.trace.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::join_key;

    #[test]
    fn join_key_uses_one_separator() {
        assert_eq!(join_key("/out", "/a"), "/out/a");
        assert_eq!(join_key("/out/", "/a"), "/out/a");
        assert_eq!(join_key("/out", "a"), "/out/a");
        assert_eq!(join_key("/out", ""), "/out");
    }
}
