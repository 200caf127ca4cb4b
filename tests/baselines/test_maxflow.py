"""MaxFlow reward (Structured Reasoning Eq. 3-4, Sec. 4.3): step attention, capacity graph, max flow and step importance
against hand-worked values and networkx, the attention pass on a tiny Qwen3, the reward and its configs."""

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from baselines.combine import WeightedSumReward
from baselines.maxflow.attention import StepAttention, step_attention
from baselines.maxflow.flow import (
    capacity_graph,
    max_flow_value,
    maxflow_quality,
    quality_from_importance,
    step_importance,
)
from baselines.maxflow.reward import MaxFlowReward
from sarl.bench.maxflow import networkx_importance
from sarl.contract.reward import Reward, RewardFunction, RewardOutput, RolloutBatch
from sarl.formats.tags import parse_structured

CONF = str(Path(__file__).resolve().parents[2] / "conf")

# --------------------------------------------------------------------------------------------- Eq. (3)

# Two heads over 4 tokens (rows are queries, causal, each row sums to 1).
ATT = np.array(
    [
        [[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.3, 0.5, 0], [0.1, 0.2, 0.3, 0.4]],
        [[1, 0, 0, 0], [0.9, 0.1, 0, 0], [0.6, 0.2, 0.2, 0], [0.4, 0.1, 0.1, 0.4]],
    ]
)
SPANS = [(0, 2), (2, 3), (3, 4)]


def test_step_attention_hand_worked():
    """A_ij = 1/(H|T_i|) sum_h sum_{a in T_i} max_{b in T_j} Att_h[a, b] (Structured Reasoning Eq. 3)."""
    a = step_attention(ATT, SPANS)
    expected = np.array(
        [
            [(1 + 1 + 0.5 + 0.9) / 4, 0, 0],  # T_0 = {0, 1}: both heads, both queries
            [(0.3 + 0.6) / 2, (0.5 + 0.2) / 2, 0],  # query 2: max over keys {0, 1} is 0.3 / 0.6
            [(0.2 + 0.4) / 2, (0.3 + 0.1) / 2, (0.4 + 0.4) / 2],
        ]
    )
    np.testing.assert_allclose(a, expected, atol=1e-7)


def test_step_attention_equals_the_literal_formula_and_handles_empty_spans():
    rng = np.random.default_rng(0)
    att = rng.uniform(size=(3, 9, 9))
    spans = [(0, 2), (2, 2), (2, 5), (5, 9)]  # the second node has no tokens
    a = step_attention(torch.tensor(att), spans)
    for i, (si, ei) in enumerate(spans):
        for j, (sj, ej) in enumerate(spans):
            if ei == si or ej == sj:
                assert a[i, j] == 0.0
                continue
            literal = sum(att[h, q, sj:ej].max() for h in range(3) for q in range(si, ei)) / (3 * (ei - si))
            assert a[i, j] == pytest.approx(literal, rel=1e-6)
    with pytest.raises(ValueError, match="H x T x T"):
        step_attention(np.zeros((2, 3, 4)), [(0, 1)])
    with pytest.raises(ValueError, match="do not fit"):
        step_attention(np.zeros((1, 3, 3)), [(0, 4)])


def test_capacity_graph_runs_earlier_to_later_above_tau():
    a = step_attention(ATT, SPANS)  # A[1,0] = 0.45, A[2,0] = 0.3, A[2,1] = 0.2
    cap = capacity_graph(a, tau=0.25)
    expected = np.zeros((3, 3))
    expected[0, 1], expected[0, 2] = 0.45, 0.3  # edge j -> i carries A_ij; A[2,1] = 0.2 <= tau is pruned
    np.testing.assert_allclose(cap, expected, atol=1e-12)
    exact = np.array([[0.9, 0.0, 0.0], [0.45, 0.8, 0.0], [0.3, 0.2, 0.7]])
    # A_ij > tau keeps, A_ij = tau prunes (the answer stays reachable through 0 -> 1 -> 2)
    exact = np.array([[0.9, 0.0, 0.0], [0.45, 0.8, 0.0], [0.3, 0.35, 0.7]])
    assert capacity_graph(exact, tau=0.3)[0, 2] == 0.0 and capacity_graph(exact, tau=0.3)[0, 1] == 0.45
    full = capacity_graph(np.full((3, 3), 0.9))
    assert full.trace() == 0 and not np.tril(full).any()  # no self loops, no later -> earlier edges
    assert capacity_graph(exact).sum() == pytest.approx(0.45 + 0.3 + 0.35)  # tau = 0.05 by default


def test_pruning_keeps_the_answer_reachable_from_the_question():
    """Structured Reasoning App. E.2: edges below 0.05 "are pruned to zero while maintaining connectivity".
    Connectivity is read as the answer (node 5) staying reachable from the question (node 0), the s-t
    connectivity App. F's Algorithm 2 checks; weak edges are pruned weakest first, and one whose removal
    would cut every 0 -> 5 path is kept.

    Strong edges: 0->1 .5, 0->2 .3, 1->2 .5, 2->3 .5, 3->4 .5. Weak: 0->5 .01, 1->3 .02, 3->5 .03, 4->5 .04.
    Pruning every weak edge (the old rule) leaves node 5 without an in-edge: F = 0, Q = 0. Weakest first:
    0->5 goes (0->1->2->3->5 remains), 1->3 goes, 3->5 goes (... 3->4->5 remains), 4->5 is the last way in
    and stays. Then F = .04 (bottleneck 4->5) and dF_k = F - F_{-k}: node 1 can be bypassed by 0->2, so
    dF_1 = 0; removing 2, 3 or 4 cuts the only path: dF = .04 each. K_top = ceil(25% of 4) = 1 node, so
    Q = 1 - .04 / .12 = 2/3 (Eq. 4).
    """
    a = np.eye(6)  # A_ii (self attention) never makes an edge
    for j, i, w in [(0, 1, 0.5), (0, 2, 0.3), (1, 2, 0.5), (2, 3, 0.5), (3, 4, 0.5)]:
        a[i, j] = w
    for j, i, w in [(0, 5, 0.01), (1, 3, 0.02), (3, 5, 0.03), (4, 5, 0.04)]:
        a[i, j] = w
    cap = capacity_graph(a)
    expected = cap_from(6, [(0, 1, 0.5), (0, 2, 0.3), (1, 2, 0.5), (2, 3, 0.5), (3, 4, 0.5), (4, 5, 0.04)])
    np.testing.assert_array_equal(cap, expected)
    flow, delta = step_importance(cap)
    assert flow == pytest.approx(0.04)
    np.testing.assert_allclose(delta, [0, 0, 0.04, 0.04, 0.04, 0], atol=1e-12)
    assert maxflow_quality(cap) == pytest.approx(2 / 3)
    # connected by strong edges alone: every weak edge goes
    a[5, 4] = 0.5
    assert capacity_graph(a)[[0, 1, 3], [5, 3, 5]].tolist() == [0.0, 0.0, 0.0]
    # the unpruned graph does not connect 0 to 5 (no edge into 5): there is nothing to maintain
    no_way_in = a.copy()
    no_way_in[5, :5] = 0.0
    assert capacity_graph(no_way_in)[1, 3] == 0.0
    with pytest.raises(ValueError, match="tau must be >= 0"):
        capacity_graph(a, tau=-0.1)


# ------------------------------------------------------------------------------------ max flow, Eq. (4)


def cap_from(n, edges):
    cap = np.zeros((n, n))
    for u, v, c in edges:
        cap[u, v] = c
    return cap


def test_max_flow_of_the_textbook_network():
    """CLRS Fig. 26.1 (edges in both directions between nodes, so not a DAG in index order): 23."""
    cap = cap_from(
        6,
        [(0, 1, 16), (0, 2, 13), (1, 3, 12), (2, 1, 4), (2, 4, 14), (3, 2, 9), (3, 5, 20), (4, 3, 7), (4, 5, 4)],
    )
    assert max_flow_value(cap) == pytest.approx(23)
    flow, delta = step_importance(cap)
    ref_flow, ref_delta = networkx_importance(cap)
    assert flow == pytest.approx(ref_flow) and delta == pytest.approx(ref_delta)


PARALLEL = cap_from(4, [(0, 1, 1.0), (1, 3, 1.0), (0, 2, 0.5), (2, 3, 0.5)])


@pytest.mark.parametrize(
    "cap, flow, delta, q",
    [
        # two parallel routes: dF = [1, 0.5], K_top = ceil(0.5) = 1 node -> Q = 1 - 1/1.5
        (PARALLEL, 1.5, [0, 1.0, 0.5, 0], 1 / 3),
        # a chain with a shortcut 0 -> 4 carrying 0.5: each chain node is worth 1, Q = 1 - 1/3
        (cap_from(5, [(0, 1, 1), (1, 2, 1), (2, 3, 1), (3, 4, 1), (0, 4, 0.5)]), 1.5, [0, 1, 1, 1, 0], 2 / 3),
        # node 2 hangs off node 1 and adds nothing: one step dominates, Q = 0
        (cap_from(4, [(0, 1, 1), (1, 3, 1), (1, 2, 1), (2, 3, 1)]), 1.0, [0, 1, 0, 0], 0.0),
        # a chain of 4 intermediates, all equal: K_top = 1 of 4, Q = 0.75
        (cap_from(6, [(k, k + 1, 1) for k in range(5)]), 1.0, [0, 1, 1, 1, 1, 0], 0.75),
        # 5 equal intermediates: K_top = ceil(1.25) = 2, Q = 1 - 2/5
        (cap_from(7, [(k, k + 1, 0.5) for k in range(6)]), 0.5, [0, 0.5, 0.5, 0.5, 0.5, 0.5, 0], 0.6),
        # no path from the question to the answer: sum dF = 0 -> Q = 0
        (cap_from(4, [(0, 1, 1), (2, 3, 1)]), 0.0, [0, 0, 0, 0], 0.0),
        # fewer than 2 intermediate nodes -> Q = 0 (decision), though dF_1 = 1
        (cap_from(3, [(0, 1, 1), (1, 2, 1)]), 1.0, [0, 1, 0], 0.0),
    ],
)
def test_step_importance_and_quality_hand_worked(cap, flow, delta, q):
    f, d = step_importance(cap)
    assert f == pytest.approx(flow) and d == pytest.approx(delta)
    assert maxflow_quality(cap) == pytest.approx(q)
    assert quality_from_importance(d) == pytest.approx(q)


def test_step_importance_equals_networkx_on_random_graphs():
    """DAGs in index order (the residual-reuse path, with ties and zero-flow nodes) and general graphs
    (the fresh-Dinic path) against networkx's max flow with each node removed."""
    rng = np.random.default_rng(7)
    for trial in range(120):
        n = int(rng.integers(2, 13))
        cap = rng.uniform(0, 1, (n, n)) * (rng.uniform(size=(n, n)) < rng.uniform(0.2, 1.0))
        if trial % 3 != 2:
            cap = np.triu(cap, 1)
        if trial % 3 == 1:
            cap = np.round(cap * 4) / 4  # equal capacities: many equally good max flows
        flow, delta = step_importance(cap)
        ref_flow, ref_delta = networkx_importance(cap)
        assert abs(flow - ref_flow) < 1e-9 and np.abs(delta - ref_delta).max() < 1e-9, (trial, cap)


def test_bad_capacities_are_errors():
    for bad in (np.zeros((2, 3)), np.array([[0, -1], [0, 0]]), np.array([[0, np.nan], [0, 0]])):
        with pytest.raises(ValueError):
            step_importance(bad)
    with pytest.raises(ValueError, match="source and a sink"):
        step_importance(np.zeros((1, 1)))
    assert maxflow_quality(np.zeros((1, 1))) == 0.0
    assert max_flow_value(np.zeros((1, 1))) == 0.0


# ------------------------------------------------------------------------------------- attention pass

RESPONSE = "<think><assumption> x is 2.\n<inference> y is 3.\n<verify> the sum is 5.</think> The answer is \\boxed{5}."


def node_starts(prefix, response):
    p = parse_structured(response)
    return [0] + [len(prefix) + s.start for s in p.steps] + [len(prefix) + p.answer_start]


def test_attention_pass_equals_eq3_on_the_models_own_attention_weights(tiny_qwen3):
    _, model, tok = tiny_qwen3
    sa = StepAttention(model, tok, layers=[0, 1], device="cpu")
    prefix = sa.prefix("What is x plus y?")
    assert prefix == "What is x plus y?\n"  # no chat template: the prompt and a newline
    starts = node_starts(prefix, RESPONSE)
    ids, spans = sa.token_spans(prefix + RESPONSE, starts)
    assert spans[0][0] == 0 and spans[-1][1] == len(ids)  # the nodes partition the sequence
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and all(e > s for s, e in spans)
    model.train()
    got = sa(prefix + RESPONSE, starts)
    assert model.training  # mode restored
    assert all(not layer.self_attn._forward_hooks for layer in model.model.layers)  # hooks removed
    with torch.no_grad():
        attentions = model.eval()(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    expected = np.mean([step_attention(attentions[k][0], spans) for k in (0, 1)], axis=0)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert not np.triu(got, 1).any()  # causal: no step attends to a later one
    last = StepAttention(model, tok, layers=[-1], device="cpu")(prefix + RESPONSE, starts)
    np.testing.assert_allclose(last, step_attention(attentions[1][0], spans), atol=1e-6)


def test_attention_pass_keeps_no_layers_weights_even_where_the_config_asks(tiny_qwen3):
    """The pass asks for no attention outputs, so a checkpoint whose config sets `output_attentions` does not make
    transformers keep every layer's H x T x T weights to the end (the memory plan counts one layer's:
    eager_pass_bytes)."""
    _, model, tok = tiny_qwen3
    outputs = []
    handle = model.register_forward_hook(lambda module, args, output: outputs.append(output))
    model.config.output_attentions = True
    try:
        sa = StepAttention(model, tok, layers=[0], device="cpu")
        sa("q\n" + RESPONSE, node_starts("q\n", RESPONSE))
    finally:
        model.config.output_attentions = False
        handle.remove()
    assert len(outputs) == 1 and outputs[0].attentions is None


def test_attention_pass_loads_a_checkpoint_path_and_checks_its_arguments(tiny_qwen3):
    path, model, tok = tiny_qwen3
    from_path = StepAttention(path, layers=[0, 1], device="cpu")
    text = "q\n" + RESPONSE
    starts = node_starts("q\n", RESPONSE)
    np.testing.assert_allclose(from_path(text, starts), StepAttention(model, tok, [0, 1], device="cpu")(text, starts))
    from transformers import Qwen3ForCausalLM

    sdpa = Qwen3ForCausalLM(model.config.__class__.from_dict({**model.config.to_dict(), "attn_implementation": "sdpa"}))
    sdpa.load_state_dict(model.state_dict())
    assert sdpa.config._attn_implementation == "sdpa"
    switched = StepAttention(sdpa, tok, [0, 1], device="cpu")  # only eager attention returns weights
    assert sdpa.config._attn_implementation == "eager"
    np.testing.assert_allclose(switched(text, starts), from_path(text, starts), atol=1e-6)
    with pytest.raises(ValueError, match="do not all exist"):
        StepAttention(model, tok, layers=[-5, -1])
    with pytest.raises(ValueError, match="tokenizer"):
        StepAttention(model, None)
    with pytest.raises(ValueError, match="max_tokens"):
        StepAttention(model, tok, [0], max_tokens=5, device="cpu")(text, starts)


def test_chat_template_prefix_and_an_already_templated_prompt(tiny_qwen3, byte_tokenizer):
    _, model, _ = tiny_qwen3
    tok = byte_tokenizer.__class__.from_pretrained(tiny_qwen3[0])
    tok.chat_template = (
        "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    sa = StepAttention(model, tok, [0], device="cpu")
    assert sa.prefix("What is 2+3?") == "<|user|>What is 2+3?\n<|assistant|>\n"
    assert sa.prefix("<|user|>What is 2+3?\n<|assistant|>\n") == "<|user|>What is 2+3?\n<|assistant|>\n"
    assert StepAttention(model, tok, [0], use_chat_template=False, device="cpu").prefix("Q") == "Q\n"


# --------------------------------------------------------------------------------------------- reward


class FixedAttention:
    """A stand-in for StepAttention: returns a given step matrix and records its calls."""

    def __init__(self, matrix):
        self.matrix = np.asarray(matrix, dtype=float)
        self.calls = []

    def prefix(self, prompt):
        return prompt + "\n"

    def __call__(self, text, starts):
        self.calls.append((text, list(starts)))
        if isinstance(self.matrix, Exception):
            raise self.matrix
        return self.matrix


class BrokenAttention(FixedAttention):
    def __call__(self, text, starts):
        raise RuntimeError("CUDA out of memory")


# Steps: question, assumption, inference, answer. Capacities above tau: 0->1 (1), 1->3 (1), 0->2 (0.5),
# 2->3 (0.5), the PARALLEL graph: Q = 1/3, F = 1.5. Entries at or below tau (0.05) are pruned.
MATRIX = np.array(
    [
        [0.9, 0.0, 0.0, 0.0],
        [1.0, 0.8, 0.0, 0.0],
        [0.5, 0.05, 0.7, 0.0],
        [0.03, 1.0, 0.5, 0.6],
    ]
)
TWO_STEPS = "<think><assumption> x is 2.\n<inference> y is 3.</think> So \\boxed{5}."


def maxflow_reward(grader, attention, **kw):
    return MaxFlowReward(attention=attention, grader=grader, **kw)


def test_correct_answer_scores_two_q_plus_format(grader):
    att = FixedAttention(MATRIX)
    out = maxflow_reward(grader, att)(RolloutBatch(prompts=["What?"], responses=[TWO_STEPS], ground_truths=["5"]))
    (o,) = out
    assert o.failed is None
    assert o.diagnostics["Q"] == pytest.approx(1 / 3) and o.diagnostics["F"] == pytest.approx(1.5)
    assert o.diagnostics["format"] == 1.0 and o.diagnostics["acc"] == 1.0 and o.diagnostics["n_edges"] == 4
    assert o.score == pytest.approx(2.0 * (1 / 3) + 1.0)  # weights 2.0 and 1.0 (App. A.4.4)
    ((text, starts),) = att.calls
    p = parse_structured(TWO_STEPS)
    assert text == "What?\n" + p.text
    assert starts == [0, 6 + p.steps[0].start, 6 + p.steps[1].start, 6 + p.answer_start]
    assert text[starts[-1] :] == "So \\boxed{5}."


def test_wrong_answer_is_minus_one_without_an_attention_pass(grader):
    att = FixedAttention(MATRIX)
    (o,) = maxflow_reward(grader, att)(RolloutBatch(prompts=["What?"], responses=[TWO_STEPS], ground_truths=["6"]))
    assert o.score == pytest.approx(-2.0 + 1.0) and o.diagnostics["r_maxflow"] == -1.0 and "Q" not in o.diagnostics
    assert att.calls == []


def test_fewer_than_two_steps_is_q_zero_and_no_answer_text_uses_the_last_step(grader):
    att = FixedAttention(MATRIX)
    reward = maxflow_reward(grader, att)
    one_step = "<think><verify> it is 5.</think> \\boxed{5}"
    no_think = "<assumption> x is 2.\n<inference> y is 3.\n<summarize> so \\boxed{5}"
    a, b = reward(RolloutBatch(prompts=["Q"] * 2, responses=[one_step, no_think], ground_truths=["5", "5"]))
    assert a.diagnostics["Q"] == 0.0 and a.score == pytest.approx(0.0 + 1.0)
    assert len(att.calls) == 1  # only the second response needed the model
    assert b.diagnostics["answer_is_last_step"] == 1.0 and b.diagnostics["format"] == 0.0  # no </think>
    ((text, starts),) = att.calls
    assert len(starts) == 4 and text[starts[-1] :].startswith("<summarize>")
    assert b.score == pytest.approx(2.0 * (1 / 3))


def test_failures_say_why(grader):
    batch = RolloutBatch(prompts=["Q", "", "Q"], responses=[TWO_STEPS] * 3, ground_truths=[None, "5", "5"])
    outs = maxflow_reward(grader, BrokenAttention(MATRIX), failed_score=-0.5)(batch)
    assert [o.score for o in outs] == [-0.5] * 3
    assert outs[0].failed == "no ground truth"
    assert outs[1].failed.startswith("no prompt text")
    assert outs[2].failed == "attention pass failed: RuntimeError: CUDA out of memory"


def test_bad_model_output_never_raises(grader):
    outs = maxflow_reward(grader, FixedAttention(MATRIX))(
        RolloutBatch(prompts=["Q"] * 3, responses=[None, "", "<think><verify>"], ground_truths=["5"] * 3)
    )
    assert [o.score for o in outs] == [0.0, -2.0, -2.0]  # a non-str is not a response: failed_score
    assert outs[0].failed == "unusable response: a NoneType, not a str" and outs[2].failed is None


def test_free_form_steps(grader):
    att = FixedAttention(MATRIX)
    response = "<think>x is 2.\n\ny is 3.</think> So \\boxed{5}."
    (o,) = maxflow_reward(grader, att, step_mode="paragraphs")(
        RolloutBatch(prompts=["Q"], responses=[response], ground_truths=["5"])
    )
    assert o.diagnostics["n_steps"] == 2 and o.diagnostics["format"] == 1.0
    assert o.score == pytest.approx(2 / 3 + 1)


def test_reward_end_to_end_on_the_tiny_policy(tiny_qwen3, grader):
    path, _, _ = tiny_qwen3
    reward = MaxFlowReward(path, layers=[0, 1], tau=0.0, device="cpu", grader=grader)
    (o,) = reward(RolloutBatch(prompts=["What is x plus y?"], responses=[RESPONSE], ground_truths=["5"]))
    att = reward.attention
    prefix = att.prefix("What is x plus y?")
    cap = capacity_graph(att(prefix + parse_structured(RESPONSE).text, node_starts(prefix, RESPONSE)), 0.0)
    assert o.failed is None and o.diagnostics["Q"] == pytest.approx(maxflow_quality(cap))
    assert 0.0 < o.diagnostics["Q"] < 1.0 and o.diagnostics["n_edges"] == 10  # 5 nodes, every earlier pair
    assert o.score == pytest.approx(2 * o.diagnostics["Q"] + 1.0)


def test_a_response_past_max_tokens_scores_q_zero_and_only_a_prompt_past_it_fails(tiny_qwen3, grader):
    """The response's length is the response's doing: Q = 0, the bottom of the correct band, flagged and never a mask
    (a masked row has no advantage: the policy could switch off its own reward); a prompt that alone fills max_tokens
    is the configuration's limit and fails the row."""
    path, _, _ = tiny_qwen3
    reward = MaxFlowReward(path, layers=[0, 1], device="cpu", grader=grader)
    reward.attention.max_tokens = reward.attention.count_tokens(reward.attention.prefix("Q")) + 5
    long = RESPONSE.replace("the sum is 5.", "the sum is 5. " * 50)
    batch = RolloutBatch(prompts=["Q"] * 2, responses=[long.replace("{5}", "{6}"), long], ground_truths=["5"] * 2)
    wrong, over = reward(batch)
    assert over.failed is None and over.score == 1.0  # 2 * Q + format, Q = 0
    assert over.diagnostics["over_max_tokens"] == 1.0 and over.diagnostics["Q"] == over.diagnostics["r_maxflow"] == 0.0
    assert wrong.diagnostics["over_max_tokens"] == 0.0 and wrong.score == -2.0 + 1.0  # no pass for a wrong answer
    (failed,) = reward(RolloutBatch(prompts=["Q " * 50], responses=[long], ground_truths=["5"]))
    assert failed.failed.startswith("attention pass failed: the prompt alone has ") and failed.score == 0.0


def test_a_model_that_cannot_be_loaded_fails_every_row_with_the_reason(grader, tmp_path, caplog):
    """Not an exception on every call (verl would mark the group failed and sample it again, forever): the reward
    is built once, says why it cannot run, and every row fails with that reason, counted."""
    missing = str(tmp_path / "no-checkpoint")
    reward = MaxFlowReward(missing, device="cpu", grader=grader, failed_score=-0.5)
    problem = reward.check_ready()
    assert problem.startswith(f"attention model {missing!r} not loaded: ") and reward.attention is None
    assert "every row fails" in caplog.text
    batch = RolloutBatch(
        prompts=["Q"] * 3, responses=[TWO_STEPS, TWO_STEPS.replace("5", "6"), "x"], ground_truths=["5"] * 3
    )
    outs = reward(batch)
    assert [o.score for o in outs] == [-0.5] * 3 and {o.failed for o in outs} == {problem}
    assert reward.failure_counts == {f"attention model {missing!r} not loaded": 3}
    joint = WeightedSumReward({"maxflow": reward, "lcs": Const([0.0])}, {"maxflow": 1.0, "lcs": 1.0})
    assert joint.check_ready() == f"component 'maxflow': {problem}"


def test_through_verl_a_model_that_cannot_be_loaded_gives_failed_rows(tmp_path):
    """verl's per-sample path returns the failed row (`failed` = 1, counted by the trainer) instead of raising."""
    import sarl.backends.verl.reward as bridge

    cfg = {"_target_": "baselines.maxflow.reward.MaxFlowReward", "model": str(tmp_path / "nowhere"), "device": "cpu"}
    out = asyncio.run(bridge.compute_score("math", TWO_STEPS, "5", {"user_prompt": "Q", "uid": "u"}, reward=cfg))
    assert out["failed"] == 1.0 and out["score"] == 0.0
    assert bridge.reward_from_config(cfg) is bridge.reward_from_config(cfg)  # built, and loaded, once


def test_the_attention_model_goes_to_gpu_0_or_the_named_device():
    from baselines.maxflow.attention import default_device, planned_gpu

    assert default_device() == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert planned_gpu(None) == planned_gpu("cuda") == planned_gpu("cuda:0") == 0 and planned_gpu("cuda:3") == 3
    assert planned_gpu("cpu") is None
    with pytest.raises(ValueError, match="use null, cpu, cuda or cuda:N"):
        planned_gpu("gpu0")


# --------------------------------------------------------------------------------- configs and joint


def reward_config(name, overrides=()):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="score", overrides=[f"reward={name}", *overrides]).reward


def test_maxflow_config_instantiates_on_the_tiny_policy(tiny_qwen3):
    path, _, _ = tiny_qwen3
    cfg = reward_config("maxflow", [f"reward.model={path}", "reward.layers=[-1]", "reward.device=cpu"])
    assert cfg.tau == 0.05 and cfg.maxflow_weight == 2.0 and cfg.format_weight == 1.0
    assert list(reward_config("maxflow").layers) == [-5, -4, -3, -2, -1]
    reward = instantiate(cfg)
    assert isinstance(reward, MaxFlowReward) and isinstance(reward, Reward) and reward.attention.layers == [1]
    with pytest.raises(Exception, match="policy checkpoint"):
        instantiate(reward_config("maxflow"))  # score.yaml has no model group: the model must be given


def test_joint_config_is_flow_plus_lcs_one_to_one_with_the_format_score_once(tiny_qwen3):
    path, _, _ = tiny_qwen3
    cfg = reward_config(
        "lcs_maxflow",
        [f"reward.components.maxflow.model={path}", "reward.components.maxflow.layers=[-1]"],
    )
    assert dict(cfg.weights) == {"maxflow": 1.0, "lcs": 1.0}
    assert cfg.components.maxflow.format_weight == 1.0 and cfg.components.lcs.format_weight == 0.0
    joint = instantiate(cfg)
    assert isinstance(joint, WeightedSumReward) and joint.group_reward
    assert type(joint.components["maxflow"]).__name__ == "MaxFlowReward"
    assert "lcs/r_lcs" in joint.diagnostic_keys and "maxflow/Q" in joint.diagnostic_keys


class Const(RewardFunction):
    diagnostic_keys = ("x",)

    def __init__(self, scores, failed=None):
        super().__init__()
        self.scores, self.failed = scores, failed or {}

    def score(self, batch):
        return [RewardOutput(s, {"x": s}, self.failed.get(i)) for i, s in enumerate(self.scores)]


def test_weighted_sum_combines_prefixes_and_fails_loudly():
    joint = WeightedSumReward({"a": Const([1.0, 2.0]), "b": Const([0.5, -1.0], {1: "boom"})}, {"a": 1.0, "b": 2.0})
    o1, o2 = joint(RolloutBatch.from_responses(["r1", "r2"]))
    assert o1.score == 2.0 and o1.diagnostics == {"a/score": 1.0, "a/x": 1.0, "b/score": 0.5, "b/x": 0.5}
    assert o2.failed == "b: boom" and o2.score == 0.0
    with pytest.raises(ValueError, match="name the components"):
        WeightedSumReward({"a": Const([1.0])}, {"b": 1.0})
    with pytest.raises(ValueError, match="finite"):
        WeightedSumReward({"a": Const([1.0])}, {"a": math.inf})


# ------------------------------------------------------------------------------------------- backends


def test_through_the_verl_per_sample_reward_function(tiny_qwen3):
    """verl's reward workers call `compute_score` per sample with the resolved reward config."""
    import sarl.backends.verl.reward as bridge

    path, _, _ = tiny_qwen3
    cfg = {
        "_target_": "baselines.maxflow.reward.MaxFlowReward",
        "model": path,
        "layers": [0, 1],
        "tau": 0.0,
        "device": "cpu",
    }

    async def run_all():
        return await asyncio.gather(
            *[
                bridge.compute_score("math", r, "5", {"user_prompt": "What is x plus y?", "uid": "u"}, reward=cfg)
                for r in (RESPONSE, TWO_STEPS.replace("5", "6"))
            ]
        )

    a, b = asyncio.run(run_all())
    direct = bridge.reward_from_config(cfg)(
        RolloutBatch(
            prompts=["What is x plus y?"] * 2,
            responses=[RESPONSE, TWO_STEPS.replace("5", "6")],
            ground_truths=["5", "5"],
        )
    )
    assert a["score"] == pytest.approx(direct[0].score) and b["score"] == pytest.approx(-2.0 + 1.0)
    assert set(a) == set(b) == {"score", "failed", *MaxFlowReward.diagnostic_keys}
    assert math.isnan(b["Q"]) and 0 < a["Q"] < 1


def test_through_the_trl_reward_function(tiny_qwen3, grader):
    trl_rewards = pytest.importorskip("sarl.backends.trl.rewards")
    path, _, _ = tiny_qwen3
    reward = MaxFlowReward(path, layers=[0, 1], tau=0.0, device="cpu", grader=grader)
    fn = trl_rewards.TRLReward(reward, num_generations=2)
    scores = fn(prompts=["What is x plus y?"] * 2, completions=[RESPONSE, "no"], ground_truth=["5", "5"])
    direct = reward(
        RolloutBatch(prompts=["What is x plus y?"] * 2, responses=[RESPONSE, "no"], ground_truths=["5", "5"])
    )
    assert scores == pytest.approx([o.score for o in direct]) and scores[1] == -2.0


def test_joint_reward_through_the_trl_reward_function(grader):
    """FLOW:LCS 1:1 on one group: the sum of the MaxFlow reward (format included) and the LCS reward
    without its format term."""
    from baselines.lcs import LCSReward

    trl_rewards = pytest.importorskip("sarl.backends.trl.rewards")
    flow = maxflow_reward(grader, FixedAttention(MATRIX))
    lcs = LCSReward(format_weight=0.0, grader=grader)
    joint = WeightedSumReward({"maxflow": flow, "lcs": lcs}, {"maxflow": 1.0, "lcs": 1.0})
    group = [TWO_STEPS, TWO_STEPS.replace("5", "6"), "<think><assumption> x</think> \\boxed{5}"]
    scores = trl_rewards.TRLReward(joint, num_generations=3)(
        prompts=["Q"] * 3, completions=group, ground_truth=["5"] * 3
    )
    batch = RolloutBatch(prompts=["Q"] * 3, responses=group, ground_truths=["5"] * 3, group_ids=["g"] * 3)
    expected = [a.score + b.score for a, b in zip(flow(batch), lcs(batch))]
    assert scores == pytest.approx(expected) and scores[0] == pytest.approx(2 / 3 + 1 + lcs(batch)[0].score)
