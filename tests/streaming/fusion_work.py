"""Module-level functions for the planner's tests, so that they pickle to worker processes."""

import os

import numpy as np

from fpipe.random import active_rng


def image(i):
    """An item as an image pipeline makes them: a 64x64 float32 image (16 KiB) and a label;
    seeded stages add a draw to the image."""
    rng = active_rng()
    noise = np.float32(rng.random()) if rng is not None else np.float32(0)
    return np.full((64, 64), i, np.float32) + noise, i


def ragged(i):
    """An item whose array has another length from item 6 on (combine_to_arrays refuses it)."""
    return np.arange(3 if i < 6 else 4), i


def labelled(i):
    """A dict item."""
    return {"x": np.arange(i % 3 + 1), "y": i}


def bad_at(i, bad):
    """``image(i)``, except a KeyError naming the item at item ``bad``."""
    if i == bad:
        raise KeyError(f"bad item {i}")
    return image(i)


def twice(i):
    return 2 * i


def drawn(i):
    """``i`` and a draw from the item's generator (seeded stages make it reproducible)."""
    rng = active_rng()
    return i, None if rng is None else float(rng.random())


def where(i):
    """``i`` and the pid of the process that ran this."""
    return i, os.getpid()


def stacked_here(items):
    """A user's combiner: the items' first fields stacked, and the pid that stacked them."""
    return np.stack([item[0] for item in items]), os.getpid()


def pad_value(array):
    return -1


def noisy_batch(batch):
    """A user's step after the combiner: the batch's images plus a draw of the batch's
    generator (seeded maps make it reproducible), and the pid that ran it."""
    images, labels = batch
    rng = active_rng()
    return images + np.float32(0 if rng is None else rng.random()), labels, os.getpid()


def bad_batch_at(batch, bad):
    """``batch``, except a KeyError naming the batch whose first label is ``bad``."""
    if batch[1][0] == bad:
        raise KeyError(f"bad batch from {bad}")
    return batch
