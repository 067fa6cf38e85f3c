"""Helpers for the command-line tests: run ``python -m fpipe`` on real files."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fpipe.dataset._indexing as indexing
import fpipe.dataset.keyindex as hashing
import fpipe.dataset.keyindex as keyindex
import fpipe.dataset.reader as reader_module
import fpipe.dataset.writer as writer_module
from fpipe.cli import main
from fpipe.dataset import FileWriter, MsgpackReader

# Fixed help width, so that help texts compare equal on any terminal.
ENV = {**os.environ, "COLUMNS": "100", "PYTHONWARNINGS": "ignore"}


def fpipe(*argv, cwd=None, env=None) -> subprocess.CompletedProcess:
    """Run the fpipe command with ``argv`` (``env`` adds variables); never raises on a non-zero
    status."""
    return subprocess.run([sys.executable, "-m", "fpipe", *map(str, argv)], capture_output=True,
                          text=True, cwd=cwd, env={**ENV, **(env or {})}, timeout=120)


def ok(*argv, cwd=None, env=None) -> str:
    """Run the fpipe command, check that it succeeded cleanly, return its stdout."""
    result = fpipe(*argv, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def fails(status: int, *argv, cwd=None) -> str:
    """Run the fpipe command, check that it exits with ``status`` and one clear message (no
    traceback); return stderr."""
    result = fpipe(*argv, cwd=cwd)
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip(), "an error says what went wrong"
    return result.stderr


def mistake(capsys, status: int, *argv) -> str:
    """Run ``fpipe.cli.main`` in this process (as ``python -m fpipe`` does, without the cost of
    an interpreter), check that it returns ``status`` with a message and no exception; return
    stderr. The subprocess tests prove that the process exits with the same status."""
    try:
        code = main([str(arg) for arg in argv])
    except SystemExit as exit:  # argparse's usage errors
        code = exit.code
    captured = capsys.readouterr()
    assert code == status, (code, captured.out, captured.err)
    assert captured.err.strip(), "an error says what went wrong"
    return captured.err


def ok_or_failure(status: int, *argv) -> str:
    """Run the fpipe command, check its exit status (and that it has no traceback), return stdout."""
    result = fpipe(*argv)
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def make_dataset(path: Path, n: int, prefix: str = "s", labels: int = 3) -> Path:
    rng = np.random.default_rng(n)
    with FileWriter(path) as writer:
        for i in range(n):
            writer.write({"key": f"{prefix}{i:04d}", "data": rng.bytes(20 + i % 50),
                          "label": i % labels})
    return path


def keys(path: Path) -> list[str]:
    with MsgpackReader(path) as reader:
        return [reader.find_key(i) for i in range(len(reader))]


def leftovers(folder: Path) -> list[str]:
    """Staging folders left behind in ``folder`` (there must be none)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".fpipe-"))


def jpeg(seed: int, size=(12, 10)) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


@pytest.fixture
def image_folder(tmp_path) -> Path:
    """An ImageFolder tree: classes b10, b2, a (3, 2, 2 JPEG images) and a loose README."""
    root = tmp_path / "images"
    for label, count in (("b10", 3), ("b2", 2), ("a", 2)):
        (root / label).mkdir(parents=True)
        for i in range(count):
            (root / label / f"{i}.jpg").write_bytes(jpeg(len(label) * 10 + i))
    (root / "README.txt").write_text("not an image")
    return root


@pytest.fixture
def dataset(tmp_path) -> Path:
    return make_dataset(tmp_path / "set.msgpack", 50)


def shrink_storage_bounds(monkeypatch, offsets: int, pending: int, bloom_bytes: int) -> None:
    """The storage layer's fixed bounds (keys checked at write, pairs held before they spill,
    the Bloom filter, offsets held by a reader, batches of keys), made small so that growth
    past them shows with tens of thousands of samples: the memory tests' setting."""
    monkeypatch.setattr(reader_module, "_RESIDENT_OFFSETS", offsets)
    monkeypatch.setattr(writer_module, "WINDOW", 1024)
    monkeypatch.setattr(keyindex, "_PENDING", pending)
    monkeypatch.setattr(keyindex, "_SORTED", pending)
    monkeypatch.setattr(hashing, "BLOOM_MAX_BYTES", bloom_bytes)
    monkeypatch.setattr(indexing, "_BATCH", 4096)
