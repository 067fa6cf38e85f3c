"""Coverage-guided fuzzing of the reader with atheris (optional: ``pip install atheris``).

Run it from the repository's root; libFuzzer's options pass through, and a folder argument
is the corpus (seeded with valid datasets when empty)::

    python -m tests.reliability.fuzz_reader -atheris_runs=100000 /tmp/fpipe-corpus

An input is one byte ``k``, then ``k`` big-endian uint64 offsets, then the data file. Every
read of it must give what the format says (``files.Oracle``) or raise FormatError; anything
else stops the fuzzer with the input saved as ``crash-*``. ``test_atheris.py`` runs it.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
from pathlib import Path


def encode(data: bytes, offsets: list[int]) -> bytes:
    """The fuzzer input that stands for a data file and its offsets."""
    return bytes([len(offsets)]) + struct.pack(f">{len(offsets)}Q", *offsets) + data


def decode(blob: bytes) -> dict[str, bytes]:
    """The dataset files (by suffix) that a fuzzer input stands for."""
    count = min(blob[0], (len(blob) - 1) // 8) if blob else 0
    end = 1 + 8 * count
    return {"": blob[end:], ".offsets": blob[1:end]}


def seeds() -> list[bytes]:
    """Inputs made of valid datasets: mutations start from real samples."""
    import numpy as np

    from fpipe.dataset import pack_sample

    rng = np.random.default_rng(0)
    found = []
    for n in (1, 3, 8):
        messages = [pack_sample({"key": f"k{i}", "x": rng.normal(size=i).astype("<f4"),
                                 "grid": np.zeros((2, i), "<i2"), "raw": rng.bytes(i)})
                    for i in range(n)]
        offsets = np.cumsum([0, *map(len, messages)]).tolist()
        found.append(encode(b"".join(messages), offsets))
    return found


def _corpus(argv: list[str]) -> None:
    folders = [Path(arg) for arg in argv[1:] if not arg.startswith("-")]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        if not any(folder.iterdir()):
            for number, seed in enumerate(seeds()):
                (folder / f"seed{number}").write_bytes(seed)


def main(argv: list[str] | None = None) -> None:
    import atheris  # here, not at the top: doctest collection imports this module

    argv = list(sys.argv if argv is None else argv)
    with atheris.instrument_imports():  # before anything imports fpipe, which it instruments
        from tests.reliability.files import check_reader, put_files
    _corpus(argv)
    folder = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    path = folder / "fuzz.msgpack"

    def one_input(blob: bytes) -> None:
        contents = decode(blob)
        put_files(path, contents)
        check_reader(path, contents)

    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
