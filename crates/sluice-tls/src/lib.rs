//! TLS for Sluice: rustls configurations built from PEM files (a node's
//! listener, its connections to peers, clients), and a local certificate
//! authority for `sluice dev --tls` and tests.
//!
//! Invariants: no I/O beyond reading the named files, writing the
//! development CA's, and the streams callers hand to `accept`/`connect`
//! (this crate opens no sockets); the TLS protocol is all rustls' (its
//! unbuffered API, driven by `stream`); one crypto provider (`ring`), chosen here, so no
//! process-wide default has to be installed; every error names the file or
//! setting at fault and says what to do.

mod pki;
mod stream;

pub use pki::{make_dev_pki, DevPki, Validity, DEV_CLIENT_NAME};
pub use rustls;
pub use stream::{accept, connect, ClientStream, ServerStream, Side, TlsStream};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What went wrong setting TLS up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {}: {reason}", path.display())]
    File {
        /// The setting or flag that named the file (`tls.cert`, `--tls-ca`).
        what: String,
        path: PathBuf,
        reason: String,
    },
    #[error("{0}")]
    Config(String),
}

/// What a client should do about a TLS failure it met, where the node
/// refused its certificate (or its lack of one): the alert in `e`, in
/// the client's terms. `None` for any other failure.
pub fn client_hint(e: &std::io::Error) -> Option<&'static str> {
    use rustls::AlertDescription as A;
    match e.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::AlertReceived(A::CertificateRequired) => Some(
            "the node requires a client certificate: pass --tls-cert and --tls-key (Python: tls_cert=, tls_key=)",
        ),
        rustls::Error::AlertReceived(A::CertificateExpired) => {
            Some("the node refused this client's certificate as expired")
        }
        rustls::Error::AlertReceived(
            A::BadCertificate | A::UnknownCA | A::CertificateUnknown | A::DecryptError,
        ) => Some(
            "the node refused this client's certificate: it must be signed by the CA the node trusts (its tls.ca)",
        ),
        _ => None,
    }
}

/// The principal a verified client certificate names: its subject's
/// common name (else its first DNS name). `None` for a certificate that
/// does not parse or names neither.
pub fn principal_of(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    if let Some(cn) = c
        .subject()
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
    {
        return Some(cn.to_string());
    }
    let san = c.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
        _ => None,
    })
}

/// A bearer token's SHA-256, hex: what a node keeps instead of the token.
pub fn token_sha256(token: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A new bearer token: 32 random bytes from the operating system, hex,
/// after a `slt_` prefix (so a leaked token is easy to grep for).
pub fn new_token() -> Result<String, TlsError> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| TlsError::Config("the system random source failed".into()))?;
    Ok(format!(
        "slt_{}",
        b.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// ring's provider with AES-128-GCM first: what the cipher costs per
/// message is most of what TLS adds here (BENCHMARKS.md: TLS next to
/// plaintext), and AES-128 does 10 rounds to AES-256's 14 at a security
/// level no attack comes near; both ends prefer it, so it is what they
/// agree on. The other suites stay, for peers that lack it.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    let mut p = rustls::crypto::ring::default_provider();
    let first = [cs::TLS13_AES_128_GCM_SHA256, cs::TLS13_AES_256_GCM_SHA384];
    p.cipher_suites.retain(|s| !first.contains(s));
    for (i, s) in first.into_iter().enumerate() {
        p.cipher_suites.insert(i, s);
    }
    Arc::new(p)
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        what: what.into(),
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// The certificates of a PEM file (a chain, or a CA bundle).
pub fn load_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::File {
            what: what.into(),
            path: path.to_path_buf(),
            reason: format!("not PEM certificates: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::File {
            what: what.into(),
            path: path.to_path_buf(),
            reason: "holds no certificate (expected -----BEGIN CERTIFICATE-----)".into(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(what: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(what, path)?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| TlsError::File {
            what: what.into(),
            path: path.to_path_buf(),
            reason: format!("not a PEM private key: {e}"),
        })?
        .ok_or_else(|| TlsError::File {
            what: what.into(),
            path: path.to_path_buf(),
            reason: "holds no private key (expected -----BEGIN PRIVATE KEY-----)".into(),
        })
}

/// How a node's config names its CA, certificate and key.
const NODE_NAMES: [&str; 3] = ["tls.ca", "tls.cert", "tls.key"];

/// The CA certificates of `path`; `what` names the setting or flag that
/// gave it, for the errors.
fn roots(what: &str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for c in load_certs(what, path)? {
        store.add(c).map_err(|e| TlsError::File {
            what: what.into(),
            path: path.to_path_buf(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(store)
}

/// A node's `[tls]`: its certificate and key (presented to clients, and
/// to peers when it connects to them), the CA that signed its peers' and
/// (optionally) clients' certificates, and whether clients must present
/// one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeTls {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    /// Refuse clients without a certificate signed by `ca` (mutual TLS).
    pub require_client_cert: bool,
}

impl NodeTls {
    /// Whether TLS is on (a certificate is named).
    pub fn enabled(&self) -> bool {
        self.cert.is_some()
    }

    /// Checks the settings hang together (before any file is read).
    pub fn validate(&self) -> Result<(), TlsError> {
        match (&self.cert, &self.key) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(TlsError::Config(
                    "tls: set both tls.cert and tls.key (the node's certificate and its private key), or neither".into(),
                ))
            }
            _ => {}
        }
        if self.cert.is_none() && (self.ca.is_some() || self.require_client_cert) {
            return Err(TlsError::Config(
                "tls: tls.ca and tls.require_client_cert need tls.cert and tls.key (TLS is off without them)".into(),
            ));
        }
        if self.require_client_cert && self.ca.is_none() {
            return Err(TlsError::Config(
                "tls.require_client_cert = true needs tls.ca (the CA that signs client certificates)".into(),
            ));
        }
        Ok(())
    }

    /// The listener's configuration; `None` when TLS is off.
    pub fn server_config(&self) -> Result<Option<Arc<ServerConfig>>, TlsError> {
        self.validate()?;
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return Ok(None);
        };
        let certs = load_certs(NODE_NAMES[1], cert)?;
        let key = load_key(NODE_NAMES[2], key)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &self.ca {
            Some(ca) => {
                let v = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots(NODE_NAMES[0], ca)?),
                    provider(),
                );
                let v = if self.require_client_cert {
                    v.build()
                } else {
                    v.allow_unauthenticated().build()
                }
                .map_err(|e| TlsError::Config(format!("tls.ca: {e}")))?;
                builder.with_client_cert_verifier(v)
            }
            None => builder.with_no_client_auth(),
        };
        let cfg = builder
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Config(format!("tls.cert / tls.key: {e}")))?;
        Ok(Some(Arc::new(cfg)))
    }

    /// How this node connects to its peers: verifying them against `ca`
    /// (else its own certificate's chain) and presenting its own
    /// certificate; `None` when TLS is off.
    pub fn peer_config(&self) -> Result<Option<ClientTls>, TlsError> {
        self.validate()?;
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return Ok(None);
        };
        // Without a CA, peers are checked against the node's own chain:
        // errors about that file then name `tls.cert`, which gave it.
        let names = match &self.ca {
            Some(_) => NODE_NAMES,
            None => [NODE_NAMES[1], NODE_NAMES[1], NODE_NAMES[2]],
        };
        let ca = self.ca.as_deref().unwrap_or(cert);
        ClientTls::with_names(ca, Some((cert, key)), names).map(Some)
    }
}

/// A client's TLS: the CA it trusts, and optionally its own certificate.
#[derive(Clone, Debug)]
pub struct ClientTls {
    pub config: Arc<ClientConfig>,
}

/// The same configuration (settings compare equal when they share it).
impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
    }
}

impl Eq for ClientTls {}

impl ClientTls {
    /// Trusts the certificates in `ca`; presents `cert` and `key` when
    /// given (nodes that require client certificates).
    pub fn new(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<ClientTls, TlsError> {
        ClientTls::with_names(ca, identity, NODE_NAMES)
    }

    /// `new`, with `names` for the CA, the certificate and the key as the
    /// caller calls them (flags, keyword arguments), for the errors.
    fn with_names(
        ca: &Path,
        identity: Option<(&Path, &Path)>,
        names: [&str; 3],
    ) -> Result<ClientTls, TlsError> {
        let [ca_name, cert_name, key_name] = names;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots(ca_name, ca)?);
        let config = match identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(load_certs(cert_name, cert)?, load_key(key_name, key)?)
                .map_err(|e| {
                    TlsError::Config(format!("client certificate {}: {e}", cert.display()))
                })?,
            None => builder.with_no_client_auth(),
        };
        Ok(ClientTls {
            config: Arc::new(config),
        })
    }

    /// From optional file names as a user gives them (flags, keyword
    /// arguments): none is plaintext, a CA alone trusts the nodes, a CA
    /// with a certificate and key also presents them. `names` are how the
    /// caller calls the three, for the errors.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        names: [&str; 3],
    ) -> Result<Option<ClientTls>, TlsError> {
        let [ca_name, cert_name, key_name] = names;
        match (ca, cert, key) {
            (None, None, None) => Ok(None),
            (Some(ca), None, None) => ClientTls::with_names(ca, None, names).map(Some),
            (Some(ca), Some(c), Some(k)) => ClientTls::with_names(ca, Some((c, k)), names).map(Some),
            (None, _, _) => Err(TlsError::Config(format!(
                "{cert_name} and {key_name} need {ca_name} (the CA that signed the nodes' certificates)"
            ))),
            _ => Err(TlsError::Config(format!(
                "{cert_name} and {key_name} go together"
            ))),
        }
    }

    /// The name a node's certificate must carry: its IP address, or the
    /// host name it was reached by.
    pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
        ServerName::try_from(host.to_string()).map_err(|e| {
            TlsError::Config(format!(
                "{host:?} cannot be checked against a certificate: {e}"
            ))
        })
    }
}

#[cfg(test)]
mod tests;
