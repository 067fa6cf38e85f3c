"""The process stage on dask.distributed: the same pipeline, unchanged, on a LocalCluster."""

import pytest
from toolz import pipe

import fpipe as fp

from .helpers import fail_at, noisy

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            yield client


def test_the_pipeline_runs_unchanged_on_dask(client):
    stage = fp.processes(noisy, n_workers=2, backend="dask", seed=3, options=fp.ParallelOptions(chunk_size=8))
    try:
        on_dask = list(pipe(range(200), stage, fp.batch(10)))
        again = list(pipe(range(200), stage, fp.batch(10)))  # a second epoch, same workers
        errors = fp.processes(fail_at, n_workers=2, backend="dask")
        with pytest.raises(KeyError, match="bad item 7"):
            list(errors(range(20)))
    finally:
        stage.close()
        errors.close()
    reference = list(pipe(range(200), fp.stream.map(noisy, seed=3), fp.batch(10)))
    assert on_dask == reference
    assert [x for b in again for x, _ in b] == list(range(200)) and again != reference
