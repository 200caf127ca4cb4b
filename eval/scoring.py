"""Scoring the responses of an evaluation: their structure statistics (SARL Fig. 2a), the WildBench judgements,
the per-benchmark summaries with one row per problem (math answers graded, code runs and judgements counted), and
the optional lm-eval tasks. Structure statistics and judgements are cached per sample.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from eval.cache import SampleCache, stable_hash, text_hash
from eval.code import code_outcomes, code_sample
from eval.config import build
from eval.generate import SamplingConfig
from eval.lm_eval_bridge import run_lm_eval
from eval.metrics import benchmark_metrics
from eval.prompts import answer_reader
from eval.protocol import Benchmark, Plan
from eval.results import problem_row, summarise_math, summarise_overall, summarise_wildbench
from eval.wildbench import EMPTY_RESPONSE_SCORE, judge_prompt, load_template
from sarl.checking.grading.extract import strip_thinking
from sarl.checking.grading.grader import Grader
from sarl.contract.reward import RolloutBatch, build_reward
from sarl.runtime.errors import UserError
from sarl.serving.auto import embedding_server_for
from sarl.structure.cluster import method_k_rule

log = logging.getLogger("eval.run")  # a part of `python -m eval.run`: its messages keep that name


def _fresh(cached: dict[int, dict], i: int, text: str) -> dict | None:
    """A cached structure or judgement record of sample `i` if it was made for this very text."""
    record = cached.get(i)
    return record if record is not None and record.get("text_hash") == text_hash(text) else None


# ---------------------------------------------------------------------------------------------------------
# Structure statistics (SARL Fig. 2a)
# ---------------------------------------------------------------------------------------------------------


def structure_all(
    cfg: DictConfig, benchmarks: list[Benchmark], texts: dict[tuple[str, str, int], str], root: Path
) -> dict[tuple[str, str, int], dict]:
    """The structure reward (SR, C, L, steps, nodes, edges, flags, failure) of every response, cached."""
    if not cfg.structure.enabled:
        return {}
    emb_cfg = OmegaConf.to_container(cfg.embedding, resolve=True)
    identity = {"embedding": emb_cfg, "structure": OmegaConf.to_container(cfg.structure), "seed": cfg.seed}
    cache = SampleCache(root / f"structure-{stable_hash(identity)}")
    out: dict[tuple[str, str, int], dict] = {}
    pending: dict[str, list[tuple[tuple[str, str, int], str]]] = {}
    for b in benchmarks:
        for p in b.problems:
            cached = cache.get(b.name, p.id, p.prompt_hash)
            for i in range(b.n_samples):
                key = (b.name, p.id, i)
                if key not in texts:
                    continue
                record = _fresh(cached, i, texts[key])
                if record is not None:
                    out[key] = record
                else:
                    pending.setdefault(b.kind, []).append((key, texts[key]))
    n_pending = sum(len(v) for v in pending.values())
    log.info("structure statistics: %d cached, %d to compute", len(out), n_pending)
    if not n_pending:
        return out
    hashes = {(b.name, p.id): p.prompt_hash for b in benchmarks for p in b.problems}
    from hydra.utils import instantiate
    from tqdm import tqdm

    with embedding_server_for(cfg, {"embedder": emb_cfg}):
        embedder = instantiate(emb_cfg)
        with tqdm(total=n_pending, desc="structure", unit="resp", dynamic_ncols=True) as bar:
            for kind, items in pending.items():
                # The reward's settings (conf/reward/sarl.yaml as structure.reward), the benchmark kind's clustering.
                clustering = cfg.structure.clustering[kind]
                reward = build_reward(
                    cfg.structure.reward,
                    embedder=embedder,
                    clustering=clustering,
                    k_rule=method_k_rule(clustering, cfg.structure.reward.k_rule),
                )
                size = int(cfg.structure.batch_size)
                for start in range(0, len(items), size):
                    chunk = items[start : start + size]
                    analyses = reward.analyze(RolloutBatch.from_responses([t for _, t in chunk]))
                    for (key, text), a in zip(chunk, analyses):
                        d = a.output.diagnostics
                        record = {
                            "text_hash": text_hash(text),
                            "sr": d.get("sr"),
                            "C": d.get("C"),
                            "L": d.get("L"),
                            "n_steps": int(d.get("n_steps", 0)),
                            "n_nodes": int(d.get("n_nodes", 0)),
                            "n_edges": int(d.get("n_edges", 0)),
                            "truncated": bool(d.get("truncated")),
                            "no_think": bool(d.get("no_think")),
                            "failed": a.output.failed,
                        }
                        out[key] = record
                        cache.put(key[0], key[1], hashes[key[:2]], key[2], record)
                    bar.update(len(chunk))
    return out


# ---------------------------------------------------------------------------------------------------------
# WildBench judging
# ---------------------------------------------------------------------------------------------------------


def check_judge(cfg: DictConfig, plan: Plan) -> None:
    """Where the plan judges (a wildbench benchmark), the judge `judge_all` builds, built now, before any model
    loads: its template read (a URL fetched once, then kept in `cache_dir`) and the judge made (the API key it
    needs). A problem is a UserError naming it, not a traceback after every response has been generated."""
    if not any(e.kind == "wildbench" for e in plan.entries):
        return
    j = cfg.judge
    try:
        build(j, load_template(str(j.template), cache_dir=Path(cfg.cache_dir))).close()
    except (RuntimeError, OSError, ValueError) as err:  # load_template's and the judge's own (a key it lacks)
        raise UserError(f"the WildBench judge: {err}") from err


def judge_all(
    cfg: DictConfig, benchmarks: list[Benchmark], texts: dict[tuple[str, str, int], str], root: Path, cache_dir: Path
) -> dict[tuple[str, str, int], dict]:
    """A judgement per WildBench response: cached; an empty final answer scores 1 without a judge call; a
    failed judgement is recorded with its reason (not cached: a rerun tries again)."""
    wb = [b for b in benchmarks if b.kind == "wildbench"]
    if not wb:
        return {}
    j = cfg.judge
    template = load_template(str(j.template), cache_dir=cache_dir)
    identity = {
        "model": j.model,
        "template": stable_hash(template),
        "temperature": j.temperature,
        "max_tokens": j.max_tokens,
        "json_mode": j.json_mode,
        "extra_body": OmegaConf.to_container(j.extra_body),
    }
    cache = SampleCache(root / f"judge-{stable_hash(identity)}")
    out: dict[tuple[str, str, int], dict] = {}
    pending: list[tuple[tuple[str, str, int], str]] = []
    hashes = {}
    for b in wb:
        for p in b.problems:
            hashes[(b.name, p.id)] = p.prompt_hash
            cached = cache.get(b.name, p.id, p.prompt_hash)
            for i in range(b.n_samples):
                key = (b.name, p.id, i)
                if key not in texts:
                    out[key] = {"score": None, "failed": "no response (generation failed)"}
                elif _fresh(cached, i, texts[key]) is not None:
                    out[key] = cached[i]
                else:
                    final = strip_thinking(texts[key])
                    if not final:
                        record = {
                            "text_hash": text_hash(texts[key]),
                            "score": EMPTY_RESPONSE_SCORE,
                            "failed": None,
                            "empty": True,
                            "judge_output": None,
                        }
                        out[key] = record
                        cache.put(b.name, p.id, p.prompt_hash, i, record)
                        continue
                    conversation = p.extra_info.get("conversation") or p.messages
                    checklist = list(p.extra_info.get("checklist") or [])
                    pending.append((key, judge_prompt(template, conversation, final, checklist)))
    log.info("judging: %d judgements cached or empty, %d to request from %s", len(out), len(pending), j.model)
    if not pending:
        return out
    judge = build(j, template)  # conf/eval/judge/<choice>.yaml with the template's text

    def on_result(key: tuple[str, str, int], record: dict[str, Any]) -> None:
        record = {"text_hash": text_hash(texts[key]), **record}
        out[key] = record
        if record["failed"]:
            log.warning("judgement failed for %s/%s sample %d: %s", *key, record["failed"])
        else:
            cache.put(key[0], key[1], hashes[key[:2]], key[2], record)

    try:
        judge.judge_many(pending, on_result)
    finally:
        judge.close()
    return out


# ---------------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------------


def score_benchmarks(
    cfg: DictConfig,
    benchmarks: list[Benchmark],
    records: dict[tuple[str, str], dict[int, dict]],
    failures: dict[tuple[str, str, int], str],
    structure: dict[tuple[str, str, int], dict],
    judgements: dict[tuple[str, str, int], dict],
    base: dict | None,
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Per-benchmark summaries (math and code; wildbench) and one row per problem (code runs in `judgements`)."""
    grader = Grader(timeout_s=float(cfg.grading.timeout_s))
    unclosed = bool(cfg.grading.answer_in_unclosed_think)  # the training rewards' switch of the same name
    math_out: dict[str, Any] = {}
    wb_out: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        for b in benchmarks:
            problem_summaries = []
            # the answer as the benchmark's prompt asks for it: the last \boxed{}, or "Answer: X" (eval.prompts)
            extract_answer = answer_reader(b.plan.prompt.answer if b.plan and b.plan.prompt else "boxed")
            for p in b.problems:
                samples = []
                for i in range(b.n_samples):
                    key = (b.name, p.id, i)
                    rec = records[(b.name, p.id)].get(i)
                    s: dict[str, Any] = {"sample": i}
                    if rec is None:
                        s.update(
                            text="", n_tokens=None, truncated=False, generation_failed=failures.get(key, "missing")
                        )
                    else:
                        s.update(
                            n_tokens=rec["n_tokens"], truncated=rec["truncated"], finish_reason=rec["finish_reason"]
                        )
                    text = "" if rec is None else rec["text"]
                    if b.kind == "math":
                        answer = extract_answer(text, answer_in_unclosed_think=unclosed)
                        s["answer"] = answer
                        verdict = grader.check_any(answer, p.gold) if answer is not None else None
                        s["correct"] = verdict is not None and verdict.ok
                        # a math-verify timeout counts as incorrect: marked here, counted per benchmark
                        s["grader_timeout"] = verdict is not None and verdict.timed_out
                    elif b.kind == "code":
                        s.update(code_sample(judgements.get(key)))
                    else:
                        j = judgements.get(key, {"score": None, "failed": "not judged"})
                        s.update(judge_score=j["score"], judge_failed=j["failed"], empty=bool(j.get("empty")))
                    s["structure"] = structure.get(key)
                    samples.append(s)
                problem_summaries.append({"id": p.id, "samples": samples, "problem": p})
                rows.append(problem_row(b, p, samples))
            if b.kind in ("math", "code"):  # code: the same shape, plus its outcome counts
                math_out[b.label] = summarise_math(b.label, problem_summaries, b.n_samples)
                math_out[b.label] |= {"code_outcomes": code_outcomes(problem_summaries)} if b.kind == "code" else {}
                correct = [[bool(s["correct"]) for s in p["samples"]] for p in problem_summaries]
                math_out[b.label]["metrics"] = benchmark_metrics(correct, b.plan.metrics if b.plan else ["avg@k"])
            else:
                wb_out[b.label] = summarise_wildbench(b, problem_summaries, base)
    finally:
        grader.close()
    base_math = (base or {}).get("math")
    math_part = {"benchmarks": math_out, "overall": summarise_overall(math_out, base_math)} if math_out else None
    return math_part, ({"benchmarks": wb_out} if wb_out else None), rows


def lm_eval_stage(cfg: DictConfig, sampling: SamplingConfig) -> dict[str, Any] | None:
    if not cfg.lm_eval.tasks:
        return None

    le = cfg.lm_eval
    model_args = OmegaConf.to_container(le.model_args, resolve=True) or {}
    if le.model in ("vllm", "hf"):
        model_args.setdefault("pretrained", str(cfg.ckpt))
    return run_lm_eval(
        list(le.tasks),
        int(le.k),
        sampling,
        str(le.model),
        model_args,
        include_path=le.include_path,
        include_defaults=bool(le.include_defaults),
        apply_chat_template=bool(le.apply_chat_template),
        limit=le.limit,
        batch_size=le.batch_size,
        seed=int(cfg.seed),
    )
