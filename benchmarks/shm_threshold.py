"""Where shared memory starts to pay for the results of a process stage.

``python -m benchmarks.shm_threshold``: for arrays of 4 KiB to 4 MiB, the round trip of a
chunk of 16 of them from one loky worker, pickled through the pipe and through
``fpipe.stream.parallel._shm``, alternating, median of 30 round trips each. The threshold of the
process stage (``_shm.THRESHOLD``) sits where shared memory becomes the cheaper of the two.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

SIZES = (4096, 16384, 32768, 65536, 262144, 1 << 20, 4 << 20)
PER_CHUNK, ROUND_TRIPS = 16, 30


def chunk(transport, size: int, shared: bool) -> list:
    from fpipe.stream.parallel import _shm

    out = [np.ones(size // 4, np.float32) for _ in range(PER_CHUNK)]
    return _shm.encode(transport, out)[0] if shared else out


def round_trip(executor, transport, size: int, shared: bool) -> float:
    times = []
    for _ in range(ROUND_TRIPS):
        began = time.perf_counter()
        result = executor.submit(chunk, transport, size, shared).result()
        float(result[-1][0])
        del result
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    from joblib.externals.loky import ProcessPoolExecutor

    from fpipe.stream.parallel import _shm

    executor = ProcessPoolExecutor(max_workers=1)
    transport = _shm.Transport.for_consumer(1, threshold=1)
    print(f"chunks of {PER_CHUNK} arrays, median of {ROUND_TRIPS} round trips (ms)")
    for size in SIZES:
        round_trip(executor, transport, size, True)  # warm-up: the worker makes its slab
        pipe = min(round_trip(executor, transport, size, False) for _ in range(2))
        shared = min(round_trip(executor, transport, size, True) for _ in range(2))
        print(f"{size // 1024:>6} KiB  pipe {pipe * 1e3:7.2f}  shared memory {shared * 1e3:7.2f}  "
              f"pipe / shared {pipe / shared:5.2f}")


if __name__ == "__main__":
    main()
