//! The client side's credentials for every command of this process: TLS
//! set once by `main` from `--tls-ca`/`--tls-cert`/`--tls-key` (or, for a
//! `sluice dev --tls` cluster found through `./sluice-dev/endpoints`, from
//! the files it wrote) and the bearer token of `--token`, read by each
//! place that connects.

use anyhow::{Context, Result};
use sluice_tls::ClientTls;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static CLIENT: OnceLock<Option<ClientTls>> = OnceLock::new();
static TOKEN: OnceLock<Option<String>> = OnceLock::new();

/// Sets the bearer token every connection of this process presents.
pub fn init_token(token: Option<String>) {
    let _ = TOKEN.set(token.filter(|t| !t.is_empty()));
}

/// The token of `--token` (or `SLUICE_TOKEN`).
pub fn token() -> Option<String> {
    TOKEN.get().cloned().flatten()
}

/// Where `sluice dev --tls` keeps its CA and certificates.
pub const DEV_TLS_DIR: &str = "sluice-dev/tls";

/// Sets this process's client TLS from the flags; with none, and when
/// the address came from `sluice dev`'s endpoints, from its TLS files.
pub fn init(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    dev_default: bool,
) -> Result<()> {
    let dev = Path::new(DEV_TLS_DIR);
    let (ca, cert, key) = match (ca, cert, key) {
        (None, None, None) if dev_default && dev.join("ca.pem").exists() => (
            Some(dev.join("ca.pem")),
            Some(dev.join("client.pem")),
            Some(dev.join("client-key.pem")),
        ),
        other => other,
    };
    let tls = ClientTls::from_files(
        ca.as_deref(),
        cert.as_deref(),
        key.as_deref(),
        ["--tls-ca", "--tls-cert", "--tls-key"],
    )?;
    let _ = CLIENT.set(tls);
    Ok(())
}

/// The TLS every client connection of this process uses.
pub fn client() -> Option<ClientTls> {
    CLIENT.get().cloned().flatten()
}

/// A node's own connections to itself (applying `--dfgs`): as a peer.
pub fn of_node(cfg: &sluice_server::ServerConfig) -> Result<Option<ClientTls>> {
    cfg.tls.peer_config().context("the node's [tls] settings")
}
