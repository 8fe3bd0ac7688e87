//! Python lambdas, out of process: the `python` UDL (also under Cascade's
//! `PythonOCDPO` UUID). A vertex names a Python class (Cascade's shape:
//! `python_path`, `module`, `entry_class`, plus the class's own config);
//! the node starts `workers` Python processes for it and supervises them.
//! The module may live on the node's file system (`python_path`) or be
//! shipped as an object (`code_key`: the key whose value is its source).
//!
//! Each worker shares one memory region with the node (a file under
//! `/dev/shm`, mapped by both) and two eventfds. The region:
//!
//! ```text
//! 0      header: magic, version, where the rings and arenas are; ring
//!        indices (monotonic u64s, each on its own cache line)
//! 4096   request ring  (node -> worker): 64 descriptors of 128 bytes
//!        response ring (worker -> node): 64 descriptors of 128 bytes
//!        input arena   (node writes: an upcall's key, pool and value;
//!                       replies to store calls)
//!        output arena  (the worker writes: emitted keys and values,
//!                       store calls, error messages)
//! ```
//!
//! An upcall's value is copied once, into the input arena, and read there
//! by Python as a memoryview (no socket, no pickling). A trigger put of
//! 256 KB or more is not even copied: the vertex lends the connection that
//! receives it room in its landing area (`LandingArea`, `landing_mb`; a
//! file every worker of the vertex maps read-only), the frame is read from
//! the socket straight into it, and the upcall passes the value's offset
//! there (`F_LANDED`). Emitted values are
//! written once by Python and copied out once here; emitting the input
//! value itself is a reference to the object the node already holds (no
//! copy). After writing a descriptor each side bumps its ring's head and
//! writes its eventfd (the syscall orders the writes for the other side);
//! each side polls its ring (the node for `spin_us`, a worker for
//! `worker_spin_us`) before blocking on its eventfd, while the recent
//! messages came within that budget on average (each descriptor carries
//! when it was sent, so a late wake-up is not taken for a late message).
//!
//! One upcall at a time per worker: the engine thread that runs it holds
//! the worker, answers its store calls, and waits for it to finish,
//! checking every 100 ms that the process lives. A worker that dies
//! fails the upcall it was running (with the key and how it died) and is
//! started again for the next one. Engine threads map to workers by
//! their index, so the vertex's dispatch policy (FIFO per key, round
//! robin, single) holds as it does for Rust lambdas.

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_compute::landing::Landing;
use sluice_compute::{Context, Emitter, Udl, UdlError, Upcall};
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The worker script, shipped inside the node binary.
const WORKER_PY: &str = include_str!("../python/sluice_worker.py");

const MAGIC: &[u8; 8] = b"SLUICEPW";
const VERSION: u32 = 2;
const HEADER: usize = 4096;
const DESC: usize = 128;
const SLOTS: usize = 64;
const H_REQ_HEAD: usize = 128;
const H_REQ_TAIL: usize = 192;
const H_RESP_HEAD: usize = 256;
const H_RESP_TAIL: usize = 320;
const H_OUT_FREE: usize = 448;
/// Times the worker blocked on its eventfd for a request (it counts).
const H_WORKER_SLEEPS: usize = 512;

const R_UPCALL: u32 = 1;
const R_CTX_REPLY: u32 = 2;
const R_STOP: u32 = 3;
const P_EMIT: u32 = 1;
const P_DONE: u32 = 2;
const P_FAIL: u32 = 3;
const P_CTX_CALL: u32 = 4;
const F_INPUT_VALUE: u32 = 1;
/// How long a worker may take to load its class (`start_timeout_s`), and
/// one upcall (`call_timeout_s`), unless the vertex's config says.
const START_LIMIT_S: u64 = 60;
const CALL_LIMIT_S: u64 = 3600;
/// Default spin before blocking: the node's for answers, a worker's for
/// requests (BENCHMARKS.md: Python lambdas, and "A spin rule by the
/// sender's stamp": a closed loop's calls come 250-570 µs apart on a busy
/// 2-core machine, and spinning through that keeps 2-worker scaling where
/// the node spinning longer does not).
const DEFAULT_SPIN_US: u64 = 300;
const DEFAULT_WORKER_SPIN_US: u64 = 1000;
/// `stream_copy` applies from this size on: below it the bytes are better
/// left in the cache for the worker to read.
const STREAM_MIN: usize = 64 << 10;
/// Default landing area per vertex, MiB (pages are used as values land).
const DEFAULT_LANDING_MB: u64 = 64;
/// Upcall flag: the value lies in the vertex's landing area, not the
/// worker's input arena.
const F_LANDED: u32 = 2;
/// The landing area's file in the vertex's directory.
const LANDING_FILE: &str = "landing.shm";

/// A descriptor (both rings; `DESC_FMT` in the worker): kind, flags, call
/// id, version (responses: the worker's output arena head), timestamp,
/// worker id, status, three (offset, length) ranges in the region, the
/// object's previous versions and the sending node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Desc {
    kind: u32,
    flags: u32,
    call_id: u64,
    version: u64,
    timestamp_us: u64,
    worker_id: u32,
    status: i32,
    a: (u64, u64),
    b: (u64, u64),
    c: (u64, u64),
    previous_version: u64,
    previous_version_by_key: u64,
    sender: u32,
    /// When the writer published it (CLOCK_MONOTONIC, ns).
    sent_ns: u64,
}

impl Desc {
    fn write(&self, buf: &mut [u8]) {
        let mut w = &mut buf[..];
        let _ = w.write_all(&self.kind.to_le_bytes());
        let _ = w.write_all(&self.flags.to_le_bytes());
        let _ = w.write_all(&self.call_id.to_le_bytes());
        let _ = w.write_all(&self.version.to_le_bytes());
        let _ = w.write_all(&self.timestamp_us.to_le_bytes());
        let _ = w.write_all(&self.worker_id.to_le_bytes());
        let _ = w.write_all(&self.status.to_le_bytes());
        for (o, l) in [self.a, self.b, self.c] {
            let _ = w.write_all(&o.to_le_bytes());
            let _ = w.write_all(&l.to_le_bytes());
        }
        let _ = w.write_all(&self.previous_version.to_le_bytes());
        let _ = w.write_all(&self.previous_version_by_key.to_le_bytes());
        let _ = w.write_all(&self.sender.to_le_bytes());
        let _ = w.write_all(&self.sent_ns.to_le_bytes());
    }

    fn read(buf: &[u8]) -> Desc {
        let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().unwrap_or_default());
        let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap_or_default());
        Desc {
            kind: u32_at(0),
            flags: u32_at(4),
            call_id: u64_at(8),
            version: u64_at(16),
            timestamp_us: u64_at(24),
            worker_id: u32_at(32),
            status: u32_at(36) as i32,
            a: (u64_at(40), u64_at(48)),
            b: (u64_at(56), u64_at(64)),
            c: (u64_at(72), u64_at(80)),
            previous_version: u64_at(88),
            previous_version_by_key: u64_at(96),
            sender: u32_at(104),
            sent_ns: u64_at(108),
        }
    }
}

/// Where the parts of a region lie.
#[derive(Clone, Copy, Debug)]
struct Layout {
    req: usize,
    resp: usize,
    input: usize,
    input_len: usize,
    out: usize,
    out_len: usize,
    size: usize,
}

impl Layout {
    fn new(arena_bytes: usize) -> Layout {
        let req = HEADER;
        let resp = req + SLOTS * DESC;
        let input = resp + SLOTS * DESC;
        let out = input + arena_bytes;
        Layout {
            req,
            resp,
            input,
            input_len: arena_bytes,
            out,
            out_len: arena_bytes,
            size: out + arena_bytes,
        }
    }
}

/// The vertex's configuration (`dfgs.json`: the vertex's config object).
#[derive(Clone, Debug)]
pub struct PythonSpec {
    pub python: String,
    pub python_path: Vec<String>,
    pub module: String,
    pub entry_class: String,
    pub workers: usize,
    pub arena_bytes: usize,
    /// How long the node polls for a worker's answers before blocking on
    /// its eventfd (`spin_us`).
    pub spin: Duration,
    /// How long an idle worker polls for its next request before blocking
    /// (`worker_spin_us`).
    pub worker_spin: Duration,
    /// Values of `STREAM_MIN` bytes or more go into the region with
    /// non-temporal stores (`stream_copy`; see `copy_streaming`).
    pub stream_copy: bool,
    /// The worker registers its region with CUDA (`pin_cuda`).
    pub pin_cuda: bool,
    /// Bytes of shared memory the vertex lends for large trigger puts to
    /// be read into (`landing_mb`; 0: none).
    pub landing_bytes: usize,
    /// How long a worker may take to load its class (`start_timeout_s`).
    pub start_limit: Duration,
    /// How long one upcall may take (`call_timeout_s`) before its worker
    /// is stopped, the call failed and another worker started.
    pub call_limit: Duration,
    /// Everything in the config, handed to the class's constructor.
    pub config: Value,
}

impl PythonSpec {
    pub fn from_config(c: &Value) -> Result<PythonSpec, String> {
        let s = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_string);
        let module = s("module").ok_or(
            "a python UDL needs \"module\" (and \"entry_class\"; \"python_path\" where the module lives)",
        )?;
        let entry_class = s("entry_class").ok_or("a python UDL needs \"entry_class\"")?;
        let python_path = match c.get("python_path") {
            None => Vec::new(),
            Some(Value::String(p)) => vec![p.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or("python_path: a list of strings")
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("python_path: a string or a list of strings".into()),
        };
        // A whole number in `ok`, `default` when absent; else `why`.
        let number = |key: &str, default: u64, ok: std::ops::RangeInclusive<u64>, why: &str| match c
            .get(key)
        {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .filter(|n| ok.contains(n))
                .ok_or(format!("{key}: {why}")),
        };
        let workers = number("workers", 1, 1..=64, "a number of processes from 1 to 64")? as usize;
        let arena_mb = number(
            "arena_mb",
            64,
            1..=4096,
            "from 1 to 4096 (MiB per worker and direction)",
        )?;
        let spin_us = number(
            "spin_us",
            DEFAULT_SPIN_US,
            0..=100_000,
            "microseconds from 0 to 100000",
        )?;
        let worker_spin_us = number(
            "worker_spin_us",
            DEFAULT_WORKER_SPIN_US,
            0..=100_000,
            "microseconds from 0 to 100000",
        )?;
        let landing_mb = number(
            "landing_mb",
            DEFAULT_LANDING_MB,
            0..=4096,
            "from 0 (none) to 4096 (MiB per vertex)",
        )?;
        let start_s = number(
            "start_timeout_s",
            START_LIMIT_S,
            1..=86_400,
            "seconds from 1 to 86400 (a worker loading its class)",
        )?;
        let call_s = number(
            "call_timeout_s",
            CALL_LIMIT_S,
            1..=86_400,
            "seconds from 1 to 86400 (one call of the lambda)",
        )?;
        let pin_cuda = c.get("pin_cuda").and_then(Value::as_bool) == Some(true);
        // On by default for a region registered with CUDA: its values are
        // read by DMA (BENCHMARKS.md, "GPU": a quarter off the copy).
        let stream_copy = match c.get("stream_copy") {
            None => pin_cuda,
            Some(v) => v.as_bool().ok_or("stream_copy: true or false")?,
        };
        let python = s("python")
            .or_else(|| std::env::var("SLUICE_PYTHON").ok())
            .unwrap_or_else(|| "python3".into());
        Ok(PythonSpec {
            python,
            python_path,
            module,
            entry_class,
            workers,
            arena_bytes: (arena_mb as usize) << 20,
            spin: Duration::from_micros(spin_us),
            worker_spin: Duration::from_micros(worker_spin_us),
            stream_copy,
            pin_cuda,
            landing_bytes: (landing_mb as usize) << 20,
            start_limit: Duration::from_secs(start_s),
            call_limit: Duration::from_secs(call_s),
            config: c.clone(),
        })
    }

    /// Whether large trigger puts are read into the vertex's landing area.
    /// Not where values are copied for a GPU (`pin_cuda`, `stream_copy`):
    /// the copy with streaming stores into the registered region is what
    /// reaches the device fastest (BENCHMARKS.md, "GPU").
    fn lands(&self) -> bool {
        self.landing_bytes > 0 && !self.stream_copy && !self.pin_cuda
    }
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// CLOCK_MONOTONIC in nanoseconds: the clock Python's `time.monotonic_ns`
/// reads, so that both sides' stamps compare.
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a valid u64 to an eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Logs each line a worker writes to `pipe` (its stdout at `level` info,
/// its stderr at warn) with the lambda and the worker's pid, on a thread
/// that ends with the worker (end of file). Lines are cut at 64 KiB.
fn forward_output(
    pipe: impl std::io::Read + Send + 'static,
    lambda: String,
    pid: u32,
    level: tracing::Level,
) {
    use std::io::BufRead as _;
    let spawned = std::thread::Builder::new()
        .name(format!("sluice-py-out-{pid}"))
        .spawn(move || {
            let mut r = std::io::BufReader::new(pipe);
            let mut line = Vec::new();
            loop {
                line.clear();
                match std::io::Read::take(&mut r, 64 << 10).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end();
                if level == tracing::Level::WARN {
                    tracing::warn!(target: "sluice_udls::python::worker", lambda = %lambda, pid, "{text}");
                } else {
                    tracing::info!(target: "sluice_udls::python::worker", lambda = %lambda, pid, "{text}");
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, pid, "cannot start a thread for a python worker's output; it is dropped");
    }
}

/// Waits up to `timeout` for `fd` to be signalled (and resets it).
fn wait(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
    if n > 0 {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a u64 from a readable eventfd.
        unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        return true;
    }
    false
}

/// A new file of `size` bytes (sparse) for memory the node shares with
/// its workers: a worker's region, a vertex's landing area.
fn shared_file(path: &Path, size: usize) -> Result<std::fs::File, String> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("creating {}: {e}", path.display()))?;
    f.set_len(size as u64)
        .map_err(|e| format!("sizing {}: {e}", path.display()))?;
    Ok(f)
}

/// Shared memory is reserved this much at a time (`reserve`).
const RESERVE_STEP: usize = 1 << 20;

/// Reserves the pages of a shared file below `end` (rounded up to
/// `RESERVE_STEP`, at most `size`), from `*reserved` on. The files are
/// sparse, in tmpfs (`/dev/shm`): without this, the first write to a page
/// the file system has no room for is a SIGBUS, which killed the node (a
/// container's /dev/shm is 64 MB unless given more, and a vertex's landing
/// area alone is 64 MiB). Written ranges are reserved first, so a full
/// /dev/shm is an error for the call instead.
fn reserve(
    file: &std::fs::File,
    reserved: &mut usize,
    end: usize,
    size: usize,
) -> Result<(), String> {
    if end <= *reserved {
        return Ok(());
    }
    let end = end.next_multiple_of(RESERVE_STEP).min(size).max(end);
    #[cfg(test)]
    if let Some(e) = tests::RESERVE_FAILS.with(|f| f.get()) {
        return Err(shm_full(std::io::Error::from_raw_os_error(e)));
    }
    // SAFETY: posix_fallocate on a descriptor `file` owns, within i64.
    let r = unsafe {
        libc::posix_fallocate(file.as_raw_fd(), *reserved as i64, (end - *reserved) as i64)
    };
    if r != 0 {
        return Err(shm_full(std::io::Error::from_raw_os_error(r)));
    }
    *reserved = end;
    Ok(())
}

/// What a Python lambda's shared memory without room says.
fn shm_full(e: std::io::Error) -> String {
    format!(
        "no room for the Python lambda's shared memory in /dev/shm ({e}): a container's /dev/shm is 64 MB unless it is given more (`docker run --shm-size=1g`, Kubernetes: an emptyDir with medium Memory); or lower the vertex's \"arena_mb\", \"landing_mb\" or \"workers\""
    )
}

/// `dst.copy_from_slice(src)` with non-temporal stores on x86_64: the
/// bytes go to memory rather than into this core's cache, so a device
/// that reads them by DMA (a GPU copying an object from a pinned region)
/// finds them there instead of snooping another core's dirty lines.
/// Elsewhere, a plain copy.
fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let body = (dst.len() - head) / 16;
        dst[..head].copy_from_slice(&src[..head]);
        // SAFETY: `head + 16 * body <= len` for both slices (same length);
        // the stores are to 16-aligned addresses of `dst` (`align_offset`),
        // the loads unaligned; SSE2 is part of x86_64. The fence orders
        // the streaming stores before the descriptor that publishes them.
        unsafe {
            let d = dst.as_mut_ptr().add(head).cast::<__m128i>();
            let s = src.as_ptr().add(head).cast::<__m128i>();
            for i in 0..body {
                _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i)));
            }
            _mm_sfence();
        }
        let tail = head + 16 * body;
        dst[tail..].copy_from_slice(&src[tail..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// The memory a vertex lends for large trigger puts (`Udl::landing`): a
/// file in the vertex's directory under `/dev/shm`, mapped here to be
/// written by the connections that read frames into it, and read-only by
/// each worker, which reads a landed value in place (`F_LANDED`). A range
/// is lent to one frame at a time and comes back when its last `Bytes`
/// slice is dropped (the upcalls done); the mapping lives as long as any
/// range is out.
struct LandingArea {
    map: memmap2::MmapRaw,
    /// Free ranges (start, len): sorted, disjoint, never adjacent; and
    /// how far the file's pages are reserved (`reserve`).
    free: parking_lot::Mutex<(Vec<(usize, usize)>, usize)>,
    file: std::fs::File,
    /// A range not lent for want of room in /dev/shm was said once.
    said_full: std::sync::atomic::AtomicBool,
}

impl LandingArea {
    fn create(path: &Path, size: usize) -> Result<Arc<LandingArea>, String> {
        let f = shared_file(path, size)?;
        let map = memmap2::MmapRaw::map_raw(&f)
            .map_err(|e| format!("mapping {}: {e}", path.display()))?;
        Ok(Arc::new(LandingArea {
            map,
            free: parking_lot::Mutex::new((vec![(0, size)], 0)),
            file: f,
            said_full: Default::default(),
        }))
    }

    /// `frame_len` bytes placed so that `value_at` bytes in is a multiple
    /// of 64 from the area's start (page-aligned), first fit.
    fn lend(self: &Arc<Self>, frame_len: usize, value_at: usize) -> Option<Landing> {
        let base = NonNull::new(self.map.as_mut_ptr())?;
        let start = {
            let mut g = self.free.lock();
            let (free, reserved) = &mut *g;
            let (i, start) = free.iter().enumerate().find_map(|(i, &(s, l))| {
                let skip = (64 - (s + value_at) % 64) % 64;
                (skip + frame_len <= l).then_some((i, s + skip))
            })?;
            // No room in /dev/shm: the value is copied into the arena
            // instead, as when the area is full.
            if let Err(e) = reserve(&self.file, reserved, start + frame_len, self.map.len()) {
                if !self.said_full.swap(true, Ordering::Relaxed) {
                    tracing::warn!("large values go through the workers' arenas: {e}");
                }
                return None;
            }
            let (s, l) = free[i];
            let mut rest = Vec::with_capacity(2);
            if start > s {
                rest.push((s, start - s));
            }
            if s + l > start + frame_len {
                rest.push((start + frame_len, s + l - start - frame_len));
            }
            free.splice(i..=i, rest);
            start
        };
        let area = self.clone();
        // SAFETY: `start + frame_len` is inside the mapping (a free range
        // of it), that range is lent once until `give_back`, and the
        // closure's `Arc` keeps the mapping alive until then.
        unsafe {
            Some(Landing::new(base.add(start), frame_len, move || {
                area.give_back(start, frame_len)
            }))
        }
    }

    fn give_back(&self, start: usize, len: usize) {
        let mut g = self.free.lock();
        let free = &mut g.0;
        let i = free.partition_point(|&(s, _)| s < start);
        free.insert(i, (start, len));
        // Merge with the next range, then with the previous one.
        if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
            free[i].1 += free[i + 1].1;
            free.remove(i + 1);
        }
        if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
            free[i - 1].1 += free[i].1;
            free.remove(i);
        }
    }

    /// Where `value` lies in the area, if it is there.
    fn offset_of(&self, value: &[u8]) -> Option<usize> {
        let base = self.map.as_ptr() as usize;
        let at = value.as_ptr() as usize;
        (at >= base && at + value.len() <= base + self.map.len() && !value.is_empty())
            .then(|| at - base)
    }

    #[cfg(test)]
    fn free_ranges(&self) -> Vec<(usize, usize)> {
        self.free.lock().0.clone()
    }
}

/// One worker process and its region.
struct Proc {
    child: Child,
    map: memmap2::MmapMut,
    /// The region's file, and how far its pages are reserved for what
    /// this side writes (the header, the rings, the input arena:
    /// `reserve`; the worker reserves its output arena itself).
    file: std::fs::File,
    reserved: usize,
    layout: Layout,
    to_worker: OwnedFd,
    to_node: OwnedFd,
    path: PathBuf,
    call_id: u64,
    spin: Duration,
    stream_copy: bool,
    /// Recent wait for an answer, by the worker's stamps (µs, moving
    /// average): see `spin_budget`.
    wait_ewma_us: f64,
    /// The vertex's count of wake-ups, and how many of the worker's own
    /// (`H_WORKER_SLEEPS`) it holds so far.
    wakeups: Arc<Wakeups>,
    worker_sleeps_seen: u64,
}

/// How often a Python vertex's sides blocked for each other instead of
/// finding the message while polling (`sluice dfg list`): each block costs
/// an eventfd wake-up, tens to hundreds of microseconds on a busy machine
/// (`spin_us`, `worker_spin_us`).
#[derive(Default)]
struct Wakeups {
    /// The node, waiting for a worker's answer.
    node: AtomicU64,
    /// Workers, waiting for a request.
    worker: AtomicU64,
}

/// How a worker ended, for messages.
fn exit_text(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (_, Some(sig)) => format!("killed by signal {sig}"),
        (Some(c), _) => format!("exited with code {c}"),
        _ => "ended".into(),
    }
}

/// Whether the slot at `tail` of a ring the worker writes holds a
/// published answer: yes once the worker's head has passed it, no while
/// they are equal. A head behind the tail, or past it by more than the
/// ring holds, is a worker that broke the protocol (workers used to write
/// their head a byte at a time, and the node read slots not yet written).
fn published(head: u64, tail: u64) -> Result<bool, String> {
    match head.checked_sub(tail) {
        Some(0) => Ok(false),
        Some(n) if n <= SLOTS as u64 => Ok(true),
        _ => Err(format!(
            "python worker: its response ring's head {head} is not within the ring's {SLOTS} slots after the node's tail {tail}"
        )),
    }
}

impl Proc {
    fn index(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is an 8-aligned offset inside the header of a live
        // mapping; both processes access it only as an atomic u64.
        unsafe { &*(self.map.as_ptr().add(at) as *const AtomicU64) }
    }

    fn start(
        spec: &PythonSpec,
        dir: &Path,
        n: usize,
        wakeups: Arc<Wakeups>,
    ) -> Result<Proc, String> {
        let layout = Layout::new(spec.arena_bytes);
        let path = dir.join(format!("worker-{n}.shm"));
        let f = shared_file(&path, layout.size)?;
        let mut reserved = 0;
        reserve(&f, &mut reserved, layout.input, layout.size)?;
        // SAFETY: a file this node created for this worker alone, never
        // truncated while mapped.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }
            .map_err(|e| format!("mapping {}: {e}", path.display()))?;
        map[..8].copy_from_slice(MAGIC);
        map[8..12].copy_from_slice(&VERSION.to_le_bytes());
        let fields = [
            layout.req as u64,
            SLOTS as u64,
            layout.resp as u64,
            SLOTS as u64,
            layout.input as u64,
            layout.input_len as u64,
            layout.out as u64,
            layout.out_len as u64,
        ];
        for (i, v) in fields.iter().enumerate() {
            map[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        let to_worker = eventfd().map_err(|e| format!("eventfd: {e}"))?;
        let to_node = eventfd().map_err(|e| format!("eventfd: {e}"))?;
        let script = dir.join("sluice_worker.py");
        if !script.exists() {
            std::fs::write(&script, WORKER_PY)
                .map_err(|e| format!("writing {}: {e}", script.display()))?;
        }
        let spec_json = json!({
            "python_path": spec.python_path,
            "module": spec.module,
            "entry_class": spec.entry_class,
            "config": spec.config,
        })
        .to_string();
        let (tw, tn) = (to_worker.as_raw_fd(), to_node.as_raw_fd());
        let mut cmd = Command::new(&spec.python);
        cmd.arg(&script)
            .arg(&path)
            .arg(tw.to_string())
            .arg(tn.to_string());
        if spec.lands() {
            cmd.arg(dir.join(LANDING_FILE));
        }
        cmd.env("SLUICE_UDL_SPEC", spec_json)
            .env(
                "SLUICE_WORKER_SPIN_US",
                spec.worker_spin.as_micros().to_string(),
            )
            .env("PYTHONUNBUFFERED", "1")
            .env("SLUICE_NODE_PID", std::process::id().to_string());
        // SAFETY: between fork and exec only async-signal-safe fcntl calls:
        // the two eventfds stay open in the worker (they are CLOEXEC here).
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                for fd in [tw, tn] {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting {} for a python UDL: {e}", spec.python))?;
        // What the lambda prints goes to the node's log, saying whose.
        let who = format!("{}.{}", spec.module, spec.entry_class);
        if let Some(out) = child.stdout.take() {
            forward_output(out, who.clone(), child.id(), tracing::Level::INFO);
        }
        if let Some(err) = child.stderr.take() {
            forward_output(err, who, child.id(), tracing::Level::WARN);
        }
        let mut p = Proc {
            child,
            map,
            file: f,
            reserved,
            layout,
            to_worker,
            to_node,
            path,
            call_id: 0,
            spin: spec.spin,
            stream_copy: spec.stream_copy,
            wait_ewma_us: 0.0,
            wakeups,
            worker_sleeps_seen: 0,
        };
        // The worker says it is ready (its class loaded) with a DONE.
        match p.next_response(Instant::now(), spec.start_limit, None) {
            Ok(d) if d.kind == P_DONE => Ok(p),
            Ok(d) if d.kind == P_FAIL => {
                Err(String::from_utf8_lossy(p.out(d.a)?).trim().to_string())
            }
            Ok(d) => Err(format!("python worker: unexpected first message {d:?}")),
            Err(e) => Err(e),
        }
    }

    /// The next response descriptor, waiting until `limit` after `since`
    /// (when the worker started, or the call did), checking every 100 ms
    /// that the process lives.
    fn next_response(
        &mut self,
        since: Instant,
        limit: Duration,
        key: Option<&str>,
    ) -> Result<Desc, String> {
        let doing = || match key {
            Some(k) => format!("handling key {k}"),
            None => "starting".to_string(),
        };
        let t0 = Instant::now();
        let t0_ns = monotonic_ns();
        let spin = self.spin_budget();
        let mut spin_until = t0 + spin;
        let mut slept = false;
        loop {
            // Checked on every turn, not only after a quiet 100 ms: a
            // lambda that emits without end answers all the time.
            if since.elapsed() > limit {
                let setting = match key {
                    Some(_) => "call_timeout_s",
                    None => "start_timeout_s",
                };
                return Err(format!(
                    "python worker (pid {}) still {} after {limit:?} (the vertex's {setting}); stopped",
                    self.child.id(),
                    doing()
                ));
            }
            let tail = self.index(H_RESP_TAIL).load(Ordering::Acquire);
            if published(self.index(H_RESP_HEAD).load(Ordering::Acquire), tail)? {
                let at = self.layout.resp + (tail as usize % SLOTS) * DESC;
                let d = Desc::read(&self.map[at..at + DESC]);
                self.index(H_RESP_TAIL).store(tail + 1, Ordering::Release);
                self.count_wait(t0_ns, d.sent_ns);
                return Ok(d);
            }
            if Instant::now() < spin_until {
                std::hint::spin_loop();
                continue;
            }
            if !slept {
                slept = true;
                self.wakeups.node.fetch_add(1, Ordering::Relaxed);
            }
            if wait(&self.to_node, Duration::from_millis(100)) {
                spin_until = Instant::now() + spin;
            } else {
                if let Ok(Some(status)) = self.child.try_wait() {
                    return Err(format!(
                        "python worker (pid {}) {} while {}",
                        self.child.id(),
                        exit_text(status),
                        doing()
                    ));
                }
            }
        }
    }

    /// How long to spin for the worker's next answer: the budget while
    /// the recent waits average less (else spinning is mostly waste: a
    /// lambda computing for milliseconds), nothing otherwise. An answer's
    /// wait counts up to when the worker stamped it (`sent_ns`), not to
    /// when this side saw it: blocked, it sees an answer only once its
    /// eventfd wakes it, and a slow wake-up must not pass for a slow
    /// worker (that kept a node blocking for good on a loaded machine).
    /// A mean, not a share of quick answers: a call's first answer after
    /// a long computation and its quick last one alternate, and a share
    /// near one half had the node spin for the slow ones and block for
    /// the quick ones (BENCHMARKS.md, "A spin rule by the sender's stamp").
    fn spin_budget(&self) -> Duration {
        if self.wait_ewma_us < self.spin.as_micros() as f64 {
            self.spin
        } else {
            Duration::ZERO
        }
    }

    /// Counts an answer stamped `sent_ns` that was waited for from `t0_ns`.
    fn count_wait(&mut self, t0_ns: u64, sent_ns: u64) {
        let waited = sent_ns.saturating_sub(t0_ns) as f64 / 1000.0;
        self.wait_ewma_us = 0.8 * self.wait_ewma_us + 0.2 * waited;
    }

    /// Adds the worker's blocks since the last look to the vertex's count.
    fn count_worker_sleeps(&mut self) {
        let n = self.index(H_WORKER_SLEEPS).load(Ordering::Acquire);
        let new = n.saturating_sub(self.worker_sleeps_seen);
        self.worker_sleeps_seen = n;
        self.wakeups.worker.fetch_add(new, Ordering::Relaxed);
    }

    fn push(&mut self, mut d: Desc) {
        let head = self.index(H_REQ_HEAD).load(Ordering::Acquire);
        // One upcall and its replies at a time: the ring does not fill,
        // but a stuck worker must not be overrun.
        while head - self.index(H_REQ_TAIL).load(Ordering::Acquire) >= SLOTS as u64 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::yield_now();
        }
        let at = self.layout.req + (head as usize % SLOTS) * DESC;
        d.sent_ns = monotonic_ns();
        d.write(&mut self.map[at..at + DESC]);
        self.index(H_REQ_HEAD).store(head + 1, Ordering::Release);
        signal(&self.to_worker);
    }

    /// Bytes `(off, len)` of the region, checked to lie in `arena`.
    fn slice(&self, (off, len): (u64, u64), arena: (usize, usize)) -> Result<&[u8], String> {
        let (start, alen) = arena;
        let (o, l) = (off as usize, len as usize);
        if o < start || o.checked_add(l).is_none_or(|e| e > start + alen) {
            return Err(format!(
                "python worker: a range ({off}, {len}) outside its arena"
            ));
        }
        Ok(&self.map[o..o + l])
    }

    fn out(&self, r: (u64, u64)) -> Result<&[u8], String> {
        self.slice(r, (self.layout.out, self.layout.out_len))
    }

    /// Copies `parts` into the input arena from `from` on (an offset
    /// into the region), one after the other, each aligned to 64 bytes
    /// when its flag says so (values, for NumPy and the GPU; a page
    /// instead bought a GPU's copy nothing, BENCHMARKS.md "GPU"), values
    /// of `STREAM_MIN` bytes or more with streaming stores where the
    /// vertex asks (`stream_copy`); their (offset, len), and where the
    /// last one ends.
    fn put_input(
        &mut self,
        from: usize,
        parts: &[(&[u8], bool)],
    ) -> Result<(Vec<(u64, u64)>, usize), String> {
        let mut at = from.max(self.layout.input);
        let end = self.layout.input + self.layout.input_len;
        let mut out = Vec::with_capacity(parts.len());
        for (p, aligned) in parts {
            if *aligned {
                at = at.next_multiple_of(64);
            }
            if at + p.len() > end {
                return Err(format!(
                    "{} bytes do not fit the python worker's input arena ({} bytes, shared by an upcall's value and its store calls' replies; raise the vertex's \"arena_mb\")",
                    p.len(),
                    self.layout.input_len
                ));
            }
            reserve(
                &self.file,
                &mut self.reserved,
                at + p.len(),
                self.layout.size,
            )?;
            let dst = &mut self.map[at..at + p.len()];
            if self.stream_copy && p.len() >= STREAM_MIN {
                copy_streaming(dst, p);
            } else {
                dst.copy_from_slice(p);
            }
            out.push((at as u64, p.len() as u64));
            at += p.len();
        }
        Ok((out, at))
    }

    /// Stops a worker that is dead, silent or broken, so that its slot
    /// starts another for the next upcall.
    fn abandon(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.push(Desc {
                kind: R_STOP,
                ..Desc::default()
            });
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(2) {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `python` UDL: a pool of worker processes running one class.
pub struct PythonUdl {
    spec: PythonSpec,
    dir: PathBuf,
    landing: Option<Arc<LandingArea>>,
    procs: Vec<parking_lot::Mutex<Option<Proc>>>,
    wakeups: Arc<Wakeups>,
    /// `OWNER_LOCK`, locked while this lambda lives.
    _owner: std::fs::File,
}

/// The file in a Python lambda's directory (`/dev/shm/sluice-py-<pid>-<n>`:
/// its landing area, its worker script) that the node holds locked
/// (`flock`) for as long as the lambda runs. A node that dies without
/// removing the directory (SIGKILL, a crash) leaves it, landing area and
/// all (64 MiB of memory by default, in tmpfs: never freed by itself);
/// a directory whose lock can be taken is such a leftover.
const OWNER_LOCK: &str = "owner.lock";

/// Creates `dir`'s owner lock and takes it.
fn lock_owner(dir: &Path) -> Result<std::fs::File, String> {
    let path = dir.join(OWNER_LOCK);
    let f =
        std::fs::File::create(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "locking {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(f)
}

/// Removes the Python lambdas' directories in `base` that dead nodes
/// left: those whose owner lock can be taken (its holder is gone,
/// whatever its PID namespace), and those without one (made before the
/// lock existed) whose process is gone from this PID namespace. Returns
/// how many it removed.
fn sweep_stale(base: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("sluice-py-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = e.path();
        let stale = match std::fs::File::open(dir.join(OWNER_LOCK)) {
            // SAFETY: flock on a descriptor this block owns; the lock
            // taken goes with it.
            Ok(f) => unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 },
            Err(_) => !Path::new(&format!("/proc/{pid}")).exists(),
        };
        if stale && std::fs::remove_dir_all(&dir).is_ok() {
            removed += 1;
        }
    }
    removed
}

impl PythonUdl {
    pub fn from_config(c: &Value, ctx: &Context) -> Result<PythonUdl, String> {
        let spec = PythonSpec::from_config(c)?;
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        // Once per process: what nodes that died left behind.
        static SWEEP: std::sync::Once = std::sync::Once::new();
        SWEEP.call_once(|| {
            let n = sweep_stale(&base);
            if n > 0 {
                tracing::info!(removed = n, dir = %base.display(), "removed Python lambdas' directories that nodes which died left behind");
            }
        });
        let dir = base.join(format!(
            "sluice-py-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // A lambda that does not start (a class that does not load, a
        // missing interpreter) leaves nothing: its workers are stopped
        // (dropped in `start_in`) before the directory goes.
        Self::start_in(spec, dir.clone(), c, ctx).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })
    }

    /// Starts the lambda's workers in `dir`, made for it.
    fn start_in(
        mut spec: PythonSpec,
        dir: PathBuf,
        c: &Value,
        ctx: &Context,
    ) -> Result<PythonUdl, String> {
        let owner = lock_owner(&dir)?;
        // Code shipped as an object: the module's source is the value of
        // `code_key` (so one `dfg apply` after a put upgrades every node).
        if let Some(key) = c.get("code_key") {
            let key = key
                .as_str()
                .ok_or("code_key: the key of the module's source")?;
            let o = ctx.get(key).map_err(|e| {
                format!("code_key {key}: {e} (put the module's source there first)")
            })?;
            let code = dir.join("code");
            std::fs::create_dir_all(&code)
                .map_err(|e| format!("creating {}: {e}", code.display()))?;
            let file = code.join(format!("{}.py", spec.module.replace('.', "/")));
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("creating {}: {e}", parent.display()))?;
            }
            std::fs::write(&file, &o.value)
                .map_err(|e| format!("writing {}: {e}", file.display()))?;
            spec.python_path.insert(0, code.display().to_string());
        }
        // Before the workers, which map it.
        let landing = if spec.lands() {
            Some(LandingArea::create(
                &dir.join(LANDING_FILE),
                spec.landing_bytes,
            )?)
        } else {
            None
        };
        let mut procs = Vec::new();
        let wakeups = Arc::new(Wakeups::default());
        for n in 0..spec.workers {
            // Start them now: a class that fails to load fails `dfg apply`.
            let p = Proc::start(&spec, &dir, n, wakeups.clone())?;
            procs.push(parking_lot::Mutex::new(Some(p)));
        }
        tracing::info!(module = %spec.module, class = %spec.entry_class, workers = spec.workers, "python UDL started");
        Ok(PythonUdl {
            spec,
            dir,
            landing,
            procs,
            wakeups,
            _owner: owner,
        })
    }

    /// Runs one upcall on `p`: the value in, emits and store calls out,
    /// until the worker says done or failed.
    fn run(
        &self,
        p: &mut Proc,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        ctx: &Context,
    ) -> Result<(), UdlError> {
        let started = Instant::now();
        p.call_id += 1;
        let o = call.object;
        // A value read into the landing area is passed by its offset there.
        let landed = self.landing.as_ref().and_then(|a| a.offset_of(&o.value));
        let value: &[u8] = if landed.is_some() { &[] } else { &o.value };
        // b: the pool's pathname and the vertex's, NUL-separated.
        let (r, input_end) = p
            .put_input(
                0,
                &[
                    (call.key.as_bytes(), false),
                    (call.pool.as_bytes(), false),
                    (b"\0", false),
                    (call.vertex.as_bytes(), false),
                    (value, true),
                ],
            )
            .map_err(UdlError::Failed)?;
        let input = landed.map_or(r[4], |off| (off as u64, o.value.len() as u64));
        let where_ = (r[1].0, r[1].1 + 1 + r[3].1);
        p.push(Desc {
            kind: R_UPCALL,
            flags: if landed.is_some() { F_LANDED } else { 0 },
            call_id: p.call_id,
            version: o.meta.version,
            timestamp_us: o.meta.timestamp_us,
            worker_id: call.worker_id as u32,
            a: r[0],
            b: where_,
            c: input,
            previous_version: o.meta.previous_version,
            previous_version_by_key: o.meta.previous_version_by_key,
            sender: call.sender,
            ..Desc::default()
        });
        // The first error of this call. The worker is drained to its
        // done or failed whatever happens here: the next upcall must not
        // read this one's answers (a refused emit used to end the call
        // early, and the next call then took this one's completion).
        let mut failed: Option<UdlError> = None;
        let mut at = InFlight {
            input,
            input_end,
            value: &o.value,
        };
        loop {
            let d = match p.next_response(started, self.spec.call_limit, Some(call.key)) {
                Ok(d) => d,
                Err(e) => {
                    p.abandon(); // dead, or silent past the limit
                    return Err(UdlError::Failed(e));
                }
            };
            if d.call_id != p.call_id {
                continue; // an answer to an earlier call: never ours
            }
            if failed.is_some() && d.kind == P_EMIT {
                // After a refusal the call has failed: what it emits
                // later is dropped (what it emitted before stands).
                p.index(H_OUT_FREE).store(d.version, Ordering::Release);
                continue;
            }
            match answer(p, &d, &mut at, emit, ctx) {
                Ok(Some(end)) => return failed.map_or(end, Err),
                Ok(None) => {}
                Err(Answer::Refused(e)) => {
                    failed.get_or_insert(e);
                }
                Err(Answer::Broken(e)) => {
                    // What it sent cannot be read: it cannot be trusted.
                    // The answer itself goes into the message (a worker
                    // that breaks the protocol is rare and hard to catch
                    // again).
                    p.abandon();
                    return Err(UdlError::Failed(format!(
                        "{e} (its answer: kind {}, flags {}, call {}, ranges {:?} {:?}; the call's input at {:?})",
                        d.kind, d.flags, d.call_id, d.a, d.b, at.input
                    )));
                }
            }
        }
    }
}

/// One answer of the worker during an upcall: `Some` with the call's
/// outcome once it is done or failed.
fn answer(
    p: &mut Proc,
    d: &Desc,
    at: &mut InFlight<'_>,
    emit: &mut Emitter<'_>,
    ctx: &Context,
) -> Result<Option<Result<(), UdlError>>, Answer> {
    match d.kind {
        P_EMIT => {
            let suffix = String::from_utf8_lossy(p.out(d.a).map_err(Answer::Broken)?).into_owned();
            let value = if d.flags & F_INPUT_VALUE != 0 && d.b == at.input {
                at.value.clone()
            } else {
                Bytes::copy_from_slice(p.out(d.b).map_err(Answer::Broken)?)
            };
            p.index(H_OUT_FREE).store(d.version, Ordering::Release);
            emit.emit(&suffix, value).map_err(Answer::Refused)?;
            Ok(None)
        }
        P_CTX_CALL => {
            let args: Value =
                serde_json::from_slice(p.out(d.a).map_err(Answer::Broken)?).unwrap_or(Value::Null);
            let value = Bytes::copy_from_slice(p.out(d.b).map_err(Answer::Broken)?);
            p.index(H_OUT_FREE).store(d.version, Ordering::Release);
            let (status, meta, data) = store_call(ctx, &args, value);
            // After the upcall's bytes and the earlier replies: what
            // the lambda got from them stays valid until it returns.
            let (status, (r, end)) = match p.put_input(
                at.input_end,
                &[(meta.to_string().as_bytes(), false), (&data, true)],
            ) {
                Ok(r) => (status, r),
                // The reply does not fit: the lambda's call raises why.
                Err(why) => {
                    let meta = json!({ "message": why }).to_string();
                    let r = p
                        .put_input(at.input_end, &[(meta.as_bytes(), false), (&[], true)])
                        .map_err(Answer::Broken)?;
                    (1, r)
                }
            };
            at.input_end = end;
            p.push(Desc {
                kind: R_CTX_REPLY,
                call_id: p.call_id,
                status,
                a: r[0],
                b: r[1],
                ..Desc::default()
            });
            Ok(None)
        }
        P_DONE => {
            p.index(H_OUT_FREE).store(d.version, Ordering::Release);
            p.count_worker_sleeps();
            Ok(Some(Ok(())))
        }
        P_FAIL => {
            let msg = String::from_utf8_lossy(p.out(d.a).map_err(Answer::Broken)?).into_owned();
            p.index(H_OUT_FREE).store(d.version, Ordering::Release);
            p.count_worker_sleeps();
            Ok(Some(Err(UdlError::Failed(format!("python: {msg}")))))
        }
        other => Err(Answer::Broken(format!(
            "python worker: unknown message kind {other}"
        ))),
    }
}

/// Where an upcall's bytes are in the input arena: its value (which an
/// emit can hand back by reference), and the end of what the call has
/// been given so far (its value, then its store calls' replies).
struct InFlight<'a> {
    input: (u64, u64),
    input_end: usize,
    value: &'a Bytes,
}

/// Why an answer of the worker was not taken.
enum Answer {
    /// The store refused what the lambda asked (an emit): the call fails,
    /// the worker goes on.
    Refused(UdlError),
    /// The worker broke the protocol: it is stopped and replaced.
    Broken(String),
}

/// A lambda's store call (get, put, trigger_put, list_keys): status (0:
/// ok), metadata as JSON, and bytes.
fn store_call(ctx: &Context, args: &Value, value: Bytes) -> (i32, Value, Bytes) {
    let key = args["key"].as_str().unwrap_or_default();
    let res: Result<(Value, Bytes), sluice_types::SluiceError> = match args["op"].as_str() {
        Some("get") => {
            // Absent, or a whole number: anything else is refused, never
            // read as "the latest" (the worker checks first; this is the
            // node's own guard against a worker that does not).
            let number = |name: &str| match &args[name] {
                Value::Null => Ok(None),
                v => v.as_u64().map(Some).ok_or_else(|| {
                    sluice_types::SluiceError::invalid_argument(
                        name,
                        format!("{v} is not a whole number of at least 0"),
                    )
                }),
            };
            let got = match (number("version"), number("timestamp_us")) {
                (Err(e), _) | (_, Err(e)) => Err(e),
                (Ok(Some(_)), Ok(Some(_))) => Err(sluice_types::SluiceError::invalid_argument(
                    "read",
                    "give version or timestamp_us, not both",
                )),
                (Ok(Some(v)), _) => ctx.get_version(key, v),
                (_, Ok(Some(t))) => ctx.get_by_time(key, t),
                (Ok(None), Ok(None)) => ctx.get(key),
            };
            got.map(|o| {
                (
                    json!({"key": &*o.key, "version": o.meta.version, "timestamp_us": o.meta.timestamp_us}),
                    o.value.clone(),
                )
            })
        }
        Some("put") => ctx.put(key, value).map(|r| {
            (
                json!({"version": r.version, "timestamp_us": r.timestamp_us}),
                Bytes::new(),
            )
        }),
        Some("trigger_put") => ctx
            .trigger_put(key, value)
            .map(|ts| (json!({"timestamp_us": ts}), Bytes::new())),
        Some("list_keys") => ctx
            .list_keys(
                args["pool"].as_str().unwrap_or_default(),
                args["prefix"].as_str(),
            )
            .map(|keys| (json!({"keys": keys}), Bytes::new())),
        other => {
            return (
                1,
                json!({"message": format!("unknown store call {other:?}")}),
                Bytes::new(),
            )
        }
    };
    match res {
        Ok((meta, data)) => (0, meta, data),
        Err(e) => (
            1,
            json!({"message": e.to_string(), "error": e}),
            Bytes::new(),
        ),
    }
}

impl Udl for PythonUdl {
    fn handle(
        &self,
        call: &Upcall<'_>,
        emit: &mut Emitter<'_>,
        ctx: &Context,
    ) -> Result<(), UdlError> {
        let slot = &self.procs[call.worker_id % self.procs.len()];
        let mut g = slot.lock();
        if g.is_none() {
            *g = Some(
                Proc::start(
                    &self.spec,
                    &self.dir,
                    call.worker_id % self.procs.len(),
                    self.wakeups.clone(),
                )
                .map_err(UdlError::Failed)?,
            );
        }
        let p = g.as_mut().expect("started above");
        let r = self.run(p, call, emit, ctx);
        if let Err(e) = &r {
            // A dead worker is replaced for the next upcall.
            if !matches!(p.child.try_wait(), Ok(None)) {
                tracing::warn!(key = call.key, error = %e, "python worker ended (died, or stopped: broken or past its call_timeout_s); starting another");
                *g = None;
            }
        }
        r
    }

    /// Lends room in the vertex's landing area for the frame, placed so
    /// that its value starts on 64 bytes; none when the area is full (the
    /// node then reads the frame into its own buffer, and the value is
    /// copied into a worker's arena as usual).
    fn landing(&self, frame_len: usize, value_at: usize) -> Option<Landing> {
        self.landing.as_ref()?.lend(frame_len, value_at)
    }

    /// Wakes the idle workers (one not in a call: its slot is free), so
    /// that they poll their ring, for a while, when the upcall comes.
    fn counters(&self) -> Option<Value> {
        Some(json!({"wakeups": {
            "node": self.wakeups.node.load(Ordering::Relaxed),
            "worker": self.wakeups.worker.load(Ordering::Relaxed),
        }}))
    }

    fn expect(&self) {
        for slot in &self.procs {
            if let Some(g) = slot.try_lock() {
                if let Some(p) = g.as_ref() {
                    signal(&p.to_worker);
                }
            }
        }
    }
}

impl Drop for PythonUdl {
    fn drop(&mut self) {
        for p in &self.procs {
            p.lock().take();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    thread_local! {
        /// Makes `reserve` fail with this OS error (a full /dev/shm).
        pub(super) static RESERVE_FAILS: std::cell::Cell<Option<i32>> =
            const { std::cell::Cell::new(None) };
    }

    /// A full /dev/shm (a container's 64 MB) killed the node with SIGBUS
    /// once a large value landed past its room: ranges are reserved
    /// before they are written now, and without room a landing is not
    /// lent (the value goes through the arena) and a value that does not
    /// fit the arena's room fails its call, saying what to do.
    #[test]
    fn without_room_in_dev_shm_nothing_is_written_and_the_call_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let area = LandingArea::create(&dir.path().join(LANDING_FILE), 8 << 20).unwrap();
        RESERVE_FAILS.with(|f| f.set(Some(libc::ENOSPC)));
        assert!(area.lend(3 << 20, 100).is_none(), "lent without room");
        assert_eq!(area.free_ranges(), vec![(0, 8 << 20)], "nothing taken");
        let mut p = test_proc(dir.path(), Duration::ZERO);
        let e = p.put_input(0, &[(&[7u8; 1000], true)]).unwrap_err();
        assert!(e.contains("/dev/shm") && e.contains("--shm-size"), "{e}");
        RESERVE_FAILS.with(|f| f.set(None));
        let lent = area.lend(3 << 20, 100).expect("lent once there is room");
        drop(lent);
        let (parts, _) = p.put_input(0, &[(&[7u8; 1000], true)]).unwrap();
        assert_eq!(parts.len(), 1);
        assert!(p.reserved >= p.layout.input + 1000, "{}", p.reserved);
    }

    /// A response ring whose head reads behind its tail publishes
    /// nothing: the call fails as a broken worker. Workers wrote their
    /// head with `struct.pack_into`, which zeroes the field and then
    /// writes it a byte at a time: the node read a head of 0 (or its low
    /// byte), took it for one past its tail, read slots not yet written
    /// (skipped as answers to earlier calls), ran ahead of the worker
    /// round the ring, and read the slot the worker was writing: a new
    /// answer's kind and call, its ranges still zero ("a range (0, 0)
    /// outside its arena" in `sluice bench python-udl`).
    /// A `Proc` over an anonymous mapping, its "worker" a `sleep` (the
    /// test plays the worker's side of the rings).
    fn test_proc(dir: &Path, spin: Duration) -> Proc {
        let layout = Layout::new(4096);
        Proc {
            child: Command::new("sleep").arg("30").spawn().unwrap(),
            map: memmap2::MmapMut::map_anon(layout.size).unwrap(),
            file: shared_file(&dir.join("worker-0.shm"), layout.size).unwrap(),
            reserved: 0,
            layout,
            to_worker: eventfd().unwrap(),
            to_node: eventfd().unwrap(),
            path: dir.join("worker-0.shm"),
            call_id: 1,
            spin,
            stream_copy: false,
            wait_ewma_us: 0.0,
            wakeups: Arc::default(),
            worker_sleeps_seen: 0,
        }
    }

    #[test]
    fn a_head_behind_the_tail_publishes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = test_proc(dir.path(), Duration::ZERO);
        // Five answers taken; the worker is writing its head for the
        // sixth (zeroed so far) and the slot holds an answer not yet
        // published.
        p.index(H_RESP_TAIL).store(5, Ordering::Release);
        p.index(H_RESP_HEAD).store(0, Ordering::Release);
        let at = p.layout.resp + 5 * DESC;
        Desc {
            kind: P_DONE,
            call_id: 1,
            ..Desc::default()
        }
        .write(&mut p.map[at..at + DESC]);
        let r = p.next_response(Instant::now(), Duration::from_millis(150), None);
        assert!(r.is_err(), "an unpublished slot was taken: {r:?}");
        assert!(r.unwrap_err().contains("response ring's head 0"));
        assert_eq!(p.index(H_RESP_TAIL).load(Ordering::Acquire), 5);
        // Nor does a head past what the ring holds.
        p.index(H_RESP_HEAD)
            .store(5 + SLOTS as u64 + 1, Ordering::Release);
        assert!(p
            .next_response(Instant::now(), Duration::from_millis(150), None)
            .is_err());
        assert_eq!(p.index(H_RESP_TAIL).load(Ordering::Acquire), 5);
        // Equal: nothing yet, the node waits (here until the limit).
        p.index(H_RESP_HEAD).store(5, Ordering::Release);
        let r = p.next_response(Instant::now(), Duration::from_millis(150), None);
        assert!(r.is_err_and(|e| e.contains("still starting after")));
        // Published, it is taken.
        p.index(H_RESP_HEAD).store(6, Ordering::Release);
        let d = p
            .next_response(Instant::now(), Duration::from_millis(150), None)
            .unwrap();
        assert_eq!((d.kind, d.call_id), (P_DONE, 1));
        assert_eq!(p.index(H_RESP_TAIL).load(Ordering::Acquire), 6);
        let _ = p.child.kill();
        let _ = p.child.wait();
    }

    /// A node that stopped spinning (its worker's answers came late)
    /// spins again once they come soon again, however late it sees them:
    /// blocked, it learns of an answer only when its eventfd wakes it,
    /// and on a loaded machine that wake-up alone can take longer than
    /// the spin budget. Measured up to when it saw the answer, that wait
    /// kept the node blocking for good (each wait a slow wake-up longer
    /// than the budget): `sluice bench python-udl` fell into a slow mode
    /// for whole runs.
    #[test]
    fn answers_sent_soon_bring_spinning_back_however_late_they_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let budget = Duration::from_micros(300);
        let mut p = test_proc(dir.path(), budget);
        let head = p.index(H_RESP_HEAD) as *const AtomicU64 as usize;
        let fd = p.to_node.as_raw_fd();
        // Answer `i`, stamped `sent` (now when None), published and
        // signalled after `delay`.
        let answer = |p: &mut Proc, i: u64, sent: Option<u64>, delay: Duration| {
            let at = p.layout.resp + (i as usize % SLOTS) * DESC;
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(delay);
                    let d = Desc {
                        kind: P_DONE,
                        call_id: 1,
                        sent_ns: sent.unwrap_or_else(monotonic_ns),
                        ..Desc::default()
                    };
                    // SAFETY: the slot and head are the mapping's, which
                    // outlives this scope; the node reads the slot only
                    // once the head says it is written.
                    let map = unsafe {
                        std::slice::from_raw_parts_mut((head - H_RESP_HEAD + at) as *mut u8, DESC)
                    };
                    d.write(map);
                    // SAFETY: the mapping's 8-aligned head, only ever
                    // accessed as an atomic u64.
                    unsafe { &*(head as *const AtomicU64) }.store(i + 1, Ordering::Release);
                    let one: u64 = 1;
                    // SAFETY: 8 bytes to the eventfd the node waits on.
                    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
                });
                let d = p
                    .next_response(Instant::now(), Duration::from_secs(10), None)
                    .unwrap();
                assert_eq!(d.kind, P_DONE);
            });
        };
        let mut i = 0;
        // Answers that take 5 ms: spinning for them is waste, and it stops
        // within a few (a few more where this thread lost the CPU for
        // longer than the writer's 5 ms before it started waiting).
        while p.spin_budget() > Duration::ZERO && i < 40 {
            answer(&mut p, i, None, Duration::from_millis(5));
            i += 1;
        }
        assert_eq!(p.spin_budget(), Duration::ZERO, "answers beyond the budget");
        // Answers sent at once, seen 2 ms later (a slow wake-up): the
        // node spins again within a few (the average decays).
        while p.spin_budget() == Duration::ZERO && i < 40 {
            let sent = monotonic_ns();
            answer(&mut p, i, Some(sent), Duration::from_millis(2));
            i += 1;
        }
        assert_eq!(p.spin_budget(), budget, "answers sent within the budget");
        let _ = p.child.kill();
        let _ = p.child.wait();
    }

    /// What a node killed with SIGKILL leaves in /dev/shm (its lambdas'
    /// landing areas: 64 MiB each) is removed by the next node's first
    /// Python lambda; a live lambda's directory is not, nor anything else.
    #[test]
    fn directories_dead_nodes_left_are_swept_and_live_ones_kept() {
        let base = tempfile::tempdir().unwrap();
        let mk = |name: &str| {
            let d = base.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(LANDING_FILE), b"x").unwrap();
            d
        };
        // A process that has exited: its PID is free.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        // Left by a dead node, its lock free.
        let left = mk(&format!("sluice-py-{dead}-3"));
        drop(lock_owner(&left).unwrap());
        // A live lambda's, its lock held (here, as by another node).
        let live = mk(&format!("sluice-py-{dead}-4"));
        let held = lock_owner(&live).unwrap();
        // Made before the lock existed: by a dead process, by a live one.
        let old_dead = mk(&format!("sluice-py-{dead}-5"));
        let old_live = mk(&format!("sluice-py-{me}-6"));
        let other = mk("something-else");
        assert_eq!(sweep_stale(base.path()), 2);
        assert!(!left.exists() && !old_dead.exists());
        assert!(live.exists() && old_live.exists() && other.exists());
        drop(held);
        assert_eq!(sweep_stale(base.path()), 1, "its holder gone");
        assert!(!live.exists());
    }

    fn area(size: usize) -> (tempfile::TempDir, Arc<LandingArea>) {
        let dir = tempfile::tempdir().unwrap();
        let a = LandingArea::create(&dir.path().join(LANDING_FILE), size).unwrap();
        (dir, a)
    }

    #[test]
    fn a_landed_value_starts_on_64_bytes_and_its_range_comes_back_with_its_last_slice() {
        let (_d, a) = area(1 << 20);
        let mut l = a.lend(300_000, 37).unwrap();
        l.put_slice(&[9u8; 300_000]);
        let frame = l.into_bytes();
        let value = frame.slice(37..);
        drop(frame);
        let off = a.offset_of(&value).unwrap();
        assert_eq!(off % 64, 0, "the value is aligned");
        assert!(value.iter().all(|&b| b == 9));
        assert!(a.offset_of(b"elsewhere").is_none());
        assert_ne!(
            a.free_ranges(),
            vec![(0, 1 << 20)],
            "lent while the value lives"
        );
        drop(value);
        assert_eq!(a.free_ranges(), vec![(0, 1 << 20)], "whole again");
    }

    #[test]
    fn a_full_area_lends_nothing_and_freed_ranges_merge_whatever_the_order() {
        let (_d, a) = area(1 << 20);
        let lent: Vec<Landing> = (0..3).map(|_| a.lend(300_000, 0).unwrap()).collect();
        assert!(a.lend(300_000, 0).is_none(), "no room for a fourth");
        assert!(a.lend(100_000, 0).is_some(), "room for a smaller one");
        let mut lent: Vec<Option<Landing>> = lent.into_iter().map(Some).collect();
        for i in [1, 0, 2] {
            lent[i] = None; // dropped unfilled: a connection that died
        }
        assert_eq!(a.free_ranges(), vec![(0, 1 << 20)]);
        assert!(a.lend(1 << 20, 0).is_some(), "one frame may take it all");
    }

    #[test]
    fn the_node_and_its_workers_spin_for_budgets_of_their_own() {
        let spec = |extra: Value| {
            let mut c = json!({"module": "m", "entry_class": "C"});
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            PythonSpec::from_config(&c)
        };
        let d = spec(json!({})).unwrap();
        assert_eq!(
            (d.spin, d.worker_spin),
            (Duration::from_micros(300), Duration::from_micros(1000))
        );
        let s = spec(json!({"spin_us": 0, "worker_spin_us": 50})).unwrap();
        assert_eq!(
            (s.spin, s.worker_spin),
            (Duration::ZERO, Duration::from_micros(50))
        );
        let e = spec(json!({"worker_spin_us": -1})).err().unwrap();
        assert!(e.contains("worker_spin_us"), "{e}");
    }

    #[test]
    fn landing_is_off_where_values_are_copied_for_a_gpu() {
        let spec = |c: Value| PythonSpec::from_config(&c).unwrap();
        let base = json!({"module": "m", "entry_class": "C"});
        assert!(spec(base.clone()).lands());
        let with = |k: &str, v: Value| {
            let mut c = base.clone();
            c[k] = v;
            spec(c)
        };
        assert!(!with("pin_cuda", json!(true)).lands());
        assert!(!with("stream_copy", json!(true)).lands());
        assert!(!with("landing_mb", json!(0)).lands());
        assert!(PythonSpec::from_config(
            &json!({"module": "m", "entry_class": "C", "landing_mb": 5000})
        )
        .is_err());
    }

    #[test]
    fn streaming_copy_matches_a_plain_copy_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 31 % 251) as u8).collect();
        for (off, len) in [
            (0, 0),
            (1, 15),
            (3, 16),
            (0, 17),
            (5, 4096),
            (7, 65_536 + 13),
        ] {
            let mut buf = vec![0xAAu8; len + 64];
            copy_streaming(&mut buf[off..off + len], &src[..len]);
            assert_eq!(
                &buf[off..off + len],
                &src[..len],
                "offset {off}, length {len}"
            );
            assert!(
                buf[..off].iter().all(|&b| b == 0xAA),
                "wrote before the range"
            );
            assert!(
                buf[off + len..].iter().all(|&b| b == 0xAA),
                "wrote past the range"
            );
        }
    }
}
