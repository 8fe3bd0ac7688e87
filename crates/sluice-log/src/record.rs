use bytes::{BufMut, Bytes, BytesMut};

/// What a record says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Put = 1,
    Remove = 2,
    /// A put whose value lives elsewhere (the consensus log of a
    /// replicated shard): the record's value is a [`ValueRef`].
    PutRef = 3,
}

/// Where a value lives outside the history: bytes `offset..offset + len`
/// of segment `segment` of another log (see `History::set_resolver`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueRef {
    pub segment: u64,
    pub offset: u64,
    pub len: u32,
}

impl ValueRef {
    pub const ENCODED: usize = 20;

    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(Self::ENCODED);
        b.put_u64_le(self.segment);
        b.put_u64_le(self.offset);
        b.put_u32_le(self.len);
        b.freeze()
    }

    pub fn decode(b: &[u8]) -> Option<ValueRef> {
        if b.len() != Self::ENCODED {
            return None;
        }
        Some(ValueRef {
            segment: u64::from_le_bytes(b[0..8].try_into().ok()?),
            offset: u64::from_le_bytes(b[8..16].try_into().ok()?),
            len: u32::from_le_bytes(b[16..20].try_into().ok()?),
        })
    }
}

/// One logged write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub kind: RecordKind,
    pub version: u64,
    pub timestamp_us: u64,
    /// The key's previous version (the backpointer), `u64::MAX` for none.
    pub prev_version_by_key: u64,
    pub key: String,
    pub value: Bytes,
}

/// len + crc.
pub const RECORD_HEADER: usize = 8;
const BODY_FIXED: usize = 1 + 8 + 8 + 8 + 2;
/// Keys are bounded so a length field can never ask for more.
pub const KEY_MAX: usize = u16::MAX as usize;

impl Record {
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER + BODY_FIXED + self.key.len() + self.value.len()
    }

    /// Appends everything but the value to `out` (the value follows it in
    /// the file unchanged); the checksum covers the value too. Lets the log
    /// write a value from the very `Bytes` it arrived in.
    pub fn encode_head(&self, out: &mut BytesMut) {
        let body_len = BODY_FIXED + self.key.len() + self.value.len();
        let start = out.len();
        out.put_u32_le(body_len as u32);
        out.put_u32_le(0);
        out.put_u8(self.kind as u8);
        out.put_u64_le(self.version);
        out.put_u64_le(self.timestamp_us);
        out.put_u64_le(self.prev_version_by_key);
        out.put_u16_le(self.key.len() as u16);
        out.put_slice(self.key.as_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&out[start + RECORD_HEADER..]), &self.value);
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    pub fn encode(&self, out: &mut BytesMut) {
        out.reserve(self.encoded_len());
        self.encode_head(out);
        out.put_slice(&self.value);
    }
}

/// Why bytes at an offset are not a record.
#[derive(Debug, PartialEq, Eq)]
pub enum Decode {
    /// Fewer bytes remain than the record needs (a torn write).
    Short,
    /// The checksum or the structure is wrong.
    Bad(String),
}

/// Decodes the record at the start of `buf`; returns it and its length.
/// `value` is a slice of `buf` (no copy).
pub fn decode(buf: &Bytes) -> Result<(Record, usize), Decode> {
    if buf.len() < RECORD_HEADER {
        return Err(Decode::Short);
    }
    let body_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if body_len < BODY_FIXED {
        return Err(Decode::Bad(format!(
            "record length {body_len} is below the minimum {BODY_FIXED}"
        )));
    }
    if buf.len() < RECORD_HEADER + body_len {
        return Err(Decode::Short);
    }
    let body = &buf[RECORD_HEADER..RECORD_HEADER + body_len];
    let actual = crc32c::crc32c(body);
    if actual != crc {
        return Err(Decode::Bad(format!(
            "checksum mismatch (stored {crc:#010x}, computed {actual:#010x})"
        )));
    }
    let kind = match body[0] {
        1 => RecordKind::Put,
        2 => RecordKind::Remove,
        3 => RecordKind::PutRef,
        k => return Err(Decode::Bad(format!("unknown record kind {k}"))),
    };
    let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
    let key_len = u16::from_le_bytes([body[25], body[26]]) as usize;
    if BODY_FIXED + key_len > body_len {
        return Err(Decode::Bad(format!(
            "key length {key_len} runs past the record"
        )));
    }
    let key = std::str::from_utf8(&body[BODY_FIXED..BODY_FIXED + key_len])
        .map_err(|_| Decode::Bad("key is not UTF-8".into()))?
        .to_string();
    let value = buf.slice(RECORD_HEADER + BODY_FIXED + key_len..RECORD_HEADER + body_len);
    Ok((
        Record {
            kind,
            version: u64_at(1),
            timestamp_us: u64_at(9),
            prev_version_by_key: u64_at(17),
            key,
            value,
        },
        RECORD_HEADER + body_len,
    ))
}

/// The sector size a torn write is assumed to respect: a power loss
/// leaves whole sectors written or not, a process killed mid-`write(2)`
/// stops at a page boundary (a multiple of it).
pub const TORN_WRITE_ALIGN: usize = 512;

/// Whether the bytes of `data` from `start`, where a record fails to
/// decode, to the end are what a crash during an append leaves, rather
/// than damage to a record that was written whole (and may have been
/// acknowledged). `record_end` is where that record ends when its declared
/// length fits in `data` (`None`: it runs past the end, so the append
/// never finished: torn).
///
/// A complete record is torn only if nothing but zeros follows it and its
/// own bytes end in zeros from a `TORN_WRITE_ALIGN`-aligned file offset
/// on (`base` is the file offset of `data[0]`): the part of the write that
/// never reached the file of a preallocated or zero-extended segment. A
/// complete record whose last sector holds data yet fails its checksum
/// was damaged after it was written: corruption, never cut silently. (A
/// flipped byte in a record whose last bytes are zeros is the ambiguous
/// case; it is cut like a torn write, and its bytes are kept as evidence
/// by the caller.)
pub fn is_torn_tail(data: &[u8], base: u64, start: usize, record_end: Option<usize>) -> bool {
    let Some(end) = record_end else { return true };
    let end = end.min(data.len());
    if data[end..].iter().any(|&b| b != 0) {
        return false;
    }
    match data[start..end].iter().rposition(|&b| b != 0) {
        None => true,
        Some(z) => {
            let first_zero = base + (start + z + 1) as u64;
            let aligned = first_zero.div_ceil(TORN_WRITE_ALIGN as u64) * TORN_WRITE_ALIGN as u64;
            aligned < base + end as u64
        }
    }
}

#[cfg(test)]
mod torn_tests {
    use super::*;

    #[test]
    fn incomplete_and_zero_tails_are_torn_whole_damaged_records_are_not() {
        let mut d = vec![7u8; 2048];
        // Runs past the end: the append never finished.
        assert!(is_torn_tail(&d, 0, 100, None));
        // All zeros from the record on (a preallocated tail).
        d[100..].fill(0);
        assert!(is_torn_tail(&d, 0, 100, Some(1200)));
        // Data up to 700, zeros from the 1024 boundary on: a write that
        // stopped at a sector boundary.
        d[100..700].fill(9);
        assert!(is_torn_tail(&d, 0, 100, Some(1200)));
        // The record's last sector holds data: written whole, so damaged.
        d[100..1100].fill(9);
        assert!(!is_torn_tail(&d, 0, 100, Some(1100)));
        assert!(!is_torn_tail(&d, 0, 100, Some(1200)));
        // Anything but zeros after the record: not a tail at all.
        let mut e = vec![0u8; 2048];
        e[100..200].fill(1);
        e[1500] = 1;
        assert!(!is_torn_tail(&e, 0, 100, Some(300)));
        // The alignment is of file offsets, not of the slice: 50 bytes of
        // data then zeros up to 300 hold a sector boundary only when the
        // slice starts at file offset 400 (boundary 512), not at 0.
        let mut x = vec![0u8; 300];
        x[..50].fill(9);
        assert!(!is_torn_tail(&x, 0, 0, Some(300)));
        assert!(is_torn_tail(&x, 400, 0, Some(300)));
    }
}
