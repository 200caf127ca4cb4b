"""`python -m sarl.bench suite=smoke` in quick mode: the tiny policy's phases idle and beside a busy process, and the
README's commands with their longest silence. No timing is asserted."""

import sys

import pytest
from rich.console import Console
from testkit import bench_config

from sarl.bench.__main__ import run
from sarl.bench.commands import timed_lines
from sarl.bench.smoke import PHASES, child_env, parse_setting
from sarl.runtime.errors import UserError


def test_the_longest_gap_and_the_lines_around_it(tmp_path):
    script = "import time\nprint('one')\nprint('two')\ntime.sleep(0.3)\nprint('three', end='\\r')\nprint('four')\n"
    row = timed_lines([sys.executable, "-c", script], tmp_path / "out.log")
    assert row["rc"] == 0 and row["lines"] == 4
    assert (row["gap_before"], row["gap_after"]) == ("two", "three")
    assert row["longest_gap_s"] >= 0.3 and row["wall_s"] >= row["longest_gap_s"]
    assert "] four" in (tmp_path / "out.log").read_text()
    failed = timed_lines([sys.executable, "-c", "raise SystemExit(3)"])
    assert failed["rc"] == 3 and failed["lines"] == 0 and failed["gap_after"] == "(exit 3)"


def test_settings_and_the_childrens_wait(monkeypatch):
    assert parse_setting("auto/train") == ("auto", "TRAIN") and parse_setting("auto") == ("auto", "TRAIN")
    assert parse_setting("2/unset") == (2, "UNSET") and parse_setting("2/spin1000") == (2, "SPIN1000")
    assert parse_setting("null/passive") == (None, "PASSIVE")
    for bad in ("2/SPIN", "2/spinning", "0/train"):
        with pytest.raises(UserError, match="smoke.settings"):
            parse_setting(bad)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the bench's own environment does not leak into a variant
    assert not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(child_env("UNSET"))
    assert child_env("TRAIN")["GOMP_SPINCOUNT"] == "1000" and "OMP_WAIT_POLICY" not in child_env("TRAIN")
    assert child_env("PASSIVE")["OMP_WAIT_POLICY"] == "PASSIVE" and child_env("SPIN50")["GOMP_SPINCOUNT"] == "50"


def test_quick_smoke_suite(tmp_path):
    console = Console(record=True, width=400)
    result = run(bench_config(["suite=smoke", "quick=true", "load=1"]), console, out_dir=tmp_path)
    out, text = result["smoke"], console.export_text()
    assert result["load"] == 1 and out["settings"] == ["auto/TRAIN"]
    assert [r["phase"] for r in out["rows"]] == list(PHASES)
    for r in out["rows"]:
        assert r["idle_s"] > 0 and r["loaded_s"] > 0 and r["ratio"] > 0 and r["threads_loaded"] >= 1
    for col in ("loaded/idle", "threads loaded", "longest gap s", "load average"):
        assert col in text
    run0 = out["runs"]["auto/TRAIN"][1][0]
    assert run0["wait"] == {"GOMP_SPINCOUNT": "1000"} and run0["threads"].startswith("torch: ")
    commands = out["commands"]
    assert [(c["command"], c["load"]) for c in commands] == [("train", 0), ("eval", 0)]  # quick: idle only
    for c in commands:
        assert c["rc"] == 0 and c["lines"] > 5 and 0 <= c["longest_gap_s"] <= c["wall_s"]
    assert (tmp_path / "command-train-load0.log").is_file()
