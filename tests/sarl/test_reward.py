"""The structure reward object: end to end, configs, and every bad input of the foundation issue."""

import math
from pathlib import Path

import numpy as np
import pytest
from fakes import KeywordEmbedder
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from sarl.contract.reward import RewardOutput, RolloutBatch
from sarl.structure.reward import StructureReward, structure_rewards_from_embeddings

CONF = str(Path(__file__).resolve().parents[2] / "conf")


def think(*steps: str, close: bool = True) -> str:
    return "<think>\n" + "\n\n".join(steps) + ("\n</think>\n\nThe answer is \\boxed{1}." if close else "")


def run(reward, responses):
    outs = reward(RolloutBatch.from_responses(responses))
    assert len(outs) == len(responses)
    for o in outs:
        assert isinstance(o, RewardOutput)
        assert math.isfinite(o.score) and 0.0 <= o.score <= 1.0
        assert all(math.isfinite(v) for v in o.diagnostics.values())
    return outs


def test_known_structures_get_their_worked_values(keyword_embedder):
    reward = StructureReward(keyword_embedder, clustering="kmeans")
    # Four steps, k = 2: plan/calc alternate -> one edge -> SR 0.5
    (one_edge,) = run(reward, [think("plan it", "calc a", "plan again", "calc b")])
    assert one_edge.score == pytest.approx(0.5)
    assert one_edge.diagnostics["n_nodes"] == 2 and one_edge.diagnostics["n_edges"] == 1
    assert one_edge.diagnostics["C"] == 0.0 and one_edge.diagnostics["L"] == 1.0


def test_triangle_of_functions_scores_one():
    emb = KeywordEmbedder()
    # 9 steps -> k = 3; plan -> calc -> check -> plan ... closes a triangle.
    steps = ["plan 1", "calc 1", "check 1", "plan 2", "calc 2", "check 2", "plan 3", "calc 3", "check 3"]
    (out,) = run(StructureReward(emb), [think(*steps)])
    assert out.score == pytest.approx(1.0)
    assert out.diagnostics["C"] == 1.0 and out.diagnostics["L"] == 1.0


def test_variants_and_hdbscan(keyword_embedder):
    steps = [f"{k} {i}" for i in range(5) for k in ("plan", "calc", "check", "answer")]
    text = think(*steps)
    full = run(StructureReward(keyword_embedder), [text])[0]
    c_only = run(StructureReward(keyword_embedder, variant="c_only"), [text])[0]
    l_only = run(StructureReward(keyword_embedder, variant="l_only"), [text])[0]
    assert c_only.score == pytest.approx(full.diagnostics["C"] / 2)
    assert l_only.score == pytest.approx(1 / (1 + full.diagnostics["L"]))
    assert full.score == pytest.approx(c_only.score + l_only.score)
    assert c_only.diagnostics["sr"] == pytest.approx(full.score)
    hd = run(StructureReward(keyword_embedder, clustering="hdbscan"), [text])[0]
    assert hd.diagnostics["n_nodes"] == 4 and hd.failed is None


def test_steps_embedded_once_per_batch(keyword_embedder):
    reward = StructureReward(keyword_embedder)
    run(reward, [think("plan", "calc"), think("plan", "calc", "check")])
    assert len(keyword_embedder.calls) == 1
    assert sorted(keyword_embedder.calls[0]) == ["calc", "check", "plan"]


def test_reward_independent_of_batch_composition(keyword_embedder):
    reward = StructureReward(keyword_embedder)
    texts = [think(*[f"{k} {i}" for i in range(n) for k in ("plan", "calc", "check")]) for n in range(1, 9)]
    together = [o.score for o in run(reward, texts)]
    alone = [run(reward, [t])[0].score for t in texts]
    assert together == alone


BAD_RESPONSES = {
    "no_think": "Just the answer: \\boxed{4}.\n\nWith a second paragraph.",
    "unclosed": think("plan a", "calc b", "check c", close=False),
    "empty": "",
    "whitespace": "   \n\n\t ",
    "one_step": think("plan only"),
    "thousands": think(*[f"{('plan', 'calc', 'check')[i % 3]} step {i}" for i in range(3000)]),
    "identical": think(*["calc the same thing"] * 50),
    "huge_step": think("plan " + "x" * 200_000, "calc y"),
    "control_chars": think("plan\x00\x01\x02 a", "calc\x1b[31m b\x7f", "check\x0c c"),
    "invalid_unicode": think("plan \ud800 a", "calc \udfff b"),
    "only_think_tags": "<think></think>",
    "nested_tags": "<think><think>plan</think>calc</think>",
}


@pytest.mark.parametrize("name", sorted(BAD_RESPONSES))
@pytest.mark.parametrize("clustering", ["kmeans", "hdbscan"])
def test_bad_responses_get_defined_values(name, clustering):
    reward = StructureReward(KeywordEmbedder(), clustering=clustering, max_steps=1024)
    (out,) = run(reward, [BAD_RESPONSES[name]])
    assert out.failed is None
    d = out.diagnostics
    if name in ("empty", "whitespace", "only_think_tags"):
        assert out.score == 0.0 and d["n_steps"] == 0 and d["n_nodes"] == 0
    if name in ("one_step", "identical"):
        assert out.score == 0.0 and d["n_nodes"] == 1
    if name == "no_think":
        assert d["no_think"] == 1.0 and d["n_steps"] == 2
    if name == "unclosed":
        assert d["truncated"] == 1.0 and d["n_steps"] == 3
    if name == "thousands":
        assert d["steps_capped"] == 1.0 and d["n_steps"] == 1024


def test_bad_responses_together_in_one_batch_with_real_embedder(minilm):
    reward = StructureReward(minilm, max_steps=256)
    outs = run(reward, list(BAD_RESPONSES.values()) + [None, 42])
    assert [o.failed is None for o in outs] == [True] * len(BAD_RESPONSES) + [False, False]
    assert outs[-1].failed.startswith("unparseable response")
    assert reward.failure_counts["unparseable response"] == 2


@pytest.mark.parametrize(
    "bad,reason",
    [
        ([np.nan] * 16, "non-finite embedding"),
        ([0.0] * 16, "zero embedding"),
        ([1.0] * 7, "wrong embedding dimension"),
        ([np.inf] + [0.0] * 15, "non-finite embedding"),
    ],
)
def test_bad_embeddings_fail_only_their_responses(bad, reason):
    emb = KeywordEmbedder(bad={"calc POISON": bad})
    reward = StructureReward(emb, failed_score=0.0)
    outs = run(reward, [think("plan a", "calc POISON", "check c"), think("plan a", "calc b", "check c", "plan d")])
    assert outs[0].failed.startswith(reason) and outs[0].score == 0.0
    assert outs[1].failed is None and outs[1].score > 0
    assert reward.failure_counts[reason] == 1


def test_embedder_crash_fails_the_batch_without_raising():
    class Crashing(KeywordEmbedder):
        def _embed_unique(self, texts):
            raise RuntimeError("CUDA out of memory")

    outs = run(StructureReward(Crashing()), [think("plan", "calc"), think("check")])
    assert all(o.failed.startswith("embedding error: RuntimeError: CUDA out of memory") for o in outs)


def test_rewards_from_embeddings_batched_api():
    rng = np.random.default_rng(0)
    embs = [rng.normal(size=(m, 32)) for m in (0, 1, 2, 5, 40)]
    embs = [e / np.linalg.norm(e, axis=1, keepdims=True) if len(e) else e for e in embs]
    for method in ("kmeans", "hdbscan"):
        for variant in ("sarl", "c_only", "l_only"):
            scores = structure_rewards_from_embeddings(embs, method=method, variant=variant)
            assert len(scores) == 5 and all(0.0 <= s <= 1.0 for s in scores)
            assert scores[0] == 0.0 and scores[1] == 0.0
    with pytest.raises(ValueError, match="sarl, c_only, l_only"):
        structure_rewards_from_embeddings(embs, variant="both")


@pytest.mark.parametrize("name,variant", [("sarl", "sarl"), ("sarl_c_only", "c_only"), ("sarl_l_only", "l_only")])
def test_reward_configs_instantiate(name, variant):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="score", overrides=[f"reward={name}", "reward.clustering=hdbscan"])
    cfg.reward.embedder = {"_target_": "fakes.KeywordEmbedder", "dim": 16}
    reward = instantiate(cfg.reward)
    assert isinstance(reward, StructureReward)
    assert (reward.variant, reward.clustering, reward.delimiter, reward.max_steps) == (variant, "hdbscan", "\n\n", 1024)


def test_k_rule_reaches_the_reward(keyword_embedder):
    """Nine steps cycling through three functions: k = round(sqrt 9) = 3 gives the triangle (C = 1, L = 1,
    SR = 1); k = round(sqrt(9/2)) = 2 merges two functions into one node: one edge, C = 0, L = 1, SR = 1/2."""
    text = think(*(f"{w} {i}" for i in range(3) for w in ("plan", "calc", "check")))
    (paper,) = run(StructureReward(keyword_embedder), [text])
    assert (paper.score, paper.diagnostics["n_nodes"], paper.diagnostics["n_edges"]) == (1.0, 3, 3)
    (half,) = run(StructureReward(keyword_embedder, k_rule="sqrt_half"), [text])
    assert (half.score, half.diagnostics["n_nodes"], half.diagnostics["n_edges"]) == (0.5, 2, 1)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="score", overrides=["reward.k_rule=sqrt_half"])
    cfg.reward.embedder = {"_target_": "fakes.KeywordEmbedder", "dim": 16}
    assert instantiate(cfg.reward).k_rule == "sqrt_half"
    with pytest.raises(ValueError, match="KMeans only"):
        StructureReward(keyword_embedder, clustering="hdbscan", k_rule="sqrt_half")
    with pytest.raises(ValueError, match="fixed:K"):
        StructureReward(keyword_embedder, k_rule="cube_root")


def test_unknown_options_name_the_choices(keyword_embedder):
    with pytest.raises(ValueError, match="kmeans, hdbscan"):
        StructureReward(keyword_embedder, clustering="kmedoids")
    with pytest.raises(ValueError, match="sarl, c_only, l_only"):
        StructureReward(keyword_embedder, variant="C")


def test_dimension_inferred_from_the_majority_not_the_first_vector():
    emb = KeywordEmbedder(bad={"plan WRONG": [1.0] * 5})
    emb.dim = None
    outs = run(StructureReward(emb), [think("plan WRONG", "calc a"), think("plan b", "calc c", "check d")])
    assert outs[0].failed.startswith("wrong embedding dimension: got 5, expected 16")
    assert outs[1].failed is None and emb.dim == 16


def test_every_embedding_config_composes():
    from sarl.serving.http import HTTPEmbedder

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        server = compose(config_name="score", overrides=["embedding=vllm_server", "embedding.url=http://127.0.0.1:9"])
        hidden = compose(config_name="score", overrides=["embedding=policy_hidden"])
        local = compose(config_name="score", overrides=["embedding=local"])
    emb = instantiate(server.embedding)
    assert isinstance(emb, HTTPEmbedder) and emb.dim == 1024 and emb.model == "Qwen/Qwen3-Embedding-0.6B"
    live = instantiate(hidden.embedding)  # model: policy, the policy being trained: unbound outside backend=trl
    assert live.live and live.model is None and live.layer == -1
    with pytest.raises(RuntimeError, match="only backend=trl binds; elsewhere set embedding.model to a checkpoint"):
        live.embed(["a step"])
    assert local.embedding.model == "bundled-minilm"


def test_failures_are_reported_through_the_shared_record_failures(caplog):
    class Crashing(KeywordEmbedder):
        def _embed_unique(self, texts):
            raise RuntimeError("CUDA out of memory")

    reward = StructureReward(Crashing())
    with caplog.at_level("WARNING", logger="sarl.structure.reward"):
        run(reward, [think("plan", "calc"), think("check")])
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sarl.structure.reward" and r.levelname == "WARNING"]
    assert line.startswith("structure reward: 2 of 2 rows failed")
    assert reward.failure_counts == {"embedding error": 2}


def test_check_ready_embeds_one_text_and_names_a_dead_server():
    import socket

    from baselines.combine import WeightedSumReward
    from sarl.contract.reward import reward_problem
    from sarl.serving.http import HTTPEmbedder

    assert reward_problem(StructureReward(KeywordEmbedder())) is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = StructureReward(HTTPEmbedder(url=f"http://127.0.0.1:{port}", model="m", max_retries=0))
    problem = reward_problem(dead)
    assert f"127.0.0.1:{port}" in problem and "embedding.url" in problem and "/health does not answer" in problem
    both = WeightedSumReward({"ok": StructureReward(KeywordEmbedder()), "sr": dead}, {"ok": 1.0, "sr": 1.0})
    assert reward_problem(both).startswith("component 'sr': embedder HTTPEmbedder")
