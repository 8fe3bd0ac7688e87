//! A local certificate authority for `sluice dev --tls` and tests: a CA,
//! one certificate per node (for 127.0.0.1 and localhost, usable both to
//! serve and to connect to peers) and one client certificate, as PEM files.

use crate::TlsError;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// The common name of the development client certificate: the principal
/// a client presenting it acts as.
pub const DEV_CLIENT_NAME: &str = "sluice-client";

/// When the certificates are valid, relative to now.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    pub from_days: i64,
    pub to_days: i64,
}

impl Default for Validity {
    /// From a day ago (clock skew) for a year.
    fn default() -> Self {
        Validity {
            from_days: -1,
            to_days: 365,
        }
    }
}

/// Where `make_dev_pki` writes its files.
#[derive(Clone, Debug)]
pub struct DevPki {
    pub ca: PathBuf,
    /// Per node: (certificate, key).
    pub nodes: Vec<(PathBuf, PathBuf)>,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl DevPki {
    /// The files of a development CA for `nodes` nodes in `dir` (whether
    /// or not they exist yet).
    pub fn at(dir: &Path, nodes: u32) -> DevPki {
        DevPki {
            ca: dir.join("ca.pem"),
            nodes: (0..nodes)
                .map(|i| {
                    (
                        dir.join(format!("node-{i}.pem")),
                        dir.join(format!("node-{i}-key.pem")),
                    )
                })
                .collect(),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client-key.pem"),
        }
    }

    /// Node `id`'s `[tls]` section for its config file: its certificate
    /// and key, the CA, and mutual TLS (clients and peers alike present a
    /// certificate from the CA). `None` for a node it has no certificate
    /// for.
    pub fn node_section(&self, id: u32) -> Option<String> {
        let (cert, key) = self.nodes.get(id as usize)?;
        Some(format!(
            "\n[tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\nrequire_client_cert = true\n",
            cert.display(),
            key.display(),
            self.ca.display()
        ))
    }

    /// Whether every file is there (a CA made earlier can be used again).
    pub fn complete(&self) -> bool {
        std::iter::once(&self.ca)
            .chain(self.nodes.iter().flat_map(|(c, k)| [c, k]))
            .chain([&self.client_cert, &self.client_key])
            .all(|p| p.exists())
    }
}

fn gen_err(e: rcgen::Error) -> TlsError {
    TlsError::Config(format!("generating a certificate: {e}"))
}

fn write(path: &Path, text: &str) -> Result<(), TlsError> {
    std::fs::write(path, text).map_err(|e| TlsError::File {
        what: "writing".into(),
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// A private key: readable by its owner only.
fn write_key(path: &Path, text: &str) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| TlsError::File {
            what: "writing".into(),
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// Writes a CA, `nodes` node certificates and a client certificate into
/// `dir` (`ca.pem`, `node-<i>.pem`/`node-<i>-key.pem`, `client.pem`/
/// `client-key.pem`). `leaf` sets the node and client certificates'
/// validity (tests make expired ones); the CA is valid for as long.
pub fn make_dev_pki(dir: &Path, nodes: u32, leaf: Validity) -> Result<DevPki, TlsError> {
    std::fs::create_dir_all(dir).map_err(|e| TlsError::File {
        what: "creating".into(),
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    let now = OffsetDateTime::now_utc();
    let when = |p: &mut CertificateParams| {
        p.not_before = now + Duration::days(leaf.from_days);
        p.not_after = now + Duration::days(leaf.to_days);
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "Sluice development CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = now + Duration::days(leaf.from_days.min(-1));
    ca.not_after = now + Duration::days(leaf.to_days.max(365));
    let ca_key = KeyPair::generate().map_err(gen_err)?;
    let issuer = CertifiedIssuer::self_signed(ca, ca_key).map_err(gen_err)?;
    let files = DevPki::at(dir, nodes);
    write(&files.ca, &issuer.pem())?;
    let leaf_cert = |name: String| -> Result<(String, String), TlsError> {
        let mut p = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .map_err(gen_err)?;
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        when(&mut p);
        let key = KeyPair::generate().map_err(gen_err)?;
        let cert = p.signed_by(&key, &issuer).map_err(gen_err)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    for (i, (cp, kp)) in files.nodes.iter().enumerate() {
        let (c, k) = leaf_cert(format!("sluice-node-{i}"))?;
        write(cp, &c)?;
        write_key(kp, &k)?;
    }
    let (c, k) = leaf_cert(DEV_CLIENT_NAME.into())?;
    write(&files.client_cert, &c)?;
    write_key(&files.client_key, &k)?;
    Ok(files)
}
