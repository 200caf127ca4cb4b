"""Evaluate a checkpoint by a paper's protocol (conf/eval/protocol/, `eval.protocol`): by default SARL's, avg@k on
the math benchmarks and the WildBench score (SARL Sec. 4.1, Tables 2-3, 8-9, Fig. 2a).

    python -m eval.run ckpt=/path/to/checkpoint        # vLLM; where it is not installed, Transformers (CPU)
    python -m eval.run ckpt=runs/<row>/<date>_<time>   # a training run: its final/ model (verl's shards merged)
    python -m eval.run ckpt=RUN_DIR select=paper       # every checkpoint on the held-out set, the paper's pick
    python -m eval.run ckpt=runs/smoke/<run> protocol=smoke   # the smoke run's held-out prompts, offline
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

The parts: `eval.config` composes the configuration and names the run, `eval.protocol` plans it, `eval.responses`
generates (or reads from the cache) every response, `eval.scoring` scores them and `eval.results` writes the report.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from eval.cache import SampleCache, atomic_write_text, stable_hash
from eval.code import run_code
from eval.config import (
    compose_eval_config,
    eval_run_dir,
    generator_chosen,
    generator_name,
    run_name,
    training_run,
    usable_generator,
)
from eval.protocol import (
    check_eval_config,
    check_runnable,
    format_plan,
    load_benchmarks,
    model_kind,
    resolve_plan,
    sampling_config,
)
from eval.responses import checkpoint_cache_root, generate_all, generators
from eval.results import (
    load_base,
    log_to_training_run,
    log_wandb,
    markdown_report,
    protocol_math_part,
    write_results,
)
from eval.scoring import check_judge, judge_all, lm_eval_stage, score_benchmarks, structure_all
from eval.select import select_and_evaluate
from sarl.runtime import torch_threads
from sarl.runtime.checkpoints import resolve_checkpoint
from sarl.runtime.errors import EXIT_INCOMPLETE, check_writable_dir, exit_code
from sarl.runtime.hub import offline_if_unreachable, offline_note
from sarl.runtime.runs import git_commit, versions
from sarl.runtime.usage import Usage, asks_for_help, usage
from slurm import launcher

log = logging.getLogger("eval.run")


def run(cfg: DictConfig, explicit_generator: bool = True, selection: dict | None = None) -> int:
    """The whole evaluation; returns the exit code (0 complete, 3 incomplete). `explicit_generator`: whether the
    command line chose the generator (if not, a vLLM that cannot be imported here gives way to Transformers);
    `selection`: how the checkpoint was picked (eval.select), kept in the results."""
    base = load_base(cfg.base_results)  # read before anything is made: a bad one leaves nothing behind
    check_eval_config(cfg)
    plan = resolve_plan(cfg)
    check_runnable(plan, cfg.paths.data_dir)
    check_judge(cfg, plan)
    if offline_note():  # said once the checks passed: a one-line error stays one line
        log.info("%s", offline_note())
    cfg = usable_generator(cfg, explicit_generator)  # after the checks: a mistake stays the one line said
    if str(cfg.generator.get("url", "auto")) == "auto":  # loaded here (not a server's name): a run directory, a verl
        model, how = resolve_checkpoint(str(cfg.ckpt))  # checkpoint or a folder without weights, said in one line
        if how:
            log.info("%s", how)
            cfg.ckpt = str(model)
    name = run_name(cfg)
    ckpt = str(cfg.ckpt)
    trained_by = training_run(ckpt)
    chosen = str(cfg.get("model_kind") or "auto") != "auto"
    kind = model_kind(cfg) if chosen else "trained" if trained_by else "base"
    plan = resolve_plan(cfg, kind)  # the prompts of this kind of model (a protocol may ask base models otherwise)
    if plan.by_kind:
        auto = "auto: a sarl.train run wrote it" if trained_by else "auto: no sarl.train run wrote it"
        why = "model_kind" if chosen else auto
        log.info("a %s model (%s): %s asked as the protocol asks %s models", kind, why, ", ".join(plan.by_kind), kind)
    if trained_by and not cfg.name:
        log.info("run name %s: the row of the training run %s (name=NAME for another)", name, trained_by["run_dir"])
    run_dir = check_writable_dir(eval_run_dir(cfg, name), "run_dir")
    handler = logging.FileHandler(run_dir / "eval.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    logging.getLogger().addHandler(handler)
    torch_threads.apply(cfg.get("torch_threads", "auto"), say=log.info)  # before a model loads (decisions §7.9)
    try:
        started = dt.datetime.now().isoformat(timespec="seconds")
        config = OmegaConf.to_container(cfg, resolve=True)
        atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        meta = {"git_commit": git_commit(), "versions": versions(), "command": sys.argv, "started": started}
        atomic_write_text(run_dir / "meta.json", json.dumps(meta, indent=2))
        log.info("evaluating %s by protocol %s -> %s", ckpt, plan.protocol, run_dir)
        benchmarks = load_benchmarks(cfg, plan.entries)
        root = checkpoint_cache_root(Path(cfg.cache_dir), ckpt)
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
                "trained_by": trained_by,  # the sarl.train run that wrote ckpt: row, run_dir, date (None: elsewhere)
                "model_kind": kind,  # trained | base: whose prompts asked it (protocol.model_kind)
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
            "selection": selection,
        }
        markdown = markdown_report(results, base)
        write_results(run_dir, results, rows, markdown)
        if "wandb" in cfg.logger.backends:
            log_wandb(OmegaConf.to_container(cfg.logger), results, rows, run_dir, config)
            if trained_by:  # the scores beside the training run's own curves (its W&B run, resumed)
                log_to_training_run(OmegaConf.to_container(cfg.logger), results, Path(trained_by["run_dir"]))
        sys.stdout.write(markdown)
        log.info("wrote %s, %s and %s", run_dir / "results.json", run_dir / "results.md", run_dir / "problems.jsonl")
        if reasons:
            log.warning("evaluation incomplete: %s; rerun the same command to retry them", "; ".join(reasons))
            return EXIT_INCOMPLETE
        return 0
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


USAGE = Usage(
    synopsis=(
        "python -m eval.run ckpt=CKPT [protocol=NAME] [select=RULE] [KEY=VALUE ...]",
        "python -m eval.run ckpt=runs/<row>/<date>_<time>            # a training run: its final/ model",
        "python -m eval.run ckpt=RUN_DIR protocol=structured select=paper  # the checkpoint the paper reports",
        "python -m eval.run protocol=NAME dry_run=true                # the protocol's plan; no checkpoint needed",
    ),
    about=(
        "Evaluate a checkpoint by a paper's protocol (default SARL's: avg@8 on AIME25, AMC23, MATH500, Minerva and the "
        "WildBench score): generate (vLLM, or Transformers where vLLM is not installed), grade, judge, then "
        "results.json, results.md and problems.jsonl under runs/eval/<row>/<date>_<time>/. Generations are cached: "
        "rerunning the same command resumes. Exit 0 complete, 2 a user error, 3 some generations or judgements failed."
    ),
    keys=(
        (
            "ckpt",
            "a Hugging Face directory or Hub id, a training run directory (its final/), a pipeline's run "
            "directory, or a verl checkpoint checkpoints/global_step_N (merged on first use)",
        ),
        ("select", "best | last | paper: every checkpoint of the run on the protocol's held-out set, then the pick"),
        ("name", "the results' name (default: the training row, which the table notebooks look for); name=base"),
        ("base_results", "the base model's results: the Δ% columns"),
        (
            "model_kind",
            "auto | trained | base: a protocol may ask the models a paper trained otherwise than the untrained ones "
            "(auto: trained when a sarl.train run wrote ckpt)",
        ),
        ("only", "a list of the protocol's benchmarks to run, e.g. only=[aime25]"),
        ("limit", "the first N problems of every benchmark (quick checks)"),
        ("dry_run", "true: print the resolved plan and exit"),
    ),
    groups=(
        ("protocol", "eval/protocol", "a paper's evaluation protocol"),
        ("generator", "eval/generator", "what samples the model"),
        ("judge", "eval/judge", "the WildBench judge"),
        ("prompt", "eval/prompt", "ask every math benchmark with one template (default: each as its protocol says)"),
        ("launcher", "launcher", "run here (local) or submit to SLURM"),
        ("logger", "logger", "W&B or none"),
    ),
    more="More: docs/commands.md#evaluation, docs/evaluation.md.",
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if asks_for_help(argv):
        sys.stdout.write(usage(USAGE))
        return 0
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s] %(message)s")
    logging.getLogger("eval").setLevel(logging.INFO)
    torch_threads.wait_policy_env()  # before torch loads OpenMP (sarl.runtime.torch_threads, decisions §7.9)
    offline_if_unreachable()  # before anything imports huggingface_hub: no Hub retries here or in the children
    return exit_code(
        lambda: _run_command(argv),
        on_error=lambda err: log.error("%s", err),
        on_interrupt=lambda: log.warning("interrupted; finished samples are cached: rerun the same command to resume"),
    )


def _run_command(argv: list[str]) -> int:
    cfg = compose_eval_config(argv)
    if cfg.dry_run:  # the resolved plan; no checkpoint needed
        sys.stdout.write(format_plan(resolve_plan(cfg), cfg.paths.data_dir))
        if cfg.launcher.name != "local":
            job_argv = [a for a in argv if not a.startswith("dry_run")]
            sys.stderr.write(launcher.submission_plan("eval.run", job_argv, cfg.launcher))
        return 0
    if cfg.launcher.name != "local":  # submit this same command to SLURM (with launcher=local inside the job)
        check_eval_config(cfg, here=False)  # no checkpoint or a bad value fails here, not in the queue

        return launcher.dispatch("eval.run", argv, cfg.launcher)
    explicit = generator_chosen(argv)
    if cfg.get("select"):  # every checkpoint of a run on the held-out set, then the one the rule picks
        check_judge(cfg, resolve_plan(cfg))  # the pick's evaluation judges: its judge checked before the first pass
        return select_and_evaluate(cfg, lambda c, selection: run(c, explicit, selection))
    return run(cfg, explicit)


if __name__ == "__main__":
    sys.exit(main())
