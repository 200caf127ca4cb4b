"""One synthesis run (`synthesize`): the recipe over the problems on a thread pool, resumed from the cache,
then the selection across problems and the outputs.

Writes, under `out_dir`: `train.parquet` (verl's multi-turn SFT layout: a `messages` column), `train.trl.jsonl`
(TRL's conversational prompt-completion rows: loss on the completion only), `manifest.json` (teacher, prompt
files and their SHA-256, counts per stage, rejection reasons) and `cache.jsonl` (one line per finished
problem, keyed by problem, prompts, recipe and teacher: a rerun asks the teacher nothing for those).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from sarl.checking.grading.grader import default_grader
from sarl.checking.openai_client import run_concurrently
from sarl.data.sources import sha256_file
from sarl.data.synthesize.config import PROMPT_ROLES, check_recipe
from sarl.data.synthesize.context import Context
from sarl.data.synthesize.grp import grp_examples, synthesize_grp
from sarl.data.synthesize.inputs import Prompt, SourceProblem, load_problems, load_prompt
from sarl.data.synthesize.structured import select_structured, synthesize_structured
from sarl.data.synthesize.teacher import Teacher, check_teacher, teacher_endpoint
from sarl.data.writers import write_json, write_jsonl, write_parquet
from sarl.runtime.errors import EXIT_INCOMPLETE, UserError, check_output_file, check_writable_dir

log = logging.getLogger("sarl.data.synthesize")


def cache_key(
    problem: SourceProblem, teacher_model: str, prompts: Mapping[str, Prompt], recipe: Mapping[str, Any], seed: int
) -> str:
    """What one problem's result depends on: the problem, the teacher, the prompt files and the recipe's
    per-problem settings (not the selection across problems)."""
    per_problem = {k: v for k, v in recipe.items() if k not in ("select", "cot_remainder", "source")}
    blob = json.dumps(
        {
            "id": problem.id,
            "question": problem.question,
            "golds": problem.golds,
            "trace": problem.trace,
            "teacher": teacher_model,
            "prompts": {k: p.sha256 for k, p in sorted(prompts.items())},
            "recipe": per_problem,
            "seed": seed,
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def read_cache(path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """key -> cached result (the last line per key wins), and the number of unreadable lines skipped (an
    interrupted write leaves at most one)."""
    out: dict[str, dict[str, Any]] = {}
    bad = 0
    if not path.is_file():
        return out, bad
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            out[obj["key"]] = obj["result"]
        except (ValueError, KeyError, TypeError):
            bad += 1
    return out, bad


def sft_records(examples: Sequence[dict[str, str]], recipe: str, data_source: str) -> tuple[list[dict], list[dict]]:
    """(verl parquet rows, TRL jsonl rows) of the examples.

    verl 0.9.1's SFT trainer (`verl.utils.dataset.multiturn_sft_dataset`) reads the `messages` column (loss on
    the assistant turns); TRL 1.16's `SFTTrainer` reads conversational prompt-completion rows, whose loss is
    on the completion only (`completion_only_loss` defaults to on for them)."""
    parquet, trl = [], []
    for ex in examples:
        user = {"role": "user", "content": ex["prompt"]}
        assistant = {"role": "assistant", "content": ex["completion"]}
        parquet.append(
            {
                "messages": [user, assistant],
                "extra_info": {"id": ex["id"], "kind": ex["kind"], "recipe": recipe, "data_source": data_source},
            }
        )
        trl.append({"prompt": [user], "completion": [assistant]})
    return parquet, trl


def synthesize(cfg: DictConfig) -> tuple[dict[str, Any], int]:
    """Runs the recipe; returns the manifest and the exit code (0, or EXIT_INCOMPLETE when some problems
    failed for good: a rerun resumes them)."""
    recipe = OmegaConf.to_container(cfg.recipe, resolve=True)
    check_recipe(recipe)
    t = cfg.teacher
    if not t.url:
        raise UserError(
            "teacher.url is not set: pass teacher.url=http://HOST:PORT/v1 (an OpenAI-compatible server) "
            "or teacher.url=auto"
        )
    if not t.model:
        raise UserError(
            "teacher.model is not set: pass teacher.model=NAME (the served model; "
            "for teacher.url=auto a local model path)"
        )
    out_dir = check_writable_dir(Path(str(cfg.out_dir)), "out_dir")
    for name in ("train.parquet", "train.trl.jsonl", "manifest.json", "cache.jsonl"):
        check_output_file(out_dir / name, "out_dir")  # each a regular file (or none yet), before any work
    prompts = {role: load_prompt(str(recipe["prompts"][role])) for role in PROMPT_ROLES[recipe["method"]]}
    problems, source_record, skipped = load_problems(cfg)
    cache_path = out_dir / "cache.jsonl"
    cached, bad_lines = read_cache(cache_path)
    tr = cfg.translator
    if recipe["method"] != "grp" or (tr.url is None and tr.model is None):
        tr_url = tr_model = None
    elif tr.url == "auto" or not tr.url or not tr.model:
        raise UserError(
            f"translator.url={tr.url} translator.model={tr.model}: give both, as a running server's URL and its "
            "model (only the teacher can be started with url=auto), or neither to translate with the teacher"
        )
    else:
        tr_url, tr_model = str(tr.url), str(tr.model)
    models = str(t.model) if tr_model is None else f"{t.model} | translator {tr_url} {tr_model}"
    keys = {p.id: cache_key(p, models, prompts, recipe, int(cfg.seed)) for p in problems}
    todo = [p for p in problems if keys[p.id] not in cached]
    results: dict[str, dict[str, Any]] = {p.id: cached[keys[p.id]] for p in problems if keys[p.id] in cached}
    failed: dict[str, str] = {}
    calls = 0
    started_server = False
    with teacher_endpoint(cfg, out_dir) as url:
        started_server = t.url == "auto"
        if todo:
            check_teacher(url, str(t.model))
            t_settings = OmegaConf.to_container(t, resolve=True)
            teacher = Teacher(url, str(t.model), t_settings)
            translator = None
            if tr_url is not None:
                check_teacher(tr_url, tr_model, key="translator")
                translator = Teacher(tr_url, tr_model, t_settings)
            ctx = Context(recipe, teacher, default_grader(), prompts, int(cfg.seed), translator)
            work: Callable[[SourceProblem, Context], dict[str, Any]] = (
                synthesize_grp if recipe["method"] == "grp" else synthesize_structured
            )
            lock = threading.Lock()
            with cache_path.open("a", encoding="utf-8") as cache:

                def on_result(p: SourceProblem, res: dict[str, Any] | None, err: str | None) -> None:
                    if err is not None:
                        failed[p.id] = err
                        return
                    results[p.id] = res
                    with lock:
                        cache.write(
                            json.dumps({"key": keys[p.id], "id": p.id, "result": res}, ensure_ascii=False) + "\n"
                        )
                        cache.flush()

                try:
                    run_concurrently(
                        todo, lambda p: work(p, ctx), on_result, int(cfg.concurrency), f"synthesize {recipe['name']}"
                    )
                finally:
                    calls = teacher.requests + (translator.requests if translator else 0)
                    teacher.close()
                    if translator:
                        translator.close()

    stages: Counter = Counter()
    rejections: Counter = Counter({f"input/{k}": v for k, v in skipped.items()})
    ordered = [results[p.id] for p in problems if p.id in results]
    for res in ordered:
        stages.update(res["stages"])
        rejections.update(res["rejections"])
    if recipe["method"] == "structured":
        questions = {p.id: p.question for p in problems}
        examples = select_structured(ordered, questions, int(recipe["select"]["keep"]), stages, rejections)
    else:
        examples = grp_examples(ordered, recipe["cot_remainder"], int(cfg.seed), stages)
    for ex in examples:
        stages[f"examples_{ex['kind']}"] += 1
    stages["examples"] = len(examples)
    parquet_rows, trl_rows = sft_records(examples, recipe["name"], str(source_record.get("source")))
    outputs: dict[str, Any] = {}
    parquet, trl = out_dir / "train.parquet", out_dir / "train.trl.jsonl"
    if not examples:  # no stale set from an earlier run beside a manifest that lists none
        for stale in (parquet, trl):
            stale.unlink(missing_ok=True)
    else:
        write_parquet(parquet_rows, parquet)
        write_jsonl(trl_rows, trl)
        outputs = {
            "rows": len(examples),
            "parquet": parquet.name,
            "trl": trl.name,
            "sha256": {"parquet": sha256_file(parquet), "trl": sha256_file(trl)},
        }
    complete = not failed
    manifest = {
        "recipe": recipe["name"],
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": complete,
        "teacher": {"url": str(t.url), "model": str(t.model), "started_vllm": started_server},
        "translator": {"url": tr_url, "model": tr_model} if tr_model else "the teacher",
        "prompts": {
            role: {"file": f"conf/synthesize/prompts/{p.name}", "sha256": p.sha256} for role, p in prompts.items()
        },
        "source": source_record,
        "problems": {
            "total": len(problems),
            "finished": len(ordered),
            "from_cache": len(problems) - len(todo),
            "failed": len(failed),
        },
        "teacher_requests_this_run": calls,
        "counts": dict(sorted(stages.items())),
        "rejections": dict(sorted(rejections.items())),
        "failed": [{"id": k, "error": v} for k, v in sorted(failed.items())],
        "cache": {"file": cache_path.name, "unreadable_lines": bad_lines},
        "outputs": outputs,
        "config": {"recipe": recipe, "seed": int(cfg.seed), "concurrency": int(cfg.concurrency)},
    }
    write_json(manifest, out_dir / "manifest.json")
    if failed:
        log.error(
            "%d problem(s) failed for good (listed in manifest.json); rerun the same command to retry them", len(failed)
        )
    if not examples:
        log.warning("no SFT example came out; see the rejections in %s", out_dir / "manifest.json")
    log.info("%s: %d examples in %s", recipe["name"], len(examples), out_dir)
    return manifest, 0 if complete else EXIT_INCOMPLETE
