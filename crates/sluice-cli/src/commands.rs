//! Client commands, shared by the command line and `sluice shell`.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde_json::json;
use sluice_client::{
    BlockingClient, ClientConfig, Object, PoolMeta, PoolSpec, PoolType, VERSION_NONE,
};
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Subcommand, Debug)]
pub enum ClientCmd {
    /// Store a value: from VALUE, --file, or standard input.
    Put {
        key: String,
        /// The value (else --file, or standard input when it is piped).
        value: Option<String>,
        #[arg(long, conflicts_with = "value")]
        file: Option<PathBuf>,
        /// Read the value from standard input even when it is empty (an
        /// empty value) or a terminal.
        #[arg(long, conflicts_with_all = ["value", "file"])]
        stdin: bool,
        /// Only if the key's current version is this (`none`: only if absent).
        #[arg(long)]
        expect_version: Option<String>,
        /// put_and_forget: do not wait for the acknowledgement.
        #[arg(long)]
        forget: bool,
    },
    /// Fire lambdas and watchers without storing (trigger put).
    Trigger {
        key: String,
        value: Option<String>,
        #[arg(long, conflicts_with = "value")]
        file: Option<PathBuf>,
        /// Read the value from standard input even when it is empty or a
        /// terminal.
        #[arg(long, conflicts_with_all = ["value", "file"])]
        stdin: bool,
    },
    /// Print a value (latest, --version V, or --at TIMESTAMP_US).
    Get {
        key: String,
        /// In a cluster: read through the shard's leader after it confirms
        /// its leadership (default: a stable read from any member).
        #[arg(long, conflicts_with_all = ["version", "at"])]
        linearizable: bool,
        #[arg(long)]
        version: Option<u64>,
        #[arg(long, conflicts_with = "version")]
        at: Option<u64>,
        /// Write the value to a file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print version metadata instead of the value.
        #[arg(long)]
        meta: bool,
    },
    /// The version current at a timestamp (µs since the Unix epoch). A
    /// future timestamp waits until it is stable (bounded by --timeout-ms).
    GetByTime {
        key: String,
        timestamp_us: u64,
        /// Answer now even if the timestamp is not stable (the answer may change).
        #[arg(long)]
        unstable: bool,
    },
    /// Get several keys at once.
    Mget { keys: Vec<String> },
    /// Remove a key (writes a tombstone version).
    Rm {
        key: String,
        #[arg(long)]
        expect_version: Option<String>,
    },
    /// List the keys of a pool (persistent pools: as of a version or time).
    Ls {
        pool: String,
        #[arg(long)]
        prefix: Option<String>,
        #[arg(long)]
        at_version: Option<u64>,
        #[arg(long, conflicts_with = "at_version")]
        at_time: Option<u64>,
    },
    /// Every version of a key in a range, newest first (persistent pools).
    History {
        key: String,
        #[arg(long)]
        from_version: Option<u64>,
        #[arg(long)]
        to_version: Option<u64>,
        #[arg(long, conflicts_with_all = ["from_version", "to_version"])]
        from_time: Option<u64>,
        #[arg(long, conflicts_with_all = ["from_version", "to_version"])]
        to_time: Option<u64>,
    },
    /// Size of a value in bytes.
    Size {
        key: String,
        #[arg(long)]
        version: Option<u64>,
        #[arg(long, conflicts_with = "version")]
        at: Option<u64>,
    },
    /// Manage object pools.
    #[command(subcommand)]
    Pools(PoolsCmd),
    /// Print notifications for keys under a prefix.
    Watch {
        prefix: String,
        /// Stop after this many notifications.
        #[arg(long)]
        count: Option<u64>,
        /// Persistent pools: first replay every stored version from this
        /// one on (versions are numbered per shard), then go on live;
        /// resume after a reconnect from the last version seen + 1.
        #[arg(long)]
        from_version: Option<u64>,
        /// Persistent pools: first replay every version written at or
        /// after this time (µs since the epoch), then go on live.
        #[arg(long, conflicts_with = "from_version")]
        from_time: Option<u64>,
    },
    /// Manage data flow graphs (lambdas) on the node.
    #[command(subcommand)]
    Dfg(DfgCmd),
    /// Cluster membership, leaders and replication lag.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Server counters.
    Stats,
    /// Round trip time to the node.
    Ping,
    /// Whether the node serves: it answers, and in a cluster every group it
    /// is a member of has a leader. Exit code 0 when healthy, 1 when not
    /// (for scripts and probes).
    Health,
}

#[derive(clap::Subcommand, Debug)]
pub enum ClusterCmd {
    /// Every node's groups: role, term, leader, applied version, follower lag.
    Status,
    /// Add a node to a shard (it catches up from the leader, then votes).
    AddMember {
        /// The shard, e.g. volatile/0/0.
        shard: String,
        node: u32,
    },
    /// Remove a node from a shard (e.g. a dead one before replacing it).
    RemoveMember { shard: String, node: u32 },
    /// Fault injection (nodes started with --fault-injection): cut NODE's
    /// links to PEERS, both directions.
    Cut {
        node: u32,
        #[arg(required = true)]
        peers: Vec<u32>,
    },
    /// Fault injection: restore every link of NODE.
    Heal { node: u32 },
}

#[derive(clap::Subcommand, Debug)]
pub enum DfgCmd {
    /// Load graphs from a dfgs.json file (replaces graphs with the same id).
    Apply { file: PathBuf },
    /// List applied graphs with per-lambda counters.
    Ls,
    /// Remove a graph by id.
    Rm { id: String },
    /// One graph: its vertices, lambdas and counters (JSON).
    Show { id: String },
}

#[derive(clap::Subcommand, Debug)]
pub enum PoolsCmd {
    /// Create a pool.
    Create {
        path: String,
        #[arg(long = "type", value_parser = ["volatile", "persistent", "trigger"])]
        pool_type: String,
        /// Affinity set regex: keys whose matches are equal share a shard.
        #[arg(long)]
        affinity: Option<String>,
        #[arg(long, default_value_t = 0)]
        subgroup: u32,
        /// Pin a key to a shard: KEY=SHARD (repeatable).
        #[arg(long = "pin")]
        pins: Vec<String>,
        /// Persistent pools: keep at most this many versions per key.
        #[arg(long)]
        keep_versions: Option<u32>,
        /// Persistent pools: keep versions written in the last this-many seconds.
        #[arg(long)]
        keep_for_s: Option<u64>,
    },
    /// Remove a pool: its keys can no longer be read or written, but
    /// stay stored until `pools purge` (a new pool at the path is refused
    /// until then, so it always starts empty).
    Rm { path: String },
    /// Delete a removed pool's objects for good (every version, from
    /// memory and disk, on every replica) and free its path.
    Purge { path: String },
    /// List pools.
    Ls {
        /// Include deleted pools.
        #[arg(long)]
        all: bool,
    },
    /// Show one pool.
    Show { path: String },
    /// Which pool a key belongs to.
    Find { key: String },
}

pub fn connect(addr: &str, timeout_ms: u64) -> Result<BlockingClient> {
    BlockingClient::connect_with(ClientConfig {
        addr: addr.to_string(),
        request_timeout: Duration::from_millis(timeout_ms),
        client_name: "sluice-cli".into(),
        ..Default::default()
    })
    .with_context(|| format!("connecting to {addr}"))
}

/// Whether values are escaped for a terminal (set once by `main`).
static ESCAPE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn escape_values(on: bool) {
    ESCAPE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// A value as printed: as it is, or, on a terminal, when it is not plain
/// text, quoted with escapes as redis-cli does (`"\x00\xffa\n"`), so
/// binary bytes never reach the terminal.
fn shown(v: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if !ESCAPE.load(std::sync::atomic::Ordering::Relaxed) {
        return v.into();
    }
    escaped(v)
}

fn escaped(v: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let text = std::str::from_utf8(v).ok();
    let plain = text.is_some_and(|t| t.chars().all(|c| !c.is_control() || c == '\n' || c == '\t'));
    if plain {
        return v.into();
    }
    let mut out = String::from("\"");
    let push_byte = |out: &mut String, b: u8| match b {
        b'\n' => out.push_str("\\n"),
        b'\r' => out.push_str("\\r"),
        b'\t' => out.push_str("\\t"),
        b'"' => out.push_str("\\\""),
        b'\\' => out.push_str("\\\\"),
        0x20..=0x7e => out.push(b as char),
        _ => out.push_str(&format!("\\x{b:02x}")),
    };
    match text {
        // Valid UTF-8 with control characters: escape those, keep the rest.
        Some(t) => {
            for c in t.chars() {
                if c.is_ascii() {
                    push_byte(&mut out, c as u8);
                } else if c.is_control() {
                    for b in c.to_string().bytes() {
                        push_byte(&mut out, b);
                    }
                } else {
                    out.push(c);
                }
            }
        }
        None => v.iter().for_each(|b| push_byte(&mut out, *b)),
    }
    out.push('"');
    out.into_bytes().into()
}

pub fn run_once(addr: &str, timeout_ms: u64, json: bool, cmd: ClientCmd) -> Result<()> {
    let c = connect(addr, timeout_ms)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    execute(&c, cmd, json, &mut out, true)
}

fn parse_expect(s: &Option<String>) -> Result<Option<u64>> {
    match s.as_deref() {
        None => Ok(None),
        Some("none") => Ok(Some(VERSION_NONE)),
        Some(v) => v
            .parse()
            .map(Some)
            .with_context(|| format!("--expect-version {v:?} is not a version number or `none`")),
    }
}

/// The value of a put: the argument, a file, or standard input. Standard
/// input is read by itself only when it is piped and not empty (an empty
/// value stored by accident is worse than an error); `--stdin` reads it
/// whatever it holds.
fn read_value(
    value: Option<String>,
    file: Option<PathBuf>,
    stdin: bool,
    stdin_ok: bool,
) -> Result<Bytes> {
    let read_stdin = || -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading the value from standard input")?;
        Ok(buf)
    };
    match (value, file) {
        (Some(v), _) => Ok(Bytes::from(v)),
        (None, Some(f)) => Ok(Bytes::from(
            std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?,
        )),
        (None, None) if !stdin_ok => bail!("give a value or --file"),
        (None, None) if stdin => Ok(Bytes::from(read_stdin()?)),
        (None, None) if std::io::stdin().is_terminal() => {
            bail!("give a value, --file FILE, or pipe it in (--stdin reads the terminal)")
        }
        (None, None) => {
            let buf = read_stdin()?;
            if buf.is_empty() {
                bail!("standard input is empty: give a value ('' for an empty one), --file FILE, or --stdin to store what it holds")
            }
            Ok(Bytes::from(buf))
        }
    }
}

fn version_str(v: u64) -> String {
    if v == VERSION_NONE {
        "none".into()
    } else {
        v.to_string()
    }
}

fn object_json(o: &Object, with_value: bool) -> serde_json::Value {
    let mut j = json!({
        "key": &*o.key,
        "version": o.meta.version,
        "timestamp_us": o.meta.timestamp_us,
        "previous_version": o.meta.previous_version,
        "previous_version_by_key": if o.meta.previous_version_by_key == VERSION_NONE { serde_json::Value::Null } else { o.meta.previous_version_by_key.into() },
        "size": o.value.len(),
    });
    if with_value {
        match std::str::from_utf8(&o.value) {
            Ok(s) => j["value"] = s.into(),
            Err(_) => {
                j["value_hex"] = o
                    .value
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
                    .into()
            }
        }
    }
    j
}

fn pool_line(p: &PoolMeta) -> String {
    format!(
        "{:<24} {:<10} subgroup={} shards={} affinity={} pinned={}{}",
        p.pathname,
        p.pool_type,
        p.subgroup_index,
        p.shard_count,
        p.affinity_set_regex.as_deref().unwrap_or("-"),
        p.object_locations.len(),
        if p.deleted { " (deleted)" } else { "" }
    )
}

fn print_json(out: &mut dyn Write, v: &serde_json::Value) -> Result<()> {
    writeln!(out, "{}", serde_json::to_string_pretty(v)?)?;
    Ok(())
}

/// The items of a JSON array as text (numbers, node ids).
fn listed(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|m| m.to_string())
        .collect()
}

/// `cluster status`: every node's groups, asked of each node.
fn cluster_status(c: &BlockingClient, json: bool, out: &mut dyn Write) -> Result<()> {
    let info = c.cluster_command(json!({"op": "info"}), None)?;
    let nodes: Vec<u32> = info["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n["id"].as_u64().map(|i| i as u32))
                .collect()
        })
        .unwrap_or_default();
    let mut all = Vec::new();
    for n in nodes {
        match c.cluster_command(json!({"op": "status"}), Some(n)) {
            Ok(s) => all.push(s),
            Err(e) => all.push(json!({"node": n, "error": e.to_string()})),
        }
    }
    if json {
        return print_json(out, &json!({"epoch": info["epoch"], "nodes": all}));
    }
    writeln!(out, "metadata epoch {}", info["epoch"])?;
    writeln!(
        out,
        "{:<6} {:<16} {:<21} {:>5} {:>7} {:>9} {:>9} {:>9}  lag",
        "node", "group", "role", "term", "leader", "log", "applied", "version"
    )?;
    for s in &all {
        if let Some(e) = s.get("error") {
            writeln!(
                out,
                "{:<6} unreachable: {}",
                s["node"],
                e.as_str().unwrap_or("")
            )?;
            continue;
        }
        let t = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => "-".into(),
            v => v.to_string(),
        };
        for g in s["groups"].as_array().into_iter().flatten() {
            // Followers' lag in entries: "2:0 3:15" (none but on a leader).
            let lag: Vec<String> = g["lag"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(node, n)| format!("{node}:{n}"))
                .collect();
            writeln!(
                out,
                "{:<6} {:<16} {:<21} {:>5} {:>7} {:>9} {:>9} {:>9}  {}",
                t(&s["node"]),
                t(&g["group"]),
                t(&g["role"]),
                t(&g["term"]),
                t(&g["leader"]),
                t(&g["last_log_index"]),
                t(&g["applied_index"]),
                t(&g["applied_version"]),
                if lag.is_empty() {
                    "-".to_string()
                } else {
                    lag.join(" ")
                }
            )?;
        }
    }
    Ok(())
}

fn cluster(c: &BlockingClient, cmd: ClusterCmd, json: bool, out: &mut dyn Write) -> Result<()> {
    if c.async_client().cluster_epoch().is_none() {
        bail!("this node runs standalone (start nodes with --cluster LAYOUT, or try `sluice dev`)");
    }
    let (command, node) = match &cmd {
        ClusterCmd::Status => return cluster_status(c, json, out),
        ClusterCmd::AddMember { shard, node } => (
            json!({"op": "add_member", "shard": shard, "node": node}),
            None,
        ),
        ClusterCmd::RemoveMember { shard, node } => (
            json!({"op": "remove_member", "shard": shard, "node": node}),
            None,
        ),
        ClusterCmd::Cut { node, peers } => (json!({"op": "cut", "peers": peers}), Some(*node)),
        ClusterCmd::Heal { node } => (json!({"op": "heal"}), Some(*node)),
    };
    let r = c.cluster_command(command, node)?;
    if json {
        return print_json(out, &r);
    }
    match &cmd {
        ClusterCmd::AddMember { shard, node } | ClusterCmd::RemoveMember { shard, node } => {
            let members = listed(&r["members"]);
            let what = if matches!(cmd, ClusterCmd::AddMember { .. }) {
                "added to"
            } else {
                "removed from"
            };
            writeln!(
                out,
                "node {node} {what} {shard}; members now {}",
                members.join(", ")
            )?;
        }
        ClusterCmd::Cut { node, .. } | ClusterCmd::Heal { node } => {
            let cut = listed(&r["cut"]);
            if cut.is_empty() {
                writeln!(out, "node {node}: every link open")?;
            } else {
                writeln!(out, "node {node}: links to {} cut", cut.join(", "))?;
            }
        }
        ClusterCmd::Status => {}
    }
    Ok(())
}

/// Runs one client command. `stdin_ok` is false in the shell, where
/// standard input carries commands, not values.
pub fn execute(
    c: &BlockingClient,
    cmd: ClientCmd,
    json: bool,
    out: &mut dyn Write,
    stdin_ok: bool,
) -> Result<()> {
    let cmd = match cmd {
        ClientCmd::Pools(p) => return pools(c, p, json, out),
        ClientCmd::Cluster(cmd) => return cluster(c, cmd, json, out),
        ClientCmd::Dfg(cmd) => return dfg(c, cmd, json, out),
        other => other,
    };
    // Each group handles its own commands and hands back the others.
    let Some(cmd) = writes(c, cmd, json, out, stdin_ok)? else {
        return Ok(());
    };
    let Some(cmd) = reads(c, cmd, json, out)? else {
        return Ok(());
    };
    let Some(cmd) = lists(c, cmd, json, out)? else {
        return Ok(());
    };
    let Some(cmd) = watch(c, cmd, json, out)? else {
        return Ok(());
    };
    match node(c, cmd, json, out)? {
        None => Ok(()),
        Some(other) => bail!("internal error: no handler for {other:?}"),
    }
}

/// Puts, trigger puts and removes. Hands back a command it does not
/// handle.
fn writes(
    c: &BlockingClient,
    cmd: ClientCmd,
    json: bool,
    out: &mut dyn Write,
    stdin_ok: bool,
) -> Result<Option<ClientCmd>> {
    match cmd {
        ClientCmd::Put {
            key,
            value,
            file,
            stdin,
            expect_version,
            forget,
        } => {
            let v = read_value(value, file, stdin, stdin_ok)?;
            if forget {
                c.put_and_forget(&key, v)?;
                if json {
                    print_json(out, &json!({"key": key, "sent": true}))?;
                } else {
                    writeln!(out, "sent {key} (not acknowledged)")?;
                }
                return Ok(None);
            }
            let r = match parse_expect(&expect_version)? {
                Some(e) => c.put_if_version(&key, v, e)?,
                None => c.put(&key, v)?,
            };
            if json {
                print_json(
                    out,
                    &json!({"key": key, "version": r.version, "timestamp_us": r.timestamp_us}),
                )?;
            } else {
                writeln!(
                    out,
                    "{key} version {} timestamp_us {}",
                    r.version, r.timestamp_us
                )?;
            }
        }
        ClientCmd::Trigger {
            key,
            value,
            file,
            stdin,
        } => {
            let ts = c.trigger_put(&key, read_value(value, file, stdin, stdin_ok)?)?;
            if json {
                print_json(out, &json!({"key": key, "timestamp_us": ts}))?;
            } else {
                writeln!(out, "triggered {key} at {ts}")?;
            }
        }
        ClientCmd::Rm {
            key,
            expect_version,
        } => {
            let r = match parse_expect(&expect_version)? {
                Some(e) => c.remove_if_version(&key, e)?,
                None => c.remove(&key)?,
            };
            if json {
                print_json(
                    out,
                    &json!({"key": key, "version": r.version, "timestamp_us": r.timestamp_us, "removed": true}),
                )?;
            } else {
                writeln!(out, "removed {key} (tombstone version {})", r.version)?;
            }
        }
        other => return Ok(Some(other)),
    }
    Ok(None)
}

/// Reads of one key: latest, by version, by time, size. Hands back a
/// command it does not handle.
fn reads(
    c: &BlockingClient,
    cmd: ClientCmd,
    json: bool,
    out: &mut dyn Write,
) -> Result<Option<ClientCmd>> {
    match cmd {
        ClientCmd::Get {
            key,
            linearizable,
            version,
            at,
            out: file,
            meta,
        } => {
            let o = match (version, at) {
                (Some(v), _) => c.get_version(&key, v)?,
                (None, Some(ts)) => c.get_by_time(&key, ts)?,
                (None, None) if linearizable => c.get_linearizable(&key)?,
                (None, None) => c.get(&key)?,
            };
            if let Some(f) = &file {
                std::fs::write(f, &o.value).with_context(|| format!("writing {}", f.display()))?;
            }
            if json {
                print_json(out, &object_json(&o, !meta))?;
            } else if meta {
                writeln!(
                    out,
                    "{} version {} timestamp_us {} previous_version {} previous_version_by_key {} size {}",
                    o.key,
                    o.meta.version,
                    o.meta.timestamp_us,
                    o.meta.previous_version,
                    version_str(o.meta.previous_version_by_key),
                    o.value.len()
                )?;
            } else if let Some(f) = file {
                writeln!(
                    out,
                    "wrote {} bytes of {} version {} to {}",
                    o.value.len(),
                    o.key,
                    o.meta.version,
                    f.display()
                )?;
            } else {
                let v = shown(&o.value);
                out.write_all(&v)?;
                if v.last() != Some(&b'\n') && std::str::from_utf8(&v).is_ok() {
                    writeln!(out)?;
                }
            }
        }
        ClientCmd::GetByTime {
            key,
            timestamp_us,
            unstable: true,
        } => {
            let o = c.get_by_time_unstable(&key, timestamp_us)?;
            if json {
                print_json(out, &object_json(&o, true))?;
            } else {
                out.write_all(&shown(&o.value))?;
                writeln!(out)?;
            }
        }
        ClientCmd::GetByTime {
            key,
            timestamp_us,
            unstable: false,
        } => {
            return reads(
                c,
                ClientCmd::Get {
                    key,
                    linearizable: false,
                    version: None,
                    at: Some(timestamp_us),
                    out: None,
                    meta: false,
                },
                json,
                out,
            )
        }
        ClientCmd::Size { key, version, at } => {
            let n = c.get_size(&key, version, at)?;
            if json {
                print_json(out, &json!({"key": key, "size": n}))?;
            } else {
                writeln!(out, "{n}")?;
            }
        }
        other => return Ok(Some(other)),
    }
    Ok(None)
}

/// Reads of many keys: several keys, the keys of a pool, a key's history.
/// Hands back a command it does not handle.
fn lists(
    c: &BlockingClient,
    cmd: ClientCmd,
    json: bool,
    out: &mut dyn Write,
) -> Result<Option<ClientCmd>> {
    match cmd {
        ClientCmd::Mget { keys } => {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let res = c.multi_get(&refs)?;
            if json {
                let items: Vec<_> = keys
                    .iter()
                    .zip(&res)
                    .map(|(k, r)| match r {
                        Ok(o) => object_json(o, true),
                        Err(e) => json!({"key": k, "error": e.to_string()}),
                    })
                    .collect();
                print_json(out, &serde_json::Value::Array(items))?;
            } else {
                for (k, r) in keys.iter().zip(res) {
                    match r {
                        Ok(o) => writeln!(
                            out,
                            "{k}\tversion {}\t{}",
                            o.meta.version,
                            String::from_utf8_lossy(&shown(&o.value))
                        )?,
                        Err(e) => writeln!(out, "{k}\terror: {e}")?,
                    }
                }
            }
        }
        ClientCmd::Ls {
            pool,
            prefix,
            at_version,
            at_time,
        } => {
            let keys = match (at_version, at_time) {
                (Some(v), _) => c.list_keys_at(&pool, prefix.as_deref(), false, v)?,
                (None, Some(t)) => c.list_keys_at(&pool, prefix.as_deref(), true, t)?,
                (None, None) => c.list_keys(&pool, prefix.as_deref())?,
            };
            if json {
                print_json(out, &json!(keys))?;
            } else {
                for k in keys {
                    writeln!(out, "{k}")?;
                }
            }
        }
        ClientCmd::History {
            key,
            from_version,
            to_version,
            from_time,
            to_time,
        } => {
            let by_time = from_time.is_some() || to_time.is_some();
            let (from, to) = if by_time {
                (from_time.unwrap_or(0), to_time.unwrap_or(u64::MAX))
            } else {
                (from_version.unwrap_or(0), to_version.unwrap_or(u64::MAX))
            };
            let versions = c.history(&key, by_time, from, to, 256)?;
            if json {
                let items: Vec<_> = versions
                    .iter()
                    .map(|o| {
                        let mut j = object_json(o, true);
                        j["removed"] = o.meta.tombstone.into();
                        j
                    })
                    .collect();
                print_json(out, &serde_json::Value::Array(items))?;
            } else {
                for o in &versions {
                    let v = if o.meta.tombstone {
                        "(removed)".to_string()
                    } else {
                        String::from_utf8_lossy(&shown(&o.value)).into_owned()
                    };
                    writeln!(
                        out,
                        "version {}\ttimestamp_us {}\t{v}",
                        o.meta.version, o.meta.timestamp_us
                    )?;
                }
            }
        }
        other => return Ok(Some(other)),
    }
    Ok(None)
}

/// Notifications under a prefix, printed as they come. Hands back a
/// command it does not handle.
fn watch(
    c: &BlockingClient,
    cmd: ClientCmd,
    json: bool,
    out: &mut dyn Write,
) -> Result<Option<ClientCmd>> {
    match cmd {
        ClientCmd::Watch {
            prefix,
            count,
            from_version,
            from_time,
        } => {
            let from = from_version
                .map(sluice_wire::WatchFrom::Version)
                .or(from_time.map(sluice_wire::WatchFrom::Time));
            let mut w = match from {
                Some(f) => c.watch_from(&prefix, f)?,
                None => c.watch(&prefix)?,
            };
            if !json {
                match from {
                    Some(sluice_wire::WatchFrom::Version(v)) => writeln!(
                        out,
                        "watching {prefix} from version {v}: stored versions first, then live (Ctrl-C to stop)"
                    )?,
                    Some(sluice_wire::WatchFrom::Time(t)) => writeln!(
                        out,
                        "watching {prefix} from time {t} µs: stored versions first, then live (Ctrl-C to stop)"
                    )?,
                    None => writeln!(out, "watching {prefix} (Ctrl-C to stop)")?,
                }
            }
            out.flush()?;
            let mut seen = 0u64;
            while count.is_none_or(|n| seen < n) {
                let Some(n) = w.next() else {
                    bail!("connection closed")
                };
                seen += 1;
                let kind = serde_json::to_value(n.kind)?;
                if n.kind == sluice_wire::DeliveryKindWire::Lagged {
                    // Every loss is shown: how many, where, which versions.
                    let lost: serde_json::Value =
                        serde_json::from_slice(&n.object.value).unwrap_or(json!({}));
                    if json {
                        writeln!(
                            out,
                            "{}",
                            json!({"kind": kind, "prefix": &*n.object.key, "dropped": n.object.meta.version, "lost": lost})
                        )?;
                    } else {
                        let range = match (
                            lost["first_version"].as_u64(),
                            lost["last_version"].as_u64(),
                        ) {
                            (Some(a), Some(b)) if a != VERSION_NONE => {
                                format!(", versions {a} to {b}")
                            }
                            _ => String::new(),
                        };
                        if lost["where"] == "retention" {
                            writeln!(
                                out,
                                "lost: {} versions{range} were dropped by the pool's retention before they could be replayed",
                                n.object.meta.version,
                            )?;
                        } else {
                            writeln!(
                                out,
                                "lagged: {} notifications lost ({} fell behind{range}); the versions are still readable with get and history in a persistent pool",
                                n.object.meta.version,
                                lost["where"].as_str().unwrap_or("the watcher"),
                            )?;
                        }
                    }
                    out.flush()?;
                    continue;
                }
                if json {
                    let mut j = object_json(&n.object, true);
                    j["kind"] = kind;
                    writeln!(out, "{}", serde_json::to_string(&j)?)?;
                } else {
                    writeln!(
                        out,
                        "{} {} version {} {}",
                        kind.as_str().unwrap_or("?"),
                        n.object.key,
                        version_str(n.object.meta.version),
                        String::from_utf8_lossy(&shown(&n.object.value))
                    )?;
                }
                out.flush()?;
            }
        }
        other => return Ok(Some(other)),
    }
    Ok(None)
}

/// Data flow graphs: apply, list, show, remove.
fn dfg(c: &BlockingClient, cmd: DfgCmd, json: bool, out: &mut dyn Write) -> Result<()> {
    match cmd {
        DfgCmd::Apply { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let r = c
                .dfg_apply(&text)
                .with_context(|| format!("applying {}", file.display()))?;
            if json {
                print_json(out, &r)?;
            } else {
                let ids: Vec<&str> = r["applied"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
                    .collect();
                writeln!(out, "applied {}", ids.join(", "))?;
            }
        }
        DfgCmd::Ls => {
            let r = c.dfg_list()?;
            if json {
                print_json(out, &r)?;
            } else {
                for g in r.as_array().into_iter().flatten() {
                    writeln!(
                        out,
                        "{} {}",
                        g["id"].as_str().unwrap_or("?"),
                        g["desc"].as_str().unwrap_or("")
                    )?;
                    for st in g["status"].as_array().into_iter().flatten() {
                        writeln!(
                            out,
                            "  {:<28} {:<8} calls {} emitted {} failures {} panics {} dropped {}{}",
                            st["vertex"].as_str().unwrap_or("?"),
                            st["udl"].as_str().unwrap_or("?"),
                            st["calls"],
                            st["emitted"],
                            st["failures"],
                            st["panics"],
                            st["dropped"],
                            st["last_error"]
                                .as_str()
                                .map(|e| format!("  last error: {e}"))
                                .unwrap_or_default()
                        )?;
                    }
                }
            }
        }
        DfgCmd::Show { id } => {
            let r = c.dfg_list()?;
            let g = r
                .as_array()
                .into_iter()
                .flatten()
                .find(|g| g["id"] == id.as_str())
                .ok_or(sluice_client::SluiceError::DfgNotFound { id })?;
            print_json(out, g)?;
        }
        DfgCmd::Rm { id } => {
            c.dfg_remove(&id)?;
            if json {
                print_json(out, &json!({"removed": id}))?;
            } else {
                writeln!(out, "removed {id}")?;
            }
        }
    }
    Ok(())
}

/// The node itself: counters, health, round trip. Hands back a command
/// it does not handle.
fn node(
    c: &BlockingClient,
    cmd: ClientCmd,
    json: bool,
    out: &mut dyn Write,
) -> Result<Option<ClientCmd>> {
    match cmd {
        ClientCmd::Stats => {
            let s = c.stats()?;
            print_json(out, &s)?;
        }
        ClientCmd::Health => {
            let rtt = c.ping()?;
            let node = c.server_info().node_id;
            let mut leaderless = Vec::new();
            match c.cluster_command(json!({"op": "status"}), None) {
                Ok(st) => {
                    for g in st["groups"].as_array().into_iter().flatten() {
                        if g["leader"].is_null() {
                            leaderless.push(g["group"].as_str().unwrap_or("?").to_string());
                        }
                    }
                }
                // A standalone node has no groups to check.
                Err(sluice_client::SluiceError::NotSupported { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if json {
                print_json(
                    out,
                    &json!({"node": node, "healthy": leaderless.is_empty(), "rtt_us": rtt.as_micros() as u64, "groups_without_leader": leaderless}),
                )?;
            }
            if !leaderless.is_empty() {
                bail!(
                    "node {node} answers, but these groups have no leader: {}",
                    leaderless.join(", ")
                );
            }
            if !json {
                writeln!(
                    out,
                    "healthy: node {node} answered in {} µs",
                    rtt.as_micros()
                )?;
            }
        }
        ClientCmd::Ping => {
            let rtt = c.ping()?;
            if json {
                print_json(out, &json!({"rtt_us": rtt.as_micros() as u64}))?;
            } else {
                writeln!(
                    out,
                    "pong from node {} in {} µs",
                    c.server_info().node_id,
                    rtt.as_micros()
                )?;
            }
        }
        other => return Ok(Some(other)),
    }
    Ok(None)
}

fn pools(c: &BlockingClient, cmd: PoolsCmd, json: bool, out: &mut dyn Write) -> Result<()> {
    let show = |out: &mut dyn Write, p: &PoolMeta| -> Result<()> {
        if json {
            print_json(out, &serde_json::to_value(p)?)
        } else {
            writeln!(out, "{}", pool_line(p))?;
            Ok(())
        }
    };
    match cmd {
        PoolsCmd::Create {
            keep_versions,
            keep_for_s,
            path,
            pool_type,
            affinity,
            subgroup,
            pins,
        } => {
            let mut locations = std::collections::BTreeMap::new();
            for pin in pins {
                let (k, s) = pin
                    .rsplit_once('=')
                    .with_context(|| format!("--pin {pin:?} is not KEY=SHARD"))?;
                let shard: u32 = s
                    .parse()
                    .with_context(|| format!("--pin {pin:?}: shard {s:?} is not a number"))?;
                locations.insert(k.to_string(), shard);
            }
            let pool_type: PoolType = pool_type.parse()?;
            let p = c.create_pool(PoolSpec {
                pathname: path,
                pool_type: Some(pool_type),
                subgroup_index: subgroup,
                affinity_set_regex: affinity,
                object_locations: locations,
                retention: (keep_versions.is_some() || keep_for_s.is_some()).then_some(
                    sluice_client::Retention {
                        keep_versions,
                        keep_for_s,
                    },
                ),
                ..Default::default()
            })?;
            show(out, &p)?;
        }
        PoolsCmd::Rm { path } => {
            let p = c.remove_pool(&path)?;
            show(out, &p)?;
        }
        PoolsCmd::Purge { path } => {
            let r = c.purge_pool(&path)?;
            if json {
                print_json(out, &json!({"pool": path, "purged": r}))?;
            } else {
                writeln!(
                    out,
                    "purged {path}: {} keys, {} versions deleted, {} bytes of history reclaimed; the path is free",
                    r.keys, r.versions, r.bytes
                )?;
            }
        }
        PoolsCmd::Ls { all } => {
            let ps = c.list_pools(all)?;
            if json {
                print_json(out, &serde_json::to_value(&ps)?)?;
            } else {
                for p in ps {
                    writeln!(out, "{}", pool_line(&p))?;
                }
            }
        }
        PoolsCmd::Show { path } => {
            let p = c.get_pool(&path)?;
            // How many keys it holds (live ones, from every shard); a
            // trigger pool stores none, a removed one serves none.
            let keys = match (p.pool_type, p.deleted) {
                (PoolType::Trigger, _) | (_, true) => None,
                _ => Some(c.list_keys(&path, None)?.len()),
            };
            if json {
                let mut j = serde_json::to_value(&p)?;
                j["keys"] = json!(keys);
                print_json(out, &j)?;
            } else {
                writeln!(
                    out,
                    "{}",
                    toml::to_string_pretty(&p).unwrap_or_else(|_| pool_line(&p))
                )?;
                if let Some(n) = keys {
                    writeln!(out, "keys = {n}")?;
                }
            }
        }
        PoolsCmd::Find { key } => {
            let p = c.pool_of_key(&key)?;
            show(out, &p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn binary_values_are_escaped_and_text_is_not() {
        assert_eq!(&*escaped(b"plain text\n\tok"), b"plain text\n\tok");
        assert_eq!(&*escaped("héllo".as_bytes()), "héllo".as_bytes());
        assert_eq!(&*escaped(b"\x00\xffa\n"), br#""\x00\xffa\n""#);
        assert_eq!(&*escaped(b"bell\x07 \"q\" \\"), br#""bell\x07 \"q\" \\""#);
        assert_eq!(
            &*escaped("é\x1b[31m".as_bytes()),
            "\"é\\x1b[31m\"".as_bytes()
        );
    }
}
