"""Module-level functions for the streaming tests, so that they pickle to worker processes."""

import os
import threading
import time

import numpy as np

from fpipe import random_apply, sample_args
from fpipe.random import uniform


def double(x):
    return 2 * x


def slow_double(x, seconds=0.002):
    time.sleep(seconds)
    return 2 * x


def logged_sleep(x, log, seconds=0.05):
    """Sleep, then note ``x`` in the file ``log``: what ran, seen from the consumer."""
    time.sleep(seconds)
    with open(log, "a") as file:
        file.write(f"{x}\n")
    return x


def fail_at(x, bad=7):
    if x == bad:
        raise KeyError(f"bad item {x}")
    return x


def pid(_):
    return os.getpid()


class Tally:
    """Counts its own calls: (the worker's pid, how many calls this copy has had so far)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, _):
        self.calls += 1
        return os.getpid(), self.calls


class TallyWithTable(Tally):
    """A Tally that holds a 2 MB array: (pid, calls so far, whether the array is memory-mapped)."""

    def __init__(self):
        super().__init__()
        self.table = np.zeros(1 << 18)

    def __call__(self, item):
        return (*super().__call__(item), getattr(self.table, "filename", None) is not None)


def exit_worker(x):
    os._exit(3)


def jitter(x):
    # finish out of order: later items are quicker
    time.sleep(0.002 * (x % 3 == 0))
    return x


def with_noise(x, noise):
    return x, noise


def negate(x):
    return -x


# seeded transforms: they draw from the item's generator when one is active
noisy = sample_args(with_noise, noise=uniform(0.0, 1.0))
maybe_negate = random_apply(0.5, negate)


def fpipe_threads():
    return [t for t in threading.enumerate() if t.name.startswith("fpipe-")
            and t.name != "fpipe-joblib"]


def lock_at(x, bad=20):
    """``x``, except a lock (which does not pickle) at item ``bad``."""
    return threading.Lock() if x == bad else x


def doubled_here(x):
    """``(2 * x, pid)``: the result, and which process made it."""
    return 2 * x, os.getpid()


def stage_in_a_child(results, n_workers):
    """In a child process: the output of two process stages over range(20), the warnings they
    gave, and this process's pid, put on ``results``."""
    import warnings

    from fpipe import processes

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = [list(processes(doubled_here, n_workers=n_workers)(range(20))) for _ in range(2)]
    results.put((outputs, [str(warning.message) for warning in caught], os.getpid()))


def announced_sleep(x, seconds, flag):
    """Create the file ``flag`` (a worker has started), then sleep ``seconds``."""
    open(flag, "a").close()
    time.sleep(seconds)
    return x


def large(i, nbytes):
    """An array of ``nbytes`` bytes, all ``i``."""
    return np.full(nbytes, i % 256, np.uint8)
