//! A user-defined lambda in its own crate.
//!
//! 1. Implement [`sluice_compute::Udl`]: `handle` gets the upcall (key,
//!    object, worker id), an `Emitter` to send results to the vertex's
//!    destinations, and a `Context` to read and write the local store.
//! 2. Register a factory under a name in a [`sluice_compute::Registry`]
//!    (start from `sluice_udls::registry()` to keep relay/log/notify/onnx).
//! 3. Build a node with that registry (`Server::bind_with`), as
//!    `src/main.rs` does, and name the UDL in a DFG:
//!    `"user_defined_logic_list": ["uppercase"]`.

use bytes::Bytes;
use serde_json::Value;
use sluice_compute::{Context, Emitter, Registry, Udl, UdlError, Upcall};
use std::sync::Arc;

/// Upper-cases UTF-8 text and emits it; config `{"suffix": "!"}` appends.
pub struct Uppercase {
    suffix: String,
}

impl Udl for Uppercase {
    fn handle(
        &self,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        _ctx: &Context,
    ) -> Result<(), UdlError> {
        let text = std::str::from_utf8(&call.object.value)
            .map_err(|_| UdlError::Failed(format!("{} is not UTF-8 text", call.key)))?;
        let out = format!("{}{}", text.to_uppercase(), self.suffix);
        emit.emit(call.key_suffix(), Bytes::from(out))
    }
}

/// The built-in UDLs plus `uppercase`.
pub fn registry() -> Registry {
    let mut r = sluice_udls::registry();
    r.register("uppercase", |config: &Value, _: &Context| {
        let suffix = match config.get("suffix") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => return Err(format!("suffix must be a string, got {other}")),
        };
        Ok(Arc::new(Uppercase { suffix }) as Arc<dyn Udl>)
    });
    r
}
