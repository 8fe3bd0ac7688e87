//! Policies in the data path (mRPC's model, issue #19): who a connection
//! is, what it may do to which pool, and how fast. The document lives in
//! the metadata service (a cluster's metadata group; a standalone node's
//! `policies.json`); this module compiles the copy this node has applied
//! and each connection checks its requests against a view of it rebuilt
//! only when the document changes.
//!
//! Cost when nothing is configured: one atomic load per request (the
//! view's generation), then nothing. Peers that authenticated with the
//! cluster key are nodes and are never checked.

pub mod audit;
pub mod bucket;
pub mod commands;
pub mod needs;
pub mod qos;

use bucket::{Bucket, Take};
use needs::Need;
use parking_lot::{Mutex, RwLock};
use sluice_types::policy::{path_covers, Perm, Policies, PolicyChange, Rule, Who};
use sluice_types::SluiceError;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The name of a connection that presented neither token nor certificate.
pub const ANONYMOUS: &str = "anonymous";

/// How a connection proved who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Anonymous,
    Token,
    Certificate,
}

impl Via {
    pub fn name(self) -> &'static str {
        match self {
            Via::Anonymous => "anonymous",
            Via::Token => "token",
            Via::Certificate => "certificate",
        }
    }
}

/// Who a connection acts as.
#[derive(Clone, Debug)]
pub struct Principal {
    pub name: String,
    pub via: Via,
    /// The token's hash, so a revoked (or re-created) token is noticed.
    token_sha256: Option<String>,
}

impl Principal {
    pub fn anonymous() -> Principal {
        Principal {
            name: ANONYMOUS.into(),
            via: Via::Anonymous,
            token_sha256: None,
        }
    }
}

/// A rate limiter's key: (rate policy, principal).
type BucketKey = (String, String);

/// The node's policies, compiled, with the rate limiters they need.
pub struct PolicyState {
    current: RwLock<Arc<Compiled>>,
    /// Bumped by every install: connections rebuild their view when it moves.
    generation: AtomicU64,
    /// (rate policy, principal) -> bucket, kept across changes to other
    /// policies (a change of the policy itself starts a fresh bucket).
    buckets: Mutex<HashMap<BucketKey, (Rule, Arc<Bucket>)>>,
    pub audit: audit::Audit,
    /// Small requests in progress on this node (QoS).
    pub gate: qos::Gate,
    /// A standalone node's document and where it is kept.
    local: Option<(PathBuf, Mutex<Policies>)>,
}

pub struct Compiled {
    pub doc: Policies,
    /// token hash -> principal name.
    tokens: HashMap<String, String>,
}

impl Compiled {
    fn new(doc: Policies) -> Compiled {
        let tokens = doc
            .tokens
            .iter()
            .map(|(n, t)| (t.token_sha256.clone(), n.clone()))
            .collect();
        Compiled { doc, tokens }
    }

    fn roles_of(&self, p: &Principal) -> Vec<String> {
        match p.via {
            Via::Token => self
                .doc
                .tokens
                .get(&p.name)
                .map(|t| t.roles.clone())
                .unwrap_or_default(),
            Via::Certificate => self
                .doc
                .cert_roles
                .get(&p.name)
                .cloned()
                .unwrap_or_default(),
            Via::Anonymous => Vec::new(),
        }
    }
}

/// A connection's view of the policies for its principal.
pub struct View {
    generation: u64,
    /// Nothing to check: no access rules, no rate limits, principal valid.
    open: bool,
    /// Why the principal is no longer accepted (its token was revoked, or
    /// authentication became required).
    revoked: Option<String>,
    /// (scope, permission bits); `None`: access control is off.
    access: Option<Vec<(String, u8)>>,
    /// (policy name, pool scope, bucket).
    rates: Vec<(String, Option<String>, Arc<Bucket>)>,
    /// The QoS class of this principal's requests (`qos::Class`).
    pub qos: Option<QosView>,
}

/// What the QoS policy says about one principal's requests.
#[derive(Clone, Copy, Debug)]
pub struct QosView {
    /// Requests with at most this many value bytes are latency-critical.
    pub small_bytes: u64,
    /// Every request of this principal is latency-critical.
    pub priority: bool,
}

/// What a request may do now.
pub enum Admit {
    Run,
    /// Run after this delay (a rate limit; already paid for).
    After(Duration),
    Refuse(SluiceError),
}

impl PolicyState {
    /// A cluster node's state: the document arrives from the metadata
    /// group (`install`).
    pub fn clustered(audit: audit::Audit) -> PolicyState {
        Self::with(Policies::default(), None, audit)
    }

    /// A standalone node's state, kept in `<data_dir>/policies.json`.
    pub fn standalone(
        data_dir: &std::path::Path,
        audit: audit::Audit,
    ) -> Result<PolicyState, String> {
        let path = data_dir.join("policies.json");
        let doc = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| format!("{}: {e} (fix or remove the file)", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Policies::default(),
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        let local = Mutex::new(doc.clone());
        Ok(Self::with(doc, Some((path, local)), audit))
    }

    fn with(
        doc: Policies,
        local: Option<(PathBuf, Mutex<Policies>)>,
        audit: audit::Audit,
    ) -> PolicyState {
        PolicyState {
            current: RwLock::new(Arc::new(Compiled::new(doc))),
            generation: AtomicU64::new(1),
            buckets: Mutex::default(),
            audit,
            gate: qos::Gate::default(),
            local,
        }
    }

    pub fn current(&self) -> Arc<Compiled> {
        self.current.read().clone()
    }

    /// Installs a document (a cluster's, as applied here) when it is not
    /// the one in force.
    pub fn install(&self, doc: Policies) {
        let mut cur = self.current.write();
        if cur.doc == doc {
            return;
        }
        tracing::info!(
            version = doc.version,
            rules = doc.rules.len(),
            tokens = doc.tokens.len(),
            "policies changed"
        );
        *cur = Arc::new(Compiled::new(doc));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// A standalone node applies a change itself and keeps the document.
    /// `None` on a cluster node (changes go through the metadata group).
    pub fn apply_local(&self, change: PolicyChange) -> Option<Result<(), SluiceError>> {
        let (path, doc) = self.local.as_ref()?;
        let mut doc = doc.lock();
        let mut next = doc.clone();
        let r = next.apply(change).and_then(|()| {
            let text = serde_json::to_vec_pretty(&next).map_err(|e| SluiceError::Internal {
                reason: e.to_string(),
            })?;
            write_atomically(path, &text)
        });
        if r.is_ok() {
            *doc = next.clone();
            self.install(next);
        }
        Some(r)
    }

    /// Who a handshake names: the principal of `token` (which must be a
    /// live one), else of the client certificate, else anonymous.
    pub fn authenticate(
        &self,
        token: Option<&str>,
        cert_name: Option<&str>,
    ) -> Result<Principal, SluiceError> {
        let cur = self.current();
        if let Some(t) = token {
            let sha = sluice_tls::token_sha256(t);
            return match cur.tokens.get(&sha) {
                Some(name) => Ok(Principal {
                    name: name.clone(),
                    via: Via::Token,
                    token_sha256: Some(sha),
                }),
                None => Err(SluiceError::Unauthenticated {
                    reason: "unknown or revoked token (`sluice auth ls` lists the principals that have one)".into(),
                }),
            };
        }
        if let Some(n) = cert_name {
            return Ok(Principal {
                name: n.to_string(),
                via: Via::Certificate,
                token_sha256: None,
            });
        }
        // Where authentication is required, an anonymous connection can
        // still finish the handshake (a cluster peer proves itself with
        // `PeerAuth` next) but every other request is refused (`view`).
        Ok(Principal::anonymous())
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The view of the policies in force for `p`.
    pub fn view(&self, p: &Principal) -> View {
        let generation = self.generation();
        let cur = self.current();
        let doc = &cur.doc;
        let roles = cur.roles_of(p);
        let revoked = match p.via {
            Via::Token => match doc.tokens.get(&p.name) {
                Some(t) if Some(&t.token_sha256) == p.token_sha256.as_ref() => None,
                _ => Some(format!("the token of principal {:?} was revoked", p.name)),
            },
            Via::Anonymous if doc.require_auth => Some(AUTH_REQUIRED.to_string()),
            _ => None,
        };
        let access = doc.access_control_on().then(|| {
            doc.rules
                .values()
                .filter_map(|r| match r {
                    Rule::Access { who, pool, allow } if who.covers(&p.name, &roles) => {
                        Some((pool.clone(), allow.iter().fold(0u8, |b, x| b | x.bit())))
                    }
                    _ => None,
                })
                .collect()
        });
        let mut rates = Vec::new();
        let mut buckets = self.buckets.lock();
        for (name, r) in &doc.rules {
            let Rule::Rate {
                who,
                pool,
                ops_per_s,
                bytes_per_s,
                max_delay_ms,
            } = r
            else {
                continue;
            };
            if !who.covers(&p.name, &roles) {
                continue;
            }
            let k = (name.clone(), p.name.clone());
            let b = match buckets.get(&k) {
                Some((rule, b)) if rule == r => b.clone(),
                _ => {
                    let b = Arc::new(Bucket::new(
                        *ops_per_s,
                        *bytes_per_s,
                        Duration::from_millis(*max_delay_ms),
                    ));
                    buckets.insert(k, (r.clone(), b.clone()));
                    b
                }
            };
            rates.push((name.clone(), pool.clone(), b));
        }
        // Buckets of policies that are gone.
        buckets.retain(|(n, _), (rule, _)| doc.rules.get(n) == Some(rule));
        let qos = doc.rules.values().find_map(|r| match r {
            Rule::Qos {
                small_bytes,
                priority,
            } => Some(QosView {
                small_bytes: *small_bytes,
                priority: priority.iter().any(|w: &Who| w.covers(&p.name, &roles)),
            }),
            _ => None,
        });
        View {
            generation,
            open: revoked.is_none() && access.is_none() && rates.is_empty(),
            revoked,
            access,
            rates,
            qos,
        }
    }
}

impl View {
    /// A view that lets everything through (before the handshake).
    pub fn none() -> View {
        View {
            generation: 0,
            open: true,
            revoked: None,
            access: None,
            rates: Vec::new(),
            qos: None,
        }
    }

    /// Whether the principal has `perm` on `path` (access control only:
    /// no rate is taken). A hint for work done before a request is
    /// admitted, such as where to read a value; `admit` still decides.
    pub fn may(&self, perm: Perm, path: &str) -> bool {
        if self.open {
            return true;
        }
        if self.revoked.is_some() {
            return false;
        }
        self.access.as_ref().is_none_or(|access| {
            access
                .iter()
                .any(|(scope, bits)| bits & perm.bit() != 0 && path_covers(scope, path))
        })
    }

    pub fn stale(&self, state: &PolicyState) -> bool {
        self.generation != state.generation()
    }

    /// Checks one request. `pool_of` names the pool a key is in (for the
    /// refusal's message); `value_bytes` is what it counts against byte
    /// rates.
    pub fn admit(
        &self,
        p: &Principal,
        req: &sluice_wire::Request,
        value_bytes: u64,
        pool_of: impl Fn(&str) -> Option<String>,
    ) -> Admit {
        if self.open {
            return Admit::Run;
        }
        let need = needs::needs(req);
        if matches!(need, Need::Nothing) {
            return Admit::Run;
        }
        if let Some(why) = &self.revoked {
            return Admit::Refuse(SluiceError::Unauthenticated {
                reason: why.clone(),
            });
        }
        let denied = |perm: Perm, path: &str| SluiceError::PermissionDenied {
            principal: p.name.clone(),
            op: req.name().to_string(),
            pool: pool_of(path).unwrap_or_else(|| path.to_string()),
            perm: perm.name().to_string(),
        };
        if let Some(access) = &self.access {
            let allowed = |perm: Perm, path: &str| {
                access
                    .iter()
                    .any(|(scope, bits)| bits & perm.bit() != 0 && path_covers(scope, path))
            };
            match need {
                Need::On(perm, path) if !allowed(perm, path) => {
                    return Admit::Refuse(denied(perm, path))
                }
                Need::OnEach(perm, keys) => {
                    if let Some(k) = keys.iter().find(|k| !allowed(perm, k)) {
                        return Admit::Refuse(denied(perm, k));
                    }
                }
                _ => {}
            }
        }
        // Rate limits count what a principal does to pools, not the
        // pool table and cluster view a client routes by.
        let path = match need {
            Need::On(_, path) => path,
            Need::OnEach(_, keys) => keys.first().map_or("/", String::as_str),
            _ => return Admit::Run,
        };
        let now = Instant::now();
        let mut wait = Duration::ZERO;
        for (name, scope, bucket) in &self.rates {
            if let Some(s) = scope {
                if !path_covers(s, path) {
                    continue;
                }
            }
            match bucket.take(value_bytes, now) {
                Take::Now => {}
                Take::After(d) => wait = wait.max(d),
                Take::Refuse { retry_after } => {
                    return Admit::Refuse(SluiceError::RateLimited {
                        principal: p.name.clone(),
                        policy: name.clone(),
                        retry_after_ms: (retry_after.as_millis() as u64).max(1),
                    })
                }
            }
        }
        if wait.is_zero() {
            Admit::Run
        } else {
            Admit::After(wait)
        }
    }
}

const AUTH_REQUIRED: &str = "this node requires a principal: connect with a token (--token, SLUICE_TOKEN; `sluice auth create`) or a client certificate";

/// Writes `path` so that a crash leaves the old or the new file, never a
/// torn one: a temporary file, fsynced, renamed over it.
fn write_atomically(path: &std::path::Path, text: &[u8]) -> Result<(), SluiceError> {
    use std::io::Write;
    let tmp = path.with_extension("json.tmp");
    let io = |e: std::io::Error| SluiceError::Io {
        reason: format!("writing {}: {e}", path.display()),
    };
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(text).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
