"""Build a training set or an evaluation benchmark into the formats the back ends read.

    python -m sarl.data.prepare dataset=aime_1983_2024 source.local_file=AIME_Dataset_1983_2024.csv
    python -m sarl.data.prepare dataset=openrubrics_v2
    python -m sarl.data.prepare -m dataset=aime25,amc23,math500,minerva_math,wildbench_v2
    python -m sarl.data.prepare dataset=minerva_math drop_invalid=true expected_count=271

`dataset=NAME` picks conf/data/NAME.yaml (its keys sit at the top of this config, so its settings are
overridden directly: `source.local_file=...`, `fields.question=...`, `filters.min_response_tokens=...`,
`expected_count=...`). Writes, under `${paths.data_dir}/NAME/`:

    <split>.parquet      verl's layout (data_source, chat prompt, ability, reward_model, extra_info)
    <split>.trl.jsonl    what backend=trl reads: {"prompt", "ground_truth", "data_source", "extra_info"}
    dpo.jsonl            OpenRubrics-v2 only: TRL's conversational preference pairs
    manifest.json        source (revision or file hash), config, counts after every step, outputs

Nothing is written unless every check passes (unusable rows, the expected row count); each file is
written atomically, the manifest last. `repeat: K` (a training set's data config) writes the training split K
times over, after the count check (EVOL-RL's AIME24 set: its 30 problems 16 times, as the authors' released
training file; docs/decisions.md §2.4); each copy's `extra_info.copy` is its number, 0 to K-1.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from sarl.data import benchmark_sets, code_sets, stratify  # noqa: F401  (their builders register themselves in BUILDERS)
from sarl.data.build import BUILDERS, Built, DataValidationError, Steps, trl_record
from sarl.data.sources import DataSourceError, load_rows, sha256_file
from sarl.data.writers import write_json, write_jsonl, write_parquet
from sarl.runtime.files import CONF_DIR
from sarl.runtime.hub import offline_if_unreachable
from sarl.runtime.runs import git_commit
from sarl.runtime.usage import Usage, asks_for_help, usage

log = logging.getLogger("sarl.data.prepare")


def register_datasets(store: ConfigStore | None = None) -> None:
    """Every conf/data/NAME.yaml that says how to build it (has a `builder`) as option NAME of the `dataset`
    group of conf/prepare.yaml, merged at the top level (package _global_): the training config's `data`
    group is also the preparation's `dataset` group. (Sets shipped ready-made, such as the smoke run's, have
    no builder.)"""
    store = store or ConfigStore.instance()
    for path in sorted((CONF_DIR / "data").glob("*.yaml")):
        node = OmegaConf.load(path)
        if "builder" in node:
            store.store(group="dataset", name=path.stem, node=node, package="_global_")


register_datasets()


def compose_prepare_config(overrides: list[str]) -> DictConfig:
    """conf/prepare.yaml with Hydra overrides (`dataset=NAME`, ...), as the command line would compose it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_prepare"):
        return compose(config_name="prepare", overrides=overrides)


def check_expected_count(name: str, split: str, rows: int, expected: int | None) -> None:
    if expected is not None and rows != int(expected):
        raise DataValidationError(
            f"dataset '{name}': {rows} rows in split '{split}' after every step, expected {expected} "
            f"(expected_count in conf/data/{name}.yaml). Check the source and the counts above; to accept "
            f"{rows}, pass expected_count={rows} (or expected_count=null to skip the check)"
        )


def prepare(cfg: DictConfig) -> dict[str, Any]:
    """Load, build, check and write one data set; returns its manifest."""
    spec = OmegaConf.to_container(cfg, resolve=True)
    name, builder = spec["name"], spec.get("builder")
    if builder not in BUILDERS:
        raise DataValidationError(
            f"dataset '{name}': builder {builder!r} is not one of {sorted(BUILDERS)} (conf/data/{name}.yaml)"
        )
    loaded = load_rows(name, spec["source"])
    steps = Steps(name)
    steps("loaded", len(loaded.rows))
    built: Built = BUILDERS[builder](spec, loaded.rows, steps, bool(spec.get("drop_invalid")))
    main_split = spec["split"]
    check_expected_count(name, main_split, len(built.splits[main_split]), spec.get("expected_count"))
    empty = [s for s, recs in built.splits.items() if not recs]
    if empty:
        raise DataValidationError(f"dataset '{name}': no rows left in split(s) {empty}")
    repeat = 1 if spec.get("repeat") is None else spec["repeat"]
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise DataValidationError(
            f"dataset '{name}': repeat={repeat!r} must be an integer >= 1 (conf/data/{name}.yaml)"
        )
    if repeat > 1:
        built.splits[main_split] = repeated(built.splits[main_split], repeat)
        log.info(
            "%s: %s split written %d times (repeat): %d rows", name, main_split, repeat, len(built.splits[main_split])
        )

    data_dir = Path(spec["paths"]["data_dir"]).resolve()
    out_dir = data_dir / name
    outputs: dict[str, Any] = {}
    for split, records in built.splits.items():
        parquet, trl = out_dir / f"{split}.parquet", out_dir / f"{split}.trl.jsonl"
        write_parquet(records, parquet)
        write_jsonl((trl_record(r) for r in records), trl)
        outputs[split] = {"rows": len(records), **_files(data_dir, parquet=parquet, trl=trl)}
    if built.dpo is not None:
        dpo = out_dir / "dpo.jsonl"
        write_jsonl(built.dpo, dpo)
        outputs["dpo"] = {"rows": len(built.dpo), **_files(data_dir, jsonl=dpo)}

    manifest = {
        "name": name,
        "role": spec.get("role"),
        "builder": builder,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": loaded.record,
        "counts": steps.steps,
        "expected_count": spec.get("expected_count"),
        "drop_invalid": bool(spec.get("drop_invalid")),
        "dropped_rows": built.dropped,
        **built.notes,
        "outputs": outputs,
        "config": {k: spec.get(k) for k in PREP_KEYS if k in spec},
        "versions": _versions(),
    }
    write_json(manifest, out_dir / "manifest.json")
    log.info("%s: wrote %s", name, ", ".join(f"{k} ({v['rows']} rows)" for k, v in outputs.items()))
    return manifest


def repeated(records: list[dict[str, Any]], times: int) -> list[dict[str, Any]]:
    """The records `times` times over, whole copies in order; copy k's `extra_info.copy` is k."""
    return [{**r, "extra_info": {**r["extra_info"], "copy": k}} for k in range(times) for r in records]


PREP_KEYS = (
    "repeat",
    "split",
    "source",
    "fields",
    "answers",
    "prompt_suffix",
    "system_prompt",
    "filters",
    "val",
    "code_format",
    "verify",
)


def _files(data_dir: Path, **paths: Path) -> dict[str, Any]:
    """Paths relative to the data directory, with their SHA-256."""
    return {
        **{k: str(p.relative_to(data_dir)) for k, p in paths.items()},
        "sha256": {k: sha256_file(p) for k, p in paths.items()},
    }


def _versions() -> dict[str, str]:
    out = {"git_commit": git_commit()}
    for pkg in ("sarl", "datasets", "pyarrow", "transformers", "math-verify"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def print_summary(manifest: dict[str, Any]) -> None:
    """Counts after every step and the files written, as tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    steps = Table(title=f"{manifest['name']}: rows after each step")
    for col in ("step", "rows", "dropped"):
        steps.add_column(col, justify="left" if col == "step" else "right")
    for s in manifest["counts"]:
        steps.add_row(s["step"], str(s["rows"]), str(s["dropped"]))
    console.print(steps)
    files = Table(title="written")
    files.add_column("output")
    files.add_column("rows", justify="right")
    files.add_column("files")
    for key, out in manifest["outputs"].items():
        files.add_row(key, str(out["rows"]), ", ".join(v for k, v in out.items() if k not in ("rows", "sha256")))
    console.print(files)
    if manifest["dropped_rows"]:
        console.print(f"dropped as unusable: {len(manifest['dropped_rows'])} rows (listed in manifest.json)")


@hydra.main(version_base="1.3", config_path="../../conf", config_name="prepare")
def main(cfg: DictConfig) -> None:
    offline_if_unreachable()  # before `datasets` is imported: a Hub that cannot be reached means the cache, no retries
    try:
        manifest = prepare(cfg)
    except (DataSourceError, DataValidationError) as err:  # the source or the config: the user's to fix
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print_summary(manifest)


USAGE = Usage(
    synopsis=("python -m sarl.data.prepare dataset=NAME [source.local_file=FILE] [drop_invalid=true]",),
    about=(
        "Build a training or evaluation set from conf/data/NAME.yaml: read its source (the Hub, or a local copy), map "
        "and check its fields, write <paths.data_dir>/NAME/ (parquet for verl, JSONL for TRL) and a manifest."
    ),
    keys=(
        ("source.local_file", "a local copy of the source's data (.json, .jsonl, .parquet, .csv): no Hub needed"),
        ("drop_invalid", "true: drop unusable rows (each listed in the manifest) instead of failing"),
        ("expected_count", "the number of rows the set must have"),
        ("paths.data_dir", "where the sets are written (default data/)"),
    ),
    groups=(("dataset", "data", "the set to build"),),
    more="More: docs/commands.md#data. Hydra's own flags still work (--cfg job); --hydra-help is Hydra's help.",
)


if __name__ == "__main__":
    if asks_for_help(sys.argv[1:]):
        sys.stdout.write(usage(USAGE))
        sys.exit(0)
    main()
