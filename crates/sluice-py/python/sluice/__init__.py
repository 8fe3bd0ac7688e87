"""Sluice's Python client.

>>> import sluice
>>> with sluice.Client("127.0.0.1:7420") as c:
...     c.put("/vol/a", b"hello")
...     c.get("/vol/a").value.tobytes()

``Client`` blocks (releasing the GIL while it waits on the network);
``AsyncClient`` is the same API for ``asyncio``. Both route every key to
its shard themselves, follow leaders in a cluster and retry as the Rust
client does (it is the Rust client underneath). Values come back as
``Value`` objects that export their bytes through the buffer protocol
without a copy (``memoryview(v)``, ``numpy.frombuffer(v, dtype=...)``);
puts accept any bytes-like object (bytes, bytearray, memoryview, a NumPy
array, strided ones in C order as ``tobytes()`` gives them) or a str: a
``bytes`` of 4 KB or more is sent from its own buffer (it cannot change;
the client holds a reference while the put is in flight), anything else
is copied once. Errors are ``SluiceError``
subclasses (``NotFound``, ``VersionConflict``, ``NoPool``, ...) with the
message the CLI prints, ``e.kind`` and ``e.details``.

The method names follow Cascade's ``ServiceClientAPI``: ``put``,
``put_and_forget``, ``trigger_put``, ``remove``, ``get`` (``version=``,
``timestamp=``, ``stable=``), ``get_size``, ``multi_get``,
``list_keys_in_object_pool``, ``create_object_pool``,
``list_object_pools``, ``get_object_pool``, ``remove_object_pool``, and
notifications through ``watch``.
"""

from __future__ import annotations

import json
import asyncio
import functools
import inspect
import logging
import os
import threading
import warnings
from typing import Any, AsyncIterator, Callable, Iterator, List, Optional, Sequence, Union

from . import _sluice
from ._sluice import (  # noqa: F401  (re-exported)
    NO_VERSION,
    Notification,
    Object,
    PutResult,
    Value,
)

# The exception classes, one per error kind (sluice.NotFound, ...). Only
# they: the extension's other classes are reached through this package's
# wrappers (sluice.streams for streams and shared queues). A star import
# put the extension's own SharedQueue, StreamProducer and others here too,
# which took only the extension's client: `sluice.SharedQueue(client, ...)`
# with a `sluice.Client` failed with "'Client' object is not an instance
# of 'Client'".
globals().update(
    {
        _n: _v
        for _n, _v in vars(_sluice).items()
        if isinstance(_v, type) and issubclass(_v, BaseException)
    }
)

SluiceError = _sluice.SluiceError
__version__: str = _sluice.__version__

# While an AsyncClient with io="loop" has calls running, how often its
# runtime is turned even when no socket is ready (for their timeouts and
# retries).
_TICK_S = 0.002

__all__ = [
    "Client",
    "AsyncClient",
    "default_io",
    "Watch",
    "AsyncWatch",
    "Object",
    "Value",
    "PutResult",
    "Notification",
    "SluiceError",
    "NO_VERSION",
    "default_address",
]


def default_address() -> str:
    """Where to connect when no address is given, as the CLI decides:
    ``$SLUICE_ADDR``, else the nodes ``sluice dev`` listed in
    ``./sluice-dev/endpoints``, else ``127.0.0.1:7420``."""
    env = os.environ.get("SLUICE_ADDR")
    if env:
        return env
    try:
        with open(os.path.join("sluice-dev", "endpoints")) as f:
            nodes = [line.strip() for line in f if line.strip()]
            if nodes:
                return ",".join(nodes)
    except OSError:
        pass
    return "127.0.0.1:7420"


def _unsigned(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Marks ``names`` as a method's arguments that are versions, counts,
    ids or times: a negative one (or one in a list) raised the extension's
    ``OverflowError`` ("can't convert negative int to unsigned", naming
    nothing); it is a ``ValueError`` naming the argument now. Nothing is
    checked on the way in: only a call that failed so is looked at."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(f)

        @functools.wraps(f)
        def method(*args: Any, **kwargs: Any) -> Any:
            try:
                return f(*args, **kwargs)
            except OverflowError:
                given = sig.bind(*args, **kwargs).arguments
                for n in names:
                    v = given.get(n)
                    values = v if isinstance(v, (list, tuple)) else [v]
                    if any(isinstance(x, int) and x < 0 for x in values):
                        raise ValueError(f"{n}={v!r} is negative") from None
                raise

        return method

    return wrap


def _version(version: Optional[int]) -> Optional[int]:
    # A negative one raised OverflowError ("can't convert negative int to
    # unsigned") from the extension.
    if version is not None and version < 0:
        raise ValueError(f"version={version!r}: versions start at 1")
    return version


def _timestamp_us(timestamp: Optional[float], timestamp_us: Optional[int]) -> Optional[int]:
    if timestamp is not None and timestamp_us is not None:
        raise ValueError("give timestamp (seconds) or timestamp_us, not both")
    for name, t in (("timestamp", timestamp), ("timestamp_us", timestamp_us)):
        if t is not None and t < 0:
            raise ValueError(f"{name}={t!r} is before the epoch: times are since 1970-01-01 UTC")
    if timestamp is not None:
        # Seconds since the epoch; past year 5000 it is a time in ms or µs
        # given where seconds were meant (it overflowed, or read the far
        # future and waited for it).
        if timestamp > _MAX_TIMESTAMP_S:
            raise ValueError(
                f"timestamp={timestamp!r} is in seconds since the epoch (that is after the year 5000); "
                "for a time in microseconds pass timestamp_us="
            )
        return int(timestamp * 1_000_000)
    return timestamp_us


# 95,617,584,000 s: 5000-01-01.
_MAX_TIMESTAMP_S = 95_617_584_000


_log = logging.getLogger("sluice")


class Watch:
    """Notifications for keys under a prefix, as an iterator::

        for n in client.watch("/vol/"):
            print(n.kind, n.key, n.value.tobytes())

    Iteration ends when the subscription is closed; a watch whose node
    dies raises ``ConnectionError`` (from iteration and ``next``) saying
    so. ``next(timeout=...)`` waits at most that long (``None`` when
    nothing came). Closing the watch (or leaving its ``with`` block) ends
    the subscription on the node.
    """

    def __init__(self, inner: "_sluice.Watch", prefix: str = "") -> None:
        self._w = inner
        self._prefix = prefix
        #: Notifications whose callback raised (``watch(..., callback=f)``).
        self.callback_errors = 0
        #: Why a callback watch stopped, if not closed (its connection lost).
        self.error: Optional[Exception] = None
        self._callback = False  # notifications go to a callback's thread

    def _deliver(self, callback: Callable[[Notification], Any], prefix: str) -> None:
        """Calls ``callback`` for each notification, on the watch's thread.
        A callback that raises is logged (logger ``sluice``, with the key)
        and counted in ``callback_errors``; the next notifications are
        still delivered. A lost connection ends the thread, logged, with
        the error in ``error``."""
        try:
            for n in self._notifications():
                try:
                    callback(n)
                except Exception:
                    self.callback_errors += 1
                    _log.exception("the callback of the watch on %r raised on %s %s", prefix, n.kind, n.key)
        except SluiceError as e:
            self.error = e
            _log.error("%s", e)

    def _notifications(self) -> Iterator[Notification]:
        while True:
            n = self._w.next()
            if n is None:
                return
            yield n

    def _not_a_callback_watch(self) -> None:
        if self._callback:
            # Each notification would go to one of the two, unpredictably.
            raise RuntimeError(
                "this watch delivers its notifications to its callback; next() and iteration are not available"
            )

    def __iter__(self) -> Iterator[Notification]:
        self._not_a_callback_watch()
        return self._notifications()

    def next(self, timeout: Optional[float] = None) -> Optional[Notification]:
        self._not_a_callback_watch()
        return self._w.next(timeout)

    def close(self) -> None:
        self._w.close()

    def __enter__(self) -> "Watch":
        return self

    def __repr__(self) -> str:
        how = " (callback)" if self._callback else ""
        return f"<sluice.Watch {self._prefix!r}{how}>"

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncWatch:
    """``Watch`` for asyncio: ``async for n in await client.watch(prefix)``."""

    def __init__(self, inner: "_sluice.Watch", client: "AsyncClient", prefix: str = "") -> None:
        self._w = inner
        self._client = client
        self._prefix = prefix
        # The extension's wait for the next notification, kept across a
        # caller's timeout or cancellation: the notification it takes is
        # the next caller's, never dropped with a cancelled future.
        self._pending: Optional["asyncio.Future[Optional[Notification]]"] = None
        self._waiting = False  # a task is in next()

    def __aiter__(self) -> AsyncIterator[Notification]:
        return self

    async def __anext__(self) -> Notification:
        n = await self.next()
        if n is None:
            raise StopAsyncIteration
        return n

    async def next(self, timeout: Optional[float] = None) -> Optional[Notification]:
        """The next notification; ``None`` once the watch is closed, or
        when ``timeout`` (seconds) passes first. Cancellation-safe, like
        ``asyncio.Queue.get``: a ``next()`` cancelled (or timed out by
        ``asyncio.wait_for``) loses nothing; the notification it was
        waiting for goes to the next call. One task at a time: a second
        task calling ``next()`` meanwhile gets ``RuntimeError``. ``close()``
        ends a waiting ``next()`` with ``None``."""
        if self._waiting:
            raise RuntimeError("another task is already waiting in this watch's next()")
        fut = self._pending
        if fut is None:
            fut = self._client._future()
            # Read an error nobody awaits any more (the watch given up
            # on), so asyncio does not report it as never retrieved.
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._client._started(self._w.next(None, future=fut))
            self._pending = fut
        self._waiting = True
        try:
            # A cancellation (BaseException) leaves `fut` for the next call.
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            if not fut.done():
                return None  # `fut` goes on waiting, for the next call
        except Exception:
            pass  # `fut`'s own error: `result()` raises it
        finally:
            self._waiting = False
        self._pending = None
        return fut.result()

    async def close(self) -> None:
        if self._client._c is _CLOSED:
            # Nothing turns a closed client's runtime: end it here (the
            # node is told, within the client's timeout).
            self._w.close()
            return
        fut = self._client._future()
        self._client._started(self._w.close(future=fut))
        await fut

    async def __aenter__(self) -> "AsyncWatch":
        return self

    def __repr__(self) -> str:
        return f"<sluice.AsyncWatch {self._prefix!r}>"

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class _Closed:
    """What a closed client's handle is: any call through it raises
    ``ConnectionError`` ("the client is closed")."""

    def __getattr__(self, name: str) -> Any:
        raise _sluice._closed_error()


_CLOSED = _Closed()


class Client:
    """A blocking client of a Sluice node or cluster.

    ``addr`` is ``host:port`` (a host alone: port 7420), or several
    comma-separated seeds (the first that answers is used; in a cluster
    any one will do). ``timeout`` bounds
    each request, in seconds. Use it as a context manager, or call
    ``close()``; it is safe to share between threads. Nodes that run
    with TLS need ``tls_ca`` (the CA's PEM file), and ``tls_cert`` and
    ``tls_key`` where they require client certificates; where nodes enforce
    policies, ``token`` (from ``sluice auth create``) names the principal
    this client acts as (README: Security). ``value_part_bytes`` sends
    larger values in parts of that size, so small requests on the same
    connection are not stuck behind them.
    """

    @_unsigned("connections", "value_part_bytes")
    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        timeout: float = 10.0,
        connect_timeout: float = 3.0,
        connections: int = 1,
        name: str = "sluice-python",
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        token: Optional[str] = None,
        value_part_bytes: Optional[int] = None,
        _driven: bool = False,
    ) -> None:
        for n, v in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                # The extension named its own argument ('timeout_s').
                raise TypeError(f"{n} must be a number of seconds, not {type(v).__name__}")
        if connections == 0:
            raise ValueError("connections=0: a client needs at least 1")
        self._addr = addr or default_address()
        self._c = _sluice.Client(
            self._addr,
            timeout_s=timeout,
            connect_timeout_s=connect_timeout,
            connections=connections,
            name=name,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            token=token,
            value_part_bytes=value_part_bytes,
            driven=_driven,
        )

    # -- context manager ------------------------------------------------
    def __enter__(self) -> "Client":
        return self

    def __repr__(self) -> str:
        closed = " (closed)" if self._c is _CLOSED else ""
        return f"<sluice.Client {self._addr}{closed}>"

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Drops this handle's connections (they close once no watch or
        other handle uses them); its later calls raise ``ConnectionError``
        ("the client is closed"). Calls in flight on other threads finish."""
        self._c = _CLOSED  # type: ignore[assignment]

    @property
    def node_id(self) -> int:
        """The id of the node this client first reached."""
        return self._c.node_id

    @property
    def cluster_epoch(self) -> Optional[int]:
        """The cluster's metadata epoch; ``None`` on a standalone node."""
        return self._c.cluster_epoch

    # -- writes -----------------------------------------------------------
    def put(self, key: str, value: Any, *, previous_version: Optional[int] = None) -> PutResult:
        """Stores ``value`` (bytes-like or str) under ``key``; returns the new
        version and its timestamp. With ``previous_version``, only if the
        key's current version is that one (``NO_VERSION``: only if absent),
        else ``VersionConflict``."""
        # The hot path: `_unsigned`'s check inlined (no wrapper's frame).
        try:
            return self._c.put(key, value, previous_version=previous_version)
        except OverflowError:
            if previous_version is not None and previous_version < 0:
                raise ValueError(f"previous_version={previous_version!r} is negative") from None
            raise

    def put_and_forget(self, key: str, value: Any) -> None:
        """Sends a put without waiting for its acknowledgement."""
        self._c.put_and_forget(key, value)

    @_unsigned("trace_id")
    def trigger_put(self, key: str, value: Any, *, trace_id: Optional[int] = None) -> int:
        """Hands ``value`` to the lambdas and watchers of ``key`` without
        storing it; returns its timestamp (µs). With ``trace_id``, the
        objects it leads to carry a latency trace (``obj.trace``: one hop
        per pipeline stage)."""
        return self._c.trigger_put(key, value, trace_id=trace_id)

    @_unsigned("previous_version")
    def remove(self, key: str, *, previous_version: Optional[int] = None) -> PutResult:
        """Removes ``key`` (a new version that is a tombstone)."""
        return self._c.remove(key, previous_version=previous_version)

    # -- reads ------------------------------------------------------------
    def get(
        self,
        key: str,
        *,
        version: Optional[int] = None,
        timestamp: Optional[float] = None,
        timestamp_us: Optional[int] = None,
        stable: bool = True,
        linearizable: bool = False,
    ) -> Object:
        """The latest version of ``key``, or the given ``version``, or the
        version current at ``timestamp`` (seconds since the epoch, or
        ``timestamp_us``). A time read is ``stable`` by default: it waits
        until the time has passed, so its answer never changes;
        ``stable=False`` answers at once. ``linearizable=True`` asks the
        shard's leader (reflects every acknowledged write). Raises
        ``NotFound`` when there is no such key or version, ``ValueError``
        when both a version and a time are given (or ``linearizable``
        with either)."""
        return self._c.get(
            key,
            version=_version(version),
            timestamp_us=_timestamp_us(timestamp, timestamp_us),
            stable=stable,
            linearizable=linearizable,
        )

    def get_size(
        self,
        key: str,
        *,
        version: Optional[int] = None,
        timestamp: Optional[float] = None,
        timestamp_us: Optional[int] = None,
    ) -> int:
        """The size of the value in bytes, without transferring it."""
        return self._c.get_size(
            key, version=_version(version), timestamp_us=_timestamp_us(timestamp, timestamp_us)
        )

    def multi_get(self, keys: Sequence[str]) -> List[Optional[Object]]:
        """Several keys at once: an ``Object`` per key (``None`` where a key
        does not exist)."""
        return self._c.multi_get(list(keys))

    def list_keys_in_object_pool(
        self,
        pool: str,
        *,
        prefix: Optional[str] = None,
        version: Optional[int] = None,
        timestamp: Optional[float] = None,
    ) -> List[str]:
        """The keys of ``pool`` (under ``prefix``), from every shard, sorted;
        as they were at ``version`` or ``timestamp`` when given."""
        return self._c.list_keys(
            pool,
            prefix=prefix,
            version=_version(version),
            timestamp_us=_timestamp_us(timestamp, None),
        )

    list_keys = list_keys_in_object_pool

    @_unsigned("start", "end")
    def history(
        self, key: str, *, start: int = 0, end: Optional[int] = None, by_time: bool = False
    ) -> List[Object]:
        """Every retained version of ``key`` from ``start`` to ``end``
        (versions, or µs timestamps with ``by_time``; both inclusive, and
        a ``start`` after ``end`` raises ``InvalidArgument``), newest
        first, removals included (``obj.removed``)."""
        return self._c.history(
            key, start=start, end=(2**64 - 1) if end is None else end, by_time=by_time
        )

    # -- pools ------------------------------------------------------------
    @_unsigned("subgroup_index", "keep_versions", "keep_for_s", "keep_bytes")
    def create_object_pool(
        self,
        pathname: str,
        pool_type: str = "volatile",
        *,
        subgroup_index: int = 0,
        affinity_set_regex: Optional[str] = None,
        keep_versions: Optional[int] = None,
        keep_for_s: Optional[int] = None,
        keep_bytes: Optional[int] = None,
    ) -> dict:
        """Creates a pool (``volatile``, ``persistent`` or ``trigger``).

        Persistent pools keep every version unless limited: ``keep_versions``
        per key, ``keep_for_s`` seconds, ``keep_bytes`` per key."""
        return self._c.create_object_pool(
            pathname,
            pool_type,
            subgroup_index=subgroup_index,
            affinity_set_regex=affinity_set_regex,
            keep_versions=keep_versions,
            keep_for_s=keep_for_s,
            keep_bytes=keep_bytes,
        )

    def list_object_pools(self, include_deleted: bool = False) -> List[dict]:
        """Every pool (a dict each: ``pathname``, ``pool_type``, its
        shards and settings); removed ones too with ``include_deleted``."""
        return self._c.list_object_pools(include_deleted)

    def get_object_pool(self, pathname: str) -> dict:
        """The pool at ``pathname`` (``PoolNotFound`` when none)."""
        return self._c.get_object_pool(pathname)

    def remove_object_pool(self, pathname: str) -> dict:
        """Removes a pool: its keys can no longer be read or written but
        stay stored until ``purge_object_pool``."""
        return self._c.remove_object_pool(pathname)

    def purge_object_pool(self, pathname: str) -> dict:
        """Deletes a removed pool's objects for good, freeing its path."""
        return self._c.purge_object_pool(pathname)

    # -- notifications ------------------------------------------------------
    @_unsigned("from_version", "from_time_us")
    def watch(
        self,
        prefix: str,
        callback: Optional[Callable[[Notification], Any]] = None,
        *,
        from_version: Optional[int] = None,
        from_time_us: Optional[int] = None,
    ) -> Watch:
        """Notifications for keys under ``prefix`` (a string prefix:
        ``"/vol/w"`` takes ``/vol/w1`` too, ``"/vol/w/"`` only the keys
        below ``/vol/w``, ``"/"`` every key): an iterator, or, with
        ``callback``, calls it for each on a thread of its own until the
        watch is closed (its ``next()`` and iteration then raise
        ``RuntimeError``: the notifications are the callback's).
        ``from_version``/``from_time_us`` first replay what a persistent
        pool stored since then. Every loss is reported as a
        ``lagged`` notification."""
        w = Watch(self._c.watch(prefix, from_version=from_version, from_time_us=from_time_us), prefix)
        if callback is not None:
            w._callback = True
            threading.Thread(
                target=w._deliver, args=(callback, prefix), name=f"sluice-watch {prefix}", daemon=True
            ).start()
        return w

    # -- the node ------------------------------------------------------------
    def ping(self) -> float:
        """The round trip to the node, in seconds."""
        return self._c.ping()

    def stats(self) -> dict:
        """The node's counters (as ``sluice stats --json``)."""
        return self._c.stats()

    @_unsigned("to", "fanout")
    def broadcast(self, key: str, to: Optional[List[int]] = None, fanout: int = 1) -> dict:
        """Sends the latest version of ``key`` to the nodes ``to`` (default:
        every other node) of the cluster, chunked and pipelined along
        ``fanout`` chains ordered by the nodes' topology labels. Each
        receiver checks the checksum and keeps the object, where lambdas'
        reads of the key find it. Returns the report: ``outcomes`` (per
        node, ``error`` None when received), ``order``, ``crossings``."""
        return self._c.broadcast(key, to, fanout)

    def policy(self, op: Union[str, dict], **fields: Any) -> dict:
        """A policy command, as ``sluice policy`` and ``sluice auth`` send
        them: ``policy("ls")``, ``policy("whoami")``,
        ``policy("auth_create", name="alice", roles=["ops"])`` (the reply
        holds the token, shown once), ``policy("set", name=..., rule={...})``,
        ``policy("rm", name=...)``, ``policy("auth_revoke", name=...)``.
        ``op`` may also be a whole command, as a dict or JSON text
        (``{"op": "set", "name": ..., "rule": {...}}``)."""
        if isinstance(op, dict):
            command = {**op, **fields}
        elif op.lstrip().startswith("{"):
            try:
                command = {**json.loads(op), **fields}
            except ValueError as e:
                raise ValueError(f"policy command {op!r} is not valid JSON: {e}") from None
        else:
            command = {"op": op, **fields}
        return self._c.policy(json.dumps(command))

    def dfg_apply(self, text: str) -> dict:
        """Applies data flow graphs (a ``dfgs.json`` document, as text).
        In a cluster, on every node: it returns once every node runs them
        (a node still loading its Python lambdas is waited for, up to the
        client's ``timeout``; one that does not answer, 3 s), else with the
        nodes still behind in ``pending_nodes``. Each apply rebuilds the
        graphs' lambdas (new code on disk or in a ``code_key`` object
        takes effect); a document ``{"graphs": [...], "only_changed":
        true}`` leaves those already running as given alone, listed in
        ``unchanged``."""
        return self._c.dfg_apply(text)

    def dfg_list(self) -> List[dict]:
        """The applied data flow graphs with their lambdas' counters."""
        return self._c.dfg_list()

    def dfg_remove(self, id: str) -> None:
        """Removes the graph ``id`` (in a cluster, from every node)."""
        return self._c.dfg_remove(id)


def default_io() -> str:
    """Where ``AsyncClient.connect(io="auto")`` runs a client's network
    work: ``"loop"`` where this process may run on at most two cores (a
    thread hand-off costs more there than the parallelism gives back),
    else ``"threads"``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return "loop" if cores <= 2 else "threads"


class _Deferred:
    """Stands in for the extension when a ``Client`` method runs for an
    ``AsyncClient``: each call is started with a future, which it returns
    for the coroutine to await. So the async methods check and convert
    their arguments in the very code the blocking ones do."""

    __slots__ = ("_c",)

    def __init__(self, client: "AsyncClient") -> None:
        self._c = _DeferredCalls(client)


class _DeferredCalls:
    __slots__ = ("_client",)

    def __init__(self, client: "AsyncClient") -> None:
        self._client = client

    def __getattr__(self, name: str) -> Callable[..., "asyncio.Future[Any]"]:
        client = self._client

        def call(*args: Any, **kwargs: Any) -> "asyncio.Future[Any]":
            fut = client._future()
            client._started(getattr(client._c, name)(*args, future=fut, **kwargs))
            return fut

        return call


def _async_method(name: str) -> Callable[..., Any]:
    """``Client.<name>`` as a coroutine: the blocking method's body (its
    checks, conversions and call) with the call started, then awaited."""
    blocking = getattr(Client, name)

    @functools.wraps(blocking)
    async def method(self: "AsyncClient", *args: Any, **kwargs: Any) -> Any:
        return await blocking(self._deferred, *args, **kwargs)

    method.__qualname__ = f"AsyncClient.{name}"
    return method


class AsyncClient:
    """The ``Client`` API for asyncio: every method is a coroutine; requests
    from many tasks are pipelined over the same connections::

        async with await sluice.AsyncClient.connect("127.0.0.1:7420") as c:
            await c.put("/vol/a", b"x")
            obj = await c.get("/vol/a")
    """

    def __init__(self, blocking: Client, loop: asyncio.AbstractEventLoop) -> None:
        self._blocking = blocking
        self._c = blocking._c
        self._loop = loop
        self._tick: Optional[asyncio.TimerHandle] = None
        # A client made with ``io="loop"`` has a runtime of its own that
        # only this loop's thread turns: the loop watches the runtime's
        # epoll descriptor, and turns it when a socket is ready or after
        # calls were started (a call never leaves the loop's thread). Any
        # other client runs on the extension's shared threads, which queue
        # what finished and signal an eventfd; the loop then takes it all
        # at once. Either way no thread but the loop's touches a future.
        self._deferred = _Deferred(self)
        self._fd, self._driven = self._c._completion_fd()
        loop.add_reader(self._fd, self._turn if self._driven else self._drain)

    def _future(self) -> "asyncio.Future[Any]":
        """A future for a call started now, on the loop this client belongs
        to (from another loop asyncio would say only "Event loop is
        closed" or "attached to a different loop")."""
        if asyncio.get_running_loop() is not self._loop:
            closed = ", which is closed" if self._loop.is_closed() else ""
            raise RuntimeError(
                f"this AsyncClient belongs to the event loop it was connected on{closed}, not to this"
                " one: connect a client in this loop (await sluice.AsyncClient.connect(...))"
            )
        return self._loop.create_future()

    def _drain(self) -> None:
        self._c._drain()  # completes the futures of the calls that finished

    def _started(self, due: Optional[bool]) -> None:
        """After a call was started: turn the client's runtime soon, once
        for all the calls started in this pass of the loop."""
        if due:
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        if self._c is _CLOSED:
            return
        running, more = self._c._turn()  # completes what finished
        if more:
            # The turn stopped with work left (data keeps arriving): go on
            # after the loop's other callbacks.
            self._loop.call_soon(self._turn)
        # Calls still running: turn again in a while even if no socket
        # becomes ready, for their timeouts and retries.
        elif running and self._tick is None:
            self._tick = self._loop.call_later(_TICK_S, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        self._turn()

    @classmethod
    async def connect(
        cls, addr: Optional[str] = None, *, io: str = "auto", **kwargs: Any
    ) -> "AsyncClient":
        """Connects without blocking the event loop. The client belongs to
        the running loop (use it from coroutines on that loop); ``kwargs``
        are ``Client``'s.

        ``io`` says where the client's network work runs. ``"loop"``: on
        the event loop's own thread, turned between the loop's callbacks:
        no thread is woken for a call, the requests a pass of the loop
        starts go out in one write, and a put costs about half the CPU it
        does on threads; one loop thread then bounds the client's
        throughput. ``"threads"``: on the extension's I/O threads, in
        parallel with the loop, which they wake when calls finish: more
        CPU per call, more throughput where cores are spare. ``"auto"``
        (the default): ``"loop"`` where this process may run on at most
        two cores, else ``"threads"`` (``default_io()``; BENCHMARKS.md:
        "An asyncio client's calls on the event loop's thread")."""
        if io == "auto":
            io = default_io()
        if io not in ("threads", "loop"):
            raise ValueError(f'io must be "auto", "threads" or "loop", not {io!r}')
        loop = asyncio.get_running_loop()
        c = await loop.run_in_executor(
            None, lambda: Client(addr, _driven=io == "loop", **kwargs)
        )
        self = cls(c, loop)
        if io == "loop" and not self._driven:
            warnings.warn(
                'io="loop" needs Linux\'s /proc to find the runtime\'s epoll '
                'descriptor; this client runs on the I/O threads (io="threads")',
                RuntimeWarning,
                stacklevel=2,
            )
        return self

    async def __aenter__(self) -> "AsyncClient":
        return self

    def __repr__(self) -> str:
        closed = " (closed)" if self._c is _CLOSED else ""
        return f"<sluice.AsyncClient {self._blocking._addr}{closed}>"

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the client: calls still in flight (its watches' too) raise
        ``ConnectionError`` ("the client was closed with this call in
        flight"), and later ones ("the client is closed")."""
        if self._c is not _CLOSED:
            open_loop = not self._loop.is_closed()
            self._c._close(open_loop)
            if open_loop:
                self._loop.remove_reader(self._fd)
            if self._tick is not None:
                self._tick.cancel()
                self._tick = None
            self._blocking.close()
            self._c = _CLOSED

    @property
    def node_id(self) -> int:
        return self._blocking.node_id

    async def put(self, key: str, value: Any, *, previous_version: Optional[int] = None) -> PutResult:
        # The hot path, spelled out (no generic wrapper).
        fut = self._future()
        try:
            due = self._c.put(key, value, previous_version, fut)  # by position: no keyword parsing
        except OverflowError:
            if previous_version is not None and previous_version < 0:
                raise ValueError(f"previous_version={previous_version!r} is negative") from None
            raise
        if due:
            self._loop.call_soon(self._turn)  # _started, inlined
        return await fut

    async def get(
        self,
        key: str,
        *,
        version: Optional[int] = None,
        timestamp: Optional[float] = None,
        timestamp_us: Optional[int] = None,
        stable: bool = True,
        linearizable: bool = False,
    ) -> Object:
        fut = self._future()
        due = self._c.get(
            key,
            version=_version(version),
            timestamp_us=_timestamp_us(timestamp, timestamp_us),
            stable=stable,
            linearizable=linearizable,
            future=fut,
        )
        self._started(due)
        return await fut

    async def multi_get(self, keys: Sequence[str]) -> List[Optional[Object]]:
        fut = self._future()
        self._started(self._c.multi_get(list(keys), future=fut))
        return await fut

    async def watch(
        self,
        prefix: str,
        *,
        from_version: Optional[int] = None,
        from_time_us: Optional[int] = None,
    ) -> AsyncWatch:
        """Notifications for keys under ``prefix``, as ``Client.watch``:
        iterate it with ``async for`` or ``await w.next(timeout)``."""
        for n, v in (("from_version", from_version), ("from_time_us", from_time_us)):
            if v is not None and v < 0:
                raise ValueError(f"{n}={v!r} is negative")
        fut = self._future()
        self._started(
            self._c.watch(
                prefix, from_version=from_version, from_time_us=from_time_us, future=fut
            )
        )
        return AsyncWatch(await fut, self, prefix)


AsyncClient.put.__doc__ = Client.put.__doc__
AsyncClient.get.__doc__ = Client.get.__doc__
AsyncClient.multi_get.__doc__ = Client.multi_get.__doc__
for _name in (
    "put_and_forget",
    "trigger_put",
    "remove",
    "get_size",
    "list_keys_in_object_pool",
    "history",
    "create_object_pool",
    "list_object_pools",
    "get_object_pool",
    "remove_object_pool",
    "purge_object_pool",
    "ping",
    "stats",
    "broadcast",
    "policy",
    "dfg_apply",
    "dfg_list",
    "dfg_remove",
):
    setattr(AsyncClient, _name, _async_method(_name))
del _name
AsyncClient.list_keys = AsyncClient.list_keys_in_object_pool  # type: ignore[attr-defined]
