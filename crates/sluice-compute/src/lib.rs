//! Compute next to the data: user-defined lambdas (UDLs) that run on the
//! node holding the objects that trigger them.
//!
//! A put or trigger put delivered on a node reaches the [`Engine`] (a store
//! `DeliveryObserver`). Its dispatcher matches the key against every
//! registered prefix in a trie ([`trie::PrefixTrie`]) and enqueues one upcall
//! per matching vertex-UDL on a pool of upcall worker threads; the object and
//! the UDL are shared (`Arc`), never copied. A UDL's `emit` forwards its
//! output to the vertex's destinations as puts or trigger puts; on this node
//! that is a direct call into the store (no network, no copy).
//!
//! Architecture invariants:
//! - the dispatcher never blocks a writer: queues are bounded and a full
//!   queue fails a trigger put with `Unavailable` (nothing stored, retry) or,
//!   for a stored put, drops the upcall and counts it;
//! - a panicking or failing UDL is caught, counted and logged with the key
//!   (a few times, then once per interval with a count: `throttle`); it
//!   never kills a worker thread or the node;
//! - replacing data flow graphs swaps an immutable dispatch table: new
//!   deliveries see the new graphs, in-flight upcalls finish under the old;
//! - no UDL lives here: the built-ins are in `sluice-udls`, so this crate
//!   (and anything embedding the engine) does not pull in tract.

pub mod dfg;
pub mod engine;
pub mod landing;
pub mod throttle;
pub mod trie;
pub mod udl;

pub use dfg::{DfgError, DfgFile};
pub use engine::{ApplyReport, Engine, EngineConfig, Membership, Prepared};
pub use udl::{
    Context, Emitter, HopDone, HopSink, Publisher, ReadAt, Reader, Registry, Udl, UdlError,
    UdlFactory, Upcall, Writer,
};
