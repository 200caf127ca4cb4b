"""The reward bridge between verl and the backend-free reward objects, and which route runs for which reward.

The route is chosen by the reward's class (`is_group_reward`: its `group_reward`, read without building it);
`sarl.backends.verl.config` and `sarl.backends.verl.trainer.SarlTrainer` ask it. Both routes build the reward's
batch with `RolloutBatch.from_columns` (sarl.contract.reward), so a reward sees the same prompt (the data row's
`extra_info["user_prompt"]`), gold answer and extra_info on either.

- Per-response rewards (`group_reward = False`: the structure reward, ground truth, GRP, MaxFlow, code
  execution) run here, in `compute_score`, verl's per-sample reward function (`reward.custom_reward_function`,
  verl 0.9: `compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)`), inside verl's
  `reward.num_workers` reward-loop workers (Ray actors; `backend.reward_num_workers`, 8 on a GPU node). verl's
  agent loop sends each rollout to a random worker the moment its generation ends (`agent_loop.py`
  `_compute_score`, via `reward_loop_worker_handles`), so rewards are computed by several processes while the
  rest of the batch is still being generated, and the trainer finds them written. verl hands the function no
  prompt: the prompt is the `user_prompt` that data preparation writes into every row's extra_info
  (`sarl.contract.reward.USER_PROMPT_KEY`). The calls that reach one worker's event loop together are gathered
  by `MicroBatcher` into one reward call, so the structure reward embeds them in one request instead of one
  round trip each.
- Group rewards (`group_reward = True`: TTRL, EMPO, EVOL-RL, LCS) do not run here: a prompt's rollouts must be
  scored together, which a per-sample call cannot give. `SarlTrainer` hides the reward workers from verl and
  scores each sampled batch in the trainer process, grouped by prompt uid (`sarl.backends.verl.trainer`,
  `score_sessions`); it builds its reward with `reward_from_config` from here.

The per-response route is kept, not replaced by the trainer's batch path, because that path runs after the
whole batch is generated and in one process: it would add the reward's whole time to every step, where the
workers overlap it with generation and share it among `reward.num_workers` processes (docs/design.md,
"Which route scores a reward").
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import threading
from typing import Any

from sarl.contract.metrics import batch_diagnostic_keys, output_row, scored_or_failed
from sarl.contract.reward import (
    USER_PROMPT_KEY,
    Reward,
    RewardFunction,
    RewardOutput,
    RolloutBatch,
    build_reward,
    reward_class,
)

log = logging.getLogger(__name__)


def is_group_reward(reward_cfg: dict) -> bool:
    """Whether the reward a `conf/reward/*` node builds needs whole groups (`group_reward = True`),
    read off its class without building it."""
    target = reward_cfg.get("_target_") if reward_cfg else None
    if not target:
        return False
    return bool(reward_class(target).group_reward)


# -- per-sample path (verl's custom_reward_function) -------------------------------------

_REWARDS: dict[str, Any] = {}
_REWARDS_LOCK = threading.Lock()


class RewardBuildError(RuntimeError):
    """The reward could not be built in this process (the message names the class and the error)."""


class RewardNotBuilt(RewardFunction):
    """Stands in for a reward whose construction raised in this process (a verl reward worker, or the trainer for a
    group reward): every call raises the construction's error, so each response it is asked to score is a failed
    reward (`scored_or_failed`), left out of the advantage and counted, and `train.max_failed_steps` such steps in a
    row stop the run, as for a reward whose scoring raises. Without it the error escaped into verl's reward loop,
    which dropped the groups uncounted (and, all failing, ended in "no materializable trajectories"). It keeps the
    real class's declared `group_reward`, `needs_prompt` and `diagnostic_keys` (read without building it)."""

    def __init__(self, target: str, why: str) -> None:
        super().__init__()
        try:
            cls = reward_class(target) if target else None
        except Exception:  # the class itself cannot be imported: nothing to read off it
            cls = None
        self.group_reward = bool(getattr(cls, "group_reward", False))
        self.needs_prompt = bool(getattr(cls, "needs_prompt", False))
        keys = getattr(cls, "diagnostic_keys", ())
        self.diagnostic_keys = tuple(keys) if isinstance(keys, (list, tuple)) else ()
        self.why = why

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        raise RewardBuildError(self.why)


def reward_from_config(reward_cfg: dict) -> Reward:
    """The reward object described by a resolved `conf/reward/*` node, built once per process; where building it
    raises, a `RewardNotBuilt` that fails every call with that error (said once per process, with the traceback)."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(reward_cfg):
        reward_cfg = OmegaConf.to_container(reward_cfg, resolve=True)
    key = hashlib.sha256(json.dumps(reward_cfg, sort_keys=True, default=str).encode()).hexdigest()
    with _REWARDS_LOCK:
        if key not in _REWARDS:
            target = str(reward_cfg.get("_target_", "")) if isinstance(reward_cfg, dict) else ""
            try:
                _REWARDS[key] = build_reward(reward_cfg)
            except Exception as err:  # any error of the reward's own constructor or its dependencies
                cause = err.__cause__ if err.__cause__ is not None else err  # Hydra wraps the constructor's error
                why = f"{target.rpartition('.')[2] or 'the reward'} could not be built: {type(cause).__name__}: {cause}"
                log.exception("%s; every response it is asked to score is a failed reward", why)
                _REWARDS[key] = RewardNotBuilt(target, why.splitlines()[0])
        return _REWARDS[key]


class MicroBatcher:
    """Gathers the single-response calls that reach one event loop together (`max_wait_s`, at most `max_batch`)
    into one reward call on a `RolloutBatch.from_columns` batch, run in a thread off the event loop."""

    def __init__(self, reward: Reward, max_batch: int = 512, max_wait_s: float = 0.05) -> None:
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
        batch = RolloutBatch.from_columns(  # the prompt: each row's extra_info["user_prompt"]
            responses=[r["response"] for r in rows],
            group_ids=[r["group_id"] for r in rows],
            ground_truths=[r["ground_truth"] for r in rows],
            data_sources=[r["data_source"] for r in rows],
            extra_info=[r["extra_info"] for r in rows],
        )
        with self._lock:
            return scored_or_failed(self.reward, batch)

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
    if prompt is None and obj.needs_prompt:
        raise KeyError(
            f"{type(obj).__name__} needs the prompt, but this row's extra_info has no {USER_PROMPT_KEY!r} "
            f"(data_source {data_source!r}, extra_info keys {sorted(extra)}): verl passes the reward no prompt, "
            "so it comes from the data; rebuild the data set with `python -m sarl.data.prepare dataset=NAME`"
        )
    row = {
        "response": solution_str,
        "ground_truth": ground_truth,
        "data_source": data_source,
        "extra_info": extra,
        "group_id": str(extra.get("uid", f"row-{next(_ROW_IDS)}")),
    }
    output = await batcher.submit(row)
    return output_row(output, batch_diagnostic_keys(obj, [output]))
