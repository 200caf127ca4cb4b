"""The README's first commands as a newcomer runs them: wall time and the longest silence of each.

Each command runs as a subprocess of this Python (`sys.executable ARGS...`) with its stdout and stderr joined, read
line by line as they come (PYTHONUNBUFFERED=1: lines arrive as a terminal would show them; a carriage return, as a
progress bar writes, ends a line too), each line stamped. Reported per command: the exit code, the wall time, the
number of lines and the longest gap between two consecutive lines (the start and the exit count as lines), with
the two lines around it. A report, not a test: no figure is asserted.

`{root}` in a command's arguments is a fresh directory of this bench run (the run directories and the policy cache
go there: the train command builds the policy from nothing, as in a fresh clone); `{train_run}` is `{root}/train`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from sarl.bench.common import busy_load


def timed_lines(argv: list[str], log_path: Path | None = None, env: dict[str, str] | None = None) -> dict:
    """Run `argv`, stamping each output line: exit code, wall time, lines, the longest gap and its two lines."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    stamps: list[tuple[float, str]] = [(0.0, "(start)")]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=env,
    )
    log = log_path.open("w", buffering=1) if log_path is not None else None  # line by line: readable while it runs
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # universal newlines: "\r" ends a line as "\n" does
            now = time.monotonic() - start
            stamps.append((now, line.rstrip("\n")))
            if log is not None:
                log.write(f"[{now:8.2f}] {line}")
        rc = proc.wait()
    finally:
        if log is not None:
            log.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - start
    stamps.append((wall, f"(exit {rc})"))
    gaps = [(b[0] - a[0], a, b) for a, b in zip(stamps, stamps[1:])]
    gap, before, after = max(gaps, key=lambda g: g[0])
    return {
        "rc": rc,
        "wall_s": round(wall, 2),
        "lines": len(stamps) - 2,
        "longest_gap_s": round(gap, 2),
        "gap_from_s": round(before[0], 2),
        "gap_before": before[1][:300],
        "gap_after": after[1][:300],
    }


def run_commands(section: DictConfig, console: Console, work: Path, load: int = 0, load_max_s: float = 3600) -> dict:
    """Every command of `section` (`{name: [args...]}`, in order), idle and, with `load` and `under_load`, again
    beside `load` busy processes; the table of wall times and longest gaps."""
    listed = OmegaConf.to_container(section.run) if section.get("run") else {}  # run=null: no commands
    commands = {k: [str(a) for a in v] for k, v in listed.items()}
    if not commands:
        return {"commands": []}
    conditions = [0, load] if load and section.under_load else [0]
    rows = []
    for n in conditions:
        with tempfile.TemporaryDirectory(prefix="sarl-bench-commands-") as root:
            for name, args in commands.items():
                argv = [sys.executable, *(a.format(root=root, train_run=f"{root}/train") for a in args)]
                where = "idle" if not n else f"beside {n} busy processes"
                console.print(f"command {name} ({where}): {' '.join(argv[1:])}")
                with busy_load(n, load_max_s, console):
                    row = timed_lines(argv, work / f"command-{name}-load{n}.log")
                rows.append({"command": name, "load": n, "argv": argv[1:], **row})
                console.print(
                    f"  exit {row['rc']}, {row['wall_s']:.1f} s, {row['lines']} lines, longest gap "
                    f"{row['longest_gap_s']:.1f} s after {row['gap_from_s']:.1f} s"
                )
                if row["rc"] != 0:
                    break  # a later command may need this one's result (eval.run reads the train run)
    console.print(commands_table(rows))
    return {"commands": rows}


def commands_table(rows: list[dict]) -> Table:
    table = Table(title="the README's first commands: wall time and the longest gap between two lines of output")
    for col in ("command", "load", "exit", "wall s", "lines", "longest gap s", "at s"):
        table.add_column(col, justify="right")
    table.add_column("between", justify="left", overflow="fold")
    for r in rows:
        table.add_row(
            r["command"],
            str(r["load"]),
            str(r["rc"]),
            f"{r['wall_s']:.1f}",
            str(r["lines"]),
            f"{r['longest_gap_s']:.1f}",
            f"{r['gap_from_s']:.1f}",
            f"{r['gap_before'][:90]!r} -> {r['gap_after'][:90]!r}",
        )
    return table
