"""Code benchmarks scored by execution (GRP Sec. 4.1, Tables 1 and 3; decisions §8): each sample's last fenced
Python block in its final answer (after `</think>`, as answers are graded) runs against its problem's tests in
`sarl.checking.code.sandbox`, at most `code.max_workers` programs at once. A sample is correct when every test
passes; the correctness per sample gives the benchmark's avg@k / pass@k through `eval.metrics`, as for math.

Outcomes per sample (counted per benchmark in results.json's `code_outcomes`): `no_code_block`, the sandbox's
`passed`, `failed`, `syntax_error`, `timeout`, `memory`, `output_limit`, `crashed` (the program died of a signal),
`sandbox_error` (the harness could not run it: incorrect, not cached, so a rerun tries again) and `no_response`
(generation failed). Runs are cached per sample by the response's text hash; only the judge's verdicts are cached
(`sarl.checking.code.sandbox`: computed in a process the program never ran in).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from eval.cache import SampleCache, stable_hash, text_hash
from sarl.checking.code.sandbox import JUDGE_VERSION, Sandbox, last_code_block, problem_of
from sarl.checking.grading.extract import strip_thinking
from sarl.runtime.errors import UserError

if TYPE_CHECKING:
    from eval.protocol import Benchmark

log = logging.getLogger(__name__)

Key = tuple[str, str, int]


def _valid(record: dict[str, Any]) -> bool:
    return isinstance(record.get("outcome"), str) and isinstance(record.get("text_hash"), str)


def run_code(cfg: DictConfig, benchmarks: Sequence[Benchmark], texts: Mapping[Key, str], root: Path) -> dict[Key, dict]:
    """A run record {"outcome", "passed", "asserts", "detail"} per response of every code benchmark: cached, or
    run now in the sandbox (`cfg.code`)."""
    from tqdm import tqdm

    code_benchmarks = [b for b in benchmarks if b.kind == "code"]
    if not code_benchmarks:
        return {}
    settings = OmegaConf.to_container(cfg.code, resolve=True)
    unclosed = bool(cfg.grading.answer_in_unclosed_think)
    # keyed by the judge's version too: a verdict of an earlier judge (which a program could forge) is never reused
    cache = SampleCache(root / f"code-{stable_hash({**settings, 'unclosed': unclosed, 'judge': JUDGE_VERSION})}")
    out: dict[Key, dict] = {}
    pending: dict[float, list[tuple]] = {}  # by timeout: (key, program, CodeProblem, prompt hash)
    by_benchmark = settings.get("timeout_s_by_benchmark") or {}
    for b in code_benchmarks:
        timeout = float(by_benchmark.get(b.name, settings["sandbox"]["timeout_s"]))
        for p in b.problems:
            try:
                problem = problem_of(p.gold)
            except ValueError as err:
                raise UserError(f"code benchmark {b.name}, problem {p.id}: {err}") from None
            cached = cache.get(b.name, p.id, p.prompt_hash, valid=_valid)
            for i in range(b.n_samples):
                key = (b.name, p.id, i)
                if key not in texts:
                    continue
                record = cached.get(i)
                if record is not None and record["text_hash"] == text_hash(texts[key]):
                    out[key] = record
                    continue
                block = last_code_block(strip_thinking(texts[key], answer_in_unclosed_think=unclosed))
                if block is None:
                    out[key] = {"text_hash": text_hash(texts[key]), "outcome": "no_code_block"}
                    cache.put(b.name, p.id, p.prompt_hash, i, out[key])
                else:
                    job = (key, block, problem, p.prompt_hash)
                    pending.setdefault(timeout, []).append(job)
    n_pending = sum(len(v) for v in pending.values())
    log.info("code execution: %d runs cached or without code, %d to run", len(out), n_pending)
    if not n_pending:
        return out
    workers = settings.get("max_workers")
    with tqdm(total=n_pending, desc="code execution", unit="program", dynamic_ncols=True) as bar:
        for timeout, jobs in pending.items():
            sandbox = Sandbox(**{**settings["sandbox"], "timeout_s": timeout})
            not_ready = sandbox.check_ready()
            if not_ready:
                raise UserError(f"code benchmarks: {not_ready} (code.sandbox in conf/eval.yaml)")
            size = 64
            for start in range(0, len(jobs), size):
                chunk = jobs[start : start + size]
                for (key, _, _, prompt_hash), result in zip(chunk, sandbox.run_many([j[1:3] for j in chunk], workers)):
                    out[key] = {
                        "text_hash": text_hash(texts[key]),
                        "outcome": result.outcome,
                        "passed": result.passed,
                        "asserts": result.asserts,
                        "detail": result.detail[:300],
                    }
                    if result.outcome != "sandbox_error":  # the harness failed, not the program: retried next run
                        cache.put(key[0], key[1], prompt_hash, key[2], out[key])
                bar.update(len(chunk))
    return out


def code_sample(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """A sample's scored fields from its run record: correct when it passed; `answer` is the outcome (None
    without a code block, as a math sample without an answer)."""
    outcome = record["outcome"] if record is not None else "no_response"
    answer = None if outcome in ("no_code_block", "no_response") else outcome
    return {"answer": answer, "correct": outcome == "passed", "code_outcome": outcome}


def code_outcomes(problems: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Samples per outcome of one benchmark."""
    return dict(Counter(s["code_outcome"] for p in problems for s in p["samples"]))
