use super::*;

#[test]
fn the_cluster_key_is_made_once_next_to_the_layout_and_a_short_one_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let settings = ClusterSettings {
        layout: Some(d.path().join("layout.toml")),
        ..Default::default()
    };
    let k1 = cluster_key(&settings).unwrap();
    assert_eq!(k1.len(), 64, "32 random bytes, hex");
    // Every node reading the same file gets the same key.
    assert_eq!(cluster_key(&settings).unwrap(), k1);
    let short = d.path().join("short.key");
    std::fs::write(&short, "abc\n").unwrap();
    let e = cluster_key(&ClusterSettings {
        key_file: Some(short),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("too short"), "{e}");
    let e = cluster_key(&ClusterSettings::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("key_file"), "{e}");
}
/// The metadata group's log is fsync'd like a persistent shard's (it was
/// not: a power loss could forget a vote or an acknowledged pool, graph,
/// policy or membership change); volatile shards' are not.
#[test]
fn the_metadata_log_is_synced_with_persistent_shards() {
    let shard = |pool_type| {
        crate::types::group_of(ShardId {
            pool_type,
            subgroup: 0,
            shard: 3,
        })
        .unwrap()
    };
    assert!(groups::synced(META_GROUP, true));
    assert!(groups::synced(shard(PoolType::Persistent), true));
    assert!(!groups::synced(shard(PoolType::Volatile), true));
    // `[persistent] sync = "never"`: nothing is.
    assert!(!groups::synced(META_GROUP, false));
    assert!(!groups::synced(shard(PoolType::Persistent), false));
}

use crate::types::{BATCH_BYTES, BATCH_WRITES as BATCH_PUTS};
use sluice_store::StoreConfig;
use std::time::Instant;

fn put(key: &str, len: usize) -> Command {
    Command::Write {
        key: key.into(),
        value: Some(bytes::Bytes::from(vec![7u8; len])),
        expected: None,
        timestamp_us: 0,
        req_id: None,
        trace: None,
    }
}

fn queued(cmds: Vec<Command>) -> Batcher {
    let mut b = Batcher::default();
    for c in cmds {
        let (tx, _rx) = tokio::sync::oneshot::channel();
        b.queue.push_back((c, tx));
    }
    b.proposers = 1;
    b
}

/// A batch stops at `BATCH_PUTS` puts or `BATCH_BYTES` of values, but
/// always takes one put (a value larger than a batch still goes); a
/// proposer that finds the queue empty gives up its slot.
#[test]
fn batches_are_bounded_by_count_and_bytes_and_always_take_one() {
    let mut b = queued(
        (0..BATCH_PUTS + 10)
            .map(|i| put(&format!("k{i}"), 8))
            .collect(),
    );
    assert_eq!(b.take().len(), BATCH_PUTS);
    assert_eq!(b.take().len(), 10);
    assert_eq!(b.proposers, 1, "a proposer with work keeps its slot");
    assert!(b.take().is_empty());
    assert_eq!(b.proposers, 0, "an empty queue ends the proposer");

    let mut b = queued(vec![
        put("big", BATCH_BYTES * 2),
        put("a", BATCH_BYTES / 2),
        put("b", BATCH_BYTES / 2),
        put("c", 1),
    ]);
    let first = b.take();
    assert_eq!(first.len(), 1, "an oversized value goes alone");
    assert!(matches!(&first[0].0, Command::Write { key, .. } if key == "big"));
    let second = b.take();
    assert_eq!(
        second.len(),
        1,
        "a + b with their keys exceed BATCH_BYTES: b waits"
    );
    assert_eq!(b.take().len(), 2);
}

fn single_node(dir: &std::path::Path) -> (ClusterLayout, ClusterSettings, Arc<Store>) {
    let layout = ClusterLayout::from_toml(
        r#"
[[nodes]]
id = 1
address = "127.0.0.1:1"

[[subgroups.volatile]]
shards = [[1]]

[[subgroups.trigger]]
shards = [[1]]
"#,
    )
    .unwrap();
    let key = dir.join("cluster.key");
    std::fs::write(&key, "k".repeat(64)).unwrap();
    let settings = ClusterSettings {
        volatile_dir: Some(dir.join("shm")),
        key_file: Some(key),
        ..Default::default()
    };
    let store = Store::open(StoreConfig {
        layout: sluice_store::Layout {
            volatile: vec![1],
            trigger: vec![1],
            persistent: vec![],
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    (layout, settings, Arc::new(store))
}

async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const SHARD: ShardId = ShardId {
    pool_type: PoolType::Volatile,
    subgroup: 0,
    shard: 0,
};

/// A node alone in its groups: it initialises them, leads them, takes
/// concurrent writes (batched) with dense versions, serves reads and read
/// barriers, refuses a read ahead of what it applied, answers admin
/// commands, refuses internal ones from a client and malformed ones with
/// a typed error, and comes back after a restart with what it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_member_cluster_writes_reads_and_restarts() {
    let d = tempfile::tempdir().unwrap();
    let (layout, settings, store) = single_node(d.path());
    let node = ClusterNode::start(
        1,
        layout.clone(),
        settings.clone(),
        d.path().to_path_buf(),
        store.clone(),
    )
    .await
    .unwrap();
    until("node 1 leads volatile/0/0", || {
        node.info()["shards"]["volatile/0/0"]["leader"] == 1
    })
    .await;
    assert!(node.replicates(SHARD));
    // Every client write is spawned as a task of its own (`Conn::defer`),
    // so its future's size is moved and stored per write: proposing
    // (a large future) is boxed, since only the
    // writer that takes a free proposer slot runs it (it was 3.7 KB in a
    // release build, 4.0 KB in a debug one).
    let w = node.write(SHARD, "/vol/size".into(), None, None, None, None);
    let size = std::mem::size_of_val(&w);
    assert!(size <= 1024, "a write's future is {size} bytes");
    drop(w);

    let writes = (0..20).map(|i| {
        let node = node.clone();
        async move {
            node.write(
                SHARD,
                format!("/vol/{i}"),
                Some(bytes::Bytes::from(format!("v{i}"))),
                None,
                None,
                None,
            )
            .await
        }
    });
    let mut versions: Vec<u64> = futures_versions(writes).await;
    versions.sort_unstable();
    let first = versions[0];
    assert_eq!(
        versions,
        (first..first + 20).collect::<Vec<_>>(),
        "every write applied once, versions dense"
    );
    node.read_barrier(SHARD).await.unwrap();
    node.check_read(SHARD, Some(first + 19)).unwrap();
    let e = node.check_read(SHARD, Some(first + 1000)).unwrap_err();
    assert!(matches!(e, SluiceError::ReplicaBehind { .. }), "{e:?}");
    assert_eq!(
        &store.get("/vol/3", None, Some(0)).unwrap().value[..],
        b"v3"
    );

    let status = node.admin(r#"{"op":"status"}"#, false).await.unwrap();
    assert_eq!(status["node"], 1, "{status}");
    let e = node.admin(r#"{"op":"bogus"}"#, false).await.unwrap_err();
    assert!(matches!(e, SluiceError::InvalidArgument { .. }), "{e:?}");
    let e = node
        .admin(r#"{"op":"set_members","group":1,"members":[1]}"#, false)
        .await
        .unwrap_err();
    assert!(matches!(e, SluiceError::Forbidden { .. }), "{e:?}");
    let e = node.admin(r#"{"op":"heal"}"#, false).await.unwrap_err();
    assert!(matches!(e, SluiceError::NotSupported { .. }), "{e:?}");

    node.shutdown().await;
    // The groups' watcher tasks hold the node a moment after their cores
    // stop; its directory locks go with the last reference.
    let gone = Arc::downgrade(&node);
    drop(node);
    until("the stopped node is dropped", || gone.upgrade().is_none()).await;
    // Restart on the same directories: the log brings the objects back.
    let (_, _, store2) = single_node(d.path());
    let node = ClusterNode::start(1, layout, settings, d.path().to_path_buf(), store2.clone())
        .await
        .unwrap();
    until("the restarted node applies its log", || {
        store2.get("/vol/19", None, Some(0)).is_ok()
    })
    .await;
    assert_eq!(
        &store2.get("/vol/19", None, Some(0)).unwrap().value[..],
        b"v19"
    );
    node.shutdown().await;
}

async fn futures_versions<F>(writes: impl Iterator<Item = F>) -> Vec<u64>
where
    F: std::future::Future<Output = Result<PutResult, SluiceError>> + Send + 'static,
{
    let tasks: Vec<_> = writes.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap().unwrap().version);
    }
    out
}

/// Broadcasts being received are bounded: a new broadcast of a key replaces
/// an unfinished one (its sender gave up), and past `MAX_ASSEMBLIES` at
/// once a new one is refused with `Unavailable`, not buffered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_broadcasts_are_bounded() {
    use super::broadcast::{chunk_body, MAX_ASSEMBLIES};
    let d = tempfile::tempdir().unwrap();
    let (layout, settings, store) = single_node(d.path());
    let node = ClusterNode::start(1, layout, settings, d.path().to_path_buf(), store)
        .await
        .unwrap();
    let whole = b"abcdefgh";
    let crc = crc32c::crc32c(whole);
    // The first half of broadcast 1, then a new broadcast 2 of the same key.
    node.on_chunk(&chunk_body(1, "/vol/m", 0, 8, crc, &whole[..4]))
        .await
        .unwrap();
    node.on_chunk(&chunk_body(2, "/vol/m", 0, 8, crc, &whole[..4]))
        .await
        .unwrap();
    // Broadcast 1 is gone: its next chunk has no start here.
    let e = node
        .on_chunk(&chunk_body(1, "/vol/m", 4, 8, crc, &whole[4..]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("without its start"), "{e}");
    let done = node
        .on_chunk(&chunk_body(2, "/vol/m", 4, 8, crc, &whole[4..]))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&done).contains("\"error\":null"),
        "{done:?}"
    );
    assert_eq!(node.broadcast_status()["received"][0]["bytes"], 8);
    // As many unfinished broadcasts of other keys as allowed, then one more.
    for i in 0..MAX_ASSEMBLIES {
        node.on_chunk(&chunk_body(
            10 + i as u64,
            &format!("/vol/k{i}"),
            0,
            8,
            crc,
            &whole[..4],
        ))
        .await
        .unwrap();
    }
    let e = node
        .on_chunk(&chunk_body(99, "/vol/over", 0, 8, crc, &whole[..4]))
        .await
        .unwrap_err();
    assert!(matches!(e, SluiceError::Unavailable { .. }), "{e:?}");
    // A wrong checksum: reported, not kept.
    let bad = node
        .on_chunk(&chunk_body(5, "/vol/k0", 0, 8, crc ^ 1, whole))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&bad).contains("checksum"),
        "{bad:?}"
    );
    node.shutdown().await;
}

/// Refused peer handshakes are logged once per `REFUSAL_LOG_EVERY` per
/// node of the layout; claims of ids the layout does not have (anyone may
/// send a handshake) share one slot, so neither the log nor the node's
/// memory grows with the ids a client makes up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_handshakes_are_logged_in_bounded_slots() {
    let d = tempfile::tempdir().unwrap();
    let (layout, settings, store) = single_node(d.path());
    let node = ClusterNode::start(1, layout, settings, d.path().to_path_buf(), store)
        .await
        .unwrap();
    assert!(node.log_refused_peer(1));
    assert!(!node.log_refused_peer(1), "again within the period");
    assert!(node.log_refused_peer(7), "the first unknown id");
    for id in 8..10_000 {
        assert!(!node.log_refused_peer(id), "unknown id {id} logged again");
    }
    assert_eq!(node.refusals_logged.lock().len(), 2);
}
