"""The PyTorch dataset (skipped cleanly where torch is not installed)."""

import uuid

import pytest

torch = pytest.importorskip("torch")

from sluice.data import PoolDataset  # noqa: E402


def test_pool_dataset_streams_a_prefix_split_across_workers(client, node):
    prefix = f"/vol/ds-{uuid.uuid4().hex[:8]}"
    for i in range(10):
        client.put(f"{prefix}/{i}", bytes([i]) * 4)
    ds = PoolDataset(node.addr, "/vol", prefix)
    items = dict(ds)
    assert sorted(items) == sorted(f"{prefix}/{i}" for i in range(10))
    assert items[f"{prefix}/3"].tolist() == [3, 3, 3, 3]
    loader = torch.utils.data.DataLoader(
        PoolDataset(node.addr, "/vol", prefix, transform=lambda k, v: int(bytes(v)[0])),
        batch_size=None,
        num_workers=2,
    )
    assert sorted(loader) == list(range(10))
