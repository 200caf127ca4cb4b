"""Evaluate a checkpoint: avg@k on the math benchmarks and the WildBench score (SARL Sec. 4.1, Tables 2-3, 8-9,
Fig. 2a).

    python -m eval.run ckpt=/path/to/checkpoint
    python -m eval.run ckpt=DIR base_results=runs/eval/Qwen3-4B/<date>_<time>      # the Δ% columns
    python -m eval.run ckpt=DIR generator=openai generator.url=http://HOST:8000/v1
    python -m eval.run ckpt=DIR judge.url=http://JUDGE:8000/v1 judge.model=Qwen/Qwen3-32B  # a local judge

Arguments are Hydra overrides of conf/eval.yaml. Stages: generate (cached per sample; an interrupted run
resumes), grade the math answers after the thinking part, structure statistics of every response (cached),
judge WildBench responses (cached), optional lm-eval tasks, then results.json, results.md and problems.jsonl
in the run directory and a W&B run. Exit code 0 when complete, 3 when some generation or judgement failed
(the results say which; rerunning the same command retries only those).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

from eval.cache import SampleCache, atomic_write_text, checkpoint_fingerprint, safe_name, stable_hash, text_hash
from eval.data import Problem, benchmark_path, load_benchmark
from eval.generate import Generation, GenerationRequest, Generator, SamplingConfig, sample_seed
from sarl.errors import UserError, check_writable_dir, composition_error_message, debug_requested

log = logging.getLogger("eval.run")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
BACKENDS = ("vllm", "openai", "transformers")  # conf/eval/generator/<name>.yaml
GENERATOR_GROUP, JUDGE_GROUP = "eval/generator@generator", "eval/judge@judge"  # the groups in conf/eval.yaml
EXIT_INCOMPLETE = 3
EXIT_INTERRUPTED = 130


def compose_eval_config(overrides: list[str]) -> DictConfig:
    """conf/eval.yaml with Hydra overrides; paths made absolute. A misspelt key or an unknown option is a
    UserError naming it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = group_overrides(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_eval"):
            cfg = compose(config_name="eval", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(composition_error_message(err)) from err
    cfg.paths.root = str(Path(cfg.paths.root).resolve())
    return cfg


def group_overrides(overrides: list[str]) -> list[str]:
    """The command line with the generator and judge choices as Hydra's group overrides: `generator=NAME` picks
    conf/eval/generator/NAME.yaml (its settings are then `generator.KEY`), `judge=NAME` conf/eval/judge/NAME.yaml.
    The former keys still work: `generator.backend=NAME` is `generator=NAME`, and `generator.NAME.KEY=V` is
    `generator.KEY=V` when NAME is the chosen back end and is ignored otherwise (it had no effect)."""
    backend = "vllm"
    for override in overrides:
        key, eq, value = override.partition("=")
        if eq and key in ("generator", "generator.backend"):
            if value not in BACKENDS:
                raise UserError(f"{key}={value!r}; choose one of: {', '.join(BACKENDS)}")
            backend = value
    out = []
    for override in overrides:
        key, eq, value = override.partition("=")
        bare = key.lstrip("+~")
        prefix = key[: len(key) - len(bare)]
        parts = bare.split(".")
        if eq and bare in ("generator", "generator.backend"):
            out.append(f"{GENERATOR_GROUP}={value}")
        elif eq and bare == "judge":
            out.append(f"{JUDGE_GROUP}={value}")
        elif len(parts) > 2 and parts[0] == "generator" and parts[1] in BACKENDS:
            if parts[1] == backend:
                out.append(f"{prefix}generator.{'.'.join(parts[2:])}{eq}{value}")
            else:
                log.info("%s has no effect with generator=%s: ignored", override, backend)
        else:
            out.append(override)
    return out


def generator_name(cfg: DictConfig) -> str:
    """The chosen generator back end, from its builder (`eval.generate.<name>_generator`)."""
    return str(cfg.generator._target_).rpartition(".")[2].removesuffix("_generator")


def _looks_like_path(name: str) -> bool:
    """A local path rather than a Hub id (`org/name`) or a served model's name."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or Path(name).exists()


def check_eval_config(cfg: DictConfig) -> None:
    """Everything that can be checked before any model is loaded or any work done; a UserError names the
    first key that cannot work."""
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise UserError("no checkpoint: python -m eval.run ckpt=/path/to/checkpoint")
    ckpt = str(cfg.ckpt)
    remote = str(cfg.generator.get("url", "auto")) != "auto"  # an OpenAI-compatible server that has the model
    if _looks_like_path(ckpt) and not remote:
        path = Path(ckpt).expanduser()
        if not path.is_dir():
            raise UserError(
                f"ckpt={ckpt} is not a directory; give a checkpoint directory (config.json, weights, tokenizer)"
            )
        if not (path / "config.json").is_file():
            raise UserError(f"ckpt={ckpt} has no config.json: not a Hugging Face checkpoint directory")
    s = cfg.sampling
    for key, value, ok, what in (
        ("sampling.n", s.n, lambda v: v >= 1, "an integer >= 1"),
        ("sampling.n_wildbench", s.n_wildbench, lambda v: v >= 1, "an integer >= 1"),
        ("sampling.max_tokens", s.max_tokens, lambda v: v >= 1, "an integer >= 1"),
        ("sampling.temperature", s.temperature, lambda v: v >= 0, "a number >= 0"),
        ("sampling.top_p", s.top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
        ("limit", cfg.limit, lambda v: v is None or v >= 1, "null or an integer >= 1"),
        ("structure.batch_size", cfg.structure.batch_size, lambda v: v >= 1, "an integer >= 1"),
    ):
        if isinstance(value, bool) or not (value is None or isinstance(value, (int, float))) or not ok(value):
            raise UserError(f"{key}={value!r}: must be {what}")
    check_writable_dir(cfg.cache_dir, "cache_dir")


@dataclass
class Benchmark:
    name: str
    kind: str  # "math" | "wildbench"
    problems: list[Problem]
    n_samples: int


def run_name(cfg: DictConfig) -> str:
    return str(cfg.name) if cfg.name else Path(str(cfg.ckpt).rstrip("/")).name


def sampling_config(cfg: DictConfig) -> SamplingConfig:
    s = cfg.sampling
    return SamplingConfig(
        temperature=float(s.temperature),
        top_p=float(s.top_p),
        top_k=int(s.top_k) if s.top_k else None,
        max_tokens=int(s.max_tokens),
        chat_template_kwargs=OmegaConf.to_container(s.chat_template_kwargs) or {},
    )


def load_benchmarks(cfg: DictConfig) -> list[Benchmark]:
    out = []
    for kind, n in (("math", cfg.sampling.n), ("wildbench", cfg.sampling.n_wildbench)):
        for name in cfg.benchmarks[kind] or []:
            problems = load_benchmark(benchmark_path(cfg.paths.data_dir, name), name, kind, cfg.limit)
            out.append(Benchmark(str(name), kind, problems, int(n)))
            log.info("%s (%s): %d problems x %d samples", name, kind, len(problems), int(n))
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise ValueError(f"a benchmark is listed twice: {names}")
    if not out:
        raise ValueError("no benchmarks: set benchmarks.math and/or benchmarks.wildbench")
    return out


# ---------------------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------------------


def build(node: DictConfig, *args: Any) -> Any:
    """`hydra.utils.instantiate(node, *args)` (plain containers for the settings); an error of the builder is
    raised as itself, not wrapped in Hydra's InstantiationException."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, *args, _convert_="all")
    except InstantiationException as err:
        if err.__cause__ is not None:
            raise err.__cause__ from None
        raise


@contextlib.contextmanager
def generator_for(cfg: DictConfig, sampling: SamplingConfig, run_dir: Path) -> Iterator[Generator]:
    """The configured generator (conf/eval/generator/<choice>.yaml, built by `hydra.utils.instantiate`), closed
    after the run (an `openai` generator with url=auto stops the vLLM server it started)."""
    from eval.generate import RunInfo

    gen = build(
        cfg.generator, str(cfg.ckpt), sampling, RunInfo(name=run_name(cfg), run_dir=run_dir, seed=int(cfg.seed))
    )
    try:
        yield gen
    finally:
        gen.close()


def checkpoint_cache_root(cache_dir: Path, name: str, ckpt: str) -> Path:
    """The cache directory of this checkpoint's current contents: `<name>-<path key>/fp-<fingerprint>`. A
    checkpoint re-saved at the same path gets a new directory (its old generations are never reused), and
    the change is said in one line."""
    ckpt_id = str(Path(ckpt).resolve()) if Path(ckpt).exists() else ckpt
    by_path = cache_dir / f"{safe_name(name)}-{stable_hash(ckpt_id)}"
    fingerprint = checkpoint_fingerprint(ckpt) or "name"
    root = by_path / f"fp-{fingerprint}"
    if not root.exists() and by_path.is_dir():
        older = [d.name[3:] for d in by_path.glob("fp-*") if d.is_dir()]
        if older:
            log.warning(
                "checkpoint %s changed since it was last evaluated (fingerprint %s, was %s): generating anew, "
                "its earlier cached samples are not used",
                ckpt,
                fingerprint,
                ", ".join(sorted(older)),
            )
    return root


def _is_generation(record: dict[str, Any]) -> bool:
    return isinstance(record.get("text"), str) and isinstance(record.get("truncated"), bool)


def _fresh(cached: dict[int, dict], i: int, text: str) -> dict | None:
    """A cached structure or judgement record of sample `i` if it was made for this very text."""
    record = cached.get(i)
    return record if record is not None and record.get("text_hash") == text_hash(text) else None


def generate_all(
    cfg: DictConfig, benchmarks: list[Benchmark], cache: SampleCache, sampling: SamplingConfig, run_dir: Path
) -> tuple[dict[tuple[str, str], dict[int, dict]], dict[tuple[str, str, int], str]]:
    """Every (benchmark, problem, sample) response: from the cache, else generated (and cached at once).
    Returns the records per problem and the failures by key."""
    records: dict[tuple[str, str], dict[int, dict]] = {}
    prompt_hash: dict[tuple[str, str], str] = {}
    pending: list[GenerationRequest] = []
    for b in benchmarks:
        for p in b.problems:
            key = (b.name, p.id)
            prompt_hash[key] = p.prompt_hash
            records[key] = cache.get(b.name, p.id, p.prompt_hash, valid=_is_generation)
            for i in range(b.n_samples):
                if i not in records[key]:
                    pending.append(
                        GenerationRequest((b.name, p.id, i), p.messages, sample_seed(cfg.seed, b.name, p.id, i))
                    )
    total = sum(len(b.problems) * b.n_samples for b in benchmarks)
    log.info("generation: %d of %d responses cached, %d to generate", total - len(pending), total, len(pending))
    failures: dict[tuple[str, str, int], str] = {}
    if not pending:
        return records, failures

    def on_result(request: GenerationRequest, generation: Generation | None, error: str | None) -> None:
        bench, pid, i = request.key
        if generation is None:
            failures[request.key] = error or "unknown error"
            log.warning("generation failed for %s/%s sample %d: %s", bench, pid, i, error)
            return
        record = generation.to_record()
        records[(bench, pid)][i] = record
        cache.put(bench, pid, prompt_hash[(bench, pid)], i, record)

    with generator_for(cfg, sampling, run_dir) as generator:
        generator.generate(pending, on_result)
    return records, failures


# ---------------------------------------------------------------------------------------------------------
# Structure statistics (SARL Fig. 2a)
# ---------------------------------------------------------------------------------------------------------


def structure_all(
    cfg: DictConfig, benchmarks: list[Benchmark], texts: dict[tuple[str, str, int], str], root: Path
) -> dict[tuple[str, str, int], dict]:
    """The structure reward (SR, C, L, steps, nodes, edges, flags, failure) of every response, cached."""
    if not cfg.structure.enabled:
        return {}
    from sarl.cluster import DEFAULT_K_RULE
    from sarl.interface import RolloutBatch
    from sarl.reward import StructureReward

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

    from sarl.embed.auto import embedding_server_for

    with embedding_server_for(cfg, {"embedder": emb_cfg}):
        embedder = instantiate(emb_cfg)
        with tqdm(total=n_pending, desc="structure", unit="resp", dynamic_ncols=True) as bar:
            for kind, items in pending.items():
                clustering = cfg.structure.clustering[kind]
                reward = StructureReward(
                    embedder,
                    variant=cfg.structure.variant,
                    clustering=clustering,
                    seed=cfg.seed,
                    k_rule=cfg.structure.k_rule if clustering == "kmeans" else DEFAULT_K_RULE,
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


def judge_all(
    cfg: DictConfig, benchmarks: list[Benchmark], texts: dict[tuple[str, str, int], str], root: Path, cache_dir: Path
) -> dict[tuple[str, str, int], dict]:
    """A judgement per WildBench response: cached; an empty final answer scores 1 without a judge call; a
    failed judgement is recorded with its reason (not cached: a rerun tries again)."""
    from eval.grading import strip_thinking
    from eval.wildbench import EMPTY_RESPONSE_SCORE, judge_prompt, load_template

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
# Scoring and the report
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
    """Per-benchmark summaries (math, wildbench) and one row per problem."""
    from eval.grading import Grader, extract_answer
    from eval.results import summarise_math, summarise_overall

    grader = Grader(timeout_s=float(cfg.grading.timeout_s))
    unclosed = bool(cfg.grading.answer_in_unclosed_think)  # the training rewards' switch of the same name
    math_out: dict[str, Any] = {}
    wb_out: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        for b in benchmarks:
            problem_summaries = []
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
                    else:
                        j = judgements.get(key, {"score": None, "failed": "not judged"})
                        s.update(judge_score=j["score"], judge_failed=j["failed"], empty=bool(j.get("empty")))
                    s["structure"] = structure.get(key)
                    samples.append(s)
                problem_summaries.append({"id": p.id, "samples": samples, "problem": p})
                rows.append(problem_row(b, p, samples))
            if b.kind == "math":
                math_out[b.name] = summarise_math(b.name, problem_summaries, b.n_samples)
            else:
                wb_out[b.name] = summarise_wildbench(b, problem_summaries, base)
    finally:
        grader.close()
    base_math = (base or {}).get("math")
    math_part = {"benchmarks": math_out, "overall": summarise_overall(math_out, base_math)} if math_out else None
    return math_part, ({"benchmarks": wb_out} if wb_out else None), rows


def problem_row(b: Benchmark, p: Problem, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """One line of problems.jsonl / the W&B table: the problem's samples without their texts."""
    from eval.results import mean

    tokens = [s["n_tokens"] for s in samples if s.get("n_tokens") is not None]
    srs = [s["structure"]["sr"] for s in samples if s.get("structure") and s["structure"].get("sr") is not None]
    row: dict[str, Any] = {
        "benchmark": b.name,
        "problem_id": p.id,
        "n_samples": len(samples),
        "n_correct": None,
        "avg": None,
        "judge_score": None,
        "n_judge_failed": None,
        "mean_tokens": mean(tokens),
        "n_truncated": sum(bool(s["truncated"]) for s in samples),
        "mean_sr": mean(srs),
        "answers": [s.get("answer") for s in samples] if b.kind == "math" else [],
        "samples": [{k: v for k, v in s.items() if k != "text"} for s in samples],
    }
    if b.kind == "math":
        row["n_correct"] = sum(bool(s["correct"]) for s in samples)
        row["avg"] = 100.0 * row["n_correct"] / len(samples)
    else:
        scores = [s["judge_score"] for s in samples if s["judge_score"] is not None]
        row["judge_score"] = mean(scores)
        row["n_judge_failed"] = sum(1 for s in samples if s["judge_failed"])
    return row


def summarise_wildbench(b: Benchmark, problems: list[dict[str, Any]], base: dict | None) -> dict[str, Any]:
    """Per-task score (mean of its judged responses), category scores, WB Score and its Δ% to the base."""
    from eval.results import mean, structure_summary, table_delta_pct
    from eval.wildbench import category_scores, task_categories, wb_score_macro

    task_scores: dict[str, float] = {}
    categories: dict[str, list[str]] = {}
    samples = [s for p in problems for s in p["samples"]]
    for p in problems:
        info = p["problem"].extra_info
        categories[p["id"]] = task_categories(info["primary_tag"], info.get("secondary_tags") or [])
        scores = [s["judge_score"] for s in p["samples"] if s["judge_score"] is not None]
        if scores:
            task_scores[p["id"]] = sum(scores) / len(scores)
    cats = category_scores(task_scores, categories)
    out: dict[str, Any] = {
        "benchmark": b.name,
        "n_tasks": len(problems),
        "n_samples": len(samples),
        "n_judged": sum(1 for s in samples if s["judge_score"] is not None and not s["empty"]),
        "n_empty": sum(1 for s in samples if s["empty"]),
        "n_failed": sum(1 for s in samples if s["judge_failed"]),
        "n_tasks_scored": len(task_scores),
        "mean_score": mean(list(task_scores.values())),
        "categories": cats,
        "wb_score": None,
        "wb_score_missing": None,
        "delta_pct": None,
        "mean_tokens": mean([s["n_tokens"] for s in samples if s.get("n_tokens") is not None]),
        "truncation_rate": 100.0 * sum(bool(s["truncated"]) for s in samples) / len(samples),
        "no_answer_rate": 100.0 * sum(bool(s["empty"]) for s in samples) / len(samples),
        "generation_failures": sum(bool(s.get("generation_failed")) for s in samples),
        "structure": structure_summary([s["structure"] for s in samples if s.get("structure") is not None]),
    }
    try:
        out["wb_score"] = wb_score_macro(cats)
    except ValueError as err:
        out["wb_score_missing"] = str(err)
    base_wb = ((base or {}).get("wildbench") or {}).get("benchmarks", {}).get(b.name, {}).get("wb_score")
    if out["wb_score"] is not None and base_wb and round(base_wb, 2):
        out["delta_pct"] = table_delta_pct(out["wb_score"], base_wb)
    return out


def lm_eval_stage(cfg: DictConfig, sampling: SamplingConfig) -> dict[str, Any] | None:
    if not cfg.lm_eval.tasks:
        return None
    from eval.lm_eval_bridge import run_lm_eval

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


def resolve_run_dir(cfg: DictConfig, name: str) -> Path:
    from sarl.runs import resolve_run_dir as train_run_dir

    return train_run_dir(cfg, f"eval/{safe_name(name)}")


def run(cfg: DictConfig) -> int:
    """The whole evaluation; returns the exit code (0 complete, 3 incomplete)."""
    from eval.results import load_base, log_wandb, markdown_report, write_results
    from sarl.runs import git_commit, versions

    check_eval_config(cfg)
    name = run_name(cfg)
    ckpt = str(cfg.ckpt)
    run_dir = check_writable_dir(resolve_run_dir(cfg, name), "run_dir")
    handler = logging.FileHandler(run_dir / "eval.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        started = dt.datetime.now().isoformat(timespec="seconds")
        config = OmegaConf.to_container(cfg, resolve=True)
        atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        meta = {"git_commit": git_commit(), "versions": versions(), "command": sys.argv, "started": started}
        atomic_write_text(run_dir / "meta.json", json.dumps(meta, indent=2))
        log.info("evaluating %s -> %s", ckpt, run_dir)
        base = load_base(cfg.base_results)
        sampling = sampling_config(cfg)
        benchmarks = load_benchmarks(cfg)
        root = checkpoint_cache_root(Path(cfg.cache_dir), name, ckpt)
        gen_identity = {**sampling.cache_identity(), "seed": int(cfg.seed)}
        gen_root = root / f"gen-{stable_hash(gen_identity)}"
        records, failures = generate_all(cfg, benchmarks, SampleCache(gen_root), sampling, run_dir)
        texts = {(bn, pid, i): r["text"] for (bn, pid), recs in records.items() for i, r in recs.items()}
        structure = structure_all(cfg, benchmarks, texts, gen_root)
        judgements = judge_all(cfg, benchmarks, texts, gen_root, Path(cfg.cache_dir))
        math_part, wb_part, rows = score_benchmarks(cfg, benchmarks, records, failures, structure, judgements, base)
        lm = lm_eval_stage(cfg, sampling)
        n_judge_failed = sum(s["n_failed"] for s in (wb_part or {}).get("benchmarks", {}).values())
        reasons = []
        if failures:
            reasons.append(f"{len(failures)} responses could not be generated")
        if n_judge_failed:
            reasons.append(f"{n_judge_failed} WildBench judgements failed")
        results = {
            "run": {
                "name": name,
                "ckpt": ckpt,
                "run_dir": str(run_dir),
                "cache": str(gen_root),
                "started": started,
                "finished": dt.datetime.now().isoformat(timespec="seconds"),
                "sampling": {**gen_identity, "n": int(cfg.sampling.n), "n_wildbench": int(cfg.sampling.n_wildbench)},
                "backend": generator_name(cfg),
                "limit": cfg.limit,
                "base_results": str(cfg.base_results) if cfg.base_results else None,
                **meta,
            },
            "complete": not reasons,
            "incomplete_reason": "; ".join(reasons) or None,
            "math": math_part,
            "wildbench": wb_part,
            "lm_eval": lm,
        }
        markdown = markdown_report(results, base)
        write_results(run_dir, results, rows, markdown)
        if "wandb" in cfg.logger.backends:
            log_wandb(OmegaConf.to_container(cfg.logger), results, rows, run_dir, config)
        sys.stdout.write(markdown)
        log.info("wrote %s, %s and %s", run_dir / "results.json", run_dir / "results.md", run_dir / "problems.jsonl")
        if reasons:
            log.warning("evaluation incomplete: %s; rerun the same command to retry them", "; ".join(reasons))
            return EXIT_INCOMPLETE
        return 0
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s] %(message)s")
    logging.getLogger("eval").setLevel(logging.INFO)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = compose_eval_config(argv)
        if cfg.launcher.name != "local":  # submit this same command to SLURM (with launcher=local inside the job)
            from slurm.launcher import dispatch

            return dispatch("eval.run", argv, cfg.launcher)
        return run(cfg)
    except UserError as err:
        if debug_requested():
            raise
        log.error("%s", err)
        return 2
    except KeyboardInterrupt:
        log.warning("interrupted; finished samples are cached: rerun the same command to resume")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
