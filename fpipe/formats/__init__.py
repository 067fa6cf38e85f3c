"""Datasets in other formats, read (and written) as fpipe reads its own: WebDataset tar shards
(``webdataset``), Parquet and Arrow files (``parquet``) and TFRecord files (``tfrecord``).
Each reader offers random access, key lookup and the readers' protocol of
:mod:`fpipe.dataset`, over local files or URLs; what they share (one byte source, the cached
indexes, the staging of exports) is the private ``_foreign``. Every public name is
re-exported here.

>>> import os, tempfile
>>> from fpipe.formats import TFRecordReader, TFRecordWriter
>>> path = os.path.join(tempfile.mkdtemp(), "x.tfrecord")
>>> with TFRecordWriter(path) as writer:
...     writer.write({"label": [3]})
>>> TFRecordReader(path)[0]["label"].tolist()
[3]
"""

from fpipe.formats import parquet, tfrecord, webdataset
from fpipe.formats.parquet import *
from fpipe.formats.tfrecord import *
from fpipe.formats.webdataset import *

_PUBLIC_MODULES = (parquet, tfrecord, webdataset)

__all__ = sorted({name for module in _PUBLIC_MODULES for name in module.__all__})  # noqa: PLE0605
