//! The planning problem and the evaluation of a plan (Eq. 5.1 with the
//! fixture's cost model).

use serde::Serialize;
use std::collections::HashMap;

/// KB/s sustained for an hour, in GB: × 3600 s / 1024 / 1024.
pub const KBPS_TO_GB_PER_HOUR: f64 = 3600.0 / 1024.0 / 1024.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// A data source: sits on tier 0, has a rate, runs nothing.
    Source,
    /// An operator with model variants (ML) or a single `default` variant
    /// (relational operators, the sink).
    Compute,
}

/// One accuracy sample: input accuracies (in the order of the operator's
/// `acc_inputs`) → output accuracy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AccRow {
    pub inputs: Vec<f64>,
    pub output: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    pub name: String,
    /// Ranks variants during model selection (lower is cheaper).
    pub cost_proxy: f64,
    /// Latency of one request per worker (index = worker); None = cannot run there.
    pub latency_ms: Vec<Option<f64>>,
    /// Accuracy profile; empty means "no profile": the output accuracy is
    /// the minimum of the input accuracies (a relational operator).
    pub acc: Vec<AccRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Operator {
    pub name: String,
    pub kind: OpKind,
    /// Requests per second, for sources.
    pub rate: Option<f64>,
    pub variants: Vec<Variant>,
    /// Operators whose accuracies the profile rows take as inputs, in order.
    pub acc_inputs: Vec<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    /// Requests arriving at `to` per request leaving `from`.
    pub ratio: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Worker {
    pub name: String,
    pub tier: usize,
    pub cost_per_hour: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Tier {
    pub name: String,
    /// Locations this tier is spread over; a worker entry stands for one
    /// replica per location (see `tcoeff`).
    pub locations: u32,
}

/// End-to-end accuracy table: variants of `ops` (in order) → accuracy.
#[derive(Clone, Debug, Serialize)]
pub struct EndToEnd {
    pub ops: Vec<usize>,
    pub rows: Vec<(Vec<usize>, f64)>,
}

/// Search settings (the fixture's config.yaml names).
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    /// BEAM_SEARCH.BEST_K: model configurations kept.
    pub model_beam: usize,
    /// WORKER_ASSIGNMENT.MAX_NUM_ASSIGN_ORDERS: random topological orders tried.
    pub assign_orders: usize,
    /// WORKER_ASSIGNMENT.BEST_K_ASSIGNMENTS: assignments kept per step.
    pub assign_beam: usize,
    /// INPUT.COMM_COST_SCALING_FACTOR, applied to every link cost.
    pub comm_scale: f64,
    /// INPUT.LATENCY_OVERESTIMATE_RATIO, applied to every latency.
    pub latency_overestimate: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            model_beam: 10,
            assign_orders: 10,
            assign_beam: 10,
            comm_scale: 1.0,
            latency_overestimate: 1.0,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    pub name: String,
    pub operators: Vec<Operator>,
    pub edges: Vec<Edge>,
    pub workers: Vec<Worker>,
    pub tiers: Vec<Tier>,
    pub sink: usize,
    pub accuracy_target: f64,
    /// Cost per GB from a source to a worker; absent = free.
    pub source_links: HashMap<(usize, usize), f64>,
    /// Cost per GB from worker a to worker b; absent = free.
    pub worker_links: HashMap<(usize, usize), f64>,
    /// (edge, from-variant name or "default", to-variant name or "default") → KB.
    pub message_kb: HashMap<(usize, String, String), f64>,
    pub end_to_end: Option<EndToEnd>,
    pub settings: Settings,
    /// Input rates, computed once (they depend only on the graph and the
    /// source rates, which do not change after loading).
    #[serde(skip)]
    pub rates_cache: std::sync::OnceLock<Vec<f64>>,
}

/// A model per operator (None for sources), by variant index.
pub type Models = Vec<Option<usize>>;

/// Workers of one operator with the load each carries, in fill order.
pub type Assignment = Vec<Vec<(usize, f64)>>;

/// A complete plan and its costs.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub models: Models,
    pub assignment: Assignment,
    pub accuracy: f64,
    pub compute_cost: f64,
    pub comm_cost: f64,
    pub total_cost: f64,
}

impl Problem {
    pub fn op_index(&self, name: &str) -> Option<usize> {
        self.operators.iter().position(|o| o.name == name)
    }

    pub fn worker_index(&self, name: &str) -> Option<usize> {
        self.workers.iter().position(|w| w.name == name)
    }

    pub fn parents(&self, v: usize) -> impl Iterator<Item = &Edge> {
        self.edges.iter().filter(move |e| e.to == v)
    }

    pub fn compute_ops(&self) -> Vec<usize> {
        (0..self.operators.len())
            .filter(|&i| self.operators[i].kind == OpKind::Compute)
            .collect()
    }

    /// Throughput coefficient of a worker: the number of locations from its
    /// tier up to the top tier (product), 1 for a single-location tier.
    pub fn tcoeff(&self, w: usize) -> f64 {
        self.tiers[self.workers[w].tier..]
            .iter()
            .map(|t| f64::from(t.locations.max(1)))
            .product()
    }

    /// Requests per second one worker entry (all its locations) sustains
    /// for `v` running variant `m`; 0 when it cannot run it.
    pub fn throughput(&self, v: usize, m: usize, w: usize) -> f64 {
        match self.operators[v].variants[m].latency_ms[w] {
            Some(l) if l > 0.0 => {
                1000.0 / (l * self.settings.latency_overestimate) * self.tcoeff(w)
            }
            _ => 0.0,
        }
    }

    /// Hourly cost of a worker entry (all its locations).
    pub fn worker_cost(&self, w: usize) -> f64 {
        self.workers[w].cost_per_hour * self.tcoeff(w)
    }

    /// Input rate of every operator: sources have theirs; an operator
    /// receives the largest of its parents' rates × ratio (inputs of a
    /// multi-input operator are aligned streams that it joins).
    pub fn rates(&self) -> &[f64] {
        self.rates_cache.get_or_init(|| self.compute_rates())
    }

    fn compute_rates(&self) -> Vec<f64> {
        let mut rate = vec![0.0; self.operators.len()];
        for v in self.topo_order() {
            rate[v] = match self.operators[v].rate {
                Some(r) => r,
                None => self
                    .parents(v)
                    .map(|e| rate[e.from] * e.ratio)
                    .fold(0.0, f64::max),
            };
        }
        rate
    }

    /// A topological order (Kahn's algorithm, lowest index first).
    pub fn topo_order(&self) -> Vec<usize> {
        self.topo_by(|ready| {
            let (i, _) = ready
                .iter()
                .enumerate()
                .min_by_key(|(_, v)| **v)
                .expect("ready is not empty");
            i
        })
    }

    /// A uniformly chosen ready node at each step: a random topological order.
    pub fn random_topo_order(&self, rng: &mut crate::rng::Rng) -> Vec<usize> {
        self.topo_by(|ready| rng.below(ready.len()))
    }

    /// Kahn's algorithm; `pick` chooses which ready node comes next.
    fn topo_by(&self, mut pick: impl FnMut(&[usize]) -> usize) -> Vec<usize> {
        let n = self.operators.len();
        let mut indeg = vec![0usize; n];
        for e in &self.edges {
            indeg[e.to] += 1;
        }
        let mut ready: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
        let mut out = Vec::with_capacity(n);
        while !ready.is_empty() {
            let v = ready.swap_remove(pick(&ready));
            out.push(v);
            for e in self.edges.iter().filter(|e| e.from == v) {
                indeg[e.to] -= 1;
                if indeg[e.to] == 0 {
                    ready.push(e.to);
                }
            }
        }
        out
    }

    /// Message size in KB on edge `e` for a pair of variants; `default`
    /// matches any variant without a row of its own.
    pub fn message_kb(&self, e: usize, from_var: &str, to_var: &str) -> f64 {
        let k = |a: &str, b: &str| {
            self.message_kb
                .get(&(e, a.to_string(), b.to_string()))
                .copied()
        };
        k(from_var, to_var)
            .or_else(|| k(from_var, "default"))
            .or_else(|| k("default", to_var))
            .or_else(|| k("default", "default"))
            .unwrap_or(0.0)
    }

    fn variant_name(&self, v: usize, models: &Models) -> &str {
        match models[v] {
            Some(m) => &self.operators[v].variants[m].name,
            None => "default",
        }
    }

    /// $/hour of moving 1 KB/s over a link of `cost_per_gb`.
    pub fn link_unit(&self, cost_per_gb: f64) -> f64 {
        cost_per_gb * self.settings.comm_scale * KBPS_TO_GB_PER_HOUR
    }

    /// Communication cost per hour of the traffic into operator `v`, given
    /// its workers' loads and its parents' (a source parent sits on tier 0).
    pub fn comm_into(&self, v: usize, models: &Models, a: &Assignment, rates: &[f64]) -> f64 {
        let mut total = 0.0;
        let tv = rates[v];
        if tv <= 0.0 {
            return 0.0;
        }
        for (ei, e) in self.edges.iter().enumerate().filter(|(_, e)| e.to == v) {
            let u = e.from;
            let kb = self.message_kb(
                ei,
                self.variant_name(u, models),
                self.variant_name(v, models),
            );
            let traffic = rates[u] * e.ratio * kb; // KB/s on the edge
            if traffic == 0.0 {
                continue;
            }
            for &(w, lw) in &a[v] {
                let fw = lw / tv;
                if self.operators[u].kind == OpKind::Source {
                    if let Some(c) = self.source_links.get(&(u, w)) {
                        total += self.link_unit(*c) * traffic * fw;
                    }
                } else {
                    let tu = rates[u];
                    for &(x, lx) in &a[u] {
                        if let Some(c) = self.worker_links.get(&(x, w)) {
                            total += self.link_unit(*c) * traffic * (lx / tu) * fw;
                        }
                    }
                }
            }
        }
        total
    }

    /// Compute and communication cost per hour of a full assignment.
    pub fn costs(&self, models: &Models, a: &Assignment) -> (f64, f64) {
        let rates = self.rates();
        let compute = a.iter().flatten().map(|&(w, _)| self.worker_cost(w)).sum();
        let comm = self
            .compute_ops()
            .into_iter()
            .map(|v| self.comm_into(v, models, a, rates))
            .sum();
        (compute, comm)
    }

    /// Highest tier among an operator's workers (sources: tier 0).
    pub fn max_tier(&self, v: usize, a: &Assignment) -> usize {
        if self.operators[v].kind == OpKind::Source {
            return 0;
        }
        a[v].iter()
            .map(|&(w, _)| self.workers[w].tier)
            .max()
            .unwrap_or(0)
    }

    /// The lowest tier `v`'s workers may use under A2 (no traffic flows
    /// down a tier): the highest tier of any parent's workers.
    pub fn min_tier_allowed(&self, v: usize, a: &Assignment) -> usize {
        self.parents(v)
            .map(|e| self.max_tier(e.from, a))
            .max()
            .unwrap_or(0)
    }

    /// Checks a full plan; returns every violation (empty = valid).
    pub fn violations(&self, models: &Models, a: &Assignment, require_a2: bool) -> Vec<String> {
        let mut out = Vec::new();
        let rates = self.rates();
        let mut seen = vec![false; self.workers.len()];
        for v in self.compute_ops() {
            let Some(m) = models[v] else {
                out.push(format!("{} has no model", self.operators[v].name));
                continue;
            };
            let cap: f64 = a[v].iter().map(|&(w, _)| self.throughput(v, m, w)).sum();
            if cap + 1e-9 < rates[v] {
                out.push(format!(
                    "{}: throughput {cap:.3} < input rate {:.3}",
                    self.operators[v].name, rates[v]
                ));
            }
            let load: f64 = a[v].iter().map(|&(_, l)| l).sum();
            if (load - rates[v]).abs() > 1e-6 * rates[v].max(1.0) {
                out.push(format!(
                    "{}: loads sum to {load:.3}, rate is {:.3}",
                    self.operators[v].name, rates[v]
                ));
            }
            for &(w, l) in &a[v] {
                if std::mem::replace(&mut seen[w], true) {
                    out.push(format!(
                        "worker {} serves more than one operator",
                        self.workers[w].name
                    ));
                }
                if l > self.throughput(v, m, w) + 1e-9 {
                    out.push(format!(
                        "{} on {}: load {l:.3} above its throughput",
                        self.operators[v].name, self.workers[w].name
                    ));
                }
            }
            if require_a2 {
                let lo = self.min_tier_allowed(v, a);
                if a[v].iter().any(|&(w, _)| self.workers[w].tier < lo) {
                    out.push(format!(
                        "{}: traffic would flow down to a lower tier (A2)",
                        self.operators[v].name
                    ));
                }
            }
        }
        out
    }

    /// Whether the plan satisfies A2.
    pub fn satisfies_a2(&self, a: &Assignment) -> bool {
        self.compute_ops().into_iter().all(|v| {
            let lo = self.min_tier_allowed(v, a);
            a[v].iter().all(|&(w, _)| self.workers[w].tier >= lo)
        })
    }

    /// Builds a `Plan` with its costs and accuracy.
    pub fn plan(&self, models: Models, assignment: Assignment) -> Plan {
        let (compute_cost, comm_cost) = self.costs(&models, &assignment);
        let accuracy = crate::accuracy::accuracy(self, &models);
        Plan {
            models,
            assignment,
            accuracy,
            compute_cost,
            comm_cost,
            total_cost: compute_cost + comm_cost,
        }
    }
}

/// Loads for a set of workers filled in order: each takes as much as it
/// can until the rate is met (the last one takes the remainder).
pub fn fill(p: &Problem, v: usize, m: usize, order: &[usize], rate: f64) -> Vec<(usize, f64)> {
    let mut rem = rate;
    order
        .iter()
        .map(|&w| {
            let l = p.throughput(v, m, w).min(rem.max(0.0));
            rem -= l;
            (w, l)
        })
        .collect()
}

/// Every ordering of `items` (n! of them; callers keep n small).
pub fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let x = rest.remove(i);
        for mut q in permutations(&rest) {
            q.insert(0, x);
            out.push(q);
        }
    }
    out
}
