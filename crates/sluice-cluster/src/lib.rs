//! Replication for Sluice: every volatile and persistent shard is an
//! [openraft](https://docs.rs/openraft) group of its member nodes, and a
//! metadata group of all nodes holds the pool table and shard membership.
//! All groups of a node share two connections per peer: one for small
//! messages, one for large ones (`network::BULK_BYTES`).
//!
//! - [`types`]: the consensus configuration, commands, group ids;
//! - [`log`]: each group's log (memory + an append-only file);
//! - [`chunks`]: encodings that reference large values instead of copying them;
//! - [`sm`]: applying commands to the store, deduplication, snapshots;
//! - [`network`]: the peer transport, with fault injection;
//! - [`marks`]: optional timestamps of a write's way through a shard (`sluice bench cluster --breakdown`);
//! - [`node`]: [`ClusterNode`], the write and read paths and administration;
//! - `raftrs`: the consensus driver, on raft-rs (issue #20): every
//!   replication group unless the layout says `consensus = "openraft"`
//!   (ARCHITECTURE.md, "Consensus library").

// openraft's StorageError (its trait methods' error type) is large; our helpers
// return it too rather than boxing and unboxing at every trait boundary.
#![allow(clippy::result_large_err)]

pub mod chunks;
pub mod log;
pub mod marks;
pub mod network;
pub mod node;
pub mod raftrs;
pub mod rt;
pub mod sm;
pub mod types;

pub use node::{ClusterNode, ClusterSettings};
pub use types::{group_name, group_of, parse_shard, MetaCommand};
