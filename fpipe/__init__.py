"""fpipe: packed datasets and lazy, parallel, reproducible batch pipelines for ML training.

Everything is a function: transforms map items, stages map streams, and a pipeline is
``toolz.pipe(source, *stages)``. The public names of every module are re-exported here.

>>> import fpipe
>>> fpipe.unpack_args(max)([3, 1, 2])
3
"""

from . import batching, errors, functional, infinite, random, sharding, sources, stages, storage
from . import pool as _pool  # the stage fpipe.pool takes the module's name
from ._version import __version__
from .batching import *
from .errors import *
from .functional import *
from .infinite import *
from .pool import *
from .random import *
from .sharding import *
from .sources import *
from .stages import *
from .storage import *
from .streaming import packing
from .streaming.packing import *

# Each module that adds public names is imported above and listed here.
_PUBLIC_MODULES = (batching, errors, functional, infinite, packing, _pool, random, sharding, sources,
                   stages, storage)

__all__ = sorted({"__version__", *(name for module in _PUBLIC_MODULES for name in module.__all__)})
