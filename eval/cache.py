"""Resumable per-sample cache of generations, structure statistics and judgements, and atomic file writes.

Layout: `<root>/<checkpoint key>/<stage key>/<benchmark>/<problem>/<sample>.json`, one JSON file per sample,
written atomically (temporary file in the same directory, fsync, `os.replace`) as soon as the sample is done.
An interrupted evaluation therefore loses at most the samples in flight, and a file is complete or absent,
never half written. Plain files (no database) because cluster file systems (NFS, Lustre) handle SQLite's locks
badly. A sample file also records the hash of its problem's prompt: if the benchmark data changed, the old
samples are ignored (counted as stale).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old or the new content, never a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def stable_hash(obj: Any, n: int = 12) -> str:
    """A short hex digest of a JSON-able object (keys sorted), stable across runs and machines."""
    raw = json.dumps(obj, sort_keys=True, ensure_ascii=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:n]


def safe_name(text: str, max_len: int = 80) -> str:
    """`text` as a file name: runs of other characters become "_"; long names keep a hash suffix."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("._") or "x"
    if len(name) > max_len or name != str(text):
        name = f"{name[: max_len - 13]}-{stable_hash(str(text), 12)}"
    return name


class SampleCache:
    """Records per (benchmark, problem, sample index) under one directory (one stage of one checkpoint): one
    small JSON file per sample, so that a record is written once and never rewritten."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _dir(self, benchmark: str, problem_id: str) -> Path:
        return self.root / safe_name(benchmark) / safe_name(problem_id)

    def get(self, benchmark: str, problem_id: str, prompt_hash: str) -> dict[int, dict[str, Any]]:
        """The cached samples of a problem by sample index (those made for another prompt are ignored)."""
        folder = self._dir(benchmark, problem_id)
        out: dict[int, dict[str, Any]] = {}
        if not folder.is_dir():
            return out
        for path in sorted(folder.glob("*.json")):
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as err:  # cannot happen with atomic writes; say so if it does
                with self._lock:
                    self.counts["unreadable_files"] += 1
                log.warning("cache file %s is unreadable (%s); the sample is recomputed", path, err)
                continue
            if stored.get("prompt_hash") != prompt_hash or stored.get("problem_id") != problem_id:
                with self._lock:
                    self.counts["stale_samples"] += 1
                log.warning("cache %s was made for another prompt of problem %r; ignored", path, problem_id)
                continue
            out[int(stored["sample"])] = stored["record"]
        return out

    def put(self, benchmark: str, problem_id: str, prompt_hash: str, sample: int, record: dict[str, Any]) -> None:
        """Store one sample's record (atomically)."""
        entry = {"problem_id": problem_id, "prompt_hash": prompt_hash, "sample": int(sample), "record": record}
        atomic_write_text(
            self._dir(benchmark, problem_id) / f"{int(sample)}.json", json.dumps(entry, ensure_ascii=False)
        )
        with self._lock:
            self.counts["writes"] += 1
