//! Encoding consensus messages and log records without copying large
//! values: bincode writes through [`ChunkWriter`], which copies the small
//! parts into one buffer but, when bincode writes exactly one of the
//! values it was told about (same address, same length), records a
//! reference to that value's `Bytes` instead. The parts, in order, are the
//! same bytes `bincode::serialize` would give; they go out with vectored
//! writes (a socket, a segment file).

use bytes::Bytes;
use std::io::IoSlice;
use std::ops::Range;

/// Values at least this large are referenced, not copied, in consensus
/// messages and log records: the size from which the peer connection's
/// queue sends a value as a part of its own
/// (`sluice_wire::ZERO_COPY_THRESHOLD`). A smaller one is copied once
/// into the encoding; a larger one would otherwise be copied into each
/// follower's message (a leader sends each entry to every follower) and
/// into a log record's buffer before the log's own copy into its mapping.
pub const BY_REFERENCE: usize = sluice_wire::ZERO_COPY_THRESHOLD;

/// Values at least this large are referenced in a snapshot file's
/// encoding: a snapshot holds every object of a shard, and each
/// referenced value is a part (an iovec) of its own.
pub const SNAPSHOT_BY_REFERENCE: usize = 16 * 1024;

/// One piece of an encoding.
#[derive(Debug)]
pub enum Part {
    /// A range of the writer's buffer.
    Own(Range<usize>),
    /// A value, by reference.
    Ref(Bytes),
}

/// A `std::io::Write` sink for bincode (see the module docs).
pub struct ChunkWriter<'a> {
    values: &'a [Bytes],
    pub buf: &'a mut Vec<u8>,
    pub parts: Vec<Part>,
    mark: usize,
    /// The shortest of `values`: shorter writes are copied unlooked.
    min: usize,
    /// The value after the last one referenced: values usually come in
    /// the order given, so that one is tried first (a snapshot of a
    /// shard references every object's value).
    next: usize,
}

impl<'a> ChunkWriter<'a> {
    /// Appends to `buf` (which may hold earlier parts already).
    pub fn new(buf: &'a mut Vec<u8>, values: &'a [Bytes]) -> Self {
        let mark = buf.len();
        ChunkWriter {
            values,
            buf,
            parts: Vec::new(),
            mark,
            min: values
                .iter()
                .map(Bytes::len)
                .min()
                .unwrap_or(usize::MAX)
                .max(1),
            next: 0,
        }
    }

    /// Seals the bytes copied since the last reference as a part.
    fn seal(&mut self) {
        if self.buf.len() > self.mark {
            self.parts.push(Part::Own(self.mark..self.buf.len()));
            self.mark = self.buf.len();
        }
    }

    /// Everything written so far, as parts.
    pub fn finish(mut self) -> Vec<Part> {
        self.seal();
        self.parts
    }
}

impl std::io::Write for ChunkWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        if data.len() >= self.min {
            let same = |v: &Bytes| v.as_ptr() == data.as_ptr() && v.len() == data.len();
            let at = match self.values.get(self.next) {
                Some(v) if same(v) => Some(self.next),
                _ => self.values.iter().position(same),
            };
            if let Some(i) = at {
                self.next = i + 1;
                self.seal();
                self.parts.push(Part::Ref(self.values[i].clone()));
                return Ok(());
            }
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Encodes `msg` with bincode, `values` (those it holds that are to be
/// referenced) by reference: the buffer of copied bytes, allocated once
/// at its final size (bincode's `serialized_size` adds lengths, copying
/// nothing; a growing buffer would copy what it holds at every doubling,
/// into fresh pages), and the parts.
pub fn encode_sized<T: serde::Serialize>(
    msg: &T,
    values: &[Bytes],
) -> bincode::Result<(Vec<u8>, Vec<Part>)> {
    let referenced: usize = values.iter().map(Bytes::len).sum();
    let size = bincode::serialized_size(msg)? as usize;
    let mut buf = Vec::with_capacity(size.saturating_sub(referenced));
    let mut w = ChunkWriter::new(&mut buf, values);
    bincode::serialize_into(&mut w, msg)?;
    let parts = w.finish();
    Ok((buf, parts))
}

/// The slices of `parts` (ranges of `buf`).
pub fn io_slices<'a>(buf: &'a [u8], parts: &'a [Part]) -> Vec<IoSlice<'a>> {
    parts
        .iter()
        .map(|p| match p {
            Part::Own(r) => IoSlice::new(&buf[r.clone()]),
            Part::Ref(b) => IoSlice::new(b),
        })
        .collect()
}

/// The parts as `Bytes` (the buffer becomes one shared allocation).
pub fn into_bytes(buf: Vec<u8>, parts: Vec<Part>) -> Vec<Bytes> {
    let buf = Bytes::from(buf);
    parts
        .into_iter()
        .map(|p| match p {
            Part::Own(r) => buf.slice(r),
            Part::Ref(b) => b,
        })
        .collect()
}

/// Writes every slice, however the writer splits them.
pub fn write_all_vectored(
    w: &mut impl std::io::Write,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The values of a command's writes (one, or a batch's), in encoding
/// order.
fn values_of(c: &crate::types::Command) -> impl Iterator<Item = &Bytes> {
    use crate::types::Command;
    let (one, batch) = match c {
        Command::Write { value, .. } => (value.as_ref(), &[][..]),
        other => (None, other.batched()),
    };
    one.into_iter()
        .chain(batch.iter().filter_map(|w| w.value.as_ref()))
}

/// The values of a command's writes of at least `min` bytes, in encoding
/// order, appended to `out`.
pub fn command_values(c: &crate::types::Command, min: usize, out: &mut Vec<Bytes>) {
    out.extend(values_of(c).filter(|v| v.len() >= min).cloned());
}

/// The bytes of a command's values (what bounds a consensus message).
pub fn value_bytes(c: &crate::types::Command) -> u64 {
    values_of(c).map(|v| v.len() as u64).sum()
}

/// The values of an entry's writes of at least `min` bytes, in encoding
/// order.
pub fn entry_values(e: &crate::types::Entry, min: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    if let crate::types::EntryPayload::Normal(c) = &e.payload {
        command_values(c, min, &mut out);
    }
    out
}

/// The values of `entries` a consensus message references
/// ([`BY_REFERENCE`] bytes or more), in order (what [`ChunkWriter`] looks for; a
/// replication batch is bounded by bytes, so the list is short).
pub fn large_values<'e>(entries: impl IntoIterator<Item = &'e crate::types::Entry>) -> Vec<Bytes> {
    entries
        .into_iter()
        .flat_map(|e| entry_values(e, BY_REFERENCE))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::types::{Command, Entry, EntryPayload};
    use crate::types::{CommittedLeaderId, LogId};

    /// A put of a `size`-byte value at log index `i` (term 1, node 1).
    pub(crate) fn put(i: u64, size: usize) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
            payload: EntryPayload::Normal(Command::Write {
                key: format!("/vol/{i}"),
                value: Some(Bytes::from(vec![i as u8; size])),
                expected: None,
                timestamp_us: i,
                req_id: None,
                trace: None,
            }),
        }
    }

    #[test]
    fn parts_are_the_bincode_bytes_and_large_values_are_not_copied() {
        let entries = vec![put(1, 100), put(2, 1 << 20), put(3, 10), put(4, 64 << 10)];
        let values = large_values(&entries);
        assert_eq!(values.len(), 2);
        let mut buf = Vec::new();
        let mut w = ChunkWriter::new(&mut buf, &values);
        bincode::serialize_into(&mut w, &entries).unwrap();
        let parts = w.finish();
        let refs: Vec<&Bytes> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Ref(b) => Some(b),
                Part::Own(_) => None,
            })
            .collect();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0].as_ptr(), values[0].as_ptr(), "the same allocation");
        assert!(buf.len() < 4096, "only the small parts were copied");
        let joined: Vec<u8> = into_bytes(buf, parts).concat();
        assert_eq!(joined, bincode::serialize(&entries).unwrap());
    }

    #[test]
    fn values_are_found_in_any_order() {
        let entries: Vec<Entry> = (1..=50).map(|i| put(i, 20_000)).collect();
        let mut values = large_values(&entries);
        values.swap(3, 40);
        let mut buf = Vec::new();
        let mut w = ChunkWriter::new(&mut buf, &values);
        bincode::serialize_into(&mut w, &entries).unwrap();
        let parts = w.finish();
        let refs = parts.iter().filter(|p| matches!(p, Part::Ref(_))).count();
        assert_eq!(refs, 50, "every value referenced, in order or not");
        let joined: Vec<u8> = into_bytes(buf, parts).concat();
        assert_eq!(joined, bincode::serialize(&entries).unwrap());
    }

    #[test]
    fn vectored_writes_survive_short_writes() {
        struct Dribble(Vec<u8>);
        impl std::io::Write for Dribble {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let n = b.len().min(3);
                self.0.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (a, b) = (b"hello ".to_vec(), b"world".to_vec());
        let mut sl = [IoSlice::new(&a), IoSlice::new(&b)];
        let mut d = Dribble(Vec::new());
        write_all_vectored(&mut d, &mut sl).unwrap();
        assert_eq!(d.0, b"hello world");
    }
}
