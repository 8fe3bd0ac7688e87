//! Streams for Python (issue #18), over `sluice-streams`: producers,
//! subscribers and lazy fetches, the timer-driven consumer, the shared
//! queue, and the pure operators (aligner, ticker) over Python values.
//! Every call that waits on the network blocks with the GIL released.

use crate::client::Client;
use crate::errors::to_py;
use crate::runtime::json_to_py;
use crate::value::{bytes_of, Value};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use sluice_streams::{align, consumer, rate, shared, topic, FailSoft, Item, Slot, Tuple};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// Runs `f` to completion with the GIL released, for an object made in
/// process `made_in` (refused in a process forked after it was made:
/// `runtime::check_process`).
fn block<T>(
    py: Python<'_>,
    made_in: u64,
    f: impl std::future::Future<Output = sluice_types::Result<T>> + Send,
) -> PyResult<T>
where
    T: Send,
{
    crate::runtime::check_process(made_in)?;
    crate::runtime::block_checking_signals(py, None, f)?.map_err(to_py)
}

/// A count or a time given as a Python int: a negative one said only
/// "can't convert negative int to unsigned" (OverflowError).
fn non_negative(name: &str, v: i128) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| {
        PyValueError::new_err(if v < 0 {
            format!("{name}={v} is negative: counts and times start at 0")
        } else {
            format!("{name}={v} is more than 2**64 - 1")
        })
    })
}

fn opt_non_negative(name: &str, v: Option<i128>) -> PyResult<Option<u64>> {
    v.map(|v| non_negative(name, v)).transpose()
}

/// The sources of an aligner or a ticker, checked.
fn sources_of(sources: &[String]) -> PyResult<Vec<&str>> {
    let names: Vec<&str> = sources.iter().map(String::as_str).collect();
    sluice_streams::check_sources(&names).map_err(PyValueError::new_err)?;
    Ok(names)
}

/// An item for an operator that does not have its source: it would be
/// dropped (the aligner) or kept for ever (the ticker) without a word.
fn unknown_source(source: &str, sources: &[String]) -> PyErr {
    let list: Vec<String> = sources.iter().map(|s| format!("{s:?}")).collect();
    PyValueError::new_err(format!(
        "source {source:?} is not one of its sources [{}]",
        list.join(", ")
    ))
}

/// The most ticks one `tick_until` makes: a `first` on another clock
/// than `now` (0, against a wall-clock time in µs) asked for 10^14.
const MAX_TICKS_AT_ONCE: u64 = 1_000_000;

fn fail_soft(s: &str) -> PyResult<FailSoft> {
    match s {
        "drop" => Ok(FailSoft::Drop),
        "last_known_good" => Ok(FailSoft::LastKnownGood),
        "partial" => Ok(FailSoft::Partial),
        other => Err(PyValueError::new_err(format!(
            "fail_soft {other:?}: use 'drop', 'last_known_good' or 'partial'"
        ))),
    }
}

fn duration(s: f64) -> PyResult<Duration> {
    crate::runtime::seconds(s)
        .ok_or_else(|| PyValueError::new_err(format!("{s} is not a duration in seconds")))
}

/// One stream item's header: where it came from, when, how big, and
/// where its payload lives (`node`, `key`, `version`) or the payload
/// itself (`payload`, eager items).
#[pyclass(module = "sluice", frozen)]
pub struct Header {
    pub(crate) h: topic::Header,
}

#[pymethods]
impl Header {
    #[getter]
    fn topic(&self) -> &str {
        &self.h.topic
    }
    #[getter]
    fn source(&self) -> &str {
        &self.h.source
    }
    #[getter]
    fn seq(&self) -> u64 {
        self.h.seq
    }
    #[getter]
    fn ts_us(&self) -> u64 {
        self.h.ts_us
    }
    #[getter]
    fn size(&self) -> u64 {
        self.h.size
    }
    #[getter]
    fn node(&self) -> Option<&str> {
        self.h.node.as_deref()
    }
    #[getter]
    fn key(&self) -> Option<&str> {
        self.h.key.as_deref()
    }
    #[getter]
    fn version(&self) -> Option<u64> {
        self.h.version
    }
    /// True when the payload travelled with the header.
    #[getter]
    fn eager(&self) -> bool {
        self.h.is_eager()
    }
    /// The inline payload (eager items), zero-copy; None for lazy items.
    #[getter]
    fn payload(&self) -> Option<Value> {
        self.h.inline.clone().map(|bytes| Value { bytes })
    }
    fn __repr__(&self) -> String {
        format!(
            "Header(topic={:?}, source={:?}, seq={}, ts_us={}, size={}, {})",
            self.h.topic,
            self.h.source,
            self.h.seq,
            self.h.ts_us,
            self.h.size,
            if self.h.is_eager() { "eager" } else { "lazy" }
        )
    }
}

/// The writing side of one stream (see `sluice.streams.Producer`).
#[pyclass(module = "sluice._sluice", frozen)]
pub struct StreamProducer {
    inner: Arc<Mutex<topic::Producer>>,
    /// The process it was made in (`runtime::check_process`).
    made_in: u64,
}

#[pymethods]
impl StreamProducer {
    #[new]
    #[pyo3(signature = (broker, local_addr, topic, source, routing = "lazy", keep_for_s = 60, keep_bytes = None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        broker: &Client,
        local_addr: String,
        topic: String,
        source: String,
        routing: &str,
        keep_for_s: i128,
        keep_bytes: Option<i128>,
    ) -> PyResult<StreamProducer> {
        let keep_for_s = non_negative("keep_for_s", keep_for_s)?;
        let keep_bytes = opt_non_negative("keep_bytes", keep_bytes)?;
        let routing: topic::Routing = routing.parse().map_err(to_py)?;
        let (b, made_in) = (broker.rust()?, broker.made_in());
        let keep = topic::Keep {
            for_s: keep_for_s,
            bytes: keep_bytes,
        };
        let p = block(py, made_in, async move {
            topic::Producer::new(b, &local_addr, &topic, &source, routing, keep).await
        })?;
        Ok(StreamProducer {
            inner: Arc::new(Mutex::new(p)),

            made_in,
        })
    }

    /// Publishes one item (any buffer); returns its header.
    #[pyo3(signature = (value, ts_us = None))]
    fn publish(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        ts_us: Option<i128>,
    ) -> PyResult<Header> {
        let ts_us = opt_non_negative("ts_us", ts_us)?;
        let payload = bytes_of(value)?;
        let inner = self.inner.clone();
        let h = block(py, self.made_in, async move {
            inner.lock().await.publish(ts_us, payload).await
        })?;
        Ok(Header { h })
    }

    /// What `routing='auto'` measured (sizes, µs per item each way, the
    /// break-even in bytes), or None.
    #[getter]
    fn break_even(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let g = self.inner.blocking_lock();
        match g.break_even() {
            Some(b) => json_to_py(py, &serde_json::to_value(b).expect("serializes")),
            None => Ok(py.None()),
        }
    }
}

/// A subscription to a topic, with the fetcher for its lazy payloads.
#[pyclass(module = "sluice._sluice", frozen)]
pub struct StreamSubscriber {
    sub: Arc<Mutex<topic::Subscriber>>,
    fetcher: Arc<Mutex<topic::Fetcher>>,
    /// The process it was made in (`runtime::check_process`).
    made_in: u64,
}

#[pymethods]
impl StreamSubscriber {
    #[new]
    #[pyo3(signature = (broker, topic, from_ts_us = None))]
    fn new(
        py: Python<'_>,
        broker: &Client,
        topic: String,
        from_ts_us: Option<i128>,
    ) -> PyResult<Self> {
        let from_ts_us = opt_non_negative("from_ts_us", from_ts_us)?;
        let (b, made_in) = (broker.rust()?, broker.made_in());
        let sub = block(py, made_in, async move {
            topic::Subscriber::new(&b, &topic, from_ts_us).await
        })?;
        Ok(StreamSubscriber {
            sub: Arc::new(Mutex::new(sub)),
            fetcher: Arc::new(Mutex::new(topic::Fetcher::default())),

            made_in,
        })
    }

    /// The next header (per-source order), or None when `timeout_s`
    /// passed first or the subscription ended.
    #[pyo3(signature = (timeout_s = None))]
    fn next(&self, py: Python<'_>, timeout_s: Option<f64>) -> PyResult<Option<Header>> {
        let wait = timeout_s.map(duration).transpose()?;
        let sub = self.sub.clone();
        let h = block(py, self.made_in, async move {
            let mut s = sub.lock().await;
            let n = match wait {
                None => s.next().await,
                Some(t) => tokio::time::timeout(t, s.next()).await.unwrap_or(None),
            };
            n.transpose()
        })?;
        Ok(h.map(|h| Header { h }))
    }

    /// The item's payload: inline, or fetched from its recording node
    /// (`PayloadExpired` past its retention).
    fn fetch(&self, py: Python<'_>, header: &Header) -> PyResult<Value> {
        let (f, h) = (self.fetcher.clone(), header.h.clone());
        let bytes = block(
            py,
            self.made_in,
            async move { f.lock().await.fetch(&h).await },
        )?;
        Ok(Value { bytes })
    }

    /// Headers received (and their bytes), payloads fetched (and their
    /// bytes), notifications lost.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let (s, f) = (self.sub.blocking_lock(), self.fetcher.blocking_lock());
        json_to_py(
            py,
            &serde_json::json!({
                "received": s.received, "received_bytes": s.received_bytes, "lost": s.lost,
                "fetched": f.fetched, "fetched_bytes": f.fetched_bytes,
            }),
        )
    }
}

/// A tuple of headers as Python: `(ts, [slot, ...])`, a slot `None`
/// (missing) or `(state, Header)` with state 'fresh' or 'imputed'.
fn header_tuple(py: Python<'_>, t: Tuple<topic::Header>) -> PyResult<Py<PyAny>> {
    let slots = PyList::empty(py);
    for s in t.slots {
        let (state, item) = match s {
            Slot::Fresh(i) => ("fresh", i),
            Slot::Imputed(i) => ("imputed", i),
            Slot::Missing => {
                slots.append(py.None())?;
                continue;
            }
        };
        let h = Py::new(
            py,
            Header {
                h: item.value.expect("a good item has a header"),
            },
        )?;
        slots.append(PyTuple::new(
            py,
            [
                state.into_pyobject(py)?.into_any(),
                h.into_bound(py).into_any(),
            ],
        )?)?;
    }
    Ok(
        PyTuple::new(py, [t.ts.into_pyobject(py)?.into_any(), slots.into_any()])?
            .into_any()
            .unbind(),
    )
}

/// Decodes a tuple that a `stream_aggregate` or `stream_rate` vertex
/// emitted (in a Python UDL downstream of one).
#[pyfunction]
pub fn decode_tuple(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let t = topic::decode_tuple(&bytes_of(value)?).map_err(to_py)?;
    header_tuple(py, t)
}

/// The timer-driven consumer at a target frequency, with its metrics.
#[pyclass(module = "sluice._sluice", frozen)]
pub struct RateConsumer {
    inner: Arc<Mutex<consumer::RateConsumer>>,
    /// The process it was made in (`runtime::check_process`).
    made_in: u64,
}

#[pymethods]
impl RateConsumer {
    #[new]
    #[pyo3(signature = (broker, topic, sources, period_s, max_age_s = None, fail_soft = "last_known_good"))]
    fn new(
        py: Python<'_>,
        broker: &Client,
        topic: String,
        sources: Vec<String>,
        period_s: f64,
        max_age_s: Option<f64>,
        fail_soft: &str,
    ) -> PyResult<Self> {
        let (period, policy) = (duration(period_s)?, self::fail_soft(fail_soft)?);
        let max_age = max_age_s.map(duration).transpose()?;
        let (b, made_in) = (broker.rust()?, broker.made_in());
        let c = block(py, made_in, async move {
            let names: Vec<&str> = sources.iter().map(String::as_str).collect();
            consumer::RateConsumer::new(&b, &topic, &names, period, max_age, policy).await
        })?;
        Ok(RateConsumer {
            inner: Arc::new(Mutex::new(c)),

            made_in,
        })
    }

    /// Waits for the next tick; its tuple `(ts, [slot, ...])` (see
    /// `decode_tuple`), or None when the subscription ended.
    fn tick(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let inner = self.inner.clone();
        match block(py, self.made_in, async move {
            inner.lock().await.tick().await.transpose()
        })? {
            Some(t) => header_tuple(py, t),
            None => Ok(py.None()),
        }
    }

    /// The payloads of the headers given (fetched if lazy), in order; the
    /// call counts as processing one tuple.
    fn payloads(&self, py: Python<'_>, headers: Vec<PyRef<'_, Header>>) -> PyResult<Vec<Value>> {
        let t = Tuple {
            ts: 0,
            slots: headers
                .iter()
                .map(|h| Slot::Fresh(Item::new(&h.h.source, h.h.ts_us, h.h.clone())))
                .collect(),
        };
        let inner = self.inner.clone();
        let v = block(py, self.made_in, async move {
            inner.lock().await.payloads(&t).await
        })?;
        Ok(v.into_iter()
            .flatten()
            .map(|bytes| Value { bytes })
            .collect())
    }

    /// Records a prediction made now.
    fn predicted(&self, label: String) {
        self.inner.blocking_lock().predicted(label);
    }

    /// Records the ground truth from `ts_us` on.
    fn truth(&self, ts_us: i128, label: String) -> PyResult<()> {
        let ts_us = non_negative("ts_us", ts_us)?;
        self.inner.blocking_lock().truth(ts_us, label);
        Ok(())
    }

    /// Backlog, used/skipped items, payloads fetched, predictions, excess,
    /// actual frequency and its spread, real-time accuracy.
    fn metrics(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let m = self.inner.blocking_lock().metrics();
        json_to_py(py, &serde_json::to_value(m).expect("serializes"))
    }
}

/// A shared queue of competing consumers (see `sluice.streams.SharedQueue`).
#[pyclass(module = "sluice._sluice", frozen)]
pub struct SharedQueue {
    inner: Arc<Mutex<shared::SharedQueue>>,
    /// The process it was made in (`runtime::check_process`).
    made_in: u64,
}

/// An item a consumer took: `id`, `value`, `delivery` (1, or more after
/// a redelivery).
#[pyclass(module = "sluice", frozen)]
pub struct Delivery {
    #[pyo3(get)]
    pub id: String,
    #[pyo3(get)]
    pub value: Py<Value>,
    #[pyo3(get)]
    pub delivery: u32,
    d: shared::Delivery,
}

#[pymethods]
impl Delivery {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Delivery(id={:?}, delivery={}, {} bytes)",
            self.id,
            self.delivery,
            self.value.bind(py).get().bytes.len()
        )
    }
}

#[pymethods]
impl SharedQueue {
    #[new]
    #[pyo3(signature = (client, name, consumer, lease_s = 30.0))]
    fn new(
        py: Python<'_>,
        client: &Client,
        name: String,
        consumer: String,
        lease_s: f64,
    ) -> PyResult<Self> {
        let lease = duration(lease_s)?;
        let (c, made_in) = (client.rust()?, client.made_in());
        let q = block(py, made_in, async move {
            shared::SharedQueue::open(c, &name, &consumer, lease).await
        })?;
        Ok(SharedQueue {
            inner: Arc::new(Mutex::new(q)),

            made_in,
        })
    }

    fn push(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<String> {
        let v = bytes_of(value)?;
        let inner = self.inner.clone();
        block(
            py,
            self.made_in,
            async move { inner.lock().await.push(v).await },
        )
    }

    /// The next item no live consumer holds, waiting up to `timeout_s`.
    #[pyo3(signature = (timeout_s = 10.0))]
    fn take(&self, py: Python<'_>, timeout_s: f64) -> PyResult<Option<Delivery>> {
        let wait = duration(timeout_s)?;
        let inner = self.inner.clone();
        let d = block(py, self.made_in, async move {
            inner
                .lock()
                .await
                .take(wait, Duration::from_millis(20))
                .await
        })?;
        d.map(|d| {
            Ok(Delivery {
                id: d.id.clone(),
                value: Py::new(
                    py,
                    Value {
                        bytes: d.value.clone(),
                    },
                )?,
                delivery: d.delivery,
                d,
            })
        })
        .transpose()
    }

    /// Acknowledges an item (`VersionConflict` if the lease ran out and
    /// another consumer took it over).
    fn ack(&self, py: Python<'_>, delivery: &Delivery) -> PyResult<()> {
        let (inner, d) = (self.inner.clone(), delivery.d.clone());
        block(
            py,
            self.made_in,
            async move { inner.lock().await.ack(&d).await },
        )
    }

    /// Items waiting or in progress.
    fn backlog(&self, py: Python<'_>) -> PyResult<usize> {
        let inner = self.inner.clone();
        block(py, self.made_in, async move {
            inner.lock().await.backlog().await
        })
    }

    #[getter]
    fn redelivered(&self) -> u64 {
        self.inner.blocking_lock().redelivered
    }

    #[getter]
    fn missed(&self) -> u64 {
        self.inner.blocking_lock().missed
    }
}

type PyItem = Arc<Py<PyAny>>;

/// A tuple of Python values: `(ts, [slot, ...])`, a slot `None` or
/// `(state, source, ts, value)`.
fn value_tuples(py: Python<'_>, ts: Vec<Tuple<PyItem>>) -> PyResult<Py<PyAny>> {
    let out = PyList::empty(py);
    for t in ts {
        let slots = PyList::empty(py);
        for s in t.slots {
            let (state, i) = match s {
                Slot::Fresh(i) => ("fresh", i),
                Slot::Imputed(i) => ("imputed", i),
                Slot::Missing => {
                    slots.append(py.None())?;
                    continue;
                }
            };
            let v = i.value.map_or_else(|| py.None(), |v| v.clone_ref(py));
            slots.append((state, i.source, i.ts, v).into_pyobject(py)?)?;
        }
        out.append((t.ts, slots).into_pyobject(py)?)?;
    }
    Ok(out.into_any().unbind())
}

fn py_item(source: &str, ts: u64, value: Option<Py<PyAny>>) -> Item<PyItem> {
    Item {
        source: source.to_string(),
        ts,
        value: value.map(Arc::new),
    }
}

/// Time alignment with bounded skew over any Python values (the clock is
/// the caller's: `push` and `advance` take times).
#[pyclass(module = "sluice._sluice")]
pub struct Aligner {
    inner: align::Aligner<PyItem>,
    sources: Vec<String>,
}

#[pymethods]
impl Aligner {
    #[new]
    #[pyo3(signature = (sources, max_skew, fail_soft = "partial"))]
    fn new(sources: Vec<String>, max_skew: i128, fail_soft: &str) -> PyResult<Self> {
        let names = sources_of(&sources)?;
        let max_skew = non_negative("max_skew", max_skew)?;
        Ok(Aligner {
            inner: align::Aligner::new(&names, max_skew, self::fail_soft(fail_soft)?),
            sources,
        })
    }

    /// An item (`value` None: it arrived broken); the tuples it completes.
    #[pyo3(signature = (source, ts, value))]
    fn push(
        &mut self,
        py: Python<'_>,
        source: &str,
        ts: i128,
        value: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let ts = non_negative("ts", ts)?;
        if !self.inner.has_source(source) {
            return Err(unknown_source(source, &self.sources));
        }
        let t = self.inner.push(py_item(source, ts, value));
        value_tuples(py, t)
    }

    /// The clock reached `now`: windows that ended close.
    fn advance(&mut self, py: Python<'_>, now: i128) -> PyResult<Py<PyAny>> {
        let t = self.inner.advance(non_negative("now", now)?);
        value_tuples(py, t)
    }

    #[getter]
    fn waiting(&self) -> usize {
        self.inner.waiting()
    }
}

/// Target prediction frequency over any Python values: ticks at `first`,
/// `first + period`, ... with each source's last known item.
#[pyclass(module = "sluice._sluice")]
pub struct Ticker {
    inner: rate::Ticker<PyItem>,
    sources: Vec<String>,
}

#[pymethods]
impl Ticker {
    #[new]
    #[pyo3(signature = (sources, first, period, max_age = None, fail_soft = "last_known_good"))]
    fn new(
        sources: Vec<String>,
        first: i128,
        period: i128,
        max_age: Option<i128>,
        fail_soft: &str,
    ) -> PyResult<Self> {
        let names = sources_of(&sources)?;
        let (first, period) = (
            non_negative("first", first)?,
            non_negative("period", period)?,
        );
        if period == 0 {
            return Err(PyValueError::new_err(
                "the period must be more than zero (a tick every period from first)",
            ));
        }
        let max_age = opt_non_negative("max_age", max_age)?;
        Ok(Ticker {
            inner: rate::Ticker::new(
                &names,
                first,
                period,
                max_age.unwrap_or(u64::MAX),
                self::fail_soft(fail_soft)?,
            ),
            sources,
        })
    }

    #[pyo3(signature = (source, ts, value))]
    fn observe(&mut self, source: &str, ts: i128, value: Option<Py<PyAny>>) -> PyResult<()> {
        let ts = non_negative("ts", ts)?;
        if !self.inner.observe(py_item(source, ts, value)) {
            return Err(unknown_source(source, &self.sources));
        }
        Ok(())
    }

    /// Every tick due by `now`, as tuples.
    fn tick_until(&mut self, py: Python<'_>, now: i128) -> PyResult<Py<PyAny>> {
        let now = non_negative("now", now)?;
        let due = self.inner.due(now);
        if due > MAX_TICKS_AT_ONCE {
            return Err(PyValueError::new_err(format!(
                "tick_until({now}): {due} ticks due at once (at most {MAX_TICKS_AT_ONCE}): are `first` and `now` on the same clock, in the same unit?"
            )));
        }
        let t = self.inner.tick_until(now);
        value_tuples(py, t)
    }

    #[getter]
    fn used(&self) -> u64 {
        self.inner.used
    }

    #[getter]
    fn skipped(&self) -> u64 {
        self.inner.skipped
    }
}

/// Share of predictions `[(t, label)]` equal to the truth `[(t, label)]`
/// last known at their time (EdgeServe's real-time accuracy).
#[pyfunction]
pub fn realtime_accuracy(
    predictions: Vec<(u64, String)>,
    truth: Vec<(u64, String)>,
) -> Option<f64> {
    let mut truth = truth;
    truth.sort_by_key(|t| t.0);
    sluice_streams::metrics::realtime_accuracy(&predictions, &truth)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Header>()?;
    m.add_class::<StreamProducer>()?;
    m.add_class::<StreamSubscriber>()?;
    m.add_class::<RateConsumer>()?;
    m.add_class::<SharedQueue>()?;
    m.add_class::<Delivery>()?;
    m.add_class::<Aligner>()?;
    m.add_class::<Ticker>()?;
    m.add_function(wrap_pyfunction!(decode_tuple, m)?)?;
    m.add_function(wrap_pyfunction!(realtime_accuracy, m)?)?;
    Ok(())
}
