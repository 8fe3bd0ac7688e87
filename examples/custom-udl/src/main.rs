//! `sluice-custom-node`: a Sluice node with the `uppercase` UDL built in,
//! standalone or as a member of a cluster, like `sluice serve`:
//! `--config FILE` (a node config; see examples/node.toml), `--listen ADDR`,
//! `--data-dir DIR`, `--cluster LAYOUT --node-id N`.

use anyhow::{Context, Result};
use sluice_server::{Server, ServerConfig};

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let mut cfg = ServerConfig::default();
    let mut listen = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_default();
        match a.as_str() {
            "--config" => {
                let p = value();
                let text = std::fs::read_to_string(&p).with_context(|| format!("reading {p}"))?;
                cfg = ServerConfig::from_toml(&text).map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
            }
            "--listen" => listen = Some(value().parse()?),
            "--data-dir" => cfg.data_dir = value().into(),
            "--cluster" => cfg.cluster.layout = Some(value().into()),
            "--node-id" => cfg.node_id = value().parse()?,
            other => anyhow::bail!(
                "unknown argument {other:?}; use --config FILE --listen ADDR --data-dir DIR --cluster LAYOUT --node-id N"
            ),
        }
    }
    match (listen, &cfg.cluster.layout) {
        (Some(l), _) => cfg.listen = l,
        // A cluster member listens on its address in the layout.
        (None, Some(p)) => {
            let text = std::fs::read_to_string(p)?;
            let l = sluice_types_layout(&text)?;
            cfg.listen = l
                .address_of(cfg.node_id)
                .ok_or_else(|| anyhow::anyhow!("node {} is not in {}", cfg.node_id, p.display()))?
                .listen_addr();
        }
        (None, None) => {}
    }
    // Everything `sluice serve` does (data directory lock, persistent
    // pools, a cluster), with the built-in UDLs and `uppercase`.
    let server = Server::bind_with_registry(cfg, sluice_custom_udl_example::registry()).await?;
    println!("sluice-custom-node listening on {}", server.local_addr());
    server
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    Ok(())
}

fn sluice_types_layout(text: &str) -> Result<sluice_types::cluster::ClusterLayout> {
    sluice_types::cluster::ClusterLayout::from_text(text).map_err(anyhow::Error::msg)
}
