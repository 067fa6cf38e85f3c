"""Fit a tiny model from an Infinite with the ``Trainer`` of one Lightning package, and print
what tests/infinite/test_lightning.py checks, as JSON:
``python tests/infinite/_lightning_fit.py lightning|pytorch_lightning``.

It runs in a fresh interpreter, so that the package is the only Lightning imported; Lightning
and torch are imported in :func:`main`, not when this module is collected.
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
import threading

import numpy as np

from fpipe import Infinite, Threads, sample

BATCHES = 5
DATA = [(x, np.float32(x.sum())) for x in np.random.default_rng(0).random((64, 4))]


def as_float32(pair: tuple) -> tuple:
    x, y = pair
    return x.astype(np.float32), np.float32(y)


def fpipe_threads() -> list:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("fpipe-"))


def model_class(pl, torch) -> type:
    class Tiny(pl.LightningModule):
        def __init__(self, fail_at=None, interrupt_setup=False):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.fail_at, self.interrupt_setup, self.seen = fail_at, interrupt_setup, []

        def setup(self, stage):
            if self.interrupt_setup:  # a Ctrl-C while setup downloads the data, say
                raise KeyboardInterrupt

        def training_step(self, batch, batch_idx):
            if self.global_step == self.fail_at:
                raise RuntimeError("training failed")
            x, y = (torch.as_tensor(field) for field in batch)
            self.seen.append(len(x))
            return torch.nn.functional.mse_loss(self.layer(x).squeeze(-1), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny


def fit(pl, model, closing: bool = True) -> dict:
    batch_iter = Infinite(sample(DATA, random_state=0), Threads(as_float32, n_workers=2),
                          batch_size=8, batches_per_epoch=BATCHES)
    callback = batch_iter.closing_callback
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback] if closing else [])
    error = None
    try:
        trainer.fit(model, train_dataloaders=batch_iter)
    except RuntimeError as caught:
        error = str(caught)
    except SystemExit as caught:  # how Lightning ends a fit that a KeyboardInterrupt stopped
        error = f"SystemExit({caught.code})"
    report = {"steps": trainer.global_step, "epochs": trainer.current_epoch, "seen": model.seen,
              "error": error, "threads_after": fpipe_threads(),
              "is_callback": isinstance(callback, pl.Callback), "sigint": sigint_handler()}
    batch_iter.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as the next fit expects it
    return report


def sigint_handler() -> str:
    handler = signal.getsignal(signal.SIGINT)
    names = {signal.SIG_IGN: "SIG_IGN", signal.SIG_DFL: "SIG_DFL",
             signal.default_int_handler: "default_int_handler"}
    return names.get(handler, repr(handler))


def both_packages(package: str, pl) -> bool:
    """Once the other package is imported too, the callback is a Callback of both."""
    other = importlib.import_module("pytorch_lightning" if package == "lightning" else
                                    "lightning.pytorch")
    callback = Infinite(range(3), batch_size=1, batches_per_epoch=1).closing_callback
    return isinstance(callback, pl.Callback) and isinstance(callback, other.Callback)


def main(package: str) -> None:
    import torch

    pl = importlib.import_module("lightning.pytorch" if package == "lightning" else package)
    tiny = model_class(pl, torch)
    report = {"fit": fit(pl, tiny()), "failed": fit(pl, tiny(fail_at=3)),
              "without_callback": fit(pl, tiny(), closing=False),
              "interrupted": fit(pl, tiny(interrupt_setup=True)),
              "interrupted_without_callback": fit(pl, tiny(interrupt_setup=True), closing=False),
              "both": both_packages(package, pl)}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
