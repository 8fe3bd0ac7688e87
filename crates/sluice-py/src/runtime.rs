//! The extension's tokio runtime, and the one place a Rust future meets
//! Python: awaited with the GIL released (blocking calls), or spawned and
//! its result handed to an asyncio future on that future's event loop.

use crate::errors;
use pyo3::prelude::*;
use std::future::Future;
use std::sync::OnceLock;

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
/// `sluice._resolve(future, ok, value)`: sets an asyncio future's result
/// or exception unless it was cancelled (set by the package at import).
static RESOLVER: OnceLock<Py<PyAny>> = OnceLock::new();

pub fn rt() -> &'static tokio::runtime::Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-io")
            .enable_all()
            .build()
            .expect("the Sluice client's runtime starts")
    })
}

/// Registers the function that completes asyncio futures.
#[pyfunction]
pub fn _set_resolver(f: Py<PyAny>) {
    let _ = RESOLVER.set(f);
}

/// Converts a Rust result to its Python value (with the GIL held).
pub type Convert<T> = fn(Python<'_>, T) -> PyResult<Py<PyAny>>;

/// Runs `work`: with `future` absent, to completion with the GIL released
/// (other Python threads run meanwhile) and returns its value; with an
/// asyncio `future`, on the runtime, returning `None` at once and
/// completing the future on its loop when done.
pub fn run<T, F>(
    py: Python<'_>,
    future: Option<Py<PyAny>>,
    work: F,
    convert: Convert<T>,
) -> PyResult<Py<PyAny>>
where
    F: Future<Output = sluice_types::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    match future {
        None => match py.detach(|| rt().block_on(work)) {
            Ok(v) => convert(py, v),
            Err(e) => Err(errors::to_py(e)),
        },
        Some(fut) => {
            rt().spawn(async move {
                let r = work.await;
                Python::attach(|py| {
                    let outcome = r.map_err(errors::to_py).and_then(|v| convert(py, v));
                    resolve(py, fut, outcome);
                });
            });
            Ok(py.None())
        }
    }
}

/// Completes an asyncio future from any thread, on its own loop.
fn resolve(py: Python<'_>, fut: Py<PyAny>, outcome: PyResult<Py<PyAny>>) {
    let Some(resolver) = RESOLVER.get() else {
        return;
    };
    let (ok, value) = match outcome {
        Ok(v) => (true, v),
        Err(e) => (false, e.into_value(py).into_any()),
    };
    let fut = fut.bind(py);
    let done = fut
        .call_method0("get_loop")
        .and_then(|lp| lp.call_method1("call_soon_threadsafe", (resolver, fut, ok, value)));
    // A closed loop: nobody waits for the answer any more.
    if let Err(e) = done {
        if !e.is_instance_of::<pyo3::exceptions::PyRuntimeError>(py) {
            e.print(py);
        }
    }
}

/// A JSON value as Python objects (dicts, lists, str, int, float, bool,
/// None).
pub fn json_to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    use pyo3::types::{PyDict, PyList};
    Ok(match v {
        serde_json::Value::Null => py.None(),
        serde_json::Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any().unbind(),
            (None, Some(i), _) => i.into_pyobject(py)?.into_any().unbind(),
            (_, _, f) => f.unwrap_or(f64::NAN).into_pyobject(py)?.into_any().unbind(),
        },
        serde_json::Value::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        serde_json::Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(json_to_py(py, x)?)?;
            }
            l.into_any().unbind()
        }
        serde_json::Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any().unbind()
        }
    })
}
