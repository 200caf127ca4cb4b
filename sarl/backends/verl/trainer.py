"""Our verl 0.9.1 V1 trainer: group rewards on whole groups, `reward/*` metrics every step.

`SarlTrainer` is verl's synchronous PPO trainer (`PPOTrainerSync`) registered under
`trainer.v1.trainer_mode = "sarl"` (config.TRAINER_NAME). It changes four things, each at a
method verl's V1 trainer calls (line numbers: verl 0.9.1, `trainer/ppo/v1/trainer_base.py`):

- group rewards (TTRL, EMPO, EVOL-RL, LCS; `group_reward = True`) are not computed per sample in
  the agent loop: `_setup` hides the reward workers from the agent loop and from `_step_once` /
  `_validate` (`reward_loop_worker_handles` is None, l.410, 577, 1081), so each sampled batch goes
  through `_compute_reward_colocate`, which reads the rollouts from TransferQueue, scores them in
  this process in one reward call grouped by the prompt uid of their keys, not by position
  (`score_sessions`, on a `RolloutBatch.from_columns` batch), writes `rm_scores` and the reward
  info back, logs the `reward/*` metrics and keeps a seeded random `n_trained` of each prompt's
  `n_votes` rollouts;
- `_next_train_batch` asks the agent loop for `n_votes` rollouts per prompt (`__rollout_n__`,
  `agent_loop_tq.py:115`) while verl's `rollout.n` (which sizes every training batch) is `n_trained`;
- per-response rewards are not scored here: they keep verl's streaming route (our `compute_score`
  in verl's reward workers, concurrently with generation: `sarl.backends.verl.reward` says why);
  `_compute_metrics` adds their `reward/*` metrics from the reward info verl stored with each
  rollout, which verl's V1 trainer does not log during training;
- failed rewards are left out (`_balance_batch`, the first method after the rewards of a training
  batch are written, l.582): a session whose reward failed (`failed` = 1 in its reward info), and
  under a group advantage every session of a prompt with fewer than two usable ones, is cleared
  from TransferQueue and from the batch before verl computes the group statistics, so it counts in
  no baseline, advantage, KL or loss; verl pads the smaller batch with its no-op rows
  (`upsample_batch_to_divisible_size`). A training batch with no usable session has no training
  signal: its update is skipped (`_step_once` returns it untrained, `_compute_metrics` leaves it out
  of verl's data metrics; `reward/update_skipped` = 1),
  and after `train.max_failed_steps` consecutive such batches (as on TRL) the run stops
  (`RewardsFailedError`; `sarl.backends.verl.main` exits 1 with one line);
- `SarlTaskRunnerV1` is verl's TaskRunnerV1 defined in this module, so the Ray actor that runs it
  imports this module, and with it the registration, before `get_trainer_cls` (`main_ppo.py:141`).

The logic is in the plain functions at the top (keys -> sessions, the trained subset, the jagged
score layout, the metrics); the methods only move data between TransferQueue and them.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable, Sequence

import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer import main_ppo
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.utils import tensordict_utils as tu

from sarl.backends.verl.config import TRAINER_NAME
from sarl.backends.verl.reward import is_group_reward, reward_from_config
from sarl.contract.metrics import FAILED_KEY, row_metrics, score_rollouts
from sarl.contract.reward import USER_PROMPT_KEY, Reward, RewardsFailedError, RolloutBatch
from sarl.contract.selection import select_for_training
from sarl.formats.tags import draw_key, redraw_tags, tags_of_prompt

log = logging.getLogger(__name__)

Session = tuple[str, int]  # (prompt uid, session id): one of the n rollouts of a prompt

# fields of a rollout row in TransferQueue (agent_loop_tq.py: the agent loop output plus the dataset row)
SCORE_FIELDS = ["prompts", "responses", "data_source", "reward_model", "extra_info", "extra_fields"]


# -- plain functions ----------------------------------------------------------------------------


def parse_key(key: str) -> tuple[str, int, int]:
    """A V1 trajectory key `{uid}_{session_id}_{index}` (agent_loop_tq.py:178-193) as its parts."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"TransferQueue key {key!r} is not verl's '{{uid}}_{{session_id}}_{{index}}'")
    return parts[0], int(parts[1]), int(parts[2])


def group_sessions(keys: Sequence[str]) -> dict[Session, list[int]]:
    """Row positions of each rollout session, the session's last output last (an agent loop may
    emit several outputs per session; verl rewards the last and copies it to the others)."""
    rows: dict[Session, list[tuple[int, int]]] = {}
    for pos, key in enumerate(keys):
        uid, session, index = parse_key(key)
        rows.setdefault((uid, session), []).append((index, pos))
    return {s: [pos for _, pos in sorted(r)] for s, r in rows.items()}


def trained_sessions(sessions: Sequence[Session], n_trained: int, seed: int) -> tuple[list[Session], int]:
    """The sessions to train on: a seeded random `n_trained` of each prompt's sessions (TTRL's
    "64 votes / 32 trained", `sarl.contract.selection.select_for_training`), and how many prompts had fewer.

    A prompt's sessions are ordered by session id before the draw, so the subset depends only on
    (seed, uid), never on which rollouts finished first (TransferQueue lists them in completion
    order, which favours short responses). A prompt with fewer than `n_trained` sessions (a failed
    rollout) keeps all of them and is counted."""
    ordered = sorted(sessions)
    sizes = Counter(uid for uid, _ in ordered)
    full = [s for s in ordered if sizes[s[0]] >= n_trained]
    short = [s for s in ordered if sizes[s[0]] < n_trained]
    picked = select_for_training([uid for uid, _ in full], n_trained, seed) if full else []
    return sorted([full[i] for i in picked] + short), sum(1 for n in sizes.values() if n < n_trained)


def left_out_sessions(failed: dict[Session, bool], min_usable: int) -> tuple[set[Session], int]:
    """The sessions to leave out of training: those whose reward failed, and every session of a prompt
    with fewer than `min_usable` usable ones (2 under a group advantage: a baseline needs a sibling);
    and how many prompts were dropped that way."""
    usable = Counter(uid for (uid, _), bad in failed.items() if not bad)
    dropped = {uid for uid, _ in failed if usable[uid] < min_usable}
    return {s for s, bad in failed.items() if bad or s[0] in dropped}, len(dropped)


def is_truncated(response: Sequence[int], cap: int, eos_ids: set[int]) -> bool:
    """A response cut by the length cap: it has `cap` tokens (verl's data.max_response_length) and does not end
    in an end-of-sequence token (one that ends exactly at the cap is complete)."""
    return len(response) >= cap and (len(response) == 0 or int(response[-1]) not in eos_ids)


def jagged_scores(scores: Sequence[float], lengths: Sequence[int]) -> tuple[torch.Tensor, int]:
    """verl's `rm_scores` layout (agent_loop.py:144-148): per response a zero vector of its length
    with the score on the last token, as a jagged nested tensor; and the number of empty responses,
    which have no token to carry their score (counted, `reward/empty_responses`)."""
    rows = []
    for score, length in zip(scores, lengths, strict=True):
        row = torch.zeros(int(length), dtype=torch.float32)
        if length > 0:
            row[-1] = float(score)
        rows.append(row)
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged), sum(1 for n in lengths if n == 0)


def column(data: Any, name: str) -> list:
    """A non-tensor TransferQueue field as a plain list (a NonTensorStack, a LinkedList or an array)."""
    value = data.get(name)
    return value.tolist() if hasattr(value, "tolist") else list(value)


def rollout_batch(
    prompts: Sequence[str],
    responses: Sequence[str],
    uids: Sequence[Any],
    reward_models: Sequence[Any],
    data_sources: Sequence[Any],
    extra_infos: Sequence[Any],
) -> RolloutBatch:
    """One row per rollout, grouped by prompt uid, from TransferQueue's columns (`RolloutBatch.from_columns`): the
    gold answer from the dataset's `reward_model`; the prompt the user prompt of its data row
    (`extra_info["user_prompt"]`, as verl's reward workers give it to a per-response reward), `prompts` (the
    decoded, chat-templated prompt) only where the row has none. A reward that reads the prompt (MaxFlow's node 0)
    so gets the same text on both routes."""
    return RolloutBatch.from_columns(
        responses=responses,
        prompts=prompts,
        group_ids=uids,
        reward_models=reward_models,
        data_sources=data_sources,
        extra_info=extra_infos,
    )


def score_sessions(
    reward: Reward, keys: Sequence[str], columns: dict[str, Sequence[Any]], decode: Callable[[Any], str]
) -> tuple[dict[Session, list[int]], list[dict[str, float]], list[dict[str, float]]]:
    """A group reward on a sampled batch, as `SarlTrainer._compute_reward_colocate` runs it: the batch's rows
    (TransferQueue `keys` in any order, `columns` "prompts", "responses" (token ids, turned to text by `decode`),
    "reward_model", "data_source", "extra_info" row by row) grouped into sessions, each session's final output
    scored in one reward call grouped by the uid of its key (`rollout_batch`), whatever order the rows came in.
    Returns the sessions, the reward info of each session (in that order) and the reward info of each row (a
    session's info on each of its outputs, as verl copies it)."""
    sessions = group_sessions(keys)
    final = [rows[-1] for rows in sessions.values()]  # the scored output of each session
    scored = rollout_batch(
        [decode(columns["prompts"][i]) for i in final],
        [decode(columns["responses"][i]) for i in final],
        [uid for uid, _ in sessions],
        *([columns[name][i] for i in final] for name in ("reward_model", "data_source", "extra_info")),
    )
    _, infos = score_rollouts(reward, scored)
    info_of_row: list[dict[str, float]] = [{}] * len(keys)
    for rows, info in zip(sessions.values(), infos, strict=True):
        for pos in rows:
            info_of_row[pos] = info
    return sessions, infos, info_of_row


def streamed_reward_metrics(extra_fields: Sequence[Any]) -> dict[str, float]:
    """`reward/*` metrics of a per-response reward from the `reward_extra_info` that verl's agent
    loop stored in each rollout's `extra_fields`; a rollout without one is counted
    (`reward/missing_info`)."""
    infos = [e.get("reward_extra_info") if isinstance(e, dict) else None for e in extra_fields]
    metrics = row_metrics([i for i in infos if i])
    metrics["reward/missing_info"] = float(sum(1 for i in infos if not i))
    return metrics


# -- the trainer --------------------------------------------------------------------------------


class _NoUsableReward(Exception):
    """A training batch with no usable reward: raised from `_balance_batch`, caught by
    `SarlTrainer._step_once`, which skips the rest of the step (verl's fit clears the batch after it)."""

    def __init__(self, batch: KVBatchMeta) -> None:
        super().__init__("no usable reward in this training batch")
        self.batch = batch


class _BatchRewardLoop:
    """verl's RewardLoopManager as seen with streaming rewards off: verl reads this property to hand
    reward workers to the agent loop (trainer_base.py:410) and to decide whether to score the
    sampled batch itself (l.577 train, l.1081 validation)."""

    reward_loop_worker_handles = None

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def register_adv_estimator(config: DictConfig) -> None:
    """Call the function that registers the algorithm's advantage estimator with verl
    (`trainer.v1.sarl.adv_estimator_register`, from `algorithm.adv_estimator_register`: PASC-GRPO's `scae`),
    in this process, which computes the advantages."""
    path = OmegaConf.select(config, f"trainer.v1.{TRAINER_NAME}.adv_estimator_register", default=None)
    if path:
        from hydra.utils import get_method

        get_method(str(path))()


@register_trainer(TRAINER_NAME)
class SarlTrainer(PPOTrainerSync):
    """verl's sync PPO trainer with our reward objects (see the module docstring)."""

    def __init__(self, config: DictConfig) -> None:
        reward_cfg = config.reward.custom_reward_function.get("reward_kwargs", {}).get("reward")
        if reward_cfg is None:
            raise ValueError(
                "reward.custom_reward_function.reward_kwargs.reward is not set: build the config with sarl.train"
            )
        reward_cfg = OmegaConf.to_container(reward_cfg, resolve=True) if OmegaConf.is_config(reward_cfg) else reward_cfg
        self.group_reward = is_group_reward(reward_cfg)
        if self.group_reward:
            self._check_group_config(config)
            ours = config.trainer.v1[TRAINER_NAME]
            self.n_votes, self.selection_seed = int(ours.n_votes), int(ours.seed)
        # verl's base class branches on trainer_mode == "sync" (replay buffer, checkpoints, refill:
        # trainer_base.py:153, 731, 902, 912, 1004, 1499); the registered name only picks this class.
        config.trainer.v1.trainer_mode = "sync"
        max_failed = config.trainer.v1.get(TRAINER_NAME, {}).get("max_failed_steps")
        self.max_failed_steps = int(max_failed) if max_failed is not None else None  # train.max_failed_steps
        self.failed_streak = 0  # consecutive training batches with no usable reward
        self._skipped_keys: set[str] = set()  # keys of this step's batches that were not trained on
        self._tags_redrawn = (0, 0)  # this step's prompts whose tag set changed, of those redrawn (_redraw_tags)
        register_adv_estimator(config)
        ours = config.trainer.v1.get(TRAINER_NAME, {})
        self.mask_truncated = bool(ours.get("mask_truncated", False))
        self.resample_tags_seed = int(ours.get("seed", 0)) if ours.get("resample_tags", False) else None
        super().__init__(config)
        self.reward = reward_from_config(reward_cfg) if self.group_reward else None

    @staticmethod
    def _check_group_config(config: DictConfig) -> None:
        if TRAINER_NAME not in config.trainer.v1:
            raise ValueError(f"trainer.v1.{TRAINER_NAME} (n_votes, seed) is not set: build the config with sarl.train")
        n_votes, n_trained = int(config.trainer.v1[TRAINER_NAME].n_votes), int(config.actor_rollout_ref.rollout.n)
        if not 1 <= n_trained <= n_votes:
            raise ValueError(f"a group reward trains on rollout.n={n_trained} of n_votes={n_votes} rollouts per prompt")
        if config.algorithm.get("filter_groups", {}).get("enable", False):
            raise ValueError(
                "algorithm.filter_groups (DAPO) filters groups on the streamed reward at sampling time; "
                "a group reward is computed after sampling: disable filter_groups"
            )
        if config.reward.reward_model.enable:
            raise ValueError("a group reward replaces the reward model: set reward.reward_model.enable=false")

    def _setup(self) -> None:
        super()._setup()
        if self.group_reward:
            self.reward_loop_manager = _BatchRewardLoop(self.reward_loop_manager)

    def _next_train_batch(self, num_prompts: int | None = None):
        batch = super()._next_train_batch(num_prompts)
        if self.resample_tags_seed is not None:
            self._redraw_tags(batch)
        if self.group_reward:
            # the agent loop generates this many rollouts per prompt (agent_loop_tq.py:115)
            tu.assign_non_tensor_data(batch, "__rollout_n__", self.n_votes)
        return batch

    def _redraw_tags(self, batch) -> None:  # noqa: ANN001 (verl's TensorDict)
        """train.resample_tags (Structured Reasoning App. A.4): each sampled prompt's tag set redrawn from (seed,
        row id, epoch) before generation (`raw_prompt`, what the agent loop renders), and `extra_info.user_prompt`
        (what the rewards read) with it; the step logs how many were drawn and how many came out changed
        (`data/tag_sets_drawn`, `data/tag_sets_changed`)."""
        epoch = max(0, (int(self.global_steps) - 1) // max(1, int(getattr(self, "steps_per_epoch", 0) or 1)))
        prompts, infos = column(batch, "raw_prompt"), column(batch, "extra_info")
        new_prompts, new_infos, changed = [], [], 0
        for messages, info in zip(prompts, infos, strict=True):
            info = dict(info) if isinstance(info, dict) else {}
            redrawn = redraw_tags(
                list(messages), self.resample_tags_seed, draw_key(info.get("id", info.get("index")), epoch)
            )
            info[USER_PROMPT_KEY] = redrawn[-1]["content"]
            new_prompts.append(redrawn)
            new_infos.append(info)
            changed += tags_of_prompt(redrawn[-1]["content"]) != tags_of_prompt(str(list(messages)[-1]["content"]))
        self._tags_redrawn = (changed, len(new_prompts))
        tu.assign_non_tensor_stack(batch, "raw_prompt", new_prompts)
        tu.assign_non_tensor_stack(batch, "extra_info", new_infos)

    def _compute_reward_colocate(self, batch: KVBatchMeta, metrics: dict | None = None) -> KVBatchMeta:
        """Score the sampled batch grouped by uid; on training batches log `reward/*` and keep
        `rollout.n` sessions per prompt (the others are cleared from TransferQueue)."""
        if not self.group_reward:
            return super()._compute_reward_colocate(batch, metrics=metrics)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=SCORE_FIELDS)
        responses = data["responses"].unbind()
        columns = {name: column(data, name) for name in ("reward_model", "data_source", "extra_info")}
        sessions, infos, info_of_row = score_sessions(
            self.reward,
            batch.keys,
            {"prompts": data["prompts"].unbind(), "responses": responses, **columns},
            lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
        )
        rm_scores, n_empty = jagged_scores([i["score"] for i in info_of_row], [len(r) for r in responses])
        extra_fields = [
            {**(e if isinstance(e, dict) else {}), "reward_extra_info": info}  # read by _validate, l.1126-1139
            for e, info in zip(column(data, "extra_fields"), info_of_row, strict=True)
        ]
        fields = tu.get_tensordict({"rm_scores": rm_scores, "extra_fields": extra_fields})
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        if batch.partition_id == "val":
            return batch

        keep, n_short = trained_sessions(list(sessions), self.config.actor_rollout_ref.rollout.n, self.selection_seed)
        kept_keys = [batch.keys[pos] for s in keep for pos in sessions[s]]
        if metrics is not None:
            metrics.update(row_metrics(infos))
            metrics.update(
                {
                    "reward/empty_responses": float(n_empty),
                    "reward/voted_sessions": float(len(sessions)),
                    "reward/trained_sessions": float(len(keep)),
                    "reward/short_groups": float(n_short),
                }
            )
        if n_short:
            log.warning(
                "%d prompts have fewer than rollout.n sessions (failed rollouts); all of theirs are kept", n_short
            )
        if len(kept_keys) == len(batch):
            return batch
        kept = set(kept_keys)
        # fit() clears only the keys of the batch it trains on (trainer_base.py:511)
        tq.kv_clear(keys=[k for k in batch.keys if k not in kept], partition_id=batch.partition_id)
        return batch.select_keys([k for k in batch.keys if k in kept])

    def _balance_batch(self, batch: KVBatchMeta, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        if batch.partition_id == "train":
            batch = self._leave_out_failed(batch, metrics)
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def _leave_out_failed(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """Clear the sessions `left_out_sessions` names from TransferQueue and the batch; log
        `reward/left_out` (sessions) and `reward/groups_dropped` (prompts)."""
        sessions = group_sessions(batch.keys)
        final = [batch.keys[rows[-1]] for rows in sessions.values()]
        data = tq.kv_batch_get(keys=final, partition_id=batch.partition_id, select_fields=["extra_fields"])
        infos = [e.get("reward_extra_info") if isinstance(e, dict) else None for e in column(data, "extra_fields")]
        reward_failed = {s: bool((info or {}).get(FAILED_KEY)) for s, info in zip(sessions, infos, strict=True)}
        failed = self._with_truncated(batch, sessions, reward_failed, metrics)
        min_usable = 1 if self.config.algorithm.adv_estimator == "gae" else 2
        left_out, n_dropped = left_out_sessions(failed, min_usable)
        metrics.update({"reward/left_out": float(len(left_out)), "reward/groups_dropped": float(n_dropped)})
        n_failed = sum(reward_failed.values())
        n_truncated = sum(failed.values()) - n_failed  # truncated (train.mask_truncated) with a reward
        unusable = len(left_out) == len(sessions)
        self._count_failed_step(batch, unusable, n_failed, len(sessions), metrics, n_truncated=n_truncated)
        if not left_out:
            return batch
        gone = {batch.keys[pos] for s in left_out for pos in sessions[s]}
        log.warning("leaving %d of %d sessions out of training (failed rewards)", len(left_out), len(sessions))
        tq.kv_clear(keys=sorted(gone), partition_id=batch.partition_id)
        return batch.select_keys([k for k in batch.keys if k not in gone])

    def _count_failed_step(
        self, batch: KVBatchMeta, unusable: bool, n_failed: int, n_sessions: int, metrics: dict, n_truncated: int = 0
    ) -> None:
        """Counts training batches with no usable reward (`reward/update_skipped`, `reward/failed_streak`).
        Such a batch's update is skipped (`_NoUsableReward`); after
        `train.max_failed_steps` in a row the run stops (`RewardsFailedError`), as on TRL. `n_failed` counts
        the rewards that failed, `n_truncated` the other responses left out for being truncated."""
        self.failed_streak = self.failed_streak + 1 if unusable else 0
        metrics.update({"reward/update_skipped": float(unusable), "reward/failed_streak": float(self.failed_streak)})
        if not unusable:
            return
        what = f"{n_failed} of {n_sessions} rewards failed"
        if n_truncated:
            what += f", {n_truncated} truncated responses left out (train.mask_truncated)"
        if n_failed + n_truncated < n_sessions:
            what += ", no group has two usable ones"
        if self.max_failed_steps is not None and self.failed_streak >= self.max_failed_steps:
            raise RewardsFailedError(
                f"no usable reward in {self.failed_streak} consecutive steps (up to step {self.global_steps}; "
                f"train.max_failed_steps={self.max_failed_steps}; last: {what}): fix the reward's dependency "
                "(embedding server, reward model) and rerun, which resumes from the last checkpoint"
            )
        log.warning("step %d: no usable reward (%s); its update is skipped", self.global_steps, what)
        raise _NoUsableReward(batch)

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        try:
            return super()._step_once(metrics, timing_raw, sample_batch_size)
        except _NoUsableReward as skipped:  # no old/ref log-probs, advantages or updates for this batch
            self._skipped_keys.update(skipped.batch.keys)
            return skipped.batch

    def _with_truncated(
        self, batch: KVBatchMeta, sessions: dict[Session, list[int]], failed: dict[Session, bool], metrics: dict
    ) -> dict[Session, bool]:
        """`train.mask_truncated` (Structured Reasoning App. A.4.4 "Truncation Robustness": "we mask the truncated
        completions to disregard their reward values and gradient updates"): a session whose final response hit
        data.max_response_length (`is_truncated`) is left out like a failed reward, before the advantage, so it
        is neither in its group's baseline nor in the loss nor in the logged reward; counted as
        `response/truncated_left_out`."""
        if not self.mask_truncated:
            return failed
        final = [batch.keys[rows[-1]] for rows in sessions.values()]
        data = tq.kv_batch_get(keys=final, partition_id=batch.partition_id, select_fields=["responses"])
        cap = int(self.config.data.max_response_length)
        eos = self.tokenizer.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        cut = {
            s: is_truncated(r.tolist(), cap, eos_ids) for s, r in zip(sessions, data["responses"].unbind(), strict=True)
        }
        metrics["response/truncated_left_out"] = float(sum(cut.values()))
        return {s: bad or cut[s] for s, bad in failed.items()}

    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch) -> None:
        if self.resample_tags_seed is not None:  # this step's prompts whose tag set the redraw changed (_redraw_tags)
            changed, total = self._tags_redrawn
            metrics.update({"data/tag_sets_changed": float(changed), "data/tag_sets_drawn": float(total)})
        skipped, self._skipped_keys = self._skipped_keys, set()
        if skipped:  # verl's data metrics need the fields of a trained batch (advantages, returns, ...)
            trained = [k for k in batch.keys if k not in skipped]
            if not trained:
                metrics.update({"training/global_step": global_steps, "training/epoch": epoch})
                return
            batch = batch.select_keys(trained)
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        if self.group_reward:
            return  # logged in _compute_reward_colocate, over every vote
        real = [k for k, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
        final = [real[rows[-1]] for rows in group_sessions(real).values()]
        data = tq.kv_batch_get(keys=final, partition_id=batch.partition_id, select_fields=["extra_fields"])
        metrics.update(streamed_reward_metrics(column(data, "extra_fields")))


def _task_runner_class() -> type:
    """The class under verl's `@ray.remote TaskRunnerV1` (Ray forbids subclassing the actor class)."""
    try:
        return main_ppo.TaskRunnerV1.__ray_metadata__.modified_class.__ray_actor_class__
    except AttributeError as err:
        raise ImportError(
            "verl.trainer.main_ppo.TaskRunnerV1 is not the Ray actor class of verl 0.9.1 / Ray 2.x; "
            "sarl.backends.verl.trainer needs updating for this verl"
        ) from err


class SarlTaskRunnerV1(_task_runner_class()):
    """verl's TaskRunnerV1, defined here: Ray imports the module of an actor's class in the actor's
    process, so `SarlTrainer` is registered there when `run` looks up `trainer.v1.trainer_mode`."""


SarlTaskRunner = ray.remote(SarlTaskRunnerV1)
