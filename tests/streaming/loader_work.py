"""A torch dataset whose items come from a process stage, for the DataLoader tests (imported
by the DataLoader's workers, so it is a module of its own: it imports torch)."""

import os

import torch

import fpipe as fp

from .helpers import doubled_here


class DoubledByProcesses(torch.utils.data.IterableDataset):
    """range(count), doubled by a process stage, each DataLoader worker taking its share;
    each item comes with the pid of the process that doubled it and of the loader's worker."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        share = range(info.id, self.count, info.num_workers)
        for doubled, pid in fp.processes(doubled_here, n_workers=2)(share):
            yield doubled, pid, os.getpid()
