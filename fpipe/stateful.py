"""The one protocol of everything in fpipe that can save its place: ``state_dict()`` gives a
plain dict, and ``load_state_dict(state)`` makes a fresh object, built the same way, carry on
from there exactly, or raises (a ``TypeError`` or ``ValueError`` that names what differs) and
changes nothing.

It is the protocol of ``torch.distributed.checkpoint`` and of torchdata's
``StatefulDataLoader``, which asks every dataset and every dataset iterator that has it for its
state with each batch. fpipe's readers' orderings, sources, the streams that stages return,
:class:`fpipe.Infinite` and the torch adapters keep it; a stream whose place cannot be named
(work under way in threads or processes, a generator of yours) raises ``TypeError`` from
``state_dict()`` rather than give a state that would not resume exactly.

>>> from toolz import pipe
>>> import fpipe
>>> stream = pipe(range(10), fpipe.stream.filter(lambda x: x % 3), fpipe.batch(2))
>>> isinstance(stream, Stateful), next(stream)
(True, [1, 2])
>>> again = pipe(range(10), fpipe.stream.filter(lambda x: x % 3), fpipe.batch(2))
>>> again.load_state_dict(stream.state_dict())
>>> list(again) == list(stream) == [[4, 5], [7, 8]]
True
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Stateful", "is_stateful"]


@runtime_checkable
class Stateful(Protocol):
    """What can save its place: ``state_dict()`` and ``load_state_dict(state)``.

    >>> class Counter:
    ...     def __init__(self):
    ...         self.count = 0
    ...     def state_dict(self):
    ...         return {"count": self.count}
    ...     def load_state_dict(self, state):
    ...         self.count = state["count"]
    >>> counter, again = Counter(), Counter()
    >>> counter.count = 3
    >>> again.load_state_dict(counter.state_dict())
    >>> isinstance(again, Stateful), again.count
    (True, 3)
    """

    def state_dict(self) -> dict[str, Any]:
        """Where this object stands, as a plain dict (ints, strings, lists, dicts; the items a
        stream holds, where it holds any)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Carry on from ``state``, a :meth:`state_dict` of an object built the same way."""


def is_stateful(value: Any) -> bool:
    """Whether ``value`` has callable ``state_dict`` and ``load_state_dict``.

    >>> class Counter:
    ...     def state_dict(self):
    ...         return {"count": 0}
    ...     def load_state_dict(self, state):
    ...         pass
    >>> is_stateful(iter([1])), is_stateful(Counter()), isinstance(Counter(), Stateful)
    (False, True, True)
    """
    return callable(getattr(value, "state_dict", None)) and \
        callable(getattr(value, "load_state_dict", None))
