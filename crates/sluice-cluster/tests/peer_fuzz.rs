//! The peer message decoder against hostile input (issue #14): every seed
//! in `fuzz-corpus/` (first byte the message kind, the rest its body;
//! regenerated with `cargo test -p sluice-cluster --test peer_fuzz --
//! --ignored regenerate_corpus`) decodes, and thousands of mutations of
//! each decode or fail cleanly: never a panic, a huge allocation or a
//! deep recursion. `SLUICE_FUZZ_ITERATIONS` sets the mutations per seed
//! (CI: 3000); a long run reports its figures with `--nocapture`.

use bytes::Bytes;
use raft::eraftpb::{self, EntryType, MessageType};
use sluice_cluster::network::kind;
use sluice_cluster::raftrs::wire::{decode, encode};
use sluice_cluster::raftrs::{Outgoing, RaftMessage};
use sluice_cluster::types::{BatchedWrite, Command};

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-corpus")
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

/// A raft-rs message of `ty` from member 1 to member 2 in term 3.
fn msg(ty: MessageType) -> RaftMessage {
    let mut m = RaftMessage {
        from: 1,
        to: 2,
        term: 3,
        log_term: 2,
        index: 4,
        commit: 6,
        ..Default::default()
    };
    m.set_msg_type(ty);
    m
}

/// An entry of the log (`data`: the driver's marker of a command, 1, or
/// raft-rs's own).
fn entry(index: u64, ty: EntryType, data: Vec<u8>) -> eraftpb::Entry {
    let mut e = eraftpb::Entry {
        term: 3,
        index,
        data,
        ..Default::default()
    };
    e.set_entry_type(ty);
    e
}

/// The seeds: one message of each kind and shape a peer sends, encoded as
/// the transport sends them (`raftrs::wire`).
fn seeds() -> Vec<(String, u8, Vec<u8>)> {
    let mut append = msg(MessageType::MsgAppend);
    append.entries = vec![
        entry(5, EntryType::EntryNormal, vec![]),
        // A membership change: raft-rs's ConfChangeV2, our configuration
        // as its context.
        entry(
            6,
            EntryType::EntryConfChangeV2,
            prost::Message::encode_to_vec(&eraftpb::ConfChangeV2 {
                context: vec![1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
                ..Default::default()
            }),
        ),
    ];
    append
        .entries
        .extend((7..13).map(|i| entry(i, EntryType::EntryNormal, vec![1])));
    let commands = vec![
        write("/vol/a", Some(vec![5; 100]), 10).into(),
        Command::Meta(r#"{"op":"pool_remove","path":"/x"}"#.into()),
        Command::Tick { timestamp_us: 11 },
        Command::Batch(vec![
            write("/p/b", Some(vec![1; 40]), 12),
            write("/p/c", None, 13),
        ]),
        Command::Purge {
            prefix: "/p".into(),
            except: vec!["/p/q".into()],
        },
        Command::Without {
            down: vec![3],
            writes: vec![write("/p/d", Some(vec![2; 30]), 14)],
        },
    ];
    let mut snapshot = msg(MessageType::MsgSnapshot);
    snapshot.snapshot = Some(eraftpb::Snapshot {
        data: vec![1, 2, 3, 4, 5, 6, 7, 8],
        metadata: Some(eraftpb::SnapshotMetadata {
            conf_state: Some(eraftpb::ConfState {
                voters: vec![1, 2, 3],
                ..Default::default()
            }),
            index: 10,
            term: 3,
        }),
    });
    let out = |m: RaftMessage, commands: Vec<Command>| Outgoing {
        group: 1 << 56,
        to: 2,
        msg: m,
        commands,
    };
    [
        ("append", out(append, commands)),
        ("heartbeat", out(msg(MessageType::MsgHeartbeat), vec![])),
        ("vote", out(msg(MessageType::MsgRequestPreVote), vec![])),
        ("snapshot", out(snapshot, vec![])),
    ]
    .into_iter()
    .map(|(name, o)| (name.into(), kind::RAFTRS, encode(&o).unwrap().concat()))
    .collect()
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
        assert_eq!(k, kind::RAFTRS, "seed {}", f.display());
        if let Err(e) = decode(&body) {
            panic!("seed {} does not decode: {e}", f.display());
        }
        let mut rng = Rng(0x5eed ^ n as u64);
        for _ in 0..per_seed {
            let m = mutate(&mut rng, &data[1..]);
            match decode(&Bytes::from(m)) {
                Ok(_) => accepted += 1,
                Err(e) => {
                    assert!(e.to_string().contains("bad raft message"), "{e}");
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
    let (_, _, body) = seeds().remove(0);
    // bincode writes the batch as its variant index (Command::Batch is
    // the fourth: 3 as a u32) then its element count (2 as a u64), after
    // the raft-rs message: make that count enormous.
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
    let e = decode(&Bytes::from(bad)).expect_err("refused");
    assert!(e.to_string().contains("bad raft message"), "{e}");
}
