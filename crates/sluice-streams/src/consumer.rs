//! A timer-driven consumer at a target prediction frequency (EdgeServe
//! §5.2 on a live topic): headers arrive from a [`Subscriber`]; every
//! `period` of the wall clock a tick yields the last known item of each
//! source ([`Ticker`]); only the payloads of the items a tick uses are
//! fetched ([`RateConsumer::payloads`]), so skipped items' payloads never
//! move. [`ConsumerMetrics`] says how it keeps up.

use crate::metrics::{excess, frequency, realtime_accuracy};
use crate::rate::Ticker;
use crate::topic::{Fetcher, Header, Result, Subscriber};
use crate::{FailSoft, Item, Slot, Tuple};
use bytes::Bytes;
use serde::Serialize;
use sluice_client::Client;
use std::time::Duration;

/// How a consumer keeps up (EdgeServe §6.2).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConsumerMetrics {
    /// Headers received, and the bytes that came with them.
    pub received: u64,
    pub received_bytes: u64,
    /// Items waiting for a tick now (the backlog).
    pub backlog: u64,
    /// Items a tick used, and items overtaken before any tick used them.
    pub used: u64,
    pub skipped: u64,
    /// Payloads fetched from recording nodes, and their bytes.
    pub fetched: u64,
    pub fetched_bytes: u64,
    pub predictions: u64,
    /// Tuples processed (their payloads fetched) beyond one per
    /// prediction.
    pub excess: u64,
    /// Actual prediction frequency (Hz) and the standard deviation of the
    /// interval between predictions (ms).
    pub frequency_hz: Option<f64>,
    pub interval_std_ms: Option<f64>,
    /// Share of predictions equal to the truth known when each was made
    /// (when truth is supplied).
    pub realtime_accuracy: Option<f64>,
}

pub struct RateConsumer {
    sub: Subscriber,
    ticker: Ticker<Header>,
    fetcher: Fetcher,
    period: Duration,
    next_tick: tokio::time::Instant,
    /// Prediction times (µs) and labels; truth times and labels.
    predictions: Vec<(u64, String)>,
    truth: Vec<(u64, String)>,
    processed: u64,
}

impl RateConsumer {
    /// Subscribes to `topic` and ticks every `period` from now; a source
    /// whose last item is older than `max_age` at a tick is missing there
    /// (`policy` decides what it becomes).
    pub async fn new(
        broker: &Client,
        topic: &str,
        sources: &[&str],
        period: Duration,
        max_age: Option<Duration>,
        policy: FailSoft,
    ) -> Result<RateConsumer> {
        let bad = |reason: String| {
            Err(sluice_client::SluiceError::invalid_argument(
                "rate consumer",
                reason,
            ))
        };
        if period.is_zero() {
            return bad(format!("its period must be more than zero, not {period:?}"));
        }
        if sources.is_empty() {
            return bad("it predicts from its sources: name at least one".into());
        }
        if let Err(reason) = crate::check_sources(sources) {
            return bad(reason);
        }
        let sub = Subscriber::new(broker, topic, None).await?;
        let now = sluice_client::wall_us();
        let period_us = (period.as_micros() as u64).max(1);
        let max_age = max_age.map_or(u64::MAX, |a| a.as_micros() as u64);
        Ok(RateConsumer {
            sub,
            ticker: Ticker::new(sources, now + period_us, period_us, max_age, policy),
            fetcher: Fetcher::default(),
            period,
            next_tick: tokio::time::Instant::now() + period,
            predictions: Vec::new(),
            truth: Vec::new(),
            processed: 0,
        })
    }

    /// Receives headers until the next tick is due, then returns its
    /// tuple (ticks `FailSoft::Drop` drops are passed over). `None` when
    /// the subscription ended.
    pub async fn tick(&mut self) -> Option<Result<Tuple<Header>>> {
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(self.next_tick) => {
                    self.next_tick += self.period;
                    let mut due = self.ticker.tick_until(sluice_client::wall_us());
                    if let Some(t) = due.pop() {
                        return Some(Ok(t));
                    }
                }
                h = self.sub.next() => match h? {
                    // Items of the topic's other sources are dropped.
                    Ok(h) => {
                        self.ticker.observe(Item::new(&h.source.clone(), h.ts_us, h));
                    }
                    Err(e) => return Some(Err(e)),
                },
            }
        }
    }

    /// The payloads of a tuple's items (fetched now if lazy); `None` for
    /// a missing slot. Counts the tuple as processed.
    pub async fn payloads(&mut self, t: &Tuple<Header>) -> Result<Vec<Option<Bytes>>> {
        self.processed += 1;
        let mut out = Vec::with_capacity(t.slots.len());
        for s in &t.slots {
            match s {
                Slot::Fresh(i) | Slot::Imputed(i) => {
                    let h = i.value.as_ref().expect("a good item has a header");
                    out.push(Some(self.fetcher.fetch(h).await?));
                }
                Slot::Missing => out.push(None),
            }
        }
        Ok(out)
    }

    /// Records a prediction made now (for frequency and accuracy).
    pub fn predicted(&mut self, label: impl Into<String>) {
        self.predictions
            .push((sluice_client::wall_us(), label.into()));
    }

    /// Records the ground truth from `ts_us` on.
    pub fn truth(&mut self, ts_us: u64, label: impl Into<String>) {
        let at = self.truth.partition_point(|(t, _)| *t <= ts_us);
        self.truth.insert(at, (ts_us, label.into()));
    }

    pub fn metrics(&self) -> ConsumerMetrics {
        let times: Vec<u64> = self.predictions.iter().map(|p| p.0).collect();
        let f = frequency(&times);
        ConsumerMetrics {
            received: self.sub.received,
            received_bytes: self.sub.received_bytes,
            backlog: self.ticker.pending() as u64,
            used: self.ticker.used,
            skipped: self.ticker.skipped,
            fetched: self.fetcher.fetched,
            fetched_bytes: self.fetcher.fetched_bytes,
            predictions: self.predictions.len() as u64,
            excess: excess(self.processed, self.predictions.len() as u64),
            frequency_hz: f.map(|(mean, _)| 1e6 / mean.max(1.0)),
            interval_std_ms: f.map(|(_, std)| std / 1e3),
            realtime_accuracy: realtime_accuracy(&self.predictions, &self.truth),
        }
    }
}
