"""Where rows come from (sarl.data.sources): local CSV/JSON/JSONL/parquet files read alike, clear errors for
missing files, unknown formats and an unreachable hub; atomic writes (sarl.data.writers)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sarl.data.sources import DataSourceError, load_local_file, load_rows, sha256_file
from sarl.data.writers import write_json, write_jsonl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
AIME25 = [json.loads(line) for line in (FIXTURES / "aime25.jsonl").read_text().splitlines()]


def write_as(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.name.endswith(".lines.json"):  # JSON lines under a .json name, as many hub repositories ship them
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("filename", ["a.csv", "a.json", "a.lines.json", "a.jsonl", "a.parquet"])
def test_every_local_format_gives_the_same_rows(tmp_path, filename):
    path = write_as(tmp_path / filename, AIME25)
    loaded = load_rows("aime25", {"hf_id": "math-ai/aime25", "local_file": str(path)})  # the local file wins
    assert loaded.rows == AIME25
    assert loaded.record == {
        "kind": "local_file",
        "local_file": str(path.resolve()),
        "format": filename.rsplit(".", 1)[1],
        "sha256": sha256_file(path),
        "rows": 3,
    }


def test_csv_cells_stay_text_so_leading_zeros_survive_until_normalisation():
    rows = load_local_file("aime_1983_2024", FIXTURES / "aime_1983_2024.csv").rows
    assert rows[1]["Answer"] == "020" and rows[3]["Answer"] == "080 or 081 (both were accepted)"
    assert rows[0]["Part"] == "" and list(rows[0]) == ["ID", "Year", "Problem Number", "Question", "Answer", "Part"]


@pytest.mark.parametrize(
    "content,name,match",
    [
        (None, "missing.jsonl", "does not exist"),
        ("a,b\n1,2\n", "data.tsv", r"unknown extension '.tsv'; use one of .csv, .json, .jsonl, .parquet"),
        ('{"a": 1}', "obj.json", "holds a JSON dict; expected an array"),
        ('[{"a": 1}, 2]', "mixed.json", r"rows \[1\] are not JSON objects"),
        ('{"a": 1}\n{"a": \n', "broken.jsonl", "line 2 is not valid JSON"),
        ("[1, 2", "broken.json", "is not valid JSON"),
    ],
)
def test_bad_local_files_are_clear_errors(tmp_path, content, name, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataSourceError, match=match) as err:
        load_rows("aime25", {"local_file": str(path)})
    assert "dataset 'aime25'" in str(err.value)


def test_a_source_with_neither_hub_id_nor_file_says_what_to_set():
    with pytest.raises(DataSourceError, match=r"no source: set source.hf_id .* source.local_file="):
        load_rows("aime25", {"hf_id": None, "local_file": None})


@pytest.mark.slow
def test_an_unreachable_hub_dataset_is_one_clear_error_without_hanging(tmp_path):
    """Offline and not cached: one DataSourceError naming the data set, the hub id and the local-file override.
    Run in a fresh interpreter so that `datasets` reads the offline switches at import."""
    code = (
        "from sarl.data.sources import load_rows, DataSourceError\n"
        "try:\n"
        "    load_rows('wildbench_v2', {'hf_id': 'allenai/WildBench', 'hf_config': 'v2', 'split': 'test'})\n"
        "except DataSourceError as err:\n"
        "    print(err)\n"
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    message = proc.stdout.strip()
    assert message.startswith("dataset 'wildbench_v2': cannot load 'allenai/WildBench' (config 'v2'), split 'test'")
    assert "not in the local cache" in message
    assert message.endswith(
        "supply a local copy: python -m sarl.data.prepare dataset=wildbench_v2 "
        "source.local_file=/path/to/file.csv|.json|.jsonl|.parquet"
    )


def test_writes_are_atomic(tmp_path):
    target = tmp_path / "out" / "rows.jsonl"
    write_jsonl([{"a": 1}], target)
    assert target.read_text() == '{"a": 1}\n'

    def failing():
        yield {"a": 2}
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        write_jsonl(failing(), target)
    assert target.read_text() == '{"a": 1}\n'  # the previous version is intact
    assert [p.name for p in target.parent.iterdir()] == ["rows.jsonl"]  # and no temporary file is left
    write_json({"b": "é"}, tmp_path / "out" / "m.json")
    assert json.loads((tmp_path / "out" / "m.json").read_text()) == {"b": "é"}
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "out" / "m.json").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600
