"""fpipe: packed datasets and lazy, parallel, reproducible batch pipelines for ML training.

Everything is a function: transforms map items, stages map streams, and a pipeline is
``toolz.pipe(source, *stages)``. The public names of every module are re-exported here.

>>> import fpipe
>>> fpipe.unpack_args(max)([3, 1, 2])
3
"""

from . import errors, functional, image, infinite, random, sharding, skipping, storage, streaming
from ._version import __version__
from .errors import *
from .functional import *
from .infinite import *
from .random import *
from .sharding import *
from .skipping import *
from .storage import *
from .streaming import *

# Each module that adds public names is imported above and listed here.
_PUBLIC_MODULES = (errors, functional, infinite, random, sharding, skipping, storage,
                   streaming)

__all__ = sorted({"__version__", *(name for module in _PUBLIC_MODULES for name in module.__all__)})
