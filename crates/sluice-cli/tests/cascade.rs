//! Cascade's files, unchanged, on a Sluice cluster (issue #17): a cluster
//! of real node processes started from Cascade's `layout.json` (imported
//! with `sluice layout import`), every `dfgs.json` shape of Cascade's
//! public repository (fixtures in `tests/fixtures/cascade`, see its README)
//! applied with `sluice dfg apply --aliases` through any node, run on every
//! node, and what each graph does checked; graphs survive a node's restart
//! and a node that was down catches up with graphs applied and removed
//! meanwhile.

use sluice_client::{BlockingClient, PoolSpec, PoolType};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{free_base, python3_present};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const WAIT: Duration = Duration::from_secs(30);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cascade")
}

fn sluice(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(fixtures())
        .output()
        .expect("running sluice")
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(x) = f() {
            return x;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Nodes {
    dir: tempfile::TempDir,
    layout: PathBuf,
    addrs: BTreeMap<u32, SocketAddr>,
    procs: BTreeMap<u32, Child>,
}

impl Nodes {
    fn spawn(&mut self, id: u32) {
        let d = self.dir.path();
        let cfg = d.join(format!("node-{id}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[cluster]\nvolatile_dir = \"{}\"\n",
                d.join(format!("node-{id}/raft-volatile")).display()
            ),
        )
        .unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join(format!("node-{id}.log")))
            .unwrap();
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&cfg)
            .arg("--cluster")
            .arg(&self.layout)
            .args(["--node-id", &id.to_string(), "--data-dir"])
            .arg(d.join(format!("node-{id}")))
            .arg("--udl-aliases")
            .arg(fixtures().join("udl_aliases.cfg"))
            // Python UDLs find their module path relative to the node.
            .current_dir(fixtures())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs.insert(id, child);
    }

    fn kill(&mut self, id: u32) {
        let mut c = self.procs.remove(&id).unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// For a failure message: the nodes that exited, and each node's
    /// last log lines.
    fn diagnose(&mut self) -> String {
        let mut out = String::new();
        for (id, c) in self.procs.iter_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                out += &format!("node {id} exited: {status}\n");
            }
            let log = std::fs::read_to_string(self.dir.path().join(format!("node-{id}.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            out += &format!("--- node {id}'s log, last lines:\n{tail}\n");
        }
        out
    }

    fn seeds(&self) -> String {
        let v: Vec<String> = self.addrs.values().map(|a| a.to_string()).collect();
        v.join(",")
    }

    fn client(&self) -> BlockingClient {
        wait_for("a client connection", || {
            BlockingClient::connect(&self.seeds()).ok()
        })
    }

    /// Each node's graphs: id -> state, for the nodes that answer.
    fn states(&self, c: &BlockingClient) -> BTreeMap<u32, BTreeMap<String, String>> {
        c.dfg_list_nodes()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(n, r)| {
                let r = r.ok()?;
                let m = r
                    .as_array()?
                    .iter()
                    .map(|g| {
                        (
                            g["id"].as_str().unwrap_or("?").to_string(),
                            g["state"].as_str().unwrap_or("?").to_string(),
                        )
                    })
                    .collect();
                Some((n, m))
            })
            .collect()
    }

    /// Waits until every node runs exactly the graphs `ids`.
    fn wait_graphs(&self, c: &BlockingClient, ids: &[&str]) {
        let want: BTreeMap<String, String> = ids
            .iter()
            .map(|i| (i.to_string(), "running".to_string()))
            .collect();
        wait_for(&format!("graphs {ids:?} running on every node"), || {
            let s = self.states(c);
            (s.len() == self.addrs.len() && s.values().all(|m| *m == want)).then_some(())
        });
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in self.procs.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Calls of `vertex` summed over the cluster's nodes.
fn calls(c: &BlockingClient, vertex: &str) -> u64 {
    c.dfg_list_nodes()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(_, r)| r.ok())
        .flat_map(|r| r.as_array().cloned().unwrap_or_default())
        .flat_map(|g| g["status"].as_array().cloned().unwrap_or_default())
        .filter(|s| s["vertex"] == vertex)
        .map(|s| s["calls"].as_u64().unwrap_or(0))
        .sum()
}

fn value_of(c: &BlockingClient, key: &str) -> Option<Vec<u8>> {
    c.get(key).ok().map(|o| o.value.to_vec())
}

/// Applies a fixture through node `via`, returning the CLI's output.
fn apply(nodes: &Nodes, fixture: &str, via: u32) -> String {
    let file = fixtures().join(fixture);
    let aliases = fixtures().join("udl_aliases.cfg");
    ok(
        sluice(&[
            "--addr",
            &nodes.addrs[&via].to_string(),
            "dfg",
            "apply",
            file.to_str().unwrap(),
            "--aliases",
            aliases.to_str().unwrap(),
        ]),
        &format!("dfg apply {fixture}"),
    )
}

/// The dairy farm graph, applied in the middle of the sequence and kept
/// until the restart check at the end.
const DAIRY: &str = "8ac4c636-9d92-11eb-9dbc-0242ac110002";

/// Applies a fixture whose single vertex `vertex` has no destinations, puts
/// one object under it and waits for exactly one call over the cluster,
/// then removes the graph.
fn runs_once(nodes: &Nodes, c: &BlockingClient, fixture: &str, id: &str, vertex: &str) {
    apply(nodes, fixture, 0);
    nodes.wait_graphs(c, &[id, DAIRY]);
    c.put(&format!("{vertex}/x"), "v").unwrap();
    wait_for(&format!("one call of {vertex}"), || {
        (calls(c, vertex) == 1).then_some(())
    });
    remove(nodes, id);
}

fn remove(nodes: &Nodes, id: &str) {
    ok(
        sluice(&["--addr", &nodes.seeds(), "dfg", "rm", id]),
        &format!("dfg rm {id}"),
    );
}

/// One cluster at a time: several processes each on a small machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn cascade_layout_and_every_dfgs_shape_run_on_a_cluster() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Cascade's layout.json, imported to three nodes on free ports.
    let dir = tempfile::tempdir().unwrap();
    let base = free_base(3);
    let layout = dir.path().join("layout.toml");
    let out = sluice(&[
        "layout",
        "import",
        fixtures().join("layout.json").to_str().unwrap(),
        "--base",
        &format!("127.0.0.1:{base}"),
        "--out",
        layout.to_str().unwrap(),
    ]);
    let notes = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "layout import");
    for n in ["Raw", "add-member", "metadata group is every node"] {
        assert!(notes.contains(n), "import notes lack {n:?}:\n{notes}");
    }
    let imported =
        sluice_types::cluster::ClusterLayout::from_toml(&std::fs::read_to_string(&layout).unwrap())
            .unwrap();
    assert_eq!(
        imported.subgroups.volatile[0].shards,
        vec![vec![0, 1, 2], vec![2]]
    );
    let mut nodes = Nodes {
        dir,
        layout,
        addrs: imported
            .nodes
            .iter()
            .map(|n| {
                (
                    n.id,
                    n.address
                        .ip()
                        .expect("an imported layout names IP addresses"),
                )
            })
            .collect(),
        procs: BTreeMap::new(),
    };
    for id in [0, 1, 2] {
        nodes.spawn(id);
    }
    let c = nodes.client();
    for (p, t) in [
        ("/pool0", PoolType::Volatile),
        ("/pool1.1", PoolType::Volatile),
        ("/pool1.2", PoolType::Trigger),
        ("/pool2", PoolType::Volatile),
        ("/pool3", PoolType::Volatile),
        ("/dairy_farm/front_end", PoolType::Volatile),
        ("/dairy_farm/compute", PoolType::Volatile),
        ("/dairy_farm/storage", PoolType::Volatile),
        ("/dds/tiny_text", PoolType::Volatile),
        ("/dds/big_chunk", PoolType::Volatile),
        ("/storage", PoolType::Volatile),
        ("/signatures", PoolType::Volatile),
        ("/oob", PoolType::Volatile),
        ("/console_printer", PoolType::Volatile),
        ("/console_printer_out", PoolType::Volatile),
        ("/sched/preprocess", PoolType::Volatile),
        ("/sched/infer", PoolType::Trigger),
        ("/sched/result", PoolType::Volatile),
    ] {
        wait_for(&format!("pool {p}"), || {
            c.create_pool(PoolSpec {
                pathname: p.into(),
                pool_type: Some(t),
                ..Default::default()
            })
            .ok()
        });
    }

    // Every node up (the pools needed only a majority): `dfg apply`
    // waits for all of them.
    wait_for("every node answering", || {
        (nodes.states(&c).len() == nodes.addrs.len()).then_some(())
    });

    // unit_tests: older field name, two UDLs, put and trigger_put edges.
    let out = apply(&nodes, "unit_tests.dfgs.json", 1);
    assert!(out.contains("on every node"), "{out}\n{}", nodes.diagnose());
    assert!(out.contains("data_path_logic_list"), "{out}");
    nodes.wait_graphs(&c, &["26639e22-9b3c-11eb-a237-0242ac110002"]);
    c.put("/pool0/k", "v0").unwrap();
    for k in ["/pool1.1/k", "/pool2/k", "/pool3/k"] {
        let v = wait_for(k, || value_of(&c, k));
        assert_eq!(v, b"v0");
    }
    remove(&nodes, "26639e22-9b3c-11eb-a237-0242ac110002");

    // dairy_farm: object_pool_pathname, a three-pool chain.
    apply(&nodes, "dairy_farm.dfgs.json", 2);
    nodes.wait_graphs(&c, &[DAIRY]);
    c.put("/dairy_farm/front_end/cow1", "moo").unwrap();
    assert_eq!(
        wait_for("the chain's end", || value_of(
            &c,
            "/dairy_farm/storage/cow1"
        )),
        b"moo"
    );

    // dds: stateful, hook both, no destinations: the lambda runs.
    runs_once(
        &nodes,
        &c,
        "dds.dfgs.json",
        "0e04225a-7cc4-552d-a423-85ff34647986",
        "/dds/tiny_text",
    );

    // chain_pipeline: two UDLs with [{}, {...}] configs and [{...}, {}].
    apply(&nodes, "chain_pipeline.dfgs.json", 1);
    nodes.wait_graphs(&c, &["200c8278-2e1c-11ec-a3d7-0242ac110002", DAIRY]);
    c.put("/storage/block1", "b1").unwrap();
    assert_eq!(
        wait_for("the signature", || value_of(&c, "/signatures/block1")),
        b"b1"
    );
    wait_for("the backup lambda on both vertices", || {
        (calls(&c, "/signatures") >= 1 && calls(&c, "/storage") >= 2).then_some(())
    });

    // primary_test replaces the graph of the same id: hook ordered, and a
    // vertex that names no UDL (its longer lists noted).
    let out = apply(&nodes, "primary_test.dfgs.json", 2);
    assert!(out.contains("names no UDL"), "{out}");
    assert!(out.contains("extra ones are ignored"), "{out}");
    nodes.wait_graphs(&c, &["200c8278-2e1c-11ec-a3d7-0242ac110002", DAIRY]);
    c.put("/storage/block2", "b2").unwrap();
    assert_eq!(
        wait_for("the signature", || value_of(&c, "/signatures/block2")),
        b"b2"
    );
    remove(&nodes, "200c8278-2e1c-11ec-a3d7-0242ac110002");

    // oob_test: dispatcher one, Cascade's console printer UUID (built in).
    runs_once(
        &nodes,
        &c,
        "oob_test.dfgs.json",
        "4a2ec3ae-9cd6-11eb-90e5-0242ac110002",
        "/oob",
    );

    // scheduler hints: accepted and reported as unused.
    let out = apply(&nodes, "scheduler.dfgs.json", 1);
    for hint in [
        "required_models_list",
        "expected_execution_timeus",
        "required_objects_pathnames",
    ] {
        assert!(out.contains(hint), "{hint} not reported:\n{out}");
    }
    nodes.wait_graphs(&c, &[DAIRY, "9d1c1a4e-7a1b-11ee-b962-0242ac120002"]);
    c.put("/sched/preprocess/img", "px").unwrap();
    assert_eq!(
        wait_for("the result", || value_of(&c, "/sched/result/img")),
        b"px"
    );
    remove(&nodes, "9d1c1a4e-7a1b-11ee-b962-0242ac120002");

    // A Python UDL by Cascade's PythonOCDPO UUID, string config, trailing /.
    if python3_present() {
        apply(&nodes, "python_udl.dfgs.json", 2);
        nodes.wait_graphs(&c, &["3a8e4e4c-0b5f-11ee-be56-0242ac120002", DAIRY]);
        c.put("/console_printer/line", "hello").unwrap();
        assert_eq!(
            wait_for("the Python lambda's output", || value_of(
                &c,
                "/console_printer_out/line"
            )),
            b"printed: hello"
        );
        remove(&nodes, "3a8e4e4c-0b5f-11ee-be56-0242ac120002");
    } else {
        eprintln!("python3 not found: the Python UDL fixture is skipped");
    }

    // A node that is down misses a removal and an apply, then catches up
    // from the metadata group when it restarts, and its graphs run again.
    nodes.wait_graphs(&c, &[DAIRY]);
    nodes.kill(2);
    remove(&nodes, DAIRY);
    apply(&nodes, "unit_tests.dfgs.json", 0);
    nodes.spawn(2);
    nodes.wait_graphs(&c, &["26639e22-9b3c-11eb-a237-0242ac110002"]);
    // Node 2 alone holds volatile shard 1 of subgroup 0: the keys routed
    // there only run if node 2 runs the graph.
    for i in 0..16 {
        let k = format!("/pool0/after-restart-{i}");
        wait_for("a put after the restart", || c.put(&k, "r").ok());
    }
    for i in 0..16 {
        let k = format!("/pool3/after-restart-{i}");
        assert_eq!(wait_for(&k, || value_of(&c, &k)), b"r");
    }
}

/// The shapes load as Cascade's loader reads them, and what Cascade would
/// have taken silently is refused saying so (checked without a cluster).
#[test]
fn every_fixture_parses_and_cascades_silent_defaults_are_refused() {
    let mut reg = sluice_udls_registry();
    let aliases = std::fs::read_to_string(fixtures().join("udl_aliases.cfg")).unwrap();
    for (a, u) in sluice_compute::dfg::parse_aliases(&aliases).unwrap() {
        reg.alias(&a, &u);
    }
    for f in std::fs::read_dir(fixtures()).unwrap() {
        let p = f.unwrap().path();
        if !p.to_string_lossy().ends_with(".dfgs.json") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let file = sluice_compute::DfgFile::parse(&text, &reg)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        for g in &file.graphs {
            for v in &g.vertices {
                assert!(!v.pathname.ends_with('/'), "{}", v.pathname);
                for u in &v.udls {
                    assert!(
                        reg.factory(&u.name).is_some(),
                        "{} resolved to {}",
                        p.display(),
                        u.name
                    );
                }
            }
        }
    }
    let refuse = |vertex: &str, path: &str, why: &str| {
        let text = format!(r#"[{{"id": "g", "graph": [{vertex}]}}]"#);
        let e = sluice_compute::DfgFile::parse(&text, &reg).unwrap_err();
        assert!(
            e.path.ends_with(path) && e.reason.contains(why),
            "{vertex}: {e}"
        );
    };
    let v = |extra: &str| {
        format!(r#"{{"pathname": "/p", "user_defined_logic_list": ["relay"]{extra}}}"#)
    };
    refuse(
        &v(r#", "user_defined_logic_stateful_list": ["statefull"]"#),
        "stateful_list[0]",
        "Cascade would run it as stateful",
    );
    refuse(
        &v(r#", "user_defined_logic_hook_list": ["trigger_put"]"#),
        "hook_list[0]",
        "Cascade would take it as both",
    );
    refuse(
        &v(r#", "shard_dispatcher_list": ["any"]"#),
        "shard_dispatcher_list[0]",
        "Cascade would take it as one",
    );
    refuse(
        &v(r#", "execution_environment": [{"mode": "docker"}]"#),
        "execution_environment[0].mode",
        "not supported",
    );
    refuse(
        &v(r#", "execution_environment": [{"mode": "process"}]"#),
        "execution_environment[0].mode",
        "only Python UDLs",
    );
    refuse(&v(r#", "priority": 3"#), ".priority", "unknown field");
    refuse(
        &v(r#", "destinations": [{"/o": "putt"}]"#),
        "/o",
        "Cascade would take it as put",
    );
    let e = sluice_compute::dfg::parse_aliases("../service/libsha_hash_udl.so\n").unwrap_err();
    assert!(e.reason.contains("udl_dlls.cfg"), "{e}");
    // A Python UDL may say it runs in a process, as Cascade's may.
    let py = r#"[{"id": "g", "graph": [{"pathname": "/p", "user_defined_logic_list": ["python"],
        "execution_environment": [{"mode": "process"}]}]}]"#;
    sluice_compute::DfgFile::parse(py, &reg).unwrap();
}

fn sluice_udls_registry() -> sluice_compute::Registry {
    sluice_udls::registry()
}

/// `--dfgs` applies a graph at start, as Cascade reads its dfgs.json: on a
/// standalone node at once, in a `sluice dev` cluster through the
/// metadata group to every node.
#[test]
fn graphs_given_at_start_run_standalone_and_on_every_node_of_a_cluster() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let dfg = dir.path().join("dfgs.json");
    std::fs::write(
        &dfg,
        r#"[{"id": "start", "graph": [{"pathname": "/trig/in", "user_defined_logic_list": ["relay"],
            "destinations": [{"/vol/out": "put"}]}]}]"#,
    )
    .unwrap();
    // Standalone.
    let base = free_base(4);
    let addr = format!("127.0.0.1:{base}");
    let mut node = Command::new(BIN)
        .args(["serve", "--listen", &addr, "--data-dir"])
        .arg(dir.path().join("solo"))
        .arg("--dfgs")
        .arg(&dfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let c = wait_for("the standalone node", || {
        BlockingClient::connect(&addr).ok()
    });
    let l = c.dfg_list().unwrap();
    assert_eq!(l[0]["id"], "start", "{l}");
    node.kill().unwrap();
    node.wait().unwrap();
    // A cluster of three from `sluice dev --dfgs`.
    let mut dev = Command::new(BIN)
        .args([
            "dev",
            "--nodes",
            "3",
            "--base-port",
            &(base + 1).to_string(),
            "--dir",
        ])
        .arg(dir.path().join("dev"))
        .arg("--dfgs")
        .arg(&dfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seeds = (1..=3)
        .map(|i| format!("127.0.0.1:{}", base + i))
        .collect::<Vec<_>>()
        .join(",");
    let c = wait_for("the dev cluster", || BlockingClient::connect(&seeds).ok());
    wait_for("the graph on every node", || {
        let nodes = c.dfg_list_nodes().ok()?;
        (nodes.len() == 3
            && nodes.iter().all(|(_, r)| {
                r.as_ref()
                    .is_ok_and(|l| l[0]["id"] == "start" && l[0]["state"] == "running")
            }))
        .then_some(())
    });
    c.trigger_put("/trig/in/x", "at start").unwrap();
    assert_eq!(
        wait_for("the relay", || value_of(&c, "/vol/out/x")),
        b"at start"
    );
    // SAFETY: signalling the child process this test started.
    unsafe {
        libc::kill(dev.id() as libc::pid_t, libc::SIGINT);
    }
    dev.wait().unwrap();
}

/// A `--dfgs` file that cannot apply (an unknown UDL) used to be retried
/// for ever on a cluster, with one warning in node 0's log, while `sluice
/// dev` said the cluster was up: it now fails the start, as it does on a
/// standalone node. A file holding no graph starts (there is nothing to
/// apply), but `dfg apply` of such a file is refused instead of answering
/// "applied " with no name.
#[test]
fn a_dfgs_file_that_cannot_apply_fails_the_start() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"[{"id": "b", "graph": [{"pathname": "/trig/in", "user_defined_logic_list": ["nosuchudl"],
            "destinations": [{"/vol/out": "put"}]}]}]"#,
    )
    .unwrap();
    // `sluice dev --nodes 3 --dfgs FILE` in its own directory, on free ports.
    let dev_with = |name: &str, dfgs: &Path, out: fn() -> Stdio| {
        let base = free_base(3);
        let child = Command::new(BIN)
            .args([
                "dev",
                "--nodes",
                "3",
                "--base-port",
                &base.to_string(),
                "--dir",
            ])
            .arg(dir.path().join(name))
            .arg("--dfgs")
            .arg(dfgs)
            .stdout(out())
            .stderr(out())
            .spawn()
            .unwrap();
        (child, base)
    };
    let (mut dev, _) = dev_with("dev", &bad, Stdio::piped);
    let status = wait_for("sluice dev to give up", || dev.try_wait().unwrap());
    let out = dev.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "{text}");
    assert!(
        text.contains("node 0 exited during start")
            && text.contains("--dfgs")
            && text.contains("unknown UDL \"nosuchudl\""),
        "{text}"
    );
    // No graph in the file: the cluster starts; applying it is refused.
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "[]").unwrap();
    let (mut dev, base) = dev_with("dev2", &empty, Stdio::null);
    let addr = format!("127.0.0.1:{base}");
    let c = wait_for("the dev cluster", || {
        BlockingClient::connect(&addr)
            .ok()
            .filter(|c| c.put("/vol/up", "1").is_ok())
    });
    let e = c.dfg_apply("[]").unwrap_err().to_string();
    assert!(
        e.contains("holds no data flow graph: nothing to apply"),
        "{e}"
    );
    // SAFETY: signalling the child process this test started.
    unsafe {
        libc::kill(dev.id() as libc::pid_t, libc::SIGINT);
    }
    dev.wait().unwrap();
}
