"""The reward bridge between verl and the backend-free reward objects.

Two paths, both calling the same reward objects:

- `compute_score`: verl's per-sample reward-function interface
  (`reward.custom_reward_function`, verl 0.9: `compute_score(data_source, solution_str,
  ground_truth, extra_info, **reward_kwargs)`). verl hands it no prompt: the prompt is the
  `user_prompt` that data preparation writes into every row's extra_info
  (`sarl.interface.USER_PROMPT_KEY`). It is async: the calls that verl's reward
  workers make concurrently are gathered into micro-batches, so the structure reward
  embeds and clusters many responses at once instead of one HTTP round trip each.
- `reward_dataproto`: the whole generated batch (a verl `DataProto`) at once, keyed by
  the prompt uid, for group rewards (TTRL, EMPO, EVOL-RL) that must see a prompt's
  rollouts together whatever order verl put them in.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import math
import threading
from typing import Any, Sequence

import numpy as np

from sarl.interface import USER_PROMPT_KEY, RewardOutput, RolloutBatch

log = logging.getLogger(__name__)

FAILED_KEY = "failed"


def diagnostic_keys(reward: Any, outputs: Sequence[RewardOutput]) -> list[str]:
    """A fixed key set for a batch (verl stacks each key across rows): the reward's declared
    `diagnostic_keys` if it has them, else every key any output carries."""
    declared = getattr(reward, "diagnostic_keys", None)
    if declared:
        return list(declared)
    keys: dict[str, None] = {}
    for o in outputs:
        keys.update(dict.fromkeys(o.diagnostics))
    return list(keys)


def output_row(output: RewardOutput, keys: Sequence[str]) -> dict[str, float]:
    """One response's reward as verl's reward-info dict: score, diagnostics (NaN where the
    reward did not define one, e.g. L of a one-node map) and failed (0/1)."""
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


def is_group_reward(reward_cfg: dict) -> bool:
    """Whether the reward a `conf/reward/*` node builds needs whole groups (`group_reward = True`),
    read off its class without building it."""
    target = reward_cfg.get("_target_") if reward_cfg else None
    if not target:
        return False
    from hydra.utils import get_class

    return bool(getattr(get_class(target), "group_reward", False))


def needs_prompt(reward: Any) -> bool:
    """Whether a reward object reads the prompt text (`needs_prompt = True` on its class; MaxFlow's graph
    starts at the prompt)."""
    return bool(getattr(reward, "needs_prompt", False))


def score_rollouts(reward: Any, batch: RolloutBatch) -> tuple[list[RewardOutput], list[dict[str, float]]]:
    """The reward's outputs for a batch and one reward-info row per response, every row with the
    same keys (score, each diagnostic, failed)."""
    outputs = reward(batch)
    if len(outputs) != len(batch):
        raise RuntimeError(f"reward returned {len(outputs)} outputs for {len(batch)} responses")
    keys = diagnostic_keys(reward, outputs)
    return outputs, [output_row(o, keys) for o in outputs]


# -- per-sample path (verl's custom_reward_function) -------------------------------------

_REWARDS: dict[str, Any] = {}
_REWARDS_LOCK = threading.Lock()


def reward_from_config(reward_cfg: dict) -> Any:
    """The reward object described by a resolved `conf/reward/*` node, built once per process."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(reward_cfg):
        reward_cfg = OmegaConf.to_container(reward_cfg, resolve=True)
    key = hashlib.sha256(json.dumps(reward_cfg, sort_keys=True, default=str).encode()).hexdigest()
    with _REWARDS_LOCK:
        if key not in _REWARDS:
            from hydra.utils import instantiate

            _REWARDS[key] = instantiate(reward_cfg)
        return _REWARDS[key]


class MicroBatcher:
    """Gathers concurrent single-response calls on one event loop into batched reward calls."""

    def __init__(self, reward: Any, max_batch: int = 512, max_wait_s: float = 0.05) -> None:
        self.reward = reward
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._pending: list[tuple[dict, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()  # one reward call at a time per process

    async def submit(self, row: dict) -> RewardOutput:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((row, fut))
        if len(self._pending) >= self.max_batch:
            self._flush(loop)
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush, loop)
        return await fut

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rows, self._pending = self._pending, []
        if rows:
            task = loop.run_in_executor(None, self._score, [r for r, _ in rows])
            task.add_done_callback(lambda t: self._resolve(t, [f for _, f in rows]))

    def _score(self, rows: list[dict]) -> list[RewardOutput]:
        batch = RolloutBatch(
            prompts=[r["prompt"] for r in rows],
            responses=[r["response"] for r in rows],
            group_ids=[r["group_id"] for r in rows],
            ground_truths=[r["ground_truth"] for r in rows],
            data_sources=[r["data_source"] for r in rows],
            extra_info=[r["extra_info"] for r in rows],
        )
        with self._lock:
            return self.reward(batch)

    @staticmethod
    def _resolve(task: asyncio.Future, futures: list[asyncio.Future]) -> None:
        err = task.exception()
        for i, fut in enumerate(futures):
            if fut.done():
                continue
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(task.result()[i])


_BATCHERS: dict[tuple[int, int], MicroBatcher] = {}
_ROW_IDS = itertools.count()


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    reward: dict | None = None,
    **_: Any,
) -> dict[str, float]:
    """verl's per-sample reward function: score plus every diagnostic of the configured reward. The prompt is
    `extra_info["user_prompt"]`; a reward that needs the prompt fails on a row without it."""
    if reward is None:
        raise ValueError(
            "sarl reward function called without reward kwargs: set "
            "reward.custom_reward_function.reward_kwargs.reward (sarl.train does this)"
        )
    obj = reward_from_config(reward)
    loop = asyncio.get_running_loop()
    batcher = _BATCHERS.setdefault((id(obj), id(loop)), MicroBatcher(obj))
    extra = dict(extra_info or {})
    prompt = extra.get(USER_PROMPT_KEY)
    if prompt is None and needs_prompt(obj):
        raise KeyError(
            f"{type(obj).__name__} needs the prompt, but this row's extra_info has no {USER_PROMPT_KEY!r} "
            f"(data_source {data_source!r}, extra_info keys {sorted(extra)}): verl passes the reward no prompt, "
            "so it comes from the data; rebuild the data set with `python -m sarl.data.prepare dataset=NAME`"
        )
    row = {
        "prompt": "" if prompt is None else str(prompt),
        "response": solution_str,
        "ground_truth": ground_truth,
        "data_source": data_source,
        "extra_info": extra,
        "group_id": str(extra.get("uid", f"row-{next(_ROW_IDS)}")),
    }
    output = await batcher.submit(row)
    return output_row(output, diagnostic_keys(obj, [output]))


# -- whole-batch path (group rewards) ----------------------------------------------------


def rollout_batch_from_dataproto(data: Any, tokenizer: Any) -> RolloutBatch:
    """Decoded responses of a verl `DataProto`, grouped by its `uid` column. A row's prompt is the
    `user_prompt` of its extra_info (the user message, as `compute_score` gets it), else the decoded prompt
    tokens (the chat template, without its special tokens)."""
    prompts_t = data.batch["prompts"]
    responses_t = data.batch["responses"]
    prompt_len = prompts_t.shape[-1]
    attn = data.batch["attention_mask"]
    nt = data.non_tensor_batch
    n = len(data)
    extras = [dict(e) if isinstance(e, dict) else {} for e in nt["extra_info"]] if "extra_info" in nt else None
    prompts, responses = [], []
    for i in range(n):
        p_mask = attn[i, :prompt_len].bool()
        r_len = int(attn[i, prompt_len:].sum())
        user_prompt = extras[i].get(USER_PROMPT_KEY) if extras else None
        if user_prompt is None:
            user_prompt = tokenizer.decode(prompts_t[i][p_mask], skip_special_tokens=True)
        prompts.append(str(user_prompt))
        responses.append(tokenizer.decode(responses_t[i][:r_len], skip_special_tokens=True))
    if "uid" not in nt:
        raise KeyError("DataProto has no 'uid' column: group rewards need the prompt uid of every rollout")
    reward_model = nt.get("reward_model")
    return RolloutBatch(
        prompts=prompts,
        responses=responses,
        group_ids=[str(u) for u in nt["uid"]],
        ground_truths=[rm.get("ground_truth") if isinstance(rm, dict) else None for rm in reward_model]
        if reward_model is not None
        else None,
        data_sources=[str(s) for s in nt["data_source"]] if "data_source" in nt else None,
        extra_info=extras,
    )


def reward_dataproto(data: Any, reward: Any, tokenizer: Any) -> tuple[Any, dict[str, float]]:
    """Rewards of a whole generated batch as verl expects them: a DataProto with `rm_scores`
    (the score on each response's last valid token) and one column per diagnostic, plus the
    `reward/*` metrics of the batch."""
    from tensordict import TensorDict
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

    batch = rollout_batch_from_dataproto(data, tokenizer)
    _, rows = score_rollouts(reward, batch)
    rm_scores = RewardManagerBase.assemble_rm_scores(data, [r["score"] for r in rows])
    extra_keys = [k for k in rows[0] if k != "score"] if rows else []
    non_tensor = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in extra_keys}
    out = DataProto(
        batch=TensorDict({"rm_scores": rm_scores}, batch_size=len(data)),
        non_tensor_batch=non_tensor,
        meta_info={"reward_extra_keys": extra_keys},
    )
    return out, row_metrics(rows)
