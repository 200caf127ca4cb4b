"""The lock files (`requirements/gpu.lock`, `requirements/cpu.lock`, written by `scripts/lock.sh`): read, and
compared with what is installed. A GPU node's preflight fails where its packages are not gpu.lock's; the tests fail
where the CPU environment is not cpu.lock's or the two locks diverge (decisions §7.6)."""

from __future__ import annotations

import re
from pathlib import Path

from sarl.runtime.node_checks import installed_version

LOCK_DIR = Path(__file__).resolve().parents[2] / "requirements"
GPU_LOCK = LOCK_DIR / "gpu.lock"
CPU_LOCK = LOCK_DIR / "cpu.lock"
# The packages whose versions differ between the locks, and why (decisions §7.6). Nothing else may.
CPU_EXCEPTIONS = {"torch": "the CPU wheel: torch 2.11 has no CPU build on PyPI"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==(\S+)")


def canonical(name: str) -> str:
    """PEP 503's normalised name: case and runs of `-_.` do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """{canonical name: version} of each `name==version` line of a lock file."""
    pins = {}
    for line in path.read_text().splitlines():
        if m := _PIN.match(line):
            pins[canonical(m.group(1))] = m.group(2)
    if not pins:
        raise ValueError(f"{path}: no `name==version` line; regenerate it with `bash scripts/lock.sh`")
    return pins


def inputs_hash(path: Path) -> str | None:
    """The `# inputs-sha256:` a lock was resolved from (scripts/lock_inputs.py), None where it has none."""
    for line in path.read_text().splitlines()[:5]:
        if line.startswith("# inputs-sha256:"):
            return line.split(":", 1)[1].strip()
    return None


def same_version(installed: str, locked: str) -> bool:
    """Equal but for a local build label on the installed side (`2.11.0+cu126` is the lock's `2.11.0`)."""
    return installed == locked or installed.split("+", 1)[0] == locked.split("+", 1)[0] and "+" not in locked


def diverging(lock: dict[str, str]) -> list[tuple[str, str | None, str]]:
    """(name, installed version or None, locked version) of each locked package this environment does not have at
    the lock's version."""
    out = []
    for name, want in sorted(lock.items()):
        have = installed_version(name)
        if have is None or not same_version(have, want):
            out.append((name, have, want))
    return out


def describe(diffs: list[tuple[str, str | None, str]], most: int = 6) -> str:
    """`transformers 5.10.4 (lock 5.9.0), vllm missing (lock 0.24.0), ... and N more`."""
    parts = [f"{n} {have or 'missing'} (lock {want})" for n, have, want in diffs[:most]]
    more = f" and {len(diffs) - most} more" if len(diffs) > most else ""
    return ", ".join(parts) + more


def lock_divergence(gpu: dict[str, str], cpu: dict[str, str], exceptions: dict[str, str] = CPU_EXCEPTIONS) -> list[str]:
    """What makes cpu.lock other than gpu.lock with the listed exceptions: a package only the CPU side has, a
    version that differs without an exception, an exception whose versions no longer differ (stale)."""
    problems = []
    for name, version in sorted(cpu.items()):
        if name not in gpu:
            problems.append(f"{name}=={version} is in cpu.lock only")
        elif version != gpu[name] and name not in exceptions:
            problems.append(f"{name}: cpu.lock {version}, gpu.lock {gpu[name]}")
    for name in sorted(exceptions):
        if name in cpu and cpu[name] == gpu.get(name):
            problems.append(f"{name} is listed as an exception but both locks have {cpu[name]}")
    return problems
