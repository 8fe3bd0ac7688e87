//! Accuracy estimation (section 5.4.1): the output accuracy of an operator
//! is read from the profile row closest to, but not above, its inputs'
//! accuracies; the end-to-end table, when given, is authoritative.

use crate::problem::{Models, OpKind, Problem};

/// Conservative output accuracy of variant `m` of `v` given input
/// accuracies (in `acc_inputs` order): the best output among rows whose
/// every input is ≤ the given one (outputs are monotone in inputs).
/// `NEG_INFINITY` when no row applies.
pub fn estimate(p: &Problem, v: usize, m: usize, inputs: &[f64]) -> f64 {
    let rows = &p.operators[v].variants[m].acc;
    if rows.is_empty() {
        return inputs.iter().copied().fold(f64::INFINITY, f64::min);
    }
    rows.iter()
        .filter(|r| {
            r.inputs.len() == inputs.len()
                && r.inputs.iter().zip(inputs).all(|(need, have)| need <= have)
        })
        .map(|r| r.output)
        .fold(f64::NEG_INFINITY, f64::max)
}

/// Accuracy of every operator under `models`, in topological order.
pub fn propagate(p: &Problem, models: &Models) -> Vec<f64> {
    let mut acc = vec![f64::INFINITY; p.operators.len()];
    for v in p.topo_order() {
        if p.operators[v].kind == OpKind::Source {
            continue;
        }
        let Some(m) = models[v] else {
            acc[v] = f64::NEG_INFINITY;
            continue;
        };
        let inputs: Vec<f64> = p.operators[v].acc_inputs.iter().map(|&u| acc[u]).collect();
        acc[v] = estimate(p, v, m, &inputs);
    }
    acc
}

/// End-to-end accuracy at the sink: the end-to-end table's value when it
/// has a row for these variants, else the per-operator estimate.
pub fn accuracy(p: &Problem, models: &Models) -> f64 {
    if let Some(e2e) = &p.end_to_end {
        let key: Option<Vec<usize>> = e2e.ops.iter().map(|&o| models[o]).collect();
        if let Some(key) = key {
            if let Some((_, a)) = e2e.rows.iter().find(|(vars, _)| *vars == key) {
                return *a;
            }
        }
    }
    propagate(p, models)[p.sink]
}
