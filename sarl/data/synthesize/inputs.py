"""What a synthesis run reads: the prompt templates of conf/synthesize/prompts/ (`Prompt`, `load_prompt`) and
the problems of a source of conf/synthesize/sources.yaml (`SourceProblem`, `load_problems`: local files only, no hub
access)."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from sarl.checking.grading.extract import extract_answer
from sarl.checking.grading.gold import gold_answers
from sarl.data.sources import DataSourceError, load_local_file
from sarl.data.synthesize.config import PROMPTS_DIR, SYNTH_DIR
from sarl.runtime.errors import UserError
from sarl.runtime.files import CONF_DIR

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


# ---------------------------------------------------------------------------------------------------------
# Prompt files
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """A prompt template from conf/synthesize/prompts/: its text without the leading `##` provenance lines,
    and the SHA-256 of that text (what the manifest and the cache key record)."""

    name: str
    text: str
    sha256: str

    def render(self, **values: str) -> str:
        """`{name}` placeholders replaced in one pass (a value is never searched again, so a question that
        contains "{trace}" stays as written); other braces (JSON, LaTeX) are kept."""
        missing = [m for m in dict.fromkeys(_PLACEHOLDER.findall(self.text)) if m in values and values[m] is None]
        if missing:
            raise ValueError(f"prompt {self.name}: no value for {missing}")
        return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), self.text)


def load_prompt(name: str, prompts_dir: Path = PROMPTS_DIR) -> Prompt:
    path = prompts_dir / name
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist; the recipe's prompts.* names a file of {prompts_dir}")
    lines = path.read_text(encoding="utf-8").split("\n")
    while lines and lines[0].startswith("##"):
        lines.pop(0)
    text = "\n".join(lines)
    text = text[:-1] if text.endswith("\n") else text  # the editor's final newline is not part of the prompt
    return Prompt(name, text, hashlib.sha256(text.encode("utf-8")).hexdigest())


# ---------------------------------------------------------------------------------------------------------
# Problems
# ---------------------------------------------------------------------------------------------------------


@dataclass
class SourceProblem:
    """One problem: its id, question, accepted gold answers (empty for code) and, for a recipe that reads
    traces from the data set, the data set's verified trace."""

    id: str
    question: str
    golds: list[str]
    trace: str | None = None


def _truthy(value: Any) -> bool:
    return (
        value is True
        or (isinstance(value, (int, float)) and value == 1)
        or str(value).strip().lower()
        in (
            "true",
            "1",
            "yes",
            "pass",
            "passed",
        )
    )


def _trace_text(value: Any) -> str | None:
    """A trace column: a string, or a conversation (list of {role|from, content|value}) -> its last
    non-user turn (KodCode-V1-SFT-R1's `conversations`)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, list):
        for turn in reversed(value):
            if isinstance(turn, Mapping):
                role = turn.get("role", turn.get("from"))
                text = turn.get("content", turn.get("value"))
                if role not in ("user", "human", "system") and isinstance(text, str) and text.strip():
                    return text.strip()
    return None


def load_problems(cfg: DictConfig) -> tuple[list[SourceProblem], dict[str, Any], Counter]:
    """The problems of `source` (the recipe's paper data when null), the source record for the manifest and
    the rows skipped, by reason."""
    sources = OmegaConf.to_container(OmegaConf.load(SYNTH_DIR / "sources.yaml"), resolve=True)
    name = cfg.source or cfg.recipe.source
    if name not in sources:
        raise UserError(
            f"source={name} is not known; choose one of: {', '.join(sources)} (conf/synthesize/sources.yaml)"
        )
    spec = sources[name]
    fields = {**(spec.get("fields") or {}), **OmegaConf.to_container(cfg.fields)}
    skipped: Counter = Counter()
    if spec["format"] == "prepared":
        if not cfg.dataset:
            raise UserError("source=prepared needs dataset=NAME (a set built by python -m sarl.data.prepare)")
        path = Path(cfg.paths.data_dir) / str(cfg.dataset) / f"{cfg.split}.trl.jsonl"
        if not path.is_file():
            raise UserError(
                f"dataset={cfg.dataset}: {path} does not exist; "
                f"build it: python -m sarl.data.prepare dataset={cfg.dataset}"
            )
        data_cfg = CONF_DIR / "data" / f"{cfg.dataset}.yaml"
        suffix = cfg.strip_suffix
        data_spec = OmegaConf.load(data_cfg) if data_cfg.is_file() else OmegaConf.create({})
        if data_spec.get("prompt_style") == "structured":
            raise UserError(
                f"dataset={cfg.dataset} holds tagged prompts (prompt_style: structured), not plain questions; "
                "use its plain counterpart (e.g. dataset=aime_1983_2024)"
            )
        if suffix is None:
            suffix = data_spec.get("prompt_suffix")
        try:
            loaded = load_local_file(str(cfg.dataset), path)
        except DataSourceError as err:
            raise UserError(str(err)) from err
        rows = []
        for r in loaded.rows:
            info = r.get("extra_info") or {}
            question = str(info.get("user_prompt", ""))
            if suffix and question.endswith(suffix):
                question = question[: -len(suffix)]
            rows.append(
                {"id": info.get("id", info.get("index")), "question": question, "answer": r.get("ground_truth")}
            )
        fields = {"id": "id", "question": "question", "answer": "answer"}
        record = {**loaded.record, "source": "prepared", "dataset": cfg.dataset, "stripped_suffix": suffix}
    else:
        if not cfg.input_file:
            raise UserError(
                f"source={name} reads a local copy of its data: pass input_file=/path/to/file "
                f"(.json, .jsonl, .parquet or .csv; {spec.get('about', 'see conf/synthesize/sources.yaml')})"
            )
        try:
            loaded = load_local_file(name, Path(str(cfg.input_file)))
        except DataSourceError as err:
            raise UserError(str(err)) from err
        rows, record = loaded.rows, {**loaded.record, "source": name}
    needs_trace = cfg.recipe.get("trace_source") == "dataset"
    needs_gold = cfg.recipe.task == "math"
    for key in ("question",) + (("trace",) if needs_trace else ()) + (("answer",) if needs_gold else ()):
        col = fields.get(key)
        if not col or (rows and col not in rows[0]):
            raise UserError(
                f"source={name}: fields.{key}={col} is not a column of the input "
                f"(columns: {', '.join(list(rows[0])[:20])}); "
                f"set fields.{key}=COLUMN"
            )
    problems: list[SourceProblem] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        rid = row.get(fields["id"]) if fields.get("id") else None
        pid = str(rid) if rid not in (None, "") else f"{name}-{i}"
        question = row.get(fields["question"])
        if not isinstance(question, str) or not question.strip():
            skipped["no_question"] += 1
            continue
        if pid in seen:
            skipped["duplicate_id"] += 1
            continue
        golds: list[str] = []
        if needs_gold:
            raw = row.get(fields["answer"])
            if spec.get("answer_from") == "boxed":
                raw = extract_answer(raw) if isinstance(raw, str) else None
            try:
                golds = gold_answers(raw) if raw is not None else []
            except ValueError:
                golds = []
            if not golds:
                skipped["no_gold_answer"] += 1
                continue
        trace = None
        if needs_trace:
            ok_col = fields.get("trace_ok")
            if ok_col and not _truthy(row.get(ok_col)):
                skipped["trace_not_verified"] += 1
                continue
            trace = _trace_text(row.get(fields["trace"]))
            if trace is None:
                skipped["no_trace"] += 1
                continue
        seen.add(pid)
        problems.append(SourceProblem(pid, question.strip(), golds, trace))
        if cfg.limit is not None and len(problems) >= int(cfg.limit):
            break
    if not problems:
        raise UserError(f"source={name}: no usable problem in the input (skipped: {dict(skipped)})")
    return problems, record, skipped
