//! Stream operators after EdgeServe (`shared/seeds/001_…`, sections 5 and
//! 6.2), as pure logic over timestamps a caller supplies (so tests drive
//! them with a controlled clock): [`align::Aligner`] yields tuples with one
//! item per source within a maximum skew, closing a window with a partial
//! tuple when a source is late; [`rate::Ticker`] predicts at a target
//! frequency from the last known observation, so items between ticks are
//! skipped (their payloads never need to move); [`FailSoft`] says what a
//! missing input becomes; [`queue::SharedQueue`] hands each item to one of
//! competing consumers and delivers it again when a consumer's lease runs
//! out; [`metrics`] measures excess work, the actual prediction frequency
//! and real-time accuracy.
//!
//! Streams themselves live on Sluice's pools and watches: [`topic`]
//! (producers, subscribers, lazy fetches), [`consumer`] (a timer-driven
//! consumer at a target frequency, with its metrics) and [`shared`] (a shared queue
//! across processes, on a replicated pool).
//!
//! Invariants: the operators (`align`, `rate`, `queue`, `metrics`) do no
//! I/O and keep no clock of their own; only `topic`, `consumer` and `shared` talk to
//! nodes, and only through `sluice-client` (no second wire
//! implementation).

pub mod align;
pub mod consumer;
pub mod metrics;
pub mod queue;
pub mod rate;
pub mod shared;
pub mod topic;

/// One item of a stream: its source, its timestamp (µs, or any unit the
/// caller keeps to) and its value. `value: None` is an item that arrived
/// broken (the paper's ■): it counts as missing.
#[derive(Clone, Debug, PartialEq)]
pub struct Item<T> {
    pub source: String,
    pub ts: u64,
    pub value: Option<T>,
}

impl<T> Item<T> {
    pub fn new(source: &str, ts: u64, value: T) -> Self {
        Item {
            source: source.to_string(),
            ts,
            value: Some(value),
        }
    }

    /// An item that arrived broken.
    pub fn failed(source: &str, ts: u64) -> Self {
        Item {
            source: source.to_string(),
            ts,
            value: None,
        }
    }
}

/// The sources of an aligner or ticker: at least one, none twice (a
/// second slot of the same source took that source's next item).
pub fn check_sources(sources: &[&str]) -> Result<(), String> {
    if sources.is_empty() {
        return Err("it makes tuples of its sources' items: name at least one source".into());
    }
    for (i, s) in sources.iter().enumerate() {
        if sources[..i].contains(s) {
            return Err(format!("source {s:?} twice: name each source once"));
        }
    }
    Ok(())
}

/// What a source's slot in a tuple holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Slot<T> {
    /// An item of this window.
    Fresh(Item<T>),
    /// The source's last known good item, standing in for a missing one.
    Imputed(Item<T>),
    Missing,
}

impl<T> Slot<T> {
    pub fn item(&self) -> Option<&Item<T>> {
        match self {
            Slot::Fresh(i) | Slot::Imputed(i) => Some(i),
            Slot::Missing => None,
        }
    }
}

/// What becomes of a tuple when a source has nothing for it (per topic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailSoft {
    /// The tuple is not yielded.
    Drop,
    /// The source's last known good item stands in (EdgeServe's default).
    LastKnownGood,
    /// The tuple is yielded with the slot `Missing`.
    Partial,
}

/// A tuple: one slot per source of the topic, in the topic's source order.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuple<T> {
    /// The window's start (aligner) or the tick's time (ticker).
    pub ts: u64,
    pub slots: Vec<Slot<T>>,
}

impl<T> Tuple<T> {
    pub fn is_complete(&self) -> bool {
        self.slots.iter().all(|s| matches!(s, Slot::Fresh(_)))
    }
}

/// Fills the slot of a source with nothing fresh, by `policy`; `None`:
/// drop the tuple.
fn fail_soft<T: Clone>(policy: FailSoft, last_good: Option<&Item<T>>) -> Option<Slot<T>> {
    match policy {
        FailSoft::Drop => None,
        FailSoft::Partial => Some(Slot::Missing),
        FailSoft::LastKnownGood => Some(match last_good {
            Some(i) => Slot::Imputed(i.clone()),
            None => Slot::Missing,
        }),
    }
}
