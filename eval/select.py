"""The checkpoint a paper reports: `python -m eval.run ckpt=RUN_DIR select=RULE`.

Every checkpoint the training run saved (sarl.runtime.checkpoints.run_checkpoints: TRL's `checkpoint-N`, verl's
`global_step_N`, merged on first use) is evaluated on the protocol's held-out set (`selection.benchmarks` of
conf/eval/protocol/<name>.yaml; each a run of its own under `<eval run dir>/select/step_N/`, cached like any
evaluation), and one is picked by the rule:

- `best`: the highest held-out score (the mean of the held-out benchmarks' avg@k; the earliest step on a tie).
  Structured Reasoning App. A.4.4: "Validation occurs at fixed intervals; we report the best checkpoint on held-out
  metrics".
- `last`: the run's last checkpoint, what a paper reports when it reports the model at the end of training (SARL,
  EVOL-RL, GRP); the held-out scores are still computed and recorded.
- `paper`: the protocol's own rule (`selection.rule`).

The picked checkpoint is then evaluated by the whole protocol into the eval run directory; its results.json has a
`selection` block: the rule, the held-out benchmarks, every checkpoint's step, path and score, and the pick
(decisions §7.8 says which held-out set each protocol uses and why).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from eval.config import eval_run_dir, run_name
from sarl.runtime.checkpoints import (
    FINAL_SUBDIR,
    Checkpoint,
    exported_step,
    hf_model_of,
    is_hf_model,
    pipeline_final,
    run_checkpoints,
)
from sarl.runtime.errors import UserError

log = logging.getLogger("eval.run")

RULES = ("best", "last", "paper")
SELECT_SUBDIR = "select"


def selection_rule(cfg: DictConfig) -> tuple[str, list[str]]:
    """(the rule, the held-out benchmarks) for `cfg.select` under `cfg.protocol`; UserError naming what is wrong."""
    rule = str(cfg.select)
    if rule not in RULES:
        raise UserError(
            f"select={rule!r}; choose one of: {', '.join(RULES)} (or leave it unset: the run's final model)"
        )
    name = str(cfg.protocol.name)
    spec = cfg.protocol.get("selection")
    if not spec:
        raise UserError(
            f"select={rule}: protocol {name} (conf/eval/protocol/{name}.yaml) names no held-out set to select on "
            "(`selection:`); select with the protocol whose table it is and evaluate the checkpoint it picks"
        )
    if rule == "paper":
        rule = str(spec.rule)
        if rule not in ("best", "last"):
            raise UserError(f"conf/eval/protocol/{name}.yaml: selection.rule={rule!r}; choose best or last")
    benchmarks = [str(b) for b in spec.benchmarks]
    if not benchmarks:
        raise UserError(f"conf/eval/protocol/{name}.yaml: selection.benchmarks is empty")
    return rule, benchmarks


def checkpoints_of(run_dir: Path) -> list[Checkpoint]:
    """The run's checkpoints in step order; its `final/` stands for the last step (verl: the checkpoint it was merged
    from, no second merge; TRL: the step its summary names, also when the trainer kept no checkpoint there)."""
    if not (run_dir / "meta.json").is_file():
        raise UserError(
            f"select= needs a training run directory (one with meta.json, as sarl.train writes); ckpt={run_dir} "
            "is not one"
        )
    ckpts = run_checkpoints(run_dir)
    final = run_dir / FINAL_SUBDIR
    step = exported_step(run_dir)  # verl: the step final/ was merged from; TRL: the run's last step
    if step is None and is_hf_model(final):
        step = _summary_steps(run_dir)
    if step is not None and is_hf_model(final):  # the last step is evaluated as final/ (the same weights, one cache)
        ckpts = [c for c in ckpts if c.step != step] + [Checkpoint(step, final, "hf")]
    if not ckpts:
        raise UserError(f"{run_dir} saved no checkpoint to select from (checkpoints/ is empty and there is no final/)")
    return sorted(ckpts, key=lambda c: c.step)


def _summary_steps(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "summary.json").read_text())["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def held_out_score(results: dict[str, Any]) -> float | None:
    """The mean avg@k over the math benchmarks of a held-out run's results (None when it has none)."""
    benches = ((results.get("math") or {}).get("benchmarks")) or {}
    values = [b["avg_at_k"] for b in benches.values() if b.get("avg_at_k") is not None]
    return sum(values) / len(values) if values else None


def pick(rule: str, scores: dict[int, float | None]) -> int:
    """The step the rule picks: the last step, or the best held-out score (the earliest step on a tie)."""
    steps = sorted(scores)
    if rule == "last":
        return steps[-1]
    scored = [s for s in steps if scores[s] is not None]
    if not scored:
        raise UserError("no checkpoint has a held-out score to select on (every held-out evaluation was empty)")
    return max(scored, key=lambda s: (scores[s], -s))


def select_and_evaluate(cfg: DictConfig, evaluate: Callable[[DictConfig, dict | None], int]) -> int:
    """`select=RULE`: every checkpoint on the held-out set, the pick, then the whole protocol on the pick (module
    docstring). `evaluate(cfg, selection)` is eval.run's `run`."""
    rule, held_out = selection_rule(cfg)
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise UserError(
            f"select={cfg.select} needs a training run: python -m eval.run ckpt=RUN_DIR select={cfg.select}"
        )
    run_dir = Path(str(cfg.ckpt)).expanduser().resolve()
    if (run_dir / "pipeline.json").is_file():  # a pipeline that trains one model: its last stage's checkpoints
        run_dir = pipeline_final(run_dir).parent
    ckpts = checkpoints_of(run_dir)
    name = run_name(cfg)
    eval_dir = Path(str(cfg.run_dir)) if cfg.run_dir else eval_run_dir(cfg, name)
    log.info(
        "select=%s: %d checkpoint(s) of %s (steps %s) on the held-out set %s, then the pick on protocol %s",
        rule,
        len(ckpts),
        run_dir,
        ", ".join(str(c.step) for c in ckpts),
        ", ".join(held_out),
        cfg.protocol.name,
    )
    entries = []
    for c in ckpts:
        model = hf_model_of(c)
        sub = _with(cfg, ckpt=str(model), only=held_out, name=name, run_dir=str(eval_dir / SELECT_SUBDIR / c.label))
        sub.logger.backends = [b for b in sub.logger.backends if b != "wandb"]  # one W&B run: the pick's
        rc = evaluate(sub, None)
        if rc != 0:
            log.error(
                "select: the held-out evaluation of step %d ended with exit %d; rerun the same command", c.step, rc
            )
            return rc
        results = json.loads((eval_dir / SELECT_SUBDIR / c.label / "results.json").read_text())
        score = held_out_score(results)
        entries.append({"step": c.step, "ckpt": str(model), "held_out_score": score})
        log.info("select: step %d held-out score %s", c.step, "-" if score is None else f"{score:.4f}")
    chosen = pick(rule, {e["step"]: e["held_out_score"] for e in entries})
    chosen_entry = next(e for e in entries if e["step"] == chosen)
    selection = {
        "rule": rule,
        "held_out": held_out,
        "metric": "mean avg@k over the held-out benchmarks",
        "run_dir": str(run_dir),
        "checkpoints": entries,
        "step": chosen,
        "ckpt": chosen_entry["ckpt"],
    }
    log.info(
        "select=%s picks step %d (%s); evaluating it on protocol %s",
        rule,
        chosen,
        chosen_entry["ckpt"],
        cfg.protocol.name,
    )
    return evaluate(_with(cfg, ckpt=chosen_entry["ckpt"], name=name, run_dir=str(eval_dir)), selection)


def _with(cfg: DictConfig, **values: Any) -> DictConfig:
    out = copy.deepcopy(cfg)
    out.select = None
    for key, value in values.items():
        out[key] = value
    return out
