//! `sluice._sluice`: the native part of Sluice's Python package (`import
//! sluice`), over the Rust client: no second wire implementation. The
//! Python layer (`python/sluice/__init__.py`) adds the blocking and
//! asyncio clients' Pythonic API on top.
//!
//! Modules: `runtime` (the tokio runtime; running a Rust future for a
//! blocking call or an asyncio future), `errors` (exception classes),
//! `value` (`Value`: zero-copy buffers; `Object`, `PutResult`), `client`
//! (`Client`), `watch` (`Watch`, `Notification`), `streams` (stream producers,
//! subscribers, the rate consumer, shared queues, operators), `bench` (the Rust client measured
//! beside the Python one, on a runtime of its own).

use pyo3::prelude::*;

mod bench;
mod client;
mod errors;
mod runtime;
mod streams;
mod value;
mod watch;

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    runtime::watch_forks();
    m.add_class::<client::Client>()?;
    m.add_class::<value::Value>()?;
    m.add_class::<value::Object>()?;
    m.add_class::<value::PutResult>()?;
    m.add_class::<watch::Watch>()?;
    m.add_class::<watch::Notification>()?;
    m.add_function(wrap_pyfunction!(bench::_rust_get_latencies, m)?)?;
    m.add_function(wrap_pyfunction!(bench::_rust_put_throughput, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::_closed_error, m)?)?;
    streams::register(m)?;
    errors::register(m)?;
    m.add("NO_VERSION", sluice_types::VERSION_NONE)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
