"""A packed dataset's files: what they are called (:class:`DatasetFiles`, the ``SUFFIX_*``
names), how they are opened (regular files only), and the ``.md5`` file that lists their
checksums. The modules that build and read the index files stand on these;
:mod:`fpipe.dataset.format` re-exports them with the rest of the format.

>>> files = DatasetFiles("data/train.msgpack")
>>> md5_line("d41d8cd98f00b204e9800998ecf8427e", files.data.name)
'd41d8cd98f00b204e9800998ecf8427e  train.msgpack\\n'
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Union

import msgpack

from fpipe.errors import FormatError

__all__ = ["DECODE_ERRORS", "DatasetFiles", "PathLike", "SUFFIX_CLASSES", "SUFFIX_FILTER",
           "SUFFIX_KEYS", "SUFFIX_KEY_HASHES", "SUFFIX_KEY_INDEX", "SUFFIX_LEGACY_INDEX",
           "SUFFIX_MD5", "SUFFIX_OFFSETS", "md5_line", "open_regular", "read_md5", "read_regular"]

PathLike = Union[str, "os.PathLike[str]"]

#: Exceptions that msgpack and the numpy decoder raise on bytes that are not a valid sample
#: (numpy parses a dtype string such as ``"(3,"`` as a Python literal: SyntaxError).
DECODE_ERRORS = (ValueError, TypeError, msgpack.UnpackException, OverflowError, IndexError,
                 SyntaxError)

#: What the index files' names add to the data file's (datadings's ``datadings.index`` names).
SUFFIX_OFFSETS = ".offsets"
SUFFIX_KEYS = ".keys"
SUFFIX_KEY_HASHES = ".key_hashes"
SUFFIX_FILTER = ".filter"
SUFFIX_LEGACY_INDEX = ".index"
#: fpipe's own index file (datadings has no name for it, and ignores it).
SUFFIX_KEY_INDEX = ".key_index"
SUFFIX_MD5 = ".md5"
SUFFIX_CLASSES = ".classes.json"


@dataclass(frozen=True)
class DatasetFiles:
    """The paths of one dataset's files, named after its data file.

    >>> files = DatasetFiles("train.msgpack")
    >>> files.offsets.name, files.md5.name
    ('train.msgpack.offsets', 'train.msgpack.md5')
    >>> print(*(path.name[13:] for path in files.index_files))
    .offsets .keys .key_hashes .filter .key_index
    """

    data: Path

    def __init__(self, data: PathLike) -> None:
        object.__setattr__(self, "data", Path(data))

    def _sibling(self, suffix: str) -> Path:
        return self.data.with_name(self.data.name + suffix)

    @property
    def offsets(self) -> Path:
        """``n + 1`` big-endian uint64 byte offsets of the samples."""
        return self._sibling(SUFFIX_OFFSETS)

    @property
    def keys(self) -> Path:
        """One msgpack array of the ``n`` keys."""
        return self._sibling(SUFFIX_KEYS)

    @property
    def key_hashes(self) -> Path:
        """An 8-byte salt followed by ``n`` big-endian uint64 key hashes."""
        return self._sibling(SUFFIX_KEY_HASHES)

    @property
    def filter(self) -> Path:
        """A Bloom filter of the keys in the simplebloom format."""
        return self._sibling(SUFFIX_FILTER)

    @property
    def key_index(self) -> Path:
        """fpipe's key index: key hashes sorted, with their samples' indices, and where each
        key is in ``.keys`` (see ``fpipe.dataset.keyindex``)."""
        return self._sibling(SUFFIX_KEY_INDEX)

    @property
    def md5(self) -> Path:
        """``md5sum -c`` compatible checksums of the data and index files."""
        return self._sibling(SUFFIX_MD5)

    @property
    def legacy_index(self) -> Path:
        """The pre-3.1 datadings index: one msgpack map from key to offset (read only)."""
        return self._sibling(SUFFIX_LEGACY_INDEX)

    @property
    def index_files(self) -> tuple[Path, ...]:
        """The index files, in the order the ``.md5`` file lists them: datadings's four, then
        fpipe's key index."""
        return self.offsets, self.keys, self.key_hashes, self.filter, self.key_index

    @property
    def classes(self) -> Path:
        """The class names of label fields, as JSON (written by ``fpipe write`` and the
        well-known dataset writers; see :func:`read_classes`)."""
        return self._sibling(SUFFIX_CLASSES)

    @property
    def all_files(self) -> tuple[Path, ...]:
        """Every file a writer creates: data, index files and ``.md5``."""
        return self.data, *self.index_files, self.md5

    @property
    def members(self) -> tuple[Path, ...]:
        """Every file of the dataset, the data file first: the files a writer creates, the
        legacy ``.index`` and ``.classes.json``. Commands that replace, copy or move a dataset
        touch these and no other file, whatever its name begins with.

        >>> print(*(path.name for path in DatasetFiles("a").members[6:]))
        a.md5 a.index a.classes.json
        """
        return (*self.all_files, self.legacy_index, self.classes)


# --- opening them -----------------------------------------------------------------------------

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: PathLike) -> BinaryIO:
    """``path`` opened for reading in binary mode, if it is a regular file (symlinks followed).

    Anything else raises :class:`~fpipe.errors.FormatError` at once: a FIFO would block the
    open or the read forever, a device such as ``/dev/zero`` never ends. The file is opened
    without blocking and checked on the open descriptor, so it cannot change in between.

    >>> open_regular("/dev/zero")
    Traceback (most recent call last):
    ...
    fpipe.errors.FormatError: /dev/zero: not a regular file but a device
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            raise FormatError(f"not a regular file but {kind}", path=path)
        return open(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: PathLike) -> bytes:
    """The bytes of ``path``, a regular file (see :func:`open_regular`).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as file:
    ...     read_regular(file.name)
    b''
    """
    with open_regular(path) as file:
        return file.read()


# --- the .md5 file ----------------------------------------------------------------------------

def read_md5(path: PathLike) -> dict[str, str]:
    """The checksums of a dataset's ``.md5`` file, as ``{file name: md5 hex}``.

    Entries are named after the dataset's files as they are called now: a dataset copied or
    renamed file by file (``toy.msgpack*`` to ``train.msgpack*``) keeps the checksums that
    name its old files.

    >>> import tempfile, os
    >>> toy = DatasetFiles(os.path.join(tempfile.mkdtemp(), "toy.msgpack"))
    >>> _ = toy.md5.write_text(md5_line("d41d8cd98f00b204e9800998ecf8427e", "toy.msgpack")
    ...                        + md5_line("7dea362b3fac8e00956a4952a3d4f474", "toy.msgpack.offsets"))
    >>> _ = toy.md5.rename(toy.md5.with_name("train.msgpack.md5"))
    >>> read_md5(toy.data.with_name("train.msgpack"))["train.msgpack"]
    'd41d8cd98f00b204e9800998ecf8427e'
    """
    files = DatasetFiles(path)
    data = read_regular(files.md5)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FormatError(f"corrupt md5 file ({error})", path=files.md5) from error
    entries = {}
    for line in text.split("\n"):  # names may hold other line breaks (\v, \x85) as they are
        # md5sum writes "<hex>  <name>" (text mode) or "<hex> *<name>" (binary mode), and
        # "\\<hex>  <name>" with a name that has a backslash or a line break escaped.
        escaped = line.startswith("\\")
        digest, _, rest = line[escaped:].partition(" ")
        if rest[:1] in (" ", "*") and rest[1:]:
            entries[_unescaped(rest[1:]) if escaped else rest[1:]] = digest
    return _renamed(entries, files.data.name)


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {escape[1]: char for char, escape in _ESCAPES.items()}


def md5_line(digest: str, name: str) -> str:
    """The line of an ``.md5`` file for file ``name``, as ``md5sum`` writes it (so that
    ``md5sum -c`` checks it): a name with a backslash, newline or carriage return has them
    escaped, and the line begins with a backslash.

    >>> md5_line("d41d8cd98f00b204e9800998ecf8427e", "a.msgpack")
    'd41d8cd98f00b204e9800998ecf8427e  a.msgpack\\n'
    >>> md5_line("d41d8cd98f00b204e9800998ecf8427e", "two\\nlines")
    '\\\\d41d8cd98f00b204e9800998ecf8427e  two\\\\nlines\\n'
    """
    escaped = "".join(_ESCAPES.get(char, char) for char in name)
    mark = "\\" if escaped != name else ""
    return f"{mark}{digest}  {escaped}\n"


def _unescaped(name: str) -> str:
    return re.sub(r"\\(.)", lambda found: _UNESCAPES.get(found.group(1), found.group(0)), name)


_SUFFIXES = ("", ".offsets", ".keys", ".key_hashes", ".filter", ".index", ".key_index")


def _renamed(entries: dict[str, str], name: str) -> dict[str, str]:
    """``entries`` with the files of the dataset they were written for named after data file
    ``name``: that dataset's data file is the entry whose index files (offsets, or a legacy
    index, at least) are the others."""
    if name in entries:
        return entries
    for old in entries:
        if ((old + ".offsets" in entries or old + ".index" in entries)
                and all(other[len(old):] in _SUFFIXES and other.startswith(old) for other in entries)):
            return {name + other[len(old):]: digest for other, digest in entries.items()}
    return entries
