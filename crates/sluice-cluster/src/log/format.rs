//! The record format of a consensus log: segment headers, records
//! `len | crc32c | bincode(Record)`, decoding and checking a segment, and
//! the names of its files.

use super::*;

#[derive(Serialize, Deserialize)]
pub(super) enum Record {
    Entry(Entry),
    Vote(Vote),
    Committed(Option<LogId>),
    /// Entries at and after this index were removed (a conflicting suffix).
    Truncate(u64),
    /// Entries up to this log id were purged (covered by a snapshot).
    Purge(LogId),
    /// The end of a sealed segment of a mapped log: what follows is stale
    /// (its file is not cut to length, which would drop pages the next
    /// use of the file needs again).
    Seal,
}

/// Where an entry's record lies: segment, offset of its header, body
/// length.
#[derive(Clone, Copy, Debug)]
pub(super) struct Loc {
    pub(super) seq: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
}

/// The files `<prefix><n>.log` in `dir`, by number.
pub(super) fn numbered(dir: &Path, prefix: &str) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            let seq = n.strip_prefix(prefix)?.strip_suffix(".log")?.parse().ok()?;
            Some((seq, e.path()))
        })
        .collect();
    out.sort_unstable();
    Ok(out)
}

pub(super) fn seg_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("seg-{seq:08}.log"))
}

/// The checksum of a record body, seeded with its segment's number: a
/// stale record left in a recycled segment file never passes as current.
pub(super) fn checksum(seq: u64, body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&seq.to_le_bytes()), body)
}

/// Appends one record, `len | crc32c | bincode`, to `buf` and `parts`:
/// copied into `buf` except `values` (large values it holds), which are
/// referenced. Returns the body length.
pub(super) fn encode_parts(
    rec: &Record,
    values: &[Bytes],
    seq: u64,
    buf: &mut Vec<u8>,
    parts: &mut Vec<Part>,
) -> Result<u32, StorageError> {
    // Header placeholder, then the body.
    let start = buf.len();
    let mut w = ChunkWriter::new(buf, values);
    w.buf.extend_from_slice(&[0u8; 8]);
    bincode::serialize_into(&mut w, rec).map_err(io_err)?;
    let rparts = w.finish();
    let mut crc = crc32c::crc32c(&seq.to_le_bytes());
    let mut len = 0usize;
    for p in &rparts {
        let bytes: &[u8] = match p {
            Part::Own(rg) => &buf[rg.start.max(start + 8)..rg.end],
            Part::Ref(v) => v,
        };
        crc = crc32c::crc32c_append(crc, bytes);
        len += bytes.len();
    }
    buf[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    for p in rparts {
        match (parts.last_mut(), p) {
            // Adjacent copies: one slice.
            (Some(Part::Own(prev)), Part::Own(rg)) if prev.end == rg.start => prev.end = rg.end,
            (_, p) => parts.push(p),
        }
    }
    Ok(len as u32)
}

/// The values a record's encoding references rather than copies (those
/// of `chunks::BY_REFERENCE` bytes or more): the log's write copies them
/// straight from the client's buffer into its mapping or the file.
pub(super) fn record_values(rec: &Record) -> Vec<Bytes> {
    match rec {
        Record::Entry(e) => entry_values(e, BY_REFERENCE),
        _ => Vec::new(),
    }
}

/// Appends one small record (no value referenced) to `buf`.
pub(super) fn encode(rec: &Record, buf: &mut Vec<u8>, seq: u64) -> Result<(), StorageError> {
    encode_parts(rec, &[], seq, buf, &mut Vec::new()).map(|_| ())
}

/// Every segment starts with this header: `SLUICERL | format version
/// u32 | segment number u64 | crc32c of the preceding 20 bytes u32`, so
/// a file of another format (an older or newer Sluice, or not a log at
/// all) is refused by name instead of being misread.
pub const SEGMENT_HEADER: usize = 24;
pub(super) const SEGMENT_MAGIC: &[u8; 8] = b"SLUICERL";
/// The record format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

pub(super) fn segment_header(seq: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c(&h[..20]);
    h[20..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What the start of a segment file holds.
pub(super) enum Header {
    Good,
    /// Shorter than a header, or zeros: a segment whose creation did not
    /// finish.
    Missing,
    Bad(String),
}

pub(super) fn check_header(data: &[u8], seq: u64) -> Header {
    let Some(h) = data.get(..SEGMENT_HEADER) else {
        return Header::Missing;
    };
    if h.iter().all(|&b| b == 0) {
        return Header::Missing;
    }
    if &h[..8] != SEGMENT_MAGIC {
        return Header::Bad(
            "no segment header (a log written by Sluice before format version 1, or not a Sluice consensus log)".into(),
        );
    }
    let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if h != segment_header(seq) && crc32c::crc32c(&h[..20]).to_le_bytes() == h[20..] {
        if version != FORMAT_VERSION {
            return Header::Bad(format!(
                "format version {version}; this build reads version {FORMAT_VERSION} (run the Sluice that wrote it, or restore this member from its peers)"
            ));
        }
        return Header::Bad("the header names another segment number".into());
    }
    if h != segment_header(seq) {
        return Header::Bad("the segment header fails its checksum".into());
    }
    Header::Good
}

/// Decoded records with their locations, and where the good prefix ends
/// (`None`: the segment has no header).
pub(super) type Decoded = (Vec<(Record, Loc)>, Option<usize>);

/// Decodes the records of one segment after its header.
pub(super) fn decode_all(data: &[u8], seq: u64) -> std::io::Result<Decoded> {
    match check_header(data, seq) {
        Header::Good => {
            let (recs, good) = decode_records(data, seq, SEGMENT_HEADER);
            Ok((recs, Some(good)))
        }
        Header::Missing => Ok((Vec::new(), None)),
        Header::Bad(reason) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("consensus log segment {seq}: {reason}"),
        )),
    }
}

/// Decodes records from `data[start..]`; returns them with their
/// locations (offsets into `data`), and where the good prefix ends.
pub(super) fn decode_records(data: &[u8], seq: u64, start: usize) -> (Vec<(Record, Loc)>, usize) {
    let mut out = Vec::new();
    let mut at = start;
    while let Some(body) = checked_body(data, at, seq) {
        let len = body.len();
        let Ok(rec) = bincode::deserialize::<Record>(body) else {
            break;
        };
        out.push((
            rec,
            Loc {
                seq,
                offset: at as u64,
                len: len as u32,
            },
        ));
        at += 8 + len;
    }
    (out, at)
}

/// The body of the record `len | crc32c | body` at `data[at..]`, where
/// it is whole and passes its checksum.
fn checked_body(data: &[u8], at: usize, seq: u64) -> Option<&[u8]> {
    let h = data.get(at..at + 8)?;
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let body = data.get(at + 8..at + 8 + len)?;
    (checksum(seq, body) == crc).then_some(body)
}

/// What follows a segment's last good record.
pub enum Tail {
    /// Nothing (or a sealed mapped segment's stale bytes after its seal).
    Clean,
    /// What a crash leaves: cut at open.
    Cut,
    /// Damage: the log refuses to open.
    Corrupt(String),
}

/// One segment checked: its good records, where they end, what follows.
pub struct Scan {
    pub(super) recs: Vec<(Record, Loc)>,
    pub good: usize,
    pub tail: Tail,
}

impl Scan {
    pub fn records(&self) -> usize {
        self.recs.len()
    }
}

/// Checks a segment (`data`, the whole file) without changing it. Only
/// the newest segment's tail may be cut. A synced log's file is
/// preallocated with zeros and never recycled: what a crash leaves past
/// its last record is an append that did not finish (zeros from a sector
/// boundary on), while a complete record that fails its checksum was
/// written whole and fsync'd, so it may have been acknowledged: damage.
/// An unsynced log lives in RAM or the page cache, where a record cut by
/// a kill mid-copy, or a recycled file's stale bytes, are what follows
/// the last good record.
pub fn scan_segment(
    data: &[u8],
    seq: u64,
    sync: bool,
    last: bool,
    path: &Path,
) -> std::io::Result<Scan> {
    let (recs, good) = decode_all(data, seq).map_err(|e| named(path, e))?;
    let good = match good {
        Some(g) => g,
        // The only segment, created but never written: started afresh
        // (its header is written at open).
        None if last => 0,
        None => {
            return Ok(Scan {
                recs,
                good: 0,
                tail: Tail::Corrupt("a sealed segment has no header".into()),
            })
        }
    };
    // A mapped log's sealed segment ends at its seal record.
    let sealed_here = matches!(recs.last(), Some((Record::Seal, _)));
    let tail = if good == data.len() || (!last && sealed_here) {
        Tail::Clean
    } else if !last {
        Tail::Corrupt("a record written whole fails its checksum".into())
    } else if sync {
        let t = &data[good..];
        let record_end = (t.len() >= 8)
            .then(|| 8 + u32::from_le_bytes([t[0], t[1], t[2], t[3]]) as usize)
            .filter(|&end| end <= t.len());
        if sluice_log::is_torn_tail(t, good as u64, 0, record_end) {
            Tail::Cut
        } else {
            Tail::Corrupt(
                "the last record was written whole and fails its checksum: damage, not a torn write"
                    .into(),
            )
        }
    } else {
        Tail::Cut
    };
    Ok(Scan { recs, good, tail })
}

/// The segment files of the log in `dir` (live and kept), oldest first.
pub fn segment_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = numbered(dir, "seg-")?;
    out.extend(numbered(dir, "kept-")?);
    out.sort();
    Ok(out)
}

/// An error that names the file it is about.
pub(super) fn named(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Saves the non-zero part of a synced log's torn tail next to its
/// segment (`seg-<n>.log.torn-at-<offset>`) before it is cut.
pub(super) fn keep_torn_evidence(seg: &Path, offset: usize, tail: &[u8]) -> std::io::Result<()> {
    let Some(last) = tail.iter().rposition(|&b| b != 0) else {
        return Ok(());
    };
    let mut name = seg.as_os_str().to_os_string();
    name.push(format!(".torn-at-{offset}"));
    let path = PathBuf::from(name);
    std::fs::write(&path, &tail[..=last])?;
    File::open(&path)?.sync_all()?;
    tracing::warn!(file = %seg.display(), offset, evidence = %path.display(), "consensus log: cut a torn append");
    Ok(())
}

/// An entry's record as read back: its values borrowed from the buffer
/// it was read into (`Record::Entry` is the first variant, and the only
/// one an entry's location names).
#[derive(Deserialize)]
enum EntryRecordRef<'a> {
    Entry(#[serde(borrow)] crate::network::borrowed::EntryRef<'a>),
}

/// Reads an entry back from its segment, checking its checksum. One copy
/// of the record (into one buffer) and none of its values: they are
/// slices of that buffer, as a follower's are of the frame they came in.
/// A leader sends a follower behind entries read back this way, so each
/// must cost no more than the append it was.
pub(super) fn read_entry(dir: &Path, loc: Loc) -> Result<Entry, StorageError> {
    use std::os::unix::fs::FileExt;
    let path = seg_path(dir, loc.seq);
    let read_err = |e: String| -> StorageError {
        std::io::Error::other(format!(
            "reading the consensus log {} at offset {}: {e}",
            path.display(),
            loc.offset
        ))
    };
    let f = File::open(&path).map_err(|e| read_err(e.to_string()))?;
    let mut buf = vec![0u8; 8 + loc.len as usize];
    f.read_exact_at(&mut buf, loc.offset)
        .map_err(|e| read_err(e.to_string()))?;
    if checked_body(&buf, 0, loc.seq).map(<[u8]>::len) != Some(loc.len as usize) {
        return Err(read_err("not the entry recorded there".into()));
    }
    let body = Bytes::from(buf).slice(8..);
    match crate::network::decode_peer::<EntryRecordRef<'_>>(&body) {
        Ok(EntryRecordRef::Entry(e)) => Ok(e.into_entry(&body)),
        Err(e) => Err(read_err(format!("not the entry recorded there: {e}"))),
    }
}

/// Where a purged segment of a keeping log goes.
pub(super) fn kept_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("kept-{seq:08}.log"))
}
