"""Hostile files: the reader fuzzed with damaged copies of a valid dataset, random data and
index files, hostile samples, offsets that point anywhere, and lengths of gigabytes.

Every read answers what the format says the bytes hold (see ``files.Oracle``) or raises
FormatError or FileNotFoundError; no read hangs (the module runs under a timeout), crashes
the interpreter, or allocates more than ``files.allocation_limit`` of the data file's size.
The ``soak`` variants run the same fuzzers thirty times longer.
"""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpipe.dataset import MsgpackReader, unpack_sample
from fpipe.dataset.format import MAX_EMPTY_ITEMS, pack_sample, write_index
from fpipe.errors import FormatError

from .files import (
    KEY_INDEX_LEFT_ASIDE,
    MSGPACK_DEPTH,
    MSGPACK_PREALLOC,
    allocation_limit,
    check_reader,
    file_bytes,
    put_files,
    write_dataset,
)

pytestmark = [pytest.mark.timeout(600), KEY_INDEX_LEFT_ASIDE]

SUFFIXES = ["", ".offsets", ".keys", ".key_hashes", ".filter", ".md5", ".index"]


def base_samples() -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"key": f"k{i}", "n": i, "x": rng.normal(size=i % 4).astype("<f4"),
             "grid": np.arange(i % 3 * 2, dtype="<i2").reshape(-1, 2),
             "rec": np.zeros(1, dtype=[("a", "<u2"), ("b", "S2")]), "payload": rng.bytes(i % 9),
             "tags": ["t", i, 1.5, None, True]} for i in range(12)]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, bytes]:
    """The files of a valid dataset, and a legacy ``.index`` of the same samples."""
    path = write_dataset(tmp_path_factory.mktemp("good") / "base.msgpack", base_samples())
    contents = file_bytes(path)
    offsets = np.frombuffer(contents[".offsets"], ">u8").tolist()
    keys = msgpack.unpackb(contents[".keys"])
    contents[".index"] = msgpack.packb(dict(zip(keys, offsets)))
    return contents


def fuzz(strategy, check, examples: int) -> int:
    """Run ``check`` on ``examples`` cases drawn from ``strategy``; return how many ran."""
    ran = 0

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(case):
        nonlocal ran
        ran += 1
        check(case)

    run()
    return ran


def examples(default: int) -> list:
    return [pytest.param(default, id="default"),
            pytest.param(30 * default, id="soak", marks=pytest.mark.soak)]


class Reads:
    """Runs ``check_reader`` on each case with tracemalloc on, and keeps the figures."""

    def __init__(self, folder) -> None:
        self.path, self.reads, self.worst = folder / "t.msgpack", 0, 0.0
        self.warm = False

    def __call__(self, contents: dict[str, bytes]) -> None:
        put_files(self.path, contents)
        size = sum(map(len, contents.values()))
        if not self.warm:
            # the first read imports and caches lazily (megabytes); keep that out of the figures
            check_reader(self.path, contents)
            self.warm = True
        tally = self._traced(contents)
        if tally.peak > allocation_limit(size):
            # a read path taken for the first time imports and caches lazily (megabytes,
            # once per process); an allocation driven by the files recurs on a second read
            tally = self._traced(contents)
        assert tally.peak <= allocation_limit(size), f"a read allocated {tally.peak} bytes"
        self.reads += tally.reads
        self.worst = max(self.worst, tally.peak / allocation_limit(size))

    def _traced(self, contents: dict[str, bytes]):
        tracemalloc.start()
        try:
            return check_reader(self.path, contents)
        finally:
            tracemalloc.stop()


def _report(record, check: str, ran: int, reads: Reads) -> None:
    record(check, tried=ran, reads=reads.reads,
           worst_share_of_allocation_limit=round(reads.worst, 4))


# --- damaged copies of a valid dataset ---------------------------------------------------


@st.composite
def damaged(draw, good: dict[str, bytes]) -> dict[str, bytes]:
    """``good`` with one to three files flipped, cut, replaced, extended or removed; with a
    legacy index instead of ``.offsets`` now and then."""
    contents = dict(good)
    if draw(st.booleans()):
        contents.pop(".index")
    else:
        contents.pop(".offsets")
    for _ in range(draw(st.integers(1, 3))):
        suffix = draw(st.sampled_from(SUFFIXES))
        contents = _damage(draw, contents, suffix)
    return contents


def _damage(draw, contents: dict[str, bytes], suffix: str) -> dict[str, bytes]:
    data = bytearray(contents.get(suffix, b""))
    kind = draw(st.sampled_from(["flip", "cut", "replace", "extend", "remove"]))
    if kind == "flip" and data:
        for bit in draw(st.lists(st.integers(0, 8 * len(data) - 1), min_size=1, max_size=4)):
            data[bit // 8] ^= 1 << (bit % 8)
    elif kind == "cut":
        data = data[:draw(st.integers(0, len(data)))]
    elif kind == "replace":
        data = bytearray(draw(st.binary(max_size=400)))
    elif kind == "extend":
        data += draw(st.binary(min_size=1, max_size=40))
    if kind == "remove":
        return {k: v for k, v in contents.items() if k != suffix}
    return {**contents, suffix: bytes(data)}


@pytest.mark.parametrize("count", examples(250))
def test_damaged_copies_give_the_right_sample_or_format_error(good, tmp_path, record, count):
    reads = Reads(tmp_path)
    ran = fuzz(damaged(good), reads, count)
    _report(record, "bit flips, cuts, replaced, extended and missing files", ran, reads)


# --- random data and index files -----------------------------------------------------------


@st.composite
def random_data(draw) -> dict[str, bytes]:
    """Random bytes as the data file, with offsets at random (sorted or not) places in it."""
    data = draw(st.binary(max_size=600))
    cuts = draw(st.lists(st.integers(0, len(data) + 8), max_size=12))
    if draw(st.booleans()):
        cuts = sorted(cuts)
    offsets = np.array([0, *cuts], dtype=">u8").tobytes()
    return {"": data, ".offsets": offsets}


@pytest.mark.parametrize("count", examples(250))
def test_random_bytes_as_the_data_file(tmp_path, record, count):
    reads = Reads(tmp_path)
    ran = fuzz(random_data(), reads, count)
    _report(record, "random bytes as the data file", ran, reads)


msgpack_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
              st.text(max_size=6), st.binary(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.text(max_size=3), st.integers(-9, 9),
                                                      st.binary(max_size=2)), inner, max_size=3)),
    max_leaves=12)


@st.composite
def random_index(draw, good: dict[str, bytes]) -> dict[str, bytes]:
    """The valid data file with every index file random bytes or a random msgpack value."""
    contents = {"": good[""]}
    for suffix in SUFFIXES[1:]:
        choice = draw(st.sampled_from(["bytes", "msgpack", "keep", "remove"]))
        if choice == "bytes":
            contents[suffix] = draw(st.binary(max_size=300))
        elif choice == "msgpack":
            contents[suffix] = msgpack.packb(draw(msgpack_values))
        elif choice == "keep":
            contents[suffix] = good[suffix]
    return contents


@pytest.mark.parametrize("count", examples(250))
def test_random_index_files(good, tmp_path, record, count):
    reads = Reads(tmp_path)
    ran = fuzz(random_index(good), reads, count)
    _report(record, "random index files", ran, reads)


# --- hostile samples: maps that claim to be numpy values -----------------------------------

dtype_texts = st.one_of(
    st.sampled_from(["<f4", "<i2", "|u1", "O", "|O", "V0", "(0,)u1", "V3", "<M8[s]", "S3", "<U2", "(2,)f4",
                     "(100000000000,)f8", "xx", "", "b1", "<c8", "(3,)O", ",f4", "(3,", "05"]),
    st.text(max_size=6), st.binary(max_size=6), st.integers(-2, 300), st.none())
fields = st.one_of(
    st.tuples(st.one_of(st.text(max_size=3), st.binary(max_size=3), st.integers(-3, 3))),
    st.tuples(st.text(max_size=3), st.deferred(lambda: descriptions)),
    st.tuples(st.text(max_size=3), st.deferred(lambda: descriptions),
              st.one_of(st.integers(-2, 5), st.lists(st.integers(-2, 2**40), max_size=3))))
descriptions = st.one_of(dtype_texts, st.lists(fields, max_size=3))
numpy_maps = st.fixed_dictionaries(
    {b"nd": st.one_of(st.booleans(), st.none(), st.integers(0, 1))},
    optional={b"type": descriptions, b"kind": st.sampled_from([b"", b"V", b"O", b"x"]),
              b"data": st.one_of(st.binary(max_size=40), st.text(max_size=4), st.integers(-9, 9)),
              b"shape": st.one_of(st.lists(st.one_of(st.integers(-2, 2**63 - 1),
                                                     st.sampled_from([0, 1, 2**33, 2**62])),
                                           max_size=4),
                                  st.integers(-2, 10), st.text(max_size=2), st.none())})
complex_maps = st.fixed_dictionaries(
    {b"complex": st.booleans()},
    optional={b"data": st.one_of(st.text(max_size=10), st.binary(max_size=10), st.floats(),
                                 st.lists(st.integers(-9, 9), max_size=2))})
hostile_values = st.recursive(
    st.one_of(msgpack_values, numpy_maps, complex_maps),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=10)


@st.composite
def hostile_samples(draw) -> dict[str, bytes]:
    """A dataset of well-formed msgpack messages whose maps pretend to be numpy values."""
    messages = [msgpack.packb(value) for value in draw(st.lists(hostile_values, min_size=1,
                                                                max_size=6))]
    offsets = np.cumsum([0, *map(len, messages)]).astype(">u8").tobytes()
    return {"": b"".join(messages), ".offsets": offsets}


@pytest.mark.parametrize("count", examples(250))
def test_hostile_samples_decode_or_raise_format_error(tmp_path, record, count):
    reads = Reads(tmp_path)
    ran = fuzz(hostile_samples(), reads, count)
    _report(record, "samples that pretend to be numpy values", ran, reads)


def test_object_dtypes_and_deep_structured_dtypes_are_refused():
    """Regression: an object dtype over raw bytes crashed the interpreter (numpy read the
    bytes as pointers); a missing shape raised KeyError; deep nesting, RecursionError; a
    dtype string that numpy parses as a Python literal, SyntaxError."""
    deep = "<f4"
    for _ in range(400):
        deep = [["a", deep]]
    for value in [{b"nd": True, b"type": "|O", b"kind": b"", b"shape": [2], b"data": b"\x01" * 16},
                  {b"nd": True, b"type": [["a", "|O"]], b"kind": b"V", b"shape": [1],
                   b"data": b"\x01" * 8},
                  {b"nd": True, b"type": "<f4", b"kind": b"", b"data": b"\0" * 4},
                  {b"nd": False, b"type": deep, b"data": b"\0" * 4},
                  {b"nd": False, b"type": ",f4", b"data": b"\0" * 4}]:
        with pytest.raises(FormatError):
            unpack_sample(msgpack.packb(value))


# --- offsets that point anywhere -------------------------------------------------------------

offset_values = st.one_of(st.integers(0, 2000), st.integers(0, 2**64 - 1),
                          st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]))


@st.composite
def wild_offsets(draw, good: dict[str, bytes]) -> dict[str, bytes]:
    """The valid data file with offsets anywhere: backwards, past the end, enormous."""
    values = draw(st.lists(offset_values, min_size=1, max_size=15))
    return {**good, ".offsets": np.array(values, dtype=np.uint64).astype(">u8").tobytes()}


@pytest.mark.parametrize("count", examples(250))
def test_offsets_pointing_backwards_or_past_the_end(good, tmp_path, record, count):
    reads = Reads(tmp_path)
    ran = fuzz(wild_offsets(good), reads, count)
    _report(record, "offsets backwards, past the end, up to 2**64 - 1", ran, reads)


# --- lengths of gigabytes ---------------------------------------------------------------------

GIGANTIC = 2**32 - 1
HEADERS = {
    "bin 32": b"\xc6" + struct.pack(">I", GIGANTIC),
    "str 32": b"\xdb" + struct.pack(">I", GIGANTIC),
    "ext 32": b"\xc9" + struct.pack(">I", GIGANTIC) + b"\x01",
    "array 32": b"\xdd" + struct.pack(">I", GIGANTIC),
    "map 32": b"\xdf" + struct.pack(">I", GIGANTIC),
    "array of 2**32 - 2 arrays": b"\xdd" + struct.pack(">I", GIGANTIC - 1) * 200,
    "numpy shape of 2**40": msgpack.packb({b"nd": True, b"type": "<f8", b"kind": b"",
                                           b"shape": [2**40], b"data": b"\0" * 8})[:-2],
}


def _read_everything(path) -> tuple[list, list]:
    """Decode the dataset's one sample every way: each must raise FormatError; return the
    peaks of allocated memory, and the raw reads (which return the bytes as they are)."""
    reader = MsgpackReader(path)
    peaks = []
    for read in (lambda: reader.get(0), lambda: reader[:], lambda: list(reader),
                 lambda: reader.get_many([0])):
        tracemalloc.start()
        try:
            with pytest.raises(FormatError):
                read()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    return peaks, [reader.get(0, raw=True), *reader.iter(raw=True)]


@pytest.mark.parametrize("header", list(HEADERS))
def test_declared_lengths_of_gigabytes_allocate_nothing(tmp_path, header, record):
    path = tmp_path / "x.msgpack"
    body = b"\x82\xa3key\xa1a\xa4data" + HEADERS[header] + b"\0" * 20
    path.write_bytes(body)
    write_index(path, ["a"], [0, len(body)], "0" * 32)
    peaks, raw = _read_everything(path)
    assert max(peaks) < 1 << 20 and raw == [body, body]
    record(f"a declared length of 4 GiB ({header})", tried=len(peaks), peak_bytes=max(peaks))


def test_an_offset_of_exabytes_allocates_nothing(tmp_path, record):
    """Regression: a sequential read asked ``pread`` for the span the offsets claim, and
    Python allocates the whole buffer first (OverflowError, or gigabytes)."""
    path = tmp_path / "x.msgpack"
    write_dataset(path, [{"key": "a"}, {"key": "b"}])
    (tmp_path / "x.msgpack.offsets").write_bytes(np.array([0, 7, 2**62], ">u8").tobytes())
    reader = MsgpackReader(path)
    tracemalloc.start()
    try:
        assert reader.get(0) == {"key": "a"}
        for read in (lambda: list(reader), lambda: reader[:], lambda: reader.get(1),
                     lambda: list(reader.iter(raw=True, chunk_size=1))):
            with pytest.raises(FormatError, match="truncated") as raised:
                read()
            assert raised.value.index == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    record("an offset of 2**62 bytes", tried=5, peak_bytes=peak)


@pytest.mark.skipif(msgpack.version < (1, 2, 4),
                    reason="msgpack < 1.2.4 preallocates unfinished containers in full")
def test_unfinished_containers_stay_within_msgpack_s_preallocation_bound(tmp_path, record):
    """A sample that opens containers 1,024 deep, each claiming ten thousand slots or more, and
    never fills them: the preallocation msgpack does for them is the bound, whatever the size."""
    path = tmp_path / "x.msgpack"
    header = b"\xdd" + struct.pack(">I", 2 * MSGPACK_PREALLOC)
    body = header * ((1 << 20) // len(header))
    path.write_bytes(body)
    write_index(path, ["a"], [0, len(body)], "0" * 32)
    peaks, _ = _read_everything(path)
    bound = MSGPACK_DEPTH * 8 * MSGPACK_PREALLOC + 2 * len(body) + (1 << 20)
    assert max(peaks) <= bound
    record("1 MiB of array headers 1,024 deep", tried=len(peaks), peak_bytes=max(peaks),
           bound_bytes=bound)


# --- regressions: what the fuzzers found -------------------------------------------------------


@pytest.fixture
def two(tmp_path):
    """A dataset of two 7-byte samples, ``{"key": "a"}`` and ``{"key": "b"}``."""
    return write_dataset(tmp_path / "x.msgpack", [{"key": "a"}, {"key": "b"}])


def _offsets(path, values) -> None:
    (path.parent / (path.name + ".offsets")).write_bytes(np.array(values, ">u8").tobytes())


def test_a_span_past_the_end_is_not_decoded_from_the_bytes_that_are_there(two):
    """Regression: ``get`` decoded what the file held of a span that runs past its end, so a
    data file cut (or replaced) right after a complete message gave that message."""
    two.write_bytes(b"\x00")  # one complete message: the integer 0
    reader = MsgpackReader(two)
    for raw in (False, True):
        with pytest.raises(FormatError, match="truncated: sample ends at byte 7"):
            reader.get(0, raw=raw)
    _offsets(two, [9, 9, 9])  # empty spans, past the end
    with pytest.raises(FormatError, match="truncated"):
        MsgpackReader(two).get(0, raw=True)
    with pytest.raises(FormatError, match="truncated"):
        list(MsgpackReader(two).iter(raw=True))


@pytest.mark.parametrize("chunk_size", [1, 16])
@pytest.mark.parametrize("raw", [False, True])
def test_iteration_reads_up_to_decreasing_offsets_and_names_that_sample(two, chunk_size, raw):
    """Regression: a block was read up to the last offset of the chunk; when an offset in
    between was larger, samples before the damage raised, named as truncated."""
    _offsets(two, [0, 7, 0])
    reader = MsgpackReader(two)
    got = []
    with pytest.raises(FormatError, match="offsets decrease") as raised:
        got.extend(reader.iter(chunk_size=chunk_size, raw=raw))
    assert raised.value.index == 1 and len(got) == 1
    with pytest.raises(FormatError, match="offsets decrease") as raised:
        reader[:]
    assert raised.value.index == 1


@pytest.mark.parametrize("keys, match", [
    (b"\x92", "ends after 0 of 2 keys"),        # the header, and no keys
    (b"\x92\xa1a", "ends after 1 of 2 keys"),
    (b"\x92\xa1\xff\xa1b", "utf-8"),           # not UTF-8
    (b"\x92\xa1a\xa1b\x01\x02", None),          # trailing bytes are ignored
])
def test_a_keys_file_that_ends_early_or_is_not_utf8_raises_format_error(two, keys, match):
    """Regression: a keys file cut after its array header gave an IndexError at lookup, and
    invalid UTF-8 a UnicodeDecodeError."""
    (two.parent / "x.msgpack.keys").write_bytes(keys)
    reader = MsgpackReader(two)
    if match is None:
        assert [reader.find_key(0), reader.find_key(1)] == ["a", "b"]
        return
    with pytest.raises(FormatError, match=match):
        reader.find_key(0)


def test_a_legacy_index_with_keys_that_are_not_str_raises_format_error(two):
    """Regression: AttributeError ('int' object has no attribute 'encode')."""
    for name in ("offsets", "keys", "key_hashes", "filter"):
        (two.parent / f"x.msgpack.{name}").unlink()
    (two.parent / "x.msgpack.index").write_bytes(msgpack.packb({1: 0, 2: 7}))
    for read in (lambda: MsgpackReader(two).get(0), lambda: "a" in MsgpackReader(two)):
        with pytest.raises(FormatError, match="not a str"):
            read()


def test_an_md5_file_that_is_not_text_raises_format_error(two):
    """Regression: UnicodeDecodeError from ``verify_data``."""
    (two.parent / "x.msgpack.md5").write_bytes(b"\xff\xfe  x.msgpack\n")
    for verify in (MsgpackReader(two).verify_data, MsgpackReader(two).verify_index):
        with pytest.raises(FormatError, match="md5"):
            verify()


@pytest.mark.parametrize("index", ["legacy", "keys without key hashes"])
def test_the_same_key_twice_raises_format_error_at_once(two, index):
    """Regression: recomputing the key hashes tried 1,000 salts (minutes for a big dataset)
    and then raised RuntimeError."""
    if index == "legacy":
        for name in ("offsets", "keys", "key_hashes", "filter"):
            (two.parent / f"x.msgpack.{name}").unlink()
        (two.parent / "x.msgpack.index").write_bytes(b"\x82\xa1a\x00\xa1a\x07")
    else:  # the keys looked up in memory: no key index to search on disk
        for name in ("key_hashes", "key_index"):
            (two.parent / f"x.msgpack.{name}").unlink()
        (two.parent / "x.msgpack.keys").write_bytes(msgpack.packb(["a", "a"]))
    with pytest.raises(FormatError, match="'a' is there twice"):
        MsgpackReader(two).find_index("a")


def test_a_key_index_over_keys_changed_in_place_finds_no_wrong_sample(two):
    """The key index is trusted by the size and MD5 of the keys it indexed (reading every key
    to look for repeats would cost what the index saves): a lookup still gives a sample with
    that key; one that finds another key there leaves the key index aside, and the keys
    themselves, hashed anew (not the ``.key_hashes`` of the same age), are found repeated;
    ``fpipe verify`` reports the change."""
    (two.parent / "x.msgpack.keys").write_bytes(msgpack.packb(["a", "a"]))
    reader = MsgpackReader(two)
    assert reader.find_key(reader.find_index("a")) == "a"
    with pytest.warns(UserWarning, match="key_index: the key index names sample 1 for key 'b'"):
        with pytest.raises(FormatError, match=r"x.msgpack.keys: corrupt keys .*'a' is there twice"):
            reader.find_index("b")


# --- array maps whose shape claims more than their bytes hold ----------------------------------


def _array_map(type_, shape, data=b"", kind=b"") -> dict:
    return {b"nd": True, b"type": type_, b"kind": kind, b"shape": shape, b"data": data}


CLAIMED_SHAPES = {
    "2**62 items of V0 (the 58-byte sample)": _array_map("V0", [2**62]),
    "2**62 items of an empty structured dtype": _array_map([], [2**62], kind=b"V"),
    "2**62 items of a zero-size field": _array_map([["a", "V0"]], [2**62], kind=b"V"),
    "2**62 zero-length subarrays": _array_map("(0,)<f4", [2**62]),
    "a shape whose product overflows int64": _array_map("V0", [2**33, 2**33]),
    "1025 items of V0, one past the bound": _array_map("V0", [1025]),
    "a shape that is an int": _array_map("V0", 2**62),
    "a shape of floats": _array_map("<f4", [2.0], b"\0" * 8),
    "a shape of bools": _array_map("<f4", [True, True], b"\0" * 4),
    "a shape of 100,000 sizes": _array_map("V0", [2**62] * 100_000),
    "negative sizes": _array_map("<f4", [-2, -1], b"\0" * 8),
    "more bytes than the shape holds": _array_map("<f4", [1], b"\0" * 8),
    "fewer bytes than the shape holds": _array_map("<f4", [3], b"\0" * 8),
    "data that is text": _array_map("|u1", [2], "ab"),
    "a scalar with more bytes than its dtype": {b"nd": False, b"type": "<i2", b"data": b"\1" * 4},
}


@pytest.mark.parametrize("value", CLAIMED_SHAPES.values(), ids=list(CLAIMED_SHAPES))
def test_a_shape_is_checked_against_its_bytes_before_anything_is_made(value):
    """Regression: an array of 2**62 items of zero bytes (58 bytes on disk) decoded as a view,
    and its copy spun the CPU for ever, deaf to Ctrl-C; data longer than the shape gave the
    array its first bytes. The view is refused as well as the copy, with the sample named."""
    message = msgpack.packb({"key": "k0", "a": value})
    for copy in (False, True):
        with pytest.raises(FormatError, match=r"x.msgpack: sample 3 at byte 9: corrupt sample") as raised:
            unpack_sample(message, path="x.msgpack", index=3, offset=9, copy=copy)
        assert raised.value.index == 3


def test_arrays_of_zero_byte_items_round_trip_up_to_the_bound_and_the_writer_refuses_more():
    for dtype in ("V0", [], [("a", "V0")]):
        array = np.zeros(MAX_EMPTY_ITEMS, dtype)
        assert unpack_sample(pack_sample({"a": array}), copy=True)["a"].shape == array.shape
        with pytest.raises(ValueError, match=f"at most {MAX_EMPTY_ITEMS}"):
            pack_sample({"a": np.zeros(MAX_EMPTY_ITEMS + 1, dtype)})


@pytest.mark.parametrize("command", ["cat", "info", "verify"])
def test_the_commands_refuse_a_sample_that_claims_2_62_items(tmp_path, command):
    """Regression: ``fpipe cat`` and ``fpipe info`` ran for ever on the 58-byte sample, and
    ``fpipe verify`` called the dataset ok."""
    path = tmp_path / "h.msgpack"
    body = msgpack.packb({"key": "k0", "a": CLAIMED_SHAPES["2**62 items of V0 (the 58-byte sample)"]})
    path.write_bytes(body)
    write_index(path, ["k0"], [0, len(body)], hashlib.md5(body).hexdigest())
    done = subprocess.run([sys.executable, "-m", "fpipe", command, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "h.msgpack: sample 0 at byte 0: corrupt sample: an array of 4611686018427387904 items" \
        in done.stdout + done.stderr
