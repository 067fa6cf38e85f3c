"""rebuild_index: a killed writer's file recovered; damage anywhere in a data file never costs
an intact sample, and is dropped only when asked, with the original kept."""

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from fpipe.dataset import (
    DamagedDataError,
    FileWriter,
    MsgpackReader,
    RebuildReport,
    UndecidedDataError,
    pack_sample,
    read_offsets,
    rebuild_index,
    unpack_sample,
)
from fpipe.dataset import recovery as recovery_module
from fpipe.dataset import writer as writer_module
from fpipe.errors import FormatError
from fpipe.files import DatasetFiles, read_md5

from .conftest import make_samples, write


def test_rebuild_index_reproduces_the_writer_index(tmp_path, samples):
    path = write(tmp_path / "set.msgpack", samples)
    files = DatasetFiles(path)
    before = {p: p.read_bytes() for p in (*files.index_files, files.md5)}
    for p in before:
        p.unlink()
    report = rebuild_index(path)
    assert report == RebuildReport(len(samples), os.path.getsize(path), 0)
    assert {p: p.read_bytes() for p in before} == before


def test_rebuild_index_reports_its_progress_in_bytes_up_to_the_last_whole_sample(tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setattr(recovery_module, "_PROGRESS_EVERY", 3)
    samples = make_samples(10)
    ends = list(itertools.accumulate(len(pack_sample(sample)) for sample in samples))
    path = write(tmp_path / "set.msgpack", samples)
    os.truncate(path, os.path.getsize(path) - 3)  # the last sample is cut
    seen = []
    report = rebuild_index(path, progress=seen.append)
    # every third offset (the ends of samples 1, 4 and 7), then the end of the last whole one
    assert seen == [ends[1], ends[4], ends[7], ends[8]] and ends[8] == report.valid_bytes


def test_rebuild_index_recovers_a_truncated_file(tmp_path, samples):
    path = write(tmp_path / "set.msgpack", samples)
    size = os.path.getsize(path)
    os.truncate(path, size - 3)
    report = rebuild_index(path)
    assert report.samples == len(samples) - 1 and report.incomplete_bytes == size - 3 - report.valid_bytes
    assert os.path.getsize(path) == report.valid_bytes and not report.damaged
    reader = MsgpackReader(path)
    assert reader[:] == samples[:-1] and reader.verify_data()


def test_rebuild_index_without_truncation_leaves_the_tail(tmp_path, samples):
    path = write(tmp_path / "set.msgpack", samples)
    with open(path, "ab") as file:
        file.write(b"\x82\xa3key")
    report = rebuild_index(path, truncate=False)
    assert report.samples == len(samples) and report.incomplete_bytes == 5
    reader = MsgpackReader(path)
    assert reader[:] == samples and not reader.verify_data()


def test_rebuild_index_goes_on_after_corruption_and_changes_nothing_unless_asked(tmp_path):
    good = b"".join(pack_sample({"key": str(i)}) for i in range(3))
    path = tmp_path / "set.msgpack"
    path.write_bytes(good + b"\xc1" + pack_sample({"key": "late"}))
    with pytest.raises(DamagedDataError, match="1 damaged region .1 bytes. lies between") as raised:
        rebuild_index(path)
    assert raised.value.report.samples == 4 and raised.value.path == path
    assert sorted(os.listdir(tmp_path)) == ["set.msgpack"]
    report = rebuild_index(path, drop_damaged=True)
    assert report.samples == 4 and report.damaged[0].start == len(good)
    assert [s["key"] for s in MsgpackReader(path)] == ["0", "1", "2", "late"]
    assert (tmp_path / "set.msgpack.damaged").read_bytes() == good + b"\xc1" + pack_sample({"key": "late"})


_PAST_THE_WINDOW = [pack_sample({"key": f"{i:04d}"}) for i in range(40)]
_PAST_THE_WINDOW.insert(30, _PAST_THE_WINDOW[20])


@pytest.mark.parametrize("content, match", [
    (pack_sample({"key": 1}), "str"), (pack_sample([1, 2]), "str"),
    (pack_sample({"key": "a"}) * 2, "duplicate key 'a'"),
    # past the keys that the scan holds (the index builder finds it): the same error
    (b"".join(_PAST_THE_WINDOW), f"sample 30 at byte {sum(map(len, _PAST_THE_WINDOW[:30]))}: "
                                 "duplicate key '0020'")])
def test_rebuild_index_needs_unique_str_keys(tmp_path, monkeypatch, content, match):
    monkeypatch.setattr(writer_module, "WINDOW", 8)
    (tmp_path / "set.msgpack").write_bytes(content)
    with pytest.raises(FormatError, match=match):
        rebuild_index(tmp_path / "set.msgpack")
    assert os.listdir(tmp_path) == ["set.msgpack"]


def test_rebuild_index_of_an_empty_file(tmp_path):
    (tmp_path / "set.msgpack").write_bytes(b"")
    assert rebuild_index(tmp_path / "set.msgpack").samples == 0
    assert list(MsgpackReader(tmp_path / "set.msgpack")) == []


KILLED_WRITER = """
import os, sys
from fpipe.dataset import FileWriter
writer = FileWriter(sys.argv[1], buffering=0)
for i in range(100):
    writer.write({"key": str(i), "payload": b"x" * 100})
os._exit(3)
"""


def test_a_killed_writer_is_recovered_by_rebuild_index(tmp_path):
    path = tmp_path / "killed.msgpack"
    result = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)])
    assert result.returncode == 3 and not DatasetFiles(path).offsets.exists()
    report = rebuild_index(path)
    assert report.samples == 100 and report.incomplete_bytes == 0
    reader = MsgpackReader(path)
    assert reader[99] == {"key": "99", "payload": b"x" * 100} and reader.verify_data()
    assert read_md5(path)["killed.msgpack"]


# --- damage anywhere ------------------------------------------------------------------------


def _small(rng, i):
    return {"key": f"s{i:04d}", "data": rng.bytes(10 + i % 40), "label": i % 5}


def _arrays(rng, i):
    return {"key": f"a{i:03d}", "image": rng.integers(0, 255, (4, 3 + i % 3), dtype=np.uint8),
            "box": rng.normal(size=4).astype("<f4"), "tags": ["x", i, None]}


def _images(rng, i):
    return {"key": f"img/{i}.jpg", "image": b"\xff\xd8\xff" + rng.bytes(20_000 + 9_000 * i),
            "label": i % 2}


def _nested(rng, i):
    # maps with a "key" inside samples: not to be taken for samples
    objects = [{"key": f"o{i}-{j}", "box": rng.integers(0, 9, 4).tolist()} for j in range(3)]
    return {"key": f"n{i:03d}", "objects": objects, "blob": rng.bytes(30)}


def _key_last(rng, i):
    return {"data": rng.bytes(40), "label": i % 3, "key": f"z{i:03d}"}


DATASETS = {"small": (_small, 60), "arrays": (_arrays, 30), "images": (_images, 8),
            "nested": (_nested, 25), "key last": (_key_last, 30)}


def _header(span: bytes, rng) -> bytes:
    return b"\xc1" + span[1:]  # the map header becomes a byte that begins nothing


def _patch(span: bytes, rng) -> bytes:
    middle = len(span) // 3
    return span[:middle] + bytes(rng.integers(0xc1, 0xc2, 9, dtype=np.uint8)) + span[middle + 9:]


def _zeros(span: bytes, rng) -> bytes:
    return bytes(min(len(span), 64)) + span[64:]


def _fewer_fields(span: bytes, rng) -> bytes:
    return bytes([span[0] - 1]) + span[1:]  # the rest of the sample is left over


def _more_fields(span: bytes, rng) -> bytes:
    return bytes([span[0] + 2]) + span[1:]  # the sample swallows what follows it


def _delete(span: bytes, rng) -> bytes:
    return span[:5] + span[12:]


DAMAGE = {"header": _header, "patch": _patch, "zeros": _zeros, "fewer fields": _fewer_fields,
          "more fields": _more_fields, "delete": _delete}


def _damaged_dataset(folder, dataset: str, damage: str, where: str) -> tuple:
    """A dataset with sample ``where`` (first, middle or last) damaged; its path, the spans of
    the samples as written, and the index of the damaged one."""
    make, n = DATASETS[dataset]
    rng = np.random.default_rng(7)
    path = folder / "set.msgpack"
    with FileWriter(path) as writer:
        for i in range(n):
            writer.write(make(rng, i))
    offsets = read_offsets(path).tolist()
    data = path.read_bytes()
    spans = [data[a:b] for a, b in zip(offsets, offsets[1:])]
    hit = {"first": 0, "middle": n // 2, "last": n - 1}[where]
    damaged = DAMAGE[damage](spans[hit], rng)
    path.write_bytes(b"".join(spans[:hit]) + damaged + b"".join(spans[hit + 1:]))
    return path, spans, hit


def _check_recovered(path, spans: list[bytes], hit: int) -> None:
    """Every intact sample is there, in order, byte for byte; the damaged one is gone, or
    (when it still decodes as a sample) there under its own key."""
    with MsgpackReader(path) as reader:
        recovered = list(reader.iter(raw=True, yield_key=True))
    intact = [span for i, span in enumerate(spans) if i != hit]
    kept = [raw for _, raw in recovered if raw in intact]
    assert kept == intact, "an intact sample was lost"
    others = [key for key, raw in recovered if raw not in intact]
    assert others in ([], [unpack_sample(spans[hit])["key"]]), others


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("dataset", sorted(DATASETS))
@pytest.mark.parametrize("index", ["old index", "old index out of order", "no index"])
def test_damage_never_costs_an_intact_sample(tmp_path, monkeypatch, dataset, damage, where,
                                             index):
    # the old offsets are read 4 at a time (a search crosses blocks); out of order (damaged
    # too), they are held sorted
    monkeypatch.setattr(recovery_module, "_OLD_BLOCK", 4)
    path, spans, hit = _damaged_dataset(tmp_path, dataset, damage, where)
    if index == "old index out of order":
        offsets = DatasetFiles(path).offsets
        offsets.write_bytes(np.frombuffer(offsets.read_bytes(), ">u8")[::-1].tobytes())
    if index == "no index":
        for file in (*DatasetFiles(path).index_files, DatasetFiles(path).md5):
            file.unlink()
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    dry = rebuild_index(path, dry_run=True)
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    if dry.damaged:
        with pytest.raises(DamagedDataError):
            rebuild_index(path)
        assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    report = rebuild_index(path, drop_damaged=True)
    assert report == dry
    _check_recovered(path, spans, hit)
    if report.damaged:
        assert (tmp_path / "set.msgpack.damaged").read_bytes() == before["set.msgpack"]
    with MsgpackReader(path) as reader:
        assert reader.verify_data() and reader.verify_index()


def test_only_an_incomplete_last_sample_is_cut_without_asking(tmp_path):
    samples = make_samples(6)
    path = write(tmp_path / "set.msgpack", samples)
    data = open(path, "rb").read()
    last = len(pack_sample(samples[-1]))
    # the last sample complete but corrupt: a damaged region, not a tail to cut
    with open(path, "r+b") as file:
        file.seek(len(data) - last)
        file.write(b"\xc1")
    with pytest.raises(DamagedDataError, match=f"the first at bytes {len(data) - last}-{len(data)}"):
        rebuild_index(path)
    assert os.path.getsize(path) == len(data)


def test_a_backup_that_exists_is_never_replaced(tmp_path):
    path = tmp_path / "set.msgpack"
    path.write_bytes(pack_sample({"key": "a"}) + b"\xc1" + pack_sample({"key": "b"}))
    (tmp_path / "set.msgpack.damaged").write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="set.msgpack.damaged"):
        rebuild_index(path, drop_damaged=True)
    assert (tmp_path / "set.msgpack.damaged").read_bytes() == b"mine"
    assert sorted(os.listdir(tmp_path)) == ["set.msgpack", "set.msgpack.damaged"]
    report = rebuild_index(path, drop_damaged=True, backup=tmp_path / "elsewhere")
    assert report.backup == tmp_path / "elsewhere" and len(MsgpackReader(path)) == 2


# --- samples found again by decoding, whatever the samples before them looked like ------------


def _one_byte_changed(folder, spans: list[bytes], hit: int, value: int):
    """A data file (no index) of ``spans`` whose sample ``hit`` has its first byte (the map
    header) changed to ``value``; its path and bytes."""
    data = bytearray(b"".join(spans))
    data[sum(map(len, spans[:hit]))] = value
    path = folder / "set.msgpack"
    path.write_bytes(data)
    return path, bytes(data)


def _recovers_every_intact_sample(path, data: bytes, spans: list[bytes], hit: int) -> None:
    """Asked first, rebuild_index refuses and changes nothing; with drop_damaged, every
    sample but ``hit`` comes back byte for byte, and the original is kept."""
    with pytest.raises(DamagedDataError):
        rebuild_index(path)
    assert path.read_bytes() == data and os.listdir(path.parent) == ["set.msgpack"]
    report = rebuild_index(path, drop_damaged=True)
    with MsgpackReader(path) as reader:
        assert list(reader.iter(raw=True)) == spans[:hit] + spans[hit + 1:]
    assert report.backup.read_bytes() == data


def test_later_samples_with_a_field_the_first_ones_lack_are_found_after_damage(tmp_path):
    """Regression: a str32 header at sample 59 claims more bytes than the file has; the
    samples after it have a field that none before had, so the scan took all of them for
    that incomplete sample and cut 60 intact samples off, exit 0."""
    spans = [pack_sample({"key": f"k{i:03d}", "x": bytes(50), **({"extra": i} if i >= 60 else {})})
             for i in range(120)]
    path, data = _one_byte_changed(tmp_path, spans, 59, 0xDB)
    _recovers_every_intact_sample(path, data, spans, 59)


def test_samples_over_1_mib_and_twice_the_largest_before_are_found_after_damage(tmp_path):
    """Regression: samples of 3 MiB after samples of 1 KB were not looked for after damage,
    and 9 MiB of whole samples were cut off as an incomplete one."""
    rng = np.random.default_rng(3)
    spans = [pack_sample({"key": f"k{i}", "x": rng.bytes(1000 if i < 5 else 3 << 20)})
             for i in range(8)]
    path, data = _one_byte_changed(tmp_path, spans, 4, 0xDB)
    _recovers_every_intact_sample(path, data, spans, 4)


def test_drop_damaged_keeps_samples_with_fields_seen_once_before(tmp_path):
    """Regression: one byte changed in sample 5, every 7th sample with an extra field: with
    drop_damaged, samples 6 and 7 (a field seen once before) went into the damaged region."""
    rng = np.random.default_rng(0)
    spans = [pack_sample({"key": f"k{i}", "x": rng.bytes(30), **({"extra": i} if i % 7 == 0 else {})})
             for i in range(100)]
    path, data = _one_byte_changed(tmp_path, spans, 5, 0xC1)
    _recovers_every_intact_sample(path, data, spans, 5)


def test_a_sample_swallowed_by_a_damaged_length_is_found(tmp_path):
    """A bin length made longer swallows the next sample whole, and the damaged sample still
    decodes; the swallowed one begins inside the bytes of that bin, where no value of the
    damaged sample begins, so it is a sample of its own."""
    spans = [pack_sample({"key": f"k{i}", "x": bytes([i]) * 20}) for i in range(6)]
    data = bytearray(b"".join(spans))
    length_at = len(b"".join(spans[:2])) + spans[2].index(b"\xc4\x14") + 1
    data[length_at] += len(spans[3])  # sample 2's bin now holds sample 3 whole
    path = tmp_path / "set.msgpack"
    path.write_bytes(data)
    report = rebuild_index(path, drop_damaged=True)
    assert report.damaged[0].reason.startswith("a sample that holds whole samples")
    with MsgpackReader(path) as reader:
        assert list(reader.iter(raw=True)) == spans[:2] + spans[3:]


def test_maps_nested_in_a_list_are_not_samples_after_damage(tmp_path):
    spans = [pack_sample({"key": f"n{i}", "objects": [{"key": f"o{i}-{j}", "n": j} for j in range(3)],
                          "blob": bytes(20)}) for i in range(6)]
    path, data = _one_byte_changed(tmp_path, spans, 2, 0xC1)
    _recovers_every_intact_sample(path, data, spans, 2)


def test_what_cannot_be_told_is_refused_even_with_drop_damaged(tmp_path):
    """After damage, the sample where samples begin again holds a map with a "key" as its
    last field, back to back with its end: so would a damaged sample that swallowed an
    intact one. Without the old index, nothing tells them apart."""
    spans = [pack_sample({"key": f"n{i}", "meta": {"key": f"m{i}"}}) for i in range(4)]
    path, data = _one_byte_changed(tmp_path, spans, 1, 0xC1)
    for drop in (False, True):
        with pytest.raises(UndecidedDataError, match="cannot be told, so nothing was changed"):
            rebuild_index(path, drop_damaged=drop)
        assert path.read_bytes() == data and os.listdir(tmp_path) == ["set.msgpack"]


def test_a_tail_where_a_sample_decodes_is_not_cut(tmp_path):
    """Sample 1's header claims more than the file holds; sample 2 is intact, and an
    incomplete message follows it: sample 2 may be intact, so nothing is cut unasked."""
    spans = [pack_sample({"key": f"k{i}", "x": bytes(9)}) for i in range(3)]
    path, data = _one_byte_changed(tmp_path, spans, 1, 0xDB)
    path.write_bytes(data + spans[0][:5])
    with pytest.raises(DamagedDataError, match=f"a sample at byte {2 * len(spans[0])} decodes, "
                                               "but what follows it runs past the end"):
        rebuild_index(path)
    assert os.path.getsize(path) == len(data) + 5


def test_the_incomplete_sample_cut_off_is_kept(tmp_path):
    samples = make_samples(4)
    path = write(tmp_path / "set.msgpack", samples)
    whole = open(path, "rb").read()
    os.truncate(path, len(whole) - 3)
    report = rebuild_index(path)
    last = len(pack_sample(samples[-1]))
    assert report.cut_copy == tmp_path / "set.msgpack.incomplete"
    assert report.cut_copy.read_bytes() == whole[-last:-3]
    with open(path, "ab") as file:  # cut again: the name of the copy is taken
        file.write(b"\x82")
    with pytest.raises(FileExistsError, match="set.msgpack.incomplete"):
        rebuild_index(path)
    assert os.path.getsize(path) == len(whole) - last + 1
    assert rebuild_index(path, cut_copy=tmp_path / "second").cut_copy.read_bytes() == b"\x82"


def test_a_packed_sample_kept_as_bytes_in_the_last_field_is_no_damage(tmp_path):
    """A sample whose last field is another sample packed as bytes holds a sample up to its
    end, as a sample that swallowed the next does; but it begins where the bytes do."""
    samples = [{"key": f"k{i}", "raw": pack_sample({"key": f"inner{i}", "n": i})} for i in range(5)]
    path = write(tmp_path / "set.msgpack", samples)
    for file in (*DatasetFiles(path).index_files, DatasetFiles(path).md5):
        file.unlink()
    report = rebuild_index(path)
    assert report.samples == 5 and not report.damaged
    assert list(MsgpackReader(path)) == samples


def test_an_old_index_that_confirms_a_sample_holding_samples_is_believed(tmp_path):
    """The same samples with their old index: the scan does not stop at them (it looped)."""
    samples = [{"key": f"k{i}", "meta": {"key": f"m{i}"}, "raw": pack_sample({"key": f"r{i}"})[1:]}
               for i in range(3)]
    samples.append({"key": "last", "raw": b"\x00" + pack_sample({"key": "inner"})})
    path = write(tmp_path / "set.msgpack", samples)
    data = open(path, "rb").read()
    with open(path, "r+b") as file:  # damage in the first sample: the scan searches again
        file.seek(0)
        file.write(b"\xc1")
    report = rebuild_index(path, drop_damaged=True)
    assert report.samples == 3 and report.damaged[0].start == 0
    assert [s["key"] for s in MsgpackReader(path)] == ["k1", "k2", "last"]
    assert len(data) == os.path.getsize(str(path) + ".damaged")
