"""How the commands tell a damaged image.

:func:`damage` is a cheap look that ``fpipe write`` gives every image file: Pillow must know
its format from its header, and JPEG, PNG, WebP and GIF data must reach the end that their
format marks, which is where a cut-off download or copy fails (other formats, mostly
uncompressed, are decoded: BMP, TIFF, PPM). Pillow's ``verify()`` does not notice a cut-off
JPEG, and a full decode costs 15 times the look: for a 93 KiB 500x375 JPEG, reading took
0.03 ms, the look 0.07 ms, a decode 1-2 ms (160 ms for a 12-megapixel photo).
:func:`decode_failure` is the full decode, for ``fpipe write --check/--skip-bad`` and
``fpipe verify --images``.

>>> import io
>>> from PIL import Image
>>> buffer = io.BytesIO()
>>> Image.effect_noise((64, 64), 40).convert("RGB").save(buffer, "JPEG")
>>> jpeg = buffer.getvalue()
>>> damage(jpeg) is None, decode_failure(jpeg) is None
(True, True)
>>> damage(jpeg[:-40])
'the JPEG data ends before its end-of-image marker (cut off?)'
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

from ..errors import FormatError
from ._common import progress_bar
from ._inputs import IMAGE_SUFFIXES

__all__ = ["checked_suffixes", "damage", "decode_failure", "encoded_image", "image_problems"]

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


def damage(data: bytes) -> str | None:
    """Why ``data`` is not a whole image, or None: Pillow does not know it from its header,
    or JPEG, PNG, WebP or GIF data stops before its format's end, or an image of another
    format does not decode."""
    from PIL import Image, UnidentifiedImageError

    # Pillow tries every format it knows unless told which: twice the time for a JPEG
    formats = next(([kind] for magic, kind in _FORMAT_MAGIC if data.startswith(magic)), None)
    try:
        with Image.open(io.BytesIO(data), formats=formats) as image:
            kind = image.format
            if kind not in _ENDS:
                image.load()
    except UnidentifiedImageError:
        return f"not an image that Pillow knows (its bytes begin {bytes(data[:16])!r})"
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return f"not a whole image ({error})"
    complete, what = _ENDS.get(kind, (None, ""))
    return None if complete is None or complete(data) else f"the {kind} data {what} (cut off?)"


def decode_failure(data: Any) -> str | None:
    """Why ``data`` does not decode as an image (fpipe's decoder, the one the training
    pipelines use), or None when it does."""
    from PIL import Image

    from ..image import ImageDecodeError, decode_image

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
    """The images in the samples of dataset ``path`` that do not decode, one line each (at most
    10, then where it stopped), and how many images were decoded. A corrupt sample ends the
    look quietly: the structure check names it."""
    from ..storage import MsgpackReader

    problems: list[str] = []
    decoded = 0
    with MsgpackReader(path) as reader, progress_bar(
            args, total=len(reader), desc=f"decoding images of {path.name}", unit=" samples") as bar:
        try:
            for index, sample in enumerate(reader.iter(copy=False)):
                bar.update()
                images = _images_of(sample)
                decoded += len(images)
                problems += [f"sample {index} (key {sample.get('key')!r}), field {name!r}: "
                             f"{reason}" for name, reason in _undecodable(images)]
                if len(problems) >= _MAX_PROBLEMS:
                    problems.append(f"... (stopped after {len(problems)} images that do not "
                                    f"decode; sample {index} was the last)")
                    break
        except FormatError:
            pass
    return problems, decoded


def _images_of(sample: Any) -> dict[str, bytes]:
    if not isinstance(sample, dict):
        return {}
    return {name: value for name, value in sample.items() if encoded_image(value)}


def _undecodable(images: dict[str, bytes]) -> list[tuple[str, str]]:
    found = ((name, decode_failure(value)) for name, value in images.items())
    return [(name, reason) for name, reason in found if reason is not None]
