//! `sluice place`: replicas of a model's parts placed to survive node
//! failures (Lazarus), and reconfiguration that moves the fewest.

use anyhow::{Context, Result};
use serde_json::json;
use sluice_plan::place::eval::Survival;
use sluice_plan::place::search::{optimize, reconfigure, PlaceResult, Reconfig};
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
            export(dir, &p, &best.placement, a.base_addr)?;
        }
        return Ok(());
    };
    let cur = input::load(&from)?;
    let (current, lost) = remap(&cur, &p)?;
    let target = a.min_probability.unwrap_or(best.survival.p);
    if !(0.0..=1.0).contains(&target) {
        anyhow::bail!("--min-probability {target}: between 0 and 1");
    }
    let rc = reconfigure(&p, &best.counts, &current, target, budget)?;
    show_reconfig(&p, &rc, &lost, json_out);
    if let Some(dir) = &a.export {
        export(dir, &p, &rc.placement, a.base_addr)?;
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

fn show_reconfig(p: &PlaceProblem, r: &Reconfig, lost: &[(String, String)], json_out: bool) {
    let pair = |(e, n): &(usize, usize)| (p.parts[*e].name.clone(), p.nodes[*n].name.clone());
    if json_out {
        println!(
            "{}",
            json!({"placement": placement_json(p, &r.placement), "replicas": r.counts,
                   "survival": survival_json(&r.survival), "before": survival_json(&r.before),
                   "target": r.target, "moves": r.moves.iter().map(pair).collect::<Vec<_>>(),
                   "drops": r.drops.iter().map(pair).collect::<Vec<_>>(), "lost": lost,
                   "minimal": r.minimal, "states": r.states})
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
        "\nsurvival {:.6} (the current plan on these nodes: {:.6}, {:+.6}; target {:.6})",
        r.survival.p,
        r.before.p,
        r.survival.p - r.before.p,
        r.target
    );
    let _ = writeln!(
        out,
        "{} replica(s) moved{}",
        r.moves.len(),
        if r.minimal {
            " (the fewest any plan reaching the target needs)"
        } else {
            " (search stopped at its budget: greedy from the current plan)"
        }
    );
    for (e, n) in &r.moves {
        let _ = writeln!(out, "  + {} on {}", p.parts[*e].name, p.nodes[*n].name);
    }
    for (e, n) in &r.drops {
        let _ = writeln!(out, "  - {} on {}", p.parts[*e].name, p.nodes[*n].name);
    }
    print!("{out}");
}

/// placement.toml, and a layout whose volatile subgroup `e` replicates
/// part `e` on exactly its nodes, with the pools that put each part's
/// objects there.
fn export(dir: &Path, p: &PlaceProblem, pl: &Placement, base: std::net::SocketAddr) -> Result<()> {
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
    if u32::from(base.port()) + p.nodes.len() as u32 > 65536 {
        anyhow::bail!(
            "{} nodes from port {} do not fit below port 65536: give a lower --base-addr",
            p.nodes.len(),
            base.port()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("placement.toml"), input::to_toml(p, pl))?;
    let mut layout = String::from("# Written by `sluice place --export`.\nversion = 1\n\n");
    for (i, n) in p.nodes.iter().enumerate() {
        let _ = writeln!(
            layout,
            "[[nodes]]\nid = {i}\naddress = \"{}:{}\"\nname = {}{}\n",
            base.ip(),
            u32::from(base.port()) + i as u32,
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
            .map(|n| n.to_string())
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
    Ok(())
}
