"""Evaluate a checkpoint by a paper's protocol (conf/eval/protocol/, `eval.protocol`): by default SARL's, avg@k on
the math benchmarks and the WildBench score (SARL Sec. 4.1, Tables 2-3, 8-9, Fig. 2a).

    python -m eval.run ckpt=/path/to/checkpoint
    python -m eval.run ckpt=DIR protocol=evol_rl        # or grp, structured, structured_temperature
    python -m eval.run protocol=structured dry_run=true  # the resolved plan; no checkpoint needed
    python -m eval.run ckpt=DIR base_results=runs/eval/Qwen3-4B/<date>_<time>      # the Δ% columns
    python -m eval.run ckpt=DIR generator=openai generator.url=http://HOST:8000/v1
    python -m eval.run ckpt=DIR judge.url=http://JUDGE:8000/v1 judge.model=Qwen/Qwen3-32B  # a local judge

Arguments are Hydra overrides of conf/eval.yaml. Per sampling setting of the plan: generate (cached per sample;
an interrupted run resumes), grade the math answers after the thinking part, structure statistics of every response
(cached), judge WildBench responses (cached), optional lm-eval tasks, then results.json, results.md and problems.jsonl
in the run directory and a W&B run. Exit code 0 when complete, 3 when some generation or judgement failed
(the results say which; rerunning the same command retries only those).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from eval.cache import SampleCache, atomic_write_text, checkpoint_fingerprint, safe_name, stable_hash, text_hash
from eval.code import code_outcomes, code_sample, run_code
from eval.generate import Generation, GenerationRequest, Generator, SamplingConfig, sample_seed
from eval.protocol import (
    Benchmark,
    check_eval_config,
    check_runnable,
    format_plan,
    load_benchmarks,
    resolve_plan,
    sampling_config,
)
from sarl.errors import UserError, check_writable_dir, composition_error_message, debug_requested

log = logging.getLogger("eval.run")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
BACKENDS = ("vllm", "openai", "transformers")  # conf/eval/generator/<name>.yaml
GENERATOR_GROUP, JUDGE_GROUP = "eval/generator@generator", "eval/judge@judge"  # the groups in conf/eval.yaml
PROTOCOL_GROUP = "eval/protocol@protocol"
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
    """The command line with the generator, judge and protocol choices as Hydra's group overrides: `generator=NAME`
    picks conf/eval/generator/NAME.yaml (its settings are then `generator.KEY`), `judge=NAME` conf/eval/judge/NAME.yaml,
    `protocol=NAME` conf/eval/protocol/NAME.yaml.
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
        elif eq and bare == "protocol":
            names = sorted(p.stem for p in (CONF_DIR / "eval" / "protocol").glob("*.yaml"))
            if value not in names:
                raise UserError(f"protocol={value!r}; choose one of: {', '.join(names)}")
            out.append(f"{PROTOCOL_GROUP}={value}")
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


def run_name(cfg: DictConfig) -> str:
    return str(cfg.name) if cfg.name else Path(str(cfg.ckpt).rstrip("/")).name


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
def generators(cfg: DictConfig, run_dir: Path) -> Iterator[Callable[[SamplingConfig], Generator]]:
    """`get(sampling)`: the configured generator (conf/eval/generator/<choice>.yaml, built by
    `hydra.utils.instantiate` when first needed, so a fully cached run loads no model) with those sampling
    settings; one generator serves every sampling setting of the plan. Closed after the run (an `openai`
    generator with url=auto stops the vLLM server it started)."""
    from eval.generate import RunInfo

    held: list[Generator] = []

    def get(sampling: SamplingConfig) -> Generator:
        if not held:
            info = RunInfo(name=run_name(cfg), run_dir=run_dir, seed=int(cfg.seed))
            held.append(build(cfg.generator, str(cfg.ckpt), sampling, info))
        held[0].sampling = sampling  # every back end samples with its `sampling` (eval/generate.py)
        return held[0]

    try:
        yield get
    finally:
        for gen in held:
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
    cfg: DictConfig, benchmarks: list[Benchmark], cache: SampleCache, generator: Callable[[], Generator]
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

    generator().generate(pending, on_result)
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
    """Per-benchmark summaries (math and code; wildbench) and one row per problem (code runs in `judgements`)."""
    from eval.grading import Grader, extract_answer
    from eval.metrics import benchmark_metrics
    from eval.results import problem_row, summarise_math, summarise_overall, summarise_wildbench

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
    from eval.results import load_base, log_wandb, markdown_report, protocol_math_part, write_results
    from sarl.runs import git_commit, versions

    check_eval_config(cfg)
    plan = resolve_plan(cfg)
    check_runnable(plan, cfg.paths.data_dir)
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
        log.info("evaluating %s by protocol %s -> %s", ckpt, plan.protocol, run_dir)
        base = load_base(cfg.base_results)
        benchmarks = load_benchmarks(cfg, plan.entries)
        root = checkpoint_cache_root(Path(cfg.cache_dir), name, ckpt)
        math_parts, wb_out, rows, caches, n_failures = [], {}, [], [], 0
        with generators(cfg, run_dir) as generator:
            for sampling, entries in plan.groups():  # one pass per sampling setting (SARL: one)
                group = [b for b in benchmarks if b.plan in entries]
                gen_identity = {**sampling.cache_identity(), "seed": int(cfg.seed)}
                gen_root = root / f"gen-{stable_hash(gen_identity)}"
                caches.append(str(gen_root))
                records, failures = generate_all(cfg, group, SampleCache(gen_root), lambda s=sampling: generator(s))
                texts = {(bn, pid, i): r["text"] for (bn, pid), recs in records.items() for i, r in recs.items()}
                structure = structure_all(cfg, group, texts, gen_root)
                judgements = judge_all(cfg, group, texts, gen_root, Path(cfg.cache_dir))
                judgements.update(run_code(cfg, group, texts, gen_root))  # code benchmarks: run their tests
                math_g, wb_g, rows_g = score_benchmarks(cfg, group, records, failures, structure, judgements, base)
                math_parts.append(math_g)
                wb_out.update((wb_g or {}).get("benchmarks", {}))
                rows += rows_g
                n_failures += len(failures)
        lm = lm_eval_stage(cfg, sampling_config(cfg))
        n_judge_failed = sum(s["n_failed"] for s in wb_out.values())
        reasons = []
        if n_failures:
            reasons.append(f"{n_failures} responses could not be generated")
        if n_judge_failed:
            reasons.append(f"{n_judge_failed} WildBench judgements failed")
        if plan.protocol == "sarl":  # the sampling of SARL's one setting, as its results have always said
            run_sampling = {**gen_identity, "n": int(cfg.sampling.n), "n_wildbench": int(cfg.sampling.n_wildbench)}
        else:  # each benchmark's sampling is in results["protocol"]
            run_sampling = {"seed": int(cfg.seed)}
        results = {
            "run": {
                "name": name,
                "ckpt": ckpt,
                "run_dir": str(run_dir),
                "cache": caches[0] if len(caches) == 1 else caches,
                "started": started,
                "finished": dt.datetime.now().isoformat(timespec="seconds"),
                "sampling": run_sampling,
                "backend": generator_name(cfg),
                "limit": cfg.limit,
                "base_results": str(cfg.base_results) if cfg.base_results else None,
                **meta,
            },
            "complete": not reasons,
            "incomplete_reason": "; ".join(reasons) or None,
            "math": protocol_math_part(math_parts, plan.to_dict(), base),
            "wildbench": {"benchmarks": wb_out} if wb_out else None,
            "lm_eval": lm,
            "protocol": plan.to_dict(),
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
        if cfg.dry_run:  # the resolved plan; no checkpoint needed
            sys.stdout.write(format_plan(resolve_plan(cfg), cfg.paths.data_dir))
            return 0
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
