//! Model selection (section 5.4.2): beam search in reverse topological
//! order. A candidate is a partial model assignment plus the accuracy each
//! upstream operator must reach; for each operator we try every variant and
//! every profile row that meets the operator's requirement, which sets the
//! requirements of its inputs. The best `model_beam` candidates by summed
//! cost proxy survive each step.

use crate::accuracy::accuracy;
use crate::problem::{Models, OpKind, Problem};

#[derive(Clone, Debug)]
struct Cand {
    models: Models,
    need: Vec<f64>,
    cost: f64,
}

/// Up to `model_beam` model selections meeting the accuracy target,
/// cheapest (by cost proxy) first. Each is verified by forward estimation
/// (or the end-to-end table).
pub fn beam_search(p: &Problem) -> Vec<Models> {
    let n = p.operators.len();
    let mut need = vec![f64::NEG_INFINITY; n];
    need[p.sink] = p.accuracy_target;
    let mut beam = vec![Cand {
        models: vec![None; n],
        need,
        cost: 0.0,
    }];
    let mut order = p.topo_order();
    order.reverse();
    for v in order {
        if p.operators[v].kind == OpKind::Source {
            continue;
        }
        let mut next: Vec<Cand> = Vec::new();
        for c in &beam {
            for (m, var) in p.operators[v].variants.iter().enumerate() {
                let base = |c: &Cand| {
                    let mut nc = c.clone();
                    nc.models[v] = Some(m);
                    nc.cost += var.cost_proxy;
                    nc
                };
                if var.acc.is_empty() {
                    // No profile: output = min of inputs, so each input must
                    // reach this operator's requirement.
                    let mut nc = base(c);
                    for &u in &p.operators[v].acc_inputs {
                        nc.need[u] = nc.need[u].max(c.need[v]);
                    }
                    next.push(nc);
                    continue;
                }
                for row in var.acc.iter().filter(|r| r.output >= c.need[v]) {
                    let mut nc = base(c);
                    for (&u, &a) in p.operators[v].acc_inputs.iter().zip(&row.inputs) {
                        nc.need[u] = nc.need[u].max(a);
                    }
                    next.push(nc);
                }
            }
        }
        next.sort_by(|a, b| {
            a.cost
                .total_cmp(&b.cost)
                .then_with(|| a.models.cmp(&b.models))
        });
        next.dedup_by(|a, b| a.models == b.models && a.need == b.need);
        // Keep the least demanding requirements per model map: a candidate
        // whose requirements are all ≥ another's with the same models adds nothing.
        let mut kept: Vec<Cand> = Vec::new();
        for c in next {
            if kept
                .iter()
                .any(|k| k.models == c.models && k.need.iter().zip(&c.need).all(|(a, b)| a <= b))
            {
                continue;
            }
            kept.push(c);
            if kept.len() >= p.settings.model_beam.max(1) {
                break;
            }
        }
        beam = kept;
    }
    let mut out: Vec<Models> = Vec::new();
    for c in beam {
        if accuracy(p, &c.models) >= p.accuracy_target - 1e-9 && !out.contains(&c.models) {
            out.push(c.models);
        }
    }
    out
}

/// Every model selection meeting the target (for the exhaustive search).
pub fn all_feasible(p: &Problem) -> Vec<Models> {
    let ops = p.compute_ops();
    let mut out = Vec::new();
    let mut cur: Models = vec![None; p.operators.len()];
    fn rec(p: &Problem, ops: &[usize], i: usize, cur: &mut Models, out: &mut Vec<Models>) {
        if i == ops.len() {
            if accuracy(p, cur) >= p.accuracy_target - 1e-9 {
                out.push(cur.clone());
            }
            return;
        }
        for m in 0..p.operators[ops[i]].variants.len() {
            cur[ops[i]] = Some(m);
            rec(p, ops, i + 1, cur, out);
        }
        cur[ops[i]] = None;
    }
    rec(p, &ops, 0, &mut cur, &mut out);
    out
}

/// The most accurate variant of each operator (the baselines' choice):
/// the variant whose best profile row has the highest output.
pub fn most_accurate(p: &Problem) -> Models {
    p.operators
        .iter()
        .map(|o| {
            if o.kind == OpKind::Source {
                return None;
            }
            (0..o.variants.len()).max_by(|&a, &b| {
                let best = |m: usize| {
                    o.variants[m]
                        .acc
                        .iter()
                        .map(|r| r.output)
                        .fold(f64::NEG_INFINITY, f64::max)
                };
                best(a).total_cmp(&best(b)).then(b.cmp(&a))
            })
        })
        .collect()
}
