"""The packed dataset: fpipe's datadings-compatible format, its writers and readers.

A dataset is one file of msgpack samples back to back (``X.msgpack``) beside its index files
(``.offsets``, ``.keys``, ``.key_index``, ``.md5`` ...: :mod:`fpipe.files` names them). Here
are the format itself (``format``: packing samples and numpy arrays, reading and writing the
index files), the key index (``keyindex``), the writers (``writer``, and ``sharded`` for
datasets of many shards), the readers (``reader`` for packed files, ``unpacked`` for
folders, lists and zip files, both on the ``Reader`` protocol of ``base``), block shuffling
of a reader (``shuffling``), class lists, and rebuilding a damaged index (``recovery``).
Every public name is re-exported here.

>>> import os, tempfile
>>> from fpipe.dataset import FileWriter, MsgpackReader
>>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
>>> with FileWriter(path) as writer:
...     writer.write({"key": "a", "label": 0})
>>> MsgpackReader(path)[0]
{'key': 'a', 'label': 0}
"""

from fpipe.dataset import (
    base,
    class_lists,
    format,
    reader,
    recovery,
    sharded,
    shuffling,
    unpacked,
    writer,
)
from fpipe.dataset.base import *
from fpipe.dataset.class_lists import *
from fpipe.dataset.format import *
from fpipe.dataset.reader import *
from fpipe.dataset.recovery import *
from fpipe.dataset.sharded import *
from fpipe.dataset.shuffling import *
from fpipe.dataset.unpacked import *
from fpipe.dataset.writer import *

_PUBLIC_MODULES = (base, class_lists, format, reader, recovery, sharded, shuffling, unpacked, writer)

__all__ = sorted({name for module in _PUBLIC_MODULES for name in module.__all__})  # noqa: PLE0605
