"""`reward=code_exec` (baselines.code_exec): all-pass by default, the pass fraction as an option; every hostile
program of a batch scores 0 under its counted outcome; a broken sandbox masks the row (failed), never a 0."""

import os

import pytest

from baselines.code_exec import DIAGNOSTIC_KEYS, CodeExecReward
from sarl.checking.code.sandbox import Sandbox
from sarl.contract.reward import RolloutBatch

TESTS = {"tests": "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(5, 5) == 10\n"}
SANDBOX = {"timeout_s": 1.5, "memory_mb": 512}


def fenced(code, tag="python"):
    return f"<think>I add them.</think>\nHere is the code:\n```{tag}\n{code}```\n"


def batch(responses, gold=TESTS):
    return RolloutBatch(prompts=[""] * len(responses), responses=responses, ground_truths=[gold] * len(responses))


@pytest.fixture(scope="module")
def reward():
    return CodeExecReward(sandbox=SANDBOX, max_workers=4)


def test_all_pass_is_the_default_and_pass_fraction_an_option(reward):
    responses = [
        fenced("def add(a, b):\n    return a + b\n"),
        fenced("def add(a, b):\n    return a + b if a < 5 else 0\n"),
    ]
    assert [o.score for o in reward(batch(responses))] == [1.0, 0.0]
    fraction = CodeExecReward(score="pass_fraction", sandbox=SANDBOX)
    out = fraction(batch(responses))
    assert [o.score for o in out] == [1.0, pytest.approx(2 / 3)]
    assert out[1].diagnostics["acc"] == 0.0 and out[1].diagnostics["code/failed"] == 1.0


def test_the_last_python_block_after_the_thinking_is_run(reward):
    think_only = "<think>```python\ndef add(a, b):\n    return a + b\n```</think> done"
    two_blocks = fenced("def add(a, b):\n    return 0\n") + "\nBetter:\n```\ndef add(a, b):\n    return a + b\n```\n"
    other_language = fenced("def add(a, b):\n    return a + b\n") + "```bash\necho hi\n```\n"
    out = reward(batch([think_only, two_blocks, other_language, "no code here"]))
    assert [o.score for o in out] == [0.0, 1.0, 1.0, 0.0]
    assert out[0].diagnostics["code/no_code_block"] == 1.0 and out[3].diagnostics["code/no_code_block"] == 1.0
    assert all(o.failed is None for o in out)


HOSTILE = {
    "timeout": "while True:\n    pass\n",
    "memory": "x = bytearray(8 * 1024 ** 3)\n",
    "output_limit": "import sys\nfor _ in range(16384):\n    sys.stdout.write('x' * 65536)\n",
    "syntax_error": "def add(a, b)\n    return a + b\n",
    "crashed": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
    "failed": "import os\nwhile True:\n    os.fork()\n",  # a fork bomb meets RLIMIT_NPROC and raises
}


def test_hostile_programs_score_zero_under_their_counted_outcome():
    reward = CodeExecReward(sandbox=SANDBOX, max_workers=4)
    extra = [  # contained by the sandbox: each runs, and none defines add
        "import os\nos.system('echo escaped')\n",
        "data = open('/etc/passwd').read()\n",
        "import os\nos.kill(os.getppid(), 9)\n",
    ]
    responses = (
        [fenced(p) for p in HOSTILE.values()]
        + [fenced(p) for p in extra]
        + [fenced("def add(a, b):\n    return a + b\n")]
    )
    out = reward(batch(responses))
    kinds = [next(k for k in DIAGNOSTIC_KEYS if k.startswith("code/") and o.diagnostics[k]) for o in out]
    assert kinds == [f"code/{k}" for k in HOSTILE] + ["code/failed"] * 3 + ["code/passed"]
    assert [o.score for o in out] == [0.0] * 9 + [1.0] and all(o.failed is None for o in out)
    assert reward.outcome_counts == {**dict.fromkeys(HOSTILE, 1), "failed": 4, "passed": 1}
    assert all(set(o.diagnostics) == set(DIAGNOSTIC_KEYS) for o in out)


def test_a_broken_sandbox_masks_the_row_instead_of_scoring_zero():
    reward = CodeExecReward(sandbox=Sandbox(timeout_s=1, python="/nonexistent/python3"))
    out = reward(batch([fenced("def add(a, b):\n    return a + b\n"), "no code"]))
    assert out[0].failed.startswith("sandbox error") and out[0].diagnostics["code/sandbox_error"] == 1.0
    assert out[1].failed is None and out[1].diagnostics["code/no_code_block"] == 1.0  # judged without the sandbox
    assert reward.failure_counts == {"sandbox error": 1}
    assert "set python=" in reward.check_ready()


def test_unusable_ground_truths_and_responses_fail_with_the_reason(reward):
    code = fenced("def add(a, b):\n    return a + b\n")
    rows = RolloutBatch(
        prompts=[""] * 4,
        responses=[code, code, code, None],
        ground_truths=[None, "5", {"tests": "assert add(1,"}, TESTS],
    )
    failed = [o.failed for o in reward(rows)]
    assert failed[0] == "no ground truth" and failed[1].startswith("unusable ground truth: not a dict")
    assert failed[2].startswith("unusable ground truth: tests do not parse")
    assert failed[3].startswith("unusable response")


def test_a_bad_score_mode_is_refused():
    with pytest.raises(ValueError, match="reward.score='mean' is not valid; choose one of: all_pass, pass_fraction"):
        CodeExecReward(score="mean")


def test_launch_checks_judge_a_trivial_program_for_every_code_reward():
    """`sarl.train`'s cheap checks and `sarl.preflight` (verl rows): one row per code-executing reward."""
    from baselines.code_exec import sandbox_checks, sandbox_settings

    grp = {"_target_": "baselines.grp.GRPReward", "outcome": "code_exec", "code_exec": {"sandbox": SANDBOX}}
    combined = {"components": {"a": {"_target_": "baselines.code_exec.CodeExecReward", "sandbox": SANDBOX}}}
    assert sandbox_settings(grp) == [SANDBOX] and sandbox_settings(combined) == [SANDBOX]
    assert sandbox_checks({"_target_": "sarl.structure.reward.StructureReward"}) == []
    (ok,) = sandbox_checks(grp)
    assert ok.ok and ok.name == "code sandbox" and ("fork server" if os.geteuid() == 0 else "bubblewrap") in ok.detail
    (bad,) = sandbox_checks({"_target_": "baselines.code_exec.CodeExecReward", "sandbox": {"bwrap": "/nonexistent"}})
    assert not bad.ok and "bubblewrap (bwrap) is not installed" in bad.detail
    (typo,) = sandbox_checks({"_target_": "baselines.code_exec.CodeExecReward", "sandbox": {"namespaces": "auto"}})
    assert not typo.ok and "namespaces" in typo.detail
