//! Tests of the consensus log.

use super::disk::MAP_BYTES;
use super::*;
use crate::types::CommittedLeaderId;
use crate::types::{Command, EntryPayload};

fn lid(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn entry(term: u64, index: u64, size: usize) -> Entry {
    Entry {
        log_id: lid(term, index),
        payload: EntryPayload::Normal(Command::Write {
            key: format!("/vol/{index}"),
            value: Some(bytes::Bytes::from(vec![index as u8; size])),
            expected: None,
            timestamp_us: index,
            req_id: None,
            trace: None,
        }),
    }
}

/// A record's 10 KB value is referenced by its encoding, not copied into
/// the record's buffer before the log copies the buffer into its mapping
/// (16 KB was the limit before); a small one is copied; the parts are the
/// record's bytes either way.
#[test]
fn a_records_values_from_4_kb_are_referenced_not_copied() {
    for (size, referenced) in [(10 * 1024, true), (4096, true), (4095, false), (100, false)] {
        let rec = Record::Entry(entry(1, 1, size));
        let values = record_values(&rec);
        let (mut buf, mut parts) = (Vec::new(), Vec::new());
        encode_parts(&rec, &values, 1, &mut buf, &mut parts).unwrap();
        let Record::Entry(Entry {
            payload: EntryPayload::Normal(Command::Write { value: Some(v), .. }),
            ..
        }) = &rec
        else {
            unreachable!()
        };
        let by_ref = parts
            .iter()
            .any(|p| matches!(p, Part::Ref(b) if b.as_ptr() == v.as_ptr()));
        assert_eq!(by_ref, referenced, "{size} bytes");
        assert_eq!(buf.len() < size, referenced, "{size} bytes: copied or not");
        let mut whole = Vec::new();
        encode(&rec, &mut whole, 1).unwrap();
        let joined: Vec<u8> = io_slices(&buf, &parts)
            .iter()
            .flat_map(|s| s.to_vec())
            .collect();
        assert_eq!(joined, whole, "{size} bytes: the same record");
    }
}

/// Appends in batches of 4, so segments roll.
fn append(l: &mut Inner, es: Vec<Entry>) {
    let mut es = es.into_iter().peekable();
    while es.peek().is_some() {
        let recs: Vec<Record> = es.by_ref().take(4).map(Record::Entry).collect();
        let locs = l.persist(&recs).unwrap();
        for (r, loc) in recs.into_iter().zip(locs) {
            l.apply(r, Some(loc));
        }
    }
}

fn reopen(dir: &Path) -> Inner {
    let s = LogStore::open(dir, false).unwrap();
    Arc::try_unwrap(s.inner).ok().unwrap().into_inner()
}

/// A member that installed a leader's snapshot (up to 60) and then
/// received entries after it holds a gap (41 to 60 never arrived).
/// Purging what the saved snapshot covers, as the state machine does at
/// open, drops the gap too: the log is contiguous again, on disk as well.
#[test]
fn a_purge_to_the_saved_snapshot_closes_a_gap_before_it() {
    let d = tempfile::tempdir().unwrap();
    let s = LogStore::open(d.path(), false).unwrap();
    append(
        &mut s.inner.lock(),
        (1..=40).map(|i| entry(1, i, 10)).collect(),
    );
    s.purge_covered(lid(1, 30)).unwrap();
    append(
        &mut s.inner.lock(),
        (61..=70).map(|i| entry(2, i, 10)).collect(),
    );
    drop(s);
    let s = LogStore::open(d.path(), false).unwrap();
    assert_eq!(s.inner.lock().last_purged, Some(lid(1, 30)));
    s.purge_covered(lid(2, 60)).unwrap();
    // Purging to an older point changes nothing.
    s.purge_covered(lid(1, 30)).unwrap();
    let g = s.inner.lock();
    assert_eq!(g.last_purged, Some(lid(2, 60)));
    assert_eq!(
        g.index.keys().copied().collect::<Vec<_>>(),
        (61..=70).collect::<Vec<_>>()
    );
    drop(g);
    drop(s);
    let g = reopen(d.path());
    assert_eq!(g.last_purged, Some(lid(2, 60)), "on disk too");
    assert_eq!(g.index.keys().next(), Some(&61));
}

#[test]
fn vote_entries_truncation_and_purge_survive_reopen_across_segments() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = LogStore::open(d.path(), false).unwrap();
        let mut g = s.inner.lock();
        g.record(Record::Vote(Vote::new(3, 1))).unwrap();
        // 1 MiB values: several 32 MiB segments.
        append(&mut g, (1..=80).map(|i| entry(1, i, 1 << 20)).collect());
        g.record(Record::Truncate(71)).unwrap();
        append(&mut g, (71..=75).map(|i| entry(2, i, 10)).collect());
        g.record(Record::Purge(lid(1, 64))).unwrap();
        g.drop_purged_segments();
    }
    let segs = std::fs::read_dir(d.path()).unwrap().count();
    let g = reopen(d.path());
    assert_eq!(g.vote, Some(Vote::new(3, 1)));
    assert_eq!(g.last_purged, Some(lid(1, 64)));
    assert_eq!(g.index.keys().next(), Some(&65));
    assert_eq!(g.index.keys().next_back(), Some(&75));
    assert_eq!(
        g.index[&72].log_id,
        lid(2, 72),
        "the truncated suffix was replaced"
    );
    assert_eq!(g.index[&70].log_id, lid(1, 70));
    assert_eq!(g.entry(70).unwrap().unwrap().log_id, lid(1, 70));
    assert!(segs < 4, "purged segments were deleted ({segs} left)");
}

#[test]
fn a_synced_log_survives_reopen_across_preallocated_segments_and_an_unfinished_roll() {
    let d = tempfile::tempdir().unwrap();
    let last_seq = {
        let s = LogStore::open(d.path(), true).unwrap();
        let len = std::fs::metadata(seg_path(d.path(), 1)).unwrap().len();
        assert!(
            len >= SEGMENT_BYTES,
            "the first segment is preallocated ({len} bytes)"
        );
        let mut g = s.inner.lock();
        // Through the writer thread: each call returns once durable.
        g.record(Record::Vote(Vote::new(3, 1))).unwrap();
        append(&mut g, (1..=80).map(|i| entry(1, i, 1 << 20)).collect());
        g.record(Record::Truncate(71)).unwrap();
        append(&mut g, (71..=75).map(|i| entry(2, i, 10)).collect());
        let seq = g.disk.as_ref().unwrap().seq;
        assert!(seq >= 3, "segments rolled ({seq})");
        seq
    };
    // A crash in the middle of a roll: the next segment exists but
    // holds no record yet (zeros of a preallocated file).
    let next = seg_path(d.path(), last_seq + 1);
    std::fs::write(&next, vec![0u8; 4096]).unwrap();
    let g = reopen(d.path());
    assert!(!next.exists(), "the unfinished segment was removed");
    assert_eq!(g.vote, Some(Vote::new(3, 1)));
    assert_eq!(g.index.keys().next_back(), Some(&75));
    assert_eq!(
        g.index[&72].log_id,
        lid(2, 72),
        "the truncated suffix was replaced"
    );
    assert_eq!(g.entry(3).unwrap().unwrap().log_id, lid(1, 3));
    assert_eq!(g.entry(70).unwrap().unwrap().log_id, lid(1, 70));
}

/// Issue #14: in a synced (fsync'd, preallocated) log a flipped byte
/// in the last complete record is damage to an acknowledged entry:
/// the open refuses, naming file and offset, and cuts nothing; an
/// append whose last sectors never landed (zeros) is cut, its bytes
/// kept next to the segment.
#[test]
fn a_synced_log_refuses_a_damaged_last_record_and_cuts_a_torn_one() {
    let d = tempfile::tempdir().unwrap();
    let last = {
        let s = LogStore::open(d.path(), true).unwrap();
        let mut g = s.inner.lock();
        append(&mut g, (1..=3).map(|i| entry(1, i, 3000)).collect());
        g.index[&3].loc.unwrap()
    };
    let seg = seg_path(d.path(), 1);
    let pristine = std::fs::read(&seg).unwrap();
    let end = (last.offset + 8 + u64::from(last.len)) as usize;
    assert!(
        pristine[end..].iter().all(|&b| b == 0),
        "preallocated zeros"
    );
    let mut damaged = pristine.clone();
    damaged[end - 10] ^= 0x01;
    std::fs::write(&seg, &damaged).unwrap();
    let e = LogStore::open(d.path(), true).err().unwrap().to_string();
    assert!(e.contains("seg-00000001.log"), "{e}");
    assert!(e.contains(&format!("offset {}", last.offset)), "{e}");
    assert_eq!(std::fs::read(&seg).unwrap(), damaged, "nothing was cut");
    // The same record with everything after its first sector boundary
    // still zero: an append that never finished.
    let mut torn = pristine.clone();
    let boundary = (last.offset as usize / 512 + 1) * 512;
    torn[boundary..end].fill(0);
    std::fs::write(&seg, &torn).unwrap();
    let g = Arc::try_unwrap(LogStore::open(d.path(), true).unwrap().inner)
        .ok()
        .unwrap()
        .into_inner();
    assert_eq!(g.index.keys().next_back(), Some(&2), "entry 3 was cut");
    let evidence = std::fs::read(format!("{}.torn-at-{}", seg.display(), last.offset)).unwrap();
    assert_eq!(evidence, torn[last.offset as usize..boundary]);
}

/// Issue #14: after a failed fsync nothing may be reported durable,
/// not even once fsync works again (the kernel may have dropped the
/// dirty pages): the writer fails every later write with the first
/// error until the log is reopened.
#[test]
fn after_a_failed_fsync_a_synced_log_acknowledges_nothing_until_reopened() {
    let d = tempfile::tempdir().unwrap();
    let faults = Arc::new(std::sync::Mutex::new(sluice_log::Faults::default()));
    let opts = LogOptions {
        sync: true,
        faults: Some(faults.clone()),
        ..LogOptions::default()
    };
    let s = LogStore::open_with(d.path(), opts.clone()).unwrap();
    let mut g = s.inner.lock();
    append(&mut g, vec![entry(1, 1, 100)]);
    g.record(Record::Vote(Vote::new(2, 1))).unwrap();
    faults.lock().unwrap().fail_sync = true;
    let e = g.record(Record::Vote(Vote::new(3, 1))).unwrap_err();
    assert!(e.to_string().contains("fsync"), "{e}");
    faults.lock().unwrap().fail_sync = false;
    let e = g.record(Record::Vote(Vote::new(4, 1))).unwrap_err();
    assert!(e.to_string().contains("stopped accepting writes"), "{e}");
    let recs = vec![Record::Entry(entry(1, 2, 100))];
    let e = g.persist(&recs).err().unwrap();
    assert!(e.to_string().contains("stopped accepting writes"), "{e}");
    drop(g);
    drop(s);
    // Reopened (a restart): the files are checked again and writes go on.
    let s = LogStore::open_with(d.path(), opts).unwrap();
    let mut g = s.inner.lock();
    assert_eq!(g.index.keys().next_back(), Some(&1));
    g.record(Record::Vote(Vote::new(5, 1))).unwrap();
}

/// A full disk is an error, and stops the log the same way.
#[test]
fn a_full_disk_fails_the_append_and_stops_the_synced_log() {
    let d = tempfile::tempdir().unwrap();
    let faults = Arc::new(std::sync::Mutex::new(sluice_log::Faults {
        space_left: Some(1000),
        ..Default::default()
    }));
    let s = LogStore::open_with(
        d.path(),
        LogOptions {
            sync: true,
            faults: Some(faults),
            ..LogOptions::default()
        },
    )
    .unwrap();
    let mut g = s.inner.lock();
    let recs = vec![Record::Entry(entry(1, 1, 4000))];
    let e = g.persist(&recs).err().unwrap();
    assert!(e.to_string().contains("No space left"), "{e}");
    let e = g.record(Record::Vote(Vote::new(2, 1))).unwrap_err();
    assert!(e.to_string().contains("stopped accepting writes"), "{e}");
}

#[test]
fn a_keeping_log_sets_purged_segments_aside_and_reclaims_only_unreferenced_ones() {
    let d = tempfile::tempdir().unwrap();
    let s = keeping(d.path());
    {
        let mut g = s.inner.lock();
        append(&mut g, (1..=100).map(|i| entry(1, i, 1 << 20)).collect());
        g.record(Record::Purge(lid(1, 99))).unwrap();
        g.drop_purged_segments();
        assert!(
            g.disk.as_ref().unwrap().free.lock().is_empty(),
            "nothing recycled"
        );
    }
    let kept = |d: &Path| -> Vec<u64> {
        numbered(d, "kept-")
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect()
    };
    let all = kept(d.path());
    assert!(all.len() >= 2, "purged segments set aside: {all:?}");
    // A value in a kept segment is still readable where it was written.
    let e = entry(1, 3, 1 << 20);
    let at = s.value_refs(&e);
    assert!(at.is_none(), "entry 3 was purged: no live location");
    // Everything below the lowest referenced segment goes, the rest stays.
    let (files, _) = s.drop_kept_below(Some(all[1])).unwrap();
    assert_eq!(files, 1);
    assert_eq!(kept(d.path()), all[1..].to_vec());
    s.drop_kept_below(None).unwrap();
    assert!(kept(d.path()).is_empty());
    // A reopened keeping log does not scan them back in.
    drop(s);
    let g = reopen(d.path());
    assert_eq!(g.index.keys().next(), Some(&100));
}

#[test]
fn value_refs_point_at_the_value_bytes_in_the_segment() {
    let d = tempfile::tempdir().unwrap();
    let s = keeping(d.path());
    let e = Entry {
        log_id: lid(1, 1),
        payload: EntryPayload::Normal(Command::Batch(vec![
            crate::types::BatchedWrite {
                key: "/p/a".into(),
                value: Some(bytes::Bytes::from(vec![1u8; 100])),
                expected: None,
                timestamp_us: 1,
                req_id: None,
                trace: None,
            },
            crate::types::BatchedWrite {
                key: "/p/small".into(),
                value: Some(bytes::Bytes::from_static(b"tiny")),
                expected: None,
                timestamp_us: 2,
                req_id: None,
                trace: None,
            },
            crate::types::BatchedWrite {
                key: "/p/b".into(),
                value: Some(bytes::Bytes::from(vec![2u8; 70_000])),
                expected: None,
                timestamp_us: 3,
                req_id: None,
                trace: None,
            },
        ])),
    };
    append(&mut s.inner.lock(), vec![e.clone()]);
    let refs = s.value_refs(&e).unwrap();
    assert_eq!(refs.len(), 2, "values under MIN_REF are not referenced");
    assert_eq!(read_value(d.path(), &refs[0]).unwrap(), vec![1u8; 100]);
    assert_eq!(read_value(d.path(), &refs[1]).unwrap(), vec![2u8; 70_000]);
    // Another entry at that index (a different term) has no location.
    let mut other = e.clone();
    other.log_id = lid(2, 1);
    assert!(s.value_refs(&other).is_none());
}

#[test]
fn purged_segment_files_are_recycled_and_their_stale_records_ignored() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = LogStore::open(d.path(), false).unwrap();
        let mut g = s.inner.lock();
        append(&mut g, (1..=100).map(|i| entry(1, i, 1 << 20)).collect());
        g.record(Record::Purge(lid(1, 99))).unwrap();
        g.drop_purged_segments();
        let spare = g.disk.as_ref().unwrap().free.lock().len();
        assert!(spare >= 2, "{spare} purged segments kept");
        // The next segments reuse those files (full of old records).
        append(&mut g, (101..=170).map(|i| entry(2, i, 1 << 20)).collect());
        assert!(g.disk.as_ref().unwrap().free.lock().len() < spare);
    }
    let g = reopen(d.path());
    assert_eq!(g.index.len(), 71, "entries 100..=170, nothing stale");
    assert_eq!(g.index[&170].log_id, lid(2, 170));
    assert_eq!(g.entry(100).unwrap().unwrap().log_id, lid(1, 100));
}

/// A synced log tells a torn append from damage by the zeros past its
/// last record, so it never recycles a segment (the metadata group's log,
/// synced but not kept, did: a crash's tail over a recycled file's stale
/// records would read as damage), and a spare left from when it was not
/// synced is removed at open.
#[test]
fn a_synced_log_never_recycles_a_segment() {
    let d = tempfile::tempdir().unwrap();
    let spares = |d: &Path| numbered(d, "free-").unwrap().len();
    {
        let s = LogStore::open(d.path(), false).unwrap();
        let mut g = s.inner.lock();
        append(&mut g, (1..=100).map(|i| entry(1, i, 1 << 20)).collect());
        g.record(Record::Purge(lid(1, 99))).unwrap();
        g.drop_purged_segments();
    }
    assert!(spares(d.path()) >= 2, "the unsynced log kept spares");
    let s = LogStore::open(d.path(), true).unwrap();
    assert_eq!(spares(d.path()), 0, "removed at open");
    let mut g = s.inner.lock();
    append(&mut g, (101..=200).map(|i| entry(1, i, 1 << 20)).collect());
    g.record(Record::Purge(lid(1, 199))).unwrap();
    g.drop_purged_segments();
    assert!(g.disk.as_ref().unwrap().free.lock().is_empty());
    assert_eq!(spares(d.path()), 0);
    assert_eq!(
        numbered(d.path(), "seg-").unwrap().len(),
        1,
        "purged ones deleted"
    );
}

#[test]
fn only_the_newest_entries_stay_in_memory_and_older_ones_read_back_from_disk() {
    let d = tempfile::tempdir().unwrap();
    let s = LogStore::open(d.path(), false).unwrap();
    append(
        &mut s.inner.lock(),
        (1..=60).map(|i| entry(1, i, 1 << 20)).collect(),
    );
    {
        let g = s.inner.lock();
        assert!(g.mem_bytes <= MEM_TAIL_BYTES, "{}", g.mem_bytes);
        assert!(g.entries.len() < 20 && g.entries.contains_key(&60));
        assert_eq!(g.index.len(), 60);
        assert!(g.held_bytes > 60 << 20);
    }
    let got = s.entries_in(1, 61, u64::MAX).unwrap();
    assert_eq!(got.len(), 60);
    for (i, e) in got.iter().enumerate() {
        let want = entry(1, i as u64 + 1, 1 << 20);
        assert_eq!(e.log_id, want.log_id);
        match (&e.payload, &want.payload) {
            (
                EntryPayload::Normal(Command::Write {
                    value: a, key: ka, ..
                }),
                EntryPayload::Normal(Command::Write {
                    value: b, key: kb, ..
                }),
            ) => assert!(a == b && ka == kb, "entry {} read back intact", i + 1),
            _ => panic!("not a write"),
        }
    }
    // A batch for a lagging follower starts on disk.
    let batch = s.entries_in(3, 61, 1 << 20).unwrap();
    assert_eq!(batch.first().map(|e| e.log_id.index), Some(3));
}

/// A log of `n` entries of 1 MiB (unmapped, unsynced) and where entry
/// `i` lies, which the in-memory tail has let go (on disk only).
fn evicted(n: u64, i: u64) -> (tempfile::TempDir, LogStore, Loc) {
    let d = tempfile::tempdir().unwrap();
    let s = LogStore::open(d.path(), false).unwrap();
    append(
        &mut s.inner.lock(),
        (1..=n).map(|i| entry(1, i, 1 << 20)).collect(),
    );
    let loc = {
        let g = s.inner.lock();
        assert!(!g.entries.contains_key(&i), "entry {i} left memory");
        g.index[&i].loc.unwrap()
    };
    (d, s, loc)
}

#[test]
fn an_evicted_entry_that_fails_its_checksum_is_an_error_naming_the_file() {
    let (d, s, loc) = evicted(30, 1);
    let seg = seg_path(d.path(), loc.seq);
    let mut data = std::fs::read(&seg).unwrap();
    data[loc.offset as usize + 100] ^= 0xff;
    std::fs::write(&seg, &data).unwrap();
    let e = s.entries_in(1, 3, u64::MAX).err().unwrap();
    assert!(e.to_string().contains("seg-00000001.log"), "{e}");
    // Entries still in memory are unaffected.
    assert_eq!(s.entries_in(30, 31, u64::MAX).unwrap().len(), 1);
}

#[test]
fn a_torn_tail_is_cut_and_older_corruption_refuses_to_open() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = LogStore::open(d.path(), false).unwrap();
        append(
            &mut s.inner.lock(),
            (1..=3).map(|i| entry(1, i, 100)).collect(),
        );
    }
    let seg = seg_path(d.path(), 1);
    let len = std::fs::metadata(&seg).unwrap().len();
    // A crash mid-append: half a record at the end.
    let f = OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(len - 20).unwrap();
    let g = reopen(d.path());
    assert_eq!(g.index.len(), 2);
    drop(g);
    // Corruption in a sealed segment is an error naming the file.
    let mut data = std::fs::read(&seg).unwrap();
    data[SEGMENT_HEADER + 12] ^= 0xff;
    std::fs::write(&seg, &data).unwrap();
    // (A newer segment with a record: an empty one would be a roll
    // that never finished, and segment 1 the newest again.)
    let mut head = segment_header(2).to_vec();
    encode(&Record::Committed(None), &mut head, 2).unwrap();
    std::fs::write(seg_path(d.path(), 2), &head).unwrap();
    let e = LogStore::open(d.path(), false).err().unwrap();
    assert!(e.to_string().contains("seg-00000001.log"), "{e}");
    assert!(
        e.to_string().contains("offset 24"),
        "the first record's offset: {e}"
    );
}

/// Issue #14: segments carry a header with a format version, so a log
/// of another format is refused by name instead of being misread.
#[test]
fn a_segment_of_another_format_or_without_a_header_is_refused() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = LogStore::open(d.path(), false).unwrap();
        append(&mut s.inner.lock(), vec![entry(1, 1, 10)]);
    }
    let seg = seg_path(d.path(), 1);
    let good = std::fs::read(&seg).unwrap();
    assert_eq!(&good[..8], b"SLUICERL");
    // A newer format.
    let mut newer = good.clone();
    newer[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32c::crc32c(&newer[..20]);
    newer[20..24].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&seg, &newer).unwrap();
    let e = LogStore::open(d.path(), false).err().unwrap().to_string();
    assert!(
        e.contains("seg-00000001.log") && e.contains("format version 2"),
        "{e}"
    );
    // A log as older builds wrote it: records from the first byte.
    std::fs::write(&seg, &good[SEGMENT_HEADER..]).unwrap();
    let e = LogStore::open(d.path(), false).err().unwrap().to_string();
    assert!(
        e.contains("seg-00000001.log") && e.contains("no segment header"),
        "{e}"
    );
    // Neither was changed.
    assert_eq!(std::fs::read(&seg).unwrap(), &good[SEGMENT_HEADER..]);
    std::fs::write(&seg, &good).unwrap();
    assert_eq!(reopen(d.path()).index.len(), 1);
}

fn keeping(dir: &Path) -> LogStore {
    let opts = LogOptions {
        keep: true,
        ..LogOptions::default()
    };
    LogStore::open_with(dir, opts).unwrap()
}

fn mapped(dir: &Path) -> LogStore {
    let opts = LogOptions {
        mapped: true,
        ..LogOptions::default()
    };
    LogStore::open_with(dir, opts).unwrap()
}

/// Waits (bounded) until a mapped spare segment is ready.
fn spare_ready(g: &Inner) -> bool {
    let free = g.disk.as_ref().unwrap().free.clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if free.lock().iter().any(|(_, m)| m.is_some()) {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

#[test]
fn a_mapped_log_writes_through_a_prepared_mapping_and_reopens_intact() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = mapped(d.path());
        s.inner
            .lock()
            .record(Record::Vote(Vote::new(3, 1)))
            .unwrap();
        let mut g = s.inner.lock();
        // Half a segment in: a spare is prepared; the roll maps it.
        append(&mut g, (1..=20).map(|i| entry(1, i, 1 << 20)).collect());
        assert!(spare_ready(&g), "a spare segment was prepared");
        append(&mut g, (21..=40).map(|i| entry(1, i, 1 << 20)).collect());
        let dk = g.disk.as_ref().unwrap();
        assert!(
            dk.seq == 2 && dk.map.is_some(),
            "rolled into the mapped spare"
        );
        drop(g);
        // The commit point is written at the end like any record.
        s.save_commit(40).unwrap();
        let mut g = s.inner.lock();
        // Up to 1 MiB short of a full segment (no roll yet)...
        let left = SEGMENT_BYTES - g.disk.as_ref().unwrap().bytes;
        append(&mut g, vec![entry(1, 41, (left - (1 << 20)) as usize)]);
        // ... then more than the rest of the mapping: through write(2).
        append(&mut g, vec![entry(1, 42, 6 << 20)]);
        let active = std::fs::metadata(seg_path(d.path(), 2)).unwrap().len();
        assert!(active > MAP_BYTES, "written past the mapping ({active})");
        g.record(Record::Truncate(42)).unwrap();
        append(&mut g, (42..=46).map(|i| entry(2, i, 10)).collect());
        assert!(g.disk.as_ref().unwrap().seq >= 3, "segments rolled");
    }
    // Unmapped or mapped, the same records come back.
    for g in [reopen(d.path()), {
        let s = mapped(d.path());
        Arc::try_unwrap(s.inner).ok().unwrap().into_inner()
    }] {
        assert_eq!(g.vote, Some(Vote::new(3, 1)));
        assert_eq!(g.committed, Some(lid(1, 40)));
        assert_eq!(g.index.len(), 46);
        assert_eq!(
            g.index[&42].log_id,
            lid(2, 42),
            "the truncated entry was replaced"
        );
        assert_eq!(g.index[&41].log_id, lid(1, 41));
        let e = g.entry(38).unwrap().unwrap();
        assert_eq!(e.log_id, lid(1, 38));
        assert_eq!(entry_values(&e, 1), entry_values(&entry(1, 38, 1 << 20), 1));
    }
    // Corruption before a seal still refuses the open, naming the file.
    let seg = seg_path(d.path(), 2);
    let mut data = std::fs::read(&seg).unwrap();
    data[4096] ^= 0xff;
    std::fs::write(&seg, &data).unwrap();
    let e = LogStore::open(d.path(), false).err().unwrap();
    assert!(e.to_string().contains("seg-00000002.log"), "{e}");
}

#[test]
fn a_mapped_log_recycles_files_with_their_mappings() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = mapped(d.path());
        let mut g = s.inner.lock();
        append(&mut g, (1..=20).map(|i| entry(1, i, 1 << 20)).collect());
        assert!(spare_ready(&g));
        append(&mut g, (21..=70).map(|i| entry(1, i, 1 << 20)).collect());
        // Segment 2 was mapped: sealed, it is not cut (its pages stay).
        let len = std::fs::metadata(seg_path(d.path(), 2)).unwrap().len();
        assert_eq!(len, MAP_BYTES, "a sealed mapped segment keeps its pages");
        g.record(Record::Purge(lid(1, 69))).unwrap();
        g.drop_purged_segments();
        {
            let free = g.disk.as_ref().unwrap().free.lock();
            assert!(free.len() >= 2, "purged segments kept for reuse");
            assert!(
                free.iter().any(|(_, m)| m.is_some()),
                "one with its mapping"
            );
        }
        // The next segments overwrite those files (old records inside).
        append(&mut g, (71..=130).map(|i| entry(2, i, 1 << 20)).collect());
    }
    // A torn record at the end of the newest segment (a kill mid-copy).
    let newest = numbered(d.path(), "seg-").unwrap().last().unwrap().0;
    let g = reopen(d.path());
    let at = g.index[&130].loc.unwrap();
    assert_eq!(at.seq, newest);
    drop(g);
    {
        use std::os::unix::fs::FileExt;
        let f = OpenOptions::new()
            .write(true)
            .open(seg_path(d.path(), newest))
            .unwrap();
        f.write_all_at(&[0xab; 64], at.offset + 8 + 1000).unwrap();
    }
    let g = reopen(d.path());
    assert_eq!(g.index.keys().next(), Some(&70));
    assert_eq!(
        g.index.keys().next_back(),
        Some(&129),
        "the torn entry was cut, nothing stale came back"
    );
    assert_eq!(g.entry(71).unwrap().unwrap().log_id, lid(2, 71));
}

#[test]
fn a_roll_without_a_ready_spare_goes_on_unmapped_and_the_next_maps_one() {
    use std::sync::atomic::Ordering;
    let d = tempfile::tempdir().unwrap();
    let s = mapped(d.path());
    let mut g = s.inner.lock();
    // As if a preparation were under way that has not finished.
    g.disk
        .as_ref()
        .unwrap()
        .preparing
        .store(true, Ordering::Release);
    append(&mut g, (1..=40).map(|i| entry(1, i, 1 << 20)).collect());
    let dk = g.disk.as_ref().unwrap();
    assert!(
        dk.seq == 2 && dk.map.is_none(),
        "no allocation on the put's path"
    );
    dk.preparing.store(false, Ordering::Release);
    dk.prepare_ahead();
    assert!(spare_ready(&g));
    append(&mut g, (41..=75).map(|i| entry(1, i, 1 << 20)).collect());
    let dk = g.disk.as_ref().unwrap();
    assert!(
        dk.seq == 3 && dk.map.is_some(),
        "the next roll maps the spare"
    );
    drop(g);
    let g = reopen(d.path());
    assert_eq!(g.index.len(), 75);
    assert_eq!(g.entry(50).unwrap().unwrap().log_id, lid(1, 50));
}

#[test]
fn a_spare_that_cannot_be_prepared_is_dropped_and_the_log_writes_on() {
    use std::sync::atomic::Ordering;
    let d = tempfile::tempdir().unwrap();
    let s = mapped(d.path());
    // A spare file that cannot be opened for writing: a directory.
    let bad = d.path().join("free-00000009.log");
    std::fs::create_dir(&bad).unwrap();
    let mut g = s.inner.lock();
    let dk = g.disk.as_ref().unwrap();
    dk.free.lock().push((bad.clone(), None));
    dk.prepare_ahead();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while dk.preparing.load(Ordering::Acquire) {
        assert!(
            std::time::Instant::now() < deadline,
            "the preparation never ended"
        );
        std::thread::yield_now();
    }
    assert!(dk.free.lock().is_empty(), "the failed spare left the list");
    // Appends go on across a roll (into a spare prepared meanwhile, or
    // an unmapped segment).
    append(&mut g, (1..=40).map(|i| entry(1, i, 1 << 20)).collect());
    assert_eq!(g.disk.as_ref().unwrap().seq, 2);
    drop(g);
    drop(s);
    std::fs::remove_dir(&bad).unwrap();
    let g = reopen(d.path());
    assert_eq!(g.index.len(), 40);
    assert_eq!(g.entry(36).unwrap().unwrap().log_id, lid(1, 36));
}

/// A log without a disk holding entries 1..=n of `size` bytes.
fn in_memory(n: u64, size: usize) -> LogStore {
    let s = LogStore::default();
    for i in 1..=n {
        s.inner.lock().apply(Record::Entry(entry(1, i, size)), None);
    }
    s
}

#[test]
fn replication_batches_stop_at_the_byte_budget_but_never_send_nothing() {
    let s = in_memory(10, 3 << 20);
    let got = s.entries_in(1, 11, 1 << 20).unwrap();
    assert_eq!(got.len(), 1, "3 MiB + 3 MiB exceeds the budget");
    let small = in_memory(10, 10);
    assert_eq!(small.entries_in(1, 11, 1 << 20).unwrap().len(), 10);
}

/// What a snapshot keeps behind it is bounded by entries and by bytes:
/// 256 entries of 1 MB would be 256 MB kept in memory.
#[test]
fn entries_kept_behind_a_snapshot_are_bounded_by_their_bytes() {
    let s = in_memory(10, 1 << 20);
    let size = |i| s.inner.lock().index[&i].size;
    let (one, held) = (size(5), s.held_bytes());
    // Entries alone bound it where they are small enough.
    assert_eq!(s.kept_behind(10, 3, u64::MAX), 3);
    assert_eq!(s.bytes_beyond_kept(3, u64::MAX), s.bytes_beyond(3));
    // Bytes bound it where they are not: 2.5 entries' worth keeps 2, the
    // newest ones at or before the snapshot's index.
    assert_eq!(s.kept_behind(10, 8, one * 5 / 2), 2);
    assert_eq!(s.kept_behind(6, 8, one * 5 / 2), 2);
    assert_eq!(
        s.bytes_beyond_kept(8, one * 5 / 2),
        held - size(9) - size(10)
    );
    // Less than one entry's worth keeps none.
    assert_eq!(s.kept_behind(10, 8, one - 1), 0);
    assert_eq!(s.bytes_beyond_kept(8, 0), held);
}

/// A spare segment's pages are all mapped after `populate`, in chunks,
/// and what a recycled file held is left as it was; the same for `touch`,
/// what it falls back to on kernels without `MADV_POPULATE_WRITE`.
#[cfg(target_os = "linux")]
#[test]
fn populate_maps_every_page_and_keeps_the_contents() {
    for touch_only in [false, true] {
        populates(touch_only);
    }
}

#[cfg(target_os = "linux")]
fn populates(touch_only: bool) {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spare.log");
    let len = 3 * (256 << 10) + 3 * 4096; // not a whole number of chunks
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let pattern: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    f.write_all(&pattern).unwrap();
    // SAFETY: a file of this test's own, not resized while mapped.
    let mut map = unsafe { memmap2::MmapOptions::new().len(len).map_mut(&f).unwrap() };
    let rss = |map: &memmap2::MmapMut| -> usize {
        // This mapping's resident set in this process's page tables, in
        // bytes (/proc/self/smaps).
        let start = format!("{:x}-", map.as_ptr() as usize);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let block = smaps.split_once(&start).expect("the mapping in smaps").1;
        let kb: usize = block
            .lines()
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb * 1024
    };
    assert_eq!(rss(&map), 0, "mapped before populate");
    if touch_only {
        super::disk::touch(&mut map[..]);
    } else {
        super::disk::populate(&mut map).unwrap();
    }
    assert!(
        rss(&map) >= len,
        "not every page was mapped: {} of {len}",
        rss(&map)
    );
    assert!(map[..] == pattern[..], "populate changed the contents");
}

/// The spare segments kept for reuse follow `set_spares`: a purge keeps
/// no more than that many files, and lowering it hands back the rest at
/// once; without it, up to `FREE_SEGMENTS`.
#[test]
fn spare_segments_are_kept_up_to_the_number_set() {
    let files = |dir: &Path| numbered(dir, "free-").unwrap().len();
    let fill = |s: &LogStore| {
        let mut g = s.inner.lock();
        append(&mut g, (1..=260).map(|i| entry(1, i, 1 << 20)).collect());
        assert!(g.disk.as_ref().unwrap().seq >= 8, "segments rolled");
    };
    let d = tempfile::tempdir().unwrap();
    let s = LogStore::open(d.path(), false).unwrap();
    fill(&s);
    s.purge_covered(lid(1, 255)).unwrap();
    let unbounded = s.spare_count();
    assert!(unbounded >= 6, "{unbounded} spares by default");
    assert_eq!(files(d.path()), unbounded);
    drop(s);

    let d = tempfile::tempdir().unwrap();
    let s = LogStore::open(d.path(), false).unwrap();
    s.set_spares(3);
    fill(&s);
    s.purge_covered(lid(1, 255)).unwrap();
    assert_eq!(s.spare_count(), 3);
    assert_eq!(files(d.path()), 3, "the others were deleted");
    s.set_spares(1);
    assert_eq!((s.spare_count(), files(d.path())), (1, 1));
    s.set_spares(0);
    assert_eq!(s.spare_count(), 1, "at least one");
}

#[test]
fn a_log_needs_spares_for_twice_its_largest_size() {
    assert_eq!(LogStore::spares_for(0), 2);
    assert_eq!(LogStore::spares_for(64 << 20), 4);
    assert_eq!(LogStore::spares_for(65 << 20), 5);
    assert_eq!(LogStore::spares_for(288 << 20), FREE_SEGMENTS);
    assert_eq!(LogStore::spares_for(u64::MAX), FREE_SEGMENTS);
}

/// raft-rs's reads of its log take heads from the index: entries past the
/// in-memory tail are not read back (a damaged value on disk does not
/// even show), where reading the entries whole finds the damage.
#[test]
fn heads_of_entries_past_the_memory_tail_are_not_read_from_disk() {
    use super::direct::Head;
    let (d, s, loc) = evicted(40, 2);
    {
        use std::os::unix::fs::FileExt;
        let f = OpenOptions::new()
            .write(true)
            .open(seg_path(d.path(), loc.seq))
            .unwrap();
        f.write_all_at(&[0x5a; 16], loc.offset + 8 + u64::from(loc.len) - 64)
            .unwrap();
    }
    assert!(s.entries_in(2, 3, u64::MAX).is_err(), "read whole: damaged");
    let heads = s.heads_in(1, 41, u64::MAX).unwrap();
    assert_eq!(heads.len(), 40);
    for (i, h) in (1..).zip(&heads) {
        match h {
            Head::Id(id, kind) => assert_eq!((*id, *kind), (lid(1, i), Kind::Normal)),
            Head::Whole(e) => panic!("entry {} read whole", e.log_id.index),
        }
    }
    // Bounded by bytes like `entries_in` (one at least).
    assert_eq!(s.heads_in(1, 41, 3 << 20).unwrap().len(), 2);
    assert_eq!(s.heads_in(1, 41, 0).unwrap().len(), 1);
}

/// The in-memory tail keeps entries still needed (up to
/// `MEM_NEEDED_BYTES`), so apply and replication do not read them back
/// from disk; once done with, they go down to `MEM_TAIL_BYTES`.
#[test]
fn the_memory_tail_keeps_what_is_not_applied_yet() {
    let d = tempfile::tempdir().unwrap();
    let s = LogStore::open(d.path(), false).unwrap();
    s.set_needed_after(10);
    append(
        &mut s.inner.lock(),
        (1..=40).map(|i| entry(1, i, 1 << 20)).collect(),
    );
    let in_memory = |s: &LogStore| s.inner.lock().entries.keys().copied().collect::<Vec<_>>();
    assert_eq!(
        in_memory(&s),
        (11..=40).collect::<Vec<_>>(),
        "11..=40 still needed"
    );
    s.set_needed_after(40);
    let kept = in_memory(&s);
    assert!(kept.len() <= 16 && kept.last() == Some(&40), "{kept:?}");
    // Past `MEM_NEEDED_BYTES` even needed entries go to disk only.
    append(
        &mut s.inner.lock(),
        (41..=140).map(|i| entry(1, i, 1 << 20)).collect(),
    );
    let kept = in_memory(&s);
    assert!(
        kept.len() <= 64 && kept[0] > 41,
        "{} entries kept",
        kept.len()
    );
}

/// An entry read back from its segment costs one copy, of the record
/// into one buffer: its values are slices of that buffer (two values of
/// one batch share it), not each decoded into memory of its own (two
/// more copies of each value into fresh pages, which made a leader
/// feeding a follower behind slower than the follower fell behind).
#[test]
fn values_of_an_entry_read_back_are_slices_of_one_read() {
    let d = tempfile::tempdir().unwrap();
    let s = LogStore::open(d.path(), false).unwrap();
    let write = |key: &str, fill: u8| crate::types::BatchedWrite {
        key: key.into(),
        value: Some(bytes::Bytes::from(vec![fill; 512 << 10])),
        expected: None,
        timestamp_us: 1,
        req_id: None,
        trace: None,
    };
    let batch = Entry {
        log_id: lid(1, 1),
        payload: EntryPayload::Normal(Command::Batch(vec![write("/vol/a", 1), write("/vol/b", 2)])),
    };
    let mut entries = vec![batch];
    entries.extend((2..=40).map(|i| entry(1, i, 1 << 20)));
    append(&mut s.inner.lock(), entries);
    assert!(
        !s.inner.lock().entries.contains_key(&1),
        "entry 1 left memory"
    );
    let got = s.entries_in(1, 2, u64::MAX).unwrap();
    let Some(EntryPayload::Normal(Command::Batch(ws))) = got.into_iter().next().map(|e| e.payload)
    else {
        panic!("not the batch");
    };
    let mut values = ws.into_iter().filter_map(|w| w.value);
    let (a, b) = (values.next().unwrap(), values.next().unwrap());
    assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2) && a.len() == 512 << 10);
    assert!(
        !a.is_unique() && !b.is_unique(),
        "the two values share one buffer"
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Records and snapshot metas keep the bytes that builds on openraft's
/// types wrote (captured from openraft 0.10.0-alpha.37's default types
/// before it was removed): logs and snapshot files of earlier raft-rs
/// clusters open unchanged.
#[test]
fn records_keep_their_encoding() {
    let id = LogId::new(CommittedLeaderId::new(3, 2), 7);
    let m = crate::raftrs::Members {
        voters: [1, 2, 3].into_iter().collect(),
        learners: [4].into_iter().collect(),
    }
    .to_membership();
    let entry = |payload| {
        Record::Entry(Entry {
            log_id: id,
            payload,
        })
    };
    // Variant, then the log id (term 3, node 2, index 7).
    let head = "00000000030000000000000002000000000000000700000000000000";
    let localhost = "09000000000000006c6f63616c686f7374";
    // One voter set {1, 2, 3}, then nodes 1 to 4 at "localhost".
    let members = format!(
        "01000000000000000300000000000000010000000000000002000000000000000300000000000000\
         0400000000000000\
         0100000000000000{localhost}0200000000000000{localhost}\
         0300000000000000{localhost}0400000000000000{localhost}"
    );
    let want = [
        (entry(EntryPayload::Blank), format!("{head}00000000")),
        (
            entry(EntryPayload::Normal(Command::Tick { timestamp_us: 5 })),
            format!("{head}01000000020000000500000000000000"),
        ),
        (
            entry(EntryPayload::Membership(m.clone())),
            format!("{head}02000000{members}"),
        ),
        (
            Record::Vote(Vote::new(3, 1)),
            "010000000300000000000000010000000000000000".into(),
        ),
        (
            Record::Committed(Some(id)),
            "0200000001030000000000000002000000000000000700000000000000".into(),
        ),
        (Record::Committed(None), "0200000000".into()),
        (Record::Truncate(9), "030000000900000000000000".into()),
        (
            Record::Purge(id),
            "04000000030000000000000002000000000000000700000000000000".into(),
        ),
        (Record::Seal, "05000000".into()),
    ];
    for (rec, hexed) in want {
        let b = bincode::serialize(&rec).unwrap();
        assert_eq!(hex(&b), hexed);
        let back: Record = bincode::deserialize(&b).unwrap();
        assert_eq!(bincode::serialize(&back).unwrap(), b);
    }
    let meta =
        crate::types::SnapshotMeta::new(Some(id), crate::types::StoredMembership::new(Some(id), m));
    let b = bincode::serialize(&meta).unwrap();
    let lid = "01030000000000000002000000000000000700000000000000";
    // The third field: an empty snapshot id, kept for the layout.
    assert_eq!(hex(&b), format!("{lid}{lid}{members}0000000000000000"));
    let back: crate::types::SnapshotMeta = bincode::deserialize(&b).unwrap();
    assert_eq!(back, meta);
}

/// Out of descriptors (a node whose clients took them all): a roll that
/// cannot open the next segment leaves the log writing on in the one it
/// has, past its usual size, instead of failing the append (which stopped
/// the member's Raft group for good); the next append after descriptors
/// are back rolls, and every entry survives a reopen. Mapped, plain and
/// synced logs alike.
#[test]
fn a_roll_without_descriptors_writes_on_in_the_current_segment() {
    for (name, opts) in [
        (
            "mapped",
            LogOptions {
                mapped: true,
                ..LogOptions::default()
            },
        ),
        ("plain", LogOptions::default()),
        (
            "synced",
            LogOptions {
                sync: true,
                ..LogOptions::default()
            },
        ),
    ] {
        let d = tempfile::tempdir().unwrap();
        let faults = Arc::new(std::sync::Mutex::new(sluice_log::Faults::default()));
        let opts = LogOptions {
            faults: Some(faults.clone()),
            ..opts
        };
        let value = |i: u64| vec![i as u8; 1 << 20];
        let check = |g: &Inner, i: u64| {
            let e = g.entry(i).unwrap().unwrap();
            let EntryPayload::Normal(Command::Write { value: Some(v), .. }) = e.payload else {
                panic!("{name}: entry {i} is not the write");
            };
            assert_eq!(v[..], value(i)[..], "{name}: entry {i}");
        };
        {
            let s = LogStore::open_with(d.path(), opts.clone()).unwrap();
            let mut g = s.inner.lock();
            append(&mut g, (1..=40).map(|i| entry(1, i, 1 << 20)).collect());
            let seq = g.disk.as_ref().unwrap().seq;
            assert!(seq >= 2, "{name}: rolled before ({seq})");
            faults.lock().unwrap().fail_open = Some(libc::EMFILE);
            // More than a segment and its mapping's slack.
            append(&mut g, (41..=120).map(|i| entry(1, i, 1 << 20)).collect());
            let disk = g.disk.as_ref().unwrap();
            assert_eq!(disk.seq, seq, "{name}: no roll without descriptors");
            assert!(disk.bytes > MAP_BYTES, "{name}: {} bytes", disk.bytes);
            assert!(disk.roll_deferred > 0, "{name}");
            faults.lock().unwrap().fail_open = None;
            append(&mut g, (121..=124).map(|i| entry(1, i, 1 << 20)).collect());
            let disk = g.disk.as_ref().unwrap();
            assert_eq!(disk.seq, seq + 1, "{name}: rolled once it could");
            assert_eq!(disk.roll_deferred, 0, "{name}");
            for i in [40, 41, 100, 120, 124] {
                check(&g, i);
            }
        }
        let s = LogStore::open_with(d.path(), opts).unwrap();
        let g = s.inner.lock();
        assert_eq!(
            g.index.keys().copied().collect::<Vec<_>>(),
            (1..=124).collect::<Vec<_>>(),
            "{name}: every entry after a reopen"
        );
        for i in [1, 41, 77, 120, 124] {
            check(&g, i);
        }
    }
}
