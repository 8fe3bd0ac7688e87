//! `Request::Policy`: the commands behind `sluice policy` and `sluice
//! auth`. Reads answer from this node's copy; changes become a
//! `PolicyChange`, applied by the metadata group in a cluster (every node
//! installs it as it applies the log) or by a standalone node itself.

use super::{Compiled, PolicyState, Principal};
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_types::policy::{PolicyChange, Rule, TokenPrincipal};
use sluice_types::SluiceError;
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Command {
    /// The document, without token hashes.
    Ls,
    /// The connection's own principal, roles and permissions.
    Whoami,
    Set {
        name: String,
        rule: Rule,
    },
    Rm {
        name: String,
    },
    /// A new principal with a bearer token (shown once, in the reply).
    AuthCreate {
        name: String,
        #[serde(default)]
        roles: Vec<String>,
    },
    AuthRevoke {
        name: String,
    },
    /// Roles of a principal that presents a client certificate.
    AuthRoles {
        name: String,
        roles: Vec<String>,
    },
    RequireAuth {
        on: bool,
    },
}

/// What running a command takes next.
pub enum Step {
    /// The answer, from this node's copy.
    Answer(Value),
    /// A change to apply (in the metadata service), then answer `reply`.
    Change { change: PolicyChange, reply: Value },
}

/// Parses and prepares a command from `who`.
pub fn prepare(state: &PolicyState, who: &Principal, command: &str) -> Result<Step, SluiceError> {
    let cmd: Command = serde_json::from_str(command)
        .map_err(|e| SluiceError::invalid_argument("policy command", e.to_string()))?;
    let change = |change: PolicyChange| {
        Ok(Step::Change {
            change,
            reply: json!({}),
        })
    };
    match cmd {
        Command::Ls => Ok(Step::Answer(listing(&state.current()))),
        Command::Whoami => {
            let cur = state.current();
            Ok(Step::Answer(json!({
                "principal": who.name,
                "via": who.via.name(),
                "roles": cur.roles_of(who),
                "access_control": cur.doc.access_control_on(),
            })))
        }
        Command::Set { name, rule } => {
            rule.validate()?;
            change(PolicyChange::SetRule { name, rule })
        }
        Command::Rm { name } => change(PolicyChange::RemoveRule { name }),
        Command::AuthCreate { name, roles } => {
            let token = sluice_tls::new_token().map_err(|e| SluiceError::Internal {
                reason: e.to_string(),
            })?;
            let principal = TokenPrincipal {
                token_sha256: sluice_tls::token_sha256(&token),
                roles: roles.clone(),
                created_us: sluice_types::wall_us(),
            };
            Ok(Step::Change {
                change: PolicyChange::AddToken {
                    name: name.clone(),
                    principal,
                },
                reply: json!({"name": name, "roles": roles, "token": token}),
            })
        }
        Command::AuthRevoke { name } => change(PolicyChange::RevokeToken { name }),
        Command::AuthRoles { name, roles } => change(PolicyChange::SetCertRoles { name, roles }),
        Command::RequireAuth { on } => change(PolicyChange::RequireAuth { on }),
    }
}

/// The document as `sluice policy ls` shows it: token hashes left out.
fn listing(c: &Arc<Compiled>) -> Value {
    let d = &c.doc;
    let tokens: Vec<Value> = d
        .tokens
        .iter()
        .map(|(n, t)| json!({"name": n, "roles": t.roles, "created_us": t.created_us}))
        .collect();
    json!({
        "version": d.version,
        "require_auth": d.require_auth,
        "access_control": d.access_control_on(),
        "rules": d.rules,
        "tokens": tokens,
        "cert_roles": d.cert_roles,
    })
}
