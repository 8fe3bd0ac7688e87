//! Sluice's built-in lambdas (UDLs): `relay`, `log`, `notify`, `onnx`,
//! `stream_aggregate`, `stream_rate` (EdgeServe's operators over a
//! topic's headers) and `shared_queue` (feeds a shared queue), and `python` (Python classes in worker processes over
//! shared memory).
//!
//! A node's registry starts from [`registry`]; add your own UDLs to it
//! (see `examples/custom-udl`). This crate is where tract (ONNX inference)
//! enters the build, so the engine itself stays light.

pub mod npy;
#[cfg(feature = "onnx")]
pub mod onnx;
pub mod python;
pub mod streams;

use serde_json::Value;
use sluice_compute::udl::join_key;
use sluice_compute::{Context, Emitter, Registry, Udl, UdlError, Upcall};
use std::sync::Arc;

/// A registry with every built-in UDL.
pub fn registry() -> Registry {
    let mut r = Registry::default();
    register_all(&mut r);
    r
}

/// Adds the built-in UDLs to `r`.
pub fn register_all(r: &mut Registry) {
    r.register("relay", |_: &Value, _: &Context| {
        Ok(Arc::new(Relay) as Arc<dyn Udl>)
    });
    r.register("log", |c: &Value, _: &Context| {
        let prefix = c
            .get("prefix")
            .and_then(Value::as_str)
            .unwrap_or("udl")
            .to_string();
        Ok(Arc::new(Log { prefix }) as Arc<dyn Udl>)
    });
    r.register("notify", |c: &Value, _: &Context| {
        let topic = c
            .get("topic")
            .and_then(Value::as_str)
            .ok_or("notify needs {\"topic\": \"/path\"}: clients `sluice watch` that path")?;
        sluice_types::validate_key(topic, 1024).map_err(|e| format!("topic: {e}"))?;
        Ok(Arc::new(Notify {
            topic: topic.to_string(),
        }) as Arc<dyn Udl>)
    });
    r.register("stream_aggregate", |c: &Value, ctx: &Context| {
        streams::Aggregate::from_config(c, ctx).map(|u| Arc::new(u) as Arc<dyn Udl>)
    });
    r.register("stream_rate", |c: &Value, ctx: &Context| {
        streams::Rate::from_config(c, ctx).map(|u| Arc::new(u) as Arc<dyn Udl>)
    });
    r.register("shared_queue", |_: &Value, ctx: &Context| {
        Ok(Arc::new(streams::QueueFeed::new(ctx)) as Arc<dyn Udl>)
    });
    r.register("python", |c: &Value, ctx: &Context| {
        python::PythonUdl::from_config(c, ctx).map(|u| Arc::new(u) as Arc<dyn Udl>)
    });
    // Cascade's PythonOCDPO: its dfgs.json name Python lambdas by this.
    r.alias("6cfe8f64-3a1d-11ed-8e7e-0242ac110006", "python");
    r.runs_out_of_process("python");
    // Cascade's console printer sample UDL prints what it is given: `log`.
    r.alias("48e60f7c-8500-11eb-8755-0242ac110002", "log");
    #[cfg(feature = "onnx")]
    r.register("onnx", |c: &Value, ctx: &Context| {
        onnx::OnnxUdl::from_config(c, ctx).map(|u| Arc::new(u) as Arc<dyn Udl>)
    });
    #[cfg(not(feature = "onnx"))]
    r.register("onnx", |_: &Value, _: &Context| {
        Err::<Arc<dyn Udl>, _>(
            "this node was built without the onnx UDL (the `onnx` feature of sluice-server / sluice-udls)".into(),
        )
    });
}

/// Forwards the object unchanged (the no-op stage of a pipeline): same key
/// suffix, same bytes (shared, not copied).
pub struct Relay;

impl Udl for Relay {
    fn handle(
        &self,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        _: &Context,
    ) -> Result<(), UdlError> {
        emit.emit(call.key_suffix(), call.object.value.clone())
    }
}

/// Prints each object (key, version, size, and the value when it is short
/// text) to the node's standard output and log.
pub struct Log {
    prefix: String,
}

impl Udl for Log {
    fn handle(&self, call: &Upcall<'_>, _: &mut Emitter<'_>, _: &Context) -> Result<(), UdlError> {
        let o = call.object;
        let text = match std::str::from_utf8(&o.value) {
            Ok(s) if s.len() <= 120 => s.to_string(),
            _ => format!("<{} bytes>", o.value.len()),
        };
        println!(
            "[{}] {} version {} {}",
            self.prefix,
            o.key,
            sluice_types::object::fmt_version(o.meta.version),
            text
        );
        tracing::info!(key = %o.key, version = o.meta.version, size = o.value.len(), "log UDL");
        Ok(())
    }
}

/// Publishes each object to clients watching `topic` (pub/sub): the
/// notification's key is `topic` + the key's suffix under the vertex.
pub struct Notify {
    topic: String,
}

impl Udl for Notify {
    fn handle(
        &self,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        ctx: &Context,
    ) -> Result<(), UdlError> {
        let key = join_key(&self.topic, call.key_suffix());
        ctx.publish(&emit.derive(&key, call.object.value.clone()));
        Ok(())
    }
}
