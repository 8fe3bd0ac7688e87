"""PyTorch datasets over Sluice pools (needs ``torch``; importing this
module without it raises ImportError with how to install it).

>>> from sluice.data import PoolDataset
>>> ds = PoolDataset("127.0.0.1:7420", "/vol/images", transform=decode)
>>> loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=2)

Keys are listed once per epoch (as they were at ``timestamp`` of a
persistent pool when given) and split across DataLoader workers; each
worker opens its own client and fetches 64 keys per request. A key
removed after the listing is skipped. Without ``transform`` an item is
``(key, tensor)``, the tensor a uint8 view of the value (no copy).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as e:  # pragma: no cover - exercised where torch is absent
    raise ImportError("sluice.data needs PyTorch: pip install torch") from e

from ._pool_iter import pool_objects


class PoolDataset(IterableDataset):
    """The objects of ``pool`` under ``prefix`` (or as of ``timestamp``,
    seconds, in a persistent pool), streamed from Sluice."""

    def __init__(
        self,
        addr: Optional[str],
        pool: str,
        prefix: Optional[str] = None,
        *,
        timestamp: Optional[float] = None,
        transform: Optional[Callable[[str, Any], Any]] = None,
    ) -> None:
        super().__init__()
        self.addr, self.pool, self.prefix = addr, pool, prefix
        self.timestamp, self.transform = timestamp, transform

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        part = (0, 1) if info is None else (info.id, info.num_workers)
        for k, value in pool_objects(self.addr, self.pool, self.prefix, timestamp=self.timestamp, part=part):
            if self.transform is not None:
                yield self.transform(k, value)
            elif len(value) == 0:
                yield k, torch.empty(0, dtype=torch.uint8)  # frombuffer refuses an empty buffer
            else:
                yield k, torch.frombuffer(value, dtype=torch.uint8)
