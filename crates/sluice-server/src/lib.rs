//! The Sluice node server.
//!
//! Accepts TCP connections (TLS over them with `[tls]`), speaks the
//! `sluice-wire` protocol, serves Prometheus metrics with `[metrics]`,
//! enforces the policies of the metadata service (principals, access
//! rules, rate limits, QoS: `policy`), and executes requests against a
//! `sluice-store::Store`. Architecture invariants:
//! - one task per connection reads, executes and writes: a request's reply
//!   is written by the task that decoded it, with no hop between tasks on
//!   the data path (the store's operations are non-blocking);
//! - every per-connection resource is bounded (read buffer by the frame
//!   limits, pipelined requests by `max_in_flight_per_conn`, watch queues by
//!   `WATCH_QUEUE_LEN`, listings kept for their next pages by
//!   `listing::OPEN_MAX` and, all connections' together, by the node's
//!   `listing::Budget`), and breaking a bound costs only that connection;
//! - nothing a client sends can panic the server.

mod config;
mod conn;
pub mod fds;
pub mod fsck;
mod listing;
mod metrics;
pub mod otel;
pub mod policy;
mod recv_pool;
mod server;
mod stats;
mod watch;

pub use config::{
    parse_listen, ComputeConfig, MetricsConfig, PersistentConfig, PolicyConfig, ServerConfig,
    Timeouts, DEFAULT_PORT,
};
pub use server::{Server, ServerError};
pub use sluice_cluster::ClusterNode;
pub use sluice_compute::{Engine, Registry};
pub use watch::WATCH_QUEUE_LEN;
