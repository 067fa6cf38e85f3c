"""The shared-memory transport of process results, with real worker processes (loky's, as the
process stage uses them) and, for the faults, real consumers in fresh interpreters.

Every test counts the slab names in /dev/shm of the consumer concerned before and after.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import fpipe as fp
from fpipe.stream.parallel import _shm

from ..signals import check_interruptible, start_interruptible

pytestmark = [pytest.mark.skipif(not _shm.available(), reason="no /dev/shm on this system"),
              pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 20.0  # generous: nothing waits on a sleep, this only catches a hang
Pair = collections.namedtuple("Pair", "image label")


def loky_pool():
    # loky's workers, but not joblib's shared pool: a plain loky pool there would break
    # joblib's next call (it expects its own kind of executor)
    from joblib.externals.loky import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=2)
    yield pool
    pool.shutdown(wait=True)


executor = pytest.fixture(loky_pool, scope="module", name="executor")
fresh_executor = pytest.fixture(loky_pool, name="fresh_executor")  # workers with no slab yet


def image(value: int, shape=(128, 128, 3), dtype=np.float32) -> np.ndarray:
    return np.full(shape, value, dtype)


def make(transport, count, shape=(128, 128, 3)):
    """A worker's result: large arrays nested every way, small ones beside them."""
    _shm.watch_owner(transport.owner)
    out = [(image(i, shape), Pair(image(255 - i, shape, np.uint8), i),
            {"small": np.arange(4), "big": [image(i + 1, shape)]}) for i in range(count)]
    return _shm.encode(transport, out)


def run(executor, transport, count=4, shape=(128, 128, 3)):
    value, reason = executor.submit(make, transport, count, shape).result()
    assert reason is None
    return value


def own_names(pid: int | None = None) -> list[str]:
    return _shm.names(os.getpid() if pid is None else pid)


def settled_names() -> list[str]:
    """This process's slab names once the chunks that earlier tests left running are done:
    their results are mapped (and their names removed) as they arrive."""
    wait_until(lambda: not own_names())
    return own_names()


def wait_until(predicate, deadline=DEADLINE) -> float:
    began = time.monotonic()
    while not predicate():
        assert time.monotonic() - began < deadline, "timed out"
        time.sleep(0.05)
    return time.monotonic() - began


def test_large_arrays_arrive_as_views_of_shared_memory_and_small_ones_inline(executor):
    transport = _shm.Transport.for_consumer(2)
    before = settled_names()
    value = run(executor, transport)
    first, pair, fields = value[3]
    assert _shm.is_shared(first) and _shm.is_shared(pair.image) and _shm.is_shared(fields["big"][0])
    assert isinstance(pair, Pair) and pair.label == 3 and not _shm.is_shared(fields["small"])
    np.testing.assert_array_equal(first, image(3))
    np.testing.assert_array_equal(pair.image, image(252, dtype=np.uint8))
    assert first.flags.writeable and own_names() == before == []


@pytest.mark.parametrize("array", [
    np.arange(20000, dtype=">i4"),  # another byte order
    np.arange(60000, dtype=np.float64).reshape(300, 200)[:, ::2],  # not contiguous
    np.zeros(5000, dtype=[("a", np.int32), ("b", np.float64)]),  # structured
    np.ones((100, 100), dtype=bool).T[::-1],
])
def test_every_plain_dtype_and_layout_round_trips(executor, array):
    transport = _shm.Transport.for_consumer(2, threshold=1024)
    [back], reason = executor.submit(_shm.encode, transport, [array]).result()
    assert reason is None and _shm.is_shared(back)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_object_arrays_and_small_arrays_stay_in_the_pipe(executor):
    transport = _shm.Transport.for_consumer(2)
    value = [np.array([object()] * 10000), np.zeros(transport.threshold - 1, np.uint8)]
    back, reason = executor.submit(_shm.encode, transport, value).result()
    assert reason is None and not any(_shm.is_shared(array) for array in back)


def test_in_the_consumers_own_process_nothing_is_encoded():
    transport = _shm.Transport.for_consumer(2)
    value = [image(1, (256, 256))]
    assert _shm.encode(transport, value) == (value, None)


def test_slabs_are_reused_and_a_held_array_is_never_overwritten(executor):
    transport = _shm.Transport.for_consumer(2)
    kept = run(executor, transport)[2][0]  # held for the whole test
    before = set(_shm._reader().slabs)
    for _ in range(40):
        value = run(executor, transport)
        assert value[1][0][0, 0, 0] == 1
        del value  # released: its slab is free again
    np.testing.assert_array_equal(kept, image(2))
    # two workers, each with the held slab and one or two in turn; never one per result
    assert len(set(_shm._reader().slabs) - before) <= 4
    assert own_names() == []


def test_past_the_budget_results_go_through_the_pipe(executor):
    transport = _shm.Transport.for_consumer(2, budget=1 << 20)  # one slab of 1 MiB each
    value, reason = executor.submit(make, transport, 40).result()  # 40 * 440 KiB: too big
    assert reason == "budget"
    assert not _shm.is_shared(value[0][0])
    np.testing.assert_array_equal(value[39][2]["big"][0], image(40))
    assert own_names() == []


def kill_self_after_encoding(transport):
    # a new slab, named, that nobody maps
    _shm.encode(transport, [image(1, (2048, 1024))])
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_workers_segment_is_removed_by_the_sweep():
    from joblib.externals.loky import ProcessPoolExecutor
    from joblib.externals.loky.process_executor import TerminatedWorkerError

    transport = _shm.Transport.for_consumer(2)
    assert own_names() == []
    with ProcessPoolExecutor(max_workers=1) as broken, pytest.raises(TerminatedWorkerError):
        broken.submit(kill_self_after_encoding, transport).result()
    [left] = own_names()  # the name nobody mapped
    assert left in _shm.sweep(os.getpid())
    assert own_names() == []


def test_torch_tensors_travel_as_tensors_in_shared_memory(executor):
    torch = pytest.importorskip("torch")
    import fpipe.torch  # noqa: F401  (registers tensors)

    transport = _shm.Transport.for_consumer(2)
    assert ("torch.Tensor", "fpipe.torch:_TENSORS") in transport.kinds
    tensors = executor.submit(_tensors, transport).result()
    big, small, grad = tensors
    assert isinstance(big, torch.Tensor) and in_a_slab(big.data_ptr())
    assert torch.equal(big, torch.arange(50000, dtype=torch.float32).reshape(500, 100))
    assert small.numel() == 3 and grad.requires_grad  # these two went through the pipe


def in_a_slab(address: int) -> bool:
    slabs = _shm._reader().slabs.values()
    return any(slab.ctypes.data <= address < slab.ctypes.data + slab.nbytes for slab in slabs)


def _tensors(transport):
    import torch

    values = [torch.arange(50000, dtype=torch.float32).reshape(500, 100), torch.ones(3),
              torch.ones(50000, requires_grad=True)]
    value, reason = _shm.encode(transport, values)
    assert reason is None
    return value


# --- consumers that die: in a fresh interpreter each -------------------------------------

CONSUMER = """
import os, sys, time
import numpy as np
from joblib.externals.loky import get_reusable_executor
from fpipe.stream.parallel import _shm
from tests.streaming.test_shm import make, worker_pid

transport = _shm.Transport.for_consumer(2)
executor = get_reusable_executor(max_workers=2)
pids = sorted({executor.submit(worker_pid, transport).result() for _ in range(20)})
held = [executor.submit(make, transport, 8, (256, 256, 3)) for _ in range(6)]
held = [future.result() for future in held]
print(" ".join(map(str, pids)), flush=True)
while True:  # results keep coming: some are always in flight
    held.append(executor.submit(make, transport, 8, (256, 256, 3)).result())
    held = held[-8:]
"""


def worker_pid(transport):
    _shm.watch_owner(transport.owner)
    time.sleep(0.01)
    return os.getpid()


def start_consumer() -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # SIGINT at its default disposition, whatever this process ignores (a background job of a
    # shell script ignores it), so that the consumer can be interrupted
    process = start_interruptible([sys.executable, "-c", textwrap.dedent(CONSUMER)], cwd=ROOT,
                                  env=env, stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in process.stdout.readline().split()]
    assert pids, "the consumer did not start"
    return process, pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return _state(pid) not in ("Z", "X")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def test_a_killed_consumers_workers_exit_and_leave_no_segment(record_property):
    process, pids = start_consumer()
    owner = process.pid
    process.kill()
    process.wait()
    process.stdout.close()
    seconds = wait_until(lambda: not any(alive(pid) for pid in pids))
    record_property("workers_gone_seconds", round(seconds, 2))
    assert _shm._names(owner, runs=True) == []  # the run's file too


def test_ctrl_c_leaves_no_segment():
    process, pids = start_consumer()
    try:
        check_interruptible(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(DEADLINE) != 0
    finally:
        if process.poll() is None:  # a failed check: no victim left running for ever
            process.kill()
            process.wait()
    process.stdout.close()
    wait_until(lambda: not any(alive(pid) for pid in pids))
    assert _shm.names(process.pid) == []


def test_the_next_start_removes_what_a_killed_run_left():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    owner = int(dead.stdout)  # a pid that has exited
    leftover = Path(_shm.DIRECTORY, f"{_shm.PREFIX}{os.getuid()}-{owner}-{owner}-1-abcdef01")
    leftover.write_bytes(b"\0" * 4096)
    unrelated = Path(_shm.DIRECTORY, f"not-fpipe-{owner}")
    unrelated.write_bytes(b"")
    try:
        code = "from fpipe.stream.parallel import _shm; _shm.Transport.for_consumer(2)"
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
        assert not leftover.exists() and unrelated.exists()
    finally:
        unrelated.unlink()
        leftover.unlink(missing_ok=True)


def test_the_sweep_leaves_other_users_names_and_skips_what_it_may_not_remove(monkeypatch):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    owner, uid = int(dead.stdout), os.getuid()  # a consumer that has exited
    names = {"unnamed user's": f"{_shm.PREFIX}{owner}-{owner}-1-abcdef01",  # no uid: any user's
             "other user's": f"{_shm.PREFIX}{uid + 1}-{owner}-{owner}-1-abcdef01",
             "planted": f"{_shm.PREFIX}{uid}-{owner}-{owner}-2-abcdef02",  # ours by name only
             "ours": f"{_shm.PREFIX}{uid}-{owner}-{owner}-3-abcdef03"}
    paths = {kind: Path(_shm.DIRECTORY, name) for kind, name in names.items()}
    for path in paths.values():
        path.write_bytes(b"")
    unlink = os.unlink

    def refused(path, *args, **kwargs):  # what /dev/shm (sticky) says to a user not its owner
        if Path(path).name in (names["unnamed user's"], names["planted"]):
            raise PermissionError(1, "Operation not permitted", path)
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refused)
    try:
        removed = _shm.sweep()
        _shm.Transport.for_consumer(2)  # a new stage starts as usual
    finally:
        monkeypatch.undo()
        for path in paths.values():
            path.unlink(missing_ok=True)
    assert names["ours"] in removed
    assert not {names["unnamed user's"], names["other user's"], names["planted"]} & set(removed)


def test_names_of_other_files_are_not_taken_for_slabs():
    uid = os.getuid()
    assert _shm._pids(f"{_shm.PREFIX}{uid}-12-34-5-abcdef01") == (12, 34)
    assert _shm._pids(f"{_shm.RUN_PREFIX}{uid}-12-abcdef01") == (12, 12)
    for name in [f"{_shm.PREFIX}{uid}-12-x-5-ab", f"{_shm.PREFIX}{uid}-12-34", "psm_12-34-5-ab",
                 "sem.x", f"{_shm.PREFIX}12-34-5-abcdef01",  # an older fpipe's: no uid
                 f"{_shm.PREFIX}{uid + 1}-12-34-5-abcdef01", f"{_shm.RUN_PREFIX}{uid}-x-ab"]:
        assert _shm._pids(name) is None


def test_the_default_budget_is_a_share_of_dev_shm_below_lokys_leak_alarm():
    stat = os.statvfs(_shm.DIRECTORY)
    one, four = _shm.default_budget(1), _shm.default_budget(4)
    assert four <= one <= max(stat.f_blocks * stat.f_frsize // 4, 1 << 20) and four >= 1 << 20
    assert one <= 256 << 20  # loky restarts a worker whose memory grew by 300 MB


def combined_in_place(transport, count, keep=True):
    """A worker's task that stacks a batch with fpipe's combiner: what it sends, whether the
    batch lay in a lent slab (so encoding copied nothing), how many more of the worker's slabs
    are taken after the task than before it, and the worker's pid."""
    writer = _shm._writer(transport)
    taken_before = sum(slab.state[0] != 0 for slab in writer.slabs)
    with _shm.lending(transport):
        images, labels = fp.combine_to_arrays([(image(i), i) for i in range(count)])
        in_place = writer.lent_slab(images) is not None
        value, reason = _shm.encode(transport, [images, labels] if keep else [labels])
    taken = sum(slab.state[0] != 0 for slab in writer.slabs) - taken_before
    return value, reason, in_place, taken, os.getpid()


def test_a_batch_stacked_by_fpipe_in_a_worker_crosses_without_a_copy(fresh_executor):
    # a worker's first batch makes its slab (with a copy); once the consumer has let go of it,
    # every later batch is stacked straight into it
    transport = _shm.Transport.for_consumer(2)
    seen = set()
    for _ in range(8):
        (images, labels), reason, in_place, taken, worker = fresh_executor.submit(
            combined_in_place, transport, 8).result()
        assert reason is None and _shm.is_shared(images) and taken == 1
        assert in_place == (worker in seen)
        seen.add(worker)
        np.testing.assert_array_equal(images, np.stack([image(i) for i in range(8)]))
        assert labels.tolist() == list(range(8)) and own_names() == []
        del images, labels  # the slab is free again


def test_a_lent_slab_that_is_not_sent_is_free_again_after_the_task(executor):
    transport = _shm.Transport.for_consumer(2)
    for _ in range(4):  # warm: every worker has a slab that carried a batch
        run(executor, transport, count=8)
    for _ in range(6):
        [labels], reason, in_place, taken, _ = executor.submit(
            combined_in_place, transport, 8, False).result()
        assert reason is None and taken == 0 and labels.tolist() == list(range(8))
    assert own_names() == []


def test_without_a_free_slab_the_batch_is_made_plainly_and_copied_once(fresh_executor):
    transport = _shm.Transport.for_consumer(2)
    kept = []  # every result held: no slab is ever free to lend
    for _ in range(4):
        (images, _), reason, in_place, _, _ = fresh_executor.submit(
            combined_in_place, transport, 8).result()
        assert reason is None and not in_place and _shm.is_shared(images)
        kept.append(images)
    np.testing.assert_array_equal(kept[-1], np.stack([image(i) for i in range(8)]))
    assert own_names() == []


def test_outside_a_task_the_combiner_makes_plain_arrays():
    images, _ = fp.combine_to_arrays([(image(i), i) for i in range(4)])
    assert not _shm.is_shared(images) and images.base is None


@pytest.mark.parametrize("keep, held", [(None, 3), (1, 2), (0, 1)])
def test_a_worker_keeps_as_many_free_slabs_as_it_is_told(keep, held):
    # a stage with a memory budget keeps one: the slabs in use are bounded by its chunks, and
    # free ones beside them would be memory outside the budget
    writer = _shm._Writer(os.getpid(), "")
    try:
        taken = []
        for _ in range(3):  # three results held at once: three slabs
            slab = writer.slab_for(1 << 20, 1 << 30, keep)
            slab.state[0] = 1
            taken.append(slab)
        for slab in taken:  # all let go of
            slab.state[0] = 0
        assert writer.slab_for(1 << 20, 1 << 30, keep) in taken
        assert len(writer.slabs) == held
    finally:
        writer.unlink_all()
