"""fpipe: packed datasets and lazy, parallel, reproducible batch pipelines for ML training.

Everything is a function: transforms map items, stages map streams, and a pipeline is
``toolz.pipe(source, *stages)``. The names here are the everyday ones (building a pipeline,
combining batches, the function combinators, seeded randomness, the readers and writers met
first, dpipe's ``Infinite`` and its names); everything else lives in its package:
:mod:`fpipe.stream`, :mod:`fpipe.dataset`, :mod:`fpipe.formats`, :mod:`fpipe.orderings`,
:mod:`fpipe.remote`, :mod:`fpipe.image`, :mod:`fpipe.torch` (see the architecture page).

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
    files,
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
from fpipe.dataset import (  # noqa: E402
    FileWriter,
    ListReader,
    MsgpackReader,
    ShardedReader,
    ShardedWriter,
)
from fpipe.errors import FormatError, FpipeError, WorkerError  # noqa: E402
from fpipe.formats import ParquetReader, TFRecordReader, WebDatasetReader  # noqa: E402
from fpipe.functional import (  # noqa: E402
    apply_at,
    compose,
    identity,
    multiply,
    random_apply,
    sample_args,
    unpack_args,
    zip_apply,
)
from fpipe.infinite import Infinite, Iterator, Loky, Threads  # noqa: E402
from fpipe.orderings import IndexShuffler, Shuffler  # noqa: E402
from fpipe.random import current_rng, item_rng, using_rng  # noqa: E402
from fpipe.sharding import shard  # noqa: E402
from fpipe.stream import (  # noqa: E402
    ExpirationPool,
    ParallelOptions,
    Stage,
    Stream,
    as_stream,
    batch,
    batch_by_tokens,
    bucket_by_length,
    combine_batches,
    combine_dicts,
    combine_pad,
    combine_to_arrays,
    expiration_pool,
    explain,
    load_by_random_id,
    mix,
    pack,
    pad_batch_equal,
    prefetch,
    processes,
    sample,
    stats,
    take,
    threads,
    transform_stream,
    unbatch,
)

# The everyday names: dpipe's names are all here, datadings' are in fpipe.storage and fpipe.torch.
__all__ = [
    "ExpirationPool", "FileWriter", "FormatError", "FpipeError", "IndexShuffler", "Infinite",
    "Iterator", "ListReader", "Loky", "MsgpackReader", "ParallelOptions", "ParquetReader", "ShardedReader",
    "ShardedWriter", "Shuffler", "Stage", "Stream", "TFRecordReader", "Threads",
    "WebDatasetReader", "WorkerError", "__version__", "apply_at", "as_stream", "batch",
    "batch_by_tokens", "bucket_by_length", "combine_batches", "combine_dicts", "combine_pad",
    "combine_to_arrays", "compose", "current_rng", "expiration_pool", "explain", "identity",
    "item_rng", "load_by_random_id", "mix", "multiply", "pack", "pad_batch_equal", "prefetch",
    "processes", "random_apply", "sample", "sample_args", "shard", "stats", "take", "threads",
    "transform_stream", "unbatch", "unpack_args", "using_rng", "zip_apply",
]
