"""GRP parser and rewards (GRP Eq. 1-13), SCAE (Eq. 14-16) and its verl estimator, on hand-worked
graphs and through both backends' adapters."""

import asyncio
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from baselines.grp import DEFAULT_WEIGHTS, GRPReward, check_weights, graph_rewards, r_graph
from baselines.pasc_grpo import pack_scae, register_verl, scae_advantages, unpack_scae
from sarl.contract.reward import Reward, RolloutBatch
from sarl.contract.token_count import TokenCounter
from sarl.formats.graph import parse_graph

CONF = str(Path(__file__).resolve().parents[2] / "conf")


def node(i, parents, content):
    return json.dumps({"id": i, "parents_id": parents, "content": content})


def response(blocks, answer="\\boxed{6}"):
    """GRP's serialisation: label blocks of one JSON node per line inside <think>, then <answer>."""
    body = "\n".join(f"<{label}>\n" + "\n".join(node(*n) for n in nodes) + f"\n</{label}>" for label, nodes in blocks)
    return f"<think>\n{body}\n</think>\n<answer>{answer}</answer>"


VALID = response(
    [
        ("known", [(1, [], "x + y = 10"), (2, [], "x - y = 2")]),
        ("aggregate", [(3, [1, 2], "2x = 12, so x = 6")]),
        ("refine", [(4, [3], "y = 4")]),
    ]
)

# Every kind of violation once (see test_rewards_of_a_flawed_graph).
FLAWED = response(
    [
        ("known", [(1, [], "a b"), (2, [1], "c d")]),
        ("aggregate", [(3, [1], "e"), (4, [2, 3, 9], "f g h")]),
        ("generate", [(5, [], "i")]),
        ("refine", [(6, [4, 4], "j k")]),
    ]
)


# ---------------------------------------------------------------------------------------------- parser


def test_parse_the_documented_format():
    p = parse_graph(VALID)
    assert p.error is None and p.answer == "\\boxed{6}"
    assert [(n.id, n.parents, n.label, n.block) for n in p.nodes] == [
        (1, [], "known", 0),
        (2, [], "known", 0),
        (3, [1, 2], "aggregate", 1),
        (4, [3], "refine", 2),
    ]
    assert p.blocks == [[1, 2], [3], [4]]
    one_line = '<think><known>{"id": 1, "parents_id": [], "content": "a"}</known></think><answer>1</answer>'
    assert parse_graph(one_line).error is None and parse_graph(one_line).answer == "1"
    template_opened = VALID.replace("<think>", "")  # <think> put in the prompt by the chat template
    assert parse_graph(template_opened).error is None


K = '{"id": 1, "parents_id": [], "content": "a"}'


@pytest.mark.parametrize(
    "text, error",
    [
        (f"<think><known>{K}</known>", "truncated: no </think>"),
        (f"<think><ponder>{K}</ponder></think>", "unknown label <ponder>"),
        (f"<think><known>\n<refine>{K}</refine></known></think>", "<refine> opened inside <known>"),
        (f"<think>intro\n<known>{K}</known></think>", "text outside a label block"),
        ("<think><known>{'id': 1}</known></think>", "a node line is not valid JSON"),
        ("<think><known>[1, 2]</known></think>", "a node line is not a JSON object"),
        ('<think><known>{"id": 1, "content": "a"}</known></think>', "a node must have exactly the keys"),
        ('<think><known>{"id": 1, "parents_id": [], "content": "a", "x": 0}</known></think>', "exactly the keys"),
        ('<think><known>{"id": true, "parents_id": [], "content": "a"}</known></think>', "not an integer"),
        ('<think><known>{"id": "1", "parents_id": [], "content": "a"}</known></think>', "not an integer"),
        ('<think><known>{"id": 1, "parents_id": 2, "content": "a"}</known></think>', "not a list of integers"),
        ('<think><known>{"id": 1, "parents_id": ["1"], "content": "a"}</known></think>', "not a list of integers"),
        ('<think><known>{"id": 1, "parents_id": [], "content": 5}</known></think>', "content is not a string"),
        (f"<think><known>{K}\n{K}</known></think>", "duplicate node id 1"),
        (f"<think><known>{K}</refine></think>", "</refine> does not close <known>"),
        (f"<think>\n<known>{K}</known>\n</known></think>", "</known> closes nothing"),
        ("<think><known>\n</known></think>", "empty <known> block"),
        (f"<think><known>{K}\n</think>", "<known> is never closed"),
        ("<think>\n\n</think><answer>1</answer>", "no nodes"),
        (None, "response is not text"),
    ],
)
def test_strict_parse_failures(text, error):
    assert error in parse_graph(text).error


def test_the_parser_never_raises_on_random_text():
    rng = np.random.default_rng(0)
    pieces = [
        "<think>",
        "</think>",
        "<known>",
        "</known>",
        "<refine>",
        "</aggregate>",
        "{",
        "}",
        '"id": 1',
        "[",
        "]",
        ",",
        "\n",
        "x",
        '"content"',
        ":",
        "<answer>",
        "</answer>",
        "\ud800",
        "\x00",
        "1e999",
        "-",
    ]
    for _ in range(400):
        text = "".join(rng.choice(pieces, size=int(rng.integers(0, 40))))
        parse = parse_graph(text)
        if parse.error is None:
            graph_rewards(parse)
    deep = "<think><known>" + '{"id": ' + "[" * 100000 + "]" * 100000 + "}</known></think>"
    assert parse_graph(deep).error == "a node line is not valid JSON"


# --------------------------------------------------------------------------------------------- rewards


def test_rewards_of_a_valid_graph():
    r = graph_rewards(parse_graph(VALID))
    assert r["R_dens"] == r["R_topo"] == r["R_para"] == r["R_fmt"] == 1.0
    assert r["R_conn"] == 1.0 and r["R_reach"] == 1.0 and r["R_rev"] == 1.0
    # start = node 1 (the first known node): node 2 is not on a 1 ~> 4 path; words 5+5+7+3, ERS 5+7+3
    assert r["R_ers"] == pytest.approx(15 / 20)
    assert graph_rewards(parse_graph(VALID), start="all_known")["R_ers"] == 1.0
    assert r_graph(r) == pytest.approx(0.2 * (1 + 1 + 0.75 + 1 + 1))
    assert (r["n_nodes"], r["n_edges"], r["n_blocks"], r["cycle"]) == (4, 3, 3, 0)


def test_rewards_of_a_flawed_graph():
    """Edges 1->2, 1->3, 2->4, 3->4, 4->6; node 5 alone; parent 9 dangling; 4 listed twice by node 6."""
    r = graph_rewards(parse_graph(FLAWED))
    assert r["R_dens"] == pytest.approx(1 / 3)  # aggregates 3, 4 share a block; refine 6 is alone in its own
    assert r["R_topo"] == pytest.approx(3 / 5)  # known 2 has a parent, aggregate 3 has one; 1, 4, 6 are fine
    assert r["R_para"] == pytest.approx(2 / 4)  # 1 -> 2 inside <known>, 3 -> 4 inside <aggregate>
    assert r["R_fmt"] == pytest.approx((1 / 3 + 3 / 5 + 1 / 2) / 3)  # Eq. (2)
    assert r["R_conn"] == 0.5  # {1, 2, 3, 4, 6} and {5}
    assert r["R_ers"] == pytest.approx(10 / 11)  # all but node 5 ("i", 1 word) lie on 1 ~> 6
    assert r["R_reach"] == 1.0 and r["R_rev"] == pytest.approx(5 / 6)
    assert r["dangling_parents"] == 1 and r["repeated_parents"] == 1 and r["n_edges"] == 5
    w = {"R_fmt": 0.5, "R_conn": 0.5, "R_ers": 0.0, "R_reach": 0.0, "R_rev": 0.0}
    assert r_graph(r, w) == pytest.approx(0.5 * r["R_fmt"] + 0.25)


class CharTokenizer:
    """One token per character: a tokenizer whose counts differ from whitespace words."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text)))}


def test_ers_ratio_counts_the_policys_tokens():
    """GRP Eq. (9): I(v) is a token count. Characters here: nodes 10, 9, 17, 5; the ERS (1, 3, 4) holds 10+17+5
    of 41 (in whitespace words it would be 15 of 20)."""
    r = graph_rewards(parse_graph(VALID), TokenCounter(CharTokenizer()))
    assert r["R_ers"] == pytest.approx(32 / 41)
    reward = GRPReward(tokenizer=CharTokenizer())
    assert reward.count_tokens("x + y = 10") == 10


def test_a_node_escaping_a_lone_surrogate_is_counted_not_raised_on(byte_tokenizer):
    """A node line is JSON: the ASCII escape "\\ud800" decodes to a lone surrogate, which a fast tokenizer refuses
    (TypeError, the whole batch's reward failed); the count reads it as U+FFFD (sarl.contract.token_count)."""
    parse = parse_graph(response([("known", [(1, [], "a \ud800 b")])]))
    assert parse.error is None and parse.nodes[0].content == "a \ud800 b"
    count = TokenCounter(byte_tokenizer)
    assert count("a \ud800 b") == count("a \ufffd b") > 0
    assert graph_rewards(parse, count)["R_ers"] == 1.0


def test_rows_count_tokens_with_their_policys_tokenizer():
    """conf/reward/grp.yaml: the tokenizer is the row's model (in a pipeline, the SFT checkpoint the RL stage
    starts from); without a model group (sarl.score) whitespace words."""
    from sarl.launch.compose import compose_train_config

    assert compose_train_config(["+exp=grp_math_paper"])[0].reward.tokenizer == "Qwen/Qwen3-4B-Base"
    ckpt = compose_train_config(["+exp=grpo_grp_math", "model.path=/ckpt/sft"])[0]
    assert ckpt.reward.tokenizer == "/ckpt/sft"
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        assert compose(config_name="score", overrides=["reward=grp"]).reward.tokenizer is None


def test_a_cycle_zeroes_topology_and_reachability():
    cyclic = response([("known", [(1, [], "a")]), ("generate", [(2, [1, 3], "b")]), ("generate", [(3, [2], "c")])])
    r = graph_rewards(parse_graph(cyclic))
    assert r["cycle"] == 1.0 and r["R_topo"] == 0.0 and r["R_reach"] == 0.0
    assert r["R_rev"] == 1.0 and r["R_ers"] == 1.0  # the other rewards are computed as usual
    self_parent = response([("known", [(1, [1], "a")])])
    assert graph_rewards(parse_graph(self_parent))["R_topo"] == 0.0


def test_empty_denominators_and_missing_start():
    single = graph_rewards(parse_graph(response([("known", [(1, [], "a b")])])))
    assert single["R_dens"] == single["R_topo"] == single["R_para"] == 1.0  # nothing violated
    assert single["R_reach"] == single["R_rev"] == single["R_ers"] == single["R_conn"] == 1.0  # ~> is reflexive
    no_known = graph_rewards(parse_graph(response([("generate", [(1, [], "a")]), ("refine", [(2, [1], "b")])])))
    assert no_known["R_reach"] == 0.0 and no_known["R_ers"] == 0.0 and no_known["R_rev"] == 1.0
    empty_text = graph_rewards(parse_graph(response([("known", [(1, [], "")])])))
    assert empty_text["R_ers"] == 0.0  # no tokens at all
    with pytest.raises(ValueError, match="parse failed"):
        graph_rewards(parse_graph("<think>x</think>"))


def test_weights_must_sum_to_one():
    assert check_weights(DEFAULT_WEIGHTS) == DEFAULT_WEIGHTS
    with pytest.raises(ValueError, match="exactly"):
        check_weights({"R_fmt": 1.0})
    with pytest.raises(ValueError, match=">= 0"):
        check_weights({"R_fmt": 1.2, "R_conn": -0.2, "R_ers": 0, "R_reach": 0, "R_rev": 0})
    with pytest.raises(ValueError, match="sum to 1"):
        check_weights({k: 0.3 for k in DEFAULT_WEIGHTS})


# ------------------------------------------------------------------------------------------------ SCAE


def test_scae_hand_worked():
    """Group a: r̄ = 0.5; correct aux 0.5, 0.9 (r̄+ = 0.7) -> 0.5 + 0, 0.5 + 0.2; wrong aux 0.2, 0.8
    (r̄- = 0.5) -> -0.5 - 0.3, -0.5 + 0. Group b: one correct rollout -> 0."""
    adv = scae_advantages(np.array([1, 1, 0, 0, 1]), np.array([0.5, 0.9, 0.2, 0.8, 0.3]), np.array(list("aaaab")))
    np.testing.assert_allclose(adv, [0.5, 0.7, -0.8, -0.5, 0.0])
    all_right = scae_advantages(np.ones(3), np.array([0.1, 0.4, 0.7]), np.zeros(3))
    np.testing.assert_allclose(all_right, [0.0, 0.0, 0.3], atol=1e-12)  # structure only adds for correct ones


def test_scae_keeps_accuracy_first():
    rng = np.random.default_rng(0)
    acc = rng.integers(0, 2, 400).astype(float)
    adv = scae_advantages(acc, rng.uniform(size=400), rng.integers(0, 50, 400))
    assert (adv[acc == 1] >= 0).all() and (adv[acc == 0] <= 0).all()  # Eq. (15)-(16)
    with pytest.raises(ValueError, match="accuracy in"):
        scae_advantages(np.array([0.5]), np.array([0.1]), np.array([0]))
    with pytest.raises(ValueError, match="one length"):
        scae_advantages(np.ones(2), np.ones(3), np.zeros(2))
    with pytest.raises(ValueError, match="finite"):
        scae_advantages(np.ones(1), np.array([np.nan]), np.zeros(1))


def test_packing_round_trips_and_rejects_unpacked_rewards():
    scores = np.array([pack_scae(1.0, 0.25), pack_scae(0.0, 0.25), pack_scae(1.0, 0.0), pack_scae(0.0, 1.0)])
    np.testing.assert_allclose(scores, [2.25, -2.75, 2.0, -2.0])
    acc, aux = unpack_scae(scores)
    np.testing.assert_allclose(acc, [1, 0, 1, 0])
    np.testing.assert_allclose(aux, [0.25, 0.25, 0, 1], atol=1e-12)
    for plain in ([1.0, 0.0], [0.5], [-1.0]):  # ground-truth, SARL or EVOL-RL scores
        with pytest.raises(ValueError, match="reward.combine=scae"):
            unpack_scae(np.array(plain))
    with pytest.raises(ValueError):
        pack_scae(0.5, 0.1)


def verl_batch(scores, lengths, width=6):
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s  # verl puts the outcome reward on the last response token
    return rewards, mask


@pytest.mark.slow  # importing verl's core_algos takes ~15 s on a shared CPU
def test_the_registered_verl_estimator_equals_scae():
    pytest.importorskip("verl")
    from verl.trainer.ppo import core_algos

    register_verl()
    register_verl()  # idempotent
    fn = core_algos.get_adv_estimator_fn("scae")
    acc, aux = np.array([1, 0, 1, 0, 0]), np.array([0.6, 0.3, 0.2, 0.9, 0.4])
    uids = np.array(["p1", "p1", "p2", "p2", "p1"], dtype=object)
    rewards, mask = verl_batch([pack_scae(a, x) for a, x in zip(acc, aux)], [3, 6, 1, 4, 2])
    adv, ret = fn(token_level_rewards=rewards, response_mask=mask, index=uids, config=None)
    expected = scae_advantages(acc, aux, uids)
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float32).unsqueeze(-1) * mask)
    assert adv is ret or torch.equal(adv, ret)


@pytest.mark.slow
def test_verls_own_advantage_dispatch_runs_scae():
    """verl.trainer.ppo.ray_trainer.compute_advantage (the trainer's call) with adv_estimator=scae."""
    pytest.importorskip("verl")
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    from verl import DataProto

    register_verl()
    acc, aux = np.array([1, 1, 0, 0]), np.array([0.6, 0.3, 0.2, 0.9])
    rewards, mask = verl_batch([pack_scae(a, x) for a, x in zip(acc, aux)], [2, 5, 3, 6])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(["u"] * 4, dtype=object)},
    )
    out = ray_trainer.compute_advantage(data, adv_estimator="scae", config={})
    expected = torch.tensor(scae_advantages(acc, aux, np.array(["u"] * 4)), dtype=torch.float32)
    torch.testing.assert_close(out.batch["advantages"], expected.unsqueeze(-1) * mask)


# ---------------------------------------------------------------------------------------------- reward


def test_grp_reward_sum_and_scae_modes(grader):
    wrong = VALID.replace("\\boxed{6}", "7")
    batch = RolloutBatch(
        prompts=["Q"] * 4,
        responses=[VALID, wrong, FLAWED.replace("<answer>\\boxed{6}</answer>", ""), "<think>oops</think>"],
        ground_truths=["6"] * 4,
    )
    reward = GRPReward(grader=grader)
    outs = reward(batch)
    assert [o.diagnostics["acc"] for o in outs] == [1.0, 0.0, 0.0, 0.0]
    assert outs[0].score == pytest.approx(1.0 + 0.95) and outs[1].score == pytest.approx(0.95)
    assert outs[2].diagnostics["no_answer"] == 1.0 and outs[2].diagnostics["parse_failed"] == 0.0
    assert outs[3].diagnostics["parse_failed"] == 1.0 and outs[3].score == 0.0 and outs[3].failed is None
    assert reward.parse_errors == {"text outside a label block": 1}
    packed = GRPReward(combine="scae", grader=grader)(batch)
    assert [o.score for o in packed] == pytest.approx([2.95, 0.95 - 3, outs[2].score - 3, -3.0])
    plain = GRPReward(grader=grader)(
        RolloutBatch(prompts=["Q"], responses=[VALID.replace("\\boxed{6}", "6")], ground_truths=["6"])
    )
    assert plain[0].diagnostics["acc"] == 1.0  # an unboxed answer block is graded as a whole


def test_grp_reward_failures_and_options(grader):
    outs = GRPReward(grader=grader)(RolloutBatch(prompts=["Q"], responses=[VALID], ground_truths=[None]))
    assert outs[0].failed == "no ground truth" and outs[0].score == pytest.approx(0.95)  # acc 0, graph still scored
    all_known = GRPReward(start="all_known", grader=grader)(
        RolloutBatch(prompts=["Q"], responses=[VALID], ground_truths=["6"])
    )
    assert all_known[0].diagnostics["R_ers"] == 1.0
    with pytest.raises(ValueError, match="combine"):
        GRPReward(combine="max")
    with pytest.raises(ValueError, match="start"):
        GRPReward(start="last_known")


def test_grp_configs():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="score", overrides=["reward=grp"]).reward
    reward = instantiate(cfg)
    assert isinstance(reward, GRPReward) and isinstance(reward, Reward)
    assert reward.combine == "sum" and reward.weights == DEFAULT_WEIGHTS and reward.start == "first_known"
    from sarl.launch.compose import compose_train_config

    pasc, _ = compose_train_config(["+exp=pasc_grpo_grp_math"])
    assert pasc.algorithm.adv_estimator == "scae" and pasc.reward.combine == "scae"
    grpo, _ = compose_train_config(["+exp=grpo_grp_math"])
    assert grpo.algorithm.adv_estimator == "grpo" and grpo.reward.combine == "sum"


# -------------------------------------------------------------------------------------------- backends


def test_through_the_verl_per_sample_reward_function():
    import sarl.backends.verl.reward as bridge

    cfg = {"_target_": "baselines.grp.GRPReward", "combine": "scae"}

    async def run_all():
        return await asyncio.gather(
            *[bridge.compute_score("math", r, "6", {"uid": "u"}, reward=cfg) for r in (VALID, "<think>x</think>")]
        )

    a, b = asyncio.run(run_all())
    assert a["score"] == pytest.approx(2.95) and b["score"] == -3.0 and b["parse_failed"] == 1.0
    assert set(a) == {"score", "failed", *GRPReward.diagnostic_keys} and math.isnan(b["R_fmt"])


def test_through_the_trl_reward_function(grader):
    trl_rewards = pytest.importorskip("sarl.backends.trl.rewards")
    fn = trl_rewards.TRLReward(GRPReward(grader=grader), num_generations=2)
    assert fn(prompts=["Q"] * 2, completions=[VALID, FLAWED], ground_truth=["6"] * 2) == pytest.approx(
        [1.95, 1.0 + r_graph(graph_rewards(parse_graph(FLAWED)))]
    )
