"""Surviving bad samples: what ``on_error=`` and ``max_errors=`` mean on fpipe's stages and
torch adapters.

``on_error`` says what happens when the function of a stage raises an ``Exception`` on an item:

- ``"raise"`` (the default): the exception reaches the consumer and ends the stream;
- ``"skip"``: the item is left out of the output, and counted;
- a callable ``on_error(error, item, index)``: it is called where the function ran (a worker
  thread or process), with the exception, the input item and the item's index in the stream;
  its return value is ignored and the item is skipped and counted, unless it raises: then
  what it raises ends the stream (``raise error`` re-raises the original).

Each skipped item is recorded as a :class:`Skipped` (its index, its ``"key"`` when the item is a
mapping that has one, and the error in one line); :func:`fpipe.stats` reports them per stage.
``max_errors`` (None: no bound) raises :class:`TooManyErrors` once more items than that have
been skipped.

>>> log = SkipLog(max_errors=1)
>>> outputs = [1, Skipped(1, None, "ValueError: bad"), 3]
>>> log.keep(outputs, 0)
>>> outputs, log.count
([1, 3], 1)
>>> log.keep([Skipped(7, "x", "OSError: truncated")], 0)
Traceback (most recent call last):
...
fpipe.skipping.TooManyErrors: 2 items failed, more than max_errors=1; the last: item 7 (key 'x'): ...
"""

from __future__ import annotations

import array
import bisect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, Union

from fpipe.errors import FpipeError, check_choice, check_integer

__all__ = ["OnError", "SkipLog", "Skipped", "TooManyErrors"]

OnError = Union[str, Callable[[Exception, Any, int], Any]]

_KEPT_RECORDS = 1000  # the records a log keeps (the count is always exact)


class TooManyErrors(FpipeError, RuntimeError):
    """More items failed than ``max_errors`` allows."""


class Skipped(NamedTuple):
    """An item that a stage skipped: its ``index`` in the stream, its ``key`` (when the item is
    a mapping with a ``"key"``, else None) and ``error``, the exception in one line.

    >>> Skipped.of(ValueError("bad"), {"key": "a.jpg"}, 3)
    Skipped(index=3, key='a.jpg', error='ValueError: bad')
    """

    index: int
    key: Any
    error: str

    @classmethod
    def of(cls, error: BaseException, item: Any, index: int) -> Skipped:
        """The record of ``item`` (number ``index``), which raised ``error``."""
        key = item.get("key") if isinstance(item, Mapping) else None
        return cls(index, key, f"{type(error).__name__}: {error}")

    def where(self) -> str:
        """``item <index>``, with the key if there is one, for messages."""
        return f"item {self.index}" + ("" if self.key is None else f" (key {self.key!r})")


def check_on_error(on_error: Any) -> OnError:
    """``on_error``, once it is ``"raise"``, ``"skip"`` or a callable; otherwise a ``TypeError``
    or ``ValueError`` that names the argument. Not in ``__all__``: fpipe's stages use it.

    >>> check_on_error("ignore")
    Traceback (most recent call last):
    ...
    ValueError: on_error must be 'raise', 'skip' or a callable; got on_error='ignore'
    """
    if callable(on_error):
        return on_error
    if not isinstance(on_error, str):
        raise TypeError(f"on_error must be 'raise', 'skip' or a callable; got on_error={on_error!r}")
    try:
        return check_choice("on_error", on_error, ("raise", "skip"))
    except ValueError:
        raise ValueError("on_error must be 'raise', 'skip' or a callable; "
                         f"got on_error={on_error!r}") from None


def check_max_errors(max_errors: Any) -> int | None:
    """``max_errors``, once it is None or an integer >= 0. Not in ``__all__``.

    >>> check_max_errors(None), check_max_errors(3)
    (None, 3)
    """
    return None if max_errors is None else check_integer("max_errors", max_errors, 0)


def handle(on_error: OnError, error: Exception, item: Any, index: int) -> Skipped:
    """What a stage makes of ``error``, raised by its function on ``item``: the record of a
    skipped item, once a callable ``on_error`` has been called (and has not raised). Not in
    ``__all__``."""
    if on_error == "raise":
        raise error
    if callable(on_error):
        on_error(error, item, index)
    return Skipped.of(error, item, index)


def read_on(reader: Any, start: int, stop: int, skip: Callable[[Exception, int], Any],
            **options: Any) -> Iterator[tuple[int, Any]]:
    """``(index, sample)`` for samples ``start`` to ``stop`` of ``reader``, read in order with
    ``reader.iter(start, stop, **options)``; a sample that fails to read (a damaged record) is
    passed to ``skip(error, index)``, and the reading goes on after it. Not in ``__all__``:
    the torch adapters use it for ``on_error``.

    >>> class Flaky:
    ...     def iter(self, start, stop):
    ...         for i in range(start, stop):
    ...             if i == 2:
    ...                 raise ValueError("damaged")
    ...             yield i * 10
    >>> list(read_on(Flaky(), 0, 4, lambda error, index: print("skipped", index, error)))
    skipped 2 damaged
    [(0, 0), (1, 10), (3, 30)]
    """
    position = start
    while position < stop:
        try:
            for sample in reader.iter(position, stop, **options):
                yield position, sample
                position += 1
            return
        except Exception as error:
            skip(error, position)
            position += 1


def read_or_each(read: Callable[[list], list], get: Callable[[int], Any], indices: list,
                 skip: Callable[[Exception, int], Any]) -> list:
    """``read(indices)``; if it raises, ``get(i)`` for each of ``indices``, and for one that
    raises, what ``skip(error, i)`` returns. Not in ``__all__``: the torch adapters use it
    for ``on_error``.

    >>> def read(indices):
    ...     raise ValueError("one of them is damaged")
    >>> read_or_each(read, [10, 20].__getitem__, [1, 5, 0], lambda error, index: None)
    [20, None, 10]
    """
    try:
        return read(indices)
    except Exception:
        pass  # a batch that does not read is read sample by sample
    samples = []
    for index in indices:
        try:
            samples.append(get(index))
        except Exception as error:
            samples.append(skip(error, index))
    return samples


class SkipLog:
    """The skipped items of one stream: an exact ``count``, the first 1000 ``records``, and
    the ``max_errors`` bound. A stream with ``on_error`` keeps one as its ``skips``, and
    :func:`fpipe.stats` reads it.

    >>> log = SkipLog()
    >>> outputs = ["a", Skipped(1, None, "KeyError: 'x'")]
    >>> log.keep(outputs, 0)
    >>> outputs, log.count, log.records[0].index
    (['a'], 1, 1)
    """

    __slots__ = ("count", "indices", "max_errors", "records")

    def __init__(self, max_errors: int | None = None) -> None:
        self.count, self.records, self.max_errors = 0, [], max_errors
        self.indices: SkippedIndices | None = None

    def track(self, inputs: int, outputs: int) -> SkippedIndices:
        """Keep the index of every item skipped from now on (the records keep only the first
        1000), to count the inputs behind the outputs: what :class:`fpipe.Infinite` needs to
        resume a stream that skips. ``inputs`` is the index of the stream's next input,
        ``outputs`` the number of outputs made before it (see :class:`SkippedIndices`)."""
        self.indices = SkippedIndices(inputs, outputs)
        return self.indices

    def keep(self, outputs: list, mark: int) -> None:
        """Take the :class:`Skipped` records out of ``outputs[mark:]`` and log them; raise
        :class:`TooManyErrors` once more than ``max_errors`` items are skipped."""
        tail = outputs[mark:]
        skipped = [x for x in tail if type(x) is Skipped]
        if not skipped:
            return
        outputs[mark:] = [x for x in tail if type(x) is not Skipped]
        if self.indices is not None:
            self.indices.add(record.index for record in skipped)
        for record in skipped:  # one by one: the same error whatever the chunks
            self.count += 1
            if len(self.records) < _KEPT_RECORDS:
                self.records.append(record)
            if self.max_errors is not None and self.count > self.max_errors:
                raise TooManyErrors(f"{self.count} items failed, more than "
                                    f"max_errors={self.max_errors}; the last: "
                                    f"{record.where()}: {record.error}")


class SkippedIndices:
    """The indices of the items a stream skipped, in order, and so how many inputs were read to
    make a number of outputs: each output is one input, and each skipped input comes between.

    The count starts from a base, ``inputs`` read for ``outputs`` made (both zero when the
    stream numbers its items from 0); :meth:`settle` moves the base on and forgets the indices
    behind it, so that a long stream keeps only the indices ahead of what was consumed. The
    stream's thread adds indices while another may count: the two take turns. Not in
    ``__all__``: :class:`fpipe.Infinite` uses it.

    >>> skipped = SkippedIndices(inputs=0, outputs=0)
    >>> skipped.add([2, 3, 7])
    >>> skipped.inputs_for(2), skipped.inputs_for(3), skipped.inputs_for(6)
    (2, 5, 9)
    >>> skipped.settle(3)
    >>> skipped.inputs_for(6), len(skipped)
    (9, 1)
    """

    __slots__ = ("_base", "_indices", "_lock")

    def __init__(self, inputs: int, outputs: int) -> None:
        self._base = (inputs, outputs)
        self._indices = array.array("q")
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._indices)

    def add(self, indices: Iterable[int]) -> None:
        """Record skipped inputs, in order, each after those recorded before."""
        with self._lock:
            self._indices.extend(indices)

    def inputs_for(self, outputs: int) -> int:
        """How many inputs (counted as the base counts them) were read to make the first
        ``outputs`` outputs: up to the last of them, the skipped ones after it not included."""
        with self._lock:
            return self._inputs_for(outputs)

    def _inputs_for(self, outputs: int) -> int:
        inputs, made = self._base
        count = inputs + outputs - made
        for index in self._indices:
            if index >= count:
                break
            count += 1  # a skipped input before the count: one more input read
        return count

    def settle(self, outputs: int) -> None:
        """Make the base the inputs behind ``outputs`` outputs, and forget the indices before
        them (counts are never asked again for fewer outputs)."""
        with self._lock:
            inputs = self._inputs_for(outputs)
            del self._indices[:bisect.bisect_left(self._indices, inputs)]
            self._base = (inputs, outputs)
