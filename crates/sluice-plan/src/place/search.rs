//! Finding placements: an exact search where it fits a time budget, the
//! maximum-rank-overlap (MRO) and nested constructions, local search, and
//! reconfiguration with the fewest moves.
//!
//! The exact search places node by node, each node taking a set of at most
//! `slots` parts among those with replicas left (a part whose replicas left
//! equal the nodes left must be taken). Nodes the failure model cannot tell
//! apart (all of them under `Survivors`, those of one domain under
//! `Domains`) take their sets in non-increasing order, so each placement is
//! visited once up to such relabelling; every leaf is evaluated on every
//! scenario. When it finishes within its budget the result is optimal.

use super::eval::{Scenarios, Survival};
use super::{replica_counts, Failures, PlaceProblem, Placement};
use crate::error::{PlanError, Result};
use std::time::{Duration, Instant};

/// Part sets one node may take beyond which the exact search gives up.
const MAX_CHOICES: f64 = 50_000.0;

/// A baseline's placement and survival, or why its construction does not
/// apply.
pub type Baseline = std::result::Result<(Placement, Survival), String>;

/// A plan and how it was found.
#[derive(Clone, Debug)]
pub struct PlaceResult {
    pub counts: Vec<usize>,
    pub placement: Placement,
    pub survival: Survival,
    /// The exact search finished: no placement of these counts does better
    /// (on the scenarios: exact ones, or the sample).
    pub optimal: bool,
    pub states: u64,
    pub elapsed: Duration,
    /// The exact search was out of reach (a node had too many part sets
    /// to try), rather than out of time.
    pub too_large: bool,
    /// Baselines beside it: (name, placement and survival, or why not).
    pub baselines: Vec<(String, Baseline)>,
}

/// A reconfiguration from a current placement.
#[derive(Clone, Debug)]
pub struct Reconfig {
    pub counts: Vec<usize>,
    pub placement: Placement,
    pub survival: Survival,
    /// The current placement (replicas on nodes gone dropped) on the same
    /// scenarios.
    pub before: Survival,
    pub target: f64,
    /// (part, node) of every replica placed where the part was not.
    pub moves: Vec<(usize, usize)>,
    /// (part, node) of every replica the new plan drops.
    pub drops: Vec<(usize, usize)>,
    /// The search ran to its end (within its budget): when it found no
    /// plan reaching the target, none of these counts does.
    pub exhausted: bool,
    /// No plan reaching the target was found: the placement is the greedy
    /// one from the current plan.
    pub greedy: bool,
    pub states: u64,
}

impl Reconfig {
    /// Whether the plan's survival reaches the target.
    pub fn reached(&self) -> bool {
        self.survival.p >= self.target - 1e-12
    }

    /// The search finished with a plan: no plan reaching the target moves
    /// fewer.
    pub fn minimal(&self) -> bool {
        self.exhausted && !self.greedy
    }
}

/// Replica counts that keep the `current` placement where it is: each
/// part's replicas on the nodes left (its fixed count, where the input
/// fixes one), raised to the floor; `None` when they do not fit the slots.
/// After a failure these can survive more than the load-proportional
/// counts of the smaller cluster, which must then not replace them.
pub fn kept_counts(p: &PlaceProblem, current: &Placement) -> Option<Vec<usize>> {
    let n = p.nodes.len();
    let counts: Vec<usize> = p
        .parts
        .iter()
        .zip(&current.holders)
        .map(|(part, m)| {
            part.replicas
                .unwrap_or_else(|| (m.count_ones() as usize).max(p.floor))
                .min(n)
        })
        .collect();
    (counts.len() == p.parts.len() && counts.iter().sum::<usize>() <= n * p.slots).then_some(counts)
}

fn group_of(p: &PlaceProblem, n: usize) -> Option<&str> {
    match p.failures {
        Failures::Survivors(_) => Some(""),
        Failures::Domains(_) => p.nodes[n].domain.as_deref(),
    }
}

/// Shared state of the depth-first searches.
struct Dfs<'a> {
    p: &'a PlaceProblem,
    scen: &'a Scenarios,
    deadline: Instant,
    states: u64,
    out_of_time: bool,
    too_large: bool,
    holders: Vec<u64>,
    rem: Vec<usize>,
}

impl<'a> Dfs<'a> {
    fn new(p: &'a PlaceProblem, scen: &'a Scenarios, counts: &[usize], deadline: Instant) -> Self {
        Dfs {
            p,
            scen,
            deadline,
            states: 0,
            out_of_time: false,
            too_large: false,
            holders: vec![0; counts.len()],
            rem: counts.to_vec(),
        }
    }

    fn tick(&mut self) -> bool {
        self.states += 1;
        if self.states & 0xfff == 0 && Instant::now() > self.deadline {
            self.out_of_time = true;
        }
        self.out_of_time
    }

    /// The part sets node `i` may take (forced parts included), largest
    /// mask first; `None` when there are more than `MAX_CHOICES` (the
    /// exact search is then out of reach).
    fn choices(&self, i: usize, prev: Option<u64>) -> Option<Vec<u64>> {
        let n = self.p.nodes.len();
        let left_after = n - i - 1;
        let mut optional = Vec::new();
        let mut forced = 0u64;
        for (e, r) in self.rem.iter().enumerate() {
            if *r > left_after {
                forced |= 1 << e;
            } else if *r > 0 {
                optional.push(e);
            }
        }
        let f = forced.count_ones() as usize;
        if f > self.p.slots {
            return Some(Vec::new());
        }
        let total: usize = self.rem.iter().sum();
        // This node must take enough that the rest fits the nodes after it.
        let min_k = total.saturating_sub(self.p.slots * left_after).max(f);
        let max_k = self.p.slots.min(f + optional.len());
        if min_k > max_k {
            return Some(Vec::new());
        }
        let count: f64 = (min_k..=max_k)
            .map(|k| super::eval::choose(optional.len() as u64, (k - f) as u64))
            .sum();
        if count > MAX_CHOICES {
            return None;
        }
        let mut out = Vec::new();
        // Optional parts from the highest index down, so masks come out
        // largest first within each size.
        optional.reverse();
        fn combos(opt: &[usize], from: usize, k: usize, acc: u64, out: &mut Vec<u64>) {
            if k == 0 {
                out.push(acc);
                return;
            }
            for j in from..opt.len() {
                if opt.len() - j < k {
                    break;
                }
                combos(opt, j + 1, k - 1, acc | 1 << opt[j], out);
            }
        }
        for k in (min_k..=max_k).rev() {
            combos(&optional, 0, k - f, forced, &mut out);
        }
        if let Some(pm) = prev {
            out.retain(|s| *s <= pm);
        }
        Some(out)
    }

    fn apply(&mut self, i: usize, s: u64, on: bool) {
        let mut m = s;
        while m != 0 {
            let e = m.trailing_zeros() as usize;
            m &= m - 1;
            if on {
                self.holders[e] |= 1 << i;
                self.rem[e] -= 1;
            } else {
                self.holders[e] &= !(1 << i);
                self.rem[e] += 1;
            }
        }
    }
}

/// The best placement of `counts` by exhaustive search up to relabelling
/// of interchangeable nodes; `None` when the deadline came first (the best
/// found so far is still returned).
fn exact_best(
    p: &PlaceProblem,
    counts: &[usize],
    scen: &Scenarios,
    deadline: Instant,
) -> (Option<(Placement, usize)>, bool, u64, bool) {
    struct Best {
        pl: Option<(Placement, usize)>,
    }
    fn go(d: &mut Dfs<'_>, i: usize, prev: Option<u64>, best: &mut Best) {
        if d.tick() {
            return;
        }
        if i == d.p.nodes.len() {
            if d.rem.iter().all(|r| *r == 0) {
                let k = d.scen.survived(&d.holders);
                if best.pl.as_ref().is_none_or(|(_, b)| k > *b) {
                    best.pl = Some((
                        Placement {
                            holders: d.holders.clone(),
                        },
                        k,
                    ));
                }
            }
            return;
        }
        let same = i > 0 && group_of(d.p, i) == group_of(d.p, i - 1);
        let Some(choices) = d.choices(i, if same { prev } else { None }) else {
            (d.out_of_time, d.too_large) = (true, true);
            return;
        };
        for s in choices {
            d.apply(i, s, true);
            go(d, i + 1, Some(s), best);
            d.apply(i, s, false);
            if d.out_of_time {
                return;
            }
            if best
                .pl
                .as_ref()
                .is_some_and(|(_, b)| *b == d.scen.alive.len())
            {
                return; // every scenario survives: nothing better exists
            }
        }
    }
    let mut d = Dfs::new(p, scen, counts, deadline);
    let mut best = Best { pl: None };
    go(&mut d, 0, None, &mut best);
    let finished = !d.out_of_time;
    (best.pl, finished, d.states, d.too_large)
}

/// Parts by replica count, fewest first (ties by index).
fn by_count(counts: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..counts.len()).collect();
    order.sort_by_key(|&e| (counts[e], e));
    order
}

/// Fills what `pl` still lacks: each part's missing replicas on the nodes
/// with free slots that do not hold it, least used first. `None` when
/// they do not fit.
fn fill_rest(p: &PlaceProblem, counts: &[usize], mut pl: Placement) -> Option<Placement> {
    for e in by_count(counts) {
        while (pl.holders[e].count_ones() as usize) < counts[e] {
            let n = (0..p.nodes.len())
                .filter(|&n| pl.holders[e] & (1 << n) == 0 && pl.used(n) < p.slots)
                .min_by_key(|&n| (pl.used(n), n))?;
            pl.holders[e] |= 1 << n;
        }
    }
    Some(pl)
}

/// Nested: each part, fewest replicas first, on the lowest-numbered nodes
/// with a free slot (the paper's construction for parts ≤ slots, where
/// the holder sets nest).
pub fn nested(p: &PlaceProblem, counts: &[usize]) -> Option<Placement> {
    let mut pl = Placement::empty(counts.len());
    for e in by_count(counts) {
        for n in 0..p.nodes.len() {
            if pl.holders[e].count_ones() as usize == counts[e] {
                break;
            }
            if pl.used(n) < p.slots {
                pl.holders[e] |= 1 << n;
            }
        }
        if (pl.holders[e].count_ones() as usize) < counts[e] {
            return None;
        }
    }
    Some(pl)
}

/// Maximum rank overlap (Lazarus, Theorem 1): parts, fewest replicas
/// first, in consecutive groups of `slots`; group g gets its own nodes, as
/// many as its first part's replicas, and each of them one replica of each
/// part of the group; the replicas left go to free slots. `Err` says why
/// the construction does not apply.
pub fn mro(p: &PlaceProblem, counts: &[usize]) -> std::result::Result<Placement, String> {
    let order = by_count(counts);
    let n = p.nodes.len();
    let mut pl = Placement::empty(counts.len());
    let mut next = 0usize;
    for group in order.chunks(p.slots) {
        let want = counts[group[0]];
        let take = want.min(n - next);
        if take == 0 {
            return Err(format!(
                "the groups' representatives need more than the {n} nodes"
            ));
        }
        for node in next..next + take {
            for &e in group {
                pl.holders[e] |= 1 << node;
            }
        }
        next += take;
    }
    fill_rest(p, counts, pl).ok_or_else(|| {
        "the replicas left over do not fit the free slots without two replicas of a part on one node"
            .to_string()
    })
}

/// Spread: replicas dealt round-robin over the nodes, most replicas first.
pub fn spread(p: &PlaceProblem, counts: &[usize]) -> Option<Placement> {
    let mut pl = Placement::empty(counts.len());
    let mut order = by_count(counts);
    order.reverse();
    let mut cursor = 0usize;
    let n = p.nodes.len();
    for e in order {
        let mut tries = 0;
        while (pl.holders[e].count_ones() as usize) < counts[e] {
            let node = cursor % n;
            cursor += 1;
            tries += 1;
            if tries > n * (counts[e] + 1) {
                return None;
            }
            if pl.holders[e] & (1 << node) == 0 && pl.used(node) < p.slots {
                pl.holders[e] |= 1 << node;
            }
        }
    }
    Some(pl)
}

/// Hill climbing: moves of one replica to a free slot, and swaps of two
/// parts between two nodes, while either raises the scenarios survived.
fn improve(p: &PlaceProblem, scen: &Scenarios, mut pl: Placement, deadline: Instant) -> Placement {
    let n = p.nodes.len();
    let parts = pl.holders.len();
    let mut score = scen.survived(&pl.holders);
    loop {
        let mut better = false;
        'moves: for e in 0..parts {
            for x in 0..n {
                if pl.holders[e] & (1 << x) == 0 {
                    continue;
                }
                for y in 0..n {
                    if Instant::now() > deadline {
                        return pl;
                    }
                    if pl.holders[e] & (1 << y) != 0 {
                        continue;
                    }
                    // Move e from x to y.
                    if pl.used(y) < p.slots {
                        let mut c = pl.clone();
                        c.holders[e] = (c.holders[e] & !(1 << x)) | 1 << y;
                        let s = scen.survived(&c.holders);
                        if s > score {
                            (pl, score, better) = (c, s, true);
                            break 'moves;
                        }
                    }
                    // Swap e (x -> y) with f (y -> x).
                    for f in 0..parts {
                        if Instant::now() > deadline {
                            return pl;
                        }
                        if f == e || pl.holders[f] & (1 << y) == 0 || pl.holders[f] & (1 << x) != 0
                        {
                            continue;
                        }
                        let mut c = pl.clone();
                        c.holders[e] = (c.holders[e] & !(1 << x)) | 1 << y;
                        c.holders[f] = (c.holders[f] & !(1 << y)) | 1 << x;
                        let s = scen.survived(&c.holders);
                        if s > score {
                            (pl, score, better) = (c, s, true);
                            break 'moves;
                        }
                    }
                }
            }
        }
        if !better {
            return pl;
        }
    }
}

/// The placement of `p`: replica counts from the loads, then the exact
/// search within `budget`, else the best of the constructions improved by
/// local search; MRO and nested are reported beside it.
pub fn optimize(p: &PlaceProblem, budget: Duration) -> Result<PlaceResult> {
    let t0 = Instant::now();
    let counts = replica_counts(p)?;
    if p.parts.len() > 64 {
        return Err(PlanError::Invalid(format!(
            "{} parts: place handles at most 64",
            p.parts.len()
        )));
    }
    let scen = Scenarios::of(p);
    let deadline = t0 + budget;
    let (found, finished, states, too_large) = exact_best(p, &counts, &scen, deadline);
    let mut baselines = Vec::new();
    let mro_pl = mro(p, &counts);
    baselines.push((
        "maximum rank overlap (MRO)".to_string(),
        mro_pl.clone().map(|pl| {
            let s = scen.survival(&pl);
            (pl, s)
        }),
    ));
    baselines.push((
        "nested".to_string(),
        nested(p, &counts)
            .map(|pl| {
                let s = scen.survival(&pl);
                (pl, s)
            })
            .ok_or_else(|| "the replicas do not nest into the slots".to_string()),
    ));
    let (placement, optimal) = match (found, finished) {
        (Some((pl, _)), true) => (pl, true),
        (found, _) => {
            // Out of time: the best construction, improved.
            let mut cands: Vec<Placement> = found.into_iter().map(|(pl, _)| pl).collect();
            cands.extend(mro_pl.ok());
            cands.extend(nested(p, &counts));
            cands.extend(spread(p, &counts));
            let start = cands
                .into_iter()
                .max_by_key(|pl| scen.survived(&pl.holders))
                .ok_or_else(|| {
                    PlanError::Invalid("no construction places these replicas".into())
                })?;
            let polish = Instant::now() + budget.max(Duration::from_millis(100));
            (improve(p, &scen, start, polish), false)
        }
    };
    let survival = scen.survival(&placement);
    Ok(PlaceResult {
        counts,
        placement,
        survival,
        optimal,
        states,
        elapsed: t0.elapsed(),
        too_large,
        baselines,
    })
}

/// From `current` (on `p`'s nodes; replicas of nodes gone already
/// dropped) to a placement of `counts` whose survival is at least
/// `target`, moving the fewest replicas: exact within `budget`, else
/// greedy from the current placement.
pub fn reconfigure(
    p: &PlaceProblem,
    counts: &[usize],
    current: &Placement,
    target: f64,
    budget: Duration,
) -> Result<Reconfig> {
    let scen = Scenarios::of(p);
    let need = (target * scen.alive.len() as f64 - 1e-9).ceil() as usize;
    let deadline = Instant::now() + budget;
    struct Best {
        pl: Option<(Placement, usize)>,
    }
    fn go(d: &mut Dfs<'_>, i: usize, moved: usize, cur: &Placement, need: usize, best: &mut Best) {
        if d.tick() {
            return;
        }
        if best.pl.as_ref().is_some_and(|(_, m)| moved >= *m) {
            return;
        }
        if i == d.p.nodes.len() {
            if d.rem.iter().all(|r| *r == 0) && d.scen.survived(&d.holders) >= need {
                best.pl = Some((
                    Placement {
                        holders: d.holders.clone(),
                    },
                    moved,
                ));
            }
            return;
        }
        let had: u64 = cur
            .holders
            .iter()
            .enumerate()
            .filter(|(_, h)| *h & (1 << i) != 0)
            .fold(0, |m, (e, _)| m | 1 << e);
        let Some(mut choices) = d.choices(i, None) else {
            (d.out_of_time, d.too_large) = (true, true);
            return;
        };
        // Fewest new replicas first, so good bounds come early.
        choices.sort_by_key(|s| ((s & !had).count_ones(), std::cmp::Reverse(s.count_ones())));
        for s in choices {
            let added = (s & !had).count_ones() as usize;
            d.apply(i, s, true);
            go(d, i + 1, moved + added, cur, need, best);
            d.apply(i, s, false);
            if d.out_of_time {
                return;
            }
        }
    }
    let mut d = Dfs::new(p, &scen, counts, deadline);
    let mut best = Best { pl: None };
    go(&mut d, 0, 0, current, need, &mut best);
    let greedy = best.pl.is_none();
    let placement = match best.pl {
        Some((pl, _)) => pl,
        None => greedy_from(p, counts, current, &scen).ok_or_else(|| {
            PlanError::Invalid("the new replica counts do not fit the nodes' slots".into())
        })?,
    };
    let mut moves = Vec::new();
    let mut drops = Vec::new();
    for (e, (new, old)) in placement.holders.iter().zip(&current.holders).enumerate() {
        for n in 0..p.nodes.len() {
            let (a, b) = (new & (1 << n) != 0, old & (1 << n) != 0);
            if a && !b {
                moves.push((e, n));
            }
            if b && !a {
                drops.push((e, n));
            }
        }
    }
    Ok(Reconfig {
        counts: counts.to_vec(),
        survival: scen.survival(&placement),
        before: scen.survival(current),
        placement,
        target,
        moves,
        drops,
        exhausted: !d.out_of_time,
        greedy,
        states: d.states,
    })
}

/// Keeps what `current` has where the counts allow (dropping the replicas
/// whose loss costs least), then adds the missing ones where they gain most.
fn greedy_from(
    p: &PlaceProblem,
    counts: &[usize],
    current: &Placement,
    scen: &Scenarios,
) -> Option<Placement> {
    let mut pl = current.clone();
    for (e, &want) in counts.iter().enumerate() {
        while pl.holders[e].count_ones() as usize > want {
            let n = (0..p.nodes.len())
                .filter(|n| pl.holders[e] & (1 << n) != 0)
                .max_by_key(|&n| {
                    let mut c = pl.clone();
                    c.holders[e] &= !(1 << n);
                    scen.survived(&c.holders)
                })?;
            pl.holders[e] &= !(1 << n);
        }
    }
    for e in by_count(counts) {
        while (pl.holders[e].count_ones() as usize) < counts[e] {
            let n = (0..p.nodes.len())
                .filter(|&n| pl.holders[e] & (1 << n) == 0 && pl.used(n) < p.slots)
                .max_by_key(|&n| {
                    let mut c = pl.clone();
                    c.holders[e] |= 1 << n;
                    scen.survived(&c.holders)
                })?;
            pl.holders[e] |= 1 << n;
        }
    }
    Some(pl)
}
