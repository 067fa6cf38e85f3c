"""The stream core: :class:`Stream`, :class:`Stage`, and the stream kinds that the stage
modules build on (:func:`as_stream`, :func:`generator_stream`, :func:`mapped_stream`). What a
stream measures for :func:`fpipe.stats` is kept by its meter (``fpipe.stream._meter``).

A *stage* is built from its configuration and then applied to an iterable, so a pipeline is
``toolz.pipe(source, *stages)``. Applying a stage returns a :class:`Stream`: a lazy iterator
that starts nothing before its first ``next()``, closes its upstream when it is closed (also on
leaving a ``with`` block), and measures where its time goes (:func:`fpipe.stats`).

>>> from toolz import pipe
>>> from fpipe.stream import filter, map
>>> from fpipe import take
>>> with pipe(range(10), map(lambda x: x * x), filter(lambda x: x % 2), take(3)) as stream:
...     list(stream)
[1, 9, 25]

Streams hand items to each other in chunks (:meth:`Stream.pull`), so a chain of cheap stages
costs about as much as a plain loop, and a hop to a thread or a process is paid once per chunk,
not once per item. This module is the only one that reads a stream's private attributes; the
others write streams against the contract in :class:`Stream`'s docstring.

**Epochs.** The *epoch* of an application is the number of times the stage object was applied
before (0, 1, 2, ...), unless :meth:`Stage.set_epoch` set it. A seeded stage draws differently
in each epoch and identically in the same epoch of another run. :meth:`Stage.apply` takes the
epoch (and the index of the first item) explicitly, to resume a stream.
"""

from __future__ import annotations

import abc
import collections
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fpipe.errors import CapturedError, check_bool, check_integer, check_state, close_after, state_header
from fpipe.stateful import is_stateful
from fpipe.stream._meter import Meter

__all__ = ["Stage", "Stream", "as_stream"]

_READ_AHEAD = 64  # most items next() reads ahead of the consumer ...
READ_SECONDS = 1e-4  # ... and only while they take less than this to make (batch too)
_GENERATOR_SLICE = 1e-3  # a generator stage returns what it has after this long
JOIN_SECONDS = 2.0  # close() waits this long for a stage's threads (or its joblib generator)


# --- streams ----------------------------------------------------------------------------


class Stream(abc.ABC):
    """A lazy stream of items: what a stage returns, and what the next stage reads.

    It is an iterator (``next()``, ``for``) and a context manager that closes it. Stages read
    each other with :meth:`pull`, a chunk at a time. ``waits`` tells whether a pull may wait:
    for other threads (a background stage upstream), or for the consumer itself (a source that
    is not a plain container, such as a generator, may wait for what the consumer does with the
    items it has). So a pull never holds an item back to wait for the next one: once it has
    one, it reads on only where that cannot wait. ``next()`` reads ahead so, and only while
    items are cheap: at most 64 items, as many as take about 0.1 ms to make. Several threads
    may read one stream: they take turns, and each item goes to one of them.

    >>> stream = as_stream(range(5))
    >>> next(stream), stream.pull(3), list(stream)
    (0, [1, 2, 3], [4])

    **Writing a stream.** A subclass calls ``super().__init__(upstream, name)`` (``upstream``
    is a stream or None) and implements:

    - ``_pull(n)``: make the next items, at least one and at most ``n``; ``[]`` at the end.
      An exception raised there closes the stream and reaches the consumer. Once it has an
      output, it returns rather than read an upstream that ``waits`` again.
    - ``_pull_full(n)``, if it stops early so: the same for a caller that needs all ``n``
      (``pull(n, full=True)``); the default is ``_pull(n)``.
    - ``_close()``, if it holds anything: release it. It runs once, from :meth:`close`; the
      default closes the upstream.
    - :meth:`start`, if it works in the background: start that work now.
    - :meth:`shares`, if its time splits otherwise than between its own work and its upstream.

    It may call, besides the public methods:

    - :meth:`pull_upstream` to read its upstream a chunk at a time (timed for
      :func:`fpipe.stats`; ``full=True`` when it needs the whole chunk), or
      ``next(self.upstream)`` to read it item by item;
    - :meth:`defer_error` in an ``except`` block, so that the items made before an error are
      delivered and the error is raised at the next pull;
    - :meth:`reads` for each stream it reads besides its upstream;
    - :attr:`closed`, :attr:`read_ahead` and :meth:`discard_read_ahead`.

    The other underscore attributes of this class are its own: a subclass neither reads nor
    sets them.

    >>> class Doubled(Stream):
    ...     def _pull(self, n):
    ...         return [2 * x for x in self.pull_upstream(n)]
    >>> list(Doubled(as_stream([1, 2, 3]), "doubled"))
    [2, 4, 6]
    """

    # whether a pull may wait: for other threads, or for the consumer (see the docstring)
    waits = False
    skips = None  # the SkipLog of a stage with on_error: the items it left out
    # whether the source keeps its place (an fpipe dataset's pass): then next() reads no item
    # ahead, so that the chain's state holds no items it read ahead, and moves to another grid
    keeps_place = False

    def __init__(self, upstream: Stream | None, name: str) -> None:
        self.upstream, self.name = upstream, name
        self._buffer: list = []  # items next() has read, last one first
        self._read_size = 1
        self._error: BaseException | CapturedError | None = None  # raised at the next pull
        self._closed = False
        self._meter = Meter()
        self._reader: Meter | None = None  # the meter of the stream that reads this one
        self._turn = threading.Lock()  # held by the thread that reads (several may)
        if upstream is not None:
            self.reads(upstream)
            self.keeps_place = upstream.keeps_place

    def pull(self, n: int, *, full: bool = False) -> list:
        """The next items, at least one and at most ``n``; ``[]`` once the stream has ended.
        Once it has an item, it returns rather than wait for more (see :attr:`waits`), unless
        ``full``: then the caller needs all ``n`` (a batch) and the stream may wait for each.
        It may still return fewer: ask again.

        An error raised while making items is raised after the items made before it, at the
        next pull; the stream then closes itself.
        """
        with self._turn:
            return self._pull_in_turn(n, full)

    def _pull_in_turn(self, n: int, full: bool = False) -> list:
        if self._buffer or self._error is not None or self._closed:
            items = self._pull_held(n)
            if items or self._closed:
                return items
        meter = self._meter
        meter.until_timed -= 1
        if not meter.until_timed:
            return self._timed_pull(n, full)
        try:
            items = self._pull_full(n) if full else self._pull(n)
        except BaseException as error:
            self._fail(error)
            raise
        meter.items += len(items)
        return items

    def _timed_pull(self, n: int, full: bool) -> list:
        meter = self._meter
        start = meter.begin(time.perf_counter())
        try:
            items = self._pull_full(n) if full else self._pull(n)
        except BaseException as error:
            self._fail(error)
            raise
        finally:
            meter.timing = False
        meter.end(start, len(items), time.perf_counter())
        return items

    def _fail(self, error: BaseException) -> None:
        """Close the stream that ``error`` ends: an error of the closing is chained to it
        rather than raised in its place. A StopIteration would end the consumer's loop as if
        the stream had ended, so it is raised as a RuntimeError (as PEP 479 does)."""
        close_after(self.close, error)
        if isinstance(error, StopIteration):
            raise RuntimeError(f"{self.name} raised StopIteration") from error

    def _pull_held(self, n: int) -> list:
        if self._buffer:
            items = self._unbuffer(n)
            if items:
                return items
        if self._error is not None:
            self._raise_error()
        return []  # closed, or another reader took the items held

    @abc.abstractmethod
    def _pull(self, n: int) -> list:
        """Make the next items, at least one and at most ``n``; ``[]`` at the end. An error
        raised here closes the stream (see :meth:`pull`)."""

    def _pull_full(self, n: int) -> list:
        """:meth:`_pull` for a caller that needs all ``n`` items (``pull(n, full=True)``): a
        stream that stops early when its upstream may wait reads on here."""
        return self._pull(n)

    def _unbuffer(self, n: int) -> list:
        # one pop at a time: next() pops without taking its turn
        take, items = self._buffer.pop, []
        try:
            for _ in range(n):
                items.append(take())
        except IndexError:
            pass
        return items

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        try:
            if isinstance(error, CapturedError):
                error.reraise()
            raise error
        except BaseException as raised:
            self._fail(raised)
            raise

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Any:
        buffer = self._buffer
        if buffer:
            try:
                return buffer.pop()
            except IndexError:  # another thread took the last one
                pass
        with self._turn:
            return self._next_in_turn()

    def _next_in_turn(self) -> Any:
        buffer = self._buffer
        if buffer:
            try:
                return buffer.pop()  # read by the thread whose turn came first
            except IndexError:
                pass
        start = time.perf_counter()
        items = self._pull_in_turn(self._read_size)
        seconds = time.perf_counter() - start
        reader = self._reader
        if reader is not None and reader.timing:
            reader.waited += seconds
        if not items:
            raise StopIteration
        count = len(items)
        if not self.keeps_place:
            self._read_size = next_chunk_size(count, seconds, READ_SECONDS, _READ_AHEAD)
        if count == 1:  # from a source that may wait, every time
            return items[0]
        items.reverse()
        first = items.pop()
        self._buffer = items
        return first

    def close(self) -> None:
        """Stop this stream's work (threads are joined, process workers stay warm for the next
        run) and close its upstream. Closing twice does nothing. An error in closing (say, of
        the source's ``close()``) is raised here, whatever stage the source is read by."""
        if not self._closed:
            self._closed = True
            self._close()


    def _close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the stream also closes itself at its end)."""
        return self._closed

    def start(self) -> Stream:
        """Start the background work of this stream and of its upstream now, not at the
        first ``next()`` (a stream that works in its consumer's thread has none), and return
        the stream.

        >>> from fpipe import prefetch
        >>> with prefetch(2)(range(3)).start() as stream:
        ...     list(stream)
        [0, 1, 2]
        """
        if self.upstream is not None and not self._closed:
            self.upstream.start()
        return self

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> None:
        if error is None:
            self.close()
        else:
            close_after(self.close, error)  # never hide the error of the block

    def __repr__(self) -> str:
        return f"<{self.name} stream>"

    # --- the consumer's place (the Stateful protocol, fpipe.stateful) ---

    def state_dict(self) -> dict:
        """Where the consumer of this stream stands: for each stream of the chain, from this
        one up to its source, what it has taken and what it holds, at the items this stream has
        delivered (the items ``next()`` read ahead are held, not delivered). A plain dict, with
        the items that streams hold in it (a partial batch, a packer's open rows), and the
        state of the source's iterator where it has one (an fpipe dataset's pass), else the
        count of the items taken from it.

        :meth:`load_state_dict` gives it to the same chain built anew, before its first item:
        that chain delivers what this one would have. A stream whose place cannot be named
        (work under way in threads or processes, a generator) raises ``TypeError``.

        >>> from toolz import pipe
        >>> from fpipe import batch
        >>> from fpipe.stream import map
        >>> stream = pipe(range(7), map(lambda x: 10 * x), batch(3))
        >>> next(stream)
        [0, 10, 20]
        >>> again = pipe(range(7), map(lambda x: 10 * x), batch(3))
        >>> again.load_state_dict(stream.state_dict())
        >>> list(again)
        [[30, 40, 50], [60]]
        """
        return {**state_header("Stream"), "stream": self.name, "held": self._buffer[::-1],
                "own": self._own_state(),
                "upstream": None if self.upstream is None else self.upstream.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Carry on from ``state``, a :meth:`state_dict` of the same chain of stages (by name and
        settings), before this stream's first item; anything else raises a ``TypeError`` or
        ``ValueError`` naming the difference, and changes nothing."""
        self.state_loader(state)()

    def state_loader(self, state: Any, name: str = "state") -> Callable[[], None]:
        """Check ``state`` all through, changing nothing, and return the function that loads
        it (so that a chain, or a mix of chains, is checked whole before any part changes)."""
        check_state(state, "Stream", ("held", "own", "upstream"), {"stream": self.name}, name=name)
        if self._meter.started is not None or self._buffer or self._closed:
            raise ValueError(f"load_state_dict() must come before the first item of {self.name}; "
                             "build the pipeline anew and load the state into it")
        held = state["held"]
        if not isinstance(held, list):
            raise TypeError(f"{name}['held'] must be a list of items; got {held!r:.80}")
        own = self._own_loader(state["own"], f"{name}['own']")
        if (self.upstream is None) != (state["upstream"] is None):
            raise ValueError(f"{name}['upstream'] is the state of "
                             f"{'no' if state['upstream'] is None else 'an'} upstream; "
                             f"{self.name} has {'none' if self.upstream is None else 'one'}")
        upstream = None if self.upstream is None else self.upstream.state_loader(
            state["upstream"], f"{name}['upstream']")

        def load() -> None:
            if upstream is not None:
                upstream()
            own()
            self._buffer = held[::-1]
        return load

    def _own_state(self) -> Any:
        """What this stream holds or has counted, for :meth:`state_dict`: stream kinds that
        keep their place say it here; the others refuse."""
        raise self._no_place()

    def _own_loader(self, own: Any, name: str) -> Callable[[], None]:
        """Check ``own`` (of :meth:`_own_state`) and return what restores it; a stream kind
        without a place refuses its state too."""
        raise self._no_place()

    def _no_place(self) -> TypeError:
        return TypeError(f"{self.name} cannot save its place: its items are made in the "
                         "background (threads, processes) or by code fpipe cannot see into; "
                         "keep such stages out of a pipeline whose state you save, or save "
                         "states only at the end of an epoch")

    # --- for the authors of streams (see the class docstring) ---

    def pull_upstream(self, n: int, *, full: bool = False) -> list:
        """``self.upstream.pull(n, full=full)``, timed when this stream's pull is, so that
        :func:`fpipe.stats` can tell this stream's work from its upstream's. (A stream is the
        only reader of its upstream, so it reads without taking turns.)"""
        meter = self._meter
        if not meter.timing:
            return self.upstream._pull_in_turn(n, full)
        start = time.perf_counter()
        try:
            return self.upstream._pull_in_turn(n, full)
        finally:
            meter.waited += time.perf_counter() - start

    def defer_error(self, error: BaseException | CapturedError, items: list) -> bool:
        """Keep ``error`` to raise at the next pull, after ``items`` (the items made before it)
        are delivered, and return True; with no items, return False: then the caller raises
        it at once, with a bare ``raise``, so the traceback gains no frame.

        >>> class Halves(Stream):
        ...     def _pull(self, n):
        ...         items = []
        ...         try:
        ...             items.extend(1 / x for x in self.pull_upstream(n))
        ...         except ZeroDivisionError as error:
        ...             if not self.defer_error(error, items):
        ...                 raise
        ...         return items
        >>> stream = Halves(as_stream([2, 4, 0]), "halves")
        >>> stream.pull(3)
        [0.5, 0.25]
        >>> stream.pull(3)
        Traceback (most recent call last):
        ...
        ZeroDivisionError: division by zero
        """
        if not items:
            return False
        self._error = error
        return True

    def reads(self, source: Stream) -> None:
        """Declare that this stream reads ``source`` (its upstream is declared already): the
        time spent waiting for it counts as waiting in :func:`fpipe.stats`, and this stream
        ``waits`` if ``source`` does."""
        source._reader = self._meter
        if source.waits:
            self.waits = True

    @property
    def read_ahead(self) -> int:
        """How many items ``next()`` has read ahead and not yet delivered."""
        return len(self._buffer)

    def discard_read_ahead(self) -> None:
        """Forget the items ``next()`` has read ahead (to jump to another position)."""
        self._buffer = []

    def measure(self, now: float) -> tuple[int, float]:
        """The items this stream has delivered and the seconds since its first pull, at
        ``time.perf_counter()`` value ``now`` (0.0 before the first pull)."""
        return self._meter.measure(now)

    def shares(self, wall: float) -> tuple[float, float, float]:
        """The shares of ``wall`` seconds that this stream spent working, waiting for its
        input, and waiting for its consumer; estimated from the sampled pulls (see
        ``fpipe.stream._meter``)."""
        return self._meter.shares(wall)


def next_chunk_size(items: int, seconds: float, target: float, cap: int) -> int:
    """How many items to ask for next: about ``target`` seconds' worth, at most ``cap`` and at
    most twice the last chunk, so that a slow start stays small."""
    ideal = target * items / seconds if seconds > 0 else cap
    return max(1, min(cap, 2 * items, int(ideal)))


_PLAIN = frozenset({itertools.count, itertools.repeat})
_PLAIN |= frozenset(type(iter(plain)) for plain in (
    [], (), range(0), range(2 ** 64), "", "\u00e9", b"", bytearray(), {}, {}.values(),
    {}.items(), set(), collections.deque(), reversed([]), reversed(range(0)), reversed({})))


def reads_ahead_freely(iterable: Iterable) -> bool:
    """Whether reading ``iterable`` ahead of its consumer cannot wait for the consumer: it has
    a length (a list, an array, a dataset, an ordering: its items are there already), or it is
    an iterator of a built-in container, ``itertools.count`` or ``repeat``, or ``zip`` or
    ``enumerate`` over such. A generator, or any other iterator, may wait for what the consumer
    does with the items it has (a feedback loop). Not in ``__all__``.

    >>> reads_ahead_freely(range(3)), reads_ahead_freely(zip(range(3), iter("abc")))
    (True, True)
    >>> reads_ahead_freely(x for x in range(3))
    False
    """
    kind = type(iterable)
    if kind in _PLAIN or hasattr(iterable, "__len__"):
        return True
    if kind is zip or kind is enumerate:  # their parts, as pickling lists them
        parts = iterable.__reduce__()[1]
        return all(reads_ahead_freely(part) for part in parts if not isinstance(part, int))
    return False


class _Source(Stream):
    """Any iterable as a stream; ``iter()`` is called at the first pull. It ``waits`` unless
    told otherwise or :func:`reads_ahead_freely` says it cannot wait for its consumer."""

    def __init__(self, iterable: Iterable, waits: bool) -> None:
        super().__init__(None, f"source({type(iterable).__name__})")
        self._iterable, self._iterator = iterable, None
        self.waits = waits
        self._given = 0  # items given by the iterator
        self.keeps_place = getattr(iterable, "keeps_place", False) is True

    def _pull(self, n: int) -> list:
        if not self.waits:
            return self._pull_full(n)
        # one item: the next may wait for what the consumer does with this one
        if self._iterator is None:
            self._iterator = iter(self._iterable)
        try:
            item = next(self._iterator)
        except StopIteration:
            return []
        self._given += 1
        return [item]

    def _pull_full(self, n: int) -> list:
        if self._iterator is None:
            self._iterator = iter(self._iterable)
        items: list = []
        try:
            items.extend(itertools.islice(self._iterator, n))
        except BaseException as error:
            if not self.defer_error(error, items):
                raise
        finally:
            self._given += len(items)
        return items

    def _own_state(self) -> dict:
        # an iterator that keeps its own place (an fpipe dataset's pass) says it; any other
        # source is taken again from its start, up to the items taken
        iterator = self._iterator
        saved = iterator.state_dict() if iterator is not None and is_stateful(iterator) else None
        return {"taken": self._given, "iterator": saved}

    def _own_loader(self, own: Any, name: str) -> Callable[[], None]:
        if not isinstance(own, dict) or set(own) != {"taken", "iterator"}:
            raise TypeError(f"{name} must be the dict of a source's state, with 'taken' and "
                            f"'iterator'; got {own!r:.120}")
        taken, saved = check_integer(f"{name}['taken']", own["taken"], 0), own["iterator"]

        def load() -> None:
            iterator = iter(self._iterable)
            if saved is not None:
                if not is_stateful(iterator):
                    raise TypeError(f"{name}['iterator'] is the state of an iterator that keeps "
                                    f"its place, but iter() of this source gives "
                                    f"{type(iterator).__name__}, which does not")
                iterator.load_state_dict(saved)
            elif taken:
                skipped = sum(1 for _ in itertools.islice(iterator, taken))
                if skipped < taken:
                    raise ValueError(f"the source ended after {skipped} items, before the "
                                     f"{taken} that the state had taken")
            self._iterator, self._given = iterator, taken
        return load

    def _close(self) -> None:
        # an iterator that was never started is closed too, so that it cannot start later
        close = getattr(self._iterable if self._iterator is None else self._iterator, "close", None)
        if close is not None:
            close()


def as_stream(iterable: Iterable, *, waits: bool | None = None) -> Stream:
    """``iterable`` as a :class:`Stream` (a stream is returned as it is).

    ``waits`` says whether reading the iterable may wait for the consumer of the pipeline (a
    feedback loop: a generator that yields what the consumer's last step made). Such a
    source is read one item at a time whenever a stage does not need more (``next()``, a
    background stage's feeder), so that no item it gave is held back while the next one is
    read. By default, anything with a length, the iterators of built-in containers,
    ``itertools.count`` and ``repeat`` (and ``zip`` or ``enumerate`` of those) are read ahead
    freely, and other iterables (generators, iterators) are taken to wait. ``waits=False``
    reads a generator that never waits for its consumer ahead in chunks again, which is
    faster when its items are cheap.

    >>> as_stream([1, 2]).pull(5)
    [1, 2]
    >>> as_stream(x for x in [1, 2]).pull(5), as_stream((x for x in [1, 2]), waits=False).pull(5)
    ([1], [1, 2])
    """
    if isinstance(iterable, Stream):
        return iterable
    if waits is None:
        waits = not reads_ahead_freely(iterable)
    return _Source(iterable, check_bool("waits", waits))


# --- stages -----------------------------------------------------------------------------


class Stage(abc.ABC):
    """A function from an iterable to a :class:`Stream`, configured at construction.

    Each call is an application with its own epoch: the first call is epoch 0, the next epoch 1,
    and so on; :meth:`set_epoch` sets the epoch of the next call.

    ``one_to_one`` (false unless a stage class sets it) says that the stage gives exactly one
    output per input, in input order, and numbers the items from ``start``, apart from the
    inputs it leaves out with ``on_error``, which its stream's ``skips`` log records: then
    :class:`fpipe.Infinite` resumes a pipeline by skipping inputs instead of replaying outputs.

    >>> from fpipe.stream import map
    >>> stage = map(abs)
    >>> stage.epoch, list(stage([1, -2])), stage.epoch, stage.one_to_one
    (0, [1, 2], 1, True)
    """

    _epoch = 0
    one_to_one = False

    def __call__(self, iterable: Iterable) -> Stream:
        epoch, self._epoch = self._epoch, self._epoch + 1
        return self.apply(iterable, epoch=epoch)

    @property
    def epoch(self) -> int:
        """The epoch that the next call will use."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next call epoch ``epoch`` (later calls count on from there).

        >>> from fpipe.stream import map
        >>> stage = map(abs)
        >>> stage.set_epoch(5)
        >>> stage.epoch
        5
        """
        self._epoch = check_integer("epoch", epoch, 0)

    @abc.abstractmethod
    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        """Apply the stage as epoch ``epoch``, numbering the items from ``start`` (the index
        from which a seeded stage derives each item's generator); the epoch counter is left
        alone. This is how a stopped stream is resumed.

        >>> from fpipe.stream import map
        >>> list(map(abs).apply([3, -4], epoch=2, start=10))
        [3, 4]
        """

    def close(self) -> None:  # noqa: B027 (a no-op by design: most stages keep nothing)
        """Release what the stage keeps between applications (nothing, unless a stage class
        says otherwise: :func:`fpipe.processes` on a backend other than loky ends its joblib
        generator). The stage can be applied again afterwards."""


# --- the stream kinds that stages build on ----------------------------------------------


class _Mapped(Stream):
    """A per-item stage run over whole chunks: ``into(outputs, chunk, index)``."""

    def __init__(self, upstream: Stream, name: str, into: Callable, start: int) -> None:
        super().__init__(upstream, name)
        self._into, self._index = into, start

    def _pull(self, n: int, full: bool = False) -> list:
        outputs: list = []
        meter = self._meter
        while not outputs:
            chunk = (self.pull_upstream(n, full=full) if meter.timing
                     else self.upstream._pull_in_turn(n, full))
            if not chunk:
                return outputs
            start, self._index = self._index, self._index + len(chunk)
            try:
                self._into(outputs, chunk, start)
            except BaseException as error:
                if not self.defer_error(error, outputs):
                    raise
        return outputs

    def _pull_full(self, n: int) -> list:
        return self._pull(n, True)

    def _own_state(self) -> dict:
        return {"index": self._index}  # a pull hands out all it made: nothing is held

    def _own_loader(self, own: Any, name: str) -> Callable[[], None]:
        index = checked_fields(own, name, ("index",))["index"]

        def load() -> None:
            self._index = index
        return load


def checked_fields(own: Any, name: str, keys: tuple[str, ...]) -> dict:
    """``own``, once it is a dict of exactly ``keys``, each an integer >= 0 (for the
    :meth:`Stream._own_loader` of a stream kind; not in ``__all__``)."""
    if not isinstance(own, dict) or set(own) != set(keys):
        raise TypeError(f"{name} must be a dict of {', '.join(keys)}; got {own!r:.120}")
    return {key: check_integer(f"{name}[{key!r}]", own[key], 0) for key in keys}


def mapped_stream(iterable: Iterable, name: str, into: Callable[[list, list, int], None],
                  start: int = 0) -> Stream:
    """The stream, named ``name``, that runs ``into(outputs, chunk, index)`` on each chunk of
    ``iterable`` in the consumer's thread: ``into`` appends the chunk's results to ``outputs``
    (those made before an error stay there and are delivered), and ``index`` numbers the
    chunk's first item, counting from ``start``. What :func:`fpipe.stream.map` and
    :func:`fpipe.stream.filter` apply; not in ``__all__``.

    >>> def doubled(outputs, chunk, index):
    ...     outputs.extend(2 * x for x in chunk)
    >>> list(mapped_stream([1, 2], "doubled", doubled))
    [2, 4]
    """
    return _Mapped(as_stream(iterable), name, into, start)


class _Generated(Stream):
    """A stage written as a generator over its upstream, which it reads item by item."""

    def __init__(self, upstream: Stream, name: str, start: Callable[[Stream], Iterator]) -> None:
        super().__init__(upstream, name)
        self._start, self._iterator = start, None

    def _pull(self, n: int) -> list:
        # past the first output, the generator could wait on an upstream that waits
        return self._generate(1 if self.upstream.waits else n, _GENERATOR_SLICE)

    def _pull_full(self, n: int) -> list:
        return self._generate(n, float("inf"))

    def _generate(self, n: int, seconds: float) -> list:
        if self._iterator is None:
            self._iterator = self._start(self.upstream)
        items: list = []
        deadline = time.perf_counter() + seconds
        try:
            for item in self._iterator:
                items.append(item)
                if len(items) >= n or time.perf_counter() > deadline:
                    break
        except BaseException as error:
            if not self.defer_error(error, items):
                raise
        return items

    def _close(self) -> None:
        try:
            close = getattr(self._iterator, "close", None)
            if close is not None:
                close()
        finally:
            super()._close()


def generator_stream(iterable: Iterable, name: str, start: Callable[[Stream], Iterator]) -> Stream:
    """The stream, named ``name``, of what the iterator ``start(upstream)`` yields in the
    consumer's thread, where ``upstream`` is ``iterable`` as a stream; closing it closes the
    iterator and the upstream. What :func:`fpipe.transform_stream` applies; not in ``__all__``:
    fpipe's other stage modules build their streams with it.

    >>> list(generator_stream("abc", "upper", lambda upstream: (x.upper() for x in upstream)))
    ['A', 'B', 'C']
    """
    return _Generated(as_stream(iterable), name, start)
