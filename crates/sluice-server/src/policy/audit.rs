//! The audit log: every refusal (a permission denied, a failed
//! authentication, a rate-limited request) as one JSON line in the file
//! `[policy] audit_log` names, and as a `sluice::audit` tracing event,
//! counted in `sluice_policy_refusals_total`.

use parking_lot::Mutex;
use sluice_types::SluiceError;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;

/// Where refusals are recorded.
#[derive(Default)]
pub struct Audit {
    file: Option<Mutex<std::fs::File>>,
}

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
        Ok(Audit { file })
    }

    /// Records one refusal of `op` by `principal` from `peer`.
    pub fn refused(&self, principal: &str, op: &str, peer: SocketAddr, e: &SluiceError) {
        let kind = match e {
            SluiceError::PermissionDenied { .. } => "permission_denied",
            SluiceError::RateLimited { .. } => "rate_limited",
            SluiceError::Unauthenticated { .. } => "unauthenticated",
            _ => "refused",
        };
        tracing::warn!(target: "sluice::audit", %principal, op, %peer, kind, error = %e, "refused");
        metrics::counter!("sluice_policy_refusals_total", "kind" => kind, "op" => op.to_string(), "principal" => principal.to_string())
            .increment(1);
        if let Some(f) = &self.file {
            let line = serde_json::json!({
                "time_us": sluice_types::wall_us(),
                "principal": principal,
                "op": op,
                "peer": peer.to_string(),
                "kind": kind,
                "error": e,
                "message": e.to_string(),
            });
            // One write per line, so concurrent refusals never interleave.
            let mut text = line.to_string();
            text.push('\n');
            if let Err(err) = f.lock().write_all(text.as_bytes()) {
                tracing::error!(error = %err, "cannot write the audit log");
            }
        }
    }
}
