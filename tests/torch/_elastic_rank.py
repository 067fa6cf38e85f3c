"""One rank of the elastic resume test:
``python -m tests.torch._elastic_rank RANK WORKERS BATCH_SIZE STEPS DATASET STATE REPORT``.

The launcher (test_elastic_distributed.py) sets MASTER_ADDR, MASTER_PORT and WORLD_SIZE. The
rank builds an elastic IterableDataset, loads STATE (a JSON file of a state_dict; ``-`` starts
epoch 1 from its beginning), trains a DistributedDataParallel model on STEPS batches (all of
them if STEPS is -1) with WORKERS DataLoader workers, and writes to REPORT its batches and the
state after them.
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

import fpipe
from fpipe.dataset import MsgpackReader
from fpipe.torch import Compose, Elastic, IterableDataset, Samples


def draw(_sample) -> dict:
    return {"p": float(fpipe.current_rng().random())}


def make(path: str, batch_size: int) -> IterableDataset:
    return IterableDataset(MsgpackReader(path), {"x": Compose(abs)}, draw, batch_size=batch_size,
                           layout=Elastic(even="drop"), samples=Samples(seed=11))


def train(dataset: IterableDataset, workers: int, batch_size: int, steps: int) -> list:
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    batches = []
    for batch in DataLoader(dataset, batch_size=batch_size, num_workers=workers):
        loss = model(batch["x"].float().unsqueeze(1)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # a rank with a batch more than the others would wait here forever
        optimizer.step()
        batches.append(list(zip(batch["x"].tolist(), batch["__params__"]["p"].tolist())))
        if len(batches) == steps:
            break
    return batches


def main(rank: int, workers: int, batch_size: int, steps: int, path: str, state: str,
         output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=60))
    dataset = make(path, batch_size)
    if state == "-":
        dataset.set_epoch(1)
    else:
        with open(state) as file:
            dataset.load_state_dict(json.load(file))
    batches = train(dataset, workers, batch_size, steps)
    report = {"rank": dataset.rank, "world_size": dataset.world_size, "batches": batches,
              "state": dataset.state_dict(len(batches))}
    dist.barrier()
    dist.destroy_process_group()
    with open(output, "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    rank, workers, batch_size, steps = map(int, sys.argv[1:5])
    main(rank, workers, batch_size, steps, *sys.argv[5:8])
