"""What every dataset writer shares: staged output, overwrite rules, order, workers, checks."""

import threading

import pytest

import fpipe.sets
from fpipe.dataset import MsgpackReader
from fpipe.sets import ArchiveError, cifar10, mnist
from fpipe.sets._writing import ordered_map

from .archives import make_cifar10, make_mnist, with_local_md5


def _keys(path):
    return [sample["key"] for sample in MsgpackReader(path)]


def test_ordered_map_keeps_the_order_for_any_number_of_workers():
    items = list(range(1000))
    for workers in (1, 2, 5):
        assert list(ordered_map(lambda x: x * x, items, workers, chunk_size=7)) == [x * x for x in items]


def test_ordered_map_raises_a_worker_error_in_the_consumer():
    def fail_at_42(x):
        if x == 42:
            raise KeyError(x)
        return x

    with pytest.raises(KeyError, match="42"):
        list(ordered_map(fail_at_42, range(100), workers=3, chunk_size=4))


def test_ordered_map_closed_early_stops_its_threads():
    before = threading.active_count()
    iterator = ordered_map(abs, range(10_000), workers=2, chunk_size=8)
    assert next(iterator) == 0
    iterator.close()
    assert threading.active_count() == before


def test_workers_and_a_seeded_shuffle_give_byte_identical_datasets(tmp_path):
    make_cifar10(tmp_path)
    dataset = with_local_md5(cifar10, tmp_path)
    files = {}
    for workers in (1, 3):
        for shuffle in (False, True):
            written = dataset.write(tmp_path / f"w{workers}{shuffle}", tmp_path, workers=workers,
                                    shuffle=shuffle, seed=11)
            files[workers, shuffle] = [path.read_bytes() for path in written.values()]
    assert files[1, False] == files[3, False] and files[1, True] == files[3, True]
    assert files[1, False] != files[1, True]


def test_the_shuffle_is_a_permutation_that_depends_on_the_seed_not_on_other_splits(tmp_path):
    make_cifar10(tmp_path)
    dataset = with_local_md5(cifar10, tmp_path)
    plain = _keys(dataset.write(tmp_path / "plain", tmp_path)["train"])
    seeded = [_keys(dataset.write(tmp_path / f"s{seed}", tmp_path, shuffle=True, seed=seed)["train"])
              for seed in (0, 1)]
    assert sorted(seeded[0]) == sorted(plain) and seeded[0] != plain and seeded[0] != seeded[1]
    alone = dataset.write(tmp_path / "alone", tmp_path, shuffle=True, seed=0, splits=["train"])
    assert _keys(alone["train"]) == seeded[0]


def test_an_existing_dataset_is_kept_unless_overwrite(tmp_path):
    make_cifar10(tmp_path)
    dataset = with_local_md5(cifar10, tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out/test.msgpack.classes.json").write_text("{}")
    (tmp_path / "out/notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"test.msgpack.classes.json \(a file of dataset "
                                              r".*test.msgpack\) exists; pass -y/--overwrite"):
        dataset.write(tmp_path / "out", tmp_path)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["notes.txt",
                                                                   "test.msgpack.classes.json"]
    (tmp_path / "out/train.msgpack.index").write_text("a stale legacy index")
    mine = ["train.msgpack.bak", "train.msgpack.bak2", "test.pdf", "test.txt", "train.msgpacks",
            "train.msgpack.keys.old", "train.msgpack.d/inside.txt"]
    (tmp_path / "out/train.msgpack.d").mkdir()
    for name in mine:
        (tmp_path / "out" / name).write_text(f"the user's {name}")
    dataset.write(tmp_path / "out", tmp_path, overwrite=True)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "train.msgpack.index" not in names and "notes.txt" in names
    assert all((tmp_path / "out" / name).read_text() == f"the user's {name}" for name in mine)
    # notes and the user's files, and each split's data, 6 index files (the key index among
    # them), classes
    assert len(names) == 1 + len(mine) + 2 * 8, names


def test_a_failed_run_leaves_no_dataset_and_no_staging_folder(tmp_path):
    make_cifar10(tmp_path)
    dataset = with_local_md5(cifar10, tmp_path)
    written = dataset.write(tmp_path / "out", tmp_path)
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"garbage")
    with pytest.raises(ArchiveError):
        dataset.write(tmp_path / "out", tmp_path, overwrite=True, verify=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert len(MsgpackReader(written["train"])) == 10


def test_a_failure_in_the_second_split_leaves_not_even_the_first(tmp_path):
    make_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(ArchiveError, match="t10k-labels-idx1-ubyte.gz: not a gzipped IDX file"):
        mnist.write(tmp_path / "out", tmp_path, verify=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arguments, message", [
    ({"workers": 0}, "workers must be >= 1; got workers=0"),
    ({"splits": ["val"]}, r"splits must be a non-empty subset of \('train', 'test'\); got"),
    ({"splits": []}, "splits must be a non-empty subset"),
    ({"base_url": "ftp://mirror/"}, "base_url must be an http:// or https:// URL"),
])
def test_arguments_are_checked_before_anything_happens(tmp_path, arguments, message):
    with pytest.raises(ValueError, match=message):
        mnist.write(tmp_path / "out", tmp_path, **arguments)
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_type_of_workers_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="workers must be an integer; got workers=True"):
        mnist.write(tmp_path / "out", tmp_path, workers=True)
    assert list(tmp_path.iterdir()) == []


def test_every_dataset_is_reachable_by_name_and_documents_its_schema():
    for name in fpipe.sets.names():
        dataset = fpipe.sets.get(name)
        assert dataset.name == name
        assert dataset.fields[:3] == ("key", "image", "label")
        assert set(dataset.classes()) == {"label", *dataset.fields[3:]}


def test_importing_the_sets_loads_neither_pillow_nor_torch():
    import subprocess
    import sys

    code = "import fpipe.sets, sys; print(sorted(m for m in ('PIL', 'torch', 'scipy') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
