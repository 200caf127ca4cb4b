"""Preflight check of a run's prepared data (`sarl.preflight`, `sarl.train`'s cheap checks)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from sarl.runtime.checks import Check


def check_data(cfg: DictConfig) -> Check:
    """The training and validation files exist; the training set has `data.expected_count` rows, times
    `data.repeat` where the set is written several times over (sarl.data.prepare): a set prepared before its
    config changed is named, not trained on."""
    import pyarrow.parquet as pq

    problems, counts = [], []
    for key in ("train_files", "val_files"):
        path = Path(str(cfg.data[key]))
        if not path.is_file():
            problems.append(f"data.{key} = {path} does not exist")
            continue
        try:
            n = pq.read_metadata(path).num_rows
        except Exception as err:
            problems.append(f"data.{key} = {path} is not a readable parquet file ({err})")
            continue
        counts.append(f"{key.split('_')[0]} {n} rows")
        expected = cfg.data.get("expected_count")
        repeat = int(cfg.data.get("repeat") or 1)
        if key == "train_files" and expected and n != int(expected) * repeat:
            times = f" x repeat {repeat}" if repeat > 1 else ""
            problems.append(f"{path} has {n} rows, conf/data/{cfg.data.name}.yaml expects {expected}{times}")
        if n == 0:
            problems.append(f"{path} has no rows")
    if problems:
        return Check(
            "data",
            False,
            "; ".join(problems),
            f"python -m sarl.data.prepare dataset={cfg.data.name} (and the validation set)",
        )
    return Check("data", True, ", ".join(counts))
