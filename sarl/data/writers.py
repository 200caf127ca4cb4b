"""Atomic writes: each file is written to a temporary name in its directory and renamed over the target,
so a reader never sees half a file and an interrupted build leaves the previous version in place."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: files get the usual permissions, not mkstemp's 0600


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`; renamed onto `path` when the block ends without error, removed otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_text(path: Path, write: Callable[[Any], None]) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """One JSON object per line (UTF-8, not ASCII-escaped)."""

    def write(f: Any) -> None:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")

    _write_text(path, write)


def write_json(obj: Any, path: Path) -> None:
    _write_text(path, lambda f: f.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n"))


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """The rows as one parquet table; column types are inferred from the rows (nested dicts become structs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
