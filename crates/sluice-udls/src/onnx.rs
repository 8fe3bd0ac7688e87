//! The `onnx` UDL: runs an ONNX model (tract) on each object.
//!
//! Config:
//! - `model_key` (required): key of the model object in a pool. Loaded from
//!   the store on first use and cached; when a newer version of that key is
//!   put, the next call loads it (live model upgrade, no restart). A model
//!   held on another node of a cluster is read from a member of its shard
//!   and checked for a new version at most once a second.
//! - `input_shape` (required for raw input): e.g. `[1, 64]`.
//! - `input_format`: `f32` (raw little-endian, default) or `npy`.
//! - `output_format` (mode `tensor`): `f32` (raw, default) or `npy` (with
//!   its shape: what a next `onnx` stage with `input_format: npy` reads).
//! - `escalate_below` + `escalate_to` (a model cascade): when the largest
//!   output (a classifier's confidence) is below the threshold, the input
//!   also goes as a trigger put to `escalate_to`, whose bigger model's
//!   answer, under the same key suffix, replaces this one.
//! - `mode`: `tensor` (emit the output as raw f32, default), `argmax` (emit
//!   the index of the largest output as text), or `gate` (emit the *input*
//!   unchanged when `output[0]` ≥ `threshold`, else put `reject_value` under
//!   `reject_destination`).
//!
//! A model that fails to load is an error in the node's log, in the UDL's
//! failure counter and `last_error` (`sluice dfg ls`), and in the reply to
//! `sluice dfg apply` when the model is already stored at apply time.

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::Value;
use sluice_compute::udl::DestMode;
use sluice_compute::{Context, Emitter, Udl, UdlError, Upcall};
use std::sync::Arc;
use tract_onnx::prelude::*;

type Plan = Arc<TypedRunnableModel>;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Tensor,
    Argmax,
    Gate,
}

pub struct OnnxUdl {
    model_key: String,
    shape: Option<Vec<usize>>,
    npy: bool,
    /// Emit tensors as `.npy` (with their shape) rather than raw f32.
    npy_out: bool,
    mode: Mode,
    threshold: f32,
    reject_destination: Option<String>,
    reject_value: Bytes,
    /// A model cascade: when the largest output (the confidence of a
    /// classifier's probabilities) is below `.0`, the input also goes, as a
    /// trigger put, to `.1`, where a bigger model answers; its answer, put
    /// under the same key suffix, replaces this one.
    escalate: Option<(f32, String)>,
    /// The loaded model: (version, plan, when its version was last checked).
    cache: Mutex<Option<(u64, Plan, std::time::Instant)>>,
}

/// Parses and optimizes an ONNX model for a fixed input shape.
pub fn load_model(bytes: &[u8], shape: &[usize]) -> Result<Plan, String> {
    let model = tract_onnx::onnx()
        .model_for_read(&mut &bytes[..])
        .map_err(|e| format!("not a loadable ONNX model: {e}"))?
        .with_input_fact(0, f32::fact(shape).into())
        .map_err(|e| format!("input shape {shape:?} does not fit the model: {e}"))?
        .into_optimized()
        .map_err(|e| format!("cannot optimize the model: {e}"))?
        .into_runnable()
        .map_err(|e| format!("cannot plan the model: {e}"))?;
    Ok(model)
}

/// Runs a plan on one input; returns the first output, flattened.
pub fn run_model(plan: &Plan, shape: &[usize], input: Vec<f32>) -> Result<Vec<f32>, String> {
    run_model_shaped(plan, shape, input).map(|(_, v)| v)
}

/// `run_model`, with the output's shape.
pub fn run_model_shaped(
    plan: &Plan,
    shape: &[usize],
    input: Vec<f32>,
) -> Result<(Vec<usize>, Vec<f32>), String> {
    let t = Tensor::from_shape(shape, &input)
        .map_err(|e| format!("input does not match shape {shape:?}: {e}"))?;
    let out = plan
        .run(tvec!(t.into()))
        .map_err(|e| format!("inference failed: {e}"))?;
    let first = out.first().ok_or("the model produced no output")?;
    let view = first
        .to_plain_array_view::<f32>()
        .map_err(|e| format!("output is not f32: {e}"))?;
    Ok((view.shape().to_vec(), view.iter().copied().collect()))
}

impl OnnxUdl {
    pub fn from_config(c: &Value, ctx: &Context) -> Result<Self, String> {
        let model_key = c
            .get("model_key")
            .and_then(Value::as_str)
            .ok_or("onnx needs \"model_key\": the key of the model object")?;
        sluice_types::validate_key(model_key, 1024).map_err(|e| format!("model_key: {e}"))?;
        let shape = match c.get("input_shape") {
            None => None,
            Some(s) => Some(
                s.as_array()
                    .ok_or("input_shape must be a list of dimensions")?
                    .iter()
                    .map(|d| {
                        d.as_u64()
                            .filter(|d| *d > 0)
                            .map(|d| d as usize)
                            .ok_or("input_shape dimensions are positive integers")
                    })
                    .collect::<Result<Vec<usize>, _>>()?,
            ),
        };
        let npy = match c
            .get("input_format")
            .and_then(Value::as_str)
            .unwrap_or("f32")
        {
            "f32" => false,
            "npy" => true,
            other => return Err(format!("input_format {other:?}: use f32 or npy")),
        };
        let npy_out = match c
            .get("output_format")
            .and_then(Value::as_str)
            .unwrap_or("f32")
        {
            "f32" => false,
            "npy" => true,
            other => return Err(format!("output_format {other:?}: use f32 or npy")),
        };
        if !npy && shape.is_none() {
            return Err("raw f32 input needs \"input_shape\"".into());
        }
        let mode = match c.get("mode").and_then(Value::as_str).unwrap_or("tensor") {
            "tensor" => Mode::Tensor,
            "argmax" => Mode::Argmax,
            "gate" => Mode::Gate,
            other => return Err(format!("mode {other:?}: use tensor, argmax or gate")),
        };
        let threshold = c.get("threshold").and_then(Value::as_f64).unwrap_or(0.5) as f32;
        let reject_destination = c
            .get("reject_destination")
            .and_then(Value::as_str)
            .map(str::to_string);
        let reject_value = Bytes::from(
            c.get("reject_value")
                .and_then(Value::as_str)
                .unwrap_or("rejected")
                .to_string(),
        );
        let escalate = match (c.get("escalate_below"), c.get("escalate_to")) {
            (None, None) => None,
            (Some(t), Some(to)) => {
                let t = t.as_f64().ok_or("escalate_below: a confidence, e.g. 0.8")?;
                let to = to
                    .as_str()
                    .ok_or("escalate_to: the pathname of the bigger model's vertex")?;
                sluice_types::validate_key(to, 1024).map_err(|e| format!("escalate_to: {e}"))?;
                Some((t as f32, to.to_string()))
            }
            _ => return Err("a model cascade needs both escalate_below and escalate_to".into()),
        };
        let udl = OnnxUdl {
            escalate,
            model_key: model_key.to_string(),
            shape,
            npy,
            npy_out,
            mode,
            threshold,
            reject_destination,
            reject_value,
            cache: Mutex::new(None),
        };
        // When the model is already stored, load it now so a bad model is
        // reported in the apply reply, not only at the first upcall.
        if let (Ok(obj), Some(shape)) = (ctx.get(model_key), &udl.shape) {
            let plan = load_model(&obj.value, shape)
                .map_err(|e| format!("model {model_key} (version {}): {e}", obj.meta.version))?;
            *udl.cache.lock() = Some((obj.meta.version, plan, std::time::Instant::now()));
        }
        Ok(udl)
    }

    fn plan(&self, ctx: &Context, shape: &[usize]) -> Result<Plan, UdlError> {
        // A model on another node is checked for a new version at most
        // every REMOTE_CHECK (each check moves the whole object); a local
        // one on every call (a shared pointer, no copy).
        if !ctx.holds(&self.model_key) {
            if let Some((_, plan, at)) = self.cache.lock().as_ref() {
                if at.elapsed() < REMOTE_CHECK {
                    return Ok(plan.clone());
                }
            }
        }
        let obj = ctx.get(&self.model_key).map_err(|e| {
            UdlError::Failed(format!("model {} is not available: {e}", self.model_key))
        })?;
        let mut cache = self.cache.lock();
        if let Some((v, plan, at)) = cache.as_mut() {
            if *v == obj.meta.version {
                *at = std::time::Instant::now();
                return Ok(plan.clone());
            }
        }
        let plan = load_model(&obj.value, shape).map_err(|e| {
            UdlError::Failed(format!(
                "model {} (version {}) failed to load: {e}",
                self.model_key, obj.meta.version
            ))
        })?;
        tracing::info!(model = %self.model_key, version = obj.meta.version, "onnx model loaded");
        *cache = Some((obj.meta.version, plan.clone(), std::time::Instant::now()));
        Ok(plan)
    }
}

/// How often a model held on another node is checked for a new version.
const REMOTE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl Udl for OnnxUdl {
    fn handle(
        &self,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        ctx: &Context,
    ) -> Result<(), UdlError> {
        let value = &call.object.value;
        let (shape, input) = if self.npy {
            crate::npy::parse_f32(value).map_err(UdlError::Failed)?
        } else {
            let shape = self.shape.clone().unwrap_or_default();
            let n: usize = shape.iter().product();
            if value.len() != n * 4 {
                return Err(UdlError::Failed(format!(
                    "input of {} bytes does not match shape {shape:?} ({} f32 = {} bytes)",
                    value.len(),
                    n,
                    n * 4
                )));
            }
            (
                shape,
                value
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            )
        };
        let plan = self.plan(ctx, &shape)?;
        let (out_shape, out) = run_model_shaped(&plan, &shape, input).map_err(UdlError::Failed)?;
        let suffix = call.key_suffix();
        if let Some((below, to)) = &self.escalate {
            let confidence = out.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if confidence < *below {
                emit.emit_to(to, DestMode::TriggerPut, suffix, value.clone())?;
            }
        }
        match self.mode {
            Mode::Tensor if self.npy_out => {
                emit.emit(suffix, Bytes::from(crate::npy::write_f32(&out_shape, &out)))
            }
            Mode::Tensor => {
                let mut b = Vec::with_capacity(out.len() * 4);
                for v in &out {
                    b.extend_from_slice(&v.to_le_bytes());
                }
                emit.emit(suffix, Bytes::from(b))
            }
            Mode::Argmax => {
                let best = out
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map(|(i, _)| i)
                    .ok_or_else(|| UdlError::Failed("empty output".into()))?;
                emit.emit(suffix, Bytes::from(best.to_string()))
            }
            Mode::Gate => {
                let score = out.first().copied().unwrap_or(f32::NEG_INFINITY);
                if score >= self.threshold {
                    emit.emit(suffix, value.clone())
                } else if let Some(dest) = &self.reject_destination {
                    emit.emit_to(dest, DestMode::Put, suffix, self.reject_value.clone())
                } else {
                    Ok(())
                }
            }
        }
    }
}
