//! The `sluice place` input, TOML or JSON (`examples/place/moe.toml`):
//!
//! ```toml
//! name = "moe-8"
//! slots = 2              # replica slots per node
//! floor = 1              # replicas per part at least
//! nodes = 6              # n0..n5; or [[nodes]] with name and domain
//! [failures]
//! survivors = 3          # R of the N nodes survive; or domains = 1
//! [[parts]]
//! name = "expert-0"
//! load = 120.0           # replicas in proportion; `replicas = 3` fixes them
//! ```
//!
//! A current plan (`--from`) is the same file with a `[placement]` table
//! (part -> node names), as `sluice place --export` writes it; nodes gone
//! are those no longer listed, or named in `failed = [...]`. The export
//! also gives each node the `id` and `address` its layout runs it under;
//! a node listed without an `id` has its place in the list (before any
//! failed node is taken out), so plans after a failure keep the ids, or,
//! where another node has that id, one above every id given.

use super::{Failures, Node, Part, PlaceProblem, Placement};
use crate::error::{PlanError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct FailuresIn {
    survivors: Option<usize>,
    domains: Option<usize>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct NodeIn {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    address: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
enum NodesIn {
    Count(usize),
    List(Vec<NodeIn>),
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PartIn {
    name: String,
    load: f64,
    replicas: Option<usize>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct FileIn {
    #[serde(default)]
    name: String,
    slots: usize,
    #[serde(default = "one")]
    floor: usize,
    nodes: NodesIn,
    failures: FailuresIn,
    parts: Vec<PartIn>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    failed: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    placement: BTreeMap<String, Vec<String>>,
}

fn one() -> usize {
    1
}

/// A problem read from a file, with the current placement it names (if
/// any) and the replicas that placement had on nodes now gone.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub problem: PlaceProblem,
    pub current: Option<Placement>,
    /// (part, node name) of replicas on nodes no longer in the problem.
    pub lost: Vec<(String, String)>,
    /// The nodes named in `failed`, with their ids.
    pub gone: Vec<Node>,
    /// Nodes listed without an id where others have one (as an export
    /// writes them): added since the export, so not yet in the layout
    /// the cluster runs.
    pub added: Vec<String>,
}

pub fn parse(text: &str, file: &str) -> Result<Loaded> {
    let raw: FileIn = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| PlanError::File {
            file: file.into(),
            reason: e.to_string(),
        })?
    } else {
        toml::from_str(text).map_err(|e| PlanError::File {
            file: file.into(),
            reason: e.to_string(),
        })?
    };
    let field = |f: &str, r: String| PlanError::Field {
        file: file.into(),
        field: f.into(),
        reason: r,
    };
    // Nodes listed without an id beside nodes with one: added to the
    // plan by hand since its export, so not in the running layout yet.
    let mut added = Vec::new();
    let nodes: Vec<Node> = match raw.nodes {
        NodesIn::Count(n) => (0..n)
            .map(|i| Node {
                name: format!("n{i}"),
                domain: None,
                id: i as u32,
                address: None,
            })
            .collect(),
        NodesIn::List(l) => {
            // A node without an id takes its place in the list, or, where
            // another node has that id, one above every id given (a node
            // added to a plan whose others carry ids: never the id of a
            // node deleted from the file, which the cluster may still have).
            let mut taken: std::collections::BTreeSet<u32> =
                l.iter().filter_map(|n| n.id).collect();
            let mut out = Vec::with_capacity(l.len());
            let some_given = !taken.is_empty();
            for (i, n) in l.into_iter().enumerate() {
                if n.id.is_none() && some_given {
                    added.push(n.name.clone());
                }
                let id = n.id.unwrap_or_else(|| {
                    let id = if taken.contains(&(i as u32)) {
                        taken.last().map_or(0, |m| m.saturating_add(1))
                    } else {
                        i as u32
                    };
                    taken.insert(id);
                    id
                });
                out.push(Node {
                    name: n.name,
                    domain: n.domain,
                    id,
                    address: n.address,
                });
            }
            out
        }
    };
    for (i, n) in nodes.iter().enumerate() {
        if nodes[..i].iter().any(|m| m.name == n.name) {
            return Err(field("nodes", format!("node {:?} appears twice", n.name)));
        }
        if let Some(m) = nodes[..i].iter().find(|m| m.id == n.id) {
            return Err(field(
                "nodes",
                format!(
                    "nodes {:?} and {:?} have the same id {}",
                    m.name, n.name, n.id
                ),
            ));
        }
        if let Some(a) = &n.address {
            if a.parse::<std::net::SocketAddr>().is_err() {
                return Err(field(
                    "nodes",
                    format!(
                        "node {:?}: address {a:?} is not an IP address and port",
                        n.name
                    ),
                ));
            }
            if let Some(m) = nodes[..i].iter().find(|m| m.address.as_ref() == Some(a)) {
                return Err(field(
                    "nodes",
                    format!(
                        "nodes {:?} and {:?} have the same address {a}",
                        m.name, n.name
                    ),
                ));
            }
        }
    }
    for f in &raw.failed {
        if !nodes.iter().any(|n| &n.name == f) {
            return Err(field("failed", format!("{f:?} is not a node")));
        }
    }
    let (nodes, gone): (Vec<Node>, Vec<Node>) = nodes
        .into_iter()
        .partition(|n| !raw.failed.contains(&n.name));
    let failures =
        match (raw.failures.survivors, raw.failures.domains) {
            (Some(r), None) => Failures::Survivors(r),
            (None, Some(k)) => Failures::Domains(k),
            _ => return Err(field(
                "failures",
                "give exactly one of survivors (R of N nodes survive) or domains (k domains fail)"
                    .into(),
            )),
        };
    let parts: Vec<Part> = raw
        .parts
        .into_iter()
        .map(|p| Part {
            name: p.name,
            load: p.load,
            replicas: p.replicas,
        })
        .collect();
    for (i, p) in parts.iter().enumerate() {
        if parts[..i].iter().any(|q| q.name == p.name) {
            return Err(field("parts", format!("part {:?} appears twice", p.name)));
        }
    }
    let problem = PlaceProblem {
        name: raw.name,
        nodes,
        slots: raw.slots,
        floor: raw.floor,
        parts,
        failures,
    };
    problem.validate().map_err(|e| PlanError::File {
        file: file.into(),
        reason: e.to_string(),
    })?;
    let mut lost = Vec::new();
    let current = if raw.placement.is_empty() {
        None
    } else {
        let mut pl = Placement::empty(problem.parts.len());
        for (part, holders) in &raw.placement {
            let e = problem
                .parts
                .iter()
                .position(|p| &p.name == part)
                .ok_or_else(|| field("placement", format!("{part:?} is not a part")))?;
            for h in holders {
                match problem.nodes.iter().position(|n| &n.name == h) {
                    Some(n) => pl.holders[e] |= 1 << n,
                    None => lost.push((part.clone(), h.clone())),
                }
            }
        }
        Some(pl)
    };
    Ok(Loaded {
        problem,
        current,
        lost,
        gone,
        added,
    })
}

pub fn load(path: &Path) -> Result<Loaded> {
    let text = std::fs::read_to_string(path).map_err(|e| PlanError::File {
        file: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse(&text, &path.display().to_string())
}

/// The problem and `pl` as a file `parse` reads back (what `--export`
/// writes as `placement.toml`, and `--from` takes).
pub fn to_toml(p: &PlaceProblem, pl: &Placement) -> String {
    let file = FileIn {
        name: p.name.clone(),
        slots: p.slots,
        floor: p.floor,
        nodes: NodesIn::List(
            p.nodes
                .iter()
                .map(|n| NodeIn {
                    name: n.name.clone(),
                    domain: n.domain.clone(),
                    id: Some(n.id),
                    address: n.address.clone(),
                })
                .collect(),
        ),
        failures: match p.failures {
            Failures::Survivors(r) => FailuresIn {
                survivors: Some(r),
                domains: None,
            },
            Failures::Domains(k) => FailuresIn {
                survivors: None,
                domains: Some(k),
            },
        },
        parts: p
            .parts
            .iter()
            .map(|x| PartIn {
                name: x.name.clone(),
                load: x.load,
                replicas: x.replicas,
            })
            .collect(),
        failed: Vec::new(),
        placement: p
            .parts
            .iter()
            .zip(&pl.holders)
            .map(|(x, m)| {
                (
                    x.name.clone(),
                    (0..p.nodes.len())
                        .filter(|n| m & (1 << n) != 0)
                        .map(|n| p.nodes[n].name.clone())
                        .collect(),
                )
            })
            .collect(),
    };
    toml::to_string(&file).unwrap_or_default()
}
