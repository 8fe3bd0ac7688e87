//! Stream operators as DFG vertices (issue #18): `stream_aggregate`
//! (tuples with one item per source within a skew) and `stream_rate`
//! (a tuple of the last known items every period). Both take a topic's
//! headers (a vertex on `/streams/<topic>`) and emit tuples of headers
//! (`sluice_streams::topic::encode_tuple`) under the suffix `/<topic>`:
//! payloads are not moved here; the next stage fetches the ones it uses.
//!
//! Time is the stream's own: the newest header's timestamp is the clock,
//! so a window closes (a tick falls due) when a later item of any source
//! arrives, and a vertex's output is a function of its input (replayable).
//!
//! Config: `{"sources": ["cam", "mic"], "fail_soft": "drop" |
//! "last_known_good" | "partial"}` plus `max_skew_ms` (aggregate) or
//! `period_ms` and optionally `max_age_ms` (rate).
//!
//! `shared_queue` feeds a shared queue from a graph: each object it gets
//! is emitted under a fresh item id (`/<time>-n<node>-<seq>`, ordered by
//! time), so with the destination `/queues/<name>/items` every input
//! becomes one item that competing consumers (`sluice queue take`,
//! `sluice_streams::shared::SharedQueue`, `sluice.streams.SharedQueue`)
//! take, each item once, redelivered if a consumer dies mid-item.

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::Value;
use sluice_compute::{Context, Emitter, Udl, UdlError, Upcall};
use sluice_streams::align::Aligner;
use sluice_streams::rate::Ticker;
use sluice_streams::topic::{encode_tuple, Header};
use sluice_streams::{FailSoft, Item, Tuple};

fn sources(c: &Value) -> Result<Vec<String>, String> {
    let s: Vec<String> = c
        .get("sources")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    if s.is_empty() {
        return Err(
            "needs \"sources\": [\"<source>\", ...] (the topic's sources, in tuple order)".into(),
        );
    }
    let names: Vec<&str> = s.iter().map(String::as_str).collect();
    sluice_streams::check_sources(&names)?;
    Ok(s)
}

fn fail_soft(c: &Value) -> Result<FailSoft, String> {
    match c
        .get("fail_soft")
        .and_then(Value::as_str)
        .unwrap_or("last_known_good")
    {
        "drop" => Ok(FailSoft::Drop),
        "last_known_good" => Ok(FailSoft::LastKnownGood),
        "partial" => Ok(FailSoft::Partial),
        other => Err(format!(
            "fail_soft {other:?}: use drop, last_known_good or partial"
        )),
    }
}

fn ms(c: &Value, field: &str) -> Result<Option<u64>, String> {
    match c.get(field) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|m| *m >= 0.0)
            .map(|m| Some((m * 1000.0) as u64))
            .ok_or_else(|| format!("{field} must be a number of milliseconds, not {v}")),
    }
}

/// Runs an operator on this upcall's header (an item whose value is the
/// header's wire bytes, passed on unchanged; reserved sources skipped)
/// and emits the tuples it yields under `/<topic>`.
fn operate(
    call: &Upcall<'_>,
    emit: &mut Emitter<'_>,
    sources: &[String],
    op: impl FnOnce(Item<Bytes>) -> Vec<Tuple<Bytes>>,
) -> Result<(), UdlError> {
    let v = &call.object.value;
    let h = Header::decode(v).map_err(|e| UdlError::Failed(format!("{}: {e}", call.key)))?;
    if h.source.starts_with('_') {
        return Ok(());
    }
    for t in op(Item::new(&h.source, h.ts_us, v.clone())) {
        emit.emit(&format!("/{}", h.topic), encode_tuple(&t, sources))?;
    }
    Ok(())
}

pub struct Aggregate {
    sources: Vec<String>,
    aligner: Mutex<Aligner<Bytes>>,
}

impl Aggregate {
    pub fn from_config(c: &Value, _: &Context) -> Result<Aggregate, String> {
        let sources = sources(c)?;
        let skew = ms(c, "max_skew_ms")?.ok_or("needs \"max_skew_ms\"")?;
        let names: Vec<&str> = sources.iter().map(String::as_str).collect();
        Ok(Aggregate {
            aligner: Mutex::new(Aligner::new(&names, skew, fail_soft(c)?)),
            sources,
        })
    }
}

impl Udl for Aggregate {
    fn handle(
        &self,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        _: &Context,
    ) -> Result<(), UdlError> {
        operate(call, emit, &self.sources, |item| {
            let now = item.ts;
            let mut a = self.aligner.lock();
            let mut t = a.push(item);
            t.extend(a.advance(now));
            t
        })
    }
}

pub struct Rate {
    sources: Vec<String>,
    period: u64,
    max_age: u64,
    policy: FailSoft,
    /// Started at the first item's time.
    ticker: Mutex<Option<Ticker<Bytes>>>,
}

impl Rate {
    pub fn from_config(c: &Value, _: &Context) -> Result<Rate, String> {
        let period = ms(c, "period_ms")?
            .filter(|p| *p > 0)
            .ok_or("needs \"period_ms\" > 0 (the target prediction period)")?;
        Ok(Rate {
            sources: sources(c)?,
            period,
            max_age: ms(c, "max_age_ms")?.unwrap_or(u64::MAX),
            policy: fail_soft(c)?,
            ticker: Mutex::new(None),
        })
    }
}

impl Udl for Rate {
    fn handle(
        &self,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        _: &Context,
    ) -> Result<(), UdlError> {
        operate(call, emit, &self.sources, |item| {
            let now = item.ts;
            let mut g = self.ticker.lock();
            let t = g.get_or_insert_with(|| {
                let names: Vec<&str> = self.sources.iter().map(String::as_str).collect();
                Ticker::new(&names, now, self.period, self.max_age, self.policy)
            });
            t.observe(item);
            t.tick_until(now)
        })
    }
}

pub struct QueueFeed {
    node: u32,
    seq: std::sync::atomic::AtomicU64,
}

impl QueueFeed {
    pub fn new(ctx: &Context) -> QueueFeed {
        QueueFeed {
            node: ctx.node_id,
            seq: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Udl for QueueFeed {
    fn handle(
        &self,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        _: &Context,
    ) -> Result<(), UdlError> {
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("/{:020}-n{}-{seq}", sluice_types::wall_us(), self.node);
        emit.emit(&id, call.object.value.clone())?;
        Ok(())
    }
}
