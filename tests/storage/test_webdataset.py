"""WebDataset tar shards: TarReader and WebDatasetReader against the webdataset and wids
packages, which write and read the same shards; damaged shards."""

import io
import os
import pickle
import shutil
import tarfile

import numpy as np
import pytest
import torch
import webdataset
import wids

import fpipe.torch
from fpipe.errors import FormatError
from fpipe.formats import TarReader, WebDatasetReader, decode_field, encode_field
from fpipe.orderings import QuasiShuffler, Shuffler
from fpipe.remote import RemoteOptions

N_SHARDS, PER_SHARD = 3, 40


def _sample(shard: int, i: int) -> dict:
    rng = np.random.default_rng(shard * 1000 + i)
    return {"__key__": f"s{shard}/{i:04d}", "jpg": rng.bytes(int(rng.integers(0, 3000))),
            "cls": str(i % 5).encode(), "meta.json": b'{"n": %d}' % i}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Shards written by webdataset's own TarWriter."""
    folder = tmp_path_factory.mktemp("wds")
    for shard in range(N_SHARDS):
        with webdataset.TarWriter(str(folder / f"train-{shard:03d}.tar")) as sink:
            for i in range(PER_SHARD):
                sink.write(_sample(shard, i))
    return folder


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


def key_of(sample: dict) -> str:
    return sample["key"]


def _ours(sample: dict) -> dict:
    return {"key": sample["__key__"], **{k: v for k, v in sample.items() if not k.startswith("__")}}


def test_iteration_matches_webdataset(shards, cache):
    pattern = str(shards / "train-{000..002}.tar")
    theirs = [_ours(s) for s in webdataset.WebDataset(pattern, shardshuffle=False)]
    reader = WebDatasetReader(pattern, remote=RemoteOptions(cache_dir=cache))
    assert len(reader) == N_SHARDS * PER_SHARD == len(theirs)
    assert list(reader) == theirs
    assert list(reader.iter(chunk_size=7)) == theirs
    assert reader.get_slice(35, 45) == theirs[35:45]


def test_random_access_matches_wids(shards, cache):
    spec = [{"url": str(shards / f"train-{s:03d}.tar"), "nsamples": PER_SHARD} for s in range(N_SHARDS)]
    theirs = wids.ShardListDataset(spec, cache_dir=str(cache / "wids"), transformations=[])
    reader = WebDatasetReader(sorted(str(p) for p in shards.glob("*.tar")),
                              remote=RemoteOptions(cache_dir=cache))
    for i in np.random.default_rng(0).permutation(len(reader))[:50].tolist():
        their = theirs[i]
        assert reader[i] == {"key": their["__key__"], **{extension.lstrip("."): _bytes(value)
                                                          for extension, value in their.items()
                                                          if not extension.startswith("__")}}


def _bytes(value) -> bytes:
    return value.read() if hasattr(value, "read") else bytes(value)


def test_keys_slices_negative_and_raw(shards, cache):
    reader = WebDatasetReader(str(shards / "train-*.tar"), remote=RemoteOptions(cache_dir=cache))
    assert reader.find_index("s1/0003") == PER_SHARD + 3 and "s2/0039" in reader
    assert "s9/0000" not in reader and 7 not in reader
    with pytest.raises(KeyError):
        reader.find_index("nope")
    assert reader.find_key(-1) == "s2/0039" and reader[-1]["key"] == "s2/0039"
    assert reader[10:2:-3] == [reader[i] for i in (10, 7, 4)]
    key, raw = reader.get(5, yield_key=True, raw=True)
    assert key == "s0/0005" and fpipe.dataset.unpack_sample(raw) == reader[5]
    assert list(reader.iter(3, 6, yield_key=True)) == [(reader.find_key(i), reader[i]) for i in range(3, 6)]


def test_decode_and_fields(shards, cache):
    reader = TarReader(shards / "train-000.tar", decode=True, fields=["cls", "meta.json"],
                       remote=RemoteOptions(cache_dir=cache))
    assert reader[7] == {"key": "s0/0007", "cls": 2, "meta.json": {"n": 7}}
    for extension, value in [("cls", 3), ("x.txt", "héllo"), ("a.json", [1, {"b": None}]),
                             ("npy", np.arange(6.0).reshape(2, 3)), ("mp", {"k": [1, 2]}), ("jpg", b"\xff")]:
        back = decode_field(extension, encode_field(extension, value))
        assert (back == value).all() if isinstance(value, np.ndarray) else back == value
    with pytest.raises(TypeError, match="field 'label' holds int"):
        encode_field("label", 3)


def test_a_tar_reader_holds_no_python_object_per_member(shards, cache):
    # design rule 6: a forked worker that reads a shard touches what its reader holds, so a
    # container of one object per member would be copied into every worker
    reader = TarReader(str(shards / "train-000.tar"), remote=RemoteOptions(cache_dir=cache))
    for state in (vars(reader), vars(pickle.loads(pickle.dumps(reader)))):
        containers = {name: len(value) for name, value in state.items()
                      if isinstance(value, (list, tuple, dict, set))}
        # a few items each (the index's views, the distinct extensions); the shard has 120 members
        assert max(containers.values()) <= 8, containers
    assert reader[7] == _ours(_sample(0, 7))


def test_index_is_built_once_and_reused(shards, cache, monkeypatch):
    TarReader(shards / "train-001.tar", remote=RemoteOptions(cache_dir=cache))
    import fpipe.formats.webdataset as module

    def fail(source):
        raise AssertionError("the index was built again")
    monkeypatch.setattr(module, "_build_tar_index", fail)
    assert len(TarReader(shards / "train-001.tar", remote=RemoteOptions(cache_dir=cache))) == PER_SHARD


def test_pickles_into_dataloader_workers(shards, cache):
    reader = WebDatasetReader(str(shards / "train-*.tar"), remote=RemoteOptions(cache_dir=cache))
    again = pickle.loads(pickle.dumps(reader))
    assert again[50] == reader[50]
    dataset = fpipe.torch.Dataset(Shuffler(reader, seed=1), transforms=key_of)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2,
                                         multiprocessing_context="spawn")
    seen = [key for batch in loader for key in batch]
    assert sorted(seen) == sorted(reader.find_key(i) for i in range(len(reader)))


def test_orderings_work_on_shards(shards, cache):
    reader = WebDatasetReader(str(shards / "train-*.tar"), remote=RemoteOptions(cache_dir=cache))
    keys = [s["key"] for s in QuasiShuffler(reader, buf_size=16, chunk_size=4, seed=0)]
    assert sorted(keys) == sorted(reader.find_key(i) for i in range(len(reader)))


def _tar(path, members):
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_long_names_pax_headers_and_skipped_members(tmp_path, cache):
    long = "d" * 120 + "/x"
    path = tmp_path / "names.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [(long + ".txt", b"long"), ("ü/ß.txt", b"pax"), ("README", b"no dot"),
                           ("__meta__.json", b"{}")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
    reader = TarReader(path, remote=RemoteOptions(cache_dir=cache))
    assert list(reader) == [{"key": long, "txt": b"long"}, {"key": "ü/ß", "txt": b"pax"}]
    gnu = tmp_path / "gnu.tar"
    _tar(gnu, [(long + ".txt", b"long")])
    assert TarReader(gnu, remote=RemoteOptions(cache_dir=cache))[0] == {"key": long, "txt": b"long"}


# --- damage ----------------------------------------------------------------------------------

def _members(n):
    return [(f"{i:03d}.{ext}", bytes([i]) * 700) for i in range(n) for ext in ("jpg", "cls")]


def test_truncated_tar_keeps_the_samples_before_and_names_the_cut_one(tmp_path, cache):
    path = tmp_path / "cut.tar"
    _tar(path, _members(5))
    data = path.read_bytes()
    # cut inside the data of sample 3's second member
    cut_at = data.index(b"\x03" * 700) + 1536 + 100
    path.write_bytes(data[:cut_at])
    reader = TarReader(path, remote=RemoteOptions(cache_dir=cache))
    assert len(reader) == 4 and [s["key"] for s in reader.iter(0, 3)] == ["000", "001", "002"]
    cut = r"cut\.tar: sample 3 at byte \d+: truncated: member '003\.cls'"
    with pytest.raises(FormatError, match=cut) as error:
        reader[3]
    assert error.value.index == 3 and error.value.path == str(path)
    got = []
    with pytest.raises(FormatError):
        for sample in reader:
            got.append(sample["key"])
    assert got == ["000", "001", "002"]


def test_tar_cut_between_samples_loses_no_whole_sample(tmp_path, cache):
    path = tmp_path / "cut.tar"
    _tar(path, _members(3))
    data = path.read_bytes()
    start_of_two = data.index(b"002.jpg")
    path.write_bytes(data[:start_of_two + 300])  # inside sample 2's first header
    reader = TarReader(path, remote=RemoteOptions(cache_dir=cache))
    assert [s["key"] for s in reader.iter(0, 2)] == ["000", "001"] and len(reader) == 3
    with pytest.raises(FormatError, match="sample 2 .*truncated"):
        reader[2]


def test_corrupt_header_is_an_error_for_the_sample_it_may_cut(tmp_path, cache):
    path = tmp_path / "bad.tar"
    _tar(path, _members(3))
    data = bytearray(path.read_bytes())
    header = data.index(b"002.jpg")
    data[header + 130] ^= 0x55  # the size field: the checksum no longer matches
    path.write_bytes(bytes(data))
    reader = TarReader(path, remote=RemoteOptions(cache_dir=cache))
    assert reader[0]["key"] == "000"
    with pytest.raises(FormatError, match="sample 1 .*checksum"):
        reader[1]


def test_missing_field_names_file_sample_and_field(tmp_path, cache):
    path = tmp_path / "fields.tar"
    _tar(path, [("a.jpg", b"1"), ("a.cls", b"0"), ("b.jpg", b"2"), ("c.jpg", b"3"), ("c.cls", b"1")])
    reader = TarReader(path, fields=["jpg", "cls"], remote=RemoteOptions(cache_dir=cache))
    assert reader[0] == {"key": "a", "jpg": b"1", "cls": b"0"}
    missing = r"fields\.tar: sample 1 at byte \d+: sample 'b' has no field 'cls'"
    with pytest.raises(FormatError, match=missing):
        reader[1]
    assert reader[2]["cls"] == b"1"


def test_duplicate_member_is_an_error(tmp_path, cache):
    path = tmp_path / "dup.tar"
    _tar(path, [("a.jpg", b"1"), ("a.jpg", b"2")])
    with pytest.raises(FormatError, match="sample 0 .*a.jpg is twice"):
        TarReader(path, remote=RemoteOptions(cache_dir=cache))[0]


def test_on_error_skip_goes_past_the_bad_sample(tmp_path, cache):
    path = tmp_path / "fields.tar"
    _tar(path, [("a.jpg", b"1"), ("a.cls", b"0"), ("b.jpg", b"2"), ("c.jpg", b"3"), ("c.cls", b"1")])
    reader = TarReader(path, fields=["jpg", "cls"], remote=RemoteOptions(cache_dir=cache))
    skip = fpipe.torch.Samples(on_error="skip")
    mapped = fpipe.torch.Dataset(reader, transforms=key_of, samples=skip)
    assert [k for batch in torch.utils.data.DataLoader(mapped, batch_size=3) for k in batch] == ["a", "c"]
    iterable = fpipe.torch.IterableDataset(reader, transforms=key_of, samples=skip)
    assert list(iterable) == ["a", "c"] and iterable.skipped == 1


def test_not_a_file_and_no_match(tmp_path, cache):
    with pytest.raises(IsADirectoryError):
        TarReader(tmp_path, remote=RemoteOptions(cache_dir=cache))
    with pytest.raises(FileNotFoundError):
        WebDatasetReader(str(tmp_path / "none-*.tar"), remote=RemoteOptions(cache_dir=cache))
    with pytest.raises(FileNotFoundError):
        WebDatasetReader(str(tmp_path / "none-{0..2}.tar"), remote=RemoteOptions(cache_dir=cache))
    with pytest.raises(ValueError, match="only applies to URLs"):
        TarReader(os.devnull, remote=RemoteOptions(block_size=10))


def test_a_shard_cut_at_a_member_boundary_does_not_pass_for_whole(tmp_path, cache):
    path = tmp_path / "boundary.tar"
    _tar(path, [("a.jpg", b"1" * 600), ("a.cls", b"0"), ("b.jpg", b"2" * 600), ("b.cls", b"1")])
    data = path.read_bytes()
    path.write_bytes(data[:data.index(b"b.cls")])  # b.jpg whole, b.cls and the end blocks gone
    reader = TarReader(path, remote=RemoteOptions(cache_dir=cache))
    assert reader[0] == {"key": "a", "jpg": b"1" * 600, "cls": b"0"}
    with pytest.raises(FormatError, match="sample 1 .*without its end-of-archive blocks"):
        reader[1]


def test_export_refuses_a_sample_with_nothing_but_its_key(tmp_path):
    with pytest.raises(ValueError, match="sample 'b' has no field besides its key"):
        fpipe.formats.write_webdataset([{"key": "a", "x.txt": "1"}, {"key": "b"}],
                                       str(tmp_path / "s-%d.tar"))
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_index_in_the_cache_is_built_again(shards, cache):
    reader = TarReader(shards / "train-002.tar", remote=RemoteOptions(cache_dir=cache))
    (stored,) = (cache / "indexes").iterdir()
    data = bytearray(stored.read_bytes())
    data[-8:] = (2**40).to_bytes(8, "little")  # the last damage entry: a sample far away
    stored.write_bytes(bytes(data))
    again = TarReader(shards / "train-002.tar", remote=RemoteOptions(cache_dir=cache))
    assert list(again) == list(reader)
    stored.write_bytes(b"FPIPEIDX" + bytes(20))
    assert TarReader(shards / "train-002.tar", remote=RemoteOptions(cache_dir=cache))[-1] == reader[-1]


# --- tiny members kept in the index ----------------------------------------------------------

class _CountedReads:
    """A ByteSource's ``read``, counting its calls."""

    def __init__(self, read):
        self.read, self.calls = read, 0

    def __call__(self, start, stop):
        self.calls += 1
        return self.read(start, stop)


def _count_reads(reader):
    counted = reader.source.read = _CountedReads(reader.source.read)
    return counted


def test_a_sample_of_an_image_and_tiny_members_costs_one_read(shards, cache):
    reader = TarReader(shards / "train-000.tar", remote=RemoteOptions(cache_dir=cache))
    theirs = [_ours(s) for s in webdataset.WebDataset(str(shards / "train-000.tar"), shardshuffle=False)]
    counted = _count_reads(reader)
    ours = [reader[i] for i in range(PER_SHARD)]
    assert ours == theirs
    # cls and meta.json (at most 64 bytes) come from the index; a jpg is read unless it is tiny too
    assert counted.calls == sum(1 for sample in theirs if len(sample["jpg"]) > 64) > PER_SHARD // 2
    assert all(type(sample[field]) is bytes for sample in ours for field in ("jpg", "cls", "meta.json"))


def test_the_bytes_kept_in_the_index_are_bounded(tmp_path, cache, monkeypatch):
    import fpipe.formats.webdataset as module

    path = tmp_path / "small.tar"
    members = [(f"{i:03d}.{ext}", data) for i in range(10)
               for ext, data in (("cls", b"%d" % i), ("txt", bytes(64)), ("big", bytes(65)))]
    _tar(path, members)
    monkeypatch.setattr(module, "_INLINE_LIMIT", 3 * 65)  # room for three samples' tiny members
    reader = TarReader(path, remote=RemoteOptions(cache_dir=cache))
    counted = _count_reads(reader)
    samples = [reader[i] for i in range(10)]
    assert samples == [{"key": f"{i:03d}", "cls": b"%d" % i, "txt": bytes(64), "big": bytes(65)}
                       for i in range(10)]
    assert counted.calls == 3 * 1 + 7 * 3  # 65-byte members always read; tiny ones past the limit too


def _stored_index(cache):
    from fpipe.formats._foreign import _index_bytes, _load_index

    (stored,) = (cache / "indexes").iterdir()
    return stored, {name: array.copy() for name, array in _load_index(stored.read_bytes()).items()}, \
        _index_bytes


@pytest.mark.parametrize("damage", ["older", "past the blob", "too big"])
def test_an_index_whose_kept_members_do_not_fit_is_built_again(shards, cache, damage):
    reader = TarReader(shards / "train-002.tar", remote=RemoteOptions(cache_dir=cache))
    stored, index, index_bytes = _stored_index(cache)
    kept = np.flatnonzero(index["inline_at"] >= 0)
    if damage == "older":  # an index of an fpipe that kept no member in it
        del index["inline_at"], index["inline_blob"]
    elif damage == "past the blob":
        index["inline_at"][kept[-1]] = len(index["inline_blob"])
    else:
        index["sizes"][kept[0]] = 65
    stored.write_bytes(index_bytes(index))
    again = TarReader(shards / "train-002.tar", remote=RemoteOptions(cache_dir=cache))
    assert list(again) == list(reader) and [again[i] for i in range(PER_SHARD)] == list(reader)
    assert (again._inline_at >= 0).sum() == len(kept)



def _shard_of(path, names_and_labels) -> None:
    with tarfile.open(path, "w") as tar:
        for name, label in names_and_labels:
            for extension, data in (("jpg", name.encode() * 50), ("cls", label)):
                info = tarfile.TarInfo(f"{name}.{extension}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("change_time", ["seen", "the same"])
@pytest.mark.parametrize("new", [[("b1", b"7"), ("b2", b"8")], [("a1", b"7"), ("a2", b"8")]],
                         ids=["other keys", "other labels"])
def test_a_shard_copied_over_keeping_size_and_times_gets_a_new_index(tmp_path, cache, monkeypatch,
                                                                      change_time, new):
    shard, other = tmp_path / "shard.tar", tmp_path / "other.tar"
    _shard_of(shard, [("a1", b"1"), ("a2", b"2")])
    _shard_of(other, new)
    assert shard.stat().st_size == other.stat().st_size
    if change_time == "the same":  # a file system whose change times do not tell (the digest does)
        import types

        import fpipe.formats._foreign as foreign

        real = foreign._stat_file
        monkeypatch.setattr(foreign, "_stat_file", lambda path: types.SimpleNamespace(
            **{name: getattr(real(path), name) for name in ("st_size", "st_mtime_ns", "st_ino")},
            st_ctime_ns=0))
    assert TarReader(shard,
                     remote=RemoteOptions(cache_dir=cache))[1] == {"key": "a2", "jpg": b"a2" * 50,
                                          "cls": b"2"}
    inode, times = shard.stat().st_ino, (shard.stat().st_atime_ns, shard.stat().st_mtime_ns)
    shutil.copyfile(other, shard)  # as cp -p does: the same file, its times put back
    os.utime(shard, ns=times)
    assert shard.stat().st_ino == inode
    name, label = new[1]
    assert TarReader(shard,
                     remote=RemoteOptions(cache_dir=cache))[1] == {"key": name, "jpg": name.encode() * 50,
                                          "cls": label}


@pytest.mark.parametrize("data", [b"my notes\nline two\n" * 40, b"short notes\n"])
def test_a_file_that_is_not_a_tar_raises_format_error_naming_it(tmp_path, cache, data):
    path = tmp_path / "notes.tar"
    path.write_bytes(data)
    with pytest.raises(FormatError, match=r"notes\.tar: byte 0: (not a tar file|truncated)") as error:
        TarReader(path, remote=RemoteOptions(cache_dir=cache))
    assert error.value.path == str(path)


def test_a_zeroed_header_is_damage_not_the_end_of_the_shard(tmp_path, cache):
    path = tmp_path / "zeroed.tar"
    _tar(path, _members(4))
    data = bytearray(path.read_bytes())
    header = data.index(b"002.cls") // 512 * 512
    data[header:header + 512] = bytes(512)  # sample 2 loses its label, and 3 would be lost
    path.write_bytes(bytes(data))
    reader = TarReader(path, remote=RemoteOptions(cache_dir=cache))
    assert [reader[i]["key"] for i in range(2)] == ["000", "001"]
    with pytest.raises(FormatError, match=r"zeroed\.tar: sample 2 .*a zero block at byte \d+ with more"):
        reader[2]


@pytest.mark.parametrize("typeflag, data_follows", [(b"5", False), (b"2", False), (b"S", None)])
def test_a_member_type_without_data_skips_nothing_and_a_sparse_one_is_refused(
        tmp_path, cache, typeflag, data_follows):
    """As tarfile reads them: a folder's or a link's size says nothing (no data follows its
    header); a sparse member is not read, and is damage rather than a member left out."""
    path = tmp_path / "types.tar"
    _tar(path, [("000.jpg", b"a" * 10), ("000.cls", b"1"), ("001.jpg", b"b")])
    data = bytearray(path.read_bytes())
    header = data.index(b"000.cls") // 512 * 512
    data[header + 156:header + 157] = typeflag
    data[header + 148:header + 156] = b" " * 8
    data[header + 148:header + 156] = b"%06o\0 " % sum(data[header:header + 512])
    path.write_bytes(bytes(data))
    if data_follows is None:
        with pytest.raises(FormatError, match="a sparse file"):
            TarReader(path, remote=RemoteOptions(cache_dir=cache))[0]
        return
    with tarfile.open(path) as tar:
        theirs = [m.name for m in tar if m.isreg()]
    assert theirs == ["000.jpg"]  # its data block, read as a header, ends the archive
    with pytest.raises(FormatError, match="sample 0 .*checksum"):
        TarReader(path, remote=RemoteOptions(cache_dir=cache))[0]


def _pax_header(records: bytes) -> bytes:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(records)
    return info.tobuf(tarfile.USTAR_FORMAT) + records + bytes(-len(records) % 512)


@pytest.mark.parametrize("records, reason", [
    (b"18 path=other.jpg\n", "two headers in a row"),  # a second pax header before the member
    (b"18 path=other.jpg", "does not parse"),  # no newline, and a length that runs past it
    (b"18 path=other.jpg\n" + b"x", "does not parse"),  # more than records
    (b"22 GNU.sparse.size=10\n", "sparse"),
])
def test_pax_headers_that_tarfile_would_read_otherwise_are_damage(tmp_path, cache, records, reason):
    path = tmp_path / "pax.tar"
    _tar(path, [("000.jpg", b"a"), ("000.cls", b"1")])
    data = path.read_bytes()
    info = tarfile.TarInfo("000.txt")
    info.size = 2
    member = info.tobuf(tarfile.USTAR_FORMAT) + b"hi" + bytes(510)
    second = b"" if "two" not in reason else _pax_header(b"18 path=first.jpg\n")
    end = data.index(bytes(1024), data.index(b"000.cls") // 512 * 512 + 1024)
    path.write_bytes(data[:end] + second + _pax_header(records) + member + bytes(1024))
    reader = TarReader(path, remote=RemoteOptions(cache_dir=cache))
    with pytest.raises(FormatError, match=f"pax\\.tar: sample 0 .*{reason}"):
        list(reader)
