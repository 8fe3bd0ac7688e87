use crate::layout::ShardId;
use parking_lot::Mutex;
use sluice_types::Object;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One shard: the latest version of each key, plus the shard's version
/// sequence.
///
/// Writers serialise on `write_lock` (it guards the version counter, so
/// versions are assigned in the order objects become visible). Readers never
/// touch it: `objects` is a lock-free map from key to an immutable
/// `Arc<Object>` snapshot, swapped whole by the writer.
pub struct Shard {
    pub id: ShardId,
    pub(crate) write_lock: Mutex<()>,
    last_version: AtomicU64,
    /// Timestamp of the newest visible write: every write of this shard
    /// with an earlier timestamp is visible too (timestamps are assigned in
    /// version order and writes become visible in version order).
    pub(crate) visible_ts: AtomicU64,
    pub(crate) objects: papaya::HashMap<Arc<str>, Arc<Object>>,
    /// Every version on disk, for shards of persistent pools.
    pub(crate) history: Option<Mutex<sluice_log::History>>,
    /// Group commit state, for persistent shards with the batch policy.
    pub(crate) commit: Option<GroupCommit>,
    /// Held while the history's segments are rewritten (retention or a
    /// purge): one rewrite of a segment at a time.
    pub(crate) compaction: Mutex<()>,
}

/// Group commit: writers append under the shard's write lock, then one of
/// them fsyncs for everyone appended so far; objects become visible (in
/// version order) only once that fsync succeeded.
#[derive(Default)]
pub(crate) struct GroupCommit {
    pub(crate) state: Mutex<CommitState>,
    pub(crate) cond: parking_lot::Condvar,
    /// A handle on the active segment for the syncer, reopened only when
    /// the log rolls over to a new segment.
    pub(crate) sync_file: Mutex<Option<(u64, Box<dyn sluice_log::SegmentFile>)>>,
}

#[derive(Default)]
pub(crate) struct CommitState {
    /// Appended, not yet durable, in version order.
    pub(crate) pending: std::collections::VecDeque<Arc<Object>>,
    /// Every version up to this one is durable and visible.
    pub(crate) durable: u64,
    pub(crate) syncing: bool,
    /// Set after a failed fsync: the disk is not trusted again until the
    /// node restarts and recovers from what is actually on it.
    pub(crate) failed: Option<String>,
}

impl Shard {
    pub fn new(id: ShardId) -> Self {
        Shard {
            id,
            write_lock: Mutex::new(()),
            last_version: AtomicU64::new(0),
            visible_ts: AtomicU64::new(0),
            objects: papaya::HashMap::new(),
            history: None,
            commit: None,
            compaction: Mutex::new(()),
        }
    }

    /// The latest version assigned in this shard (0 before the first put).
    pub fn last_version(&self) -> u64 {
        self.last_version.load(Ordering::Acquire)
    }

    pub(crate) fn set_last_version(&self, v: u64) {
        self.last_version.store(v, Ordering::Release);
    }

    /// Latest object of a key (tombstones included). Lock-free.
    pub fn latest(&self, key: &str) -> Option<Arc<Object>> {
        self.objects.pin().get(key).cloned()
    }

    /// Number of keys held, tombstones included.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
