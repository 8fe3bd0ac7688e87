//! The probability that every part keeps a live replica.
//!
//! The failure scenarios are the sets of live nodes: every R-subset of the
//! N nodes (`Failures::Survivors`), or the nodes outside every k-subset of
//! failure domains (`Failures::Domains`), all equally likely. When there
//! are at most `EXACT_LIMIT` of them the probability is exact (each
//! scenario checked); otherwise a fixed sample of `SAMPLES` scenarios (a
//! seeded `Rng`, so two placements are compared on the same scenarios)
//! gives an estimate with a 95% Wilson interval.

use super::{Failures, PlaceProblem, Placement};
use crate::rng::Rng;

/// Scenarios enumerated exactly up to this many.
pub const EXACT_LIMIT: u64 = 2_000_000;
/// Scenarios sampled beyond it.
pub const SAMPLES: usize = 50_000;

/// The live-node sets a placement is judged on.
#[derive(Clone, Debug)]
pub struct Scenarios {
    pub alive: Vec<u64>,
    pub exact: bool,
    /// Survivors of the uniform model (for the exact per-part bound).
    survivors: Option<(usize, usize)>,
}

/// A survival probability: exact, or estimated with a 95% interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Survival {
    pub p: f64,
    pub exact: bool,
    /// (low, high) of the 95% interval when estimated.
    pub interval: Option<(f64, f64)>,
    pub scenarios: usize,
    /// When estimated: an exact upper bound, the survival of the part
    /// least likely to survive alone (every part must).
    pub bound: Option<f64>,
}

impl std::fmt::Display for Survival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.interval {
            None => write!(f, "{:.6} (exact, {} scenarios)", self.p, self.scenarios),
            Some((lo, hi)) => write!(
                f,
                "{:.6} (95% interval {lo:.6}-{hi:.6}, {} sampled scenarios; exact upper bound {:.6})",
                self.p,
                self.scenarios,
                self.bound.unwrap_or(1.0)
            ),
        }
    }
}

/// C(n, k) as a float (for deciding between exact and sampled).
pub fn choose(n: u64, k: u64) -> f64 {
    let k = k.min(n - k.min(n));
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// Every k-subset of `0..n` as a bitmask, in increasing order (Gosper's hack).
fn subsets(n: usize, k: usize) -> Vec<u64> {
    if k == 0 {
        return vec![0];
    }
    let mut out = Vec::new();
    let mut s: u64 = (1u64 << k) - 1;
    let limit: u128 = 1u128 << n;
    while (s as u128) < limit {
        out.push(s);
        let c = s & s.wrapping_neg();
        let r = s + c;
        if r == 0 {
            break; // all 64 bits used
        }
        s = (((r ^ s) >> 2) / c) | r;
    }
    out
}

/// A uniformly random k-subset of `0..n` (partial Fisher-Yates).
fn random_subset(rng: &mut Rng, n: usize, k: usize) -> u64 {
    let mut idx: Vec<usize> = (0..n).collect();
    let mut m = 0u64;
    for i in 0..k {
        let j = i + rng.below(n - i);
        idx.swap(i, j);
        m |= 1 << idx[i];
    }
    m
}

impl Scenarios {
    pub fn of(p: &PlaceProblem) -> Scenarios {
        let n = p.nodes.len();
        let all = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        match p.failures {
            Failures::Survivors(r) => {
                if choose(n as u64, r as u64) <= EXACT_LIMIT as f64 {
                    Scenarios {
                        alive: subsets(n, r),
                        exact: true,
                        survivors: Some((n, r)),
                    }
                } else {
                    let mut rng = Rng::new(0x005E_ED0F_FA11);
                    Scenarios {
                        alive: (0..SAMPLES)
                            .map(|_| random_subset(&mut rng, n, r))
                            .collect(),
                        exact: false,
                        survivors: Some((n, r)),
                    }
                }
            }
            Failures::Domains(k) => {
                let domains = p.domains();
                let of_domain: Vec<u64> = domains
                    .iter()
                    .map(|d| {
                        p.nodes
                            .iter()
                            .enumerate()
                            .filter(|(_, x)| x.domain.as_deref() == Some(d.as_str()))
                            .fold(0u64, |m, (i, _)| m | 1 << i)
                    })
                    .collect();
                let dead_sets = |failed: u64| {
                    (0..domains.len())
                        .filter(|d| failed & (1 << d) != 0)
                        .fold(0u64, |m, d| m | of_domain[d])
                };
                if choose(domains.len() as u64, k as u64) <= EXACT_LIMIT as f64 {
                    Scenarios {
                        alive: subsets(domains.len(), k)
                            .into_iter()
                            .map(|f| all & !dead_sets(f))
                            .collect(),
                        exact: true,
                        survivors: None,
                    }
                } else {
                    let mut rng = Rng::new(0x005E_EDD0_3A15);
                    Scenarios {
                        alive: (0..SAMPLES)
                            .map(|_| all & !dead_sets(random_subset(&mut rng, domains.len(), k)))
                            .collect(),
                        exact: false,
                        survivors: None,
                    }
                }
            }
        }
    }

    /// Scenarios in which every part of `holders` keeps a live replica.
    pub fn survived(&self, holders: &[u64]) -> usize {
        self.alive
            .iter()
            .filter(|a| holders.iter().all(|h| h & **a != 0))
            .count()
    }

    pub fn survival(&self, pl: &Placement) -> Survival {
        let n = self.alive.len();
        let k = self.survived(&pl.holders);
        let p = k as f64 / n as f64;
        let interval = (!self.exact).then(|| wilson(k as f64, n as f64));
        // A part with r replicas dies only when all r are among the N - R
        // failed nodes: C(N - r, R) of the C(N, R) survivor sets.
        let bound = match (self.exact, self.survivors) {
            (false, Some((nn, rr))) => Some(
                pl.holders
                    .iter()
                    .map(|h| {
                        let r = h.count_ones() as u64;
                        let (nn, rr) = (nn as u64, rr as u64);
                        if nn - r < rr {
                            1.0
                        } else {
                            1.0 - choose(nn - r, rr) / choose(nn, rr)
                        }
                    })
                    .fold(1.0f64, f64::min),
            ),
            _ => None,
        };
        Survival {
            p,
            exact: self.exact,
            interval,
            scenarios: n,
            bound,
        }
    }
}

/// The 95% Wilson score interval of k successes in n trials.
fn wilson(k: f64, n: f64) -> (f64, f64) {
    let z = 1.959_963_984_540_054_f64;
    let p = k / n;
    let d = 1.0 + z * z / n;
    let c = (p + z * z / (2.0 * n)) / d;
    let h = z * ((p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt()) / d;
    ((c - h).max(0.0), (c + h).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_are_every_k_subset_once() {
        let s = subsets(5, 2);
        assert_eq!(s.len(), 10);
        assert!(s.iter().all(|m| m.count_ones() == 2 && *m < 32));
        let mut d = s.clone();
        d.dedup();
        assert_eq!(d.len(), 10);
        assert_eq!(subsets(4, 0), vec![0]);
        assert_eq!(choose(6, 2), 15.0);
    }

    #[test]
    fn the_wilson_interval_holds_the_estimate() {
        let (lo, hi) = wilson(900.0, 1000.0);
        assert!(lo < 0.9 && 0.9 < hi && hi - lo < 0.05, "{lo} {hi}");
    }
}
