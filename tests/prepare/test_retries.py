"""Requests for manifests and the index at a URL are tried again after failures that may heal
(throttling, 5xx), and not after those that cannot (refused access); fsspec's in-memory file
system stands for object storage, with failures injected."""

from __future__ import annotations

import uuid

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from fpipe.prepare import _store, from_generator, verify_dataset, write_dataset
from fpipe.remote import RemoteError, urls

from . import jobs


class SlowDown(OSError):
    """What a throttled PUT raises (botocore says SlowDown, with HTTP 503)."""

    status = 503


@pytest.fixture
def url(monkeypatch):
    monkeypatch.setattr(urls, "_BACKOFF", 0.0)
    return f"memory://prep-{uuid.uuid4().hex}/out"


def _failing(monkeypatch, error: Exception, times: int, suffix: str) -> list[str]:
    """Make the first ``times`` writes of objects named ``*suffix`` raise ``error``."""
    calls, original = [], MemoryFileSystem.pipe_file

    def pipe_file(self, path, value, *args, **kwargs):
        if path.endswith(suffix):
            calls.append(path)
            if len(calls) <= times:
                raise error
        return original(self, path, value, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", pipe_file)
    return calls


@pytest.mark.parametrize("suffix", ["manifest.json", "dataset.shards"])
def test_throttled_writes_are_tried_again(url, monkeypatch, suffix):
    calls = _failing(monkeypatch, SlowDown("SlowDown: please reduce your request rate"), 2, suffix)
    report = write_dataset(from_generator(jobs.rows, range(2)), url, n_workers=1)
    assert report.samples == 2 * jobs.SAMPLES and verify_dataset(url)["partitions"] == 2
    assert len(calls) == (4 if suffix == "manifest.json" else 3)  # 2 failed, then each once


def test_a_failure_that_does_not_heal_is_a_remote_error_after_the_last_try(url, monkeypatch):
    calls = _failing(monkeypatch, SlowDown("SlowDown"), 100, "dataset.shards")
    with pytest.raises(RemoteError, match=f"{url}: SlowDown.* after {_store.TRIES} attempts"):
        write_dataset(from_generator(jobs.rows, range(1)), url, n_workers=1)
    assert len(calls) == _store.TRIES


def test_refused_access_is_not_tried_again(url, monkeypatch):
    calls = _failing(monkeypatch, PermissionError("AccessDenied"), 100, "manifest.json")
    with pytest.raises(RemoteError, match="access denied"):
        write_dataset(from_generator(jobs.rows, range(1)), url, n_workers=1)
    assert len(calls) == 1
    # the attempt's shards went with it: a rerun starts from nothing
    monkeypatch.undo()
    assert not MemoryFileSystem().find(url[len("memory://"):] + "/part-000000")
