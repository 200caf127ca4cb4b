"""`--help` and `-h` on every entry point a user types: what the command does, its main keys and the groups to pick
from (each group's options read from conf/, so none is missing), exit 0, nothing composed, started or written; and
Hydra's own flags still reach Hydra where a command is a Hydra application."""

import pytest
from testkit import REPO, run_module

ENTRY_POINTS = {  # module -> groups its help must list with every option of conf/<folder>/
    "sarl.train": {"+exp": "exp", "reward": "reward", "algorithm": "algorithm", "backend": "backend", "data": "data"},
    "eval.run": {"protocol": "eval/protocol", "generator": "eval/generator", "prompt": "eval/prompt"},
    "sarl.preflight": {"+exp": "exp"},
    "sarl.launch.inputs": {"+exp": "exp"},
    "sarl.score": {"reward": "reward", "embedding": "embedding"},
    "sarl.data.prepare": {"dataset": "data"},
    "sarl.data.synthesize": {"recipe": "synthesize/recipe"},
}


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_help_says_what_the_command_does_and_lists_its_groups(module, tmp_path):
    for flag in ("--help", "-h"):
        proc = run_module(module, flag, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-2000:]
        out = proc.stdout
        assert out.startswith(f"python -m {module}"), out[:300]
        assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
        listed = " ".join(out.split())
        for key, folder in ENTRY_POINTS[module].items():
            assert f"{key}= " in out and f"(conf/{folder}/)" in out, (key, out)
            for option in sorted(p.stem for p in (REPO / "conf" / folder).glob("*.yaml")):
                assert option in listed, (module, key, option)
    assert not any(tmp_path.iterdir()), sorted(tmp_path.iterdir())  # nothing written (no runs/, no outputs/)


def test_hydra_flags_still_reach_hydra(tmp_path):
    proc = run_module("sarl.score", "--cfg", "job", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "reward:" in proc.stdout and "_target_" in proc.stdout, proc.stderr[-2000:]
