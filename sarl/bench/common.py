"""What every benchmark report shares: the machine line, thread settings, alternating repeats, memory."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
import tracemalloc
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console


def machine() -> dict:
    """Cores, load average, date, versions and what the host gives right now (`host_probe`): printed at the start
    and end of every report."""
    import numpy as np
    import sklearn

    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "cores": os.cpu_count(),
        "cpu": cpu_model() or platform.processor() or platform.machine(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "numpy": np.__version__,
        "sklearn": sklearn.__version__,
        **host_probe(),
    }


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# The probe's sizes: a 128 MB float32 copy; Gram products of one response at the paper's shape (79 steps x 1,024).
PROBE_COPY_FLOATS = 32 * 2**20
PROBE_GRAM_SHAPE = (79, 1024)
PROBE_GRAMS = 256


def host_probe(repeats: int = 3) -> dict:
    """What this host gives at the moment, to compare figures measured on hosts of the same name (a virtual
    machine's memory bandwidth and CPU share vary from one host to the next): the memory copy rate (a 128 MB
    float32 array copied into another, GB/s read + written) and the rate of Gram products of a 79 x 1,024
    float32 response on one thread, per second: numpy's `x @ x.T` (BLAS, the figure earlier reports give) and the
    reward's compiled `sarl.structure.gram.gram`. Best of `repeats`; ~0.4 s."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from sarl.structure.gram import gram  # deferred: numba loads the compiled kernels; only when a report probes

    src = np.ones(PROBE_COPY_FLOATS, dtype=np.float32)
    dst = np.zeros_like(src)  # both touched before timing
    copy_s = min(timed(lambda: np.copyto(dst, src))[0] for _ in range(repeats))
    xs = np.random.default_rng(0).standard_normal((PROBE_GRAMS, *PROBE_GRAM_SHAPE), dtype=np.float32)
    with threadpool_limits(limits=1, user_api="blas"):
        gram_s = min(timed(lambda: [x @ x.T for x in xs])[0] for _ in range(repeats))
    kernel_s = min(timed(lambda: [gram(x) for x in xs])[0] for _ in range(repeats))
    return {
        "memory_copy_gb_s": round(2 * src.nbytes / copy_s / 1e9, 1),
        "gram_79x1024_per_s_1_thread": round(PROBE_GRAMS / gram_s),
        "gram_kernel_79x1024_per_s_1_thread": round(PROBE_GRAMS / kernel_s),
    }


def print_machine(console: Console, when: str, info: dict) -> None:
    console.print(
        f"[bold]{when}[/]: {info['date_utc']} UTC, {info['cores']} cores ({info['cpu']}), "
        f"load average {info['load_avg_1_5_15'][0]} / {info['load_avg_1_5_15'][1]} / {info['load_avg_1_5_15'][2]} "
        f"(1/5/15 min), numpy {info['numpy']}, scikit-learn {info['sklearn']}\n"
        f"host now: memory copy {info['memory_copy_gb_s']} GB/s; Gram products of 79 x 1,024 float32 per s on 1 "
        f"thread: {info['gram_79x1024_per_s_1_thread']} with BLAS, {info['gram_kernel_79x1024_per_s_1_thread']} with "
        "the reward's kernel"
    )


@contextmanager
def thread_settings(threads: int, console: Console) -> Iterator[dict]:
    """The same thread limits for our code and the baseline: BLAS and OpenMP pools through threadpoolctl,
    torch's intra-op pool when torch is loaded. Yields what was set (printed)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    torch_before = None
    try:
        import torch

        torch_before = torch.get_num_threads()
        torch.set_num_threads(threads)
    except ImportError:
        torch = None
    with threadpool_limits(limits=threads):
        pools = sorted({f"{p['internal_api']}={p['num_threads']}" for p in threadpool_info()})
        settings = {"threads": threads, "pools": pools, "torch": torch.get_num_threads() if torch else None}
        console.print(
            f"threads: {threads} for both sides (threadpoolctl: {', '.join(pools) or 'no pools loaded'}; "
            f"torch.set_num_threads({settings['torch']}))"
        )
        try:
            yield settings
        finally:
            if torch is not None and torch_before is not None:
                torch.set_num_threads(torch_before)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def alternate(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Run each side once per repeat, in turn (a, b, a, b, ...), and return every side's times.
    Alternating keeps a load change on the shared machine from favouring one side."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            times[name].append(timed(fn)[0])
    return times


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def peak_memory_mb(fn: Callable[[], object]) -> float:
    """Peak of Python and numpy allocations during fn (tracemalloc, MB above what was allocated before;
    BLAS/OpenMP scratch buffers are not seen). Run separately from the timed calls (tracemalloc is slow)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return (tracemalloc.get_traced_memory()[1] - before) / 2**20
    finally:
        tracemalloc.stop()


BUSY_CODE = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def busy_load(n: int, max_s: float, console: Console) -> Iterator[list[int]]:
    """`n` busy processes beside the measurement (each spins on one core, as a training node's reward workers, data
    loaders and rollout engine keep theirs busy), started here, bounded by `max_s` seconds each (they end by
    themselves if this process dies) and stopped here by their process ids. Yields the ids."""
    import subprocess
    import sys

    procs = [
        subprocess.Popen([sys.executable, "-c", BUSY_CODE.format(seconds=float(max_s))], stdin=subprocess.DEVNULL)
        for _ in range(int(n))
    ]
    if procs:
        console.print(f"load: {n} busy processes (pids {', '.join(str(p.pid) for p in procs)}, at most {max_s:.0f} s)")
        time.sleep(0.5)  # running before the first measurement
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
