//! The paper's baselines (section 5.6): both use the most accurate model of
//! every operator. First Fit assigns each operator the cheapest workers per
//! request wherever they are; Best Fit prefers the cheapest workers on the
//! tier its inputs come from and moves up a tier only when that tier runs
//! out. Neither looks at communication, and, as in the paper, either may
//! break A2 (reported, not enforced).

use crate::problem::{fill, Assignment, Plan, Problem};
use crate::select::most_accurate;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    FirstFit,
    BestFit,
}

pub fn run(p: &Problem, which: Baseline) -> Option<Plan> {
    let models = most_accurate(p);
    let rates = p.rates();
    let mut used = vec![false; p.workers.len()];
    let mut a: Assignment = vec![Vec::new(); p.operators.len()];
    for v in p.topo_order() {
        let Some(m) = models[v] else { continue };
        let mut cands: Vec<usize> = (0..p.workers.len())
            .filter(|&w| !used[w] && p.throughput(v, m, w) > 0.0)
            .collect();
        let per_req = |w: usize| p.worker_cost(w) / p.throughput(v, m, w);
        let home = p.min_tier_allowed(v, &a);
        match which {
            Baseline::FirstFit => {
                cands.sort_by(|&x, &y| per_req(x).total_cmp(&per_req(y)).then(x.cmp(&y)))
            }
            Baseline::BestFit => cands.sort_by(|&x, &y| {
                let tier_rank = |w: usize| p.workers[w].tier.abs_diff(home);
                tier_rank(x)
                    .cmp(&tier_rank(y))
                    .then(per_req(x).total_cmp(&per_req(y)))
                    .then(x.cmp(&y))
            }),
        }
        let mut chosen = Vec::new();
        let mut rem = rates[v];
        for w in cands {
            if rem <= 1e-12 {
                break;
            }
            chosen.push(w);
            used[w] = true;
            rem -= p.throughput(v, m, w);
        }
        if rem > 1e-9 {
            return None;
        }
        a[v] = fill(p, v, m, &chosen, rates[v]);
    }
    Some(p.plan(models, a))
}
