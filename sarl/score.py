"""Score a JSONL file of responses with the structure reward.

    python -m sarl.score input=FILE.jsonl output=OUT.jsonl [plot=true] [reward=sarl_c_only]
    python -m sarl.score input=FILE.jsonl view=ID      # the reasoning-map viewer for one response

Each input line needs a "response" field (optional: "id", "prompt"); ids are unique. Each output line
holds the id, score, SR, C, L, step/node/edge counts, flags and the failure reason (an undefined value
is null). Exit code 2 for a bad setting or input (one line on stderr, checked before the model loads),
3 when every response failed.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from importlib import resources
from pathlib import Path

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from sarl.runtime.errors import UserError, check_output_file, check_writable_dir, report_user_errors
from sarl.structure.interface import RolloutBatch
from sarl.structure.reward import StructureAnalysis, StructureReward

EXIT_ALL_FAILED = 3

log = logging.getLogger(__name__)


def read_responses(path: str | Path | None) -> list[dict]:
    """Rows of a JSONL file (the shipped samples when `path` is None); each must have "response", and ids
    (the line number where absent) must be unique strings or finite numbers. A UTF-8 byte-order mark is
    accepted. Any problem is a UserError naming the file and line."""
    if path is None:
        data = resources.files("sarl").joinpath("samples/responses.jsonl").read_bytes()
        source = "shipped samples"
    else:
        p = Path(path)
        if not p.exists():
            raise UserError(f"input={path} does not exist")
        if not p.is_file():
            raise UserError(f"input={path} is not a file")
        try:
            data = p.read_bytes()
        except OSError as err:
            raise UserError(f"input={path} cannot be read ({err.strerror})") from err
        source = str(path)
    rows: list[dict] = []
    first_line: dict[str, int] = {}
    for n, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise UserError(f"{source}, line {n}: not UTF-8 (byte {err.start + 1}); convert the file to UTF-8") from err
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"{source}, line {n}: not valid JSON ({err})") from err
        if not isinstance(row, dict) or "response" not in row:
            raise UserError(f'{source}, line {n}: expected an object with a "response" field')
        rid = row.setdefault("id", str(n))
        if (
            isinstance(rid, bool)
            or not isinstance(rid, (str, int, float))
            or (isinstance(rid, float) and not math.isfinite(rid))
        ):
            raise UserError(f"{source}, line {n}: id {rid!r} is not a string or a finite number")
        key = str(rid)
        if key in first_line:
            raise UserError(f"{source}, line {n}: id {key!r} repeats line {first_line[key]}; ids must be unique")
        first_line[key] = n
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
    """A file name for an id: the id itself where it is safe, else a cleaned prefix plus a hash of the id,
    so that two ids never share a file."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]
    if safe == text and safe not in ("", ".", ".."):
        return safe
    import hashlib

    return f"{safe.strip('.') or 'response'}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def view_one(cfg: DictConfig, reward: StructureReward, rows: list[dict]) -> Path:
    """`view=ID`: the reasoning map of the response with that id (PNG in plot_dir) and its steps by function."""
    from sarl.structure.viz import step_table, view_response

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


def _json_value(value: float | None) -> float | None:
    """A diagnostic as JSON: NaN (undefined, e.g. L of a one-node map) is null, so every line is valid JSON."""
    return None if value is None or not math.isfinite(value) else value


@hydra.main(version_base="1.3", config_path="../conf", config_name="score")
@report_user_errors("sarl.score")
def main(cfg: DictConfig) -> None:
    if int(cfg.batch_size) < 1:
        raise UserError(f"batch_size={cfg.batch_size}: must be at least 1")
    rows = read_responses(cfg.input)  # before the embedding model loads: a bad file fails in a second
    if cfg.get("view") is not None:
        check_writable_dir(cfg.plot_dir, "plot_dir")
        view_one(cfg, hydra.utils.instantiate(cfg.reward), rows)
        return
    out_path = check_output_file(cfg.output, "output", inputs=(cfg.input,))
    if cfg.plot:
        check_writable_dir(cfg.plot_dir, "plot_dir")
    reward: StructureReward = hydra.utils.instantiate(cfg.reward)
    analyses = score_rows(reward, rows, cfg.batch_size)
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
                "SR": _json_value(d.get("sr")),
                "C": _json_value(d.get("C")),
                "L": _json_value(d.get("L")),
                "n_steps": int(d.get("n_steps", 0)),
                "n_nodes": int(d.get("n_nodes", 0)),
                "n_edges": int(d.get("n_edges", 0)),
                "no_think": bool(d.get("no_think")),
                "truncated": bool(d.get("truncated")),
                "steps_capped": bool(d.get("steps_capped")),
                "failed": a.output.failed,
            }
            f.write(json.dumps(record, allow_nan=False) + "\n")
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
                from sarl.structure.viz import plot_reasoning_map

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
    if rows and n_failed == len(rows):
        reasons = sorted({str(a.output.failed) for a in analyses})
        sys.stderr.write(f"sarl.score: every response failed ({'; '.join(reasons)[:300]})\n")
        sys.exit(EXIT_ALL_FAILED)


if __name__ == "__main__":
    main()
