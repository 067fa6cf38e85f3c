"""One gloo rank of the remote test: ``python -m tests.remote._rank RANK URL CACHE REPORT``.

Credentials and the endpoint come from the AWS_* environment variables, as they would on a
cluster; the rank reads its shard of the URL with two DataLoader workers and writes the keys
it saw to REPORT as JSON.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch.distributed as dist
from torch.utils.data import DataLoader

from fpipe.dataset import MsgpackReader
from fpipe.remote import RemoteOptions
from fpipe.torch import IterableDataset, Samples, Shards


def main(rank: int, url: str, cache: str, report: str) -> None:
    dist.init_process_group("gloo", rank=rank, timeout=timedelta(seconds=120))
    try:
        dataset = IterableDataset(MsgpackReader(url, remote=RemoteOptions(cache_dir=cache, block_size=16384)),
                                  layout=Shards(shuffle=True), samples=Samples(seed=1))
        keys = [key for batch in DataLoader(dataset, batch_size=32, num_workers=2)
                for key in batch["key"]]
        with open(report, "w", encoding="utf-8") as file:
            json.dump(keys, file)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
