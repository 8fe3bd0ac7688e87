"""A pool's objects, streamed: what ``sluice.data.PoolDataset`` yields,
kept free of torch so that it runs (and is tested) without it."""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import sluice

#: Keys fetched per request (``multi_get``) when reading the latest versions.
BATCH = 64


def pool_objects(
    addr: Optional[str],
    pool: str,
    prefix: Optional[str] = None,
    *,
    timestamp: Optional[float] = None,
    part: Tuple[int, int] = (0, 1),
    batch: int = BATCH,
) -> Iterator[Tuple[str, "sluice.Value"]]:
    """``(key, value)`` for the objects of ``pool`` under ``prefix``, listed
    once (as of ``timestamp``, seconds, in a persistent pool), this caller's
    share of them: every ``part[1]``-th key from the ``part[0]``-th. The
    latest versions come ``batch`` keys per request; a key removed since
    the listing is skipped (it is no longer in the pool), not an error."""
    index, parts = part
    with sluice.Client(addr) as c:
        keys = c.list_keys_in_object_pool(pool, prefix=prefix, timestamp=timestamp)[index::parts]
        if timestamp is not None:
            for k in keys:
                try:
                    yield k, c.get(k, timestamp=timestamp).value
                except sluice.NotFound:
                    continue
            return
        for i in range(0, len(keys), batch):
            chunk = keys[i : i + batch]
            for k, o in zip(chunk, c.multi_get(chunk)):
                if o is not None:
                    yield k, o.value
