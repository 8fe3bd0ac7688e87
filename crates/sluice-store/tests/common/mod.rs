//! Helpers shared by the store's integration tests.

use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Bytes that say when they are freed.
struct Owner(Vec<u8>, Arc<AtomicBool>);

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.1.store(true, Ordering::SeqCst);
    }
}

/// A 1 MiB value, and the flag set once its memory is freed.
pub fn watched_value() -> (Bytes, Arc<AtomicBool>) {
    let freed = Arc::new(AtomicBool::new(false));
    (
        Bytes::from_owner(Owner(vec![7; 1 << 20], freed.clone())),
        freed,
    )
}
