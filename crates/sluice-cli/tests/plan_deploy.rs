//! From a plan to a running deployment, unchanged (issue #17): plan the
//! JellyBean fixture and `examples/plan/traffic.toml`, export, start a
//! local cluster from the exported layout (`sluice dev --layout`), deploy
//! with `sluice plan --apply`, put a real ONNX model (Relu) at every model
//! key the plan chose, push `.npy` tensors at the source pools and read
//! the results at the sink. The lambdas run where the layout placed their
//! operators: models are read from the nodes that hold them, and trigger
//! puts between operators go to the operator's nodes.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::free_base;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn run(args: &[&str]) -> (String, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "sluice {args:?} failed:\n{out}\n{err}");
    (out, err)
}

/// A `sluice dev` cluster, stopped (Ctrl-C) when dropped.
struct Dev(Child);

impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: signalling the child process this test started.
        unsafe {
            libc::kill(self.0.id() as libc::pid_t, libc::SIGINT);
        }
        let _ = self.0.wait();
    }
}

fn npy(shape: &[usize], values: &[f32]) -> Vec<u8> {
    sluice_udls::npy::write_f32(shape, values)
}

/// One cluster at a time: each is several processes on a small machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn deploy_and_run(plan_input: &Path, sources: &[&str]) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    // Room for every node the plan may use (node i on base + i).
    let base = free_base(16);
    let (out, _) = run(&[
        "plan",
        plan_input.to_str().unwrap(),
        "--exact-budget-ms",
        "300",
        "--export",
        export.to_str().unwrap(),
        "--base-addr",
        &format!("127.0.0.1:{base}"),
    ]);
    assert!(out.contains("total"), "{out}");
    // What was exported loads as it is.
    let nodes = sluice_types::cluster::ClusterLayout::from_toml(
        &std::fs::read_to_string(export.join("layout.toml")).unwrap(),
    )
    .unwrap()
    .nodes
    .len() as u16;
    assert!(nodes <= 16);
    let mut child = Command::new(BIN)
        .args(["dev", "--layout"])
        .arg(export.join("layout.toml"))
        .arg("--dir")
        .arg(tmp.path().join("dev"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let dev = Dev(child);
    let mut lines = std::io::BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("nodes up") => break,
            Some(Ok(_)) => {}
            _ => panic!("sluice dev ended before its nodes were up"),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let addr = format!("127.0.0.1:{}", base + nodes - 1);
    let (_, err) = run(&[
        "--addr",
        &addr,
        "plan",
        plan_input.to_str().unwrap(),
        "--exact-budget-ms",
        "300",
        "--apply",
    ]);
    assert!(err.contains("applied graph"), "{err}");
    assert!(err.contains("is not stored yet"), "{err}");
    let model = repo("crates/sluice-cli/tests/fixtures/plan/relu.onnx");
    let keys = std::fs::read_to_string(export.join("models.txt")).unwrap();
    let keys: Vec<&str> = keys.lines().filter(|l| l.starts_with('/')).collect();
    assert!(!keys.is_empty());
    for k in &keys {
        run(&["--addr", &addr, "put", k, "--file", model.to_str().unwrap()]);
    }
    // Applying again changes nothing and finds every model.
    let (_, err) = run(&[
        "--addr",
        &addr,
        "plan",
        plan_input.to_str().unwrap(),
        "--exact-budget-ms",
        "300",
        "--apply",
    ]);
    assert!(
        err.contains("exists") && !err.contains("not stored"),
        "{err}"
    );
    let c = sluice_client::BlockingClient::connect(&addr).unwrap();
    let input = npy(&[1, 4], &[-1.0, 2.0, -3.0, 4.0]);
    let want = npy(&[1, 4], &[0.0, 2.0, 0.0, 4.0]);
    for (i, s) in sources.iter().enumerate() {
        c.trigger_put(&format!("/plan/{s}/in{i}"), input.clone())
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..sources.len() {
        let key = format!("/plan/results/in{i}");
        let v = loop {
            match c.get(&key) {
                Ok(o) => break o.value,
                Err(e) => {
                    assert!(Instant::now() < deadline, "no result at {key}: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        assert_eq!(&v[..], &want[..], "{key}");
    }
    // Each operator ran only on the nodes the layout gives its pool.
    let layout = sluice_types::cluster::ClusterLayout::from_toml(
        &std::fs::read_to_string(export.join("layout.toml")).unwrap(),
    )
    .unwrap();
    let pools = std::fs::read_to_string(export.join("pools.txt")).unwrap();
    let per_node = c.dfg_list_nodes().unwrap();
    let mut ran = 0;
    for line in pools.lines().filter(|l| l.contains("--type trigger")) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let (pool, sg): (&str, usize) = (w[3], w[w.len() - 1].parse().unwrap());
        let placed: Vec<u32> = layout.subgroups.trigger[sg].shards.concat();
        for (node, list) in &per_node {
            let calls: u64 = list.as_ref().unwrap().as_array().unwrap()[0]["status"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|st| st["vertex"] == pool)
                .map(|st| st["calls"].as_u64().unwrap())
                .sum();
            assert!(
                calls == 0 || placed.contains(node),
                "{pool} ran {calls} times on node {node}, placed on {placed:?}"
            );
            ran += calls;
        }
    }
    assert!(ran >= 2 * sources.len() as u64, "operators ran {ran} times");
    drop(dev);
}

#[test]
fn the_jellybean_plan_deploys_and_runs_as_exported() {
    deploy_and_run(
        &repo("../shared/fixtures/jellybean-vqa"),
        &["ExtractImageFeature", "SpeechRecognition"],
    );
}

#[test]
fn the_traffic_plan_deploys_and_runs_as_exported() {
    deploy_and_run(&repo("examples/plan/traffic.toml"), &["detect"]);
}
