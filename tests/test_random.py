"""Examples and error messages of fpipe.random."""

import pickle
import threading

import numpy as np
import pytest

from fpipe.random import (
    active_rng,
    as_generator,
    choice,
    current_rng,
    integers,
    item_rng,
    normal,
    seed_entropy,
    uniform,
    using_rng,
)


def test_seed_entropy_accepts_every_seed_kind():
    assert seed_entropy(np.int64(4)) == 4
    assert seed_entropy(np.random.RandomState(0)) == seed_entropy(np.random.RandomState(0))
    ss = np.random.SeedSequence(9)
    assert seed_entropy(ss) == seed_entropy(np.random.SeedSequence(9))
    assert seed_entropy(None) != seed_entropy(None)


@pytest.mark.parametrize("bad", [1.5, "3", True, [1]])
def test_seed_entropy_rejects_other_types(bad):
    with pytest.raises(TypeError, match="seed must be an int, Generator, SeedSequence or RandomState"):
        seed_entropy(bad)


def test_as_generator_with_none_is_fresh():
    assert as_generator(None).integers(2**62) != as_generator(None).integers(2**62)


def test_item_rng_is_independent_of_order_of_creation():
    forward = [item_rng(5, 0, i).random() for i in range(10)]
    backward = [item_rng(5, 0, i).random() for i in reversed(range(10))][::-1]
    assert forward == backward
    assert len(set(forward)) == 10


def test_active_rng_is_per_thread_and_restored():
    seen = []
    with using_rng(np.random.default_rng(0)) as rng:
        thread = threading.Thread(target=lambda: seen.append(active_rng()))
        thread.start()
        thread.join()
        assert active_rng() is rng
    assert seen == [None] and active_rng() is None


def test_current_rng_falls_back_to_an_unseeded_process_generator():
    assert current_rng() is current_rng()
    with using_rng(np.random.default_rng(0)) as rng:
        assert current_rng() is rng


def test_samplers_check_arguments_and_pickle():
    with pytest.raises(ValueError, match="low must not exceed high"):
        uniform(2, 1)
    with pytest.raises(ValueError, match="scale must be non-negative"):
        normal(0, -1)
    with pytest.raises(ValueError, match=r"the range \[low, high\) must not be empty"):
        integers(3, 3)
    with pytest.raises(ValueError, match="options must not be empty"):
        choice([])
    with pytest.raises(ValueError, match="p must have one probability per option"):
        choice("ab", p=[1.0])
    sampler = choice(["x", "y"], p=[0.25, 0.75])
    clone = pickle.loads(pickle.dumps(sampler))
    assert clone == sampler
    assert clone(item_rng(0, 0, 1)) == sampler(item_rng(0, 0, 1))
    assert repr(sampler) == "choice(('x', 'y'), (0.25, 0.75))"


def test_samplers_draw_from_their_support():
    rng = np.random.default_rng(0)
    assert all(1 <= uniform(1, 2)(rng) < 2 for _ in range(100))
    assert {integers(3)(rng) for _ in range(200)} == {0, 1, 2}
    assert isinstance(choice(["a"])(rng), str)
