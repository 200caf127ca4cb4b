"""Score a JSONL file of responses with the structure reward.

    python -m sarl.score input=FILE.jsonl output=OUT.jsonl [plot=true] [reward=sarl_c_only]
    python -m sarl.score input=FILE.jsonl view=ID      # the reasoning-map viewer for one response

Each input line needs a "response" field (optional: "id", "prompt"). Each output line
holds the id, score, SR, C, L, step/node/edge counts, flags and the failure reason.
"""

from __future__ import annotations

import json
import logging
import re
from importlib import resources
from pathlib import Path

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from sarl.interface import RolloutBatch
from sarl.reward import StructureAnalysis, StructureReward

log = logging.getLogger(__name__)


def read_responses(path: str | Path | None) -> list[dict]:
    """Rows of a JSONL file (the shipped samples when `path` is None); each must have "response"."""
    if path is None:
        text = resources.files("sarl").joinpath("samples/responses.jsonl").read_text(encoding="utf-8")
        source = "shipped samples"
    else:
        text = Path(path).read_text(encoding="utf-8")
        source = str(path)
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{source}, line {n}: not valid JSON ({err})") from err
        if not isinstance(row, dict) or "response" not in row:
            raise ValueError(f'{source}, line {n}: expected an object with a "response" field')
        row.setdefault("id", str(n))
        rows.append(row)
    return rows


def score_rows(reward: StructureReward, rows: list[dict], batch_size: int = 256) -> list[StructureAnalysis]:
    """Structure analyses of the rows, `batch_size` responses per reward call."""
    out: list[StructureAnalysis] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        batch = RolloutBatch(
            prompts=[str(r.get("prompt", "")) for r in chunk], responses=[r["response"] for r in chunk]
        )
        out.extend(reward.analyze(batch))
    return out


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80] or "response"


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def view_one(cfg: DictConfig, reward: StructureReward, rows: list[dict]) -> Path:
    """`view=ID`: the reasoning map of the response with that id (PNG in plot_dir) and its steps by function."""
    from sarl.viz import step_table, view_response

    wanted = str(cfg.view)
    row = next((r for r in rows if str(r["id"]) == wanted), None)
    if row is None:
        ids = ", ".join(str(r["id"]) for r in rows[:20]) + (" ..." if len(rows) > 20 else "")
        raise ValueError(
            f"view={wanted!r}: no response with that id in {cfg.input or 'the shipped samples'}; ids: {ids}"
        )
    png = Path(cfg.plot_dir) / f"{_safe_name(wanted)}.png"
    _, analysis = view_response(row["response"], reward, png, prompt=str(row.get("prompt", "")))
    d = analysis.output.diagnostics
    table = Table(
        title=f"{wanted}: SR={_fmt(d.get('sr'))}  C={_fmt(d.get('C'))}  L={_fmt(d.get('L'))}  "
        f"{int(d.get('n_nodes', 0))} functions, {int(d.get('n_edges', 0))} edges"
    )
    for col in ("step", "function", "text"):
        table.add_column(col, justify="right" if col == "step" else "left", overflow="fold")
    for n, function, text in step_table(analysis):
        table.add_row(str(n), function, text)
    console = Console(width=max(Console().width, 120))
    console.print(table)
    console.print(f"reasoning map: {png}")
    return png


@hydra.main(version_base="1.3", config_path="../conf", config_name="score")
def main(cfg: DictConfig) -> None:
    reward: StructureReward = hydra.utils.instantiate(cfg.reward)
    rows = read_responses(cfg.input)
    if cfg.get("view") is not None:
        view_one(cfg, reward, rows)
        return
    analyses = score_rows(reward, rows, cfg.batch_size)
    out_path = Path(cfg.output)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    table = Table(title=f"Structure reward ({reward.variant}, {reward.clustering}) on {len(rows)} responses")
    for col in ("id", "score", "SR", "C", "L", "steps", "nodes", "edges", "flags"):
        table.add_column(col, justify="left" if col in ("id", "flags") else "right", overflow="fold")
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row, a in zip(rows, analyses):
            d = a.output.diagnostics
            record = {
                "id": row["id"],
                "score": a.output.score,
                "SR": d.get("sr"),
                "C": d.get("C"),
                "L": d.get("L"),
                "n_steps": int(d.get("n_steps", 0)),
                "n_nodes": int(d.get("n_nodes", 0)),
                "n_edges": int(d.get("n_edges", 0)),
                "no_think": bool(d.get("no_think")),
                "truncated": bool(d.get("truncated")),
                "steps_capped": bool(d.get("steps_capped")),
                "failed": a.output.failed,
            }
            f.write(json.dumps(record) + "\n")
            flags = [k for k in ("no_think", "truncated", "steps_capped") if record[k]]
            if a.output.failed:
                flags.append(f"failed: {a.output.failed}")
            table.add_row(
                str(row["id"]),
                _fmt(a.output.score),
                _fmt(d.get("sr")),
                _fmt(d.get("C")),
                _fmt(d.get("L")),
                str(record["n_steps"]),
                str(record["n_nodes"]),
                str(record["n_edges"]),
                ", ".join(flags),
            )
            if cfg.plot and a.labels is not None:
                title = f"{row['id']}: SR={_fmt(d.get('sr'))}  C={_fmt(d.get('C'))}  L={_fmt(d.get('L'))}"
                png = Path(cfg.plot_dir) / f"{_safe_name(str(row['id']))}.png"
                from sarl.viz import plot_reasoning_map

                plot_reasoning_map(a.steps, a.labels, png, title=title)
    tmp.replace(out_path)
    console = Console(width=max(Console().width, 120))
    console.print(table)
    scores = [a.output.score for a in analyses if not a.output.failed]
    n_failed = sum(1 for a in analyses if a.output.failed)
    mean = sum(scores) / len(scores) if scores else float("nan")
    console.print(f"mean score {mean:.4f} over {len(scores)} responses, {n_failed} failed; wrote {out_path}")
    if cfg.plot:
        console.print(f"reasoning maps in {cfg.plot_dir}")


if __name__ == "__main__":
    main()
