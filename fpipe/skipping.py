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

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Union

from .errors import FpipeError, check_choice, check_integer

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

    __slots__ = ("count", "records", "max_errors")

    def __init__(self, max_errors: int | None = None) -> None:
        self.count, self.records, self.max_errors = 0, [], max_errors

    def keep(self, outputs: list, mark: int) -> None:
        """Take the :class:`Skipped` records out of ``outputs[mark:]`` and log them; raise
        :class:`TooManyErrors` once more than ``max_errors`` items are skipped."""
        tail = outputs[mark:]
        skipped = [x for x in tail if type(x) is Skipped]
        if not skipped:
            return
        outputs[mark:] = [x for x in tail if type(x) is not Skipped]
        for record in skipped:  # one by one: the same error whatever the chunks
            self.count += 1
            if len(self.records) < _KEPT_RECORDS:
                self.records.append(record)
            if self.max_errors is not None and self.count > self.max_errors:
                raise TooManyErrors(f"{self.count} items failed, more than "
                                    f"max_errors={self.max_errors}; the last: "
                                    f"{record.where()}: {record.error}")
