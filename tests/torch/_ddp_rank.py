"""One rank of the distributed test: ``python -m tests.torch._ddp_rank RANK DATASET REPORT``.

The launcher (test_distributed.py) sets MASTER_ADDR, MASTER_PORT and WORLD_SIZE. The rank
reads the dataset through fpipe's IterableDataset with two DataLoader workers, trains a
DistributedDataParallel model over every batch of two epochs with ``even=`` set, resumes a
shuffled epoch in its middle, and writes what it saw to REPORT as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from fpipe.dataset import MsgpackReader
from fpipe.torch import IterableDataset, Samples, Shards


def _positions(data_loader) -> list[int]:
    return [int(x) for batch in data_loader for x in batch["x"]]


def _sharding(reader: MsgpackReader) -> dict:
    """Epochs 0 and 1 without persistent workers (set_epoch), then with (passes count)."""
    report = {}
    dataset = IterableDataset(reader)
    report["rank"], report["world_size"] = dataset.rank, dataset.world_size
    data_loader = DataLoader(dataset, batch_size=4, num_workers=2)
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        report[f"set_epoch/{epoch}"] = _positions(data_loader)
    dataset.set_epoch(0)
    persistent = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True)
    for epoch in (0, 1):
        report[f"persistent/{epoch}"] = _positions(persistent)
    return report


def _training(reader: MsgpackReader, even: str) -> dict:
    """Train over every batch of two epochs; a rank with fewer batches would hang the rest."""
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    dataset = IterableDataset(reader, batch_size=2, layout=Shards(even=even))
    data_loader = DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=True)
    report = {}
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        batches = 0
        for batch in data_loader:
            loss = model(batch["x"].float().unsqueeze(1)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            batches += 1
        report[f"{even}/{epoch}"] = batches
    report[f"{even}/weight"] = float(model.module.weight.detach().sum())
    return report


def _batches(data_loader) -> list[list[int]]:
    return [[int(x) for x in batch["x"]] for batch in data_loader]


def _resumed(reader: MsgpackReader, done: int = 5) -> dict:
    """Epoch 1 of a shuffled, evened dataset whole, then again from batch ``done`` on with a
    new dataset and persistent workers, as a run restarted from a checkpoint would."""
    def loader(dataset):
        return DataLoader(dataset, batch_size=3, num_workers=2, persistent_workers=True)
    options = {"chunk_size": 2, "layout": Shards(even="drop", shuffle=True, buffer_samples=4),
               "samples": Samples(seed=0)}
    whole = IterableDataset(reader, epoch=1, **options)
    restarted = IterableDataset(reader, epoch=1, **options)
    restarted.resume(done, batch_size=3)
    return {"resume/whole": _batches(loader(whole)), "resume/restarted": _batches(loader(restarted))}


def main(rank: int, path: str, output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=60))
    reader = MsgpackReader(path)
    report = _sharding(reader)
    for even in ("drop", "pad"):
        report.update(_training(reader, even))
    report.update(_resumed(reader))
    dist.barrier()
    dist.destroy_process_group()
    with open(output, "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
