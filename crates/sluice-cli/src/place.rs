//! `sluice place`: replicas of a model's parts placed to survive node
//! failures (Lazarus), and reconfiguration that moves the fewest.

use anyhow::{Context, Result};
use serde_json::json;
use sluice_plan::place::eval::{Scenarios, Survival};
use sluice_plan::place::search::{kept_counts, optimize, reconfigure, PlaceResult, Reconfig};
use sluice_plan::place::{input, Failures, PlaceProblem, Placement};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args)]
pub struct PlaceArgs {
    /// The nodes, parts and failure model (TOML or JSON; see
    /// examples/place/moe.toml). Optional with --from, whose file then gives them.
    path: Option<PathBuf>,
    /// The current plan (a placement.toml that --export wrote, edited:
    /// nodes gone removed or named in `failed`, loads changed): the new
    /// plan moves the fewest replicas for the survival it reaches.
    #[arg(long)]
    from: Option<PathBuf>,
    /// With --from: the survival probability the new plan must reach
    /// (default: the best the new nodes allow).
    #[arg(long)]
    min_probability: Option<f64>,
    /// Time for each exact search, in milliseconds (past it, the best
    /// construction improved by local search).
    #[arg(long, default_value_t = 2000)]
    budget_ms: u64,
    /// Write placement.toml (what --from reads), and a Sluice layout with a
    /// replicated subgroup per part on exactly its nodes, and its pools.
    #[arg(long)]
    export: Option<PathBuf>,
    /// In the exported layout, node i listens on this address's port + i.
    #[arg(long, default_value = "127.0.0.1:7420")]
    base_addr: std::net::SocketAddr,
}

pub fn run(a: PlaceArgs, json_out: bool) -> Result<()> {
    let budget = Duration::from_millis(a.budget_ms);
    let (problem_path, from) = match (&a.path, &a.from) {
        (Some(p), from) => (p.clone(), from.clone()),
        (None, Some(f)) => (f.clone(), Some(f.clone())),
        (None, None) => {
            anyhow::bail!("give a placement problem (a TOML/JSON file), or --from a current plan")
        }
    };
    let loaded = input::load(&problem_path)?;
    let p = loaded.problem.clone();
    let best = optimize(&p, budget)?;
    let Some(from) = from else {
        show_plan(&p, &best, json_out);
        if let Some(dir) = &a.export {
            export(dir, &p, &best.placement, a.base_addr, None)?;
        }
        return Ok(());
    };
    let cur = input::load(&from)?;
    let (current, lost) = remap(&cur, &p)?;
    // The current plan may survive more on these nodes than any plan of
    // the smaller cluster's load-proportional counts (a failure leaves
    // fewer slots, and the counts shrink to the floor): then the best the
    // nodes allow is at least the current plan, and keeping its counts
    // is how to get there.
    let kept = kept_counts(&p, &current);
    let before = Scenarios::of(&p).survival(&current).p;
    let best_known = if kept.is_some() {
        best.survival.p.max(before)
    } else {
        best.survival.p
    };
    let target = a.min_probability.unwrap_or(best_known);
    if !(0.0..=1.0).contains(&target) {
        anyhow::bail!("--min-probability {target}: between 0 and 1");
    }
    let by_load = reconfigure(&p, &best.counts, &current, target, budget);
    let rc = match (by_load, kept.filter(|k| *k != best.counts)) {
        (Ok(rc), _) if rc.reached() => rc,
        (by_load, Some(k)) => {
            let alt = reconfigure(&p, &k, &current, target, budget)?;
            match by_load {
                Ok(rc) if rc.survival.p >= alt.survival.p && !alt.reached() => rc,
                _ => alt,
            }
        }
        (by_load, None) => by_load?,
    };
    show_reconfig(&p, &rc, &best, &lost, json_out);
    if !rc.reached() {
        anyhow::bail!(
            "no plan found reaches survival {target:.6} (the best found: {:.6}){}; nothing exported",
            rc.survival.p,
            if rc.exhausted {
                ": no placement of these nodes' replica counts does"
            } else {
                ": the search stopped at its budget (a larger --budget-ms may find one)"
            }
        );
    }
    if let Some(dir) = &a.export {
        let script = membership_script(&cur, &p, &current, &rc, &lost);
        export(dir, &p, &rc.placement, a.base_addr, Some(script))?;
    }
    Ok(())
}

/// The current plan's replicas on the nodes and parts of `p` (by name),
/// and those on nodes `p` no longer has.
fn remap(cur: &input::Loaded, p: &PlaceProblem) -> Result<(Placement, Vec<(String, String)>)> {
    let mut lost = cur.lost.clone();
    let mut pl = Placement::empty(p.parts.len());
    if let Some(c) = &cur.current {
        for (e, part) in cur.problem.parts.iter().enumerate() {
            let Some(ne) = p.parts.iter().position(|x| x.name == part.name) else {
                continue; // a part no longer placed
            };
            for (n, node) in cur.problem.nodes.iter().enumerate() {
                if c.holders[e] & (1 << n) == 0 {
                    continue;
                }
                match p.nodes.iter().position(|x| x.name == node.name) {
                    Some(nn) => pl.holders[ne] |= 1 << nn,
                    None => lost.push((part.name.clone(), node.name.clone())),
                }
            }
        }
    } else {
        anyhow::bail!(
            "--from: the file has no [placement] table (write one with sluice place --export)"
        );
    }
    Ok((pl, lost))
}

/// When no failure scenario keeps every part, the parts with the fewest
/// replicas (the first lost) and the knob that gives them more.
fn none_survive_hint(p: &PlaceProblem, pl: &Placement, survival: f64, out: &mut String) {
    if survival > 0.0 {
        return;
    }
    let Some(fewest) = pl.holders.iter().map(|m| m.count_ones()).min() else {
        return;
    };
    let weakest: Vec<&str> = p
        .parts
        .iter()
        .zip(&pl.holders)
        .filter(|(_, m)| m.count_ones() == fewest)
        .map(|(x, _)| x.name.as_str())
        .collect();
    let _ = writeln!(
        out,
        "no failure scenario keeps every part: the parts with the fewest replicas ({}: {fewest} each) \
         are lost first; a higher `floor` gives every part more (the load-proportional counts \
         leave the light parts at the floor)",
        weakest.join(", ")
    );
}

fn failures_text(p: &PlaceProblem) -> String {
    match p.failures {
        Failures::Survivors(r) => format!("{r} of {} nodes survive", p.nodes.len()),
        Failures::Domains(k) => format!("{k} of {} failure domains fail", p.domains().len()),
    }
}

fn holders(p: &PlaceProblem, m: u64) -> Vec<&str> {
    (0..p.nodes.len())
        .filter(|n| m & (1 << n) != 0)
        .map(|n| p.nodes[n].name.as_str())
        .collect()
}

fn table(p: &PlaceProblem, pl: &Placement, out: &mut String) {
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>8}  nodes",
        "part", "load", "replicas"
    );
    for (e, part) in p.parts.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:<16} {:>10.2} {:>8}  {}",
            part.name,
            part.load,
            pl.holders[e].count_ones(),
            holders(p, pl.holders[e]).join(" ")
        );
    }
    let loads = pl.node_loads(p);
    let _ = writeln!(out, "{:<16} {:>10} {:>8}", "node", "load", "replicas");
    for (n, node) in p.nodes.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:<16} {:>10.2} {:>8}{}",
            node.name,
            loads[n],
            pl.used(n),
            node.domain
                .as_deref()
                .map(|d| format!("  ({d})"))
                .unwrap_or_default()
        );
    }
}

fn placement_json(p: &PlaceProblem, pl: &Placement) -> serde_json::Value {
    json!(p
        .parts
        .iter()
        .zip(&pl.holders)
        .map(|(x, m)| (x.name.clone(), json!(holders(p, *m))))
        .collect::<serde_json::Map<_, _>>())
}

fn survival_json(s: &Survival) -> serde_json::Value {
    json!({"p": s.p, "exact": s.exact, "interval": s.interval, "scenarios": s.scenarios, "upper_bound": s.bound})
}

fn show_plan(p: &PlaceProblem, r: &PlaceResult, json_out: bool) {
    if json_out {
        let baselines: Vec<_> = r
            .baselines
            .iter()
            .map(|(name, b)| match b {
                Ok((_, s)) => json!({"name": name, "survival": survival_json(s)}),
                Err(why) => json!({"name": name, "not_applicable": why}),
            })
            .collect();
        println!(
            "{}",
            json!({"placement": placement_json(p, &r.placement), "replicas": r.counts,
                   "survival": survival_json(&r.survival), "optimal": r.optimal, "states": r.states,
                   "node_loads": r.placement.node_loads(p), "baselines": baselines})
        );
        return;
    }
    let mut out = format!(
        "placement {:?}: {} nodes x {} slots, {} parts (floor {}), {}\n\n",
        p.name,
        p.nodes.len(),
        p.slots,
        p.parts.len(),
        p.floor,
        failures_text(p)
    );
    table(p, &r.placement, &mut out);
    let _ = writeln!(
        out,
        "\nevery part keeps a live replica with probability {}\n{}",
        r.survival,
        if r.optimal {
            format!(
                "optimal: exact search over {} states in {:.0?}",
                r.states, r.elapsed
            )
        } else if r.too_large {
            "too large for the exact search: the best construction improved by local search; not proven optimal".to_string()
        } else {
            format!(
                "exact search stopped at its budget ({} states): the best construction improved by local search; not proven optimal",
                r.states
            )
        }
    );
    none_survive_hint(p, &r.placement, r.survival.p, &mut out);
    let _ = writeln!(out, "baselines:");
    for (name, b) in &r.baselines {
        match b {
            Ok((_, s)) => {
                let _ = writeln!(out, "  {name:<28} {:.6}", s.p);
            }
            Err(why) => {
                let _ = writeln!(out, "  {name:<28} does not apply: {why}");
            }
        }
    }
    print!("{out}");
}

fn show_reconfig(
    p: &PlaceProblem,
    r: &Reconfig,
    best: &PlaceResult,
    lost: &[(String, String)],
    json_out: bool,
) {
    let pair = |(e, n): &(usize, usize)| (p.parts[*e].name.clone(), p.nodes[*n].name.clone());
    let kept = r.counts != best.counts;
    if json_out {
        println!(
            "{}",
            json!({"placement": placement_json(p, &r.placement), "replicas": r.counts,
                   "survival": survival_json(&r.survival), "before": survival_json(&r.before),
                   "target": r.target, "reached": r.reached(),
                   "moves": r.moves.iter().map(pair).collect::<Vec<_>>(),
                   "drops": r.drops.iter().map(pair).collect::<Vec<_>>(), "lost": lost,
                   "counts_kept": kept, "load_counts_best": best.survival.p,
                   "minimal": r.minimal(), "states": r.states})
        );
        return;
    }
    let mut out = format!(
        "reconfiguration of {:?}: {} nodes x {} slots, {}\n",
        p.name,
        p.nodes.len(),
        p.slots,
        failures_text(p)
    );
    for (part, node) in lost {
        let _ = writeln!(out, "lost: {part} on {node} (node gone)");
    }
    let _ = writeln!(out);
    table(p, &r.placement, &mut out);
    let _ = writeln!(
        out,
        "\nsurvival {:.6} (the current plan on these nodes: {:.6}, {:+.6}; target {:.6}{})",
        r.survival.p,
        r.before.p,
        r.survival.p - r.before.p,
        r.target,
        if r.reached() { "" } else { ": NOT reached" }
    );
    none_survive_hint(p, &r.placement, r.survival.p, &mut out);
    if kept {
        let _ = writeln!(
            out,
            "replica counts kept from the current plan (raised to the floor): \
             the load-proportional counts of these nodes reach at most {:.6}",
            best.survival.p
        );
    }
    let how = match (r.reached(), r.exhausted, r.greedy) {
        (true, true, false) => " (the fewest any plan reaching the target needs)",
        (true, false, false) => {
            " (the fewest found before the search's budget ran out; not proven the fewest)"
        }
        (_, false, true) => " (search stopped at its budget: greedy from the current plan)",
        _ => " (greedy from the current plan: no plan reaches the target)",
    };
    let _ = writeln!(out, "{} replica(s) moved{how}", r.moves.len());
    for (e, n) in &r.moves {
        let _ = writeln!(out, "  + {} on {}", p.parts[*e].name, p.nodes[*n].name);
    }
    for (e, n) in &r.drops {
        let _ = writeln!(out, "  - {} on {}", p.parts[*e].name, p.nodes[*n].name);
    }
    print!("{out}");
}

/// The membership changes that take a running cluster from the current
/// plan (`cur`, its replicas remapped onto `p`'s nodes as `current`) to
/// `rc`'s: `sluice cluster` commands, part by part (part `e` is volatile
/// subgroup `e` of the exported layouts). A failed node's members go
/// first (a dead member still counts in its shard's majority), then the
/// new replicas, then the dropped ones. A shard without a majority of
/// live members cannot change its membership, and says so.
fn membership_script(
    cur: &input::Loaded,
    p: &PlaceProblem,
    current: &Placement,
    rc: &Reconfig,
    lost: &[(String, String)],
) -> String {
    let mut out = String::from(
        "# Written by `sluice place --from ... --export`: the membership changes that take\n\
         # the running cluster from the current plan to this one. Run it against any live\n\
         # node (`SLUICE_ADDR=host:port sh membership.sh`). Per part (volatile subgroup):\n\
         # a failed node's member is removed first (a dead member still counts in its\n\
         # shard's majority), then the new replicas are added (each catches up from the\n\
         # shard's leader before it votes), then the dropped ones removed.\n\
         set -e\n",
    );
    let same_parts = cur.problem.parts.len() == p.parts.len()
        && cur
            .problem
            .parts
            .iter()
            .zip(&p.parts)
            .all(|(a, b)| a.name == b.name);
    if !same_parts {
        out.push_str(
            "# The parts changed (added, removed or reordered) since the current plan: the\n\
             # running cluster's subgroups are not the new layout's, so it cannot be changed\n\
             # live. Start the new layout (sluice dev --layout layout.toml) and load the\n\
             # parts' objects into it (sluice dump / sluice load).\n",
        );
        return out;
    }
    // Every node of the current plan's file, failed ones included.
    let listed = || cur.gone.iter().chain(&cur.problem.nodes);
    // The id of a node gone: named in `failed`, or listed in the current
    // plan's file but not in the new problem.
    let gone_id = |name: &str| listed().find(|n| n.name == name).map(|n| n.id);
    // The nodes the running cluster's layout has: the current plan's,
    // but those added to its file since the export.
    let known = |id: u32| listed().any(|n| n.id == id && !cur.added.contains(&n.name));
    let mut changes = 0;
    for (e, part) in p.parts.iter().enumerate() {
        let shard = format!("volatile/{e}/0");
        let dead: Vec<&str> = lost
            .iter()
            .filter(|(x, _)| *x == part.name)
            .map(|(_, n)| n.as_str())
            .collect();
        let live = current.holders[e].count_ones() as usize;
        let ids_of = |changes: &[(usize, usize)]| -> Vec<u32> {
            changes
                .iter()
                .filter(|m| m.0 == e)
                .map(|m| p.nodes[m.1].id)
                .collect()
        };
        let (adds, drops) = (ids_of(&rc.moves), ids_of(&rc.drops));
        if dead.is_empty() && adds.is_empty() && drops.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "\n# {} ({shard})",
            part.name.replace(['\n', '\r'], " ")
        );
        if 2 * live <= live + dead.len() {
            no_majority(&mut out, &part.name, live, live + dead.len());
            continue;
        }
        for name in dead {
            let _ = match gone_id(name) {
                Some(id) => writeln!(
                    out,
                    "sluice cluster remove-member {shard} {id}   # {name}, failed"
                ),
                None => writeln!(
                    out,
                    "# {name} failed, its id unknown (deleted from the file, not named in `failed`):\n\
                     # sluice cluster remove-member {shard} <its id>"
                ),
            };
            changes += 1;
        }
        for id in adds {
            if known(id) {
                let _ = writeln!(out, "sluice cluster add-member {shard} {id}");
            } else {
                // A running cluster adds members only among the nodes of
                // the layout it was started with.
                let _ = writeln!(
                    out,
                    "# node {id} is new to the cluster: once every node runs the new layout.toml \
                     (it lists node {id}), run:\n# sluice cluster add-member {shard} {id}"
                );
            }
            changes += 1;
        }
        for id in drops {
            let _ = writeln!(out, "sluice cluster remove-member {shard} {id}");
            changes += 1;
        }
    }
    if changes == 0 {
        out.push_str("# Nothing to change.\n");
    }
    out
}

/// Why the shard of `part`, `live` of its `members` alive, cannot change
/// its membership, and what is left to do.
fn no_majority(out: &mut String, part: &str, live: usize, members: usize) {
    let readable = if live == 0 {
        "# No member is alive: its objects are out of reach until a failed node comes back;"
            .to_string()
    } else {
        format!(
            "# Its objects stay readable from the live members (a stable `get`; \
             `sluice dump /parts/{}` copies them out);",
            sluice_plan::export::path_segment(part)
        )
    };
    let _ = writeln!(
        out,
        "# {live} of its {members} members alive: no majority, so its membership cannot change \
         live.\n{readable}\n# bringing failed members back restores the majority, then \
         run `sluice place --from` again."
    );
}

/// placement.toml, and a layout whose volatile subgroup `e` replicates
/// part `e` on exactly its nodes, with the pools that put each part's
/// objects there; after `--from`, the membership changes as `membership.sh`.
/// Each node keeps the id and address an earlier export gave it (the others
/// get `base`'s port + their id).
fn export(
    dir: &Path,
    p: &PlaceProblem,
    pl: &Placement,
    base: std::net::SocketAddr,
    script: Option<String>,
) -> Result<()> {
    // A part's pool is named after it, with characters a pool name had
    // better not hold replaced: two parts must not end up in one pool
    // (the second `pools create` would fail, and its objects would live
    // on the first part's nodes).
    let pool_names: Vec<String> = p
        .parts
        .iter()
        .map(|part| sluice_plan::export::path_segment(&part.name))
        .collect();
    for (e, name) in pool_names.iter().enumerate() {
        if let Some(f) = pool_names[..e].iter().position(|n| n == name) {
            anyhow::bail!(
                "parts {:?} and {:?} would both live in the pool /parts/{name}: \
                 rename one (a pool name keeps letters, digits, '-' and '_')",
                p.parts[f].name,
                p.parts[e].name
            );
        }
    }
    let mut p = p.clone();
    for n in p.nodes.iter_mut().filter(|n| n.address.is_none()) {
        let port = u32::from(base.port()) + n.id;
        if port > 65535 {
            anyhow::bail!(
                "node {:?} (id {}) from port {} is past port 65535: give a lower --base-addr",
                n.name,
                n.id,
                base.port()
            );
        }
        n.address = Some(std::net::SocketAddr::new(base.ip(), port as u16).to_string());
    }
    let taken: Vec<&String> = p.nodes.iter().filter_map(|n| n.address.as_ref()).collect();
    if let Some(a) = taken
        .iter()
        .enumerate()
        .find_map(|(i, a)| taken[..i].contains(a).then_some(a))
    {
        anyhow::bail!(
            "two nodes would listen on {a}: give the others addresses in the file, or another --base-addr"
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("placement.toml"), input::to_toml(&p, pl))?;
    let mut layout = String::from("# Written by `sluice place --export`.\nversion = 1\n\n");
    for n in &p.nodes {
        let _ = writeln!(
            layout,
            "[[nodes]]\nid = {}\naddress = \"{}\"\nname = {}{}\n",
            n.id,
            n.address.as_deref().unwrap_or_default(),
            sluice_plan::export::toml_str(&n.name),
            n.domain
                .as_deref()
                .map(|d| format!(
                    "\nlabels = {{ domain = {} }}",
                    sluice_plan::export::toml_str(d)
                ))
                .unwrap_or_default()
        );
    }
    let mut pools = String::new();
    for (e, part) in p.parts.iter().enumerate() {
        let members: Vec<String> = (0..p.nodes.len())
            .filter(|n| pl.holders[e] & (1 << n) != 0)
            .map(|n| p.nodes[n].id.to_string())
            .collect();
        let _ = writeln!(
            layout,
            "# part {}\n[[subgroups.volatile]]\nshards = [[{}]]\n",
            part.name.replace(['\n', '\r'], " "),
            members.join(", ")
        );
        let name = &pool_names[e];
        let _ = writeln!(
            pools,
            "sluice pools create /parts/{name} --type volatile --subgroup {e}"
        );
    }
    std::fs::write(dir.join("layout.toml"), layout)?;
    std::fs::write(dir.join("pools.txt"), pools)?;
    eprintln!(
        "wrote {}, layout.toml and pools.txt: a part's objects under /parts/<part> live on exactly its nodes (sluice dev --layout {})",
        dir.join("placement.toml").display(),
        dir.join("layout.toml").display()
    );
    if let Some(script) = script {
        let at = dir.join("membership.sh");
        std::fs::write(&at, script)?;
        eprintln!(
            "wrote {}: the membership changes that take the running cluster there (SLUICE_ADDR=host:port sh {})",
            at.display(),
            at.display()
        );
    }
    Ok(())
}
