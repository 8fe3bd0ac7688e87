//! `sluice auth` and `sluice policy`: principals and the policies every
//! node enforces (access rules, rate limits, QoS), through the metadata
//! service. A thin shell over `Client::policy`.

use crate::commands::{lines, Shown};
use anyhow::{bail, Result};
use clap::Subcommand;
use serde_json::{json, Value};
use sluice_client::BlockingClient;

#[derive(Subcommand, Debug)]
pub enum AuthCmd {
    /// A new principal with a bearer token (printed once: keep it; the
    /// nodes keep only its SHA-256).
    Create {
        /// The principal's name (letters, digits and `-` `_` `.` `@`).
        name: String,
        /// A role the principal has (repeat for several).
        #[arg(long = "role")]
        roles: Vec<String>,
    },
    /// Principals with tokens (no tokens shown), and certificate roles.
    Ls,
    /// Revoke a principal's token: its connections are refused from the
    /// next request on, on every node.
    Revoke {
        /// The principal's name.
        name: String,
    },
    /// Roles of a principal that connects with a client certificate (its
    /// common name).
    Roles {
        /// The certificate's common name.
        name: String,
        /// Its roles (none: it has no roles).
        roles: Vec<String>,
    },
    /// Who this connection is: principal, how it proved it, roles.
    Whoami,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Every policy, principal and setting.
    Ls,
    /// Add or replace a named policy.
    #[command(subcommand)]
    Set(SetCmd),
    /// Remove a named policy.
    Rm {
        /// The policy's name (`policy ls` lists them).
        name: String,
    },
    /// Refuse everything but the handshake to connections that present no
    /// valid token or client certificate (`on`/`off`).
    RequireAuth {
        /// `on` refuses anonymous connections, `off` allows them.
        on: OnOff,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Subcommand, Debug)]
pub enum SetCmd {
    /// Allow WHO (a principal, `role:NAME` or `*`) permissions on a pool
    /// and everything under it. Once any access rule exists, whatever no
    /// rule allows is refused.
    Access {
        /// The rule's name (a rule of that name is replaced).
        name: String,
        /// Whom the rule covers: a principal, role:NAME, or * (everyone).
        #[arg(long)]
        who: String,
        /// Pool path (or any path: the rule covers it and what is under it).
        #[arg(long, default_value = "/")]
        pool: String,
        /// Comma-separated: read, write, trigger, watch, admin.
        #[arg(long, value_delimiter = ',', required = true)]
        allow: Vec<String>,
    },
    /// Limit each principal WHO covers (per node): ops/s and/or value
    /// bytes/s, bursts of one second's worth; over it a request waits up
    /// to --max-delay-ms, then is refused with RateLimited.
    Rate {
        /// The limit's name (a policy of that name is replaced).
        name: String,
        /// Whom the limit covers, each principal alone: a principal,
        /// role:NAME, or * (everyone).
        #[arg(long, default_value = "*")]
        who: String,
        /// Count only requests on keys under this path.
        #[arg(long)]
        pool: Option<String>,
        /// Requests a second (whole numbers, at least 1).
        #[arg(long)]
        ops: Option<u64>,
        /// Value bytes a second (sizes like 10MB work).
        #[arg(long, value_parser = parse_bytes)]
        bytes: Option<u64>,
        /// How long a request over the limit may wait for its turn before
        /// it is refused with `RateLimited` (0: refused at once; at most
        /// 60000).
        #[arg(long, default_value_t = 0)]
        max_delay_ms: u64,
    },
    /// Small requests (and principals in --priority) go ahead of bulk ones.
    Qos {
        /// The policy's name (a policy of that name is replaced).
        name: String,
        /// Requests with at most this many value bytes are latency-critical.
        #[arg(long, value_parser = parse_bytes, default_value = "4096")]
        small_bytes: u64,
        /// Principals (or `role:NAME`) whose requests are all latency-critical.
        #[arg(long)]
        priority: Vec<String>,
    },
}

/// `10MB`, `64KiB`, `4096`: a byte count.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        u => return Err(format!("{u:?}: use B, KB, MB or GB")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn who(s: &str) -> Result<Value> {
    Ok(serde_json::to_value(sluice_types::policy::Who::parse(s)?)?)
}

pub fn auth(c: &BlockingClient, cmd: AuthCmd) -> Result<Shown> {
    Ok(match cmd {
        AuthCmd::Create { name, roles } => {
            let r = c.policy(json!({"op": "auth_create", "name": name, "roles": roles}))?;
            let text = lines([
                format!(
                    "principal {name} created{}",
                    if roles.is_empty() {
                        String::new()
                    } else {
                        format!(" with roles {}", roles.join(", "))
                    }
                ),
                format!("token: {}", r["token"].as_str().unwrap_or("?")),
                "(shown once; use it as --token or SLUICE_TOKEN)".into(),
            ]);
            Shown::new(r, text)
        }
        AuthCmd::Ls => {
            let r = c.policy(json!({"op": "ls"}))?;
            let mut text = Vec::new();
            for t in r["tokens"].as_array().into_iter().flatten() {
                text.push(format!(
                    "{}  token  roles: {}",
                    t["name"].as_str().unwrap_or("?"),
                    roles_of(&t["roles"])
                ));
            }
            for (n, roles) in r["cert_roles"].as_object().into_iter().flatten() {
                text.push(format!("{n}  certificate  roles: {}", roles_of(roles)));
            }
            if text.is_empty() {
                text.push("no principals (every connection is anonymous)".into());
            }
            Shown::new(
                json!({"tokens": r["tokens"], "cert_roles": r["cert_roles"]}),
                lines(text),
            )
        }
        AuthCmd::Revoke { name } => {
            let r = c.policy(json!({"op": "auth_revoke", "name": name}))?;
            Shown::new(r, lines([format!("token of {name} revoked")]))
        }
        AuthCmd::Roles { name, roles } => {
            let r = c.policy(json!({"op": "auth_roles", "name": name, "roles": roles}))?;
            Shown::new(r, lines([format!("{name}: roles {}", roles.join(", "))]))
        }
        AuthCmd::Whoami => {
            let r = c.policy(json!({"op": "whoami"}))?;
            let text = format!(
                "{} (by {}), roles: {}\n",
                r["principal"].as_str().unwrap_or("?"),
                r["via"].as_str().unwrap_or("?"),
                roles_of(&r["roles"])
            );
            Shown::new(r, text)
        }
    })
}

fn roles_of(v: &Value) -> String {
    let r: Vec<&str> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if r.is_empty() {
        "-".into()
    } else {
        r.join(", ")
    }
}

pub fn policy(c: &BlockingClient, cmd: PolicyCmd) -> Result<Shown> {
    Ok(match cmd {
        PolicyCmd::Ls => {
            let r = c.policy(json!({"op": "ls"}))?;
            Shown::new(r.clone(), listing(&r))
        }
        PolicyCmd::Set(s) => {
            let (name, rule) = rule_of(s)?;
            let r = c.policy(json!({"op": "set", "name": name, "rule": rule}))?;
            Shown::new(
                r,
                lines([format!(
                    "policy {name} set (each node enforces it once it applies the change: within a second where it is up, when it is back where it is down or cut off)"
                )]),
            )
        }
        PolicyCmd::Rm { name } => {
            let r = c.policy(json!({"op": "rm", "name": name}))?;
            Shown::new(r, lines([format!("policy {name} removed")]))
        }
        PolicyCmd::RequireAuth { on } => {
            let on = matches!(on, OnOff::On);
            let r = c.policy(json!({"op": "require_auth", "on": on}))?;
            Shown::new(
                r,
                lines([format!(
                    "authentication {}",
                    if on { "required" } else { "optional" }
                )]),
            )
        }
    })
}

fn rule_of(s: SetCmd) -> Result<(String, Value)> {
    Ok(match s {
        SetCmd::Access {
            name,
            who: w,
            pool,
            allow,
        } => {
            for a in &allow {
                a.parse::<sluice_types::policy::Perm>()?;
            }
            (
                name,
                json!({"kind": "access", "who": who(&w)?, "pool": pool, "allow": allow}),
            )
        }
        SetCmd::Rate {
            name,
            who: w,
            pool,
            ops,
            bytes,
            max_delay_ms,
        } => {
            if ops.is_none() && bytes.is_none() {
                bail!("give --ops, --bytes or both");
            }
            (
                name,
                json!({"kind": "rate", "who": who(&w)?, "pool": pool, "ops_per_s": ops,
                       "bytes_per_s": bytes, "max_delay_ms": max_delay_ms}),
            )
        }
        SetCmd::Qos {
            name,
            small_bytes,
            priority,
        } => {
            let p: Vec<Value> = priority.iter().map(|w| who(w)).collect::<Result<_>>()?;
            (
                name,
                json!({"kind": "qos", "small_bytes": small_bytes, "priority": p}),
            )
        }
    })
}

/// `sluice policy ls` as text: one line per policy.
fn listing(r: &Value) -> String {
    let mut text = vec![format!(
        "version {}; authentication {}; access control {}",
        r["version"],
        if r["require_auth"] == true {
            "required"
        } else {
            "optional"
        },
        if r["access_control"] == true {
            "on (default deny)"
        } else {
            "off (no access rules)"
        }
    )];
    let rules = r["rules"].as_object();
    for (name, rule) in rules.into_iter().flatten() {
        let who = |v: &Value| -> String {
            serde_json::from_value::<sluice_types::policy::Who>(v.clone())
                .map(|w| w.to_string())
                .unwrap_or_else(|_| v.to_string())
        };
        let line = match rule["kind"].as_str() {
            Some("access") => format!(
                "{name}: access  {} may {} on {}",
                who(&rule["who"]),
                rule["allow"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(","),
                rule["pool"].as_str().unwrap_or("?")
            ),
            Some("rate") => format!(
                "{name}: rate  {}{}: {} ops/s, {} bytes/s, delay up to {} ms",
                who(&rule["who"]),
                rule["pool"]
                    .as_str()
                    .map(|p| format!(" on {p}"))
                    .unwrap_or_default(),
                rule["ops_per_s"]
                    .as_u64()
                    .map_or("-".into(), |v| v.to_string()),
                rule["bytes_per_s"]
                    .as_u64()
                    .map_or("-".into(), |v| v.to_string()),
                rule["max_delay_ms"]
            ),
            Some("qos") => format!(
                "{name}: qos  small requests <= {} bytes first; priority: {}",
                rule["small_bytes"],
                rule["priority"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(who)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => format!("{name}: {rule}"),
        };
        text.push(line);
    }
    lines(text)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_parse() {
        assert_eq!(super::parse_bytes("4096"), Ok(4096));
        assert_eq!(super::parse_bytes("10MB"), Ok(10 << 20));
        assert_eq!(super::parse_bytes("64KiB"), Ok(64 << 10));
        assert!(super::parse_bytes("ten").is_err());
        assert!(super::parse_bytes("1XB").is_err());
    }
}
