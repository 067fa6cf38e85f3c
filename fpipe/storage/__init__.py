"""Packed datasets: the datadings-compatible format, writers and readers.

>>> import os, tempfile
>>> from fpipe.storage import FileWriter, MsgpackReader
>>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
>>> with FileWriter(path) as writer:
...     writer.write({"key": "a", "label": 0})
>>> MsgpackReader(path)[0]
{'key': 'a', 'label': 0}
"""

from . import format, order, reader, unpacked, writer
from .format import *
from .order import *
from .reader import *
from .unpacked import *
from .writer import *

__all__ = sorted({*format.__all__, *order.__all__, *reader.__all__, *unpacked.__all__,  # noqa: PLE0605
                  *writer.__all__})
