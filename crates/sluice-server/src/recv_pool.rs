//! Recycled buffers for large incoming frames.
//!
//! A value stays in the buffer it arrived in (the store and the consensus
//! log keep slices of the frame), so a connection cannot reuse its read
//! buffer: every large frame used to land on memory the process had not
//! touched yet, and the kernel's copy from the socket took a page fault
//! every 4 KB of it (`BENCHMARKS.md`, "Page faults per put"). A frame of
//! `LARGE_FRAME` bytes or more is read into a buffer of its own from this
//! pool instead, wrapped so that when the last slice of it is dropped
//! (the key overwritten, the log entry purged) the buffer comes back here
//! with its pages still mapped, for the next large frame. (A large
//! trigger put whose lambda lends memory for it is read there instead:
//! `LargeBuf::Landing`.)

use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;

/// A large frame's own buffer while it is read: a recycled one of the
/// node's, or memory a lambda the frame triggers lent for it (its value
/// then reaches the lambda without a copy; see `sluice_compute::landing`).
pub enum LargeBuf {
    Pooled(Vec<u8>),
    Landing(sluice_compute::landing::Landing),
}

impl LargeBuf {
    pub fn len(&self) -> usize {
        match self {
            LargeBuf::Pooled(b) => b.len(),
            LargeBuf::Landing(l) => l.len(),
        }
    }

    /// Appends `bytes` (the frame's start, read before the buffer was).
    pub fn put_slice(&mut self, bytes: &[u8]) {
        match self {
            LargeBuf::Pooled(b) => b.extend_from_slice(bytes),
            LargeBuf::Landing(l) => bytes::BufMut::put_slice(l, bytes),
        }
    }

    /// Reads from `sock`, never more than `room` bytes (the frame's rest:
    /// the next frame starts in the connection's own buffer).
    pub async fn read_from<S>(&mut self, sock: &mut S, room: usize) -> std::io::Result<usize>
    where
        S: tokio::io::AsyncRead + Unpin,
    {
        use bytes::BufMut;
        use tokio::io::AsyncReadExt;
        match self {
            LargeBuf::Pooled(b) => sock.read_buf(&mut b.limit(room)).await,
            LargeBuf::Landing(l) => sock.read_buf(&mut l.limit(room)).await,
        }
    }
}

/// Frames at least this large are read into a pooled buffer.
pub const LARGE_FRAME: usize = 256 * 1024;
/// Buffer sizes are rounded up to this, so frames of nearly the same size
/// (a 1 MB value with keys of different lengths) share buffers.
const ROUND: usize = 64 * 1024;

/// Free buffers, bounded in total bytes.
pub struct RecvPool {
    free: Mutex<Free>,
    max_free_bytes: usize,
    /// The free buffers' bytes, for the memory limit (they hold no data:
    /// `sluice_store::MemoryLimit::reusable`).
    free_bytes: Arc<std::sync::atomic::AtomicU64>,
}

/// The free buffers and their capacities' sum.
#[derive(Default)]
struct Free {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl RecvPool {
    /// A pool that keeps at most `max_free_bytes` of free buffers, their
    /// total kept in `free_bytes`.
    pub fn new(
        max_free_bytes: usize,
        free_bytes: Arc<std::sync::atomic::AtomicU64>,
    ) -> Arc<RecvPool> {
        Arc::new(RecvPool {
            free: Mutex::default(),
            max_free_bytes,
            free_bytes,
        })
    }

    fn count(&self, free: &Free) {
        self.free_bytes
            .store(free.bytes as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// An empty buffer with room for at least `need` bytes: a free one
    /// that is not more than twice as large, else a new one.
    pub fn take(&self, need: usize) -> Vec<u8> {
        let mut free = self.free.lock();
        let fit = free
            .bufs
            .iter()
            .position(|b| b.capacity() >= need && b.capacity() <= need.saturating_mul(2));
        match fit {
            Some(i) => {
                let b = free.bufs.swap_remove(i);
                free.bytes -= b.capacity();
                self.count(&free);
                b
            }
            None => Vec::with_capacity(need.div_ceil(ROUND) * ROUND),
        }
    }

    /// `buf` (filled) as `Bytes` that give it back to the pool when the
    /// last slice of them is dropped.
    pub fn wrap(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: self.clone(),
        })
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut free = self.free.lock();
        if free.bytes + buf.capacity() <= self.max_free_bytes {
            free.bytes += buf.capacity();
            free.bufs.push(buf);
            self.count(&free);
        }
    }

    /// Free buffers held.
    #[cfg(test)]
    fn free_buffers(&self) -> usize {
        self.free.lock().bufs.len()
    }
}

struct Pooled {
    buf: Vec<u8>,
    pool: Arc<RecvPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_last_slice_is_dropped() {
        let pool = RecvPool::new(8 << 20, Arc::default());
        let mut b = pool.take(300_000);
        let cap = b.capacity();
        assert!(cap >= 300_000 && cap.is_multiple_of(ROUND));
        b.extend_from_slice(&vec![7u8; 300_000]);
        let ptr = b.as_ptr();
        let whole = pool.wrap(b);
        let value = whole.slice(24..);
        drop(whole);
        assert_eq!(pool.free_buffers(), 0, "a slice still holds it");
        assert_eq!(value[0], 7);
        drop(value);
        assert_eq!(pool.free_buffers(), 1);
        // The next frame of about that size gets the same memory, empty.
        let again = pool.take(299_000);
        assert_eq!(again.as_ptr(), ptr);
        assert!(again.is_empty());
        // A much smaller frame does not take a buffer twice its size.
        pool.give_back(again);
        assert_ne!(pool.take(100_000).capacity(), cap);
    }

    #[test]
    fn free_buffers_are_bounded_in_bytes() {
        let pool = RecvPool::new(1 << 20, Arc::default());
        let bufs: Vec<Vec<u8>> = (0..4).map(|_| pool.take(400_000)).collect();
        for b in bufs {
            drop(pool.wrap(b));
        }
        // 448 KiB each: two fit in 1 MiB, the others are freed.
        assert_eq!(pool.free_buffers(), 2);
        // Taking one out makes room for exactly one again.
        let out = pool.take(400_000);
        assert_eq!(pool.free_buffers(), 1);
        drop(pool.wrap(out));
        drop(pool.wrap(pool.take(400_000)));
        drop(pool.wrap(Vec::with_capacity(448 << 10)));
        assert_eq!(pool.free_buffers(), 2);
    }
}
