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
        let mut s = accept(server, a).await?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).await?;
        s.write_all(&buf).await?;
        s.flush().await?;
        Ok::<_, std::io::Error>(())
    });
    let name = ClientTls::server_name("127.0.0.1").unwrap();
    let r = async {
        let mut c = connect(client.config, name, b).await?;
        c.write_all(b"hello").await?;
        c.flush().await?;
        let mut buf = [0u8; 5];
        c.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"hello");
        Ok::<_, std::io::Error>(())
    }
    .await
    .map_err(|e| match client_hint(&e) {
        Some(hint) => format!("{e} ({hint})"),
        None => e.to_string(),
    });
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
    // Without a certificate: refused, and the client is told what to pass.
    let anon = ClientTls::new(&pki.ca, None).unwrap();
    let e = rt().block_on(exchange(server.clone(), anon)).unwrap_err();
    assert!(e.contains("pass --tls-cert and --tls-key"), "{e}");
    // With one from another CA: refused, saying whose CA it must be.
    let stranger = ClientTls::new(&pki.ca, Some((&other.client_cert, &other.client_key))).unwrap();
    let e = rt()
        .block_on(exchange(server.clone(), stranger))
        .unwrap_err();
    assert!(e.contains("signed by the CA the node trusts"), "{e}");
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

/// Errors about a file name the setting or flag that gave it: a client's
/// `--tls-ca` is not a node's `tls.ca`, and a node without `tls.ca`
/// checks its peers against its `tls.cert`.
#[test]
fn file_errors_name_the_flag_or_setting_that_gave_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_dev_pki(dir.path(), 1, Validity::default()).unwrap();
    let missing = dir.path().join("missing.pem");
    let names = ["--tls-ca", "--tls-cert", "--tls-key"];
    let e = ClientTls::from_files(Some(&missing), None, None, names)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--tls-ca "), "{e}");
    let e = ClientTls::from_files(Some(&pki.ca), Some(&missing), Some(&pki.client_key), names)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--tls-cert "), "{e}");
    let e = ClientTls::from_files(Some(&pki.ca), Some(&pki.client_cert), Some(&missing), names)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--tls-key "), "{e}");
    // A node's certificate file that holds none, no CA set: its peers'
    // check reads the certificate file, and says so.
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "listen = 1\n").unwrap();
    let e = NodeTls {
        cert: Some(not_pem),
        key: Some(pki.nodes[0].1.clone()),
        ..Default::default()
    }
    .peer_config()
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("tls.cert "), "{e}");
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

/// A node and a client over an in-memory pipe of `cap` bytes, past the
/// handshake.
async fn pair(
    cap: usize,
) -> (
    ServerStream<tokio::io::DuplexStream>,
    ClientStream<tokio::io::DuplexStream>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_dev_pki(dir.path(), 1, Validity::default()).unwrap();
    let server = node(&pki, false).server_config().unwrap().unwrap();
    let client = ClientTls::new(&pki.ca, None).unwrap();
    let (a, b) = tokio::io::duplex(cap);
    let srv = tokio::spawn(accept(server, a));
    let name = ClientTls::server_name("127.0.0.1").unwrap();
    let c = connect(client.config, name, b).await.unwrap();
    (srv.await.unwrap().unwrap(), c, dir)
}

/// Deterministic sizes for the stream tests (xorshift).
fn sizes(seed: u64, n: usize, max: usize) -> Vec<usize> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % max as u64) as usize + 1
        })
        .collect()
}

#[test]
fn messages_of_every_size_cross_whole_both_ways() {
    // Vectored writes of a small header and a value (the shape of every
    // Sluice frame), values around the 16 KB record limit and far past
    // it, read back in small pieces so decrypted records are kept over.
    // The pipe holds 4 KB: writes and reads meet `Pending` all the time.
    rt().block_on(async {
        let (mut s, mut c, _dir) = pair(4096).await;
        let mut lens = vec![0, 1, 16383, 16384, 16385, 1 << 20];
        lens.extend(sizes(7, 40, 70_000));
        let msgs: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        let expect: Vec<u8> = msgs
            .iter()
            .flat_map(|m| {
                let mut v = (m.len() as u32).to_le_bytes().to_vec();
                v.extend_from_slice(m);
                v
            })
            .collect();
        let total = expect.len();
        let send = msgs.clone();
        let writer = tokio::spawn(async move {
            for m in &send {
                let head = (m.len() as u32).to_le_bytes();
                let mut slices = [std::io::IoSlice::new(&head), std::io::IoSlice::new(m)];
                let mut rest: &mut [std::io::IoSlice<'_>] = &mut slices;
                while !rest.is_empty() {
                    let n = c.write_vectored(rest).await?;
                    std::io::IoSlice::advance_slices(&mut rest, n);
                }
            }
            c.flush().await?;
            // And the node's echo comes back whole.
            let mut back = vec![0u8; total];
            c.read_exact(&mut back).await?;
            Ok::<_, std::io::Error>(back)
        });
        let mut got = Vec::with_capacity(total);
        let mut piece = vec![0u8; 3000];
        for (i, &n) in sizes(11, 1 << 16, 3000).iter().enumerate() {
            if got.len() == total {
                break;
            }
            let r = s.read(&mut piece[..n]).await.unwrap();
            assert!(
                r > 0,
                "end of stream after {} of {total} bytes (read {i})",
                got.len()
            );
            got.extend_from_slice(&piece[..r]);
        }
        assert_eq!(got.len(), total);
        assert!(got == expect, "the node read other bytes than were sent");
        s.write_all(&got).await.unwrap();
        s.flush().await.unwrap();
        let back = writer.await.unwrap().unwrap();
        assert!(back == expect, "the echo came back changed");
    });
}

#[test]
fn a_shutdown_ends_the_peers_reads_and_a_cut_connection_is_an_error() {
    rt().block_on(async {
        let (mut s, mut c, _dir) = pair(64 * 1024).await;
        c.write_all(b"last words").await.unwrap();
        c.shutdown().await.unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last words");
        // Nothing can be written after one's own shutdown.
        assert_eq!(
            c.write_all(b"more").await.unwrap_err().kind(),
            std::io::ErrorKind::BrokenPipe
        );

        // Dropped without close_notify: the reader learns it was cut.
        let (mut s, c, _dir) = pair(64 * 1024).await;
        drop(c);
        let e = s.read(&mut [0u8; 16]).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    });
}

/// A node's side of a handshake running over a pipe: the other end, for
/// a test to write anything into, and the handshake's outcome. Call
/// inside a runtime.
fn node_side() -> (
    tokio::io::DuplexStream,
    tokio::task::JoinHandle<std::io::Result<()>>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_dev_pki(dir.path(), 1, Validity::default()).unwrap();
    let server = node(&pki, false).server_config().unwrap().unwrap();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let srv = tokio::spawn(async move { accept(server, a).await.map(|_| ()) });
    (b, srv, dir)
}

#[test]
fn a_plaintext_peer_gets_an_alert_and_a_clear_error() {
    rt().block_on(async move {
        let (mut b, srv, _dir) = node_side();
        // A Sluice frame where a ClientHello belongs.
        b.write_all(b"SLCE\x01\x00\x00\x00\x10\x00\x00\x00hello in plain text")
            .await
            .unwrap();
        let mut back = Vec::new();
        b.read_to_end(&mut back).await.unwrap();
        let e = srv.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        // One fatal alert record (type 21), in the clear.
        assert_eq!(back.first(), Some(&21), "{back:?}");
        assert_eq!(back.get(5), Some(&2), "not a fatal alert: {back:?}");
    });
}

#[test]
fn a_record_changed_on_the_way_fails_every_read_after_it() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let pki = make_dev_pki(dir.path(), 1, Validity::default()).unwrap();
        let server = node(&pki, false).server_config().unwrap().unwrap();
        let client = ClientTls::new(&pki.ca, None).unwrap();
        // client <-> relay <-> node; the relay flips one bit of what the
        // client sends once `tamper` is set.
        let (ca, mut cr) = tokio::io::duplex(64 * 1024);
        let (sa, mut sr) = tokio::io::duplex(64 * 1024);
        let tamper = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let t = tamper.clone();
        tokio::spawn(async move {
            let (mut cr_r, mut cr_w) = tokio::io::split(&mut cr);
            let (mut sr_r, mut sr_w) = tokio::io::split(&mut sr);
            let up = async {
                let mut b = vec![0u8; 64 * 1024];
                loop {
                    let n = cr_r.read(&mut b).await?;
                    if n == 0 {
                        return Ok::<_, std::io::Error>(());
                    }
                    if t.load(std::sync::atomic::Ordering::SeqCst) {
                        b[n - 1] ^= 1;
                    }
                    sr_w.write_all(&b[..n]).await?;
                }
            };
            let down = tokio::io::copy(&mut sr_r, &mut cr_w);
            let _ = tokio::join!(up, down);
        });
        let srv = tokio::spawn(accept(server, sa));
        let name = ClientTls::server_name("127.0.0.1").unwrap();
        let mut c = connect(client.config, name, ca).await.unwrap();
        let mut s = srv.await.unwrap().unwrap();
        c.write_all(b"intact").await.unwrap();
        c.flush().await.unwrap();
        let mut b = [0u8; 6];
        s.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"intact");
        tamper.store(true, std::sync::atomic::Ordering::SeqCst);
        c.write_all(b"changed").await.unwrap();
        c.flush().await.unwrap();
        for _ in 0..3 {
            let e = s.read(&mut b).await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
            assert!(e.to_string().contains("decrypt"), "{e}");
        }
        assert!(s.write_all(b"x").await.is_err());
    });
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever a stranger sends where a handshake belongs, in whatever
    /// pieces, the node's side ends with an error (or waits for more
    /// bytes) and never panics.
    #[test]
    fn any_bytes_before_a_handshake_fail_cleanly(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600), 1..6),
        as_tls in proptest::prelude::any::<bool>(),
    ) {
        rt().block_on(async move {
            let (mut b, srv, _dir) = node_side();
            for (i, mut c) in chunks.into_iter().enumerate() {
                // Half the cases look like TLS records (handshake type,
                // TLS 1.2 version, a length), so rustls goes past its
                // first check.
                if as_tls && i == 0 && c.len() >= 5 {
                    let n = (c.len() - 5) as u16;
                    c[..5].copy_from_slice(&[22, 3, 3, (n >> 8) as u8, n as u8]);
                }
                if b.write_all(&c).await.is_err() {
                    break;
                }
            }
            drop(b);
            let r = srv.await.expect("the node's side panicked");
            proptest::prop_assert!(r.is_err());
            Ok(())
        })?;
    }

    /// Bytes injected into an established connection: the reader gets an
    /// error, every later call too, and nothing panics.
    #[test]
    fn any_bytes_after_a_handshake_fail_cleanly(
        junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..2000),
        as_record in proptest::prelude::any::<bool>(),
    ) {
        rt().block_on(async move {
            // The node reads what the client's raw side sends.
            let dir = tempfile::tempdir().unwrap();
            let pki = make_dev_pki(dir.path(), 1, Validity::default()).unwrap();
            let server = node(&pki, false).server_config().unwrap().unwrap();
            let client = ClientTls::new(&pki.ca, None).unwrap();
            let (a, b) = tokio::io::duplex(64 * 1024);
            let srv = tokio::spawn(accept(server, a));
            let name = ClientTls::server_name("127.0.0.1").unwrap();
            let c = connect(client.config, name, b).await.unwrap();
            let mut s = srv.await.unwrap().unwrap();
            let mut raw = c.into_io();
            let mut junk = junk;
            if as_record && junk.len() >= 5 {
                // An application-data record header in front of the junk.
                let n = (junk.len() - 5) as u16;
                junk[..5].copy_from_slice(&[23, 3, 3, (n >> 8) as u8, n as u8]);
            }
            raw.write_all(&junk).await.unwrap();
            drop(raw);
            let mut buf = [0u8; 64];
            let first = s.read(&mut buf).await;
            proptest::prop_assert!(first.is_err(), "{first:?}");
            proptest::prop_assert!(s.read(&mut buf).await.is_err());
            Ok(())
        })?;
    }
}

#[test]
fn written_bytes_leave_without_a_flush() {
    // Like a TCP stream: what `write` accepted is on its way; `flush` is
    // not needed for the peer to get it.
    rt().block_on(async {
        let (mut s, mut c, _dir) = pair(64 * 1024).await;
        c.write_all(b"no flush").await.unwrap();
        let mut b = [0u8; 8];
        tokio::time::timeout(std::time::Duration::from_secs(5), s.read_exact(&mut b))
            .await
            .expect("the bytes stayed in the writer's buffer")
            .unwrap();
        assert_eq!(&b, b"no flush");
    });
}

#[test]
fn key_updates_from_either_side_keep_the_stream_whole() {
    // After a key update the first record with new keys must follow the
    // key update message, on both sides (the answering side's update is
    // made while it seals its next write).
    rt().block_on(async {
        let (mut s, mut c, _dir) = pair(64 * 1024).await;
        for round in 0..3u8 {
            if round % 2 == 0 {
                c.update_keys().await.unwrap();
            } else {
                s.update_keys().await.unwrap();
            }
            let msg = vec![round; 20_000];
            c.write_all(&msg).await.unwrap();
            c.flush().await.unwrap();
            let mut got = vec![0u8; msg.len()];
            s.read_exact(&mut got).await.unwrap();
            assert!(got == msg, "round {round}: the node read other bytes");
            s.write_all(&msg).await.unwrap();
            s.flush().await.unwrap();
            c.read_exact(&mut got).await.unwrap();
            assert!(got == msg, "round {round}: the client read other bytes");
        }
    });
}

#[test]
fn a_handshake_message_of_the_largest_size_is_read_whole_then_judged() {
    // A ClientHello of 64 KB (TLS's handshake length field allows 16 MB;
    // rustls takes up to 64 KB) arriving in full records: more than the
    // 64 KB receive buffer once joined with its record headers, so the
    // buffer grows to hold it; its bytes are junk, so the node's side
    // then fails cleanly.
    rt().block_on(async move {
        let (mut b, srv, _dir) = node_side();
        let body = 0xffff;
        let mut msg = vec![1u8, 0x00, 0xff, 0xff];
        msg.extend((0..body).map(|i| (i % 251) as u8));
        for chunk in msg.chunks(16 * 1024) {
            let n = chunk.len() as u16;
            let mut rec = vec![22u8, 3, 3, (n >> 8) as u8, n as u8];
            rec.extend_from_slice(chunk);
            if b.write_all(&rec).await.is_err() {
                break;
            }
        }
        let e = tokio::time::timeout(std::time::Duration::from_secs(5), srv)
            .await
            .expect("the node's side waited for more")
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        // rustls judged the message: it was read whole.
        assert!(!e.to_string().contains("longer than"), "{e}");
    });
}

#[test]
fn a_nodes_tls_section_names_its_own_files_and_asks_for_mutual_tls() {
    let pki = DevPki::at(std::path::Path::new("/ca-dir"), 2);
    let s = pki.node_section(1).unwrap();
    let cfg: toml::Value = toml::from_str(&s).unwrap();
    let t = &cfg["tls"];
    assert_eq!(t["cert"].as_str(), Some("/ca-dir/node-1.pem"));
    assert_eq!(t["key"].as_str(), Some("/ca-dir/node-1-key.pem"));
    assert_eq!(t["ca"].as_str(), Some("/ca-dir/ca.pem"));
    assert_eq!(t["require_client_cert"].as_bool(), Some(true));
    // As the node config reads it.
    let n: NodeTls = toml::from_str(&toml::to_string(t).unwrap()).unwrap();
    assert!(n.require_client_cert && n.enabled());
    assert_eq!(pki.node_section(2), None);
}
