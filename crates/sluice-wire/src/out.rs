use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::IoSlice;

/// Default for clients: values at least this large are queued as their
/// own chunk (no copy); smaller ones are copied next to their header so a
/// burst of small requests leaves in one write.
pub const ZERO_COPY_THRESHOLD: usize = 4096;

/// Outgoing bytes as a list of chunks, written with vectored I/O.
pub struct OutQueue {
    chunks: VecDeque<Bytes>,
    cur: BytesMut,
    len: usize,
    copy_below: usize,
}

impl Default for OutQueue {
    fn default() -> Self {
        OutQueue {
            chunks: VecDeque::new(),
            cur: BytesMut::new(),
            len: 0,
            copy_below: ZERO_COPY_THRESHOLD,
        }
    }
}

impl OutQueue {
    pub fn new() -> Self {
        Self::default()
    }

    /// A queue that never copies values: every value goes out as the very
    /// `Bytes` it was stored as (the server's reply path).
    pub fn zero_copy() -> Self {
        OutQueue {
            copy_below: 0,
            ..Self::default()
        }
    }

    /// Buffer for headers and metadata of the frame being written.
    pub fn buf(&mut self) -> &mut BytesMut {
        &mut self.cur
    }

    /// Appends a value: copied when small, queued by reference when large.
    pub fn push_value(&mut self, v: &Bytes) {
        if v.len() < self.copy_below || v.is_empty() {
            self.cur.extend_from_slice(v);
        } else {
            self.seal();
            self.len += v.len();
            self.chunks.push_back(v.clone());
        }
    }

    fn seal(&mut self) {
        if !self.cur.is_empty() {
            let b = self.cur.split().freeze();
            self.len += b.len();
            self.chunks.push_back(b);
        }
    }

    /// Queues `other`'s bytes after these (by reference: no copy).
    pub fn append(&mut self, mut other: OutQueue) {
        other.seal();
        if other.chunks.is_empty() {
            return;
        }
        self.seal();
        self.len += other.len;
        self.chunks.append(&mut other.chunks);
    }

    /// Total queued bytes.
    pub fn len(&mut self) -> usize {
        self.len + self.cur.len()
    }

    pub fn is_empty(&mut self) -> bool {
        self.len() == 0
    }

    /// Fills `dst` with slices of the queued bytes; returns how many.
    pub fn io_slices<'a>(&'a mut self, dst: &mut [IoSlice<'a>]) -> usize {
        self.seal();
        let mut n = 0;
        for (slot, c) in dst.iter_mut().zip(self.chunks.iter()) {
            *slot = IoSlice::new(c);
            n += 1;
        }
        n
    }

    /// Drops `n` bytes that were written.
    pub fn advance(&mut self, mut n: usize) {
        self.len -= n.min(self.len);
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            if n >= front.len() {
                n -= front.len();
                self.chunks.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }

    /// Everything queued as one contiguous buffer (tests, small tools).
    pub fn to_bytes(&mut self) -> Bytes {
        self.seal();
        let mut out = BytesMut::with_capacity(self.len);
        for c in self.chunks.drain(..) {
            out.extend_from_slice(&c);
        }
        self.len = 0;
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_keeps_both_queues_in_order() {
        let mut a = OutQueue::new();
        a.buf().extend_from_slice(b"head");
        a.push_value(&Bytes::from(vec![b'a'; 5000]));
        a.advance(2);
        let mut b = OutQueue::new();
        b.buf().extend_from_slice(b"next");
        b.push_value(&Bytes::from_static(b"small"));
        a.append(b);
        a.append(OutQueue::new());
        assert_eq!(a.len(), 2 + 5000 + 4 + 5);
        let mut want = b"ad".to_vec();
        want.extend(vec![b'a'; 5000]);
        want.extend_from_slice(b"nextsmall");
        assert_eq!(a.to_bytes(), Bytes::from(want));
    }
}
