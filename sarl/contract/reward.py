"""The one reward contract: every reward maps a RolloutBatch to RewardOutputs.

`Reward` is the contract a backend relies on (and calls directly, without probing for optional
attributes); `RewardFunction` is the base class every reward of `sarl/` and `baselines/` derives from: it
declares the defaults, checks the output length and counts failures once, in `__call__`, so a reward
only writes `score(batch)`. `sarl/`, `baselines/` and `eval/` all import these types; no reward imports a
training backend. `RolloutBatch.from_columns` is the one place a back end (verl's trainer and reward workers, TRL,
`sarl.score`, the bench) builds the batch it hands a reward, so every route gives a reward the same fields.
"""

from __future__ import annotations

import abc
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

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

    @classmethod
    def from_columns(
        cls,
        responses: Sequence[str],
        prompts: Sequence[Any] | None = None,
        group_ids: Sequence[Any] | None = None,
        ground_truths: Sequence[Any] | None = None,
        reward_models: Sequence[Any] | None = None,
        data_sources: Sequence[Any] | None = None,
        extra_info: Sequence[Any] | None = None,
        response_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> RolloutBatch:
        """The batch a back end hands a reward, from its per-row columns: the one place every back end (verl's
        trainer and reward workers, TRL, `sarl.score`, the bench) builds one.

        - prompt: the row's `extra_info[USER_PROMPT_KEY]` (the user message data preparation stores) where it has
          one, else `prompts` (a back end's own, e.g. a decoded chat-templated prompt), else "";
        - gold answer: `ground_truths` (the plain value), or `reward_models` (verl's dataset column, a dict whose
          "ground_truth" it is; any other value gives None), not both;
        - `extra_info`: each row a dict (copied), a JSON object string (TRL's column) or None ({});
        - group ids and data sources as strings (a missing data source is ""); no group ids: one group per row.
        """
        n = len(responses)
        if ground_truths is not None and reward_models is not None:
            raise ValueError("RolloutBatch.from_columns takes ground_truths or reward_models, not both")
        infos = [_info_dict(e) for e in extra_info] if extra_info is not None else None
        given = list(prompts) if prompts is not None else [None] * n
        if infos is not None and len(infos) == n == len(given):
            given = [p if i.get(USER_PROMPT_KEY) is None else i[USER_PROMPT_KEY] for p, i in zip(given, infos)]
        if reward_models is not None:
            ground_truths = [rm.get("ground_truth") if isinstance(rm, dict) else None for rm in reward_models]
        return cls(
            prompts=["" if p is None else str(p) for p in given],
            responses=list(responses),
            group_ids=[str(g) for g in group_ids] if group_ids is not None else None,
            ground_truths=list(ground_truths) if ground_truths is not None else None,
            data_sources=["" if s is None else str(s) for s in data_sources] if data_sources is not None else None,
            extra_info=infos,
            response_token_ids=[list(map(int, t)) for t in response_token_ids]
            if response_token_ids is not None
            else None,
        )


def _info_dict(value: Any) -> dict[str, Any]:
    """One row's extra_info as a fresh dict (`RolloutBatch.from_columns`)."""
    if value is None:
        return {}
    if isinstance(value, str):
        parsed = json.loads(value) if value else {}
        if not isinstance(parsed, dict):
            raise TypeError(f"extra_info must be a JSON object, got {type(parsed).__name__}")
        return parsed
    if isinstance(value, dict):
        return dict(value)
    raise TypeError(f"extra_info must be a dict or a JSON string, got {type(value).__name__}")


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
    """What a backend calls: `reward(batch)` -> one RewardOutput per response, plus what it reads off the reward.

    - `group_reward`: the reward compares a response with its prompt's siblings (TTRL, EMPO, EVOL-RL, LCS),
      so a backend must hand it whole groups (`RolloutBatch.group_ids`). A backend reads it off the class,
      before building the reward (`reward_class`).
    - `needs_prompt`: the reward reads the prompt text (MaxFlow: the question is node 0 of its graph); a
      backend that gets no prompt of its own must supply `extra_info[USER_PROMPT_KEY]`.
    - `diagnostic_keys`: the diagnostics every output may carry, for a fixed per-batch key set (verl stacks
      each key across rows); empty means "whatever keys the outputs carry".
    - `failure_counts`: failed outputs so far, by reason category (`record_failures`).
    - `check_ready()`: None when the reward can run, else the reason (what is wrong and what to do). A
      reward with an external dependency (an embedding server, a remote model) tries it once, so that a
      backend stops a run with a dead dependency before step 1 instead of failing every reward.
    """

    group_reward: bool
    needs_prompt: bool
    diagnostic_keys: Sequence[str]
    failure_counts: Counter[str]

    def __call__(self, batch: RolloutBatch) -> list[RewardOutput]: ...

    def check_ready(self) -> str | None: ...


# The members of `Reward` a class declares (failure_counts is per instance).
CLASS_MEMBERS = ("group_reward", "needs_prompt", "diagnostic_keys", "check_ready", "__call__")


class RewardFunction(abc.ABC):
    """The base class of every reward: a subclass writes `score(batch)` and declares what differs from the
    defaults below; `__call__` checks the number of outputs and counts the failed ones (`record_failures`,
    one warning per batch naming `failure_label`). A subclass with an `__init__` calls `super().__init__()`."""

    group_reward: ClassVar[bool] = False
    needs_prompt: ClassVar[bool] = False
    diagnostic_keys: Sequence[str] = ()
    failure_label: ClassVar[str] = ""  # names the reward in the failure warning; default: the class name

    def __init__(self, threads: int | None = 1) -> None:
        """`threads`: the BLAS/OpenMP threads of the reward's numerical kernels per call (sarl.contract.threads;
        `threads` in its conf/reward/*.yaml); None leaves the pools as the process has them."""
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(
                f"reward threads={threads!r}: a positive number of threads, or null to leave them as they are"
            )
        self.threads = threads
        self.failure_counts: Counter[str] = Counter()

    @abc.abstractmethod
    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        """One RewardOutput per response of `batch`, in its order."""

    def __call__(self, batch: RolloutBatch) -> list[RewardOutput]:
        outputs = self.score(batch)
        if len(outputs) != len(batch):
            raise RuntimeError(f"{type(self).__name__} returned {len(outputs)} outputs for {len(batch)} responses")
        self.count_failures(outputs)
        return outputs

    def count_failures(self, outputs: Sequence[RewardOutput | None]) -> None:
        """Add the failed outputs to `failure_counts` and log them (what `__call__` does after `score`)."""
        label = self.failure_label or type(self).__name__
        record_failures(self.failure_counts, outputs, label, logging.getLogger(type(self).__module__))

    def check_ready(self) -> str | None:
        """None: a reward without an external dependency can always run (see `Reward`)."""
        return None

    # The reward's own preflight items, read off the class before anything is built (`reward_hooks`): a back end
    # adds them to its checks (`python -m sarl.preflight`, and the cheap ones sarl.train runs before a launch).
    # `reward_cfg` is the run's whole resolved reward config, a combined reward's components included.

    @classmethod
    def preflight_checks(cls, reward_cfg: Any) -> list:
        """The checks this reward needs on the machine that runs it (`sarl.runtime.checks.Check` rows, e.g. the
        code sandbox of `baselines.code_exec`); default: none."""
        return []

    @classmethod
    def gpu_memory_items(
        cls,
        reward_cfg: Any,
        copies: int,
        where: str,
        seq: int,
        allow_download: bool = False,
        skip_missing: bool = False,
    ) -> tuple[dict[int, list], list]:
        """What this reward loads on a GPU of the node beside the trainer, in `copies` processes (`where` they run)
        over sequences of `seq` tokens: `sarl.runtime.memory.Item`s by GPU index, and the checks that failed (a
        model's config.json not found, unless `skip_missing`); default: nothing (e.g. `baselines.maxflow`'s
        attention model is something)."""
        return {}, []


def contract_problems(reward: object) -> list[str]:
    """The members of the `Reward` contract that `reward` (an object, or a class: then without the per-instance
    `failure_counts`) lacks; empty when it satisfies the contract."""
    if isinstance(reward, type):  # a class is always callable itself: look for `__call__` on its instances
        missing = [m for m in CLASS_MEMBERS if m != "__call__" and not hasattr(reward, m)]
        if not any("__call__" in vars(k) for k in reward.__mro__[:-1]):
            missing.append("__call__")
        return missing
    return [m for m in (*CLASS_MEMBERS, "failure_counts") if not hasattr(reward, m)]


def check_reward(reward: Any) -> Any:
    """`reward` itself if it satisfies the `Reward` contract, else TypeError naming what it lacks."""
    missing = contract_problems(reward)
    if missing:
        name = reward.__name__ if isinstance(reward, type) else type(reward).__name__
        raise TypeError(
            f"{name} is not a reward: it lacks {', '.join(missing)} "
            "(derive it from sarl.contract.reward.RewardFunction)"
        )
    return reward


def build_reward(node: Any, **kwargs: Any) -> Any:
    """A `conf/reward/*` node built (Hydra's instantiate, `kwargs` passed on) and checked against the contract."""
    from hydra.utils import instantiate

    return check_reward(instantiate(node, **kwargs))


def reward_class(target: str) -> type:
    """The class a `conf/reward/*` node's `_target_` names, checked against the contract, without building it."""
    from hydra.utils import get_class

    return check_reward(get_class(target))


def reward_hooks(reward_cfg: Any, hook: str) -> list[Any]:
    """The classmethod `hook` (`preflight_checks`, `gpu_memory_items`) of every reward class a resolved
    `conf/reward/*` config names by `_target_` (the reward and its components), each implementation once, in the
    config's order; a `_target_` that is not an importable class with that hook (a function, an embedder) is left
    out (sarl.train refuses a reward that cannot be imported before it asks)."""
    from hydra.utils import get_class

    found: list[Any] = []
    seen: set[Any] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            target = node.get("_target_")
            try:
                method = getattr(get_class(str(target)), hook, None) if target else None
            except (ImportError, ValueError, TypeError, AttributeError):  # not a class, or not importable
                method = None
            impl = getattr(method, "__func__", method)
            if method is not None and impl not in seen:
                seen.add(impl)
                found.append(method)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(reward_cfg)
    return found


def reward_problem(reward: Reward) -> str | None:
    """Why `reward` cannot run (its `check_ready()`, see `Reward`), None if it can."""
    return reward.check_ready()
