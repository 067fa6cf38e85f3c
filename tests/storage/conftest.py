"""Helpers shared by the storage tests: small datasets written with fpipe or datadings."""

from __future__ import annotations

import numpy as np
import pytest

from fpipe.dataset import FileWriter


def make_samples(n: int, size: int = 8, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"key": f"s{i:05d}", "data": rng.bytes(size), "label": i % 7} for i in range(n)]


def write(path, samples, **options) -> str:
    with FileWriter(path, **options) as writer:
        for sample in samples:
            writer.write(sample)
    return str(path)


def same(a, b) -> bool:
    """Deep equality that compares numpy arrays by dtype, shape and bytes."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and (a == b or (a != a and b != b))


@pytest.fixture
def samples() -> list[dict]:
    return make_samples(50)


@pytest.fixture
def dataset(tmp_path, samples) -> str:
    return write(tmp_path / "set.msgpack", samples)
