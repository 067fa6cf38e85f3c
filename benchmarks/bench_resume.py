"""Workloads of the resume story (issue 38): C2 (a resume through torchdata's
``StatefulDataLoader`` against re-reading to the same point) and C4 (the size of its state).

The data is ``compact`` (100,000 samples of a key, 100 random bytes and a label), read as
``IterableDataset(MsgpackReader(path), layout=Shards(shuffle=True), samples=Samples(seed=0))``
in batches of 64 (default collation), interrupted after 1,406 batches: 89,984 samples, 90 % of the epoch.

C2 times, from ``load_state_dict`` to the first batch of the resumed loader: a fresh
``StatefulDataLoader`` over a freshly built dataset (built untimed) loads the state taken at
that point and yields its next batch. The reference is re-reading: the same loader over the
same fpipe dataset seen through a torch ``IterableDataset`` of the user's that keeps no state,
which ``StatefulDataLoader`` resumes by its own fast-forward, reading, collating and dropping
the 1,406 batches before the first one it gives. Both sides start their workers within the
timing, as a resumed run does. The first batch of both resumed loaders is checked against the
batch the interrupted loader gave next.

C4 is ``len(pickle.dumps(loader.state_dict())) / max(1, num_workers)`` at the same point (no
packing buffers).
"""

from __future__ import annotations

import logging
import pickle

from .data import compact_path
from .harness import Pair, Value, workload

BATCH = 64
SAMPLES = 100_000
STOP = int(0.9 * SAMPLES) // BATCH  # 1,406 batches: 89,984 samples


def _plain(inner):
    """A user's torch dataset around fpipe's that keeps no state: a resume must re-read."""
    import torch

    class Plain(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from inner

    return Plain()


def _dataset(plain: bool = False):
    import fpipe
    import fpipe.torch

    data = fpipe.torch.IterableDataset(fpipe.dataset.MsgpackReader(compact_path()),
                                       layout=fpipe.torch.Shards(shuffle=True),
                                       samples=fpipe.torch.Samples(seed=0))
    return _plain(data) if plain else data


def _loader(workers: int, plain: bool = False):
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(_dataset(plain), batch_size=BATCH, num_workers=workers)


def _interrupted(workers: int, plain: bool = False) -> tuple[dict, dict]:
    """The state of a loader after STOP batches (through a pickle, as a checkpoint), and the
    batch it gives next."""
    loader = _loader(workers, plain)
    batches = iter(loader)
    for _ in range(STOP):
        next(batches)
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    following = next(batches)
    del batches
    return state, following


def _same(first: dict, second: dict) -> bool:
    import torch

    return first["key"] == second["key"] and torch.equal(first["label"], second["label"])


def _resume(workers: int):
    """C2 and C2w0: resumed from the state against re-read to the same point."""
    logging.getLogger("torchdata.stateful_dataloader.stateful_dataloader").setLevel(logging.ERROR)
    states = {plain: _interrupted(workers, plain) for plain in (False, True)}
    if not _same(states[False][1], states[True][1]):
        raise AssertionError("the fpipe dataset and the plain one read different orders")
    running: list = []  # the resumed loaders' iterators, shut down untimed
    built: dict = {}  # a fresh loader over a fresh dataset for each side, built untimed

    def build() -> None:
        running.clear()
        built.update({plain: _loader(workers, plain) for plain in (False, True)})

    def first_batch(plain: bool) -> None:
        state, following = states[plain]
        loader = built.pop(plain, None)
        if loader is None:  # the warm-up builds its own
            loader = _loader(workers, plain)
        loader.load_state_dict(state)
        batches = iter(loader)
        batch = next(batches)
        running.append(batches)
        if not _same(batch, following):
            raise AssertionError(f"the resumed loader (plain={plain}) did not carry on where "
                                 "the interrupted one stopped")

    return Pair(fpipe=lambda: first_batch(False), reference=lambda: first_batch(True),
                settle=build, teardown=running.clear)


@workload("C2", description="StatefulDataLoader over a shuffled 100,000-sample epoch (100-byte "
          "samples, batch 64, 2 workers), state taken at 90 %: load_state_dict + iter to the "
          "first batch of a fresh loader over a fresh dataset",
          reference="re-reading: StatefulDataLoader's fast-forward over the same dataset "
          "wrapped in a stateless torch IterableDataset", target="<= 0.05", kind="time")
def resume_two_workers() -> Pair:
    return _resume(2)


@workload("C2w0", description="C2 with num_workers=0",
          reference="re-reading: StatefulDataLoader's fast-forward over the same dataset "
          "wrapped in a stateless torch IterableDataset", target="<= 0.05", kind="time")
def resume_in_process() -> Pair:
    return _resume(0)


def _state_size(workers: int) -> Value:
    state, _ = _interrupted(workers)
    return Value(len(pickle.dumps(state)) / max(1, workers) / 1024, "KiB")


@workload("C4", description="C2's StatefulDataLoader state at 90 % (2 workers, no packing "
          "buffer): pickled size per worker", reference="-", target="<= 64", kind="value")
def state_size_two_workers() -> Value:
    return _state_size(2)


@workload("C4w0", description="C4 with num_workers=0 (the whole state)", reference="-",
          target="<= 64", kind="value")
def state_size_in_process() -> Value:
    return _state_size(0)
