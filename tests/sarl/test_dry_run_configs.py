"""Every row's dry run prints the config it printed when the snapshot was taken, byte for byte.

`python -m sarl.train +exp=ROW train.dry_run=true` prints the final back-end config (verl's trainer config, the
TRL arguments, each stage of a pipeline). A refactor must not change one byte of it; a change of a row's settings
must be a decision, seen in review as a change of `tests/fixtures/dry_run_configs.json.gz`. The machine's paths,
the run directory, times and free ports are replaced by placeholders. After an intended change:

    .venv/bin/python tests/sarl/test_dry_run_configs.py --update

rewrites the snapshot; `git diff --stat` then shows it changed, and the test prints the diff of a row it finds
different.
"""

from __future__ import annotations

import contextlib
import difflib
import gzip
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "fixtures" / "dry_run_configs.json.gz"
# The SFT stages of the pipeline rows need at least one full batch of traces; the shipped samples hold 6.
SFT_STAGE = ["sft:train.train_batch_size=8", "sft:data.sft_files={sft12}"]


def _normalise(text: str, run_root: Path) -> str:
    text = text.replace(str(run_root), "<RUN>").replace(str(ROOT), "<ROOT>").replace(sys.executable, "<PY>")
    text = re.sub(r"\d{4}-\d\d-\d\d[ _]\d\d[:-]\d\d[:-]\d\d(,\d+)?", "<TIME>", text)
    return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<PORT>", text)


def dry_run(row: str, run_root: Path) -> tuple[int, str]:
    """(exit code, normalised stdout) of `sarl.train +exp=ROW train.dry_run=true` in this process."""
    from sarl.launch.compose import compose_train_config
    from sarl.train import main

    sft12 = run_root / "sft12.jsonl"
    if not sft12.exists():
        traces = (ROOT / "sarl" / "samples" / "sft" / "grp_math.jsonl").read_text()
        sft12.write_text(traces + traces)
    argv = [f"+exp={row}", "train.dry_run=true", f"run_dir={run_root / row}"]
    cfg, _ = compose_train_config([f"+exp={row}"])
    if any(stage.name == "sft" for stage in cfg.get("pipeline") or []):
        argv += [o.format(sft12=sft12) for o in SFT_STAGE]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, _normalise(out.getvalue(), run_root)


def all_rows() -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml"))


def snapshot(run_root: Path) -> dict[str, dict]:
    return {row: dict(zip(("exit", "stdout"), dry_run(row, run_root))) for row in all_rows()}


@pytest.fixture
def quiet_wandb(monkeypatch):
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)


@pytest.mark.slow
def test_every_rows_dry_run_config_is_the_snapshots(tmp_path, quiet_wandb):
    expected = json.loads(gzip.decompress(SNAPSHOT.read_bytes()))
    got = snapshot(tmp_path)
    assert sorted(got) == sorted(expected), (
        "rows added or removed since the snapshot: update it (module docstring): "
        f"new {sorted(set(got) - set(expected))}, gone {sorted(set(expected) - set(got))}"
    )
    changed = [row for row in got if got[row] != expected[row]]
    diffs = []
    for row in changed[:3]:
        lines = difflib.unified_diff(
            expected[row]["stdout"].splitlines(True), got[row]["stdout"].splitlines(True), row, row, n=2
        )
        diffs.append(f"exit {expected[row]['exit']} -> {got[row]['exit']}\n" + "".join(list(lines)[:40]))
    assert not changed, f"dry-run configs changed: {changed}\n" + "\n".join(diffs)
    assert all(v["exit"] == 0 for v in got.values()), {r: v["exit"] for r, v in got.items() if v["exit"]}


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        del os.environ[key]
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        data = snapshot(Path(tmp).resolve())
    SNAPSHOT.write_bytes(gzip.compress(json.dumps(data, indent=1, sort_keys=True).encode(), mtime=0))
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}: {len(data)} rows; exits {sorted({v['exit'] for v in data.values()})}")
