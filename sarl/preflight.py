"""Checks to run on the GPU node before spending GPU hours on a verl or a TRL run.

    python -m sarl.preflight +exp=grpo_sarl_math [overrides]
    python -m sarl.preflight +exp=dpo_open [overrides]

One table, one row per check, each ✓ or ✗ with what to do; exit code 0 only if every check passes
(1 if one fails, 2 for a config that does not compose). The same overrides as `python -m sarl.train`.
`sarl.train` runs the cheap ones itself before it launches (each back end's `cheap_checks`: for verl the data, run
directory and disk, memory plan, embedding-server budget and the rewards' own checks; for TRL the GPUs its
processes need and the DPO memory plan; verl's SFT trainer its memory plan); a failure stops it with one line and
exit code 2. A pipeline row's preflight also plans each SFT stage (`STAGE:key=value` overrides apply to that stage).

Each check lives beside what it checks: the node's in sarl/runtime/node_checks.py, the models' and the embedding
server's in sarl/serving/checks.py, the data's in sarl/data/checks.py, each back end's in its preflight module
(the back end that conf/backend/<name>.yaml names puts its table together: `preflight` of sarl/backends/base.py),
the rewards' own (the code sandbox, the MaxFlow attention model's GPU memory) in the reward's class
(`RewardFunction.preflight_checks`, `gpu_memory_items`), read from the config's `_target_` without building it.
This module composes the row and its pipeline's stages, and prints the table.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sarl.backends.base import backend_for
from sarl.launch.compose import compose_user_config
from sarl.launch.pipeline import split_stage_overrides, stage_configs
from sarl.runtime.checks import Check
from sarl.runtime.errors import report_user_errors
from sarl.runtime.hub import offline_if_unreachable, offline_note
from sarl.runtime.runs import experiment_name, resolve_run_dir
from sarl.runtime.usage import Usage, asks_for_help, usage

log = logging.getLogger("sarl.preflight")


def sft_stage_checks(
    cfg: DictConfig, overrides: list[str], run_dir: Path, experiment: str, allow_download: bool = True
) -> list[Check]:
    """The stages of a pipeline row, each composed as sarl.launch.pipeline composes it (the command line's
    overrides, the stage's own, then `STAGE:` ones) and checked by its own back end (`stage_checks`: the memory
    plan of a verl SFT stage)."""
    if not cfg.get("pipeline"):
        return []
    out = []
    for stage, stage_cfg in stage_configs(cfg, overrides):
        name = stage["name"]
        backend = backend_for(stage_cfg)
        out += backend.stage_checks(stage_cfg, run_dir / name, f"{experiment}/{name}", name, allow_download)
    return out


def preflight(cfg: DictConfig, choices: dict[str, Any], overrides: list[str] | None = None) -> list[Check]:
    """Every check for the composed config of a row, as its back end lists them (`overrides`: its command line,
    which composes the stages of a pipeline row)."""
    experiment = experiment_name(choices)
    stages = sft_stage_checks(cfg, overrides or [], resolve_run_dir(cfg, experiment), experiment)
    return backend_for(cfg).preflight(cfg, choices, stages)


def print_table(checks: list[Check], title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("", "check", "result", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row("[green]✓[/]" if c.ok else "[red]✗[/]", escape(c.name), escape(c.detail), escape(c.fix))
    Console(width=max(120, shutil.get_terminal_size().columns)).print(table)


USAGE = Usage(
    synopsis=("python -m sarl.preflight +exp=ROW [KEY=VALUE ...]   # the same arguments as sarl.train",),
    about=(
        "On the GPU node, before a run: the row's GPUs, libraries, memory plan, embedding server, data, model and "
        "W&B, one ✓/✗ table with the fix of each ✗ row. Exit 0 when every check passes, 1 when one fails, 2 for a "
        "user error."
    ),
    groups=(("+exp", "exp", "a paper row"), ("backend", "backend", "the trainer")),
    more="The other keys and groups are sarl.train's (python -m sarl.train --help); docs/gpu.md.",
)


@report_user_errors("sarl.preflight")  # a misspelt key or option, an invalid value: one line, exit 2
def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if asks_for_help(args):
        sys.stdout.write(usage(USAGE))
        return 0
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="[%(name)s] %(message)s")
    offline_if_unreachable()  # a Hub that cannot be reached: the model checks read the local cache, no retries
    cfg, choices = compose_user_config(split_stage_overrides(args)[0])  # `STAGE:key=value`: that stage's only
    checks = preflight(cfg, choices, args)
    print_table(checks, f"preflight: {experiment_name(choices)}")
    if offline_note():
        print(offline_note())
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed" + (": fix the ✗ rows first" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
