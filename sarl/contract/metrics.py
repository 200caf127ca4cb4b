"""The `reward/*` metrics of a batch, the same for every backend.

A reward's outputs become one reward-info row per response (`output_row`: score, each diagnostic, failed),
every row of a batch with the same keys (verl stacks each key across rows); the metrics of a batch are
`reward/score/mean|std`, `reward/failed` (a count) and `reward/<name>/mean` for every diagnostic, over the
rows where it is defined (`row_metrics`). The verl bridge (`sarl.backends.verl.reward`, `.trainer`) and the
TRL adapter (`sarl.backends.trl.rewards`) both log these.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import numpy as np

from sarl.contract.reward import Reward, RewardOutput, RolloutBatch

log = logging.getLogger(__name__)

FAILED_KEY = "failed"


def batch_diagnostic_keys(reward: Reward, outputs: Sequence[RewardOutput]) -> list[str]:
    """A fixed key set for a batch: the reward's declared `diagnostic_keys`, or, when it declares none,
    every key any output carries (in order of first appearance)."""
    if reward.diagnostic_keys:
        return list(reward.diagnostic_keys)
    keys: dict[str, None] = {}
    for o in outputs:
        keys.update(dict.fromkeys(o.diagnostics))
    return list(keys)


def output_row(output: RewardOutput, keys: Sequence[str]) -> dict[str, float]:
    """One response's reward as a reward-info dict (verl's per-sample format): score, diagnostics (NaN where
    the reward did not define one, e.g. L of a one-node map) and failed (0/1)."""
    row = {"score": output.score}
    row.update({k: float(output.diagnostics.get(k, math.nan)) for k in keys})
    row[FAILED_KEY] = float(output.failed is not None)
    return row


def reward_metrics(outputs: Sequence[RewardOutput], keys: Sequence[str]) -> dict[str, float]:
    """`reward/<name>/mean` for every diagnostic (over the responses that define it),
    `reward/score/mean|std` and `reward/failed` (a count)."""
    return row_metrics([output_row(o, keys) for o in outputs])


def row_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The `reward/*` metrics of a batch from its reward-info rows (`output_row` dicts, the
    `reward_extra_info` verl keeps per sample): `reward/score/mean|std`, `reward/failed` (a count)
    and `reward/<name>/mean` for every other key, over the rows where it is defined (not NaN);
    a key no row defines gives no metric."""
    scores = np.array([float(r["score"]) for r in rows], dtype=np.float64)
    metrics = {
        "reward/score/mean": float(scores.mean()) if len(scores) else math.nan,
        "reward/score/std": float(scores.std()) if len(scores) else math.nan,
        "reward/failed": float(sum(float(r.get(FAILED_KEY, 0.0)) for r in rows)),
    }
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(k for k in r if k not in ("score", FAILED_KEY)))
    for k in keys:
        vals = []
        for r in rows:
            value = r.get(k, math.nan)
            try:
                value = float(value)
            except (TypeError, ValueError) as err:
                raise TypeError(f"reward info {k!r} = {value!r} is not a number; diagnostics must be floats") from err
            if not math.isnan(value):
                vals.append(value)
        if vals:
            metrics[f"reward/{k}/mean"] = float(np.mean(vals))
    return metrics


def scored_or_failed(reward: Reward, batch: RolloutBatch) -> list[RewardOutput]:
    """`reward(batch)`, or, where the reward raises, one failed output per response naming the error: verl marks
    a group whose reward function raised as failed and its replay buffer samples that group again, for ever
    (verl 0.9.1 trainer/ppo/v1/replay_buffer.py:463-467); a failed output is left out of training and counted
    instead (the verl trainer), and `train.max_failed_steps` such steps in a row stop the run."""
    try:
        return reward(batch)
    except Exception as err:  # any error of the reward's own code or its dependencies
        why = f"{type(reward).__name__} raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        log.error("reward failed on %d responses: %s", len(batch), why)
        return [RewardOutput(score=0.0, failed=why) for _ in range(len(batch))]


def score_rollouts(reward: Reward, batch: RolloutBatch) -> tuple[list[RewardOutput], list[dict[str, float]]]:
    """The reward's outputs for a batch and one reward-info row per response, every row with the
    same keys (score, each diagnostic, failed)."""
    outputs = scored_or_failed(reward, batch)
    if len(outputs) != len(batch):
        raise RuntimeError(f"reward returned {len(outputs)} outputs for {len(batch)} responses")
    keys = batch_diagnostic_keys(reward, outputs)
    return outputs, [output_row(o, keys) for o in outputs]
