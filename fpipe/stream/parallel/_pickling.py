"""How items and results cross to and from the worker processes of a process stage, pickled
by fpipe: a task's items (:class:`ShippedItems`), and a chunk's results, with the item
whose result does not pickle named (:func:`pickled_results`). A run's function travels as
:class:`~fpipe.stream.parallel._joblib.ShippedCall`, beside joblib's executor that it needs.
"""

from __future__ import annotations

import pickle
from typing import Any

from fpipe.errors import CapturedError, capture
from fpipe.stream.parallel._shm import Transport, encode

__all__: list[str] = []  # private: the process stage is its user


class ShippedItems:
    """A task's items as they travel to a worker: pickled by fpipe, not by loky. loky's
    pickler memory-maps each numpy array of more than 1 MiB into a file under ``/dev/shm``,
    which joblib removes only when a ``Parallel`` call ends; a stage makes no such call, so
    each large item stayed in memory until the interpreter exited (400 items of 4 MiB kept
    1.6 GB there, and loky warned of "leaked" files at exit)."""

    __slots__ = ("items",)

    def __init__(self, items: list) -> None:
        self.items = items

    def __reduce__(self):
        # the arrays' bytes go beside the pickle, as buffers that loky's pickler copies into
        # its stream once (not into these bytes first), and that the arrays then view
        buffers: list[pickle.PickleBuffer] = []
        return _loaded, (dumps(self.items, buffers), buffers)


def _loaded(pickled: bytes, buffers: list) -> list:
    return pickle.loads(pickled, buffers=buffers)


def pickled_results(outputs: list, error: CapturedError | None, index: int,
                    transport: Transport | None) -> tuple[bytes, CapturedError | None, str | None]:
    """``outputs`` pickled (their large arrays in shared memory, with ``transport``), the
    error, and why shared memory was not used. An output that does not pickle ends them: the
    outputs before it are sent, with a ``TypeError`` that names its item."""
    try:
        sent, reason = _encoded(outputs, transport)
        return sent, error, reason
    except Exception as failure:  # whatever pickling raises
        bad = next((i for i, output in enumerate(outputs) if not _pickles(output)), 0)
        sent, reason = _encoded(outputs[:bad], transport)
        return sent, _unpicklable(outputs[bad], index + bad, failure), reason


def _encoded(outputs: list, transport: Transport | None) -> tuple[bytes, str | None]:
    return (dumps(outputs), None) if transport is None else encode(transport, outputs, dumps)


def dumps(value: Any, buffers: list[pickle.PickleBuffer] | None = None) -> bytes:
    """``value`` pickled, as loky would (cloudpickle, where plain pickle cannot); with
    ``buffers``, its arrays' bytes are appended there instead (pickle's protocol 5)."""
    callback = None if buffers is None else buffers.append
    try:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL, buffer_callback=callback)
    except Exception:  # a lambda, a class made at run time...
        import cloudpickle

        if buffers is not None:
            buffers.clear()  # those of the failed attempt
        return cloudpickle.dumps(value, pickle.HIGHEST_PROTOCOL, buffer_callback=callback)


def _pickles(value: Any) -> bool:
    try:
        dumps(value)
    except Exception:
        return False
    return True


def _unpicklable(output: Any, item: int, failure: Exception) -> CapturedError:
    try:
        raise TypeError(f"processes(): the result for item {item} (of type "
                        f"{type(output).__name__}) does not pickle, so it cannot leave the "
                        f"worker process: {failure}") from failure
    except TypeError as error:
        return capture(error)
