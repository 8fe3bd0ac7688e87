//! Where a persistent shard's values lie in its log files (its history
//! refers to them instead of copying them), and reading them back.

use super::*;

/// Values shorter than this are copied into a persistent shard's history
/// rather than referenced (a reference is 20 bytes).
pub const MIN_REF: usize = 64;

/// A counting sink for bincode that notes where each expected value's
/// bytes start (the values come in encoding order; matched by address and
/// length, so a value that appears twice is told apart by order).
pub(super) struct Positions<'a> {
    pub(super) values: &'a [Bytes],
    pub(super) next: usize,
    pub(super) at: u64,
    pub(super) found: Vec<u64>,
}

impl Write for Positions<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        if let Some(v) = self.values.get(self.next) {
            if v.as_ptr() == data.as_ptr() && v.len() == data.len() {
                self.found.push(self.at);
                self.next += 1;
            }
        }
        self.at += data.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads `at` from a keeping log's segment files in `dir` (the live
/// segment or, once purged, the kept one).
pub fn read_value(dir: &Path, at: &sluice_store::ValueRef) -> std::io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let f = match File::open(seg_path(dir, at.segment)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            File::open(kept_path(dir, at.segment))?
        }
        Err(e) => return Err(e),
    };
    let mut buf = vec![0u8; at.len as usize];
    f.read_exact_at(&mut buf, at.offset)?;
    Ok(Bytes::from(buf))
}

impl LogStore {
    /// Where the values of entry `e` of at least `MIN_REF` bytes lie in
    /// this log's files (in encoding order), when `e` is the entry this
    /// log holds at its index.
    pub fn value_refs(&self, e: &Entry) -> Option<Vec<sluice_store::ValueRef>> {
        let values = entry_values(e, MIN_REF);
        if values.is_empty() {
            return Some(Vec::new());
        }
        let loc = {
            let g = self.inner.lock();
            let h = g.index.get(&e.log_id.index)?;
            if h.log_id != e.log_id {
                return None;
            }
            h.loc?
        };
        // bincode writes `Record::Entry(e)` as the variant index (u32, 0)
        // then `e`: counting from 4 needs no copy of the entry.
        let mut p = Positions {
            values: &values,
            next: 0,
            at: 4,
            found: Vec::new(),
        };
        bincode::serialize_into(&mut p, e).ok()?;
        if p.found.len() != values.len() {
            return None;
        }
        Some(
            p.found
                .iter()
                .zip(&values)
                .map(|(pos, v)| sluice_store::ValueRef {
                    segment: loc.seq,
                    offset: loc.offset + 8 + pos,
                    len: v.len() as u32,
                })
                .collect(),
        )
    }
}
