"""DPO preference pairs from OpenRubrics-v2 rows (SARL Table 3 "DPO"; decisions §2.5 "DPO").

Each row has `instruction`, `response_a`, `response_b` and `winner`; a pair is
{"prompt": instruction, "chosen": winning response, "rejected": the other}. Loading the data set and the
prompt filter of SARL App. B.1 belong to the data pipeline (`sarl.data`); this is the pure row -> pair step, and
`conversational_pairs` turns pairs into TRL's conversational preference format.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Iterable, Mapping

log = logging.getLogger(__name__)

# `winner` encodings seen in pairwise-preference data sets, compared after strip().lower().
WINNER_A = frozenset({"a", "response_a", "response a", "model_a", "model a", "[[a]]", "(a)"})
WINNER_B = frozenset({"b", "response_b", "response b", "model_b", "model b", "[[b]]", "(b)"})
TIES = frozenset({"tie", "tie (bothbad)", "tie(bothbad)", "both_bad", "both bad", "draw", "equal", "neither"})


class PreferencePairs(list):
    """The pairs (a plain list of dicts) plus `skipped`: rows left out, counted by reason."""

    def __init__(self, pairs: Iterable[dict[str, str]] = (), skipped: Counter[str] | None = None) -> None:
        super().__init__(pairs)
        self.skipped: Counter[str] = skipped if skipped is not None else Counter()


def dpo_pairs_from_openrubrics(rows: Iterable[Mapping[str, Any]]) -> PreferencePairs:
    """{"prompt", "chosen", "rejected"} per row whose `winner` names response A or B.

    `winner` is read case-insensitively: "A", "response_a", "model_a", "[[A]]", ... (see WINNER_A/WINNER_B).
    Rows are skipped, counted in `.skipped` and logged: "tie" (tie encodings in TIES), "unknown winner"
    (anything else, numbers included: 0/1 could be an index or a label), "missing field" (instruction or
    a response absent, not a string or blank), "identical responses" (chosen == rejected teaches nothing).
    """
    pairs = PreferencePairs()
    unknown: Counter[str] = Counter()
    for row in rows:
        prompt, a, b = row.get("instruction"), row.get("response_a"), row.get("response_b")
        if not all(isinstance(x, str) and x.strip() for x in (prompt, a, b)):
            pairs.skipped["missing field"] += 1
            continue
        winner = row.get("winner")
        key = winner.strip().lower() if isinstance(winner, str) else None
        if key in WINNER_A:
            chosen, rejected = a, b
        elif key in WINNER_B:
            chosen, rejected = b, a
        elif key in TIES:
            pairs.skipped["tie"] += 1
            continue
        else:
            pairs.skipped["unknown winner"] += 1
            unknown[repr(winner)] += 1
            continue
        if chosen.strip() == rejected.strip():
            pairs.skipped["identical responses"] += 1
            continue
        pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    if pairs.skipped:
        log.info("DPO pairs: kept %d, skipped %s", len(pairs), dict(pairs.skipped))
    if unknown:
        log.warning("DPO pairs: unknown winner values (value: rows): %s", dict(unknown.most_common(10)))
    return pairs


def conversational_pairs(pairs: Iterable[Mapping[str, str]]) -> list[dict[str, list[dict[str, str]]]]:
    """Pairs in TRL's conversational preference format: {"prompt": [user message], "chosen": [assistant
    message], "rejected": [assistant message]} (what `DPOTrainer` reads with the model's chat template)."""
    return [
        {
            "prompt": [{"role": "user", "content": p["prompt"]}],
            "chosen": [{"role": "assistant", "content": p["chosen"]}],
            "rejected": [{"role": "assistant", "content": p["rejected"]}],
        }
        for p in pairs
    ]
