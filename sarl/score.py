"""Score a JSONL file of responses with any reward of conf/reward/ (default: the structure reward).

    python -m sarl.score input=FILE.jsonl output=OUT.jsonl [reward=NAME] [plot=true]
    python -m sarl.score input=FILE.jsonl view=ID      # the reasoning-map viewer for one response

Each input line is a JSON object; ids are unique. The fields a reward reads (null is the same as absent):

    field         value                                read by
    response      the text (required)                  every reward
    id            string or number                     none: names the output line (default: the line number)
    prompt        the question's text                  maxflow, lcs_maxflow (node 0 of the graph); the grouping
    group         string or number                     the group rewards: ttrl, empo, empo_open_ended, evol_rl, lcs,
                                                       lcs_maxflow, structured_accuracy (see below)
    ground_truth  gold answer or list of accepted      ground_truth, structured_accuracy, lcs, lcs_maxflow, maxflow,
                  ones; code: {"tests": SOURCE, ...}   grp; code_exec, grp_code (the tests); ttrl (diagnostics only)
    data_source   string                               no shipped reward (passed on, for a contributor's reward)
    extra_info    object                               no shipped reward (passed on, for a contributor's reward); its
                                                       "user_prompt" is the prompt, over "prompt", as in training

Groups: a group reward (its class sets `group_reward`) compares the responses of one prompt. Rows with the same
"group" form one group; a row without one is grouped with the rows of the same "prompt" text; a group reward
refuses a row with neither. Every reward call gets whole groups. A reward that needs a gold answer refuses a row
without "ground_truth", naming its line.

Each output line holds the id, the score, the reward's diagnostics and the failure reason (null if none; an
undefined value is null): for the structure reward (conf/reward/sarl*.yaml) SR, C, L, the step/node/edge counts
and flags; for any other reward the diagnostics its class documents. Reasoning maps (`plot=true`, `view=ID`) are
the structure reward's. Exit code 2 for a bad setting or input (one line on stderr; the file and the settings are
checked before the reward loads, a missing gold answer when the reward reads it), 3 when every response failed.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from sarl.contract.metrics import batch_diagnostic_keys
from sarl.contract.reward import Reward, RewardOutput, RolloutBatch, build_reward, reward_class
from sarl.runtime.errors import (
    UserError,
    check_output_file,
    check_writable_dir,
    composition_error_message,
    report_user_errors,
)
from sarl.runtime.files import CONF_DIR
from sarl.runtime.usage import Usage, asks_for_help, usage
from sarl.structure.reward import StructureAnalysis, StructureReward
from sarl.structure.viz import plot_reasoning_map, step_table, view_response

EXIT_ALL_FAILED = 3
# The reason `GroundTruthReward` and `CodeExecReward` give a row without a gold answer; the rewards built on them
# (LCS, MaxFlow, GRP, weighted sums) pass it on, prefixed.
NO_GROUND_TRUTH = "no ground truth"

log = logging.getLogger(__name__)


@dataclass
class Responses:
    """The rows of an input file, the file's name for messages and the line each row came from."""

    source: str
    rows: list[dict]
    lines: list[int]


def _is_id(value: object) -> bool:
    """A string or a finite number (not a bool): what an id or a group may be."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return False
    return not isinstance(value, float) or math.isfinite(value)


def _field_problem(row: dict) -> str | None:
    """What is wrong with the optional fields of a row (module docstring), None if nothing."""
    for key, ok, what in (
        ("prompt", lambda v: isinstance(v, str), "a string"),
        ("group", _is_id, "a string or a finite number"),
        ("data_source", lambda v: isinstance(v, str), "a string"),
        ("extra_info", lambda v: isinstance(v, dict), "an object"),
    ):
        value = row.get(key)
        if value is not None and not ok(value):
            return f'"{key}" is {json.dumps(value)[:60]}, not {what}'
    return None


def read_input(path: str | Path | None) -> Responses:
    """The rows of a JSONL file (the shipped samples when `path` is None); each must have "response", ids (the
    line number where absent) must be unique strings or finite numbers and the optional fields of the module
    docstring of their type. A UTF-8 byte-order mark is accepted. Any problem is a UserError naming the file and
    line."""
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
    out = Responses(source, [], [])
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
        if not _is_id(rid):
            raise UserError(f"{source}, line {n}: id {rid!r} is not a string or a finite number")
        key = str(rid)
        if key in first_line:
            raise UserError(f"{source}, line {n}: id {key!r} repeats line {first_line[key]}; ids must be unique")
        problem = _field_problem(row)
        if problem:
            raise UserError(f"{source}, line {n}: {problem}")
        first_line[key] = n
        out.rows.append(row)
        out.lines.append(n)
    return out


def read_responses(path: str | Path | None) -> list[dict]:
    """The rows of a JSONL file of responses (`read_input`)."""
    return read_input(path).rows


def group_ids(data: Responses, reward: str, needs_groups: bool) -> list[str]:
    """The group of each row: its "group", else its "prompt" text, else (a reward that does not compare rows
    only) the row alone; a UserError for the first row with neither when the reward compares a prompt's
    responses (`needs_groups`)."""
    out = []
    for row, line in zip(data.rows, data.lines):
        if row.get("group") is not None:
            out.append(f"group:{row['group']}")
        elif row.get("prompt") is not None:
            out.append(f"prompt:{row['prompt']}")
        elif needs_groups:
            raise UserError(
                f"{data.source}, line {line}: reward={reward} compares the responses of one prompt; give each row a "
                '"group" (or a "prompt": rows with the same prompt text form a group)'
            )
        else:
            out.append(f"line:{line}")
    return out


def reward_calls(groups: list[str], batch_size: int) -> list[list[int]]:
    """Row indices of each reward call: whole groups in order of first appearance, `batch_size` rows at most
    unless one group alone has more."""
    members: dict[str, list[int]] = {}
    for i, gid in enumerate(groups):
        members.setdefault(gid, []).append(i)
    calls: list[list[int]] = [[]]
    for rows in members.values():
        if calls[-1] and len(calls[-1]) + len(rows) > batch_size:
            calls.append([])
        calls[-1].extend(rows)
    return [c for c in calls if c]


def rows_batch(rows: list[dict], groups: list[str]) -> RolloutBatch:
    """The rows as the batch a back end hands a reward (module docstring: the fields and what reads them)."""
    return RolloutBatch.from_columns(
        responses=[r["response"] for r in rows],
        prompts=[r.get("prompt") for r in rows],
        group_ids=groups,
        ground_truths=[r.get("ground_truth") for r in rows],
        data_sources=[r.get("data_source") for r in rows],
        extra_info=[r.get("extra_info") for r in rows],
    )


def score_rows(
    reward: Reward, rows: list[dict], groups: list[str], batch_size: int = 256
) -> tuple[list[RewardOutput], list[StructureAnalysis] | None]:
    """The reward output of every row (input order), whole groups per call (`reward_calls`), and for the
    structure reward its analyses too (steps and clusters: the reasoning maps)."""
    structure = isinstance(reward, StructureReward)
    outputs: list[RewardOutput | None] = [None] * len(rows)
    analyses: list[StructureAnalysis | None] = [None] * len(rows)
    for call in reward_calls(groups, batch_size):
        batch = rows_batch([rows[i] for i in call], [groups[i] for i in call])
        if structure:
            for i, a in zip(call, reward.analyze(batch)):
                analyses[i], outputs[i] = a, a.output
        else:
            for i, o in zip(call, reward(batch)):
                outputs[i] = o
    return outputs, analyses if structure else None  # type: ignore[return-value]


def check_gold(data: Responses, outputs: list[RewardOutput], reward: str) -> None:
    """A UserError for the first row the reward failed for want of a gold answer that has no "ground_truth"."""
    for row, line, o in zip(data.rows, data.lines, outputs):
        if o.failed and NO_GROUND_TRUTH in o.failed and row.get("ground_truth") is None:
            raise UserError(
                f'reward={reward} needs a "ground_truth" field (the gold answer; code: {{"tests": SOURCE}}): '
                f"{data.source}, line {line} has none"
            )


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


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def find_row(data: Responses, wanted: str) -> dict:
    """The row whose id is `wanted`; a UserError listing some ids if there is none."""
    row = next((r for r in data.rows if str(r["id"]) == wanted), None)
    if row is None:
        ids = ", ".join(str(r["id"]) for r in data.rows[:20]) + (" ..." if len(data.rows) > 20 else "")
        raise UserError(f"view={wanted!r}: no response with that id in {data.source}; ids: {ids}")
    return row


def view_one(cfg: DictConfig, reward: StructureReward, row: dict) -> Path:
    """`view=ID`: the reasoning map of that row's response (PNG in plot_dir) and its steps by function."""
    wanted = str(cfg.view)
    png = Path(cfg.plot_dir) / f"{_safe_name(wanted)}.png"
    try:
        _, analysis = view_response(row["response"], reward, png, prompt=str(row.get("prompt") or ""))
    except ValueError as err:  # the reward of this response failed: the reason, in one line
        raise UserError(f"view={wanted!r}: {_one_line(err)}") from err
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


def structure_record(rid: object, o: RewardOutput) -> dict:
    """An output line of the structure reward: its score, SR, C, L, counts and flags."""
    d = o.diagnostics
    return {
        "id": rid,
        "score": o.score,
        "SR": _json_value(d.get("sr")),
        "C": _json_value(d.get("C")),
        "L": _json_value(d.get("L")),
        "n_steps": int(d.get("n_steps", 0)),
        "n_nodes": int(d.get("n_nodes", 0)),
        "n_edges": int(d.get("n_edges", 0)),
        "no_think": bool(d.get("no_think")),
        "truncated": bool(d.get("truncated")),
        "steps_capped": bool(d.get("steps_capped")),
        "failed": o.failed,
    }


def reward_record(rid: object, o: RewardOutput, keys: list[str]) -> dict:
    """An output line of any other reward: its score and diagnostics (`keys`, null where undefined)."""
    return {"id": rid, "score": o.score, **{k: _json_value(o.diagnostics.get(k)) for k in keys}, "failed": o.failed}


def scoring_reward(cfg: DictConfig, name: str) -> Reward:
    """The reward `cfg.reward` describes; a setting it refuses (a ValueError, a missing model path) is a
    UserError naming the reward."""
    try:
        return build_reward(cfg.reward)
    except InstantiationException as err:
        raise UserError(f"reward={name} cannot be built: {_one_line(err.__cause__ or err)}") from err
    except ValueError as err:  # reward.threads
        raise UserError(f"reward={name} cannot be built: {_one_line(err)}") from err


def write_scores(
    cfg: DictConfig,
    out_path: Path,
    data: Responses,
    outputs: list[RewardOutput],
    analyses: list[StructureAnalysis] | None,
    title: str,
    keys: list[str],
) -> None:
    """The output file (written whole, then moved into place), the terminal table and, with `plot=true`, the
    reasoning maps."""
    if analyses is not None:
        columns = ("id", "score", "SR", "C", "L", "steps", "nodes", "edges", "flags")
    else:
        columns = ("id", "score", "diagnostics", "failed")
    table = Table(title=title)
    for col in columns:
        left = col in ("id", "flags", "diagnostics", "failed")
        table.add_column(col, justify="left" if left else "right", overflow="fold")
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for i, (row, o) in enumerate(zip(data.rows, outputs)):
            record = structure_record(row["id"], o) if analyses is not None else reward_record(row["id"], o, keys)
            f.write(json.dumps(record, allow_nan=False) + "\n")
            failed = f"failed: {o.failed}" if o.failed else ""
            if analyses is None:  # the table: the non-zero diagnostics; the file has them all
                shown = ", ".join(f"{k}={v:.3g}" for k in keys if (v := record[k]) is not None and v != 0)
                table.add_row(str(row["id"]), _fmt(o.score), shown, failed)
                continue
            d = o.diagnostics
            flags = [k for k in ("no_think", "truncated", "steps_capped") if record[k]] + ([failed] if failed else [])
            table.add_row(
                str(row["id"]),
                _fmt(o.score),
                _fmt(d.get("sr")),
                _fmt(d.get("C")),
                _fmt(d.get("L")),
                *(str(record[k]) for k in ("n_steps", "n_nodes", "n_edges")),
                ", ".join(flags),
            )
            a = analyses[i]
            if cfg.plot and a.labels is not None:
                png = Path(cfg.plot_dir) / f"{_safe_name(str(row['id']))}.png"
                map_title = f"{row['id']}: SR={_fmt(d.get('sr'))}  C={_fmt(d.get('C'))}  L={_fmt(d.get('L'))}"
                plot_reasoning_map(a.steps, a.labels, png, title=map_title)
    tmp.replace(out_path)
    Console(width=max(Console().width, 120)).print(table)


@hydra.main(version_base="1.3", config_path="../conf", config_name="score")
@report_user_errors("sarl.score")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        score(cfg)
    finally:
        drop_unused_run_dir(run_dir)


def drop_unused_run_dir(run_dir: Path) -> None:
    """The folder Hydra made for this call (runs/score/<date>/<time>/), removed when nothing was written into it but
    Hydra's own records and log: a call that failed, or wrote its scores elsewhere (output=...), leaves no folder
    behind; the date, runs/score and runs folders go too when that leaves them empty."""
    if not run_dir.is_dir() or any(p.name not in (".hydra", "score.log") for p in run_dir.iterdir()):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in (run_dir.parent, run_dir.parent.parent, run_dir.parent.parent.parent):
        try:
            parent.rmdir()  # only when empty: another call's folder keeps it
        except OSError:
            break


def score(cfg: DictConfig) -> None:
    """The command (module docstring), run by `main` inside Hydra's run folder."""
    if int(cfg.batch_size) < 1:
        raise UserError(f"batch_size={cfg.batch_size}: must be at least 1")
    data = read_input(cfg.input)  # before the reward loads: a bad file fails in a second
    if not data.rows:
        raise UserError(f"input={data.source} has no responses (no line with a JSON object); nothing to score")
    name = HydraConfig.get().runtime.choices.get("reward", "?")
    try:
        cls = reward_class(str(cfg.reward.get("_target_")))
    except (ImportError, TypeError, ValueError) as err:
        raise UserError(f"reward={name}: {_one_line(err)}") from err
    has_maps = issubclass(cls, StructureReward)
    if not has_maps and (cfg.view is not None or cfg.plot):
        setting = f"view={cfg.view}" if cfg.view is not None else "plot=true"
        raise UserError(
            f"{setting}: reward={name} ({cls.__name__}) has no reasoning maps; they are the structure reward's "
            "(reward=sarl, sarl_c_only, sarl_l_only)"
        )
    groups = group_ids(data, name, bool(cls.group_reward))
    if cfg.view is not None:
        row = find_row(data, str(cfg.view))
        check_writable_dir(cfg.plot_dir, "plot_dir")
        view_one(cfg, scoring_reward(cfg, name), row)
        return
    out_path = check_output_file(cfg.output, "output", inputs=(cfg.input,))
    if cfg.plot:
        check_writable_dir(cfg.plot_dir, "plot_dir")
    reward = scoring_reward(cfg, name)
    outputs, analyses = score_rows(reward, data.rows, groups, cfg.batch_size)
    check_gold(data, outputs, name)
    n = len(data.rows)
    if isinstance(reward, StructureReward):
        title = f"Structure reward ({reward.variant}, {reward.clustering}) on {n} responses"
    else:
        title = f"reward={name} ({cls.__name__}) on {n} responses"
    write_scores(cfg, out_path, data, outputs, analyses, title, batch_diagnostic_keys(reward, outputs))
    scores = [o.score for o in outputs if not o.failed]
    n_failed = n - len(scores)
    mean = sum(scores) / len(scores) if scores else float("nan")
    console = Console(width=max(Console().width, 120))
    console.print(f"mean score {mean:.4f} over {len(scores)} responses, {n_failed} failed; wrote {out_path}")
    if cfg.plot:
        console.print(f"reasoning maps in {cfg.plot_dir}")
    if n_failed == n:
        reasons = sorted({str(o.failed) for o in outputs})
        sys.stderr.write(f"sarl.score: every response failed ({'; '.join(reasons)[:300]})\n")
        sys.exit(EXIT_ALL_FAILED)


@report_user_errors("sarl.score")
def check_command_line(argv: list[str]) -> None:
    """The overrides composed once before Hydra runs `main`: a misspelt key is a one-line error naming the nearest
    key, as in sarl.train and eval.run (Hydra's own advice, `+KEY=VALUE`, would add a key nothing reads). A command
    line with Hydra's flags (`-m` and its sweeps, `--cfg`, ...) is left to Hydra."""
    if not argv or any(a.startswith("-") for a in argv):
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_score_check"):
            compose(config_name="score", overrides=argv)
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(composition_error_message(err)) from err


USAGE = Usage(
    synopsis=(
        "python -m sarl.score input=FILE.jsonl [output=OUT.jsonl] [reward=NAME] [plot=true] [view=ID]",
        "python -m sarl.score                       # the shipped sample responses, the structure reward",
    ),
    about=(
        "Score saved responses with any reward, no training: one JSON object per line (response; id, prompt, group, "
        "ground_truth where the reward reads them: conf/score.yaml lists which). Writes one line per response with "
        "its score, diagnostics and failure; the structure reward (sarl*) adds SR, C, L and can draw reasoning maps."
    ),
    keys=(
        ("input", "the JSONL of responses (null: sarl/samples/responses.jsonl)"),
        ("output", "where the scores go (default: the run folder runs/score/<date>/<time>/scores.jsonl)"),
        ("plot", "true: each response's reasoning map as PNG (plot_dir); structure reward only"),
        ("view", "one response's id: its steps listed and its map drawn"),
        ("batch_size", "responses per reward call"),
    ),
    groups=(("reward", "reward", "the reward"), ("embedding", "embedding", "the structure reward's embedder")),
    more="Hydra's own flags still work (--cfg job, -m for a sweep); --hydra-help is Hydra's help.",
)


if __name__ == "__main__":
    if asks_for_help(sys.argv[1:]):
        sys.stdout.write(usage(USAGE))
        sys.exit(0)
    check_command_line(sys.argv[1:])
    main()
