"""The tiny policy's build says how far it is (a build takes minutes on a laptop) and is reused afterwards."""

import json
import logging
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from sarl.runtime.files import CONF_DIR, resolve_path
from sarl.smoke.policy import PROGRESS_LINES, STAMP, build_policy


def test_the_build_logs_its_progress_with_the_time_to_go_and_is_then_reused(tmp_path, caplog):
    spec = small_spec()
    with caplog.at_level(logging.INFO, logger="sarl.smoke.policy"):
        out = build_policy(spec, tmp_path)
    lines = [r.getMessage() for r in caplog.records]
    assert (out / STAMP).is_file()
    assert lines[0].startswith(f"policy: building {out} (20 warm-start steps")
    progress = [line for line in lines if line.startswith("policy: warm start step ")]
    assert [p.split()[4].rstrip(",") for p in progress] == [f"{n}/20" for n in range(2, 20, 20 // PROGRESS_LINES)]
    assert all("s so far, about" in p and p.endswith("s to go") for p in progress)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sarl.smoke.policy"):
        assert build_policy(spec, tmp_path) == out
    assert [r.getMessage() for r in caplog.records] == [f"policy: reusing {out}"]


def small_spec() -> dict:
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "tiny_qwen3.yaml").build)
    spec.pop("cache_dir"), spec.pop("seed")
    spec["traces"] = str(resolve_path(spec["traces"]))
    spec["architecture"].update(hidden_size=64, intermediate_size=64, num_hidden_layers=1)
    spec["warm_start"].update(steps=20, batch_size=2, max_length=64)
    return spec


BUILD_IN_CHILD = """
import json, logging, sys
from sarl.smoke.policy import build_policy
logging.basicConfig(level=logging.INFO, format="%(message)s")
print(build_policy(json.loads(sys.argv[1]), sys.argv[2]))
"""


def test_processes_sharing_a_cache_build_a_policy_once(tmp_path):
    """Parallel runs (or test workers) asking for the same policy: the first builds it, the others wait for it
    (a file lock) instead of building it again into the same directory."""
    args = [sys.executable, "-c", BUILD_IN_CHILD, json.dumps(small_spec()), str(tmp_path)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    paths = {out.strip() for out, _ in outs}
    logs = "".join(err for _, err in outs)
    assert len(paths) == 1 and (Path(paths.pop()) / STAMP).is_file()
    assert logs.count("policy: building ") == 1, logs
    assert logs.count("policy: reusing ") == 2, logs  # after waiting for the builder, or after it finished
