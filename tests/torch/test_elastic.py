"""Elastic resume on real DataLoaders: IterableDataset(layout=Elastic()) and ElasticBatchSampler
save where the epoch stands and carry on on another grid of ranks × workers (ranks played by
datasets with explicit rank and world_size, in one process), every sample once."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import fpipe
from fpipe.dataset import ListReader
from fpipe.orderings import Shuffler
from fpipe.sharding import elastic_state_dict
from fpipe.torch import Compose, Dataset, Elastic, ElasticBatchSampler, IterableDataset, Samples

N = 29  # awkward: no grid below divides it


def draw(_sample) -> dict:
    return {"p": float(fpipe.current_rng().random())}


def make_stream(reader, rank, world_size, batch_size, even=None):
    return IterableDataset(reader, {"x": Compose(abs)}, draw, batch_size=batch_size, chunk_size=2,
                           layout=Elastic(rank=rank, world_size=world_size, even=even),
                           samples=Samples(seed=3))


def as_pairs(batch) -> list[tuple[int, float]]:
    return list(zip(batch["x"].tolist(), batch["__params__"]["p"].tolist()))


def run_grid(datasets, workers, batch_size, steps=None, persistent=False):
    """``steps`` steps (all, if None) of one DataLoader per rank; the batches, step by step."""
    loaders = [iter(DataLoader(d, batch_size=batch_size, num_workers=workers,
                               persistent_workers=persistent and workers > 0)) for d in datasets]
    taken = []
    while steps is None or len(taken) < steps:
        step = [as_pairs(batch) for batch in (next(loader, None) for loader in loaders) if batch is not None]
        if not step:
            break
        taken.append(step)
    return taken


@pytest.fixture(scope="module")
def reference():
    """Every sample of epoch 1 with its parameters, read whole by one process."""
    data = make_stream(ListReader([{"x": i} for i in range(N)]), 0, 1, N)
    data.set_epoch(1)
    return dict(pair for batch in run_grid([data], 0, N) for step in batch for pair in step)


def expected_steps(position, world_size, batch_size, reference, order=range(N)):
    """What a run that never stopped, on this grid from ``position``, makes in its full steps."""
    step = world_size * batch_size
    def batch(start):
        return [(order[p], reference[order[p]]) for p in range(start, start + batch_size)]
    return [[batch(start + r * batch_size) for r in range(world_size)]
            for start in range(position, N - step + 1, step)]


@pytest.mark.parametrize("grids", [
    [(2, 2, 2, 3), (1, 3, 3, 2), (2, 1, 2, None)],
    [(1, 0, 4, 2), (3, 2, 1, 4), (2, 2, 3, None)],
], ids=["2x2-1x3-2x1", "1x0-3x2-2x2"])
def test_switching_grids_mid_epoch_sees_the_epoch_once_with_the_batches_of_the_new_grid(grids, reference):
    reader = ListReader([{"x": i} for i in range(N)])
    seen, state = [], None
    for world_size, workers, batch_size, steps in grids:
        datasets = [make_stream(reader, r, world_size, batch_size) for r in range(world_size)]
        for data in datasets:
            data.load_state_dict(state) if state else data.set_epoch(1)
        position = datasets[0].state_dict(0)["position"]
        taken = run_grid(datasets, workers, batch_size, steps)
        full = expected_steps(position, world_size, batch_size, reference)
        assert taken[:len(full)] == full[:len(taken)]
        seen += [pair for step in taken for batch in step for pair in batch]
        states = [data.state_dict(len(taken)) for data in datasets]
        assert states[0]["epoch"] == 1 and all(s == states[0] for s in states)
        state = states[0]
    assert state["position"] == N
    assert sorted(seen) == sorted(reference.items())


def test_a_shuffled_order_and_persistent_workers_carry_over_and_the_next_pass_is_whole():
    reader = Shuffler(ListReader([{"x": i} for i in range(N)]), seed=4)
    reader.set_epoch(2)
    order = [sample["x"] for sample in reader]
    first = make_stream(reader, 0, 1, 4)
    first.set_epoch(2)
    before = run_grid([first], 2, 4, steps=3)
    assert [x for step in before for x, _ in step[0]] == order[:12]
    second = [make_stream(reader, r, 2, 3) for r in range(2)]
    loaders = [DataLoader(d, batch_size=3, num_workers=2, persistent_workers=True) for d in second]
    for data in second:
        data.load_state_dict(first.state_dict(3))
    rest = [[as_pairs(b) for b in loader] for loader in loaders]
    assert [x for a, b in zip(*rest) for x, _ in a + b] == order[12:]  # step by step, in order
    for data in second:
        data.set_epoch(3)
    whole = [[x for b in loader for x, _ in as_pairs(b)] for loader in loaders]
    assert sorted(whole[0] + whole[1]) == list(range(N))


@pytest.mark.parametrize("even", ["drop", "pad"])
def test_even_ranks_make_equal_batch_counts_after_a_switch(even):
    reader = ListReader([{"x": i} for i in range(N)])
    first = [make_stream(reader, r, 2, 2, even) for r in range(2)]
    run_grid(first, 2, 2, steps=2)
    state = first[0].state_dict(2)
    after = [make_stream(reader, r, 2, 3, even) for r in range(2)]
    for data in after:
        data.load_state_dict(state)
    lengths = [len(data) for data in after]
    counts = [len(list(DataLoader(d, batch_size=3, num_workers=2))) for d in after]
    # 21 samples left: 3 steps of 6, then 3 more: one each and one dropped, or two each
    assert counts == [4, 4] and lengths == ([10, 10] if even == "drop" else [11, 11])


def test_resume_in_elastic_mode_is_the_position_of_the_batches_done():
    reader = ListReader([{"x": i} for i in range(N)])
    data = make_stream(reader, 1, 2, 3)
    data.resume(2, batch_size=3)
    assert data.state_dict(0) == elastic_state_dict(0, 12, N)
    rank_1 = [x for b in DataLoader(data, batch_size=3) for x, _ in as_pairs(b)]
    assert rank_1 == [15, 16, 17, 21, 22, 23, 27, 28]


def test_the_map_style_sampler_switches_grids_with_dataloader_workers():
    data = Dataset(ListReader([{"x": i} for i in range(N)]), {"x": Compose(abs)}, draw,
                   samples=Samples(seed=3))
    samplers = [ElasticBatchSampler(data, 3, rank=r, world_size=2) for r in range(2)]
    loaders = [iter(DataLoader(data, batch_sampler=s, num_workers=2)) for s in samplers]
    before = [as_pairs(next(loader)) for _ in range(2) for loader in loaders]
    state = samplers[1].state_dict(2)
    assert state == samplers[0].state_dict(2) == elastic_state_dict(0, 12, N)
    after = [ElasticBatchSampler(N, 4, rank=r, world_size=3) for r in range(3)]
    for sampler in after:
        sampler.load_state_dict(state)
    rest = [[as_pairs(b) for b in DataLoader(data, batch_sampler=s, num_workers=3)] for s in after]
    # 3 ranks of 4 from 12: rank 1 takes 16..19, then 26 and 27 of the last 5
    assert [b[0][0] for b in rest[1]] == [16, 26]
    pairs = [p for b in before for p in b] + [p for rank in rest for b in rank for p in b]
    assert sorted(x for x, _ in pairs) == list(range(N))
    assert dict(pairs) == {i: data[i]["__params__"]["p"] for i in range(N)}
    assert len(after[0]) == 3 and [len(list(s)) for s in after] == [3, 3, 3]  # the next pass is whole


def test_elastic_arguments_and_states_are_checked():
    reader = ListReader([{"x": i} for i in range(5)])
    with pytest.raises(ValueError, match=r"layout=Elastic\(\) needs batch_size"):
        IterableDataset(reader, layout=Elastic())
    with pytest.raises(TypeError, match="Elastic got an unexpected keyword argument 'shuffle': an "
                                        "elastic epoch has one order; shuffle it with an ordering"):
        IterableDataset(reader, batch_size=2, layout=Elastic(shuffle=True))
    with pytest.raises(TypeError, match="'elastic': it became layout=Elastic"):
        IterableDataset(reader, batch_size=2, elastic="yes")
    with pytest.raises(TypeError, match=r"layout must be Shards\(...\) or Elastic\(...\); "
                                        "got layout='elastic'"):
        IterableDataset(reader, batch_size=2, layout="elastic")
    with pytest.raises(ValueError, match=r"needs IterableDataset.*layout=Elastic\(\)"):
        IterableDataset(reader).state_dict(0)
    data = IterableDataset(reader, batch_size=2, layout=Elastic())
    with pytest.raises(TypeError, match="state must be a dict"):
        data.load_state_dict({"epoch": 0, "position": 1})
    with pytest.raises(ValueError, match="ElasticEpoch with length=6; this one has length=5"):
        data.load_state_dict({"epoch": 0, "position": 1, "length": 6})
    with pytest.raises(ValueError, match="at most the length 5; got 6"):
        data.load_state_dict({"epoch": 0, "position": 6, "length": 5})
    with pytest.raises(ValueError, match="batches must be >= 0"):
        data.state_dict(-1)
    with pytest.raises(TypeError, match="data must be a dataset with len"):
        ElasticBatchSampler(object(), 2, rank=0, world_size=1)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ElasticBatchSampler(5, 0, rank=0, world_size=1)
    with pytest.raises(ValueError, match="even"):
        ElasticBatchSampler(5, 2, rank=0, world_size=1, even="half")
