//! Replication for Sluice: every volatile and persistent shard is a Raft
//! group of its member nodes ([raft-rs](https://docs.rs/raft), driven by
//! `raftrs`), and a metadata group of all nodes holds the pool table and
//! shard membership.
//! All groups of a node share two connections per peer: one for small
//! messages, one for large ones (`network::BULK_BYTES`).
//!
//! - [`types`]: the consensus configuration, commands, group ids;
//! - [`log`]: each group's log (memory + an append-only file);
//! - [`chunks`]: encodings that reference large values instead of copying them;
//! - [`sm`]: applying commands to the store, deduplication, snapshots;
//! - [`applied`]: how far a member had applied its log before a restart
//!   (applied again without delivering);
//! - [`network`]: the peer transport, with fault injection;
//! - [`marks`]: optional timestamps of a write's way through a shard (`sluice bench cluster --breakdown`);
//! - [`node`]: [`ClusterNode`], the write and read paths and administration;
//! - [`raftrs`]: the consensus driver, on raft-rs (issue #20): every
//!   replication group (ARCHITECTURE.md, "Consensus library").

pub mod applied;
pub mod chunks;
pub mod log;
pub mod marks;
pub mod network;
pub mod node;
pub mod raftrs;
pub mod rt;
pub mod sm;
pub mod types;

pub use network::PEER_CLIENT_PREFIX;
pub use node::{ClusterNode, ClusterSettings};
pub use types::{group_name, group_of, parse_shard, MetaCommand};
