//! The extension's tokio runtimes, and the one place a Rust future meets
//! Python: awaited with the GIL released (blocking calls), or started and
//! its result handed to the asyncio event loop (`Exec`).
//!
//! Two ways to run a client's calls:
//! - **Shared**: on the extension's multi-threaded runtime (`rt()`). A
//!   blocking `sluice.Client` uses it (any thread may call, the GIL is
//!   released while waiting).
//! - **Driven by the event loop** (`sluice.AsyncClient.connect`): the
//!   client gets a single-threaded runtime of its own that only the
//!   event loop's thread turns (`Exec::turn`): the loop watches the
//!   runtime's epoll descriptor (`loop.add_reader`) and turns it when a
//!   socket is ready or after it started calls. A call then never leaves
//!   the loop's thread: no thread is woken to start it or to hand back its
//!   result. On a machine with few cores each of those wake-ups costs more
//!   CPU than the call itself (BENCHMARKS: "An asyncio client's calls on
//!   the event loop's thread").

use crate::errors;
use parking_lot::Mutex;
use pyo3::prelude::*;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Poll, Waker};
use std::time::Duration;

/// The shared runtime of this process: made on first use, and again in
/// a child process after a fork (the parent's threads do not exist
/// there, so its runtime would never run a task or fire a timer: every
/// call hung). The parent's runtime is left as it is in the child, never
/// dropped (dropping it would wait for those threads).
/// The longest wait, lease or period a Python caller gets: a longer one
/// (`float("inf")` among them) is this. A deadline past the clock's range
/// panicked ("overflow when adding duration to instant", a
/// `PanicException` that `except Exception` does not catch).
pub const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `s` seconds as a duration of at most `LONGEST`; `None` for a negative
/// number or NaN.
pub fn seconds(s: f64) -> Option<Duration> {
    (s >= 0.0).then(|| {
        Duration::try_from_secs_f64(s)
            .unwrap_or(LONGEST)
            .min(LONGEST)
    })
}

pub fn rt() -> &'static tokio::runtime::Runtime {
    static CURRENT: std::sync::atomic::AtomicPtr<tokio::runtime::Runtime> =
        std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    static MADE_IN: AtomicU64 = AtomicU64::new(u64::MAX);
    static MAKING: Mutex<()> = Mutex::new(());
    let here = process();
    if MADE_IN.load(Ordering::Acquire) != here {
        let _g = MAKING.lock();
        if MADE_IN.load(Ordering::Acquire) != here {
            let made = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("sluice-io")
                .enable_all()
                .build()
                .expect("the Sluice client's runtime starts");
            CURRENT.store(Box::into_raw(Box::new(made)), Ordering::Release);
            MADE_IN.store(here, Ordering::Release);
        }
    }
    // SAFETY: set above (or earlier, for this process) from a leaked box,
    // never freed.
    unsafe { &*CURRENT.load(Ordering::Acquire) }
}

/// Forks this process has gone through (0 in the one that imported the
/// extension, then one more in each child): what a client records when
/// it is made, to tell a client made before a fork.
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn after_fork_in_child() {
    FORKS.fetch_add(1, Ordering::AcqRel);
}

/// Counts forks from now on (called once, when the module loads).
pub fn watch_forks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only bumps an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

/// Which process (fork generation) this is.
pub fn process() -> u64 {
    FORKS.load(Ordering::Acquire)
}

/// Refuses the use of a client (or of a watch, stream or queue over one)
/// made before this process forked: its connections are the parent's
/// sockets (a request sent on them here could be answered to the parent,
/// request ids and all) and its tasks ran on the parent's threads.
pub fn check_process(made_in: u64) -> PyResult<()> {
    if made_in == process() {
        return Ok(());
    }
    Err(errors::to_py(sluice_types::SluiceError::Connection {
        reason: "this client was made before the process forked: its connections belong to the \
                 parent process; make a new sluice.Client in this one (each multiprocessing or \
                 DataLoader worker its own)"
            .into(),
    }))
}

/// `py.detach(f)` (runs `f` with the GIL released), except that a thread
/// other than the process's main one that comes back while the
/// interpreter is finalizing stays here for good instead of attaching
/// again. Before 3.14, CPython ends such a thread (a daemon thread
/// blocked in a call or a watch's `next` when the program exits) with
/// `pthread_exit`, whose unwinding through Rust frames aborted the whole
/// process ("FATAL: exception not rethrown", exit code 134); Python 3.14
/// hangs such threads itself, as this does. The main thread is the one
/// that finalizes, and may attach.
pub fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    py.detach(|| {
        let r = f();
        if finalizing() && !main_thread() {
            loop {
                std::thread::park();
            }
        }
        r
    })
}

/// Whether the interpreter is finalizing: `Py_IsFinalizing` (3.13+) or
/// `_Py_IsFinalizing` (before), found at run time (neither is in
/// pyo3's bindings for every version); both read one atomic and may be
/// called without the GIL. `false` where neither is found.
fn finalizing() -> bool {
    type IsFinalizing = unsafe extern "C" fn() -> std::os::raw::c_int;
    static CHECK: OnceLock<Option<IsFinalizing>> = OnceLock::new();
    let check = CHECK.get_or_init(|| {
        [c"Py_IsFinalizing", c"_Py_IsFinalizing"]
            .into_iter()
            .find_map(|name| {
                // SAFETY: a lookup in the loaded objects by a valid C string.
                let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
                // SAFETY: both symbols are `int (void)` functions.
                (!p.is_null())
                    .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, IsFinalizing>(p) })
            })
    });
    // SAFETY: see above; no GIL needed.
    check.is_some_and(|f| unsafe { f() } != 0)
}

/// Whether this is the process's main thread (its thread id is the pid).
fn main_thread() -> bool {
    // SAFETY: gettid and getpid cannot fail.
    unsafe { libc::gettid() == libc::getpid() }
}

/// Converts a Rust result to its Python value (with the GIL held).
pub type Convert<T> = fn(Python<'_>, T) -> PyResult<Py<PyAny>>;

/// A finished asynchronous call, waiting for the event loop to take it:
/// its asyncio future, and how to make its result (on the loop's thread).
type Done = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// Finished asynchronous calls of one client. No runtime thread takes the
/// GIL: what finished is queued, and the only thread that touches Python
/// objects is the event loop's, which takes everything queued at once
/// (`Client._drain`, or with `Client._turn`). On the shared runtime the
/// first call queued signals an eventfd that the loop watches, so a
/// burst of completions costs one wake-up; a driven client's calls finish
/// on the loop's thread itself and signal nothing.
pub struct Completions {
    queue: Mutex<Vec<(Py<PyAny>, Done)>>,
    /// The eventfd signalled when the queue stops being empty (clients on
    /// the shared runtime; a driven client has none).
    fd: Option<OwnedFd>,
    in_flight: AtomicUsize,
}

impl Completions {
    fn new(signal: bool) -> std::io::Result<Completions> {
        let fd = if signal {
            // SAFETY: eventfd returns a new descriptor or -1.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: a fresh descriptor owned here.
            Some(unsafe { OwnedFd::from_raw_fd(fd) })
        } else {
            None
        };
        Ok(Completions {
            queue: Mutex::new(Vec::new()),
            fd,
            in_flight: AtomicUsize::new(0),
        })
    }

    fn push(&self, future: Py<PyAny>, done: Done) {
        let was_empty = {
            let mut q = self.queue.lock();
            q.push((future, done));
            q.len() == 1
        };
        self.in_flight.fetch_sub(1, Ordering::Release);
        if let (true, Some(fd)) = (was_empty, &self.fd) {
            let one: u64 = 1;
            // SAFETY: 8 bytes from a valid u64 to an eventfd.
            unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// Completes the asyncio future of everything finished so far (a
    /// future cancelled meanwhile is left as it is) and resets the
    /// eventfd. Done here rather than in Python: no tuple per call, no
    /// loop in the interpreter.
    fn resolve(&self, py: Python<'_>) {
        if let Some(fd) = &self.fd {
            let mut v: u64 = 0;
            // SAFETY: reading 8 bytes into a u64 from a non-blocking eventfd.
            unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
        let items = std::mem::take(&mut *self.queue.lock());
        for (fut, done) in items {
            let fut = fut.bind(py);
            let set = match done(py) {
                Ok(v) => fut.call_method1(pyo3::intern!(py, "set_result"), (v,)),
                Err(e) => fut.call_method1(pyo3::intern!(py, "set_exception"), (e.into_value(py),)),
            };
            // Only a cancelled future refuses its result (`InvalidStateError`);
            // anything else is reported (`sys.unraisablehook`), and the
            // other futures are still completed.
            if let Err(e) = set {
                let cancelled = fut
                    .call_method0(pyo3::intern!(py, "cancelled"))
                    .and_then(|c| c.is_truthy())
                    .unwrap_or(false);
                if !cancelled {
                    e.write_unraisable(py, Some(fut));
                }
            }
        }
    }
}

/// A client's own single-threaded runtime, turned by the event loop.
struct Driven {
    rt: tokio::runtime::Runtime,
    idle: Arc<Idle>,
    /// Calls started since the last turn, spawned by the next one (from
    /// inside the runtime: a spawn from outside would signal the runtime
    /// through its eventfd, one more system call per call).
    started: Mutex<Vec<Call>>,
}

/// An asynchronous call, until a turn spawns it.
type Call = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// How a turn knows the runtime has nothing left to do: tokio calls its
/// park hook when no task is ready, just before it looks for I/O; if the
/// epoll descriptor has nothing either, the turn ends (otherwise the
/// events it finds would wake tasks that no turn runs until the next one).
struct Idle {
    turning: AtomicBool,
    idle: AtomicBool,
    waker: Mutex<Option<Waker>>,
    /// The runtime's epoll descriptor: readable when one of its sockets is
    /// (known once the runtime is built, hence atomic).
    epfd: AtomicUsize,
}

impl Idle {
    fn on_park(&self) {
        if !self.turning.load(Ordering::Acquire) {
            return;
        }
        let epfd = self.epfd.load(Ordering::Relaxed) as RawFd;
        self.idle.store(!readable(epfd), Ordering::Release);
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }
}

/// Whether `fd` is readable now (without waiting).
fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
}

/// Whether epoll descriptor `epfd` watches descriptor `fd`.
fn watches(epfd: RawFd, fd: RawFd) -> bool {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{epfd}")).is_ok_and(|info| {
        info.lines().any(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some("tfd:") && w.next() == Some(&fd.to_string())
        })
    })
}

/// The epoll descriptors this process has open (from `/proc/self/fd`).
fn epoll_fds() -> std::io::Result<Vec<RawFd>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd")? {
        let e = e?;
        let is_epoll = std::fs::read_link(e.path())
            .map(|l| l.as_os_str() == "anon_inode:[eventpoll]")
            .unwrap_or(false);
        if let (true, Ok(fd)) = (is_epoll, e.file_name().to_string_lossy().parse()) {
            v.push(fd);
        }
    }
    Ok(v)
}

/// How often the anchor's timer comes due at most (see `anchor`).
const ANCHOR_EVERY: Duration = Duration::from_millis(250);

/// The anchor's period for a client whose calls' timers (request,
/// attempt, reconnect) come due after `shortest` at the soonest: half that (a call's deadline then always
/// comes after the anchor's), at most `ANCHOR_EVERY`, at least 1 ms.
fn anchor_every(shortest: Duration) -> Duration {
    (shortest / 2).clamp(Duration::from_millis(1), ANCHOR_EVERY)
}

/// Keeps a timer in the runtime's timer wheel at all times. When tokio's
/// time driver parks with no timer in its wheel, every timer armed before
/// it parks again (each call arms one, for its timeout) signals the
/// runtime's eventfd, in case the new deadline is sooner than the park's:
/// a `write` per call. With this timer due within `every`, sooner than
/// any call's deadline, a call's timer signals nothing. A driven runtime
/// runs only inside a turn, so the anchor costs nothing while the client
/// is idle.
async fn anchor(every: Duration) {
    loop {
        tokio::time::sleep(every).await;
    }
}

impl Driven {
    /// A runtime for one client, or `None` where its epoll descriptor
    /// cannot be found (not Linux, no `/proc`): the client then runs on
    /// the shared runtime.
    fn new(anchor_every: Duration) -> Option<Driven> {
        let idle = Arc::new(Idle {
            turning: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            waker: Mutex::new(None),
            epfd: AtomicUsize::new(0),
        });
        let hook = idle.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(move || hook.on_park())
            .build()
            .ok()?;
        // Which epoll descriptor is the runtime's: the one a socket
        // registered with the runtime shows up in (`/proc/self/fdinfo`
        // lists an epoll descriptor's targets).
        let (probe, _peer) = std::os::unix::net::UnixStream::pair().ok()?;
        probe.set_nonblocking(true).ok()?;
        let probe_fd = probe.as_raw_fd();
        let registered = rt
            .block_on(async move { tokio::net::UnixStream::from_std(probe) })
            .ok()?;
        let epfd = epoll_fds()
            .ok()?
            .into_iter()
            .find(|fd| watches(*fd, probe_fd))?;
        rt.block_on(async move { drop(registered) });
        idle.epfd.store(epfd as usize, Ordering::Relaxed);
        rt.spawn(anchor(anchor_every));
        Some(Driven {
            rt,
            idle,
            started: Mutex::new(Vec::new()),
        })
    }

    /// Queues a call for the next turn; `true` when it is the first since
    /// the last turn (the loop must schedule one).
    fn start(&self, call: Call) -> bool {
        let mut q = self.started.lock();
        q.push(call);
        q.len() == 1
    }

    /// Starts the calls queued, then runs every task that can go on,
    /// reading what the sockets have, until nothing is left to do, or for
    /// at most `MAX_ROUNDS` looks at the sockets: then `true`, and the
    /// loop must turn the runtime again soon (data that keeps arriving,
    /// a busy watch, must not hold the event loop).
    fn turn(&self) -> bool {
        const MAX_ROUNDS: u32 = 16;
        let idle = self.idle.clone();
        let started = std::mem::take(&mut *self.started.lock());
        idle.turning.store(true, Ordering::Release);
        let mut started = Some(started);
        let mut rounds = 0;
        let more = self.rt.block_on(std::future::poll_fn(|cx| {
            for call in started.take().into_iter().flatten() {
                tokio::spawn(call);
            }
            if idle.idle.swap(false, Ordering::AcqRel) {
                return Poll::Ready(false);
            }
            if rounds == MAX_ROUNDS {
                return Poll::Ready(true);
            }
            rounds += 1;
            *idle.waker.lock() = Some(cx.waker().clone());
            Poll::Pending
        }));
        idle.turning.store(false, Ordering::Release);
        more
    }
}

/// Where a client's calls run, and where their results go (see the
/// module's comment). Cloned into the client's watches.
#[derive(Clone)]
pub struct Exec {
    completions: Arc<Completions>,
    driven: Option<Arc<Driven>>,
    closing: Arc<Closing>,
    /// The process it was made in (`process`).
    made_in: u64,
}

/// An asyncio client closed (`Exec::close`): once it is, nothing turns its
/// runtime or completes its futures, so its calls in flight end at once
/// with an error, and new ones are refused.
#[derive(Default)]
struct Closing {
    closed: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Closing {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Resolves once the client is closed.
    async fn closed(&self) {
        loop {
            // Made before the check: a close after it still wakes it.
            let woken = self.notify.notified();
            if self.is_closed() {
                return;
            }
            woken.await;
        }
    }
}

/// What a call of a closed client raises (the blocking client's are
/// refused in Python, with this error).
#[pyfunction]
pub fn _closed_error(py: Python<'_>) -> Py<PyAny> {
    errors::to_py(closed_error(false)).into_value(py).into_any()
}

/// What an asyncio call of a closed client gets.
fn closed_error(in_flight: bool) -> sluice_types::SluiceError {
    sluice_types::SluiceError::Connection {
        reason: if in_flight {
            "the client was closed with this call in flight".into()
        } else {
            "the client is closed".into()
        },
    }
}

impl Exec {
    /// On the shared runtime, or (`driven`) on a runtime of its own that
    /// the event loop turns, where one can be had; `shortest` is the
    /// soonest a call of the client times out.
    pub fn new(driven: bool, shortest: Duration) -> std::io::Result<Exec> {
        let driven = if driven {
            Driven::new(anchor_every(shortest)).map(Arc::new)
        } else {
            None
        };
        Ok(Exec {
            completions: Arc::new(Completions::new(driven.is_none())?),
            driven,
            closing: Arc::default(),
            made_in: process(),
        })
    }

    /// Closes an asyncio client: its calls in flight (and those of its
    /// watches) end with `ConnectionError` and their futures are completed
    /// now (`resolve`: false where the event loop is closed already, so
    /// nothing may be scheduled on it); later calls are refused.
    pub fn close(&self, py: Python<'_>, resolve: bool) {
        self.closing.close();
        match &self.driven {
            // The calls see it when the runtime next runs them: now.
            Some(d) => {
                detach(py, || while d.turn() {});
            }
            // The shared runtime's threads run them at once; wait (briefly:
            // each only has to see the close) until every one has finished.
            None => detach(py, || {
                let deadline = std::time::Instant::now() + Duration::from_secs(1);
                while self.completions.in_flight.load(Ordering::Acquire) > 0
                    && std::time::Instant::now() < deadline
                {
                    std::thread::yield_now();
                }
            }),
        }
        if resolve {
            self.completions.resolve(py);
        } else {
            self.completions.queue.lock().clear();
        }
    }

    /// The process (fork generation) it was made in.
    pub fn made_in(&self) -> u64 {
        self.made_in
    }

    /// Refuses a client made before this process forked (`check_process`).
    pub fn check_process(&self) -> PyResult<()> {
        check_process(self.made_in)
    }

    /// Runs `f` to completion on this client's runtime, blocking.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        match &self.driven {
            Some(d) => d.rt.block_on(f),
            None => rt().block_on(f),
        }
    }

    /// The descriptor the event loop watches: the driven runtime's epoll
    /// descriptor (readable: turn it), else the completions' eventfd
    /// (readable: drain them). And whether the client is driven.
    pub fn fd(&self) -> (RawFd, bool) {
        match &self.driven {
            Some(d) => (d.idle.epfd.load(Ordering::Relaxed) as RawFd, true),
            // Made with an eventfd whenever not driven (`Exec::new`).
            None => (
                self.completions.fd.as_ref().map_or(-1, |f| f.as_raw_fd()),
                false,
            ),
        }
    }

    /// Completes the futures of the asynchronous calls finished so far
    /// (see `Completions::resolve`).
    pub fn drain(&self, py: Python<'_>) {
        self.completions.resolve(py)
    }

    /// Turns a driven runtime (with the GIL released), then completes the
    /// futures of what finished; returns how many calls are still running,
    /// so that the loop turns the runtime again for their timers while any
    /// are, and whether the turn stopped with work left (turn again at
    /// once).
    pub fn turn(&self, py: Python<'_>) -> (usize, bool) {
        let more = match &self.driven {
            Some(d) => detach(py, || d.turn()),
            None => false,
        };
        self.completions.resolve(py);
        (self.completions.in_flight.load(Ordering::Relaxed), more)
    }
}

/// How often a blocking call looks for Python's signals (Ctrl-C).
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Runs `work` to its end with the GIL released, on `exec`'s runtime
/// (else the shared one), waking every `SIGNAL_CHECK` to run Python's
/// signal handlers: a call that waits long (a read at a future time, a
/// slow or stopped node) ends at Ctrl-C with `KeyboardInterrupt`, the
/// call dropped (as a cancelled asyncio call is). It waited for the
/// call's own timeout.
pub fn block_checking_signals<F>(
    py: Python<'_>,
    exec: Option<&Exec>,
    work: F,
) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let mut work = std::pin::pin!(work);
    loop {
        let slice = async { tokio::time::timeout(SIGNAL_CHECK, work.as_mut()).await };
        let done = detach(py, || match exec {
            Some(e) => e.block_on(slice),
            None => rt().block_on(slice),
        });
        match done {
            Ok(v) => return Ok(v),
            Err(_) => py.check_signals()?,
        }
    }
}

/// Runs `work`: without `future`, to completion with the GIL released
/// (other Python threads run meanwhile), returning its value; with an
/// asyncio `future`, started on the client's runtime, its result queued
/// for the event loop (`Completions`), returning at once: `True` when the
/// loop must turn the client's runtime soon (`Client._turn`), else `None`.
pub fn run<T, F>(
    py: Python<'_>,
    exec: &Exec,
    future: Option<Py<PyAny>>,
    work: F,
    convert: Convert<T>,
) -> PyResult<Py<PyAny>>
where
    F: Future<Output = sluice_types::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    exec.check_process()?;
    let Some(fut) = future else {
        return match block_checking_signals(py, Some(exec), work)? {
            Ok(v) => convert(py, v),
            Err(e) => Err(errors::to_py(e)),
        };
    };
    if exec.closing.is_closed() {
        return Err(errors::to_py(closed_error(false)));
    }
    let completions = exec.completions.clone();
    completions.in_flight.fetch_add(1, Ordering::Relaxed);
    // The call's future is large (a put's is over 3 KB: routing, retries,
    // the timeout), and an async block that awaits a future it captured
    // holds it twice; boxed, it is copied once, and the task that moves
    // through the queues is a few words.
    let work = Box::pin(work);
    let closing = exec.closing.clone();
    let task = async move {
        let r = tokio::select! {
            biased;
            r = work => r,
            () = closing.closed() => Err(closed_error(true)),
        };
        completions.push(
            fut,
            Box::new(move |py| r.map_err(errors::to_py).and_then(|v| convert(py, v))),
        );
    };
    match &exec.driven {
        None => {
            rt().spawn(task);
            Ok(py.None())
        }
        Some(d) => {
            let first = d.start(Box::pin(task));
            Ok(if first {
                pyo3::types::PyBool::new(py, true)
                    .to_owned()
                    .into_any()
                    .unbind()
            } else {
                py.None()
            })
        }
    }
}

/// A JSON value as Python objects (dicts, lists, str, int, float, bool,
/// None).
pub fn json_to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    use pyo3::types::{PyDict, PyList};
    Ok(match v {
        serde_json::Value::Null => py.None(),
        serde_json::Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any().unbind(),
            (None, Some(i), _) => i.into_pyobject(py)?.into_any().unbind(),
            (_, _, f) => f.unwrap_or(f64::NAN).into_pyobject(py)?.into_any().unbind(),
        },
        serde_json::Value::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        serde_json::Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(json_to_py(py, x)?)?;
            }
            l.into_any().unbind()
        }
        serde_json::Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any().unbind()
        }
    })
}
