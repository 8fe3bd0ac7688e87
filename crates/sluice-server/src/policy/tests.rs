use super::*;
use bytes::Bytes;
use sluice_types::policy::TokenPrincipal;
use sluice_wire::Request;

/// One request of every kind, with what it needs: the table the access
/// check is tested against.
fn every_request() -> Vec<(Request, Option<(Perm, &'static str)>)> {
    let mut v = data_requests();
    v.extend(control_requests());
    v
}

/// The handshake and the requests about keys.
fn data_requests() -> Vec<(Request, Option<(Perm, &'static str)>)> {
    use Perm::*;
    let key = || "/p/k".to_string();
    vec![
        (
            Request::Hello {
                protocol_version: 1,
                client_name: "t".into(),
                token: None,
            },
            None,
        ),
        (
            Request::PeerAuth {
                node: 1,
                key: "k".into(),
            },
            None,
        ),
        (Request::Ping, None),
        (
            Request::Put {
                key: key(),
                shard: None,
                expected: None,
                value: Bytes::from_static(b"v"),
                trace: None,
                req_id: None,
            },
            Some((Write, "/p/k")),
        ),
        (
            Request::TriggerPut {
                key: key(),
                shard: None,
                value: Bytes::new(),
                trace: None,
                origin: None,
            },
            Some((Trigger, "/p/k")),
        ),
        (
            Request::Remove {
                key: key(),
                shard: None,
                expected: None,
                req_id: None,
            },
            Some((Write, "/p/k")),
        ),
        (
            Request::Get {
                key: key(),
                shard: None,
                version: None,
                min_version: None,
                linearizable: false,
            },
            Some((Read, "/p/k")),
        ),
        (
            Request::GetByTime {
                key: key(),
                shard: None,
                timestamp_us: 1,
                wait_ms: 0,
                unstable: false,
            },
            Some((Read, "/p/k")),
        ),
        (
            Request::GetSize {
                key: key(),
                shard: None,
                version: None,
                timestamp_us: None,
            },
            Some((Read, "/p/k")),
        ),
        (
            Request::ListKeys {
                pool: "/p".into(),
                prefix: None,
                shard: None,
                after: None,
            },
            Some((Read, "/p")),
        ),
        (
            Request::MultiGet {
                shard: None,
                keys: vec![key(), "/p/j".into()],
            },
            Some((Read, "/p/k")),
        ),
    ]
}

/// The rest of the table: pools, watches, graphs, node and cluster
/// commands, policies.
fn control_requests() -> Vec<(Request, Option<(Perm, &'static str)>)> {
    use Perm::*;
    let key = || "/p/k".to_string();
    vec![
        (
            Request::PoolCreate {
                spec: sluice_types::PoolSpec {
                    pathname: "/p/new".into(),
                    ..Default::default()
                },
                req_id: None,
            },
            Some((Admin, "/p/new")),
        ),
        (
            Request::PoolRemove {
                path: "/p".into(),
                req_id: None,
            },
            Some((Admin, "/p")),
        ),
        (
            Request::PoolPurge {
                path: "/p".into(),
                req_id: None,
            },
            Some((Admin, "/p")),
        ),
        (
            Request::PoolList {
                include_deleted: false,
            },
            None,
        ),
        (Request::PoolGet { path: "/p".into() }, None),
        (Request::PoolOfKey { key: key() }, None),
        (
            Request::Watch {
                prefix: "/p".into(),
                from: None,
            },
            Some((Watch, "/p")),
        ),
        (Request::Unwatch { watch_id: 1 }, None),
        (Request::Stats, Some((Admin, "/"))),
        (Request::DfgApply { text: "{}".into() }, Some((Admin, "/"))),
        (Request::DfgList, Some((Admin, "/"))),
        (
            Request::DfgRemove {
                id: "g".into(),
                req_id: None,
            },
            Some((Admin, "/")),
        ),
        (
            Request::History {
                key: key(),
                shard: None,
                by_time: false,
                from: 0,
                to: 1,
                limit: 1,
            },
            Some((Read, "/p/k")),
        ),
        (
            Request::ListKeysAt {
                pool: "/p".into(),
                prefix: None,
                by_time: false,
                at: 1,
                after: Some("/p/a".into()),
            },
            Some((Read, "/p")),
        ),
        // Consensus messages are refused to clients by the peer check.
        (
            Request::Raft {
                from: 1,
                group: 0,
                kind: 0,
                body: Bytes::new(),
                more: vec![],
            },
            None,
        ),
        (
            Request::Cluster {
                command: r#"{"op":"status"}"#.into(),
            },
            None,
        ),
        (
            Request::Cluster {
                command: r#"{"op":"add_member","shard":"x","node":1}"#.into(),
            },
            Some((Admin, "/")),
        ),
        (
            Request::Policy {
                command: r#"{"op":"ls"}"#.into(),
                req_id: None,
            },
            None,
        ),
        (
            Request::Policy {
                command: r#"{"op":"rm","name":"x"}"#.into(),
                req_id: None,
            },
            Some((Admin, "/")),
        ),
    ]
}

fn state() -> PolicyState {
    PolicyState::clustered(audit::Audit::default())
}

fn doc(rules: &[(&str, Rule)]) -> Policies {
    let mut p = Policies::default();
    for (n, r) in rules {
        p.apply(PolicyChange::SetRule {
            name: n.to_string(),
            rule: r.clone(),
        })
        .unwrap();
    }
    p
}

fn access(who: &str, pool: &str, allow: &[Perm]) -> Rule {
    Rule::Access {
        who: Who::parse(who).unwrap(),
        pool: pool.into(),
        allow: allow.to_vec(),
    }
}

fn get(key: &str) -> Request {
    Request::get_latest(key)
}

fn bob() -> Principal {
    Principal {
        name: "bob".into(),
        via: Via::Certificate,
        token_sha256: None,
    }
}

#[test]
fn the_table_covers_every_request_kind() {
    let kinds: std::collections::BTreeSet<u8> =
        every_request().iter().map(|(r, _)| r.opcode()).collect();
    // Opcodes 0x01..=0x1C are the requests.
    assert_eq!(kinds, (0x01..=sluice_wire::op::POLICY).collect());
}

#[test]
fn every_request_is_refused_without_the_permission_it_needs_and_runs_with_it() {
    let st = state();
    // Access control on (a rule for someone else): bob may do nothing.
    st.install(doc(&[("other", access("carol", "/", &Perm::ALL))]));
    let p = bob();
    let v = st.view(&p);
    for (req, need) in every_request() {
        let r = v.admit(&p, &req, 0, |_| Some("/p".into()));
        match (need, r) {
            (None, Admit::Run) => {}
            (
                Some((perm, _)),
                Admit::Refuse(SluiceError::PermissionDenied {
                    principal,
                    op,
                    pool,
                    perm: named,
                }),
            ) => {
                assert_eq!(principal, "bob");
                assert_eq!(op, req.name());
                assert_eq!(pool, "/p", "{op}");
                assert_eq!(named, perm.name(), "{op}");
            }
            (need, _) => panic!("{}: needs {need:?}, got another answer", req.name()),
        }
    }
    // Granted exactly what each needs (on a scope covering its path), it
    // runs; granted every other permission, it is still refused.
    for (req, need) in every_request() {
        let Some((perm, path)) = need else { continue };
        let scope = if path == "/" { "/" } else { "/p" };
        st.install(doc(&[("r", access("bob", scope, &[perm]))]));
        let v = st.view(&p);
        assert!(
            matches!(v.admit(&p, &req, 0, |_| None), Admit::Run),
            "{} with {perm:?}",
            req.name()
        );
        let others: Vec<Perm> = Perm::ALL.into_iter().filter(|x| *x != perm).collect();
        st.install(doc(&[("r", access("bob", "/", &others))]));
        let v = st.view(&p);
        assert!(
            matches!(v.admit(&p, &req, 0, |_| None), Admit::Refuse(_)),
            "{} without {perm:?}",
            req.name()
        );
    }
}

#[test]
fn scopes_roles_and_anyone() {
    let st = state();
    let mut d = doc(&[
        ("ops", access("role:ops", "/logs", &[Perm::Read])),
        ("all", access("*", "/public", &[Perm::Read, Perm::Write])),
    ]);
    d.cert_roles.insert("bob".into(), vec!["ops".into()]);
    st.install(d);
    let p = bob();
    let v = st.view(&p);
    let ok = |k: &str| matches!(v.admit(&p, &get(k), 0, |_| None), Admit::Run);
    assert!(ok("/logs/a"));
    assert!(ok("/public/x"));
    assert!(!ok("/logsx/a"), "scopes end on a segment boundary");
    assert!(!ok("/private/a"));
    // Every key of a multi-get must be allowed.
    let mg = |keys: &[&str]| Request::MultiGet {
        shard: None,
        keys: keys.iter().map(|k| k.to_string()).collect(),
    };
    assert!(matches!(
        v.admit(&p, &mg(&["/logs/a", "/public/b"]), 0, |_| None),
        Admit::Run
    ));
    match v.admit(&p, &mg(&["/logs/a", "/private/b"]), 0, |_| None) {
        Admit::Refuse(SluiceError::PermissionDenied { pool, .. }) => assert_eq!(pool, "/private/b"),
        _ => panic!("a multi-get with one key out of scope must be refused"),
    }
}

#[test]
fn tokens_authenticate_and_revocation_ends_them() {
    let st = state();
    let token = sluice_tls::new_token().unwrap();
    let mut d = Policies::default();
    d.apply(PolicyChange::AddToken {
        name: "alice".into(),
        principal: TokenPrincipal {
            token_sha256: sluice_tls::token_sha256(&token),
            roles: vec!["ops".into()],
            created_us: 0,
        },
    })
    .unwrap();
    st.install(d.clone());
    let p = st.authenticate(Some(&token), None).unwrap();
    assert_eq!((p.name.as_str(), p.via), ("alice", Via::Token));
    assert!(matches!(
        st.authenticate(Some("slt_wrong"), None),
        Err(SluiceError::Unauthenticated { .. })
    ));
    // A token wins over a certificate; a certificate over nothing.
    assert_eq!(st.authenticate(None, Some("bob")).unwrap().name, "bob");
    assert_eq!(st.authenticate(None, None).unwrap().name, ANONYMOUS);
    let v = st.view(&p);
    assert!(matches!(
        v.admit(&p, &Request::Stats, 0, |_| None),
        Admit::Run
    ));
    d.apply(PolicyChange::RevokeToken {
        name: "alice".into(),
    })
    .unwrap();
    st.install(d.clone());
    assert!(v.stale(&st));
    let v = st.view(&p);
    assert!(matches!(
        v.admit(&p, &Request::Stats, 0, |_| None),
        Admit::Refuse(SluiceError::Unauthenticated { .. })
    ));
    // Required authentication: anonymous may finish the handshake only.
    d.apply(PolicyChange::RequireAuth { on: true }).unwrap();
    st.install(d);
    let anon = Principal::anonymous();
    let v = st.view(&anon);
    assert!(matches!(
        v.admit(&anon, &Request::Ping, 0, |_| None),
        Admit::Run
    ));
    assert!(matches!(
        v.admit(
            &anon,
            &Request::PoolList {
                include_deleted: false
            },
            0,
            |_| None
        ),
        Admit::Refuse(SluiceError::Unauthenticated { .. })
    ));
}

#[test]
fn rate_limits_delay_then_refuse_and_apply_per_pool() {
    let st = state();
    st.install(doc(&[(
        "slow",
        Rule::Rate {
            who: Who::Anyone,
            pool: Some("/p".into()),
            ops_per_s: Some(2),
            bytes_per_s: None,
            max_delay_ms: 600,
        },
    )]));
    let p = bob();
    let v = st.view(&p);
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(match v.admit(&p, &get("/p/a"), 0, |_| None) {
            Admit::Run => "run".to_string(),
            Admit::After(d) => format!("after {}", (d.as_millis() + 50) / 100 * 100),
            Admit::Refuse(SluiceError::RateLimited {
                policy,
                retry_after_ms,
                ..
            }) => format!("refuse {policy} {}", (retry_after_ms + 50) / 100 * 100),
            Admit::Refuse(e) => format!("{e}"),
        });
    }
    assert_eq!(answers, ["run", "run", "after 500", "refuse slow 400"]);
    // Keys outside the policy's pool are not counted.
    for _ in 0..10 {
        assert!(matches!(v.admit(&p, &get("/q/a"), 0, |_| None), Admit::Run));
    }
    // Another view of the same principal shares the bucket; a change to
    // the policy starts a fresh one.
    let v2 = st.view(&p);
    assert!(matches!(
        v2.admit(&p, &get("/p/a"), 0, |_| None),
        Admit::Refuse(_)
    ));
    st.install(doc(&[(
        "slow",
        Rule::Rate {
            who: Who::Anyone,
            pool: Some("/p".into()),
            ops_per_s: Some(3),
            bytes_per_s: None,
            max_delay_ms: 0,
        },
    )]));
    let v3 = st.view(&p);
    assert!(matches!(
        v3.admit(&p, &get("/p/a"), 0, |_| None),
        Admit::Run
    ));
}

#[test]
fn standalone_changes_are_kept_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let st = PolicyState::standalone(dir.path(), audit::Audit::default()).unwrap();
    st.apply_local(PolicyChange::SetRule {
        name: "r".into(),
        rule: access("*", "/", &[Perm::Read]),
    })
    .unwrap()
    .unwrap();
    assert!(st
        .apply_local(PolicyChange::RemoveRule {
            name: "nope".into()
        })
        .unwrap()
        .is_err());
    let again = PolicyState::standalone(dir.path(), audit::Audit::default()).unwrap();
    assert_eq!(again.current().doc, st.current().doc);
    assert!(again.current().doc.access_control_on());
    std::fs::write(dir.path().join("policies.json"), "{not json").unwrap();
    let e = PolicyState::standalone(dir.path(), audit::Audit::default())
        .err()
        .unwrap();
    assert!(e.contains("policies.json"), "{e}");
}

#[test]
fn may_answers_as_admit_does_for_access() {
    // `View::may` decides whether a large trigger put's bytes may go into
    // a lambda's memory before the request is admitted: it must never say
    // yes where `admit` would refuse.
    let st = state();
    let p = bob();
    let trigger = |k: &str| Request::TriggerPut {
        key: k.into(),
        shard: None,
        value: Bytes::new(),
        trace: None,
        origin: None,
    };
    let agree = |v: &View, k: &str| {
        let admitted = matches!(v.admit(&p, &trigger(k), 0, |_| None), Admit::Run);
        assert_eq!(v.may(Perm::Trigger, k), admitted, "{k}");
        admitted
    };
    assert!(agree(&st.view(&p), "/anything/k"), "open: no policies");
    st.install(doc(&[("t", access("bob", "/trig", &[Perm::Trigger]))]));
    let v = st.view(&p);
    assert!(agree(&v, "/trig/a"));
    assert!(!agree(&v, "/trigx/a"));
    assert!(!agree(&v, "/other/a"));
    assert!(!v.may(Perm::Read, "/trig/a"), "only the permission granted");
    st.install(doc(&[(
        "w",
        access("bob", "/", &[Perm::Write, Perm::Read]),
    )]));
    assert!(!agree(&st.view(&p), "/trig/a"), "write is not trigger");
}
