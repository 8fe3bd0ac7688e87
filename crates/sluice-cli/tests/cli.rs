//! End-to-end tests of the real `sluice` binary: a node process and CLI
//! processes talking to it over loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::{
    free_base, python3_present, spawn_node, spawn_node_cmd, spawn_node_with, start_node, temp_dir,
    Node, BIN,
};

impl Node {
    fn terminate(mut self) -> std::process::ExitStatus {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "node ignored SIGTERM");
            // Wait on the node's own output instead of sleeping blind.
            let _ = self.lines.recv_timeout(Duration::from_millis(50));
        }
    }
}

#[test]
fn put_get_versions_and_values_from_args_files_and_stdin() {
    let n = start_node();
    assert!(n
        .ok(&["put", "/vol/a", "hello"])
        .contains("/vol/a version 1"));
    assert_eq!(n.ok(&["get", "/vol/a"]), "hello\n");
    let f = n.dir.join("value.bin");
    std::fs::write(&f, [0u8, 159, 146, 150]).unwrap();
    assert!(n
        .ok(&["put", "/vol/bin", "--file", f.to_str().unwrap()])
        .contains("version 2"));
    let out = n.dir.join("out.bin");
    n.ok(&["get", "/vol/bin", "--out", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out).unwrap(), vec![0u8, 159, 146, 150]);
    let o = n.sluice_stdin(&["put", "/vol/stdin"], Some(b"from stdin"));
    assert!(o.status.success());
    assert_eq!(n.ok(&["get", "/vol/stdin"]), "from stdin\n");
    let j: serde_json::Value = serde_json::from_str(&n.ok(&["--json", "get", "/vol/bin"])).unwrap();
    assert_eq!(j["value_hex"], "009f9296");
    assert_eq!(j["version"], 2);
    n.ok(&["put", "/vol/a", "world"]);
    let meta = n.ok(&["get", "/vol/a", "--meta"]);
    assert!(
        meta.contains("version 4") && meta.contains("previous_version_by_key 1"),
        "{meta}"
    );
    assert_eq!(n.ok(&["get", "/vol/a", "--version", "4"]), "world\n");
    let e = n.fails(&["get", "/vol/a", "--version", "1"]);
    assert!(e.contains("keeps only the latest version"), "{e}");
    assert_eq!(n.ok(&["size", "/vol/a"]), "5\n");
    let j: serde_json::Value =
        serde_json::from_str(&n.ok(&["--json", "put", "/vol/t", "x"])).unwrap();
    let ts = j["timestamp_us"].as_u64().unwrap();
    assert_eq!(n.ok(&["get-by-time", "/vol/t", &ts.to_string()]), "x\n");
    let e = n.fails(&["get-by-time", "/vol/t", &(ts - 1).to_string()]);
    assert!(e.contains("no retained version"), "{e}");
    assert_eq!(
        n.ok(&["get", "/vol/t", "--at", &(ts + 10).to_string()]),
        "x\n"
    );
    // An empty standard input is not taken for an empty value (issue #15);
    // `--stdin` stores what it holds, empty included.
    let o = n.sluice_stdin(&["put", "/vol/empty"], Some(b""));
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("standard input is empty"), "{e}");
    assert!(n.fails(&["get", "/vol/empty"]).contains("not found"));
    let o = n.sluice_stdin(&["put", "/vol/empty", "--stdin"], Some(b""));
    assert!(o.status.success());
    assert_eq!(n.ok(&["size", "/vol/empty"]), "0\n");
}

#[test]
fn conditional_put_remove_list_and_mget() {
    let n = start_node();
    n.ok(&["put", "/vol/k", "v1", "--expect-version", "none"]);
    let e = n.fails(&["put", "/vol/k", "v2", "--expect-version", "none"]);
    assert!(e.contains("current version is 1"), "{e}");
    let e = n.fails(&["put", "/vol/k", "v2", "--expect-version", "7"]);
    assert!(
        e.contains("expected version 7, current version is 1"),
        "{e}"
    );
    n.ok(&["put", "/vol/k", "v2", "--expect-version", "1"]);
    let e = n.fails(&["put", "/vol/k", "v3", "--expect-version", "abc"]);
    assert!(e.contains("not a version number"), "{e}");
    n.ok(&["put", "/vol/k2", "x"]);
    n.ok(&["put", "/vol/other", "y"]);
    assert_eq!(n.ok(&["ls", "/vol"]), "/vol/k\n/vol/k2\n/vol/other\n");
    assert_eq!(
        n.ok(&["ls", "/vol", "--prefix", "/vol/k"]),
        "/vol/k\n/vol/k2\n"
    );
    // No keys at all is a usage error, not an empty success.
    let e = n.fails(&["mget"]);
    assert!(e.contains("<KEYS>"), "{e}");
    let m = n.ok(&["mget", "/vol/k", "/vol/nope", "/vol/k2"]);
    assert!(
        m.contains("/vol/k\tversion 2\tv2")
            && m.contains("/vol/nope\terror: key \"/vol/nope\" not found"),
        "{m}"
    );
    // A key no pool covers (a typo) is an error, not an absent key: every
    // line is printed, and the exit code says that something failed (it
    // was 0, so a script took the error line for a value).
    let o = n.sluice(&["mget", "/vol/k2", "/vols/k2", "/vol/nope"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("/vol/k2\tversion")
            && out.contains("/vols/k2\terror: no object pool covers key")
            && out.contains("/vol/nope\terror: key \"/vol/nope\" not found"),
        "{out}"
    );
    assert!(
        err.contains("1 of 3 keys could not be read (/vols/k2)"),
        "{err}"
    );
    assert!(n.ok(&["rm", "/vol/k"]).contains("tombstone version 5"));
    let e = n.fails(&["get", "/vol/k"]);
    assert!(e.contains("not found"), "{e}");
    let e = n.fails(&["rm", "/vol/k"]);
    assert!(e.contains("not found"), "{e}");
    let j: serde_json::Value = serde_json::from_str(&n.ok(&["--json", "ls", "/vol"])).unwrap();
    assert_eq!(j, serde_json::json!(["/vol/k2", "/vol/other"]));
    n.ok(&["put", "/vol/f", "fire-and-forget", "--forget"]);
}

#[test]
fn pools_commands_and_errors() {
    let n = start_node();
    let ls = n.ok(&["pools", "ls"]);
    assert!(
        ls.contains("/trig")
            && ls.contains("trigger")
            && ls.contains("/vol")
            && ls.contains("volatile"),
        "{ls}"
    );
    n.ok(&[
        "pools",
        "create",
        "/positions",
        "--type",
        "volatile",
        "--affinity",
        "/[a-zA-Z0-9]+_[0-9]+_",
        "--pin",
        "/positions/pinned=0",
    ]);
    let j: serde_json::Value =
        serde_json::from_str(&n.ok(&["--json", "pools", "show", "/positions"])).unwrap();
    assert_eq!(j["affinity_set_regex"], "/[a-zA-Z0-9]+_[0-9]+_");
    assert_eq!(j["object_locations"]["/positions/pinned"], 0);
    assert_eq!(j["deleted"], false);
    assert!(n
        .ok(&["pools", "find", "/positions/little3_7_42"])
        .starts_with("/positions"));
    n.ok(&["put", "/positions/little3_7_42", "p"]);
    n.ok(&["put", "/positions/pinned", "q"]);
    // Key counts per pool (issue #15).
    let shown = n.ok(&["pools", "show", "/positions"]);
    assert!(shown.contains("keys = 2"), "{shown}");
    // The text is TOML, `keys` one of the pool's own fields (it came
    // after `[object_locations]`, so it parsed as a pinned key's).
    let t: toml::Table = shown.parse().unwrap();
    assert_eq!(t["keys"].as_integer(), Some(2), "{shown}");
    let pins = t["object_locations"].as_table().unwrap();
    assert_eq!(pins.len(), 1, "{shown}");
    assert_eq!(pins["/positions/pinned"].as_integer(), Some(0), "{shown}");
    // No `[access_policy] mode = ""`: pools have no access setting of
    // their own (`sluice policy` rules give access), so none is shown.
    assert!(
        shown.starts_with("pathname = \"/positions\"") && !shown.contains("access_policy"),
        "{shown}"
    );
    let j: serde_json::Value =
        serde_json::from_str(&n.ok(&["--json", "pools", "show", "/positions"])).unwrap();
    assert_eq!(j["keys"], 2, "{j}");
    let e = n.fails(&["pools", "create", "/positions", "--type", "volatile"]);
    assert!(e.contains("already exists"), "{e}");
    // Persistent pools are on by default.
    n.ok(&["pools", "create", "/p", "--type", "persistent"]);
    // The type may come after the path, as Cascade's `create_object_pool
    // PATH TYPE` takes it; once.
    n.ok(&["pools", "create", "/p2", "trigger"]);
    assert!(n.ok(&["pools", "show", "/p2"]).contains("trigger"));
    let e = n.fails(&["pools", "create", "/p3", "volatile", "--type", "persistent"]);
    assert!(e.contains("cannot be used with"), "{e}");
    let e = n.fails(&["pools", "create", "/p3"]);
    assert!(e.contains("--type"), "{e}");
    let e = n.fails(&["pools", "create", "/p3", "persistant"]);
    assert!(
        e.contains("possible values: volatile, persistent, trigger"),
        "{e}"
    );
    n.ok(&["put", "/p/a", "one"]);
    n.ok(&["put", "/p/a", "two"]);
    assert_eq!(n.ok(&["get", "/p/a", "--version", "1"]).trim(), "one");
    let e = n.fails(&[
        "pools",
        "create",
        "/bad",
        "--type",
        "volatile",
        "--affinity",
        "([",
    ]);
    assert!(e.contains("does not compile"), "{e}");
    let e = n.fails(&[
        "pools", "create", "/bad", "--type", "volatile", "--pin", "nonsense",
    ]);
    assert!(e.contains("KEY=SHARD"), "{e}");
    let e = n.fails(&["pools", "create", "/bad", "--type", "weird"]);
    assert!(e.contains("weird"), "{e}");
    n.ok(&["pools", "rm", "/positions"]);
    assert!(!n.ok(&["pools", "ls"]).contains("/positions"));
    assert!(n.ok(&["pools", "ls", "--all"]).contains("(deleted)"));
    let e = n.fails(&["get", "/positions/little3_7_42"]);
    assert!(e.contains("is deleted"), "{e}");
    let e = n.fails(&["pools", "rm", "/positions"]);
    assert!(e.contains("not found"), "{e}");
    // A pool created again at the path starts empty: refused until the
    // removed pool's objects are purged (they used to come back).
    let e = n.fails(&["pools", "create", "/positions", "--type", "trigger"]);
    assert!(e.contains("sluice pools purge /positions"), "{e}");
    let out = n.ok(&["pools", "purge", "/positions"]);
    assert!(out.contains("purged /positions: 2 keys"), "{out}");
    assert!(!n.ok(&["pools", "ls", "--all"]).contains("/positions"));
    n.ok(&["pools", "create", "/positions", "--type", "volatile"]);
    let e = n.fails(&["get", "/positions/little3_7_42"]);
    assert!(e.contains("not found"), "{e}");
    // One of each is said as one ("1 keys" before).
    n.ok(&["put", "/positions/one", "v"]);
    n.ok(&["pools", "rm", "/positions"]);
    let out = n.ok(&["pools", "purge", "/positions"]);
    assert!(
        out.contains("purged /positions: 1 key, 1 version deleted"),
        "{out}"
    );
    n.ok(&["pools", "create", "/positions", "--type", "volatile"]);
    let e = n.fails(&["pools", "purge", "/positions"]);
    assert!(e.contains("remove it first"), "{e}");
    let e = n.fails(&["put", "/nowhere/x", "v"]);
    assert!(
        e.contains("no object pool covers key \"/nowhere/x\""),
        "{e}"
    );
    // The command it suggests works as written (it lacked the required
    // `--type`, so copying it failed with a usage error).
    assert!(
        e.contains("`sluice pools create <path> --type volatile`"),
        "{e}"
    );
    n.ok(&["pools", "create", "/nowhere", "--type", "volatile"]);
    n.ok(&["put", "/nowhere/x", "v"]);
    let e = n.fails(&["put", "relative/key", "v"]);
    assert!(e.contains("must start with '/'"), "{e}");
    let e = n.fails(&["get", "/trig/x"]);
    assert!(e.contains("trigger pool"), "{e}");
    let e = n.fails(&["ls", "/trig"]);
    assert!(e.contains("trigger pool"), "{e}");
}

/// `sluice watch ARGS` against `addr`, once it printed its banner
/// (starting with `banner`): the process and its remaining output lines.
fn watching(
    addr: &str,
    args: &[&str],
    banner: &str,
) -> (
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut w = Command::new(BIN)
        .args(["--addr", addr, "watch"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(w.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with(banner), "{first}");
    (w, lines)
}

#[test]
fn a_watch_whose_node_dies_says_so() {
    // It printed "connection closed", nothing about which watch or why.
    let mut n = start_node();
    let (w, _lines) = watching(&n.addr, &["/vol/gone"], "watching /vol/gone");
    n.child.kill().unwrap();
    n.child.wait().unwrap();
    let out = w.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("the watch on \"/vol/gone\" ended"), "{err}");
}

#[test]
fn watch_receives_trigger_puts_and_shell_runs_commands() {
    let n = start_node();
    let (mut w, mut lines) = watching(
        &n.addr,
        &["/trig/cam", "--count", "2"],
        "watching /trig/cam",
    );
    n.ok(&["trigger", "/trig/cam/1", "frame-1"]);
    n.ok(&["trigger", "/trig/other", "not-watched"]);
    n.ok(&["trigger", "/trig/cam/2", "frame-2"]);
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "trigger_put /trig/cam/1 version none frame-1"
    );
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "trigger_put /trig/cam/2 version none frame-2"
    );
    assert!(w.wait().unwrap().success());

    // A watch on a persistent pool resumes from a version: stored ones
    // first, then live.
    n.ok(&["pools", "create", "/hist", "--type", "persistent"]);
    for v in ["a", "b", "c"] {
        n.ok(&["put", "/hist/k", v]);
    }
    let (mut w, mut lines) = watching(
        &n.addr,
        &["/hist", "--from-version", "2", "--count", "3"],
        "watching /hist from version 2",
    );
    assert_eq!(lines.next().unwrap().unwrap(), "put /hist/k version 2 b");
    assert_eq!(lines.next().unwrap().unwrap(), "put /hist/k version 3 c");
    n.ok(&["put", "/hist/k", "d"]);
    assert_eq!(lines.next().unwrap().unwrap(), "put /hist/k version 4 d");
    assert!(w.wait().unwrap().success());
    let e = n.fails(&["watch", "/vol", "--from-version", "1"]);
    assert!(e.contains("only persistent pools"), "{e}");

    let script = b"put /vol/s 'hello shell'\nget /vol/s\nget /vol/missing\nbogus\n--json size /vol/s\nhelp\nhelp get\nquit\nput /vol/never x\n";
    let o = n.sluice_stdin(&["shell"], Some(script));
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("/vol/s version 1"), "{out}");
    assert!(out.contains("hello shell\n"), "{out}");
    assert!(
        out.contains("error: key \"/vol/missing\" not found"),
        "{out}"
    );
    assert!(out.contains("unrecognized subcommand 'bogus'"), "{out}");
    assert!(out.contains("\"size\": 11"), "{out}");
    // The shell's help names its own usage (no program name: the words
    // are typed at its prompt) and how to leave.
    assert!(
        out.contains("Usage: [--json] <COMMAND> [ARGS]...\n"),
        "{out}"
    );
    assert!(
        out.contains("quit (or exit, or end of input) leaves"),
        "{out}"
    );
    assert!(out.contains("Usage: get [OPTIONS] <KEY>"), "{out}");
    assert!(!out.contains("Usage: [OPTIONS]"), "{out}");
    assert!(
        n.fails(&["get", "/vol/never"]).contains("not found"),
        "quit stops the shell"
    );
}

#[test]
fn stats_ping_and_graceful_shutdown() {
    let n = start_node();
    n.ok(&["put", "/vol/a", "x"]);
    let j: serde_json::Value = serde_json::from_str(&n.ok(&["--json", "stats"])).unwrap();
    assert_eq!(j["store"]["puts"], 1);
    let text = n.ok(&["stats"]);
    assert!(text.starts_with("node 0: "), "{text}");
    assert!(text.contains("\nstore "), "{text}");
    assert!(text.contains(" puts 1"), "{text}");
    assert!(n.ok(&["ping"]).starts_with("pong from node 0"));
    // A health check for scripts: exit code 0 when the node serves.
    assert!(n.ok(&["health"]).starts_with("healthy: node 0"));
    let j: serde_json::Value = serde_json::from_str(&n.ok(&["--json", "health"])).unwrap();
    assert_eq!(j["healthy"], true, "{j}");
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let o = Command::new(BIN)
        .args(["--addr", &dead.to_string(), "health"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "health of a node that is not there");
    // Cluster commands on a standalone node: a clear error, not a hang.
    let o = n.sluice(&["cluster", "status"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("standalone") && e.contains("--cluster"), "{e}");
    let status = n.terminate();
    assert!(status.success(), "SIGTERM exits cleanly: {status}");
}

#[test]
fn bad_configs_and_unreachable_nodes_are_clear_errors() {
    let dir = temp_dir("cfg");
    let cfg = dir.join("node.toml");
    std::fs::write(&cfg, "node_id = 1\n[limits]\nmax_value_bytez = 5\n").unwrap();
    let o = Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("max_value_bytez") && e.contains("node.toml"),
        "{e}"
    );
    // A good config file is honoured (limits travel to the client in the handshake).
    std::fs::write(
        &cfg,
        "node_id = 7\nlisten = \"127.0.0.1:0\"\n[limits]\nmax_value_bytes = 8\n",
    )
    .unwrap();
    let n = spawn_node(&dir, &["--config", cfg.to_str().unwrap()]).unwrap();
    assert!(n.ok(&["ping"]).starts_with("pong from node 7"));
    let e = n.fails(&["put", "/vol/big", "123456789"]);
    assert!(e.contains("9 bytes exceeds the limit of 8"), "{e}");
    drop(n);
    // Nobody listening.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let free = l.local_addr().unwrap().to_string();
    drop(l);
    let o = Command::new(BIN)
        .args(["--addr", &free, "get", "/vol/a"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("cannot connect") && e.contains("sluice serve"),
        "{e}"
    );
}

#[test]
fn default_serve_uses_documented_port_and_data_dir() {
    let dir = temp_dir("default");
    let n = match spawn_node(&dir, &[]) {
        Ok(n) => n,
        Err(e) if e.contains("Address already in use") => {
            eprintln!("skipping: port 7420 is taken on this machine ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(n.addr, "127.0.0.1:7420");
    assert!(dir.join("sluice-data/pools.json").exists());
    // No --addr: the CLI's default reaches the default node.
    let o = Command::new(BIN)
        .args(["put", "/vol/a", "hello"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(BIN).args(["get", "/vol/a"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello\n");
}

#[test]
fn demo_pipeline_matches_offline_accuracy() {
    // Issue #15: no frames printed "accuracy NaN" and exited 0; a rate of
    // 0 silently ran at 1/s. Both are refused, naming the flag.
    for bad in [["--images", "0"], ["--rate", "0"]] {
        let o = Command::new(BIN).arg("demo").args(bad).output().unwrap();
        assert!(!o.status.success(), "demo {bad:?} ran");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(bad[0]) && e.contains("0"), "{e}");
    }
    let dir = temp_dir("demo");
    let svg = dir.join("chart.svg");
    let o = Command::new(BIN)
        .args([
            "demo",
            "--rate",
            "2000",
            "--check",
            "--svg",
            svg.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let offline: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("demo/offline_metrics.json")).unwrap(),
    )
    .unwrap();
    let want = format!(
        "({}/{} correct)",
        offline["offline_pipeline_correct"], offline["images"]
    );
    assert!(out.contains(&want), "expected {want} in:\n{out}");
    for stage in ["/demo/frames", "/demo/digits", "/demo/labels"] {
        assert!(out.contains(stage), "{out}");
    }
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(
        chart.starts_with("<svg") && chart.contains("compute"),
        "{chart}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

#[test]
fn plan_on_fixture_and_example_with_json_dot_and_export() {
    let fixture = repo_path("../shared/fixtures/jellybean-vqa");
    let o = Command::new(BIN)
        .args(["plan", fixture.to_str().unwrap(), "--exhaustive"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("resnet18") && out.contains("wav2vec2-large-960h-lv60-self"),
        "{out}"
    );
    assert!(
        out.contains("total 7.4850/h")
            && out.contains("exhaustive optimum (A2)               7.4850"),
        "{out}"
    );

    let o = Command::new(BIN)
        .args(["--json", "plan", fixture.to_str().unwrap()])
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(j["plan"]["total_cost_per_hour"].as_f64().unwrap() <= 7.5088);
    assert_eq!(j["plan"]["a2_holds"], true);
    assert_eq!(j["plan"]["operators"].as_array().unwrap().len(), 3);

    let example = repo_path("examples/plan/traffic.toml");
    let o = Command::new(BIN)
        .args(["plan", example.to_str().unwrap(), "--dot"])
        .output()
        .unwrap();
    let dot = String::from_utf8_lossy(&o.stdout);
    assert!(
        dot.starts_with("digraph plan {") && dot.contains("->") && dot.contains("KB/s"),
        "{dot}"
    );

    let dir = temp_dir("export");
    let o = Command::new(BIN)
        .args([
            "plan",
            example.to_str().unwrap(),
            "--export",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    for f in ["layout.toml", "dfgs.json", "pools.txt"] {
        assert!(dir.join(f).exists(), "{f}");
    }
    assert!(std::fs::read_to_string(dir.join("pools.txt"))
        .unwrap()
        .contains("sluice pools create /plan/detect --type trigger"));
    let _ = std::fs::remove_dir_all(&dir);

    let o = Command::new(BIN)
        .args(["plan", "/no/such/input.toml"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/no/such/input.toml"));
}

#[test]
fn dfg_apply_ls_rm_on_a_running_node() {
    let n = start_node();
    n.ok(&["pools", "create", "/out", "--type", "volatile"]);
    let f = n.dir.join("dfg.json");
    std::fs::write(
        &f,
        r#"[{"id": "echo", "desc": "relay /trig/in to /out",
            "graph": [{"pathname": "/trig/in", "user_defined_logic_list": ["relay"],
                       "destinations": [{"/out": "put"}]}]}]"#,
    )
    .unwrap();
    assert_eq!(
        n.ok(&["dfg", "apply", f.to_str().unwrap()]),
        "applied echo\n"
    );
    let mut w = Command::new(BIN)
        .args(["--addr", &n.addr, "watch", "/out", "--count", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(w.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("watching /out"));
    n.ok(&["trigger", "/trig/in/a", "payload"]);
    assert!(
        lines
            .next()
            .unwrap()
            .unwrap()
            .starts_with("put /out/a version"),
        "the relay stored the object"
    );
    assert!(w.wait().unwrap().success());
    assert_eq!(n.ok(&["get", "/out/a"]), "payload\n");
    let ls = n.ok(&["dfg", "ls"]);
    assert!(
        ls.contains("echo relay /trig/in to /out") && ls.contains("calls 1 emitted 1"),
        "{ls}"
    );
    // One graph, as JSON (issue #15).
    let g: serde_json::Value = serde_json::from_str(&n.ok(&["dfg", "show", "echo"])).unwrap();
    assert_eq!(g["id"], "echo", "{g}");
    assert!(n
        .fails(&["dfg", "show", "nope"])
        .contains("data flow graph \"nope\" not found"));
    // Invalid graphs are rejected whole with the JSON path.
    std::fs::write(&f, r#"[{"id": "bad", "graph": [{"pathname": "/trig/x", "user_defined_logic_list": ["relay"], "user_defined_logic_hook_list": ["sometimes"]}]}]"#).unwrap();
    let e = n.fails(&["dfg", "apply", f.to_str().unwrap()]);
    assert!(
        e.contains("$[0].graph[0].user_defined_logic_hook_list[0]") && e.contains("sometimes"),
        "{e}"
    );
    n.ok(&["dfg", "rm", "echo"]);
    assert_eq!(n.ok(&["--json", "dfg", "ls"]).trim(), "[]");
    let e = n.fails(&["dfg", "rm", "echo"]);
    assert!(e.contains("not found"), "{e}");
}

/// A node config with persistent pools on (plus `extra` TOML lines under
/// `[persistent]`), written into `dir`.
fn persistent_config(dir: &Path, extra: &str) -> PathBuf {
    let cfg = dir.join("node.toml");
    let text = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[persistent]\nenabled = true\n{}",
        dir.join("data").display(),
        extra.replace("\\n", "\n")
    );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

#[test]
fn persistent_preview_keeps_history_across_restarts() {
    let dir = temp_dir("persist");
    let cfg = persistent_config(&dir, "");
    let n = spawn_node(&dir, &["--config", cfg.to_str().unwrap()]).unwrap();
    let e = n.fails(&[
        "pools",
        "create",
        "/q",
        "--type",
        "trigger",
        "--affinity",
        "(",
    ]);
    assert!(e.contains("does not compile"), "{e}");
    n.ok(&["pools", "create", "/p", "--type", "persistent"]);
    let put = |v: &str| -> serde_json::Value {
        serde_json::from_str(&n.ok(&["--json", "put", "/p/a", v])).unwrap()
    };
    let (a, b, c) = (put("one"), put("two"), put("three"));
    n.ok(&["rm", "/p/a"]);
    // SIGKILL (Drop) without removing the data, then a new process on it.
    let mut n = n;
    n.dir = dir.join("no-cleanup");
    drop(n);
    let n = spawn_node(&dir, &["--config", cfg.to_str().unwrap()]).unwrap();
    assert_eq!(
        n.ok(&["get", "/p/a", "--version", &b["version"].to_string()]),
        "two\n"
    );
    assert_eq!(
        n.ok(&["get-by-time", "/p/a", &a["timestamp_us"].to_string()]),
        "one\n"
    );
    let h = n.ok(&["history", "/p/a"]);
    let lines: Vec<&str> = h.lines().collect();
    assert_eq!(lines.len(), 4, "{h}");
    assert!(
        lines[0].ends_with("(removed)") && lines[1].ends_with("three") && lines[3].ends_with("one"),
        "{h}"
    );
    let h = n.ok(&[
        "history",
        "/p/a",
        "--from-version",
        &b["version"].to_string(),
        "--to-version",
        &c["version"].to_string(),
    ]);
    assert_eq!(h.lines().count(), 2, "{h}");
    assert_eq!(
        n.ok(&["ls", "/p", "--at-version", &c["version"].to_string()]),
        "/p/a\n"
    );
    assert_eq!(n.ok(&["ls", "/p"]), "");
    // A version not written yet lists nothing it could be right about: an
    // error (it used to list the current keys, issue #15).
    let e = n.fails(&["ls", "/p", "--at-version", "1000000"]);
    assert!(e.contains("has not been written yet"), "{e}");
    let e = n.fails(&["history", "/vol/x"]);
    assert!(
        e.contains("only persistent pools keep history") || e.contains("not found"),
        "{e}"
    );
}

#[test]
fn retention_compacts_persistent_pools_in_the_background() {
    let dir = temp_dir("retention");
    let cfg = persistent_config(&dir, "compact_every_s = 1\nsegment_bytes = 4096\n");
    let n = spawn_node(&dir, &["--config", cfg.to_str().unwrap()]).unwrap();
    let e = n.fails(&[
        "pools",
        "create",
        "/v",
        "--type",
        "volatile",
        "--keep-versions",
        "2",
    ]);
    assert!(e.contains("retention applies to persistent pools"), "{e}");
    n.ok(&[
        "pools",
        "create",
        "/r",
        "--type",
        "persistent",
        "--keep-versions",
        "3",
    ]);
    let j: serde_json::Value =
        serde_json::from_str(&n.ok(&["--json", "pools", "show", "/r"])).unwrap();
    assert_eq!(j["retention"]["keep_versions"], 3);
    let f = dir.join("value.bin");
    std::fs::write(&f, vec![b'z'; 500]).unwrap();
    for _ in 0..40 {
        n.ok(&["put", "/r/k", "--file", f.to_str().unwrap()]);
    }
    // Reads honour retention at once (issue #14), whether or not the
    // compactor (every second) has run yet: under load the puts take
    // longer than that, and a compacted version is refused with the
    // retention that dropped it too.
    let versions = || n.ok(&["history", "/r/k"]).lines().count();
    assert_eq!(versions(), 3);
    let e = n.fails(&["get", "/r/k", "--version", "1"]);
    assert!(
        e.contains("dropped by the pool's retention")
            || e.contains(
                "the pool's retention (keeps 3 versions per key) dropped this key's versions"
            ),
        "{e}"
    );
    // The background compactor (every second) reclaims the disk space:
    // wait (bounded) for the history's files to shrink.
    let disk = || -> u64 {
        let shard = dir.join("data/persistent/sg0-shard0");
        std::fs::read_dir(shard)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.metadata().map_or(0, |m| m.len()))
                    .sum()
            })
            .unwrap_or(0)
    };
    // The 40 values alone took 20,000 bytes; kept, 3 of them take 1,500.
    // (Under load the compactor may have run before the first look, so
    // the bound is on what was written, not on a first measurement.)
    let written = 40 * 500;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while disk() > written / 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "retention never reclaimed space ({} bytes left of {written} written)",
            disk()
        );
        let _ = n.lines.recv_timeout(Duration::from_millis(200));
    }
    assert_eq!(versions(), 3);
    assert_eq!(n.ok(&["size", "/r/k"]), "500\n");
}

/// A `sluice dev --nodes 3` of a test: the process, the rest of its
/// output, its nodes' pids, its first client and metrics ports.
struct Dev {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
    pids: Vec<String>,
    base: u16,
    metrics_base: u16,
}

/// Starts `sluice dev --nodes 3` in `dir` and reads its lines up to the
/// nodes' pids.
fn spawn_dev(dir: &Path) -> Dev {
    let base = free_base(3);
    spawn_dev_with(
        dir,
        base,
        3,
        &["--nodes", "3", "--base-port", &base.to_string()],
    )
}

/// Starts `sluice dev ARGS` (`nodes` nodes, the first on `base`) in
/// `dir` and reads its lines up to the nodes' pids.
fn spawn_dev_with(dir: &Path, base: u16, nodes: u16, args: &[&str]) -> Dev {
    let metrics_base = free_base(nodes);
    let mut child = Command::new(BIN)
        .arg("dev")
        .args(args)
        .args(["--metrics-base", &metrics_base.to_string(), "--dir"])
        .arg(dir.join("sluice-dev"))
        .env_remove("SLUICE_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.contains(&format!("{nodes} nodes up")), "{first:?}");
    let mut pids = Vec::new();
    for _ in 0..nodes {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        let pid = l
            .split("pid ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap();
        pids.push(pid.to_string());
    }
    Dev {
        child,
        out,
        pids,
        base,
        metrics_base,
    }
}

/// `sluice ARGS` (`top`, which takes no --addr), which must succeed: its
/// standard output.
fn top_at(args: &[&str]) -> String {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(o.status.success(), "sluice {args:?}: {o:?}");
    String::from_utf8(o.stdout).unwrap()
}

/// `sluice --addr ADDR ARGS`, which must succeed: its standard output.
fn cli_at(addr: &str, args: &[&str]) -> String {
    let o = Command::new(BIN)
        .args(["--addr", addr])
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `sluice dev --layout` with shards that leave node 0 out (as Cascade's
/// layouts and `sluice place` exports do): the nodes come up (each node
/// knows the leaders of its own groups only; `dev` waited for node 0 to
/// name them all and gave up after 30 s), and every shard serves.
#[test]
fn dev_starts_a_layout_whose_shards_leave_node_0_out() {
    let dir = temp_dir("dev-layout");
    let base = free_base(3);
    let mut layout = String::from("version = 1\n");
    for i in 0..3 {
        layout += &format!(
            "[[nodes]]\nid = {i}\naddress = \"127.0.0.1:{}\"\n",
            base + i
        );
    }
    layout += "[[subgroups.volatile]]\nshards = [[0, 1], [1, 2], [2, 0]]\n\
               [[subgroups.persistent]]\nshards = [[0, 1, 2]]\n\
               [[subgroups.trigger]]\nshards = [[0], [1], [2]]\n";
    let path = dir.join("layout.toml");
    std::fs::write(&path, layout).unwrap();
    let mut dev = spawn_dev_with(&dir, base, 3, &["--layout", path.to_str().unwrap()]);
    let cli = |args: &[&str]| cli_at(&format!("127.0.0.1:{base}"), args);
    cli(&["pools", "create", "/l", "--type", "volatile"]);
    let keys: Vec<String> = (0..24).map(|i| format!("/l/k{i}")).collect();
    for k in &keys {
        cli(&["put", k, k]);
    }
    for k in &keys {
        assert_eq!(cli(&["get", "--linearizable", k]), format!("{k}\n"));
    }
    // Every shard got some of the keys: each of the three leaders wrote.
    let status: serde_json::Value =
        serde_json::from_str(&cli(&["--json", "cluster", "status"])).unwrap();
    let written: Vec<u64> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["groups"].as_array().unwrap())
        .filter(|g| g["role"] == "leader" && g["group"].as_str().unwrap().starts_with("volatile/"))
        .map(|g| g["applied_version"].as_u64().unwrap())
        .collect();
    assert_eq!(written.len(), 3, "{status}");
    assert!(written.iter().all(|v| *v > 0), "{status}");
    let _ = dev.child.kill();
    let _ = dev.child.wait();
    wait_gone(&dev.pids, "killing sluice dev");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What `sluice place --export` wrote runs as its message says (`sluice
/// dev --layout DIR/layout.toml`, then `pools.txt`): its layout has
/// volatile subgroups only, and every node refused to start, "the layout
/// has no trigger subgroup 0" for the built-in `/trig` pool.
#[test]
fn a_placement_export_runs_under_dev() {
    let dir = temp_dir("place-dev");
    let base = free_base(6);
    let o = Command::new(BIN)
        .arg("place")
        .arg(repo_path("examples/place/moe.toml"))
        .args(["--base-addr", &format!("127.0.0.1:{base}"), "--export"])
        .arg(dir.join("deploy"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let layout = dir.join("deploy/layout.toml");
    let mut dev = spawn_dev_with(&dir, base, 6, &["--layout", layout.to_str().unwrap()]);
    let addr = format!("127.0.0.1:{base}");
    let pools = std::fs::read_to_string(dir.join("deploy/pools.txt")).unwrap();
    for line in pools.lines() {
        let args: Vec<&str> = line.split_whitespace().skip(1).collect();
        cli_at(&addr, &args);
    }
    cli_at(&addr, &["put", "/parts/expert-3/weights", "w3"]);
    assert_eq!(
        cli_at(&addr, &["get", "--linearizable", "/parts/expert-3/weights"]),
        "w3\n"
    );
    // The built-in /vol is there (the layout has volatile subgroups); /trig
    // is not, the layout having no trigger subgroup.
    let listed = cli_at(&addr, &["pools", "ls"]);
    assert!(
        listed.contains("/vol ") && !listed.contains("/trig"),
        "{listed}"
    );
    // Node n4 fails; the plan after it, exported, runs on the live cluster:
    // its layout keeps every other node's id and address (n5 was given
    // n4's), and its membership.sh takes n4 out of the shards that keep a
    // majority (it had no commands to run before).
    cli_at(&addr, &["put", "/parts/expert-0/weights", "w0"]);
    cli_at(&addr, &["put", "/parts/expert-1/weights", "w1"]);
    // n5 applied what it holds before n4 dies: a follower learns that an
    // entry is committed from its leader's next message, and with its
    // shard's other member gone it could never learn it after.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let st: serde_json::Value = serde_json::from_str(&cli_at(
            &format!("127.0.0.1:{}", base + 5),
            &["cluster", "status", "--json"],
        ))
        .unwrap();
        let caught_up = st["nodes"].as_array().into_iter().flatten().any(|n| {
            n["node"] == 5
                && n["groups"].as_array().is_some_and(|gs| {
                    gs.iter()
                        .all(|g| g["applied_index"].as_u64() >= g["last_log_index"].as_u64())
                })
        });
        if caught_up {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "n5 never applied its log: {st}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe {
        libc::kill(dev.pids[4].parse().unwrap(), libc::SIGKILL);
    }
    let placement = dir.join("deploy/placement.toml");
    fail_n4(&placement);
    let (_, script) = place_from_export(&placement, &dir.join("after"));
    let after = sluice_types::cluster::ClusterLayout::from_toml(
        &std::fs::read_to_string(dir.join("after/layout.toml")).unwrap(),
    )
    .unwrap();
    let n5 = after
        .nodes
        .iter()
        .find(|n| n.id == 5)
        .expect("n5 keeps id 5");
    assert_eq!(n5.address.port(), base + 5, "n5 keeps its address");
    assert!(after.nodes.iter().all(|n| n.id != 4), "n4 is gone");
    let commands: Vec<&str> = script
        .lines()
        .filter(|l| l.starts_with("sluice "))
        .collect();
    assert!(
        commands.contains(&"sluice cluster remove-member volatile/0/0 4   # n4, failed"),
        "{script}"
    );
    assert!(
        script.contains("# 1 of its 2 members alive: no majority")
            && script.contains("`sluice dump /parts/expert-1` copies them out"),
        "expert-1 and expert-2 were on n4 and n5 alone: {script}"
    );
    // As it says: the part's objects come out through its live member.
    cli_at(
        &addr,
        &[
            "dump",
            "/parts/expert-1",
            "--out",
            dir.join("e1.dump").to_str().unwrap(),
        ],
    );
    let dumped = std::fs::read_to_string(dir.join("e1.dump")).unwrap();
    assert!(dumped.contains("/parts/expert-1/weights"), "{dumped}");
    for line in &commands {
        let args: Vec<&str> = line
            .split('#')
            .next()
            .unwrap()
            .split_whitespace()
            .skip(1)
            .collect();
        cli_at(&addr, &args);
    }
    let status: serde_json::Value =
        serde_json::from_str(&cli_at(&addr, &["--json", "cluster", "status"])).unwrap();
    let members: Vec<u64> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| {
            n["groups"]
                .as_array()
                .is_some_and(|g| g.iter().any(|g| g["group"] == "volatile/0/0"))
        })
        .map(|n| n["node"].as_u64().unwrap_or(u64::MAX))
        .collect();
    assert_eq!(members, vec![2, 3, 5], "{status}");
    cli_at(&addr, &["put", "/parts/expert-0/weights", "w0 again"]);
    assert_eq!(
        cli_at(&addr, &["get", "--linearizable", "/parts/expert-0/weights"]),
        "w0 again\n"
    );
    let _ = dev.child.kill();
    let _ = dev.child.wait();
    wait_gone(&dev.pids, "killing sluice dev");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plan that no failure scenario leaves whole says which parts go first
/// and what gives them more (it printed a probability of 0 alone).
#[test]
fn a_plan_that_never_survives_says_what_to_raise() {
    let dir = tempfile::tempdir().unwrap();
    let problem = dir.path().join("p.toml");
    std::fs::write(
        &problem,
        "slots = 1\nnodes = 2\n[failures]\nsurvivors = 1\n\
         [[parts]]\nname = \"a\"\nload = 1.0\n[[parts]]\nname = \"b\"\nload = 1.0\n",
    )
    .unwrap();
    let o = Command::new(BIN)
        .args(["place", problem.to_str().unwrap()])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("probability 0.000000"), "{out}");
    assert!(
        out.contains(
            "the parts with the fewest replicas (a, b: 1 each) are lost first; a higher `floor`"
        ),
        "{out}"
    );
}

/// `sluice place --from PLACEMENT --export DIR`, which must succeed: its
/// standard output and the `membership.sh` it wrote.
fn place_from_export(placement: &Path, dir: &Path) -> (String, String) {
    let o = Command::new(BIN)
        .args(["place", "--from", placement.to_str().unwrap(), "--export"])
        .arg(dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let script = std::fs::read_to_string(dir.join("membership.sh")).unwrap();
    (out, script)
}

/// Edits the example's exported `placement.toml` as after node n4 failed
/// (named in `failed`; the floor dropped to 1 so the rest fit): its text
/// before.
fn fail_n4(placement: &Path) -> String {
    let text = std::fs::read_to_string(placement).unwrap();
    std::fs::write(
        placement,
        format!(
            "failed = [\"n4\"]\n{}",
            text.replace("floor = 2", "floor = 1")
        ),
    )
    .unwrap();
    text
}

/// Waits (bounded) until none of `pids` runs any more (gone, or a zombie).
fn wait_gone(pids: &[String], what: &str) {
    let running = |pid: &String| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut waited = Duration::from_millis(1);
    while pids.iter().any(running) {
        assert!(
            std::time::Instant::now() < deadline,
            "nodes {:?} still running after {what}",
            pids.iter().filter(|p| running(p)).collect::<Vec<_>>()
        );
        // Nothing to wait on but /proc: back off.
        std::thread::park_timeout(waited);
        waited = (waited * 2).min(Duration::from_millis(50));
    }
}

/// `sluice dev` stopped with SIGTERM stops its nodes as Ctrl-C does; and
/// killed outright (SIGKILL, no chance to clean up), its nodes still end
/// with it instead of holding their ports.
#[test]
fn dev_nodes_end_with_dev_on_sigterm_and_on_sigkill() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGKILL, "SIGKILL")] {
        let dir = temp_dir("dev-signal");
        let mut dev = spawn_dev(&dir);
        // SAFETY: signalling the child we spawned and have not reaped.
        unsafe {
            libc::kill(dev.child.id() as libc::pid_t, sig);
        }
        let st = dev.child.wait().unwrap();
        if sig == libc::SIGTERM {
            assert!(st.success(), "sluice dev after SIGTERM: {st}");
        }
        wait_gone(&dev.pids, &format!("{name} to sluice dev"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `sluice dev --nodes 3`: real node processes, the default pools work
/// unchanged against any node, `cluster status` shows one leader per
/// group, and Ctrl-C (SIGINT) stops every node.
#[test]
fn dev_starts_a_three_node_cluster_and_ctrl_c_stops_it() {
    let dir = temp_dir("dev");
    let Dev {
        child: mut dev,
        mut out,
        pids,
        base,
        metrics_base,
    } = spawn_dev(&dir);
    let mut metrics_line = String::new();
    out.read_line(&mut metrics_line).unwrap();
    let metrics = metrics_line
        .trim()
        .strip_prefix("metrics: sluice top --metrics ")
        .unwrap_or_else(|| panic!("{metrics_line:?}"))
        .to_string();
    assert_eq!(
        metrics,
        (0..3)
            .map(|i| format!("127.0.0.1:{}", metrics_base + i))
            .collect::<Vec<_>>()
            .join(",")
    );
    let cli = |addr: String, args: &[&str]| cli_at(&addr, args);
    let a0 = format!("127.0.0.1:{base}");
    let a2 = format!("127.0.0.1:{}", base + 2);
    cli(a0.clone(), &["put", "/vol/a", "x"]);
    // By default a node logs its groups' leaders in its own words, and
    // raft-rs's per-election lines not at all (three per round per group).
    let node_log = std::fs::read_to_string(dir.join("sluice-dev/node-0.log")).unwrap();
    assert!(
        node_log.contains("this node is now the leader")
            || node_log.contains("following a new leader"),
        "{node_log}"
    );
    assert!(!node_log.contains(" raft: "), "{node_log}");
    assert_eq!(cli(a2.clone(), &["get", "--linearizable", "/vol/a"]), "x\n");
    let status = cli(a2, &["--json", "cluster", "status"]);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    let leaders: Vec<&serde_json::Value> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["groups"].as_array().unwrap())
        .filter(|g| g["group"] == "volatile/0/0" && g["role"] == "leader")
        .collect();
    assert_eq!(leaders.len(), 1, "{status}");
    // `sluice top` over the three nodes' metrics: one leader of the shard
    // among them (each node mirrors its groups once a second: wait).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let top = top_at(&[
            "--json",
            "top",
            "--metrics",
            &metrics,
            "--once",
            "--interval-ms",
            "100",
        ]);
        let v: serde_json::Value = serde_json::from_str(&top).unwrap();
        let roles: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|n| n["groups"].as_array().unwrap())
            .filter(|g| g["group"] == "volatile/0/0")
            .map(|g| g["role"].as_str().unwrap())
            .collect();
        if roles.len() == 3 && roles.iter().filter(|r| **r == "leader").count() == 1 {
            break;
        }
        // Each try takes its interval (100 ms): a bounded poll.
        assert!(std::time::Instant::now() < deadline, "{top}");
    }
    // From the directory `sluice dev` runs in, top finds the nodes'
    // metrics by itself (it required --metrics); the client options it
    // has no use for are refused.
    let o = Command::new(BIN)
        .current_dir(&dir)
        .args(["--json", "top", "--once", "--interval-ms", "100"])
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_str(&top).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(3), "{top}");
    // Each node's memory in use (mirrored with its groups, seen above).
    assert!(
        v.as_array()
            .unwrap()
            .iter()
            .all(|n| n["memory_bytes"].as_u64().is_some_and(|b| b > 0)),
        "{top}"
    );
    let o = Command::new(BIN)
        .current_dir(&dir)
        .args(["top", "--once", "--addr", "127.0.0.1:1"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("takes no --addr"), "{e}");
    // In human form: no raw JSON; followers' lag as node:entries.
    let human = cli(a0.clone(), &["cluster", "status"]);
    assert!(!human.contains('{'), "{human}");
    assert!(
        human.lines().any(|l| l.contains(" leader ")
            && l.split_whitespace()
                .last()
                .is_some_and(|lag| lag.contains(':'))),
        "{human}"
    );
    // And each node's connections to its peers.
    assert_eq!(
        human
            .lines()
            .filter(|l| l.contains("connections to peers:"))
            .count(),
        3,
        "{human}"
    );
    // Never an empty list: a node that has opened none says "none".
    assert!(
        human
            .lines()
            .filter(|l| l.contains("connections to peers:"))
            .all(|l| !l.contains(":  ") && !l.contains("(bulk: )")),
        "{human}"
    );
    // Membership changes answer in words, not JSON.
    let r = cli(
        a0.clone(),
        &["cluster", "remove-member", "volatile/0/0", "2"],
    );
    assert_eq!(
        r.trim(),
        "node 2 removed from volatile/0/0; members now 0, 1",
        "{r}"
    );
    let r = cli(a0.clone(), &["cluster", "add-member", "volatile/0/0", "2"]);
    assert_eq!(
        r.trim(),
        "node 2 added to volatile/0/0; members now 0, 1, 2",
        "{r}"
    );
    // Issue #14: a second `sluice dev` on the same ports must not report
    // "3 nodes up" because its probe reached this cluster: its nodes die
    // with "address in use", and it says so.
    let second = dir.join("second");
    let (so, se) = must_fail(
        &dir,
        &[
            "dev",
            "--nodes",
            "3",
            "--base-port",
            &base.to_string(),
            "--dir",
            second.to_str().unwrap(),
        ],
        Duration::from_secs(40),
    );
    assert!(!so.contains("nodes up"), "{so}");
    assert!(
        se.contains("exited during start") && se.contains("in use"),
        "{se}"
    );
    // Several seeds, and the endpoints file `sluice dev` leaves: with node
    // 0 dead, client commands still reach the other two.
    let endpoints = std::fs::read_to_string(dir.join("sluice-dev/endpoints")).unwrap();
    assert_eq!(endpoints.lines().count(), 3, "{endpoints}");
    unsafe {
        libc::kill(pids[0].parse().unwrap(), libc::SIGKILL);
    }
    let o = Command::new(BIN)
        .args(["get", "/vol/a"])
        .env_remove("SLUICE_ADDR")
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "x\n");
    let seeds = format!("{a0},127.0.0.1:{}", base + 1);
    assert_eq!(cli(seeds, &["get", "/vol/a"]), "x\n");
    // Issue #15: `sluice dev` says how to restart the node that died; the
    // command it prints brings it back into the cluster.
    let mut err = BufReader::new(dev.stderr.take().unwrap());
    let hint = loop {
        let mut l = String::new();
        assert!(
            err.read_line(&mut l).unwrap() > 0,
            "sluice dev said nothing about node 0"
        );
        if l.contains("node 0 exited") && l.contains("Restart it with") {
            let mut cmd = String::new();
            err.read_line(&mut cmd).unwrap();
            break cmd;
        }
    };
    let words: Vec<&str> = hint.split_whitespace().collect();
    let end = words
        .iter()
        .position(|w| *w == ">>")
        .expect("the hint appends to the log");
    assert!(hint.contains("--node-id 0"), "{hint}");
    let mut again = Command::new(words[0])
        .args(&words[1..end])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let o = Command::new(BIN)
            .args(["--addr", &a0, "get", "/vol/a"])
            .output()
            .unwrap();
        if o.status.success() {
            assert_eq!(String::from_utf8_lossy(&o.stdout), "x\n");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node 0 did not come back"
        );
        std::thread::park_timeout(Duration::from_millis(100));
    }
    // SAFETY: signalling the child we spawned.
    unsafe {
        libc::kill(dev.id() as libc::pid_t, libc::SIGINT);
    }
    assert!(dev.wait().unwrap().success());
    wait_gone(&pids, "Ctrl-C");
    // The node restarted by hand is stopped with the others (it outlived
    // `sluice dev`, holding its port and data directory).
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(
        rest.contains(&format!(
            "stopping node 0 (pid {}, restarted by hand)",
            again.id()
        )),
        "{rest}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while again.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the node restarted by hand outlived sluice dev"
        );
        std::thread::park_timeout(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `sluice ARGS` that must exit with an error (bounded: a server
/// that starts would never exit by itself); returns its stdout and stderr.
fn must_fail(cwd: &Path, args: &[&str], within: Duration) -> (String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + within;
    let mut waited = Duration::from_millis(1);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "sluice {args:?} kept running, expected it to refuse: {}",
                String::from_utf8_lossy(&o.stdout)
            );
        }
        // Polling a child that has no other signal to wait on: back off.
        std::thread::park_timeout(waited);
        waited = (waited * 2).min(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success(), "sluice {args:?} exited 0");
    (
        String::from_utf8(o.stdout).unwrap(),
        String::from_utf8(o.stderr).unwrap(),
    )
}

/// `sluice serve ARGS` that must refuse to start; returns its stderr.
fn serve_must_fail(cwd: &Path, args: &[&str]) -> String {
    let all: Vec<&str> = std::iter::once("serve")
        .chain(args.iter().copied())
        .collect();
    must_fail(cwd, &all, Duration::from_secs(20)).1
}

/// Issue #14: a second server on a live server's data directory (on
/// another port, or on the same port where it would fail with "address in
/// use" only after recovering the directory) must exit before it touches
/// anything, naming the holder; the first server's data is intact.
#[test]
fn a_second_server_on_the_same_data_dir_is_refused() {
    // The data directory outlives the node processes (a Node removes its
    // own working directory when dropped).
    let data = temp_dir("locked-data");
    let start = || {
        spawn_node(
            &temp_dir("locked"),
            &[
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                data.to_str().unwrap(),
            ],
        )
        .unwrap()
    };
    let n = start();
    n.ok(&["pools", "create", "/sensors", "--type", "persistent"]);
    n.ok(&["put", "/vol/a", "first"]);
    n.ok(&["put", "/sensors/p", "kept"]);
    let pools_before = std::fs::read(data.join("pools.json")).unwrap();
    for listen in ["127.0.0.1:0", n.addr.as_str()] {
        let e = serve_must_fail(
            &n.dir,
            &["--listen", listen, "--data-dir", data.to_str().unwrap()],
        );
        assert!(e.contains("in use by another process"), "{e}");
        assert!(
            e.contains(&n.child.id().to_string()),
            "names the holder's pid: {e}"
        );
        assert!(e.contains(&n.addr), "names the holder's address: {e}");
    }
    assert_eq!(
        std::fs::read(data.join("pools.json")).unwrap(),
        pools_before
    );
    assert_eq!(n.ok(&["get", "/vol/a"]), "first\n");
    n.ok(&["put", "/sensors/p", "later"]);
    let status = n.terminate();
    assert!(status.success());
    // Once the holder is gone the directory is free again, with its data.
    let n2 = start();
    assert_eq!(n2.ok(&["get", "/sensors/p"]), "later\n");
    drop(n2);
    let _ = std::fs::remove_dir_all(&data);
}

/// `sluice fsck --data-dir DATA EXTRA...`.
fn fsck_at(data: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["fsck", "--data-dir", data.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

/// A dry run of fsck on a damaged directory: a non-zero exit; its report.
fn fsck_dry_run_finds_damage(data: &std::path::Path) -> String {
    let o = fsck_at(data, &[]);
    assert!(!o.status.success(), "damage is a non-zero exit");
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Issue #14: a flipped byte in the last (acknowledged, fsync'd) record of
/// a persistent history is damage: the node refuses to start naming file
/// and offset, `sluice fsck` reports it without changing anything, and
/// `fsck --repair` cuts the history there, keeping the bytes as evidence.
#[test]
fn damaged_history_refuses_to_start_and_fsck_reports_and_repairs_it() {
    let data = temp_dir("fsck-data");
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ];
    let n = spawn_node(&temp_dir("fsck"), &args).unwrap();
    n.ok(&["pools", "create", "/sensors", "--type", "persistent"]);
    n.ok(&["put", "/sensors/t", "first"]);
    n.ok(&["put", "/sensors/t", "second-acknowledged"]);
    // fsck on a running node is refused (it would race the node's writes).
    let o = Command::new(BIN)
        .args(["fsck", "--data-dir", data.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("in use") && e.contains("stopped"), "{e}");
    assert!(n.terminate().success());
    let shard = data.join("persistent/sg0-shard0");
    let seg = std::fs::read_dir(&shard)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.len() - 3; // inside the last record's value
    bytes[at] ^= 0x20;
    std::fs::write(&seg, &bytes).unwrap();
    let e = serve_must_fail(&data, &args);
    assert!(
        e.contains(&seg.display().to_string()) && e.contains("corrupt at offset"),
        "{e}"
    );
    // With the command that comes next, for this data directory.
    assert!(
        e.contains(&format!(
            "`sluice fsck --data-dir {}` reports",
            data.display()
        )),
        "{e}"
    );
    assert_eq!(std::fs::read(&seg).unwrap(), bytes, "the node cut nothing");
    let fsck = |extra: &[&str]| fsck_at(&data, extra);
    let out = fsck_dry_run_finds_damage(&data);
    assert!(
        out.contains("CORRUPT at offset") && out.contains("dry run"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(&seg).unwrap(),
        bytes,
        "a dry run changes nothing"
    );
    let j: serde_json::Value = serde_json::from_slice(&fsck(&["--json"]).stdout).unwrap();
    assert_eq!(j["damaged"], 1);
    let offset = j["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["status"] == "corrupt")
        .unwrap()["offset"]
        .as_u64()
        .unwrap();
    let o = fsck(&["--repair"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("cut ") && out.contains("kept in"), "{out}");
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), offset);
    let evidence: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("fsck-evidence-")
        })
        .collect();
    assert_eq!(evidence.len(), 1);
    let kept = std::fs::read_dir(evidence[0].join("sg0-shard0"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(std::fs::read(kept).unwrap(), &bytes[offset as usize..]);
    assert!(fsck(&[]).status.success(), "clean after the repair");
    // The node starts; the damaged version is gone, the one before is there.
    let n = spawn_node(&temp_dir("fsck"), &args).unwrap();
    assert_eq!(n.ok(&["get", "/sensors/t"]), "first\n");
    drop(n);
    let _ = std::fs::remove_dir_all(&data);
}

/// Issue #15: an error is printed once (its cause used to appear twice:
/// in the message and again as its source), and a node whose log goes to
/// a file or a pipe writes no colour codes.
#[test]
fn errors_print_once_and_logs_off_a_terminal_have_no_colour() {
    let n = start_node();
    let dir = temp_dir("twice");
    let data = dir.join("data");
    let e = serve_must_fail(
        &dir,
        &["--listen", &n.addr, "--data-dir", data.to_str().unwrap()],
    );
    assert_eq!(e.matches("in use").count(), 1, "{e}");
    assert!(!e.contains('\x1b'), "colour codes in a piped log: {e:?}");
    std::fs::write(data.join("pools.json"), b"{ not json").unwrap();
    let e = serve_must_fail(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
    );
    assert_eq!(e.matches("is corrupt").count(), 1, "{e}");
    assert!(!e.contains('\x1b'), "{e:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #15: errors a new user met said the wrong thing: an unknown DFG
/// id was a "key ... not found", and a port that is not a Sluice node was
/// "is this a Sluice client?".
#[test]
fn errors_name_what_is_wrong() {
    let n = start_node();
    let e = n.fails(&["dfg", "rm", "shout"]);
    assert!(e.contains("data flow graph \"shout\" not found"), "{e}");
    // Under --json, errors are JSON (they were plain text), with the
    // typed error's kind.
    let e = n.fails(&["--json", "get", "/vol/missing"]);
    let j: serde_json::Value = serde_json::from_str(e.trim()).expect("a JSON error");
    assert_eq!(j["error"]["error"], "not_found", "{j}");
    assert!(
        j["message"].as_str().unwrap().contains("/vol/missing"),
        "{j}"
    );
    assert!(!e.contains("key \""), "{e}");
    // Something that is not a Sluice node on the port.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming().take(4) {
            let mut s = s.unwrap();
            let _ = std::io::Write::write_all(&mut s, b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let o = Command::new(BIN)
        .args(["--addr", &addr, "get", "/vol/a"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("is not a Sluice node"), "{e}");
    assert!(!e.contains("Sluice client"), "{e}");
}

/// Issue #15: `get` printed binary values raw to the terminal. On a
/// terminal they are escaped now, as redis-cli does; to a pipe, or with
/// `--raw`, the bytes are written as they are.
#[test]
fn binary_values_are_escaped_on_a_terminal_only() {
    use std::os::fd::FromRawFd;
    let n = start_node();
    let dir = temp_dir("binary");
    let f = dir.join("value");
    std::fs::write(&f, b"\x00\xffa\n").unwrap();
    n.ok(&["put", "/vol/bin", "--file", f.to_str().unwrap()]);
    n.ok(&["put", "/vol/text", "plain"]);
    assert_eq!(n.sluice(&["get", "/vol/bin"]).stdout, b"\x00\xffa\n");
    let on_a_terminal = |args: &[&str]| -> Vec<u8> {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty writes two new descriptors, owned below.
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty");
        // SAFETY: both descriptors are fresh and owned by nothing else.
        let (slave, mut master) = unsafe {
            (
                std::fs::File::from_raw_fd(slave),
                std::fs::File::from_raw_fd(master),
            )
        };
        let st = Command::new(BIN)
            .args(["--addr", &n.addr])
            .args(args)
            .stdout(Stdio::from(slave))
            .status()
            .unwrap();
        assert!(st.success(), "{args:?}");
        // Every copy of the terminal's other end is closed now: read what
        // it holds until it reports the end.
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(k) = std::io::Read::read(&mut master, &mut buf) {
            if k == 0 {
                break;
            }
            out.extend_from_slice(&buf[..k]);
        }
        out
    };
    // (The terminal turns each \n into \r\n.)
    assert_eq!(
        on_a_terminal(&["get", "/vol/bin"]),
        br#""\x00\xffa\n""#.iter().chain(b"\r\n").copied().collect::<Vec<u8>>()
    );
    assert_eq!(on_a_terminal(&["get", "/vol/text"]), b"plain\r\n");
    assert_eq!(
        on_a_terminal(&["--raw", "get", "/vol/bin"]),
        b"\x00\xffa\r\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sluice place` (issue #21): a plan with its probability and baselines,
/// exported as a layout whose subgroups replicate each part on exactly its
/// nodes, and reconfigured after a node fails with the fewest moves.
#[test]
fn place_plans_exports_and_reconfigures() {
    let example = repo_path("examples/place/moe.toml");
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .args(["place", example.to_str().unwrap(), "--export"])
        .arg(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("probability 0.400000 (exact, 20 scenarios)"),
        "{out}"
    );
    assert!(out.contains("optimal: exact search"), "{out}");
    assert!(out.contains("maximum rank overlap (MRO)"), "{out}");
    let layout = sluice_types::cluster::ClusterLayout::from_toml(
        &std::fs::read_to_string(dir.path().join("layout.toml")).unwrap(),
    )
    .unwrap();
    assert_eq!(layout.nodes.len(), 6);
    assert_eq!(layout.subgroups.volatile.len(), 8, "a subgroup per part");
    let pools = std::fs::read_to_string(dir.path().join("pools.txt")).unwrap();
    assert!(
        pools.contains("/parts/expert-7 --type volatile --subgroup 7"),
        "{pools}"
    );
    // Node n4 fails; the floor drops to 1 so the rest fit.
    let placement = dir.path().join("placement.toml");
    let text = fail_n4(&placement);
    let o = Command::new(BIN)
        .args(["--json", "place", "--from", placement.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["minimal"], true, "{r}");
    assert!(
        r["lost"].as_array().unwrap().len() >= 2,
        "n4's replicas: {r}"
    );
    // Never worse than the plan in place: the five nodes' load-proportional
    // counts (5, 3, 2 and five parts of 1) survive no 3-of-5 failure, and
    // the plan once moved five replicas to get there from the current
    // plan's 0.4. The current counts are kept; nothing needs to move.
    assert_eq!(r["load_counts_best"], 0.0, "{r}");
    assert_eq!(r["survival"]["p"], r["before"]["p"], "{r}");
    assert_eq!(r["before"]["p"], 0.4, "{r}");
    assert_eq!(r["counts_kept"], true, "{r}");
    assert_eq!(r["reached"], true, "{r}");
    assert_eq!(r["moves"].as_array().unwrap().len(), 0, "{r}");
    // Not one part is placed on the failed node.
    for nodes in r["placement"].as_object().unwrap().values() {
        assert!(!nodes.as_array().unwrap().iter().any(|n| n == "n4"), "{r}");
    }
    // A target no plan reaches: said, exit 1, nothing exported (it exited
    // 0 with "search stopped at its budget" and wrote the plan).
    let o = Command::new(BIN)
        .args(["place", "--from", placement.to_str().unwrap()])
        .args(["--min-probability", "0.9", "--export"])
        .arg(dir.path().join("unreached"))
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("target 0.900000: NOT reached"), "{out}");
    assert!(
        err.contains("no plan found reaches survival 0.900000 (the best found: 0.400000)"),
        "{err}"
    );
    assert!(!dir.path().join("unreached").exists());
    // Loads changed, no node gone: the counts follow the loads, and the
    // export says how the running cluster gets there.
    std::fs::write(
        &placement,
        text.replace(
            "name = \"expert-7\"\nload = 50.0",
            "name = \"expert-7\"\nload = 2000.0",
        ),
    )
    .unwrap();
    let (out, script) = place_from_export(&placement, &dir.path().join("rebalanced"));
    assert!(out.contains("+ expert-7 on"), "{out}");
    assert!(!out.contains("counts kept"), "{out}");
    assert!(
        script.contains("sluice cluster add-member volatile/7/0 "),
        "{script}"
    );
    // n4 fails and n6 joins the plan (listed by hand, without an id): the
    // replicas n4 held go to n6, which the running cluster's layout does
    // not have yet, so the script says to roll the new layout out first
    // (`add-member` of a node outside the layout is refused).
    std::fs::write(
        &placement,
        format!(
            "failed = [\"n4\"]\n{}",
            text.replacen("[failures]", "[[nodes]]\nname = \"n6\"\n\n[failures]", 1)
        ),
    )
    .unwrap();
    let (out, script) = place_from_export(&placement, &dir.path().join("joined"));
    assert!(out.contains(" on n6"), "{out}");
    assert!(
        script.contains("# node 6 is new to the cluster: once every node runs the new layout.toml"),
        "{script}"
    );
    assert!(
        !script
            .lines()
            .any(|l| l.starts_with("sluice cluster add-member") && l.ends_with(" 6")),
        "{script}"
    );
    // Bad input: a clear error naming the problem.
    let o = Command::new(BIN)
        .args([
            "place",
            placement
                .to_str()
                .unwrap()
                .replace("placement", "nope")
                .as_str(),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    // Two parts whose names make the same pool name: the second part's
    // `pools create` failed and its objects lived on the first part's
    // nodes. Refused, writing nothing. Names with quotes and newlines
    // give a layout that parses, with their names kept.
    let p = dir.path().join("names.toml");
    let problem = |a: &str, b: &str| {
        format!(
            "name = \"n\"\nslots = 2\nfloor = 1\n[[nodes]]\nname = 'q\"0'\ndomain = 'r\"0'\n\
             [[nodes]]\nname = \"n1\"\ndomain = \"r1\"\n[[nodes]]\nname = \"n2\"\ndomain = \"r2\"\n\
             [failures]\nsurvivors = 2\n[[parts]]\nname = {a:?}\nload = 1.0\n[[parts]]\nname = {b:?}\nload = 1.0\n"
        )
    };
    let export = |name: &str| {
        Command::new(BIN)
            .args(["place", p.to_str().unwrap(), "--export"])
            .arg(dir.path().join(name))
            .output()
            .unwrap()
    };
    std::fs::write(&p, problem("x.1", "x_1")).unwrap();
    let o = export("clash");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("\"x.1\" and \"x_1\" would both live in the pool /parts/x_1"),
        "{err}"
    );
    assert!(!dir.path().join("clash").exists());
    std::fs::write(&p, problem("a\nb", "c")).unwrap();
    let o = export("quoted");
    assert!(o.status.success(), "{o:?}");
    let layout = sluice_types::cluster::ClusterLayout::from_toml(
        &std::fs::read_to_string(dir.path().join("quoted/layout.toml")).unwrap(),
    )
    .unwrap();
    assert_eq!(layout.nodes[0].name.as_deref(), Some("q\"0"), "{layout:?}");
}

/// `GET /metrics` on a node's Prometheus endpoint (HTTP/1.1, one request).
fn scrape(addr: &str) -> Result<String, String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    if !text.starts_with("HTTP/1.1 200") {
        return Err(text);
    }
    Ok(text)
}

/// The value of the series `name` (with its labels as written), if shown.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Issue #19 (observability): the Prometheus endpoint shows each
/// operation's count and latency by pool, bytes, connections, store
/// operations and each UDL's calls and latency; a port already taken is
/// a clear start-up error naming the setting.
#[test]
fn metrics_endpoint_shows_requests_by_op_and_pool_and_udl_calls() {
    let dir = temp_dir("metrics");
    let port = free_base(1);
    let maddr = format!("127.0.0.1:{port}");
    let n = spawn_node(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
            "--metrics",
            &maddr,
        ],
    )
    .unwrap();
    n.ok(&["put", "/vol/m", "value"]);
    assert_eq!(n.ok(&["get", "/vol/m"]), "value\n");
    let f = dir.join("dfg.json");
    std::fs::write(
        &f,
        r#"[{"id": "m", "graph": [{"pathname": "/trig/m", "user_defined_logic_list": ["relay"],
             "destinations": [{"/vol/out": "put"}]}]}]"#,
    )
    .unwrap();
    n.ok(&["dfg", "apply", f.to_str().unwrap()]);
    n.ok(&["trigger", "/trig/m/a", "x"]);
    // Mirrored series refresh every second: wait for them, bounded.
    let want = [
        r#"sluice_request_duration_seconds_count{op="put",pool="/vol"}"#,
        r#"sluice_request_duration_seconds_count{op="get",pool="/vol"}"#,
        r#"sluice_request_duration_seconds_count{op="trigger_put",pool="/trig"}"#,
        r#"sluice_store_operations_total{op="put"}"#,
        r#"sluice_udl_calls_total{graph="m",vertex="/trig/m",udl="relay"}"#,
        r#"sluice_udl_duration_seconds_count{graph="m",vertex="/trig/m",udl="relay"}"#,
        "sluice_connections_accepted_total",
        "sluice_memory_in_use_bytes",
        "sluice_received_bytes_total",
        "sluice_sent_bytes_total",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = scrape(&maddr).unwrap_or_default();
        if want
            .iter()
            .all(|w| series(&text, w).is_some_and(|v| v >= 1.0))
        {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "missing series; the endpoint shows:\n{text}"
        );
        // Wait on the node's own output rather than sleeping blind.
        let _ = n.lines.recv_timeout(Duration::from_millis(100));
    };
    // Two puts (one by the CLI, one by the relay's `put` destination).
    assert_eq!(
        series(&text, r#"sluice_store_operations_total{op="put"}"#),
        Some(2.0)
    );
    assert_eq!(
        series(
            &text,
            r#"sluice_udl_failures_total{graph="m",vertex="/trig/m",udl="relay"}"#
        ),
        Some(0.0)
    );
    // Nothing waits once the relay ran, on any worker.
    let depths: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sluice_upcall_queue_depth{"))
        .collect();
    assert!(
        !depths.is_empty() && depths.iter().all(|l| l.ends_with(" 0")),
        "{depths:?}"
    );
    assert!(
        text.contains("# TYPE sluice_request_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains(r#"sluice_request_duration_seconds_bucket{op="get",pool="/vol",le="0.001"}"#),
        "{text}"
    );
    assert!(
        text.contains("# HELP sluice_request_duration_seconds"),
        "{text}"
    );
    // `sluice top` over the same endpoint: totals since the start, and
    // the lambda by vertex and UDL.
    let top: serde_json::Value = serde_json::from_str(&top_at(&[
        "--json",
        "top",
        "--metrics",
        &maddr,
        "--once",
        "--interval-ms",
        "100",
    ]))
    .unwrap();
    let node = &top[0];
    assert_eq!(node["addr"], maddr.as_str(), "{top}");
    let total = |list: &str, name: &str| {
        node[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["total"].as_u64().unwrap())
    };
    assert_eq!(total("ops", "put"), Some(1), "{top}");
    assert_eq!(total("ops", "get"), Some(1), "{top}");
    assert_eq!(total("ops", "trigger_put"), Some(1), "{top}");
    assert_eq!(total("lambdas", "/trig/m relay"), Some(1), "{top}");
    assert!(total("pools", "/vol").unwrap() >= 2, "{top}");
    let o = Command::new(BIN)
        .args(["top", "--metrics", "127.0.0.1:1", "--once"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("is the node started with --metrics 127.0.0.1:1?"),
        "{e}"
    );
    // The endpoint's port is taken: the second node refuses to start.
    let dir2 = temp_dir("metrics-taken");
    let e = serve_must_fail(
        &dir2,
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir2.join("data").to_str().unwrap(),
            "--metrics",
            &maddr,
        ],
    );
    assert!(e.contains("metrics.listen = ") && e.contains(&maddr), "{e}");
    let _ = std::fs::remove_dir_all(&dir2);
}

/// A node config with `[tls]` from `pki` (node 0's certificate).
fn tls_config(dir: &Path, pki: &sluice_tls::DevPki, require_client_cert: bool) -> PathBuf {
    let cfg = dir.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\nrequire_client_cert = {require_client_cert}\n",
            pki.nodes[0].0.display(),
            pki.nodes[0].1.display(),
            pki.ca.display()
        ),
    )
    .unwrap();
    cfg
}

fn tls_node(dir: &Path, cfg: &Path) -> Node {
    spawn_node(
        dir,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
        ],
    )
    .unwrap()
}

/// Issue #19: a node with `[tls]` serves clients that trust its CA and
/// nobody else (plaintext, another CA); an expired certificate is refused
/// as expired; with `require_client_cert` a client needs a certificate
/// from the CA.
#[test]
fn tls_nodes_serve_clients_that_trust_their_ca_and_nobody_else() {
    let dir = temp_dir("tls");
    let pki =
        sluice_tls::make_dev_pki(&dir.join("pki"), 1, sluice_tls::Validity::default()).unwrap();
    let other =
        sluice_tls::make_dev_pki(&dir.join("other"), 1, sluice_tls::Validity::default()).unwrap();
    let n = tls_node(&dir, &tls_config(&dir, &pki, false));
    let ca = pki.ca.to_str().unwrap();
    n.ok(&["--tls-ca", ca, "put", "/vol/s", "secret"]);
    assert_eq!(n.ok(&["--tls-ca", ca, "get", "/vol/s"]), "secret\n");
    let e = n.fails(&["get", "/vol/s"]);
    assert!(
        e.contains("if the node runs with TLS connect with its CA (--tls-ca)"),
        "{e}"
    );
    let e = n.fails(&["--tls-ca", other.ca.to_str().unwrap(), "get", "/vol/s"]);
    assert!(
        e.contains("TLS handshake") && e.contains("invalid peer certificate"),
        "{e}"
    );
    let e = n.fails(&["--tls-cert", "c.pem", "--tls-key", "k.pem", "get", "/vol/s"]);
    assert!(e.contains("need --tls-ca"), "{e}");
    drop(n);

    // An expired node certificate.
    let dir = temp_dir("tls-expired");
    let expired = sluice_tls::Validity {
        from_days: -30,
        to_days: -1,
    };
    let old = sluice_tls::make_dev_pki(&dir.join("pki"), 1, expired).unwrap();
    let n = tls_node(&dir, &tls_config(&dir, &old, false));
    let e = n.fails(&["--tls-ca", old.ca.to_str().unwrap(), "get", "/vol/s"]);
    assert!(e.contains("certificate expired"), "{e}");
    drop(n);

    // Mutual TLS.
    let dir = temp_dir("mtls");
    let pki =
        sluice_tls::make_dev_pki(&dir.join("pki"), 1, sluice_tls::Validity::default()).unwrap();
    let n = tls_node(&dir, &tls_config(&dir, &pki, true));
    let ca = pki.ca.to_str().unwrap();
    let e = n.fails(&["--tls-ca", ca, "get", "/vol/s"]);
    assert!(
        e.contains("CertificateRequired") && e.contains("pass --tls-cert and --tls-key"),
        "{e}"
    );
    let (cert, key) = (
        pki.client_cert.to_str().unwrap(),
        pki.client_key.to_str().unwrap(),
    );
    n.ok(&[
        "--tls-ca",
        ca,
        "--tls-cert",
        cert,
        "--tls-key",
        key,
        "put",
        "/vol/m",
        "x",
    ]);
    assert_eq!(
        n.ok(&[
            "--tls-ca",
            ca,
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "get",
            "/vol/m"
        ]),
        "x\n"
    );
}

/// Issue #19: `sluice dev --tls` is the secure setup in one command: a
/// local CA, mutual TLS among the nodes (their Raft traffic included) and
/// for clients, which find the files by themselves when run from there.
#[test]
fn dev_tls_runs_a_cluster_over_mutual_tls() {
    let dir = temp_dir("dev-tls");
    let base = free_base(3);
    let mut dev = Command::new(BIN)
        .args([
            "dev",
            "--tls",
            "--nodes",
            "3",
            "--base-port",
            &base.to_string(),
        ])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(dev.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..5 {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        lines.push(l);
    }
    assert!(lines[0].contains("3 nodes up"), "{lines:?}");
    assert!(lines[4].starts_with("tls: mutual TLS"), "{lines:?}");
    let cli = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let a2 = format!("127.0.0.1:{}", base + 2);
    let o = cli(&["put", "/vol/t", "over tls"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A follower answers a linearizable read: it asked the leader, over TLS.
    let o = cli(&["--addr", &a2, "get", "--linearizable", "/vol/t"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "over tls\n");
    // Without the client certificate: refused.
    let ca = dir.join("sluice-dev/tls/ca.pem");
    let o = cli(&[
        "--addr",
        &a2,
        "--tls-ca",
        ca.to_str().unwrap(),
        "get",
        "/vol/t",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("CertificateRequired"));
    unsafe {
        libc::kill(dev.id() as i32, libc::SIGINT);
    }
    assert!(dev.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sluice dev --dir D` elsewhere than `./sluice-dev` said client
/// commands run from here find the nodes in `D/endpoints`, but they look
/// in `./sluice-dev` only (so they failed, or reached another cluster):
/// it now prints what to export, and with that a command works.
#[test]
fn dev_in_another_directory_says_what_clients_need() {
    let dir = temp_dir("dev-dir");
    let base = free_base(1);
    let mut dev = Command::new(BIN)
        .args([
            "dev",
            "--tls",
            "--nodes",
            "1",
            "--base-port",
            &base.to_string(),
            "--dir",
            "elsewhere",
        ])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(dev.stdout.take().unwrap());
    let mut printed = String::new();
    let export = loop {
        let mut l = String::new();
        assert!(
            out.read_line(&mut l).unwrap() > 0,
            "sluice dev ended: {printed}"
        );
        printed += &l;
        if let Some(vars) = l.trim().strip_prefix("export ") {
            break vars.to_string();
        }
        assert!(
            !l.starts_with("Ctrl-C"),
            "no variables to export: {printed}"
        );
    };
    assert!(!printed.contains("from this directory"), "{printed}");
    let mut cmd = Command::new(BIN);
    for kv in export.split_whitespace() {
        let (k, v) = kv.split_once('=').unwrap();
        cmd.env(k, v);
    }
    let o = cmd
        .args(["put", "/vol/d", "x"])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{export}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    unsafe {
        libc::kill(dev.id() as i32, libc::SIGINT);
    }
    assert!(dev.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #19: a node listening beyond loopback without TLS says so.
#[test]
fn a_node_beyond_loopback_without_tls_warns() {
    let dir = temp_dir("exposed");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.join("data"))
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let found = (|| loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) if l.contains("listening beyond loopback without TLS") => return Some(l),
            Ok(_) => continue,
            Err(_) => return None,
        }
    })();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let line = found.expect("no warning about listening beyond loopback without TLS");
    assert!(
        line.contains("[tls]") && line.contains("0.0.0.0:"),
        "{line}"
    );
}

#[test]
fn bench_without_its_binary_says_how_to_build_it() {
    // A `sluice` with no `sluice-bench` beside it or on the PATH: a hard
    // link in a directory of its own next to the binary (a copy would be
    // open for writing while other tests fork, and exec would fail with
    // "Text file busy").
    let dir = Path::new(BIN)
        .parent()
        .unwrap()
        .join(format!("bench-alone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let alone = dir.join("sluice");
    let _ = std::fs::remove_file(&alone);
    std::fs::hard_link(BIN, &alone).unwrap();
    let out = Command::new(&alone)
        .args(["bench", "cluster"])
        .env("PATH", dir.join("nothing-here"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("not installed next to")
            && err.contains("cargo build --release -p sluice-bench"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sluice dev --nodes 3 --base-port 65534` failed with the parse error
/// of the layout it generated ("TOML parse error at line 14 ...
/// 127.0.0.1:65536"): it names the flag now, as `--metrics-base` did.
#[test]
fn dev_ports_past_the_range_name_the_flag() {
    let dir = temp_dir("dev-ports");
    // `top` with no --metrics and no `sluice dev --metrics-base` here says
    // where the addresses come from.
    let o = Command::new(BIN)
        .current_dir(&dir)
        .args(["top", "--once"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("no --metrics"), "{e}");
    for port in ["65534", "0"] {
        let o = Command::new(BIN)
            .args(["dev", "--nodes", "3", "--base-port", port, "--dir"])
            .arg(dir.join("sluice-dev"))
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{e}");
        assert!(
            e.contains(&format!("--base-port {port}: nodes 0..2 need ports")),
            "{e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sluice bench --help` said `Usage: sluice-bench [OPTIONS] [COMMAND]`,
/// a binary the user did not type: its help names `sluice bench` now.
#[test]
fn bench_help_names_the_command_typed() {
    let bench = Path::new(BIN).with_file_name("sluice-bench");
    if !bench.exists() {
        // `cargo test --workspace` (the README's command) builds it.
        eprintln!("skipped: no {} (build the workspace)", bench.display());
        return;
    }
    for args in [&["bench", "--help"][..], &["bench", "cluster", "--help"]] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let usage = text.lines().find(|l| l.starts_with("Usage:")).unwrap_or("");
        assert!(usage.starts_with("Usage: sluice bench"), "{args:?}: {text}");
        assert!(!text.contains("sluice-bench "), "{args:?}: {text}");
    }
}

/// A client's options given to `serve` were ignored: `serve --addr
/// 127.0.0.1:7531` listened on 7420, and `serve --tls-cert ... --tls-key
/// ...` served plaintext. They are refused now, saying where a node's
/// settings go; the same variables in the environment (a shell set up for
/// client commands) are left alone.
#[test]
fn client_options_given_to_serve_are_refused() {
    let dir = temp_dir("misplaced");
    for (args, named) in [
        (vec!["--addr", "127.0.0.1:1"], "--addr"),
        (
            vec!["--tls-cert", "node.pem", "--tls-key", "node-key.pem"],
            "--tls-cert, --tls-key",
        ),
        (vec!["--token", "slt_x"], "--token"),
    ] {
        // Bounded: where the options were ignored, a node started and ran.
        let mut child = Command::new(BIN)
            .arg("serve")
            .args(&args)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let status = loop {
            match child.try_wait().unwrap() {
                Some(s) => break Some(s),
                None if std::time::Instant::now() > deadline => break None,
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{args:?}: {err}");
        let _ = std::fs::remove_dir_all(dir.join("data"));
        assert!(
            err.contains(&format!("takes no {named}"))
                && err.contains("--listen")
                && err.contains("[tls]"),
            "{args:?}: {err}"
        );
    }
    let o = Command::new(BIN)
        .args(["fsck", "--addr", "127.0.0.1:1", "--data-dir"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("`sluice fsck` takes no --addr"),
        "{o:?}"
    );
    // Offline commands, which ignored them too.
    for cmd in [&["layout", "import", "x.json"][..], &["place", "x.toml"]] {
        let o = Command::new(BIN)
            .args(cmd)
            .args(["--addr", "127.0.0.1:1"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&o.stderr)
                .contains(&format!("`sluice {}` takes no --addr", cmd[0])),
            "{o:?}"
        );
    }
    // Nor a client's timeout or output mode, which it ignored.
    let o = Command::new(BIN)
        .args(["fsck", "--raw", "--timeout-ms", "5", "--data-dir"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("`sluice fsck` takes no --timeout-ms, --raw (options of the commands"),
        "{o:?}"
    );
    // `dev --addr` started its nodes on the ports of --base-port anyway
    // (bounded: where it was taken, the nodes came up and ran).
    let base = free_base(1).to_string();
    let (_, err) = must_fail(
        &dir,
        &[
            "dev",
            "--addr",
            "127.0.0.1:1",
            "--nodes",
            "1",
            "--base-port",
            &base,
            "--dir",
            "dev",
        ],
        Duration::from_secs(20),
    );
    assert!(
        err.contains("`sluice dev` takes no --addr") && err.contains("--base-port"),
        "{err}"
    );
    // `dev --layout L --base-port P` (or --nodes) took the layout's
    // addresses and said nothing of P: refused now (with the layout's
    // addresses in use, node 0 failed "address in use" on a port the user
    // had moved away from).
    let layout = dir.join("l.toml");
    std::fs::write(
        &layout,
        "version = 1\n[[nodes]]\nid = 0\naddress = \"127.0.0.1:1\"\n",
    )
    .unwrap();
    for flag in [["--base-port", base.as_str()], ["--nodes", "1"]] {
        let (_, err) = must_fail(
            &dir,
            &[
                "dev",
                "--layout",
                layout.to_str().unwrap(),
                flag[0],
                flag[1],
            ],
            Duration::from_secs(20),
        );
        assert!(
            err.contains(flag[0])
                && err.contains("cannot be used with")
                && err.contains("--layout"),
            "{err}"
        );
    }
    // From the environment: the node starts.
    let n = common::spawn_node_env(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
        ],
        &[("SLUICE_ADDR", "127.0.0.1:1"), ("SLUICE_TOKEN", "slt_x")],
    );
    assert!(n.is_ok(), "{:?}", n.err());
}

/// A reader that stops early (`sluice get K | head -c 10`) ends the
/// command quietly, as it ends `cat`: it printed "error: Broken pipe (os
/// error 32)" and exited 1.
#[test]
fn a_reader_that_goes_away_ends_a_command_quietly() {
    let n = start_node();
    let value = vec![b'v'; 4 << 20];
    let o = n.sluice_stdin(&["put", "/vol/big", "--stdin"], Some(&value));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut c = Command::new(BIN)
        .args(["--addr", &n.addr, "get", "/vol/big"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 10];
    c.stdout.take().unwrap().read_exact(&mut first).unwrap(); // then closed
    let out = c.wait_with_output().unwrap();
    assert_eq!(&first, b"vvvvvvvvvv");
    assert_eq!(out.status.code(), Some(141), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A layout of one cluster node on a free port in `dir/layout.toml`: a
/// volatile shard on it, and the subgroups `more` adds.
fn one_node_layout(dir: &Path, more: &str) {
    let port = free_base(1);
    let text = format!(
        "version = 1\n[[nodes]]\nid = 0\naddress = \"127.0.0.1:{port}\"\n\
         [[subgroups.volatile]]\nshards = [[0]]\n{more}"
    );
    std::fs::write(dir.join("layout.toml"), text).unwrap();
}

/// `sluice serve ARGS` in `dir`, once it has its shards' leaders; `dir`
/// is the test's to remove.
fn start_member(dir: &Path, args: &[&str]) -> Node {
    let mut n = spawn_node(dir, args).unwrap();
    n.dir = dir.join("kept");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !n.sluice(&["health"]).status.success() {
        assert!(std::time::Instant::now() < deadline, "no leader");
        std::thread::park_timeout(Duration::from_millis(20));
    }
    n
}

/// A cluster node started on an emptied data directory starts empty. It
/// served the volatile objects (with their versions and Raft state) of
/// the node that had the directory before: volatile shards' logs live
/// elsewhere (under /dev/shm by default, named after the data
/// directory's path) and outlived it. A plain restart keeps them.
#[test]
fn a_node_on_an_emptied_data_directory_does_not_serve_its_predecessors_volatile_objects() {
    let dir = temp_dir("pair");
    one_node_layout(
        &dir,
        "[[subgroups.persistent]]\nshards = [[0]]\n[[subgroups.trigger]]\nshards = [[0]]\n",
    );
    // The volatile logs outside the data directory, as under /dev/shm
    // (whether the default goes there depends on its free space).
    std::fs::write(
        dir.join("node.toml"),
        format!(
            "[cluster]\nvolatile_dir = \"{}\"\n",
            dir.join("volatile").display()
        ),
    )
    .unwrap();
    let args = [
        "--config",
        "node.toml",
        "--cluster",
        "layout.toml",
        "--node-id",
        "0",
        "--data-dir",
        "data",
    ];
    let start = || start_member(&dir, &args);
    let n = start();
    assert!(n.ok(&["put", "/vol/a", "old"]).contains("version 1"));
    assert!(n.terminate().success());
    let n = start();
    assert_eq!(n.ok(&["get", "/vol/a"]), "old\n", "a restart keeps them");
    assert!(n.terminate().success());

    std::fs::remove_dir_all(dir.join("data")).unwrap();
    let n = start();
    let e = n.fails(&["get", "/vol/a"]);
    assert!(e.contains("not found"), "{e}");
    assert!(n.ok(&["put", "/vol/b", "new"]).contains("version 1"));
    assert!(n.terminate().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cluster node's volatile logs outlive it (a restart finds them there)
/// but must not outlive its data directory: after a stopped node's data
/// directory was removed they held their RAM under /dev/shm (56 MiB for a
/// 20 MB shard) until the machine rebooted. The next node to start next to
/// them removes them; those of a node that is only stopped stay.
#[test]
fn volatile_logs_of_a_removed_data_directory_are_removed_by_the_next_node() {
    let dir = temp_dir("orphans");
    one_node_layout(&dir, "");
    // Roots named as the default names them under /dev/shm, in a
    // directory of this test's.
    let root = |data: &str| dir.join("shm").join(format!("sluice-{:0>16}", data));
    let start = |data: &str| {
        let cfg = dir.join(format!("{data}.toml"));
        let text = format!("[cluster]\nvolatile_dir = \"{}\"\n", root(data).display());
        std::fs::write(&cfg, text).unwrap();
        let args = [
            "--config",
            cfg.to_str().unwrap(),
            "--cluster",
            "layout.toml",
            "--node-id",
            "0",
            "--data-dir",
            data,
        ];
        start_member(&dir, &args)
    };
    let n = start("a");
    let value = vec![b'v'; 1 << 20];
    let o = n.sluice_stdin(&["put", "/vol/big", "--stdin"], Some(&value));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(n.terminate().success());
    let n = start("b");
    assert!(n.terminate().success());
    assert!(
        root("a").join("volatile-0-0").exists(),
        "a stopped node's logs stay"
    );

    std::fs::remove_dir_all(dir.join("a")).unwrap();
    let n = start("b");
    assert!(
        !root("a").exists(),
        "the removed data directory's logs are gone"
    );
    assert!(
        root("b").join("volatile-0-0").exists(),
        "the running node's stay"
    );
    assert!(n.terminate().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sluice dump` and `sluice load`: a persistent pool with every version
/// (a remove and a binary value among them) and a volatile pool go from
/// one node to another; a dump cut short is refused before anything is
/// written, as are another format and a pool of another type.
#[test]
fn dump_and_load_copy_pools_with_their_history_and_refuse_a_cut_dump() {
    let (a, b) = (start_node(), start_node());
    let dir = temp_dir("dump");
    a.ok(&[
        "pools",
        "create",
        "/p",
        "--type",
        "persistent",
        "--keep-versions",
        "9",
    ]);
    a.ok(&["put", "/p/k", "one"]);
    a.ok(&["put", "/p/k", "two"]);
    a.ok(&["rm", "/p/k"]);
    a.ok(&["put", "/p/k", "three"]);
    let binary = b"line\n\x00\xff{\"end\":{}}\n".to_vec();
    let o = a.sluice_stdin(&["put", "/p/bin", "--stdin"], Some(&binary));
    assert!(o.status.success(), "{o:?}");
    a.ok(&["put", "/vol/v", "vee"]);
    // A key with more versions than a page of history (64), through the
    // shell: one process (in a pool that keeps them all).
    a.ok(&["pools", "create", "/h", "--type", "persistent"]);
    let script: String = (0..150).map(|i| format!("put /h/many v{i}\n")).collect();
    assert!(a
        .sluice_stdin(&["shell"], Some(script.as_bytes()))
        .status
        .success());

    let all = dir.join("all.dump");
    let o = a.sluice(&["dump", "/", "--history", "--out", all.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("156 objects"), "{said}");
    // To standard output as well (piped here), the same records.
    let piped = a.sluice(&["dump", "/p"]);
    assert!(piped.stdout.starts_with(b"{\"created_us\""), "{piped:?}");
    // One pool is said as one ("dumped 1 pools" before).
    let said = String::from_utf8_lossy(&piped.stderr);
    assert!(said.starts_with("dumped 1 pool, "), "{said}");

    let loaded = b.ok(&["load", all.to_str().unwrap()]);
    assert!(
        loaded.contains("156 objects") && loaded.contains("created"),
        "{loaded}"
    );
    let many = b.ok(&["history", "/h/many"]);
    let values: Vec<String> = many
        .lines()
        .map(|l| l.rsplit('\t').next().unwrap().to_string())
        .collect();
    let want: Vec<String> = (0..150).rev().map(|i| format!("v{i}")).collect();
    assert_eq!(values, want);
    let history = b.ok(&["history", "/p/k"]);
    let values: Vec<&str> = history
        .lines()
        .map(|l| l.rsplit('\t').next().unwrap())
        .collect();
    assert_eq!(values, ["three", "(removed)", "two", "one"], "{history}");
    assert_eq!(b.sluice(&["get", "/p/bin"]).stdout, binary);
    assert_eq!(b.ok(&["get", "/vol/v"]), "vee\n");
    assert!(b.ok(&["pools", "show", "/p"]).contains("keep_versions = 9"));

    // Cut anywhere, the dump is refused and nothing of it written.
    // (Its pools renamed, byte for byte: the binary value stays as it is.)
    let rename = |bytes: &[u8], from: &[u8], to: &[u8]| -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i..].starts_with(from) {
                out.extend_from_slice(to);
                i += from.len();
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        out
    };
    let renamed = rename(&std::fs::read(&all).unwrap(), b"\"/p", b"\"/q");
    for cut in [renamed.len() / 2, renamed.len() - 2, renamed.len() - 40] {
        let part = dir.join("cut.dump");
        std::fs::write(&part, &renamed[..cut]).unwrap();
        let e = b.fails(&["load", part.to_str().unwrap()]);
        assert!(e.contains("cut short"), "cut at {cut}: {e}");
    }
    let e = b.fails(&["pools", "show", "/q"]);
    assert!(e.contains("not found"), "{e}");
    // Another format, another pool type, not a dump at all.
    let other = dir.join("v2.dump");
    std::fs::write(&other, "{\"sluice_dump\":2}\n").unwrap();
    let e = b.fails(&["load", other.to_str().unwrap()]);
    assert!(e.contains("format 2"), "{e}");
    b.ok(&["pools", "create", "/r", "--type", "volatile"]);
    let typed = dir.join("typed.dump");
    std::fs::write(&typed, rename(&renamed, b"\"/q", b"\"/r")).unwrap();
    let e = b.fails(&["load", typed.to_str().unwrap()]);
    assert!(e.contains("pool /r is Volatile here but Persistent"), "{e}");
    // ... before anything was written: the pools listed before /r in
    // the dump got none of their objects again.
    assert_eq!(b.ok(&["history", "/h/many"]).lines().count(), 150);
    let huge = dir.join("huge.dump");
    std::fs::write(
        &huge,
        "{\"sluice_dump\":1}\n{\"key\":\"/vol/x\",\"size\":18446744073709551615}\nx\n",
    )
    .unwrap();
    let e = b.fails(&["load", huge.to_str().unwrap()]);
    assert!(e.contains("damaged"), "{e}");
    let e = b.fails(&["load", all.parent().unwrap().to_str().unwrap()]);
    assert!(e.contains("not a dump") || e.contains("directory"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `[limits] max_memory_bytes`: a node filled to its limit refuses puts
/// with `OutOfMemory` (it had no limit: filled past the machine's memory
/// it was killed by the kernel, with every replica of its shards), keeps
/// serving reads and removes, takes puts again once keys are removed,
/// and `stats` shows its memory.
#[test]
fn a_node_at_its_memory_limit_refuses_writes_and_takes_them_after_removes() {
    let dir = temp_dir("memory");
    let cfg = dir.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[limits]\nmax_memory_bytes = {}\n",
            dir.join("data").display(),
            48 << 20
        ),
    )
    .unwrap();
    let n = spawn_node(&dir, &["--config", cfg.to_str().unwrap()]).unwrap();
    let value = dir.join("value");
    std::fs::write(&value, vec![7u8; 1 << 20]).unwrap();
    let file = value.to_str().unwrap();
    let mut stored = 0;
    let refusal = loop {
        assert!(stored < 200, "no refusal after {stored} MB");
        let o = n.sluice(&["put", &format!("/vol/k{stored}"), "--file", file]);
        if !o.status.success() {
            break String::from_utf8_lossy(&o.stderr).to_string();
        }
        stored += 1;
    };
    assert!(
        stored >= 30
            && refusal.contains("at its limit of 50331648 bytes")
            && refusal.contains("reads and removes go on"),
        "after {stored}: {refusal}"
    );
    // Reads go on; a removed key's memory takes the next put.
    assert_eq!(n.ok(&["size", "/vol/k0"]).trim(), "1048576");
    for i in 0..4 {
        n.ok(&["rm", &format!("/vol/k{i}")]);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !n
        .sluice(&["put", "/vol/after", "--file", file])
        .status
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "still refused after removes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = n.ok(&["stats"]);
    assert!(
        stats.contains("max bytes 50331648") && stats.contains("refused writes"),
        "{stats}"
    );
}

/// A damaged line in the pool table's log (`pools.log`, a line per pool
/// change): the node refuses to start naming the file and line and what
/// to run, `sluice fsck` reports it (it did not read the pool table), and
/// `--repair` cuts the log before that line, keeping the rest as
/// evidence; the node then starts with the changes before it.
#[test]
fn a_damaged_pool_table_log_is_reported_and_repaired_by_fsck() {
    let data = temp_dir("fsck-pools");
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ];
    let n = spawn_node(&temp_dir("fsck-pools-node"), &args).unwrap();
    for p in ["/p1", "/p2", "/p3"] {
        n.ok(&["pools", "create", p, "--type", "volatile"]);
    }
    assert!(n.terminate().success());
    let log = data.join("pools.log");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The line of /p2's creation, made unreadable.
    let k = lines
        .iter()
        .position(|l| l.contains("\"/p2\""))
        .expect("/p2 in the log");
    let kept: String = lines[..k].iter().map(|l| format!("{l}\n")).collect();
    let damaged = format!(
        "{kept}{{x{}\n{}\n",
        &lines[k][1..],
        lines[k + 1..].join("\n")
    );
    let line = format!("line {}", k + 1);
    std::fs::write(&log, &damaged).unwrap();
    let e = serve_must_fail(&data, &args);
    assert!(
        e.contains("pools.log") && e.contains(&line) && e.contains("sluice fsck --repair"),
        "{e}"
    );
    let fsck = |extra: &[&str]| fsck_at(&data, extra);
    let out = fsck_dry_run_finds_damage(&data);
    assert!(
        out.contains("pool table log") && out.contains("CORRUPT") && out.contains(&line),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        damaged,
        "a dry run changes nothing"
    );
    let o = fsck(&["--repair"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("after its first {k} lines")) && out.contains("lost"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap(), kept);
    assert!(fsck(&[]).status.success(), "clean after the repair");
    let n = spawn_node(&temp_dir("fsck-pools-node"), &args).unwrap();
    let pools = n.ok(&["pools", "ls"]);
    assert!(pools.contains("/p1") && !pools.contains("/p2"), "{pools}");
    drop(n);
    let _ = std::fs::remove_dir_all(&data);
}

/// A node's clients can no longer take the file descriptors it needs
/// itself. With `ulimit -n` at 1,024 (a systemd service's soft limit) and
/// `max_connections` at 1,024, a fleet of clients left the node unable to
/// start a log segment: every put to a persistent pool failed with "Too
/// many open files" (and in a cluster the member's Raft group stopped for
/// good), and the next client hung until its handshake timed out. Now the
/// node keeps a reserve (half of a limit this small) and refuses clients
/// beyond the rest with a typed "at its limit of N connections".
#[test]
fn clients_cannot_take_the_descriptors_a_node_needs() {
    let dir = temp_dir("fds");
    let cfg = dir.join("node.toml");
    // Small segments: the puts below start new ones.
    std::fs::write(&cfg, "[persistent]\nsegment_bytes = 65536\n").unwrap();
    let data = dir.join("data");
    let node = spawn_node_with(
        &dir,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
        Some(128),
    )
    .unwrap();
    node.ok(&["pools", "create", "/per", "persistent"]);
    let mut clients = Vec::new();
    let refused = loop {
        match sluice_client::BlockingClient::connect(&node.addr) {
            Ok(c) => {
                c.put(&format!("/per/c{}", clients.len()), "v").unwrap();
                clients.push(c);
                assert!(clients.len() <= 128, "every client was let in");
            }
            Err(e) => break e,
        }
    };
    assert_eq!(clients.len(), 64, "a reserve of 64 of 128 descriptors");
    assert!(
        matches!(
            refused,
            sluice_client::SluiceError::TooManyConnections { max: 64 }
        ),
        "{refused}"
    );
    assert_eq!(
        clients[0].server_info().limits.max_connections,
        64,
        "announced"
    );
    // The node still starts log segments (each put below is one).
    for i in 0..24u8 {
        clients[0]
            .put(&format!("/per/big{i}"), vec![i; 64 << 10])
            .unwrap();
    }
    for i in 0..24u8 {
        let o = clients[1].get(&format!("/per/big{i}")).unwrap();
        assert_eq!(o.value[..], vec![i; 64 << 10][..]);
    }
    // And it said why it takes no more, as it started.
    assert!(
        node.before
            .iter()
            .any(|l| l.contains("accepting at most 64 client connections")),
        "no warning about the connection limit: {:?}",
        node.before
    );
}

/// A container's /dev/shm is 64 MB unless it is given more, and a Python
/// lambda's shared memory lives there (a vertex's landing area alone is
/// 64 MiB): once large values had filled it, the next write to a page of
/// it killed the node with SIGBUS. Now the node reserves what it writes
/// first, and without room the lambda's call fails, saying what to do.
/// Runs the node in a mount namespace of its own whose /dev/shm is a
/// 48 MB tmpfs (skipped where that is not allowed, or without python3).
#[test]
fn a_full_dev_shm_fails_a_lambdas_call_not_the_node() {
    let allowed = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=1m tmpfs /dev/shm")
        .output()
        .is_ok_and(|o| o.status.success());
    if !allowed || !python3_present() {
        eprintln!("no mount namespace (or no python3) here: skipped");
        return;
    }
    let dir = temp_dir("shm");
    let udls = dir.join("udls");
    std::fs::create_dir_all(&udls).unwrap();
    std::fs::write(
        udls.join("echo.py"),
        "class Echo:\n    def __init__(self, conf):\n        pass\n\n    \
         def ocdpo_handler(self, key_suffix, blob, emit, context, **kw):\n        \
         emit(key_suffix, bytes(blob))\n",
    )
    .unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=48m tmpfs /dev/shm && exec \"$0\" serve \"$@\"")
        .arg(BIN)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"));
    let mut node = spawn_node_cmd(&dir, cmd).unwrap();
    let dfg = serde_json::json!([{ "id": "echo", "graph": [
        { "pathname": "/trig/in", "user_defined_logic_list": ["python"],
          "user_defined_logic_config_list": [{ "python_path": [udls.to_str().unwrap()],
              "module": "echo", "entry_class": "Echo", "workers": 1 }],
          "destinations": [{ "/vol/out": "put" }] }
    ]}]);
    let graph = dir.join("graph.json");
    std::fs::write(&graph, dfg.to_string()).unwrap();
    node.ok(&["dfg", "apply", graph.to_str().unwrap()]);
    let value = dir.join("value");
    std::fs::write(&value, vec![7u8; 12 << 20]).unwrap();
    for i in 0..8 {
        node.ok(&[
            "trigger",
            &format!("/trig/in/{i}"),
            "--file",
            value.to_str().unwrap(),
        ]);
    }
    // Every call done (ran or failed), the node alive through them.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let listed = loop {
        let o = node.ok(&["dfg", "ls", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&o).unwrap();
        if v[0]["status"][0]["calls"].as_u64() == Some(8) {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "calls not done: {v}");
        assert!(node.child.try_wait().unwrap().is_none(), "the node died");
        std::thread::sleep(Duration::from_millis(50));
    };
    let st = &listed[0]["status"][0];
    assert!(
        st["failures"].as_u64().unwrap() > 0,
        "48 MB held every value: {listed}"
    );
    let last = st["last_error"].to_string();
    assert!(last.contains("--shm-size"), "{last}");
    assert!(node.child.try_wait().unwrap().is_none(), "the node died");
    node.ok(&["put", "/vol/after", "still here"]);
}
