"""Preflight check of a run's prepared data (`sarl.preflight`, `sarl.train`'s cheap checks)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from sarl.runtime.checks import Check


def check_data(cfg: DictConfig) -> Check:
    """The training and validation files exist; the training set has `data.expected_count` rows."""
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
        if key == "train_files" and expected and n != int(expected):
            problems.append(f"{path} has {n} rows, conf/data/{cfg.data.name}.yaml expects {expected}")
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
