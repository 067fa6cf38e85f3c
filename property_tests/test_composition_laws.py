"""The law of compositions: a pipeline made of any source, ordering and stages, read through
torchdata's StatefulDataLoader by any number of workers on any number of ranks, interrupted at
any batch and resumed from the loader's state, delivers every item once: in the uninterrupted
order on the same grid; on another grid (through ``fpipe.torch.regrid_state``) exactly once,
or the state is refused with a ``ValueError``. Hypothesis picks the composition."""

from __future__ import annotations

import collections
import os
import pickle
import tempfile

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from toolz import pipe

torch = pytest.importorskip("torch")
StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

import fpipe  # noqa: E402
from fpipe.dataset import FileWriter, ListReader, MsgpackReader  # noqa: E402
from fpipe.orderings import QuasiShuffler, Shuffler  # noqa: E402
from fpipe.orderings.permutation import IndexShuffler  # noqa: E402
from fpipe.remote import RemoteOptions  # noqa: E402
from fpipe.torch import Elastic, IterableDataset, Samples, Shards, regrid_state  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]

N = 48
DOCS = [{"key": f"{i:04d}", "cls": 1 + (5 * i) % 9} for i in range(N)]
OTHER = [{"key": f"x{i:03d}", "cls": 1 + i % 4} for i in range(15)]


@pytest.fixture(scope="module")
def folder():
    with tempfile.TemporaryDirectory() as name:
        yield name


def reader_of(kind: str, folder: str):
    if kind == "list":
        return ListReader(DOCS)
    if kind == "msgpack":
        path = f"{folder}/docs.msgpack"
        try:
            return MsgpackReader(path)
        except (OSError, ValueError):
            with FileWriter(path, overwrite=True) as writer:
                for doc in DOCS:
                    writer.write(doc)
            return MsgpackReader(path)
    if kind == "parquet":
        from fpipe.formats import ParquetReader, write_parquet
        paths = [f"{folder}/docs-{i:03d}.parquet" for i in range(3)]
        if not os.path.exists(paths[-1]):
            write_parquet(DOCS, f"{folder}/docs-%03d.parquet", shard_size=20)
        return ParquetReader(paths)
    from fpipe.formats import WebDatasetReader, write_webdataset
    try:
        return WebDatasetReader(f"{folder}/docs-*.tar", decode=True,
                                remote=RemoteOptions(cache_dir=f"{folder}/cache"))
    except (OSError, ValueError):
        write_webdataset(DOCS, f"{folder}/docs-%03d.tar", shard_size=20)
        return WebDatasetReader(f"{folder}/docs-*.tar", decode=True,
                                remote=RemoteOptions(cache_dir=f"{folder}/cache"))


def ordered(reader, ordering: str):
    if ordering == "Shuffler":
        return Shuffler(reader, seed=3)
    if ordering == "IndexShuffler":
        return IndexShuffler(reader, seed=3)
    if ordering == "QuasiShuffler":
        return QuasiShuffler(reader, seed=3, buf_size=6, chunk_size=2)
    return reader


def tokens(doc: dict) -> dict:
    start = 1000 * (int(doc["key"][1:]) + (500 if doc["key"][0] == "x" else 0))
    return {"tokens": np.arange(start, start + int(doc["cls"]))}


def keep(doc: dict) -> bool:
    return int(doc["cls"]) != 3


class Pipeline(torch.utils.data.IterableDataset):
    """A dataset of the user's around fpipe's, as the docs show: stages built in each pass."""

    def __init__(self, inner, stages: tuple) -> None:
        self.inner, self.stages = inner, stages

    def load_state_dict(self, state):  # for regrid_state's elastic state, onto the inner dataset
        self.inner.load_state_dict(state)

    def __iter__(self):
        made = []
        source = self.inner
        for name in self.stages:
            if name == "mix":
                source = fpipe.mix(source, OTHER, seed=4, until="all")
            elif name == "filter":
                made.append(fpipe.stream.filter(keep))
            elif name == "map":
                made.append(fpipe.stream.map(tokens))
            elif name == "pool":
                made.append(fpipe.stream.ExpirationPool(3, 2, seed=5))
            elif name == "pack":
                made += [] if "map" in self.stages else [fpipe.stream.map(tokens)]
                made.append(fpipe.pack(8, buffer_size=3))
            elif name == "batch":
                made.append(fpipe.batch(3))
        return pipe(source, *made) if made else iter(source)


def atoms(item) -> list:
    """What an item of the loader stands for: its tokens, or its keys."""
    if isinstance(item, list):
        return [a for part in item for a in atoms(part)]
    if isinstance(item, dict) and "segment_ids" in item:
        return item["tokens"][item["segment_ids"] > 0].tolist()
    if isinstance(item, dict) and "tokens" in item:
        return item["tokens"].tolist()
    return [item["key"]]


def flat(batches: list) -> list:
    return [atoms(item) for batch in batches for item in batch]


compositions = st.fixed_dictionaries({
    "source": st.sampled_from(["list", "msgpack", "parquet", "webdataset"]),
    "ordering": st.sampled_from(["in order", "Shuffler", "IndexShuffler", "QuasiShuffler",
                                 "shuffle=True"]),
    "stages": st.lists(st.sampled_from(["filter", "map", "pool", "pack", "batch", "mix"]),
                       max_size=3, unique=True).map(lambda names: tuple(sorted(
                           names, key=["mix", "filter", "map", "pool", "pack", "batch"].index))),
    "workers": st.sampled_from([0, 0, 1, 2]),
    "ranks": st.integers(1, 3),
    "elastic": st.booleans(),
    "threads": st.sampled_from([None, None, 2, "auto"]),  # the dataset's transforms in threads
    "stop": st.integers(0, 8),
    "new_ranks": st.integers(1, 3),
})


def dataset(folder, composition: dict, rank: int, ranks: int):
    ordering = composition["ordering"]
    elastic = composition["elastic"] and ordering != "shuffle=True"
    threads = composition["threads"]
    layout = Elastic(rank=rank, world_size=ranks) if elastic else Shards(
        rank=rank, world_size=ranks, shuffle=ordering == "shuffle=True")
    inner = IterableDataset(ordered(reader_of(composition["source"], folder), ordering),
                            dict if threads else None, batch_size=12 // ranks if elastic else None,
                            layout=layout, samples=Samples(seed=7, n_threads=threads))
    return Pipeline(inner, composition["stages"])


def loaders(folder, composition: dict, ranks: int, state=None) -> list:
    result = []
    for rank in range(ranks):
        data = dataset(folder, composition, rank, ranks)
        if state is not None:
            data.load_state_dict(state)
        result.append(StatefulDataLoader(data, batch_size=12 // ranks,
                                         num_workers=composition["workers"], collate_fn=list))
    return result


@settings(max_examples=25, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(compositions)
def test_any_composition_resumes_every_item_once(folder, composition):
    ranks = composition["ranks"]
    whole = [list(loader) for loader in loaders(folder, composition, ranks)]
    head, states = [], []
    # interrupted before the end of every pass (a state at its end begins the next epoch)
    stop = max(0, min(composition["stop"], *(len(batches) - 1 for batches in whole)))
    for loader in loaders(folder, composition, ranks):
        batches = iter(loader)
        head.append([batch for _, batch in zip(range(stop), batches)])
        states.append(pickle.loads(pickle.dumps(loader.state_dict())))
        del batches
    # the same grid: the rest of each rank's pass, in the uninterrupted order
    for rank, loader in enumerate(loaders(folder, composition, ranks)):
        loader.load_state_dict(states[rank])
        assert flat(head[rank] + list(loader)) == flat(whole[rank]), rank
    # another grid: every item once, or refused
    new_ranks = composition["new_ranks"]
    try:
        state = regrid_state(states)
    except ValueError:
        simple = (composition["elastic"] and composition["ordering"] != "shuffle=True"
                  and set(composition["stages"]) <= {"map", "filter"} and ranks == 1
                  and composition["workers"] == 0)
        assert not simple or set(composition["stages"]) & {"filter"}, composition
        return
    rest = [list(loader) for loader in loaders(folder, composition, new_ranks, state)]
    seen = collections.Counter(a for rank in head + rest for batch in rank for item in batch
                               for a in atoms(item))
    expected = collections.Counter(a for rank in whole for batch in rank for item in batch
                                   for a in atoms(item))
    assert seen == expected
