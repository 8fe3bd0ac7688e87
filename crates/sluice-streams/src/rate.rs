//! Target prediction frequency (EdgeServe §5.2): predictions are made on a
//! timer, every `period`, from the last known observation of each source
//! at that time; items that arrive between two ticks and are overtaken
//! before the next are skipped (never consumed, so their payloads never
//! move). A source whose last good item is older than `max_age` at a tick
//! is missing there, and `FailSoft` decides (§5.3).

use crate::{fail_soft, FailSoft, Item, Slot, Tuple};
use std::collections::BTreeMap;

pub struct Ticker<T> {
    sources: Vec<String>,
    period: u64,
    /// The next tick's time; `None` once the clock's last tick was made
    /// (a tick at `u64::MAX - period` or later has no next).
    next: Option<u64>,
    max_age: u64,
    policy: FailSoft,
    /// Items not yet at or before a tick, by source, in timestamp order.
    pending: BTreeMap<String, Vec<Item<T>>>,
    /// The last good item of each source at the last tick.
    latest: BTreeMap<String, Item<T>>,
    /// Good items a tick used, and items overtaken unused.
    pub used: u64,
    pub skipped: u64,
}

impl<T: Clone> Ticker<T> {
    /// Ticks at `first`, `first + period`, ...; `max_age`: how old a
    /// source's last item may be at a tick and still count as fresh
    /// (`u64::MAX`: any age).
    pub fn new(sources: &[&str], first: u64, period: u64, max_age: u64, policy: FailSoft) -> Self {
        Ticker {
            sources: sources.iter().map(|s| s.to_string()).collect(),
            period: period.max(1),
            next: Some(first),
            max_age,
            policy,
            pending: sources
                .iter()
                .map(|s| (s.to_string(), Vec::new()))
                .collect(),
            latest: BTreeMap::new(),
            used: 0,
            skipped: 0,
        }
    }

    /// Items observed and not yet used or skipped by a tick.
    pub fn pending(&self) -> usize {
        self.pending.values().map(Vec::len).sum()
    }

    /// Whether `source` is one of this ticker's.
    pub fn has_source(&self, source: &str) -> bool {
        self.pending.contains_key(source)
    }

    /// An item arrived (any order of sources; each source's in time
    /// order). An item of a source that is not one of the ticker's is
    /// dropped (`false`): no tick would take it, so it would be kept for
    /// ever (a topic's other sources grew a node's memory without bound).
    pub fn observe(&mut self, item: Item<T>) -> bool {
        let Some(q) = self.pending.get_mut(&item.source) else {
            return false;
        };
        let at = q.partition_point(|i| i.ts <= item.ts);
        q.insert(at, item);
        true
    }

    /// How many ticks `tick_until(now)` would make.
    pub fn due(&self, now: u64) -> u64 {
        match self.next {
            Some(next) if next <= now => ((now - next) / self.period).saturating_add(1),
            _ => 0,
        }
    }

    /// Every tick due by `now`, each a tuple of the sources' last known
    /// items at that tick (ticks that `FailSoft::Drop` drops yield none).
    pub fn tick_until(&mut self, now: u64) -> Vec<Tuple<T>> {
        let mut out = Vec::new();
        // An item's time is its producer's: one near the end of the clock
        // made `next + period` overflow (a panic in a debug build; in a
        // release build it wrapped, and the loop ran for ever).
        while let Some(t) = self.next.filter(|t| *t <= now) {
            self.next = t.checked_add(self.period);
            let mut slots = Vec::with_capacity(self.sources.len());
            let mut dropped = false;
            for s in &self.sources {
                let q = self.pending.entry(s.clone()).or_default();
                let due = q.partition_point(|i| i.ts <= t);
                let mut fresh = None;
                for i in q.drain(..due) {
                    // A broken item has nothing to use; a good one that a
                    // later one overtakes before the tick is skipped.
                    if i.value.is_some() && fresh.replace(i).is_some() {
                        self.skipped += 1;
                    }
                }
                if let Some(i) = fresh {
                    self.used += 1;
                    self.latest.insert(s.clone(), i);
                }
                // The last known observation, when recent enough.
                match self
                    .latest
                    .get(s)
                    .filter(|i| t - i.ts.min(t) <= self.max_age)
                {
                    Some(i) => slots.push(Slot::Fresh(i.clone())),
                    None => match fail_soft(self.policy, self.latest.get(s)) {
                        Some(slot) => slots.push(slot),
                        None => dropped = true,
                    },
                }
            }
            if !dropped {
                out.push(Tuple { ts: t, slots });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(ts: &[Tuple<&'static str>]) -> Vec<(u64, Option<&'static str>)> {
        ts.iter()
            .map(|t| (t.ts, t.slots[0].item().and_then(|i| i.value)))
            .collect()
    }

    /// §5.2: data (1,x1),(3,x3),(4,x4),(6,x6) at a target of 2 yields
    /// (2,f(x1)),(4,f(x4)),(6,f(x6)); x3 is never consumed.
    #[test]
    fn the_papers_target_frequency_example() {
        let mut t = Ticker::new(&["s"], 2, 2, u64::MAX, FailSoft::LastKnownGood);
        for (ts, v) in [(1, "x1"), (3, "x3"), (4, "x4"), (6, "x6")] {
            t.observe(Item::new("s", ts, v));
        }
        let out = t.tick_until(6);
        assert_eq!(
            values(&out),
            vec![(2, Some("x1")), (4, Some("x4")), (6, Some("x6"))]
        );
        assert_eq!(t.skipped, 1, "x3 was overtaken by x4 before a tick");
        assert_eq!(t.used, 3);
    }

    /// Items of a source the ticker does not have are dropped, not kept
    /// pending for ever.
    #[test]
    fn items_of_other_sources_are_not_kept() {
        let mut t = Ticker::new(&["s"], 2, 2, u64::MAX, FailSoft::LastKnownGood);
        for ts in 0..1000 {
            assert!(!t.observe(Item::new("other", ts, "o")));
        }
        assert!(t.observe(Item::new("s", 1, "x1")));
        assert_eq!(t.pending(), 1);
        assert_eq!(t.due(1), 0);
        assert_eq!(t.due(6), 3);
        assert_eq!(values(&t.tick_until(2)), vec![(2, Some("x1"))]);
        assert_eq!(t.pending(), 0);
    }

    /// Ticks at the end of the clock: the last one is made, then none
    /// (it overflowed; a wrapped `next` ticked for ever).
    #[test]
    fn the_clocks_last_tick_ends_the_ticks() {
        let first = u64::MAX - 5;
        let mut t = Ticker::new(&["s"], first, 2, u64::MAX, FailSoft::LastKnownGood);
        assert!(t.observe(Item::new("s", first, "x")));
        assert_eq!(t.due(u64::MAX), 3);
        let out = t.tick_until(u64::MAX);
        assert_eq!(
            out.iter().map(|t| t.ts).collect::<Vec<_>>(),
            vec![first, first + 2, first + 4]
        );
        assert_eq!(t.due(u64::MAX), 0);
        assert!(t.tick_until(u64::MAX).is_empty());
        let t = Ticker::<&str>::new(&["s"], 0, 1, u64::MAX, FailSoft::Drop);
        assert_eq!(t.due(u64::MAX), u64::MAX);
    }

    /// §5.3: (1,x1),(3,■),(4,x4),(6,x6): at a target of 2 the same three
    /// predictions; at a target of 1, x1 stands in at 1, 2 and 3.
    #[test]
    fn the_papers_fail_soft_examples() {
        let feed = |t: &mut Ticker<&'static str>| {
            t.observe(Item::new("s", 1, "x1"));
            t.observe(Item::failed("s", 3));
            t.observe(Item::new("s", 4, "x4"));
            t.observe(Item::new("s", 6, "x6"));
        };
        let mut two = Ticker::new(&["s"], 2, 2, u64::MAX, FailSoft::LastKnownGood);
        feed(&mut two);
        assert_eq!(
            values(&two.tick_until(6)),
            vec![(2, Some("x1")), (4, Some("x4")), (6, Some("x6"))]
        );
        let mut one = Ticker::new(&["s"], 1, 1, u64::MAX, FailSoft::LastKnownGood);
        feed(&mut one);
        assert_eq!(
            values(&one.tick_until(6)),
            vec![
                (1, Some("x1")),
                (2, Some("x1")),
                (3, Some("x1")),
                (4, Some("x4")),
                (5, Some("x4")),
                (6, Some("x6"))
            ]
        );
    }

    /// A source late beyond `max_age`: imputed, dropped or partial by policy.
    #[test]
    fn a_late_source_is_imputed_dropped_or_partial() {
        let run = |policy| {
            let mut t = Ticker::new(&["a", "b"], 10, 10, 5, policy);
            t.observe(Item::new("a", 9, 1));
            t.observe(Item::new("b", 8, 2));
            t.observe(Item::new("a", 19, 3)); // b has nothing new by 20
            t.tick_until(20)
        };
        let lkg = run(FailSoft::LastKnownGood);
        assert_eq!(lkg.len(), 2);
        assert!(lkg[0].is_complete());
        assert!(matches!(&lkg[1].slots[1], Slot::Imputed(i) if i.ts == 8));
        let drop = run(FailSoft::Drop);
        assert_eq!(drop.iter().map(|t| t.ts).collect::<Vec<_>>(), vec![10]);
        let partial = run(FailSoft::Partial);
        assert_eq!(partial[1].slots[1], Slot::Missing);
        assert!(matches!(&partial[1].slots[0], Slot::Fresh(i) if i.ts == 19));
    }
}
