//! Time alignment with bounded skew (EdgeServe §5.1): tuples with one item
//! per source of a topic whose timestamps lie within `max_skew` of the
//! window's start. A window starts at the oldest item waiting; it yields
//! as soon as every source has an item in it, or, once the clock passes
//! the window's end, with what it has (the missing sources per
//! `FailSoft`). Each source's items are taken in timestamp order.

use crate::{fail_soft, FailSoft, Item, Slot, Tuple};
use std::collections::{BTreeMap, VecDeque};

pub struct Aligner<T> {
    sources: Vec<String>,
    max_skew: u64,
    policy: FailSoft,
    buffers: BTreeMap<String, VecDeque<Item<T>>>,
    last_good: BTreeMap<String, Item<T>>,
}

impl<T: Clone> Aligner<T> {
    pub fn new(sources: &[&str], max_skew: u64, policy: FailSoft) -> Self {
        Aligner {
            sources: sources.iter().map(|s| s.to_string()).collect(),
            max_skew,
            policy,
            buffers: sources
                .iter()
                .map(|s| (s.to_string(), VecDeque::new()))
                .collect(),
            last_good: BTreeMap::new(),
        }
    }

    /// Whether `source` is one of this aligner's (`push` drops the items
    /// of any other).
    pub fn has_source(&self, source: &str) -> bool {
        self.buffers.contains_key(source)
    }

    /// Items waiting for their tuple (the backlog).
    pub fn waiting(&self) -> usize {
        self.buffers.values().map(VecDeque::len).sum()
    }

    /// An item arrived; the tuples it completes. An item of a source
    /// that is not one of the aligner's is dropped.
    pub fn push(&mut self, item: Item<T>) -> Vec<Tuple<T>> {
        if let Some(q) = self.buffers.get_mut(&item.source) {
            let at = q.partition_point(|i| i.ts <= item.ts);
            q.insert(at, item);
        }
        self.emit(None)
    }

    /// The clock reached `now`: windows that ended before it close, with
    /// what they have.
    pub fn advance(&mut self, now: u64) -> Vec<Tuple<T>> {
        self.emit(Some(now))
    }

    fn start(&self) -> Option<u64> {
        self.buffers
            .values()
            .filter_map(|q| q.front())
            .map(|i| i.ts)
            .min()
    }

    fn emit(&mut self, now: Option<u64>) -> Vec<Tuple<T>> {
        let mut out = Vec::new();
        while let Some(start) = self.start() {
            let end = start.saturating_add(self.max_skew);
            let complete = self
                .buffers
                .values()
                .all(|q| q.front().is_some_and(|i| i.ts <= end));
            let closed = now.is_some_and(|n| n > end);
            if !complete && !closed {
                break;
            }
            let mut slots = Vec::with_capacity(self.sources.len());
            let mut dropped = false;
            for s in &self.sources {
                let taken = self.buffers.get_mut(s).and_then(|q| {
                    if q.front()?.ts <= end {
                        q.pop_front()
                    } else {
                        None
                    }
                });
                match taken {
                    Some(i) if i.value.is_some() => {
                        self.last_good.insert(s.clone(), i.clone());
                        slots.push(Slot::Fresh(i));
                    }
                    // Broken or absent: fail soft.
                    _ => match fail_soft(self.policy, self.last_good.get(s)) {
                        Some(slot) => slots.push(slot),
                        None => dropped = true,
                    },
                }
            }
            if !dropped {
                out.push(Tuple { ts: start, slots });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts_of(t: &Tuple<u32>) -> Vec<Option<u64>> {
        t.slots.iter().map(|s| s.item().map(|i| i.ts)).collect()
    }

    #[test]
    fn items_within_the_skew_form_one_tuple() {
        let mut a = Aligner::new(&["cam", "mic"], 10, FailSoft::Partial);
        assert!(a.push(Item::new("cam", 100, 1)).is_empty());
        let t = a.push(Item::new("mic", 107, 2));
        assert_eq!(t.len(), 1);
        assert!(t[0].is_complete());
        assert_eq!((t[0].ts, ts_of(&t[0])), (100, vec![Some(100), Some(107)]));
        assert_eq!(a.waiting(), 0);
    }

    #[test]
    fn a_late_source_gives_a_partial_tuple_when_the_window_closes() {
        let mut a = Aligner::new(&["cam", "mic"], 10, FailSoft::Partial);
        a.push(Item::new("cam", 100, 1));
        // mic's item is outside cam's window: not a tuple yet.
        assert!(a.push(Item::new("mic", 115, 2)).is_empty());
        assert!(
            a.advance(110).is_empty(),
            "the window [100, 110] is still open at 110"
        );
        let t = a.advance(111);
        assert_eq!(t.len(), 1);
        assert_eq!(ts_of(&t[0]), vec![Some(100), None]);
        // mic's item starts the next window, which cam's next completes.
        let t = a.push(Item::new("cam", 118, 3));
        assert_eq!(ts_of(&t[0]), vec![Some(118), Some(115)]);
    }

    #[test]
    fn fail_soft_policies_for_a_missing_source() {
        let run = |policy| {
            let mut a = Aligner::new(&["a", "b"], 5, policy);
            let mut out = a.push(Item::new("a", 0, 1));
            out.extend(a.push(Item::new("b", 2, 2))); // a complete tuple
            out.extend(a.push(Item::new("a", 10, 3))); // b is late for this one
            out.extend(a.push(Item::failed("b", 21))); // and broken for the next
            out.extend(a.push(Item::new("a", 20, 4)));
            out.extend(a.advance(100));
            out
        };
        let lkg = run(FailSoft::LastKnownGood);
        assert_eq!(lkg.len(), 3);
        assert!(matches!(&lkg[1].slots[1], Slot::Imputed(i) if i.ts == 2));
        assert!(matches!(&lkg[2].slots[1], Slot::Imputed(i) if i.ts == 2));
        let drop = run(FailSoft::Drop);
        assert_eq!(drop.len(), 1);
        let partial = run(FailSoft::Partial);
        assert_eq!(partial.len(), 3);
        assert_eq!(partial[2].slots[1], Slot::Missing);
    }
}
