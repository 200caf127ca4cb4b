"""avg@k on lm-evaluation-harness tasks (GPQA, MMLU-Pro as in EVOL-RL) through
`lm_eval.simple_evaluate`, with sampling that really samples and every repeat scored.

lm-eval's defaults defeat avg@k in three ways (see shared notes "evaluation.md"): `repeats: k` with the
default filter scores only the first sample (`take_first`); temperature is forced to 0 unless `do_sample` is
set; and a fixed seed makes every repeat identical (the API models send `seed: 1234` with every request).
The bridge therefore derives, for every leaf task, an inline task config from the task's own config:

- `repeats: k`, and each filter pipeline ends in `take_first_k k` instead of `take_first`;
- `process_results` = `RepeatScorer`: the task's OWN scoring (`base_task.process_results(doc, [response])`)
  on each of the k filtered responses, averaged per metric, so the task's `mean` aggregation gives avg@k;
- generation kwargs: `do_sample: true`, the configured temperature/top_p/top_k/max tokens, the task's own
  stop sequences, and for API models `seed: null` so that the server draws a fresh seed per request.

lm-eval is an optional dependency (extra `eval-extra`); everything here but `run_lm_eval` works without it.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

from eval.generate import SamplingConfig

log = logging.getLogger(__name__)

API_MODELS = frozenset({"local-completions", "local-chat-completions", "openai-completions", "openai-chat-completions"})
REDUCING_FILTERS = frozenset({"take_first", "take_first_k", "majority_vote"})


def sampling_gen_kwargs(sampling: SamplingConfig, model_type: str, task_gen_kwargs: Mapping[str, Any] | None) -> dict:
    """lm-eval generation kwargs that sample: the task's stop sequences (`until`) and other settings, with
    sampling switched on and the configured parameters; no fixed seed."""
    out = {k: v for k, v in dict(task_gen_kwargs or {}).items() if k not in ("do_sample", "temperature", "seed")}
    out.update(do_sample=True, temperature=float(sampling.temperature), top_p=float(sampling.top_p))
    out["max_gen_toks"] = int(sampling.max_tokens)
    out.pop("max_tokens", None)
    if sampling.top_k:
        out["top_k"] = int(sampling.top_k)
    if model_type in API_MODELS:
        out["seed"] = None  # overrides lm-eval's fixed per-request seed (1234): repeats must differ
    if sampling.temperature <= 0:
        raise ValueError("avg@k needs sampling: temperature must be > 0")
    return out


def avg_at_k_filters(filter_list: Sequence[Mapping[str, Any]] | None, k: int) -> list[dict[str, Any]]:
    """The task's filter pipelines with the final `take_first` replaced by `take_first_k k` (keep all k)."""
    if not filter_list:
        return [{"name": "none", "filter": [{"function": "take_first_k", "k": k}]}]
    out = []
    for pipeline in filter_list:
        steps = [dict(step) for step in pipeline.get("filter", [])]
        reducing = [s["function"] for s in steps if s.get("function") in REDUCING_FILTERS - {"take_first"}]
        if reducing:
            raise ValueError(
                f"filter {pipeline.get('name')!r} already reduces the repeats ({', '.join(reducing)}): "
                "it is not a single-answer task that avg@k can score"
            )
        steps = [s for s in steps if s.get("function") != "take_first"]
        steps.append({"function": "take_first_k", "k": k})
        out.append({"name": pipeline.get("name", "none"), "filter": steps})
    return out


class RepeatScorer:
    """`process_results(doc, results)` of a derived task: the base task's scoring of each of the k responses
    on its own, averaged per metric (avg@k per document)."""

    def __init__(self, base_task: Any, k: int) -> None:
        self.base_task = base_task
        self.k = int(k)

    def __call__(self, doc: dict, results: Sequence[Any]) -> dict[str, float]:
        responses = results[0] if len(results) == 1 and isinstance(results[0], (list, tuple)) else results
        if len(responses) != self.k:
            raise ValueError(f"expected {self.k} filtered responses per document, got {len(responses)}")
        per_metric: dict[str, list[float]] = {}
        for response in responses:
            for metric, value in self.base_task.process_results(doc, [response]).items():
                if isinstance(value, bool) or isinstance(value, (int, float)):
                    per_metric.setdefault(metric, []).append(float(value))
                else:
                    raise TypeError(
                        f"metric {metric!r} of task {self.base_task.config.task!r} gives {type(value).__name__} "
                        "per document, not a number: avg@k cannot average it"
                    )
        return {metric: sum(v) / len(v) for metric, v in per_metric.items()}

    def __deepcopy__(self, memo: dict) -> RepeatScorer:  # lm-eval deep-copies configs; the task is shared
        return self


def avg_at_k_task_config(base_task: Any, k: int, gen_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """An inline lm-eval task config `<task>_avg<k>` that samples k responses per document and scores all."""
    cfg = base_task.config.to_dict(keep_callable=True)
    if cfg.get("output_type") != "generate_until":
        raise ValueError(
            f"task {cfg.get('task')!r} is {cfg.get('output_type')!r}; avg@k needs a generative task "
            "(e.g. gpqa_diamond_cot_zeroshot, mmlu_pro)"
        )
    if not cfg.get("metric_list"):
        raise ValueError(f"task {cfg.get('task')!r} has no metric_list to aggregate")
    for key in ("tag", "group", "task_alias"):
        cfg.pop(key, None)
    cfg.update(
        task=f"{cfg['task']}_avg{k}",
        repeats=int(k),
        filter_list=avg_at_k_filters(base_task.config.filter_list, k),
        process_results=RepeatScorer(base_task, k),
        generation_kwargs=dict(gen_kwargs),
    )
    return cfg


def summarise(results: Mapping[str, Any], derived: Mapping[str, str], k: int) -> dict[str, Any]:
    """Per task: each metric's avg@k in percent (over documents, from lm-eval's `mean` aggregation), the
    number of documents, repeats seen per document and how many documents got k identical responses."""
    out: dict[str, Any] = {}
    for task, name in derived.items():
        raw = results["results"].get(name, {})
        metrics = {
            key: 100.0 * float(value)
            for key, value in raw.items()
            if "_stderr" not in key
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and not math.isnan(float(value))
        }
        samples = (results.get("samples") or {}).get(name, [])
        repeats, identical = [], 0
        for sample in samples:
            resps = sample.get("resps") or []
            flat = resps[0] if len(resps) == 1 and isinstance(resps[0], list) else resps
            flat = [r[0] if isinstance(r, list) and len(r) == 1 else r for r in flat]
            repeats.append(len(flat))
            if len(flat) > 1 and len({str(r) for r in flat}) == 1:
                identical += 1
        if identical:
            log.warning(
                "%s: %d of %d documents got %d identical responses: is sampling on?", task, identical, len(samples), k
            )
        out[task] = {
            "lm_eval_task": name,
            "metrics": metrics,
            "n_docs": len(samples) or int(results.get("n-samples", {}).get(name, {}).get("effective", 0)),
            "repeats_per_doc": sorted(set(repeats)),
            "identical_repeats": identical,
        }
    return out


def run_lm_eval(
    tasks: Sequence[str],
    k: int,
    sampling: SamplingConfig,
    model_type: str,
    model_args: Mapping[str, Any],
    include_path: str | None = None,
    include_defaults: bool = True,
    apply_chat_template: bool = True,
    limit: int | float | None = None,
    batch_size: int | str | None = None,
    system_instruction: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """avg@k of each task (a group such as mmlu_pro is expanded into its leaf tasks). `include_path` adds task
    yamls; `include_defaults=False` skips indexing lm-eval's ~15k built-in tasks (only the included ones)."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise RuntimeError("the lm-eval bridge needs lm-eval: pip install -e '.[eval-extra]'") from err

    manager = TaskManager(include_path=include_path, include_defaults=include_defaults)
    specs: list[dict[str, Any]] = []
    derived: dict[str, str] = {}
    for name in tasks:
        loaded = manager.load([name])["tasks"]
        if not loaded:
            raise ValueError(f"lm-eval task {name!r} not found")
        for leaf, task in loaded.items():
            gen_kwargs = sampling_gen_kwargs(sampling, model_type, task.config.generation_kwargs)
            cfg = avg_at_k_task_config(task, k, gen_kwargs)
            derived[leaf] = cfg["task"]
            specs.append(cfg)
    log.info("lm-eval avg@%d on %s with %s", k, ", ".join(derived), model_type)
    # python's, numpy's, torch's and the few-shot sampler's generators, all seeded with `seed`
    seeds = dict.fromkeys(("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed"), seed)
    results = lm_eval.simple_evaluate(
        model=model_type,
        model_args=dict(model_args),
        tasks=specs,
        task_manager=manager,
        bootstrap_iters=0,
        log_samples=True,
        apply_chat_template=apply_chat_template,
        system_instruction=system_instruction,
        limit=limit,
        batch_size=batch_size,
        **seeds,
    )
    if results is None:  # not rank 0
        return {}
    return {"k": int(k), "model": model_type, "tasks": summarise(results, derived, k)}
