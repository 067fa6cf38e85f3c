"""``fpipe index`` (rebuilding from the samples, or converting a legacy ``.index``),
``fpipe verify`` and the passes over the keys of a legacy dataset, ``fpipe info`` and
``fpipe write`` from a folder in bounded memory: no table of keys, offsets or files, however
many samples."""

import io
import json
import os
import tracemalloc

import msgpack
import pytest
from PIL import Image

import fpipe.cli._index_checks as index_checks
import fpipe.cli.inspect as inspect
import fpipe.dataset.format as format_module
import fpipe.dataset.recovery as recovery
import fpipe.dataset.writer as writer_module
from fpipe.cli import main
from fpipe.cli._common import dataset_key_batches
from fpipe.dataset import MsgpackReader, RawWriter, md5_file, read_offsets
from fpipe.files import DatasetFiles

from .conftest import shrink_storage_bounds

# Traced memory that a command may gain for each sample more (a table of keys costs 100
# bytes a sample and more; the buffers held at the moment of the peak vary by a few hundred
# kilobytes, which is a few bytes a sample here).
_BYTES_A_SAMPLE = 30


@pytest.fixture
def small_bounds(monkeypatch):
    """The fixed bounds of the storage layer and the commands (see shrink_storage_bounds; and
    the recovery's and info's batches and windows), made small."""
    shrink_storage_bounds(monkeypatch, offsets=1 << 12, pending=1 << 15, bloom_bytes=1 << 12)
    monkeypatch.setattr(recovery, "_HANDED", 4096)
    monkeypatch.setattr(recovery, "_OLD_BLOCK", 1024)
    monkeypatch.setattr(inspect, "_OFFSETS_WINDOW", 4096)
    monkeypatch.setattr(inspect, "_KEY_BATCH", 4096)
    monkeypatch.setattr(index_checks, "_WINDOW", 4096)
    monkeypatch.setattr(index_checks, "_BATCH", 4096)
    monkeypatch.setattr(format_module, "_LEGACY_BATCH", 4096)


def _tiny_dataset(path, n: int):
    with RawWriter(path) as writer:
        for key in (f"{i:09d}" for i in range(n)):
            writer.write(key, msgpack.packb({"key": key, "d": len(key)}))
    return path


def _peak(*argv) -> int:
    """The peak of traced memory while ``fpipe *argv -q`` runs (it must succeed); the first
    run of a command pays for the modules it imports, so callers run it once before."""
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


def _legacy_dataset(path, n: int):
    """A dataset of ``n`` tiny samples with only datadings < 3.1's ``.index`` (key -> offset)
    and an ``.md5`` of its data file."""
    _tiny_dataset(path, n)
    files = DatasetFiles(path)
    legacy = dict(zip((f"{i:09d}" for i in range(n)), read_offsets(path)[:-1].tolist()))
    for index_file in files.index_files:
        index_file.unlink()
    files.legacy_index.write_bytes(msgpack.packb(legacy))
    files.md5.write_text(f"{md5_file(path)}  {path.name}\n")
    return path


# (dataset builder, samples the index keeps): a writer killed as it appended (the last sample
# cut short) and a dataset with only datadings < 3.1's ``.index``. Measured: 16 bytes a sample,
# the index builder's read buffer filling up to its 1 MiB; 157 when the scan held the keys and
# spans and the old offsets whole, 184 when the legacy map was read whole.
@pytest.mark.slow
@pytest.mark.parametrize("dataset, kept", [(_killed_append, -1), (_legacy_dataset, 0)],
                         ids=["killed append", "legacy index"])
def test_index_rebuilds_in_the_same_memory_at_any_size(tmp_path, small_bounds, dataset, kept):
    assert main(["index", str(dataset(tmp_path / "first.msgpack", 2000)), "-q"]) == 0
    peaks = {}
    for n in (10_000, 80_000):
        path = dataset(tmp_path / f"{n}.msgpack", n)
        peaks[n] = _peak("index", path)
        last = n + kept - 1
        with MsgpackReader(path) as reader:
            assert len(reader) == n + kept and reader.find_key(last) == f"{last:09d}"
            assert reader.find_index(f"{n // 2:09d}") == n // 2 and reader.verify_data()
    assert _growth(peaks) < _BYTES_A_SAMPLE, peaks


def test_verify_reads_a_legacy_index_in_the_same_memory_at_any_size(tmp_path, small_bounds):
    assert main(["verify", str(_legacy_dataset(tmp_path / "first.msgpack", 2000)), "-q"]) == 0
    peaks = {n: _peak("verify", _legacy_dataset(tmp_path / f"{n}.msgpack", n))
             for n in (10_000, 80_000)}
    # measured: 7 bytes a sample (read buffers up to their 1 MiB); 284 when the map was read
    # whole
    assert _growth(peaks) < _BYTES_A_SAMPLE, peaks


def test_the_key_passes_of_info_merge_and_split_read_a_legacy_index_in_batches(tmp_path,
                                                                               small_bounds):
    """(Their reads of samples go through the reader, which holds a legacy index's tables.)"""
    peaks = {}
    for n in (10_000, 80_000):
        with MsgpackReader(_legacy_dataset(tmp_path / f"{n}.msgpack", n)) as reader:
            tracemalloc.start()
            try:
                last = [batch[-1] for _, batch in dataset_key_batches(reader, 4096)][-1]
                peaks[n] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert last == f"{n - 1:09d}"
    # measured: 10 bytes a sample, the map's read buffer filling up to its 1 MiB; 237 when
    # the map was read whole
    assert _growth(peaks) < _BYTES_A_SAMPLE, peaks


def test_info_reads_the_index_in_the_same_memory_at_any_size(tmp_path, small_bounds, capsys):
    assert main(["info", str(_tiny_dataset(tmp_path / "first.msgpack", 2000)), "-q"]) == 0
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


def _image_tree(root, n: int) -> None:
    """``n`` PNG files of about 1 KiB in 4 class folders, 100 to a folder below them."""
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "PNG")
    png = buffer.getvalue() + bytes(1000)  # data after the IEND chunk: still a whole PNG
    for i in range(n):
        # short keys: the index builder's read buffer grows with the keys up to 1 MiB (its
        # bound), ~13 bytes a file here; no Path for each file: pathlib interns the parts of
        # the paths it parses, and a table of interned strings that grows with the files
        # would be copied whole when it grows again, in whichever run that happens
        folder = os.path.join(root, f"c{i % 4}", f"p{i // 400}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i}.png"), "wb") as file:
            file.write(png)


@pytest.mark.slow  # about 10 s: 18,000 files written and packed
def test_write_walks_a_folder_in_the_same_memory_at_any_size(tmp_path, small_bounds,
                                                             monkeypatch):
    # blocks written in the caller's thread: the writer thread's queue holds up to 4 blocks of
    # 1 MiB, as many as the disk lets pile up (noise, not growth)
    monkeypatch.setattr(writer_module, "_THREAD_MIN", 1 << 62)
    peaks = {}
    for n in (2_000, 16_000):
        _image_tree(tmp_path / f"tree{n}", n)
    assert main(["write", str(tmp_path / "tree2000"), str(tmp_path / "first.msgpack"), "-q"]) == 0
    for n in (2_000, 16_000):
        out = tmp_path / f"{n}.msgpack"
        peaks[n] = _peak("write", tmp_path / f"tree{n}", out)
        with MsgpackReader(out) as reader:
            assert len(reader) == n and reader[1]["label"] == 0
            # c0/p0 first, its files in natural order (0, 4, 8, ...), then c0/p1's
            assert [reader.find_key(i) for i in (0, 1, 100)] == [
                "c0/p0/0.png", "c0/p0/4.png", "c0/p1/400.png"]
    # measured: 11 bytes a file (the index builder's buffers growing to their bounds); 497
    # when the whole listing was held (and the look for Parquet files listed the tree again)
    assert _growth(peaks) < _BYTES_A_SAMPLE, peaks


@pytest.fixture(scope="module")
def image_trees(tmp_path_factory):
    """Trees of 2,000 and 16,000 PNG files (see _image_tree), each with a list file of them,
    and JSON-lines files of as many samples; made once for the tests of this module."""
    root = tmp_path_factory.mktemp("trees")
    for n in (2_000, 16_000):
        tree = root / f"tree{n}"
        _image_tree(tree, n)
        names = [f"c{i % 4}/p{i // 400}/{i}.png" for i in range(n)]
        (tree / "list.csv").write_text("".join(f"{name},c{i % 4}\n"
                                               for i, name in enumerate(names)))
        # samples of 1 KiB, as the files are: the writer holds up to 1 MiB of them (its bound)
        (root / f"samples{n}.jsonl").write_text("".join(
            json.dumps({"key": name, "label": f"c{i % 4}", "text": "x" * 1000}) + "\n"
            for i, name in enumerate(names)))
    return root


_SOURCES = {"folder": "tree{n}", "list file": "tree{n}/list.csv",
            "JSON lines": "samples{n}.jsonl", "glob": "tree{n}/{{LABEL}}/**/*.png"}


_SHUFFLED = ["--shuffle", "--seed", "7"]
# a folder listed in order: test_write_walks_a_folder_in_the_same_memory_at_any_size
_CASES = [(source, order) for source in sorted(_SOURCES) for order in ([], _SHUFFLED)
          if source != "folder" or order]


@pytest.mark.slow  # about 10 s a case: 18,000 files packed
@pytest.mark.parametrize(("source", "order"), _CASES,
                         ids=[f"{source}-{'shuffled' if order else 'listed'}" for source, order in _CASES])
def test_write_lists_and_shuffles_any_source_in_the_same_memory_at_any_size(
        image_trees, tmp_path, small_bounds, monkeypatch, source, order):
    import fpipe.cli._shuffle as shuffle

    monkeypatch.setattr(writer_module, "_THREAD_MIN", 1 << 62)  # as in the folder's test
    # buckets of 1,000 entries: 2 and 16 of them; dealt lines written every 64 KiB
    monkeypatch.setattr(shuffle, "BUCKET_ENTRIES", 1000)
    monkeypatch.setattr(shuffle, "DEALT_BYTES", 1 << 16)
    paths = {n: str(image_trees / _SOURCES[source].format(n=n)) for n in (2_000, 16_000)}
    assert main(["write", paths[2_000], str(tmp_path / "first.msgpack"), "-q", *order]) == 0
    peaks = {}
    for n, path in paths.items():
        out = tmp_path / f"{n}.msgpack"
        peaks[n] = _peak("write", path, out, *order)
        with MsgpackReader(out) as reader:
            assert len(reader) == n
            keys = {reader.find_key(i) for i in range(n)}
            assert keys == {f"c{i % 4}/p{i // 400}/{i}.png" for i in range(n)}
            assert (reader.find_key(0) == "c0/p0/0.png") == (not order)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no bucket left
    # measured (bytes a sample), listed: list file 14, JSON lines 17, pattern 12 (the index
    # builder's buffers); 702, 1,642 and 541 when the listing was held whole; shuffled:
    # folder 6, list file 6, JSON lines 10, pattern 6; 312, 699, 1,651 and 541 when the
    # entries were held and permuted
    assert _growth(peaks) < _BYTES_A_SAMPLE, peaks
