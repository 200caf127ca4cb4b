"""What every per-problem pipeline carries: the run's `Context` (recipe, teacher, grader, prompts, seed) and
the problem's `Tally` (counts per stage, rejections by reason). The pipelines run on a thread pool; every
teacher call goes through `sarl.data.synthesize.teacher.Teacher`."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sarl.data.synthesize.inputs import Prompt
from sarl.data.synthesize.teacher import Teacher


def _reason(text: str) -> str:
    """A rejection reason with its numbers replaced by N (so reasons count together in the manifest)."""
    return re.sub(r"-?\d+", "N", text)


@dataclass
class Context:
    recipe: dict[str, Any]
    teacher: Teacher  # samples the traces
    grader: Any
    prompts: dict[str, Prompt]
    seed: int
    translator: Teacher | None = None  # GRP: translates and verifies (None: the teacher)

    @property
    def graph_teacher(self) -> Teacher:
        return self.translator or self.teacher


@dataclass
class Tally:
    stages: Counter = field(default_factory=Counter)
    rejections: Counter = field(default_factory=Counter)

    def reject(self, stage: str, reason: str) -> None:
        self.rejections[f"{stage}/{_reason(reason)}"] += 1

    def as_dict(self) -> dict[str, Any]:
        """The counts as a per-problem result carries them (and the cache stores them)."""
        return {"stages": dict(self.stages), "rejections": dict(self.rejections)}
