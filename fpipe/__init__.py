"""fpipe: packed datasets and lazy, parallel, reproducible batch pipelines for ML training.

Everything is a function: transforms map items, stages map streams, and a pipeline is
``toolz.pipe(source, *stages)``. The public names of every module are re-exported here.

>>> import fpipe
>>> fpipe.unpack_args(max)([3, 1, 2])
3
"""

# First, before the imports that take the command a quarter of a second: Ctrl-C while the
# fpipe command starts exits with status 130 (a no-op when fpipe is imported by a program).
from fpipe._startup import guard_command_start as _guard_command_start

_guard_command_start()

from fpipe import (  # noqa: E402
    dataset,
    errors,
    formats,
    functional,
    image,
    infinite,
    orderings,
    random,
    remote,
    sharding,
    skipping,
    storage,
    stream,
)
from fpipe._version import __version__  # noqa: E402
from fpipe.dataset import *  # noqa: E402
from fpipe.errors import *  # noqa: E402
from fpipe.formats import *  # noqa: E402
from fpipe.functional import *  # noqa: E402
from fpipe.infinite import *  # noqa: E402
from fpipe.orderings import *  # noqa: E402
from fpipe.random import *  # noqa: E402
from fpipe.sharding import *  # noqa: E402
from fpipe.skipping import *  # noqa: E402
from fpipe.stream import *  # noqa: E402

# Each module that adds public names is imported above and listed here.
_PUBLIC_MODULES = (dataset, errors, formats, functional, infinite, orderings, random, sharding,
                   skipping, stream)

__all__ = sorted({"__version__", *(name for module in _PUBLIC_MODULES for name in module.__all__)})
