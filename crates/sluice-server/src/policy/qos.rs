//! Global QoS (mRPC's small-first policy): while latency-critical requests
//! are being served anywhere on the node, connections carrying bulk
//! requests hold their next bulk request back (bounded), and a bulk
//! connection gives up its worker thread after each turn's worth of bytes,
//! so small requests never queue behind megabytes of someone else's
//! values. Requests are classified by their value size against the
//! policy's `small_bytes`, or by their principal (`priority`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Bulk value bytes a connection executes per turn before it yields.
pub const BULK_TURN_BYTES: usize = 128 * 1024;

/// The longest a bulk request is held back for small ones: bulk traffic
/// slows down under QoS but never stops.
pub const BULK_HOLD_MAX: Duration = Duration::from_micros(500);

/// The node's count of latency-critical requests in progress.
#[derive(Default)]
pub struct Gate {
    small_in_progress: AtomicUsize,
    clear: tokio::sync::Notify,
}

impl Gate {
    /// A small request decoded (call `done` once its reply is written).
    pub fn begin(&self) {
        self.small_in_progress.fetch_add(1, Ordering::AcqRel);
    }

    /// `n` small requests answered.
    pub fn done(&self, n: usize) {
        if n > 0 && self.small_in_progress.fetch_sub(n, Ordering::AcqRel) == n {
            self.clear.notify_waiters();
        }
    }

    /// Small requests in progress beyond `own` (a connection's own).
    pub fn others(&self, own: usize) -> usize {
        self.small_in_progress
            .load(Ordering::Acquire)
            .saturating_sub(own)
    }

    /// Waits (at most `BULK_HOLD_MAX`) until no small request is in
    /// progress, then yields the worker once.
    pub async fn hold_bulk(&self) {
        if self.others(0) > 0 {
            let clear = self.clear.notified();
            if self.others(0) > 0 {
                let _ = tokio::time::timeout(BULK_HOLD_MAX, clear).await;
            }
        }
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bulk_waits_for_small_requests_but_not_for_ever() {
        let g = std::sync::Arc::new(Gate::default());
        g.begin();
        assert_eq!(g.others(0), 1);
        assert_eq!(g.others(1), 0);
        // Released when the small request is done...
        let g2 = g.clone();
        let waiter = tokio::spawn(async move {
            let t = std::time::Instant::now();
            g2.hold_bulk().await;
            t.elapsed()
        });
        tokio::task::yield_now().await;
        g.done(1);
        let waited = waiter.await.unwrap();
        assert!(waited < Duration::from_secs(1), "{waited:?}");
        // ...and after the bound when it never is.
        g.begin();
        let t = std::time::Instant::now();
        g.hold_bulk().await;
        assert!(t.elapsed() >= BULK_HOLD_MAX);
        g.done(1);
        assert_eq!(g.others(0), 0);
    }
}
