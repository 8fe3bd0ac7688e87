//! `sluice place`: placements checked against brute force, MRO where it is
//! and is not optimal, failure domains, sampling, and minimal-move
//! reconfiguration.

use proptest::prelude::*;
use sluice_plan::place::eval::Scenarios;
use sluice_plan::place::search::{kept_counts, mro, nested, optimize, reconfigure};
use sluice_plan::place::{replica_counts, Failures, Node, Part, PlaceProblem, Placement};
use std::time::Duration;

fn problem(nodes: usize, slots: usize, loads: &[f64], survivors: usize) -> PlaceProblem {
    PlaceProblem {
        name: "t".into(),
        nodes: (0..nodes)
            .map(|i| Node {
                name: format!("n{i}"),
                domain: None,
                id: i as u32,
                address: None,
            })
            .collect(),
        slots,
        floor: 1,
        parts: loads
            .iter()
            .enumerate()
            .map(|(i, l)| Part {
                name: format!("p{i}"),
                load: *l,
                replicas: None,
            })
            .collect(),
        failures: Failures::Survivors(survivors),
    }
}

/// Every placement of `counts` (each part on any `r` of the nodes), with
/// the slots respected: no symmetry reduction, nothing clever.
fn all_placements(p: &PlaceProblem, counts: &[usize]) -> Vec<Placement> {
    let n = p.nodes.len();
    let subsets = |r: usize| -> Vec<u64> {
        (0u64..1 << n)
            .filter(|m| m.count_ones() as usize == r)
            .collect()
    };
    let mut out = vec![Placement::empty(counts.len())];
    for (e, r) in counts.iter().enumerate() {
        let mut next = Vec::new();
        for pl in &out {
            for s in subsets(*r) {
                let mut c = pl.clone();
                c.holders[e] = s;
                if (0..n).all(|x| c.used(x) <= p.slots) {
                    next.push(c);
                }
            }
        }
        out = next;
    }
    out
}

fn brute_best(p: &PlaceProblem, counts: &[usize]) -> usize {
    let scen = Scenarios::of(p);
    all_placements(p, counts)
        .iter()
        .map(|pl| scen.survived(&pl.holders))
        .max()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]

    /// On every instance small enough to enumerate, the plan equals the
    /// exhaustive optimum, and MRO (where it applies) is never better.
    #[test]
    fn the_plan_is_the_exhaustive_optimum(
        nodes in 3usize..=5,
        slots in 1usize..=3,
        loads in proptest::collection::vec(1.0f64..100.0, 1..=4),
        surv in 1usize..=5,
    ) {
        let survivors = surv.min(nodes);
        prop_assume!(loads.len() <= nodes * slots);
        let p = problem(nodes, slots, &loads, survivors);
        let r = optimize(&p, Duration::from_secs(10)).unwrap();
        prop_assert!(r.optimal, "the exact search finished");
        prop_assert!(r.placement.valid(&p, &r.counts));
        let scen = Scenarios::of(&p);
        let got = scen.survived(&r.placement.holders);
        prop_assert_eq!(got, brute_best(&p, &r.counts));
        if let Ok(m) = mro(&p, &r.counts) {
            prop_assert!(m.valid(&p, &r.counts));
            prop_assert!(scen.survived(&m.holders) <= got);
        }
    }
}

/// Lazarus's replica counts: proportional to load, at least the floor,
/// filling the slots.
#[test]
fn replica_counts_follow_the_loads_with_a_floor() {
    let p = problem(4, 3, &[1.0, 1.0, 10.0, 30.0], 2);
    let c = replica_counts(&p).unwrap();
    assert_eq!(c.iter().sum::<usize>(), 12);
    assert!(c[0] >= 1 && c[1] >= 1);
    assert!(c[3] >= c[2] && c[2] >= c[0], "{c:?}");
    assert!(
        c.iter().all(|r| *r <= 4),
        "one replica of a part per node: {c:?}"
    );
}

/// The issue's example: 4 nodes with 2 slots, parts with 2/3/3 replicas,
/// 2 nodes surviving. Every valid placement keeps every part in 5 of the 6
/// survivor pairs (the 2-replica part dies only with both its nodes; a part
/// on 3 of 4 nodes cannot die with 2 alive), so no placement is worse than
/// another there; and no nested one (holders of each part inside the
/// next's) fits 2 slots, nor does MRO's construction.
#[test]
fn the_issues_example_has_every_placement_at_the_optimum() {
    let mut p = problem(4, 2, &[1.0, 1.0, 1.0], 2);
    for (part, r) in p.parts.iter_mut().zip([2, 3, 3]) {
        part.replicas = Some(r);
    }
    let r = optimize(&p, Duration::from_secs(10)).unwrap();
    assert_eq!(r.counts, vec![2, 3, 3]);
    let scen = Scenarios::of(&p);
    assert_eq!(scen.alive.len(), 6);
    assert_eq!(scen.survived(&r.placement.holders), 5);
    assert!(r.optimal);
    let all = all_placements(&p, &r.counts);
    assert!(all.iter().all(|pl| scen.survived(&pl.holders) == 5));
    assert!(nested(&p, &r.counts).is_none());
    assert!(mro(&p, &r.counts).is_err());
}

/// Where MRO is not optimal: Theorem 1 assumes nodes fail independently
/// and alike. When whole racks fail, MRO's overlap (the parts of a group
/// on the same nodes) puts every replica of a group in one rack: 4 nodes
/// in 2 racks, 2 parts of 2 replicas, one rack failing: MRO survives half
/// the scenarios, the plan all of them.
#[test]
fn mro_loses_when_whole_domains_fail() {
    let mut p = problem(4, 2, &[1.0, 1.0], 2);
    for (i, n) in p.nodes.iter_mut().enumerate() {
        n.domain = Some(if i < 2 { "rack-a" } else { "rack-b" }.into());
    }
    p.failures = Failures::Domains(1);
    for part in &mut p.parts {
        part.replicas = Some(2);
    }
    let r = optimize(&p, Duration::from_secs(10)).unwrap();
    assert_eq!(r.counts, vec![2, 2]);
    let scen = Scenarios::of(&p);
    let m = mro(&p, &r.counts).unwrap();
    assert_eq!(scen.survived(&m.holders), 1);
    assert_eq!(scen.survived(&r.placement.holders), 2);
}

/// Where MRO is optimal: under uniform node failures it equals the optimum
/// on every small instance where its construction applies (Theorem 1; a
/// wider sweep of fixed counts, 3-6 nodes, 1-3 slots, 2-4 parts, found no
/// exception either); with no more parts than slots always.
#[test]
fn mro_is_optimal_when_parts_fit_a_node_and_counted_beyond() {
    let (mut applies, mut optimal, mut small_optimal) = (0, 0, 0);
    for nodes in 3..=5usize {
        for slots in 1..=3usize {
            for parts in 1..=4usize {
                for survivors in 1..=nodes {
                    if parts > nodes * slots {
                        continue;
                    }
                    let loads: Vec<f64> = (0..parts).map(|i| (i * i + 1) as f64).collect();
                    let p = problem(nodes, slots, &loads, survivors);
                    let counts = replica_counts(&p).unwrap();
                    let Ok(m) = mro(&p, &counts) else { continue };
                    applies += 1;
                    let scen = Scenarios::of(&p);
                    let best = brute_best(&p, &counts);
                    if scen.survived(&m.holders) == best {
                        optimal += 1;
                    }
                    if parts <= slots {
                        small_optimal += 1;
                        assert_eq!(
                            scen.survived(&m.holders),
                            best,
                            "MRO below the optimum with parts <= slots: {nodes} nodes, {slots} slots, {counts:?}, {survivors} survive"
                        );
                    }
                }
            }
        }
    }
    eprintln!("MRO applies on {applies} instances, optimal on {optimal} ({small_optimal} with parts <= slots)");
    assert!(applies > 50);
    assert_eq!(
        optimal, applies,
        "MRO below the optimum under uniform failures"
    );
}

/// Whole failure domains: with two racks and one failing, a plan keeps a
/// replica of every part in each rack.
#[test]
fn failure_domains_are_survived_by_spreading_across_them() {
    let mut p = problem(4, 2, &[1.0, 1.0], 2);
    for (i, n) in p.nodes.iter_mut().enumerate() {
        n.domain = Some(if i < 2 { "rack-a" } else { "rack-b" }.into());
    }
    p.failures = Failures::Domains(1);
    let r = optimize(&p, Duration::from_secs(10)).unwrap();
    assert_eq!(r.survival.p, 1.0, "{:?}", r.placement);
    assert!(r.survival.exact);
    for h in &r.placement.holders {
        assert!(h & 0b0011 != 0 && h & 0b1100 != 0, "{h:b}");
    }
}

/// Too many scenarios to enumerate: a sampled estimate with its interval.
#[test]
fn large_instances_are_sampled_with_an_interval() {
    let loads: Vec<f64> = (0..16).map(|i| (i + 1) as f64).collect();
    let p = problem(40, 2, &loads, 20);
    let r = optimize(&p, Duration::from_millis(300)).unwrap();
    assert!(!r.survival.exact && !r.optimal);
    let (lo, hi) = r.survival.interval.unwrap();
    assert!(lo <= r.survival.p && r.survival.p <= hi);
    // The exact bound (the weakest part alone) is above the estimate's
    // interval's low end.
    let bound = r.survival.bound.unwrap();
    assert!(bound <= 1.0 && lo <= bound, "{lo} {bound}");
    assert!(r.placement.valid(&p, &r.counts));
    // The local search never ends below the best construction.
    let scen = Scenarios::of(&p);
    for (_, b) in &r.baselines {
        if let Ok((pl, _)) = b {
            assert!(scen.survived(&pl.holders) <= scen.survived(&r.placement.holders));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// After a node fails, the new plan reaches the new optimum's survival
    /// with the fewest replicas moved: no placement reaching it moves fewer.
    #[test]
    fn reconfiguration_moves_the_fewest_replicas(
        nodes in 4usize..=5,
        slots in 1usize..=2,
        loads in proptest::collection::vec(1.0f64..50.0, 1..=3),
        gone in 0usize..5,
    ) {
        prop_assume!(loads.len() <= (nodes - 1) * slots);
        let p = problem(nodes, slots, &loads, 2);
        let before = optimize(&p, Duration::from_secs(10)).unwrap();
        // Node `gone` fails: its replicas are lost, the rest keep their place.
        let gone = gone % nodes;
        let mut q = p.clone();
        q.nodes.remove(gone);
        q.failures = Failures::Survivors(2.min(q.nodes.len()));
        let shift = |m: u64| (m & ((1 << gone) - 1)) | ((m >> (gone + 1)) << gone);
        let current = Placement {
            holders: before.placement.holders.iter().map(|m| shift(*m)).collect(),
        };
        let target = optimize(&q, Duration::from_secs(10)).unwrap();
        let rc = reconfigure(&q, &target.counts, &current, target.survival.p, Duration::from_secs(10)).unwrap();
        prop_assert!(rc.minimal());
        prop_assert!(rc.placement.valid(&q, &target.counts));
        prop_assert!(rc.survival.p >= target.survival.p - 1e-12);
        let scen = Scenarios::of(&q);
        let need = scen.survived(&target.placement.holders);
        let fewest = all_placements(&q, &target.counts)
            .iter()
            .filter(|pl| scen.survived(&pl.holders) >= need)
            .map(|pl| pl.moves_from(&current))
            .min()
            .unwrap();
        prop_assert_eq!(rc.moves.len(), fewest);
    }
}

/// `--export` writes what `--from` reads back.
#[test]
fn a_plan_round_trips_through_its_file() {
    let p = problem(4, 2, &[3.0, 1.0, 2.0], 2);
    let r = optimize(&p, Duration::from_secs(5)).unwrap();
    let text = sluice_plan::place::input::to_toml(&p, &r.placement);
    let back = sluice_plan::place::input::parse(&text, "placement.toml").unwrap();
    assert_eq!(back.problem, p);
    assert_eq!(back.current.unwrap(), r.placement);
    // A node named in `failed` is gone, and so are its replicas.
    let text = format!("failed = [\"n0\"]\n{text}");
    let gone = sluice_plan::place::input::parse(&text, "x").unwrap();
    assert_eq!(gone.problem.nodes.len(), 3);
    let held_by_n0 = r.placement.holders.iter().filter(|m| *m & 1 != 0).count();
    assert_eq!(gone.lost.len(), held_by_n0);
    // The others keep their ids (a layout runs them under those), the
    // failed one is remembered with its own.
    let ids: Vec<u32> = gone.problem.nodes.iter().map(|n| n.id).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    assert_eq!(gone.gone.iter().map(|n| n.id).collect::<Vec<_>>(), vec![0]);
}

/// Node ids and addresses in a plan's file: kept through a round trip,
/// refused when two nodes share one or an address is not one.
#[test]
fn node_ids_and_addresses_are_kept_and_checked() {
    let mut p = problem(3, 2, &[1.0, 1.0], 2);
    p.nodes[0].id = 3;
    p.nodes[2].address = Some("10.0.0.3:7420".into());
    let pl = optimize(&p, Duration::from_secs(5)).unwrap().placement;
    let text = sluice_plan::place::input::to_toml(&p, &pl);
    assert_eq!(
        sluice_plan::place::input::parse(&text, "x")
            .unwrap()
            .problem,
        p
    );
    // A node added without an id, whose place in the list (3) n0 has,
    // gets one above every id given.
    let added = text.replacen("[failures]", "[[nodes]]\nname = \"n3\"\n\n[failures]", 1);
    let with_new = sluice_plan::place::input::parse(&added, "x").unwrap();
    let ids: Vec<u32> = with_new.problem.nodes.iter().map(|n| n.id).collect();
    assert_eq!(ids, vec![3, 1, 2, 4]);
    let err = |t: String| {
        sluice_plan::place::input::parse(&t, "x")
            .unwrap_err()
            .to_string()
    };
    let same_id = text.replacen("id = 3", "id = 1", 1);
    assert!(err(same_id).contains("\"n0\" and \"n1\" have the same id 1"));
    let bad = text.replace("10.0.0.3:7420", "node-3");
    assert!(err(bad).contains("address \"node-3\" is not an IP address and port"));
}

/// The counts that keep a current placement: its replicas on the nodes
/// left, raised to the floor; none when they overflow the slots.
#[test]
fn kept_counts_follow_the_current_placement() {
    let mut p = problem(4, 2, &[1.0, 1.0, 1.0], 2);
    let current = Placement {
        holders: vec![0b0011, 0b1100, 0],
    };
    assert_eq!(kept_counts(&p, &current), Some(vec![2, 2, 1]));
    p.floor = 3;
    assert_eq!(kept_counts(&p, &current), None, "9 replicas, 8 slots");
}
