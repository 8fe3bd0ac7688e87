//! Limits on everything a client can make the server hold.

use serde::{Deserialize, Serialize};

/// Bounds the server enforces and announces at connect.
///
/// Exceeding one is a typed error to the offending client only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Longest key accepted, in bytes.
    pub max_key_bytes: u32,
    /// Largest value accepted, in bytes (default 64 MiB).
    pub max_value_bytes: u32,
    /// Largest frame metadata section (keys, lists), in bytes.
    pub max_meta_bytes: u32,
    /// Requests one connection may have outstanding before new ones are refused.
    pub max_in_flight_per_conn: u32,
    /// Connections the server accepts at once; further ones are told so and closed.
    pub max_connections: u32,
    /// Keys in one multi-get.
    pub max_multi_get_keys: u32,
    /// Watches (subscriptions) one connection may hold.
    pub max_watches_per_conn: u32,
    /// Memory in use (the allocator's bytes in use and shared pages, as
    /// Redis's `used_memory` counts it) past which the node refuses writes
    /// that store a value, with `OutOfMemory`; reads and removes go on.
    /// 0: no limit. Redis's `maxmemory` with `noeviction`: better than the
    /// kernel's OOM killer taking every replica of a shard at once.
    pub max_memory_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 1024,
            max_value_bytes: 64 << 20,
            max_meta_bytes: 4 << 20,
            max_in_flight_per_conn: 4096,
            max_connections: 1024,
            max_multi_get_keys: 4096,
            max_watches_per_conn: 64,
            max_memory_bytes: 0,
        }
    }
}
