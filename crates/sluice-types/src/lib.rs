//! Sluice's shared vocabulary.
//!
//! Keys, objects, object pools, shard routing and the typed error every layer
//! speaks. This crate performs no I/O and knows nothing about networks,
//! threads or storage engines: it is the dependency every other crate shares.

pub mod cascade_layout;
pub mod cluster;
pub mod error;
pub mod key;
pub mod limits;
pub mod marks;
pub mod object;
pub mod policy;
pub mod pool;
pub mod retry;
pub mod routing;

pub use error::{Result, SluiceError};

/// The port a node listens on unless told otherwise, and the one a client
/// assumes for an address without a port.
pub const DEFAULT_PORT: u16 = 7420;

/// A random 64-bit number from the operating system's random source
/// (std seeds every `RandomState` from it): client ids, retry jitter.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(wall_us());
    h.finish()
}

/// Microseconds since the Unix epoch (0 if the clock is before it): the
/// time every timestamp in Sluice is in.
pub fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
pub use key::{validate_key, validate_prefix};
pub use limits::Limits;
pub use object::{
    Hop, Object, ObjectMeta, PutResult, ReqId, Trace, EMIT_DEPTH_MAX, TRACE_HOPS_MAX, VERSION_NONE,
};
pub use pool::{PoolMeta, PoolSpec, PoolTable, PoolType, PurgeReport, ShardingPolicy};
pub use routing::{fnv1a64, PoolRouter};
