"""A small dataset cut at every byte, and ``fpipe verify`` against ``rebuild_index``.

Every read of a cut dataset returns the sample that was written or raises FormatError. On the
same damaged files, ``fpipe verify`` and ``rebuild_index`` (``fpipe index``) agree: verify
flags exactly the damaged datasets, rebuild_index recovers exactly the complete samples of a
cut file and every intact sample of a file with flipped bits, and verify passes what
rebuild_index leaves behind.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpipe.cli.repair import check_dataset
from fpipe.dataset import MsgpackReader, rebuild_index
from fpipe.dataset.format import DatasetFiles
from fpipe.errors import FormatError

from .files import KEY_INDEX_LEFT_ASIDE, check_reader, file_bytes, put_files, same, write_dataset

pytestmark = [pytest.mark.timeout(600), KEY_INDEX_LEFT_ASIDE]


def small_samples() -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"key": f"s{i}", "label": i % 3, "x": rng.normal(size=(i % 3, 2)).astype("<f4"),
             "blob": rng.bytes(i * 5), "note": "é" * (i % 4)} for i in range(8)]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    folder = tmp_path_factory.mktemp("original")
    samples = small_samples()
    path = write_dataset(folder / "small.msgpack", samples)
    offsets = np.frombuffer(DatasetFiles(path).offsets.read_bytes(), ">u8").tolist()
    return samples, file_bytes(path), offsets


def _expect(got, wanted, what: str) -> None:
    if wanted is None:
        assert isinstance(got, FormatError), f"{what}: {got!r:.200}"
    else:
        assert not isinstance(got, Exception) and same(got, wanted), f"{what}: {got!r:.200}"


def _attempt(read, *args, **kwargs):
    try:
        return read(*args, **kwargs)
    except FormatError as error:
        return error


def _read_cut(reader: MsgpackReader, samples: list[dict], complete: int) -> int:
    """Read a dataset whose data file holds the first ``complete`` samples whole; each read
    is the written sample or FormatError. Return the number of reads."""
    wanted = [s if i < complete else None for i, s in enumerate(samples)]
    reads = 0
    for i in range(len(samples)):
        _expect(_attempt(reader.get, i), wanted[i], f"get({i})")
        raw = _attempt(reader.get, i, raw=True)
        assert isinstance(raw, bytes) == (i < complete), f"get({i}, raw=True): {raw!r:.80}"
        reads += 2
    for chunk_size in (1, 3, 16):
        got = []
        error = _attempt(got.extend, reader.iter(chunk_size=chunk_size))
        assert same(got, samples[:complete]), f"iter(chunk_size={chunk_size})"
        assert isinstance(error, FormatError) == (complete < len(samples))
        reads += 1
    _expect(_attempt(reader.get_slice, 0, len(samples)),
            samples if complete == len(samples) else None, "get_slice")
    _expect(_attempt(reader.get_many, [complete - 1, 0] if complete else [0]),
            [samples[complete - 1], samples[0]] if complete else None, "get_many")
    return reads + 2


def test_every_cut_of_the_data_file_reads_right_or_raises_format_error(original, tmp_path,
                                                                        record):
    samples, contents, offsets = original
    path, data, reads = tmp_path / "cut.msgpack", contents[""], 0
    put_files(path, contents)
    for cut in range(len(data) + 1):
        path.write_bytes(data[:cut])
        complete = sum(stop <= cut for stop in offsets[1:])
        reads += _read_cut(MsgpackReader(path), samples, complete)
    record("the data file cut at every byte", tried=len(data) + 1, reads=reads)


@pytest.mark.parametrize("every", [pytest.param(8, id="default"),
                                   pytest.param(1, id="soak", marks=pytest.mark.soak)])
def test_every_cut_of_every_index_file_reads_right_or_raises(original, tmp_path, record, every):
    """Every byte of the files that locate samples; every ``every``-th of the others (the
    Bloom filter and the md5 file, which reads do not need)."""
    samples, contents, _ = original
    path, cuts, reads = tmp_path / "cut.msgpack", 0, 0
    for suffix in (".offsets", ".keys", ".key_hashes", ".filter", ".md5"):
        step = every if suffix in (".filter", ".md5") else 1
        for cut in range(0, len(contents[suffix]), step):
            damaged = {**contents, suffix: contents[suffix][:cut]}
            put_files(path, damaged)
            reads += check_reader(path, damaged).reads
            cuts += 1
    record("each index file cut", tried=cuts, reads=reads)


# --- verify and rebuild_index on the same files ---------------------------------------------

QUIET = argparse.Namespace(quick=False, quiet=True)


def verify(path) -> list[str]:
    problems, _ = check_dataset(path, QUIET)
    return problems


def rebuilt(path, copy, drop_damaged: bool = False) -> tuple[object, list]:
    """``rebuild_index`` on a copy of the data file (and its old index): its report, and the
    samples it indexed (their raw bytes); or the FormatError it raised."""
    for suffix in ("", ".offsets", ".damaged", ".incomplete"):
        Path(str(copy) + suffix).unlink(missing_ok=True)
    shutil.copyfile(path, copy)
    shutil.copyfile(DatasetFiles(path).offsets, DatasetFiles(copy).offsets)
    try:
        report = rebuild_index(copy, drop_damaged=drop_damaged)
    except FormatError as error:
        return error, []
    return report, list(MsgpackReader(copy).iter(raw=True))


def _cuts(size: int, offsets: list, every: int) -> list[int]:
    """Every ``every``-th byte, and each sample boundary with the bytes either side of it."""
    near = {cut + d for cut in offsets for d in (-1, 0, 1)}
    return sorted({*range(0, size + 1, every), *(c for c in near if 0 <= c <= size)})


@pytest.mark.parametrize("every", [pytest.param(7, id="default"),
                                   pytest.param(1, id="soak", marks=pytest.mark.soak)])
def test_verify_and_rebuild_index_agree_on_cuts(original, tmp_path, record, every):
    samples, contents, offsets = original
    path, copy = _two_places(tmp_path)
    data = contents[""]
    cuts = _cuts(len(data), offsets, every)
    for cut in cuts:
        put_files(path, {**contents, "": data[:cut]})
        problems = verify(path)
        assert bool(problems) == (cut < len(data)), problems
        report, recovered = rebuilt(path, copy)
        complete = sum(stop <= cut for stop in offsets[1:])
        assert report.samples == complete and report.valid_bytes == offsets[complete]
        assert report.incomplete_bytes == cut - offsets[complete]
        assert recovered == [data[a:b] for a, b in zip(offsets[:complete], offsets[1:complete + 1])]
        if report.incomplete_bytes:  # the bytes cut off are kept
            assert report.cut_copy.read_bytes() == data[offsets[complete]:cut]
        assert verify(copy) == []
    record("verify vs rebuild_index: the data file cut", tried=len(cuts))


def _two_places(folder) -> tuple:
    """The damaged dataset and the copy that rebuild_index repairs: the same file name (the
    .md5 file names it) in two folders."""
    (folder / "damaged").mkdir(exist_ok=True)
    (folder / "repaired").mkdir(exist_ok=True)
    return folder / "damaged" / "small.msgpack", folder / "repaired" / "small.msgpack"


@st.composite
def flipped(draw, data: bytes) -> bytes:
    damaged = bytearray(data)
    for bit in draw(st.sets(st.integers(0, 8 * len(data) - 1), min_size=1, max_size=3)):
        damaged[bit // 8] ^= 1 << (bit % 8)
    return bytes(damaged)


def _agree_on_flips(contents: dict, offsets: list, folder, counts: dict):
    path, copy = _two_places(folder)
    spans = [contents[""][a:b] for a, b in zip(offsets, offsets[1:])]

    def check(data: bytes) -> None:
        put_files(path, {**contents, "": data})
        problems = verify(path)
        assert problems, "verify passed a data file with flipped bits"
        flipped = {i for i, (a, b) in enumerate(zip(offsets, offsets[1:])) if data[a:b] != spans[i]}
        report, recovered = rebuilt(path, copy, drop_damaged=True)
        counts["tried"] += 1
        if isinstance(report, FormatError):  # a flipped key that another sample has
            assert "duplicate key" in str(report)
            counts["refused"] += 1
            return
        # every sample that no flip touched is found again, in order, byte for byte ...
        intact = [span for i, span in enumerate(spans) if i not in flipped]
        assert [raw for raw in recovered if raw in intact] == intact
        # ... a flipped one is gone, or there as it decodes now; what is left passes verify
        assert len(recovered) - len(intact) <= len(flipped)
        assert verify(copy) == []
        counts["recovered_samples"] += report.samples
        counts["damaged_regions"] += len(report.damaged)
    return check


@pytest.mark.parametrize("count", [pytest.param(200, id="default"),
                                   pytest.param(5000, id="soak", marks=pytest.mark.soak)])
def test_verify_and_rebuild_index_agree_on_flipped_bits(original, tmp_path, record, count):
    _, contents, offsets = original
    counts = {"tried": 0, "refused": 0, "recovered_samples": 0, "damaged_regions": 0}
    run = settings(max_examples=count, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck))(
        given(flipped(contents[""]))(_agree_on_flips(contents, offsets, tmp_path, counts)))
    run()
    record("verify vs rebuild_index: 1-3 flipped bits in the data file", **counts)


def test_fpipe_index_and_verify_on_the_command_line(original, tmp_path):
    """The same agreement through the commands a user runs."""
    from fpipe.cli import main

    samples, contents, offsets = original
    path = tmp_path / "cut.msgpack"
    put_files(path, {**contents, "": contents[""][:offsets[5] + 3]})
    assert main(["verify", "-q", str(path)]) == 1
    assert main(["index", "-q", str(path)]) == 0
    assert main(["verify", "-q", str(path)]) == 0
    assert same(list(MsgpackReader(path)), samples[:5])


def test_rebuild_index_never_indexes_a_sample_that_a_reader_cannot_decode(tmp_path):
    """Regression: the scan decoded without the numpy hook, so it indexed a sample whose
    array had lost its shape, which every read of the rebuilt dataset then failed on."""
    path = write_dataset(tmp_path / "x.msgpack", small_samples()[:3])
    data = bytearray(path.read_bytes())
    position = data.rindex(b"shape")
    data[position] = ord("r")  # the last sample's array now has a "rhape" and no shape
    path.write_bytes(data)
    report = rebuild_index(path, drop_damaged=True)
    assert report.samples == 2 and len(report.damaged) == 1 and verify(path) == []
