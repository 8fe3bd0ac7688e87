//! Exhaustive search (the paper's lower bound): every accuracy-feasible
//! model selection × every map of workers to operators (or to nothing) ×
//! every fill order of each operator's workers, under A2. The objective is
//! linear in each operator's loads with the others fixed, so its optimum
//! over loads lies at a vertex of the load polytope, i.e. at a fill order:
//! enumerating fill orders is exact.

use crate::error::{PlanError, Result};
use crate::problem::{fill, permutations, Assignment, Models, Plan, Problem};
use crate::select::all_feasible;

/// Search states above which `--exhaustive` refuses.
pub const STATE_LIMIT: f64 = 5e9;

/// Estimated states: selections × (operators + 1)^workers.
pub fn estimate_states(p: &Problem, selections: usize) -> f64 {
    selections as f64 * ((p.compute_ops().len() + 1) as f64).powi(p.workers.len() as i32)
}

struct Search<'a> {
    p: &'a Problem,
    models: &'a Models,
    ops: Vec<usize>,
    rates: Vec<f64>,
    /// worker -> operator slot (index into ops) or None.
    choice: Vec<Option<usize>>,
    best: Option<Plan>,
    bound: f64,
}

impl Search<'_> {
    fn dfs(&mut self, w: usize, compute: f64) {
        if compute >= self.bound {
            return;
        }
        if w == self.p.workers.len() {
            self.leaf();
            return;
        }
        self.choice[w] = None;
        self.dfs(w + 1, compute);
        for slot in 0..self.ops.len() {
            let v = self.ops[slot];
            let Some(m) = self.models[v] else { continue };
            if self.p.throughput(v, m, w) <= 0.0 {
                continue;
            }
            self.choice[w] = Some(slot);
            self.dfs(w + 1, compute + self.p.worker_cost(w));
        }
        self.choice[w] = None;
    }

    fn leaf(&mut self) {
        let p = self.p;
        let mut sets: Vec<Vec<usize>> = vec![Vec::new(); self.ops.len()];
        for (w, c) in self.choice.iter().enumerate() {
            if let Some(s) = c {
                sets[*s].push(w);
            }
        }
        // Capacity first (cheap), then A2 on tiers.
        for (slot, set) in sets.iter().enumerate() {
            let v = self.ops[slot];
            let m = self.models[v].unwrap_or(0);
            let cap: f64 = set.iter().map(|&w| p.throughput(v, m, w)).sum();
            if cap + 1e-9 < self.rates[v] || (set.is_empty() && self.rates[v] > 0.0) {
                return;
            }
        }
        let mut a: Assignment = vec![Vec::new(); p.operators.len()];
        for (slot, set) in sets.iter().enumerate() {
            a[self.ops[slot]] = set.iter().map(|&w| (w, 0.0)).collect();
        }
        if !p.satisfies_a2(&a) {
            return;
        }
        // Every combination of fill orders.
        let perms: Vec<Vec<Vec<usize>>> = sets.iter().map(|s| permutations(s)).collect();
        let mut idx = vec![0usize; perms.len()];
        loop {
            for (slot, ps) in perms.iter().enumerate() {
                let v = self.ops[slot];
                a[v] = fill(
                    p,
                    v,
                    self.models[v].unwrap_or(0),
                    &ps[idx[slot]],
                    self.rates[v],
                );
            }
            let (c, m) = p.costs(self.models, &a);
            if c + m < self.bound - 1e-12 {
                self.bound = c + m;
                self.best = Some(p.plan(self.models.clone(), a.clone()));
            }
            let mut k = 0;
            loop {
                if k == idx.len() {
                    return;
                }
                idx[k] += 1;
                if idx[k] < perms[k].len() {
                    break;
                }
                idx[k] = 0;
                k += 1;
            }
        }
    }
}

/// The optimal plan under A2, or a refusal with the state estimate.
/// `upper_bound` (e.g. the heuristic's cost) prunes the search.
pub fn optimum(p: &Problem, upper_bound: Option<f64>) -> Result<Option<Plan>> {
    let selections = all_feasible(p);
    let states = estimate_states(p, selections.len());
    if states > STATE_LIMIT {
        return Err(PlanError::TooLarge {
            states,
            limit: STATE_LIMIT,
        });
    }
    let mut best: Option<Plan> = None;
    let mut bound = upper_bound.map_or(f64::INFINITY, |b| b + 1e-9);
    for models in &selections {
        let mut s = Search {
            p,
            models,
            ops: p.compute_ops(),
            rates: p.rates().to_vec(),
            choice: vec![None; p.workers.len()],
            best: None,
            bound,
        };
        s.dfs(0, 0.0);
        if let Some(plan) = s.best {
            bound = plan.total_cost;
            best = Some(plan);
        }
    }
    Ok(best)
}
