"""embedding=policy_hidden on backend=trl: the reward embeds each step with the hidden states of the policy being
trained (SARL draft App. A.1 "Implementation A"; sarl/backends/trl/live.py); verl refuses it (decisions §1.2)."""

import json

import pytest
from testkit import HELDOUT_SMALL, smoke_small

from sarl.backends.trl.metrics import read_metrics
from sarl.launch.compose import compose_train_config
from sarl.train import UnsupportedOnBackend, check_supported, main

pytest.importorskip("trl")

ROW = "grpo_sarl_hidden_math"


def test_the_row_composes_for_trl_and_verl_refuses_the_live_policy():
    cfg, choices = compose_train_config([f"+exp={ROW}"])
    assert choices["embedding"] == "policy_hidden" and cfg.backend.name == "trl"
    assert cfg.reward.embedder.model == "policy" and cfg.reward.clustering == "kmeans"
    check_supported(cfg, choices)  # TRL runs it
    cfg, choices = compose_train_config([f"+exp={ROW}", "backend=verl"])
    with pytest.raises(UnsupportedOnBackend, match="embedding=policy_hidden .* run it with backend=trl") as err:
        check_supported(cfg, choices)
    assert "\n" not in str(err.value)
    cfg, choices = compose_train_config([f"+exp={ROW}", "backend=verl", "embedding.model=/ckpt"])
    check_supported(cfg, choices)  # a frozen checkpoint embeds anywhere


@pytest.mark.slow
def test_smoke_trains_with_the_live_policy_embeddings(policy_cache, tmp_path):
    """`+exp=smoke embedding=policy_hidden`, two steps: the reward embeds its steps through the policy at every call
    and the probe's embedding moves once the first optimiser step has changed the weights."""
    args = ["+exp=smoke", "logger=none", f"paths.root={tmp_path}", f"model.build.cache_dir={policy_cache}"]
    assert main([*args, "embedding=policy_hidden", *smoke_small(), *HELDOUT_SMALL, "backend.max_steps=2"]) == 0
    (run,) = (tmp_path / "runs" / "smoke").iterdir()
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["embedding/policy_texts"] > 0 and r["reward/failed"] == 0 for r in rows)
    assert rows[0]["embedding/drift"] == 0.0  # the first call: the weights the run started from
    assert rows[1]["embedding/drift"] > 1e-7  # after one update: the same probe text embeds differently
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["heldout"]  # held-out SR on the frozen starting policy
