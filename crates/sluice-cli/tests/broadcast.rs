//! Broadcast of large objects (issue #21) across real node processes: a
//! topology-ordered chain, repair around a receiver that cannot be
//! reached, checksum failures reported, and a live model swap in an `onnx`
//! lambda on every node, the model read from the copy broadcast to it.

mod common;
use common::free_base;

use serde_json::{json, Value};
use sluice_client::{BlockingClient, PoolSpec, PoolType};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const FILTER: &[u8] = include_bytes!("../../../demo/filter.onnx");
const CLASSIFIER: &[u8] = include_bytes!("../../../demo/classifier.onnx");
const IMAGES: &[u8] = include_bytes!("../../../demo/images.f32");

struct Nodes(Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(x) = f() {
            return x;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `sluice broadcast` through node `via`: (exit success, report).
fn broadcast(addr: &str, args: &[&str]) -> (bool, Value) {
    let o = Command::new(BIN)
        .args(["--json", "--addr", addr, "broadcast"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let report = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&o.stderr)));
    (o.status.success(), report)
}

fn outcome(r: &Value, node: u32) -> Option<String> {
    r["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["node"] == node)
        .map(|o| o["error"].as_str().unwrap_or("ok").to_string())
}

/// Nodes 0-3 (racks a, b, a, b); the volatile shard on `members` (TOML).
fn start(dir: &Path, base: u16, members: &str) -> Nodes {
    // Racks interleaved by id, so an order by id would cross them often.
    let racks = ["a", "b", "a", "b"];
    let mut layout = String::from("version = 1\n");
    for (i, r) in racks.iter().enumerate() {
        layout.push_str(&format!(
            "[[nodes]]\nid = {i}\naddress = \"127.0.0.1:{}\"\nlabels = {{ rack = \"{r}\" }}\n",
            base + i as u16
        ));
    }
    // Trigger pools on every node.
    layout.push_str(&format!(
        "[[subgroups.volatile]]\nshards = [{members}]\n[[subgroups.trigger]]\nshards = [[0, 1, 2, 3]]\n"
    ));
    std::fs::write(dir.join("layout.toml"), layout).unwrap();
    let mut procs = Vec::new();
    for i in 0..4 {
        let cfg = dir.join(format!("node-{i}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[cluster]\nfault_injection = true\nvolatile_dir = \"{}\"\n",
                dir.join(format!("node-{i}/raft-volatile")).display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join(format!("node-{i}.log"))).unwrap();
        procs.push(
            Command::new(BIN)
                .args(["serve", "--config"])
                .arg(&cfg)
                .arg("--cluster")
                .arg(dir.join("layout.toml"))
                .args(["--node-id", &i.to_string(), "--data-dir"])
                .arg(dir.join(format!("node-{i}")))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }
    Nodes(procs)
}

/// The volatile pool `/m` the tests keep their objects in.
fn create_models_pool(c: &BlockingClient) {
    wait_for("the models pool", || {
        c.create_pool(PoolSpec {
            pathname: "/m".into(),
            pool_type: Some(PoolType::Volatile),
            ..Default::default()
        })
        .ok()
    });
}

#[test]
fn broadcast_orders_repairs_checks_and_swaps_a_live_model() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base(4);
    // The models live on node 0 alone.
    let _nodes = start(dir.path(), base, "[0]");
    let addr = |i: u16| format!("127.0.0.1:{}", base + i);
    let seeds = (0..4).map(addr).collect::<Vec<_>>().join(",");
    let c = wait_for("the cluster", || BlockingClient::connect(&seeds).ok());
    create_models_pool(&c);
    // 3 MB, not all alike, sent in 256 KiB chunks along one chain.
    let big: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    wait_for("the put", || c.put("/m/blob", big.clone()).ok());
    let (ok, r) = broadcast(&addr(0), &["/m/blob", "--to", "1,2,3", "--chunk-kb", "256"]);
    assert!(ok, "{r}");
    assert_eq!(r["ok"], 3, "{r}");
    // From node 0 (rack a): node 2 (a) first, then rack b; one crossing.
    assert_eq!(r["order"], json!([2, 1, 3]), "{r}");
    assert_eq!(
        (r["crossings"].clone(), r["crossings_optimum"].clone()),
        (json!(1), json!(1))
    );
    for n in 1..4 {
        let st = c
            .cluster_command(json!({"op": "broadcast_status"}), Some(n))
            .unwrap();
        assert_eq!(st["received"][0]["key"], "/m/blob", "{st}");
        assert_eq!(st["received"][0]["bytes"], 3_000_000, "{st}");
    }

    // Node 2 cannot reach node 1: the chain goes on to node 3 without it.
    c.cluster_command(json!({"op": "cut", "peers": [1]}), Some(2))
        .unwrap();
    let (ok, r) = broadcast(&addr(0), &["/m/blob", "--to", "1,2,3", "--chunk-kb", "256"]);
    assert!(!ok, "a receiver missed it: the command fails");
    assert!(outcome(&r, 1).unwrap().contains("unreachable"), "{r}");
    assert_eq!(outcome(&r, 2).unwrap(), "ok", "{r}");
    assert_eq!(outcome(&r, 3).unwrap(), "ok", "{r}");
    c.cluster_command(json!({"op": "heal"}), Some(2)).unwrap();

    // Node 2 corrupts what it passes on: nodes 1 and 3 refuse the object.
    c.cluster_command(json!({"op": "corrupt_chunks", "on": true}), Some(2))
        .unwrap();
    let (ok, r) = broadcast(&addr(0), &["/m/blob", "--to", "1,2,3", "--chunk-kb", "256"]);
    assert!(!ok);
    assert_eq!(outcome(&r, 2).unwrap(), "ok", "{r}");
    for n in [1, 3] {
        assert!(outcome(&r, n).unwrap().contains("checksum"), "{r}");
    }
    c.cluster_command(json!({"op": "corrupt_chunks", "on": false}), Some(2))
        .unwrap();

    // A live model swap: onnx on every node reads /m/model, which only
    // node 0 holds; each new version is broadcast, and every node's lambda
    // switches to it.
    wait_for("model v1", || c.put("/m/model", FILTER.to_vec()).ok());
    let (ok, r) = broadcast(&addr(0), &["/m/model"]);
    assert!(ok, "{r}");
    let dfg = json!([{"id": "serve", "graph": [{"pathname": "/trig/img",
        "user_defined_logic_list": ["onnx"],
        "user_defined_logic_config_list": [{"model_key": "/m/model", "input_shape": [1, 64]}],
        "user_defined_logic_hook_list": ["trigger"],
        "destinations": [{"/vol/out": "put"}]}]}]);
    wait_for("the graph", || c.dfg_apply(&dfg.to_string()).ok());
    wait_for("the graph on every node", || {
        let n = c.dfg_list_nodes().ok()?;
        n.iter()
            .all(|(_, l)| l.as_ref().is_ok_and(|l| l[0]["state"] == "running"))
            .then_some(())
    });
    let img = |i: usize| IMAGES[i * 256..(i + 1) * 256].to_vec();
    // The output sizes of one trigger put per node and image: 4 bytes from
    // the filter model, 40 from the classifier.
    let run_all = |round: &str| -> Vec<usize> {
        // Straight to each node, so every node's lambda runs.
        for n in 0..4u16 {
            let one = BlockingClient::connect(&addr(n)).unwrap();
            for k in 0..2 {
                let key = format!("/trig/img/{round}-{n}-{k}");
                wait_for("a trigger put", || one.trigger_put(&key, img(k)).ok());
            }
        }
        let mut sizes = Vec::new();
        for n in 0..4u16 {
            for k in 0..2 {
                let key = format!("/vol/out/{round}-{n}-{k}");
                sizes.push(wait_for(&key, || c.get(&key).ok()).value.len());
            }
        }
        sizes
    };
    assert_eq!(run_all("v1"), vec![4; 8]);
    wait_for("model v2", || c.put("/m/model", CLASSIFIER.to_vec()).ok());
    let (ok, r) = broadcast(&addr(0), &["/m/model", "--fanout", "2"]);
    assert!(ok, "{r}");
    // Each lambda checks a model held elsewhere at most once a second.
    let t0 = Instant::now();
    let mut round = 0;
    loop {
        round += 1;
        if run_all(&format!("v2-{round}")) == vec![40; 8] {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the new model never ran everywhere"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // A receiver killed: the chain repairs around it. The receivers are
    // named by shard and by vertex too.
    let mut nodes = _nodes;
    let _ = nodes.0[1].kill();
    let _ = nodes.0[1].wait();
    let (ok, r) = broadcast(&addr(0), &["/m/model", "--to", "1,2,3"]);
    assert!(!ok);
    assert!(outcome(&r, 1).unwrap().contains("unreachable"), "{r}");
    assert_eq!(outcome(&r, 2).unwrap(), "ok", "{r}");
    assert_eq!(outcome(&r, 3).unwrap(), "ok", "{r}");
    let (_, r) = broadcast(&addr(0), &["/m/model", "--to-shard", "trigger/0/0"]);
    assert_eq!(
        r["order"],
        json!([2, 1, 3]),
        "every member but the sender: {r}"
    );
    let (_, r) = broadcast(&addr(0), &["/m/model", "--to-vertex", "/trig/img"]);
    assert_eq!(
        r["order"],
        json!([2, 3]),
        "the live nodes running the vertex: {r}"
    );
}

/// A broadcast sends the latest version its shard committed, whichever
/// node it is asked of. A follower cut off from its leader holds an older
/// copy of a key written since: it used to broadcast that copy, and the
/// receiver kept it as the latest (a key just written could also be
/// missing on a follower that had not applied it yet: `NotFound`). Now it
/// reads through the leader, and refuses while it cannot reach it.
#[test]
fn a_broadcast_never_sends_a_members_stale_copy() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base(4);
    let _nodes = start(dir.path(), base, "[0, 1, 2]");
    let addr = |i: u32| format!("127.0.0.1:{}", base as u32 + i);
    let seeds = (0..4).map(addr).collect::<Vec<_>>().join(",");
    let c = wait_for("the cluster", || BlockingClient::connect(&seeds).ok());
    create_models_pool(&c);
    wait_for("the first put", || c.put("/m/k", vec![1u8; 100]).ok());
    let leader = wait_for("the shard's leader", || {
        let st = c.cluster_command(json!({"op": "status"}), Some(0)).ok()?;
        st["groups"]
            .as_array()?
            .iter()
            .find(|g| g["group"] == "volatile/0/0")?["leader"]
            .as_u64()
    }) as u32;
    let f = (0..3).find(|n| *n != leader).unwrap();
    let version_at = |n: u32| {
        c.cluster_command(json!({"op": "version_of", "key": "/m/k"}), Some(n))
            .ok()
            .and_then(|v| v["version"].as_u64())
    };
    wait_for("the follower's copy", || {
        (version_at(f) == Some(1)).then_some(())
    });
    // Cut off from its leader, the follower misses the second version.
    c.cluster_command(json!({"op": "cut", "peers": [leader]}), Some(f))
        .unwrap();
    wait_for("the second put", || c.put("/m/k", vec![2u8; 200]).ok());
    assert_eq!(version_at(f), Some(1), "the follower's copy is behind");
    let received = |n: u32| {
        let st = c
            .cluster_command(json!({"op": "broadcast_status"}), Some(n))
            .unwrap();
        st["received"]
            .as_array()
            .and_then(|r| r.iter().find(|o| o["key"] == "/m/k"))
            .map(|o| o["bytes"].as_u64().unwrap())
    };
    let run = || {
        Command::new(BIN)
            .args([
                "--json",
                "--addr",
                &addr(f),
                "broadcast",
                "/m/k",
                "--to",
                "3",
            ])
            .output()
            .unwrap()
    };
    let o = run();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.success() {
        assert_eq!(
            received(3),
            Some(200),
            "the latest version, not the copy: {said}"
        );
    } else {
        assert_eq!(received(3), None, "nothing stale was sent: {said}");
    }
    // Healed, the same request sends the latest version.
    c.cluster_command(json!({"op": "heal"}), Some(f)).unwrap();
    let r = wait_for("a broadcast through the follower", || {
        let o = run();
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).to_string())
    });
    assert_eq!(received(3), Some(200), "{r}");
}
