"""Builders: source rows -> records in verl's parquet layout, every filter step counted.

A record (one parquet row; the TRL JSONL line is derived from it):

    {"data_source": NAME, "prompt": [{"role": "user", "content": ...}], "ability": "math" | "open",
     "reward_model": {"style": "rule", "ground_truth": [accepted answers]}      # math
                     {"style": "none", "ground_truth": ""},                      # open-ended
     "extra_info": {"index": source row position, "id": original id, "split": ...,
                    "user_prompt": the text of the last user message of "prompt", ...}}

`index` is the row's position in the source, so a problem keeps its index whatever the filters drop.
`user_prompt` is the prompt as the policy sees it (suffix or structured template included): verl's per-sample
reward function reads the prompt from extra_info only (`sarl.contract.reward.USER_PROMPT_KEY`).
A row that cannot be used (no question, a gold answer that does not parse, a WildBench row without its
checklist) is reported by id; the build fails unless `drop_invalid` is set, and then each dropped row is
listed in the manifest. Rows removed by a filter of the paper (length, duplicates) are counted, not listed.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from sarl.checking.grading.gold import validate_gold, validate_gold_rows
from sarl.contract.reward import USER_PROMPT_KEY
from sarl.data.answers import accepted_answers
from sarl.data.sources import DataSourceError
from sarl.formats.pairs import conversational_pairs, dpo_pairs_from_openrubrics
from sarl.formats.tags import randomized_prompt, structured_prompt

log = logging.getLogger(__name__)

RESERVED_EXTRA_KEYS = frozenset({"index", "id", "split", USER_PROMPT_KEY})
CHAT_ROLES = frozenset({"system", "user", "assistant"})


class DataValidationError(ValueError):
    """Rows or a config that make the build fail: unusable rows, duplicate ids, a wrong row count."""


@dataclass
class Built:
    """What a builder produced: records per split, DPO pairs (OpenRubrics), rows dropped as unusable and
    further facts for the manifest."""

    splits: dict[str, list[dict[str, Any]]]
    dpo: list[dict[str, Any]] | None = None
    dropped: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


class Steps:
    """Row counts after each step, logged as they happen and kept for the manifest."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.steps: list[dict[str, Any]] = []

    def __call__(self, step: str, rows: int) -> None:
        dropped = self.steps[-1]["rows"] - rows if self.steps else 0
        self.steps.append({"step": step, "rows": rows, "dropped": dropped})
        log.info("%s: %-58s %7d rows (%d dropped)", self.name, step, rows, dropped)


# ---------------------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------------------


def check_fields(name: str, rows: Sequence[Mapping[str, Any]], fields: Mapping[str, Any]) -> None:
    """Every column the `fields:` mapping names must exist in the source; the error lists the columns."""
    columns: set[str] = set()
    for row in rows:
        columns.update(row)
    wanted = {f"fields.{k}": v for k, v in fields.items() if k != "extra" and v is not None}
    wanted.update({f"fields.extra.{k}": v for k, v in (fields.get("extra") or {}).items()})
    missing = {key: col for key, col in wanted.items() if col not in columns}
    if missing:
        listing = ", ".join(f"{key}={col!r}" for key, col in missing.items())
        raise DataValidationError(
            f"dataset '{name}': the source has no column for {listing}; its columns are {sorted(columns)}. "
            f"Fix the field mapping in conf/data/{name}.yaml or override it (e.g. fields.question=...)"
        )
    clash = RESERVED_EXTRA_KEYS & set(fields.get("extra") or {})
    if clash:
        raise DataValidationError(f"dataset '{name}': fields.extra may not use the reserved keys {sorted(clash)}")


def row_ids(name: str, rows: Sequence[Mapping[str, Any]], id_field: str | None) -> list[str | None]:
    """The original id of each row as a string (its position in the source when `id_field` is null); None
    where the row has none. Duplicate ids fail the build: ids are how problems are reported and joined."""
    if id_field is None:
        return [str(i) for i in range(len(rows))]
    ids = [None if _blank(row.get(id_field)) else str(_plain(row.get(id_field))) for row in rows]
    repeated = sorted(k for k, n in Counter(i for i in ids if i is not None).items() if n > 1)
    if repeated:
        raise DataValidationError(
            f"dataset '{name}': ids in field {id_field!r} are not unique ({len(repeated)} repeated, e.g. "
            f"{repeated[:5]}); set fields.id=null to use the row position as the id"
        )
    return ids


def extras(row: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """The `fields.extra` columns of a row (key in extra_info -> source column); empty cells are None."""
    return {
        key: (None if _blank(row.get(col)) else _plain(row.get(col)))
        for key, col in (fields.get("extra") or {}).items()
    }


def problem(row_id: str | None, index: int, reason: str) -> dict[str, Any]:
    return {"id": row_id if row_id is not None else f"<row {index}>", "index": index, "reason": reason}


def settle(name: str, problems: list[dict[str, Any]], drop_invalid: bool) -> None:
    """Fail with every unusable row listed, or (drop_invalid) log them; they go into the manifest."""
    if not problems:
        return
    listing = "\n  ".join(f"{p['id']}: {p['reason']}" for p in problems)
    if not drop_invalid:
        raise DataValidationError(
            f"dataset '{name}': {len(problems)} rows are unusable (id: reason):\n  {listing}\n"
            "Fix the source, or pass drop_invalid=true to drop these rows (the manifest lists each of them)."
        )
    log.warning("%s: dropped %d unusable rows (drop_invalid=true):\n  %s", name, len(problems), listing)


def _blank(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _plain(value: Any) -> Any:
    """numpy scalars/arrays (from parquet or `datasets`) as Python values."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def record(
    name: str, split: str, ability: str, prompt: list[dict[str, str]], ground_truth: Any, info: dict[str, Any]
) -> dict[str, Any]:
    """One row of verl's parquet layout (see the module docstring)."""
    style = "rule" if ability == "math" else "none"
    user_prompt = next(m["content"] for m in reversed(prompt) if m["role"] == "user")  # what the response answers
    return {
        "data_source": name,
        "prompt": prompt,
        "ability": ability,
        "reward_model": {"style": style, "ground_truth": ground_truth},
        "extra_info": {
            "index": info["index"],
            "id": info["id"],
            "split": split,
            **info,
            USER_PROMPT_KEY: user_prompt,
        },
    }


def trl_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The TRL JSONL line of a record: prompt, ground_truth (None for open-ended sets), data_source, extra_info."""
    truth = rec["reward_model"]["ground_truth"] if rec["reward_model"]["style"] != "none" else None
    return {
        "prompt": rec["prompt"],
        "ground_truth": truth,
        "data_source": rec["data_source"],
        "extra_info": rec["extra_info"],
    }


# ---------------------------------------------------------------------------------------------------------
# Math problems: AIME 1983-2024 (training), AIME25, AMC23, MATH500, Minerva Math (evaluation)
# ---------------------------------------------------------------------------------------------------------


def unparseable_golds(candidates: list[dict[str, Any]]) -> dict[int, str]:
    """Row index -> reason for every candidate whose accepted answers math-verify cannot parse
    (`sarl.checking.grading.gold.validate_gold_rows`; on failure each row is checked alone to name the culprits)."""
    try:
        validate_gold_rows(candidates, id_key="id", answer_key="answers")
    except ValueError:
        bad = {}
        for c in candidates:
            try:
                validate_gold(c["answers"])
            except ValueError as err:
                bad[c["index"]] = str(err)
        return bad
    return {}


PROMPT_STYLES = ("plain", "structured", "structured_fixed")


def math_prompt(cfg: Mapping[str, Any]) -> Callable[[str, str], str]:
    """The user prompt of a math problem (question, row id) for `prompt_style`:
    - plain: question + `prompt_suffix` (SARL App. B.1);
    - structured: Structured Reasoning's tagged-step prompt (Structured Reasoning App. A.8) with its RL-time tag
      randomisation (App. A.4: the top 5 tags plus 0-5 random others, shuffled), drawn per row from
      (`prompt_seed`, row id), so every row gets its own tag set and a rebuild gives the same prompts;
    - structured_fixed: the same prompt with all 23 tags in the paper's order, as its "Mathematical Problem
      Solving Template" prints it (Structured Reasoning App. A.8): the evaluation sets of the structured
      experiments."""
    style = cfg.get("prompt_style") or "plain"
    if style == "plain":
        suffix = cfg.get("prompt_suffix") or ""
        return lambda question, rid: question + suffix
    if style == "structured":
        seed = int(cfg.get("prompt_seed") or 0)
        return lambda question, rid: randomized_prompt(question, seed=seed, key=rid)
    if style == "structured_fixed":
        return lambda question, rid: structured_prompt(question)
    raise DataValidationError(
        f"dataset '{cfg['name']}': prompt_style {style!r} is not one of {', '.join(PROMPT_STYLES)}"
    )


def build_math(cfg: Mapping[str, Any], rows: list[dict[str, Any]], steps: Steps, drop_invalid: bool) -> Built:
    """Math problems: prompt = question + `prompt_suffix` (SARL App. B.1: "Let's think step by step and output
    the final answer within \\boxed{}."), after a system turn `system_prompt` where one is set (EVOL-RL App. C.3:
    SimpleRL-Zoo's system prompt), ground truth = the normalised accepted answers, validated by
    math-verify through `sarl.checking.grading`. `answers.fixes` (id -> answer) replaces a source's gold written in a
    notation math-verify cannot read; each fix is recorded in the manifest."""
    name, split, fields = cfg["name"], cfg["split"], cfg["fields"]
    answers_cfg = cfg.get("answers") or {}
    several, remark = answers_cfg.get("several"), answers_cfg.get("remark")
    fixes = {str(k): v for k, v in (answers_cfg.get("fixes") or {}).items()}
    check_fields(name, rows, fields)
    ids = row_ids(name, rows, fields.get("id"))
    unknown = sorted(set(fixes) - set(ids))
    if unknown:
        raise DataValidationError(f"dataset '{name}': answers.fixes names ids that are not in the source: {unknown}")
    problems, candidates, fixed = [], [], {}
    for index, (row, rid) in enumerate(zip(rows, ids)):
        question = _text(row.get(fields["question"]))
        if rid is None:
            problems.append(problem(rid, index, f"no id in field {fields['id']!r}"))
        elif question is None:
            problems.append(problem(rid, index, f"no question in field {fields['question']!r}"))
        else:
            gold = row.get(fields["answer"])
            if rid in fixes:  # a gold written in a notation math cannot read, corrected in the config
                fixed[rid] = {"source": _plain(gold), "fixed": fixes[rid]}
                gold = fixes[rid]
            try:
                answers = accepted_answers(gold, several=several, remark=remark)
            except ValueError as err:
                problems.append(problem(rid, index, f"answer field {fields['answer']!r}: {err}"))
                continue
            candidates.append({"index": index, "id": rid, "question": question, "answers": answers, "row": row})
    steps("id, question and answer present", len(candidates))
    bad = unparseable_golds(candidates)
    problems += [problem(c["id"], c["index"], bad[c["index"]]) for c in candidates if c["index"] in bad]
    problems.sort(key=lambda p: p["index"])
    kept = [c for c in candidates if c["index"] not in bad]
    steps("gold answers parse (sarl.checking.grading, math-verify)", len(kept))
    settle(name, problems, drop_invalid)
    prompt_of = math_prompt(cfg)
    system = [{"role": "system", "content": cfg["system_prompt"]}] if cfg.get("system_prompt") else []
    records = [
        record(
            name,
            split,
            "math",
            [*system, {"role": "user", "content": prompt_of(c["question"].strip(), str(c["id"]))}],
            c["answers"],
            {"index": c["index"], "id": c["id"], **extras(c["row"], fields)},
        )
        for c in kept
    ]
    several_answers = {c["id"]: c["answers"] for c in kept if len(c["answers"]) > 1}
    notes: dict[str, Any] = {"rows_with_several_accepted_answers": several_answers} if several_answers else {}
    if fixed:
        notes["gold_fixes"] = fixed
    return Built(splits={split: records}, dropped=problems, notes=notes)


# ---------------------------------------------------------------------------------------------------------
# OpenRubrics-v2 prompts (SARL App. B.1) and their DPO pairs
# ---------------------------------------------------------------------------------------------------------


def instruction_key(text: str) -> str:
    """SHA-256 of the normalised instruction (Unicode NFKC, case-folded, runs of whitespace as one space,
    stripped): instructions that differ only in case or spacing are duplicates."""
    normalised = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()


def token_counter(tokenizer: str) -> Callable[[list[str]], list[int]]:
    """Tokens per text, without special tokens: a Hugging Face tokenizer (hub id or local directory), or
    "whitespace" (words split on whitespace; for tests and quick looks, not the paper's filter)."""
    if tokenizer == "whitespace":
        return lambda texts: [len(t.split()) for t in texts]
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(tokenizer)
    except Exception as err:
        raise DataSourceError(
            f"tokenizer {tokenizer!r} (filters.tokenizer) cannot be loaded ({type(err).__name__}: {err}); "
            "download it where there is network, or point filters.tokenizer at a local tokenizer directory"
        ) from err
    tok.model_max_length = int(1e30)  # counting only: no "sequence longer than the model" warnings

    def count(texts: list[str]) -> list[int]:
        from tqdm import tqdm

        out: list[int] = []
        for start in tqdm(range(0, len(texts), 1024), desc="tokenising", unit="batch", disable=len(texts) <= 4096):
            enc = tok(texts[start : start + 1024], add_special_tokens=False, return_attention_mask=False)
            out.extend(len(ids) for ids in enc["input_ids"])
        return out

    return count


def build_openrubrics(cfg: Mapping[str, Any], rows: list[dict[str, Any]], steps: Steps, drop_invalid: bool) -> Built:
    """SARL App. B.1: the `instruction` alone is the prompt; keep rows whose two reference responses both have
    at least `filters.min_response_tokens` tokens (a missing response counts as 0 tokens), then drop
    duplicate instructions (first occurrence kept; `instruction_key`). Also: a `val` split sampled from the
    kept prompts, and DPO pairs from the kept rows (`sarl.formats.pairs`)."""
    name, split, fields, flt = cfg["name"], cfg["split"], cfg["fields"], cfg["filters"]
    check_fields(name, rows, fields)
    ids = row_ids(name, rows, fields.get("id"))
    problems, candidates = [], []
    for index, (row, rid) in enumerate(zip(rows, ids)):
        if rid is None:
            problems.append(problem(rid, index, f"no id in field {fields['id']!r}"))
        elif _text(row.get(fields["instruction"])) is None:
            problems.append(problem(rid, index, f"no instruction in field {fields['instruction']!r}"))
        else:
            candidates.append(index)
    steps("id and instruction present", len(candidates))
    settle(name, problems, drop_invalid)

    # SARL App. B.1, first filter: both reference responses longer than the threshold
    min_tokens, tokenizer = int(flt["min_response_tokens"]), str(flt["tokenizer"])
    count = token_counter(tokenizer)
    responses = {k: [_text(rows[i].get(fields[k])) or "" for i in candidates] for k in ("response_a", "response_b")}
    len_a, len_b = count(responses["response_a"]), count(responses["response_b"])
    kept = [i for i, a, b in zip(candidates, len_a, len_b) if a >= min_tokens and b >= min_tokens]
    steps(f"both responses >= {min_tokens} tokens ({tokenizer})", len(kept))

    # SARL App. B.1, second filter: deduplicate instructions
    if flt.get("dedupe", True):
        seen: set[str] = set()
        unique = []
        for i in kept:
            key = instruction_key(rows[i][fields["instruction"]])
            if key not in seen:
                seen.add(key)
                unique.append(i)
        kept = unique
        steps("duplicate instructions dropped (hash of normalised text)", len(kept))

    def open_record(i: int, split_name: str) -> dict[str, Any]:
        prompt = [{"role": "user", "content": rows[i][fields["instruction"]].strip()}]
        return record(name, split_name, "open", prompt, "", {"index": i, "id": ids[i], **extras(rows[i], fields)})

    splits = {split: [open_record(i, split) for i in kept]}
    notes: dict[str, Any] = {}
    val = cfg.get("val") or {}
    if val.get("size"):
        size = min(int(val["size"]), len(kept))
        picked = sorted(random.Random(int(val.get("seed", 0))).sample(kept, size))
        splits["val"] = [open_record(i, "val") for i in picked]
        notes["val"] = {"rows": size, "seed": int(val.get("seed", 0)), "drawn_from": split, "held_out": False}

    pairs = dpo_pairs_from_openrubrics(
        {
            "instruction": rows[i][fields["instruction"]].strip(),
            "response_a": rows[i].get(fields["response_a"]),
            "response_b": rows[i].get(fields["response_b"]),
            "winner": rows[i].get(fields["winner"]),
        }
        for i in kept
    )
    log.info("%s: %d DPO pairs from %d prompts; skipped %s", name, len(pairs), len(kept), dict(pairs.skipped))
    notes["dpo"] = {"pairs": len(pairs), "from_rows": len(kept), "skipped": dict(pairs.skipped)}
    notes["token_filter"] = {"tokenizer": tokenizer, "min_response_tokens": min_tokens}
    return Built(splits=splits, dpo=conversational_pairs(pairs), dropped=problems, notes=notes)


# ---------------------------------------------------------------------------------------------------------
# WildBench v2 (evaluation, open-ended)
# ---------------------------------------------------------------------------------------------------------


def chat_messages(conversation: Any) -> list[dict[str, str]]:
    """A conversation as chat messages {"role", "content"} (other keys dropped); ValueError unless it is a
    non-empty list of messages with known roles and text, ending with a user turn."""
    conversation = _plain(conversation)
    if not isinstance(conversation, list) or not conversation:
        raise ValueError("conversation is not a non-empty list of messages")
    messages = []
    for n, m in enumerate(conversation):
        if not isinstance(m, Mapping) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"message {n} is not a {{role, content}} message with a role in {sorted(CHAT_ROLES)}")
        messages.append({"role": m["role"], "content": m["content"]})
    if messages[-1]["role"] != "user":
        raise ValueError("the conversation does not end with a user turn")
    return messages


def build_wildbench(cfg: Mapping[str, Any], rows: list[dict[str, Any]], steps: Steps, drop_invalid: bool) -> Built:
    """WildBench: the prompt is the whole multi-turn input; extra_info keeps the checklist, the primary and
    secondary tags, the session id and the conversation (what the judge template needs)."""
    name, split, fields = cfg["name"], cfg["split"], cfg["fields"]
    check_fields(name, rows, fields)
    ids = row_ids(name, rows, fields.get("id"))
    problems, records = [], []
    for index, (row, rid) in enumerate(zip(rows, ids)):
        try:
            if rid is None:
                raise ValueError(f"no id in field {fields['id']!r}")
            messages = chat_messages(row.get(fields["conversation"]))
            checklist = _plain(row.get(fields["checklist"]))
            if not isinstance(checklist, list) or not checklist or not all(_text(c) for c in checklist):
                raise ValueError(f"no checklist (a non-empty list of text) in field {fields['checklist']!r}")
            primary = _text(row.get(fields["primary_tag"]))
            if primary is None:
                raise ValueError(f"no primary tag in field {fields['primary_tag']!r}")
            secondary = _plain(row.get(fields["secondary_tags"])) or []
            if not isinstance(secondary, list) or not all(isinstance(t, str) for t in secondary):
                raise ValueError(f"secondary tags in field {fields['secondary_tags']!r} are not a list of text")
            session = _text(row.get(fields["session_id"]))
            if session is None:
                raise ValueError(f"no session id in field {fields['session_id']!r}")
        except ValueError as err:
            problems.append(problem(rid, index, str(err)))
            continue
        info = {
            "index": index,
            "id": rid,
            "checklist": list(checklist),
            "primary_tag": primary,
            "secondary_tags": list(secondary),
            "session_id": session,
            "conversation": messages,
            **extras(row, fields),
        }
        records.append(record(name, split, "open", messages, "", info))
    steps("conversation, checklist, tags and session id present", len(records))
    settle(name, problems, drop_invalid)
    return Built(splits={split: records}, dropped=problems)


# ---------------------------------------------------------------------------------------------------------
# Problems with a reference that is not a math-verify answer: S1K (reference solution, the source of
# Structured Reasoning's SFT traces), KodCode-Light-RL-10K (unit tests, GRP App. E.2)
# ---------------------------------------------------------------------------------------------------------


def build_problems(cfg: Mapping[str, Any], rows: list[dict[str, Any]], steps: Steps, drop_invalid: bool) -> Built:
    """prompt = question + `prompt_suffix`; `reward_model` = {"style": `reference_style`, "ground_truth": the
    `fields.answer` column as text} (a reference solution or unit tests, kept verbatim, not parsed as a math
    answer); `ability` from the config. A row without id, question or reference is unusable (settle)."""
    name, split, fields = cfg["name"], cfg["split"], cfg["fields"]
    ability, style = str(cfg.get("ability") or "math"), str(cfg.get("reference_style") or "reference")
    suffix = cfg.get("prompt_suffix") or ""
    check_fields(name, rows, fields)
    ids = row_ids(name, rows, fields.get("id"))
    problems, records = [], []
    for index, (row, rid) in enumerate(zip(rows, ids)):
        question, reference = _text(row.get(fields["question"])), _text(_plain(row.get(fields["answer"])))
        if rid is None:
            problems.append(problem(rid, index, f"no id in field {fields['id']!r}"))
        elif question is None:
            problems.append(problem(rid, index, f"no question in field {fields['question']!r}"))
        elif reference is None:
            problems.append(problem(rid, index, f"no reference in field {fields['answer']!r}"))
        else:
            prompt = [{"role": "user", "content": question.strip() + suffix}]
            info = {"index": index, "id": rid, **extras(row, fields)}
            rec = record(name, split, ability, prompt, reference, info)
            rec["reward_model"]["style"] = style
            records.append(rec)
    steps("id, question and reference present", len(records))
    settle(name, problems, drop_invalid)
    return Built(splits={split: records}, dropped=problems)


BUILDERS: dict[str, Callable[[Mapping[str, Any], list[dict[str, Any]], Steps, bool], Built]] = {
    "problems": build_problems,
    "math": build_math,
    "openrubrics": build_openrubrics,
    "wildbench": build_wildbench,
}
