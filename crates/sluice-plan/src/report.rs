//! Runs every planner on a problem and renders the result as a table,
//! JSON or Graphviz.

use crate::assign::{heuristic, polish};
use crate::baselines::{self, Baseline};
use crate::error::{PlanError, Result};
use crate::exhaustive;
use crate::problem::{OpKind, Plan, Problem};
use crate::select::beam_search;
use serde::Serialize;
use std::fmt::Write as _;
use std::time::Instant;

/// Model-selection spaces up to this size are enumerated whole for the
/// extended heuristic (beyond the paper's beam of `model_beam`).
pub const WIDE_SELECTION_LIMIT: f64 = 256.0;

/// How long the default plan may search exactly before it keeps the
/// heuristics' best.
pub const EXACT_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub seed: u64,
    pub exhaustive: bool,
    /// The exact search the default plan runs after the heuristics, within
    /// this time (`None`: heuristics only).
    pub exact_budget: Option<std::time::Duration>,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            seed: 42,
            exhaustive: false,
            exact_budget: Some(EXACT_BUDGET),
        }
    }
}

/// How the exact search inside the default plan went.
#[derive(Clone, Debug, Serialize)]
pub struct ExactSummary {
    /// Search states visited.
    pub states: u64,
    pub ms: f64,
    /// The whole space was searched: the plan is optimal (under A2).
    pub optimal: bool,
    /// When not: a lower bound on any plan's cost, and how far above it
    /// the plan is (a fraction).
    pub lower_bound: Option<f64>,
    pub gap: Option<f64>,
    /// Why it did not run (too many states).
    pub note: Option<String>,
}

#[derive(Serialize)]
pub struct PlanReport {
    pub problem: String,
    pub accuracy_target: f64,
    pub seed: u64,
    /// Model selections the beam search kept.
    pub model_selections: usize,
    /// The plan Sluice recommends (best of everything below, polished).
    pub plan: Plan,
    /// The paper's heuristic alone (beam search + Algorithm 1).
    pub paper_heuristic: Plan,
    pub first_fit: Option<Plan>,
    pub best_fit: Option<Plan>,
    pub exhaustive: Option<Plan>,
    /// Why the exhaustive search did not run, when it was asked for.
    pub exhaustive_note: Option<String>,
    pub optimizer_ms: f64,
    pub exhaustive_ms: Option<f64>,
    /// The exact search of the default plan.
    pub exact: Option<ExactSummary>,
}

/// Plans `p`: the paper's heuristic, our extended heuristic, the polish,
/// the baselines and (optionally) the exhaustive optimum.
pub fn plan_all(p: &Problem, opt: &PlanOptions) -> Result<PlanReport> {
    let t0 = Instant::now();
    let selections = beam_search(p);
    if selections.is_empty() {
        return Err(PlanError::Infeasible {
            target: p.accuracy_target,
            reason:
                "no combination of model variants reaches it according to the accuracy profiles"
                    .into(),
        });
    }
    let paper = heuristic(p, &selections, opt.seed, false).ok_or_else(|| PlanError::Infeasible {
        target: p.accuracy_target,
        reason: "the workers cannot carry the input rates with any accurate-enough model selection under A2".into(),
    })?;
    let mut best = polish(p, &paper);
    // Beyond the paper: the cost proxy ranks selections only roughly, so
    // when the selection space is small, place every accurate-enough one.
    let mut wide = selections.clone();
    let space: f64 = p
        .compute_ops()
        .iter()
        .map(|&v| p.operators[v].variants.len() as f64)
        .product();
    if space <= WIDE_SELECTION_LIMIT {
        for s in crate::select::all_feasible(p) {
            if !wide.contains(&s) {
                wide.push(s);
            }
        }
    }
    if let Some(ext) = heuristic(p, &wide, opt.seed, true) {
        let ext = polish(p, &ext);
        if ext.total_cost < best.total_cost - 1e-12 {
            best = ext;
        }
    }
    // The heuristics can land well above the optimum (2.3x on a variant
    // of the fixture): search exactly, within a budget, below their cost.
    let exact = opt.exact_budget.map(|budget| {
        let t = Instant::now();
        let gap = |best: &Plan| {
            let lb = exhaustive::lower_bound(p);
            (Some(lb), (lb > 0.0).then(|| best.total_cost / lb - 1.0))
        };
        match exhaustive::optimum_within(p, Some(best.total_cost), Some(budget)) {
            Ok(e) => {
                if let Some(o) = e.plan {
                    if o.total_cost < best.total_cost - 1e-12 {
                        best = o;
                    }
                }
                let (lower_bound, gap) = if e.finished { (None, None) } else { gap(&best) };
                ExactSummary {
                    states: e.states,
                    ms: t.elapsed().as_secs_f64() * 1000.0,
                    optimal: e.finished,
                    lower_bound,
                    gap,
                    note: None,
                }
            }
            Err(e) => {
                let (lower_bound, gap) = gap(&best);
                ExactSummary {
                    states: 0,
                    ms: t.elapsed().as_secs_f64() * 1000.0,
                    optimal: false,
                    lower_bound,
                    gap,
                    note: Some(e.to_string()),
                }
            }
        }
    });
    let optimizer_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let (mut exhaustive, mut exhaustive_note, mut exhaustive_ms) = (None, None, None);
    if opt.exhaustive {
        let t1 = Instant::now();
        match exhaustive::optimum(p, Some(best.total_cost)) {
            Ok(Some(o)) => exhaustive = Some(o),
            // Nothing strictly cheaper than the heuristic exists: it is optimal.
            Ok(None) => exhaustive = Some(best.clone()),
            Err(e @ PlanError::TooLarge { .. }) => exhaustive_note = Some(e.to_string()),
            Err(e) => return Err(e),
        }
        exhaustive_ms = Some(t1.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(PlanReport {
        problem: p.name.clone(),
        accuracy_target: p.accuracy_target,
        seed: opt.seed,
        model_selections: selections.len(),
        plan: best,
        paper_heuristic: paper,
        first_fit: baselines::run(p, Baseline::FirstFit),
        best_fit: baselines::run(p, Baseline::BestFit),
        exhaustive,
        exhaustive_note,
        optimizer_ms,
        exhaustive_ms,
        exact,
    })
}

/// A plan as JSON with names instead of indices.
pub fn plan_json(p: &Problem, plan: &Plan) -> serde_json::Value {
    let rates = p.rates();
    let ops: Vec<_> = p
        .compute_ops()
        .into_iter()
        .map(|v| {
            let m = plan.models[v].unwrap_or(0);
            let workers: Vec<_> = plan.assignment[v]
                .iter()
                .map(|&(w, load)| {
                    serde_json::json!({
                        "worker": p.workers[w].name,
                        "tier": p.workers[w].tier,
                        "throughput_rps": p.throughput(v, m, w),
                        "load_rps": load,
                        "share": if rates[v] > 0.0 { load / rates[v] } else { 0.0 },
                    })
                })
                .collect();
            let capacity: f64 = plan.assignment[v]
                .iter()
                .map(|&(w, _)| p.throughput(v, m, w))
                .sum();
            serde_json::json!({
                "operator": p.operators[v].name,
                "model": p.operators[v].variants[m].name,
                "input_rate_rps": rates[v],
                "throughput_rps": capacity,
                "workers": workers,
            })
        })
        .collect();
    serde_json::json!({
        "accuracy": plan.accuracy,
        "compute_cost_per_hour": plan.compute_cost,
        "comm_cost_per_hour": plan.comm_cost,
        "total_cost_per_hour": plan.total_cost,
        "a2_holds": p.satisfies_a2(&plan.assignment),
        "operators": ops,
    })
}

pub fn report_json(p: &Problem, r: &PlanReport) -> serde_json::Value {
    let opt = |x: &Option<Plan>| x.as_ref().map(|pl| plan_json(p, pl));
    serde_json::json!({
        "problem": r.problem,
        "accuracy_target": r.accuracy_target,
        "seed": r.seed,
        "model_selections": r.model_selections,
        "plan": plan_json(p, &r.plan),
        "paper_heuristic": plan_json(p, &r.paper_heuristic),
        "first_fit": opt(&r.first_fit),
        "best_fit": opt(&r.best_fit),
        "exhaustive": opt(&r.exhaustive),
        "exhaustive_note": r.exhaustive_note,
        "optimizer_ms": r.optimizer_ms,
        "exhaustive_ms": r.exhaustive_ms,
        "exact": r.exact,
    })
}

/// Human-readable report.
pub fn render_table(p: &Problem, r: &PlanReport) -> String {
    let mut s = String::new();
    let plan = &r.plan;
    let rates = p.rates();
    let _ = writeln!(
        s,
        "plan for {} (accuracy target {}, seed {})",
        r.problem, r.accuracy_target, r.seed
    );
    let _ = writeln!(
        s,
        "{:<22} {:<32} {:>9} {:>10}  workers (load rps / throughput rps, tier)",
        "operator", "model", "rate", "capacity"
    );
    for v in p.compute_ops() {
        let m = plan.models[v].unwrap_or(0);
        let cap: f64 = plan.assignment[v]
            .iter()
            .map(|&(w, _)| p.throughput(v, m, w))
            .sum();
        let ws: Vec<String> = plan.assignment[v]
            .iter()
            .map(|&(w, l)| {
                format!(
                    "{} ({:.2}/{:.2}, t{})",
                    p.workers[w].name,
                    l,
                    p.throughput(v, m, w),
                    p.workers[w].tier
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "{:<22} {:<32} {:>9.2} {:>10.2}  {}",
            p.operators[v].name,
            p.operators[v].variants[m].name,
            rates[v],
            cap,
            ws.join(", ")
        );
    }
    let _ = writeln!(
        s,
        "accuracy {:.3}   compute {:.4}/h   communication {:.4}/h   total {:.4}/h   (A2 {})",
        plan.accuracy,
        plan.compute_cost,
        plan.comm_cost,
        plan.total_cost,
        if p.satisfies_a2(&plan.assignment) {
            "holds"
        } else {
            "VIOLATED"
        }
    );
    let _ = writeln!(s, "\ncomparison (total cost per hour):");
    let mut line = |name: &str, pl: Option<&Plan>| {
        let _ = match pl {
            Some(pl) => writeln!(
                s,
                "  {:<34} {:>9.4}  (compute {:.4}, comm {:.4}, accuracy {:.2}{})",
                name,
                pl.total_cost,
                pl.compute_cost,
                pl.comm_cost,
                pl.accuracy,
                if p.satisfies_a2(&pl.assignment) {
                    ""
                } else {
                    ", breaks A2"
                }
            ),
            None => writeln!(s, "  {name:<34} infeasible"),
        };
    };
    line("sluice plan", Some(&r.plan));
    line("paper heuristic (beam + Alg. 1)", Some(&r.paper_heuristic));
    line("first fit, most accurate models", r.first_fit.as_ref());
    line("best fit, most accurate models", r.best_fit.as_ref());
    if r.exhaustive.is_some() {
        line("exhaustive optimum (A2)", r.exhaustive.as_ref());
    }
    if let Some(n) = &r.exhaustive_note {
        let _ = writeln!(s, "  exhaustive: {n}");
    }
    let _ = writeln!(
        s,
        "optimizer time {:.2} ms ({} model selections)",
        r.optimizer_ms, r.model_selections
    );
    if let Some(ms) = r.exhaustive_ms {
        let _ = writeln!(s, "exhaustive time {ms:.1} ms");
    }
    if let Some(e) = &r.exact {
        let _ = match (e.optimal, e.gap, &e.note) {
            (true, _, _) => writeln!(
                s,
                "exact search: the plan is optimal ({} states, {:.1} ms)",
                e.states, e.ms
            ),
            (false, Some(g), note) => writeln!(
                s,
                "exact search {}: the plan is at most {:.1}% above the optimum (lower bound {:.4})",
                note.as_deref().map_or(
                    format!(
                        "stopped at its budget ({} states, {:.0} ms)",
                        e.states, e.ms
                    ),
                    |n| format!("not run ({n})")
                ),
                g * 100.0,
                e.lower_bound.unwrap_or_default()
            ),
            (false, None, note) => writeln!(
                s,
                "exact search not finished{}",
                note.as_deref()
                    .map(|n| format!(": {n}"))
                    .unwrap_or_default()
            ),
        };
    }
    s
}

/// Graphviz drawing of a plan: operators with their model and workers,
/// edges labelled with their traffic.
pub fn render_dot(p: &Problem, plan: &Plan) -> String {
    let rates = p.rates();
    let mut s = String::from(
        "digraph plan {\n  rankdir=LR;\n  node [shape=box, fontname=\"Helvetica\"];\n",
    );
    for (v, o) in p.operators.iter().enumerate() {
        let label = match o.kind {
            OpKind::Source => format!("{}\\n{:.1} rps", o.name, rates[v]),
            OpKind::Compute => {
                let m = plan.models[v].unwrap_or(0);
                let ws: Vec<String> = plan.assignment[v]
                    .iter()
                    .map(|&(w, l)| format!("{} {:.1}", p.workers[w].name, l))
                    .collect();
                format!("{}\\n{}\\n{}", o.name, o.variants[m].name, ws.join("\\n"))
            }
        };
        let shape = if o.kind == OpKind::Source {
            "ellipse"
        } else {
            "box"
        };
        let _ = writeln!(
            s,
            "  n{v} [label=\"{}\", shape={shape}];",
            label.replace('"', "'")
        );
    }
    for (ei, e) in p.edges.iter().enumerate() {
        let name = |v: usize| {
            plan.models[v].map_or("default".to_string(), |m| {
                p.operators[v].variants[m].name.clone()
            })
        };
        let kbps = rates[e.from] * e.ratio * p.message_kb(ei, &name(e.from), &name(e.to));
        let _ = writeln!(
            s,
            "  n{} -> n{} [label=\"{:.1} KB/s\"];",
            e.from, e.to, kbps
        );
    }
    let _ = writeln!(
        s,
        "  label=\"total {:.4}/h (compute {:.4}, comm {:.4}), accuracy {:.2}\";",
        plan.total_cost, plan.compute_cost, plan.comm_cost, plan.accuracy
    );
    s.push_str("}\n");
    s
}
