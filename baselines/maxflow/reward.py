"""The MaxFlow reward object (Structured Reasoning Sec. 4.3, App. A.4.4): the graph of a correct response
from the policy's attention, its quality Q from the max flow, plus the format score."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from baselines.ground_truth import GroundTruthReward
from baselines.maxflow.attention import SequenceTooLong, StepAttention
from baselines.maxflow.flow import TAU, capacity_graph, quality_from_importance, step_importance
from baselines.maxflow.preflight import attention_gpu_items
from sarl.checking.grading.grader import Grader, default_grader
from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch
from sarl.contract.threads import limited
from sarl.formats.tags import STEP_MODES, format_score, parse_structured

log = logging.getLogger(__name__)


class MaxFlowReward(RewardFunction):
    """Structured Reasoning's MaxFlow reward: maxflow_weight * r_maxflow + format_weight * format, where
    r_maxflow = Q (Eq. 4) for a correct answer and -1 otherwise (Sec. 4.3).

    `model`/`tokenizer`: the policy checkpoint whose attention builds the graph (`StepAttention`), or a
    ready `StepAttention` as `attention`. Diagnostics: `acc`, `format`, `r_maxflow`, `Q` (correct answers),
    `F` (max flow), `n_steps`, `n_edges`, `no_answer`, `answer_is_last_step`, `untagged_prefix`,
    `truncated`, `over_max_tokens`. A row whose gold answer is missing or whose attention pass fails scores
    `failed_score` and says why in `failed`. A correct response that makes prompt + response longer than
    `max_tokens` is scored, not failed: Q = 0, the bottom of the correct band (as for a graph with fewer than 2
    intermediate nodes), flagged `over_max_tokens` (its batch mean is their share); only a prompt that alone
    leaves no room for a response fails the row (the configuration's limit, not the response's doing).

    The model is loaded once, when the reward is built. If it cannot be (a wrong path, no memory left on its
    GPU), building still succeeds, once: `check_ready()` names the error, and every row of every batch fails
    with it (the reward cannot judge without its graph), so a backend counts the failures and stops the run
    (`train.max_failed_steps`) instead of rebuilding the reward, and retrying the load, on every call.
    """

    diagnostic_keys = (
        "acc",
        "format",
        "r_maxflow",
        "Q",
        "F",
        "n_steps",
        "n_edges",
        "no_answer",
        "answer_is_last_step",
        "untagged_prefix",
        "truncated",
        "over_max_tokens",
    )
    # node 0 of the graph is the prompt: a backend must hand this reward the prompt text
    # (sarl.backends.verl.reward.compute_score fails a row whose extra_info lacks it)
    needs_prompt = True
    failure_label = "MaxFlow reward"
    gpu_memory_items = classmethod(attention_gpu_items)  # its attention model in the back end's memory plan

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        layers: Sequence[int] = (-5, -4, -3, -2, -1),
        tau: float = TAU,
        step_mode: str = "tags",
        maxflow_weight: float = 2.0,
        format_weight: float = 1.0,
        max_tokens: int = 16384,
        use_chat_template: bool = True,
        device: str | None = None,
        dtype: str = "auto",
        failed_score: float = 0.0,
        grader: Grader | None = None,
        attention: StepAttention | None = None,
        threads: int | None = 1,
    ) -> None:
        super().__init__(threads)
        if step_mode not in STEP_MODES:
            raise ValueError(f"step_mode {step_mode!r} is not valid; choose one of: {', '.join(STEP_MODES)}")
        if tau < 0:
            raise ValueError(f"tau must be >= 0, got {tau}")
        self.load_error: str | None = None
        if attention is None:
            if model is None:
                raise ValueError("MaxFlowReward needs the policy checkpoint: set reward.model=PATH (or attention=)")
            try:
                attention = StepAttention(model, tokenizer, layers, max_tokens, use_chat_template, device, dtype)
            except Exception as err:  # kept as text: the exception's frames would keep a half-loaded model alive
                self.load_error = f"attention model {model!r} not loaded: {type(err).__name__}: {err}"
                log.error("MaxFlow reward: %s; every row fails until the run is fixed", self.load_error)
        self.attention = attention
        self.tau = float(tau)
        self.step_mode = step_mode
        self.maxflow_weight = float(maxflow_weight)
        self.format_weight = float(format_weight)
        self.failed_score = float(failed_score)
        self.grader = grader

    def check_ready(self) -> str | None:
        """Why the attention model cannot be used (`sarl.contract.reward.Reward.check_ready`), None if it can."""
        return self.load_error

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        if self.load_error is not None:
            return [RewardOutput(self.failed_score, {}, self.load_error) for _ in batch.responses]
        grader = self.grader or default_grader()
        graded = GroundTruthReward(grader)(batch)
        out = []
        for i, (response, g) in enumerate(zip(batch.responses, graded)):
            out.append(self._score(batch.prompts[i], response, g))
        return out

    def _score(self, prompt: Any, response: Any, graded: RewardOutput) -> RewardOutput:
        parsed = parse_structured(response, self.step_mode)
        fmt = format_score(parsed)
        acc = graded.diagnostics.get("acc", 0.0)
        diag = {
            "acc": acc,
            "format": fmt,
            "n_steps": float(len(parsed.steps)),
            "no_answer": graded.diagnostics.get("no_answer", 1.0),
            "untagged_prefix": float(parsed.untagged_prefix),
            "truncated": float(parsed.truncated),
            "over_max_tokens": 0.0,
        }
        if graded.failed:
            return RewardOutput(self.failed_score, diag, graded.failed)
        if acc == 1.0 and not (isinstance(prompt, str) and prompt.strip()):
            return RewardOutput(self.failed_score, diag, "no prompt text: the question is node 0 of the graph")
        if acc < 1.0:
            diag["r_maxflow"] = -1.0  # Structured Reasoning Sec. 4.3: -1 for a wrong answer
            return RewardOutput(self.maxflow_weight * -1.0 + self.format_weight * fmt, diag)
        try:
            q, flow, n_edges, last_step = self._quality(prompt, parsed)
        except SequenceTooLong as err:
            prompt_tokens = self.attention.count_tokens(self.attention.prefix(prompt))
            if prompt_tokens >= self.attention.max_tokens:  # no room for any response: the configuration's limit
                reason = f"the prompt alone has {prompt_tokens} tokens, max_tokens={self.attention.max_tokens}"
                return RewardOutput(self.failed_score, diag, f"attention pass failed: {reason}")
            # the response made it too long: the bottom of the correct band (Q = 0), counted, never a mask
            log.info("MaxFlow reward: %s; scored Q = 0 (over_max_tokens)", err)
            diag.update({"r_maxflow": 0.0, "Q": 0.0, "over_max_tokens": 1.0})
            diag["answer_is_last_step"] = float(parsed.answer_start is None)
            return RewardOutput(self.maxflow_weight * 0.0 + self.format_weight * fmt, diag)
        except Exception as err:  # the model pass must not take the run down; the row says why
            return RewardOutput(self.failed_score, diag, f"attention pass failed: {type(err).__name__}: {err}")
        diag.update({"r_maxflow": q, "Q": q, "F": flow, "n_edges": float(n_edges)})
        diag["answer_is_last_step"] = float(last_step)
        return RewardOutput(self.maxflow_weight * q + self.format_weight * fmt, diag)

    def _quality(self, prompt: str, parsed: Any) -> tuple[float, float, int, bool]:
        """(Q, F, edges, answer_is_last_step) of a correct response."""
        steps = list(parsed.steps)
        last_step = parsed.answer_start is None
        if last_step:  # no answer text after </think>: the last step is the answer node
            if not steps:
                return 0.0, 0.0, 0, True
            answer_start = steps.pop().start
        else:
            answer_start = parsed.answer_start
        if len(steps) < 2:  # fewer than 2 intermediate nodes: Q = 0 (no attention pass needed)
            return 0.0, 0.0, 0, last_step
        prefix = self.attention.prefix(prompt)
        starts = [0] + [len(prefix) + s.start for s in steps] + [len(prefix) + answer_start]
        att = self.attention(prefix + parsed.text, starts)
        with limited(self.threads):  # the flow and its per-step deltas: the reward's thread cap
            cap = capacity_graph(att, self.tau)
            flow, delta = step_importance(cap)
        return quality_from_importance(delta), flow, int((cap > 0).sum()), last_step
