//! Client commands, shared by the command line and `sluice shell`.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde_json::{json, Value};
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
        /// The key: a path under an object pool (`/vol/a`).
        key: String,
        /// The value (else --file, or standard input when it is piped).
        value: Option<String>,
        /// The value from this file.
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
        /// The key: lambdas whose vertex path is a prefix of it fire.
        key: String,
        /// The value (else --file, or standard input when it is piped).
        value: Option<String>,
        /// The value from this file.
        #[arg(long, conflicts_with = "value")]
        file: Option<PathBuf>,
        /// Read the value from standard input even when it is empty or a
        /// terminal.
        #[arg(long, conflicts_with_all = ["value", "file"])]
        stdin: bool,
        /// Start a latency trace with this id: each stage adds its hop
        /// (exported as OpenTelemetry spans by nodes with `[otel]`).
        #[arg(long)]
        trace_id: Option<u64>,
    },
    /// Print a value (latest, --version V, or --at TIMESTAMP_US).
    Get {
        /// The key: a path under an object pool (`/vol/a`).
        key: String,
        /// In a cluster: read through the shard's leader after it confirms
        /// its leadership (default: a stable read from any member).
        #[arg(long, conflicts_with_all = ["version", "at"])]
        linearizable: bool,
        /// This version (persistent pools keep them; a volatile pool only its latest).
        #[arg(long)]
        version: Option<u64>,
        /// The version current at this time (µs since the epoch).
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
        /// The key, in a persistent pool.
        key: String,
        /// The time, in µs since the Unix epoch (`date +%s%6N`).
        timestamp_us: u64,
        /// Answer now even if the timestamp is not stable (the answer may change).
        #[arg(long)]
        unstable: bool,
    },
    /// Get several keys at once. Each key is answered on its own line; a
    /// key that does not exist says `not found` there, and any other error
    /// (no pool covers the key, a permission) makes the exit code 1 once
    /// every line is printed.
    Mget {
        /// The keys, any pools (each answered on its own line).
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Remove a key (writes a tombstone version).
    Rm {
        /// The key: a path under an object pool (`/vol/a`).
        key: String,
        /// Only if the key's current version is this (else VersionConflict).
        #[arg(long)]
        expect_version: Option<String>,
    },
    /// List the keys of a pool (persistent pools: as of a version or time).
    Ls {
        /// The pool's path (`/vol`).
        pool: String,
        /// Only keys starting with this (a key path inside the pool).
        #[arg(long)]
        prefix: Option<String>,
        /// Persistent pools: the keys live at this version of the pool's shards.
        #[arg(long)]
        at_version: Option<u64>,
        /// Persistent pools: the keys live at this time (µs since the epoch).
        #[arg(long, conflicts_with = "at_version")]
        at_time: Option<u64>,
    },
    /// Every version of a key in a range, newest first (persistent pools).
    History {
        /// The key, in a persistent pool.
        key: String,
        /// The oldest version shown (inclusive; default: the oldest kept).
        #[arg(long)]
        from_version: Option<u64>,
        /// The newest version shown (inclusive; default: the latest).
        #[arg(long)]
        to_version: Option<u64>,
        /// Versions written at or after this time (µs since the epoch).
        #[arg(long, conflicts_with_all = ["from_version", "to_version"])]
        from_time: Option<u64>,
        /// Versions written at or before this time (µs since the epoch).
        #[arg(long, conflicts_with_all = ["from_version", "to_version"])]
        to_time: Option<u64>,
    },
    /// Size of a value in bytes.
    Size {
        /// The key: a path under an object pool (`/vol/a`).
        key: String,
        /// The size of this version.
        #[arg(long)]
        version: Option<u64>,
        /// The size of the version current at this time (µs since the epoch).
        #[arg(long, conflicts_with = "version")]
        at: Option<u64>,
    },
    /// Manage object pools.
    #[command(subcommand)]
    Pools(PoolsCmd),
    /// Print notifications for keys under a prefix.
    Watch {
        /// A key prefix (`/vol/cam1/`): every put, trigger put and remove
        /// of a key starting with it is printed.
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
    /// Principals: bearer tokens, certificate roles, who am I.
    #[command(subcommand)]
    Auth(crate::policy::AuthCmd),
    /// Access rules, rate limits and QoS, enforced by every node.
    #[command(subcommand)]
    Policy(crate::policy::PolicyCmd),
    /// Cluster membership, leaders and replication lag.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Send the latest version of KEY to many nodes at once: chunked and
    /// pipelined along chains ordered by the nodes' topology labels; each
    /// receiver checks the checksum and keeps it for its lambdas. The
    /// command waits for every receiver: for large objects on slow links
    /// raise --timeout-ms.
    Broadcast {
        /// The key whose latest version is sent.
        key: String,
        /// Receiving node ids, comma-separated (default: every other node).
        #[arg(long, value_delimiter = ',')]
        to: Vec<u32>,
        /// Receivers: the members of this shard (`volatile/0/1`).
        #[arg(long, conflicts_with_all = ["to", "to_vertex"])]
        to_shard: Option<String>,
        /// Receivers: the nodes running this DFG vertex (a pathname).
        #[arg(long, conflicts_with = "to")]
        to_vertex: Option<String>,
        /// Chains from each node: 1 is one chain, 2 a binary tree.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=255))]
        fanout: u16,
        /// Chunk size in KiB (4 KiB to 64 MiB).
        #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(4..=65536))]
        chunk_kb: u32,
        /// The node that sends (default: the node the client talks to).
        #[arg(long)]
        from: Option<u32>,
    },
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
        /// The node's id (its entry in the layout's `[[nodes]]`).
        node: u32,
    },
    /// Remove a node from a shard (e.g. a dead one before replacing it).
    RemoveMember {
        /// The shard, e.g. volatile/0/0.
        shard: String,
        /// The node's id.
        node: u32,
    },
    /// Fault injection (nodes started with --fault-injection): cut NODE's
    /// links to PEERS, both directions.
    Cut {
        /// The node whose links are cut.
        node: u32,
        /// The peers it can no longer reach (nor they it).
        #[arg(required = true)]
        peers: Vec<u32>,
    },
    /// Fault injection: restore every link of NODE.
    Heal {
        /// The node whose links are restored.
        node: u32,
    },
    /// Fault injection: from now until NODE restarts, every write to its
    /// persistent shards' consensus logs fails as on a full disk (ENOSPC).
    /// Its replicas of those shards stop (`cluster status`, `health` say
    /// so); the other members go on.
    DiskFull {
        /// The node whose disk is to be full.
        node: u32,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum DfgCmd {
    /// Load graphs from a dfgs.json file (replaces graphs with the same
    /// id, rebuilding their lambdas: new code on disk or in a `code_key`
    /// object takes effect); in a cluster, on every node.
    Apply {
        /// The graphs: Cascade's dfgs.json array, or an object with
        /// `graphs` (see the README's "Lambdas").
        file: PathBuf,
        /// Map UDL names in the file (Cascade's UUIDs) to Sluice UDLs: one
        /// `<uuid> <udl>` per line (in place of Cascade's udl_dlls.cfg).
        #[arg(long)]
        aliases: Option<PathBuf>,
        /// Leave graphs that already run exactly as the file gives them
        /// alone (their lambdas are not restarted); apply the others.
        #[arg(long)]
        only_changed: bool,
    },
    /// List applied graphs with per-lambda counters (per node in a cluster).
    Ls,
    /// Remove a graph by id.
    Rm {
        /// The graph's id (its `id` in the file; `dfg ls` lists them).
        id: String,
    },
    /// One graph: its vertices, lambdas and counters (JSON).
    Show {
        /// The graph's id.
        id: String,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum PoolsCmd {
    /// Create a pool.
    Create {
        /// The pool's path: keys under it belong to the pool (`/cams`).
        path: String,
        /// The type, as --type (after the path, as Cascade's
        /// `create_object_pool PATH TYPE` takes it).
        #[arg(value_name = "TYPE", value_parser = POOL_TYPES, conflicts_with = "pool_type")]
        type_after_path: Option<String>,
        /// volatile (latest version, in memory), persistent (every version,
        /// on disk) or trigger (stores nothing: lambdas and watchers only).
        #[arg(long = "type", value_parser = POOL_TYPES, required_unless_present = "type_after_path")]
        pool_type: Option<String>,
        /// Affinity set regex: keys whose matches are equal share a shard.
        #[arg(long)]
        affinity: Option<String>,
        /// The layout's subgroup of that type whose shards hold the pool.
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
        /// Persistent pools: keep versions while they and the newer
        /// versions of their key hold at most this many bytes.
        #[arg(long)]
        keep_bytes: Option<u64>,
    },
    /// Remove a pool: its keys can no longer be read or written, but
    /// stay stored until `pools purge` (a new pool at the path is refused
    /// until then, so it always starts empty).
    Rm {
        /// The pool's path.
        path: String,
    },
    /// Delete a removed pool's objects for good (every version, from
    /// memory and disk, on every replica) and free its path.
    Purge {
        /// The removed pool's path.
        path: String,
    },
    /// List pools.
    Ls {
        /// Include deleted pools.
        #[arg(long)]
        all: bool,
    },
    /// Show one pool.
    Show {
        /// The pool's path.
        path: String,
    },
    /// Which pool a key belongs to.
    Find {
        /// The key.
        key: String,
    },
}

pub fn connect(addr: &str, timeout_ms: u64) -> Result<BlockingClient> {
    BlockingClient::connect_with(ClientConfig {
        addr: addr.to_string(),
        request_timeout: Duration::from_millis(timeout_ms),
        client_name: "sluice-cli".into(),
        tls: crate::tls::client(),
        token: crate::tls::token(),
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
        put_bytes(&mut j, "value", &o.value);
    }
    j
}

/// Sets `j[name]` to `v` as text, or, when `v` is not UTF-8, `j[name_hex]`
/// to its hex digits: JSON output never loses a value's bytes.
pub(crate) fn put_bytes(j: &mut serde_json::Value, name: &str, v: &[u8]) {
    match std::str::from_utf8(v) {
        Ok(s) => j[name] = s.into(),
        Err(_) => {
            j[format!("{name}_hex")] = v
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                .into()
        }
    }
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

/// What a command shows: its JSON form and its text form. Handlers build
/// both; `Out::show` is the one place that picks one and writes it.
pub struct Shown {
    json: serde_json::Value,
    text: Vec<u8>,
    /// One compact JSON object per line (a stream) instead of pretty JSON.
    line: bool,
}

impl Shown {
    pub fn new(json: serde_json::Value, text: impl Into<Vec<u8>>) -> Shown {
        Shown {
            json,
            text: text.into(),
            line: false,
        }
    }

    /// The same JSON whatever the format (counters, a graph's document).
    fn json(json: serde_json::Value) -> Shown {
        let text = serde_json::to_string_pretty(&json).unwrap_or_default() + "\n";
        Shown::new(json, text)
    }

    /// A line of a stream (`watch`): compact JSON, one object per line.
    fn streamed(json: serde_json::Value, text: impl Into<Vec<u8>>) -> Shown {
        Shown {
            line: true,
            ..Shown::new(json, text)
        }
    }
}

/// `stats` for a person (Redis's `INFO`: a section a line): the node's
/// counters as `name value` pairs, shards one a line. Sections this
/// build does not know are printed the same way, so nothing is hidden.
fn stats_text(stats: &Value) -> String {
    fn scalar(v: &Value) -> String {
        match v {
            Value::String(s) => s.clone(),
            Value::Array(a) => a.iter().map(scalar).collect::<Vec<_>>().join("/"),
            _ => v.to_string(),
        }
    }
    // `name value, name value` of an object's scalar fields; objects
    // inside it on lines of their own, indented.
    fn section(out: &mut String, title: &str, v: &Value) {
        let Some(map) = v.as_object() else {
            out.push_str(&format!("{title:<12} {}\n", scalar(v)));
            return;
        };
        let flat: Vec<String> = map
            .iter()
            .filter(|(_, v)| !v.is_object())
            .map(|(k, v)| format!("{} {}", k.replace('_', " "), scalar(v)))
            .collect();
        out.push_str(&format!("{title:<12} {}\n", flat.join(", ")));
        for (k, v) in map.iter().filter(|(_, v)| v.is_object()) {
            section(out, &format!("  {}", k.replace('_', " ")), v);
        }
    }
    let mut out = String::new();
    let n = |k: &str| stats.get(k).map(scalar).unwrap_or_else(|| "?".into());
    out.push_str(&format!(
        "node {}: {} requests, {} protocol errors, {} watches\n",
        n("node_id"),
        n("requests"),
        n("protocol_errors"),
        n("watches")
    ));
    let Some(map) = stats.as_object() else {
        return out;
    };
    for (k, v) in map {
        match k.as_str() {
            "node_id" | "requests" | "protocol_errors" | "watches" => {}
            "shards" => {
                for (i, s) in v.as_array().into_iter().flatten().enumerate() {
                    out.push_str(&format!(
                        "{:<12} {:<20} {} keys, last version {}\n",
                        if i == 0 { "shards" } else { "" },
                        s.get("shard").map(scalar).unwrap_or_default(),
                        s.get("keys").map(scalar).unwrap_or_default(),
                        s.get("last_version").map(scalar).unwrap_or_default(),
                    ));
                }
            }
            "compute" => section(&mut out, "lambdas", v),
            _ => section(&mut out, &k.replace('_', " "), v),
        }
    }
    out
}

/// Text lines, each ending in a newline.
pub fn lines<I: IntoIterator<Item = String>>(items: I) -> String {
    items.into_iter().map(|l| l + "\n").collect()
}

/// Where a command's output goes, in the format the user asked for.
pub struct Out<'a> {
    w: &'a mut dyn Write,
    json: bool,
}

impl Out<'_> {
    /// Writes `s` as JSON or as text (and flushes: streams show each
    /// item as it comes).
    fn show(&mut self, s: Shown) -> Result<()> {
        if self.json {
            let j = if s.line {
                serde_json::to_string(&s.json)?
            } else {
                serde_json::to_string_pretty(&s.json)?
            };
            writeln!(self.w, "{j}")?;
        } else {
            self.w.write_all(&s.text)?;
        }
        self.w.flush()?;
        Ok(())
    }
}

/// The items of a JSON array as text (numbers, node ids).
fn listed(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|m| m.to_string())
        .collect()
}

/// A group's followers' lag in entries, as `cluster status` shows it:
/// "2:0 3:15" (none but on a leader), "3:15(down)" for one the leader
/// counts as down (it takes no share of the lambdas dispatched to one
/// member).
fn lag_column(g: &serde_json::Value) -> Vec<String> {
    let down = |node: &str| {
        g["down"]
            .as_array()
            .is_some_and(|d| d.iter().any(|n| n.as_u64() == node.parse().ok()))
    };
    g["lag"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(node, n)| {
            let mark = if down(node) { "(down)" } else { "" };
            format!("{node}:{n}{mark}")
        })
        .collect()
}

/// The role column of `cluster status`: "follower", or "follower(no
/// state)" for a member that started with nothing and holds its vote back
/// until it has caught up from the leader.
fn role_column(g: &serde_json::Value) -> String {
    let role = g["role"].as_str().unwrap_or("-");
    match g["state_lost"].as_bool() {
        Some(true) => format!("{role}(no state)"),
        _ => role.to_string(),
    }
}

/// `cluster status`: every node's groups, asked of each node.
fn cluster_status(c: &BlockingClient) -> Result<Shown> {
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
    let mut text = vec![
        format!("metadata epoch {}", info["epoch"]),
        format!(
            "{:<6} {:<16} {:<21} {:>5} {:>7} {:>9} {:>9} {:>9}  lag",
            "node", "group", "role", "term", "leader", "log", "applied", "version"
        ),
    ];
    let t = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        v => v.to_string(),
    };
    for s in &all {
        if let Some(e) = s.get("error") {
            text.push(format!(
                "{:<6} unreachable: {}",
                s["node"],
                e.as_str().unwrap_or("")
            ));
            continue;
        }
        for g in s["groups"].as_array().into_iter().flatten() {
            let lag = lag_column(g);
            text.push(format!(
                "{:<6} {:<16} {:<21} {:>5} {:>7} {:>9} {:>9} {:>9}  {}",
                t(&s["node"]),
                t(&g["group"]),
                role_column(g),
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
            ));
            if let Some(why) = g["stopped"].as_str() {
                text.push(format!(
                    "{:<6} {} stopped: {why}; {STOPPED_ADVICE}",
                    t(&s["node"]),
                    t(&g["group"]),
                ));
            }
        }
        // Its connections to peers: "2 3 (bulk: 2 3)"; a node that has
        // sent nothing to a peer (a follower everywhere) has "none".
        let peers = |lane: &str| -> String {
            let ids: Vec<String> = s["peer_connections"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["lane"] == lane)
                .map(|c| t(&c["node"]))
                .collect();
            if ids.is_empty() {
                "none".into()
            } else {
                ids.join(" ")
            }
        };
        let refusing: Vec<String> = s["peers_refusing_key"]
            .as_array()
            .into_iter()
            .flatten()
            .map(t)
            .collect();
        text.push(format!(
            "{:<6} connections to peers: {} (bulk: {}){}",
            t(&s["node"]),
            peers("small"),
            peers("bulk"),
            if refusing.is_empty() {
                String::new()
            } else {
                format!(
                    "; refused this node's cluster key: {} (copy the cluster's key here)",
                    refusing.join(" ")
                )
            }
        ));
    }
    Ok(Shown::new(
        json!({"epoch": info["epoch"], "nodes": all}),
        lines(text),
    ))
}

fn cluster(c: &BlockingClient, cmd: ClusterCmd) -> Result<Shown> {
    if c.async_client().cluster_epoch().is_none() {
        bail!("this node runs standalone (start nodes with --cluster LAYOUT, or try `sluice dev`)");
    }
    let (command, node) = match &cmd {
        ClusterCmd::Status => return cluster_status(c),
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
        ClusterCmd::DiskFull { node } => (json!({"op": "disk_full"}), Some(*node)),
    };
    let r = c.cluster_command(command, node)?;
    let text = match &cmd {
        ClusterCmd::AddMember { shard, node } | ClusterCmd::RemoveMember { shard, node } => {
            let what = if matches!(cmd, ClusterCmd::AddMember { .. }) {
                "added to"
            } else {
                "removed from"
            };
            format!(
                "node {node} {what} {shard}; members now {}\n",
                listed(&r["members"]).join(", ")
            )
        }
        ClusterCmd::Cut { node, .. } | ClusterCmd::Heal { node } => match listed(&r["cut"]) {
            cut if cut.is_empty() => format!("node {node}: every link open\n"),
            cut => format!("node {node}: links to {} cut\n", cut.join(", ")),
        },
        ClusterCmd::DiskFull { node } => format!(
            "node {node}: writes to its persistent shards' logs now fail as on a full disk \
             (until it restarts)\n"
        ),
        ClusterCmd::Status => String::new(),
    };
    Ok(Shown::new(r, text))
}

/// Runs one client command. `stdin_ok` is false in the shell, where
/// standard input carries commands, not values.
pub fn execute(
    c: &BlockingClient,
    cmd: ClientCmd,
    json: bool,
    w: &mut dyn Write,
    stdin_ok: bool,
) -> Result<()> {
    let out = &mut Out { w, json };
    let shown = match cmd {
        ClientCmd::Pools(p) => pools(c, p)?,
        ClientCmd::Cluster(cmd) => cluster(c, cmd)?,
        ClientCmd::Dfg(cmd) => dfg(c, cmd)?,
        ClientCmd::Auth(cmd) => crate::policy::auth(c, cmd)?,
        ClientCmd::Policy(cmd) => crate::policy::policy(c, cmd)?,
        ClientCmd::Broadcast {
            key,
            to,
            to_shard,
            to_vertex,
            fanout,
            chunk_kb,
            from,
        } => {
            let to = receivers(c, to, to_shard, to_vertex)?;
            return broadcast(c, &key, to, (fanout.into(), chunk_kb as usize, from), out);
        }
        ClientCmd::Watch {
            prefix,
            count,
            from_version,
            from_time,
        } => return watch(c, &prefix, count, from_version, from_time, out),
        ClientCmd::Health => return health(c, out),
        cmd @ (ClientCmd::Put { .. } | ClientCmd::Trigger { .. } | ClientCmd::Rm { .. }) => {
            writes(c, cmd, stdin_ok)?
        }
        cmd @ (ClientCmd::Get { .. } | ClientCmd::GetByTime { .. } | ClientCmd::Size { .. }) => {
            reads(c, cmd)?
        }
        ClientCmd::Mget { keys } => return mget(c, &keys, out),
        cmd @ (ClientCmd::Ls { .. } | ClientCmd::History { .. }) => lists(c, cmd)?,
        ClientCmd::Stats => {
            let stats = c.stats()?;
            let text = stats_text(&stats);
            Shown::new(stats, text)
        }
        ClientCmd::Ping => {
            let rtt = c.ping()?;
            Shown::new(
                json!({"rtt_us": rtt.as_micros() as u64}),
                format!(
                    "pong from node {} in {} µs\n",
                    c.server_info().node_id,
                    rtt.as_micros()
                ),
            )
        }
    };
    out.show(shown)
}

/// Puts, trigger puts and removes.
fn writes(c: &BlockingClient, cmd: ClientCmd, stdin_ok: bool) -> Result<Shown> {
    Ok(match cmd {
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
                return Ok(Shown::new(
                    json!({"key": key, "sent": true}),
                    format!("sent {key} (not acknowledged)\n"),
                ));
            }
            let r = match parse_expect(&expect_version)? {
                Some(e) => c.put_if_version(&key, v, e)?,
                None => c.put(&key, v)?,
            };
            Shown::new(
                json!({"key": key, "version": r.version, "timestamp_us": r.timestamp_us}),
                format!(
                    "{key} version {} timestamp_us {}\n",
                    r.version, r.timestamp_us
                ),
            )
        }
        ClientCmd::Trigger {
            key,
            value,
            file,
            stdin,
            trace_id,
        } => {
            let v = read_value(value, file, stdin, stdin_ok)?;
            let ts = match trace_id {
                Some(id) => c.trigger_put_traced(&key, v, id)?,
                None => c.trigger_put(&key, v)?,
            };
            Shown::new(
                json!({"key": key, "timestamp_us": ts}),
                format!("triggered {key} at {ts}\n"),
            )
        }
        ClientCmd::Rm {
            key,
            expect_version,
        } => {
            let r = match parse_expect(&expect_version)? {
                Some(e) => c.remove_if_version(&key, e)?,
                None => c.remove(&key)?,
            };
            Shown::new(
                json!({"key": key, "version": r.version, "timestamp_us": r.timestamp_us, "removed": true}),
                format!("removed {key} (tombstone version {})\n", r.version),
            )
        }
        other => bail!("internal error: {other:?} is not a write"),
    })
}

/// A value as text output: as stored (escaped on a terminal), with a
/// newline after text that has none.
fn value_text(v: &[u8]) -> Vec<u8> {
    let mut t = shown(v).into_owned();
    if t.last() != Some(&b'\n') && std::str::from_utf8(&t).is_ok() {
        t.push(b'\n');
    }
    t
}

/// Reads of one key: latest, by version, by time, size.
fn reads(c: &BlockingClient, cmd: ClientCmd) -> Result<Shown> {
    Ok(match cmd {
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
            let text = if meta {
                format!(
                    "{} version {} timestamp_us {} previous_version {} previous_version_by_key {} size {}\n",
                    o.key,
                    o.meta.version,
                    o.meta.timestamp_us,
                    o.meta.previous_version,
                    version_str(o.meta.previous_version_by_key),
                    o.value.len()
                )
                .into_bytes()
            } else if let Some(f) = file {
                format!(
                    "wrote {} bytes of {} version {} to {}\n",
                    o.value.len(),
                    o.key,
                    o.meta.version,
                    f.display()
                )
                .into_bytes()
            } else {
                value_text(&o.value)
            };
            Shown::new(object_json(&o, !meta), text)
        }
        ClientCmd::GetByTime {
            key,
            timestamp_us,
            unstable: true,
        } => {
            let o = c.get_by_time_unstable(&key, timestamp_us)?;
            let mut text = shown(&o.value).into_owned();
            text.push(b'\n');
            Shown::new(object_json(&o, true), text)
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
            )
        }
        ClientCmd::Size { key, version, at } => {
            let n = c.get_size(&key, version, at)?;
            Shown::new(json!({"key": key, "size": n}), format!("{n}\n"))
        }
        other => bail!("internal error: {other:?} is not a read"),
    })
}

/// The pool types `pools create` takes.
const POOL_TYPES: [&str; 3] = ["volatile", "persistent", "trigger"];

/// `mget`: a line per key; then an error naming the keys that failed
/// other than as absent (a script must not take an error line for a
/// value).
fn mget(c: &BlockingClient, keys: &[String], out: &mut Out) -> Result<()> {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let res = c.multi_get(&refs)?;
    let items: Vec<_> = keys
        .iter()
        .zip(&res)
        .map(|(k, r)| match r {
            Ok(o) => object_json(o, true),
            Err(e) => json!({"key": k, "error": e.to_string()}),
        })
        .collect();
    let text = keys.iter().zip(&res).map(|(k, r)| match r {
        Ok(o) => format!(
            "{k}\tversion {}\t{}",
            o.meta.version,
            String::from_utf8_lossy(&shown(&o.value))
        ),
        Err(e) => format!("{k}\terror: {e}"),
    });
    out.show(Shown::new(serde_json::Value::Array(items), lines(text)))?;
    let failed: Vec<&str> = keys
        .iter()
        .zip(&res)
        .filter(|(_, r)| {
            r.as_ref()
                .is_err_and(|e| !matches!(e, sluice_client::SluiceError::NotFound { .. }))
        })
        .map(|(k, _)| k.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {} keys could not be read ({})",
            failed.len(),
            keys.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// Reads of many keys: the keys of a pool, a key's history.
fn lists(c: &BlockingClient, cmd: ClientCmd) -> Result<Shown> {
    Ok(match cmd {
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
            Shown::new(json!(keys), lines(keys.iter().cloned()))
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
            let items: Vec<_> = versions
                .iter()
                .map(|o| {
                    let mut j = object_json(o, true);
                    j["removed"] = o.meta.tombstone.into();
                    j
                })
                .collect();
            let text = versions.iter().map(|o| {
                let v = if o.meta.tombstone {
                    "(removed)".to_string()
                } else {
                    String::from_utf8_lossy(&shown(&o.value)).into_owned()
                };
                format!(
                    "version {}\ttimestamp_us {}\t{v}",
                    o.meta.version, o.meta.timestamp_us
                )
            });
            Shown::new(serde_json::Value::Array(items), lines(text))
        }
        other => bail!("internal error: {other:?} is not a list"),
    })
}

/// Notifications under a prefix, shown as they come.
fn watch(
    c: &BlockingClient,
    prefix: &str,
    count: Option<u64>,
    from_version: Option<u64>,
    from_time: Option<u64>,
    out: &mut Out,
) -> Result<()> {
    let from = from_version
        .map(sluice_wire::WatchFrom::Version)
        .or(from_time.map(sluice_wire::WatchFrom::Time));
    let mut w = match from {
        Some(f) => c.watch_from(prefix, f)?,
        None => c.watch(prefix)?,
    };
    let banner = match from {
        Some(sluice_wire::WatchFrom::Version(v)) => format!(
            "watching {prefix} from version {v}: stored versions first, then live (Ctrl-C to stop)\n"
        ),
        Some(sluice_wire::WatchFrom::Time(t)) => format!(
            "watching {prefix} from time {t} µs: stored versions first, then live (Ctrl-C to stop)\n"
        ),
        None => format!("watching {prefix} (Ctrl-C to stop)\n"),
    };
    // The banner is for people: JSON output is the notifications alone.
    if !out.json {
        out.show(Shown::new(serde_json::Value::Null, banner))?;
    }
    let mut seen = 0u64;
    while count.is_none_or(|n| seen < n) {
        let Some(n) = w.next() else {
            match w.lost() {
                Some(e) => return Err(e.into()),
                None => bail!("connection closed"),
            }
        };
        seen += 1;
        out.show(notification(&n)?)?;
    }
    Ok(())
}

/// One notification of `watch`; a loss says how many, where, which
/// versions.
fn notification(n: &sluice_client::Notification) -> Result<Shown> {
    let kind = serde_json::to_value(n.kind)?;
    if n.kind != sluice_wire::DeliveryKindWire::Lagged {
        let mut j = object_json(&n.object, true);
        j["kind"] = kind.clone();
        let text = format!(
            "{} {} version {} {}\n",
            kind.as_str().unwrap_or("?"),
            n.object.key,
            version_str(n.object.meta.version),
            String::from_utf8_lossy(&shown(&n.object.value))
        );
        return Ok(Shown::streamed(j, text));
    }
    let lost: serde_json::Value = serde_json::from_slice(&n.object.value).unwrap_or(json!({}));
    let range = match (
        lost["first_version"].as_u64(),
        lost["last_version"].as_u64(),
    ) {
        (Some(a), Some(b)) if a != VERSION_NONE => format!(", versions {a} to {b}"),
        _ => String::new(),
    };
    let text = if lost["where"] == "retention" {
        let dropped = n.object.meta.version;
        format!(
            "lost: {}{range} {} dropped by the pool's retention before {} could be replayed\n",
            counted(dropped, "version"),
            if dropped == 1 { "was" } else { "were" },
            if dropped == 1 { "it" } else { "they" },
        )
    } else {
        format!(
            "lagged: {} notifications lost ({} fell behind{range}); the versions are still readable with get and history in a persistent pool\n",
            n.object.meta.version,
            lost["where"].as_str().unwrap_or("the watcher"),
        )
    };
    Ok(Shown::streamed(
        json!({"kind": kind, "prefix": &*n.object.key, "dropped": n.object.meta.version, "lost": lost}),
        text,
    ))
}

/// Data flow graphs: apply, list, show, remove.
fn dfg(c: &BlockingClient, cmd: DfgCmd) -> Result<Shown> {
    Ok(match cmd {
        DfgCmd::Apply {
            file,
            aliases,
            only_changed,
        } => {
            let mut text = dfg_text(&file, aliases.as_deref())?;
            if only_changed {
                text = sluice_compute::dfg::only_changed(&text)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            }
            let r = c
                .dfg_apply(&text)
                .with_context(|| format!("applying {}", file.display()))?;
            let ids: Vec<&str> = r["applied"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
                .collect();
            let pending: Vec<String> = r["pending_nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|n| n.to_string())
                .collect();
            let unchanged: Vec<&str> = r["unchanged"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
                .collect();
            let mut text = Vec::new();
            if !unchanged.is_empty() {
                text.push(format!(
                    "unchanged {} (already running as given)",
                    unchanged.join(", ")
                ));
            }
            if ids.is_empty() {
                return Ok(Shown::new(r, lines(text)));
            }
            text.push(format!(
                "applied {}{}",
                ids.join(", "),
                match (r["cluster"] == true, pending.is_empty()) {
                    (false, _) => String::new(),
                    (true, true) => " (running on every node of the cluster)".to_string(),
                    (true, false) => format!(
                        " (not yet running on node(s) {}: each runs it once it catches up; see `sluice dfg ls`)",
                        pending.join(", ")
                    ),
                }
            ));
            for n in r["notes"].as_array().into_iter().flatten() {
                text.push(format!("note: {}", n.as_str().unwrap_or("?")));
            }
            Shown::new(r, lines(text))
        }
        DfgCmd::Ls => {
            let nodes = c.dfg_list_nodes()?;
            let mut text = Vec::new();
            let mut all = Vec::new();
            let many = nodes.len() > 1;
            for (node, r) in nodes {
                if many {
                    text.push(format!("node {node}:"));
                }
                match r {
                    Ok(r) => {
                        dfg_lines(&r, many, &mut text);
                        all.push(json!({"node": node, "graphs": r}));
                    }
                    Err(e) => {
                        text.push(format!("  unreachable: {e}"));
                        all.push(json!({"node": node, "error": e.to_string()}));
                    }
                }
            }
            let r = if many {
                Value::Array(all)
            } else {
                all.pop().map_or(json!([]), |n| n["graphs"].clone())
            };
            Shown::new(r, lines(text))
        }
        DfgCmd::Show { id } => {
            let r = c.dfg_list()?;
            let g = r
                .as_array()
                .into_iter()
                .flatten()
                .find(|g| g["id"] == id.as_str())
                .ok_or(sluice_client::SluiceError::DfgNotFound { id })?;
            Shown::json(g.clone())
        }
        DfgCmd::Rm { id } => {
            c.dfg_remove(&id)?;
            let text = format!("removed {id}\n");
            Shown::new(json!({"removed": id}), text)
        }
    })
}

/// `broadcast`: the sending node's report, one line per receiver.
/// The receivers of a broadcast: the ids given, a shard's members, or the
/// nodes that run a DFG vertex (empty: every other node).
fn receivers(
    c: &BlockingClient,
    to: Vec<u32>,
    shard: Option<String>,
    vertex: Option<String>,
) -> Result<Vec<u32>> {
    if let Some(s) = shard {
        let info = c.cluster_command(json!({"op": "info"}), None)?;
        // Replicated shards by name; trigger shards by position.
        let trigger = s.strip_prefix("trigger/").and_then(|rest| {
            let (sg, sh) = rest.split_once('/')?;
            Some(&info["trigger"][sg.parse::<usize>().ok()?][sh.parse::<usize>().ok()?])
        });
        let members = trigger
            .unwrap_or(&info["shards"][&s]["members"])
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("no shard {s:?} in this cluster"))?;
        return Ok(members
            .iter()
            .filter_map(|m| m.as_u64().map(|m| m as u32))
            .collect());
    }
    if let Some(v) = vertex {
        let v = v.trim_end_matches('/');
        let mut out = Vec::new();
        for (node, list) in c.dfg_list_nodes()? {
            let runs = list.ok().is_some_and(|l| {
                l.as_array().into_iter().flatten().any(|g| {
                    g["state"] == "running"
                        && g["graph"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|x| x["pathname"] == v)
                })
            });
            if runs {
                out.push(node);
            }
        }
        anyhow::ensure!(!out.is_empty(), "no node runs the vertex {v:?}");
        return Ok(out);
    }
    Ok(to)
}

/// A receiver that did not get the object is an error (exit code 1), after
/// the report.
fn broadcast(
    c: &BlockingClient,
    key: &str,
    to: Vec<u32>,
    (fanout, chunk_kb, from): (usize, usize, Option<u32>),
    out: &mut Out,
) -> Result<()> {
    let mut cmd = json!({"op": "broadcast", "key": key, "fanout": fanout, "chunk_kb": chunk_kb});
    if !to.is_empty() {
        cmd["to"] = json!(to);
    }
    let r = c.cluster_command(cmd, from)?;
    let mut text = vec![format!(
        "{} version {} ({} bytes, crc32c {:08x}) to {}/{} nodes in {:.1} ms; order {} crosses {} topology boundaries (fewest possible {})",
        key,
        r["version"],
        r["bytes"],
        r["crc32c"].as_u64().unwrap_or(0),
        r["ok"],
        r["outcomes"].as_array().map_or(0, Vec::len),
        r["elapsed_ms"].as_f64().unwrap_or(0.0),
        r["order"],
        r["crossings"],
        r["crossings_optimum"]
    )];
    for o in r["outcomes"].as_array().into_iter().flatten() {
        text.push(format!(
            "  node {}: {}",
            o["node"],
            o["error"].as_str().unwrap_or("ok")
        ));
    }
    let (ok, all) = (
        r["ok"].as_u64().unwrap_or(0),
        r["outcomes"].as_array().map_or(0, |a| a.len() as u64),
    );
    out.show(Shown::new(r, lines(text)))?;
    if ok != all {
        bail!("{} of {all} nodes did not receive {key}", all - ok);
    }
    Ok(())
}

/// A DFG file's text, with the aliases of `aliases` (an alias file, see
/// `sluice_compute::dfg::parse_aliases`) added to it.
fn dfg_text(file: &std::path::Path, aliases: Option<&std::path::Path>) -> Result<String> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let Some(a) = aliases else { return Ok(text) };
    let atext = std::fs::read_to_string(a).with_context(|| format!("reading {}", a.display()))?;
    let pairs = sluice_compute::dfg::parse_aliases(&atext)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.display()))?;
    let mut doc: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", file.display()))?;
    if doc.is_array() {
        doc = json!({"graphs": doc});
    }
    let map = doc
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("{}: a DFG file is a list of graphs", file.display()))?
        .entry("udl_aliases")
        .or_insert_with(|| json!({}));
    let map = map
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("{}: udl_aliases must be an object", file.display()))?;
    for (alias, udl) in pairs {
        map.entry(alias).or_insert(Value::String(udl));
    }
    Ok(doc.to_string())
}

/// The text lines of one node's graph list.
fn dfg_lines(r: &Value, indent: bool, text: &mut Vec<String>) {
    let pad = if indent { "  " } else { "" };
    for g in r.as_array().into_iter().flatten() {
        text.push(format!(
            "{pad}{} {}{}",
            g["id"].as_str().unwrap_or("?"),
            g["desc"].as_str().unwrap_or(""),
            match g["state"].as_str() {
                Some("failed") => format!("  FAILED here: {}", g["error"].as_str().unwrap_or("?")),
                _ => String::new(),
            }
        ));
        for st in g["status"].as_array().into_iter().flatten() {
            text.push(format!(
                "{pad}  {:<28} {:<8} calls {}{} emitted {} failures {} panics {} dropped {}{}{}",
                st["vertex"].as_str().unwrap_or("?"),
                st["udl"].as_str().unwrap_or("?"),
                st["calls"],
                // Large trigger puts announced before their value was in,
                // and of those, the ones read into the lambda's memory.
                match (st["expected"].as_u64(), st["landed"].as_u64()) {
                    (Some(n), Some(l)) if n > 0 && l > 0 => {
                        format!(" (expected early {n}, landed {l})")
                    }
                    (Some(n), _) if n > 0 => format!(" (expected early {n})"),
                    _ => String::new(),
                },
                st["emitted"],
                st["failures"],
                st["panics"],
                st["dropped"],
                // A Python lambda's eventfd wake-ups (node, workers).
                match (
                    st["counters"]["wakeups"]["node"].as_u64(),
                    st["counters"]["wakeups"]["worker"].as_u64(),
                ) {
                    (Some(n), Some(w)) => format!(" wake-ups node {n} workers {w}"),
                    _ => String::new(),
                },
                st["last_error"]
                    .as_str()
                    .map(|e| format!("  last error: {e}"))
                    .unwrap_or_default()
            ));
        }
    }
}

/// `health`: the node answers and every group it is in runs and has a
/// leader. An unhealthy node is an error (exit code 1); under `--json`
/// its report is shown first. Members that the groups this node leads
/// count as down are named (the node is healthy: the others serve).
fn health(c: &BlockingClient, out: &mut Out) -> Result<()> {
    let rtt = c.ping()?;
    let node = c.server_info().node_id;
    let mut leaderless = Vec::new();
    let mut stopped = Vec::new();
    let mut down = serde_json::Map::new();
    // Leaderless groups this node holds its vote back in, having come back
    // with no state (`raftrs/lost.rs`).
    let mut held_back = Vec::new();
    match c.cluster_command(json!({"op": "status"}), None) {
        Ok(st) => {
            for g in st["groups"].as_array().into_iter().flatten() {
                let name = g["group"].as_str().unwrap_or("?").to_string();
                if g["down"].as_array().is_some_and(|d| !d.is_empty()) {
                    down.insert(name.clone(), g["down"].clone());
                }
                if let Some(why) = g["stopped"].as_str() {
                    stopped.push((name, why.to_string()));
                } else if g["leader"].is_null() {
                    if g["state_lost"] == true {
                        held_back.push(name.clone());
                    }
                    leaderless.push(name);
                }
            }
        }
        // A standalone node has no groups to check.
        Err(sluice_client::SluiceError::NotSupported { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let mut problems = Vec::new();
    if !stopped.is_empty() {
        let list: Vec<String> = stopped
            .iter()
            .map(|(g, why)| format!("{g} ({why})"))
            .collect();
        problems.push(format!(
            "these groups have stopped on it: {}; {STOPPED_ADVICE}",
            list.join(", ")
        ));
    }
    if !leaderless.is_empty() {
        problems.push(format!(
            "these groups have no leader: {}",
            leaderless.join(", ")
        ));
    }
    if !held_back.is_empty() {
        problems.push(format!(
            "this node came back with no state in {} and holds its vote until a leader catches it up: that needs a majority of their members, with their state, up and connected",
            held_back.join(", ")
        ));
    }
    let healthy = problems.is_empty();
    let stopped_json: Vec<_> = stopped
        .iter()
        .map(|(g, why)| json!({"group": g, "reason": why}))
        .collect();
    let report = json!({"node": node, "healthy": healthy, "rtt_us": rtt.as_micros() as u64,
        "groups_without_leader": leaderless, "groups_stopped": stopped_json,
        "groups_holding_vote_back": held_back,
        "members_down": down});
    let text = if healthy {
        let down: Vec<String> = down.iter().map(|(g, d)| format!("{g} {d}")).collect();
        let note = if down.is_empty() {
            String::new()
        } else {
            format!(
                "; as their leader it counts these members down (the others serve, and take their share of lambdas): {}",
                down.join(", ")
            )
        };
        format!(
            "healthy: node {node} answered in {} µs{note}\n",
            rtt.as_micros()
        )
    } else {
        // The error says it.
        String::new()
    };
    out.show(Shown::new(report, text))?;
    if !healthy {
        bail!("node {node} answers, but {}", problems.join("; and "));
    }
    Ok(())
}

/// What to do about a group stopped on a node (its log or state machine
/// failed to write: a full disk, an I/O error).
const STOPPED_ADVICE: &str = "restart the node once the cause is fixed (free disk space, \
     replace a failing disk): its copy catches up from the leader, and the other members \
     go on meanwhile";

fn pools(c: &BlockingClient, cmd: PoolsCmd) -> Result<Shown> {
    let one = |p: &PoolMeta| -> Result<Shown> {
        Ok(Shown::new(p.to_json(), format!("{}\n", pool_line(p))))
    };
    match cmd {
        PoolsCmd::Create {
            keep_versions,
            keep_for_s,
            keep_bytes,
            path,
            type_after_path,
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
            // One of the two is there (clap requires it, and refuses both).
            let given = type_after_path.or(pool_type).unwrap_or_default();
            let pool_type = PoolType::parse_for(&path, &given)?;
            let p = c.create_pool(PoolSpec {
                pathname: path,
                pool_type: Some(pool_type),
                subgroup_index: subgroup,
                affinity_set_regex: affinity,
                object_locations: locations,
                retention: sluice_client::Retention::of(keep_versions, keep_for_s, keep_bytes),
                ..Default::default()
            })?;
            one(&p)
        }
        PoolsCmd::Rm { path } => one(&c.remove_pool(&path)?),
        PoolsCmd::Purge { path } => {
            let r = c.purge_pool(&path)?;
            let text = format!(
                "purged {path}: {}, {} deleted, {} of history reclaimed; the path is free\n",
                counted(r.keys, "key"),
                counted(r.versions, "version"),
                counted(r.bytes, "byte")
            );
            Ok(Shown::new(json!({"pool": path, "purged": r}), text))
        }
        PoolsCmd::Ls { all } => {
            let ps = c.list_pools(all)?;
            Ok(Shown::new(
                ps.iter().map(PoolMeta::to_json).collect(),
                lines(ps.iter().map(pool_line)),
            ))
        }
        PoolsCmd::Show { path } => {
            let p = c.get_pool(&path)?;
            // How many keys it holds (live ones, from every shard); a
            // trigger pool stores none, a removed one serves none.
            let keys = match (p.pool_type, p.deleted) {
                (PoolType::Trigger, _) | (_, true) => None,
                _ => Some(c.list_keys(&path, None)?.len()),
            };
            let mut j = p.to_json();
            j["keys"] = json!(keys);
            // The same fields as the JSON, in the struct's order (a
            // toml::Table would sort them): the empty access_policy table
            // left out.
            let mut text = toml::to_string_pretty(&p).unwrap_or_else(|_| pool_line(&p));
            if j.get("access_policy").is_none() {
                text = text.replace("[access_policy]\nmode = \"\"\n\n", "");
                text = text.replace("\n[access_policy]\nmode = \"\"\n", "");
            }
            // `keys` among the top-level fields: after the tables
            // (`[object_locations]`, `[retention]`) it read as one of
            // theirs to anything that parsed the text as TOML.
            if let Some(n) = keys {
                let at = text.find("\n[").map_or(text.len(), |i| i + 1);
                text.insert_str(at, &format!("keys = {n}\n"));
            }
            text += "\n";
            Ok(Shown::new(j, text))
        }
        PoolsCmd::Find { key } => one(&c.pool_of_key(&key)?),
    }
}

/// `n` and `what`, plural unless `n` is 1 ("1 key", "2 keys").
pub(crate) fn counted(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

#[cfg(test)]
mod tests {
    use super::{counted, dfg_lines, escaped, lag_column, role_column, stats_text, Out, Shown};
    use serde_json::json;

    /// `cluster status` marks a follower the leader counts as down.
    #[test]
    fn the_lag_column_marks_members_counted_down() {
        let g = json!({"lag": {"2": 0, "3": 15}, "down": [3]});
        assert_eq!(lag_column(&g), ["2:0", "3:15(down)"]);
        assert!(lag_column(&json!({"lag": {}, "down": []})).is_empty());
    }

    #[test]
    fn the_role_column_marks_a_member_that_started_with_nothing() {
        let g = json!({"role": "candidate", "state_lost": true});
        assert_eq!(role_column(&g), "candidate(no state)");
        assert_eq!(
            role_column(&json!({"role": "leader", "state_lost": false})),
            "leader"
        );
        assert_eq!(role_column(&json!({"role": "leader"})), "leader");
    }

    /// Counts in messages (dump, load, purge, fsck, stream publish): one
    /// of a thing is said as one.
    #[test]
    fn one_of_a_thing_is_said_as_one() {
        assert_eq!(counted(1, "pool"), "1 pool");
        assert_eq!(counted(0, "byte"), "0 bytes");
        assert_eq!(counted(7, "file"), "7 files");
        // A watch's notice of versions retention dropped before a replay.
        let lost = |n: u64| {
            let notice = sluice_client::Notification {
                kind: sluice_wire::DeliveryKindWire::Lagged,
                object: sluice_types::Object {
                    key: "/p".into(),
                    meta: sluice_types::ObjectMeta {
                        version: n,
                        timestamp_us: 0,
                        previous_version: sluice_types::VERSION_NONE,
                        previous_version_by_key: sluice_types::VERSION_NONE,
                        tombstone: false,
                    },
                    value: r#"{"where":"retention"}"#.into(),
                    trace: None,
                },
            };
            String::from_utf8(super::notification(&notice).unwrap().text).unwrap()
        };
        assert_eq!(
            lost(1),
            "lost: 1 version was dropped by the pool's retention before it could be replayed\n"
        );
        assert!(
            lost(3).starts_with("lost: 3 versions were dropped"),
            "{}",
            lost(3)
        );
    }

    #[test]
    fn a_vertex_line_says_how_many_large_puts_came_early_and_landed() {
        let list = |expected: u64, landed: u64| {
            let r = json!([{"id": "g", "desc": "", "status": [{
                "vertex": "/in", "udl": "python", "calls": 3, "expected": expected,
                "landed": landed, "emitted": 3, "failures": 0, "panics": 0, "dropped": 0,
                "last_error": null
            }]}]);
            let mut text = Vec::new();
            dfg_lines(&r, false, &mut text);
            text[1].clone()
        };
        assert!(list(2, 2).contains("calls 3 (expected early 2, landed 2) emitted 3"));
        assert!(!list(0, 0).contains("wake-ups"), "a lambda without them");
        assert!(list(2, 0).contains("calls 3 (expected early 2) emitted 3"));
        assert!(list(0, 0).contains("calls 3 emitted 3"));
        let r = json!([{"id": "g", "desc": "", "status": [{
            "vertex": "/in", "udl": "python", "calls": 3, "emitted": 3, "failures": 0,
            "panics": 0, "dropped": 0, "last_error": null,
            "counters": {"wakeups": {"node": 4, "worker": 3}}
        }]}]);
        let mut text = Vec::new();
        dfg_lines(&r, false, &mut text);
        assert!(
            text[1].ends_with("dropped 0 wake-ups node 4 workers 3"),
            "{}",
            text[1]
        );
    }

    fn render(s: Shown, json: bool) -> String {
        let mut buf = Vec::new();
        Out { w: &mut buf, json }.show(s).unwrap();
        String::from_utf8(buf).unwrap()
    }

    /// One place decides the format: text as built, JSON pretty, a
    /// stream's items one compact object per line.
    #[test]
    fn output_is_rendered_as_text_or_json_in_one_place() {
        let s = || Shown::new(json!({"key": "/a", "version": 3}), "/a version 3\n");
        assert_eq!(render(s(), false), "/a version 3\n");
        assert_eq!(
            render(s(), true),
            "{\n  \"key\": \"/a\",\n  \"version\": 3\n}\n"
        );
        let line = Shown::streamed(json!({"kind": "put", "key": "/a"}), "put /a\n");
        assert_eq!(render(line, true), "{\"key\":\"/a\",\"kind\":\"put\"}\n");
        let doc = Shown::json(json!({"n": 1}));
        assert_eq!(
            render(Shown::json(json!({"n": 1})), false),
            render(doc, true)
        );
    }

    /// `stats` without `--json` reads as a summary (it printed the JSON
    /// document, pretty, whatever the format).
    #[test]
    fn stats_read_as_lines_of_counters() {
        let stats = json!({
            "compute": {"dispatch_overhead_us": {"count": 0, "p50": 0.0}, "graphs": 1,
                        "queued": [0, 3], "workers": 2},
            "connections": {"accepted": 12, "open": 4, "rejected": 0},
            "node_id": 0, "protocol_errors": 0, "requests": 79,
            "shards": [{"keys": 1, "last_version": 1, "shard": "volatile/0/0"},
                       {"keys": 0, "last_version": 0, "shard": "trigger/0/0"}],
            "store": {"gets": 0, "puts": 1},
            "watches": 0,
            "raft": {"elections": 2}
        });
        let text = stats_text(&stats);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "node 0: 79 requests, 0 protocol errors, 0 watches"
        );
        assert!(
            lines.contains(&"lambdas      graphs 1, queued 0/3, workers 2"),
            "{text}"
        );
        assert!(
            lines.contains(&"  dispatch overhead us count 0, p50 0.0"),
            "{text}"
        );
        assert!(
            lines.contains(&"connections  accepted 12, open 4, rejected 0"),
            "{text}"
        );
        assert!(
            lines.contains(&"shards       volatile/0/0         1 keys, last version 1"),
            "{text}"
        );
        assert!(
            lines.contains(&"             trigger/0/0          0 keys, last version 0"),
            "{text}"
        );
        assert!(lines.contains(&"store        gets 0, puts 1"), "{text}");
        // A section this build does not know is shown, not dropped.
        assert!(lines.contains(&"raft         elections 2"), "{text}");
        assert!(!text.contains('{'), "{text}");
    }

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
