"""Checks to run on the GPU node before spending GPU hours on a verl or a TRL run.

    python -m sarl.preflight +exp=grpo_sarl_math [overrides]
    python -m sarl.preflight +exp=dpo_open [overrides]

One table, one row per check, each ✓ or ✗ with what to do; exit code 0 only if every check passes
(1 if one fails, 2 for a config that does not compose). The same overrides as `python -m sarl.train`.
`sarl.train` runs the cheap ones itself before it launches: for verl `run_cheap_checks` (data, run directory and
disk, memory plan, embedding-server budget, code sandbox), for TRL `run_trl_cheap_checks`
(sarl/backends/trl/preflight.py: the GPUs its processes need, the DPO memory plan of sarl/backends/trl/memory.py),
for verl's SFT trainer its memory plan (`sft_memory_plan`); a failure stops it with one line and exit code 2. A
pipeline row's preflight also plans each SFT stage (`STAGE:key=value` overrides apply to that stage).

Each check lives beside what it checks: the node's in sarl/runtime/node_checks.py, the models' and the embedding
server's in sarl/serving/checks.py, the data's in sarl/data/checks.py, each back end's in its preflight module,
the rewards' own (the code sandbox, the MaxFlow attention model's GPU memory) beside the reward. This module
puts them together.
"""

from __future__ import annotations

import copy
import logging
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from baselines.code_exec import sandbox_checks
from baselines.maxflow.preflight import maxflow_gpu_items
from sarl.backends.trl.preflight import trl_preflight
from sarl.backends.verl import preflight as verl_preflight
from sarl.data.checks import check_data
from sarl.launch.compose import compose_user_config
from sarl.launch.pipeline import split_stage_overrides, stages_of
from sarl.runtime.checks import Check, raise_failed
from sarl.runtime.errors import report_user_errors
from sarl.runtime.hub import offline_if_unreachable, offline_note
from sarl.runtime.node_checks import check_gpus, check_wandb
from sarl.runtime.runs import experiment_name, resolve_run_dir
from sarl.runtime.usage import Usage, asks_for_help, usage
from sarl.serving.auto import check_reward_endpoints
from sarl.serving.checks import check_embedding_server, check_model_files

log = logging.getLogger("sarl.preflight")


def check_memory_plan(
    cfg: DictConfig, verl_cfg: DictConfig, reward_cfg: dict, allow_download: bool = False, skip_missing: bool = False
) -> list[Check]:
    """verl's memory plan of the fullest GPU with what the rewards load beside it (the MaxFlow attention model,
    once per process that builds the reward)."""
    if cfg.backend.get("cpu", False):
        return []  # backend=verl_cpu: no GPU to plan
    copies, where, seq = verl_preflight.reward_processes(verl_cfg)
    beside = maxflow_gpu_items(reward_cfg, copies, where, seq, allow_download, skip_missing)
    return verl_preflight.check_verl_memory_plan(cfg, verl_cfg, reward_cfg, beside, allow_download, skip_missing)


def cheap_checks(cfg: DictConfig, verl_cfg: DictConfig, run_dir: Path, reward_cfg: dict) -> list[Check]:
    """What sarl.train checks before a verl launch: no network, no GPU, seconds."""
    return [
        check_data(cfg),
        verl_preflight.check_run_dir(cfg, verl_cfg, run_dir),
        *check_memory_plan(cfg, verl_cfg, reward_cfg, skip_missing=True),  # where the configs are at hand
        *sandbox_checks(reward_cfg),
    ]


def run_cheap_checks(cfg: DictConfig, verl_cfg: DictConfig, run_dir: Path) -> None:
    """Raise PreflightError naming every failed cheap check and its fix."""
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    raise_failed(cheap_checks(cfg, verl_cfg, run_dir, reward_cfg))


def sft_checks(cfg: DictConfig, run_dir: Path, experiment: str, stage: str = "", allow_download: bool = True):
    """The memory plan of a verl SFT run (`algorithm=sft`: a row, or the stage `stage` of a pipeline)."""
    from sarl.backends.verl.sft import build_verl_sft_config  # deferred: imports verl (~9 s)

    try:
        sft_cfg = build_verl_sft_config(cfg, str(run_dir), experiment)
    except Exception as err:
        return [Check("verl SFT config", False, f"{experiment}: {err}", "fix the override named above")]
    return verl_preflight.check_sft_memory_plan(cfg, sft_cfg, stage, allow_download)


def sft_stage_checks(
    cfg: DictConfig, overrides: list[str], run_dir: Path, experiment: str, allow_download: bool = True
) -> list[Check]:
    """The SFT stages of a pipeline row on verl, each composed as sarl.launch.pipeline composes it (the command
    line's overrides, the stage's own, then `STAGE:` ones), with their memory plans."""
    if not cfg.get("pipeline"):
        return []
    common, per_stage = split_stage_overrides(overrides)
    user = [o for o in common if not o.startswith(("run_dir=", "pipeline="))]
    out = []
    for stage in stages_of(cfg):
        name = stage["name"]
        own = per_stage.get(name, [])
        stage_cfg, _ = compose_user_config([*user, *stage["overrides"], *own, "pipeline=null"], named=[*user, *own])
        if stage_cfg.backend.name == "verl" and stage_cfg.algorithm.name == "sft":
            out += sft_checks(stage_cfg, run_dir / name, f"{experiment}/{name}", name, allow_download)
    return out


def preflight(cfg: DictConfig, choices: dict[str, Any], overrides: list[str] | None = None) -> list[Check]:
    """Every check for the composed config of a verl row (`overrides`: its command line, which composes the SFT
    stages of a pipeline row)."""
    # deferred (both): import verl (~9 s), not for a TRL row
    from sarl.backends.verl.attention import check_attention
    from sarl.backends.verl.config import build_verl_config

    experiment = experiment_name(choices)
    run_dir = resolve_run_dir(cfg, experiment)
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    if cfg.backend.get("cpu", False):  # backend=verl_cpu: the CPU stack, no GPU
        checks = [*verl_preflight.check_cpu_stack(), check_attention(str(cfg.backend.attn_implementation))]
    else:
        checks = [check_gpus(cfg), *verl_preflight.check_stack(), check_attention(str(cfg.backend.attn_implementation))]
    stages = sft_stage_checks(cfg, overrides or [], run_dir, experiment)
    if cfg.algorithm.name == "sft":  # verl's SFT trainer: no rollout, no reward
        return [
            *checks,
            check_model_files(cfg, {}),
            *(stages if cfg.get("pipeline") else sft_checks(cfg, run_dir, experiment)),
        ]
    checks += stages
    try:
        check_reward_endpoints(cfg, reward_cfg)
        verl_cfg = build_verl_config(cfg, copy.deepcopy(reward_cfg), str(run_dir), experiment)
    except Exception as err:
        checks.append(Check("verl config", False, str(err), "fix the override named above"))
        return checks
    checks.append(Check("verl config", True, f"{experiment}: composed against verl {cfg.backend.version}'s schema"))
    steps: list[Callable[[], Check | list[Check]]] = [
        lambda: check_model_files(cfg, reward_cfg),
        lambda: check_memory_plan(cfg, verl_cfg, reward_cfg, allow_download=True),
        lambda: check_embedding_server(cfg, reward_cfg),
        lambda: check_data(cfg),
        lambda: verl_preflight.check_run_dir(cfg, verl_cfg, run_dir, allow_download=True),
        lambda: check_wandb(cfg),
        lambda: sandbox_checks(reward_cfg),
    ]
    for step in steps:
        result = step()
        checks.extend(result if isinstance(result, list) else [result])
    return checks


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
    checks = trl_preflight(cfg) if cfg.backend.name == "trl" else preflight(cfg, choices, args)
    print_table(checks, f"preflight: {experiment_name(choices)}")
    if offline_note():
        print(offline_note())
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed" + (": fix the ✗ rows first" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
