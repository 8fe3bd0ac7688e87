//! Issue #18 on real node processes: a broker node holding the topics and
//! two edge (recording) nodes. Headers travel through the broker; lazy
//! payloads stay on their recording node and are fetched from it; a
//! payload past its retention is `PayloadExpired` naming the item; a
//! subscriber resumes from a timestamp; a shared queue hands a killed
//! consumer's item to another.

mod common;

use bytes::Bytes;
use common::{start_node, Node, BIN};
use sluice_client::{Client, SluiceError};
use sluice_streams::shared::SharedQueue;
use sluice_streams::topic::{Fetcher, Header, Keep, Producer, Routing, Subscriber};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn next(sub: &mut Subscriber) -> Header {
    tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("a header within 10 s")
        .expect("the watch is open")
        .unwrap()
}

#[test]
fn lazy_payloads_stay_on_their_recording_node_and_eager_ones_travel() {
    let (broker, edge1, edge2) = (start_node(), start_node(), start_node());
    rt().block_on(async {
        let b = Client::connect(&broker.addr).await.unwrap();
        let keep = Keep::default();
        let mut cam = Producer::new(b.clone(), &edge1.addr, "room", "cam", Routing::Lazy, keep)
            .await
            .unwrap();
        let mut mic = Producer::new(b.clone(), &edge2.addr, "room", "mic", Routing::Eager, keep)
            .await
            .unwrap();
        let mut sub = Subscriber::new(&b, "room", None).await.unwrap();
        let frame = |src: &str, i: u64| Bytes::from(format!("{src}-{i}-{}", "x".repeat(4000)));
        for i in 0..5 {
            cam.publish(Some(1_000 + i), frame("cam", i)).await.unwrap();
            mic.publish(Some(1_000 + i), frame("mic", i)).await.unwrap();
        }
        let mut fetcher = Fetcher::default();
        let mut seen = std::collections::BTreeMap::<String, Vec<u64>>::new();
        for _ in 0..10 {
            let h = next(&mut sub).await;
            seen.entry(h.source.clone()).or_default().push(h.seq);
            match h.source.as_str() {
                "cam" => {
                    assert!(!h.is_eager());
                    assert_eq!(h.node.as_deref(), Some(edge1.addr.as_str()));
                }
                _ => assert!(h.is_eager() && h.node.is_none()),
            }
            let p = fetcher.fetch(&h).await.unwrap();
            assert_eq!(p, frame(&h.source, h.seq));
            assert_eq!(h.size, p.len() as u64);
        }
        // Per-source order.
        assert_eq!(seen["cam"], vec![0, 1, 2, 3, 4]);
        assert_eq!(seen["mic"], vec![0, 1, 2, 3, 4]);
        // Only the five lazy payloads moved from a recording node, and
        // the broker holds headers of lazy items, not their payloads.
        assert_eq!(fetcher.fetched, 5);
        let on_broker = b.get("/streams/room/cam").await.unwrap();
        assert!(on_broker.value.len() < 400, "{}", on_broker.value.len());
        let e1 = Client::connect(&edge1.addr).await.unwrap();
        assert_eq!(
            e1.get("/edge/room/cam").await.unwrap().value,
            frame("cam", 4)
        );
        assert!(matches!(
            e1.get("/edge/room/mic").await,
            Err(SluiceError::NotFound { .. })
        ));
        // A producer that restarts goes on with its numbering.
        let mut cam2 = Producer::new(b.clone(), &edge1.addr, "room", "cam", Routing::Lazy, keep)
            .await
            .unwrap();
        assert_eq!(cam2.publish(None, frame("cam", 5)).await.unwrap().seq, 5);
        assert_eq!(next(&mut sub).await.seq, 5);
    });
}

#[test]
fn expired_payloads_are_named_and_subscribers_resume_from_a_time() {
    let (broker, edge) = (start_node(), start_node());
    rt().block_on(async {
        let b = Client::connect(&broker.addr).await.unwrap();
        // Room for about two 1000-byte payloads per source.
        let keep = Keep {
            for_s: 3600,
            bytes: Some(2500),
        };
        let mut p = Producer::new(b.clone(), &edge.addr, "t", "s", Routing::Lazy, keep)
            .await
            .unwrap();
        let mut headers = Vec::new();
        for i in 0..6u8 {
            let ts = 10_000 * (u64::from(i) + 1);
            headers.push(
                p.publish(Some(ts), Bytes::from(vec![i; 1000]))
                    .await
                    .unwrap(),
            );
        }
        let mut fetcher = Fetcher::default();
        assert_eq!(fetcher.fetch(&headers[5]).await.unwrap()[0], 5);
        let e = fetcher.fetch(&headers[0]).await.unwrap_err();
        match &e {
            SluiceError::PayloadExpired {
                topic,
                stream_source,
                seq,
                ts_us,
                ..
            } => assert_eq!(
                (topic.as_str(), stream_source.as_str(), *seq, *ts_us),
                ("t", "s", 0, 10_000)
            ),
            other => panic!("expected PayloadExpired, got {other:?}"),
        }
        assert!(
            e.to_string().contains("payload of stream item t/s #0"),
            "{e}"
        );

        // Resuming from the time the broker wrote the fourth header
        // replays it and what follows, in order, then goes on live.
        let at = b
            .history("/streams/t/s", false, 0, u64::MAX, 100)
            .await
            .unwrap();
        let fourth = at
            .iter()
            .find(|o| Header::decode(&o.value).unwrap().seq == 3)
            .unwrap()
            .meta
            .timestamp_us;
        let mut sub = Subscriber::new(&b, "t", Some(fourth)).await.unwrap();
        for want in 3..6 {
            assert_eq!(next(&mut sub).await.seq, want);
        }
        p.publish(None, Bytes::from_static(b"live")).await.unwrap();
        assert_eq!(next(&mut sub).await.seq, 6);
    });
}

/// A consumer process takes an item and is killed before acknowledging
/// it: once its lease ends another consumer gets it, marked as a second
/// delivery; the other items go out once each.
#[test]
fn a_replaying_subscriber_may_come_before_the_topic_exists() {
    // Nothing published yet: no topic pool, nothing to replay. The
    // subscriber waits for items instead of failing (it said "no object
    // pool covers key /streams/early").
    let (broker, edge) = (start_node(), start_node());
    rt().block_on(async {
        let b = Client::connect(&broker.addr).await.unwrap();
        let mut sub = Subscriber::new(&b, "early", Some(0)).await.unwrap();
        let mut cam = Producer::new(
            b.clone(),
            &edge.addr,
            "early",
            "cam",
            Routing::Eager,
            Keep::default(),
        )
        .await
        .unwrap();
        for i in 0..3 {
            cam.publish(Some(10 + i), Bytes::from(format!("item {i}")))
                .await
                .unwrap();
        }
        for i in 0..3 {
            let h = next(&mut sub).await;
            assert_eq!((h.source.as_str(), h.seq), ("cam", i));
        }
        // Once the topic exists, a replaying subscriber gets what it keeps.
        let mut late = Subscriber::new(&b, "early", Some(0)).await.unwrap();
        assert_eq!(next(&mut late).await.seq, 0);
    });
}

#[test]
fn a_subscriber_whose_broker_dies_gets_an_error_not_an_end() {
    // `next` gave `None`, as for a subscription closed on purpose: a
    // consumer loop ended quietly with its broker gone.
    let (mut broker, edge) = (start_node(), start_node());
    rt().block_on(async {
        let b = Client::connect(&broker.addr).await.unwrap();
        let mut sub = Subscriber::new(&b, "gone", None).await.unwrap();
        let mut cam = Producer::new(
            b.clone(),
            &edge.addr,
            "gone",
            "cam",
            Routing::Eager,
            Keep::default(),
        )
        .await
        .unwrap();
        cam.publish(Some(1), Bytes::from_static(b"one"))
            .await
            .unwrap();
        assert_eq!(next(&mut sub).await.seq, 0);
        broker.child.kill().unwrap();
        broker.child.wait().unwrap();
        let end = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("the subscriber learns of it within 10 s");
        match end {
            Some(Err(SluiceError::Connection { reason })) => {
                assert!(
                    reason.contains("the watch on \"/streams/gone\" ended"),
                    "{reason}"
                )
            }
            other => panic!("expected a connection error, got {other:?}"),
        }
    });
}

#[test]
fn a_killed_consumers_item_is_redelivered_to_another() {
    let n: Node = start_node();
    rt().block_on(async {
        let c = Client::connect(&n.addr).await.unwrap();
        let mut q = SharedQueue::open(c.clone(), "jobs", "pusher", Duration::from_secs(1))
            .await
            .unwrap();
        for i in 0..4 {
            q.push(format!("job-{i}")).await.unwrap();
        }
        let mut dying = Command::new(BIN)
            .args([
                "--addr",
                &n.addr,
                "queue",
                "take",
                "jobs",
                "--consumer",
                "dying",
            ])
            .args(["--lease-ms", "800", "--hold-ms", "600000"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let line = BufReader::new(dying.stdout.take().unwrap())
            .lines()
            .next()
            .unwrap()
            .unwrap();
        let taken: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(taken["value"], "job-0");
        assert_eq!(taken["delivery"], 1);
        dying.kill().unwrap();
        dying.wait().unwrap();

        let mut other = SharedQueue::open(c.clone(), "jobs", "other", Duration::from_secs(5))
            .await
            .unwrap();
        let mut got = Vec::new();
        while got.len() < 4 {
            let d = other
                .take(Duration::from_secs(10), Duration::from_millis(20))
                .await
                .unwrap()
                .expect("an item within 10 s");
            got.push((String::from_utf8(d.value.to_vec()).unwrap(), d.delivery));
            other.ack(&d).await.unwrap();
        }
        got.sort();
        assert_eq!(
            got,
            vec![
                ("job-0".to_string(), 2),
                ("job-1".to_string(), 1),
                ("job-2".to_string(), 1),
                ("job-3".to_string(), 1)
            ]
        );
        assert_eq!(other.redelivered, 1);
        assert_eq!(other.backlog().await.unwrap(), 0);
    });
}

/// Competing consumers: every item goes to exactly one of them.
#[test]
fn competing_consumers_each_item_once() {
    let n = start_node();
    rt().block_on(async {
        let c = Client::connect(&n.addr).await.unwrap();
        let mut q = SharedQueue::open(c.clone(), "work", "p", Duration::from_secs(30))
            .await
            .unwrap();
        for i in 0..40 {
            q.push(format!("{i}")).await.unwrap();
        }
        let mut tasks = Vec::new();
        for w in 0..3 {
            let c = Client::connect(&n.addr).await.unwrap();
            tasks.push(tokio::spawn(async move {
                let mut q = SharedQueue::open(c, "work", &format!("w{w}"), Duration::from_secs(30))
                    .await
                    .unwrap();
                let mut mine = Vec::new();
                while let Some(d) = q.try_take().await.unwrap() {
                    assert_eq!(d.delivery, 1);
                    mine.push(String::from_utf8(d.value.to_vec()).unwrap());
                    q.ack(&d).await.unwrap();
                }
                mine
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let mut sorted: Vec<u32> = all.iter().map(|s| s.parse().unwrap()).collect();
        sorted.sort();
        assert_eq!(sorted, (0..40).collect::<Vec<_>>());
    });
}

/// An item another consumer took since this one listed the backlog costs
/// one read, not a claim written and cleaned up (five requests, two of
/// them writes), and a consumer that finds an item held by another skips
/// ahead in its list instead of trying the next oldest: three consumers
/// drained a backlog no faster than one, the third taking almost nothing,
/// as all went for the same oldest items. A consumer alone still takes
/// the oldest item first.
#[test]
fn consumers_skip_items_taken_meanwhile_with_a_read_and_spread_out() {
    let n = start_node();
    rt().block_on(async {
        let c = Client::connect(&n.addr).await.unwrap();
        let open = |name: &'static str| {
            let c = c.clone();
            async move {
                SharedQueue::open(c, "skip", name, Duration::from_secs(30))
                    .await
                    .unwrap()
            }
        };
        let mut p = open("p").await;
        for i in 0..20 {
            p.push(format!("{i}")).await.unwrap();
        }
        let (mut a, mut b) = (open("w0").await, open("w1").await);
        let first_a = a.try_take().await.unwrap().unwrap();
        assert_eq!(&first_a.value[..], b"0", "the oldest first");
        let first_b = b.try_take().await.unwrap().unwrap();
        assert_eq!(b.missed, 1, "the oldest was held by a");
        assert_ne!(&first_b.value[..], b"1", "b skipped ahead");
        a.ack(&first_a).await.unwrap();
        b.ack(&first_b).await.unwrap();
        // b takes everything else; a's listing is then all stale.
        while let Some(d) = b.try_take().await.unwrap() {
            b.ack(&d).await.unwrap();
        }
        let writes = |s: serde_json::Value| -> u64 {
            s["shards"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["last_version"].as_u64().unwrap_or(0))
                .sum()
        };
        let before = writes(c.stats().await.unwrap());
        assert!(a.try_take().await.unwrap().is_none());
        assert_eq!(
            writes(c.stats().await.unwrap()),
            before,
            "no claim was written for an item already gone"
        );
        assert_eq!(a.missed, 19);
        assert_eq!(a.backlog().await.unwrap(), 0);
    });
}

/// The operators as DFG vertices on a node: `stream_aggregate` emits a
/// complete tuple, then a partial one (a source missing) once a later item
/// closes the window; `stream_rate` ticks on the stream's own clock.
#[test]
fn aggregate_and_rate_vertices_emit_tuples_of_headers() {
    let (broker, edge) = (start_node(), start_node());
    rt().block_on(async {
        let b = Client::connect(&broker.addr).await.unwrap();
        let keep = Keep::default();
        let mut cam = Producer::new(b.clone(), &edge.addr, "room", "cam", Routing::Lazy, keep)
            .await
            .unwrap();
        let mut mic = Producer::new(b.clone(), &edge.addr, "room", "mic", Routing::Eager, keep)
            .await
            .unwrap();
        b.create_pool(sluice_client::PoolSpec {
            pathname: "/out".into(),
            pool_type: Some(sluice_client::PoolType::Volatile),
            ..Default::default()
        })
        .await
        .unwrap();
        let dfg = r#"[
          {"id": "agg", "graph": [{"pathname": "/streams/room",
            "user_defined_logic_list": ["stream_aggregate"],
            "user_defined_logic_config_list": [{"sources": ["cam", "mic"], "max_skew_ms": 50, "fail_soft": "partial"}],
            "destinations": [{"/out/agg": "put"}]}]},
          {"id": "rate", "graph": [{"pathname": "/streams/room",
            "user_defined_logic_list": ["stream_rate"],
            "user_defined_logic_config_list": [{"sources": ["cam", "mic"], "period_ms": 100, "fail_soft": "partial"}],
            "destinations": [{"/out/rate": "put"}]}]}]"#;
        b.dfg_apply(dfg).await.unwrap();
        let mut w = b.watch("/out").await.unwrap();
        for (on_cam, ts) in [
            (true, 1_000),
            (false, 1_010),
            (true, 200_000),
            (false, 400_000),
            (true, 400_020),
        ] {
            let p = if on_cam { &mut cam } else { &mut mic };
            p.publish(Some(ts), Bytes::from(format!("at {ts}"))).await.unwrap();
        }
        let (mut agg, mut rate) = (Vec::new(), Vec::new());
        while agg.len() < 3 || rate.len() < 4 {
            let n = tokio::time::timeout(Duration::from_secs(10), w.next())
                .await
                .expect("tuples within 10 s")
                .unwrap();
            let t = sluice_streams::topic::decode_tuple(&n.object.value).unwrap();
            match &*n.object.key {
                "/out/agg/room" => agg.push(t),
                "/out/rate/room" => rate.push(t),
                k => panic!("unexpected key {k}"),
            }
        }
        let shape = |t: &sluice_streams::Tuple<Header>| -> Vec<Option<u64>> {
            t.slots.iter().map(|s| s.item().map(|i| i.ts)).collect()
        };
        assert_eq!(
            agg.iter().map(|t| (t.ts, shape(t))).collect::<Vec<_>>(),
            vec![
                (1_000, vec![Some(1_000), Some(1_010)]),
                (200_000, vec![Some(200_000), None]),
                (400_000, vec![Some(400_020), Some(400_000)]),
            ]
        );
        assert_eq!(
            rate.iter().map(|t| t.ts).collect::<Vec<_>>(),
            vec![1_000, 101_000, 201_000, 301_000]
        );
        // The tuples carry headers: the lazy one is fetched from the
        // recording node, the eager one came inline.
        let mut f = Fetcher::default();
        let slot = |i: usize| agg[0].slots[i].item().unwrap().value.clone().unwrap();
        assert_eq!(f.fetch(&slot(0)).await.unwrap(), Bytes::from("at 1000"));
        assert!(slot(1).is_eager());
        assert_eq!(f.fetch(&slot(1)).await.unwrap(), Bytes::from("at 1010"));
        // A source named twice took two slots of each tuple: refused.
        let e = b
            .dfg_apply(
                r#"[{"id": "dup", "graph": [{"pathname": "/streams/room",
                "user_defined_logic_list": ["stream_rate"],
                "user_defined_logic_config_list": [{"sources": ["cam", "cam"], "period_ms": 100}],
                "destinations": [{"/out/rate": "put"}]}]}]"#,
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("source \"cam\" twice"), "{e}");
    });
}

/// A graph feeds a shared queue: every object the `shared_queue` vertex
/// gets becomes one item, taken once.
#[test]
fn a_dfg_vertex_feeds_a_shared_queue() {
    let n = start_node();
    rt().block_on(async {
        let c = Client::connect(&n.addr).await.unwrap();
        let mut q = SharedQueue::open(c.clone(), "fed", "w", Duration::from_secs(30))
            .await
            .unwrap();
        c.dfg_apply(
            r#"[{"id": "feed", "graph": [{"pathname": "/trig/jobs",
                "user_defined_logic_list": ["shared_queue"],
                "destinations": [{"/queues/fed/items": "put"}]}]}]"#,
        )
        .await
        .unwrap();
        for i in 0..3 {
            c.trigger_put(&format!("/trig/jobs/{i}"), format!("job-{i}"))
                .await
                .unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 3 {
            let d = q
                .take(Duration::from_secs(10), Duration::from_millis(20))
                .await
                .unwrap()
                .expect("an item within 10 s");
            got.push(String::from_utf8(d.value.to_vec()).unwrap());
            q.ack(&d).await.unwrap();
        }
        got.sort();
        assert_eq!(got, ["job-0", "job-1", "job-2"]);
        assert_eq!(q.try_take().await.unwrap().map(|d| d.id), None);
    });
}

/// A queue whose pool was made persistent first keeps its pushed items
/// (and what was taken and acknowledged stays gone) across a SIGKILL of
/// its node: the README's way to queues that outlive restarts.
#[test]
fn a_queue_on_a_persistent_pool_keeps_its_items_across_a_kill() {
    let n = start_node();
    n.ok(&[
        "pools",
        "create",
        "/queues/durable",
        "--type",
        "persistent",
        "--keep-versions",
        "1",
    ]);
    for v in ["one", "two", "three"] {
        n.ok(&["queue", "push", "durable", v]);
    }
    let first = n.ok(&["--json", "queue", "take", "durable", "--wait-ms", "5000"]);
    assert!(first.contains(r#""value":"one""#), "{first}");
    // SIGKILL (Drop) keeping the data, then a new process on it.
    let dir = n.dir.clone();
    let mut n = n;
    n.dir = dir.join("no-cleanup");
    drop(n);
    let data = dir.join("data");
    let n = common::spawn_node(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
    )
    .unwrap();
    let rest = n.ok(&[
        "--json",
        "queue",
        "take",
        "durable",
        "--count",
        "2",
        "--wait-ms",
        "5000",
    ]);
    let values: Vec<&str> = rest
        .lines()
        .map(|l| {
            l.split(r#""value":""#)
                .nth(1)
                .unwrap()
                .trim_end_matches("\"}")
        })
        .collect();
    assert_eq!(values, ["two", "three"], "{rest}");
    let e = n.fails(&["queue", "take", "durable", "--wait-ms", "200"]);
    assert!(e.contains("no item in queue durable"), "{e}");
}

/// The command line's streams and queues as a user runs them: `stream
/// publish` says in a line what it published and where the payload stays
/// (`--json`: the header), `stream sub --fetch` and `queue take` print
/// JSON lines that keep a binary payload's bytes (hex), never replacing
/// them with U+FFFD.
#[test]
fn the_command_lines_streams_and_queues_keep_every_byte() {
    let (broker, edge) = (start_node(), start_node());
    let local = ["--local", edge.addr.as_str()];
    let line = broker.ok(&[&["stream", "publish", "room", "cam", "frame 1"][..], &local].concat());
    assert_eq!(
        line.trim_end(),
        format!(
            "published room/cam seq 0 at {} µs, 7 bytes, lazy: the payload is /edge/room/cam version 1 on {}",
            line.split(" at ").nth(1).unwrap().split(' ').next().unwrap(),
            edge.addr
        ),
        "{line}"
    );
    let line = broker.ok(&[
        "stream",
        "publish",
        "room",
        "mic",
        "é",
        "--routing",
        "eager",
    ]);
    assert!(
        line.ends_with("2 bytes, eager: the payload travels in the header\n"),
        "{line}"
    );
    let h: serde_json::Value = serde_json::from_str(
        &broker.ok(&[
            &[
                "--json", "stream", "publish", "room", "cam", "-", "--ts-us", "5",
            ][..],
            &local,
        ]
        .concat()),
    )
    .unwrap();
    assert_eq!((h["seq"].as_u64(), h["ts_us"].as_u64()), (Some(1), Some(5)));
    assert_eq!(h["node"], edge.addr.as_str());

    // A binary payload (stdin) and a text one cut in a character.
    let binary = broker.sluice_stdin(
        &[&["stream", "publish", "room", "raw", "-"][..], &local].concat(),
        Some(b"\xff\x00\x01"),
    );
    assert!(binary.status.success());
    let long = "é".repeat(20);
    broker.ok(&[&["stream", "publish", "room", "txt", &long][..], &local].concat());
    let out = broker.ok(&[
        "stream",
        "sub",
        "room",
        "--from-time-us",
        "0",
        "--count",
        "5",
        "--fetch",
    ]);
    let items: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |source: &str| items.iter().find(|j| j["source"] == source).unwrap();
    assert_eq!(of("cam")["head"], "frame 1");
    assert_eq!(of("mic")["head"], "é");
    assert_eq!(of("raw")["head_hex"], "ff0001", "{out}");
    assert_eq!(of("raw")["fetched"], 3);
    assert_eq!(of("txt")["head"], "é".repeat(16), "{out}");

    let pushed = broker.sluice_stdin(&["queue", "push", "jobs", "-"], Some(b"\x80job"));
    assert!(pushed.status.success());
    broker.ok(&["queue", "push", "jobs", "plain"]);
    let out = broker.ok(&["queue", "take", "jobs", "--count", "2", "--wait-ms", "5000"]);
    let taken: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(taken[0]["value_hex"], "806a6f62", "{out}");
    assert_eq!(taken[1]["value"], "plain", "{out}");
}
