"""Packed datasets: the datadings-compatible format, writers and readers.

>>> import os, tempfile
>>> from fpipe.storage import FileWriter, MsgpackReader
>>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
>>> with FileWriter(path) as writer:
...     writer.write({"key": "a", "label": 0})
>>> MsgpackReader(path)[0]
{'key': 'a', 'label': 0}
"""

from . import (
    base,
    class_lists,
    format,
    order,
    parquet,
    permutation,
    reader,
    recovery,
    sharded,
    shuffling,
    tfrecord,
    unpacked,
    webdataset,
    writer,
)
from .base import *
from .class_lists import *
from .format import *
from .order import *
from .parquet import *
from .permutation import *
from .reader import *
from .recovery import *
from .sharded import *
from .shuffling import *
from .tfrecord import *
from .unpacked import *
from .webdataset import *
from .writer import *

__all__ = sorted({*base.__all__, *class_lists.__all__, *format.__all__,  # noqa: PLE0605
                  *order.__all__, *parquet.__all__, *permutation.__all__, *reader.__all__,
                  *recovery.__all__, *sharded.__all__, *shuffling.__all__, *tfrecord.__all__,
                  *unpacked.__all__, *webdataset.__all__, *writer.__all__})
