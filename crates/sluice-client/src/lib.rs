//! The Sluice client SDK.
//!
//! [`Client`] is async (tokio); [`BlockingClient`] wraps it for synchronous
//! code. A client routes every key itself: it caches the pool table, finds
//! the key's pool (longest path prefix) and shard (pinned location, else the
//! hash of the affinity key), and sends the request with that shard, so a
//! correctly routed request never takes a proxy hop. A stale cache is caught
//! by the server (`WrongShard`, `NoPool`), refreshed and retried once.
//!
//! Requests are pipelined over a small pool of connections (TLS when
//! `ClientConfig::tls` is set); replies may arrive in any order and are
//! matched by request id.

mod blocking;
mod client;
mod cluster;
mod conn;

pub use blocking::{BlockingClient, BlockingWatch};
pub use client::{Client, ClientConfig, Notification, Watch};
/// One pipelined connection to one node (what `Client` pools; nodes use it
/// to talk to each other).
pub use conn::{Conn, MAX_QUEUED_BYTES};
/// The hash that places a key on a shard of its pool (of its affinity key,
/// where the pool has an affinity regex): shard = hash % shards.
pub use sluice_types::fnv1a64;
pub use sluice_types::pool::Retention;
pub use sluice_types::wall_us;
pub use sluice_types::{
    Object, ObjectMeta, PoolMeta, PoolSpec, PoolType, PutResult, SluiceError, VERSION_NONE,
};
pub use sluice_wire::{DeliveryKindWire as NotificationKind, ServerInfo, WatchFrom};
