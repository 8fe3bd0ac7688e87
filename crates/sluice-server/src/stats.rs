//! Counters shared by every connection of a node (`sluice stats`).

use std::sync::atomic::AtomicU64;

/// Counters shared by every connection.
#[derive(Default)]
pub struct ServerStats {
    pub connections_accepted: AtomicU64,
    pub connections_rejected: AtomicU64,
    pub connections_open: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub requests: AtomicU64,
    /// Connections dropped in (or timed out during) their TLS handshake.
    pub tls_handshake_failures: AtomicU64,
}
