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
//!
//! # Cancellation
//!
//! Every request's future may be dropped (`tokio::time::timeout`,
//! `select!`) without harm to the client: the connection stays usable for
//! the other requests. A request dropped before any of it was written is
//! never sent; one dropped part-way through being written is still sent
//! whole, by a task of the connection, so it may take effect (as one
//! whose reply was lost may): a put you gave up on can still be stored,
//! always with the value you gave it.
//!
//! # Quick start
//!
//! A node (`sluice serve`, or `sluice dev` for a local cluster), a pool,
//! versions, a conditional write, a watch. Every error is a
//! [`SluiceError`] whose variants name what went wrong, with the message
//! the CLI prints.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // An in-process node on a free port (a user runs `sluice serve`).
//! # let dir = tempfile::tempdir()?;
//! # let node = sluice_server::Server::bind(sluice_server::ServerConfig {
//! #     listen: "127.0.0.1:0".parse()?,
//! #     data_dir: dir.path().into(),
//! #     ..Default::default()
//! # })
//! # .await?;
//! # let addr = node.local_addr().to_string();
//! # tokio::spawn(node.run(std::future::pending()));
//! use sluice_client::{Client, NotificationKind, PoolSpec, PoolType, SluiceError};
//!
//! let c = Client::connect(&addr).await?; // `sluice serve`'s is 127.0.0.1:7420
//! c.create_pool(PoolSpec {
//!     pathname: "/frames".into(),
//!     pool_type: Some(PoolType::Persistent), // every version kept, on disk
//!     ..Default::default()
//! })
//! .await?;
//! let mut w = c.watch("/frames/").await?;
//!
//! let v1 = c.put("/frames/cam1", &b"first"[..]).await?;
//! let v2 = c.put("/frames/cam1", &b"second"[..]).await?;
//! assert_eq!(&c.get("/frames/cam1").await?.value[..], b"second");
//! assert_eq!(&c.get_version("/frames/cam1", v1.version).await?.value[..], b"first");
//!
//! // A write that expects a version the key no longer has is refused.
//! match c.put_if_version("/frames/cam1", &b"third"[..], v1.version).await {
//!     Err(SluiceError::VersionConflict { current, .. }) => {
//!         assert_eq!(current, v2.version.to_string())
//!     }
//!     other => panic!("{other:?}"),
//! }
//! // So is a key no pool covers, naming the key.
//! let e = c.put("/elsewhere/x", &b"x"[..]).await.unwrap_err();
//! assert!(matches!(e, SluiceError::NoPool { .. }), "{e}");
//!
//! let n = w.next().await.expect("the watch is open");
//! assert!(n.kind == NotificationKind::Put && n.object.meta.version == v1.version);
//! # Ok(())
//! # }
//! ```
//!
//! [`BlockingClient`] has the same calls for code without a runtime.

#![warn(missing_docs)]

mod blocking;
mod client;
mod cluster;
mod conn;

pub use blocking::{BlockingClient, BlockingWatch};
pub use client::{Client, ClientConfig, Notification, Watch};
pub use cluster::resolve;
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
