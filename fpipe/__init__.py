"""fpipe: packed datasets and lazy, parallel, reproducible batch pipelines for ML training.

Everything is a function: transforms map items, stages map streams, and a pipeline is
``toolz.pipe(source, *stages)``. The public names of every module are re-exported here.

>>> import fpipe
>>> fpipe.unpack_args(max)([3, 1, 2])
3
"""

# First, before the imports that take the command a quarter of a second: Ctrl-C while the
# fpipe command starts exits with status 130 (a no-op when fpipe is imported by a program).
from ._startup import guard_command_start as _guard_command_start

_guard_command_start()

from . import (  # noqa: E402
    errors,
    functional,
    image,
    infinite,
    random,
    sharding,
    skipping,
    storage,
    streaming,
)
from ._version import __version__  # noqa: E402
from .errors import *  # noqa: E402
from .functional import *  # noqa: E402
from .infinite import *  # noqa: E402
from .random import *  # noqa: E402
from .sharding import *  # noqa: E402
from .skipping import *  # noqa: E402
from .storage import *  # noqa: E402
from .streaming import *  # noqa: E402

# Each module that adds public names is imported above and listed here.
_PUBLIC_MODULES = (errors, functional, infinite, random, sharding, skipping, storage,
                   streaming)

__all__ = sorted({"__version__", *(name for module in _PUBLIC_MODULES for name in module.__all__)})
