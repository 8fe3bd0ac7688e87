//! What reads return: `Object` (key, metadata, value) and `Value`, the
//! value's bytes as received, exported through the buffer protocol
//! without a copy (`memoryview(v)`, `numpy.frombuffer(v, ...)`,
//! `torch.frombuffer`); `bytes(v)` copies when a `bytes` is wanted.

use bytes::Bytes;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::os::raw::c_int;

/// An object's value: read-only bytes, shared with the frame it arrived
/// in. Supports the buffer protocol (no copy), `len()`, `bytes()`,
/// comparison with bytes-like objects, and `decode()`.
#[pyclass(module = "sluice", frozen)]
pub struct Value {
    pub(crate) bytes: Bytes,
}

#[pymethods]
impl Value {
    /// A value over a copy of `data` (any buffer or str), as a pickled
    /// one comes back.
    #[new]
    fn py_new(data: &Bound<'_, PyAny>) -> PyResult<Value> {
        Ok(Value {
            bytes: bytes_of(data)?,
        })
    }

    /// Pickles as its bytes (`multiprocessing`, Ray): a copy.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        reduce(slf, (PyBytes::new(slf.py(), &slf.get().bytes),))
    }

    /// # Safety
    /// Called by CPython with a valid `view`; fills it over this value's
    /// bytes, which live as long as `self` (the view holds a reference).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("a Sluice value is read-only"));
        }
        let b = &slf.get().bytes;
        // SAFETY: `view` is valid (CPython's contract); the pointer and
        // length describe `b`, which `slf` owns and the view keeps alive.
        let r = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                b.as_ptr() as *mut std::ffi::c_void,
                b.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(PyErr::fetch(slf.py()))
        }
    }

    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// As `bytes` does: `v[i]` an int, `v[a:b:c]` a `bytes` (a copy of
    /// that part; `memoryview(v)[a:b]` is one without a copy).
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(slice) = index.cast::<pyo3::types::PySlice>() {
            let ind = slice.indices(self.bytes.len() as isize)?;
            if ind.step == 1 {
                let (a, b) = (ind.start as usize, (ind.stop.max(ind.start)) as usize);
                return Ok(PyBytes::new(py, &self.bytes[a..b]).into_any());
            }
            // Strided: as bytes slices it.
            return PyBytes::new(py, &self.bytes).get_item(slice);
        }
        let i: isize = index.extract()?;
        let n = self.bytes.len() as isize;
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(pyo3::exceptions::PyIndexError::new_err(
                "index out of range",
            ));
        }
        Ok(self.bytes[j as usize].into_pyobject(py)?.into_any())
    }

    /// A copy as `bytes`.
    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.bytes)
    }

    /// A copy as `bytes` (as `memoryview.tobytes`).
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.bytes)
    }

    /// The value decoded as text.
    #[pyo3(signature = (encoding = "utf-8"))]
    fn decode<'py>(&self, py: Python<'py>, encoding: &str) -> PyResult<Bound<'py, PyAny>> {
        PyBytes::new(py, &self.bytes).call_method1("decode", (encoding,))
    }

    /// Where the bytes lie in memory (for checking that a view shares
    /// them).
    #[getter]
    fn address(&self) -> usize {
        self.bytes.as_ptr() as usize
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(v) = other.cast::<Value>() {
            return v.get().bytes == self.bytes;
        }
        // Compared in place (no copy of either side).
        match pyo3::buffer::PyBuffer::<u8>::get(other) {
            Ok(buf) => buf.as_slice(other.py()).is_some_and(|cells| {
                cells.len() == self.bytes.len()
                    && cells
                        .iter()
                        .zip(self.bytes.iter())
                        .all(|(c, b)| c.get() == *b)
            }),
            Err(_) => false,
        }
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.bytes.hash(&mut h);
        h.finish()
    }

    fn __repr__(&self) -> String {
        const SHOWN: usize = 32;
        let head = &self.bytes[..self.bytes.len().min(SHOWN)];
        let text: String = head.escape_ascii().to_string();
        if self.bytes.len() > SHOWN {
            format!("Value(b'{text}'... {} bytes)", self.bytes.len())
        } else {
            format!("Value(b'{text}')")
        }
    }
}

/// A stored object: key, version, timestamp, the versions before it,
/// and its value (`Value`: no copy).
#[pyclass(module = "sluice", frozen, get_all)]
pub struct Object {
    pub key: String,
    /// Version number (per shard, dense).
    pub version: u64,
    /// When the version was written (µs since the epoch, node clock).
    pub timestamp_us: u64,
    /// The shard's version before this one.
    pub previous_version: u64,
    /// This key's version before this one (`None`: the first).
    pub previous_version_by_key: Option<u64>,
    /// Whether this version is a removal (history only).
    pub removed: bool,
    pub value: Py<Value>,
    /// The latency trace (`id`, `client_sent_us`, `hops`: one per stage
    /// with `stage`, `enqueued_us`, `started_us`, `emitted_us`), when the
    /// writer asked for one (`trigger_put(..., trace_id=)`); else `None`.
    pub trace: Option<Py<PyAny>>,
}

#[pymethods]
impl Object {
    /// As a read returns one (and a pickled one comes back).
    #[new]
    #[pyo3(signature = (key, version, timestamp_us, value, previous_version = 0, previous_version_by_key = None, removed = false, trace = None))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        key: String,
        version: u64,
        timestamp_us: u64,
        value: &Bound<'_, PyAny>,
        previous_version: u64,
        previous_version_by_key: Option<u64>,
        removed: bool,
        trace: Option<Py<PyAny>>,
    ) -> PyResult<Object> {
        let value = match value.cast::<Value>() {
            Ok(v) => v.clone().unbind(),
            Err(_) => Py::new(py, Value::py_new(value)?)?,
        };
        Ok(Object {
            key,
            version,
            timestamp_us,
            previous_version,
            previous_version_by_key,
            removed,
            value,
            trace,
        })
    }

    /// Pickles with every field (its value as bytes: a copy).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let o = slf.get();
        let args = (
            o.key.clone(),
            o.version,
            o.timestamp_us,
            o.value.clone_ref(py),
            o.previous_version,
            o.previous_version_by_key,
            o.removed,
            o.trace.as_ref().map(|t| t.clone_ref(py)),
        );
        reduce(slf, args)
    }

    fn __repr__(&self) -> String {
        if self.removed {
            // A removal in a history: its empty value is not a value.
            return format!(
                "Object(key={:?}, version={}, timestamp_us={}, removed=True)",
                self.key, self.version, self.timestamp_us
            );
        }
        format!(
            "Object(key={:?}, version={}, timestamp_us={}, value={})",
            self.key,
            self.version,
            self.timestamp_us,
            self.value.get().__repr__()
        )
    }

    fn __len__(&self) -> usize {
        self.value.get().bytes.len()
    }
}

impl Object {
    pub fn new(py: Python<'_>, o: sluice_types::Object) -> PyResult<Object> {
        Ok(Object {
            key: o.key.to_string(),
            version: o.meta.version,
            timestamp_us: o.meta.timestamp_us,
            previous_version: o.meta.previous_version,
            previous_version_by_key: (o.meta.previous_version_by_key != sluice_types::VERSION_NONE)
                .then_some(o.meta.previous_version_by_key),
            removed: o.meta.tombstone,
            trace: match o.trace.as_deref().filter(|t| t.id != 0) {
                Some(t) => Some(crate::runtime::json_to_py(
                    py,
                    &serde_json::to_value(t).unwrap_or_default(),
                )?),
                None => None,
            },
            value: Py::new(py, Value { bytes: o.value })?,
        })
    }
}

/// What a put or remove returns: the version it made and its timestamp.
#[pyclass(module = "sluice", frozen, get_all, skip_from_py_object)]
#[derive(Clone)]
pub struct PutResult {
    pub version: u64,
    pub timestamp_us: u64,
}

#[pymethods]
impl PutResult {
    #[new]
    fn py_new(version: u64, timestamp_us: u64) -> PutResult {
        PutResult {
            version,
            timestamp_us,
        }
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        reduce(slf, (slf.get().version, slf.get().timestamp_us))
    }

    fn __repr__(&self) -> String {
        format!(
            "PutResult(version={}, timestamp_us={})",
            self.version, self.timestamp_us
        )
    }

    /// `(version, timestamp_us)`, as Cascade's put returns.
    fn __iter__(slf: PyRef<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let t = (slf.version, slf.timestamp_us).into_pyobject(py)?;
        Ok(t.try_iter()?.into_any().unbind())
    }
}

impl From<sluice_types::PutResult> for PutResult {
    fn from(r: sluice_types::PutResult) -> Self {
        PutResult {
            version: r.version,
            timestamp_us: r.timestamp_us,
        }
    }
}

/// A Python `bytes` object as the storage of a `Bytes`: immutable, so
/// its buffer may be read from any thread for as long as the object
/// lives, which the reference held here ensures. Dropped on a thread
/// that is not attached to Python, pyo3 defers the decref to the next
/// call into the extension.
struct HeldBytes {
    _obj: Py<PyBytes>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the pointer is into the immutable buffer of `_obj`, kept alive
// by it; `Py<T>` itself may move between threads.
unsafe impl Send for HeldBytes {}

impl AsRef<[u8]> for HeldBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see `HeldBytes`: valid and unchanging while `_obj` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// The bytes of any buffer (bytes, bytearray, memoryview, a NumPy
/// array, strided or not) or str (UTF-8), copied once into a frame-ready
/// buffer; a `bytes` object of 4 KB or more is shared instead (it cannot
/// change).
pub fn bytes_of(v: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(s) = v.cast::<pyo3::types::PyString>() {
        return Ok(Bytes::copy_from_slice(s.to_str()?.as_bytes()));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        let data = b.as_bytes();
        // Smaller values are copied next to their header on the way out
        // anyway (the wire's zero-copy threshold).
        if data.len() < sluice_wire::ZERO_COPY_THRESHOLD {
            return Ok(Bytes::copy_from_slice(data));
        }
        return Ok(Bytes::from_owner(HeldBytes {
            ptr: data.as_ptr(),
            len: data.len(),
            _obj: b.clone().unbind(),
        }));
    }
    if let Ok(val) = v.cast::<Value>() {
        return Ok(val.get().bytes.clone());
    }
    // Any buffer, viewed as bytes whatever its item type: a C-contiguous
    // one copied as it lies, any other (a strided NumPy view, a
    // transposed array) in C order, as `tobytes()` gives it.
    let mut view = std::mem::MaybeUninit::<ffi::Py_buffer>::uninit();
    // SAFETY: `view` is filled by PyObject_GetBuffer on success and
    // released below; the bytes are copied while it is held.
    unsafe {
        if ffi::PyObject_GetBuffer(v.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_FULL_RO) != 0 {
            drop(PyErr::take(v.py()));
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "a value must be bytes-like (bytes, bytearray, memoryview, a NumPy array) or str, not {}",
                v.get_type().name()?
            )));
        }
        let mut view = view.assume_init();
        if !view.format.is_null() {
            let format = std::ffi::CStr::from_ptr(view.format).to_bytes();
            if holds_objects(format) {
                ffi::PyBuffer_Release(&mut view);
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "a value must be data, not Python objects: this {} holds object \
                     references (buffer format {:?}), whose bytes are addresses in this process; \
                     convert it to a numeric array or to bytes first (e.g. pickle.dumps)",
                    v.get_type().name()?,
                    String::from_utf8_lossy(format)
                )));
            }
        }
        let len = view.len as usize;
        let out = if ffi::PyBuffer_IsContiguous(&view, b'C' as std::os::raw::c_char) != 0 {
            Bytes::copy_from_slice(std::slice::from_raw_parts(view.buf as *const u8, len))
        } else {
            let mut flat = vec![0u8; len];
            let r = ffi::PyBuffer_ToContiguous(
                flat.as_mut_ptr().cast(),
                &view,
                view.len,
                b'C' as std::os::raw::c_char,
            );
            if r != 0 {
                ffi::PyBuffer_Release(&mut view);
                return Err(PyErr::fetch(v.py()));
            }
            Bytes::from(flat)
        };
        ffi::PyBuffer_Release(&mut view);
        Ok(out)
    }
}

/// Whether a buffer's struct-module format string has an item that is a
/// Python object reference (`O`, as in a NumPy array of `dtype=object`,
/// alone or as a field of a structured one): its bytes are pointers, not
/// data. Field names (`:name:`) are skipped.
fn holds_objects(format: &[u8]) -> bool {
    let mut in_name = false;
    for &c in format {
        match c {
            b':' => in_name = !in_name,
            b'O' if !in_name => return true,
            _ => {}
        }
    }
    false
}

/// What `__reduce__` returns: the object's class and the arguments that
/// make it again (pickle calls `type(obj)(*args)`).
pub(crate) fn reduce<'py, T: pyo3::PyClass, A: IntoPyObject<'py>>(
    slf: &Bound<'py, T>,
    args: A,
) -> PyResult<Bound<'py, PyAny>> {
    (slf.as_any().get_type(), args)
        .into_pyobject(slf.py())
        .map(Bound::into_any)
}
