//! raft-floor: what a 3-replica put costs when the Raft core is TiKV's
//! I/O-free `raft` crate driven by one event loop per node, next to
//! Redis `SET` + `WAIT 2` and a loopback TCP round trip measured by the
//! same client in the same run (issue #20; README.md).
//!
//! A node is one process with a current-thread tokio runtime: one task
//! reads each inbound connection and hands what it decodes to the node's
//! loop, which steps the Raft core, writes its messages and replies to
//! the sockets itself, appends entries to an in-memory log
//! (`MemStorage`, as Sluice's volatile shards keep theirs in memory) and
//! applies committed entries to a map. A leader sends its entries before
//! appending them to its own log (Raft thesis 10.2.1), which raft-rs
//! allows by handing out a ready's messages before its entries.
//!
//!   raft-floor bench [--size BYTES] [--secs S] [--clients N] [--redis PATH]
//!   raft-floor node ID PORT1 PORT2 PORT3        (started by bench)

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use raft::prelude::*;
use raft::storage::MemStorage;
use raft::StateRole;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("node") => {
            let id: u64 = args.get(2).context("node ID")?.parse()?;
            let ports = args[3..]
                .iter()
                .map(|p| p.parse::<u16>())
                .collect::<Result<Vec<_>, _>>()?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(node(id, ports))
        }
        Some("bench") => bench(&args[2..]),
        Some("echo") => {
            let port: u16 = args.get(2).context("echo PORT")?.parse()?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(async move {
                    echo_server(TcpListener::bind(("127.0.0.1", port)).await?).await;
                    Ok(())
                })
        }
        _ => bail!(
            "usage: raft-floor bench [--size BYTES] [--secs S] [--rounds N] [--clients N] [--redis PATH] [--sync [--dir DIR]] | raft-floor node ID PORT... | raft-floor echo PORT"
        ),
    }
}

// ------------------------------------------------------------------ node

enum Ev {
    Peer(Box<Message>),
    Put { conn: u64, req: u64, value: Vec<u8> },
    Client { conn: u64, w: OwnedWriteHalf },
    Gone(u64),
}

/// A reply's flag for "not proposed here" (no leader yet): the client
/// asks again.
const REFUSED: u64 = 1 << 63;
/// Entries kept in the in-memory log behind the applied one.
const KEEP: u64 = 4096;

async fn node(id: u64, ports: Vec<u16>) -> Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", ports[id as usize - 1])).await?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Ev>();
    tokio::spawn(async move {
        let mut next = 0u64;
        while let Ok((s, _)) = listener.accept().await {
            s.set_nodelay(true).ok();
            next += 1;
            tokio::spawn(inbound(s, next, tx.clone()));
        }
    });
    let voters: Vec<u64> = (1..=ports.len() as u64).collect();
    let storage = MemStorage::new_with_conf_state(ConfState::from((voters.clone(), vec![])));
    let cfg = Config {
        id,
        election_tick: 20,
        heartbeat_tick: 2,
        max_inflight_msgs: 256,
        max_size_per_msg: 1 << 20,
        ..Default::default()
    };
    cfg.validate()?;
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut raw = RawNode::new(&cfg, storage, &logger)?;
    let mut peers: HashMap<u64, OwnedWriteHalf> = HashMap::new();
    for &p in voters.iter().filter(|&&p| p != id) {
        peers.insert(p, connect_peer(ports[p as usize - 1], id).await?);
    }
    if id == 1 {
        raw.campaign()?;
    }
    let mut st = State::default();
    if let Ok(dir) = std::env::var("RAFT_FLOOR_LOG_DIR") {
        let path = std::path::Path::new(&dir).join(format!("node-{id}.log"));
        st.log = Some(std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?);
    }
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else { return Ok(()) };
                st.handle(&mut raw, ev)?;
                while let Ok(ev) = rx.try_recv() {
                    st.handle(&mut raw, ev)?;
                }
            }
            _ = tick.tick() => { raw.tick(); }
        }
        st.on_ready(&mut raw, &mut peers).await?;
    }
}

#[derive(Default)]
struct State {
    /// With `RAFT_FLOOR_LOG_DIR`: the node's log file, appended and
    /// fdatasync'd before a ready's entries count as persisted (its
    /// messages to followers go out first, its persisted messages after).
    log: Option<std::fs::File>,
    clients: HashMap<u64, OwnedWriteHalf>,
    kv: HashMap<u64, Vec<u8>>,
    applied: u64,
    /// The log is compacted up to here (applies come in batches, so not
    /// at exact multiples).
    compacted: u64,
    replies: HashMap<u64, Vec<u8>>,
}

impl State {
    fn handle(&mut self, raw: &mut RawNode<MemStorage>, ev: Ev) -> Result<()> {
        match ev {
            Ev::Peer(m) => {
                let _ = raw.step(*m);
            }
            Ev::Put { conn, req, value } => {
                let mut ctx = conn.to_le_bytes().to_vec();
                ctx.extend_from_slice(&req.to_le_bytes());
                if raw.raft.state != StateRole::Leader || raw.propose(ctx, value).is_err() {
                    self.reply(conn, req | REFUSED);
                }
            }
            Ev::Client { conn, w } => {
                self.clients.insert(conn, w);
            }
            Ev::Gone(conn) => {
                self.clients.remove(&conn);
            }
        }
        Ok(())
    }

    fn reply(&mut self, conn: u64, word: u64) {
        self.replies
            .entry(conn)
            .or_default()
            .extend_from_slice(&word.to_le_bytes());
    }

    fn apply(&mut self, leader: bool, entries: Vec<Entry>) {
        for e in entries {
            self.applied = e.index;
            if e.get_data().is_empty() {
                continue;
            }
            self.kv.insert(e.index % 1024, e.get_data().to_vec());
            let ctx = e.get_context();
            if leader && ctx.len() == 16 {
                let conn = u64::from_le_bytes(ctx[..8].try_into().unwrap());
                let req = u64::from_le_bytes(ctx[8..].try_into().unwrap());
                self.reply(conn, req);
            }
        }
    }

    async fn flush_replies(&mut self) {
        for (conn, buf) in self.replies.drain() {
            if let Some(w) = self.clients.get_mut(&conn) {
                let _ = w.write_all(&buf).await;
            }
        }
    }

    async fn on_ready(
        &mut self,
        raw: &mut RawNode<MemStorage>,
        peers: &mut HashMap<u64, OwnedWriteHalf>,
    ) -> Result<()> {
        if !raw.has_ready() {
            return Ok(());
        }
        let leader = raw.raft.state == StateRole::Leader;
        let mut rd = raw.ready();
        send(peers, rd.take_messages()).await;
        if !rd.snapshot().is_empty() {
            raw.mut_store().wl().apply_snapshot(rd.snapshot().clone())?;
        }
        self.apply(leader, rd.take_committed_entries());
        // Answered before this ready's own log write: they are committed.
        self.flush_replies().await;
        // As etcd's `MustSync`: a write with entries, or a new term or
        // vote, is synced; a commit index alone is written, not synced
        // (a node learns it again from the leader).
        let must_sync = !rd.entries().is_empty()
            || rd.hs().is_some_and(|hs| {
                let store = raw.store().rl();
                let old = store.hard_state();
                hs.term != old.term || hs.vote != old.vote
            });
        if let Some(log) = self
            .log
            .as_mut()
            .filter(|_| !rd.entries().is_empty() || rd.hs().is_some())
        {
            use std::io::Write;
            let mut b = Vec::new();
            for e in rd.entries() {
                let r = prost::Message::encode_to_vec(e);
                b.extend_from_slice(&(r.len() as u32).to_le_bytes());
                b.extend_from_slice(&r);
            }
            if let Some(hs) = rd.hs() {
                let r = prost::Message::encode_to_vec(hs);
                b.extend_from_slice(&(r.len() as u32 | 1 << 31).to_le_bytes());
                b.extend_from_slice(&r);
            }
            log.write_all(&b)?;
            if must_sync {
                log.sync_data()?;
            }
        }
        if !rd.entries().is_empty() {
            raw.mut_store().wl().append(rd.entries())?;
        }
        if let Some(hs) = rd.hs() {
            raw.mut_store().wl().set_hardstate(hs.clone());
        }
        send(peers, rd.take_persisted_messages()).await;
        let mut light = raw.advance(rd);
        if let Some(c) = light.commit_index() {
            raw.mut_store().wl().mut_hard_state().set_commit(c);
        }
        send(peers, light.take_messages()).await;
        self.apply(leader, light.take_committed_entries());
        raw.advance_apply();
        self.flush_replies().await;
        if self.applied > self.compacted + 2 * KEEP {
            self.compacted = self.applied - KEEP;
            raw.mut_store().wl().compact(self.compacted)?;
        }
        Ok(())
    }
}

async fn send(peers: &mut HashMap<u64, OwnedWriteHalf>, msgs: Vec<Message>) {
    if msgs.is_empty() {
        return;
    }
    let mut bufs: HashMap<u64, Vec<u8>> = HashMap::new();
    for m in msgs {
        let b = prost::Message::encode_to_vec(&m);
        let out = bufs.entry(m.to).or_default();
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&b);
    }
    for (to, b) in bufs {
        if let Some(w) = peers.get_mut(&to) {
            let _ = w.write_all(&b).await;
        }
    }
}

async fn connect_peer(port: u16, me: u64) -> Result<OwnedWriteHalf> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                let (_r, mut w) = s.into_split();
                let mut hello = vec![b'P'];
                hello.extend_from_slice(&me.to_le_bytes());
                w.write_all(&hello).await?;
                return Ok(w);
            }
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// One inbound connection: a peer's messages, or a client's puts
/// (`[u32 len][u64 request][value]`, answered by `[u64 request]`).
async fn inbound(s: TcpStream, conn: u64, tx: mpsc::UnboundedSender<Ev>) -> Result<()> {
    let (r, w) = s.into_split();
    let mut r = BufReader::with_capacity(256 * 1024, r);
    let kind = r.read_u8().await?;
    if kind == b'P' {
        let _from = r.read_u64_le().await?;
        loop {
            let n = r.read_u32_le().await? as usize;
            let mut b = vec![0u8; n];
            r.read_exact(&mut b).await?;
            let m =
                <Message as prost::Message>::decode(b.as_slice()).map_err(|e| anyhow!("{e}"))?;
            if tx.send(Ev::Peer(Box::new(m))).is_err() {
                return Ok(());
            }
        }
    }
    tx.send(Ev::Client { conn, w }).ok();
    let res: Result<()> = async {
        loop {
            let n = r.read_u32_le().await? as usize;
            let req = r.read_u64_le().await?;
            let mut value = vec![0u8; n];
            r.read_exact(&mut value).await?;
            if tx.send(Ev::Put { conn, req, value }).is_err() {
                return Ok(());
            }
        }
    }
    .await;
    tx.send(Ev::Gone(conn)).ok();
    res
}

// ----------------------------------------------------------------- bench

trait Put: Send {
    fn put(&mut self, req: u64) -> impl std::future::Future<Output = Result<bool>> + Send;
}

/// A client of the Raft nodes' leader, or of the echo process (the same
/// frame: `[u32 len][u64 request][value]`, answered by the request).
struct FrameClient {
    s: BufReader<TcpStream>,
    value: Vec<u8>,
}

impl Put for FrameClient {
    async fn put(&mut self, req: u64) -> Result<bool> {
        let mut b = Vec::with_capacity(self.value.len() + 12);
        b.extend_from_slice(&(self.value.len() as u32).to_le_bytes());
        b.extend_from_slice(&req.to_le_bytes());
        b.extend_from_slice(&self.value);
        self.s.get_mut().write_all(&b).await?;
        let got = self.s.read_u64_le().await?;
        if got == req {
            Ok(true)
        } else if got == req | REFUSED {
            Ok(false)
        } else {
            bail!("reply {got:#x} to request {req}")
        }
    }
}

/// `SET` + `WAIT 2 0` pipelined, as `sluice bench cluster` sends them.
struct RedisClient {
    s: BufReader<TcpStream>,
    value: Vec<u8>,
    line: Vec<u8>,
}

impl RedisClient {
    async fn line(&mut self) -> Result<()> {
        self.line.clear();
        loop {
            let c = self.s.read_u8().await?;
            self.line.push(c);
            if self.line.ends_with(b"\r\n") {
                return Ok(());
            }
        }
    }
}

impl Put for RedisClient {
    async fn put(&mut self, req: u64) -> Result<bool> {
        let key = format!("k{}", req % 1024);
        let mut b = Vec::with_capacity(self.value.len() + 96);
        b.extend_from_slice(
            format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n",
                key.len(),
                self.value.len()
            )
            .as_bytes(),
        );
        b.extend_from_slice(&self.value);
        b.extend_from_slice(b"\r\n*3\r\n$4\r\nWAIT\r\n$1\r\n2\r\n$1\r\n0\r\n");
        self.s.get_mut().write_all(&b).await?;
        self.line().await?;
        if self.line != b"+OK\r\n" {
            bail!("redis SET: {}", String::from_utf8_lossy(&self.line));
        }
        self.line().await?;
        Ok(self.line == b":2\r\n")
    }
}

async fn echo_server(l: TcpListener) {
    while let Ok((s, _)) = l.accept().await {
        s.set_nodelay(true).ok();
        tokio::spawn(async move {
            let (r, mut w) = s.into_split();
            let mut r = BufReader::with_capacity(256 * 1024, r);
            let mut v = Vec::new();
            loop {
                let Ok(n) = r.read_u32_le().await else { return };
                let Ok(req) = r.read_u64_le().await else {
                    return;
                };
                v.resize(n as usize, 0);
                if r.read_exact(&mut v).await.is_err()
                    || w.write_all(&req.to_le_bytes()).await.is_err()
                {
                    return;
                }
            }
        });
    }
}

async fn connect(port: u16) -> Result<BufReader<TcpStream>> {
    let s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.set_nodelay(true)?;
    Ok(BufReader::with_capacity(64 * 1024, s))
}

/// Closed loop: each client one put in flight for `dur`; latencies (µs)
/// and ops/s.
async fn closed_loop<P: Put + 'static>(
    clients: Vec<P>,
    dur: Duration,
) -> Result<(Histogram<u64>, f64)> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, mut c) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3)?;
            let mut req = (i as u64) << 40;
            // At least one put per client, however late the task starts.
            loop {
                req += 1;
                let t = Instant::now();
                if !c.put(req).await? {
                    bail!("a put was not replicated (request {req})");
                }
                h.record(t.elapsed().as_nanos() as u64 / 1000)?;
                if start.elapsed() >= dur {
                    break;
                }
            }
            Ok::<_, anyhow::Error>(h)
        }));
    }
    let mut all = Histogram::<u64>::new(3)?;
    for t in tasks {
        all.add(t.await??)?;
    }
    let n = all.len() as f64;
    Ok((all, n / start.elapsed().as_secs_f64()))
}

/// A fresh directory under `base` for the nodes' logs.
fn tempdir_in(base: &str) -> Result<std::path::PathBuf> {
    let d = std::path::Path::new(base).join(format!("raft-floor-logs-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// p50 of one `size`-byte append and `fdatasync` in `dir` (µs): what one
/// persisted step costs on this disk.
fn fsync_floor(dir: &std::path::Path, size: usize) -> Result<f64> {
    use std::io::Write;
    let path = dir.join("floor");
    let mut f = std::fs::File::create(&path)?;
    let b = vec![7u8; size];
    let mut h = Histogram::<u64>::new(3)?;
    for _ in 0..300 {
        let t = Instant::now();
        f.write_all(&b)?;
        f.sync_data()?;
        h.record(t.elapsed().as_micros() as u64)?;
    }
    std::fs::remove_file(&path)?;
    Ok(h.value_at_quantile(0.5) as f64)
}

/// Waits until a client from `make` gets a put through (each try
/// bounded by 1 s), or fails at `deadline` with the last error.
async fn until_a_put<P: Put, F, Fut>(what: &str, deadline: Instant, mut make: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<P>>,
{
    loop {
        let r: Result<bool> =
            tokio::time::timeout(Duration::from_secs(1), async { make().await?.put(1).await })
                .await
                .unwrap_or_else(|_| Err(anyhow!("no answer within 1 s")));
        if matches!(r, Ok(true)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what} took no put within 10 s: {r:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` clients from `make`, each with a connection of its own.
async fn clients<P, F, Fut>(n: usize, mut make: F) -> Result<Vec<P>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<P>>,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(make().await?);
    }
    Ok(out)
}

/// CPU time a process has used, all its threads (ns, from
/// `/proc/PID/task/*/schedstat`).
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

struct Procs(Vec<Child>);
impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn bench(a: &[String]) -> Result<()> {
    let opt = |k: &str, d: &str| -> String {
        a.iter()
            .position(|x| x == k)
            .and_then(|i| a.get(i + 1).cloned())
            .unwrap_or_else(|| d.to_string())
    };
    let size: usize = opt("--size", "10240").parse()?;
    let secs: f64 = opt("--secs", "2").parse()?;
    let many: usize = opt("--clients", "16").parse()?;
    let redis = opt("--redis", "redis-server");
    let sync = a.iter().any(|x| x == "--sync");
    let rounds: usize = opt("--rounds", "3").parse()?;
    let dur = Duration::from_secs_f64(secs);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;

    // Three Raft nodes, node 1 standing for leader.
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let exe = std::env::current_exe()?;
    let mut procs = Procs(Vec::new());
    let logs = tempdir_in(&opt("--dir", &std::env::temp_dir().to_string_lossy()))?;
    for id in 1..=3u64 {
        let mut c = Command::new(&exe);
        c.arg("node").arg(id.to_string());
        c.args(ports.iter().map(|p| p.to_string()));
        if sync {
            c.env("RAFT_FLOOR_LOG_DIR", &logs);
        }
        procs.0.push(c.stdout(Stdio::null()).spawn()?);
    }
    // Redis: a master and two replicas.
    let rports: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let dir = std::env::temp_dir().join(format!("raft-floor-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for (i, p) in rports.iter().enumerate() {
        let mut c = Command::new(&redis);
        c.args(["--port", &p.to_string(), "--save", "", "--appendonly", "no"]);
        c.args([
            "--dir",
            dir.to_str().unwrap(),
            "--dbfilename",
            &format!("d{i}.rdb"),
        ]);
        if i > 0 {
            c.args(["--replicaof", "127.0.0.1", &rports[0].to_string()]);
        }
        procs.0.push(
            c.stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {redis}"))?,
        );
    }
    // The loopback baseline's echo is a process of its own too, so the
    // round trip crosses processes as the puts do.
    let echo_port = free_port()?;
    procs.0.push(
        Command::new(&exe)
            .arg("echo")
            .arg(echo_port.to_string())
            .stdout(Stdio::null())
            .spawn()?,
    );

    // Nodes 1-3, then Redis's master and replicas (`procs`' order).
    let pids: Vec<u32> = procs.0[..6].iter().map(|c| c.id()).collect();
    let logs2 = logs.clone();
    rt.block_on(async move {
        let logs = logs2;
        let value = vec![b'x'; size];
        let (leader_port, master_port) = (ports[0], rports[0]);
        let raft_client = |v: Vec<u8>| async move {
            let mut s = connect(leader_port).await?;
            s.get_mut().write_all(b"C").await?;
            Ok::<_, anyhow::Error>(FrameClient { s, value: v })
        };
        let redis_client = |v: Vec<u8>| async move {
            Ok::<_, anyhow::Error>(RedisClient { s: connect(master_port).await?, value: v, line: Vec::new() })
        };
        // Both ready: a put that goes through, within 10 s.
        let deadline = Instant::now() + Duration::from_secs(10);
        until_a_put("the Raft nodes", deadline, || raft_client(value.clone())).await?;
        until_a_put("redis with 2 replicas", deadline, || redis_client(value.clone())).await?;
        while connect(echo_port).await.is_err() {
            if Instant::now() > deadline {
                bail!("the echo process did not listen within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("{size} B puts, {rounds} rounds of {secs} s phases taking turns; p50/p99 in µs");
        println!("{:<34} {:>10} {:>8} {:>8}", "round / phase", "ops/s", "p50", "p99");
        let mut ratios: Vec<(f64, f64, f64)> = Vec::new();
        let mut floors: Vec<f64> = Vec::new();
        let mut cpu_ratios: Vec<f64> = Vec::new();
        for round in 1..=rounds {
            if sync {
                let f = fsync_floor(&logs, size)?;
                println!("{:<34} {:>10} {:>8.0}", format!("{round} fsync floor"), "", f);
                floors.push(f);
            }
            let mut p50 = [0f64; 3];
            let mut tput = [0f64; 2];
            let mut cpu = [0f64; 2];
            for (k, name) in ["loopback", "raft-rs", "redis WAIT 2"].iter().enumerate() {
                let (h, ops) = match k {
                    0 => closed_loop(vec![FrameClient { s: connect(echo_port).await?, value: value.clone() }], dur).await?,
                    1 => closed_loop(vec![raft_client(value.clone()).await?], dur).await?,
                    _ => closed_loop(vec![redis_client(value.clone()).await?], dur).await?,
                };
                p50[k] = h.value_at_quantile(0.5) as f64;
                println!("{:<34} {:>10.0} {:>8} {:>8}", format!("{round} {name} c=1"), ops, h.value_at_quantile(0.5), h.value_at_quantile(0.99));
            }
            for (k, name) in ["raft-rs", "redis WAIT 2"].iter().enumerate() {
                // The three Raft nodes (node 1 leads), then Redis's master
                // and replicas: their CPU over the phase.
                let group = &pids[3 * k..3 * k + 3];
                let before: Vec<u64> = group.iter().map(|&p| cpu_ns(p)).collect();
                let (h, ops) = if k == 0 {
                    closed_loop(clients(many, || raft_client(value.clone())).await?, dur).await?
                } else {
                    closed_loop(clients(many, || redis_client(value.clone())).await?, dur).await?
                };
                tput[k] = ops;
                println!("{:<34} {:>10.0} {:>8} {:>8}", format!("{round} {name} c={many}"), ops, h.value_at_quantile(0.5), h.value_at_quantile(0.99));
                let per_put: Vec<f64> = group
                    .iter()
                    .zip(&before)
                    .map(|(&p, b)| cpu_ns(p).saturating_sub(*b) as f64 / 1e3 / h.len() as f64)
                    .collect();
                cpu[k] = per_put[0];
                println!(
                    "{:<34} leader / primary {:.1} µs, followers / replicas {:.1} / {:.1} µs",
                    format!("{round} {name} CPU per put"),
                    per_put[0],
                    per_put[1],
                    per_put[2]
                );
            }
            cpu_ratios.push(cpu[0] / cpu[1]);
            ratios.push((p50[1] / p50[2], p50[1] / p50[0], tput[0] / tput[1]));
            if let Some(f) = floors.last() {
                println!("{:<34} {:>10} {:>8.0}", format!("{round} raft-rs p50 - fsync floor"), "", p50[1] - f);
            }
        }
        let med = |f: fn(&(f64, f64, f64)) -> f64| {
            let mut v: Vec<f64> = ratios.iter().map(f).collect();
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        println!(
            "raft-rs one-loop nodes: put p50 {:.2}x redis WAIT 2, {:.2}x the loopback round trip; c={many} throughput {:.2}x redis (medians of the rounds' ratios)",
            med(|r| r.0),
            med(|r| r.1),
            med(|r| r.2)
        );
        cpu_ratios.sort_by(|a, b| a.total_cmp(b));
        println!(
            "raft-rs leader CPU per put at c={many}: {:.2}x redis master's (median of the rounds)",
            cpu_ratios[cpu_ratios.len() / 2]
        );
        Ok(())
    })?;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&logs);
    Ok(())
}
