"""The one reward interface: every reward maps a RolloutBatch to RewardOutputs.

`sarl/`, `baselines/` and `eval/` all import these types; no reward imports a
training backend (see docs/design.md).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

# The `extra_info` key under which data preparation (`sarl.data.build.record`) stores the text of the user
# message the policy answers. A backend that hands rewards no prompt of its own (verl's per-sample reward
# function gets only data_source, response, ground truth and extra_info) reads the prompt from there.
USER_PROMPT_KEY = "user_prompt"


@dataclass
class RolloutBatch:
    """Finished rollouts: one row per response.

    `group_ids` carries the prompt uid of each response, so group rewards see a
    prompt's siblings whatever order the backend put the rows in.
    """

    prompts: list[str]
    responses: list[str]
    group_ids: list[str] | None = None
    ground_truths: list[Any] | None = None
    data_sources: list[str] | None = None
    extra_info: list[dict[str, Any]] | None = None
    response_token_ids: list[list[int]] | None = None

    def __post_init__(self) -> None:
        n = len(self.responses)
        if self.group_ids is None:
            self.group_ids = [str(i) for i in range(n)]
        for name in ("prompts", "group_ids", "ground_truths", "data_sources", "extra_info", "response_token_ids"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"RolloutBatch.{name} has {len(value)} rows but responses has {n}")

    def __len__(self) -> int:
        return len(self.responses)

    def groups(self) -> dict[str, list[int]]:
        """Row indices per group id, groups in order of first appearance."""
        out: dict[str, list[int]] = {}
        for i, gid in enumerate(self.group_ids or []):
            out.setdefault(str(gid), []).append(i)
        return out

    @classmethod
    def from_responses(cls, responses: Sequence[str], prompts: Sequence[str] | None = None) -> RolloutBatch:
        """A batch of independent responses (one group each)."""
        responses = list(responses)
        return cls(prompts=list(prompts) if prompts is not None else [""] * len(responses), responses=responses)


@dataclass
class RewardOutput:
    """A response's reward plus named diagnostics (logged as `reward/<name>/mean`).

    `failed` holds the reason when the reward could not be computed; `score` is
    then the reward's configured failure value, never noise.
    """

    score: float
    diagnostics: dict[str, float] = field(default_factory=dict)
    failed: str | None = None

    def __post_init__(self) -> None:
        self.score = float(self.score)
        if not math.isfinite(self.score):
            raise ValueError(f"reward score must be finite, got {self.score!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score, **self.diagnostics, "failed": self.failed}


class RewardsFailedError(RuntimeError):
    """Training has no reward signal left (every reward of the step, or of several steps in a row, failed);
    a backend stops the run with a non-zero exit."""


def record_failures(
    counts: Counter[str], outputs: Sequence[RewardOutput | None], name: str, logger: logging.Logger
) -> None:
    """Add the batch's failed outputs to `counts`, keyed by the reason's category (the text before its first
    colon), and log one warning naming `name` when any failed."""
    failures = Counter(o.failed.split(":")[0] for o in outputs if o is not None and o.failed)
    if failures:
        counts.update(failures)
        logger.warning("%s: %d of %d rows failed: %s", name, sum(failures.values()), len(outputs), failures)


@runtime_checkable
class Reward(Protocol):
    """What a backend calls: rewards(batch) -> one RewardOutput per response.

    Optional: `check_ready() -> str | None`. A reward with an external dependency (an embedding
    server, a remote model) implements it to try that dependency once and return the reason it
    cannot be used (what is wrong and what to do), or None when it can. A backend calls it through
    `reward_problem` once before training, so that a dead dependency stops the run before step 1
    instead of failing every reward. It is not part of the Protocol's structural check: a reward
    without one is taken as ready.
    """

    def __call__(self, batch: RolloutBatch) -> list[RewardOutput]: ...


def reward_problem(reward: object) -> str | None:
    """Why `reward` cannot run (its optional `check_ready()`, see `Reward`), None if it can."""
    check = getattr(reward, "check_ready", None)
    return check() if callable(check) else None
