"""The tiny policy's build says how far it is (a build takes minutes on a laptop) and is reused afterwards."""

import logging

from omegaconf import OmegaConf

from sarl.backends.trl.policy import PROGRESS_LINES, STAMP, build_policy
from sarl.runtime.files import CONF_DIR, resolve_path


def test_the_build_logs_its_progress_with_the_time_to_go_and_is_then_reused(tmp_path, caplog):
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "tiny_qwen3.yaml").build)
    spec.pop("cache_dir"), spec.pop("seed")
    spec["traces"] = str(resolve_path(spec["traces"]))
    spec["architecture"].update(hidden_size=64, intermediate_size=64, num_hidden_layers=1)
    spec["warm_start"].update(steps=20, batch_size=2, max_length=64)
    with caplog.at_level(logging.INFO, logger="sarl.backends.trl.policy"):
        out = build_policy(spec, tmp_path)
    lines = [r.getMessage() for r in caplog.records]
    assert (out / STAMP).is_file()
    assert lines[0].startswith(f"policy: building {out} (20 warm-start steps")
    progress = [line for line in lines if line.startswith("policy: warm start step ")]
    assert [p.split()[4].rstrip(",") for p in progress] == [f"{n}/20" for n in range(2, 20, 20 // PROGRESS_LINES)]
    assert all("s so far, about" in p and p.endswith("s to go") for p in progress)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sarl.backends.trl.policy"):
        assert build_policy(spec, tmp_path) == out
    assert [r.getMessage() for r in caplog.records] == [f"policy: reusing {out}"]
