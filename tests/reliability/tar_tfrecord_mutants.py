"""Damaged WebDataset shards and TFRecord files, read through fpipe and through the reference
readers, in a process of its own: ``python -m tests.reliability.tar_tfrecord_mutants KIND FOLDER
SEED COUNT`` writes COUNT seeded mutants of a base file of KIND (``tar`` or ``tfrecord``) in
FOLDER and prints, for each, a JSON line ``{"start": case}`` and then one with what fpipe and
the reference made of it; the test judges them (``test_tar_tfrecord_mutants.py``).

A reader that crashed the interpreter on a mutant would end this process with a signal, and
one that hung would be stopped by ``faulthandler`` after ``CASE_SECONDS``: either way the
last ``start`` line names the mutant.

The references: Python's ``tarfile`` for the members of a shard (grouped into samples as
WebDataset groups them), and for TFRecord the framing as TensorFlow defines it (lengths and
data checked by the ``crc32c`` package) with each record parsed by protobuf's
``tf.train.Example`` (from the ``tfrecord`` package).
"""

from __future__ import annotations

import faulthandler
import hashlib
import io
import json
import struct
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from fpipe.remote import RemoteOptions

#: A case that takes longer than this is a hang.
CASE_SECONDS = 60


def digest(data: bytes) -> str:
    return hashlib.sha1(bytes(data)).hexdigest()[:16]


# --- mutants -----------------------------------------------------------------------------------

def flipped(data: bytes, rng: np.random.Generator, at: int) -> tuple[bytes, str]:
    mask = int(rng.integers(1, 256))
    out = bytearray(data)
    out[at] ^= mask
    return bytes(out), f"byte {at} ^= {mask:#04x}"


def cut(data: bytes, at: int) -> tuple[bytes, str]:
    return data[:at], f"cut at {at}"


def zeroed(data: bytes, rng: np.random.Generator, at: int) -> tuple[bytes, str]:
    length = int(rng.integers(1, 700))
    out = bytearray(data)
    out[at:at + length] = bytes(len(out[at:at + length]))
    return bytes(out), f"bytes {at}..{at + length} zeroed"


def raw_mutant(data: bytes, rng: np.random.Generator, marks: list[int]) -> tuple[bytes, str]:
    """A flip, a cut or a zeroed span, anywhere or (half of the time) at or near one of
    ``marks`` (where headers are)."""
    near = marks and rng.random() < 0.5
    at = (int(rng.choice(marks)) + int(rng.integers(0, 16)) if near
          else int(rng.integers(0, len(data))))
    at = min(at, len(data) - 1)
    kind = rng.integers(3)
    if kind == 0:
        return flipped(data, rng, at)
    if kind == 1:
        return cut(data, at)
    return zeroed(data, rng, at)


# --- tar ---------------------------------------------------------------------------------------

def tar_base(path: Path, format: int, seed: int) -> bytes:
    """A shard of 12 samples: images of 0 to 3000 bytes, labels, captions, a key longer than
    a tar header holds and one not in ASCII (pax or GNU long names), and a member that
    WebDataset leaves out."""
    rng = np.random.default_rng(seed)
    members = [("__meta__", b"x")]
    for i in range(12):
        key = f"train/{i:04d}"
        if i == 3:
            key = "long/" + "k" * 120
        if i == 5:
            key = f"naïve/{i:04d}"
        members += [(f"{key}.jpg", rng.bytes(int(rng.integers(0, 3000)))),
                    (f"{key}.cls", str(i % 7).encode())]
        if i % 3 == 0:
            members.append((f"{key}.txt", f"caption {i}".encode()))
    with tarfile.open(path, "w", format=format) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return path.read_bytes()


def header_offsets(data: bytes) -> list[int]:
    """Where the headers of a whole shard are (its members' headers, pax and long-name
    headers included)."""
    offsets, position = [], 0
    while position + 512 <= len(data) and data[position:position + 512].strip(b"\0"):
        offsets.append(position)
        size = int(data[position + 124:position + 136].split(b"\0")[0].strip() or b"0", 8)
        position += 512 + -(-size // 512) * 512
    return offsets


def edited_header(data: bytes, rng: np.random.Generator, marks: list[int]) -> tuple[bytes, str]:
    """One field of a header changed, its checksum made right again: the parser, not the
    checksum, must find what is wrong."""
    at = int(rng.choice(marks))
    header = bytearray(data[at:at + 512])
    field, start, stop = [("name", 0, 100), ("size", 124, 136), ("type", 156, 157),
                          ("magic", 257, 263), ("prefix", 345, 500)][rng.integers(5)]
    if field == "size":
        choices = [b"%011o\0" % int(rng.integers(0, 1 << 20)), b"7777777777\0\0",
                   b"\x80" + bytes(10) + b"\x01", b"abc\0" + bytes(8), b"-1\0" + bytes(9)]
        value = choices[rng.integers(len(choices))]
    elif field == "type":
        value = bytes([b"0257xgLK\0AS"[rng.integers(11)]])
    else:
        value = bytes(rng.integers(0, 256, stop - start, dtype=np.uint8)) if rng.random() < 0.5 \
            else bytes(stop - start)
    header[start:stop] = value[:stop - start].ljust(stop - start, b"\0")
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    out = bytearray(data)
    out[at:at + 512] = header
    return bytes(out), f"header at {at}: {field} set to {bytes(value)!r}, checksum made right"


def tar_mutants(folder: Path, seed: int, count: int) -> Iterator[tuple[str, Path]]:
    rng = np.random.default_rng(seed)
    bases = [tar_base(folder / "base-pax.tar", tarfile.PAX_FORMAT, seed),
             tar_base(folder / "base-gnu.tar", tarfile.GNU_FORMAT, seed + 1)]
    for case in range(count):
        base = bases[case % 2]
        marks = header_offsets(base)
        data, what = (edited_header(base, rng, marks) if rng.random() < 0.25
                      else raw_mutant(base, rng, marks))
        path = folder / f"mutant-{case:03d}.tar"
        path.write_bytes(data)
        yield f"{('pax', 'gnu')[case % 2]} shard, {what}", path


def webdataset_parts(name: str) -> tuple[str, str] | None:
    """WebDataset's key and extension of a member name (None for the names it leaves out)."""
    folder, _, base = name.rpartition("/")
    if "." not in base or (not folder and base.startswith("__")) or base.startswith("."):
        return None
    stem, extension = base.split(".", 1)
    return (f"{folder}/{stem}" if folder else stem), extension


def tar_reference(path: Path) -> dict:
    """The samples that ``tarfile`` finds, and the error it ended with (None if none)."""
    samples: list[dict] = []
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isreg():
                    continue
                data = tar.extractfile(member).read()
                if len(data) != member.size:
                    raise tarfile.ReadError("a member cut short")
                parts = webdataset_parts(member.name)
                if parts is None:
                    continue
                if not samples or samples[-1]["key"] != parts[0]:
                    samples.append({"key": parts[0]})
                samples[-1].setdefault(parts[1], []).append(digest(data))
    except Exception as error:  # the reference's end, whatever it is
        return {"samples": samples, "error": f"{type(error).__name__}: {error}"}
    return {"samples": samples, "error": None}


def tar_sample(sample: dict) -> dict:
    return {name: (value if name == "key" else [digest(value)]) for name, value in sample.items()}


def fpipe_tar(path: Path, cache: Path) -> dict:
    from fpipe.formats import TarReader

    return read_through(path, lambda path: TarReader(path, remote=RemoteOptions(cache_dir=cache)), tar_sample)


# --- tfrecord ----------------------------------------------------------------------------------

def example_records(seed: int) -> list[bytes]:
    """Serialized Examples of the shapes datasets use, by protobuf."""
    from tfrecord import example_pb2

    rng = np.random.default_rng(seed)
    records = []
    for i in range(16):
        example = example_pb2.Example()
        feature = example.features.feature
        feature["image/encoded"].bytes_list.value.append(rng.bytes(int(rng.integers(0, 600))))
        feature["image/class/label"].int64_list.value.append(int(rng.integers(-5, 1000)))
        feature["box"].float_list.value.extend(rng.random(int(rng.integers(0, 5))).tolist())
        feature["tags"].bytes_list.value.extend([b"a", b"bc"][: i % 3])
        feature["ids"].int64_list.value.extend(rng.integers(-2**40, 2**40, i % 4).tolist())
        records.append(example.SerializeToString())
    return records


def masked_crc(data: bytes) -> int:
    import crc32c

    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def framed(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return b"".join([length, struct.pack("<I", masked_crc(length)), record,
                     struct.pack("<I", masked_crc(record))])


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    tag, length, size = bytes([number << 3 | 2]), bytearray(), len(payload)
    while size >= 0x80:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    return tag + bytes(length) + bytes([size]) + payload


def merged_feature(record: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """The Example with one more entry for one of its names, whose feature comes in pieces
    of one or two kinds (protobuf merges the Examples, keeps the last entry of a name, and
    merges the pieces of its feature while they are of one kind)."""
    from tfrecord import example_pb2

    name = str(rng.choice(sorted(example_pb2.Example.FromString(record).features.feature)))
    pieces = []
    for _ in range(int(rng.integers(1, 4))):
        feature = example_pb2.Feature()
        kind = ("int64_list", "float_list", "bytes_list")[rng.integers(3) if rng.random() < 0.3 else 0]
        values = {"int64_list": lambda: [int(v) for v in rng.integers(-9, 9, 2)],
                  "float_list": lambda: rng.random(2).tolist(),
                  "bytes_list": lambda: [rng.bytes(3)]}[kind]()
        getattr(feature, kind).value.extend(values)
        pieces.append(feature.SerializeToString())
    if rng.random() < 0.5:  # the pieces in one feature field, else each a field of the entry
        pieces = [b"".join(pieces)]
    entry = field(1, name.encode()) + b"".join(field(2, piece) for piece in pieces)
    return record + field(1, field(1, entry)), f"feature {name!r} again, in {len(pieces)} pieces"


def payload_mutant(record: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """A record's Example changed where parsing must find it: a flip, a cut, bytes put in,
    a piece of it repeated, or a feature given again in pieces (which protobuf merges)."""
    at = int(rng.integers(0, max(1, len(record))))
    kind = rng.integers(5)
    if kind == 4:
        return merged_feature(record, rng)
    if kind == 0 and record:
        return flipped(record, rng, min(at, len(record) - 1))
    if kind == 1:
        return cut(record, at)
    if kind == 2:
        extra = bytes(rng.integers(0, 256, int(rng.integers(1, 4)), dtype=np.uint8))
        return record[:at] + extra + record[at:], f"{extra.hex()} put in at {at}"
    stop = int(rng.integers(at, len(record) + 1))
    return record[:stop] + record[at:stop] + record[stop:], f"bytes {at}..{stop} repeated"


def tfrecord_mutants(folder: Path, seed: int, count: int) -> Iterator[tuple[str, Path]]:
    rng = np.random.default_rng(seed)
    records = example_records(seed)
    base = b"".join(map(framed, records))
    marks, position = [], 0
    for record in records:
        marks.append(position)
        position += 16 + len(record)
    for case in range(count):
        if case % 2:  # the payload changed, its length and CRCs made right: parsing is tried
            which = int(rng.integers(len(records)))
            payload, what = payload_mutant(records[which], rng)
            changed = records[:which] + [payload] + records[which + 1:]
            data, what = b"".join(map(framed, changed)), f"record {which}: {what}, CRCs made right"
        else:
            data, what = raw_mutant(base, rng, marks)
        path = folder / f"mutant-{case:03d}.tfrecord"
        path.write_bytes(data)
        yield what, path


def tfrecord_reference(path: Path) -> dict:
    """Each record the framing finds (its Example as protobuf reads it, or why it is not one),
    and why the framing ended early (None if it did not)."""
    data, position, records = path.read_bytes(), 0, []
    while position < len(data):
        header = data[position:position + 12]
        if len(header) < 12:
            return {"records": records, "error": "a header cut off"}
        (length,), (crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
        if masked_crc(header[:8]) != crc:
            return {"records": records, "error": "the length's CRC does not match"}
        stop = position + 12 + length + 4
        if stop > len(data):
            return {"records": records, "error": "a record cut off"}
        record = data[position + 12:stop - 4]
        if masked_crc(record) != struct.unpack("<I", data[stop - 4:stop])[0]:
            records.append("the data's CRC does not match")
        else:
            records.append(protobuf_example(record))
        position = stop
    return {"records": records, "error": None}


def protobuf_example(record: bytes) -> dict | str:
    from google.protobuf.message import DecodeError
    from tfrecord import example_pb2

    try:
        example = example_pb2.Example.FromString(record)
    except DecodeError as error:
        return f"DecodeError: {error}"
    features = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        features[name] = canonical(None if kind is None else np.array(values, np.float32)
                                   if kind == "float_list" else np.array(values, np.int64)
                                   if kind == "int64_list" else values[0] if len(values) == 1
                                   else values)
    return features


def canonical(value: object) -> object:
    """A value as JSON can carry it: bytes by digest, floats by their bits (any NaN alike:
    protobuf's Python floats quiet a signalling one)."""
    if isinstance(value, bytes):
        return ["bytes", digest(value)]
    if isinstance(value, list):
        return ["list", [digest(item) for item in value]]
    if isinstance(value, np.ndarray) and value.dtype == np.float32:
        return ["float32", ["nan" if np.isnan(x) else x.view(np.uint32).item() for x in value]]
    if isinstance(value, np.ndarray):
        return [str(value.dtype), value.tolist()]
    return value


def fpipe_tfrecord(path: Path, cache: Path) -> dict:
    from fpipe.formats import TFRecordFileReader

    return read_through(path, lambda path: TFRecordFileReader(path, remote=RemoteOptions(cache_dir=cache)),
                        lambda sample: {name: canonical(value) for name, value in sample.items()})


# --- reading through fpipe ---------------------------------------------------------------------

def failure(error: Exception, path: Path) -> dict:
    from fpipe.errors import FormatError

    return {"error": f"{type(error).__name__}: {error}", "format_error": isinstance(error, FormatError),
            "names_the_file": getattr(error, "path", None) == str(path)}


def read_through(path: Path, make: Callable, canonical_sample: Callable) -> dict:
    """What a reader of the mutant at ``path`` gives: an error at open, or its length, the
    samples of an iteration up to the error that ends it, and each sample read on its own."""
    try:
        reader = make(path)
    except Exception as error:  # the test judges every kind
        return {"open": failure(error, path)}
    iterated, ended = [], None
    try:
        for sample in reader.iter(chunk_size=3):
            iterated.append(canonical_sample(sample))
    except Exception as error:  # the test judges every kind
        ended = failure(error, path)
    each = []
    for index in range(len(reader)):
        try:
            each.append({"sample": canonical_sample(reader[index])})
        except Exception as error:  # the test judges every kind
            each.append(failure(error, path))
    return {"open": None, "length": len(reader), "iterated": iterated, "ended": ended, "each": each}


CAMPAIGNS = {"tar": (tar_mutants, fpipe_tar, tar_reference),
             "tfrecord": (tfrecord_mutants, fpipe_tfrecord, tfrecord_reference)}


def main(kind: str, folder: str, seed: str, count: str) -> None:
    mutants, ours, reference = CAMPAIGNS[kind]
    root = Path(folder)
    for case, (what, path) in enumerate(mutants(root, int(seed), int(count))):
        print(json.dumps({"start": case, "what": what}), flush=True)
        faulthandler.dump_traceback_later(CASE_SECONDS, exit=True)
        result = {"case": case, "what": what, "path": str(path), "fpipe": ours(path, root / "cache"),
                  "reference": reference(path)}
        faulthandler.cancel_dump_traceback_later()
        print(json.dumps(result), flush=True)
        path.unlink()


if __name__ == "__main__":
    main(*sys.argv[1:])
