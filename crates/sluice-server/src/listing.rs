//! Listings a page at a time (`Request::ListKeys`, `Request::ListKeysAt`).
//!
//! A pool's keys are in hash maps, in no order, so a page "the smallest
//! keys after `after`" cost a pass over the whole shard: a listing of a
//! million keys took 13 such passes (4 s of the node's CPU). A connection
//! instead keeps each listing in progress: the shard's keys sorted once, at
//! the first page, and the next pages are slices of them. A listing that
//! asks after a key its connection does not hold (evicted, another
//! connection's, a client resuming) is taken afresh from that key on.
//!
//! What a listing returns: every key present for its whole length, in
//! exactly one page, in order; a key put or removed meanwhile may or may
//! not be in it (as with Redis's `SCAN`).
//!
//! Memory: a kept listing holds its keys (shared with the store's maps:
//! 16 bytes a key, plus the text of keys removed meanwhile), at most
//! `OPEN_MAX` listings a connection, and all connections' together within
//! the node's `Budget`. A listing that does not fit is not kept: each of
//! its next pages sorts the shard's keys again, slower but right.

use sluice_types::SluiceError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Listings kept per connection (a client lists every shard of a pool at
/// once); the least recent goes first.
const OPEN_MAX: usize = 8;

/// Bytes all connections' kept listings may hold together.
pub const BUDGET_BYTES: usize = 256 << 20;

/// The node's budget for kept listings, shared by its connections.
#[derive(Clone)]
pub struct Budget(Arc<AtomicUsize>);

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        Budget(Arc::new(AtomicUsize::new(bytes)))
    }

    /// Takes `n` bytes if that many are left.
    fn take(&self, n: usize) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.0.fetch_add(n, Ordering::AcqRel);
    }

    #[cfg(test)]
    fn left(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// What a listing lists: the request less its `after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct What {
    pub pool: String,
    pub prefix: Option<String>,
    pub shard: Option<u32>,
    /// `ListKeysAt`: by time, and the version or time.
    pub at: Option<(bool, u64)>,
}

struct Open {
    what: What,
    /// Sorted.
    keys: Vec<Arc<str>>,
    /// Where the next page starts.
    next: usize,
    /// What it holds of the budget (0 while not kept).
    held: usize,
}

/// A connection's listings in progress.
pub struct Listings {
    /// Least recently used first.
    open: Vec<Open>,
    budget: Budget,
}

impl Drop for Listings {
    fn drop(&mut self) {
        for o in self.open.drain(..) {
            self.budget.give(o.held);
        }
    }
}

impl Listings {
    pub fn new(budget: Budget) -> Listings {
        Listings {
            open: Vec::new(),
            budget,
        }
    }

    /// The page of `what` after `after`: at most `max_bytes` (a key counts
    /// its length and 4 bytes, as on the wire; one key at least), and
    /// whether more follow. `fetch` gives all of `what`'s keys, sorted; it
    /// is called for a listing's first page, and for one this connection
    /// does not hold.
    pub fn page(
        &mut self,
        what: What,
        after: Option<&str>,
        max_bytes: usize,
        fetch: impl FnOnce() -> Result<Vec<Arc<str>>, SluiceError>,
    ) -> Result<(Vec<String>, bool), SluiceError> {
        let kept = after.and_then(|a| {
            self.open.iter().position(|o| {
                o.what == what && o.next > 0 && o.keys.get(o.next - 1).map(|k| &**k) == Some(a)
            })
        });
        let mut open = match kept {
            Some(i) => self.open.remove(i),
            None => {
                let keys = fetch()?;
                let next = after.map_or(0, |a| keys.partition_point(|k| &**k <= a));
                Open {
                    what,
                    keys,
                    next,
                    held: 0,
                }
            }
        };
        let start = open.next;
        let mut used = 0;
        let mut end = start;
        while end < open.keys.len() {
            used += open.keys[end].len() + 4;
            if end > start && used > max_bytes {
                break;
            }
            end += 1;
        }
        let page = open.keys[start..end]
            .iter()
            .map(|k| k.to_string())
            .collect();
        open.next = end;
        if end == open.keys.len() {
            self.budget.give(open.held);
            return Ok((page, false));
        }
        if open.held == 0 {
            // Kept for the next page if the node's budget holds it.
            let cost = open.keys.len() * std::mem::size_of::<Arc<str>>()
                + open.keys[end..].iter().map(|k| k.len()).sum::<usize>();
            if !self.budget.take(cost) {
                return Ok((page, true));
            }
            open.held = cost;
        }
        if self.open.len() >= OPEN_MAX {
            let old = self.open.remove(0);
            self.budget.give(old.held);
        }
        self.open.push(open);
        Ok((page, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what(shard: u32) -> What {
        What {
            pool: "/vol".into(),
            prefix: None,
            shard: Some(shard),
            at: None,
        }
    }

    fn shared(keys: &[String]) -> Vec<Arc<str>> {
        keys.iter().map(|k| Arc::from(k.as_str())).collect()
    }

    fn listings() -> Listings {
        Listings::new(Budget::new(BUDGET_BYTES))
    }

    /// Walks a listing to its end; returns its keys and how often the
    /// keys were fetched.
    fn walk(l: &mut Listings, keys: &[String], budget: usize, w: What) -> (Vec<String>, usize) {
        let (mut got, mut fetched) = (Vec::new(), 0);
        let mut after: Option<String> = None;
        loop {
            let (page, more) = l
                .page(w.clone(), after.as_deref(), budget, || {
                    fetched += 1;
                    Ok(shared(keys))
                })
                .unwrap();
            assert!(!page.is_empty() || !more, "an empty page says no more");
            let bytes: usize = page.iter().map(|k| k.len() + 4).sum();
            assert!(
                page.len() <= 1 || bytes <= budget,
                "{bytes} bytes over {budget}"
            );
            after = page.last().cloned().or(after);
            got.extend(page);
            if !more {
                return (got, fetched);
            }
        }
    }

    /// Pages cover every key once, in order, within the budget (one key
    /// at least, however long); the keys are fetched once a listing.
    #[test]
    fn pages_cover_each_key_once_from_one_fetch() {
        let mut keys: Vec<String> = (0..500u32)
            .map(|i| {
                format!(
                    "/vol/{:05}{}",
                    (i * 7919) % 500,
                    "y".repeat((i as usize * 37) % 290)
                )
            })
            .collect();
        keys.sort();
        let mut l = listings();
        for budget in [1, 100, 1000, 4096, 1 << 20] {
            let (got, fetched) = walk(&mut l, &keys, budget, what(0));
            assert_eq!(got, keys, "budget {budget}");
            assert_eq!(fetched, 1, "budget {budget}");
        }
        assert!(l.open.is_empty(), "finished listings are dropped");
        assert_eq!(
            l.budget.left(),
            BUDGET_BYTES,
            "and give back what they held"
        );
        let (page, more) = l.page(what(0), None, 10, || Ok(Vec::new())).unwrap();
        assert!(page.is_empty() && !more);
    }

    /// Listings of several shards at once each keep their place; one
    /// evicted (more than `OPEN_MAX` at once), or asked after a key the
    /// connection does not hold, is taken afresh from that key on.
    #[test]
    fn interleaved_and_evicted_listings_resume_after_their_last_key() {
        let keys: Vec<String> = (0..100).map(|i| format!("/vol/k{i:03}")).collect();
        let mut l = listings();
        let n = OPEN_MAX as u32 + 2;
        let mut after: Vec<Option<String>> = vec![None; n as usize];
        let mut got: Vec<Vec<String>> = vec![Vec::new(); n as usize];
        let (mut fetched, mut done) = (0, vec![false; n as usize]);
        while done.iter().any(|d| !d) {
            for s in 0..n {
                let i = s as usize;
                if done[i] {
                    continue;
                }
                let (page, more) = l
                    .page(what(s), after[i].as_deref(), 10 * 12, || {
                        fetched += 1;
                        Ok(shared(&keys))
                    })
                    .unwrap();
                after[i] = page.last().cloned();
                got[i].extend(page);
                done[i] = !more;
            }
        }
        for g in &got {
            assert_eq!(g, &keys, "every shard's listing whole and in order");
        }
        assert!(fetched > n as usize, "evicted listings were fetched again");
        // A key this connection never handed out: from the key on.
        let (page, _) = l
            .page(what(0), Some("/vol/k049"), 12, || Ok(shared(&keys)))
            .unwrap();
        assert_eq!(page, vec!["/vol/k050".to_string()]);
    }

    /// The node's budget bounds what all connections keep: a listing that
    /// does not fit is not kept (its pages are still right, each from a
    /// fetch of its own), and a connection's end gives back what it held.
    #[test]
    fn kept_listings_stay_within_the_nodes_budget() {
        let keys: Vec<String> = (0..1000).map(|i| format!("/vol/k{i:04}")).collect();
        // Room for one listing of these keys (16 bytes a key and the text
        // of those after its first page), not two.
        let total = 1000 * 16 + 1000 * 10;
        let budget = Budget::new(total);
        let mut a = Listings::new(budget.clone());
        let mut b = Listings::new(budget.clone());
        let (_, more) = a.page(what(0), None, 100, || Ok(shared(&keys))).unwrap();
        assert!(more && a.open.len() == 1, "the first is kept");
        let (got, fetched) = walk(&mut b, &keys, 1000, what(1));
        assert_eq!(got, keys, "the second, not kept, is still whole");
        assert!(fetched > 1 && b.open.is_empty(), "fetched {fetched}");
        assert!(budget.left() < total);
        drop(a);
        assert_eq!(
            budget.left(),
            total,
            "a closed connection gives its listings back"
        );
    }
}
