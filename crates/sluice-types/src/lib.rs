//! Sluice's shared vocabulary.
//!
//! Keys, objects, object pools, shard routing and the typed error every layer
//! speaks. This crate performs no I/O and knows nothing about networks,
//! threads or storage engines: it is the dependency every other crate shares.

pub mod cluster;
pub mod error;
pub mod key;
pub mod limits;
pub mod object;
pub mod pool;
pub mod routing;

pub use error::{Result, SluiceError};
pub use key::validate_key;
pub use limits::Limits;
pub use object::{
    Hop, Object, ObjectMeta, PutResult, ReqId, Trace, EMIT_DEPTH_MAX, TRACE_HOPS_MAX, VERSION_NONE,
};
pub use pool::{PoolMeta, PoolSpec, PoolTable, PoolType, PurgeReport, ShardingPolicy};
pub use routing::{fnv1a64, PoolRouter};
