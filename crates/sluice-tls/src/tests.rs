use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn node(pki: &DevPki, require_client_cert: bool) -> NodeTls {
    NodeTls {
        cert: Some(pki.nodes[0].0.clone()),
        key: Some(pki.nodes[0].1.clone()),
        ca: Some(pki.ca.clone()),
        require_client_cert,
    }
}

/// A handshake and one echoed message over an in-memory pipe: the
/// client's outcome (`Err` with the error's text).
async fn exchange(server: Arc<ServerConfig>, client: ClientTls) -> Result<(), String> {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let srv = tokio::spawn(async move {
        let mut s = tokio_rustls::TlsAcceptor::from(server).accept(a).await?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).await?;
        s.write_all(&buf).await?;
        s.flush().await?;
        Ok::<_, std::io::Error>(())
    });
    let name = ClientTls::server_name("127.0.0.1").unwrap();
    let r = async {
        let mut c = tokio_rustls::TlsConnector::from(client.config)
            .connect(name, b)
            .await?;
        c.write_all(b"hello").await?;
        c.flush().await?;
        let mut buf = [0u8; 5];
        c.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"hello");
        Ok::<_, std::io::Error>(())
    }
    .await
    .map_err(|e| e.to_string());
    let s = srv.await.unwrap();
    r.and(s.map_err(|e| format!("server: {e}")))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_client_trusting_the_ca_talks_to_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_dev_pki(dir.path(), 1, Validity::default()).unwrap();
    let server = node(&pki, false).server_config().unwrap().unwrap();
    let client = ClientTls::new(&pki.ca, None).unwrap();
    rt().block_on(exchange(server, client)).unwrap();
    // Keys are for their owner only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&pki.nodes[0].1)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_wrong_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_dev_pki(&dir.path().join("a"), 1, Validity::default()).unwrap();
    let other = make_dev_pki(&dir.path().join("b"), 1, Validity::default()).unwrap();
    let server = node(&pki, false).server_config().unwrap().unwrap();
    let client = ClientTls::new(&other.ca, None).unwrap();
    let e = rt().block_on(exchange(server, client)).unwrap_err();
    assert!(e.contains("invalid peer certificate"), "{e}");
}

#[test]
fn an_expired_certificate_is_refused_as_expired() {
    let dir = tempfile::tempdir().unwrap();
    let expired = Validity {
        from_days: -30,
        to_days: -1,
    };
    let pki = make_dev_pki(dir.path(), 1, expired).unwrap();
    let server = node(&pki, false).server_config().unwrap().unwrap();
    let client = ClientTls::new(&pki.ca, None).unwrap();
    let e = rt().block_on(exchange(server, client)).unwrap_err();
    assert!(e.contains("certificate expired"), "{e}");
}

#[test]
fn mutual_tls_needs_a_client_certificate_from_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_dev_pki(&dir.path().join("a"), 1, Validity::default()).unwrap();
    let other = make_dev_pki(&dir.path().join("b"), 1, Validity::default()).unwrap();
    let server = node(&pki, true).server_config().unwrap().unwrap();
    // Without a certificate: refused.
    let anon = ClientTls::new(&pki.ca, None).unwrap();
    assert!(rt().block_on(exchange(server.clone(), anon)).is_err());
    // With one from another CA: refused.
    let stranger = ClientTls::new(&pki.ca, Some((&other.client_cert, &other.client_key))).unwrap();
    assert!(rt().block_on(exchange(server.clone(), stranger)).is_err());
    // With the CA's client certificate: accepted; so is a peer node.
    let client = ClientTls::new(&pki.ca, Some((&pki.client_cert, &pki.client_key))).unwrap();
    rt().block_on(exchange(server.clone(), client)).unwrap();
    let peer = node(&pki, true).peer_config().unwrap().unwrap();
    rt().block_on(exchange(server, peer)).unwrap();
}

#[test]
fn settings_that_do_not_hang_together_are_refused_by_name() {
    let p = |s: &str| Some(PathBuf::from(s));
    let cases = [
        (
            NodeTls {
                cert: p("c"),
                ..Default::default()
            },
            "tls.key",
        ),
        (
            NodeTls {
                ca: p("ca"),
                ..Default::default()
            },
            "need tls.cert",
        ),
        (
            NodeTls {
                cert: p("c"),
                key: p("k"),
                require_client_cert: true,
                ..Default::default()
            },
            "needs tls.ca",
        ),
    ];
    for (t, want) in cases {
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    assert!(NodeTls::default().server_config().unwrap().is_none());
    let e = NodeTls {
        cert: p("/nonexistent/cert.pem"),
        key: p("/nonexistent/key.pem"),
        ..Default::default()
    }
    .server_config()
    .unwrap_err()
    .to_string();
    assert!(e.contains("tls.cert /nonexistent/cert.pem"), "{e}");
}

#[test]
fn client_files_as_given_are_plaintext_ca_only_or_an_identity() {
    let dir = tempfile::tempdir().unwrap();
    let files = DevPki::at(dir.path(), 2);
    assert!(!files.complete());
    let pki = make_dev_pki(dir.path(), 2, Validity::default()).unwrap();
    assert!(files.complete());
    assert_eq!(pki.nodes, files.nodes);
    let names = ["--ca", "--cert", "--key"];
    let (ca, c, k) = (
        Some(pki.ca.as_path()),
        Some(pki.client_cert.as_path()),
        Some(pki.client_key.as_path()),
    );
    assert!(ClientTls::from_files(None, None, None, names)
        .unwrap()
        .is_none());
    assert!(ClientTls::from_files(ca, None, None, names)
        .unwrap()
        .is_some());
    assert!(ClientTls::from_files(ca, c, k, names).unwrap().is_some());
    let e = ClientTls::from_files(None, c, k, names)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--cert and --key need --ca"), "{e}");
    let e = ClientTls::from_files(ca, c, None, names)
        .unwrap_err()
        .to_string();
    assert!(e.contains("go together"), "{e}");
}

#[test]
fn tokens_are_random_and_hash_stably() {
    let a = crate::new_token().unwrap();
    let b = crate::new_token().unwrap();
    assert_ne!(a, b);
    assert!(a.starts_with("slt_") && a.len() == 4 + 64, "{a}");
    assert_eq!(crate::token_sha256(&a), crate::token_sha256(&a));
    assert_ne!(crate::token_sha256(&a), crate::token_sha256(&b));
    // The SHA-256 of "abc" (FIPS 180-2, appendix B.1).
    assert_eq!(
        crate::token_sha256("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn a_client_certificate_names_its_principal() {
    let dir = tempfile::tempdir().unwrap();
    let pki = crate::make_dev_pki(dir.path(), 1, crate::Validity::default()).unwrap();
    let certs = crate::load_certs("client", &pki.client_cert).unwrap();
    assert_eq!(
        crate::principal_of(&certs[0]).as_deref(),
        Some(crate::DEV_CLIENT_NAME)
    );
    let node = crate::load_certs("node", &pki.nodes[0].0).unwrap();
    assert_eq!(
        crate::principal_of(&node[0]).as_deref(),
        Some("sluice-node-0")
    );
    assert_eq!(
        crate::principal_of(&rustls::pki_types::CertificateDer::from(vec![1, 2, 3])),
        None
    );
}

#[test]
fn aes_128_gcm_is_preferred() {
    let p = crate::provider();
    assert_eq!(
        p.cipher_suites[0].suite(),
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
    );
    // Nothing was dropped: the other suites follow.
    assert_eq!(
        p.cipher_suites.len(),
        rustls::crypto::ring::default_provider().cipher_suites.len()
    );
}
