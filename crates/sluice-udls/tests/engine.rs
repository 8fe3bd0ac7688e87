//! The compute engine in-process: a store, the engine, and lambdas.

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{json, Value};
use sluice_compute::engine::{Engine, EngineConfig, Membership};
use sluice_compute::udl::{Context, Emitter, Registry, Udl, UdlError, Upcall};
use sluice_store::{Layout, ShardId, Store, StoreConfig};
use sluice_types::{PoolSpec, PoolType, SluiceError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn store() -> Arc<Store> {
    let s = Store::open(StoreConfig {
        layout: Layout {
            version: 1,
            volatile: vec![2],
            trigger: vec![1],
            persistent: vec![],
        },
        ..Default::default()
    })
    .unwrap();
    for (p, t) in [
        ("/in", PoolType::Trigger),
        ("/mid", PoolType::Trigger),
        ("/out", PoolType::Volatile),
        ("/models", PoolType::Volatile),
    ] {
        s.create_pool(&PoolSpec {
            pathname: p.into(),
            pool_type: Some(t),
            ..Default::default()
        })
        .unwrap();
    }
    Arc::new(s)
}

fn engine_with(
    s: &Arc<Store>,
    reg: Registry,
    workers: usize,
    queue: usize,
    membership: Option<Arc<dyn Membership>>,
) -> Arc<Engine> {
    Engine::start(
        s,
        reg,
        EngineConfig {
            node_id: 0,
            workers,
            queue_len: queue,
            persist_path: None,
        },
        None,
        membership,
    )
}

/// Waits (bounded) for a condition; never a blind sleep.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn count(s: &Store, pool: &str) -> usize {
    s.list_keys(pool, None, None).map(|k| k.len()).unwrap_or(0)
}

/// Records (key, value, worker) of every call.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(String, String, usize)>>,
}

impl Udl for Recorder {
    fn handle(&self, call: &Upcall<'_>, _: &mut Emitter<'_>, _: &Context) -> Result<(), UdlError> {
        let v = String::from_utf8_lossy(&call.object.value).into_owned();
        if v == "boom" {
            panic!("asked to explode");
        }
        if v == "fail" {
            return Err(UdlError::Failed("asked to fail".into()));
        }
        self.calls
            .lock()
            .push((call.key.to_string(), v, call.worker_id));
        Ok(())
    }
}

fn registry_with(rec: &Arc<Recorder>) -> Registry {
    let mut r = sluice_udls::registry();
    let rec = rec.clone();
    r.register("record", move |_: &Value, _: &Context| {
        Ok(rec.clone() as Arc<dyn Udl>)
    });
    r
}

fn graph(id: &str, vertices: Value) -> String {
    json!([{ "id": id, "graph": vertices }]).to_string()
}

#[test]
fn relay_chain_short_circuits_without_copying() {
    let s = store();
    let e = engine_with(&s, sluice_udls::registry(), 2, 64, None);
    e.apply(&graph("chain", json!([
        { "pathname": "/in", "user_defined_logic_list": ["relay"], "destinations": [{ "/mid": "trigger_put" }] },
        { "pathname": "/mid", "user_defined_logic_list": ["relay"], "destinations": [{ "/out": "put" }] }
    ])))
    .unwrap();
    // From 64 KiB a stored value is kept as it came (a smaller one is
    // copied once, into the store: `owned_if_small`).
    let value = Bytes::from(vec![7u8; sluice_store::OWN_COPY_BELOW]);
    s.trigger_put("/in/a/b", value.clone(), None).unwrap();
    wait_for("the relayed object", || {
        s.get("/out/a/b", None, None).is_ok()
    });
    let out = s.get("/out/a/b", None, None).unwrap();
    assert_eq!(out.value, value);
    assert_eq!(
        out.value.as_ptr(),
        value.as_ptr(),
        "the bytes travelled through two stages uncopied"
    );
    let st = e.stats();
    assert_eq!(st["upcalls"], 2);
    assert!(st["dispatch_overhead_us"]["count"].as_u64().unwrap() >= 2);
}

#[test]
fn stateful_policy_keeps_fifo_order_per_key_under_load() {
    let s = store();
    let rec = Arc::new(Recorder::default());
    let e = engine_with(&s, registry_with(&rec), 4, 100_000, None);
    e.apply(&graph(
        "fifo",
        json!([{ "pathname": "/in", "user_defined_logic_list": ["record"],
        "user_defined_logic_stateful_list": ["stateful"] }]),
    ))
    .unwrap();
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..500u32 {
                    let key = format!("/in/k{}", (t * 3 + i) % 10);
                    // Each writer owns its own sequence per key: t*1_000_000 + i.
                    s.trigger_put(&key, Bytes::from(format!("{t}:{i}")), None)
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    wait_for("2000 upcalls", || rec.calls.lock().len() == 2000);
    let calls = rec.calls.lock();
    let mut per_key_worker: HashMap<&str, usize> = HashMap::new();
    let mut last: HashMap<(&str, &str), u32> = HashMap::new();
    for (k, v, w) in calls.iter() {
        assert_eq!(
            *per_key_worker.entry(k).or_insert(*w),
            *w,
            "key {k} moved between workers"
        );
        let (t, i) = v.split_once(':').unwrap();
        let i: u32 = i.parse().unwrap();
        if let Some(prev) = last.insert((k, t), i) {
            assert!(i > prev, "key {k}: writer {t}'s {i} ran after {prev}");
        }
    }
}

#[test]
fn stateless_spreads_and_singlethreaded_serializes() {
    let s = store();
    let rec = Arc::new(Recorder::default());
    let e = engine_with(&s, registry_with(&rec), 3, 10_000, None);
    e.apply(&graph(
        "rr",
        json!([{ "pathname": "/in/rr", "user_defined_logic_list": ["record"] }]),
    ))
    .unwrap();
    for i in 0..30 {
        s.trigger_put(&format!("/in/rr/{i}"), Bytes::from("x"), None)
            .unwrap();
    }
    wait_for("30 upcalls", || rec.calls.lock().len() == 30);
    let mut workers: Vec<usize> = rec.calls.lock().iter().map(|c| c.2).collect();
    workers.sort_unstable();
    workers.dedup();
    assert_eq!(workers, vec![0, 1, 2], "round-robin uses every worker");
    rec.calls.lock().clear();
    e.apply(&graph(
        "rr",
        json!([{ "pathname": "/in/st", "user_defined_logic_list": ["record"],
        "user_defined_logic_stateful_list": ["singlethreaded"] }]),
    ))
    .unwrap();
    for i in 0..200 {
        s.trigger_put(
            &format!("/in/st/{}", i % 7),
            Bytes::from(i.to_string()),
            None,
        )
        .unwrap();
    }
    wait_for("200 upcalls", || rec.calls.lock().len() == 200);
    let calls = rec.calls.lock();
    assert!(calls.iter().all(|c| c.2 == 0));
    let order: Vec<u32> = calls.iter().map(|c| c.1.parse().unwrap()).collect();
    assert_eq!(
        order,
        (0..200).collect::<Vec<_>>(),
        "one worker, delivery order"
    );
}

#[test]
fn hooks_select_trigger_or_ordered_puts() {
    let s = store();
    let rec = Arc::new(Recorder::default());
    let e = engine_with(&s, registry_with(&rec), 1, 64, None);
    e.apply(&graph("hooks", json!([
        { "pathname": "/out/t", "user_defined_logic_list": ["record"], "user_defined_logic_hook_list": ["trigger"] },
        { "pathname": "/out/o", "user_defined_logic_list": ["record"], "user_defined_logic_hook_list": ["ordered"] },
        { "pathname": "/out/b", "user_defined_logic_list": ["record"], "user_defined_logic_hook_list": ["both"] }
    ])))
    .unwrap();
    for p in ["/out/t", "/out/o", "/out/b"] {
        s.put(&format!("{p}/put"), Bytes::from("p"), None, None)
            .unwrap();
        s.trigger_put(&format!("{p}/trig"), Bytes::from("t"), None)
            .unwrap();
    }
    s.remove("/out/b/put", None, None).unwrap();
    wait_for("4 upcalls", || rec.calls.lock().len() >= 4);
    let mut keys: Vec<String> = rec.calls.lock().iter().map(|c| c.0.clone()).collect();
    keys.sort();
    assert_eq!(
        keys,
        vec!["/out/b/put", "/out/b/trig", "/out/o/put", "/out/t/trig"],
        "removes fire nothing"
    );
}

/// Counts the trigger puts announced to it.
#[derive(Default)]
struct Expecting {
    expected: std::sync::atomic::AtomicUsize,
}

impl Udl for Expecting {
    fn handle(&self, _: &Upcall<'_>, _: &mut Emitter<'_>, _: &Context) -> Result<(), UdlError> {
        Ok(())
    }
    fn expect(&self) {
        self.expected
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    /// Lends a buffer of its own (given back by freeing it).
    fn landing(
        &self,
        frame_len: usize,
        _value_at: usize,
    ) -> Option<sluice_compute::landing::Landing> {
        let mut mem = std::mem::ManuallyDrop::new(vec![0u8; frame_len]);
        let ptr = std::ptr::NonNull::new(mem.as_mut_ptr()).unwrap();
        let (addr, cap) = (ptr.as_ptr() as usize, mem.capacity());
        // SAFETY: the vector's memory is this landing's alone, and freed
        // only by its release (rebuilt from its parts).
        Some(unsafe {
            sluice_compute::landing::Landing::new(ptr, frame_len, move || {
                drop(Vec::from_raw_parts(addr as *mut u8, frame_len, cap))
            })
        })
    }
}

#[test]
fn an_arriving_trigger_put_is_announced_to_the_lambdas_it_will_fire() {
    let s = store();
    let mut reg = sluice_udls::registry();
    let mut made = Vec::new();
    for name in ["t", "o", "b"] {
        let udl = Arc::new(Expecting::default());
        made.push(udl.clone());
        reg.register(&format!("expect-{name}"), move |_: &Value, _: &Context| {
            Ok(udl.clone() as Arc<dyn Udl>)
        });
    }
    let e = engine_with(&s, reg, 1, 64, None);
    e.apply(&graph("expect", json!([
        { "pathname": "/out/t", "user_defined_logic_list": ["expect-t"], "user_defined_logic_hook_list": ["trigger"] },
        { "pathname": "/out/o", "user_defined_logic_list": ["expect-o"], "user_defined_logic_hook_list": ["ordered"] },
        { "pathname": "/out/b", "user_defined_logic_list": ["expect-b"], "user_defined_logic_hook_list": ["both"] }
    ])))
    .unwrap();
    // The first lambda to fire lends memory for the frame, where the
    // sender may trigger the key; an ordered-only vertex is not fired.
    let lent = e.expect("/out/t/frame", 100, 10, true).expect("lent");
    assert_eq!(lent.capacity(), 100);
    assert!(e.expect("/out/o/frame", 100, 10, true).is_none());
    assert!(
        e.expect("/out/b/frame", 100, 10, false).is_none(),
        "the sender may not trigger it"
    );
    assert!(e.expect("/elsewhere/frame", 100, 10, true).is_none());
    let counts: Vec<usize> = made
        .iter()
        .map(|u| u.expected.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    assert_eq!(
        counts,
        vec![1, 0, 1],
        "trigger and both hooks, not ordered ones"
    );
    let listed: Vec<(String, u64)> = e.list()[0]["status"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["vertex"].as_str().unwrap().to_string(),
                v["expected"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(listed.contains(&("/out/t".into(), 1)), "{listed:?}");
    assert!(listed.contains(&("/out/o".into(), 0)), "{listed:?}");
    let landed: Vec<u64> = e.list()[0]["status"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["landed"].as_u64().unwrap())
        .collect();
    assert_eq!(landed, vec![1, 0, 0], "only the frame that was lent memory");
    // Nothing ran: an announcement is not a call.
    assert_eq!(e.stats()["upcalls"], 0);
}

/// An engine of one worker whose `record` lambda records into `rec`,
/// this member of its shards as `m` says, running the graph `vertices`.
fn recorded_as(
    s: &Arc<Store>,
    rec: &Arc<Recorder>,
    m: Arc<dyn Membership>,
    vertices: serde_json::Value,
) -> Arc<Engine> {
    let e = engine_with(s, registry_with(rec), 1, 1024, Some(m));
    e.apply(&graph("dispatch", vertices)).unwrap();
    e
}

struct SecondOfTwo;
impl Membership for SecondOfTwo {
    fn position(&self, _: ShardId) -> Option<(usize, usize)> {
        Some((1, 2))
    }
}

#[test]
fn shard_dispatcher_one_runs_on_one_member_all_on_every_member() {
    let (s, rec) = (store(), Arc::new(Recorder::default()));
    let _e = recorded_as(
        &s,
        &rec,
        Arc::new(SecondOfTwo),
        json!([
            { "pathname": "/out/one", "user_defined_logic_list": ["record"], "shard_dispatcher_list": ["one"] },
            { "pathname": "/in/one", "user_defined_logic_list": ["record"], "shard_dispatcher_list": ["one"] },
            { "pathname": "/in/all", "user_defined_logic_list": ["record"], "shard_dispatcher_list": ["all"] }
        ]),
    );
    let mut mine = 0;
    for i in 0..100 {
        // A stored put is applied on every member of the shard: `one`
        // runs it on the member its key hashes to (here member 1 of 2).
        let k = format!("/out/one/{i}");
        if sluice_types::fnv1a64(k.as_bytes()) % 2 == 1 {
            mine += 1;
        }
        s.put(&k, Bytes::from("x"), None, None).unwrap();
        // A trigger put reaches only the member it was sent to: it runs there.
        s.trigger_put(&format!("/in/one/{i}"), Bytes::from("x"), None)
            .unwrap();
        s.trigger_put(&format!("/in/all/{i}"), Bytes::from("x"), None)
            .unwrap();
    }
    wait_for("upcalls", || rec.calls.lock().len() == 200 + mine);
    let calls = rec.calls.lock();
    let count = |p: &str| calls.iter().filter(|c| c.0.starts_with(p)).count();
    assert_eq!(count("/in/all/"), 100);
    assert_eq!(count("/in/one/"), 100);
    assert_eq!(count("/out/one/"), mine);
    assert!(
        mine > 20 && mine < 80,
        "member 1 of 2 runs about half: {mine}"
    );
}

/// A member the write's leader counted as down takes no share of the
/// stored puts dispatched to one member (the others split them); trigger
/// puts sent to it, and `all` lambdas, still run there.
struct CountedDown;
impl Membership for CountedDown {
    fn position(&self, _: ShardId) -> Option<(usize, usize)> {
        None
    }
}

#[test]
fn a_member_counted_down_runs_none_of_the_stored_puts_dispatched_to_one() {
    let (s, rec) = (store(), Arc::new(Recorder::default()));
    let _e = recorded_as(
        &s,
        &rec,
        Arc::new(CountedDown),
        json!([
            { "pathname": "/out/one", "user_defined_logic_list": ["record"], "shard_dispatcher_list": ["one"] },
            { "pathname": "/out/all", "user_defined_logic_list": ["record"], "shard_dispatcher_list": ["all"] },
            { "pathname": "/in/one", "user_defined_logic_list": ["record"], "shard_dispatcher_list": ["one"] }
        ]),
    );
    for i in 0..20 {
        s.put(&format!("/out/one/{i}"), Bytes::from("x"), None, None)
            .unwrap();
        s.put(&format!("/out/all/{i}"), Bytes::from("x"), None, None)
            .unwrap();
        s.trigger_put(&format!("/in/one/{i}"), Bytes::from("x"), None)
            .unwrap();
    }
    wait_for("upcalls", || rec.calls.lock().len() == 40);
    let calls = rec.calls.lock();
    let count = |p: &str| calls.iter().filter(|c| c.0.starts_with(p)).count();
    assert_eq!(count("/out/all/"), 20);
    assert_eq!(count("/in/one/"), 20);
    assert_eq!(count("/out/one/"), 0);
}

#[test]
fn invalid_graphs_are_rejected_whole_with_the_json_path() {
    let s = store();
    let e = engine_with(&s, sluice_udls::registry(), 1, 16, None);
    let cases = [
        ("not json", "$", "not valid JSON"),
        (r#"{"x": 1}"#, "$.x", "unknown field of a DFG file"),
        (r#"{"udl_aliases": {}}"#, "$", "graphs"),
        ("[]", "$", "holds no data flow graph: nothing to apply"),
        (r#"[{"graph": []}]"#, "$[0]", "missing \"id\""),
        (
            r#"[{"id": "g", "graph": [{"pathname": "in", "user_defined_logic_list": ["relay"]}]}]"#,
            "$[0].graph[0].pathname",
            "start with '/'",
        ),
        (
            r#"[{"id": "g", "graph": [{"pathname": "/in", "user_defined_logic_list": ["nope"]}]}]"#,
            "$[0].graph[0].user_defined_logic_list[0]",
            "unknown UDL \"nope\"",
        ),
        (
            r#"[{"id": "g", "graph": [{"pathname": "/in", "user_defined_logic_list": ["relay"], "user_defined_logic_hook_list": ["always"]}]}]"#,
            "$[0].graph[0].user_defined_logic_hook_list[0]",
            "unknown hook",
        ),
        (
            r#"[{"id": "g", "graph": [{"pathname": "/in", "user_defined_logic_list": ["relay", "relay"], "user_defined_logic_stateful_list": ["stateless"]}]}]"#,
            "$[0].graph[0].user_defined_logic_stateful_list",
            "has 1 entries but the vertex names 2 UDLs",
        ),
        (
            r#"[{"id": "g", "graph": [{"pathname": "/in", "user_defined_logic_list": ["relay"], "destinations": [{"/out": "post"}]}]}]"#,
            "$[0].graph[0].destinations[0]./out",
            "unknown mode",
        ),
        (
            r#"[{"id": "g", "graph": [{"pathname": "/in", "user_defined_logic_list": ["onnx"], "user_defined_logic_config_list": [{}]}]}]"#,
            "$[0].graph[0].user_defined_logic_config_list[0]",
            "model_key",
        ),
        (
            r#"[{"id": "g", "graph": [{"pathname": "/in", "user_defined_logic_list": ["relay"]}]}, {"id": "g", "graph": []}]"#,
            "$[1].id",
            "duplicate",
        ),
    ];
    for (text, path, why) in cases {
        let err = e.apply(text).unwrap_err();
        assert_eq!(err.path, path, "{text}: {err}");
        assert!(err.reason.contains(why), "{text}: {err}");
    }
    assert_eq!(e.list(), json!([]), "nothing was applied");
    // Cascade UUIDs map through an alias table.
    e.apply(r#"{"udl_aliases": {"48e60f7c-8500-11eb-8755-0242ac110002": "relay"}, "graphs": [{"id": "u", "graph": [{"pathname": "/in", "user_defined_logic_list": ["48e60f7c-8500-11eb-8755-0242ac110002"]}]}]}"#).unwrap();
    assert_eq!(
        e.list()[0]["graph"][0]["user_defined_logic_list"][0],
        "relay"
    );
    e.remove("u").unwrap();
    assert!(matches!(
        e.remove("u"),
        Err(SluiceError::DfgNotFound { .. })
    ));
}

#[test]
fn live_graph_replacement_under_load_loses_and_duplicates_nothing() {
    let s = store();
    let e = engine_with(&s, sluice_udls::registry(), 2, 100_000, None);
    let g = |dest: &str| {
        graph(
            "live",
            json!([{ "pathname": "/in", "user_defined_logic_list": ["relay"], "destinations": [{ dest: "put" }] }]),
        )
    };
    e.apply(&g("/out/a")).unwrap();
    // The writer puts until 500 puts after it saw the new graph applied,
    // so the replacement always happens in the middle of its traffic
    // (a fixed count could all be put before the apply on a fast run).
    let applied = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (s, applied) = (s.clone(), applied.clone());
        std::thread::spawn(move || {
            let mut after = None;
            let mut i = 0;
            while after.is_none_or(|a| i < a + 500) {
                s.trigger_put(&format!("/in/{i}"), Bytes::from(i.to_string()), None)
                    .unwrap();
                i += 1;
                if after.is_none() && i >= 20_000 {
                    // Far ahead of the upcalls: let the apply come first
                    // (within the engine's queue bound).
                    while !applied.load(std::sync::atomic::Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                }
                if after.is_none() && applied.load(std::sync::atomic::Ordering::Acquire) {
                    after = Some(i);
                }
            }
            i
        })
    };
    wait_for("some traffic under the first graph", || {
        count(&s, "/out") > 100
    });
    e.apply(&g("/out/b")).unwrap();
    applied.store(true, std::sync::atomic::Ordering::Release);
    let n = writer.join().unwrap();
    let total = || {
        s.list_keys("/out", Some("/out/a"), None).unwrap().len()
            + s.list_keys("/out", Some("/out/b"), None).unwrap().len()
    };
    wait_for("every upcall", || total() == n);
    let a: std::collections::HashSet<String> = s
        .list_keys("/out", Some("/out/a"), None)
        .unwrap()
        .into_iter()
        .map(|k| k[6..].to_string())
        .collect();
    let b: std::collections::HashSet<String> = s
        .list_keys("/out", Some("/out/b"), None)
        .unwrap()
        .into_iter()
        .map(|k| k[6..].to_string())
        .collect();
    assert!(a.is_disjoint(&b), "no object ran under both graphs");
    assert_eq!(a.len() + b.len(), n);
    assert!(!b.is_empty(), "the new graph took over");
    assert_eq!(e.stats()["upcalls"], n as u64);
}

#[test]
fn panicking_and_failing_udls_are_counted_and_workers_survive() {
    let s = store();
    let rec = Arc::new(Recorder::default());
    let e = engine_with(&s, registry_with(&rec), 1, 64, None);
    e.apply(&graph(
        "p",
        json!([{ "pathname": "/in", "user_defined_logic_list": ["record"] }]),
    ))
    .unwrap();
    s.trigger_put("/in/1", Bytes::from("boom"), None).unwrap();
    s.trigger_put("/in/2", Bytes::from("fail"), None).unwrap();
    s.trigger_put("/in/3", Bytes::from("fine"), None).unwrap();
    wait_for("the healthy call after a panic", || {
        rec.calls.lock().len() == 1
    });
    let st = e.stats();
    assert_eq!(
        (st["panics"].as_u64(), st["failures"].as_u64()),
        (Some(1), Some(1))
    );
    let status = &e.list()[0]["status"][0];
    assert_eq!(status["panics"], 1);
    assert!(status["last_error"]
        .as_str()
        .unwrap()
        .contains("/in/2: asked to fail"));
}

/// Blocks each call until released, to fill the queue.
struct Gate(Mutex<()>);
impl Udl for Gate {
    fn handle(&self, _: &Upcall<'_>, _: &mut Emitter<'_>, _: &Context) -> Result<(), UdlError> {
        let _g = self.0.lock();
        Ok(())
    }
}

#[test]
fn a_full_queue_refuses_trigger_puts_with_a_typed_error() {
    let s = store();
    let gate = Arc::new(Gate(Mutex::new(())));
    let mut reg = sluice_udls::registry();
    let g2 = gate.clone();
    reg.register("gate", move |_: &Value, _: &Context| {
        Ok(g2.clone() as Arc<dyn Udl>)
    });
    let e = engine_with(&s, reg, 1, 2, None);
    e.apply(&graph(
        "q",
        json!([{ "pathname": "/in", "user_defined_logic_list": ["gate"] }]),
    ))
    .unwrap();
    let held = gate.0.lock();
    let mut refused = None;
    for i in 0..10 {
        if let Err(err) = s.trigger_put(&format!("/in/{i}"), Bytes::from("x"), None) {
            refused = Some((i, err));
            break;
        }
    }
    let (i, err) = refused.expect("the bounded queue fills");
    assert!(
        i <= 3,
        "1 running + 2 queued at most before refusing, refused at {i}"
    );
    assert!(
        matches!(&err, SluiceError::Unavailable { reason } if reason.contains("full")),
        "{err}"
    );
    drop(held);
    wait_for("the queue to drain", || {
        e.stats()["upcalls"].as_u64() == Some(i as u64)
    });
    assert_eq!(e.stats()["dropped"], 1);
    s.trigger_put("/in/again", Bytes::from("x"), None).unwrap();
}

const FILTER: &[u8] = include_bytes!("../../../demo/filter.onnx");
const CLASSIFIER: &[u8] = include_bytes!("../../../demo/classifier.onnx");
const IMAGES: &[u8] = include_bytes!("../../../demo/images.f32");

#[test]
fn onnx_runs_models_from_the_store_and_swaps_them_live() {
    let s = store();
    let e = engine_with(&s, sluice_udls::registry(), 2, 100_000, None);
    s.put("/models/m", Bytes::from_static(FILTER), None, None)
        .unwrap();
    e.apply(&graph(
        "onnx",
        json!([{ "pathname": "/in", "user_defined_logic_list": ["onnx"],
        "user_defined_logic_config_list": [{ "model_key": "/models/m", "input_shape": [1, 64] }],
        "destinations": [{ "/out": "put" }] }]),
    ))
    .unwrap();
    let img = |i: usize| Bytes::copy_from_slice(&IMAGES[i * 256..(i + 1) * 256]);
    let n = 400;
    let (half_tx, half_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            for i in 0..n {
                if i == n / 2 {
                    half_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                }
                s.trigger_put(&format!("/in/{i:04}"), img(i % 400), None)
                    .unwrap();
            }
        })
    };
    half_rx.recv().unwrap();
    // The first model has served at least one request; many of the first
    // half may still be queued when the new version lands.
    wait_for("an output of the first model", || count(&s, "/out") >= 1);
    // Live upgrade: a new version of the model key (here a different model,
    // so each output tells which one ran).
    s.put("/models/m", Bytes::from_static(CLASSIFIER), None, None)
        .unwrap();
    go_tx.send(()).unwrap();
    writer.join().unwrap();
    wait_for("every inference", || count(&s, "/out") == n);
    let size = |i: usize| {
        s.get(&format!("/out/{i:04}"), None, None)
            .unwrap()
            .value
            .len()
    };
    let first: Vec<usize> = (0..n / 2).map(size).collect();
    assert!(
        first.iter().all(|&z| z == 4 || z == 40),
        "in-flight inputs ran under one model or the other"
    );
    assert!(
        first.contains(&4),
        "the first model served before the upgrade"
    );
    assert!(
        (n / 2..n).all(|i| size(i) == 40),
        "every input after the upgrade ran on the new model"
    );
    // Probabilities from the classifier sum to 1.
    let o = s.get(&format!("/out/{:04}", n - 1), None, None).unwrap();
    let p: f32 = o
        .value
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .sum();
    assert!((p - 1.0).abs() < 1e-4, "{p}");
    assert_eq!(e.stats()["failures"], 0);
}

#[test]
fn onnx_errors_are_clear_in_apply_logs_and_metrics() {
    let s = store();
    let e = engine_with(&s, sluice_udls::registry(), 1, 64, None);
    s.put(
        "/models/bad",
        Bytes::from_static(b"not a model"),
        None,
        None,
    )
    .unwrap();
    let err = e
        .apply(&graph("bad", json!([{ "pathname": "/in", "user_defined_logic_list": ["onnx"],
            "user_defined_logic_config_list": [{ "model_key": "/models/bad", "input_shape": [1, 64] }] }])))
        .unwrap_err();
    assert!(
        err.reason.contains("/models/bad") && err.reason.contains("not a loadable ONNX model"),
        "{err}"
    );
    // A model that appears broken only later: counted, kept as last_error.
    e.apply(&graph("late", json!([{ "pathname": "/in", "user_defined_logic_list": ["onnx"],
        "user_defined_logic_config_list": [{ "model_key": "/models/late", "input_shape": [1, 64] }] }])))
        .unwrap();
    s.trigger_put("/in/x", Bytes::from(vec![0u8; 256]), None)
        .unwrap();
    wait_for("the failed call", || e.stats()["failures"] == 1);
    s.put("/models/late", Bytes::from_static(b"garbage"), None, None)
        .unwrap();
    s.trigger_put("/in/y", Bytes::from(vec![0u8; 256]), None)
        .unwrap();
    s.trigger_put("/in/z", Bytes::from(vec![0u8; 3]), None)
        .unwrap();
    wait_for("three failures", || e.stats()["failures"] == 3);
    let status = &e.list()[0]["status"][0];
    let last = status["last_error"].as_str().unwrap();
    assert!(
        last.contains("does not match shape") || last.contains("failed to load"),
        "{last}"
    );
}

#[test]
fn onnx_accepts_npy_inputs_and_argmax_mode() {
    let s = store();
    let e = engine_with(&s, sluice_udls::registry(), 1, 64, None);
    s.put("/models/c", Bytes::from_static(CLASSIFIER), None, None)
        .unwrap();
    e.apply(&graph("npy", json!([{ "pathname": "/in", "user_defined_logic_list": ["onnx"],
        "user_defined_logic_config_list": [{ "model_key": "/models/c", "input_format": "npy", "mode": "argmax" }],
        "destinations": [{ "/out": "put" }] }])))
    .unwrap();
    let floats: Vec<f32> = IMAGES[..256]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    s.trigger_put(
        "/in/img",
        Bytes::from(sluice_udls::npy::write_f32(&[1, 64], &floats)),
        None,
    )
    .unwrap();
    wait_for("the label", || s.get("/out/img", None, None).is_ok());
    let label: u32 = String::from_utf8(s.get("/out/img", None, None).unwrap().value.to_vec())
        .unwrap()
        .parse()
        .unwrap();
    assert!(label < 10);
}

/// Issue #14: destinations that lead back to their vertex (within a graph
/// or across installed graphs) are rejected naming the cycle, and so are
/// destinations without a pool; nothing is applied.
#[test]
fn cyclic_graphs_and_destinations_without_a_pool_are_rejected() {
    let s = store();
    let e = engine_with(&s, sluice_udls::registry(), 1, 16, None);
    let err = e
        .apply(&graph(
            "loop",
            json!([
                { "pathname": "/in/a", "user_defined_logic_list": ["relay"], "destinations": [{ "/mid/b": "trigger_put" }] },
                { "pathname": "/mid/b", "user_defined_logic_list": ["relay"], "destinations": [{ "/in/a": "trigger_put" }] }
            ]),
        ))
        .unwrap_err();
    assert!(err.reason.contains("/in/a -> /mid/b -> /in/a"), "{err}");
    // A cycle closed by a second graph, against one already installed.
    e.apply(&graph(
        "first",
        json!([{ "pathname": "/in", "user_defined_logic_list": ["relay"], "destinations": [{ "/mid": "trigger_put" }] }]),
    ))
    .unwrap();
    let err = e
        .apply(&graph(
            "second",
            json!([{ "pathname": "/mid/x", "user_defined_logic_list": ["relay"], "destinations": [{ "/in/y": "trigger_put" }] }]),
        ))
        .unwrap_err();
    assert!(err.reason.contains("cycle"), "{err}");
    // Replacing the first graph by one without the edge makes it acceptable.
    e.apply(&graph(
        "first",
        json!([{ "pathname": "/in", "user_defined_logic_list": ["relay"], "destinations": [{ "/out": "put" }] }]),
    ))
    .unwrap();
    e.apply(&graph(
        "second",
        json!([{ "pathname": "/mid/x", "user_defined_logic_list": ["relay"], "destinations": [{ "/in/y": "trigger_put" }] }]),
    ))
    .unwrap();
    let err = e
        .apply(&graph(
            "nopool",
            json!([{ "pathname": "/out", "user_defined_logic_list": ["relay"], "destinations": [{ "/nowhere/z": "put" }] }]),
        ))
        .unwrap_err();
    assert!(
        err.reason.contains("\"/nowhere/z\"") && err.reason.contains("no object pool"),
        "{err}"
    );
    assert_eq!(e.list().as_array().unwrap().len(), 2);
}

/// Emits to an arbitrary key: the input's key with one more segment under
/// `/in`, which triggers itself again (a cycle no DFG declares).
struct Bouncer;
impl Udl for Bouncer {
    fn handle(
        &self,
        call: &Upcall<'_>,
        out: &mut Emitter<'_>,
        _: &Context,
    ) -> Result<(), UdlError> {
        out.emit_to(
            "/in",
            sluice_compute::udl::DestMode::TriggerPut,
            "b",
            call.object.value.clone(),
        )
    }
}

/// Issue #14: a lambda that emits to keys its own vertex watches is cut
/// after `EMIT_DEPTH_MAX` emits with a counted, named error, instead of
/// spinning a core forever.
#[test]
fn an_emit_cycle_through_arbitrary_keys_stops_at_the_depth_limit() {
    let s = store();
    let mut reg = sluice_udls::registry();
    reg.register("bounce", |_: &Value, _: &Context| {
        Ok(Arc::new(Bouncer) as Arc<dyn Udl>)
    });
    let e = engine_with(&s, reg, 1, 256, None);
    e.apply(&graph(
        "b",
        json!([{ "pathname": "/in", "user_defined_logic_list": ["bounce"] }]),
    ))
    .unwrap();
    s.trigger_put("/in/start", Bytes::from("x"), None).unwrap();
    wait_for("the cycle to be cut", || {
        e.stats()["failures"].as_u64() == Some(1)
    });
    let st = e.list()[0]["status"][0].clone();
    assert!(
        st["last_error"]
            .as_str()
            .unwrap()
            .contains("64 lambda emits"),
        "{st}"
    );
    let calls = e.stats()["upcalls"].as_u64().unwrap_or(0);
    assert_eq!(
        calls,
        u64::from(sluice_types::EMIT_DEPTH_MAX) + 1,
        "{}",
        e.stats()
    );
}

/// Issue #17: a cluster node's graphs follow the metadata group's table.
/// `reconcile` builds what changed (taking what `prepare` built on this
/// node), removes what left the table, and keeps a graph it cannot build
/// as failed (with the reason) while the others run.
#[test]
fn reconcile_follows_the_table_and_reports_what_fails_here() {
    let s = store();
    let built = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut reg = sluice_udls::registry();
    let b = built.clone();
    reg.register("counted", move |_: &Value, _: &Context| {
        b.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Arc::new(sluice_udls::Relay) as Arc<dyn Udl>)
    });
    let e = engine_with(&s, reg, 2, 64, None);
    // Prepared here: checked and built once; reconcile takes it as built.
    let p = e
        .prepare(
            &graph(
                "a",
                json!([{ "pathname": "/in", "user_defined_logic_list": ["counted"],
                     "destinations": [{ "/out": "put" }] }]),
            ),
            &Default::default(),
        )
        .unwrap();
    assert_eq!(p.graphs.len(), 1);
    assert_eq!(built.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(e.list(), json!([]), "prepare runs nothing");
    let mut table = std::collections::BTreeMap::from([p.graphs[0].clone()]);
    e.reconcile(&table);
    assert_eq!(
        built.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "not built again"
    );
    s.trigger_put("/in/x", Bytes::from_static(b"1"), None)
        .unwrap();
    wait_for("the relay", || count(&s, "/out") == 1);
    // The same table again changes nothing; another node's graph (not
    // prepared here) is built here.
    e.reconcile(&table);
    assert_eq!(built.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The same file applied again is a new apply (its lambdas rebuilt, as
    // new code must be picked up), unless it asks for only what changed.
    let text = graph(
        "a",
        json!([{ "pathname": "/in", "user_defined_logic_list": ["counted"],
                 "destinations": [{ "/out": "put" }] }]),
    );
    let again = e.prepare(&text, &table).unwrap();
    assert_ne!(again.graphs[0], p.graphs[0], "stamped anew");
    let only = e
        .prepare(&sluice_compute::dfg::only_changed(&text).unwrap(), &table)
        .unwrap();
    assert!(
        only.graphs.is_empty() && only.unchanged == ["a"],
        "{only:?}"
    );
    assert_eq!(built.load(std::sync::atomic::Ordering::SeqCst), 2);
    table.insert("a".into(), again.graphs[0].1.clone());
    e.reconcile(&table);
    assert_eq!(
        built.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the staged build taken"
    );
    let other = json!({"id": "b", "desc": "", "graph": [{ "pathname": "/mid",
        "user_defined_logic_list": ["counted"], "user_defined_logic_config_list": [{}],
        "user_defined_logic_stateful_list": ["stateful"], "user_defined_logic_hook_list": ["both"],
        "shard_dispatcher_list": ["one"], "destinations": [{}] }]})
    .to_string();
    table.insert("b".into(), other);
    // A graph this node cannot build: failed here, the others run.
    let bad = json!({"id": "c", "desc": "", "graph": [{ "pathname": "/models",
        "user_defined_logic_list": ["onnx"], "user_defined_logic_config_list": [{}],
        "user_defined_logic_stateful_list": ["stateful"], "user_defined_logic_hook_list": ["both"],
        "shard_dispatcher_list": ["one"], "destinations": [{}] }]})
    .to_string();
    table.insert("c".into(), bad);
    e.reconcile(&table);
    assert_eq!(built.load(std::sync::atomic::Ordering::SeqCst), 3);
    let l = e.list();
    let state = |id: &str| {
        l.as_array()
            .unwrap()
            .iter()
            .find(|g| g["id"] == id)
            .map(|g| (g["state"].clone(), g["error"].clone()))
    };
    assert_eq!(state("a").unwrap().0, "running");
    assert_eq!(state("b").unwrap().0, "running");
    let (st, err) = state("c").unwrap();
    assert_eq!(st, "failed");
    assert!(err.as_str().unwrap().contains("model_key"), "{err}");
    // Graphs that left the table stop.
    table.remove("a");
    table.remove("c");
    e.reconcile(&table);
    let ids: Vec<Value> = e
        .list()
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["id"].clone())
        .collect();
    assert_eq!(ids, vec![json!("b")]);
    s.trigger_put("/in/y", Bytes::from_static(b"2"), None)
        .unwrap();
    // /in/y has no lambda now: the pool /out keeps its one key.
    assert_eq!(count(&s, "/out"), 1);
}

/// Issue #17: without a stateful list a Cascade graph keeps Cascade's
/// default, stateful (FIFO per key), and the listing says so.
#[test]
fn the_stateful_default_is_cascades() {
    let s = store();
    let e = engine_with(&s, sluice_udls::registry(), 2, 64, None);
    e.apply(&graph(
        "d",
        json!([{ "pathname": "/in", "user_defined_logic_list": ["relay"] }]),
    ))
    .unwrap();
    assert_eq!(
        e.list()[0]["graph"][0]["user_defined_logic_stateful_list"],
        json!(["stateful"])
    );
}

/// Records the metadata of every object it is called with.
#[derive(Default)]
struct MetaRecorder {
    seen: Mutex<Vec<(String, sluice_types::ObjectMeta)>>,
}

impl Udl for MetaRecorder {
    fn handle(&self, call: &Upcall<'_>, _: &mut Emitter<'_>, _: &Context) -> Result<(), UdlError> {
        self.seen
            .lock()
            .push((call.key.to_string(), call.object.meta));
        Ok(())
    }
}

/// Issue #17: an emit carries the input's version, timestamp and previous
/// versions to a trigger-put destination, as Cascade's emit does; a put
/// destination stores its own version.
#[test]
fn an_emit_carries_the_inputs_version_and_time_to_trigger_destinations() {
    let s = store();
    let rec = Arc::new(MetaRecorder::default());
    let mut reg = sluice_udls::registry();
    let r = rec.clone();
    reg.register("meta", move |_: &Value, _: &Context| {
        Ok(r.clone() as Arc<dyn Udl>)
    });
    let e = engine_with(&s, reg, 2, 64, None);
    e.apply(&graph(
        "m",
        json!([
            { "pathname": "/out", "user_defined_logic_list": ["relay"],
              "user_defined_logic_hook_list": ["ordered"],
              "destinations": [{ "/mid": "trigger_put" }] },
            { "pathname": "/mid", "user_defined_logic_list": ["meta"] }
        ]),
    ))
    .unwrap();
    s.put("/out/k", Bytes::from_static(b"1"), None, None)
        .unwrap();
    let second = s
        .put("/out/k", Bytes::from_static(b"2"), None, None)
        .unwrap();
    wait_for("both emits", || rec.seen.lock().len() == 2);
    let stored = s.get("/out/k", None, None).unwrap();
    let seen = rec.seen.lock().clone();
    let (key, meta) = seen
        .iter()
        .find(|(_, m)| m.version == second.version)
        .expect("the second put's version reached /mid");
    assert_eq!(key, "/mid/k");
    assert_eq!(meta.timestamp_us, stored.meta.timestamp_us);
    assert_eq!(
        meta.previous_version_by_key,
        stored.meta.previous_version_by_key
    );
    assert_ne!(meta.previous_version_by_key, sluice_types::VERSION_NONE);
}

/// Issue #18: a model cascade. The cheap model answers every input; those
/// it is less sure of than the threshold also go to the bigger model's
/// vertex, whose answer replaces the first under the same key. Exactly the
/// inputs below the threshold escalate (checked against the model's own
/// confidences).
#[test]
fn a_model_cascade_escalates_exactly_the_unsure_inputs() {
    let s = store();
    let e = engine_with(&s, sluice_udls::registry(), 2, 100_000, None);
    s.put("/models/small", Bytes::from_static(CLASSIFIER), None, None)
        .unwrap();
    s.put("/models/big", Bytes::from_static(CLASSIFIER), None, None)
        .unwrap();
    let img = |i: usize| Bytes::copy_from_slice(&IMAGES[i * 256..(i + 1) * 256]);
    let n = 40;
    // The threshold: the median confidence, so about half escalate.
    let plan = sluice_udls::onnx::load_model(CLASSIFIER, &[1, 64]).unwrap();
    let mut conf: Vec<f32> = (0..n)
        .map(|i| {
            let x: Vec<f32> = img(i)
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let out = sluice_udls::onnx::run_model(&plan, &[1, 64], x).unwrap();
            out.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    let mut sorted = conf.clone();
    sorted.sort_by(f32::total_cmp);
    let threshold = sorted[n / 2];
    let unsure = conf.iter().filter(|c| **c < threshold).count();
    assert!(unsure > 0 && unsure < n, "{unsure} of {n}");
    e.apply(&graph(
        "cascade",
        json!([
            { "pathname": "/in", "user_defined_logic_list": ["onnx"],
              "user_defined_logic_config_list": [{ "model_key": "/models/small", "input_shape": [1, 64],
                  "mode": "argmax", "escalate_below": threshold, "escalate_to": "/mid" }],
              "destinations": [{ "/out": "put" }] },
            { "pathname": "/mid", "user_defined_logic_list": ["onnx"],
              "user_defined_logic_config_list": [{ "model_key": "/models/big", "input_shape": [1, 64],
                  "mode": "argmax" }],
              "destinations": [{ "/out": "put" }] }
        ]),
    ))
    .unwrap();
    for i in 0..n {
        s.trigger_put(&format!("/in/{i:03}"), img(i), None).unwrap();
    }
    let calls = |v: &str| -> u64 {
        e.list()[0]["status"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|st| st["vertex"] == v)
            .map(|st| st["calls"].as_u64().unwrap())
            .sum()
    };
    wait_for("every answer", || {
        calls("/in") == n as u64 && calls("/mid") == unsure as u64
    });
    wait_for("every result", || count(&s, "/out") == n);
    // An escalated key holds two answers: the cheap one, then the big one.
    let i = conf.iter().position(|c| *c < threshold).unwrap();
    wait_for("the better answer", || {
        s.get(&format!("/out/{i:03}"), None, None)
            .is_ok_and(|o| o.meta.previous_version_by_key != sluice_types::VERSION_NONE)
    });
    let err = e
        .apply(&graph(
            "half",
            json!([{ "pathname": "/in", "user_defined_logic_list": ["onnx"],
                "user_defined_logic_config_list": [{ "model_key": "/models/small", "input_shape": [1, 64],
                    "escalate_below": 0.5 }] }]),
        ))
        .unwrap_err();
    assert!(err.reason.contains("escalate_to"), "{err}");
    conf.clear();
}
