"""Several training stages from one command: an exp file's `pipeline` (e.g. SFT, then RL from its checkpoint).

    python -m sarl.train +exp=lcs_paper                          # every stage, in order
    python -m sarl.train +exp=lcs_paper run_dir=RUNS/lcs_paper/X  # rerun: finished stages are skipped
    python -m sarl.train +exp=lcs_paper sft:data.sft_files=/data/structured.jsonl backend.max_steps=2

An exp file lists its stages, each a name, the Hydra overrides that turn the row into that stage, and
optionally the stage whose final checkpoint it starts from:

    pipeline:
      - {name: sft, overrides: [algorithm=sft, data=sft_structured, train.actor_lr=1.0e-5]}
      - {name: rl, init_from: sft}

Each stage is composed as `<command-line overrides> + <stage overrides> + <that stage's command-line overrides>`
(an override `STAGE:key=value` applies to that stage only; a plain one to every stage) with `pipeline=null`,
and run by `sarl.train.run` in `<pipeline run dir>/<stage name>/` (its own config.yaml, metrics, checkpoints).
A stage that ends with exit 0 and a final checkpoint gets a done marker (`stage_done.json`, naming the
checkpoint); a stage is finished when its marker and the checkpoint it names exist, and a rerun with the
same `run_dir` skips it. `init_from: NAME` sets `model.path` and `model.tokenizer_path` to NAME's final
checkpoint (the Hugging Face directory every finished run leaves in `final/`, whatever its back end).
Stages without `init_from` all start from the row's own model: `+exp=smoke_compare` trains one policy once per
reward, and its `pipeline_report` (sarl.reports.compare.report) then compares the stages.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from sarl.launch.compose import check_model_paths, compose_user_config, config_function
from sarl.runtime.checkpoints import FINAL_SUBDIR
from sarl.runtime.errors import UserError
from sarl.runtime.weights import weight_files

log = logging.getLogger("sarl.launch.pipeline")

DONE_MARKER = "stage_done.json"
STAGE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
STAGE_OVERRIDE = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*):(.+)$")


def split_stage_overrides(overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(overrides for every stage, {stage: its own overrides}) from a command line; `STAGE:key=value` is a
    stage's own. A Hydra override never starts with `word:` (a group or key path has no colon before '=')."""
    common: list[str] = []
    per_stage: dict[str, list[str]] = {}
    for item in overrides:
        m = STAGE_OVERRIDE.match(item)
        if m and "=" not in m.group(1):
            per_stage.setdefault(m.group(1), []).append(m.group(2))
        else:
            common.append(item)
    return common, per_stage


def stages_of(cfg: DictConfig) -> list[dict[str, Any]]:
    """The validated stage list of `cfg.pipeline`: names unique and well-formed, overrides a list of strings,
    `init_from` an earlier stage."""
    raw = OmegaConf.to_container(cfg.pipeline, resolve=False)
    if not isinstance(raw, list) or not raw:
        raise UserError(f"pipeline={raw!r}: must be a non-empty list of stages ({{name, overrides, init_from}})")
    seen: list[str] = []
    stages = []
    for i, stage in enumerate(raw):
        if not isinstance(stage, dict) or set(stage) - {"name", "overrides", "init_from"}:
            raise UserError(f"pipeline[{i}]={stage!r}: a stage has the keys name, overrides, init_from only")
        name = stage.get("name")
        if not isinstance(name, str) or not STAGE_NAME.match(name) or name in seen:
            raise UserError(f"pipeline[{i}].name={name!r}: must be a unique word (letters, digits, _ or -)")
        overrides = stage.get("overrides") or []
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise UserError(f"pipeline[{i}].overrides: must be a list of Hydra overrides (strings)")
        init_from = stage.get("init_from")
        if init_from is not None and init_from not in seen:
            raise UserError(f"pipeline[{i}].init_from={init_from!r}: must name an earlier stage ({seen or 'none'})")
        seen.append(name)
        stages.append({"name": name, "overrides": list(overrides), "init_from": init_from})
    return stages


def final_checkpoint(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The Hugging Face directory a finished stage leaves, `final/` whatever the back end (None if there is none
    yet)."""
    final = run_dir / FINAL_SUBDIR
    return final if weight_files(final) else None


def planned_checkpoint(cfg: DictConfig, run_dir: Path) -> Path:
    """Where a stage's final checkpoint will be (a dry run prints the next stage with it)."""
    return run_dir / FINAL_SUBDIR


def finished(stage_dir: Path) -> Path | None:
    """The final checkpoint of a finished stage (marker and checkpoint both there), else None."""
    try:
        done = json.loads((stage_dir / DONE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    path = Path(str(done.get("final_checkpoint", "")))
    return path if path.is_dir() else None


def mark_done(stage_dir: Path, name: str, checkpoint: Path) -> None:
    record = {"stage": name, "final_checkpoint": str(checkpoint), "finished_at": dt.datetime.now().isoformat()}
    tmp = stage_dir / (DONE_MARKER + ".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(stage_dir / DONE_MARKER)


def stage_configs(cfg: DictConfig, overrides: list[str]) -> list[tuple[dict[str, Any], DictConfig]]:
    """Each stage of a pipeline row with its config, composed as `run_pipeline` composes it (the command line's
    overrides, the stage's own, then its `STAGE:` ones), before any stage ran: a stage that starts from an earlier
    one (`init_from`) still names the row's model here."""
    common, per_stage = split_stage_overrides(overrides)
    user = [o for o in common if not o.startswith(("run_dir=", "pipeline="))]
    out = []
    for stage in stages_of(cfg):
        own = per_stage.get(stage["name"], [])
        stage_cfg, _ = compose_user_config([*user, *stage["overrides"], *own, "pipeline=null"], named=[*user, *own])
        out.append((stage, stage_cfg))
    return out


def run_pipeline(
    cfg: DictConfig,
    experiment: str,
    common: list[str],
    per_stage: dict[str, list[str]],
    run_dir: Path,
    run_stage: Callable[..., int],
) -> int:
    """Run the stages of `cfg.pipeline` in order under `run_dir` (module docstring) with `run_stage` (sarl.train's
    `run(cfg, choices, overrides)`, passed in so that this module does not import the entry point); the first
    failing stage's exit code ends the pipeline."""
    stages = stages_of(cfg)
    unknown = sorted(set(per_stage) - {s["name"] for s in stages})
    if unknown:
        raise UserError(
            f"stage overrides for {', '.join(unknown)}: this pipeline's stages are "
            f"{', '.join(s['name'] for s in stages)}"
        )
    report = pipeline_report(str(cfg.pipeline_report)) if cfg.get("pipeline_report") else None  # checked first
    user = [o for o in common if not o.startswith(("run_dir=", "pipeline="))]
    dry_run = bool(cfg.train.dry_run)
    checkpoints: dict[str, Path] = {}
    for stage in stages:
        name, stage_dir = stage["name"], run_dir / stage["name"]
        overrides = [*user, *stage["overrides"], *per_stage.get(name, []), "pipeline=null", f"run_dir={stage_dir}"]
        if stage["init_from"]:
            start = checkpoints[stage["init_from"]]
            overrides += [f"model.path={start}", f"model.tokenizer_path={start}"]
        stage_cfg, choices = compose_user_config(overrides, named=[*user, *per_stage.get(name, [])])
        if not stage["init_from"]:  # the checkpoint of an earlier stage is this pipeline's own (planned in a dry run)
            check_model_paths(stage_cfg)
        choices = {**choices, "exp": f"{experiment}/{name}"}
        done = finished(stage_dir)
        if done is not None and not dry_run:
            log.info("stage %s: finished earlier (%s), skipped", name, done)
            checkpoints[name] = done
            continue
        log.info("stage %s: %s", name, " ".join(overrides))
        if not dry_run:  # made once a stage is about to run: a stage refused before leaves nothing behind
            run_dir.mkdir(parents=True, exist_ok=True)
        rc = run_stage(stage_cfg, choices, overrides)
        if rc != 0:
            log.error("stage %s ended with exit code %d: the pipeline stops (rerun with run_dir=%s)", name, rc, run_dir)
            return rc
        if dry_run:
            checkpoints[name] = planned_checkpoint(stage_cfg, stage_dir)
            continue
        final = final_checkpoint(stage_cfg, stage_dir)
        if final is None:
            log.error("stage %s ended without a final checkpoint in %s: the pipeline stops", name, stage_dir)
            return 1
        mark_done(stage_dir, name, final)
        checkpoints[name] = final
    if not dry_run:
        record = {"experiment": experiment, "stages": {k: str(v) for k, v in checkpoints.items()}}
        chain = model_chain(stages)
        if chain:  # the pipeline trains one model (SFT, then RL from it): `eval.run ckpt=<run dir>` evaluates it
            record["final_stage"] = chain
        (run_dir / "pipeline.json").write_text(json.dumps(record, indent=2))
        if report is not None:
            report(run_dir, {s["name"]: run_dir / s["name"] for s in stages})
    return 0


def model_chain(stages: list[dict[str, Any]]) -> str | None:
    """The last stage's name when every stage leads to it through `init_from` (one model trained in stages), else
    None (separate runs, as smoke_compare's one per reward)."""
    by_name = {s["name"]: s for s in stages}
    seen, name = set(), stages[-1]["name"]
    while name is not None:
        seen.add(name)
        name = by_name[name]["init_from"]
    return stages[-1]["name"] if len(seen) == len(stages) else None


def pipeline_report(dotted: str) -> Callable[[Path, dict[str, Path]], None]:
    """The function `pipeline_report` names (`module.function`); UserError if it cannot be imported."""
    return config_function("pipeline_report", dotted)
