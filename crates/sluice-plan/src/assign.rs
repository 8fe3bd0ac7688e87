//! Worker assignment (section 5.4.3, Algorithm 1) and our refinements.
//!
//! Algorithm 1: walk the operators in a topological order; for each
//! assignment in the beam and each tier pool i (workers of tiers from the
//! lowest A2 allows up to i), add available workers in increasing order of
//! per-request cost (Eq. 5.2: hourly cost / throughput + the communication
//! cost of one request from the parents' workers) until the input rate is
//! met; keep the best `assign_beam` partial assignments. Several seeded
//! random topological orders are tried.
//!
//! Beyond the paper (never worse: the paper's result is always computed
//! and the best plan wins):
//! - closing branches: at every step of the greedy chain we also emit the
//!   candidate that closes the remaining rate with the single cheapest
//!   worker able to cover it (a best-fit finish), so one large-but-cheap
//!   worker can replace two small ones;
//! - polish: a local search over the final plan that re-orders how load is
//!   filled over an operator's workers (which changes traffic, hence cost),
//!   drops superfluous workers and swaps a worker for an unused one, taking
//!   only strict improvements that keep every constraint (A2 included).

use crate::problem::{fill, permutations, Assignment, Models, Plan, Problem};
use crate::rng::Rng;

#[derive(Clone, Debug)]
struct Partial {
    a: Assignment,
    used: Vec<bool>,
    cost: f64,
}

/// Per-request cost of running `v` on `w` given the parents already placed.
fn unit_cost(
    p: &Problem,
    v: usize,
    m: usize,
    w: usize,
    models: &Models,
    a: &mut Assignment,
    rates: &[f64],
) -> f64 {
    let t = p.throughput(v, m, w);
    let rate = rates[v];
    let saved = std::mem::replace(&mut a[v], vec![(w, rate)]);
    let comm = if rate > 0.0 {
        p.comm_into(v, models, a, rates) / rate
    } else {
        0.0
    };
    a[v] = saved;
    p.worker_cost(w) / t + comm
}

/// One greedy fill (plus closing branches when `extended`) of operator `v`
/// from workers of tiers `lo..=hi`.
fn candidates(
    p: &Problem,
    v: usize,
    m: usize,
    base: &Partial,
    lo: usize,
    hi: usize,
    models: &Models,
    rates: &[f64],
    extended: bool,
) -> Vec<Partial> {
    let rate = rates[v];
    let mut scratch = base.a.clone();
    let mut avail: Vec<(f64, usize)> = (0..p.workers.len())
        .filter(|&w| {
            !base.used[w] && (lo..=hi).contains(&p.workers[w].tier) && p.throughput(v, m, w) > 0.0
        })
        .map(|w| (unit_cost(p, v, m, w, models, &mut scratch, rates), w))
        .collect();
    avail.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let finish = |chosen: &[usize]| -> Partial {
        let mut c = base.clone();
        c.a[v] = fill(p, v, m, chosen, rate);
        for &w in chosen {
            c.used[w] = true;
            c.cost += p.worker_cost(w);
        }
        c.cost += p.comm_into(v, models, &c.a, rates);
        c
    };
    let mut out = Vec::new();
    let mut chosen: Vec<usize> = Vec::new();
    let mut rem = rate;
    for (i, &(_, w)) in avail.iter().enumerate() {
        if rem <= 1e-12 {
            break;
        }
        if extended {
            // Close the gap with the one worker (among the rest) that covers
            // it at the lowest total cost for the remaining load.
            let closer = avail[i..]
                .iter()
                .filter(|&&(_, x)| p.throughput(v, m, x) + 1e-12 >= rem)
                .min_by(|a, b| {
                    let c = |&(u, x): &(f64, usize)| {
                        p.worker_cost(x) + (u - p.worker_cost(x) / p.throughput(v, m, x)) * rem
                    };
                    c(a).total_cmp(&c(b)).then(a.1.cmp(&b.1))
                });
            if let Some(&(_, x)) = closer {
                if x != w {
                    let mut alt = chosen.clone();
                    alt.push(x);
                    out.push(finish(&alt));
                }
            }
        }
        chosen.push(w);
        rem -= p.throughput(v, m, w);
    }
    if rem <= 1e-9 {
        out.push(finish(&chosen));
    }
    if rate <= 0.0 {
        out.push(finish(&[]));
    }
    out
}

/// Algorithm 1 for one model selection and one operator order; returns the
/// best complete assignment, or None when the workers cannot carry the load.
pub fn algorithm1(p: &Problem, models: &Models, order: &[usize], extended: bool) -> Option<Plan> {
    let rates = p.rates();
    let beam_width = p.settings.assign_beam.max(1);
    let mut beam = vec![Partial {
        a: vec![Vec::new(); p.operators.len()],
        used: vec![false; p.workers.len()],
        cost: 0.0,
    }];
    for &v in order {
        let Some(m) = models[v] else { continue };
        let mut next: Vec<Partial> = Vec::new();
        for b in &beam {
            let lo = p.min_tier_allowed(v, &b.a);
            for hi in lo..p.tiers.len() {
                next.extend(candidates(p, v, m, b, lo, hi, models, &rates, extended));
            }
        }
        next.sort_by(|a, b| a.cost.total_cmp(&b.cost));
        next.dedup_by(|a, b| a.a == b.a);
        next.truncate(beam_width);
        if next.is_empty() {
            return None;
        }
        beam = next;
    }
    let best = beam.into_iter().next()?;
    Some(p.plan(models.clone(), best.a))
}

/// The operator orders to try: the canonical topological order, then
/// seeded random ones, without repeats.
pub fn orders(p: &Problem, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = Rng::new(seed);
    let compute = |o: Vec<usize>| -> Vec<usize> {
        o.into_iter()
            .filter(|&v| p.operators[v].kind != crate::problem::OpKind::Source)
            .collect()
    };
    let mut out = vec![compute(p.topo_order())];
    let mut tries = 0;
    while out.len() < p.settings.assign_orders.max(1)
        && tries < 20 * p.settings.assign_orders.max(1)
    {
        let o = compute(p.random_topo_order(&mut rng));
        if !out.contains(&o) {
            out.push(o);
        }
        tries += 1;
    }
    out
}

/// Best plan of Algorithm 1 over the selections and orders.
pub fn heuristic(p: &Problem, selections: &[Models], seed: u64, extended: bool) -> Option<Plan> {
    let orders = orders(p, seed);
    let mut best: Option<Plan> = None;
    for models in selections {
        for order in &orders {
            if let Some(plan) = algorithm1(p, models, order, extended) {
                if best
                    .as_ref()
                    .is_none_or(|b| plan.total_cost < b.total_cost - 1e-12)
                {
                    best = Some(plan);
                }
            }
        }
    }
    best
}

fn feasible(p: &Problem, models: &Models, a: &Assignment) -> bool {
    p.violations(models, a, true).is_empty()
}

fn total(p: &Problem, models: &Models, a: &Assignment) -> f64 {
    let (c, m) = p.costs(models, a);
    c + m
}

/// Re-fills `v`'s workers in `order`.
fn refill(
    p: &Problem,
    models: &Models,
    a: &Assignment,
    v: usize,
    order: &[usize],
    rates: &[f64],
) -> Assignment {
    let mut b = a.clone();
    if let Some(m) = models[v] {
        b[v] = fill(p, v, m, order, rates[v]);
    }
    b
}

/// Local search over a plan; returns a plan that is never worse.
pub fn polish(p: &Problem, plan: &Plan) -> Plan {
    let models = &plan.models;
    let rates = p.rates();
    let mut a = plan.assignment.clone();
    let mut best = total(p, models, &a);
    for _round in 0..100 {
        let mut improved = false;
        for v in p.compute_ops() {
            let ws: Vec<usize> = a[v].iter().map(|&(w, _)| w).collect();
            // 1. Fill order (exhaustive up to 6 workers, else each rotation).
            let orders = if ws.len() <= 6 {
                permutations(&ws)
            } else {
                (0..ws.len())
                    .map(|i| [&ws[i..], &ws[..i]].concat())
                    .collect()
            };
            for o in orders {
                let b = refill(p, models, &a, v, &o, &rates);
                let t = total(p, models, &b);
                if t < best - 1e-12 && feasible(p, models, &b) {
                    a = b;
                    best = t;
                    improved = true;
                }
            }
            let ws: Vec<usize> = a[v].iter().map(|&(w, _)| w).collect();
            // 2. Drop a worker.
            for i in 0..ws.len() {
                let mut o = ws.clone();
                o.remove(i);
                let b = refill(p, models, &a, v, &o, &rates);
                let t = total(p, models, &b);
                if t < best - 1e-12 && feasible(p, models, &b) {
                    a = b;
                    best = t;
                    improved = true;
                    break;
                }
            }
            // 3. Swap a worker for an unused one.
            let ws: Vec<usize> = a[v].iter().map(|&(w, _)| w).collect();
            let used: Vec<usize> = a.iter().flatten().map(|&(w, _)| w).collect();
            'swap: for i in 0..ws.len() {
                for x in (0..p.workers.len()).filter(|x| !used.contains(x)) {
                    let mut o = ws.clone();
                    o[i] = x;
                    let b = refill(p, models, &a, v, &o, &rates);
                    let t = total(p, models, &b);
                    if t < best - 1e-12 && feasible(p, models, &b) {
                        a = b;
                        best = t;
                        improved = true;
                        break 'swap;
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    p.plan(models.clone(), a)
}
