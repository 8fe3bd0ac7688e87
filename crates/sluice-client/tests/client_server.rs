//! The client SDK against a real server on a loopback port.

use bytes::Bytes;
use sluice_client::{
    Client, ClientConfig, Notification, NotificationKind, PoolSpec, PoolType, SluiceError, Watch,
    VERSION_NONE,
};
use sluice_server::{Server, ServerConfig};
use sluice_store::Layout;
use std::net::SocketAddr;
use std::time::Duration;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

struct TestServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
    _dir: TempDir,
}

/// A fresh data directory, removed when dropped.
fn temp_dir() -> TempDir {
    tempfile::tempdir().unwrap()
}

async fn start(tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
    start_with(tweak, sluice_udls::registry()).await
}

/// `start` with these UDLs.
async fn start_with(
    tweak: impl FnOnce(&mut ServerConfig),
    registry: sluice_compute::Registry,
) -> TestServer {
    let dir = temp_dir();
    let mut cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    cfg.layout = Layout {
        version: 1,
        volatile: vec![4],
        trigger: vec![2],
        persistent: vec![],
    };
    tweak(&mut cfg);
    let server = Server::bind_with_registry(cfg, registry).await.unwrap();
    let addr = server.local_addr();
    let (tx, rx) = oneshot::channel();
    let done = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    TestServer {
        addr,
        stop: Some(tx),
        done,
        _dir: dir,
    }
}

/// A node with persistent pools on (`sync` their policy), one
/// persistent shard and a persistent pool `/durable`, and a client;
/// `tweak` changes the rest of its configuration.
async fn with_durable_pool(
    sync: &str,
    tweak: impl FnOnce(&mut ServerConfig),
) -> (TestServer, Client) {
    let s = start(|c| {
        c.persistent.enabled = true;
        c.persistent.sync = sync.into();
        c.layout.persistent = vec![1];
        tweak(c);
    })
    .await;
    let c = s.client().await;
    c.create_pool(PoolSpec {
        pathname: "/durable".into(),
        pool_type: Some(PoolType::Persistent),
        ..Default::default()
    })
    .await
    .unwrap();
    (s, c)
}

impl TestServer {
    async fn client(&self) -> Client {
        Client::connect(&self.addr.to_string()).await.unwrap()
    }
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), &mut self.done)
            .await
            .expect("server stops")
            .unwrap();
    }
}

/// A request's future is moved into its task and copied as it runs, so
/// its size is paid on every request (an asyncio call from Python spawns
/// one per call). Rare paths (reconnecting, refreshing the pool table or
/// the membership) are boxed so they do not size the common one: a
/// connect inline made every put's future 7.9 KB.
#[tokio::test]
async fn request_futures_stay_small() {
    let s = start(|_| {}).await;
    let c = s.client().await;
    let put = c.put("/vol/a", Bytes::from_static(b"x"));
    let get = c.get("/vol/a");
    for (what, size) in [
        ("put", std::mem::size_of_val(&put)),
        ("get", std::mem::size_of_val(&get)),
    ] {
        assert!(size <= 4096, "a {what}'s future is {size} bytes");
    }
    drop((put, get));
    s.stop().await;
}

#[tokio::test]
async fn put_get_versions_conditional_remove() {
    let s = start(|_| {}).await;
    let c = s.client().await;
    let p1 = c.put("/vol/a", "one").await.unwrap();
    let p2 = c.put("/vol/a", "two").await.unwrap();
    assert!(p2.version > p1.version && p2.timestamp_us > p1.timestamp_us);
    let o = c.get("/vol/a").await.unwrap();
    assert_eq!(&o.value[..], b"two");
    assert_eq!(o.meta.previous_version_by_key, p1.version);
    assert_eq!(
        c.get_version("/vol/a", p2.version).await.unwrap().value,
        Bytes::from("two")
    );
    assert!(matches!(
        c.get_version("/vol/a", p1.version).await,
        Err(SluiceError::VersionNotRetained { .. })
    ));
    assert_eq!(
        c.get_by_time("/vol/a", p2.timestamp_us)
            .await
            .unwrap()
            .meta
            .version,
        p2.version
    );
    assert_eq!(c.get_size("/vol/a", None, None).await.unwrap(), 3);
    let e = c
        .put_if_version("/vol/a", "three", p1.version)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SluiceError::VersionConflict { current, .. } if *current == p2.version.to_string()),
        "{e}"
    );
    c.put_if_version("/vol/a", "three", p2.version)
        .await
        .unwrap();
    c.put_if_version("/vol/new", "x", VERSION_NONE)
        .await
        .unwrap();
    c.remove("/vol/a").await.unwrap();
    assert!(matches!(
        c.get("/vol/a").await,
        Err(SluiceError::NotFound { .. })
    ));
    s.stop().await;
}

#[tokio::test]
async fn routing_list_and_multi_get_across_shards() {
    let s = start(|_| {}).await;
    let c = s.client().await;
    let keys: Vec<String> = (0..40).map(|i| format!("/vol/k{i:02}")).collect();
    for k in &keys {
        c.put(k, k.clone()).await.unwrap();
    }
    let stats = c.stats().await.unwrap();
    let used = stats["shards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["keys"].as_u64().unwrap() > 0)
        .count();
    assert!(
        used >= 3,
        "40 keys spread over the 4 volatile shards: {stats}"
    );
    assert_eq!(c.list_keys("/vol", None).await.unwrap(), keys);
    assert_eq!(
        c.list_keys("/vol", Some("/vol/k1")).await.unwrap().len(),
        10
    );
    let want: Vec<&str> = vec!["/vol/k03", "/vol/missing", "/vol/k39", "/nopool/x"];
    let got = c.multi_get(&want).await.unwrap();
    assert_eq!(&got[0].as_ref().unwrap().value[..], b"/vol/k03");
    assert!(matches!(got[1], Err(SluiceError::NotFound { .. })));
    assert_eq!(&got[2].as_ref().unwrap().value[..], b"/vol/k39");
    assert!(matches!(got[3], Err(SluiceError::NoPool { .. })));
    s.stop().await;
}

/// A pool whose keys do not fit in one reply is listed a page at a time.
/// Its keys went in one reply, and past the frame size a client accepts
/// (8 MiB of metadata: about 180,000 keys of 40 bytes) the listing failed
/// with "protocol error: server sent a bad frame".
#[tokio::test]
async fn a_pool_too_large_for_one_reply_is_listed_a_page_at_a_time() {
    // One shard: a listing asks each shard for its keys.
    let s = start(|c| c.layout.volatile = vec![1]).await;
    let c = s.client().await;
    // 40,000 keys of 250 bytes: 10 MB of key text.
    let pad = "x".repeat(230);
    let keys: Vec<String> = (0..40_000)
        .map(|i| format!("/vol/big/{i:06}-{pad}"))
        .collect();
    for k in &keys {
        c.put_and_forget(k, "v").await.unwrap();
    }
    c.put("/vol/other", "v").await.unwrap(); // after the others, on their connection
    let listed = c.list_keys("/vol", Some("/vol/big/")).await.unwrap();
    assert_eq!(listed.len(), keys.len());
    assert!(listed == keys, "every key once, in order");
    // With a prefix that takes none of them, and the whole pool.
    assert!(c
        .list_keys("/vol", Some("/vol/none"))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        c.list_keys("/vol", None).await.unwrap().len(),
        keys.len() + 1
    );
    s.stop().await;
}

/// Multi-gets and histories whose values together pass what one reply
/// may carry come back whole, over several replies. They went in one
/// reply each, and past the frame size a client accepts (128 MiB of
/// values) `mget` and `history` failed with "server sent a bad frame".
#[tokio::test]
async fn large_values_are_fetched_together_over_several_replies() {
    let (s, c) = with_durable_pool("never", |c| c.layout.volatile = vec![1]).await;
    // Three values of 60 MB: 180 MB together.
    let values: Vec<Bytes> = (0..3u8)
        .map(|i| Bytes::from(vec![b'a' + i; 60_000_000]))
        .collect();
    let mut want = Vec::new();
    for (i, v) in values.iter().enumerate() {
        c.put(&format!("/vol/m{i}"), v.clone()).await.unwrap();
        want.push(c.put("/durable/h", v.clone()).await.unwrap().version);
    }
    let got = c
        .multi_get(&["/vol/m0", "/vol/missing", "/vol/m1", "/vol/m2"])
        .await
        .unwrap();
    assert_eq!(got.len(), 4);
    assert!(matches!(got[1], Err(SluiceError::NotFound { .. })));
    for (g, v) in [&got[0], &got[2], &got[3]].into_iter().zip(&values) {
        assert!(g.as_ref().unwrap().value == v, "each value whole, in order");
    }
    let h = c
        .history("/durable/h", false, 0, u64::MAX, 16)
        .await
        .unwrap();
    let versions: Vec<u64> = h.iter().map(|o| o.meta.version).collect();
    want.reverse();
    assert_eq!(versions, want, "every version, newest first");
    assert!(h[0].value == values[2] && h[2].value == values[0]);
    s.stop().await;
}

/// A multi-get of more keys than one request may carry is split: it
/// failed with `TooManyKeys` past the node's `max_multi_get_keys`.
#[tokio::test]
async fn a_multi_get_of_more_keys_than_one_request_takes_is_split() {
    let s = start(|c| c.layout.volatile = vec![1]).await;
    let c = s.client().await;
    let keys: Vec<String> = (0..10_000).map(|i| format!("/vol/mg/{i:05}")).collect();
    for k in &keys {
        c.put_and_forget(k, k.clone()).await.unwrap();
    }
    c.put("/vol/mg/done", "v").await.unwrap();
    let asked: Vec<&str> = keys.iter().map(String::as_str).collect();
    let got = c.multi_get(&asked).await.unwrap();
    assert_eq!(got.len(), keys.len());
    for (k, g) in keys.iter().zip(&got) {
        assert_eq!(&g.as_ref().unwrap().value[..], k.as_bytes());
    }
    s.stop().await;
}

#[tokio::test]
async fn persistent_pools_can_be_turned_off() {
    let s = start(|c| c.persistent.enabled = false).await;
    let e = s
        .client()
        .await
        .create_pool(PoolSpec {
            pathname: "/p".into(),
            pool_type: Some(PoolType::Persistent),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(e, SluiceError::NotSupported { .. }), "{e}");
    assert!(e.to_string().contains("not enabled on this node"), "{e}");
}

#[tokio::test]
async fn pools_lifecycle_and_stale_cache() {
    let s = start(|_| {}).await;
    let a = s.client().await;
    let b = s.client().await;
    let spec = PoolSpec {
        pathname: "/positions".into(),
        pool_type: Some(PoolType::Volatile),
        affinity_set_regex: Some("/[a-zA-Z0-9]+_[0-9]+_".into()),
        ..Default::default()
    };
    let p = a.create_pool(spec.clone()).await.unwrap();
    assert_eq!(p.shard_count, 4);
    assert!(matches!(
        a.create_pool(spec).await,
        Err(SluiceError::PoolExists { .. })
    ));
    // b's cache predates the pool: it refreshes on its own.
    b.put("/positions/little3_7_42", "p").await.unwrap();
    assert_eq!(
        a.pool_of_key("/positions/little3_7_42")
            .await
            .unwrap()
            .pathname,
        "/positions"
    );
    a.remove_pool("/positions").await.unwrap();
    let e = b.get("/positions/little3_7_42").await.unwrap_err();
    assert!(
        matches!(&e, SluiceError::PoolDeleted { pool, .. } if pool == "/positions"),
        "{e}"
    );
    assert!(a
        .list_pools(false)
        .await
        .unwrap()
        .iter()
        .all(|p| p.pathname != "/positions"));
    assert!(a
        .list_pools(true)
        .await
        .unwrap()
        .iter()
        .any(|p| p.pathname == "/positions" && p.deleted));
    // Persistent pools are on by default.
    let p = a
        .create_pool(PoolSpec {
            pathname: "/p".into(),
            pool_type: Some(PoolType::Persistent),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(p.pool_type, PoolType::Persistent);
    let e = a
        .create_pool(PoolSpec {
            pathname: "/bad".into(),
            pool_type: Some(PoolType::Volatile),
            affinity_set_regex: Some("(".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("does not compile"), "{e}");
    assert!(matches!(
        a.get("/trig/x").await,
        Err(SluiceError::WrongPoolType { .. })
    ));
    assert!(matches!(
        a.put("/elsewhere/x", "v").await,
        Err(SluiceError::NoPool { .. })
    ));
    s.stop().await;
}

/// A watch's next notification, which must come within 5 s.
async fn next_within_5s(w: &mut Watch) -> Notification {
    tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("a notification within 5 s")
        .expect("the watch is open")
}

/// Between a client and a node: forwards both ways until `cut` is set,
/// then swallows everything while keeping the connections open (a node
/// paused, or a link gone without a reset).
struct BlackHole {
    addr: SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

async fn black_hole_to(target: SocketAddr) -> BlackHole {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let c = cut.clone();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = l.accept().await {
            let outbound = TcpStream::connect(target).await.unwrap();
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            tokio::spawn(pipe(ri, wo, c.clone()));
            tokio::spawn(pipe(ro, wi, c.clone()));
        }
    });
    BlackHole { addr, cut }
}

async fn pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if cut.load(std::sync::atomic::Ordering::Relaxed) {
            continue;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A watch through a node that goes silent without closing its
/// connection (paused, hung, cut off) ends, saying why, after its
/// keepalive goes unanswered; before, it waited forever. While the node
/// answers, the keepalive's pings keep an idle watch open.
#[tokio::test]
async fn a_watch_through_a_silent_node_ends_saying_why() {
    let s = start(|_| {}).await;
    let hole = black_hole_to(s.addr).await;
    let c = Client::connect_with(ClientConfig {
        addr: hole.addr.to_string(),
        watch_keepalive: Duration::from_millis(200),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut w = c.watch("/vol/k").await.unwrap();
    c.put("/vol/k", "a").await.unwrap();
    assert_eq!(&next_within_5s(&mut w).await.object.value[..], b"a");
    // Five keepalives' worth of silence from the watch, the node answering
    // its pings: still open.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), w.next())
            .await
            .is_err(),
        "an idle watch on a live node stays open"
    );
    assert!(w.lost().is_none());
    let other = Client::connect_with(ClientConfig {
        addr: hole.addr.to_string(),
        request_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await
    .unwrap();
    hole.cut.store(true, std::sync::atomic::Ordering::Relaxed);
    // A request meanwhile times out naming what it was (it said
    // "request 3 (0x05)").
    let e = other.get("/vol/k").await.unwrap_err().to_string();
    assert!(e.starts_with("a get request (id "), "{e}");
    assert!(e.ends_with("timed out after 500 ms"), "{e}");
    let end = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("the watch ends within its keepalive's bound");
    assert!(end.is_none());
    let why = w.lost().expect("lost, not cancelled").to_string();
    assert!(
        why.contains("a keepalive ping included: it is paused, hung or cut off"),
        "{why}"
    );
}

#[tokio::test]
async fn watch_sees_puts_triggers_removes_in_order() {
    let s = start(|_| {}).await;
    let c = s.client().await;
    let mut w = c.watch("/vol/w").await.unwrap();
    let mut t = c.watch("/trig").await.unwrap();
    c.put("/vol/w1", "a").await.unwrap();
    c.trigger_put("/trig/go", "fire").await.unwrap();
    c.put("/vol/other", "ignored").await.unwrap();
    c.remove("/vol/w1").await.unwrap();
    let n1 = next_within_5s(&mut w).await;
    assert_eq!(
        (n1.kind, &*n1.object.key, &n1.object.value[..]),
        (NotificationKind::Put, "/vol/w1", &b"a"[..])
    );
    let n2 = next_within_5s(&mut w).await;
    assert_eq!(n2.kind, NotificationKind::Remove);
    let n3 = next_within_5s(&mut t).await;
    assert_eq!(
        (n3.kind, &n3.object.value[..]),
        (NotificationKind::TriggerPut, &b"fire"[..])
    );
    w.cancel().await.unwrap();
    // A prefix ending in '/' (the README's `c.watch("/trig/")`) was
    // refused as a key that must not end with '/': it watches the keys
    // below it only.
    let mut below = c.watch("/vol/d/").await.unwrap();
    c.put("/vol/d", "the prefix itself").await.unwrap();
    c.put("/vol/dx", "beside it").await.unwrap();
    c.put("/vol/d/a", "below").await.unwrap();
    let n = next_within_5s(&mut below).await;
    assert_eq!(&*n.object.key, "/vol/d/a");
    // "/" watches every key (it was "key has no segments"); a replay of
    // every pool is refused, saying why, and one on a trigger pool says
    // that pool stores nothing (it said "keeps only the latest version").
    let mut all = c.watch("/").await.unwrap();
    c.put("/vol/anywhere", "x").await.unwrap();
    let n = next_within_5s(&mut all).await;
    assert_eq!(&*n.object.key, "/vol/anywhere");
    for (prefix, says) in [
        ("/", "watch that pool's prefix"),
        ("/trig/", "trigger pool stores nothing"),
    ] {
        let e = c
            .watch_from(prefix, sluice_wire::WatchFrom::Version(1))
            .await
            .err()
            .unwrap();
        assert!(
            matches!(e, SluiceError::NotSupported { .. }) && e.to_string().contains(says),
            "{e}"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn put_and_forget_lands_and_pipelining_keeps_order_per_key() {
    let s = start(|_| {}).await;
    let c = Client::connect_with(ClientConfig {
        addr: s.addr.to_string(),
        connections: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    for i in 0..100 {
        c.put_and_forget("/vol/f", format!("{i}")).await.unwrap();
    }
    // Fire 500 concurrent puts on different keys: every one is acknowledged.
    let mut hs = Vec::new();
    for i in 0..500 {
        let c = c.clone();
        hs.push(tokio::spawn(async move {
            c.put(&format!("/vol/p{i}"), vec![1u8; 100]).await
        }));
    }
    for h in hs {
        h.await.unwrap().unwrap();
    }
    // The forgotten puts were on one connection? They were spread over two,
    // so wait for the last value to show up rather than assuming order.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let keys = c.list_keys("/vol", Some("/vol/f")).await.unwrap();
        if keys == vec!["/vol/f".to_string()]
            && c.stats().await.unwrap()["store"]["puts"].as_u64().unwrap() >= 600
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "forgotten puts did not land"
        );
        tokio::task::yield_now().await;
    }
    s.stop().await;
}

#[tokio::test]
async fn oversized_values_are_typed_errors_on_both_sides() {
    let s = start(|c| c.limits.max_value_bytes = 1000).await;
    let c = s.client().await;
    let e = c.put("/vol/big", vec![0u8; 1001]).await.unwrap_err();
    assert_eq!(
        e,
        SluiceError::ValueTooLarge {
            size: 1001,
            max: 1000
        }
    );
    c.put("/vol/ok", vec![0u8; 1000]).await.unwrap();
    // A raw client that ignores the limit gets the error and loses only its connection.
    let mut raw = handshake(s.addr).await;
    let mut q = sluice_wire::OutQueue::new();
    put_req("/vol/big", vec![0u8; 5000]).encode(&mut q, 7, 0);
    raw.write_all(&q.to_bytes()).await.unwrap();
    let (rid, resp) = read_response(&mut raw).await.unwrap();
    assert_eq!(rid, 7);
    assert!(matches!(
        resp,
        sluice_wire::Response::Error(SluiceError::ValueTooLarge {
            size: 5000,
            max: 1000
        })
    ));
    assert!(read_response(&mut raw).await.is_none(), "connection closed");
    assert_eq!(
        c.get_size("/vol/ok", None, None).await.unwrap(),
        1000,
        "others unaffected"
    );
    s.stop().await;
}

/// A trigger put's whole frame, as a raw client sends it.
fn trigger_put_frame(key: &str, value: Vec<u8>, request_id: u64) -> Bytes {
    let mut q = sluice_wire::OutQueue::new();
    sluice_wire::Request::TriggerPut {
        key: key.into(),
        shard: None,
        value: value.into(),
        trace: None,
        origin: None,
    }
    .encode(&mut q, request_id, 0);
    q.to_bytes()
}

/// A plain put of `value` to `key`, as a raw client sends it.
fn put_req(key: &str, value: impl Into<Bytes>) -> sluice_wire::Request {
    sluice_wire::Request::Put {
        key: key.into(),
        shard: None,
        expected: None,
        value: value.into(),
        trace: None,
        req_id: None,
    }
}

async fn handshake(addr: SocketAddr) -> Raw {
    let mut sock = raw(addr).await;
    let mut q = sluice_wire::OutQueue::new();
    sluice_wire::Request::Hello {
        protocol_version: sluice_wire::PROTOCOL_VERSION,
        client_name: "raw".into(),
        token: None,
    }
    .encode(&mut q, 1, 0);
    sock.write_all(&q.to_bytes()).await.unwrap();
    let (_, r) = read_response(&mut sock).await.unwrap();
    assert!(matches!(r, sluice_wire::Response::HelloOk(_)));
    sock
}

/// A raw protocol connection for hostile-client tests.
struct Raw {
    sock: TcpStream,
    buf: bytes::BytesMut,
}

impl Raw {
    async fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.sock.write_all(b).await
    }
}

async fn raw(addr: SocketAddr) -> Raw {
    Raw {
        sock: TcpStream::connect(addr).await.unwrap(),
        buf: bytes::BytesMut::new(),
    }
}

/// Reads one response; None on EOF.
async fn read_response(r: &mut Raw) -> Option<(u64, sluice_wire::Response)> {
    let dec = sluice_wire::FrameDecoder::new(u32::MAX, u32::MAX);
    loop {
        if let Some(f) = dec.decode(&mut r.buf).unwrap() {
            let id = f.request_id;
            return Some((id, sluice_wire::Response::decode(f).unwrap()));
        }
        match tokio::time::timeout(Duration::from_secs(10), r.sock.read_buf(&mut r.buf))
            .await
            .expect("server answers")
        {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

#[tokio::test]
async fn hostile_clients_cost_only_their_connection() {
    let s = start(|c| {
        c.timeouts.frame_ms = 300;
        c.timeouts.handshake_ms = 300;
    })
    .await;
    let good = s.client().await;
    good.put("/vol/x", "kept").await.unwrap();

    // Garbage bytes: told why, then closed.
    let mut g = raw(s.addr).await;
    g.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (_, r) = read_response(&mut g).await.unwrap();
    assert!(
        matches!(r, sluice_wire::Response::Error(SluiceError::Protocol { ref reason }) if reason.contains("magic")),
        "{r:?}"
    );

    // No handshake: first request must be HELLO.
    let mut n = raw(s.addr).await;
    let mut q = sluice_wire::OutQueue::new();
    sluice_wire::Request::Ping.encode(&mut q, 3, 0);
    n.write_all(&q.to_bytes()).await.unwrap();
    let (_, r) = read_response(&mut n).await.unwrap();
    assert!(
        matches!(r, sluice_wire::Response::Error(SluiceError::Protocol { ref reason }) if reason.contains("HELLO"))
    );

    // Huge length prefix: refused before anything is buffered.
    let mut h = handshake(s.addr).await;
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&sluice_wire::MAGIC.to_le_bytes());
    hdr.extend_from_slice(&[0x03, 0]);
    hdr.extend_from_slice(&u32::MAX.to_le_bytes());
    hdr.extend_from_slice(&0u32.to_le_bytes());
    hdr.extend_from_slice(&0u32.to_le_bytes());
    hdr.extend_from_slice(&9u64.to_le_bytes());
    h.write_all(&hdr).await.unwrap();
    let (rid, r) = read_response(&mut h).await.unwrap();
    assert_eq!(rid, 9);
    assert!(
        matches!(
            r,
            sluice_wire::Response::Error(SluiceError::MetaTooLarge { .. })
        ),
        "{r:?}"
    );

    // Slowloris: half a frame, then silence.
    let mut sl = handshake(s.addr).await;
    sl.write_all(&hdr[..10]).await.unwrap();
    let (_, r) = read_response(&mut sl).await.unwrap();
    assert!(
        matches!(r, sluice_wire::Response::Error(SluiceError::Timeout { .. })),
        "{r:?}"
    );

    // Truncated metadata inside a well-formed frame: an error reply, and the
    // connection stays usable.
    let mut t = handshake(s.addr).await;
    let mut bad = Vec::new();
    bad.extend_from_slice(&sluice_wire::MAGIC.to_le_bytes());
    bad.extend_from_slice(&[0x06, 0]);
    bad.extend_from_slice(&3u32.to_le_bytes());
    bad.extend_from_slice(&0u32.to_le_bytes());
    bad.extend_from_slice(&0u32.to_le_bytes());
    bad.extend_from_slice(&11u64.to_le_bytes());
    bad.extend_from_slice(&[1, 2, 3]);
    let mut q = sluice_wire::OutQueue::new();
    sluice_wire::Request::Ping.encode(&mut q, 12, 0);
    bad.extend_from_slice(&q.to_bytes());
    t.write_all(&bad).await.unwrap();
    let (rid, r) = read_response(&mut t).await.unwrap();
    assert!(
        rid == 11
            && matches!(
                r,
                sluice_wire::Response::Error(SluiceError::Protocol { .. })
            ),
        "{r:?}"
    );
    let (rid, r) = read_response(&mut t).await.unwrap();
    assert!(rid == 12 && r == sluice_wire::Response::Pong);

    assert_eq!(&good.get("/vol/x").await.unwrap().value[..], b"kept");
    let st = good.stats().await.unwrap();
    assert!(st["protocol_errors"].as_u64().unwrap() >= 4, "{st}");
    s.stop().await;
}

#[tokio::test]
async fn connection_and_in_flight_limits() {
    let s = start(|c| {
        c.limits.max_connections = 2;
        c.limits.max_in_flight_per_conn = 4;
    })
    .await;
    let a = s.client().await;
    let _b = s.client().await;
    let e = Client::connect(&s.addr.to_string()).await.err().unwrap();
    assert_eq!(e, SluiceError::TooManyConnections { max: 2 });
    // The SDK stays under the announced in-flight limit by itself.
    let mut hs = Vec::new();
    for i in 0..50 {
        let a = a.clone();
        hs.push(tokio::spawn(async move {
            a.put(&format!("/vol/i{i}"), "v").await
        }));
    }
    for h in hs {
        h.await.unwrap().unwrap();
    }
    drop(a);
    drop(_b);
    s.stop().await;
}

#[tokio::test]
async fn in_flight_limit_is_a_typed_error_for_raw_pipeliners() {
    let s = start(|c| c.limits.max_in_flight_per_conn = 4).await;
    let mut raw = handshake(s.addr).await;
    let mut q = sluice_wire::OutQueue::new();
    for i in 0..10 {
        sluice_wire::Request::Ping.encode(&mut q, 100 + i, 0);
    }
    raw.write_all(&q.to_bytes()).await.unwrap();
    let mut pongs = 0;
    let mut refused = 0;
    for _ in 0..10 {
        match read_response(&mut raw).await.unwrap().1 {
            sluice_wire::Response::Pong => pongs += 1,
            sluice_wire::Response::Error(SluiceError::TooManyInFlight { max: 4 }) => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(pongs + refused, 10);
    assert!(pongs >= 4);
    s.stop().await;
}

#[test]
fn blocking_client_works_outside_a_runtime() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = rt.block_on(start(|_| {}));
    let addr = s.addr.to_string();
    let r = std::thread::spawn(move || {
        let c = sluice_client::BlockingClient::connect(&addr).unwrap();
        let mut w = c.watch("/vol").unwrap();
        c.put("/vol/b", "blocking").unwrap();
        let n = w.next_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(&n.object.value[..], b"blocking");
        c.get("/vol/b").unwrap().value
    })
    .join()
    .unwrap();
    assert_eq!(&r[..], b"blocking");
    rt.block_on(s.stop());
}

#[tokio::test]
async fn server_restart_keeps_pools_and_client_reconnects() {
    let dir = temp_dir();
    let mk = |listen: SocketAddr| ServerConfig {
        listen,
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let server = Server::bind(mk("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = server.local_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let h = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    let c = Client::connect(&addr.to_string()).await.unwrap();
    c.create_pool(PoolSpec {
        pathname: "/kept".into(),
        pool_type: Some(PoolType::Volatile),
        ..Default::default()
    })
    .await
    .unwrap();
    tx.send(()).unwrap();
    h.await.unwrap();
    let err = c.ping().await.unwrap_err();
    assert!(matches!(err, SluiceError::Connection { .. }), "{err}");
    let server = Server::bind(mk(addr)).await.unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let h = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    // The same client reconnects on its next call; the pool survived.
    c.put("/kept/a", "v").await.unwrap();
    tx.send(()).unwrap();
    h.await.unwrap();
}

#[tokio::test]
async fn time_reads_of_the_future_wait_until_stable() {
    let s = start(|_| {}).await;
    let c = s.client().await;
    let first = c.put("/vol/clock", "before").await.unwrap();
    let t = first.timestamp_us + 300_000; // 300 ms ahead
                                          // Unstable: answers now, and the answer may change.
    assert_eq!(
        &c.get_by_time_with("/vol/clock", t, 0, true)
            .await
            .unwrap()
            .value[..],
        b"before"
    );
    // No wait allowed: a clear error.
    let e = c
        .get_by_time_with("/vol/clock", t, 0, false)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SluiceError::Unavailable { reason } if reason.contains("not stable yet")),
        "{e}"
    );
    // Stable: waits for t, so a write made in the meantime is included.
    let reader = {
        let c = c.clone();
        tokio::spawn(async move { c.get_by_time("/vol/clock", t).await })
    };
    let second = c.put("/vol/clock", "after").await.unwrap();
    assert!(second.timestamp_us < t);
    let o = reader.await.unwrap().unwrap();
    assert_eq!(
        &o.value[..],
        b"after",
        "the stable answer includes every write before t"
    );
    assert!(sluice_store::Clock::wall_us() >= t);
    // Too far ahead for the wait: refused at once.
    let e = c
        .get_by_time_with("/vol/clock", t + 3_600_000_000, 1000, false)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("in the future"), "{e}");
    s.stop().await;
}

/// Persistent pools on a node embedded in a current-thread runtime (where
/// tokio cannot hand a blocked worker's tasks over) still work.
#[tokio::test(flavor = "current_thread")]
async fn persistent_puts_work_on_a_current_thread_runtime() {
    let (s, c) = with_durable_pool("batch", |_| {}).await;
    let a = c.put("/durable/x", "one").await.unwrap();
    c.put("/durable/x", "two").await.unwrap();
    assert_eq!(
        &c.get_version("/durable/x", a.version).await.unwrap().value[..],
        b"one"
    );
    c.remove("/durable/x").await.unwrap();
    assert_eq!(
        c.history("/durable/x", false, 0, u64::MAX, 1)
            .await
            .unwrap()
            .len(),
        3,
        "paged one at a time"
    );
    // A range whose start is after its end (bounds swapped) was an empty
    // history, as if the key had none: an error that says so.
    for by_time in [false, true] {
        let e = c
            .history("/durable/x", by_time, 9, 3, 16)
            .await
            .unwrap_err();
        assert!(
            matches!(e, SluiceError::InvalidArgument { .. })
                && e.to_string().contains("starts at 9, after its end 3"),
            "{e}"
        );
    }
    s.stop().await;
}

/// Puts `n` values under `/vol/burst/` from `c`, 256 in flight at a
/// time; returns the versions acknowledged.
async fn burst(c: &Client, n: usize) -> Vec<u64> {
    let mut versions = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| {
                let (c, i) = (c.clone(), *i);
                tokio::spawn(async move {
                    // 1 KiB each: more than socket buffers hold in all.
                    c.put(&format!("/vol/burst/{}", i % 97), format!("{i:>1024}"))
                        .await
                })
            })
            .collect();
        for t in tasks {
            versions.push(t.await.unwrap().unwrap().version);
        }
    }
    versions
}

/// Issue #14: a watcher that stops reading loses notices, and every loss
/// is reported to it: on the server side (its queue for the connection
/// full, with the range of versions lost) even when nothing is written
/// after the burst, and on the client side (the SDK's buffer full). What
/// arrives plus what is reported lost is exactly what was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_notice_a_slow_watcher_loses_is_reported() {
    const N: usize = 30_000;
    let s = start(|_| {}).await;
    let writer = s.client().await;
    // Server side: a raw connection that does not read while the burst runs.
    let mut raw = handshake(s.addr).await;
    let mut q = sluice_wire::OutQueue::new();
    sluice_wire::Request::Watch {
        prefix: "/vol/burst".into(),
        from: None,
    }
    .encode(&mut q, 7, 0);
    raw.write_all(&q.to_bytes()).await.unwrap();
    // The SDK: a watch that is not read either.
    let c = s.client().await;
    let mut w = c.watch("/vol/burst").await.unwrap();
    let written = burst(&writer, N).await;
    assert_eq!(written.len(), N);
    // Drain the raw connection: notices and loss reports.
    let (mut seen, mut lost, mut reports) = (Vec::new(), 0u64, 0);
    while seen.len() as u64 + lost < N as u64 {
        let Some((id, r)) = read_response(&mut raw).await else {
            panic!("connection closed after {} seen, {lost} lost", seen.len())
        };
        match r {
            sluice_wire::Response::Notify { kind, object } if id == 7 => {
                if kind == NotificationKind::Lagged {
                    let j: serde_json::Value = serde_json::from_slice(&object.value).unwrap();
                    assert_eq!(j["dropped"].as_u64(), Some(object.meta.version));
                    assert!(
                        j["first_version"].as_u64() <= j["last_version"].as_u64(),
                        "{j}"
                    );
                    lost += object.meta.version;
                    reports += 1;
                } else {
                    seen.push(object.meta.version);
                }
            }
            _ => {}
        }
    }
    assert_eq!(seen.len() as u64 + lost, N as u64);
    assert!(
        reports > 0 && lost > 0,
        "the raw watcher fell behind: {} seen",
        seen.len()
    );
    // The SDK's watch: the same accounting through `next`.
    let (mut got, mut sdk_lost) = (0u64, 0u64);
    while got + sdk_lost < N as u64 {
        let n = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("a notice or a loss report")
            .unwrap();
        if n.kind == NotificationKind::Lagged {
            sdk_lost += n.object.meta.version;
        } else {
            got += 1;
        }
    }
    assert_eq!(got + sdk_lost, N as u64);
    assert!(sdk_lost > 0, "the SDK watcher fell behind");
    assert_eq!(w.dropped_locally(), 0, "every local drop was reported");
    s.stop().await;
}

/// A dropped client closes its connections (its reader task used to keep
/// each one open: a process making clients in a loop exhausted the node's
/// connection limit, found by the chaos run of issue #14).
#[tokio::test]
async fn a_dropped_client_closes_its_connections() {
    let s = start(|_| {}).await;
    let observer = s.client().await;
    let open = || async {
        observer.stats().await.unwrap()["connections"]["open"]
            .as_u64()
            .unwrap()
    };
    let base = open().await;
    let clients: Vec<Client> = connect_clients(&s, 5).await;
    for c in &clients {
        c.put("/vol/x", "1").await.unwrap();
    }
    assert_eq!(open().await, base + 5);
    drop(clients);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while open().await > base {
        assert!(
            std::time::Instant::now() < deadline,
            "{} connections still open after the clients were dropped",
            open().await - base
        );
        tokio::task::yield_now().await;
    }
    s.stop().await;
}

async fn connect_clients(s: &TestServer, n: usize) -> Vec<Client> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(s.client().await);
    }
    out
}

/// Issue #14: a watch on a persistent pool resumes from a version or a
/// time: the stored versions first, then live ones, with nothing lost or
/// repeated across the switch, even while writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_watch_replays_then_goes_live_with_nothing_missed_or_repeated() {
    const N: usize = 400;
    let s = start(|c| c.layout.persistent = vec![2]).await;
    let c = s.client().await;
    c.create_pool(PoolSpec {
        pathname: "/w".into(),
        pool_type: Some(PoolType::Persistent),
        ..Default::default()
    })
    .await
    .unwrap();
    let writer = s.client().await;
    let (half_tx, half_rx) = oneshot::channel();
    let writes = tokio::spawn(async move {
        let mut half = Some(half_tx);
        let mut acked = Vec::new();
        for i in 0..N {
            let key = format!("/w/k{}", i % 7);
            let r = writer.put(&key, format!("v{i}")).await.unwrap();
            acked.push((key, r.version));
            if i == N / 4 {
                let _ = half.take().unwrap().send(());
            }
        }
        acked
    });
    half_rx.await.unwrap();
    // Opened while the writer goes on: replay and live overlap.
    let mut w = c
        .watch_from("/w", sluice_client::WatchFrom::Time(0))
        .await
        .unwrap();
    let acked = writes.await.unwrap();
    let mut seen: std::collections::HashMap<String, Vec<u64>> = Default::default();
    let mut total = 0;
    while total < N {
        let n = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .unwrap_or_else(|_| panic!("only {total} of {N} notices"))
            .unwrap();
        assert_eq!(n.kind, NotificationKind::Put, "{n:?}");
        seen.entry(n.object.key.to_string())
            .or_default()
            .push(n.object.meta.version);
        total += 1;
    }
    let mut want: std::collections::HashMap<String, Vec<u64>> = Default::default();
    for (k, v) in acked {
        want.entry(k).or_default().push(v);
    }
    // Every acknowledged version exactly once, in order per key.
    assert_eq!(seen, want);
    // Nothing more is owed.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), w.next())
            .await
            .is_err(),
        "a notice was sent twice"
    );

    // From a version: only that one and later ones of its shard.
    let last = c.get("/w/k3").await.unwrap().meta.version;
    let mut w = c
        .watch_from("/w/k3", sluice_client::WatchFrom::Version(last))
        .await
        .unwrap();
    let n = next_within_5s(&mut w).await;
    assert_eq!((&*n.object.key, n.object.meta.version), ("/w/k3", last));
    c.put("/w/k3", "live").await.unwrap();
    let n = next_within_5s(&mut w).await;
    assert_eq!(&n.object.value[..], b"live");

    // Volatile pools keep no history to resume from: a clear refusal.
    let Err(e) = c
        .watch_from("/vol/x", sluice_client::WatchFrom::Version(1))
        .await
    else {
        panic!("a volatile pool cannot be resumed from a version")
    };
    assert!(
        matches!(&e, SluiceError::NotSupported { what } if what.contains("only persistent pools")),
        "{e}"
    );
    s.stop().await;
}

/// Versions that retention dropped before a resumed watch could replay
/// them are reported (count and range), not skipped silently.
#[tokio::test]
async fn a_resumed_watch_reports_versions_retention_dropped() {
    let s = start(|c| c.layout.persistent = vec![1]).await;
    let c = s.client().await;
    c.create_pool(PoolSpec {
        pathname: "/r".into(),
        pool_type: Some(PoolType::Persistent),
        retention: Some(sluice_types::pool::Retention {
            keep_versions: Some(1),
            keep_for_s: None,
            keep_bytes: None,
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut last = 0;
    for i in 0..5 {
        last = c.put("/r/k", format!("v{i}")).await.unwrap().version;
    }
    let mut w = c
        .watch_from("/r", sluice_client::WatchFrom::Version(1))
        .await
        .unwrap();
    let n = next_within_5s(&mut w).await;
    assert_eq!(n.kind, NotificationKind::Lagged, "{n:?}");
    let j: serde_json::Value = serde_json::from_slice(&n.object.value).unwrap();
    assert_eq!(j["dropped"], 4, "{j}");
    assert_eq!(j["where"], "retention", "{j}");
    assert_eq!(
        (j["first_version"].as_u64(), j["last_version"].as_u64()),
        (Some(1), Some(4))
    );
    let n = next_within_5s(&mut w).await;
    assert_eq!(
        (n.kind, n.object.meta.version),
        (NotificationKind::Put, last)
    );
    s.stop().await;
}

/// A fake OpenTelemetry collector: every OTLP/HTTP body it is posted,
/// answered 200.
async fn collector() -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some(i) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() >= i + 4 + len {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                            .await;
                        let _ = tx.send(serde_json::from_str(&text[i + 4..]).unwrap());
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// With `[otel] endpoint`, a traced request through a two-stage graph
/// reaches the collector as one trace: the client's request, then each
/// stage, each span a child of the one before.
#[tokio::test]
async fn traces_are_exported_as_opentelemetry_spans() {
    let (at, mut bodies) = collector().await;
    let s = start(|c| c.otel.endpoint = Some(format!("http://{at}/v1/traces"))).await;
    let c = s.client().await;
    c.dfg_apply(
        r#"[{"id": "two", "graph": [
            {"pathname": "/trig/in", "user_defined_logic_list": ["relay"], "destinations": [{"/trig/mid": "trigger_put"}]},
            {"pathname": "/trig/mid", "user_defined_logic_list": ["relay"], "destinations": [{"/vol/out": "put"}]}]}]"#,
    )
    .await
    .unwrap();
    c.trigger_put_traced("/trig/in/a", Bytes::from_static(b"x"), 77)
        .await
        .unwrap();
    let mut spans = Vec::new();
    while spans.len() < 3 {
        let body = tokio::time::timeout(Duration::from_secs(10), bodies.recv())
            .await
            .expect("spans reach the collector")
            .unwrap();
        for s in body["resourceSpans"][0]["scopeSpans"][0]["spans"]
            .as_array()
            .unwrap()
        {
            spans.push(s.clone());
        }
    }
    let by_name = |n: &str| {
        spans
            .iter()
            .find(|s| s["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("no span {n}: {spans:?}"))
    };
    let root = by_name("put /trig/in/a");
    let first = by_name("/trig/in");
    let second = by_name("/trig/mid");
    assert!(spans.iter().all(|s| s["traceId"] == format!("{:032x}", 77)));
    assert!(root.get("parentSpanId").is_none());
    assert_eq!(first["parentSpanId"], root["spanId"]);
    assert_eq!(second["parentSpanId"], first["spanId"]);
    s.stop().await;
}

/// Requests started together on one thread go out in one write when the
/// connection coalesces them (one write each when it does not), and every
/// one is answered.
#[tokio::test]
async fn requests_started_together_go_out_in_one_write_when_coalesced() {
    let s = start(|_| {}).await;
    let t = Duration::from_secs(10);
    for coalesce in [false, true] {
        let c = sluice_client::Conn::connect(s.addr, "coalesce", t)
            .await
            .unwrap();
        c.set_coalesce_writes(coalesce);
        let before = c.writes();
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..16u8 {
            let c = c.clone();
            let req = put_req(&format!("/vol/coalesce/{coalesce}/{i}"), vec![i; 1000]);
            calls.spawn(async move { c.call(&req, t).await });
        }
        while let Some(r) = calls.join_next().await {
            let r = r.unwrap();
            assert!(matches!(r, Ok(sluice_wire::Response::PutOk(_))), "{r:?}");
        }
        let writes = c.writes() - before;
        assert_eq!(writes, if coalesce { 1 } else { 16 }, "coalesce {coalesce}");
    }
    let c = s.client().await;
    for i in 0..16u8 {
        let o = c.get(&format!("/vol/coalesce/true/{i}")).await.unwrap();
        assert_eq!(o.value, vec![i; 1000]);
    }
    s.stop().await;
}

/// Coalesced requests queue up to `MAX_QUEUED_BYTES`; past that a sender
/// writes itself instead of queueing more, so the queue stays bounded even
/// before the flush task has run, and every request is still answered.
#[tokio::test]
async fn coalesced_requests_queue_only_up_to_a_bound() {
    use std::future::Future;
    let s = start(|_| {}).await;
    let t = Duration::from_secs(10);
    let c = sluice_client::Conn::connect(s.addr, "bound", t)
        .await
        .unwrap();
    c.set_coalesce_writes(true);
    let size = sluice_client::MAX_QUEUED_BYTES / 2;
    let reqs: Vec<_> = (0..6u8)
        .map(|i| put_req(&format!("/vol/bound/{i}"), vec![i; size]))
        .collect();
    let before = c.writes();
    let mut calls: Vec<_> = reqs.iter().map(|r| Box::pin(c.call(r, t))).collect();
    // One poll each, with nothing else run in between (the flush task
    // cannot have run yet): past the bound the callers wrote themselves.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for call in &mut calls {
        assert!(call.as_mut().poll(&mut cx).is_pending());
    }
    assert!(c.writes() > before, "3 MB queued and nothing written");
    for call in calls {
        let r = call.await;
        assert!(matches!(r, Ok(sluice_wire::Response::PutOk(_))), "{r:?}");
    }
    s.stop().await;
}

/// A small request on the connection a large put is being written to:
/// with the value sent in parts it goes out between two parts and is
/// answered first; sent whole, it waits for the whole value (the order
/// this test checks both ways, on one `Conn`, whose `call` takes the
/// connection's writer in its first poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_request_is_not_stuck_behind_a_large_value_sent_in_parts() {
    let s = start(|_| {}).await;
    s.client()
        .await
        .put("/vol/small", Bytes::from_static(b"s"))
        .await
        .unwrap();
    let t = Duration::from_secs(10);
    for parts in [0, 64 << 10] {
        let c = sluice_client::Conn::connect(s.addr, "parts", t)
            .await
            .unwrap();
        c.set_value_part_bytes(parts);
        let put = put_req("/vol/big", vec![7u8; 32 << 20]);
        let get = sluice_wire::Request::get_latest("/vol/small");
        // Polled in this order every time (a biased select): the put
        // takes the writer first and fills the socket; the get queues for
        // the writer; when both replies are in, the put is seen first.
        let mut put_call = std::pin::pin!(c.call(&put, t));
        let mut get_call = std::pin::pin!(c.call(&get, t));
        let (mut p, mut g) = (None, None);
        let mut order = Vec::new();
        while p.is_none() || g.is_none() {
            tokio::select! {
                biased;
                r = &mut put_call, if p.is_none() => { order.push("put"); p = Some(r); }
                r = &mut get_call, if g.is_none() => { order.push("get"); g = Some(r); }
            }
        }
        let (p, g) = (p.unwrap(), g.unwrap());
        assert!(matches!(p, Ok(sluice_wire::Response::PutOk(_))), "{p:?}");
        assert!(matches!(g, Ok(sluice_wire::Response::Object(_))), "{g:?}");
        let expected = if parts > 0 {
            ["get", "put"]
        } else {
            ["put", "get"]
        };
        assert_eq!(order, expected, "parts of {parts} bytes");
    }
    // The value sent in parts arrived whole.
    let back = s.client().await.get("/vol/big").await.unwrap();
    assert_eq!(back.value.len(), 32 << 20);
    assert!(back.value.iter().all(|b| *b == 7));
    s.stop().await;
}

/// Values in parts are bounded like whole ones: parts past
/// `max_value_bytes` get the request a `ValueTooLarge`, and the
/// connection lives on.
#[tokio::test]
async fn values_in_parts_are_bounded() {
    let s = start(|c| c.limits.max_value_bytes = 1000).await;
    let mut r = handshake(s.addr).await;
    let mut q = sluice_wire::OutQueue::new();
    for _ in 0..2 {
        sluice_wire::encode_part(
            &mut q,
            sluice_wire::op::PUT,
            5,
            &Bytes::from(vec![1u8; 600]),
        );
    }
    let put = |v: &'static [u8]| put_req("/vol/p", v);
    put(b"end").encode(&mut q, 5, 0);
    // Parts that fit, then the request: one value.
    sluice_wire::encode_part(&mut q, sluice_wire::op::PUT, 6, &Bytes::from_static(b"ab"));
    put(b"cd").encode(&mut q, 6, 0);
    r.write_all(&q.to_bytes()).await.unwrap();
    let (id, resp) = read_response(&mut r).await.unwrap();
    assert_eq!(id, 5);
    assert!(
        matches!(
            resp,
            sluice_wire::Response::Error(SluiceError::ValueTooLarge {
                size: 1200,
                max: 1000
            })
        ),
        "{resp:?}"
    );
    let (id, resp) = read_response(&mut r).await.unwrap();
    assert_eq!(id, 6);
    assert!(matches!(resp, sluice_wire::Response::PutOk(_)), "{resp:?}");
    assert_eq!(
        &s.client().await.get("/vol/p").await.unwrap().value[..],
        b"abcd"
    );
    // All of a connection's values in parts together: at most twice
    // `max_value_bytes`; the value that would pass it is refused.
    let mut q = sluice_wire::OutQueue::new();
    for (rid, n) in [(7, 900), (8, 900), (9, 300)] {
        sluice_wire::encode_part(
            &mut q,
            sluice_wire::op::PUT,
            rid,
            &Bytes::from(vec![2u8; n]),
        );
    }
    for rid in [9, 7, 8] {
        put(b"z").encode(&mut q, rid, 0);
    }
    r.write_all(&q.to_bytes()).await.unwrap();
    let (id, resp) = read_response(&mut r).await.unwrap();
    assert_eq!(id, 9);
    assert!(
        matches!(
            resp,
            sluice_wire::Response::Error(SluiceError::Unavailable { .. })
        ),
        "{resp:?}"
    );
    for rid in [7, 8] {
        let (id, resp) = read_response(&mut r).await.unwrap();
        assert_eq!(id, rid);
        assert!(matches!(resp, sluice_wire::Response::PutOk(_)), "{resp:?}");
    }
    s.stop().await;
}

/// Issue #20: frames of 256 KB and more are read into recycled buffers of
/// their own. Frames written back to back in one write (large, small,
/// large, and a get right behind) are each decoded whole, none reads into
/// the next, and the values come back byte for byte; a large frame that
/// stalls halfway is still bounded by `frame_ms`.
#[tokio::test]
async fn large_frames_in_their_own_buffers_keep_their_neighbours_intact() {
    let s = start(|c| c.timeouts.frame_ms = 300).await;
    let mut sock = handshake(s.addr).await;
    let big_a: Vec<u8> = (0..(1 << 20) + 13).map(|i| (i % 251) as u8).collect();
    let big_b: Vec<u8> = (0..300_000).map(|i| (i % 241) as u8).collect();
    let mut q = sluice_wire::OutQueue::new();
    put_req("/vol/big/a", big_a.clone()).encode(&mut q, 2, 0);
    put_req("/vol/small", b"between".to_vec()).encode(&mut q, 3, 0);
    put_req("/vol/big/b", big_b.clone()).encode(&mut q, 4, 0);
    sluice_wire::Request::get_latest("/vol/small").encode(&mut q, 5, 0);
    sock.write_all(&q.to_bytes()).await.unwrap();
    for id in 2..=5u64 {
        let (rid, r) = read_response(&mut sock).await.unwrap();
        assert_eq!(rid, id);
        match r {
            sluice_wire::Response::PutOk(_) => assert!(id < 5),
            sluice_wire::Response::Object(o) => assert_eq!(&o.value[..], b"between"),
            other => panic!("request {id}: {other:?}"),
        }
    }
    let c = s.client().await;
    assert_eq!(&c.get("/vol/big/a").await.unwrap().value[..], &big_a[..]);
    assert_eq!(&c.get("/vol/big/b").await.unwrap().value[..], &big_b[..]);
    // Overwritten many times: recycled buffers never show old bytes.
    for round in 0..8u8 {
        let v = vec![round; 400_000];
        c.put("/vol/big/a", v.clone()).await.unwrap();
        assert_eq!(&c.get("/vol/big/a").await.unwrap().value[..], &v[..]);
    }

    // Half a large frame, then nothing: closed after frame_ms.
    let mut stall = handshake(s.addr).await;
    let mut q = sluice_wire::OutQueue::new();
    put_req("/vol/big/c", vec![1u8; 1 << 20]).encode(&mut q, 9, 0);
    let bytes = q.to_bytes();
    stall.write_all(&bytes[..bytes.len() / 2]).await.unwrap();
    let (_, r) = read_response(&mut stall).await.unwrap();
    assert!(
        matches!(r, sluice_wire::Response::Error(SluiceError::Timeout { .. })),
        "{r:?}"
    );
    assert!(
        read_response(&mut stall).await.is_none(),
        "connection closed"
    );
    assert!(c.get("/vol/big/c").await.is_err(), "nothing stored");
    s.stop().await;
}

/// The lambdas a large trigger put will fire hear of it as soon as its
/// key is in, before its value is (a Python worker wakes meanwhile); the
/// put then runs as usual.
#[tokio::test]
async fn a_large_trigger_put_is_announced_before_its_value_is_in() {
    let s = start(|_| {}).await;
    let c = s.client().await;
    for (p, t) in [("/tin", PoolType::Trigger), ("/tout", PoolType::Volatile)] {
        c.create_pool(PoolSpec {
            pathname: p.into(),
            pool_type: Some(t),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    c.dfg_apply(
        r#"[{"id": "early", "graph": [{"pathname": "/tin", "user_defined_logic_list": ["relay"], "destinations": [{"/tout": "put"}]}]}]"#,
    )
    .await
    .unwrap();
    let expected = || async {
        c.dfg_list().await.unwrap()[0]["status"][0]["expected"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(expected().await, 0);
    let frame = trigger_put_frame("/tin/frame", vec![5u8; 1 << 20], 2);
    // Before its handshake a connection announces nothing (it is refused).
    let mut stranger = raw(s.addr).await;
    let _ = stranger.write_all(&frame).await;
    let (_, r) = read_response(&mut stranger).await.unwrap();
    assert!(matches!(r, sluice_wire::Response::Error(_)), "{r:?}");
    assert_eq!(expected().await, 0);
    let mut r = handshake(s.addr).await;
    r.write_all(&frame[..64 * 1024]).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while expected().await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no announcement while the value was in transit"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(c.get("/tout/frame").await.is_err(), "nothing ran yet");
    r.write_all(&frame[64 * 1024..]).await.unwrap();
    let (rid, resp) = read_response(&mut r).await.unwrap();
    assert_eq!(rid, 2);
    assert!(matches!(resp, sluice_wire::Response::PutOk(_)), "{resp:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let out = loop {
        if let Ok(o) = c.get("/tout/frame").await {
            break o;
        }
        assert!(tokio::time::Instant::now() < deadline, "the relay ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(out.value.len(), 1 << 20);
    assert_eq!(expected().await, 1);
    s.stop().await;
}

/// Lends memory of its own for large trigger puts (`Udl::landing`) and
/// counts what is out, and the calls whose value lay in lent memory.
#[derive(Default)]
struct Lender {
    /// (address, len) of each range lent and not given back.
    lent: std::sync::Arc<parking_lot::Mutex<Vec<(usize, usize)>>>,
    calls: std::sync::atomic::AtomicUsize,
    landed_calls: std::sync::atomic::AtomicUsize,
}

impl sluice_compute::Udl for Lender {
    fn handle(
        &self,
        call: &sluice_compute::Upcall<'_>,
        _: &mut sluice_compute::Emitter<'_>,
        _: &sluice_compute::Context,
    ) -> Result<(), sluice_compute::UdlError> {
        let at = call.object.value.as_ptr() as usize;
        let inside = self
            .lent
            .lock()
            .iter()
            .any(|&(a, n)| at >= a && at + call.object.value.len() <= a + n);
        if inside {
            self.landed_calls
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    fn landing(&self, frame_len: usize, _: usize) -> Option<sluice_compute::landing::Landing> {
        let mut mem = std::mem::ManuallyDrop::new(vec![0u8; frame_len]);
        let ptr = std::ptr::NonNull::new(mem.as_mut_ptr()).unwrap();
        let (addr, cap) = (ptr.as_ptr() as usize, mem.capacity());
        self.lent.lock().push((addr, frame_len));
        let lent = self.lent.clone();
        // SAFETY: the vector's memory is this landing's alone until the
        // release frees it (rebuilt from its parts).
        Some(unsafe {
            sluice_compute::landing::Landing::new(ptr, frame_len, move || {
                lent.lock().retain(|&(a, _)| a != addr);
                drop(Vec::from_raw_parts(addr as *mut u8, frame_len, cap));
            })
        })
    }
}

/// Waits (at most 10 s) until `cond` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "waited 10 s for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A large trigger put is read into the memory its lambda lends, and the
/// lambda is handed the value there; the memory comes back when the call
/// is done, and when a sender dies mid-frame. Small values are read as
/// before. (Whether a sender may land its bytes at all is the access
/// rules' `View::may`, tested with the policies.)
#[tokio::test]
async fn a_large_trigger_put_lands_in_memory_its_lambda_lends_and_gives_it_back() {
    use std::sync::atomic::Ordering::SeqCst;
    let lender = std::sync::Arc::new(Lender::default());
    let mut reg = sluice_udls::registry();
    let l = lender.clone();
    reg.register(
        "lender",
        move |_: &serde_json::Value, _: &sluice_compute::Context| {
            Ok(l.clone() as std::sync::Arc<dyn sluice_compute::Udl>)
        },
    );
    let s = start_with(|_| {}, reg).await;
    let c = s.client().await;
    c.dfg_apply(r#"[{"id": "land", "graph": [{"pathname": "/trig/in", "user_defined_logic_list": ["lender"]}]}]"#)
        .await
        .unwrap();
    c.trigger_put("/trig/in/big", Bytes::from(vec![5u8; 512 << 10]))
        .await
        .unwrap();
    until("the call", || lender.calls.load(SeqCst) == 1).await;
    assert_eq!(
        lender.landed_calls.load(SeqCst),
        1,
        "the value was read into lent memory"
    );
    until("the memory back", || lender.lent.lock().is_empty()).await;
    // Below the large-frame size: the node's own buffers.
    c.trigger_put("/trig/in/small", Bytes::from(vec![5u8; 100 << 10]))
        .await
        .unwrap();
    until("the second call", || lender.calls.load(SeqCst) == 2).await;
    assert_eq!(lender.landed_calls.load(SeqCst), 1);
    // A sender that dies mid-frame: the memory comes back, the node serves on.
    let mut raw = handshake(s.addr).await;
    let frame = trigger_put_frame("/trig/in/cut", vec![7u8; 1 << 20], 5);
    raw.write_all(&frame[..frame.len() / 2]).await.unwrap();
    until("memory lent to the half-sent frame", || {
        lender.lent.lock().len() == 1
    })
    .await;
    drop(raw);
    until("the memory back after the sender died", || {
        lender.lent.lock().is_empty()
    })
    .await;
    assert_eq!(
        lender.calls.load(SeqCst),
        2,
        "no call for a frame never finished"
    );
    c.trigger_put("/trig/in/after", Bytes::from(vec![5u8; 512 << 10]))
        .await
        .unwrap();
    until("the call after", || lender.calls.load(SeqCst) == 3).await;
    assert_eq!(lender.landed_calls.load(SeqCst), 2);
    s.stop().await;
}

/// The connections open on the node `c` talks to, by its statistics.
async fn open_connections(c: &Client) -> u64 {
    let st = c.stats().await.unwrap();
    st["connections"]["open"].as_u64().unwrap()
}

/// A node bounds the watches of one connection; a client with more
/// watches than that opens connections for watches (it failed with
/// `TooManyWatches` before), and closes them once their watches end.
#[tokio::test]
async fn watches_beyond_a_connections_limit_go_on_connections_of_their_own() {
    let s = start(|c| c.limits.max_watches_per_conn = 3).await;
    let c = s.client().await;
    let open = || open_connections(&c);
    let before = open().await;
    let mut ws = Vec::new();
    for i in 0..10 {
        ws.push(c.watch(&format!("/vol/many/{i}")).await.unwrap());
    }
    assert!(open().await > before, "the watches needed more connections");
    for i in 0..10 {
        c.put(&format!("/vol/many/{i}/k"), format!("v{i}"))
            .await
            .unwrap();
    }
    for (i, w) in ws.iter_mut().enumerate() {
        let n = next_within_5s(w).await;
        assert_eq!(&*n.object.key, format!("/vol/many/{i}/k"));
    }
    for w in ws {
        w.cancel().await.unwrap();
    }
    // Their connections close with their last watch (the node sees the
    // end of each; bounded wait, no sleep-and-hope).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while open().await > before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "connections for watches still open: {} > {before}",
            open().await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And there is room again.
    let mut again = Vec::new();
    for i in 0..4 {
        again.push(c.watch(&format!("/vol/again/{i}")).await.unwrap());
    }
    s.stop().await;
}

/// A zero timeout ended every request at once ("timed out after 0 ms");
/// now the client refuses it when made.
#[tokio::test]
async fn a_zero_timeout_is_refused_when_the_client_is_made() {
    let s = start(|_| {}).await;
    for cfg in [
        ClientConfig {
            addr: s.addr.to_string(),
            request_timeout: Duration::ZERO,
            ..Default::default()
        },
        ClientConfig {
            addr: s.addr.to_string(),
            connect_timeout: Duration::ZERO,
            ..Default::default()
        },
    ] {
        match Client::connect_with(cfg).await {
            Err(SluiceError::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("of 0 ends every attempt"), "{reason}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a zero timeout was taken"),
        }
    }
    s.stop().await;
}

/// A node that takes no watches at all (`max_watches_per_conn = 0`):
/// the connection opened for the watch is refused too, the error is
/// `TooManyWatches`, and that connection does not stay open.
#[tokio::test]
async fn a_node_that_takes_no_watches_refuses_them_and_keeps_no_connection() {
    let s = start(|c| c.limits.max_watches_per_conn = 0).await;
    let c = s.client().await;
    let open = || open_connections(&c);
    let before = open().await;
    match c.watch("/vol/none").await {
        Err(SluiceError::TooManyWatches { max: 0 }) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a watch was taken"),
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while open().await > before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch's connection stayed open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.stop().await;
}

/// A client of `s` sending values over `parts` bytes in parts.
async fn parted_client(s: &TestServer, parts: Option<usize>) -> Client {
    Client::connect_with(ClientConfig {
        addr: s.addr.to_string(),
        value_part_bytes: parts,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// `key`'s value once it is there (a request cut while being written is
/// finished by a task of the connection), or `None` after 10 s.
async fn stored_within_10s(c: &Client, key: &str) -> Option<Bytes> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match c.get(key).await {
            Err(SluiceError::NotFound { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(SluiceError::NotFound { .. }) => return None,
            r => return Some(r.unwrap().value),
        }
    }
}

/// A request whose future is dropped part-way through writing its frame
/// (a `tokio::time::timeout` around a large put) is still sent whole: the
/// node never reads the next request's bytes as the rest of it. (Before:
/// the next puts on the connection hung until the node gave up on a "bad
/// frame magic", and the cancelled put was stored with 10 MB of another
/// put's bytes in its 16 MB value.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_dropped_while_it_is_written_is_sent_whole() {
    let s = start(|_| {}).await;
    for parts in [None, Some(64 << 10)] {
        let c = parted_client(&s, parts).await;
        let key = format!("/vol/dropped-{}", parts.unwrap_or(0));
        let big = Bytes::from(vec![b'x'; 16 << 20]);
        let cut = tokio::time::timeout(Duration::from_micros(200), c.put(&key, big.clone())).await;
        assert!(cut.is_err(), "the put was not cut short ({parts:?})");
        for i in 0..4 {
            let other = Bytes::from(vec![b'y'; 4 << 20]);
            let r = tokio::time::timeout(Duration::from_secs(5), c.put("/vol/other", other)).await;
            assert!(
                matches!(r, Ok(Ok(_))),
                "put {i} after the dropped one ({parts:?}): {r:?}"
            );
        }
        // The dropped put went out whole (its last parts perhaps after the
        // others), and was stored as it was.
        let got = stored_within_10s(&c, &key)
            .await
            .expect("the dropped put was stored");
        assert_eq!(got.len(), big.len(), "{parts:?}");
        assert!(
            got == big,
            "the dropped put's value was changed ({parts:?})"
        );
        assert_eq!(c.get("/vol/other").await.unwrap().value.len(), 4 << 20);
    }
}

/// A `watch` call dropped after its request went out (here: polled once,
/// then dropped) leaves no watch on the node. (Before:
/// each one stayed there for the connection's life, the node pushing
/// every notification under its prefix to a client that dropped them.)
#[tokio::test]
async fn a_watch_call_dropped_before_its_reply_leaves_no_watch_on_the_node() {
    let s = start(|_| {}).await;
    let c = s.client().await;
    for _ in 0..20 {
        // Polled once: the request goes out, the reply is not there yet.
        let mut call = std::pin::pin!(c.watch("/vol/dropped-watch/"));
        let first = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(call.as_mut(), cx).is_pending())
        })
        .await;
        assert!(first, "the watch call was not cut short");
    }
    c.put("/vol/dropped-watch/a", Bytes::from_static(b"v"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let watches = c.stats().await.unwrap()["watches"].as_u64().unwrap();
        if watches == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{watches} watches are left on the node"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Many puts of large values on one connection at once, each under a
/// timeout of its own (0 to 2 ms: some sent whole, some cut while being
/// written, some before): every value the node holds is one of the values
/// put to its key, byte for byte, and the client goes on working. Each
/// value's bytes name its key and try, so a value completed with another
/// request's bytes is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_cut_at_random_leave_only_whole_values() {
    let s = start(|_| {}).await;
    for parts in [None, Some(96 << 10)] {
        let c = parted_client(&s, parts).await;
        let value = |key: u8, try_: u8| {
            let len = (256 << 10) + usize::from(try_) * 37_000;
            Bytes::from(
                (0..len)
                    .map(|i| if i % 2 == 0 { key } else { try_ })
                    .collect::<Vec<u8>>(),
            )
        };
        let mut tasks = Vec::new();
        for key in 0..8u8 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let mut seed = 0x9e37_79b9_u64.wrapping_mul(u64::from(key) + 1);
                for try_ in 0..16u8 {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let limit = Duration::from_micros((seed >> 33) % 2000);
                    let k = format!("/vol/cut/{key}");
                    let _ = tokio::time::timeout(limit, c.put(&k, value(key, try_))).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // Every cut request has gone out by the time these puts, queued
        // behind them, are answered.
        for key in 0..8u8 {
            c.put(&format!("/vol/cut/{key}/done"), &b"1"[..])
                .await
                .unwrap();
        }
        for key in 0..8u8 {
            let Some(got) = stored_within_10s(&c, &format!("/vol/cut/{key}")).await else {
                continue;
            };
            let try_ = got.get(1).copied().unwrap_or(0);
            assert!(
                got == value(key, try_),
                "key {key} ({parts:?}) holds {} bytes that are no value put to it",
                got.len()
            );
        }
    }
}
