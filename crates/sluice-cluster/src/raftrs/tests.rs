//! Groups of three members in one process, their messages routed in
//! memory through the peer wire's encoding (links can be cut):
//! elections, replication and apply, a leader cut off and replaced,
//! restarts from the log, fsync'd logs, read indexes.

use super::*;
use crate::log::LogOptions;
use crate::sm::{MetaCell, MetaState};
use crate::types::group_of;
use bytes::Bytes;
use parking_lot::Mutex;
use sluice_store::{ShardId, Store, StoreConfig};
use sluice_types::cluster::ClusterLayout;
use sluice_types::{PoolType, PutResult};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

const SHARD: ShardId = ShardId {
    pool_type: PoolType::Volatile,
    subgroup: 0,
    shard: 0,
};

fn group() -> u64 {
    group_of(SHARD).unwrap()
}

/// The in-memory network: members' handles, and nodes cut off from it.
#[derive(Default)]
struct Net {
    members: Mutex<HashMap<u64, GroupHandle>>,
    cut: Mutex<HashSet<u64>>,
}

struct Link {
    from: u64,
    net: Arc<Net>,
}

impl Transport for Link {
    fn send(&self, out: Outgoing) {
        {
            let cut = self.net.cut.lock();
            if cut.contains(&self.from) || cut.contains(&out.to) {
                return;
            }
        }
        let to = self.net.members.lock().get(&out.to).cloned();
        if let Some(h) = to {
            assert_eq!(out.group, h.group);
            // Through the peer wire's encoding, as between processes.
            let body: Bytes = wire::encode(&out).unwrap().concat().into();
            let (msg, commands) = wire::decode(&body).unwrap();
            h.deliver(msg, commands, body.len());
        }
    }
}

fn layout() -> ClusterLayout {
    ClusterLayout::from_toml(
        r#"
[[nodes]]
id = 0
address = "127.0.0.1:1"
[[nodes]]
id = 1
address = "127.0.0.1:2"
[[nodes]]
id = 2
address = "127.0.0.1:3"

[[subgroups.volatile]]
shards = [[0, 1, 2]]
"#,
    )
    .unwrap()
}

struct Member {
    handle: GroupHandle,
    store: Arc<Store>,
    log: LogStore,
    sm: Sm,
}

/// Starts member `me` over the log in `dir/<me>` (kept across restarts),
/// with these settings.
fn member_with(
    net: &Arc<Net>,
    dir: &Path,
    me: u64,
    opts: LogOptions,
    settings: &DriverSettings,
) -> Member {
    member_of(net, dir, me, opts, settings, &[0, 1, 2])
}

/// `member_with`, started with these voters.
fn member_of(
    net: &Arc<Net>,
    dir: &Path,
    me: u64,
    opts: LogOptions,
    settings: &DriverSettings,
    voters: &[u64],
) -> Member {
    let store = Arc::new(
        Store::open(StoreConfig {
            layout: sluice_store::Layout {
                volatile: vec![1],
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap(),
    );
    let meta = Arc::new(MetaCell::new(MetaState::from_layout(&layout())));
    // The state machine keeps its snapshot beside the log, as a node's.
    let at = dir.join(me.to_string());
    let log = LogStore::open_with(&at, opts).unwrap();
    let sm = Sm::open(
        group(),
        store.clone(),
        meta,
        Some(at),
        false,
        Some(log.clone()),
    )
    .unwrap();
    let link = Arc::new(Link {
        from: me,
        net: net.clone(),
    });
    let handle = start(group(), me, voters, log.clone(), sm.clone(), link, settings).unwrap();
    net.members.lock().insert(me, handle.clone());
    Member {
        handle,
        store,
        log,
        sm,
    }
}

fn put(key: &str, value: &[u8]) -> Command {
    Command::Write {
        key: key.into(),
        value: Some(Bytes::copy_from_slice(value)),
        expected: None,
        timestamp_us: 1,
        req_id: None,
        trace: None,
    }
}

/// The version a put's answer gives, and the put's log index.
fn version(r: (u64, Applied)) -> u64 {
    match r.1 {
        Applied::Put(Ok(PutResult { version, .. })) => version,
        other => panic!("not a put's result: {other:?}"),
    }
}

/// Waits (up to 20 s) until `ok` holds for a member's status.
async fn until(
    mut rx: watch::Receiver<GroupStatus>,
    what: &str,
    ok: impl FnMut(&GroupStatus) -> bool,
) -> GroupStatus {
    let got = tokio::time::timeout(Duration::from_secs(20), rx.wait_for(ok))
        .await
        .map(|r| r.map(|s| s.clone()));
    match got {
        Ok(Ok(s)) => s,
        _ => panic!("timed out: {what} (status {:?})", rx.borrow()),
    }
}

/// The one leader the members in `among` agree on, once they do.
async fn leader(ms: &HashMap<u64, Member>, among: &[u64]) -> u64 {
    let t0 = std::time::Instant::now();
    loop {
        let st: Vec<GroupStatus> = among
            .iter()
            .map(|n| ms[n].handle.status().borrow().clone())
            .collect();
        let leaders: Vec<u64> = among
            .iter()
            .zip(&st)
            .filter(|(_, s)| s.is_leader)
            .map(|(n, _)| *n)
            .collect();
        if let [l] = leaders[..] {
            let term = st[among.iter().position(|n| *n == l).unwrap()].term;
            if st.iter().all(|s| s.leader == Some(l) && s.term == term) {
                return l;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no leader agreed on: {st:?}"
        );
        // Any member's next status change (or a short wait: several members).
        let mut rx = ms[&among[0]].handle.status();
        let _ = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
    }
}

fn value_of(store: &Store, key: &str) -> Option<Bytes> {
    store
        .shard_objects(SHARD)
        .into_iter()
        .find(|o| &*o.key == key)
        .map(|o| o.value.clone())
}

/// Puts `<prefix><i>` (`size` bytes of `i`) for `i` in `0..n`, all at
/// once; their answers.
async fn concurrent_puts(
    h: &GroupHandle,
    prefix: &str,
    n: usize,
    size: usize,
) -> Vec<(u64, Applied)> {
    let writes = (0..n).map(|i| {
        let h = h.clone();
        let key = format!("{prefix}{i}");
        async move { h.propose(put(&key, &vec![i as u8; size])).await }
    });
    futures_util::future::join_all(writes)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// Waits until member `m` has applied `index`.
async fn caught_up(m: &Member, index: u64) {
    until(m.handle.status(), &format!("applying up to {index}"), |s| {
        s.applied >= index
    })
    .await;
}

/// Drops every member's handle and waits until each group has shut down.
async fn stop_all(net: &Net, ms: HashMap<u64, Member>) {
    let watchers: Vec<_> = ms.values().map(|m| m.handle.status()).collect();
    drop(ms);
    net.members.lock().clear();
    for rx in watchers {
        until(rx, "the member shuts down", |s| s.stopped.is_some()).await;
    }
}

/// A temporary directory, a network and three members over mapped logs
/// in it.
async fn started() -> (tempfile::TempDir, Arc<Net>, HashMap<u64, Member>) {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let ms = three(&net, dir.path()).await;
    (dir, net, ms)
}

/// The refusal of a member that does not lead, naming `leader`.
fn not_leader(leader: u64) -> DriverError {
    DriverError::NotLeader {
        group: group(),
        leader: Some(leader),
    }
}

/// Three members over mapped logs (a volatile shard's).
async fn three(net: &Arc<Net>, dir: &Path) -> HashMap<u64, Member> {
    three_with(net, dir, |_| mapped())
}

/// The tests' timing: a tick of 20 ms.
fn test_settings() -> DriverSettings {
    DriverSettings {
        tick: Duration::from_millis(20),
        ..Default::default()
    }
}

/// Three members, member `n` over a log opened with `opts(n)`.
fn three_with(
    net: &Arc<Net>,
    dir: &Path,
    opts: impl Fn(u64) -> LogOptions,
) -> HashMap<u64, Member> {
    three_set(net, dir, opts, &test_settings())
}

/// Faults to inject into a member's log.
type Faults = Arc<std::sync::Mutex<sluice_log::Faults>>;

/// Three members over synced logs, with these settings, and the faults
/// each log's writer injects.
fn three_faulty(
    net: &Arc<Net>,
    dir: &Path,
    settings: &DriverSettings,
) -> (HashMap<u64, Member>, Vec<Faults>) {
    let faults: Vec<Faults> = (0..3).map(|_| Arc::default()).collect();
    let ms = three_set(
        net,
        dir,
        |n| synced(Some(faults[n as usize].clone())),
        settings,
    );
    (ms, faults)
}

/// `three_with`, these settings.
fn three_set(
    net: &Arc<Net>,
    dir: &Path,
    opts: impl Fn(u64) -> LogOptions,
    settings: &DriverSettings,
) -> HashMap<u64, Member> {
    (0..3)
        .map(|n| (n, member_with(net, dir, n, opts(n), settings)))
        .collect()
}

/// Three members elect one leader; a write proposed there is applied on
/// every member with the same version; a follower refuses a proposal and
/// names the leader; concurrent writes get distinct, dense versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_elect_a_leader_and_apply_writes_everywhere() {
    let (_dir, _net, ms) = started().await;
    let l = leader(&ms, &[0, 1, 2]).await;
    let v = version(ms[&l].handle.propose(put("/v/a", b"one")).await.unwrap());
    let follower = (l + 1) % 3;
    let e = ms[&follower]
        .handle
        .propose(put("/v/b", b"x"))
        .await
        .unwrap_err();
    assert_eq!(e, not_leader(l));
    let done = concurrent_puts(&ms[&l].handle, "/v/k", 200, 100).await;
    let last = done.iter().map(|(i, _)| *i).max().unwrap();
    let entries: HashSet<u64> = done.iter().map(|(i, _)| *i).collect();
    assert!(
        entries.len() < 200,
        "writes that arrive together share entries (batches)"
    );
    let mut versions: Vec<u64> = done.into_iter().map(version).collect();
    versions.sort_unstable();
    assert_eq!(versions, (v + 1..=v + 200).collect::<Vec<_>>());
    for m in ms.values() {
        caught_up(m, last).await;
        assert_eq!(value_of(&m.store, "/v/a").as_deref(), Some(&b"one"[..]));
        assert_eq!(
            value_of(&m.store, "/v/k199").as_deref(),
            Some(&[199u8; 100][..])
        );
        assert_eq!(value_of(&m.store, "/v/b"), None);
    }
}

/// A leader cut off from the others steps down (check-quorum) and fails
/// the write it could not commit; the other two elect a leader and go on;
/// once the link is back, the old leader's uncommitted entry is replaced
/// and every member holds the same writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_is_replaced_and_its_uncommitted_write_fails() {
    let (_dir, net, ms) = started().await;
    let old = leader(&ms, &[0, 1, 2]).await;
    ms[&old]
        .handle
        .propose(put("/v/before", b"1"))
        .await
        .unwrap();
    net.cut.lock().insert(old);
    let e = ms[&old]
        .handle
        .propose(put("/v/lost", b"2"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, DriverError::LeaderChanged { .. }),
        "the cut-off leader's write: {e}"
    );
    let rest: Vec<u64> = (0..3).filter(|n| *n != old).collect();
    let new = leader(&ms, &rest).await;
    assert_ne!(new, old);
    ms[&new]
        .handle
        .propose(put("/v/after", b"3"))
        .await
        .unwrap();
    net.cut.lock().clear();
    let all = leader(&ms, &[0, 1, 2]).await;
    let (index, applied) = ms[&all].handle.propose(put("/v/end", b"4")).await.unwrap();
    let last = version((index, applied));
    for (n, m) in &ms {
        caught_up(m, index).await;
        assert_eq!(value_of(&m.store, "/v/lost"), None, "member {n}");
        assert_eq!(value_of(&m.store, "/v/after").as_deref(), Some(&b"3"[..]));
        let end = m
            .store
            .shard_objects(SHARD)
            .into_iter()
            .find(|o| &*o.key == "/v/end")
            .unwrap();
        assert_eq!(end.meta.version, last, "member {n}");
    }
}

/// Members stopped and started again over their logs come back with
/// their writes (re-applied from the log) and their terms, and go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_restarted_over_their_logs_keep_their_writes() {
    let (dir, net, ms) = started().await;
    let l = leader(&ms, &[0, 1, 2]).await;
    for i in 0..50u8 {
        ms[&l]
            .handle
            .propose(put(&format!("/v/r{i}"), &[i; 1000]))
            .await
            .unwrap();
    }
    let before = ms[&l].handle.status().borrow().clone();
    stop_all(&net, ms).await;
    let ms = three(&net, dir.path()).await;
    let l = leader(&ms, &[0, 1, 2]).await;
    assert!(ms[&l].handle.status().borrow().term > before.term);
    let (index, applied) = ms[&l].handle.propose(put("/v/again", b"!")).await.unwrap();
    let v = version((index, applied));
    assert!(v > 50, "versions go on from the log's: {v}");
    for m in ms.values() {
        caught_up(m, index).await;
        for i in [0u8, 49] {
            assert_eq!(
                value_of(&m.store, &format!("/v/r{i}")).as_deref(),
                Some(&[i; 1000][..])
            );
        }
    }
}

fn synced(faults: Option<Arc<std::sync::Mutex<sluice_log::Faults>>>) -> LogOptions {
    LogOptions {
        sync: true,
        faults,
        ..Default::default()
    }
}

/// Members over fsync'd logs (a persistent shard's): the writer thread
/// makes entries durable while the task goes on; concurrent writes all
/// apply everywhere, and the members come back with them after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_over_synced_logs_replicate_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let ms = three_with(&net, dir.path(), |_| synced(None));
    let l = leader(&ms, &[0, 1, 2]).await;
    let done = concurrent_puts(&ms[&l].handle, "/p/k", 100, 4000).await;
    let last = done.iter().map(|(i, _)| *i).max().unwrap();
    let mut versions: Vec<u64> = done.into_iter().map(version).collect();
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(versions.len(), 100);
    for m in ms.values() {
        caught_up(m, last).await;
    }
    stop_all(&net, ms).await;
    let ms = three_with(&net, dir.path(), |_| synced(None));
    let l = leader(&ms, &[0, 1, 2]).await;
    let (index, _) = ms[&l].handle.propose(put("/p/again", b"!")).await.unwrap();
    for m in ms.values() {
        caught_up(m, index).await;
        assert_eq!(
            value_of(&m.store, "/p/k99").as_deref(),
            Some(&[99u8; 4000][..])
        );
    }
}

/// A member whose log's fsync fails stops its group with the reason (no
/// write is acknowledged past a failed fsync); the other two go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_fsync_fails_stops_and_the_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let (ms, faults) = three_faulty(&net, dir.path(), &test_settings());
    let l = leader(&ms, &[0, 1, 2]).await;
    ms[&l].handle.propose(put("/p/a", b"1")).await.unwrap();
    let bad = (l + 1) % 3;
    faults[bad as usize].lock().unwrap().fail_sync = true;
    let (index, _) = ms[&l].handle.propose(put("/p/b", b"2")).await.unwrap();
    let st = until(ms[&bad].handle.status(), "the member stops", |s| {
        s.stopped.is_some()
    })
    .await;
    let why = st.stopped.unwrap();
    assert!(why.contains("fsync"), "{why}");
    assert!(st.applied < index, "nothing applied past the failed fsync");
    let good = 3 - l - bad;
    caught_up(&ms[&good], index).await;
    let e = ms[&bad]
        .handle
        .propose(put("/p/c", b"3"))
        .await
        .unwrap_err();
    assert!(matches!(e, DriverError::Stopped { .. }), "{e}");
    ms[&l].handle.propose(put("/p/d", b"4")).await.unwrap();
}

/// A read index from the leader covers every write acknowledged before
/// the ask, on the leader and on a follower that waits to apply it; a
/// follower refuses to give one; a leader cut off from the others never
/// answers with a read index (a stale read), it fails the ask when it
/// steps down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_indexes_cover_acknowledged_writes_and_a_cut_off_leader_gives_none() {
    let (_dir, net, ms) = started().await;
    let l = leader(&ms, &[0, 1, 2]).await;
    let (index, _) = ms[&l].handle.propose(put("/v/x", b"1")).await.unwrap();
    let asks = (0..20).map(|_| ms[&l].handle.read_index());
    for r in futures_util::future::join_all(asks).await {
        assert!(r.unwrap() >= index);
    }
    let follower = (l + 1) % 3;
    let e = ms[&follower].handle.read_index().await.unwrap_err();
    assert_eq!(e, not_leader(l));
    let read = ms[&l].handle.read_index().await.unwrap();
    ms[&follower].handle.wait_applied(read).await.unwrap();
    assert_eq!(
        value_of(&ms[&follower].store, "/v/x").as_deref(),
        Some(&b"1"[..])
    );
    net.cut.lock().insert(l);
    let e = ms[&l].handle.read_index().await.unwrap_err();
    assert!(
        matches!(
            e,
            DriverError::LeaderChanged { .. } | DriverError::NotLeader { .. }
        ),
        "{e}"
    );
}

/// A leader hands leadership to a follower it names; the new leader takes
/// writes, the old one refuses them naming it, and no write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_to_the_member_named() {
    let (_dir, _net, ms) = started().await;
    let old = leader(&ms, &[0, 1, 2]).await;
    ms[&old].handle.propose(put("/v/t1", b"1")).await.unwrap();
    let to = (old + 2) % 3;
    ms[&old].handle.transfer_leader(to);
    until(ms[&to].handle.status(), "the named member leads", |s| {
        s.is_leader
    })
    .await;
    assert_eq!(leader(&ms, &[0, 1, 2]).await, to);
    let (index, _) = ms[&to].handle.propose(put("/v/t2", b"2")).await.unwrap();
    let e = ms[&old]
        .handle
        .propose(put("/v/t3", b"3"))
        .await
        .unwrap_err();
    assert_eq!(e, not_leader(to));
    for m in ms.values() {
        caught_up(m, index).await;
        assert_eq!(value_of(&m.store, "/v/t1").as_deref(), Some(&b"1"[..]));
        assert_eq!(value_of(&m.store, "/v/t2").as_deref(), Some(&b"2"[..]));
    }
}

/// Waits (up to 20 s) until leader `h` counts no member as down and every
/// member's log matches its own up to `index` (a member back from a cut
/// is probed, and counted down meanwhile, once its first append fails).
async fn all_counted(h: &GroupHandle, index: u64) {
    let t0 = std::time::Instant::now();
    loop {
        let matched = h.matched();
        if h.status().borrow().down.is_empty()
            && matched.len() == 3
            && matched.values().all(|m| *m >= index)
        {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "still counted down: {:?}, matched {matched:?}",
            h.status().borrow()
        );
        let mut rx = h.status();
        let _ = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
    }
}

/// The command of the entry at `index` in a member's log.
fn command_at(m: &Member, index: u64) -> Command {
    let e = m.log.entries_in(index, index + 1, u64::MAX).unwrap();
    match &e[0].payload {
        EntryPayload::Normal(c) => c.clone(),
        other => panic!("entry {index}: {other:?}"),
    }
}

/// A leader names the members it counts as down in the writes it
/// proposes (`down.rs`): one found gone at once (its process: no wait
/// for a timeout), one not heard from within an election timeout; heard
/// from again and replicating, it is not named any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_names_the_members_it_counts_down_in_its_writes() {
    let (_dir, net, ms) = started().await;
    let l = leader(&ms, &[0, 1, 2]).await;
    let (f, other) = ((l + 1) % 3, (l + 2) % 3);
    let h = &ms[&l].handle;
    // A new leader counts its followers once they answer its first
    // appends (raft-rs probes each at first).
    let (i, _) = h.propose(put("/v/d0", b"0")).await.unwrap();
    all_counted(h, i).await;
    let (i, _) = h.propose(put("/v/d0", b"0")).await.unwrap();
    assert!(matches!(command_at(&ms[&l], i), Command::Write { .. }));
    // Found gone: the next write names it, with no wait.
    net.cut.lock().insert(f);
    h.peer_gone(f);
    let (i, r) = h.propose(put("/v/d1", b"1")).await.unwrap();
    assert!(version((i, r)) > 0, "a lone write is answered as one");
    match command_at(&ms[&l], i) {
        Command::Without { down, writes } => {
            assert_eq!(down, vec![f as u32]);
            assert_eq!(writes.len(), 1);
        }
        c => panic!("{c:?}"),
    }
    // Published at the end of the driver's turn, which may come after
    // the write's answer (seen once under CI load: not yet shown).
    until(h.status(), "the gone member shown down", |s| {
        s.down == vec![f as u32]
    })
    .await;
    // Healed: heard from and replicating again, it is not named.
    net.cut.lock().clear();
    all_counted(h, i).await;
    let (i, _) = h.propose(put("/v/d2", b"2")).await.unwrap();
    assert!(matches!(command_at(&ms[&l], i), Command::Write { .. }));
    // Silent (cut off, nothing said of its process): down once not heard
    // from within an election timeout.
    net.cut.lock().insert(other);
    until(h.status(), "the silent member counted down", |s| {
        s.down == vec![other as u32]
    })
    .await;
    let (i, _) = h.propose(put("/v/d3", b"3")).await.unwrap();
    assert!(matches!(command_at(&ms[&l], i), Command::Without { .. }));
    net.cut.lock().clear();
    for m in ms.values() {
        caught_up(m, i).await;
        for k in ["/v/d0", "/v/d1", "/v/d2", "/v/d3"] {
            assert!(value_of(&m.store, k).is_some(), "{k}");
        }
        m.sm.with_down(|d| assert!(d.is_empty(), "cleared after the entry"));
    }
}

/// A member that says it is stopping is named down from the leader's next
/// write on (its last index answered, for the member to apply first); a
/// follower asked refuses, naming the leader; once the member's process
/// is found gone and it is heard from again, it counts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stopping_is_named_down_from_the_leaders_next_write() {
    let (_dir, _net, ms) = started().await;
    let l = leader(&ms, &[0, 1, 2]).await;
    let (f, other) = ((l + 1) % 3, (l + 2) % 3);
    let h = &ms[&l].handle;
    let (i, _) = h.propose(put("/v/s0", b"0")).await.unwrap();
    all_counted(h, i).await;
    assert_eq!(ms[&other].handle.leaving(f).await, Err(not_leader(l)));
    let last = h.leaving(f).await.unwrap();
    assert!(last >= i);
    let (i, _) = h.propose(put("/v/s1", b"1")).await.unwrap();
    assert!(i > last);
    match command_at(&ms[&l], i) {
        Command::Without { down, .. } => assert_eq!(down, vec![f as u32]),
        c => panic!("{c:?}"),
    }
    // Gone (it stopped), then heard from (restarted): it counts again.
    h.peer_gone(f);
    all_counted(h, i).await;
}

/// Writes proposed while a leader hands its leadership over (raft-rs drops
/// proposals meanwhile) wait for the transfer's outcome: refused naming
/// the new leader once it leads, or committed by the old one when the
/// transfer is given up. They were refused at once naming the old leader
/// itself (a hint a client cannot use), so clients went round the other
/// members and paused during a graceful stop's hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_made_during_a_leadership_transfer_wait_for_its_outcome() {
    let (_dir, net, ms) = started().await;
    let old = leader(&ms, &[0, 1, 2]).await;
    let to = (old + 1) % 3;
    let h = ms[&old].handle.clone();
    let during = write_during_a_transfer(&net, &h, to, "/v/y").await;
    net.cut.lock().remove(&to);
    assert_eq!(during.await.unwrap_err(), not_leader(to));
    until(ms[&to].handle.status(), "the named member leads", |s| {
        s.is_leader
    })
    .await;

    // A transfer that cannot finish (its member stays cut off) is given
    // up after an election timeout; what was proposed meanwhile is then
    // committed.
    let old = to;
    let to = (old + 1) % 3;
    let h = ms[&old].handle.clone();
    let during = write_during_a_transfer(&net, &h, to, "/v/w").await;
    let (index, _) = during.await.unwrap();
    assert!(h.borrow_status().is_leader);
    net.cut.lock().remove(&to);
    for m in ms.values() {
        caught_up(m, index).await;
        assert_eq!(value_of(&m.store, "/v/w").as_deref(), Some(&b"/v/w"[..]));
        assert_eq!(value_of(&m.store, "/v/y"), None);
    }
}

/// Leader `h` transfers its leadership to `to`, which is behind (cut off
/// while a write commits), so the transfer is in progress until the link
/// is healed; then a write of `key` to `h`, sent and waiting.
async fn write_during_a_transfer<'a>(
    net: &Net,
    h: &'a GroupHandle,
    to: u64,
    key: &str,
) -> impl std::future::Future<Output = Result<(u64, Applied), DriverError>> + 'a {
    use futures_util::FutureExt;
    net.cut.lock().insert(to);
    h.propose(put(&format!("{key}-before"), b"x"))
        .await
        .unwrap();
    h.transfer_leader(to);
    let mut during = Box::pin(h.propose(put(key, key.as_bytes())));
    assert!((&mut during).now_or_never().is_none(), "sent, and waiting");
    during
}

/// A batch's waiters each get their write's result; a result that does
/// not fit the proposal (not one per write) fails every waiter with an
/// error that says so, and nobody is left waiting.
#[test]
fn waiters_get_their_results_or_an_error_that_says_why() {
    let put_ok = |v| {
        Applied::Put(Ok(PutResult {
            version: v,
            timestamp_us: v,
        }))
    };
    let (txs, mut rxs): (Vec<_>, Vec<_>) = (0..3).map(|_| oneshot::channel()).unzip();
    Waiting::Batch(txs).answer(7, 42, Applied::Batch((1..=3).map(put_ok).collect()));
    for (v, rx) in (1..=3).zip(&mut rxs) {
        assert_eq!(rx.try_recv().unwrap().unwrap(), (42, put_ok(v)));
    }
    let (txs, mut rxs): (Vec<_>, Vec<_>) = (0..2).map(|_| oneshot::channel()).unzip();
    Waiting::Batch(txs).answer(7, 43, Applied::Batch(vec![put_ok(1)]));
    for rx in &mut rxs {
        let e = rx.try_recv().unwrap().unwrap_err();
        assert!(
            matches!(&e, DriverError::Unexpected { group: 7, reason } if reason.contains("entry 43")),
            "{e}"
        );
    }
}

/// Settings with a snapshot every 20 entries (10 kept behind one).
fn snapshotting() -> DriverSettings {
    DriverSettings {
        tick: Duration::from_millis(20),
        snapshot_every: 20,
        ..Default::default()
    }
}

/// A mapped log's options (a volatile shard's).
fn mapped() -> LogOptions {
    LogOptions {
        mapped: true,
        ..Default::default()
    }
}

/// `three_with`, snapshotting often.
fn three_snapshotting(
    net: &Arc<Net>,
    dir: &Path,
    opts: impl Fn(u64) -> LogOptions,
) -> HashMap<u64, Member> {
    three_set(net, dir, opts, &snapshotting())
}

/// Puts `<prefix><i>` (`size` bytes of `i`) for `i` in `0..n`, each once
/// the one before is applied (an entry each); the last one's log index.
async fn puts_in_turn(h: &GroupHandle, prefix: &str, n: u8, size: usize) -> u64 {
    let mut last = 0;
    for i in 0..n {
        last = h
            .propose(put(&format!("{prefix}{i}"), &vec![i; size]))
            .await
            .unwrap()
            .0;
    }
    last
}

/// Waits until member `m` has purged its log past entry `index`.
async fn purged_past(m: &Member, index: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while m.log.bounds().first <= index {
        assert!(
            std::time::Instant::now() < deadline,
            "never purged past {index}: {:?}",
            m.log.bounds()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Puts (`<prefix><i>`) at leader `m` until its log is purged past entry
/// `index` (for at most 20 s); the last put's log index.
async fn puts_until_purged_past(m: &Member, prefix: &str, index: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut last = 0;
    for i in 0u64.. {
        if m.log.bounds().first > index {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the leader never purged past {index}: {:?}",
            m.log.bounds()
        );
        last = m
            .handle
            .propose(put(&format!("{prefix}{i}"), b"m"))
            .await
            .unwrap()
            .0;
    }
    last
}

/// Members snapshot their state and purge their logs as entries are
/// applied; a follower cut off meanwhile, whose next entries the leader
/// no longer holds, is sent the leader's snapshot, installs it, and then
/// takes entries again: it ends with every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_purged_log_catches_up_from_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let ms = three_snapshotting(&net, dir.path(), |_| mapped());
    let l = leader(&ms, &[0, 1, 2]).await;
    let behind = (l + 1) % 3;
    net.cut.lock().insert(behind);
    // Writes go on until the leader, no longer hearing from the cut-off
    // follower (check-quorum), stops keeping its entries and purges past
    // them at a snapshot.
    let last = puts_in_turn(&ms[&l].handle, "/v/s", 120, 64).await;
    let last = puts_until_purged_past(&ms[&l], "/v/more", 60)
        .await
        .max(last);
    assert!(
        ms[&behind].log.bounds().last < 10,
        "{:?}",
        ms[&behind].log.bounds()
    );
    net.cut.lock().clear();
    let (index, _) = ms[&l].handle.propose(put("/v/end", b"e")).await.unwrap();
    assert!(index > last);
    for (n, m) in &ms {
        caught_up(m, index).await;
        for i in [0u8, 59, 119] {
            assert_eq!(
                value_of(&m.store, &format!("/v/s{i}")).as_deref(),
                Some(&[i; 64][..]),
                "member {n}, /v/s{i}"
            );
        }
        assert_eq!(value_of(&m.store, "/v/end").as_deref(), Some(&b"e"[..]));
    }
    // The follower's log starts after the snapshot it installed.
    assert!(
        ms[&behind].log.bounds().first > 60,
        "{:?}",
        ms[&behind].log.bounds()
    );
    stop_all(&net, ms).await;
}

/// Members over synced logs that snapshotted and purged them come back
/// after a restart from the snapshot and the entries after it (the commit
/// point a synced log saves may lie in a purged segment: the snapshot's
/// entries count as committed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_restart_from_their_snapshots_and_purged_logs() {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let start_all = |net: &Arc<Net>| three_snapshotting(net, dir.path(), |_| synced(None));
    let ms = start_all(&net);
    let l = leader(&ms, &[0, 1, 2]).await;
    let last = puts_in_turn(&ms[&l].handle, "/p/s", 80, 100).await;
    for m in ms.values() {
        caught_up(m, last).await;
        purged_past(m, 40).await;
    }
    stop_all(&net, ms).await;
    let ms = start_all(&net);
    let l = leader(&ms, &[0, 1, 2]).await;
    let (index, _) = ms[&l].handle.propose(put("/p/again", b"!")).await.unwrap();
    for (n, m) in &ms {
        caught_up(m, index).await;
        for i in [0u8, 40, 79] {
            assert_eq!(
                value_of(&m.store, &format!("/p/s{i}")).as_deref(),
                Some(&[i; 100][..]),
                "member {n}, /p/s{i}"
            );
        }
    }
    stop_all(&net, ms).await;
}

/// Three members over mapped logs that snapshot once their log outgrows
/// 1 MiB (their state being smaller), never by entry count.
fn three_small_logged(net: &Arc<Net>, dir: &Path) -> HashMap<u64, Member> {
    let settings = DriverSettings {
        tick: Duration::from_millis(20),
        snapshot_every: 1_000_000,
        snapshot_bytes: 256 << 20,
        snapshot_min_bytes: 1 << 20,
        ..Default::default()
    };
    three_set(net, dir, |_| mapped(), &settings)
}

/// Overwrites four keys `rounds` times with `size`-byte values (round
/// `r` writes bytes `r`); checks every member applied them all, purged
/// its log past its first half and holds under `max_held` bytes of it.
async fn overwrites_keep_the_log_under(rounds: u32, size: usize, max_held: u64) {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let ms = three_small_logged(&net, dir.path());
    let l = leader(&ms, &[0, 1, 2]).await;
    let mut last = 0;
    for round in 0..rounds {
        for k in 0..4u8 {
            let v = vec![round as u8; size];
            last = ms[&l]
                .handle
                .propose(put(&format!("/v/k{k}"), &v))
                .await
                .unwrap()
                .0;
        }
    }
    for m in ms.values() {
        caught_up(m, last).await;
        purged_past(m, last / 2).await;
        // The last snapshot (and the purge after it) may still be under
        // way once the log is past its first half (seen under load).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while m.log.held_bytes() >= max_held {
            let held = m.log.held_bytes();
            assert!(std::time::Instant::now() < deadline, "{held} bytes held");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A log this small needs the fewest spare segments, not 16.
        assert_eq!(m.log.spare_limit(), 2);
        assert_eq!(
            value_of(&m.store, "/v/k3").as_deref(),
            Some(&vec![(rounds - 1) as u8; size][..])
        );
    }
    stop_all(&net, ms).await;
}

/// A member whose state is small snapshots once its log outgrows
/// `snapshot_min_bytes` (four times its last snapshot being smaller),
/// long before `snapshot_every` entries or `snapshot_bytes`: 16 MiB of
/// 8 KB puts to four keys (a 32 KB state) leave a log of a few MiB (the
/// snapshot keeps 128 entries, 1 MiB, behind it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_state_keeps_a_small_log() {
    overwrites_keep_the_log_under(512, 8 << 10, 5 << 20).await;
}

/// Large entries: what a snapshot keeps behind it is bounded by bytes
/// too (`snapshot_min_bytes`), not only by count: 64 puts of 256 KB are
/// fewer than the 256 entries a snapshot keeps, yet the log is purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_entries_kept_behind_a_snapshot_are_bounded_by_their_bytes() {
    overwrites_keep_the_log_under(16, 256 << 10, 4 << 20).await;
}

/// An append whose entries do not follow its index (raft-rs 0.7's
/// `batch_append` made such messages; a faulty peer could too) is
/// dropped: raft-rs would otherwise panic committing past the log's end
/// and take the node down. The group goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_whose_entries_do_not_follow_its_index_is_dropped() {
    let (_dir, _net, ms) = started().await;
    let l = leader(&ms, &[0, 1, 2]).await;
    let (index, _) = ms[&l].handle.propose(put("/v/a", b"1")).await.unwrap();
    let f = (l + 1) % 3;
    caught_up(&ms[&f], index).await;
    let term = ms[&f].handle.borrow_status().term;
    let entry = |i: u64| raft::eraftpb::Entry {
        term,
        index: i,
        ..Default::default()
    };
    // Entries `index - 1` and `index` (both held) under index `index`:
    // raft-rs would take them as `index + 1` and `index + 2`.
    let mut msg = RaftMessage {
        to: raft_id(f),
        from: raft_id(l),
        term,
        log_term: term,
        index,
        commit: index + 2,
        entries: vec![entry(index - 1), entry(index)],
        ..Default::default()
    };
    msg.set_msg_type(raft::eraftpb::MessageType::MsgAppend);
    ms[&f].handle.deliver(msg, Vec::new(), 0);
    let (next, _) = ms[&l].handle.propose(put("/v/b", b"2")).await.unwrap();
    caught_up(&ms[&f], next).await;
    assert_eq!(ms[&f].handle.borrow_status().stopped, None);
    assert_eq!(value_of(&ms[&f].store, "/v/b").as_deref(), Some(&b"2"[..]));
}

fn members(voters: &[u64], learners: &[u64]) -> Members {
    Members {
        voters: voters.iter().copied().collect(),
        learners: learners.iter().copied().collect(),
    }
}

/// Waits until member `m` holds configuration `want`.
async fn configured(m: &Member, want: &Members) {
    until(m.handle.status(), &format!("configuration {want:?}"), |s| {
        &s.members == want
    })
    .await;
}

/// A newcomer (started knowing only the first members) joins as a
/// learner: it takes the log from its start and the configuration with
/// it, and does not vote; promoted, it votes; a member removed is out of
/// everyone's configuration, its own included. Changes are refused on a
/// follower, when they change nothing, and when they would leave no
/// voter. A member restarted over its log with a stale list of voters
/// comes back with the configuration the log holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_joins_as_a_learner_is_promoted_and_a_member_leaves() {
    let (dir, net, mut ms) = started().await;
    let settings = test_settings();
    let opts = LogOptions {
        mapped: true,
        ..Default::default()
    };
    let l = leader(&ms, &[0, 1, 2]).await;
    concurrent_puts(&ms[&l].handle, "/v/before", 50, 100).await;
    ms.insert(
        3,
        member_of(&net, dir.path(), 3, opts.clone(), &settings, &[0, 1, 2]),
    );
    let h = ms[&l].handle.clone();
    let follower = (l + 1) % 3;
    assert_eq!(
        ms[&follower]
            .handle
            .change_members(MemberChange::AddLearner(3))
            .await
            .unwrap_err(),
        not_leader(l)
    );
    h.change_members(MemberChange::AddLearner(3)).await.unwrap();
    let with_learner = members(&[0, 1, 2], &[3]);
    for m in ms.values() {
        configured(m, &with_learner).await;
    }
    let (index, _) = h.propose(put("/v/after", b"a")).await.unwrap();
    caught_up(&ms[&3], index).await;
    assert_eq!(
        value_of(&ms[&3].store, "/v/before49").as_deref(),
        Some(&[49u8; 100][..])
    );
    let refused = |e: DriverError| matches!(e, DriverError::Refused { .. });
    assert!(refused(
        h.change_members(MemberChange::AddLearner(3))
            .await
            .unwrap_err()
    ));
    assert!(refused(
        h.change_members(MemberChange::Remove(7)).await.unwrap_err()
    ));
    h.change_members(MemberChange::Promote(3)).await.unwrap();
    let four = members(&[0, 1, 2, 3], &[]);
    for m in ms.values() {
        configured(m, &four).await;
    }
    // Remove a follower other than the newcomer.
    let out = (0..3).find(|n| *n != l).unwrap();
    h.change_members(MemberChange::Remove(out)).await.unwrap();
    let rest: Vec<u64> = (0..4).filter(|n| *n != out).collect();
    let three = members(&rest, &[]);
    for n in &rest {
        configured(&ms[n], &three).await;
    }
    configured(&ms[&out], &three).await;
    // Writes commit without the removed member.
    net.cut.lock().insert(out);
    let (index, _) = h.propose(put("/v/three", b"t")).await.unwrap();
    for n in &rest {
        caught_up(&ms[n], index).await;
    }
    // The newcomer, restarted over its log with the first voters it was
    // given, replays the changes.
    let m3 = ms.remove(&3).unwrap();
    let rx = m3.handle.status();
    net.members.lock().remove(&3);
    drop(m3);
    until(rx, "member 3 stops", |s| s.stopped.is_some()).await;
    let m3 = member_of(&net, dir.path(), 3, opts, &settings, &[0, 1, 2]);
    configured(&m3, &three).await;
    ms.insert(3, m3);
    // Down to one voter and no further.
    for n in rest.iter().filter(|n| **n != l) {
        h.change_members(MemberChange::Remove(*n)).await.unwrap();
    }
    configured(&ms[&l], &members(&[l], &[])).await;
    assert!(refused(
        h.change_members(MemberChange::Remove(l)).await.unwrap_err()
    ));
    drop(h);
    stop_all(&net, ms).await;
}

/// A newcomer whose first entries the leader has purged gets the
/// configuration with the snapshot it installs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_behind_the_purged_log_takes_the_configuration_from_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let settings = snapshotting();
    let mut ms = three_snapshotting(&net, dir.path(), |_| mapped());
    let l = leader(&ms, &[0, 1, 2]).await;
    // A change first, so the snapshot holds a configuration of its own:
    // member 2 leaves.
    let h = ms[&l].handle.clone();
    let gone = (0..3).find(|n| *n != l).unwrap();
    h.change_members(MemberChange::Remove(gone)).await.unwrap();
    let last = puts_in_turn(&h, "/v/s", 120, 64).await;
    let last = puts_until_purged_past(&ms[&l], "/v/more", 2)
        .await
        .max(last);
    ms.insert(
        4,
        member_of(&net, dir.path(), 4, mapped(), &settings, &[0, 1, 2]),
    );
    h.change_members(MemberChange::AddLearner(4)).await.unwrap();
    caught_up(&ms[&4], last).await;
    let rest: Vec<u64> = (0..3).filter(|n| *n != gone).collect();
    configured(&ms[&4], &members(&rest, &[4])).await;
    assert!(ms[&4].log.bounds().first > 2, "{:?}", ms[&4].log.bounds());
    assert_eq!(
        value_of(&ms[&4].store, "/v/s119").as_deref(),
        Some(&[119u8; 64][..])
    );
    drop(h);
    stop_all(&net, ms).await;
}

/// A follower over a synced log whose fsyncs are slow (its answers wait
/// for them), cut off while it still writes entries it took, falls
/// behind the leader's purged log: it is sent a snapshot, installs it,
/// and catches up (the snapshot arriving while entries are still being
/// written, as the chaos run found it: the test after this one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_a_slow_disk_catches_up_from_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let (ms, faults) = three_faulty(&net, dir.path(), &snapshotting());
    let l = leader(&ms, &[0, 1, 2]).await;
    let slow = (l + 1) % 3;
    // The leader streams entries to the follower (it has answered), ...
    let mut last = puts_in_turn(&ms[&l].handle, "/p/a", 20, 64).await;
    caught_up(&ms[&slow], last).await;
    // ... which from now on writes them a batch per 2 s; cut off for a
    // while, it misses some, and the leader, no longer hearing from it,
    // purges past what it holds.
    faults[slow as usize].lock().unwrap().sync_delay = Some(Duration::from_secs(2));
    last = puts_in_turn(&ms[&l].handle, "/p/b", 20, 64).await;
    net.cut.lock().insert(slow);
    let past = ms[&slow].log.bounds().last + 1;
    last = puts_until_purged_past(&ms[&l], "/p/cut", past)
        .await
        .max(last);
    net.cut.lock().clear();
    // Writes go on while the follower rejoins: it takes a snapshot with
    // entries of its own still being written.
    for j in 0..40u8 {
        last = ms[&l]
            .handle
            .propose(put(&format!("/p/c{j}"), &[j; 64]))
            .await
            .unwrap()
            .0;
    }
    faults[slow as usize].lock().unwrap().sync_delay = None;
    let st = until(
        ms[&slow].handle.status(),
        "the slow follower catches up",
        |s| s.applied >= last || s.stopped.is_some(),
    )
    .await;
    assert_eq!(st.stopped, None);
    assert_eq!(
        value_of(&ms[&slow].store, "/p/c39").as_deref(),
        Some(&[39u8; 64][..])
    );
    stop_all(&net, ms).await;
}

/// A group's queue of peers' messages is bounded in messages and in
/// bytes: past either bound a message is refused and counted, room comes
/// back as the task takes them, and one message larger than the byte
/// bound goes when the queue is empty.
#[test]
fn the_queue_of_peers_messages_is_bounded() {
    let q = Inbox::new(3, 100);
    assert!(q.take(40));
    assert!(q.take(40));
    assert!(!q.take(40), "120 bytes would pass the bound");
    assert!(q.take(10));
    assert!(!q.take(0), "three messages are the bound");
    assert_eq!(q.dropped.load(Ordering::Relaxed), 2);
    for b in [40, 40, 10] {
        q.release(b);
    }
    assert!(q.take(500), "alone, a large message goes");
    assert!(!q.take(1));
    q.release(500);
    assert!(q.take(1));
}

/// Issue #20 (found by the chaos run): a follower over a synced log takes
/// an append, whose entries its writer is still making durable (fsyncs
/// of 2 s), when the leader's snapshot arrives. It installs the snapshot
/// and goes on. (The driver applied up to the snapshot before raft-rs
/// knew it persisted, and raft-rs panicked: "applied(..) is out of range
/// [prev_applied(..), min(committed(..), persisted(..))]", stopping the
/// group.) The two messages are the leader's own, handed to the follower
/// one turn apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_that_arrives_while_entries_are_being_written_is_installed() {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let (ms, faults) = three_faulty(&net, dir.path(), &snapshotting());
    let l = leader(&ms, &[0, 1, 2]).await;
    let f = (l + 1) % 3;
    let first = puts_in_turn(&ms[&l].handle, "/p/a", 5, 64).await;
    caught_up(&ms[&f], first).await;
    // The follower hears nothing more; the next five entries are kept
    // as the leader's log holds them, for an append of our own.
    net.cut.lock().insert(f);
    let next = puts_in_turn(&ms[&l].handle, "/p/b", 5, 64).await;
    let ours = ms[&l]
        .log
        .entries_in(first + 1, next + 1, u64::MAX)
        .unwrap();
    let term = ms[&l].handle.borrow_status().term;
    // The leader snapshots past them.
    let last = puts_until_purged_past(&ms[&l], "/p/c", next).await;
    caught_up(&ms[&l], last).await;
    let snap = ms[&l].sm.current_snapshot().unwrap().unwrap();
    let snap_id = snap.meta.last_log_id.unwrap();
    assert!(snap_id.index > next, "{snap_id:?}");
    // The follower's disk turns slow; it takes the append...
    faults[f as usize].lock().unwrap().sync_delay = Some(Duration::from_secs(2));
    let commands: Vec<Command> = ours
        .iter()
        .map(|e| match &e.payload {
            EntryPayload::Normal(c) => c.clone(),
            other => panic!("not a write: {other:?}"),
        })
        .collect();
    let mut append = RaftMessage {
        to: raft_id(f),
        from: raft_id(l),
        term,
        log_term: term,
        index: first,
        commit: first,
        entries: ours.iter().map(|e| storage::to_raft(e).unwrap()).collect(),
        ..Default::default()
    };
    append.set_msg_type(MessageType::MsgAppend);
    ms[&f].handle.deliver(append, commands, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ms[&f].log.bounds().last < next {
        assert!(
            std::time::Instant::now() < deadline,
            "the append was not taken"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // ... and, its entries still being written, the snapshot.
    let mut install = RaftMessage {
        to: raft_id(f),
        from: raft_id(l),
        term,
        snapshot: Some(eraftpb::Snapshot {
            data: snap.data,
            metadata: Some(eraftpb::SnapshotMetadata {
                conf_state: Some(members(&[0, 1, 2], &[]).conf_state()),
                index: snap_id.index,
                term: snap_id.leader_id.term,
            }),
        }),
        ..Default::default()
    };
    install.set_msg_type(MessageType::MsgSnapshot);
    ms[&f].handle.deliver(install, Vec::new(), 0);
    until(
        ms[&f].handle.status(),
        "the follower installs the snapshot",
        |s| s.applied >= snap_id.index || s.stopped.is_some(),
    )
    .await;
    assert_eq!(ms[&f].handle.borrow_status().stopped, None);
    faults[f as usize].lock().unwrap().sync_delay = None;
    net.cut.lock().clear();
    let (end, _) = ms[&l].handle.propose(put("/p/end", b"e")).await.unwrap();
    caught_up(&ms[&f], end).await;
    assert_eq!(
        value_of(&ms[&f].store, "/p/end").as_deref(),
        Some(&b"e"[..])
    );
    stop_all(&net, ms).await;
}

/// An append whose values pass `max_bytes_per_msg` goes as consecutive
/// appends of at most that much (one entry at least), each naming the
/// entry before its first; the commands go with their entries; a blank
/// entry rides along; an append within the limit stays whole.
#[test]
fn large_appends_are_cut_into_consecutive_ones() {
    let e = |index: u64, term: u64, data: bool| raft::eraftpb::Entry {
        index,
        term,
        data: if data { vec![DATA_COMMAND] } else { Vec::new() },
        ..Default::default()
    };
    let mut msg = RaftMessage {
        to: 2,
        from: 1,
        term: 3,
        log_term: 2,
        index: 10,
        commit: 14,
        entries: vec![
            e(11, 2, true),
            e(12, 3, true),
            e(13, 3, true),
            e(14, 3, false),
            e(15, 3, true),
        ],
        ..Default::default()
    };
    msg.set_msg_type(MessageType::MsgAppend);
    let v = |n: usize| vec![n as u8; n];
    let commands = vec![
        put("/a", &v(600_000)),
        put("/b", &v(600_000)),
        put("/c", &v(10)),
        put("/d", &v(600_000)),
    ];
    let key = |c: &Command| match c {
        Command::Write { key, .. } => key.clone(),
        _ => unreachable!(),
    };
    let parts = split_append(msg.clone(), commands.clone(), 1 << 20);
    // (index, log_term, entries, keys, commit) of each part.
    type Part = (u64, u64, Vec<u64>, Vec<String>, u64);
    let got: Vec<Part> = parts
        .iter()
        .map(|(m, c)| {
            (
                m.index,
                m.log_term,
                m.entries.iter().map(|e| e.index).collect(),
                c.iter().map(key).collect(),
                m.commit,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (10, 2, vec![11], vec!["/a".to_string()], 14),
            (11, 2, vec![12, 13, 14], vec!["/b".into(), "/c".into()], 14),
            (14, 3, vec![15], vec!["/d".into()], 14),
        ]
    );
    assert!(parts
        .iter()
        .all(|(m, _)| m.get_msg_type() == MessageType::MsgAppend && m.term == 3));
    // Within the limit, or a single entry however large: as it was.
    let whole = split_append(msg.clone(), commands.clone(), 4 << 20);
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0].0, msg);
    let mut one = msg.clone();
    one.entries.truncate(1);
    assert_eq!(split_append(one, commands[..1].to_vec(), 1000).len(), 1);
}

/// A follower that answers, but late (its disk takes 250 ms per write,
/// longer than the leader's election timeout of 80-160 ms), stays live
/// for the leader: the leader purges its log only up to what that
/// follower has, so it never needs a snapshot. raft-rs's check-quorum
/// clears every follower's `recent_active` once per election timeout,
/// and the leader that went by it purged past such a follower whenever a
/// snapshot came between the clearing and its next answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_late_to_answer_is_not_purged_past() {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let (ms, faults) = three_faulty(&net, dir.path(), &snapshotting());
    let l = leader(&ms, &[0, 1, 2]).await;
    let slow = (l + 1) % 3;
    faults[slow as usize].lock().unwrap().sync_delay = Some(Duration::from_millis(250));
    // Fifteen snapshots' worth of writes, an entry each.
    let mut last = 0;
    for round in 0..3 {
        last = puts_in_turn(&ms[&l].handle, &format!("/p/{round}/"), 100, 64).await;
    }
    assert!(ms[&l].sm.snapshot_counts().0 >= 5, "the leader snapshotted");
    faults[slow as usize].lock().unwrap().sync_delay = None;
    caught_up(&ms[&slow], last).await;
    assert_eq!(
        ms[&slow].sm.snapshot_counts().1,
        0,
        "the slow follower took every entry from the log, no snapshot"
    );
    stop_all(&net, ms).await;
}

/// A follower that comes back far behind takes the backlog in appends of
/// at most `TURN_BYTES` (and one message more), answering between them:
/// it used to append everything queued for it in one write (a leader
/// keeps up to 32 appends of 1 MiB in flight to it), in which its node's
/// other groups waited and its leader's election timeout could run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_takes_its_backlog_a_turn_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let net = Arc::new(Net::default());
    let ms = three(&net, dir.path()).await;
    let l = leader(&ms, &[0, 1, 2]).await;
    let behind = (l + 1) % 3;
    net.cut.lock().insert(behind);
    let last = puts_in_turn(&ms[&l].handle, "/v/big", 48, 1 << 20).await;
    net.cut.lock().clear();
    caught_up(&ms[&behind], last).await;
    let largest = ms[&behind].log.largest_append();
    assert!(
        largest <= (TURN_BYTES + (2 << 20)) as u64,
        "one append took {} MiB",
        largest >> 20
    );
    stop_all(&net, ms).await;
}

/// A member that lost its log (a volatile shard's, after a reboot) and
/// started again while its leader kept leading: the leader's heartbeat
/// named a commit point past the empty log, raft-rs panicked on it and
/// the group stopped, again at every restart. It now takes the commit
/// point back to its log's end and says where that is; the leader sends
/// it the entries again (`lost.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_lost_its_log_is_sent_it_again() {
    let (dir, net, mut ms) = started().await;
    let l = leader(&ms, &[0, 1, 2]).await;
    let mut last = 0;
    for i in 0..20u8 {
        let key = format!("/v/l{i}");
        last = ms[&l].handle.propose(put(&key, &[i; 100])).await.unwrap().0;
    }
    let f = (0..3).find(|n| *n != l).unwrap();
    caught_up(&ms[&f], last).await;
    let gone = ms.remove(&f).unwrap();
    let rx = gone.handle.status();
    net.members.lock().remove(&f);
    drop(gone);
    until(rx, "the member shuts down", |s| s.stopped.is_some()).await;
    std::fs::remove_dir_all(dir.path().join(f.to_string())).unwrap();
    let back = member_with(&net, dir.path(), f, mapped(), &test_settings());
    let st = until(back.handle.status(), "the member to catch up", |s| {
        s.stopped.is_some() || s.applied >= last
    })
    .await;
    assert_eq!(st.stopped, None);
    assert_eq!(
        value_of(&back.store, "/v/l19").as_deref(),
        Some(&[19u8; 100][..])
    );
    assert!(ms[&l].handle.status().borrow().is_leader);
}
