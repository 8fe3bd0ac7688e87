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
