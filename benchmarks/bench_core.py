"""Workloads of the functional core."""

from __future__ import annotations

import fpipe

from .harness import Pair, workload

CALLS = 1_000_000


def _inc(x: int) -> int:
    return x + 1


def _double(x: int) -> int:
    return x * 2


def _dec(x: int) -> int:
    return x - 3


def _nested(x: int) -> int:
    return _dec(_double(_inc(x)))


def _call_many(func) -> None:
    for i in range(CALLS):
        func(i)


@workload("C1", description="call compose(inc, double, dec) one million times",
          reference="the hand-written nested call dec(double(inc(x)))", target="<= 1.5",
          kind="time")
def compose_calls() -> Pair:
    composed = fpipe.compose(_inc, _double, _dec)
    assert composed(5) == _nested(5)
    return Pair(fpipe=lambda: _call_many(composed), reference=lambda: _call_many(_nested),
                items=CALLS)
