"""Streams from the edge (EdgeServe) on Sluice's pools.

A *stream* is a source (``topic``/``source``) writing items. The payload of
an item stays on the node that recorded it (a persistent pool
``/edge/<topic>`` with a retention), and its header (timestamp, source,
size, where the payload lives) goes to the topic (``/streams/<topic>``)::

    import sluice
    from sluice.streams import Producer, Subscriber

    broker = sluice.Client("127.0.0.1:7420")
    cam = Producer(broker, "127.0.0.1:7421", "room", "cam", routing="lazy")
    cam.publish(frame_bytes)

    sub = Subscriber(broker, "room")
    for header in sub:                 # per-source order
        if wanted(header):
            frame = sub.fetch(header)  # from the recording node, only now

Routing: ``lazy`` (headers only; payloads fetched peer to peer when used),
``eager`` (payloads inside headers), ``auto`` (by size, against a
break-even measured when the producer starts: ``Producer.break_even``) or
``auto:<bytes>``. A payload fetched after its retention raises
``sluice.PayloadExpired`` naming the item.

Operators: :class:`Aligner` (tuples within a maximum skew),
:class:`Ticker` (target prediction frequency from the last known
observation), both on a clock the caller gives; :class:`RateConsumer`
runs a ticker on the wall clock over a live topic and keeps the
consumer's metrics; :class:`SharedQueue` hands each item to one of
competing consumers, redelivering when one dies mid-item. In a DFG, the
``stream_aggregate`` and ``stream_rate`` lambdas emit tuples of headers;
:func:`decode_tuple` reads them in a Python lambda.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence

from . import _sluice
from ._sluice import Aligner, Delivery, Header, Ticker, decode_tuple, realtime_accuracy  # noqa: F401

__all__ = [
    "Producer",
    "Subscriber",
    "RateConsumer",
    "SharedQueue",
    "Aligner",
    "Ticker",
    "Header",
    "Delivery",
    "decode_tuple",
    "realtime_accuracy",
]


def _native(client):
    c = getattr(client, "_c", client)
    if c is None:
        raise ValueError("the client is closed")
    return c


class Producer:
    """Writes items of one stream: payloads to the recording node at
    ``local_addr`` (consumers fetch them from that address), headers to the
    topic through ``broker`` (a :class:`sluice.Client`). Creates the pools
    if they do not exist, keeping items ``keep_for_s`` seconds and at most
    ``keep_bytes`` of payload per source."""

    def __init__(
        self,
        broker,
        local_addr: str,
        topic: str,
        source: str,
        routing: str = "lazy",
        keep_for_s: int = 60,
        keep_bytes: Optional[int] = None,
    ):
        self._p = _sluice.StreamProducer(
            _native(broker), local_addr, topic, source, routing, keep_for_s, keep_bytes
        )

    def publish(self, value, ts_us: Optional[int] = None) -> Header:
        """Publishes one item (any buffer) recorded at ``ts_us`` (default:
        now); returns its header."""
        return self._p.publish(value, ts_us)

    @property
    def break_even(self) -> Optional[dict]:
        """What ``routing='auto'`` measured: per size, µs per used item
        each way, and the smallest size where lazy was no slower."""
        return self._p.break_even


class Subscriber:
    """A topic's headers as they arrive (per-source order); from
    ``from_ts_us``, every retained item recorded since then first. Iterate
    it, or call :meth:`next` with a timeout."""

    def __init__(self, broker, topic: str, from_ts_us: Optional[int] = None):
        self._s = _sluice.StreamSubscriber(_native(broker), topic, from_ts_us)

    def next(self, timeout_s: Optional[float] = None) -> Optional[Header]:
        return self._s.next(timeout_s)

    def __iter__(self) -> Iterator[Header]:
        while True:
            h = self._s.next(None)
            if h is None:
                return
            yield h

    def fetch(self, header: Header) -> _sluice.Value:
        """The item's payload (zero-copy buffer): inline, or fetched from
        its recording node. ``sluice.PayloadExpired`` past its retention."""
        return self._s.fetch(header)

    def stats(self) -> dict:
        """Headers received and payloads fetched (counts and bytes)."""
        return self._s.stats()


class RateConsumer:
    """Predicts at a target frequency: every ``period_s`` of the wall
    clock, :meth:`tick` returns each source's last known item
    ``(ts, [slot, ...])`` (a slot ``None`` or ``(state, Header)``); fetch
    the payloads a prediction needs with :meth:`payloads`, record it with
    :meth:`predicted`, and give :meth:`truth` when known. Items between
    ticks are skipped: their payloads never move."""

    def __init__(
        self,
        broker,
        topic: str,
        sources: Sequence[str],
        period_s: float,
        max_age_s: Optional[float] = None,
        fail_soft: str = "last_known_good",
    ):
        self._c = _sluice.RateConsumer(
            _native(broker), topic, list(sources), period_s, max_age_s, fail_soft
        )

    def tick(self):
        return self._c.tick()

    def payloads(self, headers: Sequence[Header]) -> List[_sluice.Value]:
        return self._c.payloads(list(headers))

    def predicted(self, label) -> None:
        self._c.predicted(str(label))

    def truth(self, ts_us: int, label) -> None:
        self._c.truth(ts_us, str(label))

    def metrics(self) -> dict:
        """``backlog``, ``used``/``skipped`` items, ``fetched`` payloads,
        ``predictions``, ``excess``, ``frequency_hz`` and
        ``interval_std_ms``, ``realtime_accuracy``."""
        return self._c.metrics()


class SharedQueue:
    """A queue of competing consumers (the pool ``/queues/<name>``, made
    volatile on first use; create it as a persistent pool first for items
    that outlive a node's restart): each item goes to one live consumer;
    an item not acknowledged within ``lease_s`` goes to another
    (``Delivery.delivery`` > 1)."""

    def __init__(self, client, name: str, consumer: str, lease_s: float = 30.0):
        self._q = _sluice.SharedQueue(_native(client), name, consumer, lease_s)

    def push(self, value) -> str:
        return self._q.push(value)

    def take(self, timeout_s: float = 10.0) -> Optional[Delivery]:
        return self._q.take(timeout_s)

    def ack(self, delivery: Delivery) -> None:
        self._q.ack(delivery)

    def backlog(self) -> int:
        return self._q.backlog()

    @property
    def redelivered(self) -> int:
        """Items this consumer took over after another's lease ran out."""
        return self._q.redelivered

    @property
    def missed(self) -> int:
        """Items this consumer tried to take that another had taken since
        it listed them (contention among competing consumers)."""
        return self._q.missed
