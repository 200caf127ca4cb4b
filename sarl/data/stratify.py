"""A training set stratified by a model's per-problem success rate: GRP's RL math set (GRP App. E.2: "We sample
5,000 problems from the DeepScaleR dataset. Problems are attempted four times by Qwen3-8B and stratified by
difficulty based on success count. Problems failed in all attempts are discarded, followed by stratified sampling
with a ratio of 1:1:1.5:1.5").

    # 1. the pool as a benchmark, and Qwen3-8B's 4 attempts at each problem (problems.jsonl in the run directory)
    python -m sarl.data.prepare dataset=grp_math_pool
    python -m eval.run ckpt=Qwen/Qwen3-8B protocol=sarl benchmarks.math=[grp_math_pool] benchmarks.wildbench=[] \\
        sampling.n=4 structure.enabled=false
    # 2. the stratified set (builder `stratified`: the pool's problems, then the selection)
    python -m sarl.data.prepare dataset=grp_math_rl_5k stratify.rates=runs/eval/<run>/problems.jsonl
    # a look at the bins first (nothing written)
    python -m sarl.data.stratify runs/eval/<run>/problems.jsonl --n 5000

Success rates: one JSON object a line, either eval.run's problems.jsonl rows (`problem_id`, `n_correct`,
`n_samples`, `benchmark`: only the rows of `stratify.benchmark` are read) or `{"id", "success_rate"}`.

Bins (`stratify.bins`, in order): a problem falls in the first bin whose (`above`, `upto`] holds its success rate;
a rate in no bin (0: every attempt failed) is dropped. The GRP bins are the success counts 1, 2, 3 and 4 of 4
attempts, weighted 1:1:1.5:1.5 in that order (the paper lists the ratio without naming the bins' order: our
reading, docs/decisions.md §7.4). Each bin gets round(n * weight / sum of weights) problems (largest remainder, ties
to the earlier bin), drawn without replacement with a generator seeded by (`seed`, bin name); the set keeps the
pool's order. A bin with fewer problems than its share fails the build with one line naming it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from sarl.data.benchmark_sets import row_rng
from sarl.data.build import BUILDERS, Built, DataValidationError, Steps, build_math
from sarl.data.sources import DataSourceError

log = logging.getLogger(__name__)

# GRP App. E.2: success count 1, 2, 3, 4 of Qwen3-8B's 4 attempts, 1:1:1.5:1.5; all failed (0 of 4) dropped
GRP_BINS: tuple[dict[str, Any], ...] = (
    {"name": "1/4", "above": 0.0, "upto": 0.25, "weight": 1.0},
    {"name": "2/4", "above": 0.25, "upto": 0.5, "weight": 1.0},
    {"name": "3/4", "above": 0.5, "upto": 0.75, "weight": 1.5},
    {"name": "4/4", "above": 0.75, "upto": 1.0, "weight": 1.5},
)


@dataclass(frozen=True)
class Bin:
    name: str
    above: float  # exclusive
    upto: float  # inclusive
    weight: float

    def holds(self, rate: float) -> bool:
        return self.above < rate <= self.upto

    def describe(self) -> str:
        return f"{self.name} (success rate in ({self.above:g}, {self.upto:g}])"


def parse_bins(spec: Sequence[Mapping[str, Any]] | None) -> list[Bin]:
    """`stratify.bins` as Bins (GRP's when None); ValueError naming a malformed one."""
    bins = []
    for i, b in enumerate(spec or GRP_BINS):
        try:
            bins.append(Bin(str(b["name"]), float(b["above"]), float(b["upto"]), float(b["weight"])))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"stratify.bins[{i}] needs name, above, upto and weight ({err})") from err
        if not bins[-1].weight > 0 or not bins[-1].above < bins[-1].upto:
            raise ValueError(f"stratify.bins[{i}] ({bins[-1].name}): weight must be > 0 and above < upto")
    if len({b.name for b in bins}) != len(bins):
        raise ValueError("stratify.bins: bin names repeat")
    return bins


def allocate(n: int, weights: Sequence[float]) -> list[int]:
    """n split in proportion to `weights`, as integers summing to n (largest remainder; ties to the earlier)."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def read_success_rates(path: str | Path, benchmark: str | None = None) -> dict[str, float]:
    """Problem id -> success rate from a JSON-lines file (see the module docstring); DataSourceError naming the
    line when one is neither layout, repeats an id or has a rate outside [0, 1]."""
    path = Path(path)
    if not path.is_file():
        raise DataSourceError(f"success rates: {path} does not exist (stratify.rates: eval.run's problems.jsonl)")
    rates: dict[str, float] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"success rates {path} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataSourceError(f"{where} is not valid JSON: {err}") from err
        if benchmark is not None and "benchmark" in row and row["benchmark"] != benchmark:
            continue
        pid = row.get("problem_id", row.get("id"))
        if "success_rate" in row:
            rate = row["success_rate"]
        elif row.get("n_samples"):
            rate = row.get("n_correct")
            rate = None if rate is None else rate / row["n_samples"]
        else:
            rate = None
        if pid is None or not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 <= rate <= 1:
            raise DataSourceError(
                f"{where}: needs problem_id with n_correct and n_samples (eval.run's problems.jsonl) or id with "
                "success_rate in [0, 1]"
            )
        if str(pid) in rates:
            raise DataSourceError(f"{where}: problem {pid} has a success rate already; one line per problem")
        rates[str(pid)] = float(rate)
    if not rates:
        which = f" for benchmark {benchmark!r}" if benchmark else ""
        raise DataSourceError(f"success rates: {path} has no rows{which} (stratify.benchmark names the pool)")
    return rates


@dataclass
class Selection:
    """The chosen ids per bin (in pool order), the problems each bin had, the rates in no bin."""

    chosen: dict[str, list[str]]
    available: dict[str, int]
    wanted: dict[str, int]
    unbinned: int

    @property
    def ids(self) -> set[str]:
        return {i for ids in self.chosen.values() for i in ids}


def bin_problems(
    ids: Sequence[str], rates: Mapping[str, float], bins: Sequence[Bin]
) -> tuple[dict[str, list[str]], int]:
    """The ids (in the given order) of each bin, and how many rated ids fall in none (all failed)."""
    members: dict[str, list[str]] = {b.name: [] for b in bins}
    unbinned = 0
    for pid in ids:
        rate = rates[pid]
        home = next((b for b in bins if b.holds(rate)), None)
        if home is None:
            unbinned += 1
        else:
            members[home.name].append(pid)
    return members, unbinned


def select(ids: Sequence[str], rates: Mapping[str, float], n: int, bins: Sequence[Bin], seed: int) -> Selection:
    """`n` of the rated `ids` in the bins' proportions (module docstring); ValueError, one line, when a bin has
    too few problems."""
    members, unbinned = bin_problems(ids, rates, bins)
    wanted = dict(zip((b.name for b in bins), allocate(n, [b.weight for b in bins])))
    short = [b for b in bins if len(members[b.name]) < wanted[b.name]]
    if short:
        b = short[0]
        ratio = ":".join(f"{x.weight:g}" for x in bins)
        raise ValueError(
            f"bin {b.describe()} has {len(members[b.name])} problems, {wanted[b.name]} needed for n={n} in "
            f"proportions {ratio}; lower stratify.n or rate more problems"
        )
    chosen = {}
    for b in bins:
        picked = set(row_rng(seed, b.name).sample(members[b.name], wanted[b.name]))
        chosen[b.name] = [pid for pid in members[b.name] if pid in picked]
    return Selection(chosen, {k: len(v) for k, v in members.items()}, wanted, unbinned)


def build_stratified(cfg: Mapping[str, Any], rows: list[dict[str, Any]], steps: Steps, drop_invalid: bool) -> Built:
    """The pool's math problems (`build_math`, the config's source, fields and prompt), then `select` by the
    success rates of `stratify.rates`; extra_info gains `success_rate` and `stratum`."""
    name, split = cfg["name"], cfg["split"]
    st = cfg.get("stratify") or {}
    if not st.get("rates"):
        raise DataValidationError(
            f"dataset '{name}': stratify.rates is not set; pass stratify.rates=/path/to/problems.jsonl (eval.run's "
            f"per-problem file of the pool, conf/data/{name}.yaml says how to make it)"
        )
    try:
        bins = parse_bins(st.get("bins"))
        n, seed = int(st["n"]), int(st.get("seed") or 0)
    except (KeyError, TypeError, ValueError) as err:
        raise DataValidationError(f"dataset '{name}': stratify: {err}") from err
    rates = read_success_rates(st["rates"], st.get("benchmark"))
    built = build_math(cfg, rows, steps, drop_invalid)
    records = built.splits[split]
    by_id = {str(r["extra_info"]["id"]): r for r in records}
    unknown = sorted(set(rates) - set(by_id))
    if unknown:
        raise DataValidationError(
            f"dataset '{name}': {len(unknown)} problems of {st['rates']} are not in the pool (e.g. {unknown[:5]}): "
            "the rates come from another set, or stratify.benchmark is wrong"
        )
    rated = [pid for pid in by_id if pid in rates]
    steps("problems with a success rate", len(rated))
    members, unbinned = bin_problems(rated, rates, bins)
    steps("in a bin (all-failed dropped)", len(rated) - unbinned)
    try:
        selection = select(rated, rates, n, bins, seed)
    except ValueError as err:
        raise DataValidationError(f"dataset '{name}': {err}") from err
    stratum = {pid: b for b, ids in selection.chosen.items() for pid in ids}
    kept = []
    for rec in records:
        pid = str(rec["extra_info"]["id"])
        if pid in stratum:
            rec["extra_info"].update(success_rate=rates[pid], stratum=stratum[pid])
            kept.append(rec)
    steps(f"stratified sample ({':'.join(f'{b.weight:g}' for b in bins)}, seed {seed})", len(kept))
    notes = {
        **built.notes,
        "stratify": {
            "rates": str(Path(st["rates"]).resolve()),
            "benchmark": st.get("benchmark"),
            "n": n,
            "seed": seed,
            "bins": [
                {**b.__dict__, "available": selection.available[b.name], "chosen": selection.wanted[b.name]}
                for b in bins
            ],
            "in_no_bin": unbinned,
        },
    }
    return Built(splits={split: kept}, dropped=built.dropped, notes=notes)


BUILDERS["stratified"] = build_stratified


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sarl.data.stratify RATES [--benchmark B] [--n N] [--seed S]`: the bins of a success-rate file
    and whether n fits (GRP's bins; nothing written)."""
    parser = argparse.ArgumentParser(prog="python -m sarl.data.stratify", description=main.__doc__)
    parser.add_argument("rates", help="eval.run's problems.jsonl, or JSON lines {id, success_rate}")
    parser.add_argument("--benchmark", default=None, help="read only this benchmark's rows of problems.jsonl")
    parser.add_argument("--n", type=int, default=5000, help="problems to select (GRP App. E.2: 5000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    bins = parse_bins(None)
    try:
        rates = read_success_rates(args.rates, args.benchmark)
        members, unbinned = bin_problems(list(rates), rates, bins)
        wanted = dict(zip(members, allocate(args.n, [b.weight for b in bins])))
        print(f"{len(rates)} problems rated; {unbinned} in no bin (all attempts failed)")
        for b in bins:
            print(f"  {b.describe():40s} {len(members[b.name]):7d} available, {wanted[b.name]:6d} wanted")
        select(list(rates), rates, args.n, bins, args.seed)
    except (DataSourceError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"n={args.n} fits: python -m sarl.data.prepare dataset=grp_math_rl_5k stratify.rates={args.rates}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
