"""The threads a reward's numerical kernels may use, chosen on purpose.

verl runs several reward workers per node beside the rollout engine and the data loaders; each BLAS or OpenMP pool
that sizes itself to the node's cores then spins against the others (measured on the 2-core machine with both cores
busy: the structure stage went from 0.23 ms to 0.7-10 ms per response). `limited(n)` caps the BLAS and OpenMP pools
already loaded in this process (threadpoolctl) for the duration of one kernel call: the structure stage (Gram
products, clustering, graph metrics), MaxFlow, the semantic clustering of EMPO and EVOL-RL. The number comes from the
reward's config (`threads`, conf/reward/*.yaml, default 1: per-response work is too small to gain from more), read by
`RewardFunction.threads`. The embedders are not capped here: they run a model and have their own settings.
`StructureReward` spends more than one thread across the batch instead (`run_each`): the steps' vectors normalised in
chunks and the responses clustered `threads` at a time, each with a one-thread BLAS, with the same results.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Sequence

_LOCK = threading.Lock()
_CONTROLLER: Any = None  # one threadpoolctl controller per process: making one inspects every loaded library (ms)


def controller() -> Any:
    global _CONTROLLER
    with _LOCK:
        if _CONTROLLER is None:
            from threadpoolctl import ThreadpoolController

            _CONTROLLER = ThreadpoolController()
        return _CONTROLLER


@contextlib.contextmanager
def limited(threads: int | None) -> Iterator[None]:
    """BLAS and OpenMP pools capped at `threads` inside the block (restored after); None: left as they are."""
    if threads is None:
        yield
        return
    if int(threads) < 1:
        raise ValueError(f"threads={threads}: a kernel needs at least 1 thread (null: leave the pools as they are)")
    with controller().limit(limits=int(threads)):
        yield


def pool_sizes() -> dict[str, int]:
    """The current size of each BLAS/OpenMP pool of this process, by its API (openblas, mkl, openmp, ...)."""
    return {lib.internal_api: lib.num_threads for lib in controller().lib_controllers}


def run_each(items: Sequence[Any], fn: Callable[[Any], None], threads: int | None) -> None:
    """fn(item) for every item, on `threads` threads (this one among them; None or 1: here, in order). Items are handed
    out in order as threads come free, so a core slowed by other processes takes fewer; fn's heavy parts must release
    the GIL (BLAS, numba's nogil kernels) for the threads to gain, and each item's result must not depend on the
    others (then it does not depend on the threads either). Of the items whose fn raised, the first one's error is
    raised, as a loop would. A BLAS pool's size (`limited`) holds in every thread; OpenMP's is each thread's own, and
    the kernels run here use none."""
    n = len(items)
    workers = min(int(threads or 1), n)
    if workers <= 1:
        for item in items:
            fn(item)
        return
    lock = threading.Lock()
    position = [0]
    errors: dict[int, BaseException] = {}

    def work() -> None:
        while True:
            with lock:
                k = position[0]
                position[0] += 1
            if k >= n:
                return
            try:
                fn(items[k])
            except BaseException as err:  # re-raised below, in item order
                errors[k] = err

    others = [threading.Thread(target=work, name=f"sarl-kernel-{t}", daemon=True) for t in range(1, workers)]
    for t in others:
        t.start()
    work()
    for t in others:
        t.join()
    if errors:
        raise errors[min(errors)]
