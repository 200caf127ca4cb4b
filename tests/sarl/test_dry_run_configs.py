"""Every row's dry run prints the config it printed when the snapshot was taken, byte for byte.

`python -m sarl.train +exp=ROW train.dry_run=true` prints the final back-end config (verl's trainer config, the
TRL arguments, each stage of a pipeline). A refactor must not change one byte of it; a change of a row's settings
must be a decision, seen in review as a change of `tests/fixtures/dry_run_configs.json.gz`. The machine's paths,
the run directory, times and free ports are replaced by placeholders. After an intended change:

    .venv/bin/python tests/sarl/test_dry_run_configs.py --update

rewrites the snapshot; `git diff --stat` then shows it changed, and the test prints the diff of a row it finds
different. A commit that moves modules does not rewrite the snapshot: it edits only the moved `_target_`,
`pipeline_report` and `parser` paths in it, so the test still compares every other byte with the parent's output
(docs/design.md "Layers": how the split by role was checked against the tree before it).
"""

from __future__ import annotations

import contextlib
import difflib
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "fixtures" / "dry_run_configs.json.gz"


def _normalise(text: str, run_root: Path) -> str:
    text = text.replace(str(run_root), "<RUN>").replace(str(ROOT), "<ROOT>").replace(sys.executable, "<PY>")
    text = re.sub(r"\d{4}-\d\d-\d\d[ _]\d\d[:-]\d\d[:-]\d\d(,\d+)?", "<TIME>", text)
    return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<PORT>", text)


def dry_run(row: str, run_root: Path) -> tuple[int, str, str]:
    """(exit code, normalised stdout, stderr) of `sarl.train +exp=ROW train.dry_run=true` in this process: the
    README's command with no other flag (a run directory of the test's own)."""
    import logging

    from sarl.train import main

    argv = [f"+exp={row}", "train.dry_run=true", f"run_dir={run_root / row}"]
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    for handler in list(root.handlers):  # main's logging.basicConfig then writes to this row's stderr
        root.removeHandler(handler)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, _normalise(out.getvalue(), run_root), err.getvalue()


def all_rows() -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml"))


def snapshot(run_root: Path) -> dict[str, dict]:
    return {row: dict(zip(("exit", "stdout", "stderr"), dry_run(row, run_root))) for row in all_rows()}


def offline_env(hf_home: Path) -> dict[str, str]:
    """No network and nothing in the Hugging Face cache (HF_HOME an empty directory), no W&B settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(hf_home)})
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):  # HF_HOME alone says where
        env.pop(var, None)
    return env


@pytest.mark.slow
def test_every_rows_dry_run_works_offline_and_prints_the_snapshots_config(tmp_path):
    """Every row's dry run, one child process for all of them, offline with an empty model cache: exit 0, no
    traceback, nothing fetched or cached; the config printed is the snapshot's, byte for byte; with a critic (PPO),
    one line says its model was not resolved here."""
    hf_home = tmp_path / "hf-home"
    hf_home.mkdir()
    out = tmp_path / "dry_runs.json"
    proc = subprocess.run(
        [sys.executable, __file__, "--json", str(out), str(tmp_path / "runs")],
        env=offline_env(hf_home),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text())
    assert list(hf_home.rglob("*")) == []  # nothing fetched, nothing cached
    for row, result in got.items():
        assert "Traceback" not in result["stderr"], (row, result["stderr"][-3000:])
        unresolved = "critic.model.path=Qwen/Qwen3-4B: not a local directory nor in the Hugging Face cache"
        assert (unresolved in result["stderr"]) == row.startswith("ppo_"), (row, result["stderr"][-2000:])
    expected = json.loads(gzip.decompress(SNAPSHOT.read_bytes()))
    assert sorted(got) == sorted(expected), (
        "rows added or removed since the snapshot: update it (module docstring): "
        f"new {sorted(set(got) - set(expected))}, gone {sorted(set(expected) - set(got))}"
    )
    changed = [row for row in got if {k: got[row][k] for k in ("exit", "stdout")} != expected[row]]
    diffs = []
    for row in changed[:3]:
        lines = difflib.unified_diff(
            expected[row]["stdout"].splitlines(True), got[row]["stdout"].splitlines(True), row, row, n=2
        )
        diffs.append(f"exit {expected[row]['exit']} -> {got[row]['exit']}\n" + "".join(list(lines)[:40]))
    assert not changed, f"dry-run configs changed: {changed}\n" + "\n".join(diffs)
    assert all(v["exit"] == 0 for v in got.values()), {r: v["exit"] for r, v in got.items() if v["exit"]}


if __name__ == "__main__" and sys.argv[1:2] == ["--json"]:  # the test's child process: OUT RUN_ROOT
    sys.path.insert(0, str(ROOT))
    Path(sys.argv[3]).mkdir(parents=True, exist_ok=True)
    Path(sys.argv[2]).write_text(json.dumps(snapshot(Path(sys.argv[3]).resolve())))
elif __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        hf_home = Path(tmp) / "hf-home"
        hf_home.mkdir()
        out = Path(tmp) / "dry_runs.json"
        subprocess.run(
            [sys.executable, __file__, "--json", str(out), str(Path(tmp) / "runs")],
            env=offline_env(hf_home),
            check=True,
        )
        data = {row: {"exit": r["exit"], "stdout": r["stdout"]} for row, r in json.loads(out.read_text()).items()}
    SNAPSHOT.write_bytes(gzip.compress(json.dumps(data, indent=1, sort_keys=True).encode(), mtime=0))
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}: {len(data)} rows; exits {sorted({v['exit'] for v in data.values()})}")
