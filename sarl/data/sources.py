"""Where a data set's rows come from: a Hugging Face dataset id, or a local CSV/JSON/JSONL/parquet file.

`load_rows(name, source)` reads the `source:` section of a conf/data file:

    source:
      hf_id: math-ai/aime25     # a dataset on the Hugging Face Hub (read through `datasets.load_dataset`)
      hf_config: null           # its configuration (WildBench: v2)
      revision: null            # a branch, tag or commit; a commit pins the data
      split: test
      local_file: null          # a local copy instead: .csv, .json (array or lines), .jsonl, .parquet
      data_files: null          # optional: files of the dataset to read (e.g. `hf_id: json` with hf:// paths)

A local file wins over the hub id. Rows come back as plain dicts; CSV cells are strings exactly as written
(an answer "080" stays "080" until the answer normaliser sees it). The record that goes into the manifest
names the source and pins it: the SHA-256 of a local file, or the requested revision and the fingerprint
`datasets` computed from the downloaded files.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from sarl.runtime.hub import offline_note

log = logging.getLogger(__name__)

LOCAL_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "jsonl", ".parquet": "parquet"}


class DataSourceError(RuntimeError):
    """A source that cannot be read: unreachable and not cached, a missing file, an unknown format."""


@dataclass
class Loaded:
    """The rows of a source and what the manifest records about it."""

    rows: list[dict[str, Any]]
    record: dict[str, Any] = field(default_factory=dict)


def load_rows(name: str, source: Mapping[str, Any]) -> Loaded:
    """All rows of data set `name` from its `source` config (a local file if one is given, else the hub)."""
    local = source.get("local_file")
    if local:
        return load_local_file(name, Path(str(local)))
    if source.get("hf_id"):
        return load_hub(name, source)
    raise DataSourceError(
        f"dataset '{name}' has no source: set source.hf_id in conf/data/{name}.yaml or pass "
        f"source.local_file=/path/to/file (one of {', '.join(LOCAL_FORMATS)})"
    )


def load_hub(name: str, source: Mapping[str, Any]) -> Loaded:
    """`datasets.load_dataset(hf_id, hf_config, split=..., revision=...)`; any failure (offline and not cached,
    an unknown id, a gated set) is one DataSourceError naming the data set and the local-file override."""
    import datasets

    hf_id, hf_config, split, revision = (source.get(k) for k in ("hf_id", "hf_config", "split", "revision"))
    files = source.get("data_files")
    where = f"'{hf_id}'" + (f" (config {hf_config!r})" if hf_config else "") + f", split {split!r}"
    where += f", files {list(files)}" if files else ""
    log.info("%s: loading %s from the Hugging Face Hub (or its local cache)", name, where)
    try:
        ds = datasets.load_dataset(hf_id, hf_config, split=split, revision=revision, data_files=files)
    except Exception as err:  # offline, unknown id, gated, network: all end in the same advice
        hub = "the Hugging Face Hub (unreachable here: offline mode)" if offline_note() else "the Hugging Face Hub"
        raise DataSourceError(
            f"dataset '{name}': cannot load {where} from {hub}, and it is not in the local cache "
            f"({type(err).__name__}: {err}). Download it where there is network, or supply a local copy: "
            f"python -m sarl.data.prepare dataset={name} source.local_file=/path/to/file.csv|.json|.jsonl|.parquet"
        ) from err
    record = {
        "kind": "huggingface",
        "hf_id": hf_id,
        "hf_config": hf_config,
        "split": split,
        "revision": revision or "default branch (not pinned)",
        "data_files": list(files) if files else None,
        "fingerprint": getattr(ds, "_fingerprint", None),
        "rows": len(ds),
    }
    return Loaded(rows=ds.to_list(), record=record)


def load_local_file(name: str, path: Path) -> Loaded:
    """Rows of a local .csv (header row; cells as strings), .json (an array of objects, or JSON lines),
    .jsonl or .parquet file."""
    if not path.is_file():
        raise DataSourceError(f"dataset '{name}': source.local_file={path} does not exist or is not a file")
    fmt = LOCAL_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataSourceError(
            f"dataset '{name}': cannot read {path}: unknown extension {path.suffix!r}; "
            f"use one of {', '.join(LOCAL_FORMATS)}"
        )
    log.info("%s: reading %s (%s)", name, path, fmt)
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(_utf8_text(name, path), newline=""))
        rows = [dict(r) for r in reader]
        if not rows:
            header = f" (only a header: {', '.join(reader.fieldnames or [])})" if reader.fieldnames else ""
            raise DataSourceError(f"dataset '{name}': {path} has no rows{header}")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as err:
            raise DataSourceError(f"dataset '{name}': {path} is not a readable parquet file ({err})") from err
    else:
        rows = _read_json(name, path, lines=fmt == "jsonl")
    if not rows:
        raise DataSourceError(f"dataset '{name}': {path} has no rows")
    bad = [i for i, r in enumerate(rows) if not isinstance(r, dict)]
    if bad:
        raise DataSourceError(f"dataset '{name}': {path}: rows {bad[:10]} are not JSON objects")
    record = {
        "kind": "local_file",
        "local_file": str(path.resolve()),
        "format": fmt,
        "sha256": sha256_file(path),
        "rows": len(rows),
    }
    return Loaded(rows=rows, record=record)


def _utf8_text(name: str, path: Path) -> str:
    """The file as text (UTF-8, a byte-order mark allowed); a DataSourceError names the line that is not."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataSourceError(
            f"dataset '{name}': {path} line {line} is not UTF-8 (byte {err.start}); convert the file to UTF-8"
        ) from err


def _read_json(name: str, path: Path, lines: bool) -> list[Any]:
    text = _utf8_text(name, path)
    if not lines:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            if err.msg != "Extra data":  # several documents: JSON lines under a .json name (common on the hub)
                raise DataSourceError(f"dataset '{name}': {path} is not valid JSON: {err}") from err
        else:
            if not isinstance(data, list):
                raise DataSourceError(
                    f"dataset '{name}': {path} holds a JSON {type(data).__name__}; expected an array of row objects "
                    "(or one object per line)"
                )
            return data
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataSourceError(f"dataset '{name}': {path} line {n} is not valid JSON: {err}") from err
    return rows


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
