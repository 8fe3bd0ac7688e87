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
//!   candidates that close the remaining rate with each of the `CLOSERS`
//!   cheapest single workers able to cover it (best-fit finishes), so one large-but-cheap worker can
//!   replace two small ones and the beam sees placements that leave the
//!   right workers free for later operators;
//! - polish: a local search over the final plan that re-orders how load is
//!   filled over an operator's workers (which changes traffic, hence cost),
//!   drops superfluous workers and swaps a worker for an unused one, taking
//!   only strict improvements that keep every constraint (A2 included).

use crate::problem::{fill, permutations, Assignment, Models, Plan, Problem};
use crate::rng::Rng;

/// Closing branches emitted per step of the greedy chain: the cheapest
/// few single workers that cover the remaining rate.
const CLOSERS: usize = 3;

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

/// What stays fixed while one operator's candidates are generated.
struct Ctx<'a> {
    p: &'a Problem,
    models: &'a Models,
    rates: &'a [f64],
    extended: bool,
}

/// One greedy fill (plus closing branches when `extended`) of operator `v`
/// from workers of the given tiers.
fn candidates(
    ctx: &Ctx<'_>,
    v: usize,
    base: &Partial,
    tiers: std::ops::RangeInclusive<usize>,
) -> Vec<Partial> {
    let Ctx {
        p,
        models,
        rates,
        extended,
    } = *ctx;
    let Some(m) = models[v] else {
        return Vec::new();
    };
    let (lo, hi) = (*tiers.start(), *tiers.end());
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
            // Close the gap with any one worker (among the rest) that covers
            // it; the beam keeps the cheapest of these branches.
            let mut closers: Vec<(f64, usize)> = avail[i..]
                .iter()
                .filter(|&&(_, x)| x != w && p.throughput(v, m, x) + 1e-12 >= rem)
                .map(|&(unit, x)| {
                    (
                        p.worker_cost(x) + (unit - p.worker_cost(x) / p.throughput(v, m, x)) * rem,
                        x,
                    )
                })
                .collect();
            closers.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for &(_, x) in closers.iter().take(CLOSERS) {
                let mut alt = chosen.clone();
                alt.push(x);
                out.push(finish(&alt));
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
    let ctx = Ctx {
        p,
        models,
        rates,
        extended,
    };
    let beam_width = p.settings.assign_beam.max(1);
    let mut beam = vec![Partial {
        a: vec![Vec::new(); p.operators.len()],
        used: vec![false; p.workers.len()],
        cost: 0.0,
    }];
    for &v in order {
        if models[v].is_none() {
            continue;
        }
        let mut next: Vec<Partial> = Vec::new();
        for b in &beam {
            let lo = p.min_tier_allowed(v, &b.a);
            for hi in lo..p.tiers.len() {
                next.extend(candidates(&ctx, v, b, lo..=hi));
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

/// The cost of `b` when it is valid and strictly cheaper than `best`.
fn improves(p: &Problem, models: &Models, b: &Assignment, best: f64) -> Option<f64> {
    let t = total(p, models, b);
    (t < best - 1e-12 && feasible(p, models, b)).then_some(t)
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

/// Tries every exchange of two workers between two operators and every
/// move of one worker to another operator (appended last in its fill
/// order); applies the best strict improvement that keeps the plan valid.
fn exchange_or_move(
    p: &Problem,
    models: &Models,
    a: &mut Assignment,
    best: &mut f64,
    rates: &[f64],
) -> bool {
    let ops = p.compute_ops();
    let mut found: Option<(f64, Assignment)> = None;
    let mut consider = |b: Assignment| {
        let t = total(p, models, &b);
        if t < *best - 1e-12
            && found.as_ref().is_none_or(|(f, _)| t < *f)
            && feasible(p, models, &b)
        {
            found = Some((t, b));
        }
    };
    for &u in &ops {
        for &v in &ops {
            if u == v {
                continue;
            }
            // Re-fills u and v with the given worker orders.
            let both = |ou: &[usize], ov: &[usize]| {
                refill(p, models, &refill(p, models, a, u, ou, rates), v, ov, rates)
            };
            let wu: Vec<usize> = a[u].iter().map(|&(w, _)| w).collect();
            let wv: Vec<usize> = a[v].iter().map(|&(w, _)| w).collect();
            for i in 0..wu.len() {
                // Move wu[i] to v.
                let mut ou = wu.clone();
                let x = ou.remove(i);
                let mut ov = wv.clone();
                ov.push(x);
                consider(both(&ou, &ov));
                // Exchange wu[i] with each of v's workers (u < v: each pair once).
                if u < v {
                    for j in 0..wv.len() {
                        let mut ou = wu.clone();
                        let mut ov = wv.clone();
                        std::mem::swap(&mut ou[i], &mut ov[j]);
                        consider(both(&ou, &ov));
                    }
                }
            }
        }
    }
    match found {
        Some((t, b)) => {
            *a = b;
            *best = t;
            true
        }
        None => false,
    }
}

/// Local search over a plan; returns a plan that is never worse. Besides
/// the assignment moves, tries every other variant of each operator on the
/// same workers (kept when accurate enough, feasible and cheaper).
pub fn polish(p: &Problem, plan: &Plan) -> Plan {
    let mut cur = polish_assignment(p, plan);
    for _ in 0..20 {
        let mut next: Option<Plan> = None;
        for v in p.compute_ops() {
            for m in 0..p.operators[v].variants.len() {
                if Some(m) == cur.models[v] {
                    continue;
                }
                let mut models = cur.models.clone();
                models[v] = Some(m);
                if crate::accuracy::accuracy(p, &models) < p.accuracy_target - 1e-9 {
                    continue;
                }
                let order: Vec<usize> = cur.assignment[v].iter().map(|&(w, _)| w).collect();
                let a = refill(p, &models, &cur.assignment, v, &order, p.rates());
                if !feasible(p, &models, &a) {
                    continue;
                }
                let cand = polish_assignment(p, &p.plan(models, a));
                if cand.total_cost < cur.total_cost - 1e-12
                    && next.as_ref().is_none_or(|n| cand.total_cost < n.total_cost)
                {
                    next = Some(cand);
                }
            }
        }
        match next {
            Some(n) => cur = n,
            None => break,
        }
    }
    cur
}

fn polish_assignment(p: &Problem, plan: &Plan) -> Plan {
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
                let b = refill(p, models, &a, v, &o, rates);
                if let Some(t) = improves(p, models, &b, best) {
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
                let b = refill(p, models, &a, v, &o, rates);
                if let Some(t) = improves(p, models, &b, best) {
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
                    let b = refill(p, models, &a, v, &o, rates);
                    if let Some(t) = improves(p, models, &b, best) {
                        a = b;
                        best = t;
                        improved = true;
                        break 'swap;
                    }
                }
            }
        }
        // 4. Exchange two workers between operators; 5. move one over.
        if !improved {
            improved = exchange_or_move(p, models, &mut a, &mut best, rates);
        }
        if !improved {
            break;
        }
    }
    p.plan(models.clone(), a)
}
