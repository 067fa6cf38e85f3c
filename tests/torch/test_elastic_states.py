"""Elastic states and epochs (issue 31): IterableDataset(layout=Elastic()) and ElasticBatchSampler
keep one rule for set_epoch after load_state_dict, refuse the ambiguous call, count the pass
under way in len(), name what made a state, and a dataset that skips samples resumes exactly
or refuses."""

from __future__ import annotations

import warnings

import pytest
from torch.utils.data import DataLoader

from fpipe.dataset import ListReader
from fpipe.torch import Dataset, Elastic, ElasticBatchSampler, IterableDataset, Samples

N = 40
READER = ListReader([{"x": i} for i in range(N)])


def saved(epoch, position):
    """An elastic state of epoch ``epoch`` at ``position`` (as every fpipe version loads it)."""
    return {"epoch": epoch, "position": position, "length": N}


def stream(batch_size=8):
    return IterableDataset(READER, batch_size=batch_size, layout=Elastic())


def sampler(batch_size=8):
    return ElasticBatchSampler(N, batch_size, rank=0, world_size=1)


def seen(data) -> list[int]:
    """The positions of one pass of ``data``, an elastic dataset or a sampler."""
    if isinstance(data, ElasticBatchSampler):
        return [i for batch in data for i in batch]
    return [sample["x"] for sample in data]


@pytest.mark.parametrize("make", [stream, sampler], ids=["IterableDataset", "ElasticBatchSampler"])
def test_set_epoch_of_the_state_s_epoch_keeps_the_state(make):
    data = make()
    data.load_state_dict(saved(1, 16))
    data.set_epoch(1)  # a loop that sets the epoch at the start of each epoch, the resumed one too
    assert seen(data) == list(range(16, N))
    data.set_epoch(2)
    assert seen(data) == list(range(N))


@pytest.mark.parametrize("make", [stream, sampler], ids=["IterableDataset", "ElasticBatchSampler"])
def test_a_state_at_the_end_of_its_epoch_is_done_when_the_next_epoch_is_set(make):
    data = make()
    data.load_state_dict(saved(1, 40))
    data.set_epoch(2)
    assert seen(data) == list(range(N))  # epoch 2, whole


@pytest.mark.parametrize("make", [stream, sampler], ids=["IterableDataset", "ElasticBatchSampler"])
def test_another_epoch_after_a_mid_epoch_state_is_refused(make):
    data = make()
    data.load_state_dict(saved(1, 16))
    with pytest.raises(ValueError, match=r"set_epoch\(2\) after load_state_dict\(\) of a state of "
                                         r"epoch 1 at position 16 of 40.*24 samples left"):
        data.set_epoch(2)
    with pytest.raises(ValueError, match=r"set_epoch\(0\)"):
        data.set_epoch(0)
    assert seen(data) == list(range(16, N))  # the refused calls changed nothing
    data.set_epoch(0)  # the state was read: any epoch again
    assert seen(data) == list(range(N))


def test_the_same_loop_sees_the_same_samples_with_the_dataset_and_the_sampler():
    state = saved(1, 24)

    def loop(data, loader):
        out = []
        data.load_state_dict(state)
        for epoch in (1, 2):
            data.set_epoch(epoch)
            out.append([int(x) for batch in loader for x in batch["x"]])
        return out

    iterable = stream()
    by_stream = loop(iterable, DataLoader(iterable, batch_size=8))
    dataset = Dataset(READER)
    batches = sampler()
    by_sampler = loop(batches, DataLoader(dataset, batch_sampler=batches))
    assert by_stream == by_sampler == [list(range(24, N)), list(range(N))]


def test_len_counts_the_pass_under_way_of_a_resumed_sampler():
    batches = sampler()
    batches.load_state_dict(saved(0, 16))
    loader = DataLoader(Dataset(READER), batch_sampler=batches)
    assert len(loader) == 3
    iterator = iter(loader)
    next(iterator)
    assert len(loader) == 3  # the pass under way, not the whole epoch after it
    assert len(list(iterator)) == 2
    assert len(loader) == 5  # the next pass is whole


def test_len_counts_the_pass_under_way_of_a_resumed_dataset():
    data = stream()
    data.load_state_dict(saved(0, 16))
    assert len(data) == 24
    iterator = iter(data)
    next(iterator)
    assert len(data) == 24
    assert len(list(iterator)) == 23
    assert len(data) == N


def test_states_name_what_made_them_and_another_length_is_refused():
    data = stream()
    state = data.state_dict(batches=2)
    assert state == {"type": "ElasticEpoch", "version": 1, "length": N, "epoch": 0, "position": 16}
    moved = IterableDataset(READER, batch_size=4, layout=Elastic(rank=1, world_size=3))
    moved.load_state_dict(state)  # another grid and batch size: it may move
    with pytest.raises(ValueError, match="ElasticEpoch with length=40; this one has length=39"):
        ElasticBatchSampler(39, 8, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="the state of a 'Shuffler', not of an ElasticEpoch"):
        data.load_state_dict({**state, "type": "Shuffler"})
    with pytest.raises(TypeError, match=r"state\['epoch'\] must be an integer"):
        data.load_state_dict({**state, "epoch": 1.5})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an old elastic state says all it needs
        data.load_state_dict({"epoch": 0, "position": 16, "length": N})


def fails_on_fives(sample):
    if sample["x"] % 5 == 0:
        raise ValueError(f"bad sample {sample['x']}")
    return sample


def test_an_elastic_dataset_that_may_skip_samples_is_refused():
    with pytest.raises(ValueError, match=r"layout=Elastic\(\) needs Samples\(on_error='raise'\)"
                                         ".*ElasticBatchSampler"):
        IterableDataset(READER, fails_on_fives, batch_size=8, layout=Elastic(),
                        samples=Samples(on_error="skip"))
    # nothing to skip: no transforms
    IterableDataset(READER, batch_size=8, layout=Elastic(), samples=Samples(on_error="skip"))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("done", [1, 2, 3])
def test_a_resumed_pass_of_a_dataset_that_skips_samples_is_the_rest_of_the_pass(done, workers):
    def labels(data, **resume):
        if resume:
            data.resume(**resume)
        loader = DataLoader(data, batch_size=4, num_workers=workers)
        return [[int(x) for x in batch["x"]] for batch in loader]

    def make():
        return IterableDataset(READER, fails_on_fives, samples=Samples(on_error="skip"))

    whole = labels(make())
    assert labels(make(), batches=done, batch_size=4) == whole[done:]


def test_the_sampler_with_a_skipping_dataset_resumes_exactly():
    dataset = Dataset(READER, fails_on_fives, samples=Samples(on_error="skip"))
    whole = [[int(x) for x in b["x"]] for b in DataLoader(dataset, batch_sampler=sampler())]
    first = sampler()
    loader = iter(DataLoader(dataset, batch_sampler=first))
    before = [[int(x) for x in next(loader)["x"]] for _ in range(2)]
    again = sampler(batch_size=8)
    again.load_state_dict(first.state_dict(batches=2))
    after = [[int(x) for x in b["x"]] for b in DataLoader(dataset, batch_sampler=again)]
    assert before + after == whole


def fails_early(sample):
    if sample["x"] in (0, 1, 2, 3, 5):
        raise ValueError(f"bad sample {sample['x']}")
    return sample


def test_a_resume_past_a_worker_that_ran_out_for_its_failed_samples_is_refused():
    reader = ListReader([{"x": i} for i in range(20)])  # two workers: 0..9 and 10..19

    def batches(**resume):
        data = IterableDataset(reader, fails_early, samples=Samples(on_error="skip"))
        if resume:
            data.resume(**resume)
        return [[int(x) for x in b["x"]] for b in DataLoader(data, batch_size=4, num_workers=2)]

    whole = batches()  # worker 0 has 5 good samples, 2 batches; worker 1 has 3
    assert len(whole) == 5
    assert batches(batches=4, batch_size=4) == whole[4:]
    with pytest.raises(RuntimeError, match=r"resume\(5, batch_size=4\) cannot be exact: the "
                                           r"samples that failed in positions 0..9"):
        batches(batches=5, batch_size=4)
    assert batches(batches=6, batch_size=4) == []  # past the end of every shard: empty
