//! Watches: a subscription's notifications, one at a time (blocking with
//! the GIL released, waking for Ctrl-C), or into an asyncio future.

use crate::runtime::{json_to_py, run, Exec};
use crate::value::Object;
use pyo3::prelude::*;
use sluice_client::NotificationKind;
use std::sync::Arc;
use std::time::Duration;

/// One notification: what happened (`kind`: `put`, `trigger_put`,
/// `remove`, `notify`, or `lagged`), and the object. A `lagged`
/// notification reports a loss: `dropped` notifications, and where and
/// which versions in `lost`.
#[pyclass(module = "sluice", frozen, get_all)]
pub struct Notification {
    pub kind: String,
    pub object: Py<Object>,
    /// `lagged` only: how many notifications were lost.
    pub dropped: Option<u64>,
    /// `lagged` only: where they were lost, and which versions.
    pub lost: Option<Py<PyAny>>,
}

#[pymethods]
impl Notification {
    #[new]
    #[pyo3(signature = (kind, object, dropped = None, lost = None))]
    fn py_new(
        kind: String,
        object: Py<Object>,
        dropped: Option<u64>,
        lost: Option<Py<PyAny>>,
    ) -> Notification {
        Notification {
            kind,
            object,
            dropped,
            lost,
        }
    }

    /// Pickles with its object (see `Object`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let n = slf.get();
        let args = (
            n.kind.clone(),
            n.object.clone_ref(py),
            n.dropped,
            n.lost.as_ref().map(|l| l.clone_ref(py)),
        );
        crate::value::reduce(slf, args)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let o = self.object.bind(py).get();
        format!(
            "Notification(kind={:?}, key={:?}, version={})",
            self.kind, o.key, o.version
        )
    }

    /// Shortcuts to the object's fields.
    #[getter]
    fn key(&self, py: Python<'_>) -> String {
        self.object.bind(py).get().key.clone()
    }

    #[getter]
    fn value(&self, py: Python<'_>) -> Py<crate::value::Value> {
        self.object.bind(py).get().value.clone_ref(py)
    }

    #[getter]
    fn version(&self, py: Python<'_>) -> u64 {
        self.object.bind(py).get().version
    }
}

fn notification(py: Python<'_>, n: Option<sluice_client::Notification>) -> PyResult<Py<PyAny>> {
    let Some(n) = n else {
        return Ok(py.None());
    };
    let kind = serde_json::to_value(n.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    let (dropped, lost) = if n.kind == NotificationKind::Lagged {
        let lost: serde_json::Value =
            serde_json::from_slice(&n.object.value).unwrap_or(serde_json::Value::Null);
        (Some(n.object.meta.version), Some(json_to_py(py, &lost)?))
    } else {
        (None, None)
    };
    let object = Py::new(py, Object::new(py, n.object)?)?;
    Ok(Py::new(
        py,
        Notification {
            kind,
            object,
            dropped,
            lost,
        },
    )?
    .into_any())
}

/// A subscription (see `sluice.Client.watch`). Closing it (or dropping
/// it) ends the subscription on the node.
#[pyclass(module = "sluice._sluice", frozen)]
pub struct Watch {
    inner: Arc<tokio::sync::Mutex<Option<sluice_client::Watch>>>,
    exec: Exec,
    /// Set by `close`: a `next` waiting in the runtime (holding `inner`)
    /// ends with `None` instead of keeping `close` waiting for the lock
    /// until a notification comes, which may be never.
    closing: tokio::sync::watch::Sender<bool>,
}

impl Watch {
    pub fn new(w: sluice_client::Watch, exec: Exec) -> Watch {
        Watch {
            inner: Arc::new(tokio::sync::Mutex::new(Some(w))),
            exec,
            closing: tokio::sync::watch::Sender::new(false),
        }
    }
}

async fn next(
    inner: Arc<tokio::sync::Mutex<Option<sluice_client::Watch>>>,
    wait: Option<Duration>,
    mut closing: tokio::sync::watch::Receiver<bool>,
) -> sluice_types::Result<Option<sluice_client::Notification>> {
    let mut g = inner.lock().await;
    let Some(w) = g.as_mut() else {
        return Ok(None);
    };
    if *closing.borrow_and_update() {
        return Ok(None);
    }
    let n = tokio::select! {
        n = async {
            match wait {
                None => Some(w.next().await),
                Some(t) => tokio::time::timeout(t, w.next()).await.ok(),
            }
        } => match n {
            Some(n) => n,
            None => return Ok(None), // nothing came in time
        },
        _ = closing.changed() => return Ok(None),
    };
    ended(w, n)
}

/// A notification, or `None` for a watch that ended because it was
/// closed; one whose connection was lost is an error saying so (it was
/// `None` too, as if closed, or as if nothing had come).
fn ended(
    w: &sluice_client::Watch,
    n: Option<sluice_client::Notification>,
) -> sluice_types::Result<Option<sluice_client::Notification>> {
    match (n, w.lost()) {
        (None, Some(e)) => Err(e),
        (n, _) => Ok(n),
    }
}

#[pymethods]
impl Watch {
    /// The next notification; `None` when the subscription was closed, or
    /// when `timeout_s` passed first; `ConnectionError` when its
    /// connection was lost (the node died).
    #[pyo3(signature = (timeout_s = None, *, future = None))]
    fn next(
        &self,
        py: Python<'_>,
        timeout_s: Option<f64>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.exec.check_process()?;
        // At most zero: no wait; NaN, too.
        let wait = timeout_s.map(|s| crate::runtime::seconds(s.max(0.0)).unwrap_or_default());
        if future.is_some() {
            return run(
                py,
                &self.exec,
                future,
                next(self.inner.clone(), wait, self.closing.subscribe()),
                notification,
            );
        }
        // Blocking: woken every SIGNAL_CHECK for signals (Ctrl-C), the
        // wait going on across the slices; a close() ends it at once.
        let n = crate::runtime::block_checking_signals(
            py,
            Some(&self.exec),
            next(self.inner.clone(), wait, self.closing.subscribe()),
        )?;
        notification(py, n.map_err(crate::errors::to_py)?)
    }

    /// Ends the subscription on the node (blocking, or into an asyncio
    /// future).
    #[pyo3(signature = (*, future = None))]
    fn close(&self, py: Python<'_>, future: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        self.closing.send_replace(true);
        let inner = self.inner.clone();
        let work = async move {
            let w = inner.lock().await.take();
            match w {
                Some(w) => w.cancel().await,
                None => Ok(()),
            }
        };
        run(py, &self.exec, future, work, |py, ()| Ok(py.None()))
    }
}
