"""A weighted sum of rewards, e.g. Structured Reasoning's JOINT reward, FLOW:LCS 1:1 (Structured Reasoning Table 11).

score = sum_c weight_c * score_c over the components; each component's diagnostics are reported as
`<component>/<key>`, its score as `<component>/score`. A row fails (`failed`, score `failed_score`) when any
component fails it; the reasons are joined, each after its component's name (the category
`failure_counts` counts it under).
"""

from __future__ import annotations

import math
from typing import Mapping

from sarl.contract.reward import Reward, RewardFunction, RewardOutput, RolloutBatch, check_reward


class WeightedSumReward(RewardFunction):
    """`components`: name -> reward object; `weights`: name -> weight (the same names)."""

    # The components see whole batches; one of them may need a prompt's siblings (LCS does), so a backend
    # must hand this reward whole groups.
    group_reward = True
    failure_label = "weighted-sum reward"

    def __init__(
        self,
        components: Mapping[str, Reward],
        weights: Mapping[str, float],
        failed_score: float = 0.0,
        threads: int | None = 1,
    ) -> None:
        super().__init__(threads)
        if not components:
            raise ValueError("WeightedSumReward needs at least one component")
        if set(components) != set(weights):
            raise ValueError(f"weights must name the components exactly: {sorted(components)} vs {sorted(weights)}")
        bad = {k: v for k, v in weights.items() if not math.isfinite(float(v))}
        if bad:
            raise ValueError(f"weights must be finite, got {bad}")
        self.components = {name: check_reward(reward) for name, reward in components.items()}
        for reward in self.components.values():  # one thread cap per reward process: the joint reward's
            if hasattr(reward, "threads"):
                reward.threads = threads
        self.weights = {k: float(v) for k, v in weights.items()}
        self.failed_score = float(failed_score)

    @property
    def diagnostic_keys(self) -> tuple[str, ...]:  # type: ignore[override]
        keys: list[str] = []
        for name, reward in self.components.items():
            keys.append(f"{name}/score")
            keys.extend(f"{name}/{k}" for k in reward.diagnostic_keys)
        return tuple(keys)

    def check_ready(self) -> str | None:
        """The first component that cannot run, with its reason (`sarl.contract.reward.Reward.check_ready`)."""
        for name, reward in self.components.items():
            problem = reward.check_ready()
            if problem is not None:
                return f"component {name!r}: {problem}"
        return None

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        results = {}
        for name, reward in self.components.items():
            outputs = reward(batch)
            if len(outputs) != len(batch):
                raise RuntimeError(f"component {name!r} returned {len(outputs)} outputs for {len(batch)} rows")
            results[name] = outputs
        out = []
        for i in range(len(batch)):
            diag: dict[str, float] = {}
            reasons = []
            score = 0.0
            for name, outputs in results.items():
                o = outputs[i]
                diag[f"{name}/score"] = o.score
                diag.update({f"{name}/{k}": v for k, v in o.diagnostics.items()})
                if o.failed:
                    reasons.append(f"{name}: {o.failed}")
                score += self.weights[name] * o.score
            if reasons:
                out.append(RewardOutput(self.failed_score, diag, "; ".join(reasons)))
            else:
                out.append(RewardOutput(score, diag))
        return out
