"""Execution reward for code (decisions §8): the program in the response's last fenced code block runs against
the problem's tests in `sarl.checking.code.sandbox`.

GRP Sec. 3.2.2 partitions a group by an accuracy reward r_acc in {0, 1} (Eq. 14) and GRP Sec. 4.1 reports code
benchmarks as accuracies (avg@k), so the default score is all-pass: 1.0 when every test passes, else 0.0.
`score="pass_fraction"` gives the share of the tests' top-level `assert` statements that pass instead
(`sarl.checking.code.sandbox.RunResult.score`).

Ground truth per row: `{"tests": SOURCE, "prelude": ..., "stdin": ...}` (`sarl.data.code_tests`), SOURCE Python that
raises on a failure (MBPP's `assert` lines; HumanEval's `check(entry_point)` appended when the set is prepared). The
program only computes, inside the sandbox; the tests run and the verdict is computed in a separate judge process
(`sarl.checking.code.sandbox`), so nothing the program does to its own interpreter changes its score. The code block
is looked for in the final answer part (`sarl.checking.grading.extract.strip_thinking`: after `</think>`).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from sarl.checking.code.sandbox import (
    OUTCOMES,
    SCORE_MODES,
    CodeProblem,
    RunResult,
    Sandbox,
    last_code_block,
    problem_of,
)
from sarl.checking.grading.extract import strip_thinking
from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch
from sarl.runtime.checks import Check

log = logging.getLogger(__name__)

ROW_OUTCOMES = ("no_code_block", *OUTCOMES)  # one per row, counted; sandbox_error rows are masked (failed)
DIAGNOSTIC_KEYS = ("acc", "pass_fraction", *(f"code/{k}" for k in ROW_OUTCOMES))


class CodeExecReward(RewardFunction):
    """1.0 when the last code block passes all of its problem's tests (or the pass fraction, `score`), else 0.

    Diagnostics: `acc` (all tests passed), `pass_fraction`, and one indicator per outcome `code/<kind>` for
    the kinds of ROW_OUTCOMES (their batch mean is the share, `outcome_counts` the running counts). No code block,
    a syntax error, a timeout, memory, too much output, a crash and failed tests score 0. A row the sandbox
    could not judge (its harness broke: `sandbox_error`) and a row whose ground truth cannot be judged
    (`sarl.checking.code.sandbox.problem_of`) are failed (masked by the backends), never a silent 0.
    """

    diagnostic_keys = DIAGNOSTIC_KEYS
    failure_label = "code execution reward"

    def __init__(
        self,
        score: str = "all_pass",
        max_workers: int | None = None,
        answer_in_unclosed_think: bool = False,
        sandbox: Sandbox | dict | None = None,
    ) -> None:
        super().__init__()
        if score not in SCORE_MODES:
            raise ValueError(f"reward.score={score!r} is not valid; choose one of: {', '.join(SCORE_MODES)}")
        self.mode = score
        self.max_workers = max_workers
        self.answer_in_unclosed_think = answer_in_unclosed_think
        self.sandbox = sandbox if isinstance(sandbox, Sandbox) else Sandbox(**dict(sandbox or {}))
        self.outcome_counts: Counter[str] = Counter()

    def check_ready(self) -> str | None:
        return self.sandbox.check_ready()

    @classmethod
    def preflight_checks(cls, reward_cfg: Any) -> list[Check]:
        """The reward's preflight items (`RewardFunction.preflight_checks`): its sandbox, tried on this machine."""
        return sandbox_checks(reward_cfg)

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        golds = batch.ground_truths if batch.ground_truths is not None else [None] * len(batch)
        out: list[RewardOutput | None] = [None] * len(batch)
        jobs: list[tuple[int, str, CodeProblem]] = []
        for i, (response, gold) in enumerate(zip(batch.responses, golds)):
            try:
                problem = problem_of(gold) if gold is not None else None
            except ValueError as err:
                out[i] = RewardOutput(0.0, failed=f"unusable ground truth: {err}")
                continue
            if problem is None:
                out[i] = RewardOutput(0.0, failed="no ground truth")
            elif not isinstance(response, str):
                out[i] = RewardOutput(0.0, failed=f"unusable response: a {type(response).__name__}, not a str")
            else:
                text = strip_thinking(response, answer_in_unclosed_think=self.answer_in_unclosed_think)
                program = last_code_block(text)
                if program is None:
                    out[i] = self._output("no_code_block", 0.0, 0.0)
                else:
                    jobs.append((i, program, problem))
        results = self.sandbox.run_many([(p, t) for _, p, t in jobs], self.max_workers)
        for (i, _, _), result in zip(jobs, results):
            out[i] = self._judged(result)
        batch_counts = Counter(k for o in out if o is not None for k in ROW_OUTCOMES if o.diagnostics.get(f"code/{k}"))
        self.outcome_counts.update(batch_counts)
        log.info("code execution reward: %s", dict(batch_counts))
        return out  # type: ignore[return-value]

    def _judged(self, result: RunResult) -> RewardOutput:
        if result.outcome == "sandbox_error":  # the harness, not the program: masked
            return self._output("sandbox_error", 0.0, 0.0, failed=f"sandbox error: {result.detail}")
        fraction = result.score("pass_fraction")
        return self._output(result.outcome, result.score(self.mode), fraction)

    @staticmethod
    def _output(kind: str, score: float, fraction: float, failed: str | None = None) -> RewardOutput:
        diagnostics = {"acc": float(kind == "passed"), "pass_fraction": fraction}
        diagnostics.update({f"code/{k}": float(k == kind) for k in ROW_OUTCOMES})
        return RewardOutput(score, diagnostics, failed)


def sandbox_settings(reward_cfg: Any) -> list[dict]:
    """The sandbox settings of every code-executing reward in a resolved reward config (`reward=code_exec`, GRP's
    `outcome: code_exec`, or a component of a combined reward)."""
    found: list[dict] = []
    if isinstance(reward_cfg, dict):
        target = str(reward_cfg.get("_target_", ""))
        if target.endswith("code_exec.CodeExecReward"):
            found.append(dict(reward_cfg.get("sandbox") or {}))
        elif reward_cfg.get("outcome") == "code_exec":
            found.append(dict((reward_cfg.get("code_exec") or {}).get("sandbox") or {}))
        else:
            for value in reward_cfg.values():
                found.extend(sandbox_settings(value))
    elif isinstance(reward_cfg, list):
        for value in reward_cfg:
            found.extend(sandbox_settings(value))
    return found


def sandbox_checks(reward_cfg: Any) -> list[Check]:
    """One check per code-executing reward: a trivial program judged in its sandbox on this machine (bubblewrap
    present, namespaces allowed, the interpreter runnable by the sandbox's uids); none for other rewards."""
    checks = []
    for settings in sandbox_settings(reward_cfg):
        try:
            sandbox = Sandbox(**settings)
            problem = sandbox.check_ready()
        except (TypeError, ValueError) as err:
            problem = f"reward sandbox settings: {err}"
        detail = problem or f"a trivial program judged: {sandbox.isolation}"
        checks.append(Check("code sandbox", problem is None, detail, "" if problem is None else "as the result says"))
    return checks
