"""One resume story for the torch adapters: torchdata's StatefulDataLoader takes the state of
each worker's pass (and of the fpipe stages around it) with each batch, and a fresh loader
over a freshly built pipeline that loads it gives exactly the remaining batches; a changed grid
carries on from regrid_state, or is refused when the pipelines hold items."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from toolz import pipe

import fpipe
from fpipe.dataset import ListReader, MsgpackReader
from fpipe.torch import Elastic, IterableDataset, Samples, Shards, regrid_state

from .conftest import write_numbers

StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

DOCS = [{"key": f"{i:04d}", "n": 1 + (7 * i) % 11} for i in range(120)]


def tokens_of(document: dict) -> dict:
    start = int(document["key"]) * 100
    return {"tokens": np.arange(start, start + int(document["n"]))}


class Packed(torch.utils.data.IterableDataset):
    """The docs' pattern: a dataset of the user's that packs what an fpipe dataset reads."""

    def __init__(self, inner, length: int = 16) -> None:
        self.inner, self.length = inner, length

    def __iter__(self):
        return pipe(self.inner, fpipe.stream.map(tokens_of), fpipe.pack(self.length, buffer_size=4))


def row_tokens(rows: list) -> list:
    return [row["tokens"][row["segment_ids"] > 0].tolist() for row in rows]


def loader_of(data, workers: int, batch_size: int = 4, collate=list):
    return StatefulDataLoader(data, batch_size=batch_size, num_workers=workers,
                              collate_fn=collate)


def resumed_after(make, stop: int) -> tuple[list, list, list]:
    """The whole pass, the first `stop` batches of another, and the rest of a third loader
    built anew that loads the second's state (pickled, as a checkpoint would be)."""
    whole = list(make())
    loader = make()
    batches = iter(loader)
    head = [next(batches) for _ in range(stop)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    again = make()
    again.load_state_dict(state)
    return whole, head, list(again)


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("mode", ["plain", "shuffle", "even", "elastic"])
def test_a_stateful_loader_resumes_a_dataset_exactly(tmp_path, mode, workers):
    path = write_numbers(tmp_path / "numbers.msgpack", 90)

    def make():
        ranks = {"rank": 0, "world_size": 2 if mode == "even" else 1}
        layout = Elastic(**ranks) if mode == "elastic" else Shards(
            **ranks, even="drop" if mode == "even" else None, shuffle=mode == "shuffle")
        data = IterableDataset(MsgpackReader(path), batch_size=4 if mode == "elastic" else None,
                               layout=layout, samples=Samples(seed=5))
        return loader_of(data, workers, collate=lambda samples: [s["x"] for s in samples])

    for stop in (0, 1, 5):
        whole, head, rest = resumed_after(make, stop)
        assert head + rest == whole, (stop, head, rest)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("elastic", [False, True])
def test_packing_around_an_fpipe_dataset_resumes_every_token_once_in_order(workers, elastic):
    def make():
        inner = IterableDataset(ListReader(DOCS), batch_size=4 if elastic else None,
                                layout=Elastic() if elastic else Shards())
        return loader_of(Packed(inner), workers, collate=row_tokens)

    for stop in (1, 4):
        whole, head, rest = resumed_after(make, stop)
        assert head + rest == whole


def test_state_dict_of_a_counted_batch_is_refused_when_a_wrapper_packs_in_the_workers():
    # the corruption of the issue: the caller counts packed batches, the dataset its own
    ranks = [IterableDataset(ListReader(DOCS), batch_size=4, layout=Elastic(rank=r, world_size=2))
             for r in range(2)]
    loader = torch.utils.data.DataLoader(Packed(ranks[0]), batch_size=4, num_workers=1,
                                         collate_fn=row_tokens)
    batches = iter(loader)
    steps = sum(1 for _ in zip(range(3), batches))
    with pytest.raises(ValueError, match="a dataset of yours reads this one"):
        ranks[0].state_dict(batches=steps)
    del batches


def test_state_dict_of_a_count_other_than_the_samples_handed_out_is_refused():
    data = IterableDataset(ListReader(DOCS), batch_size=4, layout=Elastic())
    packed = iter(Packed(data))  # in this process: nothing can tell, but the count
    for _ in range(3):
        next(packed)
    with pytest.raises(ValueError, match=r"state_dict\(batches=3\) cannot be right: 3 batches"):
        data.state_dict(batches=3)
    plain = IterableDataset(ListReader(DOCS), batch_size=4, layout=Elastic())
    loader = torch.utils.data.DataLoader(plain, batch_size=4)
    batches = iter(loader)
    [next(batches) for _ in range(3)]
    assert plain.state_dict(batches=3)["position"] == 12


def test_a_pass_state_loads_only_on_its_grid_before_the_first_item():
    data = IterableDataset(ListReader(DOCS), layout=Shards(rank=0, world_size=2))
    first = iter(data)
    next(first)
    state = first.state_dict()
    assert state["type"] == "IterableDatasetPass" and state["done"] == 1
    with pytest.raises(ValueError, match="before the first item"):
        first.load_state_dict(state)
    other = IterableDataset(ListReader(DOCS), layout=Shards(rank=0, world_size=3))
    with pytest.raises(ValueError, match="world_size=2; this one has world_size=3.*same dataset and grid"):
        iter(other).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state\['done'\] must be at most"):
        iter(IterableDataset(ListReader(DOCS), layout=Shards(rank=0, world_size=2))).load_state_dict(
            {**state, "done": 10 ** 6})
    with pytest.raises(ValueError, match="is no shard of epoch 0"):
        iter(IterableDataset(ListReader(DOCS), layout=Shards(rank=0, world_size=2))).load_state_dict(
            {**state, "window": [1, 7]})
    fresh = IterableDataset(ListReader(DOCS), layout=Shards(rank=0, world_size=2))
    fresh.load_state_dict(state)  # the next pass of this process carries on
    assert [s["key"] for s in fresh][0] == "0001"


def test_the_resumed_epoch_is_the_states_and_the_next_pass_reads_the_epoch_after_it():
    data = IterableDataset(ListReader(DOCS[:12]), layout=Shards(shuffle=True), samples=Samples(seed=1))
    data.set_epoch(3)
    passes = iter(data)
    head = [next(passes)["key"] for _ in range(5)]
    again = IterableDataset(ListReader(DOCS[:12]), layout=Shards(shuffle=True), samples=Samples(seed=1))
    again.load_state_dict(passes.state_dict())
    rest = [s["key"] for s in again]
    data.set_epoch(3)
    assert head + rest == [s["key"] for s in data]
    assert [s["key"] for s in again] == [s["key"] for s in data]  # both read epoch 4


def test_a_stream_whose_work_runs_in_threads_refuses_to_save_its_place():
    stream = pipe(ListReader(DOCS), fpipe.threads(tokens_of, n_workers=2))
    next(stream)
    with pytest.raises(TypeError, match=r"threads\(.*cannot save its place"):
        stream.state_dict()
    stream.close()


def run_ranks(world_size: int, workers: int, make_data, stop: int | None, collate, state=None,
              global_batch: int = 12):
    """Every rank's loader for `stop` steps (all, if None); the batches and the loader states."""
    batches, states = [], []
    for rank in range(world_size):
        data = make_data(rank, world_size)
        if state is not None:
            data.load_state_dict(state)
        loader = loader_of(data, workers, global_batch // world_size, collate=collate)
        taken = []
        for batch in loader:
            taken.append(batch)
            if len(taken) == stop:
                break
        batches.append(taken)
        states.append(pickle.loads(pickle.dumps(loader.state_dict())))
    return batches, states


def test_an_elastic_run_moves_to_another_grid_with_every_sample_once():
    def make(rank, world_size):
        return IterableDataset(ListReader(DOCS), batch_size=12 // world_size,
                               layout=Elastic(rank=rank, world_size=world_size))

    keys = lambda samples: [s["key"] for s in samples]  # noqa: E731
    head, states = run_ranks(2, 2, make, 3, keys)
    state = regrid_state(states)
    assert state["position"] == 3 * 12
    rest, _ = run_ranks(3, 1, make, None, keys, state)
    seen = [k for rank in head + rest for batch in rank for k in batch]
    assert sorted(seen) == [d["key"] for d in DOCS]


def test_a_packed_run_that_holds_rows_is_refused_on_another_grid():
    def make(rank, world_size):
        return Packed(IterableDataset(ListReader(DOCS), batch_size=12 // world_size,
                                      layout=Elastic(rank=rank, world_size=world_size)))

    _, states = run_ranks(2, 1, make, 2, row_tokens)
    with pytest.raises(ValueError, match="hold items that another grid cannot take over"):
        regrid_state(states)
    with pytest.raises(ValueError, match="at different steps"):
        early, late = run_ranks(2, 0, make_plain, 2, list)[1], run_ranks(2, 0, make_plain, 5, list)[1]
        regrid_state(early[:1] + late[1:])


def make_plain(rank, world_size):
    return IterableDataset(ListReader(DOCS), batch_size=12 // world_size,
                           layout=Elastic(rank=rank, world_size=world_size))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_state_of_a_shuffled_pass_is_a_few_numbers_whatever_the_samples(workers):
    big = [{"key": f"{i:05d}", "pixels": np.zeros(50_000, np.uint8)} for i in range(400)]
    data = IterableDataset(ListReader(big), layout=Shards(shuffle=True), samples=Samples(seed=0))
    loader = loader_of(data, workers)
    batches = iter(loader)
    next(batches)
    assert len(pickle.dumps(loader.state_dict())) < 8 * 1024  # a sample alone is 50 kB


def noisy(sample: dict) -> dict:
    if int(sample["key"]) % 17 == 5:
        raise ValueError("a damaged sample")
    return {"key": sample["key"], "noise": int(fpipe.current_rng().integers(0, 10 ** 6))}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("threads", [2, "auto"])
def test_transforms_in_threads_give_the_same_samples_and_resume_exactly(workers, threads):
    def make(threads=threads):
        data = IterableDataset(ListReader(DOCS), noisy, layout=Shards(shuffle=True),
                               samples=Samples(seed=3, n_threads=threads, on_error="skip"))
        return loader_of(data, workers, collate=lambda samples: [(s["key"], s["noise"])
                                                                 for s in samples])

    assert list(make(None)) == list(make())  # whatever the threads, the same samples
    for stop in (1, 6):
        whole, head, rest = resumed_after(make, stop)
        assert head + rest == whole


def test_threads_are_checked_when_the_dataset_is_built():
    with pytest.raises(ValueError, match="n_threads must be an integer or 'auto'; got n_threads='many'"):
        IterableDataset(ListReader(DOCS), samples=Samples(n_threads="many"))
    with pytest.raises(ValueError, match="n_threads must be >= 1; got n_threads=0"):
        IterableDataset(ListReader(DOCS), samples=Samples(n_threads=0))


def test_skips_counted_from_threads_are_all_counted():
    data = IterableDataset(ListReader(DOCS), noisy, samples=Samples(seed=0, n_threads=4, on_error="skip"))
    kept = sum(1 for _ in data)
    assert kept + data.skipped == len(DOCS) and data.skipped == sum(
        1 for d in DOCS if int(d["key"]) % 17 == 5)


def test_an_abandoned_pass_stops_its_threads():
    import gc
    import threading
    import time

    before = threading.active_count()
    passes = iter(IterableDataset(ListReader(DOCS), noisy,
                                  samples=Samples(seed=0, n_threads=3, on_error="skip")))
    next(passes)
    assert threading.active_count() > before
    del passes
    gc.collect()
    deadline = time.monotonic() + 30  # generous: a loaded machine joins threads late
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("sampler", ["elastic", "shuffle"])
def test_a_map_style_dataset_resumes_exactly_under_a_stateful_loader(workers, sampler):
    from fpipe.orderings import Shuffler
    from fpipe.torch import Dataset, ElasticBatchSampler, Samples

    def make():
        data = Dataset(Shuffler(ListReader(DOCS), seed=1), noisy,
                       samples=Samples(seed=2, on_error="skip"))
        keys = lambda samples: [(s["key"], s["noise"]) for s in samples]  # noqa: E731
        if sampler == "elastic":  # its state_dict() without batches is the loader's to take
            return StatefulDataLoader(data, batch_sampler=ElasticBatchSampler(data, batch_size=8),
                                      num_workers=workers, collate_fn=keys)
        return StatefulDataLoader(data, batch_size=8, shuffle=True, num_workers=workers,
                                  collate_fn=keys, generator=torch.Generator().manual_seed(4))

    for stop in (1, 5):
        whole, head, rest = resumed_after(make, stop)
        assert head + rest == whole
