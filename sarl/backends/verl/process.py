"""verl's entry point (the RL driver, or torchrun for SFT) launched by `sarl.train`: its output (the driver, Ray,
every worker, vLLM) goes to `verl.log` in the run directory; the console gets a line per training step
(`sarl.reports.progress`) and, at the end, the steps' table, or the run's one-line reason for stopping, or the tail of
the log with its path."""

from __future__ import annotations

import logging
import shlex
import sys
import time
import warnings
from pathlib import Path

from sarl.reports.figures import METRICS_FILE, read_metrics_history
from sarl.reports.progress import VERL_LOG, PhaseLines, StepLines, log_tail, steps_table, stop_line
from sarl.runtime.signals import run_in_own_group

log = logging.getLogger("sarl.train")  # a part of `python -m sarl.train`: its lines keep that name


def quiet_verl_notices(cpu: bool) -> None:
    """verl's import-time notices that say nothing about a sarl run, kept off the console of sarl.train's own
    process: the optional engines it does not find (torchtitan, veomni, megatron, ...: sarl uses FSDP) and, on
    `backend=verl_cpu` only, its platform manager's "no accelerator detected" (on a GPU node that one matters)."""
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    if cpu:  # a filter, not a level: verl sets the logger's level when it imports the module, after this call
        logging.getLogger("verl.plugin.platform.platform_manager").addFilter(_errors_only)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def run_verl_process(cmd: list[str], run_dir: Path, env: dict[str, str], total_steps: int | None = None) -> int:
    """Run `cmd` in its own process group from `run_dir` (Ctrl-C or SIGTERM stops the whole group) and report as
    the module docstring says. Returns its exit code."""
    output = run_dir / VERL_LOG
    with output.open("a", encoding="utf-8") as f:  # a resumed run appends: each launch starts with this line
        f.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} sarl.train launches: {shlex.join(cmd)}\n")
    log.info("verl's output (Ray, its workers, the trainer) goes to %s; a line per step follows here", output)
    phases = PhaseLines(output, say=log.info)

    def said(line: str) -> None:
        phases.heard(line)
        log.info("%s", line)

    steps = StepLines(run_dir / METRICS_FILE, total_steps, say=said)

    def poll() -> None:  # every 2 s: the steps that arrived, the start-up's phases, no silence past ~10 s
        steps.poll()
        phases.poll()

    rc = run_in_own_group(cmd, cwd=run_dir, env=env, output=output, poll=poll)
    if rc == 0:
        try:
            rows = read_metrics_history(run_dir / METRICS_FILE)
        except ValueError as err:  # a run that logged nothing, or a damaged file: said, not a reason to fail here
            log.warning("no step table: %s", err)
        else:
            from rich.console import Console

            Console(file=sys.stdout, width=160).print(steps_table(rows))
        log.info("verl finished; its output: %s", output)
        return rc
    stop = stop_line(output)
    if stop:
        print(stop, file=sys.stderr, flush=True)  # the run's own reason, as verl's entry point said it
    else:
        tail = "\n".join(log_tail(output))
        print(f"verl exited with code {rc}; the end of its output ({output}):\n{tail}", file=sys.stderr, flush=True)
    return rc
