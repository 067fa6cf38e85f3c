"""One rank of the even_batches test: ``python -m tests.torch._even_rank RANK REPORT``.

The launcher (test_even_batches.py) sets MASTER_ADDR, MASTER_PORT and WORLD_SIZE. Each rank
reads its part of a corpus of documents that grow longer with their position (so the ranks'
parts hold different numbers of tokens) through fpipe's IterableDataset with Shards(even="drop"),
packs them into rows in each of two DataLoader workers, and counts the batches: without the
wrapper, with even_batches(..., even="drop") around a DistributedDataParallel training, with
even="pad", on a group of its own, and with a loader that raises on one rank. It writes what
it saw to REPORT as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import fpipe
from fpipe.dataset import ListReader
from fpipe.torch import IterableDataset, Shards, even_batches

DOCUMENTS = 120  # document i has 5 + i tokens
ROW, BATCH = 64, 3


class PackedReads(torch.utils.data.IterableDataset):
    """Packs what an fpipe.torch.IterableDataset reads, in the worker that reads it."""

    def __init__(self, documents: IterableDataset) -> None:
        self.documents = documents

    def __iter__(self):
        return iter(fpipe.pack(ROW, fields=["tokens"])(self.documents))


def _loader() -> tuple[IterableDataset, DataLoader]:
    reader = ListReader([{"tokens": np.arange(5 + i) + 1000 * i} for i in range(DOCUMENTS)])
    documents = IterableDataset(reader, layout=Shards(even="drop"))
    return documents, DataLoader(PackedReads(documents), batch_size=BATCH, num_workers=2,
                                 multiprocessing_context="fork")


def _tokens(batch) -> list[int]:
    return batch["tokens"][batch["segment_ids"] > 0].tolist()


def _counts(report: dict) -> None:
    """Batches and tokens of each epoch without the wrapper: they differ between ranks."""
    documents, loader = _loader()
    for epoch in (0, 1):
        documents.set_epoch(epoch)
        batches = list(loader)
        report[f"raw/{epoch}"] = len(batches)
        report[f"raw/{epoch}/tokens"] = sorted(t for batch in batches for t in _tokens(batch))


def _training(report: dict) -> None:
    """Two epochs of DistributedDataParallel steps over even_batches(loader): a rank with a
    step more would hang the others in its backward pass."""
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(ROW, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    documents, loader = _loader()
    batches = even_batches(loader)
    for epoch in (0, 1):
        documents.set_epoch(epoch)
        steps, tokens = 0, []
        for batch in batches:
            loss = model(batch["tokens"].float() / 1e5).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            tokens += _tokens(batch)
        report[f"drop/{epoch}"], report[f"drop/{epoch}/tokens"] = steps, sorted(tokens)
    report["drop/weight"] = float(model.module.weight.detach().sum())


def _padded(report: dict) -> None:
    documents, loader = _loader()
    batches = even_batches(loader, dist.new_group(backend="gloo"), even="pad")
    seen = [_tokens(batch) for batch in batches]
    report["pad/0"], report["pad/0/repeated"] = len(seen), batches.repeated
    report["pad/0/tokens"] = sorted(t for batch in seen[:len(seen) - batches.repeated] for t in batch)


class _Failing:
    """Batches 0, 1, 2, ... on every rank; rank ``rank`` raises instead of batch 3."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self):
        for step in range(10):
            if step == 3 and dist.get_rank() == self.rank:
                raise KeyError("a broken batch")
            yield step


def _failing(report: dict) -> None:
    handed = []
    try:
        for step in even_batches(_Failing(rank=1)):
            handed.append(step)
    except Exception as error:
        report["error"] = [type(error).__name__, str(error), handed]


def main(rank: int, output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=60))
    report = {"rank": rank}
    for part in (_counts, _training, _padded, _failing):
        part(report)
    dist.barrier()
    dist.destroy_process_group()
    with open(output, "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
