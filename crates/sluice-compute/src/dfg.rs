//! Data flow graphs in the shape of Cascade's `dfgs.json`:
//!
//! ```json
//! [{ "id": "demo", "desc": "…",
//!    "graph": [{ "pathname": "/demo/frames",
//!                "user_defined_logic_list": ["onnx"],
//!                "user_defined_logic_config_list": [{ "model_key": "/models/filter" }],
//!                "user_defined_logic_stateful_list": ["stateless"],
//!                "user_defined_logic_hook_list": ["trigger"],
//!                "shard_dispatcher_list": ["one"],
//!                "destinations": [{ "/demo/digits": "trigger_put" }] }] }]
//! ```
//!
//! Lists are per UDL of the vertex; all but `user_defined_logic_list` are
//! optional, with Cascade's defaults (config `{}`, `stateful`, hook `both`,
//! dispatcher `one`, execution environment `pthread`, no destinations).
//! Cascade's files load as its loader reads them: prefixes may end in `/`,
//! configs may be strings holding JSON, lists longer than the UDL list
//! have their extra entries ignored, a vertex may name no UDL, and the
//! older names `object_pool_pathname` / `data_path_logic_list` are read.
//! What Cascade would silently take as a default (an unknown policy, hook,
//! dispatcher or destination mode) and fields Sluice does not support are
//! refused, saying what Cascade would have done; Cascade's scheduler hints
//! are accepted and reported as unused (`DfgFile::notes`).
//!
//! UDLs are named by Sluice name or by an alias (Cascade's UDL UUIDs): the
//! node's registry, `[udl_aliases]` in the node config, an alias file
//! (`parse_aliases`), or the file itself as an object
//! `{"udl_aliases": {"<uuid>": "relay"}, "graphs": [...]}`. A graph is
//! rejected whole, with the JSON path of the first bad field.

use crate::udl::{DestMode, Registry};
use serde_json::{json, Value};
use sluice_types::validate_key;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct DfgError {
    pub path: String,
    pub reason: String,
}

fn err(path: &str, reason: impl Into<String>) -> DfgError {
    DfgError {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// Per-vertex dispatch policy of a UDL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Round-robin over the upcall workers.
    Stateless,
    /// FIFO per key: the same key always runs on the same worker, in order.
    Stateful,
    /// Everything on one worker, in delivery order.
    SingleThreaded,
}

/// Which deliveries fire the UDL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Trigger,
    Ordered,
    Both,
}

/// Which members of the object's shard run the UDL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardDispatcher {
    One,
    All,
}

#[derive(Clone, Debug)]
pub struct VertexUdl {
    pub name: String,
    pub config: Value,
    pub policy: Policy,
    pub hook: Hook,
    pub dispatcher: ShardDispatcher,
    pub destinations: Vec<(String, DestMode)>,
}

#[derive(Clone, Debug)]
pub struct Vertex {
    pub pathname: String,
    pub udls: Vec<VertexUdl>,
}

#[derive(Clone, Debug)]
pub struct Graph {
    pub id: String,
    pub desc: String,
    pub vertices: Vec<Vertex>,
    /// When `dfg apply` took this graph (µs since the Unix epoch; 0 in a
    /// file that was never applied). Each apply stamps it anew, so the
    /// graph's JSON changes and every node of a cluster rebuilds its UDLs
    /// even when only their code changed (a Python module on disk or in a
    /// `code_key` object).
    pub applied_us: u64,
}

#[derive(Clone, Debug)]
pub struct DfgFile {
    pub graphs: Vec<Graph>,
    /// What was read as Cascade reads it but is worth a word to the user:
    /// older field names, ignored extra list entries, scheduler hints
    /// Sluice does not use, vertices without UDLs.
    pub notes: Vec<String>,
    /// The file's `"only_changed": true` (object form): graphs whose
    /// content equals the running graph of the same id are left running
    /// as they are (their UDLs not rebuilt), as `serve --dfgs` wants at
    /// every start.
    pub only_changed: bool,
}

/// `text` (a DFG file, list or object form) with `"only_changed": true`:
/// applying it leaves graphs that already run as given untouched.
pub fn only_changed(text: &str) -> Result<String, DfgError> {
    let mut doc: Value =
        serde_json::from_str(text).map_err(|e| err("$", format!("not valid JSON: {e}")))?;
    if doc.is_array() {
        doc = json!({ "graphs": doc });
    }
    let o = doc
        .as_object_mut()
        .ok_or_else(|| err("$", "a DFG file is a list of graphs"))?;
    o.insert("only_changed".into(), Value::Bool(true));
    Ok(doc.to_string())
}

fn list<'a>(
    v: &'a Value,
    field: &str,
    path: &str,
    n: usize,
    notes: &mut Vec<String>,
) -> Result<Option<&'a Vec<Value>>, DfgError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => {
            if a.len() < n {
                return Err(err(
                    &format!("{path}.{field}"),
                    format!(
                        "has {} entries but the vertex names {n} UDLs (Cascade's loader fails on this file too: it reads one entry per UDL)",
                        a.len()
                    ),
                ));
            }
            if a.len() > n {
                notes.push(format!(
                    "{path}.{field}: {} entries for {n} UDLs; the extra ones are ignored, as Cascade's loader ignores them",
                    a.len()
                ));
            }
            Ok(Some(a))
        }
        Some(_) => Err(err(&format!("{path}.{field}"), "must be a list")),
    }
}

/// A vertex's field under its current name or the older one some of
/// Cascade's files use (`object_pool_pathname`, `data_path_logic_list`).
fn field<'a>(
    v: &'a Value,
    name: &str,
    older: &str,
    vp: &str,
    notes: &mut Vec<String>,
) -> Option<&'a Value> {
    v.get(name).or_else(|| {
        let f = v.get(older)?;
        notes.push(format!(
            "{vp}: read \"{older}\" as \"{name}\" (its name in older Cascade releases)"
        ));
        Some(f)
    })
}

/// The fields of a vertex Sluice reads.
const VERTEX_FIELDS: &[&str] = &[
    "pathname",
    "object_pool_pathname",
    "user_defined_logic_list",
    "data_path_logic_list",
    "user_defined_logic_config_list",
    "user_defined_logic_stateful_list",
    "user_defined_logic_hook_list",
    "shard_dispatcher_list",
    "execution_environment",
    "destinations",
];

/// Hints for Cascade's GPU scheduler: they place nothing in Sluice (its
/// planner does that), so they are accepted and reported as not used.
const SCHEDULER_HINTS: &[&str] = &[
    "required_models_list",
    "required_models_size_list",
    "required_objects_pathnames",
    "input_size",
    "output_size",
    "output_size_list",
    "expected_execution_timeus",
    "expected_execution_timeus_list",
];

fn str_at<'a>(v: &'a Value, path: &str) -> Result<&'a str, DfgError> {
    v.as_str().ok_or_else(|| err(path, "must be a string"))
}

impl DfgFile {
    /// Parses and validates a DFG file; UDL names must resolve in `registry`.
    pub fn parse(text: &str, registry: &Registry) -> Result<DfgFile, DfgError> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| err("$", format!("not valid JSON: {e}")))?;
        let mut registry = registry.clone();
        let mut only_changed = false;
        let graphs = match &root {
            Value::Array(_) => &root,
            Value::Object(o) => {
                if let Some(k) = o
                    .keys()
                    .find(|k| !["graphs", "udl_aliases", "only_changed"].contains(&k.as_str()))
                {
                    return Err(err(
                        &format!("$.{k}"),
                        "unknown field of a DFG file (an object DFG file has graphs, udl_aliases and only_changed)",
                    ));
                }
                if let Some(v) = o.get("only_changed") {
                    only_changed = v
                        .as_bool()
                        .ok_or_else(|| err("$.only_changed", "must be true or false"))?;
                }
                if let Some(a) = o.get("udl_aliases") {
                    let a = a
                        .as_object()
                        .ok_or_else(|| err("$.udl_aliases", "must be an object"))?;
                    for (k, v) in a {
                        registry.alias(k, str_at(v, &format!("$.udl_aliases.{k}"))?);
                    }
                }
                o.get("graphs")
                    .ok_or_else(|| err("$", "an object DFG file needs a \"graphs\" list"))?
            }
            _ => return Err(err("$", "a DFG file is a list of graphs")),
        };
        let graphs = graphs
            .as_array()
            .ok_or_else(|| err("$.graphs", "must be a list"))?;
        let mut out = Vec::new();
        let mut notes = Vec::new();
        for (gi, g) in graphs.iter().enumerate() {
            let gp = format!("$[{gi}]");
            if let Some(o) = g.as_object() {
                if let Some(k) = o
                    .keys()
                    .find(|k| !["id", "desc", "graph", "applied_us"].contains(&k.as_str()))
                {
                    return Err(err(
                        &format!("{gp}.{k}"),
                        "unknown field of a graph (a graph has id, desc and graph; `dfg apply` adds applied_us)",
                    ));
                }
            }
            let id = str_at(
                g.get("id").ok_or_else(|| err(&gp, "missing \"id\""))?,
                &format!("{gp}.id"),
            )?
            .to_string();
            if id.is_empty() {
                return Err(err(&format!("{gp}.id"), "must not be empty"));
            }
            if out.iter().any(|x: &Graph| x.id == id) {
                return Err(err(
                    &format!("{gp}.id"),
                    format!("duplicate graph id {id:?}"),
                ));
            }
            let desc = g
                .get("desc")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let verts = g
                .get("graph")
                .ok_or_else(|| err(&gp, "missing \"graph\" (the list of vertices)"))?;
            let verts = verts
                .as_array()
                .ok_or_else(|| err(&format!("{gp}.graph"), "must be a list"))?;
            let mut vertices = Vec::new();
            for (vi, v) in verts.iter().enumerate() {
                vertices.push(parse_vertex(
                    v,
                    &format!("{gp}.graph[{vi}]"),
                    &registry,
                    &mut notes,
                )?);
            }
            let applied_us = match g.get("applied_us") {
                None => 0,
                Some(v) => v.as_u64().ok_or_else(|| {
                    err(&format!("{gp}.applied_us"), "must be a whole number of µs")
                })?,
            };
            out.push(Graph {
                id,
                desc,
                vertices,
                applied_us,
            });
        }
        Ok(DfgFile {
            graphs: out,
            notes,
            only_changed,
        })
    }
}

fn parse_vertex(
    v: &Value,
    vp: &str,
    registry: &Registry,
    notes: &mut Vec<String>,
) -> Result<Vertex, DfgError> {
    let obj = v
        .as_object()
        .ok_or_else(|| err(vp, "a vertex must be an object"))?;
    for k in obj.keys() {
        if SCHEDULER_HINTS.contains(&k.as_str()) {
            notes.push(format!(
                "{vp}.{k}: a hint for Cascade's GPU scheduler; not used (Sluice places work with `sluice plan`)"
            ));
        } else if !VERTEX_FIELDS.contains(&k.as_str()) {
            return Err(err(
                &format!("{vp}.{k}"),
                format!(
                    "unknown field of a vertex; Sluice reads {}",
                    VERTEX_FIELDS.join(", ")
                ),
            ));
        }
    }
    let pathname = str_at(
        field(v, "pathname", "object_pool_pathname", vp, notes)
            .ok_or_else(|| err(vp, "missing \"pathname\""))?,
        &format!("{vp}.pathname"),
    )?;
    // Cascade writes prefixes with a trailing `/` ("/pool/vertex/"): the
    // same prefix.
    let pathname = cascade_prefix(pathname);
    validate_key(pathname, 1024).map_err(|e| err(&format!("{vp}.pathname"), e.to_string()))?;
    let names = field(
        v,
        "user_defined_logic_list",
        "data_path_logic_list",
        vp,
        notes,
    )
    .ok_or_else(|| err(vp, "missing \"user_defined_logic_list\""))?
    .as_array()
    .ok_or_else(|| err(&format!("{vp}.user_defined_logic_list"), "must be a list"))?;
    if names.is_empty() {
        // Cascade loads such a vertex and runs nothing on it; its files
        // use one to say that a pool is a destination.
        notes.push(format!(
            "{vp}: vertex {pathname} names no UDL; nothing runs there (as in Cascade)"
        ));
    }
    let n = names.len();
    let configs = list(v, "user_defined_logic_config_list", vp, n, notes)?;
    let stateful = list(v, "user_defined_logic_stateful_list", vp, n, notes)?;
    let hooks = list(v, "user_defined_logic_hook_list", vp, n, notes)?;
    let dispatchers = list(v, "shard_dispatcher_list", vp, n, notes)?;
    let environments = list(v, "execution_environment", vp, n, notes)?;
    let dests = list(v, "destinations", vp, n, notes)?;
    let mut udls = Vec::new();
    for i in 0..n {
        let np = format!("{vp}.user_defined_logic_list[{i}]");
        let raw = str_at(&names[i], &np)?;
        let name = registry
            .resolve(raw)
            .ok_or_else(|| {
                err(
                    &np,
                    format!(
                        "unknown UDL {raw:?}; registered: {}",
                        registry.names().join(", ")
                    ),
                )
            })?
            .to_string();
        let cp = format!("{vp}.user_defined_logic_config_list[{i}]");
        let config = match configs.map(|c| &c[i]) {
            None => Value::Object(Default::default()),
            Some(c @ Value::Object(_)) => c.clone(),
            // Cascade's files also give a config as a string holding JSON.
            Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                Ok(c @ Value::Object(_)) => c,
                _ => {
                    return Err(err(
                        &cp,
                        "a string config must hold a JSON object (Cascade hands the UDL the parsed JSON; Sluice's UDLs read named fields from an object)",
                    ))
                }
            },
            Some(_) => return Err(err(&cp, "must be an object (or a string holding one)")),
        };
        // Cascade's default is stateful (FIFO per key): a Cascade graph
        // keeps its per-key order here too.
        let policy = match stateful.map(|s| &s[i]) {
            None => Policy::Stateful,
            Some(s) => match str_at(s, &format!("{vp}.user_defined_logic_stateful_list[{i}]"))? {
                "stateless" => Policy::Stateless,
                "stateful" => Policy::Stateful,
                "singlethreaded" | "single_threaded" => Policy::SingleThreaded,
                other => {
                    return Err(err(
                        &format!("{vp}.user_defined_logic_stateful_list[{i}]"),
                        format!(
                            "unknown policy {other:?}; use stateless, stateful or singlethreaded (Cascade would run it as stateful)"
                        ),
                    ))
                }
            },
        };
        let hook = match hooks.map(|s| &s[i]) {
            None => Hook::Both,
            Some(s) => match str_at(s, &format!("{vp}.user_defined_logic_hook_list[{i}]"))? {
                "trigger" => Hook::Trigger,
                "ordered" => Hook::Ordered,
                "both" => Hook::Both,
                other => {
                    return Err(err(
                        &format!("{vp}.user_defined_logic_hook_list[{i}]"),
                        format!("unknown hook {other:?}; use trigger, ordered or both (Cascade would take it as both)"),
                    ))
                }
            },
        };
        let dispatcher = match dispatchers.map(|s| &s[i]) {
            None => ShardDispatcher::One,
            Some(s) => match str_at(s, &format!("{vp}.shard_dispatcher_list[{i}]"))? {
                "one" => ShardDispatcher::One,
                "all" => ShardDispatcher::All,
                other => {
                    return Err(err(
                        &format!("{vp}.shard_dispatcher_list[{i}]"),
                        format!("unknown dispatcher {other:?}; use one or all (Cascade would take it as one)"),
                    ))
                }
            },
        };
        if let Some(e) = environments.map(|e| &e[i]) {
            check_environment(
                e,
                &format!("{vp}.execution_environment[{i}]"),
                &name,
                registry,
            )?;
        }
        let mut destinations = Vec::new();
        if let Some(d) = dests.map(|d| &d[i]) {
            let dp = format!("{vp}.destinations[{i}]");
            let d = d.as_object().ok_or_else(|| {
                err(
                    &dp,
                    "must be an object {\"/pool\": \"put\"|\"trigger_put\"}",
                )
            })?;
            for (raw, mode) in d {
                let pool = cascade_prefix(raw);
                validate_key(pool, 1024).map_err(|e| err(&format!("{dp}.{raw}"), e.to_string()))?;
                let mode = match str_at(mode, &format!("{dp}.{raw}"))? {
                    "put" => DestMode::Put,
                    "trigger_put" => DestMode::TriggerPut,
                    other => {
                        return Err(err(
                            &format!("{dp}.{raw}"),
                            format!("unknown mode {other:?}; use put or trigger_put (Cascade would take it as put)"),
                        ))
                    }
                };
                destinations.push((pool.to_string(), mode));
            }
        }
        udls.push(VertexUdl {
            name,
            config,
            policy,
            hook,
            dispatcher,
            destinations,
        });
    }
    Ok(Vertex {
        pathname: pathname.to_string(),
        udls,
    })
}

/// Cascade's `execution_environment` entry for one UDL: `pthread` (in the
/// node's process) runs as every Sluice UDL does; `process` only for a UDL
/// that runs its code in worker processes (Python); the rest is refused.
fn check_environment(
    e: &Value,
    path: &str,
    udl: &str,
    registry: &Registry,
) -> Result<(), DfgError> {
    let mode = e
        .get("mode")
        .ok_or_else(|| err(path, "needs a \"mode\" (pthread or process)"))?;
    match str_at(mode, &format!("{path}.mode"))? {
        "pthread" => Ok(()),
        "process" if registry.is_out_of_process(udl) => Ok(()),
        "process" => Err(err(
            &format!("{path}.mode"),
            format!("UDL {udl:?} runs in the node's process; in Sluice only Python UDLs (\"python\") run in worker processes"),
        )),
        other => Err(err(
            &format!("{path}.mode"),
            format!("execution environment {other:?} is not supported; use pthread (in the node) or process (Python UDLs)"),
        )),
    }
}

impl Graph {
    /// The graph back in `dfgs.json` shape (for listing and persistence).
    pub fn to_json(&self) -> Value {
        let verts: Vec<Value> = self
            .vertices
            .iter()
            .map(|v| {
                let f = |g: &dyn Fn(&VertexUdl) -> Value| Value::Array(v.udls.iter().map(g).collect());
                json!({
                    "pathname": v.pathname,
                    "user_defined_logic_list": f(&|u| json!(u.name)),
                    "user_defined_logic_config_list": f(&|u| u.config.clone()),
                    "user_defined_logic_stateful_list": f(&|u| json!(match u.policy {
                        Policy::Stateless => "stateless",
                        Policy::Stateful => "stateful",
                        Policy::SingleThreaded => "singlethreaded",
                    })),
                    "user_defined_logic_hook_list": f(&|u| json!(match u.hook {
                        Hook::Trigger => "trigger",
                        Hook::Ordered => "ordered",
                        Hook::Both => "both",
                    })),
                    "shard_dispatcher_list": f(&|u| json!(match u.dispatcher {
                        ShardDispatcher::One => "one",
                        ShardDispatcher::All => "all",
                    })),
                    "destinations": f(&|u| {
                        let m: serde_json::Map<String, Value> = u
                            .destinations
                            .iter()
                            .map(|(p, m)| (p.clone(), json!(if *m == DestMode::Put { "put" } else { "trigger_put" })))
                            .collect();
                        Value::Object(m)
                    }),
                })
            })
            .collect();
        let mut g = json!({"id": self.id, "desc": self.desc, "graph": verts});
        if self.applied_us != 0 {
            g["applied_us"] = json!(self.applied_us);
        }
        g
    }

    /// Whether `other` is this graph, its `applied_us` aside.
    pub fn same_content(&self, other: &Graph) -> bool {
        let strip = |g: &Graph| {
            let mut j = g.to_json();
            if let Some(o) = j.as_object_mut() {
                o.remove("applied_us");
            }
            j
        };
        strip(self) == strip(other)
    }
}

/// Whether a key under `a` can also be under `b` (one path is a prefix of
/// the other on a segment boundary): an emit to destination `a` (plus any
/// suffix) can then trigger the vertex `b`.
fn paths_overlap(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_end_matches('/'), b.trim_end_matches('/'));
    let under = |x: &str, y: &str| {
        y.is_empty() || x == y || (x.starts_with(y) && x.as_bytes().get(y.len()) == Some(&b'/'))
    };
    under(a, b) || under(b, a)
}

/// A cycle among vertices, as the pathnames along it (the first repeated
/// at the end), if the destinations of `vertices` (pathname, destinations)
/// lead back to where they started.
pub fn find_cycle(vertices: &[(String, Vec<String>)]) -> Option<Vec<String>> {
    let next: Vec<Vec<usize>> = vertices
        .iter()
        .map(|(_, dests)| {
            (0..vertices.len())
                .filter(|&j| dests.iter().any(|d| paths_overlap(d, &vertices[j].0)))
                .collect()
        })
        .collect();
    // Iterative depth-first search with colours: 0 new, 1 on the path, 2 done.
    let mut colour = vec![0u8; vertices.len()];
    for root in 0..vertices.len() {
        if colour[root] != 0 {
            continue;
        }
        let mut path = vec![(root, 0usize)];
        colour[root] = 1;
        while let Some((v, i)) = path.last_mut() {
            let v = *v;
            match next[v].get(*i) {
                Some(&w) => {
                    *i += 1;
                    if colour[w] == 1 {
                        let start = path.iter().position(|(p, _)| *p == w).unwrap_or(0);
                        let mut cycle: Vec<String> = path[start..]
                            .iter()
                            .map(|(p, _)| vertices[*p].0.clone())
                            .collect();
                        cycle.push(vertices[w].0.clone());
                        return Some(cycle);
                    }
                    if colour[w] == 0 {
                        colour[w] = 1;
                        path.push((w, 0));
                    }
                }
                None => {
                    colour[v] = 2;
                    path.pop();
                }
            }
        }
    }
    None
}

/// An alias file: one `<alias> <udl>` (or `<alias> = <udl>`) per line,
/// `#` starts a comment. It takes the place of Cascade's `udl_dlls.cfg`,
/// which names the shared objects whose UDLs a node loads: Sluice cannot
/// load those, so each UUID is mapped to a Sluice UDL instead.
pub fn parse_aliases(text: &str) -> Result<Vec<(String, String)>, DfgError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = format!("line {}", i + 1);
        let parts: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == '=')
            .filter(|p| !p.is_empty())
            .collect();
        match parts.as_slice() {
            [alias, udl] => out.push((alias.to_string(), udl.to_string())),
            [one] if one.ends_with(".so") => {
                return Err(err(
                    &at,
                    format!("{one:?} is a Cascade UDL library (udl_dlls.cfg); Sluice cannot load it: write `<uuid> <sluice udl>` for each UDL it holds"),
                ))
            }
            _ => {
                return Err(err(
                    &at,
                    format!("expected `<uuid> <udl>`, found {line:?}"),
                ))
            }
        }
    }
    Ok(out)
}

/// A prefix as Cascade writes it (`/pool/vertex/`) as Sluice names it
/// (`/pool/vertex`); `/` alone stays.
fn cascade_prefix(p: &str) -> &str {
    match p.trim_end_matches('/') {
        "" => p,
        t => t,
    }
}

#[cfg(test)]
mod cascade_shape_tests {
    use super::*;

    fn parse(text: &str) -> Result<DfgFile, DfgError> {
        let mut r = Registry::default();
        r.register("relay", |_: &Value, _: &crate::Context| {
            Err::<std::sync::Arc<dyn crate::Udl>, _>("not built in this test".to_string())
        });
        DfgFile::parse(text, &r)
    }

    /// Issue #17: Cascade's files end prefixes with `/` and give configs
    /// as strings holding JSON; both load, as Cascade reads them.
    #[test]
    fn trailing_slashes_and_string_configs_load_as_cascade_reads_them() {
        let f = parse(
            r#"[{"id": "g", "graph": [{"pathname": "/pool/v/",
                "user_defined_logic_list": ["relay"],
                "user_defined_logic_config_list": ["{\"k\": 1}"],
                "destinations": [{"/out/": "put"}]}]}]"#,
        )
        .unwrap();
        let v = &f.graphs[0].vertices[0];
        assert_eq!(v.pathname, "/pool/v");
        assert_eq!(v.udls[0].config, serde_json::json!({"k": 1}));
        assert_eq!(
            v.udls[0].destinations,
            vec![("/out".to_string(), DestMode::Put)]
        );
        let e = parse(
            r#"[{"id": "g", "graph": [{"pathname": "/p", "user_defined_logic_list": ["relay"],
                "user_defined_logic_config_list": ["not json"]}]}]"#,
        )
        .unwrap_err();
        assert!(
            e.path.ends_with("user_defined_logic_config_list[0]")
                && e.reason.contains("JSON object"),
            "{e}"
        );
        let e = parse(
            r#"[{"id": "g", "graph": [{"pathname": "/p", "user_defined_logic_list": ["relay"],
                "user_defined_logic_config_list": [7]}]}]"#,
        )
        .unwrap_err();
        assert!(e.reason.contains("must be an object"), "{e}");
    }

    /// `applied_us` (what `dfg apply` stamps) round-trips and is not part
    /// of a graph's content; `only_changed` is read from the object form,
    /// and other fields there are refused.
    #[test]
    fn applied_stamps_and_only_changed() {
        let one =
            r#"[{"id": "g", "graph": [{"pathname": "/p", "user_defined_logic_list": ["relay"]}]}]"#;
        let a = parse(one).unwrap();
        assert!(!a.only_changed);
        assert_eq!(a.graphs[0].applied_us, 0);
        assert!(a.graphs[0].to_json().get("applied_us").is_none());
        let mut b = a.graphs[0].clone();
        b.applied_us = 42;
        let back = parse(&format!("[{}]", b.to_json())).unwrap();
        assert_eq!(back.graphs[0].applied_us, 42);
        assert!(back.graphs[0].same_content(&a.graphs[0]));
        b.desc = "other".into();
        assert!(!b.same_content(&a.graphs[0]));
        let o = parse(&only_changed(one).unwrap()).unwrap();
        assert!(o.only_changed && o.graphs.len() == 1);
        let e = parse(r#"{"graphs": [], "only_chnaged": true}"#).unwrap_err();
        assert_eq!(e.path, "$.only_chnaged", "{e}");
        let e = parse(r#"[{"id": "g", "applied_us": "now", "graph": []}]"#).unwrap_err();
        assert!(e.path.ends_with("applied_us"), "{e}");
    }
}

#[cfg(test)]
mod cycle_tests {
    use super::*;

    fn v(p: &str, d: &[&str]) -> (String, Vec<String>) {
        (p.to_string(), d.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn cycles_are_found_and_named_chains_are_not_cycles() {
        assert_eq!(
            find_cycle(&[v("/trig/a", &["/trig/b"]), v("/trig/b", &["/trig/a"])]),
            Some(vec!["/trig/a".into(), "/trig/b".into(), "/trig/a".into()])
        );
        // A vertex emitting under its own prefix.
        assert_eq!(
            find_cycle(&[v("/trig/a", &["/trig/a/out"])]),
            Some(vec!["/trig/a".into(), "/trig/a".into()])
        );
        // A chain, and a destination that is only a sibling by name.
        assert_eq!(
            find_cycle(&[
                v("/trig/a", &["/trig/b"]),
                v("/trig/b", &["/vol/out"]),
                v("/trig/ab", &["/trig/abc"]),
            ]),
            None
        );
        // A longer cycle through a destination above the vertex.
        let c = find_cycle(&[
            v("/in", &["/mid/x"]),
            v("/mid/x/y", &["/out"]),
            v("/out", &["/in/again"]),
        ])
        .unwrap();
        assert_eq!(c.first(), c.last());
        assert_eq!(c.len(), 4);
    }
}
