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


def test_verl_start_up_is_said_phase_by_phase_and_never_silent_for_long(tmp_path):
    """Before the first step: each phase once, as verl's log shows it; a line when nothing was said for every_s
    seconds (with the latest news: a step's line counts as news)."""
    from sarl.reports.progress import PhaseLines

    log = tmp_path / "verl.log"
    log.write_text("==== launch line\\n")
    now = [0.0]
    said: list[str] = []
    phases = PhaseLines(log, say=said.append, every_s=8.0, clock=lambda: now[0])
    with log.open("a") as f:
        f.write("INFO worker.py:2038 -- Started a local Ray instance.\\n")
    now[0] = 3.0
    phases.poll()
    assert said == ["verl: Ray is up (3 s)"]
    now[0] = 10.0
    phases.poll()  # 7 s of silence: nothing yet
    now[0] = 11.5
    phases.poll()
    assert said[-1].startswith("verl: running, 12 s in; last: Ray is up (its output: ")
    with log.open("a") as f:
        f.write("x INFO:...:train and validate dataloader initialized, train dataset size: 16\\n")
        f.write("x INFO:...:create worker group dict_keys(['actor_rollout_ref'])\\n")
        f.write("x INFO:...:all initialize finished, ready to fit\\n")
    now[0] = 12.0
    phases.poll()
    assert said[-3:] == [
        "verl: the data is loaded (12 s)",
        "verl: the model workers are starting (12 s)",
        "verl: ready: the first validation or step (12 s)",
    ]
    phases.heard("step 1/2: reward 0.25")
    now[0] = 21.0
    phases.poll()
    assert said[-1].startswith("verl: running, 21 s in; last: step 1/2: reward 0.25")
    phases.poll()  # said just now: nothing more
    assert len(said) == 6
