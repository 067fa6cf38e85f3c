"""What the subcommands share: argument types, progress bars, summaries, opening datasets."""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack

from fpipe.dataset import MsgpackReader, legacy_index_batches, read_classes
from fpipe.dataset._indexing import array_length
from fpipe.dataset._staging import missing_data_reason
from fpipe.dataset.format import SUFFIX_CLASSES
from fpipe.errors import FormatError, FpipeError, redacted_url
from fpipe.files import DatasetFiles, open_regular
from fpipe.formats._foreign import pending_export

__all__ = [
    "HelpFormatter",
    "UsageError",
    "add_command",
    "add_output_options",
    "buffer_size",
    "chosen_seed",
    "copy_classes",
    "data_file",
    "dataset_key_batches",
    "key_batches",
    "fraction",
    "human_bytes",
    "int_between",
    "load_classes",
    "non_negative_int",
    "not_a_dataset",
    "open_dataset",
    "positive_int",
    "positive_number",
    "progress_bar",
    "refuse_options",
    "say",
    "shows_progress",
    "workers",
]

CLASSES_SUFFIX = SUFFIX_CLASSES  # the class list beside a dataset, as messages name it
_NAMED = 5  # datasets named in the message about a folder


class UsageError(FpipeError, ValueError):
    """A mistake in the command line found after parsing (exit status 2)."""


class HelpFormatter(argparse.HelpFormatter):
    """Wrap the description and epilog paragraph by paragraph; keep indented lines (lists,
    examples) as they are written.

    >>> print(HelpFormatter("fpipe")._fill_text("one\\ntwo\\n\\n  fpipe x", 80, ""))
    one two
    <BLANKLINE>
      fpipe x
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        paragraph: list[str] = []
        for line in [*text.splitlines(), ""]:
            if line and not line[0].isspace():
                paragraph.append(line)
                continue
            if paragraph:
                lines.extend(textwrap.wrap(" ".join(paragraph), width, initial_indent=indent,
                                           subsequent_indent=indent))
                paragraph = []
            lines.append(indent + line if line else "")
        return "\n".join(lines[:-1])


def add_command(commands: argparse._SubParsersAction, name: str, summary: str, description: str,
                examples: str, run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """Register subcommand ``name``; ``examples`` (indented command lines) end its help."""
    parser = commands.add_parser(
        name, help=summary, description=description, epilog="examples:\n" + examples,
        formatter_class=HelpFormatter)
    parser.set_defaults(run=run)
    return parser


def add_output_options(parser: argparse.ArgumentParser, overwrite: bool = True) -> None:
    """``-y/--overwrite`` (if the command writes datasets) and ``-q/--quiet``."""
    if overwrite:
        parser.add_argument("-y", "--overwrite", action="store_true",
                            help="replace output datasets that already exist")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar and no summary")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {value}")
    return value


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high`` (for counts that start threads or
    processes, or sizes that allocate: a typo of a few digits must not hang or exhaust memory).

    >>> int_between(1, 256)("300")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be between 1 and 256; got 300
    """
    def checked(text: str) -> int:
        value = _int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}; got {value}")
        return value
    checked.__name__ = f"integer from {low} to {high}"
    return checked


#: The most threads or processes a command starts for one ``--workers`` option.
workers = int_between(1, 256)


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    value = _number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1; got {text}")
    return value


def positive_number(text: str) -> float:
    """An argparse type: a finite number > 0.

    >>> positive_number("inf")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a finite number > 0; got 'inf'
    """
    value = _number(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text!r}")
    return value


def buffer_size(text: str) -> float | int:
    """An argparse type: a fraction of the dataset below 1, or a whole number of samples.

    >>> buffer_size("0.05"), buffer_size("64"), buffer_size("1e3")
    (0.05, 64, 1000)
    >>> buffer_size("2.5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a fraction below 1 or a whole number of samples; got '2.5'
    """
    value = positive_number(text)
    if value < 1:
        return value
    if value != int(value):
        raise argparse.ArgumentTypeError("must be a fraction below 1 or a whole number of "
                                         f"samples; got {text!r}")
    return int(value)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None


def refuse_options(options: Mapping[str, Any], reason: str) -> None:
    """Raise :class:`UsageError` naming each of ``options`` (option name -> parsed value) that
    was given (its value is not None, False or empty), since it has no effect ``reason``: an
    option that would be silently ignored is a mistake worth one line.

    >>> refuse_options({"--seed": None}, "without --shuffle")
    >>> refuse_options({"--seed": 3, "--buf-size": None}, "without --shuffle")
    Traceback (most recent call last):
    ...
    fpipe.cli._common.UsageError: --seed has no effect without --shuffle
    """
    given = [name for name, value in options.items()
             if not (value is None or value is False or value in ([], ()))]
    if given:
        verb = "has" if len(given) == 1 else "have"
        raise UsageError(f"{', '.join(given)} {verb} no effect {reason}")


def chosen_seed(args: argparse.Namespace) -> int:
    """``args.seed``, or 0 when the option was not given (its default is None, so that
    :func:`refuse_options` can tell a seed given where nothing is drawn)."""
    return 0 if args.seed is None else args.seed


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be a number; got {text!r}")
    return value


def shows_progress(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars: not ``--quiet``, and stderr is a terminal."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


def progress_bar(args: argparse.Namespace, iterable: Iterable | None = None, **options: Any) -> Any:
    """A tqdm bar on stderr, disabled unless :func:`shows_progress`."""
    from tqdm import tqdm

    return tqdm(iterable, disable=not shows_progress(args), leave=False, dynamic_ncols=True,
                mininterval=0.2, **options)


def say(args: argparse.Namespace, text: str) -> None:
    """Print a summary line on stdout, unless ``--quiet``; a URL in it shows no credentials."""
    if not getattr(args, "quiet", False):
        print(redacted_url(text), flush=True)


def human_bytes(size: float) -> str:
    """``1536`` -> ``'1.5 KiB'``.

    >>> human_bytes(1536), human_bytes(12), human_bytes(3 * 2 ** 30)
    ('1.5 KiB', '12 B', '3.0 GiB')
    """
    if size < 1024:
        return f"{size:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


def open_dataset(path: str | Path) -> Any:
    """A :class:`~fpipe.dataset.MsgpackReader` of ``path`` (or a URL) with a clear error if it
    is missing."""
    if isinstance(path, str) and "://" in path:  # credentials from the environment (fsspec's way)
        return MsgpackReader(path)
    return MsgpackReader(data_file(path))


def data_file(path: str | Path) -> Path:
    """``path``, checked to name a data file: a folder, a missing file or a special file raise
    a clear error (a folder's names the datasets in it).

    >>> import tempfile
    >>> data_file(tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    fpipe.cli._common.UsageError: ... is a folder, not a dataset (it holds no X.msgpack)
    """
    path = Path(path)
    pending = pending_export(path)
    if pending is not None:
        raise FpipeError(f"{path}: {pending}")
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.msgpack"))
        more = f" and {len(found) - _NAMED} more" if len(found) > _NAMED else ""
        held = f"it holds {', '.join(found[:_NAMED])}{more}" if found else "it holds no X.msgpack"
        raise UsageError(f"{path} is a folder, not a dataset ({held})")
    if not path.exists():
        raise FileNotFoundError(f"{path}: {missing_data_reason(path)}")
    if not path.is_file():
        raise UsageError(f"{path} is not a regular file, so not a dataset")
    reason = not_a_dataset(path)
    if reason is not None:
        raise UsageError(f"{path} is not an fpipe dataset: {reason}")
    return path


def not_a_dataset(path: Path) -> str | None:
    """Why the file ``path`` is no fpipe dataset at all, or None when it may be one (damaged,
    perhaps, or without its index: ``fpipe index`` is for those). Only a file with none of a
    dataset's other files beside it, that no sample starts, and that is text or a format fpipe
    knows by its first bytes (an image, an archive, Parquet, ...) is no dataset.

    >>> import tempfile
    >>> notes = Path(tempfile.mkdtemp()) / "notes.txt"
    >>> _ = notes.write_text("buy milk\\n")
    >>> not_a_dataset(notes)
    "it is a text file (it begins 'buy milk\\\\n'); a dataset's data file holds msgpack samples"
    >>> _ = notes.write_bytes(msgpack.packb({"key": "a"}))
    >>> not_a_dataset(notes) is None
    True
    """
    files = DatasetFiles(path)
    if any(os.path.lexists(side) for side in (files.offsets, files.legacy_index, files.keys,
                                              files.md5)):
        return None
    with open_regular(path) as file:
        head = file.read(_HEAD_BYTES)
    if not head or _starts_with_sample(head):
        return None
    kind = _foreign_kind(head)
    return None if kind is None else f"it is {kind}; a dataset's data file holds msgpack samples"


def _starts_with_sample(head: bytes) -> bool:
    """Whether ``head``, a file's first bytes, begins with a sample: a msgpack map with a str
    ``"key"`` (or the start of a map longer than ``head``)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(head))
    unpacker.feed(head)
    try:
        first = unpacker.unpack()
    except msgpack.OutOfData:
        return head[0] in _MAP_HEADERS
    except (ValueError, TypeError, msgpack.UnpackException):
        return False
    return isinstance(first, dict) and isinstance(first.get("key"), str)


def _foreign_kind(head: bytes) -> str | None:
    """What a file that begins with ``head`` is, when fpipe knows it: text, or a format known
    by its signature."""
    for at, signature, kind in _SIGNATURES:
        if head[at:at + len(signature)] == signature:
            return kind
    try:
        text = head.decode("utf-8") if len(head) < _HEAD_BYTES else \
            head[:-4].decode("utf-8")  # the last character may be cut
    except UnicodeDecodeError:
        return None
    if "\0" in text or not text.strip():
        return None
    return f"a text file (it begins {text[:20]!r})"


_HEAD_BYTES = 1 << 16  # what not_a_dataset reads of a file
_MAP_HEADERS = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))  # msgpack: fixmap, map 16, map 32
_SIGNATURES = ((0, b"\xff\xd8\xff", "a JPEG image"), (0, b"\x89PNG\r\n\x1a\n", "a PNG image"),
               (0, b"GIF8", "a GIF image"), (0, b"PAR1", "a Parquet file"),
               (0, b"ARROW1", "an Arrow file"), (0, b"PK\x03\x04", "a zip archive"),
               (0, b"\x1f\x8b", "a gzip file"), (257, b"ustar", "a tar archive"),
               (0, b"%PDF", "a PDF document"), (0, b"RIFF", "a RIFF file (WebP, WAV, AVI)"))


def load_classes(path: str | Path) -> dict | None:
    """The checked ``.classes.json`` beside dataset ``path``, or None when there is none
    (:func:`fpipe.dataset.read_classes`)."""
    return read_classes(path)


def copy_classes(source: Path, targets: Sequence[Path]) -> None:
    """Copy the class names stored beside ``source``, if any, beside each staged target."""
    if load_classes(source) is None:
        return
    for target in targets:
        shutil.copyfile(str(source) + CLASSES_SUFFIX, str(target) + CLASSES_SUFFIX)


def key_batches(keys_file: Path, size: int = 1 << 16) -> Iterator[tuple[int, list[str]]]:
    """The keys in ``keys_file`` (a dataset's ``.keys``), in order, as ``(index of the first,
    keys)`` batches of ``size``, read as they go so that no pass holds them all. A file that
    is not one msgpack array of str, or ends before its last key, raises FormatError naming it.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "x.msgpack.keys"
    >>> _ = path.write_bytes(msgpack.packb(["a", "b", "c"]))
    >>> list(key_batches(path, 2))
    [(0, ['a', 'b']), (2, ['c'])]
    """
    done = count = 0
    with open_regular(keys_file) as file:
        unpacker = msgpack.Unpacker(file, raw=False, read_size=1 << 20)
        try:
            count = unpacker.read_array_header()
            while batch := list(itertools.islice(unpacker, min(size, count - done))):
                if not all(type(key) is str for key in batch):
                    raise ValueError("a key is not a str")
                yield done, batch
                done += len(batch)
        except (msgpack.OutOfData, ValueError, TypeError, msgpack.UnpackException) as error:
            raise FormatError(f"corrupt keys file ({error})", path=keys_file) from error
    if done != count:
        raise FormatError(f"the keys file ends after {done} of its {count} keys", path=keys_file)


def dataset_key_batches(reader: Any, size: int = 1 << 16) -> Iterator[tuple[int, list[str]]]:
    """:func:`key_batches` of the dataset that ``reader`` (a MsgpackReader) reads (a legacy
    dataset's come from its ``.index``, a batch at a time as well); a keys file that does not
    hold one key per sample raises FormatError naming it."""
    keys_file = DatasetFiles(reader.path).keys
    if not keys_file.exists():
        first = 0
        for keys, _ in legacy_index_batches(reader.path, size):
            yield first, keys
            first += len(keys)
        return
    count = array_length(keys_file)
    if count != len(reader):
        raise FormatError(f"the keys file holds {count} keys for {len(reader)} samples",
                          path=keys_file)
    yield from key_batches(keys_file, size)

