"""The torch adapters' options as values: :class:`Shards`, :class:`Elastic` and
:class:`Samples` check every field when they are made, with a message that names it; a keyword
of the old API is a ``TypeError`` that says what replaced it, and a misspelled one a
``TypeError`` that names it, both before the dataset has made anything."""

from __future__ import annotations

import dataclasses
import pickle
import re

import numpy as np
import pytest

import fpipe.torch
from fpipe.dataset import ListReader
from fpipe.torch import Dataset, DatasetBase, Elastic, IterableDataset, Samples, Shards


def _reader(n: int = 10) -> ListReader:
    return ListReader([{"x": i} for i in range(n)])


def _nothing_made(*args, **kwargs):
    raise AssertionError("the dataset made its shared state before refusing an option")


@pytest.mark.parametrize(("cls", "fields", "error", "message"), [
    (Shards, {"rank": 1}, ValueError, r"pass rank and world_size together; got rank=1, world_size=None"),
    (Shards, {"world_size": 2}, ValueError, r"pass rank and world_size together; got rank=None"),
    (Shards, {"rank": 2, "world_size": 2}, ValueError, r"rank must be in \[0, world_size\); got rank=2"),
    (Shards, {"rank": -1, "world_size": 2}, ValueError, r"rank must be in \[0, world_size\); got rank=-1"),
    (Shards, {"rank": 0, "world_size": 0}, ValueError, "world_size must be >= 1; got world_size=0"),
    (Shards, {"rank": 0.5, "world_size": 2}, TypeError, "rank must be an integer; got rank=0.5"),
    (Shards, {"rank": 0, "world_size": "2"}, TypeError, "world_size must be an integer; got world_size='2'"),
    (Shards, {"even": "trim"}, ValueError, "even must be None, 'drop' or 'pad'; got even='trim'"),
    (Shards, {"shuffle": "yes"}, TypeError, "shuffle must be True or False; got shuffle='yes'"),
    (Shards, {"buffer_samples": 1.5}, ValueError,
     "buffer_samples must be a fraction in .*; got buffer_samples=1.5"),
    (Shards, {"buffer_samples": 0}, ValueError, "got buffer_samples=0"),
    (Shards, {"buffer_samples": "big"}, TypeError,
     "buffer_samples must be a number; got buffer_samples='big'"),
    (Elastic, {"rank": 3}, ValueError, "pass rank and world_size together; got rank=3"),
    (Elastic, {"rank": 3, "world_size": 3}, ValueError, r"rank must be in \[0, world_size\); got rank=3"),
    (Elastic, {"even": "half"}, ValueError, "even must be None, 'drop' or 'pad'; got even='half'"),
    (Samples, {"seed": -2}, ValueError, "seed must be a non-negative integer; got seed=-2"),
    (Samples, {"seed": "abc"}, TypeError,
     "seed must be an int, Generator, SeedSequence or RandomState; got seed='abc'"),
    (Samples, {"seed": True}, TypeError, "got seed=True"),
    (Samples, {"n_threads": 0}, ValueError, "n_threads must be >= 1; got n_threads=0"),
    (Samples, {"n_threads": "many"}, ValueError,
     "n_threads must be an integer or 'auto'; got n_threads='many'"),
    (Samples, {"n_threads": 1.5}, TypeError, "n_threads must be an integer; got n_threads=1.5"),
    (Samples, {"on_error": "ignore"}, ValueError,
     "on_error must be 'raise', 'skip' or a callable; got on_error='ignore'"),
    (Samples, {"on_error": 1}, TypeError, "got on_error=1"),
    (Samples, {"max_errors": -1}, ValueError, "max_errors must be >= 0; got max_errors=-1"),
    (Samples, {"max_errors": "3"}, TypeError, "max_errors must be an integer; got max_errors='3'"),
])
def test_every_bad_field_is_refused_when_the_option_is_made_naming_it(cls, fields, error, message):
    with pytest.raises(error, match=message):
        cls(**fields)


@pytest.mark.parametrize(("keyword", "value", "replacement"), [
    ("seed", 0, "samples=Samples(seed=...)"),
    ("on_error", "skip", "samples=Samples(on_error=...)"),
    ("max_errors", 3, "samples=Samples(max_errors=...)"),
    ("threads", 2, "samples=Samples(n_threads=...)"),
    ("shuffle", True, "layout=Shards(shuffle=True)"),
    ("buf_size", 4, "layout=Shards(shuffle=True, buffer_samples=...)"),
    ("even", "drop", "layout=Shards(even=...) (or Elastic(even=...))"),
    ("rank", 0, "layout=Shards(rank=..., world_size=...) (or Elastic(...))"),
    ("world_size", 1, "layout=Shards(rank=..., world_size=...) (or Elastic(...))"),
    ("elastic", True, "layout=Elastic(...)"),
])
def test_a_keyword_of_the_old_api_says_what_replaced_it(keyword, value, replacement, monkeypatch):
    monkeypatch.setattr(fpipe.torch, "EpochClock", _nothing_made)
    monkeypatch.setattr(fpipe.torch, "SkipBoard", _nothing_made)
    expected = f"got an unexpected keyword argument '{keyword}': it became {replacement}"
    with pytest.raises(TypeError, match=rf"^IterableDataset {re.escape(expected)}$"):
        IterableDataset(_reader(), batch_size=2, **{keyword: value})
    if keyword in ("seed", "on_error", "max_errors", "threads"):
        for cls in (Dataset, DatasetBase):
            with pytest.raises(TypeError, match=rf"^{cls.__name__} got an unexpected keyword "
                                                rf"argument '{keyword}': it became samples="):
                cls(_reader(), **{keyword: value})


def test_a_misspelled_keyword_is_named_with_the_options_there_are():
    with pytest.raises(TypeError, match="^IterableDataset got an unexpected keyword argument "
                                        "'layuot'; its options are layout, samples$"):
        IterableDataset(_reader(), layuot=Shards())
    with pytest.raises(TypeError, match="^Dataset got an unexpected keyword argument 'sample'; "
                                        "its options are epoch, samples$"):
        Dataset(_reader(), sample=Samples())
    with pytest.raises(TypeError, match="unexpected keyword argument 'shufle'"):
        Shards(shufle=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_thread'"):
        Samples(n_thread=2)


@pytest.mark.parametrize("field", ["shuffle", "buffer_samples"])
def test_an_elastic_layout_has_no_shuffle_and_says_where_to_shuffle(field):
    with pytest.raises(TypeError, match=rf"^Elastic got an unexpected keyword argument '{field}': "
                                        r"an elastic epoch has one order; shuffle it with an "
                                        r"ordering \(IterableDataset\(IndexShuffler"):
        Elastic(**{field: True})
    with pytest.raises(TypeError, match="^Elastic got an unexpected keyword argument 'rnak'$"):
        Elastic(rnak=1)


def test_the_modes_that_need_more_are_refused_by_the_dataset(monkeypatch):
    monkeypatch.setattr(fpipe.torch, "EpochClock", _nothing_made)
    with pytest.raises(ValueError, match=r"layout=Elastic\(\) needs batch_size"):
        IterableDataset(_reader(), layout=Elastic())
    with pytest.raises(ValueError, match=r"Samples\(n_threads=...\) is for IterableDataset; "
                                         "got n_threads=2"):
        Dataset(_reader(), samples=Samples(n_threads=2))
    with pytest.raises(TypeError, match=r"samples must be Samples\(...\); got samples=Shards\(\)"):
        IterableDataset(_reader(), samples=Shards())
    with pytest.raises(TypeError, match=r"layout must be Shards\(...\) or Elastic\(...\); "
                                        r"got layout=Samples\(seed=1\)"):
        IterableDataset(_reader(), layout=Samples(seed=1))


def test_options_are_values():
    layout = Shards(rank=1, world_size=2, shuffle=True)
    assert layout == Shards(rank=1, world_size=2, shuffle=True)
    assert len({layout, Shards(1, 2, None, True)}) == 1
    assert pickle.loads(pickle.dumps(layout)) == layout
    assert pickle.loads(pickle.dumps(Elastic(rank=0, world_size=3))) == Elastic(rank=0, world_size=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.rank = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        Elastic().even = "pad"
    assert repr(Samples(seed=3, on_error="skip")) == "Samples(seed=3, on_error='skip')"
    assert repr(Elastic(even="pad")) == "Elastic(even='pad')" and repr(Shards()) == "Shards()"
    # one value serves many datasets: the ranks of a run
    ranks = [IterableDataset(_reader(), layout=dataclasses.replace(layout, rank=r)) for r in range(2)]
    assert sorted(s["x"] for rank in ranks for s in rank) == list(range(10))


def test_the_defaults_are_the_plain_layout_and_samples():
    plain = IterableDataset(_reader(), layout=Shards(), samples=Samples())
    assert [s["x"] for s in plain] == [s["x"] for s in IterableDataset(_reader())] == list(range(10))
    assert plain.layout == Shards() and plain.samples == Samples()


def test_a_generator_seed_is_drawn_from_by_the_dataset_once_as_before():
    samples = Samples(seed=np.random.default_rng(5))
    shuffled = IterableDataset(_reader(), layout=Shards(shuffle=True), samples=samples)
    expected = np.random.default_rng(5).integers(2 ** 63)
    assert shuffled.seed == expected


def test_ported_datadings_code_runs_with_its_positional_arguments():
    # datadings's IterableDataset(reader, transforms, rng, batch_size, epoch, copy, chunk_size, group)
    dataset = IterableDataset(_reader(), None, None, 2, 0, True, 4, None)
    assert [s["x"] for s in dataset] == list(range(10))
