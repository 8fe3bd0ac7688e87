//! The peer message decoder against hostile input (issue #14): every seed
//! in `fuzz-corpus/` (first byte the message kind, the rest its body;
//! regenerated with `cargo test -p sluice-cluster --test peer_fuzz --
//! --ignored regenerate_corpus`) decodes, and thousands of mutations of
//! each decode or fail cleanly: never a panic, a huge allocation or a
//! deep recursion. `SLUICE_FUZZ_ITERATIONS` sets the mutations per seed
//! (CI: 3000); a long run reports its figures with `--nocapture`.

use bytes::Bytes;
use openraft::vote::RaftLeaderId;
use openraft::EntryPayload;
use sluice_cluster::network::{decode_message, kind, PeerMessage};
use sluice_cluster::types::{
    BatchedWrite, Command, CommittedLeaderId, Entry, LogId, Membership, StoredMembership,
    TypeConfig, Vote,
};
use std::collections::BTreeSet;

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-corpus")
}

fn lid(term: u64, i: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), i)
}

fn write(key: &str, value: Option<Vec<u8>>, ts: u64) -> BatchedWrite {
    BatchedWrite {
        key: key.into(),
        value: value.map(Bytes::from),
        expected: Some(3),
        timestamp_us: ts,
        req_id: Some(sluice_types::ReqId { client: 7, seq: ts }),
        trace: Some(sluice_types::Trace {
            id: 9,
            client_sent_us: 1,
            hops: vec![sluice_types::Hop {
                stage: "/a".into(),
                enqueued_us: 2,
                started_us: 3,
                emitted_us: 4,
            }],
            emit_depth: 2,
        }),
    }
}

/// The seeds: one message of each kind and shape a peer sends.
fn seeds() -> Vec<(String, u8, Vec<u8>)> {
    let append = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(lid(2, 4)),
        entries: vec![
            Entry {
                log_id: lid(3, 5),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: lid(3, 6),
                payload: EntryPayload::Membership(Membership::new_with_defaults(
                    vec![BTreeSet::from([1, 2, 3])],
                    [1, 2, 3],
                )),
            },
            Entry {
                log_id: lid(3, 7),
                payload: EntryPayload::Normal(write("/vol/a", Some(vec![5; 100]), 10).into()),
            },
            Entry {
                log_id: lid(3, 8),
                payload: EntryPayload::Normal(Command::Meta(
                    r#"{"op":"pool_remove","path":"/x"}"#.into(),
                )),
            },
            Entry {
                log_id: lid(3, 9),
                payload: EntryPayload::Normal(Command::Tick { timestamp_us: 11 }),
            },
            Entry {
                log_id: lid(3, 10),
                payload: EntryPayload::Normal(Command::Batch(vec![
                    write("/p/b", Some(vec![1; 40]), 12),
                    write("/p/c", None, 13),
                ])),
            },
        ],
        leader_commit: Some(lid(3, 6)),
    };
    let heartbeat = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(lid(3, 10)),
        entries: vec![],
        leader_commit: Some(lid(3, 10)),
    };
    let vote = openraft::raft::VoteRequest::<TypeConfig>::new(Vote::new(4, 2), Some(lid(3, 10)));
    let snapshot = openraft_legacy::network_v1::InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        meta: openraft_legacy::network_v1::SnapshotMeta {
            last_log_id: Some(lid(3, 10)),
            last_membership: StoredMembership::new(
                Some(lid(3, 6)),
                Membership::new_with_defaults(vec![BTreeSet::from([1, 2, 3])], [1, 2, 3]),
            ),
            snapshot_id: "3-10-1".into(),
        },
        offset: 0,
        data: vec![1, 2, 3, 4, 5, 6, 7, 8],
        done: true,
    };
    vec![
        (
            "append".into(),
            kind::APPEND,
            bincode::serialize(&append).unwrap(),
        ),
        (
            "heartbeat".into(),
            kind::APPEND,
            bincode::serialize(&heartbeat).unwrap(),
        ),
        (
            "vote".into(),
            kind::VOTE,
            bincode::serialize(&vote).unwrap(),
        ),
        (
            "snapshot".into(),
            kind::SNAPSHOT,
            bincode::serialize(&snapshot).unwrap(),
        ),
    ]
}

#[test]
#[ignore = "writes the seed corpus; run by hand after a message format change"]
fn regenerate_corpus() {
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, k, body) in seeds() {
        let mut f = vec![k];
        f.extend_from_slice(&body);
        std::fs::write(dir.join(format!("{name}.bin")), f).unwrap();
    }
}

/// SplitMix64: deterministic mutations, the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = [0, 0xff, 0x7f, 0x80][rng.below(4)];
            }
            2 => b.truncate(rng.below(b.len() + 1)),
            3 => {
                let i = rng.below(b.len() + 1);
                let n = rng.below(16);
                let extra: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                b.splice(i..i, extra);
            }
            // A length prefix (8 bytes, fixint) made huge: an error, never
            // an allocation of that size.
            4 if b.len() >= 8 => {
                let i = rng.below(b.len() - 7);
                let v = [u64::MAX, u64::MAX / 2, 1 << 40, 1 << 31][rng.below(4)];
                b[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                // Duplicate a slice (repeated entries, runaway counts).
                if b.len() > 2 {
                    let i = rng.below(b.len() - 1);
                    let j = i + 1 + rng.below((b.len() - i - 1).min(64));
                    let dup = b[i..j].to_vec();
                    b.splice(j..j, dup);
                }
            }
        }
    }
    b
}

#[test]
fn corpus_and_its_mutations_never_panic() {
    let mut files: Vec<_> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 4, "corpus is missing: {} files", files.len());
    let per_seed: usize = std::env::var("SLUICE_FUZZ_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let t0 = std::time::Instant::now();
    let (mut accepted, mut rejected) = (0u64, 0u64);
    for (n, f) in files.iter().enumerate() {
        let data = std::fs::read(f).unwrap();
        let (k, body) = (data[0], Bytes::copy_from_slice(&data[1..]));
        match decode_message(k, &body) {
            Ok(PeerMessage::Append(_) | PeerMessage::Vote(_) | PeerMessage::Snapshot(_)) => {}
            Err(e) => panic!("seed {} does not decode: {e}", f.display()),
        }
        let mut rng = Rng(0x5eed ^ n as u64);
        for _ in 0..per_seed {
            let m = mutate(&mut rng, &data[1..]);
            let kind = if rng.below(20) == 0 {
                rng.next() as u8
            } else {
                k
            };
            match decode_message(kind, &Bytes::from(m)) {
                Ok(_) => accepted += 1,
                Err(e) => {
                    assert!(e.to_string().contains("consensus message"), "{e}");
                    rejected += 1
                }
            }
        }
    }
    eprintln!(
        "peer decoder: {} seeds, {} mutations ({accepted} decoded, {rejected} rejected), 0 panics, {:.2?}",
        files.len(),
        accepted + rejected,
        t0.elapsed()
    );
    assert!(
        rejected > 0 && accepted > 0,
        "the mutations reach both outcomes"
    );
}

/// A message claiming a huge batch is refused from its length prefix,
/// before anything of that size is allocated.
#[test]
fn huge_length_prefixes_are_errors_not_allocations() {
    let (_, k, body) = seeds().remove(0);
    // bincode writes the batch as its variant index (Command::Batch is
    // the fourth: 3 as a u32) then its element count (2 as a u64): make
    // that count enormous.
    let needle: Vec<u8> = 3u32
        .to_le_bytes()
        .into_iter()
        .chain(2u64.to_le_bytes())
        .collect();
    let at = body
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .expect("the batch in the seed")
        + 4;
    let mut bad = body.clone();
    bad[at..at + 8].copy_from_slice(&(u64::MAX / 4).to_le_bytes());
    let e = decode_message(k, &Bytes::from(bad)).err().expect("refused");
    assert!(e.to_string().contains("bad consensus message"), "{e}");
}
