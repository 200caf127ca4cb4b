"""A verl run's console: a line per step from metrics.jsonl as it grows, the steps' table at the end, the run's own
reason or the log's tail when it fails; the launched command's output in its log file."""

import json
import sys

from rich.console import Console

from sarl.reports.progress import StepLines, log_tail, step_line, steps_table, stop_line
from sarl.runtime.signals import run_in_own_group

VALIDATION = {"step": 0, "data": {"val-core/smoke/acc/mean@1": 0.375}}
STEP_1 = {
    "step": 1,
    "data": {"critic/score/mean": 0.25, "actor/pg_loss": -0.1, "actor/kl_loss": 0.0012, "timing_s/step": 8.9},
}


def test_each_training_step_is_said_once_as_its_record_arrives(tmp_path):
    path = tmp_path / "metrics.jsonl"
    said: list[str] = []
    steps = StepLines(path, total=3, say=said.append)
    steps.poll()  # no file yet: nothing
    line = json.dumps(STEP_1)
    with path.open("w") as f:
        f.write(json.dumps(VALIDATION) + "\n" + line[:20])  # the writer is mid-line
    steps.poll()
    assert said == []  # validation alone is no step; half a line is left for later
    with path.open("a") as f:
        f.write(line[20:] + "\n" + "not json\n" + json.dumps({**STEP_1}) + "\n")
    steps.poll()
    steps.poll()
    assert said == ["step 1/3  reward=0.25 KL=0.0012 loss=-0.1 s/step=8.9"]
    # the TRL back end's flat names and verl SFT's are read alike
    assert step_line({"step": 2, "train/loss": 1.5}) == "step 2  loss=1.5"
    resumed: list[str] = []
    later = StepLines(path, say=resumed.append)  # a resumed run: the steps already logged are not said again
    with path.open("a") as f:
        f.write(json.dumps({**STEP_1, "step": 2}) + "\n")
    later.poll()
    assert resumed == ["step 2  reward=0.25 KL=0.0012 loss=-0.1 s/step=8.9"]


def test_the_closing_table_and_what_a_failed_run_shows(tmp_path):
    rows = [{"step": 0, "val-core/x": 1.0}, {"step": 1, **STEP_1["data"]}, {"step": 2, **STEP_1["data"]}]
    console = Console(width=160, record=True)
    console.print(steps_table(rows))
    text = console.export_text()
    assert "per-step metrics" in text and "reward" in text and "s/step" in text and "SR" not in text
    assert [x.split()[1] for x in text.splitlines() if x.startswith("│")] == ["1", "2"]  # not step 0 (validation)
    log = tmp_path / "verl.log"
    log.write_text("noise\n  warnings.warn(x)\nUserWarning: y\ntraining stopped: no usable reward in 2 steps\nbye\n")
    assert stop_line(log) == "training stopped: no usable reward in 2 steps"
    assert log_tail(log, 3) == ["noise", "training stopped: no usable reward in 2 steps", "bye"]
    assert stop_line(tmp_path / "missing.log") is None and log_tail(tmp_path / "missing.log") == []


def test_a_launched_command_writes_to_its_log_and_is_polled_until_it_ends(tmp_path):
    out = tmp_path / "verl.log"
    out.write_text("==== earlier launch\n")
    polls = []
    code = "import sys, time; print('to stdout', flush=True); time.sleep(0.5); print('to stderr', file=sys.stderr)"
    rc = run_in_own_group(
        [sys.executable, "-c", code + "; sys.exit(3)"],
        tmp_path,
        {},
        output=out,
        poll=lambda: polls.append(1),
        poll_s=0.1,
    )
    assert rc == 3 and len(polls) >= 2  # while it ran, and once after
    assert out.read_text().splitlines() == ["==== earlier launch", "to stdout", "to stderr"]  # appended
