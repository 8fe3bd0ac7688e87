//! A shared queue with competing consumers (EdgeServe's shared queues):
//! each item goes to exactly one live consumer at a time; a consumer holds
//! an item under a lease and acknowledges it when done; an item whose
//! lease ran out (its consumer died or stalled) is delivered again to
//! another, at least once, with its delivery count visible.

use std::collections::{BTreeMap, VecDeque};

/// An item handed to a consumer.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery<T> {
    pub id: u64,
    pub value: T,
    /// 1 on the first delivery, more after redeliveries.
    pub attempt: u32,
}

struct Leased<T> {
    consumer: String,
    until: u64,
    delivery: Delivery<T>,
}

pub struct SharedQueue<T> {
    lease: u64,
    next_id: u64,
    ready: VecDeque<Delivery<T>>,
    leased: BTreeMap<u64, Leased<T>>,
    /// Items delivered again after a lease ran out.
    pub redelivered: u64,
}

impl<T: Clone> SharedQueue<T> {
    /// Items are held for `lease` (time units of the caller's clock).
    pub fn new(lease: u64) -> Self {
        SharedQueue {
            lease: lease.max(1),
            next_id: 1,
            ready: VecDeque::new(),
            leased: BTreeMap::new(),
            redelivered: 0,
        }
    }

    /// Enqueues an item; its id.
    pub fn push(&mut self, value: T) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.ready.push_back(Delivery {
            id,
            value,
            attempt: 0,
        });
        id
    }

    /// Items waiting for a consumer (the backlog), and items held.
    pub fn backlog(&self) -> (usize, usize) {
        (self.ready.len(), self.leased.len())
    }

    /// Leases that ran out by `now` go back to the front of the queue.
    fn expire(&mut self, now: u64) {
        let gone: Vec<u64> = self
            .leased
            .iter()
            .filter(|(_, l)| l.until <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in gone.into_iter().rev() {
            if let Some(l) = self.leased.remove(&id) {
                self.redelivered += 1;
                self.ready.push_front(l.delivery);
            }
        }
    }

    /// The next item for `consumer` at `now`, leased until `now + lease`.
    pub fn claim(&mut self, consumer: &str, now: u64) -> Option<Delivery<T>> {
        self.expire(now);
        let mut d = self.ready.pop_front()?;
        d.attempt += 1;
        self.leased.insert(
            d.id,
            Leased {
                consumer: consumer.to_string(),
                until: now + self.lease,
                delivery: d.clone(),
            },
        );
        Some(d)
    }

    /// `consumer` is done with `id`. False when it no longer held it (its
    /// lease ran out and the item went elsewhere).
    pub fn ack(&mut self, consumer: &str, id: u64) -> bool {
        match self.leased.get(&id) {
            Some(l) if l.consumer == consumer => {
                self.leased.remove(&id);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_item_goes_to_one_consumer() {
        let mut q = SharedQueue::new(10);
        for v in 0..4 {
            q.push(v);
        }
        let a = q.claim("a", 0).unwrap();
        let b = q.claim("b", 0).unwrap();
        assert_ne!(a.id, b.id);
        assert!(q.ack("a", a.id) && q.ack("b", b.id));
        assert!(!q.ack("a", a.id), "acknowledged once");
        assert_eq!(q.backlog(), (2, 0));
    }

    /// A consumer that dies mid-item: after its lease the item goes to
    /// another consumer, marked as a second attempt; the dead one's late
    /// acknowledgement is refused.
    #[test]
    fn an_item_of_a_dead_consumer_is_delivered_again() {
        let mut q = SharedQueue::new(10);
        let id = q.push("frame");
        let first = q.claim("dies", 0).unwrap();
        assert_eq!((first.id, first.attempt), (id, 1));
        assert!(q.claim("b", 5).is_none(), "held while the lease runs");
        let again = q.claim("b", 10).unwrap();
        assert_eq!((again.id, again.attempt), (id, 2));
        assert_eq!(q.redelivered, 1);
        assert!(!q.ack("dies", id));
        assert!(q.ack("b", id));
        assert_eq!(q.backlog(), (0, 0));
    }
}
