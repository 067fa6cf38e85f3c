"""``fpipe shuffle --mode index``, and ``merge``, ``split --shuffle`` and ``sample`` in bounded
memory: no table of keys, no permutation held, duplicates found by sorted hashes."""

import tracemalloc

import msgpack
import numpy as np
import pytest

import fpipe.cli.reorder as reorder
from fpipe.cli import main
from fpipe.dataset import MsgpackReader, RawWriter
from fpipe.orderings import IndexShuffler
from fpipe.orderings.permutation import Permutation

from .conftest import keys, leftovers, make_dataset, mistake, ok, shrink_storage_bounds


def test_shuffle_mode_index_writes_the_index_shufflers_order(dataset, tmp_path, capsys):
    ok("shuffle", dataset, tmp_path / "i.msgpack", "--mode", "index", "--seed", "4", "-q")
    expected = [s["key"] for s in IndexShuffler(MsgpackReader(dataset), seed=4)]
    assert keys(tmp_path / "i.msgpack") == expected and sorted(expected) == keys(dataset)
    assert "with --mode index" in mistake(capsys, 2, "shuffle", dataset, tmp_path / "x.msgpack",
                                          "--mode", "index", "--chunk-size", "4")


def test_merge_compares_the_keys_of_equal_hashes_only(tmp_path, monkeypatch, capsys):
    a = make_dataset(tmp_path / "a.msgpack", 30, prefix="a")
    b = make_dataset(tmp_path / "b.msgpack", 20, prefix="b")
    # every hash equal: each pair of neighbours is compared by key, and none is the same
    monkeypatch.setattr(reorder, "salted_hashes", lambda keys, salt: np.zeros(len(keys), np.uint64))
    assert main(["merge", str(a), str(b), str(tmp_path / "m.msgpack"), "-q"]) == 0
    assert keys(tmp_path / "m.msgpack") == keys(a) + keys(b)
    c = make_dataset(tmp_path / "c.msgpack", 5, prefix="a")  # a0000 .. a0004 again
    assert main(["merge", str(a), str(c), str(tmp_path / "n.msgpack"), "-q"]) == 1
    assert "5 duplicate key(s)" in capsys.readouterr().err
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("seed", ["1", "2"])
def test_split_and_sample_draw_by_the_index_permutation(dataset, tmp_path, seed):
    # the parts are the samples whose places in the permutation of the seed fall in each
    # part's range, in file order: drawn in one pass, with nothing held per sample
    parts = [tmp_path / f"p{i}.msgpack" for i in range(3)]
    ok("split", dataset, "--counts", "20", "25", "-o", *parts, "--shuffle", "--seed", seed, "-q")
    n, every = len(keys(dataset)), keys(dataset)
    places = Permutation(n, int(seed), 0).positions(np.arange(n))
    assert [keys(part) for part in parts] == [
        [key for key, place in zip(every, places) if low <= place < high]
        for low, high in ((0, 20), (20, 45), (45, n))]
    ok("sample", dataset, tmp_path / "s.msgpack", "12", "--seed", seed, "-q")
    assert keys(tmp_path / "s.msgpack") == [key for key, place in zip(every, places) if place < 12]


def _tool_peaks(folder, n: int) -> dict[str, int]:
    """The peak of traced memory of each tool over two datasets of ``n`` tiny samples."""
    folder.mkdir()
    for name in ("a", "b"):
        with RawWriter(folder / f"{name}.msgpack") as writer:
            for key in (f"{name}{i:08d}" for i in range(n)):
                writer.write(key, msgpack.packb({"key": key}))
    runs = {"merge": ["merge", "a.msgpack", "b.msgpack", "m.msgpack", "--strategy", "random"],
            "split": ["split", "a.msgpack", "--fractions", "0.3", "-o", "x.msgpack",
                      "y.msgpack", "--shuffle"],
            "sample": ["sample", "b.msgpack", "s.msgpack", str(n // 2)],
            "shuffle": ["shuffle", "a.msgpack", "i.msgpack", "--mode", "index"],
            "verify": ["verify", "m.msgpack"]}
    peaks = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        for name, run in runs.items():
            tracemalloc.start()
            try:
                assert main([*run, "-q"]) == 0, name
                peaks[name] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    assert len(MsgpackReader(folder / "m.msgpack")) == 2 * n
    assert len(MsgpackReader(folder / "s.msgpack")) == n // 2
    return peaks


@pytest.mark.slow
def test_the_tools_hold_nothing_per_sample(tmp_path, monkeypatch):
    shrink_storage_bounds(monkeypatch, offsets=1 << 16, pending=1 << 18, bloom_bytes=1 << 16)
    monkeypatch.setattr(reorder, "_BLOCK", 1024)
    small, large = 70_000, 210_000  # past the batches of 65,536 keys
    before, after = _tool_peaks(tmp_path / "small", small), _tool_peaks(tmp_path / "large", large)
    per_sample = {name: (after[name] - before[name]) / (large - small) for name in before}
    # A table of keys takes 100 bytes a sample and more (measured: 378 for the old merge, 283
    # for the old verify); what buffers hold at the moment of the peak varies by 2 MB or so.
    # (The permutations of split and sample, 8 bytes a sample, are ruled out above.)
    assert all(grew < 30 for grew in per_sample.values()), per_sample


def test_the_passes_over_the_keys_show_progress(tmp_path, monkeypatch):
    import fpipe.cli.repair as repair

    counted: dict[str, int] = {}

    class Bar:
        def __init__(self, args, iterable=None, *, desc="", **options):
            self.desc = desc

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return None

        def update(self, done):
            counted[self.desc] = counted.get(self.desc, 0) + done

    for module in (reorder, repair):
        monkeypatch.setattr(module, "progress_bar", Bar)
    a = make_dataset(tmp_path / "a.msgpack", 30, prefix="a")
    b = make_dataset(tmp_path / "b.msgpack", 20, prefix="b")
    assert main(["merge", str(a), str(b), str(tmp_path / "m.msgpack")]) == 0
    assert main(["verify", str(tmp_path / "m.msgpack")]) == 0
    assert counted["checking the keys"] == 50 == counted["checking the keys of m.msgpack"]
