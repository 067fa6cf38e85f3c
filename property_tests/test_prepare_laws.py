"""Laws of datasets prepared by fpipe.prepare: for any partitioning of the same input, any
shard size and any number of workers, the prepared dataset holds the input's samples, each
once, in partition order; and for one partitioning the files are the same bytes whatever the
number of workers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpipe.dataset import ShardedReader
from fpipe.prepare import from_generator, write_dataset

# each example writes a dataset (and may start worker processes): few examples, any profile
PREPARES = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def span(bounds: tuple[int, int]) -> list[dict]:
    """The input's samples from ``bounds[0]`` to ``bounds[1]``: the partition's generator."""
    return [{"key": f"{i:05d}", "x": i, "blob": bytes([i % 256]) * (i % 7)} for i in range(*bounds)]


def plus_draw(sample: dict) -> dict:
    import fpipe as fp

    return {**sample, "draw": int(fp.current_rng().integers(1 << 30))}


@st.composite
def partitionings(draw) -> list[tuple[int, int]]:
    """A partitioning of ``range(n)`` into consecutive spans, empty ones allowed."""
    n = draw(st.integers(0, 120))
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=0, max_size=8)))
    bounds = [0, *cuts, n]
    return list(zip(bounds, bounds[1:]))


def _samples(out: Path) -> list[dict]:
    return list(ShardedReader(str(out / "dataset.shards")))


def _files(out: Path) -> dict[str, bytes]:
    return {str(path.relative_to(out)): path.read_bytes()
            for path in sorted(out.rglob("*")) if path.is_file()}


@PREPARES
@given(spans=partitionings(), shard_size=st.integers(1, 50), n_workers=st.sampled_from([1, 2]))
def test_any_partitioning_on_any_workers_gives_the_input_in_order(spans, shard_size, n_workers):
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        write_dataset(from_generator(span, spans), out, shard_size=shard_size, n_workers=n_workers)
        assert _samples(out) == span((0, spans[-1][1]))
        assert sorted(os.listdir(out)) == ["dataset.shards", *(f"part-{p:06d}" for p in range(len(spans)))]


@settings(PREPARES, max_examples=10)
@given(spans=partitionings(), shard_size=st.integers(1, 50), seed=st.integers(0, 2 ** 32))
def test_one_partitioning_gives_the_same_bytes_on_one_or_two_workers(spans, shard_size, seed):
    with tempfile.TemporaryDirectory() as folder:
        outs = [Path(folder) / name for name in ("one", "two")]
        for out, n_workers in zip(outs, (1, 2)):
            write_dataset(from_generator(span, spans), out, plus_draw, shard_size=shard_size,
                          seed=seed, n_workers=n_workers)
        assert _files(outs[0]) == _files(outs[1])
