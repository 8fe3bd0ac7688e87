//! Codec round trips and decoder robustness (the decoder's fuzz target).
//!
//! `fuzz-corpus/` holds seed frames (one file each, regenerated with
//! `cargo test -p sluice-wire -- --ignored regenerate_corpus`); every seed
//! and thousands of mutations of it must decode or fail cleanly, never panic.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use sluice_types::{Hop, ObjectMeta, PoolSpec, PoolType, PutResult, ReqId, SluiceError, Trace};
use sluice_wire::{
    trigger_put_key, DeliveryKindWire, FrameDecoder, FrameError, OutQueue, Request, Response,
    WatchFrom, WireObject, FLAG_PART, HEADER_LEN,
};

const DEC: FrameDecoder = FrameDecoder {
    max_meta: 1 << 20,
    max_value: 1 << 24,
};

fn roundtrip_req(r: &Request, id: u64) -> Request {
    let mut q = OutQueue::new();
    r.encode(&mut q, id, 0);
    let mut buf = BytesMut::from(&q.to_bytes()[..]);
    let f = DEC.decode(&mut buf).unwrap().unwrap();
    assert_eq!(f.request_id, id);
    assert!(buf.is_empty());
    Request::decode(f).unwrap()
}

fn roundtrip_resp(r: &Response) -> Response {
    let mut q = OutQueue::new();
    r.encode(&mut q, 9);
    let mut buf = BytesMut::from(&q.to_bytes()[..]);
    Response::decode(DEC.decode(&mut buf).unwrap().unwrap()).unwrap()
}

fn arb_key() -> impl Strategy<Value = String> {
    "(/[a-z0-9_.ü]{1,8}){1,4}"
}

fn arb_opt_shard() -> impl Strategy<Value = Option<u32>> {
    prop_oneof![Just(None), (0u32..1000).prop_map(Some)]
}

fn arb_meta() -> impl Strategy<Value = ObjectMeta> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(a, b, c, d, t)| ObjectMeta {
            version: a,
            timestamp_us: b,
            previous_version: c,
            previous_version_by_key: d,
            tombstone: t,
        })
}

fn arb_value() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from),
        (4096usize..9000).prop_map(|n| Bytes::from(vec![7u8; n])),
    ]
}

fn arb_trace() -> impl Strategy<Value = Option<Trace>> {
    proptest::option::of(
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(
                (
                    "(/[a-z]{1,5}){1,2}",
                    any::<u64>(),
                    any::<u64>(),
                    any::<u64>(),
                ),
                0..4,
            ),
            0u32..100,
        )
            .prop_map(|(id, sent, hops, emit_depth)| Trace {
                id,
                client_sent_us: sent,
                emit_depth,
                hops: hops
                    .into_iter()
                    .map(|(stage, enqueued_us, started_us, emitted_us)| Hop {
                        stage,
                        enqueued_us,
                        started_us,
                        emitted_us,
                    })
                    .collect(),
            }),
    )
}

fn arb_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (
            any::<u16>(),
            "[a-z]{0,10}",
            proptest::option::of("[a-z0-9_]{0,40}")
        )
            .prop_map(|(v, n, token)| Request::Hello {
                protocol_version: v,
                client_name: n,
                token
            }),
        Just(Request::Ping),
        Just(Request::Stats),
        (
            arb_key(),
            arb_opt_shard(),
            proptest::option::of(any::<u64>()),
            arb_value(),
            arb_trace(),
            proptest::option::of((any::<u64>(), any::<u64>()))
        )
            .prop_map(|(key, shard, expected, value, trace, id)| Request::Put {
                key,
                shard,
                expected,
                value,
                trace,
                req_id: id.map(|(client, seq)| ReqId { client, seq }),
            }),
        (
            arb_key(),
            arb_opt_shard(),
            arb_value(),
            arb_trace(),
            proptest::option::of((any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()))
        )
            .prop_map(|(key, shard, value, trace, origin)| Request::TriggerPut {
                key,
                shard,
                value,
                trace,
                origin: origin.map(|(v, t, p, pk)| sluice_types::ObjectMeta {
                    version: v,
                    timestamp_us: t,
                    previous_version: p,
                    previous_version_by_key: pk,
                    tombstone: false,
                }),
            }),
        (
            arb_key(),
            arb_opt_shard(),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(key, shard, expected)| Request::Remove {
                key,
                shard,
                expected,
                req_id: None,
            }),
        (
            arb_key(),
            arb_opt_shard(),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
            any::<bool>()
        )
            .prop_map(
                |(key, shard, version, min_version, linearizable)| Request::Get {
                    key,
                    shard,
                    version,
                    min_version,
                    linearizable,
                }
            ),
        (any::<u32>(), any::<u64>(), any::<u8>(), arb_value()).prop_map(
            |(from, group, kind, body)| Request::Raft {
                from,
                group,
                kind,
                body,
                more: Vec::new(),
            }
        ),
        ".{0,64}".prop_map(|command| Request::Cluster { command }),
        (".{0,64}", arb_req_id()).prop_map(|(command, req_id)| Request::Policy { command, req_id }),
        (
            arb_key(),
            arb_opt_shard(),
            any::<u64>(),
            any::<u32>(),
            any::<bool>()
        )
            .prop_map(
                |(key, shard, timestamp_us, wait_ms, unstable)| Request::GetByTime {
                    key,
                    shard,
                    timestamp_us,
                    wait_ms,
                    unstable
                }
            ),
        (
            arb_key(),
            arb_opt_shard(),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(key, shard, version, timestamp_us)| Request::GetSize {
                key,
                shard,
                version,
                timestamp_us
            }),
        (
            arb_key(),
            proptest::option::of(arb_key()),
            arb_opt_shard(),
            proptest::option::of(arb_key())
        )
            .prop_map(|(pool, prefix, shard, after)| Request::ListKeys {
                pool,
                prefix,
                shard,
                after
            }),
        (arb_opt_shard(), proptest::collection::vec(arb_key(), 0..8))
            .prop_map(|(shard, keys)| Request::MultiGet { shard, keys }),
        (arb_key(), proptest::option::of("[a-z_]{1,5}"), arb_req_id()).prop_map(
            |(p, re, req_id)| Request::PoolCreate {
                spec: PoolSpec {
                    pathname: p,
                    pool_type: Some(PoolType::Trigger),
                    affinity_set_regex: re,
                    ..Default::default()
                },
                req_id,
            }
        ),
        (arb_key(), arb_req_id()).prop_map(|(path, req_id)| Request::PoolRemove { path, req_id }),
        any::<bool>().prop_map(|include_deleted| Request::PoolList { include_deleted }),
        arb_key().prop_map(|path| Request::PoolGet { path }),
        arb_key().prop_map(|key| Request::PoolOfKey { key }),
        (
            arb_key(),
            proptest::option::of(prop_oneof![
                any::<u64>().prop_map(WatchFrom::Version),
                any::<u64>().prop_map(WatchFrom::Time),
            ])
        )
            .prop_map(|(prefix, from)| Request::Watch { prefix, from }),
        (arb_key(), arb_req_id()).prop_map(|(path, req_id)| Request::PoolPurge { path, req_id }),
        any::<u64>().prop_map(|watch_id| Request::Unwatch { watch_id }),
        Just(Request::DfgList),
        (
            arb_key(),
            arb_opt_shard(),
            any::<bool>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(|(key, shard, by_time, from, to, limit)| Request::History {
                key,
                shard,
                by_time,
                from,
                to,
                limit
            }),
        (
            arb_key(),
            proptest::option::of(arb_key()),
            any::<bool>(),
            any::<u64>(),
            proptest::option::of(arb_key())
        )
            .prop_map(|(pool, prefix, by_time, at, after)| Request::ListKeysAt {
                pool,
                prefix,
                by_time,
                at,
                after
            }),
        "[a-z{}\\[\\]\":]{0,30}".prop_map(|text| Request::DfgApply { text }),
        ("[a-z]{1,8}", arb_req_id()).prop_map(|(id, req_id)| Request::DfgRemove { id, req_id }),
    ]
}

fn arb_req_id() -> impl Strategy<Value = Option<ReqId>> {
    proptest::option::of(
        (any::<u64>(), any::<u64>()).prop_map(|(client, seq)| ReqId { client, seq }),
    )
}

fn arb_object() -> impl Strategy<Value = WireObject> {
    (arb_key(), arb_meta(), arb_value(), arb_trace()).prop_map(|(key, meta, value, trace)| {
        WireObject {
            key,
            meta,
            value,
            trace,
        }
    })
}

fn arb_response() -> impl Strategy<Value = Response> {
    prop_oneof![
        Just(Response::Pong),
        Just(Response::Ok),
        (any::<u64>(), any::<u64>()).prop_map(|(version, timestamp_us)| Response::PutOk(
            PutResult {
                version,
                timestamp_us
            }
        )),
        arb_object().prop_map(Response::Object),
        any::<u64>().prop_map(Response::Size),
        (proptest::collection::vec(arb_key(), 0..6), any::<bool>())
            .prop_map(|(keys, more)| Response::Keys { keys, more }),
        (
            proptest::collection::vec(
                prop_oneof![
                    arb_object().prop_map(Ok),
                    arb_key().prop_map(|key| Err(SluiceError::NotFound { key }))
                ],
                0..6
            ),
            any::<bool>()
        )
            .prop_map(|(items, more)| Response::Objects { items, more }),
        any::<u64>().prop_map(|watch_id| Response::WatchOk { watch_id }),
        (
            arb_object(),
            prop_oneof![
                Just(DeliveryKindWire::Put),
                Just(DeliveryKindWire::TriggerPut),
                Just(DeliveryKindWire::Lagged)
            ]
        )
            .prop_map(|(object, kind)| Response::Notify { kind, object }),
        "[a-z ]{0,20}".prop_map(Response::Stats),
        "[a-z ]{0,20}".prop_map(Response::Json),
        arb_value().prop_map(Response::Raw),
        (any::<u64>(), "[a-z]{1,4}").prop_map(|(m, k)| Response::Error(
            SluiceError::VersionConflict {
                key: k,
                expected: m.to_string(),
                current: "3".into()
            }
        )),
    ]
}

fn encoded(r: &Request) -> Vec<u8> {
    let mut q = OutQueue::new();
    r.encode(&mut q, 7, 0);
    q.to_bytes().to_vec()
}

/// A trigger put's key is known from the frame's first bytes, before its
/// value is in; no other frame gives one.
#[test]
fn a_trigger_puts_key_is_read_from_its_first_bytes() {
    let put = Request::TriggerPut {
        key: "/in/frame-7".into(),
        shard: None,
        value: Bytes::from(vec![9u8; 300_000]),
        trace: None,
        origin: None,
    };
    let frame = encoded(&put);
    let key_end = HEADER_LEN + 4 + "/in/frame-7".len();
    for cut in [key_end, key_end + 1, 4096, frame.len()] {
        assert_eq!(
            trigger_put_key(&frame[..cut]),
            Some("/in/frame-7"),
            "cut at {cut}"
        );
    }
    for cut in [0, 2, HEADER_LEN, HEADER_LEN + 4, key_end - 1] {
        assert_eq!(trigger_put_key(&frame[..cut]), None, "cut at {cut}");
    }
    let plain = Request::Put {
        key: "/in/frame-7".into(),
        shard: None,
        expected: None,
        value: Bytes::from_static(b"v"),
        trace: None,
        req_id: None,
    };
    assert_eq!(trigger_put_key(&encoded(&plain)), None);
    // A value sent in parts: the part frames carry no key.
    let mut part = frame.clone();
    part[3] |= FLAG_PART;
    assert_eq!(trigger_put_key(&part), None);
    // A key length past the metadata: not a key.
    let mut lying = frame.clone();
    lying[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(trigger_put_key(&lying), None);
}

proptest! {
    #[test]
    fn requests_roundtrip(r in arb_request(), id in any::<u64>()) {
        prop_assert_eq!(roundtrip_req(&r, id), r);
    }

    /// Whatever the bytes, reading a trigger put's key never panics, and
    /// a key it gives is the one the whole frame decodes to.
    #[test]
    fn the_early_key_never_panics_and_matches_the_frame(
        r in arb_request(),
        cut in any::<prop::sample::Index>(),
        junk in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let frame = encoded(&r);
        let early = trigger_put_key(&frame[..cut.index(frame.len() + 1)]);
        if let Some(k) = early {
            match &r {
                Request::TriggerPut { key, .. } => prop_assert_eq!(k, key.as_str()),
                other => prop_assert!(false, "a key from {other:?}"),
            }
        }
        let _ = trigger_put_key(&junk);
    }

    #[test]
    fn responses_roundtrip(r in arb_response()) {
        prop_assert_eq!(roundtrip_resp(&r), r);
    }

    /// Frames split at any point decode the same once all bytes arrive.
    #[test]
    fn split_delivery_decodes(reqs in proptest::collection::vec(arb_request(), 1..5), cut in 0usize..400) {
        let mut q = OutQueue::new();
        for (i, r) in reqs.iter().enumerate() {
            r.encode(&mut q, i as u64, 0);
        }
        let all = q.to_bytes();
        let cut = cut.min(all.len());
        let mut buf = BytesMut::from(&all[..cut]);
        let mut got = Vec::new();
        while let Some(f) = DEC.decode(&mut buf).unwrap() { got.push(Request::decode(f).unwrap()); }
        buf.extend_from_slice(&all[cut..]);
        while let Some(f) = DEC.decode(&mut buf).unwrap() { got.push(Request::decode(f).unwrap()); }
        prop_assert_eq!(got, reqs);
    }

    /// Arbitrary bytes never panic the decoder.
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        decode_all(&bytes);
    }

    /// A valid header followed by arbitrary metadata never panics either.
    #[test]
    fn garbage_meta_never_panics(opcode in any::<u8>(), meta in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut b = BytesMut::new();
        sluice_wire_header(&mut b, opcode, meta.len());
        b.extend_from_slice(&meta);
        decode_all(&b);
    }
}

fn sluice_wire_header(b: &mut BytesMut, opcode: u8, meta_len: usize) {
    b.extend_from_slice(&sluice_wire::MAGIC.to_le_bytes());
    b.extend_from_slice(&[opcode, 0]);
    b.extend_from_slice(&(meta_len as u32).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
}

/// Decodes frames and messages until an error or the end; returns how many
/// messages decoded.
fn decode_all(bytes: &[u8]) -> usize {
    let mut buf = BytesMut::from(bytes);
    let mut n = 0;
    while let Ok(Some(f)) = DEC.decode(&mut buf) {
        let f2 = f.clone();
        if Request::decode(f).is_ok() {
            n += 1;
        }
        let _ = Response::decode(f2);
    }
    n
}

#[test]
fn oversized_and_bad_headers_are_typed_errors() {
    let mut b = BytesMut::new();
    b.extend_from_slice(&sluice_wire::MAGIC.to_le_bytes());
    b.extend_from_slice(&[0x03, 0]);
    b.extend_from_slice(&16u32.to_le_bytes());
    b.extend_from_slice(&u32::MAX.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&77u64.to_le_bytes());
    match DEC.decode(&mut b) {
        Err(e @ FrameError::TooLarge { .. }) => {
            assert_eq!(e.request_id(), 77);
            assert!(e.to_string().contains("too large"));
        }
        other => panic!("{other:?}"),
    }
    let mut b = BytesMut::from(&b"GET / HTTP/1.1\r\n\r\n"[..]);
    assert!(matches!(DEC.decode(&mut b), Err(FrameError::BadMagic(_))));
    let mut b = BytesMut::new();
    sluice_wire_header(&mut b, 0x03, 0);
    b[3] = 0x80; // unknown flag
    assert!(matches!(
        DEC.decode(&mut b),
        Err(FrameError::BadHeader { .. })
    ));
    // A frame that is still arriving is not an error.
    let mut b = BytesMut::new();
    sluice_wire_header(&mut b, 0x03, 10);
    assert_eq!(DEC.decode(&mut b), Ok(None));
    assert_eq!(b.len(), HEADER_LEN);
}

#[test]
fn value_bytes_are_not_copied_by_the_decoder() {
    let mut q = OutQueue::new();
    let value = Bytes::from(vec![5u8; 10_000]);
    Request::Put {
        key: "/vol/a".into(),
        shard: Some(0),
        expected: None,
        value: value.clone(),
        trace: None,
        req_id: None,
    }
    .encode(&mut q, 1, 0);
    let wire = q.to_bytes();
    let mut buf = BytesMut::from(&wire[..]);
    let base = buf.as_ptr() as usize;
    let f = DEC.decode(&mut buf).unwrap().unwrap();
    let at = f.value.as_ptr() as usize;
    assert!(
        at > base && at < base + wire.len(),
        "value is a slice of the read buffer"
    );
    let Request::Put { value: v, .. } = Request::decode(f).unwrap() else {
        panic!()
    };
    assert_eq!(v.as_ptr() as usize, at, "decoded value is the same memory");
    assert_eq!(v, value);
}

#[test]
fn a_whole_frame_in_its_own_buffer_decodes_in_place_and_anything_else_is_an_error() {
    let mut q = OutQueue::new();
    let value = Bytes::from(vec![6u8; 300_000]);
    Request::Put {
        key: "/vol/big".into(),
        shard: None,
        expected: None,
        value: value.clone(),
        trace: None,
        req_id: None,
    }
    .encode(&mut q, 7, 0);
    let wire = q.to_bytes();
    let f = DEC.decode_whole(wire.clone()).unwrap();
    assert_eq!(f.request_id, 7);
    let at = f.value.as_ptr() as usize;
    let base = wire.as_ptr() as usize;
    assert!(
        at > base && at < base + wire.len(),
        "the value is a slice of the buffer"
    );
    let Request::Put { value: v, .. } = Request::decode(f).unwrap() else {
        panic!()
    };
    assert_eq!(v, value);
    // Short of the frame, past it, a bad header: typed errors, no panic.
    for bad in [
        wire.slice(..wire.len() - 1),
        Bytes::from([&wire[..], b"x"].concat()),
        wire.slice(..HEADER_LEN - 1),
        Bytes::from_static(b"not a frame at all"),
    ] {
        assert!(DEC.decode_whole(bad).is_err());
    }
}

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-corpus")
}

#[test]
fn corpus_and_its_mutations_never_panic() {
    let mut files: Vec<_> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 10,
        "corpus is missing: {} files",
        files.len()
    );
    let mut decoded = 0;
    let mut rng = 0x2545F4914F6CDD1Du64;
    for f in &files {
        let seed = std::fs::read(f).unwrap();
        decoded += decode_all(&seed);
        for _ in 0..500 {
            let mut m = seed.clone();
            for _ in 0..3 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                if m.is_empty() {
                    break;
                }
                let i = (rng as usize) % m.len();
                match rng % 4 {
                    0 => m[i] = (rng >> 32) as u8,
                    1 => m.truncate(i),
                    2 => m.insert(i, (rng >> 24) as u8),
                    _ => m[i] ^= 0xff,
                }
            }
            decode_all(&m);
        }
    }
    assert!(
        decoded >= files.len() / 2,
        "most seeds are valid frames ({decoded})"
    );
}

#[test]
#[ignore = "writes the seed corpus; run by hand after a protocol change"]
fn regenerate_corpus() {
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let reqs = vec![
        Request::Hello {
            protocol_version: 1,
            client_name: "seed".into(),
            token: None,
        },
        Request::Ping,
        Request::Put {
            key: "/vol/a".into(),
            shard: Some(0),
            expected: Some(3),
            value: Bytes::from_static(b"hello"),
            trace: None,
            req_id: Some(ReqId { client: 1, seq: 2 }),
        },
        Request::TriggerPut {
            key: "/trig/t".into(),
            shard: None,
            value: Bytes::from_static(b"x"),
            trace: Some(Trace {
                id: 9,
                client_sent_us: 1,
                emit_depth: 3,
                hops: vec![Hop {
                    stage: "/a".into(),
                    enqueued_us: 2,
                    started_us: 3,
                    emitted_us: 4,
                }],
            }),
            origin: Some(sluice_types::ObjectMeta {
                version: 7,
                timestamp_us: 8,
                previous_version: 6,
                previous_version_by_key: 5,
                tombstone: false,
            }),
        },
        Request::Remove {
            key: "/vol/a".into(),
            shard: Some(1),
            expected: None,
            req_id: None,
        },
        Request::Get {
            key: "/vol/a".into(),
            shard: Some(0),
            version: Some(2),
            min_version: None,
            linearizable: false,
        },
        Request::GetByTime {
            key: "/vol/a".into(),
            shard: Some(0),
            timestamp_us: 1_700_000_000_000_000,
            wait_ms: 1000,
            unstable: false,
        },
        Request::GetSize {
            key: "/vol/a".into(),
            shard: None,
            version: None,
            timestamp_us: Some(5),
        },
        Request::ListKeys {
            pool: "/vol".into(),
            prefix: Some("/vol/a".into()),
            shard: None,
            after: Some("/vol/a/b".into()),
        },
        Request::MultiGet {
            shard: Some(0),
            keys: vec!["/vol/a".into(), "/vol/b".into()],
        },
        Request::PoolCreate {
            spec: PoolSpec {
                pathname: "/p".into(),
                pool_type: Some(PoolType::Volatile),
                ..Default::default()
            },
            req_id: None,
        },
        Request::PoolList {
            include_deleted: true,
        },
        Request::Watch {
            prefix: "/vol".into(),
            from: Some(WatchFrom::Version(3)),
        },
    ];
    for (i, r) in reqs.iter().enumerate() {
        let mut q = OutQueue::new();
        r.encode(&mut q, i as u64 + 1, 0);
        std::fs::write(dir.join(format!("req-{i:02}.bin")), q.to_bytes()).unwrap();
    }
    let mut q = OutQueue::new();
    Response::Objects {
        items: vec![
            Ok(first_object(Bytes::from_static(b"v"))),
            Err(SluiceError::NotFound {
                key: "/vol/b".into(),
            }),
        ],
        more: false,
    }
    .encode(&mut q, 3);
    std::fs::write(dir.join("resp-objects.bin"), q.to_bytes()).unwrap();
}

/// `/vol/a`'s first version holding `value`.
fn first_object(value: Bytes) -> WireObject {
    WireObject {
        key: "/vol/a".into(),
        meta: ObjectMeta {
            version: 1,
            timestamp_us: 2,
            previous_version: 0,
            previous_version_by_key: u64::MAX,
            tombstone: false,
        },
        value,
        trace: None,
    }
}

#[test]
fn the_servers_reply_queue_sends_values_by_reference() {
    use std::io::IoSlice;
    let value = Bytes::from(vec![3u8; 100]);
    let mut q = OutQueue::zero_copy();
    Response::Object(first_object(value.clone())).encode(&mut q, 1);
    let mut slots = [IoSlice::new(&[]); 8];
    let n = q.io_slices(&mut slots);
    assert_eq!(n, 2, "header+metadata, then the value itself");
    assert_eq!(
        slots[1].as_ptr(),
        value.as_ptr(),
        "the stored bytes go to the socket uncopied"
    );
    // The default (client) queue copies small values next to their header.
    let mut c = OutQueue::new();
    Request::Put {
        key: "/vol/a".into(),
        shard: None,
        expected: None,
        value,
        trace: None,
        req_id: None,
    }
    .encode(&mut c, 1, 0);
    assert_eq!(c.io_slices(&mut slots), 1);
}

/// A consensus message sent in chunks (large values by reference)
/// arrives as one body holding the chunks back to back.
#[test]
fn raft_message_chunks_arrive_as_one_body() {
    let big = Bytes::from(vec![7u8; 100_000]);
    let r = Request::Raft {
        from: 2,
        group: 9,
        kind: 1,
        body: Bytes::from_static(b"head"),
        more: vec![big.clone(), Bytes::from_static(b"tail")],
    };
    match roundtrip_req(&r, 5) {
        Request::Raft {
            from,
            group,
            kind,
            body,
            more,
        } => {
            assert_eq!((from, group, kind), (2, 9, 1));
            assert!(more.is_empty());
            let want = [&b"head"[..], &big[..], &b"tail"[..]].concat();
            assert_eq!(&body[..], &want[..]);
        }
        other => panic!("decoded as {other:?}"),
    }
}
