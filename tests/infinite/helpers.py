"""Module-level functions for the Infinite tests, so that they pickle to worker processes."""

import threading
import time

import numpy as np


def slow_identity(x, seconds=0.05):
    time.sleep(seconds)
    return x


def timed_sleep(x, seconds=0.05):
    """``x`` with when this call started and ended (the system-wide monotonic clock, which
    worker processes share)."""
    start = time.monotonic()
    time.sleep(seconds)
    return x, start, time.monotonic()


def square(x):
    return x * x


def fail_at(x, bad=5):
    if (x[0] if isinstance(x, tuple) else x) == bad:
        raise KeyError(f"bad item {x}")
    return x


def fail_on_batch(items):
    raise ZeroDivisionError(f"cannot combine {len(items)} items")


def noisy(x):
    """x with a draw from the item's generator (seeded stages) or fresh entropy."""
    from fpipe import current_rng

    return x, float(current_rng().random())


def pairs(items):
    items = iter(items)
    return zip(items, items)


def evens(items):
    for item in items:
        if item % 2 == 0:
            yield item


def random_shape(i):
    rng = np.random.default_rng(i)
    return np.ones((2, int(rng.integers(1, 6)))) * i, i


def fpipe_threads():
    """The threads fpipe started and has not joined (joblib's own are not counted)."""
    return [t for t in threading.enumerate() if t.name.startswith("fpipe-") and t.is_alive()]


def wait_until(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()
