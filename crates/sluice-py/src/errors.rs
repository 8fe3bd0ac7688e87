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

/// Declares one exception class per error kind. `class_of` matches every
/// variant with no wildcard: a new kind of error does not compile until
/// it has its class here.
macro_rules! kinds {
    ($($class:ident = $variant:ident: $doc:literal),* $(,)?) => {
        $(pyo3::create_exception!(sluice, $class, SluiceException, $doc);)*

        /// The class of an error.
        fn class_of<'py>(py: Python<'py>, e: &SluiceError) -> Bound<'py, pyo3::types::PyType> {
            match e {
                $(SluiceError::$variant { .. } => py.get_type::<$class>(),)*
            }
        }

        /// Adds every class to the module, and `_error_classes`: their
        /// names, for the tests.
        pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            m.add("SluiceError", py.get_type::<SluiceException>())?;
            $(m.add(stringify!($class), py.get_type::<$class>())?;)*
            m.add("_error_classes", vec![$(stringify!($class)),*])?;
            Ok(())
        }
    };
}

kinds! {
    InvalidKey = InvalidKey: "A key that is not a valid path.",
    NoPool = NoPool: "No object pool covers the key.",
    PoolDeleted = PoolDeleted: "The key's pool was removed.",
    PoolExists = PoolExists: "A pool already exists at that path.",
    PoolNotFound = PoolNotFound: "No pool at that path.",
    InvalidPool = InvalidPool: "A pool specification that cannot be created.",
    WrongPoolType = WrongPoolType: "The operation does not apply to this pool's type.",
    NotSupported = NotSupported: "The node does not support the operation.",
    Forbidden = Forbidden: "The operation is not allowed on this connection.",
    NotFound = NotFound: "No such key (or version).",
    Unauthenticated = Unauthenticated: "The node requires a principal (a token or client certificate) and got none that is valid.",
    PermissionDenied = PermissionDenied: "The principal lacks the permission the operation needs on the pool.",
    RateLimited = RateLimited: "The principal is over a rate limit; retry after details['retry_after_ms'].",
    VersionNotRetained = VersionNotRetained: "The version was dropped by the pool's retention.",
    PayloadExpired = PayloadExpired: "A stream item's payload was dropped by the recording node's retention.",
    VersionConflict = VersionConflict: "A conditional write found another version.",
    ValueTooLarge = ValueTooLarge: "The value exceeds the node's limit.",
    OutOfMemory = OutOfMemory: "The node is at its memory limit: writes that store a value are refused, reads and removes go on.",
    MetaTooLarge = MetaTooLarge: "The request's metadata exceeds the node's limit.",
    TooManyKeys = TooManyKeys: "Too many keys in one request.",
    TooManyInFlight = TooManyInFlight: "Too many requests in flight on one connection.",
    TooManyConnections = TooManyConnections: "The node has no room for another connection.",
    TooManyWatches = TooManyWatches: "The connection has no room for another watch.",
    WrongShard = WrongShard: "The request was routed to the wrong shard.",
    UnknownShard = UnknownShard: "The layout has no such shard.",
    NotLeader = NotLeader: "The member is not the shard's leader.",
    NotMember = NotMember: "The node is not a member of the shard.",
    ReplicaBehind = ReplicaBehind: "The member has not applied what this session has seen.",
    InvalidDfg = InvalidDfg: "A data flow graph that cannot be applied.",
    Protocol = Protocol: "The peer broke the protocol.",
    InvalidArgument = InvalidArgument: "An argument out of range or malformed.",
    DfgNotFound = DfgNotFound: "No data flow graph with that id.",
    Timeout = Timeout: "The request did not finish in time.",
    ConnectionError = Connection: "The node cannot be reached.",
    Unavailable = Unavailable: "The shard cannot serve now (no leader, no majority).",
    IoError = Io: "The node failed to read or write its disk.",
    Internal = Internal: "A bug in Sluice: please report it.",
}

/// The Python exception for a Sluice error.
pub fn to_py(e: SluiceError) -> PyErr {
    Python::attach(|py| exception(py, &e))
}

fn exception(py: Python<'_>, e: &SluiceError) -> PyErr {
    let fields = serde_json::to_value(e).unwrap_or_default();
    let wire = fields["error"].as_str().unwrap_or("internal").to_string();
    let class = class_of(py, e);
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
