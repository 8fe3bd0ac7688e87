use sluice_client::Client;
use sluice_server::{Server, ServerConfig};
use sluice_store::{Store, StoreConfig};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn a_node_built_with_a_custom_udl_runs_it() {
    let dir = std::env::temp_dir().join(format!("sluice-custom-udl-{}", std::process::id()));
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.clone(),
        ..Default::default()
    };
    let store = Arc::new(Store::open(StoreConfig::default()).unwrap());
    let server = Server::bind_with(cfg, store, sluice_custom_udl_example::registry())
        .await
        .unwrap();
    let addr = server.local_addr().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    let c = Client::connect(&addr).await.unwrap();
    let dfg = r#"[{"id": "shout", "graph": [{"pathname": "/trig/in", "user_defined_logic_list": ["uppercase"],
        "user_defined_logic_config_list": [{"suffix": "!"}], "destinations": [{"/vol/out": "put"}]}]}]"#;
    c.dfg_apply(dfg).await.unwrap();
    let mut w = c.watch("/vol/out").await.unwrap();
    c.trigger_put("/trig/in/greeting", "hello").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*n.object.key, "/vol/out/greeting");
    assert_eq!(&n.object.value[..], b"HELLO!");
    let bad = r#"[{"id": "x", "graph": [{"pathname": "/trig/in", "user_defined_logic_list": ["uppercase"],
        "user_defined_logic_config_list": [{"suffix": 3}]}]}]"#;
    let e = c.dfg_apply(bad).await.unwrap_err();
    assert!(e.to_string().contains("suffix must be a string"), "{e}");
    tx.send(()).unwrap();
    h.await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// A free port on 127.0.0.1 (bound then released; the node binds it next).
fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Issue #17: a node with custom UDLs runs in a cluster through the same
/// `bind_with_registry` as `sluice serve`: two members, a graph applied
/// through one runs on both, the put replicated and transformed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_nodes_form_a_cluster_and_run_the_graph_on_every_member() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,openraft=off")
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let addrs = [free_addr(), free_addr()];
    let layout = dir.path().join("layout.toml");
    std::fs::write(
        &layout,
        format!(
            "[[nodes]]\nid = 0\naddress = \"{}\"\n[[nodes]]\nid = 1\naddress = \"{}\"\n[[subgroups.volatile]]\nshards = [[0, 1]]\n[[subgroups.trigger]]\nshards = [[0, 1]]\n",
            addrs[0], addrs[1]
        ),
    )
    .unwrap();
    let mut stops = Vec::new();
    let mut runs = Vec::new();
    for (id, addr) in addrs.iter().enumerate() {
        let mut cfg = ServerConfig {
            node_id: id as u32,
            listen: *addr,
            data_dir: dir.path().join(format!("node-{id}")),
            ..Default::default()
        };
        cfg.cluster.layout = Some(layout.clone());
        cfg.cluster.volatile_dir = Some(dir.path().join(format!("node-{id}/raft-volatile")));
        let server = Server::bind_with_registry(cfg, sluice_custom_udl_example::registry())
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        runs.push(tokio::spawn(server.run(async {
            let _ = rx.await;
        })));
        stops.push(tx);
    }
    let seeds = format!("{},{}", addrs[0], addrs[1]);
    let c = Client::connect(&seeds).await.unwrap();
    let dfg = r#"[{"id": "shout", "graph": [{"pathname": "/trig/in", "user_defined_logic_list": ["uppercase"],
        "user_defined_logic_config_list": [{"suffix": "!"}], "destinations": [{"/vol/out": "put"}]}]}]"#;
    // The metadata group may still be electing its first leader.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match c.dfg_apply(dfg).await {
            Ok(r) => {
                assert_eq!(r["cluster"], true, "{r}");
                break;
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("waiting for the cluster: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // Both members run it.
    loop {
        let nodes = c.dfg_list_nodes().await.unwrap();
        let running = nodes
            .iter()
            .filter(|(_, r)| {
                r.as_ref()
                    .is_ok_and(|l| l[0]["id"] == "shout" && l[0]["state"] == "running")
            })
            .count();
        if running == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "graph not running on both: {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..8 {
        c.trigger_put(&format!("/trig/in/g{i}"), format!("hello {i}"))
            .await
            .unwrap();
    }
    for i in 0..8 {
        let key = format!("/vol/out/g{i}");
        let v = loop {
            match c.get(&key).await {
                Ok(o) => break o.value,
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("{key}: {e}"),
            }
        };
        assert_eq!(&v[..], format!("HELLO {i}!").as_bytes());
    }
    for tx in stops {
        let _ = tx.send(());
    }
    for r in runs {
        r.await.unwrap();
    }
}
