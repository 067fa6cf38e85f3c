"""fpipe.torch.even_batches on real gloo process groups of 2 and 3 ranks, whose ranks pack
different documents into different numbers of batches; and without a process group."""

from __future__ import annotations

import math

import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from fpipe.torch import EvenBatches, even_batches

from .gloo import run_ranks


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def reports(request, tmp_path_factory) -> list[dict]:
    """What each rank of a gloo group of 2 or 3 ranks saw (see _even_rank.py)."""
    world_size, folder = request.param, tmp_path_factory.mktemp("ranks")
    paths = [folder / f"rank{rank}.json" for rank in range(world_size)]
    return run_ranks("tests.torch._even_rank", [[str(rank), str(path)] for rank, path in enumerate(paths)],
                     paths, f"even_batches on {world_size} ranks")


def test_every_rank_makes_the_same_number_of_steps_after_packing(reports):
    world_size = len(reports)
    for epoch in (0, 1):
        raw = [report[f"raw/{epoch}"] for report in reports]
        assert len(set(raw)) == world_size  # packing made the ranks' batch counts differ
        # drop: every rank stops at the shortest rank's count, and trained on a prefix of
        # what it packs (here, where the workers' batches come in the same order)
        assert [report[f"drop/{epoch}"] for report in reports] == [min(raw)] * world_size
        for report in reports:
            assert set(report[f"drop/{epoch}/tokens"]) <= set(report[f"raw/{epoch}/tokens"])
    weights = [report["drop/weight"] for report in reports]
    assert math.isfinite(weights[0]) and weights == [weights[0]] * world_size  # DDP kept in step
    # pad: every rank goes on to the longest count, repeating its last batch, and nothing is lost
    raw = [report["raw/0"] for report in reports]
    assert [report["pad/0"] for report in reports] == [max(raw)] * world_size
    assert [report["pad/0/repeated"] for report in reports] == [max(raw) - r for r in raw]
    assert [report["pad/0/tokens"] for report in reports] == [report["raw/0/tokens"] for report in reports]


def test_an_error_on_one_rank_stops_every_rank_at_that_step(reports):
    errors = [report["error"] for report in reports]
    assert errors[1][:2] == ["KeyError", "'a broken batch'"]
    for rank, (kind, message, handed) in enumerate(errors):
        assert handed == [0, 1, 2]
        if rank != 1:
            assert kind == "RuntimeError" and "another rank" in message


def test_without_a_process_group_the_batches_pass_through():
    loader = DataLoader(list(range(10)), batch_size=4)
    batches = even_batches(loader)
    assert isinstance(batches, EvenBatches) and len(batches) == len(loader) == 3
    assert [b.tolist() for b in batches] == [b.tolist() for b in loader]
    assert not hasattr(batches, "state_dict")  # a plain DataLoader has no state to pass on
    with pytest.raises(ValueError, match="even"):
        even_batches(loader, even="first")


def test_state_dict_and_load_state_dict_are_the_wrapped_loaders():
    loader = StatefulDataLoader(list(range(10)), batch_size=2)
    batches = even_batches(loader)
    iterator = iter(batches)
    assert [next(iterator).tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    state = batches.state_dict()
    resumed = even_batches(StatefulDataLoader(list(range(10)), batch_size=2))
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [[4, 5], [6, 7], [8, 9]]
