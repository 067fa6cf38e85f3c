"""datadings' reader and writer names, where code ported from datadings imports them.

Code written for datadings runs on fpipe with its imports changed from ``datadings.reader``,
``datadings.reader.sharded`` and ``datadings.writer`` to ``fpipe.storage``. The names are
fpipe's own objects: the readers and writers of :mod:`fpipe.dataset` and the orderings of
:mod:`fpipe.orderings`; new code imports them from there.

>>> import os, tempfile
>>> from fpipe.storage import FileWriter, MsgpackReader
>>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
>>> with FileWriter(path) as writer:
...     writer.write({"key": "a", "label": 0})
>>> MsgpackReader(path)[0]
{'key': 'a', 'label': 0}
"""

from fpipe.dataset.base import Reader
from fpipe.dataset.reader import MsgpackReader
from fpipe.dataset.sharded import ShardedReader
from fpipe.dataset.unpacked import DirectoryReader, ListReader, ZipFileReader
from fpipe.dataset.writer import FileWriter, RawWriter, Writer
from fpipe.orderings.order import Cycler, QuasiShuffler, Range, Repeater, Shuffler

__all__ = ["Cycler", "DirectoryReader", "FileWriter", "ListReader", "MsgpackReader",
           "QuasiShuffler", "Range", "RawWriter", "Reader", "Repeater", "ShardedReader",
           "Shuffler", "Writer", "ZipFileReader"]
