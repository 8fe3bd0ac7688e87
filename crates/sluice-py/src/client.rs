//! `sluice._sluice.Client`: the Rust client (`sluice_client::Client`)
//! for Python. Every method blocks with the GIL released, or, given an
//! asyncio `future` (what `sluice.AsyncClient` passes), returns at once
//! and completes the future on its loop.

use crate::runtime::{json_to_py, run, Exec};
use crate::value::{bytes_of, Object, PutResult};
use crate::watch::Watch;
use pyo3::prelude::*;
use pyo3::types::PyList;
use sluice_client::{ClientConfig, PoolMeta, PoolSpec, PoolType, Retention, SluiceError};
use std::time::Duration;

/// A connection to a Sluice node or cluster (see `sluice.Client`).
#[pyclass(module = "sluice._sluice", frozen)]
pub struct Client {
    inner: sluice_client::Client,
    exec: Exec,
}

impl Client {
    /// The Rust client (shares its connections); refused in a process
    /// forked after the client was made (`runtime::check_process`).
    pub(crate) fn rust(&self) -> PyResult<sluice_client::Client> {
        self.exec.check_process()?;
        Ok(self.inner.clone())
    }

    /// The process (fork generation) the client was made in.
    pub(crate) fn made_in(&self) -> u64 {
        self.exec.made_in()
    }
}

fn object(py: Python<'_>, o: sluice_types::Object) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, Object::new(py, o)?)?.into_any())
}

fn put_result(py: Python<'_>, r: sluice_types::PutResult) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, PutResult::from(r))?.into_any())
}

fn none(py: Python<'_>, _: ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

fn int(py: Python<'_>, n: u64) -> PyResult<Py<PyAny>> {
    Ok(n.into_pyobject(py)?.into_any().unbind())
}

fn strings(py: Python<'_>, v: Vec<String>) -> PyResult<Py<PyAny>> {
    Ok(PyList::new(py, v)?.into_any().unbind())
}

fn json(py: Python<'_>, v: serde_json::Value) -> PyResult<Py<PyAny>> {
    json_to_py(py, &v)
}

fn serialized<T: serde::Serialize>(v: T) -> sluice_types::Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| SluiceError::Internal {
        reason: e.to_string(),
    })
}

/// Microseconds from seconds given by Python (a float).
fn micros(s: f64) -> PyResult<u64> {
    if !(s.is_finite() && s >= 0.0) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "a duration must be a non-negative number of seconds, not {s}"
        )));
    }
    Ok((s * 1e6) as u64)
}

impl Client {
    /// Runs `f` on a handle to the Rust client, blocking or into an
    /// asyncio future (see `runtime::run`).
    fn call<T, F, Fut>(
        &self,
        py: Python<'_>,
        future: Option<Py<PyAny>>,
        f: F,
        convert: crate::runtime::Convert<T>,
    ) -> PyResult<Py<PyAny>>
    where
        F: FnOnce(sluice_client::Client) -> Fut,
        Fut: std::future::Future<Output = sluice_types::Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        run(py, &self.exec, future, f(self.inner.clone()), convert)
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (addr, *, timeout_s = 10.0, connect_timeout_s = 3.0, connections = 1, name = "sluice-python".to_string(), tls_ca = None, tls_cert = None, tls_key = None, token = None, value_part_bytes = None, driven = false))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        addr: String,
        timeout_s: f64,
        connect_timeout_s: f64,
        connections: usize,
        name: String,
        tls_ca: Option<std::path::PathBuf>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        token: Option<String>,
        value_part_bytes: Option<usize>,
        driven: bool,
    ) -> PyResult<Client> {
        let tls = sluice_tls::ClientTls::from_files(
            tls_ca.as_deref(),
            tls_cert.as_deref(),
            tls_key.as_deref(),
            ["tls_ca", "tls_cert", "tls_key"],
        )
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let request_timeout = Duration::from_micros(micros(timeout_s)?);
        let connect_timeout = Duration::from_micros(micros(connect_timeout_s)?);
        // The soonest any timer of a call comes due: a request, one
        // attempt of it, or a reconnect.
        let shortest = request_timeout
            .min(connect_timeout)
            .min(ClientConfig::default().attempt_timeout);
        let exec = Exec::new(driven, shortest).map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!("creating the client's eventfd: {e}"))
        })?;
        let cfg = ClientConfig {
            tls,
            token,
            value_part_bytes,
            addr,
            connections: connections.max(1),
            connect_timeout,
            request_timeout,
            client_name: name,
            // The event loop's runtime starts a pass's calls together.
            coalesce_writes: exec.fd().1,
            ..ClientConfig::default()
        };
        let inner = crate::runtime::detach(py, || {
            exec.block_on(sluice_client::Client::connect_with(cfg))
        })
        .map_err(crate::errors::to_py)?;
        Ok(Client { inner, exec })
    }

    // Positional as well as keyword arguments: `AsyncClient.put`, the hot
    // path, passes them by position (no keyword parsing).
    #[pyo3(signature = (key, value, previous_version = None, future = None))]
    fn put(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        previous_version: Option<u64>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let v = bytes_of(value)?;
        self.call(
            py,
            future,
            move |c| async move {
                match previous_version {
                    Some(e) => c.put_if_version(&key, v, e).await,
                    None => c.put(&key, v).await,
                }
            },
            put_result,
        )
    }

    #[pyo3(signature = (key, value, *, future = None))]
    fn put_and_forget(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let v = bytes_of(value)?;
        self.call(
            py,
            future,
            move |c| async move { c.put_and_forget(&key, v).await },
            none,
        )
    }

    #[pyo3(signature = (key, value, *, trace_id = None, future = None))]
    fn trigger_put(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        trace_id: Option<u64>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let v = bytes_of(value)?;
        self.call(
            py,
            future,
            move |c| async move {
                match trace_id {
                    Some(id) => c.trigger_put_traced(&key, v, id).await,
                    None => c.trigger_put(&key, v).await,
                }
            },
            int,
        )
    }

    #[pyo3(signature = (key, *, previous_version = None, future = None))]
    fn remove(
        &self,
        py: Python<'_>,
        key: String,
        previous_version: Option<u64>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move {
                match previous_version {
                    Some(e) => c.remove_if_version(&key, e).await,
                    None => c.remove(&key).await,
                }
            },
            put_result,
        )
    }

    #[pyo3(signature = (key, *, version = None, timestamp_us = None, stable = true, linearizable = false, future = None))]
    #[allow(clippy::too_many_arguments)]
    fn get(
        &self,
        py: Python<'_>,
        key: String,
        version: Option<u64>,
        timestamp_us: Option<u64>,
        stable: bool,
        linearizable: bool,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        one_selector(version, timestamp_us)?;
        if linearizable && (version.is_some() || timestamp_us.is_some()) {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "linearizable applies to a read of the latest version, not to one by version or timestamp",
            ));
        }
        self.call(
            py,
            future,
            move |c| async move {
                match (version, timestamp_us) {
                    (Some(v), _) => c.get_version(&key, v).await,
                    (None, Some(t)) if stable => c.get_by_time(&key, t).await,
                    (None, Some(t)) => c.get_by_time_with(&key, t, 0, true).await,
                    (None, None) if linearizable => c.get_linearizable(&key).await,
                    (None, None) => c.get(&key).await,
                }
            },
            object,
        )
    }

    #[pyo3(signature = (key, *, version = None, timestamp_us = None, future = None))]
    fn get_size(
        &self,
        py: Python<'_>,
        key: String,
        version: Option<u64>,
        timestamp_us: Option<u64>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        one_selector(version, timestamp_us)?;
        self.call(
            py,
            future,
            move |c| async move { c.get_size(&key, version, timestamp_us).await },
            int,
        )
    }

    /// Several keys at once: a list with an `Object` per key, `None` for
    /// a key that does not exist; any other error is raised.
    #[pyo3(signature = (keys, *, future = None))]
    fn multi_get(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                c.multi_get(&refs)
                    .await?
                    .into_iter()
                    .map(|r| match r {
                        Ok(o) => Ok(Some(o)),
                        Err(SluiceError::NotFound { .. }) => Ok(None),
                        Err(e) => Err(e),
                    })
                    .collect::<Result<Vec<_>, _>>()
            },
            |py, objects| {
                let l = PyList::empty(py);
                for o in objects {
                    match o {
                        Some(o) => l.append(object(py, o)?)?,
                        None => l.append(py.None())?,
                    }
                }
                Ok(l.into_any().unbind())
            },
        )
    }

    #[pyo3(signature = (pool, *, prefix = None, version = None, timestamp_us = None, future = None))]
    fn list_keys(
        &self,
        py: Python<'_>,
        pool: String,
        prefix: Option<String>,
        version: Option<u64>,
        timestamp_us: Option<u64>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move {
                let prefix = prefix.as_deref();
                match (version, timestamp_us) {
                    (Some(v), _) => c.list_keys_at(&pool, prefix, false, v).await,
                    (None, Some(t)) => c.list_keys_at(&pool, prefix, true, t).await,
                    (None, None) => c.list_keys(&pool, prefix).await,
                }
            },
            strings,
        )
    }

    /// The versions of `key` from `start` to `end` (versions, or µs
    /// timestamps with `by_time`), newest first, removals included.
    #[pyo3(signature = (key, *, start = 0, end = u64::MAX, by_time = false, future = None))]
    fn history(
        &self,
        py: Python<'_>,
        key: String,
        start: u64,
        end: u64,
        by_time: bool,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move { c.history(&key, by_time, start, end, 256).await },
            |py, objects| {
                let l = PyList::empty(py);
                for o in objects {
                    l.append(object(py, o)?)?;
                }
                Ok(l.into_any().unbind())
            },
        )
    }

    #[pyo3(signature = (pathname, pool_type = "volatile".to_string(), *, subgroup_index = 0, affinity_set_regex = None, keep_versions = None, keep_for_s = None, keep_bytes = None, future = None))]
    #[allow(clippy::too_many_arguments)]
    fn create_object_pool(
        &self,
        py: Python<'_>,
        pathname: String,
        pool_type: String,
        subgroup_index: u32,
        affinity_set_regex: Option<String>,
        keep_versions: Option<u32>,
        keep_for_s: Option<u64>,
        keep_bytes: Option<u64>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let pool_type = PoolType::parse_for(&pathname, &pool_type).map_err(crate::errors::to_py)?;
        let spec = PoolSpec {
            pathname,
            pool_type: Some(pool_type),
            subgroup_index,
            affinity_set_regex,
            retention: Retention::of(keep_versions, keep_for_s, keep_bytes),
            ..Default::default()
        };
        self.call(
            py,
            future,
            move |c| async move { Ok(c.create_pool(spec).await?.to_json()) },
            json,
        )
    }

    #[pyo3(signature = (include_deleted = false, *, future = None))]
    fn list_object_pools(
        &self,
        py: Python<'_>,
        include_deleted: bool,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move {
                Ok(c.list_pools(include_deleted)
                    .await?
                    .iter()
                    .map(PoolMeta::to_json)
                    .collect())
            },
            json,
        )
    }

    #[pyo3(signature = (pathname, *, future = None))]
    fn get_object_pool(
        &self,
        py: Python<'_>,
        pathname: String,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move { Ok(c.get_pool(&pathname).await?.to_json()) },
            json,
        )
    }

    #[pyo3(signature = (pathname, *, future = None))]
    fn remove_object_pool(
        &self,
        py: Python<'_>,
        pathname: String,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move { Ok(c.remove_pool(&pathname).await?.to_json()) },
            json,
        )
    }

    #[pyo3(signature = (pathname, *, future = None))]
    fn purge_object_pool(
        &self,
        py: Python<'_>,
        pathname: String,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move { serialized(c.purge_pool(&pathname).await?) },
            json,
        )
    }

    /// A subscription to notifications for keys under `prefix` (from a
    /// stored version or time onwards when given).
    #[pyo3(signature = (prefix, *, from_version = None, from_time_us = None, future = None))]
    fn watch(
        &self,
        py: Python<'_>,
        prefix: String,
        from_version: Option<u64>,
        from_time_us: Option<u64>,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        if from_version.is_some() && from_time_us.is_some() {
            // As the CLI's --from-version and --from-time refuse each
            // other: the time was ignored.
            return Err(pyo3::exceptions::PyValueError::new_err(
                "give from_version or from_time_us, not both",
            ));
        }
        let c = self.inner.clone();
        let exec = self.exec.clone();
        let from = from_version
            .map(sluice_client::WatchFrom::Version)
            .or(from_time_us.map(sluice_client::WatchFrom::Time));
        let work = async move {
            let w = match from {
                Some(f) => c.watch_from(&prefix, f).await?,
                None => c.watch(&prefix).await?,
            };
            Ok((w, exec))
        };
        run(py, &self.exec, future, work, |py, (w, exec)| {
            Ok(Py::new(py, Watch::new(w, exec))?.into_any())
        })
    }

    /// The round trip to the home node, in seconds.
    #[pyo3(signature = (*, future = None))]
    fn ping(&self, py: Python<'_>, future: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move { c.ping().await },
            |py, d| Ok(d.as_secs_f64().into_pyobject(py)?.into_any().unbind()),
        )
    }

    /// Sends the latest version of `key` to many nodes of the cluster
    /// (`to`: node ids, default every other node), pipelined along
    /// `fanout` chains ordered by topology; the report as a dict.
    #[pyo3(signature = (key, to = None, fanout = 1, *, future = None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        key: String,
        to: Option<Vec<u32>>,
        fanout: usize,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move { c.broadcast(&key, to.as_deref(), fanout).await },
            json,
        )
    }

    /// A policy command (JSON text, `{"op": ...}`; see `sluice policy`).
    #[pyo3(signature = (command, *, future = None))]
    fn policy(
        &self,
        py: Python<'_>,
        command: String,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let cmd: serde_json::Value = serde_json::from_str(&command)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("policy command: {e}")))?;
        self.call(
            py,
            future,
            move |c| async move { c.policy(cmd).await },
            json,
        )
    }

    /// Applies data flow graphs (a `dfgs.json` document).
    #[pyo3(signature = (text, *, future = None))]
    fn dfg_apply(
        &self,
        py: Python<'_>,
        text: String,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move { c.dfg_apply(&text).await },
            json,
        )
    }

    #[pyo3(signature = (*, future = None))]
    fn dfg_list(&self, py: Python<'_>, future: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        self.call(py, future, move |c| async move { c.dfg_list().await }, json)
    }

    #[pyo3(signature = (id, *, future = None))]
    fn dfg_remove(
        &self,
        py: Python<'_>,
        id: String,
        future: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(
            py,
            future,
            move |c| async move { c.dfg_remove(&id).await },
            none,
        )
    }

    /// The node's counters.
    #[pyo3(signature = (*, future = None))]
    fn stats(&self, py: Python<'_>, future: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        self.call(py, future, move |c| async move { c.stats().await }, json)
    }

    /// The descriptor the event loop watches, and whether the client is
    /// driven: its runtime's epoll descriptor (readable: call `_turn`), or
    /// the eventfd readable when asynchronous calls finished (call
    /// `_drain`).
    fn _completion_fd(&self) -> (i32, bool) {
        self.exec.fd()
    }

    /// Closes an asyncio client (`runtime::Exec::close`): its calls in
    /// flight end with `ConnectionError`, their futures completed now
    /// unless `resolve` is false (the event loop is closed); later
    /// asynchronous calls are refused.
    fn _close(&self, py: Python<'_>, resolve: bool) {
        self.exec.close(py, resolve)
    }

    /// Completes the asyncio futures of the calls finished so far.
    fn _drain(&self, py: Python<'_>) {
        self.exec.drain(py)
    }

    /// Turns a driven client's runtime and completes the futures of what
    /// finished (see `runtime::Exec::turn`): how many calls are still
    /// running, and whether to turn again at once.
    fn _turn(&self, py: Python<'_>) -> (usize, bool) {
        self.exec.turn(py)
    }

    /// The home node's id, and the cluster's metadata epoch (`None`:
    /// standalone).
    #[getter]
    fn node_id(&self) -> u32 {
        self.inner.server_info().node_id
    }

    #[getter]
    fn cluster_epoch(&self) -> Option<u64> {
        self.inner.cluster_epoch()
    }

    /// The largest value the node accepts, in bytes.
    #[getter]
    fn max_value_bytes(&self) -> u32 {
        self.inner.server_info().limits.max_value_bytes
    }
}

/// A read names a version or a time, not both (as the CLI's `--version`
/// and `--at` refuse each other): one of them would be ignored.
fn one_selector(version: Option<u64>, timestamp_us: Option<u64>) -> PyResult<()> {
    if version.is_some() && timestamp_us.is_some() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "give version or timestamp, not both",
        ));
    }
    Ok(())
}
