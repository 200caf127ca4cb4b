"""What a verl run shows on the console while Ray, vLLM and verl's workers write to a log file: a line per
training step as its record reaches metrics.jsonl, and at the end a table of the steps (like the TRL back end's)
or, when it failed, the line that says why and the tail of the log.

verl's file logger appends `{"step": N, "data": {metric: value}}` lines (the RL trainer's validation as a record of
its own); `StepLines.poll` reads what was appended since its last call and says each step once, when its training
metrics are there. Before the first step (minutes: Ray, the workers, the model, the rollout servers, the first
validation), `PhaseLines.poll` says each start-up phase as verl's log shows it and, when nothing was said for
`every_s` seconds, that the run is still at its last phase: no silence of more than ~10 s.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

VERL_LOG = "verl.log"  # a verl run's output (the driver, Ray, every worker), in its run directory
# (column, candidate metric names: the first present is shown), verl's RL and SFT trainers' names
STEP_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("critic/score/mean", "reward/mean")),
    ("SR", ("reward/sr/mean",)),
    ("failed", ("reward/failed",)),
    ("KL", ("actor/kl_loss", "actor/kl")),
    ("entropy", ("actor/entropy",)),
    ("length", ("response_length/mean",)),
    ("loss", ("train/loss", "actor/pg_loss")),
    ("s/step", ("timing_s/step", "train/time_per_step")),
)
TRAINING_KEYS = ("actor/pg_loss", "train/loss", "critic/score/mean")  # a step's record, not only its validation
STOP_PREFIX = "training stopped:"  # sarl.backends.verl.main's one line when the rewards kept failing


def flat(record: dict[str, Any]) -> dict[str, Any]:
    """A metrics.jsonl line as `{"step", metric: value}` (verl nests the metrics under `data`)."""
    return {"step": record["step"], **record["data"]} if isinstance(record.get("data"), dict) else record


def step_cells(row: dict[str, Any]) -> list[tuple[str, Any]]:
    """(column, value) of STEP_COLUMNS present in one step's metrics."""
    cells = []
    for column, names in STEP_COLUMNS:
        name = next((n for n in names if isinstance(row.get(n), (int, float)) and not isinstance(row[n], bool)), None)
        if name is not None:
            cells.append((column, row[name]))
    return cells


def step_line(row: dict[str, Any], total: int | None = None) -> str:
    """`step 3/10  reward=0.41 KL=0.0012 ...`"""
    of = f"/{total}" if total else ""
    return f"step {int(row['step'])}{of}  " + " ".join(f"{c}={v:.4g}" for c, v in step_cells(row))


class StepLines:
    """Follows a run's metrics.jsonl: `poll()` says (via `say`) each step whose training metrics arrived since the
    last call, once. A partial last line (the writer is mid-line) is left for the next call."""

    def __init__(self, path: Path, total: int | None = None, say: Callable[[str], None] = log.info) -> None:
        self.path, self.total, self.say = Path(path), total, say
        self.said: set[int] = set()
        try:  # a resumed run's earlier steps are already in the file: only what is appended from now on is said
            self.offset = self.path.stat().st_size
        except FileNotFoundError:
            self.offset = 0

    def poll(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:  # not there yet, or unreadable for a moment: the next call tries again
            return
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for raw in chunk[:end].splitlines():
            try:
                row = flat(json.loads(raw))
            except (ValueError, TypeError, KeyError):
                continue  # not a record of ours to judge here; read_metrics_history names bad lines at the end
            step = row.get("step")
            if isinstance(step, int) and step not in self.said and any(k in row for k in TRAINING_KEYS):
                self.said.add(step)
                self.say(step_line(row, self.total))


def log_tail(path: Path, n: int = 30) -> list[str]:
    """The last `n` lines of a log that say something (Python's warnings about optional engines left out)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    keep = [x for x in lines if x.strip() and "UserWarning" not in x and "warnings.warn(" not in x]
    return keep[-n:]


def stop_line(path: Path) -> str | None:
    """The run's own one-line reason for stopping (STOP_PREFIX), if its log has one."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    return next((x.strip() for x in reversed(text.splitlines()) if x.strip().startswith(STOP_PREFIX)), None)


def steps_table(rows: list[dict[str, Any]]) -> Any:
    """A rich table of the training steps (STEP_COLUMNS that some step has)."""
    from rich.table import Table

    rows = [r for r in rows if any(k in r for k in TRAINING_KEYS)]
    columns = [c for c, _ in STEP_COLUMNS if any(c == name for r in rows for name, _ in step_cells(r))]
    table = Table(title="per-step metrics")
    table.add_column("step", justify="right")
    for c in columns:
        table.add_column(c, justify="right")
    for r in rows:
        cells = dict(step_cells(r))
        table.add_row(str(int(r["step"])), *("" if c not in cells else f"{cells[c]:.4g}" for c in columns))
    return table


# verl's start-up, as its log says it (verl 0.9.1's RL trainer; the SFT trainer's lines where they differ)
STARTUP_PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Ray is up", re.compile(r"Started a local Ray instance|Connected to Ray cluster")),
    ("the data is loaded", re.compile(r"dataloader initialized|Total training steps")),
    ("the model workers are starting", re.compile(r"create worker group")),
    ("the policy (and reference) are loaded", re.compile(r"actor and ref model engine initialized")),
    ("the rollout servers are starting", re.compile(r"checkpoint engine manager initialized|LLMServerManager")),
    ("ready: the first validation or step", re.compile(r"all initialize finished|ready to fit")),
)


class PhaseLines:
    """Follows verl's log from its current end: `poll()` says (via `say`) each start-up phase once, in order, and,
    when nothing was said for `every_s` seconds (by this or by anything else that calls `heard()`), that the run is
    still going, with its last phase and how long it has run."""

    def __init__(self, path: Path, say: Callable[[str], None] = log.info, every_s: float = 8.0, clock=time.monotonic):
        self.path, self.say, self.every_s, self.clock = Path(path), say, every_s, clock
        self.start = self.last = clock()
        self.seen: list[str] = []
        self.news = ""
        try:
            self.offset = self.path.stat().st_size
        except FileNotFoundError:
            self.offset = 0

    def heard(self, line: str = "") -> None:
        """Something was said now (a step's line): the silence starts again, and the line is the run's latest news."""
        self.last = self.clock()
        self.news = line[:80] or self.news

    def poll(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        self.offset += len(chunk)
        text = chunk.decode("utf-8", "replace")
        for name, pattern in STARTUP_PHASES:
            if name not in self.seen and pattern.search(text):
                self.seen.append(name)
                self._say(f"verl: {name} ({self.clock() - self.start:.0f} s)")
        if self.clock() - self.last >= self.every_s:
            latest = self.news or (self.seen[-1] if self.seen else "starting")
            self._say(f"verl: running, {self.clock() - self.start:.0f} s in; last: {latest} (its output: {self.path})")

    def _say(self, line: str) -> None:
        self.last = self.clock()
        self.say(line)
