"""``fpipe bench`` and ``fpipe demo``: they finish, print their figures, and leave nothing behind."""

import importlib.util

import pytest

from fpipe.dataset import FileWriter, MsgpackReader

from .conftest import fails, make_dataset, mistake, ok


def test_bench_measures_every_read_and_the_pipeline(tmp_path):
    path = make_dataset(tmp_path / "set.msgpack", 300)
    out = ok("bench", path, "--seconds", "1", "--pipeline", "--workers", "1", "--batch-size", "16")
    lines = out.splitlines()
    assert lines[0] == f"{path}: 300 samples, 0.0 MB, decoded"
    assert lines[1].split() == ["read", "samples", "seconds", "samples/s", "MB/s"]
    assert [line.split()[:2] for line in lines[2:5]] == [
        ["sequential", "300"], ["random", "300"], ["quasi", "300"]]
    assert "pipeline: read -> processes(unpack_args(decode_sample), n_workers=1) -> batch(16)" in out
    assert "bottleneck:" in out and "batch(16)" in lines[-2]
    raw = ok("bench", path, "--raw", "--modes", "random", "-q").splitlines()
    assert raw[0].endswith("raw") and len(raw) == 3 and raw[2].startswith("random")


def test_bench_mistakes_exit_2(tmp_path, capsys):
    path = make_dataset(tmp_path / "set.msgpack", 10)
    assert "--modes must be a comma-separated list" in fails(2, "bench", path, "--modes", "fast")
    assert "--seconds: must be a finite number > 0" in mistake(capsys, 2, "bench", path,
                                                               "--seconds", "0")
    FileWriter(tmp_path / "empty.msgpack").close()
    assert "is empty" in mistake(capsys, 2, "bench", tmp_path / "empty.msgpack")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_the_demo_trains_through_a_dataloader_and_leaves_nothing_behind(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = ok("demo", "--images", "64", "--epochs", "2", "--batch-size", "16",
             env={"TMPDIR": str(scratch)})
    assert "1. made 64 smooth random 48x48 JPEG images in 4 classes" in out
    assert "2. $ fpipe write " in out and "wrote 64 samples" in out
    assert "-> DataLoader(batch_size=16, num_workers=2) -> a small CNN" in out
    assert "epoch 2/2: 64 samples in" in out and "accuracy" in out
    assert "source(DataLoader)" in out and "map(train_step)" in out
    assert "4. where the time went, per stage, in the last epoch (2/2) alone:" in out
    assert ("5. the plan (fpipe.explain: what runs where, with how many workers):\n"
            "source(DataLoader)\n"
            "    in 2 DataLoader worker processes: IterableDataset(layout=Shards(shuffle=True)) "
            "-> Augment(32) -> batches of 16 (torch's collate)\n"
            "map(train_step)\n") in out
    assert "nothing was left behind" in out
    assert list(scratch.iterdir()) == []  # torch's compiler cache folder too


def test_the_demo_without_torch_runs_fpipe_stages_and_keeps_files_when_asked(tmp_path, capsys):
    keep = tmp_path / "kept"
    out = ok("demo", "--no-torch", "--images", "40", "--classes", "2", "--epochs", "2",
             "--keep", keep)
    assert ("3. Infinite(Cycler(Shuffler(seed=0)), processes(Augment(32), n_workers=2, seed=0), "
            "batch_size=32, batches_per_epoch=2)") in out
    assert "epoch 2/2: 64 samples" in out  # an epoch is batches_per_epoch full batches
    assert "map(combine_to_arrays)" in out and "bottleneck:" in out
    assert "4. where the time went, per stage, over all 2 epoch(s), worker start-up included:" in out
    # the plan: the workers make whole batches, and take in shared memory as one piece
    assert ("processes(Augment(32), n_workers=2, seed=0) + map(combine_to_arrays)\n"
            "    fused: the workers make whole batches of 32") in out
    assert "    workers 2 (fixed); room for" in out
    assert f"the files are in {keep}" in out
    with MsgpackReader(keep / "demo.msgpack") as reader:
        assert len(reader) == 40
    assert sorted(p.name for p in (keep / "images").iterdir()) == ["green", "red"]
    assert "exists; pass -y/--overwrite" in fails(2, "demo", "--no-torch", "--keep", keep)
    assert "--classes must be at most 8" in mistake(capsys, 2, "demo", "--classes", "9")


def test_the_demo_takes_a_packed_dataset_as_its_data(tmp_path):
    import io

    import numpy as np
    from PIL import Image

    with FileWriter(tmp_path / "mine.msgpack") as writer:
        for i in range(40):
            image = io.BytesIO()
            Image.fromarray(np.full((16, 16, 3), 80 * (i % 3), np.uint8)).save(image, "PNG")
            writer.write({"key": f"k{i}", "image": image.getvalue(), "label": i % 3})
    out = ok("demo", "--no-torch", "--data", tmp_path / "mine.msgpack", "--epochs", "1")
    assert "wrote 40 samples from packed fpipe datasets" in out and "epoch 1/1" in out
