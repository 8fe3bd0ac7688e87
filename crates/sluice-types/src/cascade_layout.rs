//! Cascade's `layout.json` as a Sluice cluster layout.
//!
//! Cascade (Derecho) describes its subgroups per type, each with per-shard
//! lists (`min_nodes_by_shard`, `max_nodes_by_shard`,
//! `delivery_modes_by_shard`, `reserved_node_ids_by_shard`,
//! `profiles_by_shard`); node addresses live in each node's `derecho.cfg`.
//! The mapping:
//!
//! - `VolatileCascadeStoreWithStringKey`, `PersistentCascadeStoreWithStringKey`
//!   and `TriggerCascadeNoStoreWithStringKey` become Sluice's volatile,
//!   persistent and trigger subgroups, in order (several per type and
//!   members shared between shards are kept as they are).
//! - `CascadeMetadataService`: Sluice's metadata group is every node of
//!   the layout; its members are added to the nodes.
//! - A shard's members are its `reserved_node_ids_by_shard`. Sluice's shards
//!   do not grow by themselves: a `max_nodes_by_shard` above the reserved
//!   count is noted (grow a shard with `sluice cluster add-member`); a shard
//!   with no reserved ids, fewer than `min_nodes_by_shard`, or more than
//!   `max_nodes_by_shard` is refused.
//! - `delivery_modes_by_shard`: `Ordered` everywhere; `Raw` (unordered) only
//!   on trigger subgroups, which Sluice does not replicate anyway (noted);
//!   refused on stores.
//! - `profiles_by_shard` select Derecho transport settings: only `DEFAULT`.
//! - Any other type or field is refused, naming it.
//! - Node `n` listens on the base address's port + `n` (127.0.0.1:7420 + n
//!   unless told otherwise).
//!
//! Some of Cascade's files end with a stray `'` after the JSON (cut from a
//! `derecho.cfg` string); Derecho's parser stops after the first value, so
//! whitespace and quotes after it are accepted here too.

use crate::cluster::{ClusterLayout, NodeSpec, SubgroupSpec};
use serde_json::Value;
use std::collections::BTreeSet;
use std::net::SocketAddr;

/// A layout read from Cascade's `layout.json`, with what the mapping noted.
#[derive(Clone, Debug)]
pub struct Imported {
    pub layout: ClusterLayout,
    pub notes: Vec<String>,
}

const SHARD_FIELDS: &[&str] = &[
    "min_nodes_by_shard",
    "max_nodes_by_shard",
    "delivery_modes_by_shard",
    "reserved_node_ids_by_shard",
    "profiles_by_shard",
];

/// Whether `text` looks like Cascade's JSON (a list of objects) rather
/// than a TOML layout (which may start with `[[nodes]]` or `[section]`).
pub fn is_cascade_json(text: &str) -> bool {
    let mut c = text.chars().filter(|c| !c.is_whitespace());
    c.next() == Some('[') && matches!(c.next(), Some('{') | Some(']'))
}

/// Reads Cascade's `layout.json`; node `n` gets `base` with port + `n`.
pub fn import(text: &str, base: SocketAddr) -> Result<Imported, String> {
    let mut it = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let root = match it.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => return Err(format!("not valid JSON: {e}")),
        None => return Err("empty file".into()),
    };
    let rest = &text[it.byte_offset()..];
    if let Some(c) = rest.chars().find(|c| !c.is_whitespace() && *c != '\'') {
        return Err(format!(
            "unexpected {c:?} after the layout's JSON list (only whitespace or a stray ' may follow)"
        ));
    }
    let types = root
        .as_array()
        .ok_or("$: Cascade's layout.json is a list of {\"type_alias\", \"layout\"} entries")?;
    let mut layout = ClusterLayout {
        version: 1,
        consensus: Default::default(),
        nodes: Vec::new(),
        subgroups: Default::default(),
    };
    let mut ids = BTreeSet::new();
    let mut notes = Vec::new();
    for (ti, t) in types.iter().enumerate() {
        let tp = format!("$[{ti}]");
        let obj = t.as_object().ok_or(format!("{tp}: must be an object"))?;
        if let Some(k) = obj.keys().find(|k| *k != "type_alias" && *k != "layout") {
            return Err(format!(
                "{tp}.{k}: unknown field (an entry has type_alias and layout)"
            ));
        }
        let alias = obj
            .get("type_alias")
            .and_then(Value::as_str)
            .ok_or(format!("{tp}.type_alias: missing or not a string"))?;
        let (kind, target) = match alias {
            "VolatileCascadeStoreWithStringKey" => ("volatile", Some(&mut layout.subgroups.volatile)),
            "PersistentCascadeStoreWithStringKey" => {
                ("persistent", Some(&mut layout.subgroups.persistent))
            }
            "TriggerCascadeNoStoreWithStringKey" => ("trigger", Some(&mut layout.subgroups.trigger)),
            "CascadeMetadataService" => ("metadata", None),
            other => {
                return Err(format!(
                    "{tp}.type_alias: {other:?} has no Sluice equivalent (Sluice has volatile, persistent and trigger pools, and a metadata group); remove it or map its pools to one of those"
                ))
            }
        };
        let subgroups = obj
            .get("layout")
            .and_then(Value::as_array)
            .ok_or(format!("{tp}.layout: missing or not a list of subgroups"))?;
        let mut specs = Vec::new();
        for (gi, g) in subgroups.iter().enumerate() {
            let gp = format!("{tp}.layout[{gi}]");
            let shards = subgroup(g, &gp, kind, &mut notes)?;
            for m in shards.iter().flatten() {
                ids.insert(*m);
            }
            specs.push(SubgroupSpec { shards });
        }
        match target {
            Some(t) => t.extend(specs),
            None => notes.push(format!(
                "{tp}: Sluice's metadata group is every node of the layout (Cascade's CascadeMetadataService members are among them)"
            )),
        }
    }
    if ids.is_empty() {
        return Err("the layout names no node".into());
    }
    for id in ids {
        let port = u32::from(base.port()) + id;
        let port = u16::try_from(port)
            .map_err(|_| format!("node {id}: port {} + {id} is past 65535", base.port()))?;
        layout.nodes.push(NodeSpec {
            id,
            address: SocketAddr::new(base.ip(), port).into(),
            name: None,
            labels: Default::default(),
        });
    }
    layout.validate()?;
    Ok(Imported { layout, notes })
}

/// One subgroup's shards (member ids), checked against Sluice's model.
fn subgroup(
    g: &Value,
    gp: &str,
    kind: &str,
    notes: &mut Vec<String>,
) -> Result<Vec<Vec<u32>>, String> {
    let obj = g.as_object().ok_or(format!("{gp}: must be an object"))?;
    if let Some(k) = obj.keys().find(|k| !SHARD_FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "{gp}.{k}: unknown field; a subgroup has {}",
            SHARD_FIELDS.join(", ")
        ));
    }
    let list = |f: &str| -> Result<Option<&Vec<Value>>, String> {
        match obj.get(f) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(_) => Err(format!("{gp}.{f}: must be a list (one entry per shard)")),
        }
    };
    let reserved = list("reserved_node_ids_by_shard")?.ok_or(format!(
        "{gp}.reserved_node_ids_by_shard: missing; Sluice's shards have fixed members, listed here"
    ))?;
    let n = reserved.len();
    if n == 0 {
        return Err(format!(
            "{gp}.reserved_node_ids_by_shard: a subgroup needs a shard"
        ));
    }
    for f in SHARD_FIELDS {
        if let Some(a) = list(f)? {
            if a.len() != n {
                return Err(format!(
                    "{gp}.{f}: {} entries for {n} shards (reserved_node_ids_by_shard)",
                    a.len()
                ));
            }
        }
    }
    let mut shards = Vec::with_capacity(n);
    for s in 0..n {
        let at = |f: &str| format!("{gp}.{f}[{s}]");
        let members: Vec<u32> = reserved[s]
            .as_array()
            .ok_or(format!(
                "{}: must be a list of node ids",
                at("reserved_node_ids_by_shard")
            ))?
            .iter()
            .map(|v| {
                number(v).ok_or(format!(
                    "{}: {v} is not a node id",
                    at("reserved_node_ids_by_shard")
                ))
            })
            .collect::<Result<_, _>>()?;
        if members.is_empty() {
            return Err(format!(
                "{}: empty; Cascade would fill the shard with unreserved nodes, Sluice needs its members listed",
                at("reserved_node_ids_by_shard")
            ));
        }
        let bound = |f: &str| -> Result<Option<u32>, String> {
            match list(f)? {
                None => Ok(None),
                Some(a) => {
                    number(&a[s])
                        .map(Some)
                        .ok_or(format!("{}: {} is not a count", at(f), a[s]))
                }
            }
        };
        let k = members.len() as u32;
        if let Some(min) = bound("min_nodes_by_shard")? {
            if k < min {
                return Err(format!(
                    "{}: {min}, but only {k} nodes are reserved; Cascade would wait for more, Sluice needs them listed in reserved_node_ids_by_shard",
                    at("min_nodes_by_shard")
                ));
            }
        }
        if let Some(max) = bound("max_nodes_by_shard")? {
            if k > max {
                return Err(format!(
                    "{}: {max}, but {k} nodes are reserved; Cascade would use only {max} of them",
                    at("max_nodes_by_shard")
                ));
            }
            if k < max {
                notes.push(format!(
                    "{}: {max}; the shard starts with its {k} reserved nodes and grows only with `sluice cluster add-member` (Sluice does not add nodes by itself)",
                    at("max_nodes_by_shard")
                ));
            }
        }
        if let Some(a) = list("delivery_modes_by_shard")? {
            match a[s].as_str() {
                Some("Ordered") => {}
                Some("Raw") if kind == "trigger" => notes.push(format!(
                    "{}: Raw; Sluice's trigger shards are not replicated, so a trigger put reaches the member it is sent to, unordered with others (as Raw)",
                    at("delivery_modes_by_shard")
                )),
                Some("Raw") => {
                    return Err(format!(
                        "{}: Raw (unordered) delivery is not offered for stored pools; Sluice replicates every write in order: use Ordered",
                        at("delivery_modes_by_shard")
                    ))
                }
                _ => {
                    return Err(format!(
                        "{}: {}; use Ordered (or Raw on trigger subgroups)",
                        at("delivery_modes_by_shard"),
                        a[s]
                    ))
                }
            }
        }
        if let Some(a) = list("profiles_by_shard")? {
            if a[s].as_str() != Some("DEFAULT") {
                return Err(format!(
                    "{}: {}; profiles pick Derecho transport settings in derecho.cfg, which Sluice has none of: use DEFAULT",
                    at("profiles_by_shard"),
                    a[s]
                ));
            }
        }
        shards.push(members);
    }
    Ok(shards)
}

/// A count or node id, written as a number or as a string holding one
/// (Cascade's files do both).
fn number(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> SocketAddr {
        "127.0.0.1:7420".parse().unwrap()
    }

    const SERVICE: &str = r#"[
      {"type_alias": "CascadeMetadataService", "layout": [{"min_nodes_by_shard": ["1"], "max_nodes_by_shard": ["1"], "delivery_modes_by_shard": ["Ordered"], "reserved_node_ids_by_shard": [["0"]], "profiles_by_shard": ["DEFAULT"]}]},
      {"type_alias": "VolatileCascadeStoreWithStringKey", "layout": [
          {"min_nodes_by_shard": ["1","1"], "max_nodes_by_shard": ["3","1"], "delivery_modes_by_shard": ["Ordered","Ordered"], "reserved_node_ids_by_shard": [["1","2","3"],["0"]], "profiles_by_shard": ["DEFAULT","DEFAULT"]},
          {"min_nodes_by_shard": [1], "max_nodes_by_shard": [2], "delivery_modes_by_shard": ["Ordered"], "reserved_node_ids_by_shard": [[2, 3]], "profiles_by_shard": ["DEFAULT"]}]},
      {"type_alias": "PersistentCascadeStoreWithStringKey", "layout": [{"min_nodes_by_shard": ["1"], "max_nodes_by_shard": ["3"], "delivery_modes_by_shard": ["Ordered"], "reserved_node_ids_by_shard": [["0"]], "profiles_by_shard": ["DEFAULT"]}]},
      {"type_alias": "TriggerCascadeNoStoreWithStringKey", "layout": [{"min_nodes_by_shard": ["1"], "max_nodes_by_shard": ["1"], "delivery_modes_by_shard": ["Raw"], "reserved_node_ids_by_shard": [["1"]], "profiles_by_shard": ["DEFAULT"]}]}
    ]'
"#;

    #[test]
    fn cascade_layouts_map_to_subgroups_and_shards() {
        let i = import(SERVICE, base()).unwrap();
        let l = &i.layout;
        assert_eq!(
            l.nodes
                .iter()
                .map(|n| (n.id, n.address.port()))
                .collect::<Vec<_>>(),
            vec![(0, 7420), (1, 7421), (2, 7422), (3, 7423)]
        );
        // Two volatile subgroups, the first with two shards, members shared.
        assert_eq!(l.subgroups.volatile.len(), 2);
        assert_eq!(l.subgroups.volatile[0].shards, vec![vec![1, 2, 3], vec![0]]);
        assert_eq!(l.subgroups.volatile[1].shards, vec![vec![2, 3]]);
        assert_eq!(l.subgroups.persistent[0].shards, vec![vec![0]]);
        assert_eq!(l.subgroups.trigger[0].shards, vec![vec![1]]);
        let notes = i.notes.join("\n");
        assert!(notes.contains("add-member"), "{notes}");
        assert!(notes.contains("Raw"), "{notes}");
        assert!(notes.contains("metadata group is every node"), "{notes}");
        assert!(is_cascade_json(SERVICE));
        assert!(!is_cascade_json("[[nodes]]\nid = 0\n"));
        assert!(!is_cascade_json("[cluster]\n"));
        assert!(!is_cascade_json("version = 1\n"));
    }

    #[test]
    fn what_sluice_cannot_express_is_refused_naming_the_field() {
        let bad =
            |from: &str, to: &str| import(&SERVICE.replacen(from, to, 1), base()).unwrap_err();
        let e = bad(
            "PersistentCascadeStoreWithStringKey",
            "SignatureCascadeStoreWithStringKey",
        );
        assert!(e.contains("type_alias") && e.contains("Signature"), "{e}");
        let e = bad(
            r#""reserved_node_ids_by_shard": [["0"]], "profiles_by_shard": ["DEFAULT"]}]},
      {"type_alias": "Vol"#,
            r#""reserved_node_ids_by_shard": [[]], "profiles_by_shard": ["DEFAULT"]}]},
      {"type_alias": "Vol"#,
        );
        assert!(
            e.contains("$[0].layout[0].reserved_node_ids_by_shard[0]"),
            "{e}"
        );
        let e = bad(
            r#""delivery_modes_by_shard": ["Ordered"], "reserved_node_ids_by_shard": [["0"]], "profiles_by_shard": ["DEFAULT"]}]},
      {"type_alias": "Trig"#,
            r#""delivery_modes_by_shard": ["Raw"], "reserved_node_ids_by_shard": [["0"]], "profiles_by_shard": ["DEFAULT"]}]},
      {"type_alias": "Trig"#,
        );
        assert!(
            e.contains("delivery_modes_by_shard[0]") && e.contains("Raw"),
            "{e}"
        );
        let e = bad(r#"["1","1"], "max"#, r#"["4","1"], "max"#);
        assert!(e.contains("min_nodes_by_shard[0]"), "{e}");
        let e = bad(
            r#""max_nodes_by_shard": ["3","1"]"#,
            r#""max_nodes_by_shard": ["2","1"]"#,
        );
        assert!(
            e.contains("max_nodes_by_shard[0]") && e.contains("only 2"),
            "{e}"
        );
        let e = bad(
            r#""profiles_by_shard": ["DEFAULT"]}]}"#,
            r#""profiles_by_shard": ["RDMA_BIG"]}]}"#,
        );
        assert!(e.contains("profiles_by_shard[0]"), "{e}");
        let e = bad(
            r#""min_nodes_by_shard": [1]"#,
            r#""min_nodes_by_shard": [1], "elastic": true"#,
        );
        assert!(e.contains("elastic") && e.contains("unknown field"), "{e}");
        let e = bad("]'", "] x");
        assert!(e.contains("after the layout"), "{e}");
        let e = bad(
            r#""max_nodes_by_shard": [2]"#,
            r#""max_nodes_by_shard": [2, 2]"#,
        );
        assert!(e.contains("2 entries for 1 shards"), "{e}");
    }
}
