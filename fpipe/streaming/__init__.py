"""The streaming half of layer 2: streams, the stages that make them, and where their time goes.

One module per job: the stream core (:class:`Stream`, :class:`Stage`, the meter), the
simple stages (``simple``), the background stages (``parallel``, whose runs are the private
``_background``; joblib is touched only by its private ``_joblib`` module), ``metrics``
(:func:`stats`), ``batching`` (batches and combiners), ``packing`` (token budgets, length
buckets and sequence packing), ``expiration`` (the expiration pool), ``sources`` (seeded
infinite sources) and ``planner`` (which stages fuse, and :func:`explain`; the tuner is
``_tuner``).
Every public name is re-exported here and by :mod:`fpipe`.

>>> from toolz import pipe
>>> from fpipe.streaming import batch, map
>>> list(pipe(range(5), map(abs), batch(2)))
[[0, 1], [2, 3], [4]]
"""

from . import batching, expiration, metrics, packing, parallel, planner, simple, sources
from ._core import Stage, Stream, as_stream
from .batching import *
from .expiration import *
from .metrics import *
from .packing import *
from .parallel import *
from .planner import *
from .simple import *
from .sources import *

# Each module that adds public names is imported above and listed here (the core's by name).
_PUBLIC_MODULES = (batching, expiration, metrics, packing, parallel, planner, simple, sources)

__all__ = sorted({"Stage", "Stream", "as_stream",  # noqa: PLE0605
                  *(name for module in _PUBLIC_MODULES for name in module.__all__)})
