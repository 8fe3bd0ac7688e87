//! Crash safety of persistent pools with real processes: a node is
//! SIGKILLed at random points under a concurrent write load, restarted on
//! the same data directory, and every acknowledged put must be readable
//! with its exact bytes, version and timestamp; a put that was not
//! acknowledged may be present or absent, but never with a wrong value.
//!
//! `SLUICE_CRASH_ITERATIONS=200 cargo test -p sluice-cli --test crash`
//! runs a longer soak (default: 5 iterations).

use sluice_client::{Client, ClientConfig, PoolSpec, PoolType};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn start(dir: &std::path::Path, sync: &str) -> (Child, String) {
    let cfg = dir.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[persistent]\nenabled = true\nsync = \"{sync}\"\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (child, addr)
}

#[derive(Clone, Debug)]
struct Acked {
    key: String,
    value: Vec<u8>,
    version: u64,
    timestamp_us: u64,
}

/// A tiny seeded generator (xorshift) so failures print a reproducible seed.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn acknowledged_puts_survive_sigkill() {
    harness("always");
}

/// The same with group commit: a put is acknowledged after an fsync it
/// shares with the puts appended meanwhile.
#[test]
fn acknowledged_puts_survive_sigkill_with_group_commit() {
    harness("batch");
}

fn harness(sync: &str) {
    let iterations: usize = std::env::var("SLUICE_CRASH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mut seed: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("crash harness: {iterations} iterations, seed {seed}");
    let dir = std::env::temp_dir().join(format!("sluice-crash-{sync}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let attempted: Arc<Mutex<HashMap<String, HashSet<Vec<u8>>>>> = Arc::default();
    for iteration in 0..iterations {
        let (mut node, addr) = start(&dir, sync);
        let target = 20 + (next(&mut seed) % 200) as usize;
        rt.block_on(async {
            let c = Client::connect_with(ClientConfig {
                addr: addr.clone(),
                connections: 2,
                request_timeout: Duration::from_secs(5),
                ..Default::default()
            })
            .await
            .unwrap();
            if iteration == 0 {
                c.create_pool(PoolSpec {
                    pathname: "/p".into(),
                    pool_type: Some(PoolType::Persistent),
                    ..Default::default()
                })
                .await
                .unwrap();
            }
            // Everything acknowledged so far, in any earlier life of the node.
            let (a, t) = snapshot(&acked, &attempted);
            verify(&c, &a, &t).await;
            let before = acked.lock().unwrap().len();
            let mut writers = Vec::new();
            for w in 0..8u64 {
                let c = c.clone();
                let acked = acked.clone();
                let attempted = attempted.clone();
                writers.push(tokio::spawn(async move {
                    for n in 0u64.. {
                        let key = format!("/p/w{w}-k{}", n % 16);
                        let value = format!(
                            "it{iteration}-w{w}-n{n}-{}",
                            "x".repeat((n % 7) as usize * 100)
                        )
                        .into_bytes();
                        attempted
                            .lock()
                            .unwrap()
                            .entry(key.clone())
                            .or_default()
                            .insert(value.clone());
                        match c.put(&key, value.clone()).await {
                            Ok(r) => acked.lock().unwrap().push(Acked {
                                key,
                                value,
                                version: r.version,
                                timestamp_us: r.timestamp_us,
                            }),
                            Err(_) => return, // the node died
                        }
                    }
                }));
            }
            // Kill at a random point of the load, while puts are in flight.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while acked.lock().unwrap().len() < before + target {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the write load stalled"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            node.kill().unwrap(); // SIGKILL
            node.wait().unwrap();
            for w in writers {
                let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
            }
        });
    }
    // A final restart checks the last kill too.
    let (mut node, addr) = start(&dir, sync);
    rt.block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        let (a, t) = snapshot(&acked, &attempted);
        verify(&c, &a, &t).await;
    });
    node.kill().unwrap();
    node.wait().unwrap();
    assert!(acked.lock().unwrap().len() >= iterations * 20);
    let _ = std::fs::remove_dir_all(&dir);
}

type Attempts = HashMap<String, HashSet<Vec<u8>>>;

/// Copies of the shared records, taken without holding a lock across an await.
fn snapshot(acked: &Mutex<Vec<Acked>>, attempted: &Mutex<Attempts>) -> (Vec<Acked>, Attempts) {
    let a = acked.lock().unwrap().clone();
    let t = attempted.lock().unwrap().clone();
    (a, t)
}

async fn verify(c: &Client, acked: &[Acked], attempted: &HashMap<String, HashSet<Vec<u8>>>) {
    let mut newest: HashMap<&str, u64> = HashMap::new();
    for a in acked {
        let o = c
            .get_version(&a.key, a.version)
            .await
            .unwrap_or_else(|e| panic!("acknowledged {} version {} lost: {e}", a.key, a.version));
        assert_eq!(
            &o.value[..],
            &a.value[..],
            "{} version {}: wrong bytes",
            a.key,
            a.version
        );
        assert_eq!(
            o.meta.timestamp_us, a.timestamp_us,
            "{} version {}: wrong timestamp",
            a.key, a.version
        );
        let e = newest.entry(&a.key).or_insert(0);
        *e = (*e).max(a.version);
    }
    for (key, attempts) in attempted {
        match c.get(key).await {
            Ok(o) => {
                assert!(
                    attempts.contains(&o.value.to_vec()),
                    "{key} holds a value that was never written"
                );
                assert!(
                    o.meta.version >= newest.get(key.as_str()).copied().unwrap_or(0),
                    "{key} went back in time"
                );
            }
            Err(e) => assert!(
                !newest.contains_key(key.as_str()),
                "{key} lost its acknowledged versions: {e}"
            ),
        }
    }
}
