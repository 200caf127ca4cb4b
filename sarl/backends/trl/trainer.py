"""TRL's GRPOTrainer with failed rewards left out of the update.

A reward function that returns None for a completion (`TRLReward` does so for a failed
`RewardOutput`) makes it "unscorable" in TRL: its group's mean and std are taken without
it and its advantage is 0. Its tokens still count in the loss, though: the KL term, the
entropy and the token-mean normaliser. `SarlGRPOTrainer` also

- drops a group with fewer than two usable completions entirely (a lone reward has no
  baseline to compare with), by marking all its rows unscorable;
- zeroes the `completion_mask` (and `tool_mask`) rows of every left-out completion and
  recounts `num_items_in_batch`, so the step's loss equals the loss of the step without
  those completions;
- logs `reward/left_out` (completions left out) and `reward/groups_dropped` per generation batch.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer

from sarl.contract.reward import USER_PROMPT_KEY
from sarl.formats.tags import draw_key, redraw_tags

MIN_USABLE_PER_GROUP = 2  # a group advantage needs a baseline: the response and at least one sibling


class SarlGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose left-out completions (failed reward, or a group with < 2 usable ones) carry no loss."""

    def __init__(self, *args: Any, resample_tags_seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._left_out: torch.Tensor | None = None  # (generation batch of all processes,) bool, set per batch
        self.resample_tags_seed = resample_tags_seed  # train.resample_tags: the seed of the draws, None: off

    def _with_redrawn_tags(self, inputs: list[dict]) -> list[dict]:
        """train.resample_tags (Structured Reasoning App. A.4): each prompt's tag set redrawn from (seed, row id,
        epoch) when it is sampled; the copies of one prompt (its group) share the key, hence the prompt; the
        reward's `user_prompt` follows."""
        import json

        epoch = int(self.state.epoch or 0)
        out = []
        for row in inputs:
            extra = json.loads(row["extra_info_json"])
            messages = redraw_tags(
                row["prompt"], self.resample_tags_seed, draw_key(extra.get("id", extra.get("index")), epoch)
            )
            extra[USER_PROMPT_KEY] = (
                messages[-1]["content"] if messages[-1]["role"] == "user" else extra.get(USER_PROMPT_KEY)
            )
            out.append({**row, "prompt": messages, "extra_info_json": json.dumps(extra)})
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: ANN001 (TRL's signature)
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        usable = (~unscorable).view(-1, group).sum(dim=1)
        dropped = usable < MIN_USABLE_PER_GROUP
        left_out = unscorable | dropped.repeat_interleave(group)
        rewards_per_func[left_out] = torch.nan  # TRL then leaves these rows out of the group statistics
        self._left_out = left_out
        self._metrics[mode]["reward/left_out"].append(float(left_out.sum().item()))
        self._metrics[mode]["reward/groups_dropped"].append(float(dropped.sum().item()))
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):  # noqa: ANN001 (TRL's signature)
        if self.resample_tags_seed is not None and self.model.training:
            inputs = self._with_redrawn_tags(inputs)
        output = super()._generate_and_score_completions(inputs)
        n = output["completion_ids"].size(0)
        start = self.accelerator.process_index * n
        keep = (~self._left_out[start : start + n]).to(output["completion_mask"].device)
        output["completion_mask"] = output["completion_mask"] * keep.unsqueeze(1).to(output["completion_mask"].dtype)
        loss_mask = output["completion_mask"]
        if "tool_mask" in output:
            output["tool_mask"] = output["tool_mask"] * keep.unsqueeze(1).to(output["tool_mask"].dtype)
            loss_mask = loss_mask * output["tool_mask"]
        output["advantages"] = output["advantages"] * keep.to(output["advantages"].dtype)
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        return output
