"""The stages that run in the background: ``threads``, ``processes`` and ``prefetch``
(``stages``), their runs (``_background``; joblib is touched only by ``_joblib``, which also
pickles what crosses to the workers and back), shared
memory for the results of processes (``_shm``), the tuner that sizes the pools (``_tuner``)
and the planner that fuses stages and explains a pipeline (``planner``). :mod:`fpipe.stream`
re-exports the public names; this package's ``__init__`` imports nothing, so that any of its
modules can be imported on its own.
"""

__all__: list[str] = []
