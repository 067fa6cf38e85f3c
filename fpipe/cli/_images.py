"""How the commands tell a damaged image: :func:`image_problem`, the one check of an image
file's bytes, which ``fpipe write`` gives every image file it packs and ``fpipe verify
--images`` every image in a dataset, so that both find the same problems.

It says "empty file" and "not an image" in those words; then comes a cheap look,
:func:`damage`: Pillow must know the format from its header, and JPEG, PNG, WebP and GIF data
must reach the end that their format marks, which is where a cut-off download or copy fails
(other formats, mostly uncompressed, are decoded: BMP, TIFF, PPM). Pillow's ``verify()`` does
not notice a cut-off JPEG, and a full decode costs 15 times the look: for a 93 KiB 500x375
JPEG, reading took 0.03 ms, the look 0.07 ms, a decode 1-2 ms (160 ms for a 12-megapixel
photo). With ``decode`` (``fpipe write --check/--skip-bad``, ``fpipe verify --images``) the
image is then decoded in full by :func:`decode_failure`, fpipe's decoder.

>>> import io
>>> from PIL import Image
>>> buffer = io.BytesIO()
>>> Image.effect_noise((64, 64), 40).convert("RGB").save(buffer, "JPEG")
>>> jpeg = buffer.getvalue()
>>> image_problem(jpeg, decode=True) is None
True
>>> image_problem(jpeg[:-40], decode=False)
'the JPEG data ends before its end-of-image marker (cut off?)'
>>> image_problem(b"", decode=True), image_problem(b"hello", decode=True)
('empty file (0 bytes)', "not an image (its 5 bytes start with b'hello')")
>>> decode_failure(jpeg[:-40]).startswith("cannot decode")
True
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from fpipe.cli._common import progress_bar
from fpipe.cli._inputs import IMAGE_SUFFIXES, file_suffix
from fpipe.errors import FormatError

__all__ = ["checked_suffixes", "damage", "decode_failure", "encoded_image", "image_fields",
           "image_problem", "image_problems"]

_MAX_PROBLEMS = 10  # images that fpipe verify --images names before it stops looking

_JPEG_SCAN, _JPEG_END = 0xDA, b"\xff\xd9"
_JPEG_BARE_MARKERS = frozenset((0x01, *range(0xD0, 0xD8)))  # markers without a length
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: empty, and so a fixed CRC


def _jpeg_complete(data: bytes) -> bool:
    """Whether an end-of-image marker follows the first scan's header. Segments before it
    (an EXIF thumbnail with its own end marker among them) are stepped over by their
    lengths, and entropy-coded data never holds the marker's bytes, so a file cut off after
    the scan began cannot end with them."""
    at = 2
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF or marker in _JPEG_BARE_MARKERS:
            at += 1 if marker == 0xFF else 2
            continue
        after = at + 2 + int.from_bytes(data[at + 2:at + 4], "big")
        if marker == _JPEG_SCAN:  # the end is last, unless data follows (a motion photo's video)
            return after <= len(data) and (data.endswith(_JPEG_END)
                                           or data.find(_JPEG_END, after) >= 0)
        at = after
    return False


def _riff_complete(data: bytes) -> bool:
    return len(data) >= 8 + int.from_bytes(data[4:8], "little")


_FORMAT_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF8", "GIF"),
                 (b"RIFF", "WEBP"))


def encoded_image(value: Any) -> bool:
    """Whether a sample's field holds an encoded JPEG, PNG, GIF or WebP image, by its first
    bytes: the values that ``fpipe bench`` and ``fpipe verify --images`` decode.

    >>> encoded_image(b"\\x89PNG\\r\\n\\x1a\\n..."), encoded_image(b"RIFF....WAVE"), encoded_image(3)
    (True, False, False)
    """
    if not isinstance(value, bytes):
        return False
    kind = next((kind for magic, kind in _FORMAT_MAGIC if value.startswith(magic)), None)
    return kind is not None and (kind != "WEBP" or value[8:12] == b"WEBP")


_ENDS: dict[str, tuple[Callable[[bytes], bool], str]] = {
    "JPEG": (_jpeg_complete, "ends before its end-of-image marker"),
    "PNG": (lambda data: data.endswith(_PNG_END) or data.find(_PNG_END, 8) >= 0,
            "ends before its IEND chunk"),
    "WEBP": (_riff_complete, "is shorter than its RIFF header says"),
    "GIF": (lambda data: data.rstrip(b"\x00").endswith(b";"), "ends without its trailer"),
}


def image_problem(data: bytes | bytearray | memoryview, decode: bool) -> str | None:
    """Why ``data``, the bytes of an image file, is not a whole image, or None: it is empty,
    or :func:`damage` finds it is no image or cut off, or (with ``decode``) fpipe's decoder
    fails on it (:func:`decode_failure`)."""
    if not len(data):
        return "empty file (0 bytes)"
    reason = damage(data)
    if reason is None and decode:
        reason = decode_failure(data)
    return reason


def damage(data: bytes | bytearray | memoryview) -> str | None:
    """Why ``data`` is not a whole image, or None: Pillow does not know it from its header,
    or JPEG, PNG, WebP or GIF data stops before its format's end, or an image of another
    format does not decode."""
    from PIL import Image

    from fpipe.image.decode import undecodable

    view = memoryview(data).cast("B")
    # Pillow tries every format it knows unless told which: twice the time for a JPEG
    formats = next(([kind] for magic, kind in _FORMAT_MAGIC if view[:len(magic)] == magic), None)
    try:
        with Image.open(io.BytesIO(view), formats=formats) as image:
            kind = image.format
            if kind not in _ENDS:
                image.load()
    except Image.DecompressionBombError as error:
        return str(error)
    except (OSError, SyntaxError, ValueError) as error:  # UnidentifiedImageError is an OSError
        return undecodable(view, error).reason
    complete, what = _ENDS.get(kind, (None, ""))
    whole = data if isinstance(data, bytes) else bytes(view)
    return None if complete is None or complete(whole) else f"the {kind} data {what} (cut off?)"


def decode_failure(data: Any) -> str | None:
    """Why ``data`` does not decode as an image (fpipe's decoder, the one the training
    pipelines use), or None when it does."""
    from PIL import Image

    from fpipe.image import ImageDecodeError, decode_image

    try:
        decode_image(data)
    except ImageDecodeError as error:
        return error.reason
    except Image.DecompressionBombError as error:
        return str(error)
    return None


@cache
def checked_suffixes() -> frozenset[str]:
    """The suffixes of image files that Pillow can read here (``.heic`` needs a plugin, say):
    the files that the checks look at."""
    from PIL import Image

    readable = {suffix for suffix, kind in Image.registered_extensions().items()
                if kind in Image.OPEN}
    return frozenset(IMAGE_SUFFIXES & readable)


def image_problems(path: Path, args: argparse.Namespace) -> tuple[list[str], int]:
    """The images (:func:`image_fields`) in the samples of dataset ``path`` that
    :func:`image_problem` finds bad, one line each (at most 10, then where it stopped), and
    how many images were checked. A corrupt sample ends the look quietly: the structure check
    names it."""
    from fpipe.dataset import MsgpackReader

    problems: list[str] = []
    checked = 0
    with MsgpackReader(path) as reader, progress_bar(
            args, total=len(reader), desc=f"checking images of {path.name}", unit=" samples") as bar:
        try:
            for index, sample in enumerate(reader.iter(copy=False)):
                bar.update()
                images = image_fields(sample)
                checked += len(images)
                problems += [f"sample {index} (key {sample.get('key')!r}), field {name!r}: "
                             f"{reason}" for name, reason in _bad_images(images)]
                if len(problems) >= _MAX_PROBLEMS:
                    problems.append(f"... (stopped after {len(problems)} bad images; sample "
                                    f"{index} was the last)")
                    break
        except FormatError:
            pass
    return problems, checked


def image_fields(sample: Any) -> dict[str, Any]:
    """The fields of ``sample`` that hold an image file: bytes that begin as JPEG, PNG, GIF or
    WebP data do; and any bytes in a field named like an image file's suffix (WebDataset's
    ``jpg``, ``png``) or in a sample whose key names an image file that Pillow reads, as
    ``fpipe write`` packs a folder (the key is the file's path): an empty file or a text file
    named ``.jpg`` is an image that is damaged, not some other bytes.

    >>> sorted(image_fields({"key": "cat/1.jpg", "image": b"", "label": 3}))
    ['image']
    >>> sorted(image_fields({"key": "a", "jpg": b"hello", "txt": b"hello", "x": b"GIF89a"}))
    ['jpg', 'x']
    """
    if not isinstance(sample, dict):
        return {}
    key = sample.get("key")
    named = isinstance(key, str) and file_suffix(key).lower() in checked_suffixes()
    return {name: value for name, value in sample.items()
            if isinstance(value, (bytes, bytearray, memoryview))
            and (named or f".{name}".lower() in checked_suffixes() or encoded_image(bytes(value[:12])))}


def _bad_images(images: dict[str, Any]) -> list[tuple[str, str]]:
    found = ((name, image_problem(value, decode=True)) for name, value in images.items())
    return [(name, reason) for name, reason in found if reason is not None]
