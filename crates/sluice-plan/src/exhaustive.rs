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
    /// Nodes visited (search states).
    states: u64,
    deadline: Option<std::time::Instant>,
    stopped: bool,
}

impl Search<'_> {
    fn dfs(&mut self, w: usize, compute: f64) {
        self.states += 1;
        if self.states.is_multiple_of(1024)
            && self
                .deadline
                .is_some_and(|d| std::time::Instant::now() >= d)
        {
            self.stopped = true;
        }
        if self.stopped || compute >= self.bound {
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

/// How an exact search ended.
#[derive(Clone, Debug)]
pub struct Exact {
    /// The cheapest plan found below the upper bound (the optimum when
    /// `finished`; `None`: nothing cheaper than the bound exists).
    pub plan: Option<Plan>,
    /// Search states visited.
    pub states: u64,
    /// Whether the whole space was searched (else the budget ran out).
    pub finished: bool,
}

/// The optimal plan under A2, or a refusal with the state estimate.
/// `upper_bound` (e.g. the heuristic's cost) prunes the search.
pub fn optimum(p: &Problem, upper_bound: Option<f64>) -> Result<Option<Plan>> {
    optimum_within(p, upper_bound, None).map(|e| e.plan)
}

/// `optimum`, stopping when `budget` runs out (then `finished` is false
/// and `plan` is the best found so far).
pub fn optimum_within(
    p: &Problem,
    upper_bound: Option<f64>,
    budget: Option<std::time::Duration>,
) -> Result<Exact> {
    let selections = all_feasible(p);
    let states = estimate_states(p, selections.len());
    if states > STATE_LIMIT {
        return Err(PlanError::TooLarge {
            states,
            limit: STATE_LIMIT,
        });
    }
    let deadline = budget.map(|b| std::time::Instant::now() + b);
    let mut best: Option<Plan> = None;
    let mut bound = upper_bound.map_or(f64::INFINITY, |b| b + 1e-9);
    let mut visited = 0;
    for models in &selections {
        let mut s = Search {
            p,
            models,
            ops: p.compute_ops(),
            rates: p.rates().to_vec(),
            choice: vec![None; p.workers.len()],
            best: None,
            bound,
            states: 0,
            deadline,
            stopped: false,
        };
        s.dfs(0, 0.0);
        visited += s.states;
        if let Some(plan) = s.best {
            bound = plan.total_cost;
            best = Some(plan);
        }
        if s.stopped {
            return Ok(Exact {
                plan: best,
                states: visited,
                finished: false,
            });
        }
    }
    Ok(Exact {
        plan: best,
        states: visited,
        finished: true,
    })
}

/// A lower bound on any plan's cost: each compute operator's rate carried
/// at the best cost per unit of throughput of any of its variants on any
/// worker (a relaxation: workers may be split and shared, accuracy and
/// A2 ignored, communication free).
pub fn lower_bound(p: &Problem) -> f64 {
    let rates = p.rates();
    p.compute_ops()
        .iter()
        .map(|&v| {
            let best = (0..p.operators[v].variants.len())
                .flat_map(|m| (0..p.workers.len()).map(move |w| (m, w)))
                .filter_map(|(m, w)| {
                    let t = p.throughput(v, m, w);
                    (t > 0.0).then(|| p.worker_cost(w) / t)
                })
                .fold(f64::INFINITY, f64::min);
            if best.is_finite() {
                rates[v] * best
            } else {
                0.0
            }
        })
        .sum()
}
