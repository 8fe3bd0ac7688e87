//! Memory a lambda lends for a large value to arrive in.
//!
//! A lambda that runs out of process (a Python worker) reads an upcall's
//! value from memory it shares with the node. Copying the value there
//! costs a pass over its bytes on every call. Instead, when a large
//! trigger put for such a lambda's vertex starts to arrive, the lambda may
//! lend a buffer in that shared memory (`Udl::landing`), and the node reads
//! the frame from the socket straight into it: the value is then written
//! once, by the kernel, and the lambda hands the worker an offset.
//!
//! A `Landing` is the lent buffer while it fills (it is a `BufMut`), and
//! `into_bytes` makes it the frame's `Bytes`, whose slices (the value) live
//! in the lender's memory. The lender learns when the buffer is free again
//! through the release it gave: when the `Landing` is dropped unfilled (the
//! connection died mid-frame) or the last slice of its `Bytes` is.

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes};
use std::ptr::NonNull;

/// Gives a landing buffer back to its lender.
type Release = Box<dyn FnOnce() + Send + Sync>;

/// A buffer lent by a lambda, being filled with one frame.
pub struct Landing {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
    release: Option<Release>,
}

// SAFETY: a `Landing` is the only user of its `cap` bytes (the lender
// hands each range out once until `release` runs), and the lender keeps
// the memory mapped until then; moving it between threads moves that
// exclusive use along.
unsafe impl Send for Landing {}
unsafe impl Sync for Landing {}

impl Landing {
    /// A buffer of `cap` bytes at `ptr`, handed back by `release`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + cap` must stay valid for reads and writes, and be used
    /// by nothing else, until `release` is called (the lender keeps its
    /// mapping alive until then, e.g. by an `Arc` the closure holds).
    pub unsafe fn new(
        ptr: NonNull<u8>,
        cap: usize,
        release: impl FnOnce() + Send + Sync + 'static,
    ) -> Landing {
        Landing {
            ptr,
            cap,
            len: 0,
            release: Some(Box::new(release)),
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// What was written, as `Bytes` over the lent memory (no copy); the
    /// buffer goes back to the lender when the last slice is dropped.
    pub fn into_bytes(mut self) -> Bytes {
        let landed = Landed {
            ptr: self.ptr,
            len: self.len,
            release: self.release.take(),
        };
        Bytes::from_owner(landed)
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r();
        }
    }
}

// SAFETY: `chunk_mut` is the unwritten tail of the lent buffer, which this
// `Landing` alone may write (see `new`); `advance_mut` only moves `len`
// over bytes the caller has initialised, and never past `cap`.
unsafe impl BufMut for Landing {
    fn remaining_mut(&self) -> usize {
        self.cap - self.len
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        assert!(
            cnt <= self.cap - self.len,
            "advance_mut past a landing buffer's end"
        );
        self.len += cnt;
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        // SAFETY: `len <= cap`, and the range is this buffer's (see above).
        unsafe {
            UninitSlice::from_raw_parts_mut(self.ptr.as_ptr().add(self.len), self.cap - self.len)
        }
    }
}

/// The filled buffer, owning it until the last `Bytes` slice is dropped.
struct Landed {
    ptr: NonNull<u8>,
    len: usize,
    release: Option<Release>,
}

// SAFETY: after filling, the bytes are only read (through `Bytes`), and
// stay valid until `release` runs in `drop`.
unsafe impl Send for Landed {}
unsafe impl Sync for Landed {}

impl AsRef<[u8]> for Landed {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written, and the memory is
        // valid until `release` (see `Landing::new`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Landed {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn lent(mem: &mut [u8], released: &Arc<AtomicUsize>) -> Landing {
        let r = released.clone();
        // SAFETY: the test's buffer outlives the landing and its bytes.
        unsafe {
            Landing::new(
                NonNull::new(mem.as_mut_ptr()).unwrap(),
                mem.len(),
                move || {
                    r.fetch_add(1, Ordering::SeqCst);
                },
            )
        }
    }

    #[test]
    fn bytes_written_are_read_in_place_and_released_with_the_last_slice() {
        let mut mem = vec![0u8; 64];
        let base = mem.as_ptr();
        let released = Arc::new(AtomicUsize::new(0));
        let mut l = lent(&mut mem, &released);
        l.put_slice(b"header");
        l.put_slice(b"value");
        assert_eq!((l.len(), l.remaining_mut()), (11, 53));
        let whole = l.into_bytes();
        let value = whole.slice(6..);
        assert_eq!(whole.as_ptr(), base, "read where it was written");
        drop(whole);
        assert_eq!(released.load(Ordering::SeqCst), 0, "a slice still holds it");
        assert_eq!(&value[..], b"value");
        drop(value);
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_unfilled_landing_is_released_once_when_dropped() {
        let mut mem = vec![0u8; 16];
        let released = Arc::new(AtomicUsize::new(0));
        let mut l = lent(&mut mem, &released);
        l.put_slice(b"part");
        drop(l);
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }

    #[test]
    #[should_panic(expected = "past a landing buffer's end")]
    fn it_never_counts_bytes_past_its_end() {
        let mut mem = vec![0u8; 4];
        let released = Arc::new(AtomicUsize::new(0));
        let mut l = lent(&mut mem, &released);
        l.put_slice(b"123");
        // SAFETY: the call panics before `len` passes the buffer's end.
        unsafe { l.advance_mut(2) };
    }
}
