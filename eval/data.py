"""Benchmark files as the data preparation writes them: verl parquet `<data_dir>/<benchmark>/test.parquet`.

Columns: data_source, prompt (chat messages), ability, reward_model {"ground_truth": str | list[str] | code tests},
extra_info {"index", "id", ...; WildBench adds "checklist", "primary_tag", "secondary_tags", "session_id",
"conversation"}. A malformed file is an error that names the benchmark, the row and what is wrong.

A protocol may also name a benchmark file of its own (`files:` in conf/eval/protocol/<name>.yaml), e.g. the smoke
run's held-out prompts shipped in the package: TRL prompt rows (`.jsonl`: prompt, ground_truth, data_source,
extra_info, as sarl/smoke/make_data.py writes them), read as the same rows with `ground_truth` under `reward_model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.cache import stable_hash
from sarl.checking.code.sandbox import gold_tests_problem
from sarl.checking.grading.gold import gold_answers
from sarl.runtime.errors import UserError
from sarl.runtime.files import read_jsonl, resolve_path

KINDS = ("math", "wildbench", "code")


@dataclass
class Problem:
    """One benchmark item: the chat messages to answer, the accepted answers (math) or the tests (code:
    `{"tests", "prelude", "stdin"}`, sarl.data.code_tests) and the row's extras."""

    benchmark: str
    id: str
    index: int
    messages: list[dict[str, str]]
    gold: list[str] | dict[str, Any] | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_hash(self) -> str:
        """Identifies the prompt (and gold) in the cache: a changed problem does not reuse old samples."""
        return stable_hash({"messages": self.messages, "gold": self.gold})


def benchmark_path(data_dir: str | Path, benchmark: str, file: str | None = None) -> Path:
    """The benchmark's file: `file` when its protocol names one (a path, or `pkg://package/path` for a file shipped
    in a package), else the data preparation's `<data_dir>/<benchmark>/test.parquet`."""
    if file:
        return resolve_path(file)
    return Path(data_dir) / benchmark / "test.parquet"


def _read_rows(path: Path, benchmark: str) -> list[dict[str, Any]]:
    """The rows of a benchmark file in verl's layout: a parquet file as it is; TRL prompt rows (`.jsonl`) with
    their `ground_truth` as `reward_model.ground_truth`, so that one loader checks both."""
    if path.suffix == ".jsonl":
        rows = read_jsonl(path, f"benchmark {benchmark!r}")
        for n, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ValueError(f"benchmark {benchmark!r} ({path}), row {n}: not a JSON object")
            if "reward_model" not in row:
                row["reward_model"] = {"ground_truth": row.pop("ground_truth", None)}
            row.setdefault("extra_info", {})
        return rows
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = {"prompt", "reward_model", "extra_info"} - set(table.column_names)
    if missing:
        raise ValueError(f"benchmark {benchmark!r} ({path}) lacks the columns {sorted(missing)}")
    return table.to_pylist()


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: prompt is not a non-empty list of chat messages")
    out = []
    for n, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: prompt message {n} is not a {{'role': str, 'content': str}} message")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def load_benchmark(path: str | Path, benchmark: str, kind: str, limit: int | None = None) -> list[Problem]:
    """The problems of one benchmark file (verl parquet, or TRL prompt rows `.jsonl`); `limit` keeps the first N
    rows (quick checks)."""
    if kind not in KINDS:
        raise ValueError(f"benchmark kind {kind!r} not known; choose one of: {', '.join(KINDS)}")
    path = Path(path)
    if not path.exists():
        raise UserError(
            f"benchmark {benchmark!r}: {path} does not exist; prepare it first "
            f"(python -m sarl.data.prepare dataset={benchmark}) or set paths.data_dir"
        )
    rows = _read_rows(path, benchmark)
    if limit is not None:
        rows = rows[: int(limit)]
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for n, row in enumerate(rows):
        where = f"benchmark {benchmark!r} ({path}), row {n}"
        info = dict(row.get("extra_info") or {})
        pid = info.get("id")
        pid = str(pid) if pid not in (None, "") else str(info.get("index", n))
        if pid in seen:
            raise ValueError(f"{where}: problem id {pid!r} repeats row {seen[pid]}; ids must be unique")
        seen[pid] = n
        gold = None
        if kind == "math":
            truth = (row.get("reward_model") or {}).get("ground_truth")
            try:
                gold = gold_answers(truth)
            except ValueError as err:
                raise ValueError(f"{where} (id {pid!r}): {err}") from err
        elif kind == "code":
            gold = (row.get("reward_model") or {}).get("ground_truth")
            problem = gold_tests_problem(gold.get("tests")) if isinstance(gold, dict) else "not a dict with tests"
            if problem:
                raise ValueError(f"{where} (id {pid!r}): the ground truth is not code tests: {problem}")
        else:
            for key in ("primary_tag", "secondary_tags", "checklist"):
                if key not in info:
                    raise ValueError(f"{where} (id {pid!r}): WildBench row lacks extra_info[{key!r}]")
        problems.append(
            Problem(
                benchmark=benchmark,
                id=pid,
                index=int(info.get("index", n)),
                messages=_messages(row.get("prompt"), where),
                gold=gold,
                extra_info=info,
            )
        )
    if not problems:
        raise ValueError(f"benchmark {benchmark!r} ({path}) has no rows")
    return problems
