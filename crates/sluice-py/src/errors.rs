//! Sluice's typed errors as Python exception classes: `sluice.SluiceError`
//! and one subclass per kind (`sluice.NotFound`, `sluice.VersionConflict`,
//! ...), each raised with the message the CLI prints, its kind
//! (`e.kind`, as on the wire) and its fields (`e.details`, a dict).

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_types::SluiceError;

pyo3::create_exception!(
    sluice,
    SluiceException,
    PyException,
    "Base class of every error Sluice raises."
);

/// Declares one exception class per error kind, with the kind's wire name.
macro_rules! kinds {
    ($($class:ident = $wire:literal: $doc:literal),* $(,)?) => {
        $(pyo3::create_exception!(sluice, $class, SluiceException, $doc);)*

        /// The class of an error kind (by its wire name).
        fn class_of<'py>(py: Python<'py>, wire: &str) -> Bound<'py, pyo3::types::PyType> {
            match wire {
                $($wire => py.get_type::<$class>(),)*
                _ => py.get_type::<SluiceException>(),
            }
        }

        /// Adds every class to the module.
        pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            m.add("SluiceError", py.get_type::<SluiceException>())?;
            $(m.add(stringify!($class), py.get_type::<$class>())?;)*
            Ok(())
        }
    };
}

kinds! {
    InvalidKey = "invalid_key": "A key that is not a valid path.",
    NoPool = "no_pool": "No object pool covers the key.",
    PoolDeleted = "pool_deleted": "The key's pool was removed.",
    PoolExists = "pool_exists": "A pool already exists at that path.",
    PoolNotFound = "pool_not_found": "No pool at that path.",
    InvalidPool = "invalid_pool": "A pool specification that cannot be created.",
    WrongPoolType = "wrong_pool_type": "The operation does not apply to this pool's type.",
    NotSupported = "not_supported": "The node does not support the operation.",
    Forbidden = "forbidden": "The operation is not allowed on this connection.",
    NotFound = "not_found": "No such key (or version).",
    VersionNotRetained = "version_not_retained": "The version was dropped by the pool's retention.",
    VersionConflict = "version_conflict": "A conditional write found another version.",
    ValueTooLarge = "value_too_large": "The value exceeds the node's limit.",
    MetaTooLarge = "meta_too_large": "The request's metadata exceeds the node's limit.",
    TooManyKeys = "too_many_keys": "Too many keys in one request.",
    TooManyInFlight = "too_many_in_flight": "Too many requests in flight on one connection.",
    TooManyConnections = "too_many_connections": "The node has no room for another connection.",
    TooManyWatches = "too_many_watches": "The connection has no room for another watch.",
    WrongShard = "wrong_shard": "The request was routed to the wrong shard.",
    UnknownShard = "unknown_shard": "The layout has no such shard.",
    NotLeader = "not_leader": "The member is not the shard's leader.",
    NotMember = "not_member": "The node is not a member of the shard.",
    ReplicaBehind = "replica_behind": "The member has not applied what this session has seen.",
    InvalidDfg = "invalid_dfg": "A data flow graph that cannot be applied.",
    Protocol = "protocol": "The peer broke the protocol.",
    InvalidArgument = "invalid_argument": "An argument out of range or malformed.",
    DfgNotFound = "dfg_not_found": "No data flow graph with that id.",
    Timeout = "timeout": "The request did not finish in time.",
    ConnectionError = "connection": "The node cannot be reached.",
    Unavailable = "unavailable": "The shard cannot serve now (no leader, no majority).",
    IoError = "io": "The node failed to read or write its disk.",
    Internal = "internal": "A bug in Sluice: please report it.",
}

/// The Python exception for a Sluice error.
pub fn to_py(e: SluiceError) -> PyErr {
    Python::attach(|py| exception(py, &e))
}

fn exception(py: Python<'_>, e: &SluiceError) -> PyErr {
    let fields = serde_json::to_value(e).unwrap_or_default();
    let wire = fields["error"].as_str().unwrap_or("internal").to_string();
    let class = class_of(py, &wire);
    let err = match class.call1((e.to_string(),)) {
        Ok(v) => v,
        Err(err) => return err,
    };
    let details = PyDict::new(py);
    if let Some(map) = fields.as_object() {
        for (k, v) in map.iter().filter(|(k, _)| *k != "error") {
            let _ = match v {
                serde_json::Value::String(s) => details.set_item(k, s),
                serde_json::Value::Number(n) => match n.as_u64() {
                    Some(u) => details.set_item(k, u),
                    None => details.set_item(k, n.to_string()),
                },
                serde_json::Value::Null => details.set_item(k, py.None()),
                other => details.set_item(k, other.to_string()),
            };
        }
    }
    let _ = err.setattr("kind", wire);
    let _ = err.setattr("details", details);
    PyErr::from_value(err)
}
