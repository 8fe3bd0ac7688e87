//! `sluice dev --nodes N`: a local cluster of real node processes with a
//! default layout, torn down on Ctrl-C or SIGTERM; its nodes end with it
//! however it ends (`PR_SET_PDEATHSIG`).

use anyhow::{bail, Context, Result};
use sluice_client::BlockingClient;
use sluice_types::cluster::ClusterLayout;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct DevArgs {
    /// Number of nodes (one volatile shard replicated on all of them).
    #[arg(long, default_value_t = 3, conflicts_with = "layout")]
    nodes: u32,
    /// Node i listens on 127.0.0.1:(base_port + i); node 0 on the port
    /// every client command uses by default.
    #[arg(long, default_value_t = 7420, conflicts_with = "layout")]
    base_port: u16,
    /// Where the nodes keep their data and logs.
    #[arg(long, default_value = "./sluice-dev")]
    dir: PathBuf,
    /// Start from empty data directories.
    #[arg(long)]
    fresh: bool,
    /// Start the nodes of this layout instead (Sluice's TOML, e.g. what
    /// `sluice plan --export` wrote, or Cascade's layout.json); the nodes
    /// and their addresses are the layout's (--nodes and --base-port are
    /// refused with it).
    #[arg(long)]
    layout: Option<PathBuf>,
    /// Data flow graphs to apply once the cluster is up (`serve --dfgs`).
    #[arg(long)]
    dfgs: Option<PathBuf>,
    /// Alias file for UDL names (`serve --udl-aliases`).
    #[arg(long)]
    udl_aliases: Option<PathBuf>,
    /// Serve node i's Prometheus metrics on 127.0.0.1:(PORT + i) (`sluice
    /// top` reads them; README: Observability).
    #[arg(long, value_name = "PORT")]
    metrics_base: Option<u16>,
    /// TLS everywhere: a local CA and certificates in DIR/tls (made once,
    /// kept across restarts), mutual TLS among the nodes and for clients;
    /// client commands run from here use them by themselves.
    #[arg(long)]
    tls: bool,
}

/// The development CA and certificates in `dir` (made when missing).
fn dev_pki(dir: &Path, nodes: u32) -> Result<sluice_tls::DevPki> {
    let files = sluice_tls::DevPki::at(dir, nodes);
    if files.complete() {
        return Ok(files);
    }
    Ok(sluice_tls::make_dev_pki(
        dir,
        nodes,
        sluice_tls::Validity::default(),
    )?)
}

/// Node `id`'s metrics address under `--metrics-base`.
fn metrics_addr(base: u16, id: u32) -> Result<String> {
    let port = u32::from(base) + id;
    anyhow::ensure!(
        port <= u32::from(u16::MAX),
        "--metrics-base {base}: node {id} would need port {port}"
    );
    Ok(format!("127.0.0.1:{port}"))
}

/// The default local layout: node ids 0..n on consecutive ports; a
/// volatile subgroup with one shard on every node, a persistent and a
/// trigger subgroup likewise (so the default pools /vol and /trig work
/// unchanged, and `pools create /p --type persistent` gives a replicated
/// persistent pool).
pub fn default_layout(n: u32, base_port: u16) -> String {
    let mut s = String::from("# Written by `sluice dev`.\nversion = 1\n");
    for i in 0..n {
        s.push_str(&format!(
            "\n[[nodes]]\nid = {i}\naddress = \"127.0.0.1:{}\"\n",
            u32::from(base_port) + i
        ));
    }
    let all: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let members = all.join(", ");
    s.push_str(&format!(
        "\n[[subgroups.volatile]]\nshards = [[{members}]]\n\n[[subgroups.persistent]]\nshards = [[{members}]]\n\n[[subgroups.trigger]]\nshards = [[{members}]]\n"
    ));
    s
}

/// The command line that runs node `id` of a `sluice dev` cluster (what
/// `sluice dev` starts, and what restarts a node that was stopped).
fn node_args(dir: &Path, layout: &Path, id: u32) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec![
        "serve".into(),
        "--config".into(),
        dir.join(format!("node-{id}.toml")).into(),
        "--cluster".into(),
        layout.into(),
        "--node-id".into(),
        id.to_string().into(),
        "--data-dir".into(),
        dir.join(format!("node-{id}")).into(),
    ];
    // What `sluice dev` was given for DFGs, kept next to the layout.
    let aliases = dir.join("udl_aliases.cfg");
    if aliases.exists() {
        args.extend(["--udl-aliases".into(), aliases.into()]);
    }
    args
}

/// What to type to restart node `id` by hand, its log appended to.
fn restart_hint(exe: &Path, dir: &Path, layout: &Path, id: u32) -> String {
    let args: Vec<String> = node_args(dir, layout, id)
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    format!(
        "{} {} >> {} 2>&1 &",
        exe.display(),
        args.join(" "),
        dir.join(format!("node-{id}.log")).display()
    )
}

fn spawn_node(
    exe: &Path,
    dir: &Path,
    layout: &Path,
    id: u32,
    extra: &[std::ffi::OsString],
    config: &str,
) -> Result<Child> {
    let log = std::fs::File::create(dir.join(format!("node-{id}.log")))?;
    // Everything under --dir (so --fresh really starts afresh).
    let cfg = dir.join(format!("node-{id}.toml"));
    let mut text = format!(
        "[cluster]\nvolatile_dir = \"{}\"\n",
        dir.join(format!("node-{id}"))
            .join("raft-volatile")
            .display()
    );
    text.push_str(config);
    std::fs::write(&cfg, text)?;
    let mut cmd = Command::new(exe);
    cmd.args(node_args(dir, layout, id))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // The nodes end with this command however it ends (even SIGKILL).
    ends_with_parent(&mut cmd);
    cmd.spawn().with_context(|| format!("starting node {id}"))
}

/// Waits until every node process this command started is up (it wrote
/// its "listening on" line: so the port answers for it, not for some other
/// cluster's process) and every group has a leader. A node that exits
/// meanwhile fails the wait at once, with the end of its log.
fn wait_ready(
    addr: &str,
    dir: &Path,
    children: &mut [(u32, Child)],
    timeout: Duration,
    tls: Option<sluice_tls::ClientTls>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        for (i, c) in children.iter_mut() {
            if let Some(status) = c.try_wait()? {
                bail!(
                    "node {i} exited during start ({status}):\n{}",
                    log_tail(dir, *i, 5)
                );
            }
        }
        let listening: Vec<u32> = children
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| log_tail(dir, *i, usize::MAX).contains("listening on"))
            .collect();
        if listening.len() < children.len() {
            last = format!("{} of {} nodes listening", listening.len(), children.len());
        } else {
            let cfg = sluice_client::ClientConfig {
                addr: addr.to_string(),
                tls: tls.clone(),
                ..Default::default()
            };
            // A node knows the leaders of the groups it is a member of
            // only, so every node is asked (a layout need not put node 0
            // in every shard).
            let ids: Vec<u32> = children.iter().map(|(i, _)| *i).collect();
            match BlockingClient::connect_with(cfg).and_then(|c| {
                ids.iter()
                    .map(|&i| c.cluster_command(serde_json::json!({"op": "info"}), Some(i)))
                    .collect::<sluice_types::Result<Vec<_>>>()
            }) {
                Ok(infos) => match leaderless(&infos) {
                    None => return Ok(()),
                    Some(groups) => last = format!("waiting for leaders of {groups}"),
                },
                Err(e) => last = e.to_string(),
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the cluster did not become ready within {timeout:?} ({last})")
}

/// The groups (the metadata group, shards) no node's `info` names a
/// leader for, or None when every one has a leader.
fn leaderless(infos: &[serde_json::Value]) -> Option<String> {
    let mut groups: std::collections::BTreeMap<&str, bool> = Default::default();
    for info in infos {
        for (name, shard) in info["shards"].as_object().into_iter().flatten() {
            *groups.entry(name).or_default() |= !shard["leader"].is_null();
        }
        *groups.entry("meta").or_default() |= !info["meta_leader"].is_null();
    }
    let missing: Vec<&str> = groups
        .iter()
        .filter(|(_, led)| !**led)
        .map(|(g, _)| *g)
        .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// The last `n` lines of node `i`'s log.
fn log_tail(dir: &Path, i: u32, n: usize) -> String {
    let text = std::fs::read_to_string(dir.join(format!("node-{i}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Writes the cluster's layout (the default one, or --layout's converted
/// to TOML) and alias file into --dir; returns the layout and its path.
fn write_layout(a: &DevArgs) -> Result<(ClusterLayout, PathBuf)> {
    let layout_text = match &a.layout {
        None => default_layout(a.nodes, a.base_port),
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let l = ClusterLayout::from_text(&text)
                .map_err(|e| anyhow::anyhow!("layout {}: {e}", p.display()))?;
            format!(
                "# Written by `sluice dev` from {}.\n{}",
                p.display(),
                l.to_toml().map_err(anyhow::Error::msg)?
            )
        }
    };
    let parsed = ClusterLayout::from_toml(&layout_text).map_err(anyhow::Error::msg)?;
    let layout = a.dir.join("layout.toml");
    std::fs::write(&layout, &layout_text)?;
    let aliases = a.dir.join("udl_aliases.cfg");
    match &a.udl_aliases {
        Some(p) => {
            std::fs::copy(p, &aliases).with_context(|| format!("copying {}", p.display()))?;
        }
        None => {
            let _ = std::fs::remove_file(&aliases);
        }
    }
    Ok((parsed, layout))
}

/// `--tls`: the development CA and certificates, and how this command's
/// own client connects; without it, TLS files of an earlier run are
/// removed (client commands run from here take them as a sign the
/// cluster uses them).
fn dev_tls(
    a: &DevArgs,
    parsed: &ClusterLayout,
) -> Result<(Option<sluice_tls::DevPki>, Option<sluice_tls::ClientTls>)> {
    let dir = a.dir.join("tls");
    if !a.tls {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        return Ok((None, crate::tls::client()));
    }
    let ids = parsed.nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
    let pki = dev_pki(&dir, ids)?;
    let client = sluice_tls::ClientTls::new(&pki.ca, Some((&pki.client_cert, &pki.client_key)))?;
    Ok((Some(pki), Some(client)))
}

/// What node `id`'s config adds for `--metrics-base` and `--tls`.
fn node_config(a: &DevArgs, pki: Option<&sluice_tls::DevPki>, id: u32) -> Result<String> {
    let mut config = String::new();
    if let Some(b) = a.metrics_base {
        config.push_str(&format!(
            "\n[metrics]\nlisten = \"{}\"\n",
            metrics_addr(b, id)?
        ));
    }
    if let Some(p) = pki {
        let tls = p
            .node_section(id)
            .ok_or_else(|| anyhow::anyhow!("no certificate for node {id}"))?;
        config.push_str(&tls);
    }
    Ok(config)
}

/// How client commands reach the cluster: by themselves from this
/// directory when `dir` is where they look (`./sluice-dev`); else the
/// variables to export (they looked in `./sluice-dev` and found nothing,
/// or another cluster).
fn client_hint(dir: &Path, endpoints: &[String], pki: Option<&sluice_tls::DevPki>) -> String {
    let looked = Path::new(crate::DEV_ENDPOINTS)
        .parent()
        .unwrap_or(Path::new("."));
    let same = |a: &Path, b: &Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y);
    if same(dir, looked) {
        let tls = if pki.is_some() {
            " and its TLS files in tls/"
        } else {
            ""
        };
        return format!(
            "try (from this directory, client commands find the nodes in {}/endpoints{tls}; elsewhere pass --addr{}):",
            dir.display(),
            if pki.is_some() { ", --tls-ca, --tls-cert and --tls-key" } else { "" }
        );
    }
    let abs = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let mut vars = format!("SLUICE_ADDR={}", endpoints.join(","));
    if let Some(p) = pki {
        vars += &format!(
            " SLUICE_TLS_CA={} SLUICE_TLS_CERT={} SLUICE_TLS_KEY={}",
            abs(&p.ca).display(),
            abs(&p.client_cert).display(),
            abs(&p.client_key).display()
        );
    }
    format!(
        "client commands look for a dev cluster in ./{} only, so first:\n  export {vars}\nthen try:",
        looked.display()
    )
}

/// The lines about `--tls` and `--metrics-base` once the nodes are up.
fn print_extras(
    a: &DevArgs,
    parsed: &ClusterLayout,
    pki: Option<&sluice_tls::DevPki>,
) -> Result<()> {
    if let Some(p) = pki {
        println!(
            "tls: mutual TLS with the CA {} (a client's certificate: {})",
            p.ca.display(),
            p.client_cert.display()
        );
    }
    if let Some(b) = a.metrics_base {
        let all: Vec<String> = parsed
            .nodes
            .iter()
            .map(|n| metrics_addr(b, n.id))
            .collect::<Result<_>>()?;
        // `sluice top` run from here reads them by itself.
        std::fs::write(a.dir.join("metrics"), all.join("\n") + "\n")
            .with_context(|| format!("writing {}/metrics", a.dir.display()))?;
        println!("metrics: sluice top --metrics {}", all.join(","));
    } else {
        // One a killed earlier run left would point top at nothing.
        let _ = std::fs::remove_file(a.dir.join("metrics"));
    }
    Ok(())
}

/// `--nodes` and `--base-port` within their ranges, said here rather than
/// as the generated layout's parse error ("TOML parse error at line 14
/// ... 127.0.0.1:65536").
fn check_nodes(a: &DevArgs) -> Result<()> {
    if a.nodes == 0 || a.nodes > 64 {
        bail!("--nodes must be between 1 and 64");
    }
    let last = u32::from(a.base_port) + a.nodes - 1;
    if a.layout.is_none() && (a.base_port == 0 || last > u32::from(u16::MAX)) {
        bail!(
            "--base-port {}: nodes 0..{} need ports {}..={last}, within 1..=65535",
            a.base_port,
            a.nodes - 1,
            a.base_port
        );
    }
    Ok(())
}

pub fn run(a: DevArgs) -> Result<()> {
    check_nodes(&a)?;
    if a.fresh && a.dir.exists() {
        std::fs::remove_dir_all(&a.dir).with_context(|| format!("removing {}", a.dir.display()))?;
    }
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let (parsed, layout) = write_layout(&a)?;
    let exe = std::env::current_exe().context("finding the sluice binary")?;
    let (pki, client_tls) = dev_tls(&a, &parsed)?;
    let mut children = Vec::new();
    for (k, n) in parsed.nodes.iter().enumerate() {
        // One node applies --dfgs; the metadata group gives them to all.
        let extra: Vec<std::ffi::OsString> = match (&a.dfgs, k) {
            (Some(d), 0) => vec!["--dfgs".into(), d.into()],
            _ => Vec::new(),
        };
        let config = node_config(&a, pki.as_ref(), n.id)?;
        children.push((
            n.id,
            spawn_node(&exe, &a.dir, &layout, n.id, &extra, &config)?,
        ));
    }
    let base = parsed.nodes[0].address.to_string();
    eprintln!(
        "sluice dev: starting {} nodes in {} ...",
        parsed.nodes.len(),
        a.dir.display()
    );
    if let Err(e) = wait_ready(
        &base,
        &a.dir,
        &mut children,
        Duration::from_secs(30),
        client_tls,
    ) {
        for (_, c) in &mut children {
            let _ = c.kill();
            let _ = c.wait();
        }
        return Err(e.context(format!("see the node logs in {}", a.dir.display())));
    }
    // Client commands run from here find every node by themselves (so
    // they still reach the cluster when node 0 is down).
    let endpoints: Vec<String> = parsed.nodes.iter().map(|n| n.address.to_string()).collect();
    std::fs::write(a.dir.join("endpoints"), endpoints.join("\n") + "\n")
        .with_context(|| format!("writing {}/endpoints", a.dir.display()))?;
    // Listening for SIGINT and SIGTERM before saying the nodes are up, so
    // a signal sent as soon as that line is read stops them in order.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut stop = {
        let _rt = rt.enter();
        crate::serve::StopSignals::listen()?
    };
    println!(
        "sluice dev: {} nodes up (layout {})",
        parsed.nodes.len(),
        layout.display()
    );
    for ((i, c), n) in children.iter().zip(&parsed.nodes) {
        println!(
            "  node {i}: {} (pid {}, log {}/node-{i}.log)",
            n.address,
            c.id(),
            a.dir.display()
        );
    }
    print_extras(&a, &parsed, pki.as_ref())?;
    let last = endpoints.last().cloned().unwrap_or_default();
    println!(
        "{}\n  sluice put /vol/a hello\n  sluice --addr {last} get /vol/a\n  sluice cluster status\nCtrl-C (or SIGTERM) stops every node.",
        client_hint(&a.dir, &endpoints, pki.as_ref())
    );
    let _ = std::io::stdout().flush();
    let mut reported = vec![false; children.len()];
    rt.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = stop.recv() => break,
                _ = tick.tick() => {
                    for (k, (i, c)) in children.iter_mut().enumerate() {
                        if reported[k] {
                            continue; // reaped: its pid may belong to another process now
                        }
                        if let Ok(Some(st)) = c.try_wait() {
                            eprintln!(
                                "sluice dev: node {i} exited ({st}); the others keep serving. Restart it with (stopped with the others when this command ends):\n  {}",
                                restart_hint(&exe, &a.dir, &layout, *i)
                            );
                            reported[k] = true;
                        }
                    }
                }
            }
        }
    });
    stop_nodes(&a.dir, &mut children, &reported);
    let _ = std::fs::remove_file(a.dir.join("endpoints"));
    let _ = std::fs::remove_file(a.dir.join("metrics"));
    Ok(())
}

/// Stops every node: the children still running (SIGTERM), then those
/// that exited and were restarted by hand (`reported`: their exit was
/// seen, and said how to restart them).
fn stop_nodes(dir: &Path, children: &mut [(u32, Child)], reported: &[bool]) {
    eprintln!("sluice dev: stopping");
    for (k, (_, c)) in children.iter_mut().enumerate() {
        // A reaped child's pid may have been given to another process:
        // only children still running (not reaped) are signalled.
        if reported[k] || !matches!(c.try_wait(), Ok(None)) {
            continue;
        }
        // SAFETY: signalling a child process we spawned and have not reaped.
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
    let restarted: Vec<u32> = children
        .iter()
        .zip(reported)
        .filter_map(|((i, _), r)| r.then_some(*i))
        .collect();
    stop_restarted(dir, &restarted);
}

/// Stops the nodes among `ids` that exited and were restarted by hand
/// (the command `run` printed): not children of this command, they are
/// found by the lock on their data directory, which names its holder.
/// Without this they outlived `sluice dev`, holding their port and data.
fn stop_restarted(dir: &Path, ids: &[u32]) {
    let mut waiting = Vec::new();
    for &i in ids {
        let data = dir.join(format!("node-{i}"));
        let Some(pid) = sluice_log::lock_holder(&data) else {
            continue;
        };
        eprintln!("sluice dev: stopping node {i} (pid {pid}, restarted by hand)");
        // SAFETY: signalling the process that holds node i's data
        // directory lock now (a live holder: the pid is not stale).
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
        waiting.push((i, data));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for (i, data) in waiting {
        while sluice_log::lock_holder(&data).is_some() {
            if std::time::Instant::now() > deadline {
                eprintln!("sluice dev: node {i} is still running after 20 s");
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Makes the kernel send the child of `cmd` SIGTERM when the thread that
/// starts it ends (Linux's `PR_SET_PDEATHSIG`): start it from the main
/// thread, so it ends with this command however that ends.
fn ends_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; nothing else runs between
        // fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}
