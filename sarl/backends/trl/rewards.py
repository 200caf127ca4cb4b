"""Our reward objects as a TRL reward function.

TRL's GRPOTrainer calls each reward function with the whole generation batch of the process:
`f(prompts, completions, completion_ids, **dataset_columns, trainer_state, log_metric, ...)`
and expects one float per completion, or None for a completion it cannot score. Its sampler
repeats every prompt `num_generations` times back to back
(`RepeatSampler(mini_repeat_count=num_generations)`), and its advantage is computed on those
consecutive chunks (`rewards.view(-1, num_generations)`). The adapter gives each chunk a group
id, checks that a chunk really holds one prompt `num_generations` times (so a group reward never
sees a partial or mixed group, e.g. under multi-process sharding), calls the reward once on the
batch, and logs the same `reward/<diagnostic>/mean` and `reward/failed` metrics as the verl
bridge through TRL's `log_metric`, with the `extra_metrics` given (the live policy embedder's,
sarl.backends.trl.live).

A failed output (`RewardOutput.failed`) is returned as None, never as its `failed_score`:
TRL leaves it out of its group's baseline and `SarlGRPOTrainer` masks its loss. After
`max_failed_steps` consecutive calls in which every reward failed, the adapter raises
`RewardsFailedError` (sarl.backends.trl.run stops the run with exit code 1).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Sequence

from sarl.contract.metrics import batch_diagnostic_keys, reward_metrics
from sarl.contract.reward import Reward, RewardsFailedError, RolloutBatch


def message_text(messages: Any) -> str:
    """The text of a chat completion (a list of messages) or a plain string completion."""
    if isinstance(messages, str):
        return messages
    if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        return "".join(str(m.get("content") or "") for m in messages if m.get("role") == "assistant")
    raise TypeError(f"completion must be a string or a list of chat messages, got {type(messages).__name__}")


class TRLReward:
    """A TRL reward function around one reward object (`sarl.contract.reward.Reward`)."""

    def __init__(
        self,
        reward: Reward,
        num_generations: int,
        tokenizer: Any = None,
        name: str | None = None,
        max_failed_steps: int | None = None,
        extra_metrics: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        if max_failed_steps is not None and max_failed_steps < 1:
            raise ValueError(f"max_failed_steps must be >= 1 or None (never stop), got {max_failed_steps}")
        self.reward = reward
        self.num_generations = int(num_generations)
        self.tokenizer = tokenizer
        self.__name__ = name or type(reward).__name__  # TRL names the reward's metrics after it
        self.calls = 0
        self.failed_total = 0
        self.max_failed_steps = max_failed_steps
        self.failed_streak = 0  # consecutive calls in which every reward failed
        self.extra_metrics = extra_metrics  # logged after each call (the live embedder's: sarl.backends.trl.live)

    def _prompt_text(self, prompt: Any) -> str:
        if isinstance(prompt, str):
            return prompt
        if self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return "\n".join(str(m.get("content") or "") for m in prompt)

    def group_ids(self, prompts: Sequence[Any], step: int) -> list[str]:
        """`<step>-<chunk>` for each row; ValueError if a chunk is not one prompt `num_generations` times."""
        n, g = len(prompts), self.num_generations
        if n % g:
            raise ValueError(
                f"TRL passed {n} completions, not a multiple of num_generations={g}: a group reward would see a "
                "partial group (backend=trl runs group rewards on one process)"
            )
        ids = []
        for start in range(0, n, g):
            chunk = [json.dumps(p, sort_keys=True) if not isinstance(p, str) else p for p in prompts[start : start + g]]
            if any(c != chunk[0] for c in chunk):
                raise ValueError(
                    f"completions {start}..{start + g - 1} of the generation batch do not share one prompt; "
                    "TRL's grouping changed, so rewards and advantages would mix prompts"
                )
            ids.extend([f"{step}-{start // g}"] * g)
        return ids

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]] | None = None,
        ground_truth: list[Any] | None = None,
        data_source: list[str] | None = None,
        extra_info: list[Any] | None = None,
        ground_truth_json: list[str] | None = None,
        extra_info_json: list[str] | None = None,
        trainer_state: Any = None,
        log_metric: Any = None,
        **_: Any,
    ) -> list[float | None]:
        step = int(getattr(trainer_state, "global_step", self.calls))
        if ground_truth_json is not None:  # sarl.backends.trl.run stores these columns as JSON
            ground_truth = [json.loads(g) for g in ground_truth_json]
        if extra_info_json is not None:
            extra_info = extra_info_json
        batch = RolloutBatch.from_columns(
            responses=[message_text(c) for c in completions],
            prompts=[self._prompt_text(p) for p in prompts],
            group_ids=self.group_ids(prompts, step),
            ground_truths=ground_truth,
            data_sources=data_source,
            extra_info=extra_info,
            response_token_ids=completion_ids,
        )
        outputs = self.reward(batch)
        if len(outputs) != len(batch):
            raise RuntimeError(f"reward returned {len(outputs)} outputs for {len(batch)} responses")
        self.calls += 1
        metrics = reward_metrics(outputs, batch_diagnostic_keys(self.reward, outputs))
        if self.extra_metrics is not None:
            metrics.update(self.extra_metrics())
        self.failed_total += int(metrics["reward/failed"])
        if log_metric is not None:
            for key, value in metrics.items():
                if key.startswith("reward/score/"):
                    continue  # TRL logs the reward mean/std itself
                if math.isfinite(value):
                    log_metric(key, value)
        self._count_streak(outputs, step)
        return [None if o.failed else o.score for o in outputs]

    def _count_streak(self, outputs: Sequence[Any], step: int) -> None:
        if outputs and all(o.failed for o in outputs):
            self.failed_streak += 1
        else:
            self.failed_streak = 0
        if self.max_failed_steps is not None and self.failed_streak >= self.max_failed_steps:
            reasons = sorted({o.failed for o in outputs})
            raise RewardsFailedError(
                f"every reward failed in {self.failed_streak} consecutive steps (up to step {step + 1}; "
                f"train.max_failed_steps={self.max_failed_steps}), e.g. {reasons[0]!r}: fix the reward's "
                "dependency (embedding server, reward model) and rerun, which resumes from the last checkpoint"
            )
