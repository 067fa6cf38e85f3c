"""Streams and the stages that make them, and where their time goes.

One module per job: the stream core (``core``: :class:`Stream`, :class:`Stage`), the simple
stages (``simple``), batches and combiners (``batching``), token budgets, length buckets and
sequence packing (``packing``), the expiration pool (``expiration``), seeded infinite sources
(``sources``), :func:`stats` (``metrics``), and the background stages with the planner in
:mod:`fpipe.stream.parallel`. Every public name is re-exported here.

>>> from toolz import pipe
>>> from fpipe.stream import batch, map
>>> list(pipe(range(5), map(abs), batch(2)))
[[0, 1], [2, 3], [4]]
"""

from fpipe.stream import batching, core, expiration, metrics, packing, simple, sources
from fpipe.stream.batching import *
from fpipe.stream.core import *
from fpipe.stream.expiration import *
from fpipe.stream.metrics import *
from fpipe.stream.packing import *
from fpipe.stream.parallel import planner, stages
from fpipe.stream.parallel.planner import *
from fpipe.stream.parallel.stages import *
from fpipe.stream.simple import *
from fpipe.stream.sources import *

_PUBLIC_MODULES = (batching, core, expiration, metrics, packing, planner, simple, sources, stages)

__all__ = sorted({name for module in _PUBLIC_MODULES for name in module.__all__})  # noqa: PLE0605
