"""The Lightning callback of :class:`fpipe.Infinite` (``Infinite.closing_callback``): it closes
the batch iterator when the trainer tears down or fails, and gives Ctrl-C back after Lightning
ignored it. Lightning is imported here, when the callback is made, never with fpipe. Private:
:mod:`fpipe.infinite` uses it.

>>> LIGHTNING_PACKAGES
('lightning.pytorch', 'pytorch_lightning')
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from typing import Any

__all__ = ["LIGHTNING_PACKAGES", "closing_callback", "lightning_callbacks"]

LIGHTNING_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def lightning_callbacks() -> tuple:
    """The ``Callback`` classes of the Lightning packages in use; if none is imported yet, of
    the first one that can be."""
    loaded = tuple(sys.modules[name].Callback for name in LIGHTNING_PACKAGES if name in sys.modules)
    if loaded:
        return loaded
    for name in LIGHTNING_PACKAGES:
        try:
            return (__import__(name, fromlist=["Callback"]).Callback,)
        except ImportError:
            continue
    raise ImportError("closing_callback needs Lightning: pip install lightning "
                      "(or pytorch_lightning)")


@functools.cache
def _closing_callback_class(bases: tuple) -> type:
    # a subclass of each Lightning's Callback in use, so that either Trainer accepts it
    def __init__(self, batch_iter: Any) -> None:
        self.batch_iter = batch_iter
        self.sigint = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.sigint = _sigint_handler()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.batch_iter.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.batch_iter.close()
        _restore_sigint(self.sigint)

    namespace = {"__init__": __init__, "setup": setup, "teardown": teardown,
                 "on_exception": on_exception, "__module__": __name__,
                 "__doc__": "Closes a batch iterator on teardown and on exception (and then "
                            "lets Ctrl-C through again if Lightning ignored it)."}
    return type("ClosingCallback", bases, namespace)


def _sigint_handler() -> Any:
    """SIGINT's handler, or None outside the main thread (where it cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.getsignal(signal.SIGINT)


def _restore_sigint(handler: Any) -> None:
    # On a KeyboardInterrupt, Lightning ignores SIGINT so that a second Ctrl-C cannot cut its
    # shutdown short, then raises SystemExit, and never undoes it: a program that goes on
    # (a notebook, a caller that catches SystemExit) would be deaf to Ctrl-C for good. The
    # pipeline is closed by now, so SIGINT gets back the handler it had when training began.
    ignored = _sigint_handler() is signal.SIG_IGN
    if ignored and handler is not None and handler is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handler)


def closing_callback(batch_iter: Any) -> Any:
    """A Lightning callback that closes ``batch_iter`` on teardown and on exception, a
    subclass of each Lightning ``Callback`` in use (see ``Infinite.closing_callback``).

    >>> from fpipe import Infinite
    >>> closing_callback(Infinite(range(4), batch_size=2, batches_per_epoch=1))  # doctest: +SKIP
    """
    return _closing_callback_class(lightning_callbacks())(batch_iter)
