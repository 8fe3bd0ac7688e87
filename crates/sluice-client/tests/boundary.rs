//! Requests that decode but carry the values a client should not send:
//! the edges of every integer field (0, 1, the type's maximum, times far
//! in the future), keys and paths at and past their limits, traces whose
//! hops run backwards, specs with odd retentions. A node answers each
//! (an error is an answer), keeps serving the others, and never panics:
//! a debug build's arithmetic overflow is a panic too, so this runs where
//! CI runs the tests. Its own test binary: the panic hook sees only the
//! node's threads and this test's.

use bytes::{Bytes, BytesMut};
use sluice_client::{Client, PoolSpec, PoolType};
use sluice_server::{Server, ServerConfig};
use sluice_store::Layout;
use sluice_types::pool::Retention;
use sluice_types::{Hop, ObjectMeta, ReqId, Trace};
use sluice_wire::{FrameDecoder, OutQueue, Request, Response, WatchFrom};
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// xorshift64*: the same requests on every run (`SLUICE_BOUNDARY_SEED`
/// picks another sequence).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn coin(&mut self) -> bool {
        self.next() & 1 == 0
    }
    fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())].clone()
    }
    /// An edge of u64 more often than not.
    fn u64(&mut self) -> u64 {
        let now = sluice_types::wall_us();
        match self.below(11) {
            0 => 0,
            1 => 1,
            2 => 2,
            3 => u64::MAX,
            4 => u64::MAX - 1,
            5 => u32::MAX as u64,
            6 => i64::MAX as u64,
            7 => now,
            8 => now.saturating_sub(1_000_000),
            9 => now + 3_600_000_000,
            _ => self.next(),
        }
    }
    fn u32(&mut self) -> u32 {
        match self.below(6) {
            0 => 0,
            1 => 1,
            2 => 2,
            3 => u32::MAX,
            4 => u32::MAX - 1,
            _ => self.next() as u32,
        }
    }
    fn opt_u64(&mut self) -> Option<u64> {
        self.coin().then(|| self.u64())
    }
    fn req_id(&mut self) -> Option<ReqId> {
        self.coin().then(|| ReqId {
            client: self.u64(),
            seq: self.u64(),
        })
    }
    fn shard(&mut self) -> Option<u32> {
        match self.below(4) {
            0 => Some(0),
            1 => Some(self.u32()),
            _ => None,
        }
    }
    fn key(&mut self) -> String {
        // Mostly keys of the node's pools, so requests get past the door.
        if self.below(5) < 3 {
            return self.pick(&[
                "/vol/a".to_string(),
                "/vol/b".into(),
                "/p/a".into(),
                "/p/b".into(),
                "/trig/x".into(),
            ]);
        }
        let long = format!("/vol/{}", "k".repeat(1019));
        let too_long = format!("/vol/{}", "k".repeat(1020));
        self.pick(&[
            "/vol/a".to_string(),
            "/vol/b".into(),
            "/p/a".into(),
            "/p/b".into(),
            "/trig/x".into(),
            "/trig/x/deeper".into(),
            "/nopool/a".into(),
            "/".into(),
            String::new(),
            "/vol/".into(),
            "/vol//a".into(),
            "vol/a".into(),
            "/vol/a\u{0}b".into(),
            "/vol/ключ".into(),
            long,
            too_long,
        ])
    }
    /// Pool paths other than the ones the test's requests read and write
    /// (so the node's pools stay for the rest of the run).
    fn pool_path(&mut self) -> String {
        self.pick(&[
            "/x1".to_string(),
            "/x2".into(),
            "/vol/sub".into(),
            "/".into(),
            String::new(),
            "/x1/".into(),
            "no-slash".into(),
        ])
    }
    fn value(&mut self) -> Bytes {
        match self.below(4) {
            0 => Bytes::new(),
            1 => Bytes::from_static(b"v"),
            2 => Bytes::from(vec![7u8; 100_000]),
            _ => Bytes::from(self.next().to_le_bytes().to_vec()),
        }
    }
    fn trace(&mut self) -> Option<Trace> {
        if self.coin() {
            return None;
        }
        let hops = (0..self.below(4))
            .map(|_| Hop {
                stage: self.pick(&["relay".to_string(), String::new(), "x".repeat(300)]),
                enqueued_us: self.u64(),
                started_us: self.u64(),
                emitted_us: self.u64(),
            })
            .collect();
        Some(Trace {
            id: self.u64(),
            client_sent_us: self.u64(),
            hops,
            emit_depth: self.u32(),
        })
    }
    fn json(&mut self) -> String {
        let n = self.u64();
        self.pick(&[
            String::new(),
            "{".into(),
            "null".into(),
            "[]".into(),
            format!("{{\"op\": \"ls\", \"n\": {n}}}"),
            "{\"op\": \"status\"}".into(),
            "{\"op\": \"whoami\"}".into(),
            // Rules about a principal no request here acts as (a rule
            // about this client could lock it out of what follows).
            format!("{{\"op\": \"set\", \"name\": \"r\", \"rule\": {{\"kind\": \"rate\", \"who\": {{\"principal\": \"someone-else\"}}, \"pool\": \"/vol\", \"ops_per_s\": {n}, \"bytes_per_s\": {n}, \"max_delay_ms\": {n}}}}}"),
            format!("{{\"op\": \"set\", \"name\": \"q\", \"rule\": {{\"kind\": \"qos\", \"small_bytes\": {n}, \"priority\": [{{\"role\": \"x\"}}]}}}}"),
            format!("{{\"op\": \"auth_create\", \"name\": \"p{n}\", \"roles\": [\"{n}\"]}}"),
            "{\"op\": \"rm\", \"name\": \"r\"}".into(),
            format!("{{\"op\": \"add_member\", \"shard\": \"volatile/0/0\", \"node\": {n}}}"),
            format!("{{\"op\": \"cut\", \"node\": {n}, \"peers\": [{n}]}}"),
        ])
    }

    fn request(&mut self) -> Request {
        match self.below(28) {
            0 => Request::Ping,
            1 => Request::Stats,
            2..=4 => Request::Put {
                key: self.key(),
                shard: self.shard(),
                expected: self.opt_u64(),
                value: self.value(),
                trace: self.trace(),
                req_id: self.req_id(),
            },
            5 | 6 => Request::TriggerPut {
                key: self.key(),
                shard: self.shard(),
                value: self.value(),
                trace: self.trace(),
                origin: self.coin().then(|| ObjectMeta {
                    version: self.u64(),
                    timestamp_us: self.u64(),
                    previous_version: self.u64(),
                    previous_version_by_key: self.u64(),
                    tombstone: self.coin(),
                }),
            },
            7 => Request::Remove {
                key: self.key(),
                shard: self.shard(),
                expected: self.opt_u64(),
                req_id: None,
            },
            8 | 9 => Request::Get {
                key: self.key(),
                shard: self.shard(),
                version: self.opt_u64(),
                min_version: self.opt_u64(),
                linearizable: self.coin(),
            },
            10 => {
                // A read of the future waits up to wait_ms: long waits
                // only for times that are stable already.
                let timestamp_us = self.u64();
                let past = timestamp_us <= sluice_types::wall_us();
                Request::GetByTime {
                    key: self.key(),
                    shard: self.shard(),
                    timestamp_us,
                    wait_ms: if past { self.u32() } else { self.u32() % 50 },
                    unstable: self.coin(),
                }
            }
            11 => Request::GetSize {
                key: self.key(),
                shard: self.shard(),
                version: self.opt_u64(),
                timestamp_us: self.opt_u64(),
            },
            12 => Request::ListKeys {
                pool: self.pick(&["/vol".to_string(), "/p".into(), "/trig".into(), "/".into()]),
                prefix: self.coin().then(|| self.key()),
                shard: self.shard(),
                after: self.coin().then(|| self.key()),
            },
            13 => Request::MultiGet {
                shard: self.shard(),
                keys: (0..self.below(5)).map(|_| self.key()).collect(),
            },
            14 => Request::PoolCreate {
                spec: PoolSpec {
                    pathname: self.pool_path(),
                    pool_type: self.pick(&[
                        None,
                        Some(PoolType::Volatile),
                        Some(PoolType::Persistent),
                        Some(PoolType::Trigger),
                    ]),
                    subgroup_index: self.u32(),
                    affinity_set_regex: self.pick(&[
                        None,
                        Some("(".to_string()),
                        Some("/[a-z]+".into()),
                        Some(String::new()),
                        Some("a{1000000}".into()),
                    ]),
                    object_locations: [(self.key(), self.u32())].into_iter().collect(),
                    retention: self.coin().then(|| Retention {
                        keep_versions: self.coin().then(|| self.u32()),
                        keep_for_s: self.opt_u64(),
                        keep_bytes: self.opt_u64(),
                    }),
                    ..Default::default()
                },
                req_id: self.req_id(),
            },
            15 => Request::PoolRemove {
                path: self.pool_path(),
                req_id: self.req_id(),
            },
            16 => Request::PoolPurge {
                path: self.pool_path(),
                req_id: self.req_id(),
            },
            17 => Request::PoolGet {
                path: self.pool_path(),
            },
            18 => Request::PoolOfKey { key: self.key() },
            19 => Request::Watch {
                prefix: self.key(),
                from: match self.below(3) {
                    0 => None,
                    1 => Some(WatchFrom::Version(self.u64())),
                    _ => Some(WatchFrom::Time(self.u64())),
                },
            },
            20 => Request::Unwatch {
                watch_id: self.u64(),
            },
            21 => Request::History {
                key: self.key(),
                shard: self.shard(),
                by_time: self.coin(),
                from: self.u64(),
                to: self.u64(),
                limit: self.u32(),
            },
            22 => Request::ListKeysAt {
                pool: self.pick(&["/vol".to_string(), "/p".into(), "/nopool".into()]),
                prefix: self.coin().then(|| self.key()),
                by_time: self.coin(),
                at: self.u64(),
                after: self.coin().then(|| self.key()),
            },
            23 => Request::DfgApply { text: self.json() },
            24 => Request::Cluster {
                command: self.json(),
            },
            25 => Request::Policy {
                command: self.json(),
                req_id: self.req_id(),
            },
            26 => Request::Raft {
                from: self.u32(),
                group: self.u64(),
                kind: self.next() as u8,
                body: self.value(),
                more: Vec::new(),
            },
            _ => Request::PeerAuth {
                node: self.u32(),
                key: "k".into(),
            },
        }
    }
}

/// A handshaken raw connection.
struct Raw {
    sock: TcpStream,
    buf: BytesMut,
}

impl Raw {
    async fn open(addr: &str, token: Option<&str>) -> Raw {
        let mut r = Raw {
            sock: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
        };
        let hello = Request::Hello {
            protocol_version: sluice_wire::PROTOCOL_VERSION,
            client_name: "boundary".into(),
            token: token.map(str::to_string),
        };
        let answer = r.call(&hello, 1).await;
        assert!(matches!(answer, Some(Response::HelloOk(_))), "{answer:?}");
        r
    }

    /// Sends `req` and reads frames until the one answering `id`
    /// (a watch's notifications come in between); None: the node closed
    /// the connection.
    async fn call(&mut self, req: &Request, id: u64) -> Option<Response> {
        let mut q = OutQueue::new();
        req.encode(&mut q, id, 0);
        self.sock.write_all(&q.to_bytes()).await.ok()?;
        let dec = FrameDecoder::new(u32::MAX, u32::MAX);
        loop {
            if let Some(f) = dec.decode(&mut self.buf).expect("the node's frames decode") {
                if f.request_id == id {
                    return Some(Response::decode(f).expect("the node's answers decode"));
                }
                continue;
            }
            let read =
                tokio::time::timeout(Duration::from_secs(20), self.sock.read_buf(&mut self.buf))
                    .await
                    .unwrap_or_else(|_| panic!("no answer to {req:?} within 20 s"));
            match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }
}

/// Every panic of the nodes in this process, from the hook installed once
/// (the tests share it; each looks only at the panics during its own run).
fn panics() -> &'static Mutex<Vec<String>> {
    static PANICS: std::sync::OnceLock<&'static Mutex<Vec<String>>> = std::sync::OnceLock::new();
    PANICS.get_or_init(|| {
        let seen: &'static Mutex<Vec<String>> = Box::leak(Box::default());
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // The node's panics: the tests' own failing assertions are
            // theirs to report.
            if info
                .location()
                .is_some_and(|l| l.file().ends_with("tests/boundary.rs"))
            {
                return default_hook(info);
            }
            seen.lock().unwrap().push(format!(
                "{info} (thread {:?})",
                std::thread::current().name()
            ));
            default_hook(info);
        }));
        seen
    })
}

/// A node's (or cluster's) server task and how to stop it.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(server: Server) -> Running {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Running { stop, done }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.done)
            .await
            .expect("the node stops")
            .unwrap();
    }
}

/// A persistent pool and a graph, so writes reach history and traces
/// reach the lambdas; in a cluster, once its metadata group has a leader
/// (polled, bounded).
async fn prepare(good: &Client) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match good
            .create_pool(PoolSpec {
                pathname: "/p".into(),
                pool_type: Some(PoolType::Persistent),
                ..Default::default()
            })
            .await
        {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("waiting for the node: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    good.dfg_apply(
        r#"[{"id": "g", "graph": [{"pathname": "/trig/x",
            "user_defined_logic_list": ["relay"],
            "destinations": [{"/vol/out": "put"}, {"/trig/x/deeper": "trigger_put"}]}]}]"#,
    )
    .await
    .unwrap();
    good.put("/vol/kept", "kept").await.unwrap();
}

/// Sends `n` requests of the sequence `seed` (`SLUICE_BOUNDARY_SEED` and
/// `SLUICE_BOUNDARY_REQUESTS` override them) to `addr` (as the principal
/// of `token`), each awaited; asserts that most were answered and that
/// more than the share `past_the_door` of them succeeded.
async fn send_requests(addr: &str, token: Option<&str>, n: u64, seed: u64, past_the_door: f64) {
    let seed = std::env::var("SLUICE_BOUNDARY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed);
    let n: u64 = std::env::var("SLUICE_BOUNDARY_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(n);
    let mut rng = Rng(seed);
    let mut conn = Raw::open(addr, token).await;
    let (mut answered, mut refused, mut closed) = (0u64, 0u64, 0u64);
    let mut kinds = std::collections::BTreeMap::<String, u64>::new();
    for i in 0..n {
        let req = rng.request();
        match conn.call(&req, 100 + i).await {
            Some(Response::Error(e)) => {
                answered += 1;
                refused += 1;
                let kind = format!("{e:?}");
                let kind = kind
                    .split([' ', '{', '('])
                    .next()
                    .unwrap_or("?")
                    .to_string();
                *kinds.entry(kind).or_default() += 1;
            }
            Some(_) => answered += 1,
            None => {
                // A request the node closes the connection on (a peer's
                // message from a client): a new connection goes on.
                closed += 1;
                conn = Raw::open(addr, token).await;
            }
        }
    }
    eprintln!(
        "{addr}: {n} requests: {answered} answered ({refused} with an error), {closed} closed their connection; errors by kind: {kinds:?}"
    );
    assert!(answered > n / 2, "{answered} of {n} answered");
    // Not all refused at the door: the requests reached the store, the
    // pools and the lambdas.
    let ok = answered - refused;
    assert!(
        ok as f64 > n as f64 * past_the_door,
        "{refused} of {answered} refused"
    );
}

/// The node (cluster) still serves, its data intact, and nothing panicked
/// since `from` panics had been seen.
async fn check(good: &Client, from: usize) {
    assert_eq!(&good.get("/vol/kept").await.unwrap().value[..], b"kept");
    good.put("/p/after", "x").await.unwrap();
    assert_eq!(&good.get("/p/after").await.unwrap().value[..], b"x");
    // Taken out of the lock: a failing assertion runs the hook, which
    // takes it.
    let new: Vec<String> = panics().lock().unwrap()[from..].to_vec();
    assert!(new.is_empty(), "{} panics:\n{}", new.len(), new.join("\n"));
}

/// One node with two volatile, two trigger and one persistent shard.
async fn one_node(dir: &std::path::Path) -> (String, Running) {
    let mut cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_path_buf(),
        ..Default::default()
    };
    cfg.layout = Layout {
        version: 1,
        volatile: vec![2],
        trigger: vec![2],
        persistent: vec![1],
    };
    let server = Server::bind_with_registry(cfg, sluice_udls::registry())
        .await
        .unwrap();
    (server.local_addr().to_string(), Running::start(server))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_at_the_edges_never_break_the_node() {
    let from = panics().lock().unwrap().len();
    let dir = tempfile::tempdir().unwrap();
    let (addr, running) = one_node(dir.path()).await;
    let good = Client::connect(&addr).await.unwrap();
    prepare(&good).await;
    send_requests(&addr, None, 3000, 0x5eed_b0b0_cafe_f00d, 0.2).await;
    check(&good, from).await;
    running.stop().await;
}

/// The same through the policies: authentication required, a principal
/// whose role may read and write `/vol` and `/p` and trigger `/trig`, a
/// rate limit on another; every request passes the access checks first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_at_the_edges_never_break_a_policed_node() {
    let from = panics().lock().unwrap().len();
    let dir = tempfile::tempdir().unwrap();
    let (addr, running) = one_node(dir.path()).await;
    let open = Client::connect(&addr).await.unwrap();
    prepare(&open).await;
    let token = |r: serde_json::Value| r["token"].as_str().unwrap().to_string();
    let create = |name: &str, role: &str| serde_json::json!({"op": "auth_create", "name": name, "roles": [role]});
    let admin = token(open.policy(create("admin", "admin")).await.unwrap());
    let user = token(open.policy(create("fuzz", "user")).await.unwrap());
    // The first access rule takes the anonymous client's rights away:
    // the admin's rule first, the rest as the admin.
    let good = Client::connect_with(sluice_client::ClientConfig {
        addr: addr.clone(),
        token: Some(admin),
        ..Default::default()
    })
    .await
    .unwrap();
    for (i, (name, who, pool, allow)) in [
        (
            "admin",
            "admin",
            "/",
            vec!["read", "write", "trigger", "watch", "admin"],
        ),
        ("vol", "user", "/vol", vec!["read", "write", "watch"]),
        ("p", "user", "/p", vec!["read", "write", "watch"]),
        ("trig", "user", "/trig", vec!["trigger", "watch"]),
    ]
    .into_iter()
    .enumerate()
    {
        let rule = serde_json::json!({"kind": "access", "who": {"role": who}, "pool": pool, "allow": allow});
        let c = if i == 0 { &open } else { &good };
        c.policy(serde_json::json!({"op": "set", "name": name, "rule": rule}))
            .await
            .unwrap();
    }
    let slow = serde_json::json!({"kind": "rate", "who": {"principal": "nobody"},
        "ops_per_s": 1, "max_delay_ms": 0});
    good.policy(serde_json::json!({"op": "set", "name": "slow", "rule": slow}))
        .await
        .unwrap();
    good.policy(serde_json::json!({"op": "require_auth", "on": true}))
        .await
        .unwrap();
    send_requests(&addr, Some(&user), 3000, 0x5eed_0b0e_d1e5, 0.15).await;
    check(&good, from).await;
    running.stop().await;
}

/// The same on a cluster of three in-process nodes (every shard on all
/// three): requests to a follower are forwarded, writes go through Raft,
/// commands through the metadata group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_at_the_edges_never_break_a_cluster() {
    let from = panics().lock().unwrap().len();
    let dir = tempfile::tempdir().unwrap();
    let addrs: Vec<std::net::SocketAddr> = (0..3)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
        })
        .collect();
    let mut layout = String::new();
    for (id, a) in addrs.iter().enumerate() {
        layout += &format!("[[nodes]]\nid = {id}\naddress = \"{a}\"\n");
    }
    for kind in ["volatile", "persistent", "trigger"] {
        layout += &format!("[[subgroups.{kind}]]\nshards = [[0, 1, 2]]\n");
    }
    let layout_file = dir.path().join("layout.toml");
    std::fs::write(&layout_file, layout).unwrap();
    let mut nodes = Vec::new();
    for (id, addr) in addrs.iter().enumerate() {
        let mut cfg = ServerConfig {
            node_id: id as u32,
            listen: *addr,
            data_dir: dir.path().join(format!("node-{id}")),
            ..Default::default()
        };
        cfg.cluster.layout = Some(layout_file.clone());
        cfg.cluster.volatile_dir = Some(dir.path().join(format!("node-{id}/raft-volatile")));
        let server = Server::bind_with_registry(cfg, sluice_udls::registry())
            .await
            .unwrap();
        nodes.push(Running::start(server));
    }
    let seeds: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let good = Client::connect(&seeds.join(",")).await.unwrap();
    prepare(&good).await;
    send_requests(&seeds[0], None, 1500, 0xc105_7e12, 0.2).await;
    send_requests(&seeds[2], None, 1500, 0xc105_7e13, 0.2).await;
    check(&good, from).await;
    for n in nodes {
        n.stop().await;
    }
}
