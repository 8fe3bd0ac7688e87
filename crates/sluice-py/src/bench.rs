//! The Rust client measured from the same process and against the same
//! node as the Python client (`python -m sluice.bench`, run by `sluice
//! bench python`), so the two are compared in one run.

use pyo3::prelude::*;
use std::time::{Duration, Instant};

/// The Rust client's own runtime, as a Rust program would have it (a
/// worker per core, tokio's default), apart from the Python client's.
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("rust-bench")
            .enable_all()
            .build()
            .expect("the benchmark's runtime starts")
    })
}

/// Latencies (ns) of `n` sequential gets of `key` by the Rust client.
#[pyfunction]
pub fn _rust_get_latencies(
    py: Python<'_>,
    addr: String,
    key: String,
    n: usize,
) -> PyResult<Vec<u64>> {
    crate::runtime::detach(py, || {
        rt().block_on(async move {
            let c = sluice_client::Client::connect(&addr).await?;
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                let t0 = Instant::now();
                c.get(&key).await?;
                out.push(t0.elapsed().as_nanos() as u64);
            }
            Ok(out)
        })
    })
    .map_err(crate::errors::to_py)
}

/// Puts per second of `tasks` concurrent tasks of the Rust client, each
/// putting `size`-byte values for `seconds`.
#[pyfunction]
pub fn _rust_put_throughput(
    py: Python<'_>,
    addr: String,
    prefix: String,
    size: usize,
    tasks: usize,
    seconds: f64,
) -> PyResult<f64> {
    crate::runtime::detach(py, || {
        rt().block_on(async move {
            let c = sluice_client::Client::connect(&addr).await?;
            let value = bytes::Bytes::from(vec![7u8; size]);
            let t0 = Instant::now();
            let until = t0 + Duration::from_secs_f64(seconds);
            let mut handles = Vec::new();
            for t in 0..tasks {
                let (c, value, prefix) = (c.clone(), value.clone(), prefix.clone());
                handles.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < until {
                        c.put(&format!("{prefix}/{t}/{}", n % 64), value.clone())
                            .await?;
                        n += 1;
                    }
                    Ok::<u64, sluice_types::SluiceError>(n)
                }));
            }
            let mut total = 0;
            for h in handles {
                total += h.await.map_err(|e| sluice_types::SluiceError::Internal {
                    reason: e.to_string(),
                })??;
            }
            Ok(total as f64 / t0.elapsed().as_secs_f64())
        })
    })
    .map_err(crate::errors::to_py)
}
