use bytes::Bytes;
use proptest::prelude::*;
use sluice_log::{FaultFs, Fs, Log, LogError, LogOptions, RealFs, Record, RecordKind, SyncPolicy};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A fresh directory, removed when dropped.
fn dir(_tag: &str) -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn rec(v: u64, key: &str, value: &[u8]) -> Record {
    Record {
        kind: RecordKind::Put,
        version: v,
        timestamp_us: 1_000 + v,
        prev_version_by_key: v.wrapping_sub(1),
        key: key.to_string(),
        value: Bytes::copy_from_slice(value),
    }
}

fn open(d: &std::path::Path, fs: Arc<dyn Fs>, opts: LogOptions) -> (Log, sluice_log::Recovered) {
    Log::open(d, fs, opts).unwrap()
}

fn segments(d: &std::path::Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn records_survive_reopen_and_segments_roll_over() {
    let _d_dir = dir("roll");
    let d = _d_dir.path();
    let opts = LogOptions {
        segment_bytes_max: 4096,
        sync: SyncPolicy::Always,
        ..Default::default()
    };
    let (mut log, r) = open(d, Arc::new(RealFs), opts.clone());
    assert!(r.records.is_empty());
    let mut locs = Vec::new();
    for v in 1..=100u64 {
        locs.extend(
            log.append(&[rec(v, &format!("/p/k{}", v % 7), &[v as u8; 100])])
                .unwrap(),
        );
    }
    assert!(segments(d).len() > 1, "rolled over at 4 KiB");
    assert_eq!(log.read(locs[41]).unwrap(), rec(42, "/p/k0", &[42u8; 100]));
    drop(log);
    let (log, r) = open(d, Arc::new(RealFs), opts);
    assert_eq!(r.records.len(), 100);
    assert!(r.truncated_tail.is_none());
    for (i, (loc, record)) in r.records.iter().enumerate() {
        assert_eq!(*loc, locs[i]);
        assert_eq!(record.version, i as u64 + 1);
    }
    assert_eq!(
        log.read(locs[99]).unwrap().value,
        Bytes::from(vec![100u8; 100])
    );
}

#[test]
fn a_torn_tail_is_truncated_and_appends_continue() {
    let _d_dir = dir("torn");
    let d = _d_dir.path();
    let (mut log, _) = open(d, Arc::new(RealFs), LogOptions::default());
    log.append(&[rec(1, "/p/a", b"one"), rec(2, "/p/b", b"two")])
        .unwrap();
    drop(log);
    // A crash in the middle of writing record 3: only part of it landed.
    let seg = segments(d).pop().unwrap();
    let mut partial = bytes::BytesMut::new();
    rec(3, "/p/c", b"three").encode(&mut partial);
    let mut data = std::fs::read(&seg).unwrap();
    let good_len = data.len();
    data.extend_from_slice(&partial[..partial.len() - 3]);
    std::fs::write(&seg, &data).unwrap();
    let (mut log, r) = open(d, Arc::new(RealFs), LogOptions::default());
    assert_eq!(r.records.len(), 2);
    let (_, off, removed) = r.truncated_tail.clone().unwrap();
    assert_eq!(
        (off as usize, removed as usize),
        (good_len, partial.len() - 3)
    );
    assert_eq!(std::fs::metadata(&seg).unwrap().len() as usize, good_len);
    log.append(&[rec(3, "/p/c", b"three")]).unwrap();
    drop(log);
    assert_eq!(
        open(d, Arc::new(RealFs), LogOptions::default())
            .1
            .records
            .len(),
        3
    );
}

/// Issue #14: a flipped byte in the last complete record of the newest
/// segment is damage to an acknowledged, fsync'd write, not a torn one:
/// the log refuses to open, naming the file and offset, and cuts nothing.
#[test]
fn a_flipped_byte_in_the_last_complete_record_refuses_to_open() {
    let _d_dir = dir("flip-last");
    let d = _d_dir.path();
    let opts = LogOptions {
        sync: SyncPolicy::Always,
        ..Default::default()
    };
    let (mut log, _) = open(d, Arc::new(RealFs), opts.clone());
    let locs = log
        .append(&[rec(1, "/p/a", b"one"), rec(2, "/p/b", b"acknowledged")])
        .unwrap();
    drop(log);
    let seg = segments(d).pop().unwrap();
    let mut data = std::fs::read(&seg).unwrap();
    assert_eq!(data.len() as u64, locs[1].offset + u64::from(locs[1].len));
    data[locs[1].offset as usize + 20] ^= 0x01;
    std::fs::write(&seg, &data).unwrap();
    match Log::open(d, Arc::new(RealFs), opts) {
        Err(e @ LogError::Corrupt { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&seg.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("offset {}", locs[1].offset)), "{msg}");
            assert!(msg.contains("not a torn write"), "{msg}");
        }
        Err(other) => panic!("{other}"),
        Ok((_, r)) => panic!("opened a damaged log, cut: {:?}", r.truncated_tail),
    }
    assert_eq!(std::fs::read(&seg).unwrap(), data, "the evidence is kept");
}

/// What a crash leaves at the end of a zero-extended segment (the record's
/// header and first sector written, the rest still zeros) is a torn write:
/// cut, with the cut bytes kept next to the segment.
#[test]
fn a_record_whose_last_sectors_never_landed_is_cut_and_kept_as_evidence() {
    let _d_dir = dir("torn-zeros");
    let d = _d_dir.path();
    let (mut log, _) = open(d, Arc::new(RealFs), LogOptions::default());
    log.append(&[rec(1, "/p/a", b"one")]).unwrap();
    drop(log);
    let seg = segments(d).pop().unwrap();
    let mut data = std::fs::read(&seg).unwrap();
    let good_len = data.len();
    let mut whole = bytes::BytesMut::new();
    rec(2, "/p/b", &[5u8; 3000]).encode(&mut whole);
    let mut torn = whole.to_vec();
    // Only the part up to the first 512-byte file boundary landed.
    let landed = (good_len / 512 + 1) * 512 - good_len;
    torn[landed..].fill(0);
    data.extend_from_slice(&torn);
    std::fs::write(&seg, &data).unwrap();
    let (log, r) = open(d, Arc::new(RealFs), LogOptions::default());
    assert_eq!(r.records.len(), 1);
    assert_eq!(r.truncated_tail.as_ref().unwrap().1 as usize, good_len);
    drop(log);
    let evidence = PathBuf::from(format!("{}.torn-at-{good_len}", seg.display()));
    assert_eq!(std::fs::read(&evidence).unwrap(), torn);
}

#[test]
fn corruption_in_the_middle_is_reported_with_file_and_offset() {
    let _d_dir = dir("corrupt");
    let d = _d_dir.path();
    let (mut log, _) = open(d, Arc::new(RealFs), LogOptions::default());
    let locs = log
        .append(&[
            rec(1, "/p/a", b"aaaa"),
            rec(2, "/p/b", b"bbbb"),
            rec(3, "/p/c", b"cccc"),
        ])
        .unwrap();
    drop(log);
    let seg = segments(d).pop().unwrap();
    let mut data = std::fs::read(&seg).unwrap();
    let flip = locs[1].offset as usize + locs[1].len as usize - 2; // inside record 2's value
    data[flip] ^= 0xff;
    std::fs::write(&seg, &data).unwrap();
    match Log::open(d, Arc::new(RealFs), LogOptions::default()) {
        Err(e @ LogError::Corrupt { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&seg.display().to_string())
                    && msg.contains(&format!("offset {}", locs[1].offset)),
                "{msg}"
            );
            assert!(msg.contains("checksum mismatch"), "{msg}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("opened a corrupt log"),
    }
    // Nothing was truncated: the bytes after the bad record are intact.
    assert_eq!(std::fs::read(&seg).unwrap().len(), data.len());
}

#[test]
fn a_bad_segment_header_refuses_to_open() {
    let _d_dir = dir("hdr");
    let d = _d_dir.path();
    let (mut log, _) = open(d, Arc::new(RealFs), LogOptions::default());
    log.append(&[rec(1, "/p/a", b"x")]).unwrap();
    drop(log);
    let seg = segments(d).pop().unwrap();
    let mut data = std::fs::read(&seg).unwrap();
    data[0] = b'X';
    std::fs::write(&seg, &data).unwrap();
    let e = Log::open(d, Arc::new(RealFs), LogOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("bad segment header"), "{e}");
}

#[test]
fn short_writes_enospc_and_fsync_failures_lose_nothing_acknowledged() {
    let _d_dir = dir("faults");
    let d = _d_dir.path();
    let fs = FaultFs::default();
    let (mut log, _) = open(d, Arc::new(fs.clone()), LogOptions::default());
    log.append(&[rec(1, "/p/a", b"kept")]).unwrap();

    fs.faults.lock().unwrap().short_write = Some(10);
    let e = log.append(&[rec(2, "/p/b", b"lost")]).unwrap_err();
    assert!(e.to_string().contains("injected short write"), "{e}");
    log.append(&[rec(3, "/p/c", b"after short write")]).unwrap();

    fs.faults.lock().unwrap().space_left = Some(20);
    let e = log.append(&[rec(4, "/p/d", &[0u8; 100])]).unwrap_err();
    assert!(e.is_disk_full(), "{e}");
    fs.faults.lock().unwrap().space_left = None;

    fs.faults.lock().unwrap().fail_sync = true;
    let e = log.append(&[rec(5, "/p/e", b"not durable")]).unwrap_err();
    assert!(e.to_string().contains("injected fsync failure"), "{e}");
    fs.faults.lock().unwrap().fail_sync = false;
    log.append(&[rec(6, "/p/f", b"durable")]).unwrap();
    drop(log);

    let (_, r) = open(d, Arc::new(RealFs), LogOptions::default());
    let versions: Vec<u64> = r.records.iter().map(|(_, x)| x.version).collect();
    assert_eq!(versions, vec![1, 3, 6], "exactly the acknowledged appends");
    assert!(
        r.truncated_tail.is_none(),
        "failed appends were undone at once"
    );
}

#[test]
fn batch_policy_reports_when_a_sync_is_due() {
    let _d_dir = dir("batch");
    let d = _d_dir.path();
    let opts = LogOptions {
        sync: SyncPolicy::Batch {
            max_delay: Duration::from_millis(5),
        },
        ..Default::default()
    };
    let (mut log, _) = open(d, Arc::new(RealFs), opts);
    assert!(!log.sync_due());
    log.append(&[rec(1, "/p/a", b"x")]).unwrap();
    let t = std::time::Instant::now();
    while !log.sync_due() {
        assert!(t.elapsed() < Duration::from_secs(5));
        std::hint::spin_loop();
    }
    log.sync().unwrap();
    assert!(!log.sync_due());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn random_records_roundtrip_across_reopen(
        recs in proptest::collection::vec(("(/[a-z]{1,6}){1,3}", proptest::collection::vec(any::<u8>(), 0..300), any::<bool>()), 1..60),
        seg_max in 256u64..4096,
    ) {
        let _d_dir = dir("prop");
        let d = _d_dir.path();
        let opts = LogOptions { segment_bytes_max: seg_max, sync: SyncPolicy::Never, ..Default::default() };
        let (mut log, _) = open(d, Arc::new(RealFs), opts.clone());
        let mut want = Vec::new();
        for (i, (k, v, remove)) in recs.into_iter().enumerate() {
            let mut r = rec(i as u64 + 1, &k, &v);
            if remove {
                r.kind = RecordKind::Remove;
                r.value = Bytes::new();
            }
            log.append(std::slice::from_ref(&r)).unwrap();
            want.push(r);
        }
        log.sync().unwrap();
        drop(log);
        let (_, got) = open(d, Arc::new(RealFs), opts);
        let got: Vec<Record> = got.records.into_iter().map(|(_, r)| r).collect();
        prop_assert_eq!(got, want);
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn sealed_segments_are_read_through_a_shared_memory_map() {
    let _d_dir = dir("mmap");
    let d = _d_dir.path();
    let opts = LogOptions {
        segment_bytes_max: 1024,
        sync: SyncPolicy::Never,
        ..Default::default()
    };
    let (mut log, _) = open(d, Arc::new(RealFs), opts);
    let mut locs = Vec::new();
    for v in 1..=40u64 {
        locs.extend(log.append(&[rec(v, "/p/k", &[v as u8; 64])]).unwrap());
    }
    let sealed = locs[0];
    assert_ne!(sealed.segment, log.active_segment());
    let a = log.read(sealed).unwrap();
    let b = log.read(sealed).unwrap();
    assert_eq!(a.value, Bytes::from(vec![1u8; 64]));
    assert_eq!(
        a.value.as_ptr(),
        b.value.as_ptr(),
        "both reads are slices of one mapping, not copies"
    );
    // The active segment is read with pread and still answers.
    assert_eq!(log.read(*locs.last().unwrap()).unwrap().version, 40);
}

#[test]
fn without_sync_on_roll_sealed_segments_stay_pending_until_synced() {
    let _d_dir = dir("unsynced");
    let d = _d_dir.path();
    let opts = LogOptions {
        segment_bytes_max: 1024,
        sync: SyncPolicy::Never,
        sync_on_roll: false,
    };
    let (mut log, _) = open(d, Arc::new(RealFs), opts);
    for v in 1..=40u64 {
        log.append(&[rec(v, "/p/k", &[7u8; 100])]).unwrap();
    }
    let sealed = log.sealed_segments().unwrap();
    assert!(sealed.len() >= 3, "{sealed:?}");
    let pending: Vec<u64> = log.take_unsynced().into_iter().map(|(id, _)| id).collect();
    let mut want = sealed.clone();
    want.push(log.active_segment());
    assert_eq!(pending, want, "every segment written since the last sync");
    assert!(log.take_unsynced().is_empty(), "taken once");
    // A failed fsync hands them back; `sync` then covers them.
    log.requeue_unsynced(pending.iter().copied());
    assert_eq!(log.take_unsynced().len(), pending.len());
    log.requeue_unsynced(pending);
    log.sync().unwrap();
    assert!(log.take_unsynced().is_empty());
    log.append(&[rec(41, "/p/k", b"x")]).unwrap();
    let again: Vec<u64> = log.take_unsynced().into_iter().map(|(id, _)| id).collect();
    assert_eq!(again, vec![log.active_segment()]);
    let _ = std::fs::remove_dir_all(d);
}

/// Out of descriptors (a node whose clients took them all): a roll that
/// cannot open the next segment writes on in the active one instead of
/// failing the append; the first append after descriptors are back
/// rolls, and every record survives a reopen.
#[test]
fn a_roll_without_descriptors_writes_on_in_the_active_segment() {
    let _d_dir = dir("emfile");
    let d = _d_dir.path();
    let fs = FaultFs::default();
    let opts = LogOptions {
        segment_bytes_max: 4096,
        sync: SyncPolicy::Always,
        ..Default::default()
    };
    let (mut log, _) = open(d, Arc::new(fs.clone()), opts.clone());
    let mut locs = Vec::new();
    for v in 1..=50u64 {
        locs.extend(log.append(&[rec(v, "/p/k", &[v as u8; 100])]).unwrap());
    }
    let before = segments(d).len();
    fs.faults.lock().unwrap().fail_open = Some(24); // EMFILE
    for v in 51..=150u64 {
        locs.extend(log.append(&[rec(v, "/p/k", &[v as u8; 100])]).unwrap());
    }
    assert_eq!(
        segments(d).len(),
        before,
        "no new segment without descriptors"
    );
    fs.faults.lock().unwrap().fail_open = None;
    locs.extend(log.append(&[rec(151, "/p/k", &[151; 100])]).unwrap());
    assert_eq!(segments(d).len(), before + 1, "rolled once it could");
    assert_eq!(log.read(locs[99]).unwrap(), rec(100, "/p/k", &[100u8; 100]));
    drop(log);
    let (_, r) = open(d, Arc::new(RealFs), opts);
    let versions: Vec<u64> = r.records.iter().map(|(_, x)| x.version).collect();
    assert_eq!(versions, (1..=151).collect::<Vec<_>>());
    assert!(r.truncated_tail.is_none());
}
