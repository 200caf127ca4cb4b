"""Aggregation and reporting: SARL Table 2's `Avg` and `Δ%`, Table 8's lengths, Table 3's WB Score, the
structure statistics of Fig. 2a; results.json, results.md and problems.jsonl in the run directory, and W&B.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from eval.cache import atomic_write_text
from eval.metrics import mean_std
from eval.wildbench import CATEGORY_WEIGHTS, SHORT_NAMES, category_scores, task_categories, wb_score_macro
from sarl.checking.grading.scores import avg_at_k
from sarl.runtime.errors import UserError
from sarl.runtime.runs import wandb_offline_when_unusable

if TYPE_CHECKING:
    from eval.data import Problem
    from eval.protocol import Benchmark

log = logging.getLogger(__name__)


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean; None for no values."""
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else None


def benchmark_average(scores: Mapping[str, float]) -> float:
    """SARL Table 2 `Avg`: the unweighted mean of the per-benchmark avg@k scores (decisions §3)."""
    if not scores:
        raise ValueError("the average over benchmarks needs at least one benchmark score")
    return sum(float(v) for v in scores.values()) / len(scores)


def relative_change(value: float, base: float) -> float:
    """SARL Table 2/3 `Δ%`: (value - base) / base, in percent (decisions §3)."""
    if base == 0:
        raise ValueError("Δ% against a base score of 0 is undefined")
    return (float(value) - float(base)) / float(base) * 100.0


def table_delta_pct(value: float, base: float) -> float:
    """Δ% as SARL Tables 2-3 print it: of the scores as printed (2 decimals), so that the column agrees with
    the printed Avg / WB Score columns (Table 2, TTRL: 71.12 vs 64.51 -> +10.2%, where the unrounded base
    64.5075 would give +10.3%)."""
    return relative_change(round(float(value), 2), round(float(base), 2))


def with_delta(value: float | None, base: float | None) -> str:
    """'72.16 (+11.9%)' as in SARL Tables 2-3; just the value without a usable base."""
    if value is None:
        return "-"
    text = f"{value:.2f}"
    if base is None or round(base, 2) == 0:
        return text
    return f"{text} ({table_delta_pct(value, base):+.1f}%)"


def _fmt(value: Any, spec: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


# ---------------------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------------------


def structure_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean structure reward statistics (SR, C, L, steps, nodes) over responses whose reward was computed;
    C and L average over the responses where they are defined; failures are counted."""
    ok = [r for r in records if not r.get("failed")]
    out: dict[str, Any] = {"n": len(records), "n_failed": len(records) - len(ok)}
    for key, name in (("sr", "sr"), ("C", "C"), ("L", "L"), ("n_steps", "steps"), ("n_nodes", "nodes")):
        vals = [r[key] for r in ok if r.get(key) is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
        out[f"{name}_mean"] = mean(vals)
    return out


def summarise_math(name: str, problems: Sequence[Mapping[str, Any]], k: int) -> dict[str, Any]:
    """Per-benchmark figures from per-problem rows (each with `samples`: correct, n_tokens, truncated, ...)."""
    samples = [s for p in problems for s in p["samples"]]
    tokens = [s["n_tokens"] for s in samples if s.get("n_tokens") is not None]
    return {
        "benchmark": name,
        "avg_at_k": avg_at_k([[bool(s["correct"]) for s in p["samples"]] for p in problems]),
        "k": k,
        "n_problems": len(problems),
        "n_samples": len(samples),
        "mean_tokens": mean(tokens),
        "n_without_token_count": len(samples) - len(tokens),
        "truncation_rate": 100.0 * sum(bool(s["truncated"]) for s in samples) / len(samples),
        "no_answer_rate": 100.0 * sum(s.get("answer") is None for s in samples) / len(samples),
        "grader_timeouts": sum(bool(s.get("grader_timeout")) for s in samples),  # a check counted as not equal
        "generation_failures": sum(bool(s.get("generation_failed")) for s in samples),
        "structure": structure_summary([s["structure"] for s in samples if s.get("structure") is not None]),
    }


def summarise_overall(benchmarks: Mapping[str, Mapping[str, Any]], base: Mapping[str, Any] | None) -> dict[str, Any]:
    """Across benchmarks: Table 2's Avg and Δ%, Table 8's mean length and its Δ (tokens), truncation and SR
    (each the unweighted mean of the benchmark figures, as the paper's Avg columns)."""
    if not benchmarks:
        return {}
    avg = benchmark_average({b: s["avg_at_k"] for b, s in benchmarks.items()})
    tokens = mean([s["mean_tokens"] for s in benchmarks.values() if s["mean_tokens"] is not None])
    out: dict[str, Any] = {
        "avg": avg,
        "mean_tokens": tokens,
        "truncation_rate": mean([s["truncation_rate"] for s in benchmarks.values()]),
        "sr_mean": mean(
            [s["structure"]["sr_mean"] for s in benchmarks.values() if s["structure"].get("sr_mean") is not None]
        ),
        "base_avg": None,
        "delta_pct": None,
        "delta_tokens": None,
    }
    if base:
        missing = sorted(set(benchmarks) - set(base.get("benchmarks", {})))
        if missing:
            log.warning("base results lack the benchmarks %s: no Δ%% against them", missing)
        else:
            base_avg = benchmark_average({b: base["benchmarks"][b]["avg_at_k"] for b in benchmarks})
            out["base_avg"] = base_avg
            out["delta_pct"] = table_delta_pct(avg, base_avg) if round(base_avg, 2) else None
            base_tokens = mean(
                [
                    base["benchmarks"][b]["mean_tokens"]
                    for b in benchmarks
                    if base["benchmarks"][b]["mean_tokens"] is not None
                ]
            )
            if tokens is not None and base_tokens is not None:
                out["delta_tokens"] = tokens - base_tokens
    return out


def problem_row(b: Benchmark, p: Problem, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """One line of problems.jsonl / the W&B table: the problem's samples without their texts."""
    tokens = [s["n_tokens"] for s in samples if s.get("n_tokens") is not None]
    srs = [s["structure"]["sr"] for s in samples if s.get("structure") and s["structure"].get("sr") is not None]
    row: dict[str, Any] = {
        "benchmark": b.label,
        "problem_id": p.id,
        "n_samples": len(samples),
        "n_correct": None,
        "avg": None,
        "judge_score": None,
        "n_judge_failed": None,
        "mean_tokens": mean(tokens),
        "n_truncated": sum(bool(s["truncated"]) for s in samples),
        "mean_sr": mean(srs),
        "answers": [s.get("answer") for s in samples] if b.kind in ("math", "code") else [],
        "samples": [{k: v for k, v in s.items() if k != "text"} for s in samples],
    }
    if b.kind in ("math", "code"):  # a code sample's answer is its run's outcome (eval/code.py)
        row["n_correct"] = sum(bool(s["correct"]) for s in samples)
        row["avg"] = 100.0 * row["n_correct"] / len(samples)
    else:
        scores = [s["judge_score"] for s in samples if s["judge_score"] is not None]
        row["judge_score"] = mean(scores)
        row["n_judge_failed"] = sum(1 for s in samples if s["judge_failed"])
    return row


def summarise_wildbench(b: Benchmark, problems: list[dict[str, Any]], base: Mapping[str, Any] | None) -> dict[str, Any]:
    """Per-task score (mean of its judged responses), category scores, WB Score and its Δ% to the base."""
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


def headline(summary: Mapping[str, Any]) -> tuple[str, float] | None:
    """A benchmark's first numeric protocol metric (avg@n, pass@1 or pass@1_mean) and its value."""
    return next(((k, v) for k, v in (summary.get("metrics") or {}).items() if isinstance(v, (int, float))), None)


def protocol_math_part(
    parts: Sequence[Mapping[str, Any] | None], plan: Mapping[str, Any], base: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """results.json's `math` from the parts scored per sampling setting: every benchmark (by its plan label),
    `overall` (SARL Table 2's Avg over them; per sweep value when the protocol sweeps a setting) and, with a
    sweep, `sweep`: per benchmark the headline metric at each value and their mean ± std (Structured Reasoning
    Table 4)."""
    parts = [p for p in parts if p]
    sweeps = {e["label"]: e["sweep"] for e in plan["benchmarks"] if e.get("sweep")}
    if not parts or (len(parts) == 1 and not sweeps):
        return dict(parts[0]) if parts else None
    benches = {k: v for p in parts for k, v in p["benchmarks"].items()}
    base_math = (base or {}).get("math")
    if not sweeps:
        return {"benchmarks": benches, "overall": summarise_overall(benches, base_math)}
    by_value: dict[str, dict[str, Any]] = {}
    by_bench: dict[str, dict[str, Any]] = {}
    for label, s in benches.items():
        key, value = sweeps[label]
        by_value.setdefault(f"{key}={value}", {})[label] = s
        head = headline(s)
        if head is not None:
            entry = by_bench.setdefault(label.split("/")[0], {"key": key, "metric": head[0], "values": {}})
            entry["values"][str(value)] = head[1]
    for entry in by_bench.values():
        entry["mean"], entry["std"] = mean_std(list(entry["values"].values()))
    overall = {v: summarise_overall(group, None) for v, group in by_value.items()}
    return {"benchmarks": benches, "overall": overall, "sweep": by_bench}


def protocol_markdown(results: Mapping[str, Any]) -> list[str]:
    """The metrics table of a protocol other than SARL's, and its sweep table."""
    protocol = results["protocol"]
    benches = (results.get("math") or {}).get("benchmarks") or {}
    if not benches:
        return []
    metric_names = list(dict.fromkeys(k for s in benches.values() for k in s.get("metrics") or {}))
    cols = [m for m in metric_names if m not in ("pass@1_std", "pass@1_per_seed")]
    plan = {e["label"]: e for e in protocol["benchmarks"]}
    lines = ["", f"## {protocol['paper']} protocol `{protocol['name']}`", ""]
    lines.append("| Benchmark | n | max_tokens | temperature | " + " | ".join(cols) + " |")
    lines.append("|---" * (len(cols) + 4) + "|")
    for label, s in benches.items():
        m, sampling = s.get("metrics") or {}, plan[label]["sampling"]
        cells = []
        for c in cols:
            cell = _fmt(m.get(c))
            if c == "pass@1_mean" and m.get("pass@1_std") is not None:
                cell += f" ± {_fmt(m['pass@1_std'])}"
            cells.append(cell)
        head = f"| {label} | {plan[label]['n']} | {sampling['max_tokens']} | {sampling['temperature']:g} | "
        lines.append(head + " | ".join(cells) + " |")
    sweep = (results.get("math") or {}).get("sweep") or {}
    if sweep:
        values = list(dict.fromkeys(v for e in sweep.values() for v in e["values"]))
        key = next(iter(sweep.values()))["key"]
        lines += ["", f"### By {key}: the headline metric at each value, mean ± std over them", ""]
        lines.append("| Benchmark | metric | " + " | ".join(f"{key}={v}" for v in values) + " | mean ± std |")
        lines.append("|---" * (len(values) + 3) + "|")
        for b, e in sweep.items():
            cells = [_fmt(e["values"].get(v)) for v in values]
            stat = _fmt(e["mean"]) + (f" ± {_fmt(e['std'])}" if e["std"] is not None else "")
            lines.append(f"| {b} | {e['metric']} | " + " | ".join(cells) + f" | {stat} |")
    return lines


# ---------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------


def load_base(path: str | Path | None) -> dict[str, Any] | None:
    """A previous run's results.json (the base model; `path` is it or its run directory) for the Δ columns, or
    None; a UserError naming `base_results` when it cannot be read."""
    if not path:
        return None
    key, path = f"base_results={path}", Path(path)
    if path.is_dir():
        key, path = f"{key}: {path / 'results.json'}", path / "results.json"
    if not path.is_file():
        raise UserError(f"{key} does not exist; give the results.json of the base model's run (or its run directory)")
    try:
        base = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON
        raise UserError(f"{key} cannot be read as eval.run's results.json ({err})") from err
    if not isinstance(base, dict):
        raise UserError(f"{key} is not eval.run's results.json (not a JSON object)")
    return base


def markdown_report(results: Mapping[str, Any], base: Mapping[str, Any] | None) -> str:
    """The run's tables in the layout of SARL Tables 2, 8 and 3, plus truncation and structure statistics."""
    name = results["run"]["name"]
    base_name = (base or {}).get("run", {}).get("name", "base")
    lines = [f"# Evaluation of {name}", ""]
    lines.append(f"Checkpoint `{results['run']['ckpt']}`; sampling {json.dumps(results['run']['sampling'])}.")
    if results["run"].get("limit"):
        lines += ["", f"Only the first {results['run']['limit']} problems of each benchmark (limit)."]
    if not results.get("complete", True):
        lines += ["", f"**Incomplete:** {results.get('incomplete_reason')}. Rerun the same command to resume."]
    lines += selection_markdown(results.get("selection"))
    math_part = results.get("math") or {}
    benches = math_part.get("benchmarks") or {}
    if (results.get("protocol") or {}).get("name", "sarl") != "sarl":
        lines += protocol_markdown(results)
    elif benches:
        k = next(iter(benches.values()))["k"]
        base_b = (base or {}).get("math", {}).get("benchmarks", {})
        overall = math_part["overall"]
        cols = list(benches)
        lines += ["", f"## Math reasoning: avg@{k} (SARL Table 2)", ""]
        lines.append("| Method | " + " | ".join(cols) + " | Avg (Δ%) |")
        lines.append("|---" * (len(cols) + 2) + "|")
        if base_b and all(c in base_b for c in cols):
            row = [_fmt(base_b[c]["avg_at_k"]) for c in cols]
            lines.append(f"| {base_name} | " + " | ".join(row) + f" | {_fmt(overall['base_avg'])} |")
        row = [_fmt(benches[c]["avg_at_k"]) for c in cols]
        lines.append(f"| {name} | " + " | ".join(row) + f" | {with_delta(overall['avg'], overall['base_avg'])} |")
        timeouts = ", ".join(f"{c} {_fmt(benches[c].get('grader_timeouts'), 'd')}" for c in cols)
        lines += ["", f"Grader timeouts (math-verify gave no verdict in time; graded incorrect): {timeouts}."]
        lines += ["", "## Response length in tokens (SARL Table 8)", ""]
        lines.append("| Method | " + " | ".join(cols) + " | Avg | Δ vs. Base |")
        lines.append("|---" * (len(cols) + 3) + "|")
        if base_b and all(c in base_b for c in cols):
            row = [_fmt(base_b[c]["mean_tokens"], ".1f") for c in cols]
            base_avg_tokens = mean([base_b[c]["mean_tokens"] for c in cols if base_b[c]["mean_tokens"] is not None])
            lines.append(f"| {base_name} | " + " | ".join(row) + f" | {_fmt(base_avg_tokens, '.1f')} | 0.0 |")
        row = [_fmt(benches[c]["mean_tokens"], ".1f") for c in cols]
        delta = _fmt(overall["delta_tokens"], "+.1f")
        lines.append(f"| {name} | " + " | ".join(row) + f" | {_fmt(overall['mean_tokens'], '.1f')} | {delta} |")
    all_benches = {**benches, **((results.get("wildbench") or {}).get("benchmarks") or {})}
    if all_benches:
        lines += ["", "## Truncation and reasoning structure (SARL Fig. 2a)", ""]
        lines.append(
            "| Benchmark | responses | truncated % | no answer % | mean SR (Δ% vs. base) | mean C | mean L | "
            "mean steps | structure failures |"
        )
        lines.append("|---" * 9 + "|")
        base_all = {
            **((base or {}).get("math") or {}).get("benchmarks", {}),
            **((base or {}).get("wildbench") or {}).get("benchmarks", {}),
        }
        for b, s in all_benches.items():
            st = s.get("structure") or {}
            base_sr = (base_all.get(b, {}).get("structure") or {}).get("sr_mean")
            sr = _fmt(st.get("sr_mean"), ".3f")
            if st.get("sr_mean") is not None and base_sr:  # SARL Fig. 2a: the change of SR after training
                sr += f" ({relative_change(st['sr_mean'], base_sr):+.1f}%)"
            cells = [
                b,
                str(s["n_samples"]),
                _fmt(s["truncation_rate"], ".1f"),
                _fmt(s.get("no_answer_rate"), ".1f"),
                sr,
                _fmt(st.get("C_mean"), ".3f"),
                _fmt(st.get("L_mean"), ".3f"),
                _fmt(st.get("steps_mean"), ".1f"),
                str(st.get("n_failed", "-")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    for b, s in ((results.get("wildbench") or {}).get("benchmarks") or {}).items():
        base_w = (base or {}).get("wildbench", {}).get("benchmarks", {}).get(b)
        cols = list(CATEGORY_WEIGHTS)
        lines += ["", f"## WildBench: {b} (SARL Table 3)", ""]
        lines.append("| Method | " + " | ".join(SHORT_NAMES[c] for c in cols) + " | WB Score (Δ%) |")
        lines.append("|---" * (len(cols) + 2) + "|")
        if base_w:
            row = [_fmt(base_w["categories"].get(c)) for c in cols]
            lines.append(f"| {base_name} | " + " | ".join(row) + f" | {_fmt(base_w['wb_score'])} |")
        row = [_fmt(s["categories"].get(c)) for c in cols]
        base_wb = base_w["wb_score"] if base_w else None
        lines.append(f"| {name} | " + " | ".join(row) + f" | {with_delta(s['wb_score'], base_wb)} |")
        lines += [
            "",
            f"{s['n_tasks']} tasks, {s['n_samples']} responses: {s['n_judged']} judged, {s['n_empty']} empty "
            f"(scored 1), {s['n_failed']} failed judgements (left out); mean response length "
            f"{_fmt(s['mean_tokens'], '.1f')} tokens (SARL Table 9).",
        ]
        if s.get("wb_score_missing"):
            lines.append(f"No WB Score: {s['wb_score_missing']}.")
    lm = results.get("lm_eval") or {}
    if lm.get("tasks"):
        lines += ["", f"## lm-eval tasks: avg@{lm['k']}", "", "| Task | metric | avg@k | docs |", "|---|---|---|---|"]
        for task, t in lm["tasks"].items():
            for metric, value in t["metrics"].items():
                lines.append(f"| {task} | {metric} | {_fmt(value)} | {t['n_docs']} |")
    return "\n".join(lines) + "\n"


def write_results(
    run_dir: str | Path, results: Mapping[str, Any], problems: Sequence[Mapping[str, Any]], markdown: str
) -> None:
    """results.json, results.md and problems.jsonl (one line per problem), each written atomically."""
    run_dir = Path(run_dir)
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=2, ensure_ascii=False, default=str))
    atomic_write_text(run_dir / "results.md", markdown)
    atomic_write_text(
        run_dir / "problems.jsonl", "".join(json.dumps(p, ensure_ascii=False, default=str) + "\n" for p in problems)
    )


def flat_metrics(results: Mapping[str, Any]) -> dict[str, float]:
    """The headline numbers as flat W&B summary keys (eval/<benchmark>/<metric>)."""
    out: dict[str, float] = {}

    def put(key: str, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value is not None:
            out[key] = float(value)

    for b, s in ((results.get("math") or {}).get("benchmarks") or {}).items():
        for m in ("avg_at_k", "mean_tokens", "truncation_rate", "no_answer_rate", "grader_timeouts"):
            put(f"eval/{b}/{m}", s.get(m))
        put(f"eval/{b}/sr_mean", (s.get("structure") or {}).get("sr_mean"))
        for m, v in (s.get("metrics") or {}).items():
            put(f"eval/{b}/{m}", v)
    for m, v in ((results.get("math") or {}).get("overall") or {}).items():
        put(f"eval/math/{m}", v)
    for b, s in ((results.get("wildbench") or {}).get("benchmarks") or {}).items():
        put(f"eval/{b}/wb_score", s.get("wb_score"))
        put(f"eval/{b}/delta_pct", s.get("delta_pct"))
        for c, v in s["categories"].items():
            put(f"eval/{b}/{SHORT_NAMES[c]}", v)
        for m in ("mean_tokens", "truncation_rate", "n_failed"):
            put(f"eval/{b}/{m}", s.get(m))
        put(f"eval/{b}/sr_mean", (s.get("structure") or {}).get("sr_mean"))
    for task, t in ((results.get("lm_eval") or {}).get("tasks") or {}).items():
        for metric, v in t["metrics"].items():
            put(f"eval/lm_eval/{task}/{metric}", v)
    selection = results.get("selection") or {}
    if selection:
        put("eval/selection/step", selection.get("step"))
        for c in selection.get("checkpoints") or []:
            put(f"eval/selection/held_out/step_{c['step']}", c.get("held_out_score"))
    return out


SELECTION_COLUMNS = ("step", "held_out_score", "picked", "ckpt")


def selection_rows(selection: Mapping[str, Any]) -> list[list[Any]]:
    """The per-checkpoint rows of a `selection` block (SELECTION_COLUMNS)."""
    return [
        [c["step"], c.get("held_out_score"), c["step"] == selection["step"], c["ckpt"]]
        for c in selection.get("checkpoints") or []
    ]


def selection_markdown(selection: Mapping[str, Any] | None) -> list[str]:
    """The checkpoint selection as the report prints it: the rule, the held-out set and a row per checkpoint."""
    if not selection:
        return []
    lines = [
        "",
        f"## Checkpoint selection: `{selection['rule']}` on {', '.join(selection['held_out'])} (picked step "
        f"{selection['step']})",
        "",
        "| Step | Held-out score | Picked | Checkpoint |",
        "|---|---|---|---|",
    ]
    for step, score, picked, ckpt in selection_rows(selection):
        lines.append(f"| {step} | {_fmt(score)} | {'✓' if picked else ''} | `{ckpt}` |")
    return lines


def log_to_training_run(logger_cfg: Mapping[str, Any], results: Mapping[str, Any], train_dir: Path) -> None:
    """The evaluation's headline numbers and checkpoint selection in the summary of the W&B run of the training run
    that wrote the checkpoint (resumed by its id, meta.json `wandb_run_id`), prefixed by the protocol
    (`eval/<protocol>/...`), and the selection as a table: a sweep's runs then compare in the W&B UI. A training
    run without a recorded W&B id (logged without W&B) is left alone."""
    import os

    try:
        meta = json.loads((train_dir / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    run_id = meta.get("wandb_run_id") if isinstance(meta, dict) else None
    if not run_id:
        return
    import wandb

    env = dict(os.environ)
    wandb_offline_when_unusable(env)
    protocol = (results.get("protocol") or {}).get("name", "sarl")
    run = wandb.init(
        id=str(run_id),
        resume="allow",
        project=logger_cfg.get("project"),
        entity=logger_cfg.get("entity"),
        dir=str(train_dir),
        mode=env.get("WANDB_MODE"),
        reinit="finish_previous",
    )
    try:
        flat = {k.replace("eval/", f"eval/{protocol}/", 1): v for k, v in flat_metrics(results).items()}
        run.summary.update(flat)
        run.summary.update({f"eval/{protocol}/results": results["run"]["run_dir"]})
        selection = results.get("selection")
        if selection:
            table = wandb.Table(columns=list(SELECTION_COLUMNS), data=selection_rows(selection))
            run.log({f"eval/{protocol}/selection": table})
    finally:
        run.finish()


PROBLEM_COLUMNS = (
    "benchmark",
    "problem_id",
    "n_samples",
    "n_correct",
    "avg",
    "judge_score",
    "n_judge_failed",
    "mean_tokens",
    "n_truncated",
    "mean_sr",
    "answers",
)


def log_wandb(
    logger_cfg: Mapping[str, Any],
    results: Mapping[str, Any],
    problems: Sequence[Mapping[str, Any]],
    run_dir: Path,
    config: Mapping[str, Any],
) -> None:
    """A W&B run (offline without an API key): the summary metrics and a table of per-problem results."""
    import os

    import wandb

    env = dict(os.environ)
    wandb_offline_when_unusable(env)  # offline without an API key or a reachable server
    run = wandb.init(
        project=logger_cfg.get("project"),
        entity=logger_cfg.get("entity"),
        name=f"eval-{results['run']['name']}",
        job_type="eval",
        dir=str(run_dir),
        config=dict(config),
        mode=env.get("WANDB_MODE"),
        reinit="finish_previous",
    )
    try:
        run.summary.update(flat_metrics(results))
        table = wandb.Table(columns=list(PROBLEM_COLUMNS))
        for p in problems:
            table.add_data(*[json.dumps(p[c]) if c == "answers" else p.get(c) for c in PROBLEM_COLUMNS])
        run.log({"eval/problems": table})
    finally:
        run.finish()
