"""``fpipe index`` (rebuilding from the samples) and ``fpipe info`` in bounded memory: no
table of keys or offsets, however many samples."""

import json
import os
import tracemalloc

import msgpack
import pytest

import fpipe._commands.inspect as inspect
import fpipe.storage._hashing as hashing
import fpipe.storage._indexing as indexing
import fpipe.storage.keyindex as keyindex
import fpipe.storage.reader as reader_module
import fpipe.storage.recovery as recovery
import fpipe.storage.writer as writer_module
from fpipe.cli import main
from fpipe.storage import DatasetFiles, MsgpackReader, RawWriter

# Traced memory that a command may gain for each sample more (a table of keys costs 100
# bytes a sample and more; the buffers held at the moment of the peak vary by a few hundred
# kilobytes, which is a few bytes a sample here).
_BYTES_A_SAMPLE = 30


@pytest.fixture
def small_bounds(monkeypatch):
    """The fixed bounds of the storage layer and the commands (keys checked at write, pairs
    held before they spill, the Bloom filter, offsets held by a reader, batches and windows),
    made small so that growth past them shows with tens of thousands of samples."""
    monkeypatch.setattr(reader_module, "_RESIDENT_OFFSETS", 1 << 12)
    monkeypatch.setattr(writer_module, "WINDOW", 1024)
    monkeypatch.setattr(keyindex, "_PENDING", 1 << 18)
    monkeypatch.setattr(keyindex, "_SORTED", 1 << 18)
    monkeypatch.setattr(hashing, "BLOOM_MAX_BYTES", 1 << 16)
    monkeypatch.setattr(indexing, "_BATCH", 4096)
    monkeypatch.setattr(recovery, "_HANDED", 4096)
    monkeypatch.setattr(recovery, "_OLD_BLOCK", 1024)
    monkeypatch.setattr(inspect, "_OFFSETS_WINDOW", 4096)
    monkeypatch.setattr(inspect, "_KEY_BATCH", 4096)


def _tiny_dataset(path, n: int):
    with RawWriter(path) as writer:
        for key in (f"{i:09d}" for i in range(n)):
            writer.write(key, msgpack.packb({"key": key, "d": len(key)}))
    return path


def _peak(*argv) -> int:
    """The peak of traced memory while ``fpipe *argv -q`` runs (it must succeed)."""
    tracemalloc.start()
    try:
        assert main([*map(str, argv), "-q"]) == 0, argv
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _growth(peaks: dict[int, int]) -> float:
    """Bytes of peak memory a sample more, from the smallest run to the largest."""
    (small, before), (large, after) = min(peaks.items()), max(peaks.items())
    return (after - before) / (large - small)


def _killed_append(path, n: int):
    """A dataset of ``n`` samples whose writer was killed as it appended: the old index
    describes the first ``n - 10`` samples, and the last is cut short."""
    _tiny_dataset(path, n)
    files = DatasetFiles(path)
    with open(files.offsets, "r+b") as offsets:
        offsets.truncate(8 * (n - 9))
    os.truncate(path, os.path.getsize(path) - 3)
    for stale in (files.keys, files.key_hashes, files.filter, files.key_index, files.md5):
        stale.unlink()
    return path


def test_index_rebuilds_in_the_same_memory_at_any_size(tmp_path, small_bounds):
    peaks = {}
    for n in (10_000, 80_000):
        path = _killed_append(tmp_path / f"{n}.msgpack", n)
        peaks[n] = _peak("index", path)
        with MsgpackReader(path) as reader:
            assert len(reader) == n - 1 and reader.find_key(n - 2) == f"{n - 2:09d}"
            assert reader.find_index(f"{n // 2:09d}") == n // 2 and reader.verify_data()
    # measured: no growth (the larger run peaked lower); 116 bytes a sample when the scan
    # held the keys and spans, and the old offsets whole
    assert _growth(peaks) < _BYTES_A_SAMPLE, peaks



def test_info_reads_the_index_in_the_same_memory_at_any_size(tmp_path, small_bounds, capsys):
    peaks = {}
    for n in (10_000, 80_000):
        path = _tiny_dataset(tmp_path / f"{n}.msgpack", n)
        capsys.readouterr()
        peaks[n] = _peak("info", path, "--json")
        summary = json.loads(capsys.readouterr().out)
        assert summary["keys"] == {"first": f"{0:09d}", "last": f"{n - 1:09d}",
                                   "min": f"{0:09d}", "max": f"{n - 1:09d}"}
        assert summary["samples"] == n and summary["sample_bytes"]["max"] == 18
    # measured: no growth; 84 bytes a sample when it read every key and offset at once
    assert _growth(peaks) < _BYTES_A_SAMPLE, peaks
