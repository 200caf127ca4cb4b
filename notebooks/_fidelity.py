"""docs/fidelity.md from the paper rows' configs: per paper row (`conf/exp/*_paper.yaml`, and every other conf/exp/ row
that names a paper table, a non-empty `paper.tables`: SARL's own rows), each hyper-parameter with its value (the row
composed by Hydra, as `sarl.train` composes it) and where the paper gives it, and each deviation with the paper's
value and the reason.

Where each setting comes from is said once, in the row's own `paper.fidelity` block, beside the settings it names
(no value is repeated there: the values are read from the composed config):

    paper:
      fidelity:
        source: Structured Reasoning          # the paper (docs/references.md's short name) the locations refer to
        settings:                             # key -> the paper's location of the value the row uses
          train.rollout_n: App. A.4.4
          sft:train.actor_lr: App. A.4.4      # STAGE:key, a key of one stage of the row's pipeline
        deviations:                           # key -> what the paper says, and why the row differs (or chooses)
          train.save_freq: {paper: "fixed intervals, not given (App. A.4.4)", reason: "50 steps: ours"}

A key is a dotted config key, or a config group (`model`, `algorithm`, `reward`, `data`, `embedding`: its chosen
option), optionally prefixed by a pipeline stage. Rows that extend another row (`defaults: [lcs_paper, ...]`) inherit
its block through Hydra's merge and add or replace entries. Settings several rows share can live in one file of
conf/fidelity/ (`# @package paper.fidelity`), which a row adds to its defaults (`- /fidelity: sarl_grpo`) and Hydra
merges into its block like a parent row's: SARL's rows take conf/fidelity/sarl_ppo.yaml (Table 6) or sarl_grpo.yaml
(Table 7), both on sarl.yaml's shared settings, whose locations name the table (`table`, set by the file) and the
row's column (`column: Math` or `Open-Ended`, set in the row's own block) by interpolation. The page shows every
entry of the merged block. An entry of the row's own block (setting or deviation) wins over an inherited one of the
same key (a parent row's or a conf/fidelity/ file's): Hydra's merge can leave a key in both `settings` and
`deviations`, and the row's own block says which it is; otherwise a deviation replaces a setting of the same key.
An inherited key of a stage the row does not run is left out. Checked (`problems`, tests/sarl/test_fidelity.py):
every setting names a location (a section, appendix, table, equation or figure), every deviation has the paper's
value and a reason, every key of the row's own block resolves in the composed row (an inherited one that does not,
e.g. a key of a reward the row replaces, is left out), and every key the row file itself sets is listed in its own
block, so that a row that changes a setting says where its new value comes from.

    python notebooks/fidelity.py            # rewrites docs/fidelity.md
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

ROOT = Path(__file__).resolve().parents[1]
EXP_DIR = ROOT / "conf" / "exp"
DOC = ROOT / "docs" / "fidelity.md"
GROUPS = ("model", "algorithm", "reward", "data", "embedding", "embedding_server", "backend")
SECTIONS = ("train", "backend", "reward", "data", "model", "algorithm", "embedding", "embedding_server")
LOCATION = re.compile(r"\b(Sec\.|App\.|Table|Eq\.|Fig\.)")
_UNSET = object()


@dataclass(frozen=True)
class Entry:
    key: str
    value: str
    where: str = ""  # the paper's location (a setting)
    paper: str = ""  # the paper's value (a deviation)
    reason: str = ""

    @property
    def deviation(self) -> bool:
        return bool(self.paper or self.reason)


def _raw(row: str, exp_dir: Path = EXP_DIR) -> dict[str, Any]:
    return yaml.safe_load((Path(exp_dir) / f"{row}.yaml").read_text(encoding="utf-8")) or {}


def paper_rows(exp_dir: Path = EXP_DIR) -> list[str]:
    """The rows on the page: every `*_paper` row, and every other row whose file names a paper table."""
    rows = sorted(p.stem for p in Path(exp_dir).glob("*.yaml"))
    return [r for r in rows if r.endswith("_paper") or ((_raw(r, exp_dir).get("paper") or {}).get("tables"))]


def parent(row: str, exp_dir: Path = EXP_DIR) -> str | None:
    """The row this row extends (a plain `defaults` entry naming another conf/exp/ file), or None."""
    for entry in _raw(row, exp_dir).get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_" and (Path(exp_dir) / f"{entry}.yaml").is_file():
            return entry
    return None


def _leaves(prefix: str, value: Any) -> list[str]:
    if isinstance(value, dict) and value:
        return [k for key, v in value.items() for k in _leaves(f"{prefix}.{key}", v)]
    return [prefix]


def own_keys(row: str, exp_dir: Path = EXP_DIR) -> list[str]:
    """The keys the row file itself sets: its group overrides, its sections' leaves, its stages' overrides, and
    `pipeline` where it switches the parent's pipeline off."""
    raw = _raw(row, exp_dir)
    keys = []
    for entry in raw.get("defaults") or []:
        if isinstance(entry, dict):
            keys += [k.split("/")[-1] for k in entry if k.startswith("override /")]
    for section in SECTIONS:
        if isinstance(raw.get(section), dict):
            keys += _leaves(section, raw[section])
    if "pipeline" in raw and raw["pipeline"] is None:
        keys.append("pipeline")
    for stage in raw.get("pipeline") or []:
        for override in stage.get("overrides") or []:
            keys.append(f"{stage['name']}:{override.split('=', 1)[0].lstrip('+~')}")
    return keys


def _covered(key: str, listed: set[str]) -> bool:
    """A key is listed by itself, by a key above it (`reward.weights` lists `reward.weights.R_fmt`) or, for a group,
    by a key in it (`model.path` lists the group `model`)."""
    stage, _, bare = key.rpartition(":")
    pre = f"{stage}:" if stage else ""
    parts = bare.split(".")
    if any(pre + ".".join(parts[:i]) in listed for i in range(1, len(parts) + 1)):
        return True
    return any(k.startswith(f"{pre}{bare}.") for k in listed)


@functools.cache
def compose(row: str, stage: str | None = None) -> tuple[DictConfig, dict[str, Any]]:
    """The row as `sarl.train` composes it; with `stage`, that stage of its pipeline (sarl.launch.pipeline). Cached:
    the page and the checks read the same compositions, and nothing here changes them."""
    from sarl.launch.compose import compose_train_config
    from sarl.launch.pipeline import stages_of

    top = compose_train_config([f"+exp={row}"])
    if stage is None:
        return top
    (spec,) = [s for s in stages_of(top[0]) if s["name"] == stage]
    return compose_train_config([f"+exp={row}", *spec["overrides"], "pipeline=null"])


def _format(value: Any) -> str:
    if isinstance(value, DictConfig) or OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return ", ".join(f"{k} {_format(v)}" for k, v in value.items())
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.1f}" if value.is_integer() else f"{value:.4g}"
    if isinstance(value, list):
        return json.dumps(value)
    return "null" if value is None else str(value)


def _value(cfg: DictConfig, choices: dict[str, Any], key: str) -> Any:
    if key in GROUPS and key in choices:
        return choices[key]
    if key == "pipeline":
        raw = cfg.get("pipeline")
        return None if raw is None else " -> ".join(str(s.name) for s in raw)
    return OmegaConf.select(cfg, key, default=_UNSET)


def row_entries(row: str, exp_dir: Path = EXP_DIR) -> tuple[str, list[Entry], list[str]]:
    """(the paper, the row's entries in the block's order, what is wrong with the row's block)."""
    cfg, choices = compose(row)
    where = f"conf/exp/{row}.yaml paper.fidelity"
    try:
        block = OmegaConf.to_container(cfg.paper.get("fidelity") or {}, resolve=True)
    except OmegaConfBaseException as err:  # an interpolation of a conf/fidelity/ file the row does not feed (`column`)
        return "", [], [f"{where}: does not resolve: {err}".splitlines()[0]]
    problems = []
    source = str(block.get("source") or "").strip()
    if not source:
        problems.append(f"{where}: no `source` (the paper the locations refer to)")
    settings = block.get("settings") or {}
    deviations = block.get("deviations") or {}
    stages = {s.name for s in cfg.get("pipeline") or []}
    composed: dict[str | None, tuple[DictConfig, dict[str, Any]]] = {None: (cfg, choices)}
    own_block = (_raw(row, exp_dir).get("paper") or {}).get("fidelity") or {}
    own_settings, own_deviations = set(own_block.get("settings") or {}), set(own_block.get("deviations") or {})
    own = own_settings | own_deviations

    def deviation(key: str) -> bool:  # the row's own block decides; else a deviation replaces a setting
        return key in own_deviations or (key in deviations and key not in own_settings)

    entries = []
    for key in [*[k for k in settings if not deviation(k)], *[k for k in deviations if deviation(k)]]:
        stage, _, bare = key.rpartition(":")
        if stage and stage not in stages:
            continue  # inherited from a row whose stage this row does not run
        if (stage or None) not in composed:
            composed[stage] = compose(row, stage)
        value = _value(*composed[stage or None], bare)
        if value is _UNSET:
            if key in own:
                problems.append(f"{where}: {key} is no key of the composed row; fix its name or remove it")
            continue  # inherited from a row whose group had it (a reward this row replaces)
        if deviation(key):
            d = deviations[key] if isinstance(deviations[key], dict) else {}
            paper, reason = str(d.get("paper") or "").strip(), str(d.get("reason") or "").strip()
            if not paper or not reason:
                problems.append(f"{where}.deviations: {key} needs both `paper` (the paper's value) and `reason`")
            entries.append(Entry(key, _format(value), paper=paper, reason=reason))
        else:
            location = str(settings[key] or "").strip()
            if not LOCATION.search(location):
                problems.append(
                    f"{where}.settings: {key}={location!r} names no section, appendix, table, equation or figure"
                )
            entries.append(Entry(key, _format(value), where=location))
    for key in own_keys(row, exp_dir):
        if not _covered(key, own):
            problems.append(f"{where}: {key} is set by the row but not in its own block; add its location or deviation")
    return source, entries, problems


def problems(exp_dir: Path = EXP_DIR) -> list[str]:
    return [p for row in paper_rows(exp_dir) for p in row_entries(row, exp_dir)[2]]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


HEADER = """# Fidelity of the paper rows

Generated by `python notebooks/fidelity.py` from each paper row (`conf/exp/*_paper.yaml` and every row naming a paper
table) composed as `sarl.train` composes it, and its `paper.fidelity` block (with the shared settings of
`conf/fidelity/` it takes); `tests/sarl/test_fidelity.py` fails when this page is stale, a setting names no location
in its paper or a deviation no reason. Settings: the value and where the paper gives it. Deviations (marked
**≠**): the paper's value ("not stated" where it gives none) and why the row differs. `STAGE:key` is a key of that
stage of the row's pipeline; a row that extends another lists only what differs. Reasons: [decisions](decisions.md).
"""


def ordered_rows(exp_dir: Path = EXP_DIR) -> list[str]:
    """The paper rows, each row that extends another right after the rows it extends."""
    rows = paper_rows(exp_dir)
    parents = {r: parent(r, exp_dir) for r in rows}
    out: list[str] = []

    def add(row: str) -> None:
        out.append(row)
        for child in rows:
            if parents[child] == row:
                add(child)

    for row in rows:
        if parents[row] not in rows:
            add(row)
    return out


ORDER = ("model", "algorithm", "reward", "data", "embedding", "train", "backend")


def _rank(entry: Entry) -> tuple[int, int, int]:
    """The page's order: the row's own stage first, the groups before their keys (a group's option before its own
    keys, whatever the merged block's order), then train and back-end keys."""
    stage, _, bare = entry.key.rpartition(":")
    head = bare.split(".")[0].removesuffix("_server")
    return (1 if stage else 0, ORDER.index(head) if head in ORDER else len(ORDER), 1 if "." in bare else 0)


def _base(
    row: str, source: str, entries: list[Entry], rendered: dict[str, tuple[str, dict[str, Entry]]], exp_dir: Path
) -> str | None:
    """The row the page compares `row` with: the row it extends, else the row of the same paper already on the page
    that shares the most entries with it, if it shares at least half of them."""
    base = parent(row, exp_dir)
    if base in rendered:
        return base
    shared = {
        other: sum(by_key.get(e.key) == e for e in entries)
        for other, (other_source, by_key) in rendered.items()
        if other_source == source
    }
    best = max(shared, key=lambda other: shared[other], default=None)
    return best if best is not None and 2 * shared[best] >= len(entries) else None


def render(exp_dir: Path = EXP_DIR) -> str:
    out = [HEADER]
    rendered: dict[str, tuple[str, dict[str, Entry]]] = {}
    for row in ordered_rows(exp_dir):
        source, entries, _ = row_entries(row, exp_dir)
        entries = sorted(entries, key=_rank)
        by_key = {e.key: e for e in entries}
        base = _base(row, source, entries, rendered, exp_dir)
        lines = [(e.key, e.value, f"**≠** {e.paper}; {e.reason}" if e.deviation else e.where) for e in entries]
        head = f"## `{row}` ({source})"
        if base is not None:
            before = rendered[base][1]
            lines = [line for e, line in zip(entries, lines) if before.get(e.key) != e]
            stages = {e.key.rpartition(":")[0] for e in entries}
            gone = {k.rpartition(":")[0] for k in before if k.rpartition(":")[0] not in stages}
            lines += [(f"{s}:…", "—", f"no `{s}` stage in this row") for s in sorted(gone)]
            lines += [
                (key, "—", f"no key of this row (`{base}`: {e.value})")
                for key, e in before.items()
                if key not in by_key and key.rpartition(":")[0] not in gone
            ]
            head += f": as `{base}`, except"
        rendered[row] = (source, by_key)
        out += ["", head, "", "| key | value | paper |", "|---|---|---|"]
        out += [f"| `{key}` | {_cell(value)} | {_cell(paper)} |" for key, value, paper in lines]
    return "\n".join(out) + "\n"
