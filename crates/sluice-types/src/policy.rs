//! Policies on the data path (mRPC's model): who a connection is, what it
//! may do to which pool, how fast, and which requests go first. The
//! document lives in the metadata service (a cluster's metadata group, a
//! standalone node's data directory); every node enforces the copy it has
//! applied. This module is the document and its changes, with no I/O:
//! hashing tokens and enforcing rules belong to the node.

use crate::SluiceError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a request needs on a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Perm {
    /// Get, get by time, size, history, multi-get, key listings.
    Read,
    /// Put and remove.
    Write,
    /// Trigger put (runs lambdas, stores nothing).
    Trigger,
    /// Watch notifications under a prefix.
    Watch,
    /// Pool and data flow graph management, node statistics, policies.
    Admin,
}

impl Perm {
    pub const ALL: [Perm; 5] = [
        Perm::Read,
        Perm::Write,
        Perm::Trigger,
        Perm::Watch,
        Perm::Admin,
    ];

    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }

    pub fn name(self) -> &'static str {
        match self {
            Perm::Read => "read",
            Perm::Write => "write",
            Perm::Trigger => "trigger",
            Perm::Watch => "watch",
            Perm::Admin => "admin",
        }
    }
}

impl std::str::FromStr for Perm {
    type Err = SluiceError;
    fn from_str(s: &str) -> Result<Perm, SluiceError> {
        Perm::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                SluiceError::invalid_argument(
                    "permission",
                    format!("{s:?} (one of read, write, trigger, watch, admin)"),
                )
            })
    }
}

/// The longest principal, role or policy name.
pub const MAX_NAME_BYTES: usize = 128;

/// The longest wait a rate limit may impose: beyond it a request would be
/// held long after its client gave up (the clients' default timeout is
/// 10 s).
pub const MAX_DELAY_MS: u64 = 60_000;

/// A principal's or role's name: letters, digits and `- _ . @`, at most
/// `MAX_NAME_BYTES`.
fn plain_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!("names are at most {MAX_NAME_BYTES} bytes"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
    {
        return Err("names use letters, digits and - _ . @".into());
    }
    Ok(())
}

/// Whom a rule is about: one principal, everyone with a role, or anyone
/// (`*`, unauthenticated connections included). Written `alice`,
/// `role:ops`, `*`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Who {
    Principal(String),
    Role(String),
    Anyone,
}

impl Who {
    pub fn parse(s: &str) -> Result<Who, SluiceError> {
        if s == "*" {
            return Ok(Who::Anyone);
        }
        let (role, name) = match s.strip_prefix("role:") {
            Some(r) => (true, r),
            None => (false, s),
        };
        plain_name(name)
            .map_err(|why| SluiceError::invalid_argument("principal", format!("{s:?}: {why}")))?;
        Ok(if role {
            Who::Role(name.into())
        } else {
            Who::Principal(name.into())
        })
    }

    /// Checks the name of one built otherwise than by `parse` (a rule a
    /// client sent as JSON).
    pub fn check(&self) -> Result<(), SluiceError> {
        match self {
            Who::Anyone => Ok(()),
            Who::Principal(n) | Who::Role(n) => plain_name(n).map_err(|why| {
                SluiceError::invalid_argument("principal", format!("{self}: {why}"))
            }),
        }
    }

    /// Whether a connection authenticated as `principal` (with `roles`)
    /// is one this rule is about.
    pub fn covers(&self, principal: &str, roles: &[String]) -> bool {
        match self {
            Who::Anyone => true,
            Who::Principal(p) => p == principal,
            Who::Role(r) => roles.iter().any(|x| x == r),
        }
    }
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Who::Anyone => f.write_str("*"),
            Who::Principal(p) => f.write_str(p),
            Who::Role(r) => write!(f, "role:{r}"),
        }
    }
}

/// A named policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rule {
    /// Allows `who` the permissions `allow` on every pool at or under
    /// `pool` (`/`: all). Once any access rule exists, whatever no rule
    /// allows is refused (default deny).
    Access {
        who: Who,
        pool: String,
        allow: Vec<Perm>,
    },
    /// A token bucket per principal that `who` covers (per node): at most
    /// `ops_per_s` requests and `bytes_per_s` value bytes a second, with
    /// bursts of one second's worth. Over the limit a request waits up to
    /// `max_delay_ms`, then is refused with `RateLimited`. `pool`: count
    /// only requests on keys at or under it.
    Rate {
        who: Who,
        pool: Option<String>,
        ops_per_s: Option<u64>,
        bytes_per_s: Option<u64>,
        #[serde(default)]
        max_delay_ms: u64,
    },
    /// Global QoS (mRPC's small-first policy): a request whose value is at
    /// most `small_bytes`, or sent by a principal `priority` covers, goes
    /// ahead of bulk requests on the node; bulk requests yield their turn
    /// while latency-critical ones are waiting.
    Qos {
        small_bytes: u64,
        #[serde(default)]
        priority: Vec<Who>,
    },
}

impl Rule {
    /// Checks the fields (positive rates, paths that are paths).
    pub fn validate(&self) -> Result<(), SluiceError> {
        let bad = |what: &str, why: String| Err(SluiceError::invalid_argument(what, why));
        let path_ok = |p: &str| p.starts_with('/') && !p.contains("//");
        match self {
            Rule::Access { who, .. } | Rule::Rate { who, .. } => who.check()?,
            Rule::Qos { priority, .. } => priority.iter().try_for_each(Who::check)?,
        }
        match self {
            Rule::Access { pool, allow, .. } => {
                if !path_ok(pool) {
                    return bad("pool", format!("{pool:?} is not an absolute path"));
                }
                if allow.is_empty() {
                    return bad(
                        "allow",
                        "an access rule allows at least one permission".into(),
                    );
                }
            }
            Rule::Rate {
                pool,
                ops_per_s,
                bytes_per_s,
                max_delay_ms,
                ..
            } => {
                if *max_delay_ms > MAX_DELAY_MS {
                    return bad(
                        "max_delay_ms",
                        format!("{max_delay_ms} ms is over the most a request may be held, {MAX_DELAY_MS} ms (its client would have given up)"),
                    );
                }
                if let Some(p) = pool.as_deref().filter(|p| !path_ok(p)) {
                    return bad("pool", format!("{p:?} is not an absolute path"));
                }
                if ops_per_s.is_none() && bytes_per_s.is_none() {
                    return bad("rate", "give ops/s, bytes/s or both".into());
                }
                if *ops_per_s == Some(0) || *bytes_per_s == Some(0) {
                    return bad(
                        "rate",
                        "0 would refuse everything; remove the policy or use an access rule".into(),
                    );
                }
            }
            Rule::Qos { .. } => {}
        }
        Ok(())
    }

    /// Each permission and priority once, in the order first given.
    fn dedup(&mut self) {
        match self {
            Rule::Access { allow, .. } => dedup(allow),
            Rule::Qos { priority, .. } => dedup(priority),
            Rule::Rate { .. } => {}
        }
    }
}

/// Keeps the first of each value, in order.
fn dedup<T: PartialEq>(v: &mut Vec<T>) {
    let mut i = 0;
    while i < v.len() {
        if v[..i].contains(&v[i]) {
            v.remove(i);
        } else {
            i += 1;
        }
    }
}

/// Roles as names a rule can give (`role:NAME`), each once.
fn check_roles(roles: &mut Vec<String>) -> Result<(), SluiceError> {
    for r in roles.iter() {
        plain_name(r).map_err(|why| {
            SluiceError::invalid_argument(
                "role",
                format!("{r:?}: {why} (a role is a bare name; a rule names it as role:NAME)"),
            )
        })?;
    }
    dedup(roles);
    Ok(())
}

/// A principal that authenticates with a bearer token. Only the token's
/// SHA-256 is kept: the token itself is shown once, when created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenPrincipal {
    pub token_sha256: String,
    #[serde(default)]
    pub roles: Vec<String>,
    pub created_us: u64,
}

/// Roles of principals that authenticate with a client certificate (the
/// certificate's common name is the principal).
pub type CertRoles = BTreeMap<String, Vec<String>>;

/// The policy document every node enforces.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policies {
    /// Bumped by every change; nodes recompile when it moves.
    pub version: u64,
    /// Refuse a handshake that names no principal (no valid token or
    /// client certificate).
    #[serde(default)]
    pub require_auth: bool,
    #[serde(default)]
    pub tokens: BTreeMap<String, TokenPrincipal>,
    #[serde(default)]
    pub cert_roles: CertRoles,
    #[serde(default)]
    pub rules: BTreeMap<String, Rule>,
}

/// One change to the document (replicated as a metadata command).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum PolicyChange {
    SetRule {
        name: String,
        rule: Rule,
    },
    RemoveRule {
        name: String,
    },
    AddToken {
        name: String,
        principal: TokenPrincipal,
    },
    RevokeToken {
        name: String,
    },
    SetCertRoles {
        name: String,
        roles: Vec<String>,
    },
    RequireAuth {
        on: bool,
    },
}

impl Policies {
    /// Applies a change (deterministic: every replica gets the same
    /// document). Errors leave the document as it was.
    pub fn apply(&mut self, change: PolicyChange) -> Result<(), SluiceError> {
        match change {
            PolicyChange::SetRule { name, mut rule } => {
                check_name(&name)?;
                rule.validate()?;
                rule.dedup();
                if matches!(rule, Rule::Qos { .. })
                    && self
                        .rules
                        .iter()
                        .any(|(n, r)| *n != name && matches!(r, Rule::Qos { .. }))
                {
                    return Err(SluiceError::invalid_argument(
                        "policy",
                        "a node runs one QoS policy; remove the other one first",
                    ));
                }
                self.rules.insert(name, rule);
            }
            PolicyChange::RemoveRule { name } => {
                if self.rules.remove(&name).is_none() {
                    return Err(not_found("policy", &name, "sluice policy ls"));
                }
            }
            PolicyChange::AddToken {
                name,
                mut principal,
            } => {
                check_name(&name)?;
                check_roles(&mut principal.roles)?;
                if self.tokens.contains_key(&name) {
                    return Err(SluiceError::invalid_argument(
                        "principal",
                        format!("{name:?} already has a token; revoke it first"),
                    ));
                }
                self.tokens.insert(name, principal);
            }
            PolicyChange::RevokeToken { name } => {
                if self.tokens.remove(&name).is_none() {
                    return Err(not_found("principal with a token", &name, "sluice auth ls"));
                }
            }
            PolicyChange::SetCertRoles { name, mut roles } => {
                check_name(&name)?;
                check_roles(&mut roles)?;
                self.cert_roles.insert(name, roles);
            }
            PolicyChange::RequireAuth { on } => self.require_auth = on,
        }
        self.version += 1;
        Ok(())
    }

    /// Whether any access rule exists (then everything else is refused).
    pub fn access_control_on(&self) -> bool {
        self.rules
            .values()
            .any(|r| matches!(r, Rule::Access { .. }))
    }
}

fn check_name(name: &str) -> Result<(), SluiceError> {
    Who::parse(name).and_then(|w| match w {
        Who::Principal(_) => Ok(()),
        _ => Err(SluiceError::invalid_argument(
            "name",
            format!("{name:?}: a name, not a role or *"),
        )),
    })
}

fn not_found(what: &str, name: &str, lists: &str) -> SluiceError {
    SluiceError::invalid_argument(what, format!("{name:?} not found (`{lists}` lists them)"))
}

/// Whether `pool` (a pool path, or a key) is `scope` or under it, on a
/// segment boundary (`/a` covers `/a/b`, not `/ab`).
pub fn path_covers(scope: &str, pool: &str) -> bool {
    let scope = scope.trim_end_matches('/');
    scope.is_empty()
        || pool == scope
        || (pool.starts_with(scope) && pool.as_bytes().get(scope.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_parses_and_covers() {
        assert_eq!(Who::parse("*").unwrap(), Who::Anyone);
        assert_eq!(Who::parse("role:ops").unwrap(), Who::Role("ops".into()));
        assert_eq!(Who::parse("alice").unwrap(), Who::Principal("alice".into()));
        assert!(Who::parse("role:").is_err());
        assert!(Who::parse("a b").is_err());
        let roles = vec!["ops".to_string()];
        assert!(Who::Role("ops".into()).covers("bob", &roles));
        assert!(!Who::Role("dev".into()).covers("bob", &roles));
        assert!(Who::Principal("bob".into()).covers("bob", &[]));
        assert!(!Who::Principal("bob".into()).covers("alice", &[]));
        assert_eq!(Who::parse("role:ops").unwrap().to_string(), "role:ops");
    }

    #[test]
    fn paths_cover_on_segment_boundaries() {
        assert!(path_covers("/", "/anything"));
        assert!(path_covers("/a", "/a"));
        assert!(path_covers("/a", "/a/b/c"));
        assert!(path_covers("/a/", "/a/b"));
        assert!(!path_covers("/a", "/ab"));
        assert!(!path_covers("/a/b", "/a"));
    }

    #[test]
    fn changes_apply_and_errors_leave_the_document() {
        let mut p = Policies::default();
        let rule = Rule::Access {
            who: Who::Anyone,
            pool: "/p".into(),
            allow: vec![Perm::Read],
        };
        p.apply(PolicyChange::SetRule {
            name: "r".into(),
            rule,
        })
        .unwrap();
        assert!(p.access_control_on());
        assert_eq!(p.version, 1);
        let before = p.clone();
        assert!(p
            .apply(PolicyChange::RemoveRule { name: "x".into() })
            .is_err());
        let bad_rate = Rule::Rate {
            who: Who::Anyone,
            pool: None,
            ops_per_s: Some(0),
            bytes_per_s: None,
            max_delay_ms: 0,
        };
        assert!(p
            .apply(PolicyChange::SetRule {
                name: "r2".into(),
                rule: bad_rate
            })
            .is_err());
        assert_eq!(p, before);
        let qos = |b| Rule::Qos {
            small_bytes: b,
            priority: vec![],
        };
        p.apply(PolicyChange::SetRule {
            name: "q".into(),
            rule: qos(1),
        })
        .unwrap();
        // Replacing the same QoS policy is fine, a second one is not.
        p.apply(PolicyChange::SetRule {
            name: "q".into(),
            rule: qos(2),
        })
        .unwrap();
        assert!(p
            .apply(PolicyChange::SetRule {
                name: "q2".into(),
                rule: qos(3)
            })
            .is_err());
        let tok = TokenPrincipal {
            token_sha256: "00".into(),
            roles: vec![],
            created_us: 0,
        };
        p.apply(PolicyChange::AddToken {
            name: "alice".into(),
            principal: tok.clone(),
        })
        .unwrap();
        assert!(p
            .apply(PolicyChange::AddToken {
                name: "alice".into(),
                principal: tok
            })
            .is_err());
        p.apply(PolicyChange::RevokeToken {
            name: "alice".into(),
        })
        .unwrap();
        assert!(p.tokens.is_empty());
    }

    /// Settings that could never work were taken: roles no rule can name
    /// (`a b`, `role:x`, empty), names of any length, a rate limit holding
    /// a request for years; permissions and roles given twice were kept
    /// twice; a token not found sent the user to `sluice policy ls`.
    #[test]
    fn names_roles_and_delays_that_cannot_work_are_refused() {
        let mut p = Policies::default();
        let tok = |roles: &[&str]| TokenPrincipal {
            token_sha256: "00".into(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            created_us: 0,
        };
        for bad in [&["a b"][..], &["role:x"], &[""], &["*"]] {
            let e = p
                .apply(PolicyChange::AddToken {
                    name: "bob".into(),
                    principal: tok(bad),
                })
                .unwrap_err();
            assert!(e.to_string().contains("role"), "{bad:?}: {e}");
            assert!(p
                .apply(PolicyChange::SetCertRoles {
                    name: "carol".into(),
                    roles: bad.iter().map(|r| r.to_string()).collect(),
                })
                .is_err());
        }
        assert_eq!(p, Policies::default());
        p.apply(PolicyChange::AddToken {
            name: "bob".into(),
            principal: tok(&["ops", "ops", "cams"]),
        })
        .unwrap();
        assert_eq!(p.tokens["bob"].roles, ["ops", "cams"]);
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert!(p
            .apply(PolicyChange::AddToken {
                name: long,
                principal: tok(&[]),
            })
            .unwrap_err()
            .to_string()
            .contains("at most 128 bytes"));
        assert!(Who::parse(&"x".repeat(MAX_NAME_BYTES)).is_ok());
        let rate = |max_delay_ms| Rule::Rate {
            who: Who::Anyone,
            pool: None,
            ops_per_s: Some(10),
            bytes_per_s: None,
            max_delay_ms,
        };
        let e = rate(MAX_DELAY_MS + 1).validate().unwrap_err().to_string();
        assert!(e.contains("max_delay_ms") && e.contains("60000"), "{e}");
        rate(MAX_DELAY_MS).validate().unwrap();
        p.apply(PolicyChange::SetRule {
            name: "a".into(),
            rule: Rule::Access {
                who: Who::Anyone,
                pool: "/".into(),
                allow: vec![Perm::Write, Perm::Read, Perm::Write],
            },
        })
        .unwrap();
        assert!(
            matches!(&p.rules["a"], Rule::Access { allow, .. } if *allow == [Perm::Write, Perm::Read])
        );
        // Rules built from JSON (a client's `policy set`) skip `Who::parse`.
        let json_rule: Rule = serde_json::from_str(
            r#"{"kind": "access", "who": {"principal": "a b"}, "pool": "/", "allow": ["read"]}"#,
        )
        .unwrap();
        assert!(json_rule.validate().is_err());
        let json_qos: Rule = serde_json::from_str(
            r#"{"kind": "qos", "small_bytes": 1, "priority": [{"role": ""}]}"#,
        )
        .unwrap();
        assert!(json_qos.validate().is_err());
        let e = p
            .apply(PolicyChange::RevokeToken { name: "zed".into() })
            .unwrap_err()
            .to_string();
        assert!(e.contains("`sluice auth ls`"), "{e}");
    }
}
