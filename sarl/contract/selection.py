"""Which rows of a voted group train (TTRL's "64 votes / 32 trained"; EVOL-RL's 64 / 32): a seeded random
`n_samples` of each group, the same whichever back end asks (`TTRLReward.training_rows`, the verl trainer)."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np


def _group_seed(seed: int, group_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{group_id}".encode("utf-8", "surrogatepass")).digest()[:8], "little")


def select_for_training(group_ids: Sequence[str], n_samples: int, seed: int) -> list[int]:
    """Sorted row indices of a seeded random `n_samples` rows of every group (TTRL "64 votes / 32 trained").

    The choice for a group depends only on (seed, group id) and the rank of its rows among that group's
    rows, not on where the group sits in the batch or which other groups are present. Pass a seed that
    changes per step (e.g. base seed + global step) if group ids repeat across steps.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    groups: dict[str, list[int]] = {}
    for i, gid in enumerate(group_ids):
        groups.setdefault(str(gid), []).append(i)
    short = {gid: len(rows) for gid, rows in groups.items() if len(rows) < n_samples}
    if short:
        raise ValueError(f"groups with fewer than n_samples={n_samples} rows (group id: rows): {short}")
    keep: list[int] = []
    for gid, rows in groups.items():
        picks = np.random.default_rng(_group_seed(seed, gid)).choice(len(rows), size=n_samples, replace=False)
        keep.extend(rows[j] for j in picks)
    return sorted(keep)
