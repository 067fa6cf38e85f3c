"""Prepare a packed dataset on many processes or a dask cluster: each partition written
exactly once (an attempt stages its shards, one atomic step commits them), resumable after any
failure, with the same bytes on any number of workers. The partitions are the calls of the
user's generator, the files of the sources ``fpipe write`` takes (or ranges of their
samples), or the partitions of a dask bag or dataframe (``partitions``); ``writer`` writes
and verifies. Every public name is re-exported here.

>>> import os, tempfile
>>> from fpipe.prepare import from_generator, verify_dataset, write_dataset
>>> out = os.path.join(tempfile.mkdtemp(), "squares")
>>> squares = from_generator(lambda n: ({"key": f"{n}-{i}", "y": i * i} for i in range(n)), [2, 3])
>>> write_dataset(squares, out, n_workers=1).samples
5
>>> verify_dataset(out)["partitions"]
2
"""

from fpipe.prepare import partitions, writer
from fpipe.prepare.partitions import *
from fpipe.prepare.writer import *

_PUBLIC_MODULES = (partitions, writer)

__all__ = sorted({name for module in _PUBLIC_MODULES for name in module.__all__})  # noqa: PLE0605
