"""CONTRIBUTING.md's "Add a reward" holds: a toy reward written as its four steps say, in a temporary copy of the
registry (`conf/` and a `baselines/` folder on the package's path), composes into the smoke row, passes the reward
contract and its own test, the row's dry run names it, and `python -m sarl.score` scores a file with it. Nothing else
had to be touched: the four files are all this test writes."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from testkit import run_python

ROOT = Path(__file__).resolve().parents[1]

TOY = {
    "baselines/toy_brevity.py": '''"""A toy reward: shorter responses score higher (CONTRIBUTING.md's example)."""

from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch


class ToyBrevity(RewardFunction):
    diagnostic_keys = ("words",)

    def __init__(self, scale: float = 100.0) -> None:
        super().__init__()
        self.scale = scale

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        out = []
        for text in batch.responses:
            words = len(text.split())
            if words == 0:
                out.append(RewardOutput(0.0, failed="empty response"))
            else:
                out.append(RewardOutput(1.0 - min(words / self.scale, 1.0), {"words": float(words)}))
        return out
''',
    "conf/reward/toy_brevity.yaml": """# A toy reward: 1 - words/scale, floored at 0 (CONTRIBUTING.md's example).
_target_: baselines.toy_brevity.ToyBrevity
scale: 100.0  # words at which the score reaches 0
""",
    "tests/baselines/test_toy_brevity.py": """from baselines.toy_brevity import ToyBrevity
from sarl.contract.reward import RolloutBatch


def test_scores_on_worked_values():
    out = ToyBrevity(scale=10)(RolloutBatch.from_responses(["a b", "a b c d e f g h i j k", ""]))
    assert [o.score for o in out] == [0.8, 0.0, 0.0]
    assert out[2].failed == "empty response" and out[0].diagnostics == {"words": 2.0}
""",
    "docs/methods/toy_brevity.md": """# Toy brevity

`python -m sarl.train +exp=smoke reward=toy_brevity`. r = 1 - min(words / scale, 1) (`ToyBrevity.score`);
an empty response fails. No results: an example.
""",
}


def test_contributing_counts_the_files_this_test_writes():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Add a reward") : text.index("## Add a paper row")]
    (count,) = re.findall(r"\*\*(\d+) files\*\*", section)
    steps = re.findall(r"^\d\. \*\*`([^`]+)`\*\*", section, re.M)
    assert int(count) == len(steps) == len(TOY) <= 4
    assert [s.replace("<name>", "toy_brevity") for s in steps] == list(TOY)


@pytest.fixture
def registry_copy(tmp_path, monkeypatch):
    """conf/ copied to tmp_path, a baselines/ folder there on the `baselines` package's path, the four files
    written into them; compositions read the copy."""
    import baselines
    import sarl.launch.compose as compose

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    for rel, body in TOY.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    monkeypatch.setattr(baselines, "__path__", [*baselines.__path__, str(tmp_path / "baselines")])
    monkeypatch.setattr(compose, "CONF_DIR", tmp_path / "conf")
    yield tmp_path


def test_a_toy_reward_added_by_the_four_steps_composes_and_runs(registry_copy, monkeypatch):
    from hydra.utils import instantiate

    from sarl.contract.reward import RolloutBatch, contract_problems, reward_class
    from sarl.launch.compose import compose_train_config
    from sarl.train import main

    cfg, choices = compose_train_config(["+exp=smoke", "reward=toy_brevity"])
    assert choices["reward"] == "toy_brevity" and cfg.reward._target_ == "baselines.toy_brevity.ToyBrevity"
    assert contract_problems(reward_class(cfg.reward._target_)) == []
    reward = instantiate(cfg.reward)
    assert contract_problems(reward) == []
    out = reward(RolloutBatch.from_responses(["<think>a</think> \\boxed{1}", ""]))
    assert out[0].score == pytest.approx(0.98) and reward.failure_counts["empty response"] == 1

    spec = importlib.util.spec_from_file_location(
        "test_toy_brevity", registry_copy / next(k for k in TOY if "tests/" in k)
    )
    toy_test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy_test)
    toy_test.test_scores_on_worked_values()  # the reward's own test passes

    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["+exp=smoke", "reward=toy_brevity", "train.dry_run=true", f"run_dir={registry_copy / 'run'}"])
    assert code == 0 and "baselines.toy_brevity.ToyBrevity" in stdout.getvalue()


# `python -m sarl.score` in a child process that sees the registry copy: its `baselines/` folder on the package's
# path (the first argument) and its `conf/` as the primary config directory (`--config-path`).
SCORE_WITH_COPY = """import sys
import baselines
baselines.__path__.append(sys.argv.pop(1))
from sarl.score import main
main()
"""


def test_sarl_score_scores_a_file_with_the_toy_reward(registry_copy):
    src = registry_copy / "responses.jsonl"
    src.write_text('{"id": "short", "response": "a b"}\n{"id": "empty", "response": ""}\n')
    out = registry_copy / "scores.jsonl"
    proc = run_python(
        "-c",
        SCORE_WITH_COPY,
        registry_copy / "baselines",
        f"--config-path={registry_copy / 'conf'}",
        f"input={src}",
        "reward=toy_brevity",
        f"output={out}",
        f"hydra.run.dir={registry_copy / 'score'}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    short, empty = (json.loads(line) for line in out.read_text().splitlines())
    assert short == {"id": "short", "score": pytest.approx(0.98), "words": 2.0, "failed": None}
    assert empty == {"id": "empty", "score": 0.0, "words": None, "failed": "empty response"}
    assert "ToyBrevity" in proc.stdout
