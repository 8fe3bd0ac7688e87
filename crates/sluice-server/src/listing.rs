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

use sluice_types::SluiceError;

/// Listings kept per connection (a client lists every shard of a pool at
/// once); the least recent goes first.
const OPEN_MAX: usize = 8;

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
    keys: Vec<String>,
    /// Where the next page starts.
    next: usize,
}

/// A connection's listings in progress.
#[derive(Default)]
pub struct Listings {
    /// Least recently used first.
    open: Vec<Open>,
}

impl Listings {
    /// The page of `what` after `after`: at most `max_bytes` (a key counts
    /// its length and 4 bytes, as on the wire; one key at least), and
    /// whether more follow. `fetch` gives all of `what`'s keys, sorted; it
    /// is called for a listing's first page, and for one this connection
    /// no longer holds.
    pub fn page(
        &mut self,
        what: What,
        after: Option<&str>,
        max_bytes: usize,
        fetch: impl FnOnce() -> Result<Vec<String>, SluiceError>,
    ) -> Result<(Vec<String>, bool), SluiceError> {
        let held = after.and_then(|a| {
            self.open.iter().position(|o| {
                o.what == what
                    && o.next > 0
                    && o.keys.get(o.next - 1).map(String::as_str) == Some(a)
            })
        });
        let mut open = match held {
            Some(i) => self.open.remove(i),
            None => {
                let keys = fetch()?;
                let next = after.map_or(0, |a| keys.partition_point(|k| k.as_str() <= a));
                Open { what, keys, next }
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
        let page = open.keys[start..end].to_vec();
        open.next = end;
        let more = end < open.keys.len();
        if more {
            if self.open.len() >= OPEN_MAX {
                self.open.remove(0);
            }
            self.open.push(open);
        }
        Ok((page, more))
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

    /// Walks a listing to its end; returns its keys and how often the
    /// keys were fetched.
    fn walk(l: &mut Listings, keys: &[String], budget: usize, w: What) -> (Vec<String>, usize) {
        let (mut got, mut fetched) = (Vec::new(), 0);
        let mut after: Option<String> = None;
        loop {
            let (page, more) = l
                .page(w.clone(), after.as_deref(), budget, || {
                    fetched += 1;
                    Ok(keys.to_vec())
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
        let mut l = Listings::default();
        for budget in [1, 100, 1000, 4096, 1 << 20] {
            let (got, fetched) = walk(&mut l, &keys, budget, what(0));
            assert_eq!(got, keys, "budget {budget}");
            assert_eq!(fetched, 1, "budget {budget}");
        }
        assert!(l.open.is_empty(), "finished listings are dropped");
        let (page, more) = l.page(what(0), None, 10, || Ok(Vec::new())).unwrap();
        assert!(page.is_empty() && !more);
    }

    /// Listings of several shards at once each keep their place; one
    /// evicted (more than `OPEN_MAX` at once), or asked after a key the
    /// connection does not hold, is taken afresh from that key on.
    #[test]
    fn interleaved_and_evicted_listings_resume_after_their_last_key() {
        let keys: Vec<String> = (0..100).map(|i| format!("/vol/k{i:03}")).collect();
        let mut l = Listings::default();
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
                        Ok(keys.clone())
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
            .page(what(0), Some("/vol/k049"), 12, || Ok(keys.clone()))
            .unwrap();
        assert_eq!(page, vec!["/vol/k050".to_string()]);
    }
}
