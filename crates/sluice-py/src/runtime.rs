//! The extension's tokio runtime, and the one place a Rust future meets
//! Python: awaited with the GIL released (blocking calls), or spawned and
//! its result queued for the asyncio event loop (`Completions`).

use crate::errors;
use parking_lot::Mutex;
use pyo3::prelude::*;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

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

/// Converts a Rust result to its Python value (with the GIL held).
pub type Convert<T> = fn(Python<'_>, T) -> PyResult<Py<PyAny>>;

/// A finished asynchronous call, waiting for the event loop to take it:
/// its asyncio future, and how to make its result (on the loop's thread).
type Done = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// Finished asynchronous calls of one client. The runtime's threads never
/// take the GIL: they queue what finished and, when the queue was empty,
/// signal an eventfd that the event loop watches (`loop.add_reader`); the
/// loop then takes everything queued at once (`Client._drain`), so a
/// burst of completions costs one wakeup, and the only thread that
/// touches Python objects is the loop's.
pub struct Completions {
    queue: Mutex<Vec<(Py<PyAny>, Done)>>,
    fd: OwnedFd,
}

impl Completions {
    pub fn new() -> std::io::Result<Completions> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Completions {
            queue: Mutex::new(Vec::new()),
            // SAFETY: a fresh descriptor owned here.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    fn push(&self, future: Py<PyAny>, done: Done) {
        let was_empty = {
            let mut q = self.queue.lock();
            q.push((future, done));
            q.len() == 1
        };
        if was_empty {
            let one: u64 = 1;
            // SAFETY: 8 bytes from a valid u64 to an eventfd.
            unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// Everything finished so far: `(future, ok, value)` for each (the
    /// value is the exception when not ok). Resets the eventfd.
    pub fn drain(&self, py: Python<'_>) -> PyResult<Vec<Finished>> {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a u64 from a non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        let items = std::mem::take(&mut *self.queue.lock());
        Ok(items
            .into_iter()
            .map(|(fut, done)| match done(py) {
                Ok(v) => (fut, true, v),
                Err(e) => (fut, false, e.into_value(py).into_any()),
            })
            .collect())
    }
}

/// A finished call as the event loop takes it: the future, whether it
/// succeeded, and its value (or exception).
pub type Finished = (Py<PyAny>, bool, Py<PyAny>);

/// How a call returns: blocking, or into an asyncio future.
pub enum Mode<'a> {
    Blocking,
    Async(&'a Arc<Completions>, Py<PyAny>),
}

impl<'a> Mode<'a> {
    pub fn of(completions: &'a Arc<Completions>, future: Option<Py<PyAny>>) -> Mode<'a> {
        match future {
            Some(f) => Mode::Async(completions, f),
            None => Mode::Blocking,
        }
    }
}

/// Runs `work`: blocking, to completion with the GIL released (other
/// Python threads run meanwhile), returning its value; asynchronously, on
/// the runtime, returning `None` at once, its result queued for the
/// event loop (see `Completions`).
pub fn run<T, F>(
    py: Python<'_>,
    mode: Mode<'_>,
    work: F,
    convert: Convert<T>,
) -> PyResult<Py<PyAny>>
where
    F: Future<Output = sluice_types::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    match mode {
        Mode::Blocking => match py.detach(|| rt().block_on(work)) {
            Ok(v) => convert(py, v),
            Err(e) => Err(errors::to_py(e)),
        },
        Mode::Async(completions, fut) => {
            let completions = completions.clone();
            rt().spawn(async move {
                let r = work.await;
                completions.push(
                    fut,
                    Box::new(move |py| r.map_err(errors::to_py).and_then(|v| convert(py, v))),
                );
            });
            Ok(py.None())
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
