//! Sluice's shard store.
//!
//! Holds the pool table and the shards this node hosts, assigns versions and
//! timestamps, and calls delivery observers (watchers, lambdas) after each
//! put. Architecture invariants:
//! - no network I/O: the server crate owns sockets; this crate's only I/O is
//!   the pool table file in the data directory (and, with a memory limit,
//!   `/proc/self/status`);
//! - reads take no lock a writer holds: objects live in a lock-free map of
//!   `Arc<Object>` snapshots, so a get sees a whole version or the previous one;
//! - values are `bytes::Bytes` and are never copied.

mod clock;
mod layout;
mod memory;
mod pool_file;
mod shard;
mod store;

pub use clock::Clock;
pub use layout::{Layout, ShardId};
pub use memory::{memory_in_use, MemoryLimit};
pub use pool_file::{scan_pool_log, PoolLogProblem, PoolLogScan};
pub use shard::Shard;
pub use sluice_log::{Resolver as ValueResolver, ValueRef};
pub use store::{
    owned_if_small, Delivery, DeliveryKind, DeliveryObserver, HistoryRange, Replay, Replicated,
    Store, StoreConfig, StoreStats, OWN_COPY_BELOW,
};
