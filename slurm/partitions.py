"""What the cluster says about its partitions (`sinfo`), for the resources a user leaves to it.

`launcher=slurm_h100` ties itself to no cluster: `launcher.partition: null` is the cluster's default partition (the
one `sinfo` marks with `*`), `launcher.time_min: null` that partition's time limit, and `launcher.mem_gb: null` each
node's whole memory (`--mem=0`: the job holds the node's GPUs, so it holds the node). `resolve` asks `sinfo` once at
submission; a name the cluster does not have, or a cluster without a default partition, is a one-line error naming
the key and the partitions there are.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from sarl.runtime.errors import UserError

UNLIMITED_TIME_MIN = 7 * 24 * 60  # a partition without a limit: submitit needs one; the run requeues after it
SINFO = ["sinfo", "--noheader", "--format=%P|%l"]


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    time_limit_min: int | None  # None: no limit (`infinite`)


def parse_time_limit(text: str) -> int | None:
    """Minutes of a SLURM time limit as sinfo prints it (`infinite`, `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`,
    `D-HH:MM`, `D-HH:MM:SS`; seconds round up); None for no limit. ValueError for anything else."""
    text = text.strip().lower()
    if text in ("infinite", "unlimited"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise ValueError(f"not a SLURM time limit: {text!r}")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
        total_s = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    elif c is not None:  # HH:MM:SS
        total_s = (int(a) * 60 + int(b)) * 60 + int(c)
    elif b is not None:  # MM:SS
        total_s = int(a) * 60 + int(b)
    else:  # MM
        total_s = int(a) * 60
    return -(-total_s // 60)


def parse_sinfo(text: str) -> list[Partition]:
    """The partitions of `sinfo --noheader --format=%P|%l` (one line per partition and node state: merged)."""
    seen: dict[str, Partition] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, limit = line.strip().partition("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        if name not in seen:
            seen[name] = Partition(name, default, parse_time_limit(limit))
    return list(seen.values())


def cluster_partitions(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[Partition]:
    """This cluster's partitions, from sinfo; a UserError saying what to set when sinfo cannot tell."""
    try:
        proc = run(SINFO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UserError(f"sinfo could not list the partitions ({err}): set launcher.partition and launcher.time_min")
    if proc.returncode != 0:
        raise UserError(
            f"sinfo failed ({proc.stderr.strip()[:200]}): set launcher.partition and launcher.time_min yourself"
        )
    return parse_sinfo(proc.stdout)


def resolve(s: Any, partitions: Sequence[Partition]) -> Any:
    """`s` (a slurm.launcher.SlurmSettings, which imports this module) with the partition and time limit the user
    left to the cluster filled in from `partitions`."""
    names = ", ".join(p.name + ("*" if p.default else "") for p in partitions) or "none"
    if s.partition:
        chosen = next((p for p in partitions if p.name == s.partition), None)
        if chosen is None:
            raise UserError(
                f"launcher.partition={s.partition}: this cluster has no such partition (sinfo: {names}); "
                "set launcher.partition (or SARL_SLURM_PARTITION) to one of them"
            )
    else:
        chosen = next((p for p in partitions if p.default), None)
        if chosen is None:
            raise UserError(
                f"launcher.partition is not set and this cluster has no default partition (sinfo: {names}); "
                "set launcher.partition (or SARL_SLURM_PARTITION)"
            )
    limit = chosen.time_limit_min
    if s.time_min and limit is not None and s.time_min > limit:
        raise UserError(
            f"launcher.time_min={s.time_min} is over partition {chosen.name}'s limit of {limit} minutes (the job would "
            f"wait for ever): set launcher.time_min to at most {limit}, or null (the run requeues and resumes)"
        )
    time_min = s.time_min or limit or UNLIMITED_TIME_MIN
    return replace(s, partition=chosen.name, time_min=time_min)
