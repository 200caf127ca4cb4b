"""Code execution throughput and worst cases: `sarl.checking.code.sandbox` (a fresh runner per program, from the fork
server, + a separate judge; run as root, also through bubblewrap and as a caller that is not root) on
MBPP-like programs vs. what a user would write first (one plain `subprocess.run(["python", "-c", program + tests])` per
program) and the start-up floor (the same with `python -I -S`: no site-packages), each side at the same
concurrency (the reward's `max_workers`, default min(8, cores)) and one at a time, on the same programs and tests;
in programs per second of wall time and per CPU-second (per core: the machine's busy time while the side ran,
/proc/stat); and the slowest wall time of each hostile program kind under the limits of
conf/reward/code_exec.yaml. The headline is the sandbox against the floor at equal concurrency.

The baselines have no limits, no isolation and no output cap, and judge inside the program's own process: they are
the floor of process start-up cost, not a safe alternative. Figures are medians of alternating repeats.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from sarl.bench.common import median
from sarl.bench.unprivileged import AsUser, unprivileged_uid
from sarl.checking.code.sandbox import Sandbox

# (solution, MBPP-style tests): ordinary programs of the size MBPP's solutions have.
MBPP_LIKE = [
    (
        "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n"
        "        if n % i == 0:\n            return False\n        i += 1\n    return True\n",
        "assert is_prime(2)\nassert not is_prime(15)\nassert is_prime(97)\n",
    ),
    (
        "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
        "assert reverse_words('a b c') == 'c b a'\nassert reverse_words('x') == 'x'\n",
    ),
    (
        "import heapq\ndef k_smallest(xs, k):\n    return heapq.nsmallest(k, xs)\n",
        "assert k_smallest([5, 1, 4, 2], 2) == [1, 2]\nassert k_smallest([3], 1) == [3]\n",
    ),
    (
        "from collections import Counter\ndef most_common_char(s):\n    return Counter(s).most_common(1)[0][0]\n",
        "assert most_common_char('abracadabra') == 'a'\nassert most_common_char('zz') == 'z'\n",
    ),
    (
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        "assert fib(10) == 55\nassert fib(0) == 0\nassert fib(30) == 832040\n",
    ),
    (
        "import re\ndef count_vowels(s):\n    return len(re.findall('[aeiou]', s.lower()))\n",
        "assert count_vowels('Hello World') == 3\nassert count_vowels('xyz') == 0\n",
    ),
    (
        "def max_subarray(xs):\n    best = cur = xs[0]\n    for x in xs[1:]:\n        cur = max(x, cur + x)\n"
        "        best = max(best, cur)\n    return best\n",
        "assert max_subarray([-2, 1, -3, 4, -1, 2, 1, -5, 4]) == 6\nassert max_subarray([-1]) == -1\n",
    ),
    (
        "import math\ndef lcm(a, b):\n    return a * b // math.gcd(a, b)\n",
        "assert lcm(4, 6) == 12\nassert lcm(7, 3) == 21\n",
    ),
]

# Each hostile kind and the outcome the sandbox gives it, against the tests HOSTILE_TESTS (no program defines a right
# `add`): what the sandbox contains runs and fails the tests; what hits a limit is counted under it.
HOSTILE_TESTS = "assert add(1, 2) == 3\n"
HOSTILE = {
    "infinite loop": ("while True:\n    pass\n", "timeout"),
    "sleep": ("import time\ntime.sleep(3600)\n", "timeout"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()\n", "failed"),
    "huge allocation": ("x = bytearray(64 * 1024 ** 3)\n", "memory"),
    "os.system": ("import os\nos.system('echo escaped')\n", "failed"),
    "read /etc/passwd": ("print(open('/etc/passwd').read())\n", "failed"),
    "write /tmp": ("open('/tmp/sandbox_escape', 'w').write('x')\n", "failed"),
    "kill the parent": ("import os\nos.kill(os.getppid(), 9)\n", "failed"),
    "print a gigabyte": ("import sys\nfor _ in range(16384):\n    sys.stdout.write('x' * 65536)\n", "output_limit"),
    "syntax error": ("def f(:\n    pass\n", "syntax_error"),
    "network": ("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n", "failed"),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", "crashed"),
    "always-equal answer": (
        "class Any(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Any(0)\n",
        "failed",
    ),
}


def plain_subprocess(
    jobs: list[tuple[str, str]], timeout_s: float, flags: tuple[str, ...] = (), workers: int = 1
) -> list[bool]:
    """The baseline: `python [flags] -c program+tests` per job, `workers` at a time; True where it exits 0."""

    def one(job: tuple[str, str]) -> bool:
        program, tests = job
        try:
            done = subprocess.run(
                [sys.executable, *flags, "-c", program + "\n" + tests], capture_output=True, timeout=timeout_s
            )
            return done.returncode == 0
        except subprocess.TimeoutExpired:
            return False

    if workers <= 1:
        return [one(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, jobs))


def cpu_seconds() -> float:
    """Busy CPU time of the whole machine (/proc/stat: user, nice, system, irq, softirq, steal), in seconds.
    A process's own counters miss the sandbox: bwrap exits without reaping its pid namespace's init, so the
    interpreters inside are counted by no one's `os.times()`. The machine's counter sees everything, other load
    included: the sides alternate, so that load falls on each alike."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_code_exec(cfg: DictConfig, console: Console) -> dict:
    settings = OmegaConf.to_container(cfg.reward.sandbox, resolve=True)
    sandbox = Sandbox(**settings)
    workers = cfg.reward.max_workers or min(8, len(os.sched_getaffinity(0)))  # run_many's default, for every side
    jobs = [MBPP_LIKE[i % len(MBPP_LIKE)] for i in range(cfg.programs)]
    console.print(
        f"sandbox: {sandbox.isolation}; python {sandbox.python}; {workers} at a time on every concurrent side"
    )
    ok_ours = [r.outcome for r in sandbox.run_many(jobs, workers)]  # warm-up and correctness (not timed)
    ok_plain = plain_subprocess(jobs, sandbox.timeout_s)
    timeout = sandbox.timeout_s
    # with the fork server, its alternative too (what a machine where the server cannot start gets), and as root
    # the sandbox of a caller that is not root (most cluster users: no slot uids, no cgroup), in a helper process
    wrapped = Sandbox(**{**settings, "fork_server": False}) if sandbox.zygote() is not None else None
    ok_wrapped = [r.outcome for r in wrapped.run_many(jobs, workers)] if wrapped else []
    user = AsUser(unprivileged_uid(), settings) if os.geteuid() == 0 else None
    ok_user = [r.outcome for r in user.run_many(jobs, workers)] if user else []
    if user is not None:
        console.print(f"not root: {user.info['isolation']}")
    sides = {}
    for how, n in (("concurrent", workers), ("one at a time", 1)):
        sides[f"sandbox, {how}"] = partial(sandbox.run_many, jobs, n)
        if wrapped is not None:
            sides[f"sandbox through bubblewrap, {how}"] = partial(wrapped.run_many, jobs, n)
        if user is not None:
            sides[f"sandbox, caller not root, {how}"] = partial(user.run_many, jobs, n)
        sides[f"plain subprocess.run, {how}"] = partial(plain_subprocess, jobs, timeout, (), n)
        sides[f"python -I -S (the floor), {how}"] = partial(plain_subprocess, jobs, timeout, ("-I", "-S"), n)
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for _ in range(cfg.repeats):  # alternating: a load change on the shared machine favours no side
            for name, fn in sides.items():
                c0, t0 = cpu_seconds(), time.perf_counter()
                fn()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(cpu_seconds() - c0)
    finally:
        if user is not None:
            user.close()
    rates = {name: len(jobs) / median(ts) for name, ts in wall.items()}
    per_cpu = {name: len(jobs) / max(median(ts), 1e-9) for name, ts in cpu.items()}
    table = Table(title=f"{len(jobs)} MBPP-like programs, median of {cfg.repeats} alternating repeats")
    for col in ("side", "programs/s", "vs the floor, same concurrency", "programs per CPU-second", "passed"):
        table.add_column(col, justify="right")
    for name, rate in rates.items():
        how = name.split(", ")[-1]
        floor = rates[f"python -I -S (the floor), {how}"]
        outcomes = ok_wrapped if "bubblewrap" in name else ok_user if "not root" in name else None
        outcomes = ok_ours if outcomes is None and name.startswith("sandbox") else outcomes
        passed = all(o == "passed" for o in outcomes) if outcomes is not None else all(ok_plain)  # same code
        table.add_row(name, f"{rate:.1f}", f"{rate / floor:.2f}x", f"{per_cpu[name]:.1f}", str(passed))
    console.print(table)
    floor_ratio = rates["sandbox, concurrent"] / rates["python -I -S (the floor), concurrent"]

    hostile: dict[str, dict] = {}
    for kind, (program, expected) in HOSTILE.items():
        runs = [sandbox.run(program, HOSTILE_TESTS) for _ in range(cfg.hostile_repeats)]
        outcomes = sorted({r.outcome for r in runs})
        hostile[kind] = {"worst_wall_s": max(r.wall_s for r in runs), "outcomes": outcomes, "expected": expected}
    table = Table(
        title=f"hostile programs: worst wall time of {cfg.hostile_repeats} runs (timeout {sandbox.timeout_s} s)"
    )
    for col in ("program", "worst wall s", "outcome", "as expected"):
        table.add_column(col, justify="right")
    for kind, row in hostile.items():
        table.add_row(
            kind, f"{row['worst_wall_s']:.2f}", ", ".join(row["outcomes"]), str(row["outcomes"] == [row["expected"]])
        )
    console.print(table)
    return {
        "programs": len(jobs),
        "isolation": sandbox.isolation,
        "max_workers": workers,
        "seconds": wall,
        "cpu_seconds": cpu,
        "programs_per_s": rates,
        "programs_per_cpu_s": per_cpu,
        "floor_ratio": floor_ratio,  # the sandbox's programs/s over the floor's, both `workers` at a time
        "per_core_ratio": per_cpu["sandbox, concurrent"] / per_cpu["python -I -S (the floor), concurrent"],
        "not_root_floor_ratio": (
            rates["sandbox, caller not root, concurrent"] / rates["python -I -S (the floor), concurrent"]
            if user
            else None
        ),
        "not_root_isolation": user.info["isolation"] if user else None,
        "all_passed": all(o == "passed" for o in ok_ours),
        "hostile": hostile,
    }
