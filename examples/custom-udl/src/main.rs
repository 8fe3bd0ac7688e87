//! `sluice-custom-node`: a Sluice node with the `uppercase` UDL built in.
//! Same flags as `sluice serve` would take from its config: here just
//! `--listen ADDR` and `--data-dir DIR`.

use anyhow::Result;
use sluice_server::{Server, ServerConfig};
use sluice_store::{Store, StoreConfig};
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let mut cfg = ServerConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => cfg.listen = args.next().unwrap_or_default().parse()?,
            "--data-dir" => cfg.data_dir = args.next().unwrap_or_default().into(),
            other => anyhow::bail!("unknown argument {other:?}; use --listen ADDR --data-dir DIR"),
        }
    }
    let store = Store::open(StoreConfig {
        layout: cfg.layout.clone(),
        max_key_bytes: cfg.limits.max_key_bytes as usize,
        pool_table_path: Some(cfg.data_dir.join("pools.json")),
        default_pools: cfg.default_pools.clone(),
        ..Default::default()
    })?;
    let server =
        Server::bind_with(cfg, Arc::new(store), sluice_custom_udl_example::registry()).await?;
    println!("sluice-custom-node listening on {}", server.local_addr());
    server
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    Ok(())
}
