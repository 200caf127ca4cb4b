"""Resumable per-sample cache of generations, structure statistics and judgements, and atomic file writes.

Layout: `<root>/fp-<checkpoint fingerprint>/<stage key>/<benchmark>/<problem>/<sample>.json`,
one JSON file per sample, written atomically (temporary file in the same directory, fsync, `os.replace`) as
soon as the sample is done. An interrupted evaluation therefore loses at most the samples in flight, and a file
is complete or absent, never half written. Plain files (no database) because cluster file systems (NFS,
Lustre) handle SQLite's locks badly.

Every key is what determines the content, never a name: generations by the checkpoint's fingerprint (a hash of
its weight, config and tokenizer files, names and bytes, so a copied, moved or renamed checkpoint finds its samples
and a re-saved one gets new ones) plus the sampling settings; structure statistics and judgements additionally by a
hash of the response text (`text_hash`, stored in the record). A sample file records the hash of its
problem's prompt: if the benchmark data changed, the old samples are ignored (counted as stale). A file
that is not a sample record (unreadable, or JSON of another shape) is warned about, naming it, and recomputed.
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
from typing import Any, Callable

log = logging.getLogger(__name__)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old or the new content, never a partial file. A character
    UTF-8 cannot encode (a lone surrogate, which a model or a judged program can print or raise) is written as its
    escape `\\udXXX`: inside a JSON string that is the JSON escape of the same character, so the record reads back
    equal; elsewhere (Markdown) it shows as the escape. Nothing the evaluated text holds can make a write fail."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
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


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
HASH_CHUNK = 1 << 24  # 16 MiB reads. sha256 ran at 0.24 GB/s on a busy 2-core CI machine: a 15 GB checkpoint
# takes about a minute there, once (FileDigests remembers it); a GPU node's cores are faster


def _fingerprinted(path: Path) -> bool:
    """Files that determine what a checkpoint generates: weights, configs, tokenizer and chat template."""
    name = path.name
    return name.endswith(WEIGHT_SUFFIXES) or name.endswith((".json", ".model", ".jinja", ".txt", ".tiktoken"))


class FileDigests:
    """File digests remembered by (path, size, modification time, inode) in one JSON file, so that a later
    evaluation of an unchanged checkpoint does not read its weights again. A file whose signature changed is hashed
    anew; the memo is only a shortcut to the same digest, never a key."""

    def __init__(self, memo: str | Path | None = None) -> None:
        self.memo = Path(memo) if memo else None
        self.known: dict[str, str] = {}
        if self.memo is not None and self.memo.is_file():
            try:
                loaded = json.loads(self.memo.read_text(encoding="utf-8"))
                self.known = {k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, str)}
            except (OSError, ValueError, AttributeError):
                log.warning("file digest memo %s is unreadable: hashing the checkpoint again", self.memo)
        self.changed = False

    def digest(self, path: Path) -> str:
        st = path.stat()
        signature = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
        if signature not in self.known:
            h = hashlib.sha256()  # sha256 has CPU instructions on x86 and ARM: twice blake2b's speed here
            with path.open("rb") as fh:
                while chunk := fh.read(HASH_CHUNK):
                    h.update(chunk)
            self.known[signature] = h.hexdigest()[:32]
            self.changed = True
        return self.known[signature]

    def save(self) -> None:
        if self.memo is not None and self.changed:
            atomic_write_text(self.memo, json.dumps(self.known, sort_keys=True))
            self.changed = False


def checkpoint_fingerprint(path: str | Path, digests: FileDigests | None = None) -> str | None:
    """A digest of a checkpoint directory's contents: the relative name and the bytes of every file that determines
    what it generates (`_fingerprinted`), so it does not depend on where the checkpoint lies, what it is called or
    when it was written. None for a name that is not a local directory (a Hub id or a server's model name: its name
    is its identity)."""
    root = Path(path)
    if not root.is_dir():
        return None
    digests = digests or FileDigests()
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and _fingerprinted(p)):
        h.update(f"{f.relative_to(root).as_posix()}\0{digests.digest(f)}\0".encode())
    digests.save()
    return h.hexdigest()[:16]


def text_hash(text: str) -> str:
    """The key of a response's text in the structure and judgement caches."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _is_entry(stored: Any) -> bool:
    return (
        isinstance(stored, dict)
        and isinstance(stored.get("problem_id"), str)
        and isinstance(stored.get("prompt_hash"), str)
        and isinstance(stored.get("sample"), int)
        and not isinstance(stored.get("sample"), bool)
        and isinstance(stored.get("record"), dict)
    )


class SampleCache:
    """Records per (benchmark, problem, sample index) under one directory (one stage of one checkpoint): one
    small JSON file per sample, so that a record is written once and never rewritten."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _dir(self, benchmark: str, problem_id: str) -> Path:
        return self.root / safe_name(benchmark) / safe_name(problem_id)

    def get(
        self,
        benchmark: str,
        problem_id: str,
        prompt_hash: str,
        valid: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[int, dict[str, Any]]:
        """The cached samples of a problem by sample index (those made for another prompt are ignored; a file
        that is not a sample record, or whose record `valid` rejects, is warned about and left out)."""
        folder = self._dir(benchmark, problem_id)
        out: dict[int, dict[str, Any]] = {}
        if not folder.is_dir():
            return out
        for path in sorted(folder.glob("*.json")):
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:  # not with atomic writes; say so
                with self._lock:
                    self.counts["unreadable_files"] += 1
                log.warning("cache file %s is unreadable (%s); the sample is recomputed", path, err)
                continue
            if not _is_entry(stored) or (valid is not None and not valid(stored["record"])):
                with self._lock:
                    self.counts["malformed_files"] += 1
                log.warning("cache file %s is not a valid sample record; the sample is recomputed", path)
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
