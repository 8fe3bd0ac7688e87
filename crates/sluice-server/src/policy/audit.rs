//! The audit log: every refusal (a permission denied, a failed
//! authentication) as one JSON line in the file `[policy] audit_log`
//! names, and as a `sluice::audit` tracing event, counted in
//! `sluice_policy_refusals_total`. Rate-limited requests are flow control,
//! not incidents, and come by the hundred thousand a second: each is
//! counted, and the log gets one line per principal and policy a second
//! with how many were refused since the last. Other refusals each get a
//! line in the file; in the node's log a principal's refusals of one
//! operation are five at once and then one per 10 s, with the count left
//! out (`not_logged`): a client retrying a denied request in a loop wrote
//! a line per try.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often a principal's rate-limit refusals are summarised in the log.
const RATE_LIMITED_REPORT_EVERY: Duration = Duration::from_secs(1);

use parking_lot::Mutex;
use sluice_compute::throttle::LogThrottle;
use sluice_types::SluiceError;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;

/// Where refusals are recorded.
#[derive(Default)]
pub struct Audit {
    file: Option<Mutex<std::fs::File>>,
    /// (principal, policy) -> refusals not yet logged, since when.
    rate_limited: Mutex<HashMap<(String, String), (u64, Instant)>>,
    /// (principal, operation) -> the log's share of its other refusals.
    denials_logged: Mutex<HashMap<(String, String), LogThrottle>>,
}

/// Principals and operations whose refusals the log keeps throttles for;
/// past it they start again (a client making up principal names cannot
/// grow the map without bound).
const THROTTLES_KEPT: usize = 10_000;

impl Audit {
    /// Appends to `path` (created if missing); `None`: tracing only.
    pub fn open(path: Option<&Path>) -> Result<Audit, String> {
        let file = match path {
            None => None,
            Some(p) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("[policy] audit_log {}: {e}", p.display()))?,
            )),
        };
        Ok(Audit {
            file,
            rate_limited: Mutex::default(),
            denials_logged: Mutex::default(),
        })
    }

    /// Records one refusal of `op` by `principal` from `peer`.
    pub fn refused(&self, principal: &str, op: &str, peer: SocketAddr, e: &SluiceError) {
        let kind = match e {
            SluiceError::PermissionDenied { .. } => "permission_denied",
            SluiceError::RateLimited { .. } => "rate_limited",
            SluiceError::Unauthenticated { .. } => "unauthenticated",
            _ => "refused",
        };
        metrics::counter!("sluice_policy_refusals_total", "kind" => kind, "op" => op.to_string(), "principal" => principal.to_string())
            .increment(1);
        // Rate-limited refusals: counted here, written once a second.
        let mut summarised = None;
        if let SluiceError::RateLimited { policy, .. } = e {
            let mut m = self.rate_limited.lock();
            let now = Instant::now();
            let entry = m
                .entry((principal.to_string(), policy.clone()))
                .or_insert((0, now - RATE_LIMITED_REPORT_EVERY));
            entry.0 += 1;
            if now.duration_since(entry.1) < RATE_LIMITED_REPORT_EVERY {
                return;
            }
            let count = std::mem::replace(entry, (0, now)).0;
            summarised = Some(count);
            tracing::warn!(target: "sluice::audit", %principal, %policy, count, "rate limited (requests refused since the last report)");
        } else {
            let held = {
                let mut m = self.denials_logged.lock();
                if m.len() >= THROTTLES_KEPT {
                    m.clear();
                }
                m.entry((principal.to_string(), op.to_string()))
                    .or_default()
                    .admit()
            };
            if let Some(held) = held {
                tracing::warn!(target: "sluice::audit", %principal, op, %peer, kind, error = %e, not_logged = held, "refused (not_logged: refusals of this principal and operation since the last line; the audit file has every one)");
            }
        }
        if let Some(f) = &self.file {
            let mut line = serde_json::json!({
                "time_us": sluice_types::wall_us(),
                "principal": principal,
                "op": op,
                "peer": peer.to_string(),
                "kind": kind,
                "error": e,
                "message": e.to_string(),
            });
            if let Some(n) = summarised {
                line["refused_since_last_report"] = serde_json::json!(n);
            }
            // One write per line, so concurrent refusals never interleave.
            let mut text = line.to_string();
            text.push('\n');
            if let Err(err) = f.lock().write_all(text.as_bytes()) {
                tracing::error!(error = %err, "cannot write the audit log");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An audit file in a fresh directory, a peer, and bob's refused put.
    fn audit_and_denial() -> (tempfile::TempDir, Audit, SocketAddr, SluiceError) {
        let dir = tempfile::tempdir().unwrap();
        let a = Audit::open(Some(&dir.path().join("audit.jsonl"))).unwrap();
        let denied = SluiceError::PermissionDenied {
            principal: "bob".into(),
            op: "put".into(),
            pool: "/p".into(),
            perm: "write".into(),
        };
        (dir, a, "127.0.0.1:1".parse().unwrap(), denied)
    }

    #[test]
    fn refusals_go_to_the_file_and_rate_limits_are_summarised() {
        let (dir, a, peer, denied) = audit_and_denial();
        let path = dir.path().join("audit.jsonl");
        a.refused("bob", "put", peer, &denied);
        a.refused("bob", "put", peer, &denied);
        let limited = SluiceError::RateLimited {
            principal: "bob".into(),
            policy: "slow".into(),
            retry_after_ms: 5,
        };
        for _ in 0..1000 {
            a.refused("bob", "get", peer, &limited);
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Both denials, and one line for the burst of rate-limited ones.
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["kind"], "permission_denied");
        assert_eq!(lines[0]["error"]["perm"], "write");
        assert_eq!(lines[2]["kind"], "rate_limited");
        assert_eq!(lines[2]["refused_since_last_report"], 1);
    }

    /// A `MakeWriter` collecting what a subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// A client retrying a denied request in a loop: every refusal is in
    /// the audit file, the log has the first five. (Before: a log line
    /// per refusal.)
    #[test]
    fn a_denied_request_retried_in_a_loop_gets_every_line_in_the_file_and_five_in_the_log() {
        let (dir, a, peer, denied) = audit_and_denial();
        let path = dir.path().join("audit.jsonl");
        let out = Captured::default();
        let sub = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(sub, || {
            for _ in 0..500 {
                a.refused("bob", "put", peer, &denied);
            }
            // Another principal's refusals are logged on their own terms.
            a.refused("carol", "put", peer, &denied);
        });
        let file = std::fs::read_to_string(&path).unwrap();
        assert_eq!(file.lines().count(), 501);
        let log = String::from_utf8(out.0.lock().clone()).unwrap();
        let bob = log.lines().filter(|l| l.contains("principal=bob")).count();
        assert_eq!(bob, 5, "{log}");
        assert_eq!(
            log.lines()
                .filter(|l| l.contains("principal=carol"))
                .count(),
            1
        );
    }
}
