//! Random planning instances (for property tests and optimizer timing).
//!
//! Shape: one or two sources on tier 0 feed a layer of source-fed ML
//! operators, an optional middle layer of single-input operators, and a sink
//! that joins the last layer. Workers get faster and dearer with each tier;
//! traffic from a source or between tiers costs 1 per GB upward (10
//! downward, which A2 forbids anyway). Accuracy profiles are monotone by
//! construction and the target is set between the worst and best
//! achievable end-to-end accuracy, so every instance has an accurate-enough
//! selection; capacity is generous so most have a feasible assignment.

use crate::problem::*;
use crate::rng::Rng;
use std::collections::HashMap;

pub struct GenSpec {
    pub workers: usize,
    pub tiers: usize,
    /// Source-fed operators.
    pub first_layer: usize,
    pub middle_layer: bool,
    pub variants: usize,
}

pub fn generate(seed: u64, g: &GenSpec) -> Problem {
    let mut rng = Rng::new(seed);
    let tiers: Vec<Tier> = (0..g.tiers.max(1))
        .map(|t| Tier {
            name: format!("tier{t}"),
            locations: 1,
        })
        .collect();
    let workers: Vec<Worker> = (0..g.workers.max(1))
        .map(|i| {
            let tier = if i < g.tiers {
                i
            } else {
                rng.below(tiers.len())
            };
            let speed = 1.0 + 2.5 * tier as f64;
            Worker {
                name: format!("w{i}"),
                tier,
                cost_per_hour: (0.1 + rng.range_f64(0.0, 0.4)) * speed * speed,
            }
        })
        .collect();
    let speed: Vec<f64> = workers
        .iter()
        .map(|w| (1.0 + 2.5 * w.tier as f64) * rng.range_f64(0.7, 1.3))
        .collect();
    let mut ops: Vec<Operator> = Vec::new();
    let mut edges: Vec<Edge> = Vec::new();
    let n_src = 1 + rng.below(2);
    for s in 0..n_src {
        ops.push(Operator {
            name: format!("src{s}"),
            kind: OpKind::Source,
            rate: Some(rng.range_f64(5.0, 30.0)),
            variants: vec![],
            acc_inputs: vec![],
        });
    }
    let nw = workers.len();
    let mk_variants = |rng: &mut Rng, base_acc: &dyn Fn(usize) -> Vec<AccRow>| -> Vec<Variant> {
        (0..g.variants.max(1))
            .map(|m| {
                let heavy = 1.0 + m as f64 * 0.8;
                let base = rng.range_f64(20.0, 80.0) * heavy;
                let latency_ms = (0..nw)
                    .map(|w| {
                        // The heaviest variants do not fit the weakest workers.
                        if m + 1 == g.variants
                            && g.variants > 1
                            && workers[w].tier == 0
                            && rng.below(2) == 0
                        {
                            None
                        } else {
                            Some(base / speed[w])
                        }
                    })
                    .collect();
                Variant {
                    name: format!("v{m}"),
                    cost_proxy: base / 10.0,
                    latency_ms,
                    acc: base_acc(m),
                }
            })
            .collect()
    };
    // First layer: source-fed, single row per variant.
    let mut layer: Vec<usize> = Vec::new();
    for i in 0..g.first_layer.max(1) {
        let idx = ops.len();
        let acc0 = rng.range_f64(50.0, 70.0);
        let vars = mk_variants(&mut rng, &|m| {
            vec![AccRow {
                inputs: vec![],
                output: acc0 + 8.0 * m as f64,
            }]
        });
        ops.push(Operator {
            name: format!("op{idx}"),
            kind: OpKind::Compute,
            rate: None,
            variants: vars,
            acc_inputs: vec![],
        });
        edges.push(Edge {
            from: i % n_src,
            to: idx,
            ratio: 1.0,
        });
        layer.push(idx);
    }
    // Possible output accuracies of each operator, for building profiles.
    let outputs = |ops: &Vec<Operator>, v: usize| -> Vec<f64> {
        let mut o: Vec<f64> = ops[v]
            .variants
            .iter()
            .flat_map(|x| x.acc.iter().map(|r| r.output))
            .collect();
        o.sort_by(f64::total_cmp);
        o.dedup();
        o
    };
    let combos = |ops: &Vec<Operator>, inputs: &[usize]| -> Vec<Vec<f64>> {
        let mut out = vec![vec![]];
        for &u in inputs {
            let vals = outputs(ops, u);
            out = out
                .into_iter()
                .flat_map(|c| vals.iter().map(move |x| [c.clone(), vec![*x]].concat()))
                .collect();
        }
        out
    };
    if g.middle_layer {
        let mut next = Vec::new();
        for &u in &layer {
            let idx = ops.len();
            let cs = combos(&ops, &[u]);
            let vars = mk_variants(&mut rng, &|m| {
                cs.iter()
                    .map(|c| AccRow {
                        inputs: c.clone(),
                        output: c[0] * (0.9 + 0.03 * m as f64),
                    })
                    .collect()
            });
            ops.push(Operator {
                name: format!("op{idx}"),
                kind: OpKind::Compute,
                rate: None,
                variants: vars,
                acc_inputs: vec![u],
            });
            edges.push(Edge {
                from: u,
                to: idx,
                ratio: 1.0,
            });
            next.push(idx);
        }
        layer = next;
    }
    let sink = ops.len();
    let cs = combos(&ops, &layer);
    let n = layer.len() as f64;
    let sink_vars = vec![Variant {
        name: "default".into(),
        cost_proxy: 1.0,
        latency_ms: (0..nw).map(|w| Some(10.0 / speed[w])).collect(),
        acc: cs
            .iter()
            .map(|c| AccRow {
                inputs: c.clone(),
                output: c.iter().sum::<f64>() / n,
            })
            .collect(),
    }];
    ops.push(Operator {
        name: "sink".into(),
        kind: OpKind::Compute,
        rate: None,
        variants: sink_vars,
        acc_inputs: layer.clone(),
    });
    for &u in &layer {
        edges.push(Edge {
            from: u,
            to: sink,
            ratio: 1.0,
        });
    }
    let mut message_kb = HashMap::new();
    for (e, edge) in edges.iter().enumerate() {
        let kb = if ops[edge.from].kind == OpKind::Source {
            rng.range_f64(50.0, 800.0)
        } else {
            rng.range_f64(0.1, 10.0)
        };
        message_kb.insert((e, "default".to_string(), "default".to_string()), kb);
    }
    let mut source_links = HashMap::new();
    let mut worker_links = HashMap::new();
    for (w, wk) in workers.iter().enumerate() {
        for s in 0..n_src {
            if wk.tier > 0 {
                source_links.insert((s, w), 1.0);
            }
        }
        for (x, xk) in workers.iter().enumerate() {
            if xk.tier < wk.tier {
                worker_links.insert((x, w), 1.0);
            } else if xk.tier > wk.tier {
                worker_links.insert((x, w), 10.0);
            }
        }
    }
    let mut p = Problem {
        name: format!("generated(seed={seed}, workers={})", workers.len()),
        operators: ops,
        edges,
        workers,
        tiers,
        sink,
        accuracy_target: 0.0,
        source_links,
        worker_links,
        message_kb,
        end_to_end: None,
        settings: Settings {
            comm_scale: 0.1,
            ..Settings::default()
        },
        rates_cache: Default::default(),
    };
    // Target: between the worst and best achievable accuracy.
    let mut accs: Vec<f64> = Vec::new();
    let ops_idx = p.compute_ops();
    let mut cur: Models = vec![None; p.operators.len()];
    fn rec(p: &Problem, ops: &[usize], i: usize, cur: &mut Models, out: &mut Vec<f64>) {
        if i == ops.len() {
            out.push(crate::accuracy::accuracy(p, cur));
            return;
        }
        for m in 0..p.operators[ops[i]].variants.len() {
            cur[ops[i]] = Some(m);
            rec(p, ops, i + 1, cur, out);
        }
    }
    rec(&p, &ops_idx, 0, &mut cur, &mut accs);
    accs.retain(|a| a.is_finite());
    accs.sort_by(f64::total_cmp);
    p.accuracy_target = accs.get(accs.len() / 3).copied().unwrap_or(0.0);
    p
}
