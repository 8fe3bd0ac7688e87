//! `sluice place`: replicas of a model's parts (experts, shards) placed on
//! nodes to survive failures, after Lazarus (dissertation ch. 6 in
//! `shared/seeds/004_…`).
//!
//! A [`PlaceProblem`] has N nodes with `slots` replica slots each
//! (optionally labelled with a failure domain), parts with loads, a replica
//! floor and a failure model: R of the N nodes survive, uniformly at random,
//! or k whole failure domains fail. [`replica_counts`] gives each part
//! replicas in proportion to its load, at least the floor (the paper's
//! eq. 6.1); [`search::optimize`] places them to maximise the probability
//! that every part keeps a live replica ([`eval`]: exact over every failure
//! scenario when they are few enough, else a fixed Monte Carlo sample with
//! a 95% interval); [`search::reconfigure`] moves the fewest replicas from
//! a current placement to a plan of a given probability.
//!
//! Invariants: pure computation, deterministic (our own `Rng`); a node
//! holds at most one replica of a part (a second one on the same node
//! survives nothing the first does not); nodes are at most 64.

pub mod eval;
pub mod input;
pub mod search;

use crate::error::{PlanError, Result};

/// How nodes fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failures {
    /// `survivors` of the N nodes stay alive, every such set equally likely.
    Survivors(usize),
    /// `domains` of the failure domains fail whole, every such set equally
    /// likely.
    Domains(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub domain: Option<String>,
    /// Its id in a Sluice layout: kept from plan to plan (a node that
    /// fails does not renumber the others, which run under their ids).
    pub id: u32,
    /// Its address in a Sluice layout, once a plan has given it one.
    pub address: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    pub name: String,
    pub load: f64,
    /// Replicas fixed by the input (else from the load).
    pub replicas: Option<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PlaceProblem {
    pub name: String,
    pub nodes: Vec<Node>,
    pub slots: usize,
    pub floor: usize,
    pub parts: Vec<Part>,
    pub failures: Failures,
}

/// A placement: for each part, the nodes holding a replica (bit `i` is
/// node `i`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Placement {
    pub holders: Vec<u64>,
}

impl Placement {
    pub fn empty(parts: usize) -> Placement {
        Placement {
            holders: vec![0; parts],
        }
    }

    /// Replicas on node `n`.
    pub fn used(&self, n: usize) -> usize {
        self.holders.iter().filter(|m| *m & (1 << n) != 0).count()
    }

    /// Replicas of part `e` on nodes that did not hold it in `from`.
    pub fn moves_from(&self, from: &Placement) -> usize {
        self.holders
            .iter()
            .zip(&from.holders)
            .map(|(new, old)| (new & !old).count_ones() as usize)
            .sum()
    }

    /// The load each node carries: each part's load split over its replicas.
    pub fn node_loads(&self, p: &PlaceProblem) -> Vec<f64> {
        let mut out = vec![0.0; p.nodes.len()];
        for (e, m) in self.holders.iter().enumerate() {
            let r = m.count_ones() as f64;
            if r == 0.0 {
                continue;
            }
            for (n, l) in out.iter_mut().enumerate() {
                if m & (1 << n) != 0 {
                    *l += p.parts[e].load / r;
                }
            }
        }
        out
    }

    /// Whether it respects `counts` and the slots of `p`.
    pub fn valid(&self, p: &PlaceProblem, counts: &[usize]) -> bool {
        self.holders.len() == counts.len()
            && self
                .holders
                .iter()
                .zip(counts)
                .all(|(m, r)| m.count_ones() as usize == *r && *m >> p.nodes.len() == 0)
            && (0..p.nodes.len()).all(|n| self.used(n) <= p.slots)
    }
}

impl PlaceProblem {
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(PlanError::Invalid(s));
        if self.nodes.is_empty() || self.nodes.len() > 64 {
            return bad(format!("{} nodes: place handles 1 to 64", self.nodes.len()));
        }
        if self.slots == 0 {
            return bad("slots must be at least 1".into());
        }
        if self.parts.is_empty() {
            return bad("no parts to place".into());
        }
        if self.floor == 0 {
            return bad("the replica floor must be at least 1".into());
        }
        for p in &self.parts {
            if !(p.load.is_finite() && p.load > 0.0) {
                return bad(format!("part {}: load {} must be positive", p.name, p.load));
            }
            if let Some(r) = p.replicas {
                if r == 0 || r > self.nodes.len() {
                    return bad(format!(
                        "part {}: {r} replicas; a part has 1 to {} (one per node)",
                        p.name,
                        self.nodes.len()
                    ));
                }
            }
        }
        let need = self.parts.len() * self.floor.min(self.nodes.len());
        if need > self.nodes.len() * self.slots {
            return bad(format!(
                "{} parts × floor {} need {need} replicas, but {} nodes × {} slots hold {}: \
                 lower `floor`, or give more nodes or `slots`",
                self.parts.len(),
                self.floor,
                self.nodes.len(),
                self.slots,
                self.nodes.len() * self.slots
            ));
        }
        if self.floor > self.nodes.len() {
            return bad(format!(
                "floor {} is above the {} nodes (a node holds one replica of a part)",
                self.floor,
                self.nodes.len()
            ));
        }
        match self.failures {
            Failures::Survivors(r) if r == 0 || r > self.nodes.len() => bad(format!(
                "survivors = {r}: between 1 and the {} nodes",
                self.nodes.len()
            )),
            Failures::Domains(k) => {
                let d = self.domains().len();
                if self.nodes.iter().any(|n| n.domain.is_none()) {
                    bad("failures by domain need a domain on every node".into())
                } else if k >= d {
                    bad(format!(
                        "{k} failing domains of {d}: at least one must survive"
                    ))
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    /// The failure domains, in order of first appearance.
    pub fn domains(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for n in &self.nodes {
            if let Some(d) = &n.domain {
                if !out.contains(d) {
                    out.push(d.clone());
                }
            }
        }
        out
    }
}

/// Replicas per part: the input's where given, else in proportion to the
/// loads of the parts not yet counted, over the slots left, at least the
/// floor and at most one per node, parts taken from the least loaded up
/// (Lazarus eq. 6.1); slots left by parts capped at one replica per node go
/// to the parts with the most load per replica. The sum fits the N × slots
/// slots, and fills them unless every part is on every node.
pub fn replica_counts(p: &PlaceProblem) -> Result<Vec<usize>> {
    p.validate()?;
    let n = p.nodes.len();
    let total = n * p.slots;
    let mut order: Vec<usize> = (0..p.parts.len()).collect();
    order.sort_by(|&a, &b| p.parts[a].load.total_cmp(&p.parts[b].load).then(a.cmp(&b)));
    let fixed: usize = p.parts.iter().filter_map(|x| x.replicas).sum();
    let free_parts = p.parts.iter().filter(|x| x.replicas.is_none()).count();
    if fixed + free_parts * p.floor > total {
        return Err(PlanError::Invalid(format!(
            "fixed replicas ({fixed}) and the floor for the other parts need more than the {total} slots"
        )));
    }
    let mut counts = vec![0; p.parts.len()];
    let mut left = total - fixed;
    for (i, &e) in order.iter().enumerate() {
        if let Some(r) = p.parts[e].replicas {
            counts[e] = r;
            continue;
        }
        let rest: f64 = order[i..]
            .iter()
            .filter(|&&x| p.parts[x].replicas.is_none())
            .map(|&x| p.parts[x].load)
            .sum();
        let later = order[i + 1..]
            .iter()
            .filter(|&&x| p.parts[x].replicas.is_none())
            .count();
        let share = (p.parts[e].load / rest * left as f64).floor() as usize;
        // Keep the floor for the parts still to count.
        let r = share
            .max(p.floor)
            .min(n)
            .min(left.saturating_sub(later * p.floor));
        counts[e] = r;
        left -= r;
    }
    // Slots a capped part could not take go to the parts with the most
    // load per replica that still have a node without one.
    while left > 0 {
        let Some(e) = (0..counts.len())
            .filter(|&e| p.parts[e].replicas.is_none() && counts[e] < n)
            .max_by(|&a, &b| {
                let per = |e: usize| p.parts[e].load / counts[e] as f64;
                per(a).total_cmp(&per(b)).then(b.cmp(&a))
            })
        else {
            break;
        };
        counts[e] += 1;
        left -= 1;
    }
    Ok(counts)
}
