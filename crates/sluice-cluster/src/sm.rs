//! The state machine of a group: applies committed commands to the node's
//! store (a data shard) or to the pool table and membership map (the
//! metadata group), deduplicates retried client writes, and builds and
//! installs snapshots.

use crate::rt::blocking;
use crate::types::{
    group_name, group_of, shard_of_group, Applied, Command, Entry, EntryPayload, LogId,
    MetaCommand, MetaEntry, SnapshotMeta, StorageError, StoredMembership,
};
use bytes::Bytes;

/// A snapshot: what it covers and its encoding (the bytes a member that
/// installs it restores from).
#[derive(Debug)]
pub struct Snapshot {
    pub meta: SnapshotMeta,
    pub data: Vec<u8>,
}
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use sluice_store::{ShardId, Store};
use sluice_types::cluster::ClusterLayout;
use sluice_types::{Object, ObjectMeta, PoolTable, PutResult, ReqId, SluiceError};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Results remembered per client, so a retried write is answered, not
/// applied again.
const DEDUP_PER_CLIENT: usize = 1024;
/// Clients remembered per shard (the least recently writing one goes).
const DEDUP_CLIENTS: usize = 10_000;
/// The same for the metadata group, whose results are larger (a pool's
/// description) and whose changes a client makes one after another (its
/// retries concern its last few), kept in every metadata snapshot: at
/// most about 10 MB of results.
const META_DEDUP_PER_CLIENT: usize = 32;
const META_DEDUP_CLIENTS: usize = 1_000;

/// `Sm::applying_again`'s bound while a member that started with nothing
/// has not heard from a leader (`Sm::hold_reads`).
pub const READS_HELD: u64 = u64::MAX;

/// What every node knows from the metadata group: shard members (what
/// clients route by) and the epoch, bumped by every metadata change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    pub epoch: u64,
    pub members: BTreeMap<u64, Vec<u32>>,
    /// The cluster's data flow graphs: id -> the graph as normalized JSON
    /// (UDL names resolved), which every node runs (`Engine::reconcile`).
    #[serde(default)]
    pub dfgs: BTreeMap<String, String>,
    /// Access rules, rate limits, QoS and principals, which every node
    /// enforces (`sluice policy`, `sluice auth`).
    #[serde(default)]
    pub policies: sluice_types::policy::Policies,
}

/// `MetaState` shared by the node and the metadata group's state machine,
/// with a signal for those who act on changes (the DFG reconciler).
#[derive(Debug)]
pub struct MetaCell {
    state: RwLock<MetaState>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl MetaCell {
    pub fn new(state: MetaState) -> MetaCell {
        MetaCell {
            state: RwLock::new(state),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Wakes the watchers (call after a change, the lock released).
    pub fn signal(&self) {
        let epoch = self.state.read().epoch;
        self.changed.send_replace(epoch);
    }

    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

impl std::ops::Deref for MetaCell {
    type Target = RwLock<MetaState>;
    fn deref(&self) -> &RwLock<MetaState> {
        &self.state
    }
}

impl MetaState {
    /// The members the layout file gives each replicated shard.
    pub fn from_layout(l: &ClusterLayout) -> MetaState {
        let mut members = BTreeMap::new();
        for (pool_type, sgs) in [
            (sluice_types::PoolType::Volatile, &l.subgroups.volatile),
            (sluice_types::PoolType::Persistent, &l.subgroups.persistent),
        ] {
            for (g, sg) in sgs.iter().enumerate() {
                for (s, m) in sg.shards.iter().enumerate() {
                    let id = ShardId {
                        pool_type,
                        subgroup: g as u32,
                        shard: s as u32,
                    };
                    if let Some(gid) = group_of(id) {
                        members.insert(gid, m.clone());
                    }
                }
            }
        }
        MetaState {
            epoch: 0,
            members,
            dfgs: BTreeMap::new(),
            policies: Default::default(),
        }
    }
}

/// A client's last results, oldest first. `seqs` counts the sequence
/// numbers in `results`, so a write that is not a retry (nearly all) is
/// told so without a walk over the window; it is derived, not stored
/// (snapshots keep the two fields they always had).
#[derive(Default, Serialize, Deserialize)]
#[serde(from = "StoredWindow")]
struct ClientWindow {
    last_index: u64,
    results: VecDeque<(u64, Applied)>,
    #[serde(skip_serializing)]
    seqs: HashMap<u64, u32>,
}

/// `ClientWindow` as snapshots hold it.
#[derive(Deserialize)]
struct StoredWindow {
    last_index: u64,
    results: VecDeque<(u64, Applied)>,
}

impl From<StoredWindow> for ClientWindow {
    fn from(w: StoredWindow) -> Self {
        let mut seqs = HashMap::with_capacity(w.results.len());
        for (s, _) in &w.results {
            *seqs.entry(*s).or_default() += 1;
        }
        ClientWindow {
            last_index: w.last_index,
            results: w.results,
            seqs,
        }
    }
}

impl ClientWindow {
    /// The result remembered for `seq`, the oldest if there are several.
    fn get(&self, seq: u64) -> Option<&Applied> {
        if !self.seqs.contains_key(&seq) {
            return None;
        }
        self.results.iter().find(|(s, _)| *s == seq).map(|(_, r)| r)
    }

    /// Remembers `seq`'s result, forgetting the oldest beyond `max`.
    fn push(&mut self, seq: u64, r: Applied, max: usize) {
        self.results.push_back((seq, r));
        *self.seqs.entry(seq).or_default() += 1;
        while self.results.len() > max {
            let Some((old, _)) = self.results.pop_front() else {
                break;
            };
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.seqs.entry(old) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
struct ShardSnapshot {
    last_version: u64,
    last_ts: u64,
    objects: Vec<(String, ObjectMeta, Bytes)>,
    dedup: Vec<(u64, ClientWindow)>,
}

/// A persistent shard's snapshot. Its objects are the shard's history,
/// on disk already: the snapshot file holds only the state beside it
/// (`records: None`; the history is fsync'd before the file is written).
/// What is sent to a member that needs the snapshot carries every
/// version up to `last_version` (`records: Some`).
#[derive(Serialize, Deserialize)]
struct PersistentSnapshot {
    last_version: u64,
    last_ts: u64,
    dedup: Vec<(u64, ClientWindow)>,
    records: Option<Vec<(String, ObjectMeta, Bytes)>>,
}

#[derive(Serialize, Deserialize)]
struct MetaSnapshot {
    table: PoolTable,
    state: MetaState,
    /// Results of clients' metadata changes (absent in snapshots from
    /// before they were kept).
    #[serde(default)]
    dedup: Vec<(u64, ClientWindow)>,
}

/// Where the current snapshot's data is.
#[derive(Clone)]
enum SnapData {
    /// In memory: the metadata group's and a persistent shard's (small),
    /// or any without a snapshot directory.
    Mem(Arc<Vec<u8>>),
    /// Only in the snapshot file: a volatile shard's, as large as the
    /// shard (written from the objects' values themselves, read back when
    /// a member needs it).
    File(PathBuf),
}

#[derive(Default)]
struct State {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    last_ts: u64,
    dedup: BTreeMap<u64, ClientWindow>,
    current: Option<(SnapshotMeta, SnapData)>,
    snapshots_built: u64,
    snapshots_installed: u64,
    /// A group's last entry handed to apply, kept across restarts
    /// (`crate::applied`); none without a directory.
    mark: Option<crate::applied::AppliedMark>,
}

/// One group's state machine. Clones share state (the driver builds
/// snapshots off its task with one).
#[derive(Clone)]
pub struct Sm {
    group: u64,
    shard: Option<ShardId>,
    /// A persistent shard: its history is its state (see `PersistentSnapshot`).
    persistent: bool,
    /// A persistent shard's consensus log: the history references values
    /// where this log holds them (one write to disk per value).
    log: Option<crate::log::LogStore>,
    store: Arc<Store>,
    meta: Arc<MetaCell>,
    /// Where the latest snapshot is kept (`None`: memory only).
    dir: Option<PathBuf>,
    sync: bool,
    st: Arc<Mutex<State>>,
    /// Serialises writing the snapshot file (built here or received).
    save_lock: Arc<Mutex<()>>,
    /// While a `Command::Without` is applied, the members it names as
    /// down (empty otherwise): lambdas dispatched to one member read it
    /// (`ClusterNode::position`, called as each write is delivered, on
    /// the thread applying it).
    down: Arc<Mutex<Vec<u32>>>,
    /// The last entry this member had applied before it restarted (0:
    /// none): applied again now, its writes are not delivered again, and
    /// stable reads wait until it is (`crate::applied`).
    /// Shared by the clones (the driver sets it for a member that started
    /// with nothing: `quiet_through`).
    applied_before: Arc<std::sync::atomic::AtomicU64>,
    /// `applied_before` until this member has applied it again, then 0;
    /// `READS_HELD` while a member that started with nothing has not
    /// heard from a leader (read without the state's lock on every stable
    /// read).
    again_until: Arc<std::sync::atomic::AtomicU64>,
}

/// Writes the bytes of `bincode::serialize(&(meta, data))` (a
/// length-prefixed byte string after the meta), `data` given as slices
/// (a large snapshot's values are not copied into one buffer first).
/// Overwrites `path` in place when it exists (tmpfs: pages the file has
/// cost far less than new ones), then cuts it to length.
fn write_snapshot_file(
    path: &std::path::Path,
    meta: &SnapshotMeta,
    data: &[std::io::IoSlice<'_>],
    sync: bool,
) -> std::io::Result<()> {
    let len: usize = data.iter().map(|s| s.len()).sum();
    let mut head = bincode::serialize(meta).map_err(std::io::Error::other)?;
    head.extend_from_slice(&(len as u64).to_le_bytes());
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)?;
    let mut slices = Vec::with_capacity(data.len() + 1);
    slices.push(std::io::IoSlice::new(&head));
    slices.extend(data.iter().map(|s| std::io::IoSlice::new(s)));
    crate::chunks::write_all_vectored(&mut f, &mut slices)?;
    f.set_len((head.len() + len) as u64)?;
    if sync {
        f.sync_all()?;
    }
    Ok(())
}

/// Reads back a snapshot file: the meta, then the data read straight into
/// its own buffer (not the whole file first and a copy of the data out of
/// it: a volatile shard's snapshot is as large as the shard).
fn read_snapshot_file(path: &std::path::Path) -> Result<(SnapshotMeta, Vec<u8>), StorageError> {
    use std::io::Read;
    let err = |e: &dyn std::fmt::Display| sm_err(format!("snapshot file {}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| err(&e))?;
    let size = file.metadata().map_err(|e| err(&e))?.len();
    let mut r = std::io::BufReader::new(file);
    // The encoding of `bincode::serialize`, bounded by the file's size (a
    // corrupt length is an error, not an allocation).
    use bincode::Options;
    let opts = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(size);
    let (meta, len): (SnapshotMeta, u64) = opts.deserialize_from(&mut r).map_err(|e| err(&e))?;
    let head = opts.serialized_size(&meta).map_err(|e| err(&e))? + 8;
    if head.saturating_add(len) != size {
        return Err(err(&format!(
            "holds {size} bytes but claims {head} of meta and {len} of data"
        )));
    }
    let mut data = vec![0u8; len as usize];
    r.read_exact(&mut data).map_err(|e| err(&e))?;
    Ok((meta, data))
}

/// Objects from a snapshot's `(key, meta, value)` records.
fn objects_of(records: Vec<(String, ObjectMeta, Bytes)>) -> Vec<Arc<Object>> {
    records
        .into_iter()
        .map(|(key, meta, value)| {
            Arc::new(Object {
                key: Arc::from(key),
                meta,
                value,
                trace: None,
            })
        })
        .collect()
}

/// Data in one buffer, as one part.
fn whole(d: Vec<u8>) -> (Vec<u8>, Vec<crate::chunks::Part>) {
    let n = d.len();
    (d, vec![crate::chunks::Part::Own(0..n)])
}

fn sm_err(e: impl std::fmt::Display) -> StorageError {
    std::io::Error::other(format!("applying to the state machine: {e}"))
}

/// This replica's disk failed (ENOSPC, an I/O error) applying a committed
/// entry (`what`): the other replicas' may not have, so answering with an
/// error would make them differ. The group stops here instead; after a
/// restart it rolls back to its snapshot and re-applies the log.
fn stop_replica(group: u64, what: &str, e: &SluiceError) -> StorageError {
    tracing::error!(group = %group_name(group), error = %e, "{what}; stopping this replica of the group");
    sm_err(e)
}

impl Sm {
    /// Opens the state machine of `group`, restoring the snapshot kept in
    /// `dir` (if any) into the store.
    pub fn open(
        group: u64,
        store: Arc<Store>,
        meta: Arc<MetaCell>,
        dir: Option<PathBuf>,
        sync: bool,
        log: Option<crate::log::LogStore>,
    ) -> Result<Sm, StorageError> {
        let shard = shard_of_group(group);
        let persistent = shard.is_some_and(|s| store.keeps_history(s));
        if let (true, Some(shard), Some(d)) = (persistent, shard, &dir) {
            let d = d.clone();
            store
                .set_value_resolver(
                    shard,
                    Arc::new(move |at: &sluice_store::ValueRef| crate::log::read_value(&d, at)),
                )
                .map_err(sm_err)?;
        }
        let covered = log.clone().filter(|_| dir.is_some());
        let sm = Sm {
            group,
            shard,
            persistent,
            log: log.filter(|_| persistent),
            store,
            meta,
            dir,
            sync,
            st: Arc::default(),
            save_lock: Arc::default(),
            down: Arc::default(),
            applied_before: Arc::default(),
            again_until: Arc::default(),
        };
        if let Some(d) = &sm.dir {
            let path = d.join("snapshot");
            if path.exists() {
                let (meta, data) = read_snapshot_file(&path)?;
                if let (Some(log), Some(last)) = (&covered, meta.last_log_id) {
                    log.purge_covered(last)?;
                }
                {
                    let mut st = sm.st.lock();
                    sm.restore(&mut st, &meta, &data)?;
                    let data = sm.held(data);
                    st.current = Some((meta, data));
                }
                return sm.resume(covered.as_ref());
            }
        }
        if let (true, Some(shard)) = (sm.persistent, sm.shard) {
            // No snapshot yet: the whole history is re-applied from the
            // consensus log (nothing of it was purged without a snapshot).
            let removed = sm.store.persistent_rollback(shard, 0).map_err(sm_err)?;
            if removed > 0 {
                tracing::info!(shard = %shard, removed, "history rolled back to the start; the consensus log re-applies it");
            }
        }
        sm.resume(covered.as_ref())
    }

    /// A member with a directory: opens its applied mark and, where the
    /// log holds the entry it names (and the snapshot does not cover it),
    /// applies up to there again without delivering, taking it as
    /// committed (`crate::applied`). The metadata group too: a restarted
    /// node has its pools and graphs back at once, not once a metadata
    /// leader tells it the commit point (its shards' writes meanwhile ran
    /// no lambda here: the graphs were not loaded yet).
    fn resume(self, log: Option<&crate::log::LogStore>) -> Result<Sm, StorageError> {
        let (Some(dir), Some(log)) = (&self.dir, log) else {
            return Ok(self);
        };
        let group = crate::types::group_name(self.group);
        let (mark, before) = crate::applied::AppliedMark::open(dir).map_err(sm_err)?;
        let mut st = self.st.lock();
        st.mark = Some(mark);
        let from = st.last_applied.map_or(0, |l| l.index);
        match before {
            Some(b) if b.index > from => {
                let held = log.log_id_at(b.index).map(|l| l.leader_id.term);
                if held == Some(b.leader_id.term) {
                    log.save_commit(b.index)?;
                    self.applied_before.store(b.index, Ordering::Relaxed);
                    self.again_until.store(b.index, Ordering::Relaxed);
                    tracing::info!(%group, from, to = b.index, "applying again what was applied before the restart, without running its lambdas again");
                } else {
                    tracing::warn!(%group, index = b.index, term = b.leader_id.term, log_term = ?held, "the log no longer holds the last entry applied before the restart; writes applied again are delivered again");
                }
            }
            _ => {}
        }
        drop(st);
        Ok(self)
    }

    /// A member that started with nothing (`raftrs/lost.rs`) serves no
    /// stable read until it hears from a leader (`quiet_through`) or is
    /// told to go on afresh (`release_reads`): it would say "not found"
    /// for what the others hold.
    pub(crate) fn hold_reads(&self) {
        self.again_until.store(READS_HELD, Ordering::Relaxed);
    }

    /// Reads held by `hold_reads` go on (a new group, or one whose every
    /// member lost its state: there is nothing to catch up on).
    pub(crate) fn release_reads(&self) {
        let _ =
            self.again_until
                .compare_exchange(READS_HELD, 0, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// A member that started with nothing learns the leader's commit
    /// point: it may have applied everything up to there before it lost
    /// its state (its lambdas ran then), so it applies up to there without
    /// delivering, and serves no stable read until it has.
    pub(crate) fn quiet_through(&self, index: u64) {
        let st = self.st.lock();
        let applied = st.last_applied.map_or(0, |l| l.index);
        if index > self.applied_before.load(Ordering::Relaxed) && index > applied {
            self.applied_before.store(index, Ordering::Relaxed);
            self.again_until.store(index, Ordering::Relaxed);
            tracing::info!(group = %crate::types::group_name(self.group), applied, through = index, "started with no state: applies the log up to the leader's commit point without running its lambdas again");
        } else {
            self.release_reads();
        }
    }

    /// While a restarted member applies again what it had applied before
    /// (its stable reads would see less than it served then): (applied,
    /// applied before the restart; `READS_HELD` for one that started with
    /// nothing and has not heard from a leader yet).
    pub fn applying_again(&self) -> Option<(u64, u64)> {
        match self.again_until.load(Ordering::Relaxed) {
            0 => None,
            until => Some((self.applied_index(), until)),
        }
    }

    /// The windows to encode in a snapshot (taken under the state's
    /// lock: without the derived index, which is not stored and is
    /// rebuilt when a snapshot is read).
    fn dedup_copy(st: &State) -> Vec<(u64, ClientWindow)> {
        st.dedup
            .iter()
            .map(|(c, w)| {
                let copy = ClientWindow {
                    last_index: w.last_index,
                    results: w.results.clone(),
                    seqs: HashMap::new(),
                };
                (*c, copy)
            })
            .collect()
    }

    /// Restores a persistent shard: from the snapshot file (the history
    /// is rolled back to the snapshot's version, the consensus log
    /// re-applies what follows) or from a leader's snapshot (the history
    /// is replaced by the records it carries).
    fn restore_persistent(
        &self,
        st: &mut State,
        shard: ShardId,
        data: &[u8],
    ) -> Result<(), StorageError> {
        let snap: PersistentSnapshot = bincode::deserialize(data).map_err(sm_err)?;
        match snap.records {
            None => {
                let removed = blocking(|| self.store.persistent_rollback(shard, snap.last_version))
                    .map_err(sm_err)?;
                if removed > 0 {
                    tracing::info!(shard = %shard, removed, version = snap.last_version, "history rolled back to the snapshot; the consensus log re-applies what follows");
                }
            }
            Some(records) => {
                let objects = objects_of(records);
                blocking(|| {
                    self.store
                        .persistent_install(shard, snap.last_version, &objects)
                })
                .map_err(sm_err)?;
            }
        }
        st.last_ts = snap.last_ts;
        st.dedup = snap.dedup.into_iter().collect();
        Ok(())
    }

    /// The snapshot file's form of a persistent snapshot (no records).
    fn persistent_file_form(data: &[u8]) -> Result<Vec<u8>, StorageError> {
        let mut snap: PersistentSnapshot = bincode::deserialize(data).map_err(sm_err)?;
        snap.records = None;
        bincode::serialize(&snap).map_err(sm_err)
    }

    fn restore(
        &self,
        st: &mut State,
        meta: &SnapshotMeta,
        data: &[u8],
    ) -> Result<(), StorageError> {
        match self.shard {
            Some(shard) if self.persistent => self.restore_persistent(st, shard, data)?,
            Some(shard) => {
                let snap: ShardSnapshot = bincode::deserialize(data).map_err(sm_err)?;
                let objects = objects_of(snap.objects);
                self.store
                    .install_shard(shard, snap.last_version, objects)
                    .map_err(sm_err)?;
                st.last_ts = snap.last_ts;
                st.dedup = snap.dedup.into_iter().collect();
            }
            None => {
                let snap: MetaSnapshot = serde_json::from_slice(data).map_err(sm_err)?;
                self.store.replace_pool_table(snap.table).map_err(sm_err)?;
                *self.meta.write() = snap.state;
                st.dedup = snap.dedup.into_iter().collect();
                self.meta.signal();
            }
        }
        st.last_applied = meta.last_log_id;
        st.membership = meta.last_membership.clone();
        Ok(())
    }

    /// The snapshot file of a group whose snapshot data stays only there
    /// (a volatile shard with a directory).
    fn data_file(&self) -> Option<PathBuf> {
        let d = self
            .dir
            .as_ref()
            .filter(|_| self.shard.is_some() && !self.persistent)?;
        Some(d.join("snapshot"))
    }

    /// What `current` holds of a snapshot's data (`data`: all of it,
    /// unless it stays in the file).
    fn held(&self, data: Vec<u8>) -> SnapData {
        match self.data_file() {
            Some(path) => SnapData::File(path),
            None => SnapData::Mem(Arc::new(data)),
        }
    }

    /// Writes the snapshot file: into `snapshot.tmp`, renamed over
    /// `snapshot` once complete. The file it replaces becomes the next
    /// `snapshot.tmp` (overwritten in place next time).
    fn save(&self, meta: &SnapshotMeta, data: &[std::io::IoSlice<'_>]) -> Result<(), StorageError> {
        let Some(d) = &self.dir else { return Ok(()) };
        std::fs::create_dir_all(d).map_err(sm_err)?;
        let (tmp, cur, old) = (
            d.join("snapshot.tmp"),
            d.join("snapshot"),
            d.join("snapshot.old"),
        );
        write_snapshot_file(&tmp, meta, data, self.sync).map_err(sm_err)?;
        let _ = std::fs::remove_file(&old);
        let kept = std::fs::hard_link(&cur, &old).is_ok();
        std::fs::rename(&tmp, &cur).map_err(sm_err)?;
        if kept {
            let _ = std::fs::rename(&old, &tmp);
        }
        Ok(())
    }

    /// The members named down by the `Command::Without` being applied
    /// now (none outside one), to `f`.
    pub(crate) fn with_down<R>(&self, f: impl FnOnce(&[u32]) -> R) -> R {
        f(&self.down.lock())
    }

    fn apply_batch(
        &self,
        st: &mut State,
        index: u64,
        shard: ShardId,
        writes: Vec<crate::types::BatchedWrite>,
        refs: &mut std::collections::VecDeque<sluice_store::ValueRef>,
    ) -> Result<Applied, StorageError> {
        let mut out = Vec::with_capacity(writes.len());
        for w in writes {
            out.push(self.apply_write(st, index, shard, w.into(), refs)?);
        }
        Ok(Applied::Batch(out))
    }

    fn apply_write(
        &self,
        st: &mut State,
        index: u64,
        shard: ShardId,
        cmd: Command,
        refs: &mut std::collections::VecDeque<sluice_store::ValueRef>,
    ) -> Result<Applied, StorageError> {
        let Command::Write {
            key,
            value,
            expected,
            timestamp_us,
            req_id,
            trace,
        } = cmd
        else {
            return Ok(Applied::None);
        };
        // Where the log holds this value (taken in encoding order, so
        // before any early return).
        let at = match &value {
            Some(v) if v.len() >= crate::log::MIN_REF => refs.pop_front(),
            _ => None,
        };
        if let Some(r) = req_id.and_then(|id| Self::result_of(st, id)) {
            return Ok(r);
        }
        // Strictly increasing in log order, identical on every replica.
        let ts = timestamp_us.max(st.last_ts + 1);
        let how = sluice_store::Replicated {
            timestamp_us: ts,
            at,
            // Delivered when first applied, before a restart.
            deliver: index > self.applied_before.load(Ordering::Relaxed),
        };
        let res: Result<PutResult, SluiceError> =
            self.store
                .apply_write(shard, &key, value, expected, trace.map(Arc::new), how);
        if let Err(e @ SluiceError::Io { .. }) = &res {
            return Err(stop_replica(self.group, "writing the history failed", e));
        }
        if res.is_ok() {
            st.last_ts = ts;
        }
        let applied = Applied::Put(res.map_err(|e| Applied::err(&e)));
        if let Some(id) = req_id {
            self.remember(st, id, index, &applied);
        }
        Ok(applied)
    }

    /// The result kept for a client's request `id`, if it was applied.
    fn result_of(st: &State, id: ReqId) -> Option<Applied> {
        st.dedup.get(&id.client)?.get(id.seq).cloned()
    }

    /// Keeps `applied` as the result of the client's request `id`
    /// (applied at log index `index`), forgetting the client that wrote
    /// least recently beyond this group's bound.
    fn remember(&self, st: &mut State, id: ReqId, index: u64, applied: &Applied) {
        let (per_client, clients) = match self.shard {
            Some(_) => (DEDUP_PER_CLIENT, DEDUP_CLIENTS),
            None => (META_DEDUP_PER_CLIENT, META_DEDUP_CLIENTS),
        };
        let w = st.dedup.entry(id.client).or_default();
        w.last_index = index;
        w.push(id.seq, applied.clone(), per_client);
        if st.dedup.len() > clients {
            if let Some(oldest) = st
                .dedup
                .iter()
                .min_by_key(|(_, w)| w.last_index)
                .map(|(c, _)| *c)
            {
                st.dedup.remove(&oldest);
            }
        }
    }

    /// The result of a client's request `id` if this replica applied it:
    /// a metadata change retried after its reply was lost is answered
    /// from here before anything is prepared for it again.
    pub fn applied_result(&self, id: ReqId) -> Option<Applied> {
        Self::result_of(&self.st.lock(), id)
    }

    /// A metadata change; one that carries a request id already applied
    /// (a client's retry) is answered with the first result, not made
    /// again.
    fn apply_meta(&self, st: &mut State, index: u64, json: &str) -> Result<Applied, StorageError> {
        let entry: MetaEntry = match serde_json::from_str(json) {
            Ok(e) => e,
            Err(e) => {
                return Ok(Applied::Meta(Err(Applied::err(&SluiceError::protocol(
                    e.to_string(),
                )))))
            }
        };
        if let Some(r) = entry.req_id.and_then(|id| Self::result_of(st, id)) {
            return Ok(r);
        }
        let applied = self.apply_meta_command(entry.cmd)?;
        if let Some(id) = entry.req_id {
            self.remember(st, id, index, &applied);
        }
        Ok(applied)
    }

    fn apply_meta_command(&self, cmd: MetaCommand) -> Result<Applied, StorageError> {
        let to_json = |r: Result<sluice_types::PoolMeta, SluiceError>| match r {
            Ok(p) => Ok(Ok(serde_json::to_string(&p).unwrap_or_default())),
            // The pool table not written: with an error result this node
            // went on without the change for good.
            Err(e @ SluiceError::Io { .. }) => Err(stop_replica(
                self.group,
                "writing the pool table failed",
                &e,
            )),
            Err(e) => Ok(Err(Applied::err(&e))),
        };
        let res = match cmd {
            MetaCommand::PoolCreate { spec, created_us } => {
                to_json(self.store.create_pool_at(&spec, created_us))?
            }
            MetaCommand::PoolRemove { path } => to_json(self.store.remove_pool(&path))?,
            MetaCommand::PoolPurge { path, report } => {
                let r = to_json(self.store.drop_purged_pool(&path))?;
                match (r, report) {
                    (Ok(_), Some(report)) => Ok(serde_json::to_string(&report).unwrap_or_default()),
                    (r, _) => r,
                }
            }
            MetaCommand::SetMembers { group, members } => {
                self.meta.write().members.insert(group, members);
                Ok("{}".to_string())
            }
            MetaCommand::DfgSet { graphs } => {
                let mut m = self.meta.write();
                for (id, json) in graphs {
                    m.dfgs.insert(id, json);
                }
                Ok("{}".to_string())
            }
            MetaCommand::DfgRemove { id } => match self.meta.write().dfgs.remove(&id) {
                Some(_) => Ok("{}".to_string()),
                None => Err(Applied::err(&SluiceError::DfgNotFound { id })),
            },
            MetaCommand::Policy { change } => match self.meta.write().policies.apply(change) {
                Ok(()) => Ok("{}".to_string()),
                Err(e) => Err(Applied::err(&e)),
            },
        };
        self.meta.write().epoch += 1;
        self.meta.signal();
        Ok(Applied::Meta(res))
    }

    pub(crate) fn build(&self) -> Result<Snapshot, StorageError> {
        // Under the lock only what is cheap: the state at `last_applied`
        // (object snapshots are immutable `Arc`s). Encoding happens after,
        // so applying new entries is not held up by a large snapshot.
        enum Taken {
            Shard(ShardSnapshotRefs),
            Persistent(PersistentSnapshot),
            Meta(Vec<u8>),
        }
        struct ShardSnapshotRefs {
            last_version: u64,
            last_ts: u64,
            objects: Vec<Arc<Object>>,
            dedup: Vec<(u64, ClientWindow)>,
        }
        let (taken, meta) = {
            let mut st = self.st.lock();
            let last_version = |shard| self.store.shard(shard).map_or(0, |s| s.last_version());
            let taken = match self.shard {
                Some(shard) if self.persistent => Taken::Persistent(PersistentSnapshot {
                    last_version: last_version(shard),
                    last_ts: st.last_ts,
                    dedup: Self::dedup_copy(&st),
                    records: None,
                }),
                Some(shard) => Taken::Shard(ShardSnapshotRefs {
                    last_version: last_version(shard),
                    last_ts: st.last_ts,
                    objects: self.store.shard_objects(shard),
                    dedup: Self::dedup_copy(&st),
                }),
                None => Taken::Meta(
                    serde_json::to_vec(&MetaSnapshot {
                        table: self.store.pool_table(),
                        state: self.meta.read().clone(),
                        dedup: Self::dedup_copy(&st),
                    })
                    .map_err(sm_err)?,
                ),
            };
            st.snapshots_built += 1;
            let meta = SnapshotMeta::new(st.last_applied, st.membership.clone());
            (taken, meta)
        };
        // The encoding as parts: a volatile shard's values by reference.
        let (buf, parts) = match taken {
            Taken::Meta(d) => whole(d),
            Taken::Persistent(p) => {
                // Every version the snapshot covers must be on disk before
                // the snapshot lets the driver purge the log entries.
                if let Some(shard) = self.shard {
                    self.store.persistent_sync(shard).map_err(sm_err)?;
                    // Log segments set aside after a purge whose values
                    // no version refers to any more (retention) can go.
                    if let Some(log) = &self.log {
                        let min = self.store.min_value_segment(shard).map_err(sm_err)?;
                        match log.drop_kept_below(min) {
                            Ok((0, _)) => {}
                            Ok((files, bytes)) => {
                                tracing::info!(shard = %shard, files, bytes, "reclaimed log segments no version refers to")
                            }
                            Err(e) => {
                                tracing::warn!(shard = %shard, error = %e, "could not reclaim log segments")
                            }
                        }
                        // What is left of the kept segments holds values
                        // still referred to (a key written once and kept):
                        // only their pages stay on disk.
                        if let Some(live) = log.first_live_segment() {
                            let io = |e: SluiceError| std::io::Error::other(e.to_string());
                            let punched = self
                                .store
                                .value_ref_counts_below(shard, live)
                                .map_err(io)
                                .and_then(|counts| {
                                    log.punch_kept(&counts, |due| {
                                        self.store.value_refs_in(shard, due).map_err(io)
                                    })
                                });
                            match punched {
                                Ok((0, _)) => {}
                                Ok((files, freed)) => {
                                    tracing::debug!(shard = %shard, files, freed, "punched kept log segments down to the values still referred to")
                                }
                                Err(e) => {
                                    tracing::warn!(shard = %shard, error = %e, "could not punch kept log segments")
                                }
                            }
                        }
                    }
                }
                whole(bincode::serialize(&p).map_err(sm_err)?)
            }
            Taken::Shard(r) => {
                let snap = ShardSnapshot {
                    last_version: r.last_version,
                    last_ts: r.last_ts,
                    objects: r
                        .objects
                        .iter()
                        .map(|o| (o.key.to_string(), o.meta, o.value.clone()))
                        .collect(),
                    dedup: r.dedup,
                };
                if self.data_file().is_none() {
                    whole(bincode::serialize(&snap).map_err(sm_err)?)
                } else {
                    // Only the file gets it: values by reference.
                    let values: Vec<Bytes> = snap
                        .objects
                        .iter()
                        .map(|(_, _, v)| v.clone())
                        .filter(|v| v.len() >= crate::chunks::SNAPSHOT_BY_REFERENCE)
                        .collect();
                    crate::chunks::encode_sized(&snap, &values).map_err(sm_err)?
                }
            }
        };
        let _save = self.save_lock.lock();
        // A snapshot installed meanwhile from the leader is newer: keep it.
        let newer = self
            .st
            .lock()
            .current
            .as_ref()
            .is_some_and(|(m, _)| m.last_log_id > meta.last_log_id);
        if !newer {
            self.save(&meta, &crate::chunks::io_slices(&buf, &parts))?;
            // Kept in memory, `buf` is the whole encoding (`whole`).
            let data = self.held(buf);
            self.st.lock().current = Some((meta.clone(), data));
        }
        // The driver keeps only the meta of a snapshot it asked us to
        // build (followers are sent `current_snapshot`): no second copy here.
        Ok(Snapshot {
            meta,
            data: Vec::new(),
        })
    }

    /// Index of the last entry the current snapshot covers (0: none).
    pub fn snapshot_index(&self) -> u64 {
        let st = self.st.lock();
        st.current
            .as_ref()
            .and_then(|(m, _)| m.last_log_id)
            .map_or(0, |l| l.index)
    }

    /// The configuration the state machine has applied, where it has
    /// applied one (a membership entry, or a snapshot that holds one).
    pub(crate) fn membership(&self) -> Option<crate::types::Membership> {
        let st = self.st.lock();
        st.membership
            .log_id()
            .map(|_| st.membership.membership().clone())
    }

    /// Index of the last applied entry (0 before any).
    pub fn applied_index(&self) -> u64 {
        self.st.lock().last_applied.map_or(0, |l| l.index)
    }

    /// (snapshots built here, snapshots received from a leader).
    pub fn snapshot_counts(&self) -> (u64, u64) {
        let st = self.st.lock();
        (st.snapshots_built, st.snapshots_installed)
    }

    /// The size in bytes of the snapshot this member holds (0 without
    /// one); a snapshot kept only in its file is measured there, outside
    /// the state's lock.
    pub fn snapshot_bytes(&self) -> u64 {
        let held = self.st.lock().current.as_ref().map(|(_, d)| match d {
            SnapData::Mem(b) => Ok(b.len() as u64),
            SnapData::File(p) => Err(p.clone()),
        });
        match held {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(path)) => std::fs::metadata(path).map_or(0, |m| m.len()),
        }
    }
}

impl Sm {
    /// Applies committed entries in order, one result each.
    pub(crate) fn apply_entries(
        &self,
        entries: impl Iterator<Item = Entry>,
    ) -> Result<Vec<Applied>, StorageError> {
        // Held across the whole batch: a snapshot sees exactly the state
        // at `last_applied`, never half a batch.
        let mut st = self.st.lock();
        let mut out = Vec::new();
        let before = self.applied_before.load(Ordering::Relaxed);
        for e in entries {
            st.last_applied = Some(e.log_id);
            if let Some(m) = st.mark.as_mut().filter(|_| e.log_id.index > before) {
                m.set(e.log_id);
            }
            crate::marks::mark(
                sluice_types::marks::Point::Apply,
                self.group,
                e.log_id.index,
            );
            // A persistent shard's history points at the values in the log
            // (found only for the entry the log holds; else it copies them).
            let mut refs: std::collections::VecDeque<sluice_store::ValueRef> = self
                .log
                .as_ref()
                .and_then(|l| l.value_refs(&e))
                .unwrap_or_default()
                .into();
            let r = match e.payload {
                EntryPayload::Blank => Applied::None,
                EntryPayload::Membership(m) => {
                    st.membership = StoredMembership::new(Some(e.log_id), m);
                    Applied::None
                }
                EntryPayload::Normal(Command::Meta(json)) => {
                    self.apply_meta(&mut st, e.log_id.index, &json)?
                }
                EntryPayload::Normal(Command::Tick { timestamp_us }) => {
                    st.last_ts = st.last_ts.max(timestamp_us);
                    if let Some(shard) = self.shard {
                        self.store.advance_visible(shard, st.last_ts);
                    }
                    Applied::None
                }
                EntryPayload::Normal(Command::Purge { prefix, except }) => match self.shard {
                    Some(shard) => match self.store.purge_shard(shard, &prefix, &except) {
                        Ok(r) => Applied::Purged(Ok(r)),
                        Err(e @ SluiceError::Io { .. }) => {
                            return Err(stop_replica(self.group, "purging the shard failed", &e));
                        }
                        Err(e) => Applied::Purged(Err(Applied::err(&e))),
                    },
                    None => Applied::None,
                },
                EntryPayload::Normal(Command::Batch(cmds)) => match self.shard {
                    Some(shard) => {
                        self.apply_batch(&mut st, e.log_id.index, shard, cmds, &mut refs)?
                    }
                    None => Applied::None,
                },
                EntryPayload::Normal(Command::Without { down, writes }) => match self.shard {
                    Some(shard) => {
                        *self.down.lock() = down;
                        let r = self.apply_batch(&mut st, e.log_id.index, shard, writes, &mut refs);
                        self.down.lock().clear();
                        r?
                    }
                    None => Applied::None,
                },
                EntryPayload::Normal(cmd) => match self.shard {
                    Some(shard) => {
                        self.apply_write(&mut st, e.log_id.index, shard, cmd, &mut refs)?
                    }
                    None => Applied::None,
                },
            };
            out.push(r);
        }
        self.note_applied(&st);
        Ok(out)
    }

    /// Ends `applying_again` once this member has applied what it had
    /// before its restart (by entries, or a snapshot installed past it).
    fn note_applied(&self, st: &State) {
        let applied = st.last_applied.map_or(0, |l| l.index);
        let before = self.applied_before.load(Ordering::Relaxed);
        if before > 0 && applied >= before {
            self.again_until.store(0, Ordering::Relaxed);
        }
    }

    /// Installs a snapshot received from the leader.
    pub(crate) fn install(
        &self,
        meta: &SnapshotMeta,
        mut data: Vec<u8>,
    ) -> Result<(), StorageError> {
        let _save = self.save_lock.lock();
        let mut st = self.st.lock();
        self.restore(&mut st, meta, &data)?;
        if self.persistent {
            data = Self::persistent_file_form(&data)?;
        }
        self.save(meta, &[std::io::IoSlice::new(&data)])?;
        st.current = Some((meta.clone(), self.held(data)));
        st.snapshots_installed += 1;
        self.note_applied(&st);
        tracing::info!(group = %crate::types::group_name(self.group), last_log_id = ?meta.last_log_id, "installed a snapshot from the leader");
        Ok(())
    }

    /// The snapshot to send a member that is too far behind.
    pub(crate) fn current_snapshot(&self) -> Result<Option<Snapshot>, StorageError> {
        let current = self.st.lock().current.clone();
        let Some((meta, data)) = current else {
            return Ok(None);
        };
        let (meta, data) = match data {
            SnapData::Mem(d) => (meta, d),
            SnapData::File(path) => {
                // The file's own meta: a snapshot saved since `current`
                // was read is newer, and consistent with its data.
                let (m, d) = blocking(|| read_snapshot_file(&path))?;
                (m, Arc::new(d))
            }
        };
        let data = match self.shard {
            // What a member needs: every version up to the snapshot's,
            // read from the history.
            Some(shard) if self.persistent => blocking(|| {
                let mut snap: PersistentSnapshot = bincode::deserialize(&data).map_err(sm_err)?;
                let records = self
                    .store
                    .persistent_records(shard, snap.last_version)
                    .map_err(sm_err)?;
                snap.records = Some(
                    records
                        .iter()
                        .map(|o| (o.key.to_string(), o.meta, o.value.clone()))
                        .collect(),
                );
                bincode::serialize(&snap).map_err(sm_err)
            })?,
            _ => Arc::unwrap_or_clone(data),
        };
        Ok(Some(Snapshot { meta, data }))
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;

    #[test]
    fn the_snapshot_file_is_the_bincode_of_meta_and_data() {
        let d = tempfile::tempdir().unwrap();
        let meta = SnapshotMeta::new(
            Some(LogId::new(crate::types::CommittedLeaderId::new(2, 1), 42)),
            StoredMembership::default(),
        );
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let path = d.path().join("snapshot");
        write_snapshot_file(&path, &meta, &[std::io::IoSlice::new(&data)], true).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes, bincode::serialize(&(&meta, &data[..])).unwrap());
        let (m, back): (SnapshotMeta, Vec<u8>) = bincode::deserialize(&bytes).unwrap();
        assert_eq!((m, back), (meta.clone(), data.clone()));
        // Overwritten in place by a shorter one: cut to its length.
        let short = &data[..1000];
        let parts = [
            std::io::IoSlice::new(&short[..10]),
            std::io::IoSlice::new(&short[10..]),
        ];
        write_snapshot_file(&path, &meta, &parts, false).unwrap();
        assert_eq!(read_snapshot_file(&path).unwrap(), (meta, short.to_vec()));
        // A cut file is an error naming it.
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 10).unwrap();
        let e = read_snapshot_file(&path).unwrap_err().to_string();
        assert!(e.contains("snapshot file") && e.contains("claims"), "{e}");
        // So is garbage where the meta should be.
        std::fs::write(&path, [0xffu8; 64]).unwrap();
        let e = read_snapshot_file(&path).unwrap_err().to_string();
        assert!(e.contains("snapshot file"), "{e}");
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;

    fn put(v: u64) -> Applied {
        Applied::Put(Ok(sluice_types::PutResult {
            version: v,
            timestamp_us: v,
        }))
    }

    /// The window answers retries with the oldest result of a sequence
    /// number, forgets beyond its size in arrival order, and is stored as
    /// the two fields snapshots always held (its index rebuilt on load).
    #[test]
    fn a_client_window_finds_retries_and_forgets_the_oldest() {
        let mut w = ClientWindow::default();
        // Out of order, as concurrent requests of one client apply.
        for s in [2u64, 1, 4, 3] {
            w.push(s, put(s * 10), 5);
        }
        assert_eq!(w.get(1), Some(&put(10)));
        assert_eq!(w.get(3), Some(&put(30)));
        assert_eq!(w.get(9), None);
        // A sequence number seen twice: the first result stands until it
        // goes, then the second answers.
        w.push(1, put(11), 5);
        assert_eq!(w.get(1), Some(&put(10)));
        w.push(5, put(50), 5);
        assert_eq!(w.get(2), None, "the oldest went");
        assert_eq!(w.get(1), Some(&put(10)));
        w.push(6, put(60), 5);
        assert_eq!(w.get(1), Some(&put(11)));
        for s in 7..=9 {
            w.push(s, put(s * 10), 5);
        }
        assert_eq!(w.get(1), None);
        assert_eq!(w.seqs.len(), 5);

        #[derive(Serialize)]
        struct Old {
            last_index: u64,
            results: VecDeque<(u64, Applied)>,
        }
        let stored = bincode::serialize(&w).unwrap();
        let old = bincode::serialize(&Old {
            last_index: w.last_index,
            results: w.results.clone(),
        })
        .unwrap();
        assert_eq!(stored, old, "the stored form did not change");
        let back: ClientWindow = bincode::deserialize(&stored).unwrap();
        assert_eq!(back.get(6), Some(&put(60)));
        assert_eq!(back.get(4), None);
        assert_eq!(back.seqs, w.seqs);
    }
}

#[cfg(test)]
mod meta_tests {
    use super::*;
    use crate::types::{CommittedLeaderId, META_GROUP};

    fn meta_sm() -> Sm {
        let store = Store::open(sluice_store::StoreConfig::default()).unwrap();
        let cell = Arc::new(MetaCell::new(MetaState::default()));
        Sm::open(META_GROUP, Arc::new(store), cell, None, false, None).unwrap()
    }

    fn entry(index: u64, json: String) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Normal(Command::Meta(json)),
        }
    }

    fn apply(sm: &Sm, index: u64, cmd: &MetaCommand, req_id: Option<ReqId>) -> Applied {
        let json = serde_json::to_string(&MetaEntry {
            cmd: cmd.clone(),
            req_id,
        })
        .unwrap();
        sm.apply_entries(std::iter::once(entry(index, json)))
            .unwrap()
            .remove(0)
    }

    /// A client's pool create whose reply was lost (its leader died) and
    /// that it retried under the same request id is answered with the
    /// first result, not "already exists"; on a replica that got the
    /// state by snapshot too. A create that is not a retry is refused.
    #[test]
    fn a_retried_metadata_change_is_answered_with_its_first_result() {
        let sm = meta_sm();
        let create = MetaCommand::PoolCreate {
            spec: sluice_types::PoolSpec {
                pathname: "/p".into(),
                pool_type: Some(sluice_types::PoolType::Volatile),
                ..Default::default()
            },
            created_us: 1,
        };
        let id = ReqId { client: 7, seq: 1 };
        let first = apply(&sm, 1, &create, Some(id));
        let Applied::Meta(Ok(pool)) = &first else {
            panic!("the create failed: {first:?}")
        };
        assert!(pool.contains("\"/p\""), "{pool}");
        assert_eq!(apply(&sm, 2, &create, Some(id)), first, "the retry");
        assert_eq!(sm.applied_result(id), Some(first.clone()));
        match apply(&sm, 3, &create, Some(ReqId { client: 7, seq: 2 })) {
            Applied::Meta(Err(e)) => assert!(e.contains("pool_exists"), "{e}"),
            other => panic!("a second create of /p: {other:?}"),
        }
        // A replica that installs a snapshot answers the retry the same.
        sm.build().unwrap();
        let snap = sm.current_snapshot().unwrap().unwrap();
        let other = meta_sm();
        other.install(&snap.meta, snap.data.clone()).unwrap();
        assert_eq!(apply(&other, 4, &create, Some(id)), first);
        // An entry written before entries carried a request id.
        let old = serde_json::to_string(&MetaCommand::PoolRemove { path: "/p".into() }).unwrap();
        assert!(!old.contains("req_id"), "{old}");
        let r = other
            .apply_entries(std::iter::once(entry(5, old)))
            .unwrap()
            .remove(0);
        assert!(matches!(r, Applied::Meta(Ok(_))), "{r:?}");
        // A snapshot from before the results were kept.
        let mut v: serde_json::Value = serde_json::from_slice(&snap.data).unwrap();
        v.as_object_mut().unwrap().remove("dedup").unwrap();
        let third = meta_sm();
        third
            .install(&snap.meta, serde_json::to_vec(&v).unwrap())
            .unwrap();
        assert_eq!(third.applied_result(id), None);
    }

    /// The metadata group keeps few results per client and few clients
    /// (every metadata snapshot holds them): the oldest go first.
    #[test]
    fn the_metadata_results_kept_are_bounded() {
        let sm = meta_sm();
        let remove = |i: u64| MetaCommand::PoolRemove {
            path: format!("/none{i}"),
        };
        let mut index = 0;
        let mut next = || {
            index += 1;
            index
        };
        let client = |c: u64, seq: u64| Some(ReqId { client: c, seq });
        for seq in 0..(META_DEDUP_PER_CLIENT as u64 + 8) {
            apply(&sm, next(), &remove(seq), client(1, seq));
        }
        assert!(sm.applied_result(ReqId { client: 1, seq: 7 }).is_none());
        assert!(sm.applied_result(ReqId { client: 1, seq: 8 }).is_some());
        for c in 2..=(META_DEDUP_CLIENTS as u64 + 1) {
            apply(&sm, next(), &remove(c), client(c, 0));
        }
        let st = sm.st.lock();
        assert_eq!(st.dedup.len(), META_DEDUP_CLIENTS);
        assert!(
            !st.dedup.contains_key(&1),
            "the client that wrote least recently went"
        );
    }
}
