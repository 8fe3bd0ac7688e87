//! Blocking work from async code: the one helper the state machine, the
//! log and the server's connections use.

/// Runs a call that may block (on the disk, or loading a model) from
/// async code. On a multi-threaded runtime the worker hands its other
/// tasks to a new worker meanwhile; a current-thread runtime (an
/// embedding application's choice) cannot, so the call just runs.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
