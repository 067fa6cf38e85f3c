"""An IndexShuffler under the torch adapters: sharded over ranks and DataLoader workers, in a
map-style Dataset, and elastic (a state moves to another grid); every worker computes its
positions itself, with no permutation drawn or shipped."""

from __future__ import annotations

from torch.utils.data import DataLoader

from fpipe.dataset import MsgpackReader
from fpipe.orderings import IndexShuffler
from fpipe.torch import Dataset, Elastic, IterableDataset, Shards

from .conftest import write_numbers

N = 61


def shuffled(path, epoch):
    shuffler = IndexShuffler(MsgpackReader(path), seed=8)
    shuffler.set_epoch(epoch)
    return [s["x"] for s in shuffler]


def test_ranks_and_workers_read_their_shards_of_the_epochs_order(tmp_path):
    path = write_numbers(tmp_path / "n.msgpack", N)
    for epoch in (0, 1):
        got = []
        for rank in range(2):
            data = IterableDataset(IndexShuffler(MsgpackReader(path), seed=8),
                                   layout=Shards(rank=rank, world_size=2, even="pad"))
            data.set_epoch(epoch)
            got += [x for batch in DataLoader(data, batch_size=5, num_workers=2)
                    for x in batch["x"].tolist()]
        order = shuffled(path, epoch)
        assert sorted(set(got)) == list(range(N)) and len(got) == N + 1  # one padded
        assert set(got) == set(order)


def test_a_map_style_dataset_reads_the_epochs_order(tmp_path):
    path = write_numbers(tmp_path / "n.msgpack", N)
    data = Dataset(IndexShuffler(MsgpackReader(path), seed=8))
    data.set_epoch(1)
    loader = DataLoader(data, batch_size=7, num_workers=2)
    assert [x for batch in loader for x in batch["x"].tolist()] == shuffled(path, 1)


def test_an_elastic_state_carries_the_order_onto_another_grid(tmp_path):
    path = write_numbers(tmp_path / "n.msgpack", N)
    order = shuffled(path, 2)

    def stream(rank, world_size, batch_size):
        data = IterableDataset(IndexShuffler(MsgpackReader(path), seed=8), batch_size=batch_size,
                               layout=Elastic(rank=rank, world_size=world_size))
        data.set_epoch(2)
        return data

    first = stream(0, 1, 4)
    loader = iter(DataLoader(first, batch_size=4, num_workers=2))
    head = [x for _ in range(3) for x in next(loader)["x"].tolist()]
    assert head == order[:12]
    state = first.state_dict(3)
    ranks = [stream(r, 2, 3) for r in range(2)]
    for data in ranks:
        data.load_state_dict(state)
    rest = [[x for b in DataLoader(d, batch_size=3, num_workers=2) for x in b["x"].tolist()]
            for d in ranks]
    assert sorted(head + rest[0] + rest[1]) == list(range(N))
    assert rest[0][:3] == order[12:15] and rest[1][:3] == order[15:18]
