"""fpipe.stats: counts, shares, the bottleneck."""

import time

import pytest
from toolz import pipe

import fpipe as fp


def slow(x):
    time.sleep(0.002)
    return x


def test_counts_are_exact_per_stage():
    stream = pipe(range(1000), fp.stream.map(abs), fp.stream.filter(lambda x: x % 2), fp.batch(10),
                  fp.take(20))
    assert len(list(stream)) == 20
    rows = fp.stats(stream)
    assert [(row.name, row.items) for row in rows] == [
        ("source(range)", 400), ("map(abs)", 400), ("filter(<lambda>)", 200),
        ("batch(10)", 20), ("take(20)", 20)]


def test_the_slow_stage_is_named_the_bottleneck():
    stream = pipe(range(200), fp.stream.map(abs), fp.stream.map(slow), fp.batch(8))
    list(stream)
    report = fp.stats(stream)
    assert report.bottleneck == "map(slow)"
    busy = {row.name: row.busy for row in report}
    assert busy["map(slow)"] > 0.5 > busy["map(abs)"]
    assert "bottleneck: map(slow)" in str(report)


def test_a_parallel_stage_reports_its_busy_workers():
    stream = pipe(range(300), fp.threads(slow, n_workers=2), fp.batch(10))
    list(stream)
    row = fp.stats(stream)[1]
    assert row.name == "threads(slow, n_workers=2)" and row.items == 300
    assert row.busy > 0.5 and fp.stats(stream).bottleneck == row.name


def test_a_slow_consumer_is_the_bottleneck():
    stream = pipe(range(30), fp.stream.map(abs), fp.prefetch(4))
    for _ in stream:
        time.sleep(0.003)
    report = fp.stats(stream)
    assert report.bottleneck == "the consumer"
    assert report[-1].waiting_output > 0.5


def test_stats_of_a_stream_that_has_not_started():
    rows = fp.stats(pipe([1], fp.stream.map(abs)))
    assert [row.items for row in rows] == [0, 0] and rows.bottleneck == "none"


def test_a_stage_that_is_mostly_idle_is_not_named_the_bottleneck():
    rows = fp.stream.Stats([fp.stream.StageStats("source(generator)", 256, 66.8, 0.01, 0.0, 0.99),
                     fp.stream.StageStats("processes(augment, n_workers=2)", 2, 0.5, 0.02, 0.0, 0.97),
                     fp.stream.StageStats("prefetch(2)", 2, 0.5, 0.0, 1.0, 0.0)])
    assert rows.bottleneck == "none"
    assert str(rows).splitlines()[-1] == (
        "bottleneck: none (no stage works half of the time, the busiest is "
        "processes(augment, n_workers=2) at 2%, and the consumer is not waited for)")
    busy = fp.stream.Stats([*rows[:1], fp.stream.StageStats("processes(augment)", 2, 0.5, 0.6, 0.0, 0.4)])
    assert busy.bottleneck == "processes(augment)"


def test_stats_of_a_stage_object_says_to_pass_its_stream():
    import fpipe

    stage = fpipe.processes(abs, backend="threading")
    with pytest.raises(TypeError, match=r"not the stage processes\(abs.*keep the stream"):
        fpipe.stats(stage)
    batch_iter = fpipe.Infinite(range(3), batch_size=1, batches_per_epoch=1)
    with pytest.raises(TypeError, match="call its stats\\(\\) method"):
        fpipe.stats(batch_iter)
    with pytest.raises(TypeError, match="takes a stream .*got 3"):
        fpipe.stats(3)
