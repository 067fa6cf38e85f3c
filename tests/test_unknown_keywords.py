"""A misspelled keyword argument is a TypeError that names it, raised before anything is
created: where fpipe passes keyword arguments on to another library (tqdm's progress bar) or to
the user's function, and, swept below, for every public callable of fpipe and of each of its
packages (fpipe.dataset, fpipe.formats, fpipe.stream, fpipe.torch ...); a retry with the right
spelling then works."""

from __future__ import annotations

import inspect
import os
import pickle

import numpy as np
import pytest

import fpipe
import fpipe.prepare
import fpipe.sets
import fpipe.torch
from fpipe.dataset import FileWriter, MsgpackReader, RawWriter, ShardedWriter, pack_sample
from fpipe.random import Sampler, _integers


def _tree(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(top, name), folder)
                  for top, folders, files in os.walk(folder) for name in folders + files)


WRITERS = {
    "FileWriter": lambda folder, **options: FileWriter(folder / "x.msgpack", **options),
    "RawWriter": lambda folder, **options: RawWriter(folder / "x.msgpack", **options),
    "ShardedWriter": lambda folder, **options: ShardedWriter(folder / "x", 2, **options),
}


@pytest.mark.parametrize("name", WRITERS)
def test_a_misspelled_writer_option_creates_nothing(name, tmp_path):
    (tmp_path / "other.txt").write_text("mine")
    before = _tree(tmp_path)
    with pytest.raises(TypeError, match=rf"^{name} got an unexpected keyword argument 'overwirte'"):
        WRITERS[name](tmp_path, overwirte=True)
    assert _tree(tmp_path) == before
    with WRITERS[name](tmp_path, overwrite=True, desc="retry", disable=True) as writer:
        if name == "RawWriter":
            writer.write("a", pack_sample({"key": "a"}))
        else:
            writer.write({"key": "a"})


@pytest.mark.parametrize("options", [{"ncols": "wide"}, {"file": 3}])
def test_a_bad_progress_bar_value_creates_nothing(options, tmp_path, capsys):
    before = _tree(tmp_path)
    name = next(iter(options))
    with pytest.raises(TypeError, match=rf"tqdm refused the progress bar options {name}="):
        FileWriter(tmp_path / "x.msgpack", **options)
    assert _tree(tmp_path) == before


def test_tqdm_options_still_reach_the_bar(tmp_path, capsys):
    with FileWriter(tmp_path / "x.msgpack", 0, False, desc="packing", total=2, ncols=60) as writer:
        writer.write({"key": "a"})
        writer.write({"key": "b"})
    assert "packing" in capsys.readouterr().err
    assert len(MsgpackReader(tmp_path / "x.msgpack")) == 2


def scale(x, factor=1):
    return x * factor


def pair(x, y, factor=1):
    return (x + y) * factor


COMBINATORS = {
    "unpack_args": lambda **kw: fpipe.unpack_args(pair, **kw),
    "multiply": lambda **kw: fpipe.multiply(scale, **kw),
    "apply_at": lambda **kw: fpipe.apply_at(0, scale, **kw),
    "zip_apply": lambda **kw: fpipe.zip_apply(scale, scale, **kw),
    "random_apply": lambda **kw: fpipe.random_apply(1.0, scale, **kw),
    "sample_args": lambda **kw: fpipe.sample_args(scale, **{k: fpipe.random.integers(v, v + 1)
                                                              for k, v in kw.items()}),
}
CALLS = {"unpack_args": ((1, 2), 9), "multiply": ((1, 2), (3, 6)), "apply_at": ((1, 2), (3, 2)),
         "zip_apply": ((1, 2), (3, 6)), "random_apply": (1, 3), "sample_args": (1, 3)}


@pytest.mark.parametrize("name", COMBINATORS)
def test_a_combinator_refuses_a_keyword_its_function_lacks(name):
    with pytest.raises(TypeError, match=rf"^{name} got an unexpected keyword argument 'factr' "
                                        r"\(.*go to (scale|pair)"):
        COMBINATORS[name](factr=3)
    transform = COMBINATORS[name](factor=3)
    given, expected = CALLS[name]
    assert transform(given) == expected
    assert pickle.loads(pickle.dumps(transform))(given) == expected


def test_functions_that_take_any_keyword_or_hide_their_signature_are_left_to_their_call():
    assert fpipe.multiply(lambda x, **kw: x + kw["n"], n=1)([1]) == (2,)
    assert fpipe.multiply(max, key=abs)([(-3, 2)]) == (-3,)  # max has no readable signature


def test_a_sampler_refuses_a_keyword_its_draw_lacks():
    with pytest.raises(TypeError, match="^Sampler got an unexpected keyword argument 'hihg'"):
        Sampler(_integers, 0, hihg=3)
    assert Sampler(_integers, 0, 3)(None) in range(3)


# --- every public callable ------------------------------------------------------------------
#
# Each public class and function of these modules is called with its required arguments and
# misspellings of each of its options (one made-up keyword where it has none). Each call must be
# a TypeError that names the misspelled keyword, raised before anything exists: the files stay
# as they were and no thread or process started. The names are found, not listed: a new public
# name needs an entry in ARGUMENTS (its required arguments) or NOT_CALLED, or this fails.

PUBLIC_MODULES = ("fpipe", "fpipe.dataset", "fpipe.formats", "fpipe.orderings", "fpipe.stream",
                  "fpipe.infinite", "fpipe.functional", "fpipe.random", "fpipe.sharding",
                  "fpipe.skipping", "fpipe.errors", "fpipe.files", "fpipe.remote", "fpipe.torch",
                  "fpipe.image", "fpipe.sets", "fpipe.storage", "fpipe.prepare")


def _public_callables() -> dict:
    """``label: callable`` for each public callable, labelled by the first module that exports
    it, and each well-known dataset's ``write``."""
    import importlib

    found, seen = {}, set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, fpipe.sets.KnownDataset):
                found[f"{module_name}.{name}.write"] = value.write
            elif callable(value) and id(value) not in seen:
                seen.add(id(value))
                found[f"{module_name}.{name}"] = value
    return found


# Public names that are callable but are not constructors or stages with options, so a made-up
# keyword says nothing about fpipe: typing aliases, and exceptions and containers that keep
# their built-in base's constructor (Exception, dict, list).
NOT_CALLED = {
    "fpipe.random.Seed",  # a typing alias of the seeds fpipe takes
    "fpipe.files.PathLike",  # a typing alias of the paths fpipe takes
    "fpipe.skipping.OnError",  # a typing alias of on_error's values
    "fpipe.FpipeError",  # Exception's constructor: Exception(*args)
    "fpipe.errors.RemoteTraceback",  # Exception's constructor
    "fpipe.WorkerError",  # Exception's constructor
    "fpipe.skipping.TooManyErrors",  # Exception's constructor
    "fpipe.stream.Plan",  # a list of StagePlan, as explain() returns it
    "fpipe.stream.Stats",  # a list of StageStats, as stats() returns it
    # abstract bases that a user subclasses; they take no argument at all
    "fpipe.dataset.Reader",
    "fpipe.Stage",
    "fpipe.Stream",
    "fpipe.sets.KnownDataset",
    "fpipe.prepare.JobRunning",  # Exception's constructor
    "fpipe.prepare.SettingsChanged",  # Exception's constructor
}


class _Files:
    """Inputs that the calls read: a packed dataset, a Parquet file, a TFRecord file, a tar
    shard, a zip; in a folder that no call may change."""

    def __init__(self, folder) -> None:
        import tarfile
        import zipfile

        import pyarrow as pa
        import pyarrow.parquet as pq

        self.folder = folder
        self.msgpack = folder / "x.msgpack"
        with FileWriter(self.msgpack) as writer:
            for key in "abc":
                writer.write({"key": key, "x": 1})
        self.parquet = folder / "t.parquet"
        table = pa.table({"key": ["a", "b"], "x": [1, 2]})
        pq.write_table(table, self.parquet)
        self.arrow = folder / "t.arrow"
        with pa.ipc.new_file(self.arrow, table.schema) as arrow:
            arrow.write_table(table)
        self.tfrecord = folder / "t.tfrecord"
        with fpipe.formats.TFRecordWriter(self.tfrecord) as writer:
            writer.write({"x": [1]})
        self.tar = folder / "t.tar"
        (folder / "a.txt").write_text("a")
        with tarfile.open(self.tar, "w") as tar:
            tar.add(folder / "a.txt", arcname="a.txt")
        self.zip = folder / "images.zip"
        with zipfile.ZipFile(self.zip, "w") as archive:
            archive.writestr("cat/a.txt", "a")


def _call(*args, **kwargs) -> tuple:
    return args, kwargs


def _rows(n):
    return ({"key": str(i)} for i in range(n))


def _bag():
    import dask.bag

    return dask.bag.from_sequence([{"key": "0"}], npartitions=1)


def _stream():
    return fpipe.as_stream(range(3))


# Required arguments, from the inputs (f) and a folder for outputs (out): enough to make the call
# valid without the misspelled keyword (the test binds them to the signature).
ARGUMENTS = {
    "fpipe.prepare.Partitions": lambda f, out: _call([1], _rows),
    "fpipe.prepare.PrepareReport": lambda f, out: _call("x.shards", 1, 1, 0, 3, 30, 0.1),
    "fpipe.prepare.from_dask": lambda f, out: _call(_bag()),
    "fpipe.prepare.from_generator": lambda f, out: _call(_rows, [1, 2]),
    "fpipe.prepare.from_sources": lambda f, out: _call(str(f.tfrecord)),
    "fpipe.prepare.verify_dataset": lambda f, out: _call(out / "prepared"),
    "fpipe.prepare.write_dataset": lambda f, out: _call(fpipe.prepare.from_generator(_rows, [2]),
                                                        out / "prepared"),
    "fpipe.formats.ArrowFileReader": lambda f, out: _call(f.arrow),
    "fpipe.dataset.BlockShuffler": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.dataset.BloomFilter": lambda f, out: _call(10, 0.01),
    "fpipe.errors.CapturedError": lambda f, out: _call(ValueError("x"), "traceback"),
    "fpipe.functional.Compose": lambda f, out: _call(scale),
    "fpipe.orderings.Cycler": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.dataset.DamagedDataError": lambda f, out: _call(fpipe.dataset.RebuildReport(3, 10, 0), f.msgpack),
    "fpipe.dataset.DamagedRegion": lambda f, out: _call(0, 1, "bad"),
    "fpipe.dataset.DatasetFiles": lambda f, out: _call(f.msgpack),
    "fpipe.dataset.DirectoryReader": lambda f, out: _call(str(f.folder / "{LABEL}" / "*.png")),
    "fpipe.ExpirationPool": lambda f, out: _call(4, 2),
    "fpipe.FileWriter": lambda f, out: _call(out / "y.msgpack"),
    "fpipe.FormatError": lambda f, out: _call("bad"),
    "fpipe.IndexShuffler": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.Infinite": lambda f, out: _call(range(4), scale, batch_size=2, batches_per_epoch=1),
    "fpipe.Iterator": lambda f, out: _call(scale),
    "fpipe.ListReader": lambda f, out: _call([{"key": "a"}]),
    "fpipe.Loky": lambda f, out: _call(scale),
    "fpipe.errors.MissingParameterError": lambda f, out: _call("size", "mask_size", "resize"),
    "fpipe.stream.Mix": lambda f, out: _call(([1], [2]), None, 0, "first"),
    "fpipe.MsgpackReader": lambda f, out: _call(f.msgpack),
    "fpipe.formats.ParquetFileReader": lambda f, out: _call(f.parquet),
    "fpipe.ParquetReader": lambda f, out: _call(f.parquet),
    "fpipe.orderings.QuasiShuffler": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.orderings.Range": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.dataset.RawWriter": lambda f, out: _call(out / "y.msgpack"),
    "fpipe.dataset.RebuildReport": lambda f, out: _call(3, 10, 0),
    "fpipe.orderings.Repeater": lambda f, out: _call(MsgpackReader(f.msgpack), 2),
    "fpipe.stream.Sample": lambda f, out: _call([1, 2], None, 0),
    "fpipe.random.Sampler": lambda f, out: _call(_integers, 0, 3),
    "fpipe.ShardedReader": lambda f, out: _call([f.msgpack]),
    "fpipe.ShardedWriter": lambda f, out: _call(out / "y", 2),
    "fpipe.Shuffler": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.skipping.Skipped": lambda f, out: _call(0, "a", "ValueError: bad"),
    "fpipe.stream.StagePlan": lambda f, out: _call("map"),
    "fpipe.stream.StageStats": lambda f, out: _call("map", 1, 1.0, 1.0, 0.0, 0.0),
    "fpipe.formats.TFRecordFileReader": lambda f, out: _call(f.tfrecord),
    "fpipe.TFRecordReader": lambda f, out: _call(f.tfrecord),
    "fpipe.formats.TFRecordWriter": lambda f, out: _call(out / "y.tfrecord"),
    "fpipe.formats.TarReader": lambda f, out: _call(f.tar),
    "fpipe.Threads": lambda f, out: _call(scale),
    "fpipe.dataset.UndecidedDataError": lambda f, out: _call(1, 2, f.msgpack),
    "fpipe.WebDatasetReader": lambda f, out: _call(f.tar),
    "fpipe.dataset.Writer": lambda f, out: _call(out / "y.msgpack"),
    "fpipe.dataset.ZipFileReader": lambda f, out: _call(f.zip),
    "fpipe.apply_at": lambda f, out: _call(0, scale),
    "fpipe.random.as_generator": lambda f, out: _call(0),
    "fpipe.as_stream": lambda f, out: _call(range(3)),
    "fpipe.batch": lambda f, out: _call(2),
    "fpipe.batch_by_tokens": lambda f, out: _call(8),
    "fpipe.dataset.block_bounds": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.bucket_by_length": lambda f, out: _call([4], [2, 1]),
    "fpipe.errors.capture": lambda f, out: _call(ValueError("x")),
    "fpipe.random.choice": lambda f, out: _call([1, 2]),
    "fpipe.combine_batches": lambda f, out: _call([(1, 2)]),
    "fpipe.combine_dicts": lambda f, out: _call([{"x": 1}]),
    "fpipe.combine_pad": lambda f, out: _call([(1, 2)]),
    "fpipe.combine_to_arrays": lambda f, out: _call([(1, 2)]),
    "fpipe.dataset.corrupt_reason": lambda f, out: _call(ValueError("x")),
    "fpipe.formats.decode_field": lambda f, out: _call("txt", b"a"),
    "fpipe.dataset.decode_numpy": lambda f, out: _call({"x": 1}),
    "fpipe.dataset.decode_numpy_copy": lambda f, out: _call({"x": 1}),
    "fpipe.sharding.elastic_batches": lambda f, out: _call(10, 0, 2),
    "fpipe.sharding.elastic_position": lambda f, out: _call(10, 0, 1, 2),
    "fpipe.formats.encode_example": lambda f, out: _call({"x": [1]}),
    "fpipe.formats.encode_field": lambda f, out: _call("txt", "a"),
    "fpipe.dataset.encode_numpy": lambda f, out: _call(1),
    "fpipe.expiration_pool": lambda f, out: _call(range(3), 4, 2),
    "fpipe.explain": lambda f, out: _call(_stream()),
    "fpipe.stream.filter": lambda f, out: _call(bool),
    "fpipe.dataset.hash_key": lambda f, out: _call("a", b"salt"),
    "fpipe.dataset.hash_keys": lambda f, out: _call(["a", "b"]),
    "fpipe.identity": lambda f, out: _call(1),
    "fpipe.dataset.index_keys": lambda f, out: _call(f.msgpack),
    "fpipe.random.integers": lambda f, out: _call(3),
    "fpipe.item_rng": lambda f, out: _call(0, 0, 0),
    "fpipe.dataset.key_salt": lambda f, out: _call(0),
    "fpipe.dataset.legacy_index_batches": lambda f, out: _call(f.msgpack),
    "fpipe.load_by_random_id": lambda f, out: _call(scale, ids=[1, 2]),
    "fpipe.sharding.loader_batches": lambda f, out: _call([3], 2),
    "fpipe.sharding.loader_length": lambda f, out: _call([3], 2),
    "fpipe.stream.map": lambda f, out: _call(scale),
    "fpipe.dataset.md5_file": lambda f, out: _call(f.msgpack),
    "fpipe.dataset.md5_line": lambda f, out: _call("0" * 32, "x.msgpack"),
    "fpipe.formats.member_key": lambda f, out: _call("a"),
    "fpipe.multiply": lambda f, out: _call(scale),
    "fpipe.dataset.open_regular": lambda f, out: _call(f.msgpack),
    "fpipe.pack": lambda f, out: _call(8),
    "fpipe.dataset.pack_sample": lambda f, out: _call({"key": "a"}),
    "fpipe.formats.packable_example": lambda f, out: _call({"x": 1}),
    "fpipe.pad_batch_equal": lambda f, out: _call([[1], [1, 2]]),
    "fpipe.stream.pad_to_shape": lambda f, out: _call([1], [2]),
    "fpipe.formats.parse_example": lambda f, out: _call(b""),
    "fpipe.prefetch": lambda f, out: _call(2),
    "fpipe.processes": lambda f, out: _call(scale),
    "fpipe.random_apply": lambda f, out: _call(0.5, scale),
    "fpipe.dataset.read_class_file": lambda f, out: _call(f.folder / "classes.json"),
    "fpipe.dataset.read_classes": lambda f, out: _call(f.msgpack),
    "fpipe.dataset.read_key_hashes": lambda f, out: _call(f.msgpack),
    "fpipe.dataset.read_keys": lambda f, out: _call(f.msgpack),
    "fpipe.dataset.read_legacy_index": lambda f, out: _call(f.msgpack),
    "fpipe.dataset.read_md5": lambda f, out: _call(f.msgpack),
    "fpipe.dataset.read_offsets": lambda f, out: _call(f.msgpack),
    "fpipe.dataset.read_regular": lambda f, out: _call(f.msgpack),
    "fpipe.dataset.rebuild_index": lambda f, out: _call(f.msgpack),
    "fpipe.sample": lambda f, out: _call([1, 2]),
    "fpipe.sample_args": lambda f, out: _call(scale),
    "fpipe.random.seed_entropy": lambda f, out: _call(0),
    "fpipe.shard": lambda f, out: _call(0, 2),
    "fpipe.sharding.shard_range": lambda f, out: _call(10, 0, 2),
    "fpipe.dataset.shuffled_shard": lambda f, out: _call(MsgpackReader(f.msgpack), 0, 3, seed=0, epoch=0),
    "fpipe.stats": lambda f, out: _call(_stream()),
    "fpipe.take": lambda f, out: _call(2),
    "fpipe.threads": lambda f, out: _call(scale),
    "fpipe.transform_stream": lambda f, out: _call(scale),
    "fpipe.stream.uncombine": lambda f, out: _call(([1, 2],)),
    "fpipe.unpack_args": lambda f, out: _call(pair),
    "fpipe.dataset.unpack_sample": lambda f, out: _call(pack_sample({"key": "a"})),
    "fpipe.using_rng": lambda f, out: _call(None),
    "fpipe.sharding.worker_range": lambda f, out: _call(10),
    "fpipe.dataset.write_index": lambda f, out: _call(out / "y.msgpack", ["a"], [0, 1], "0" * 32),
    "fpipe.formats.write_parquet": lambda f, out: _call([{"key": "a"}], out / "y-%05d.parquet"),
    "fpipe.dataset.write_shard_index": lambda f, out: _call([f.msgpack], out / "y.shards"),
    "fpipe.formats.write_webdataset": lambda f, out: _call([{"key": "a"}], out / "y-%05d.tar"),
    "fpipe.zip_apply": lambda f, out: _call(scale),
    "fpipe.torch.Dataset": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.torch.DatasetBase": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.torch.Elastic": lambda f, out: _call(rank=0, world_size=2, even="pad"),
    "fpipe.torch.ElasticBatchSampler": lambda f, out: _call(range(10), 2, rank=0, world_size=1),
    "fpipe.torch.EvenBatches": lambda f, out: _call([1, 2]),
    "fpipe.torch.IterableDataset": lambda f, out: _call(MsgpackReader(f.msgpack)),
    "fpipe.torch.Samples": lambda f, out: _call(seed=0, on_error="skip", max_errors=2),
    "fpipe.torch.Shards": lambda f, out: _call(rank=1, world_size=2, shuffle=True),
    "fpipe.torch.dict2tuple": lambda f, out: _call([{"image": 1, "label": 0}]),
    "fpipe.torch.even_batches": lambda f, out: _call([1, 2]),
    "fpipe.torch.no_rng": lambda f, out: _call(None),
    "fpipe.torch.regrid_state": lambda f, out: _call([{}]),
    "fpipe.image.ImageDecodeError": lambda f, out: _call("bad"),
    "fpipe.image.decode_image": lambda f, out: _call(b""),
    "fpipe.image.normalize": lambda f, out: _call(np.zeros((1, 2, 2, 3), np.uint8)),
    "fpipe.image.random_resized_crop": lambda f, out: _call(8),
    "fpipe.image.resized_center_crop": lambda f, out: _call(8),
    "fpipe.sets.Archive": lambda f, out: _call("a.tar", "0" * 32),
    "fpipe.sets.ArchiveError": lambda f, out: _call("bad"),
    "fpipe.sets.ChecksumError": lambda f, out: _call(f.msgpack, expected="0", actual="1"),
    "fpipe.sets.DownloadError": lambda f, out: _call("https://example.org/a", "refused"),
    "fpipe.sets.classes_path": lambda f, out: _call(f.msgpack),
    "fpipe.remote.RemoteError": lambda f, out: _call("s3://b/x.msgpack", 0, 1, "timed out"),
    "fpipe.remote.is_url": lambda f, out: _call("s3://b/x.msgpack"),
    "fpipe.sets.download": lambda f, out: _call("https://example.org/a.tar", out / "a.tar"),
    "fpipe.sets.fetch": lambda f, out: _call(fpipe.sets.Archive("a.tar", "0" * 32), out),
    "fpipe.sets.get": lambda f, out: _call("mnist"),
    "fpipe.sets.load_classes": lambda f, out: _call(f.msgpack),
    "fpipe.sets.md5sum": lambda f, out: _call(f.msgpack),
    **{f"fpipe.sets.{name}.write": lambda f, out: _call(out)
       for name in ("cifar10", "cifar100", "fashion_mnist", "imagenet", "mnist")},
}


# Other ways to build the same thing, where keywords take another path: each is swept too.
MODES = {
    "fpipe.Iterator": [{"n_workers": 2}],  # the transform runs on chunks, in threads
    "fpipe.Threads": [{"n_workers": 2}],
    "fpipe.Loky": [{"n_workers": 2}],
    "fpipe.threads": [{"n_workers": 2}],
    "fpipe.processes": [{"n_workers": 2}, {"n_workers": 2, "backend": "threading"}],
    "fpipe.Infinite": [{"combiner": fpipe.stream.map(list)}],  # a stage combiner takes no keywords
    # the other layout, and transforms in threads
    "fpipe.torch.IterableDataset": [{"batch_size": 2, "layout": fpipe.torch.Elastic()},
                                    {"samples": fpipe.torch.Samples(n_threads=2)}],
}


def _options(func) -> list[str]:
    """The names of ``func``'s options: its parameters that have a default or are keyword-only."""
    parameters = inspect.signature(func).parameters.values()
    return [parameter.name for parameter in parameters
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
            and (parameter.default is not parameter.empty
                 or parameter.kind is parameter.KEYWORD_ONLY)]


def _misspellings(func) -> list[str]:
    """Each option of ``func`` misspelled (a letter left out, or doubled in a short name); a
    made-up option where it has none."""
    taken = set(inspect.signature(func).parameters)
    spelled = []
    for name in _options(func):
        wrong = name[:-1] if len(name) > 3 else name + name[-1]
        spelled.append(wrong if wrong not in taken else wrong + "_")
    return spelled or ["bufer_size"]


def _files(*folders) -> list:
    """Every file and folder under ``folders``, with its size and modification time."""
    found = []
    for folder in folders:
        for top, names, files in os.walk(folder):
            for name in names + files:
                status = os.stat(os.path.join(top, name))
                found.append((os.path.join(top, name), status.st_size, status.st_mtime_ns))
    return sorted(found)


def _running() -> tuple[set, set]:
    """The threads of this process and its child processes (by id)."""
    import threading

    import psutil

    return ({thread.ident for thread in threading.enumerate()},
            {child.pid for child in psutil.Process().children(recursive=True)})


PUBLIC = _public_callables()


def test_every_public_callable_has_an_entry():
    missing = sorted(label for label, func in PUBLIC.items()
                     if label not in ARGUMENTS and label not in NOT_CALLED
                     and any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL,
                                                                      p.VAR_KEYWORD)
                             for p in inspect.signature(func).parameters.values()))
    assert not missing, f"add the required arguments of {missing} to ARGUMENTS"
    stale = sorted((set(ARGUMENTS) | NOT_CALLED) - set(PUBLIC))
    assert not stale, f"{stale} are no longer public: remove them from ARGUMENTS or NOT_CALLED"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _Files(tmp_path_factory.mktemp("inputs"))


@pytest.mark.parametrize("label", sorted(set(PUBLIC) - NOT_CALLED))
def test_a_misspelled_option_is_refused_before_anything_exists(label, files, tmp_path,
                                                               monkeypatch):
    func = PUBLIC[label]
    monkeypatch.chdir(tmp_path)
    args, kwargs = ARGUMENTS.get(label, lambda f, out: _call())(files, tmp_path)
    for mode in [{}, *MODES.get(label, [])]:
        inspect.signature(func).bind(*args, **kwargs, **mode)  # the entry is a valid call
        for wrong in _misspellings(func):
            call = f"{label}(..., {''.join(f'{k}={v!r}, ' for k, v in mode.items())}{wrong}=2)"
            before, (threads, children) = _files(files.folder, tmp_path), _running()
            with pytest.raises(TypeError) as raised:
                func(*args, **kwargs, **mode, **{wrong: 2})
            assert f"'{wrong}'" in str(raised.value) and "keyword" in str(raised.value), \
                f"{call} raised {raised.value!r}"
            assert _files(files.folder, tmp_path) == before, f"{call} left files"
            # new ones only: a thread of an earlier test may end meanwhile
            threads_now, children_now = _running()
            assert not threads_now - threads, f"{call} started a thread"
            assert not children_now - children, f"{call} started a process"


def test_every_mode_is_of_a_public_callable():
    assert set(MODES) <= set(PUBLIC) - NOT_CALLED


def shift(x, **options):
    return x + options.get("by", 0)


def shift_stream(stream, **options):
    return (x + options.get("by", 0) for x in stream)


PASSING_STAGES = {
    "map": lambda func, **options: fpipe.stream.map(func, **options),
    "threads": lambda func, **options: fpipe.threads(func, n_workers=2, **options),
    "Threads": lambda func, **options: fpipe.Threads(func, n_workers=2, **options),
    "Loky": lambda func, **options: fpipe.Loky(func, **options),
    "transform_stream": lambda func, **options: fpipe.transform_stream(func, **options),
    "Iterator": lambda func, **options: fpipe.Iterator(func, **options),
}


@pytest.mark.parametrize("name", PASSING_STAGES)
def test_a_function_that_takes_any_keyword_gets_its_keywords_through_partial(name):
    import functools

    func = shift_stream if name in ("transform_stream", "Iterator") else shift
    stage = PASSING_STAGES[name](functools.partial(func, by=10))
    with fpipe.as_stream(stage(range(3))) as stream:
        assert list(stream) == [10, 11, 12]
    with pytest.raises(TypeError, match="'n_worker'"):  # a function that names its keywords
        PASSING_STAGES[name](functools.partial(scale, factor=2), n_worker=2)
