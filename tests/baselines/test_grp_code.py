"""GRP's graph rewards on code (GRP Sec. 3.2 on the code traces of App. C.3, E; decisions §4): R_graph (Eq. 13) from
the graph blocks inside <think>, the accuracy r_acc of Eq. (14) the execution outcome of the <answer> block's code
(`baselines.code_exec`, reused), summed (GRPO) or packed for SCAE (Eq. 14-16); a broken sandbox masks the row."""

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from baselines.code_exec import CodeExecReward
from baselines.grp import GRPReward
from baselines.pasc_grpo import scae_advantages, unpack_scae
from sarl.checking.code.sandbox import Sandbox
from sarl.contract.reward import RolloutBatch

CONF = str(Path(__file__).resolve().parents[2] / "conf")
TESTS = {"tests": "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(5, 5) == 10\n"}
SANDBOX = {"timeout_s": 2.0, "memory_mb": 512}
PASSING = "def add(a, b):\n    return a + b\n"
FAILING = "def add(a, b):\n    return a - b\n"
PARTIAL = "def add(a, b):\n    return a + b if a < 5 else 0\n"  # 2 of the 3 asserts pass


def node(i, parents, content):
    return json.dumps({"id": i, "parents_id": parents, "content": content})


# known 1 (3 words), associate 2 (2 words, no parents, not reachable from the start), aggregate 3 <- {1, 2}
# (3 words): R_fmt = 1, R_conn = 1, R_ers = (3 + 3) / 8 = 0.75, R_reach = 1, R_rev = 3/3 = 1, so
# R_graph = 0.2 * (1 + 1 + 0.75 + 1 + 1) = 0.95 (Eq. 13, uniform weights)
GRAPH = (
    "<think>\n<known>\n"
    + node(1, [], "add two numbers")
    + "\n</known>\n<associate>\n"
    + node(2, [], "operator +")
    + "\n</associate>\n<aggregate>\n"
    + node(3, [1, 2], "add returns a+b")
    + "\n</aggregate>\n</think>\n"
)
R_GRAPH = 0.95


def answered(code, graph=GRAPH):
    """GRP's code format (App. C.1 criterion 9 as rebuilt in conf/synthesize/prompts/grp_translate_code.txt): the
    graph in <think>, the complete code in a ```python block inside <answer>."""
    return f"{graph}<answer>```python\n{code}```</answer>"


BROKEN_GRAPH = "<think>\nI just write it.\n</think>\n"  # text outside a label block: a parse failure, R_graph 0


def batch(responses, gold=TESTS):
    return RolloutBatch(prompts=["Q"] * len(responses), responses=responses, ground_truths=[gold] * len(responses))


@pytest.fixture(scope="module")
def code_exec():
    return CodeExecReward(sandbox=SANDBOX, max_workers=2)


def test_valid_graph_with_passing_failing_and_no_code(code_exec):
    """score = r_acc + R_graph (combine=sum): passing code 1 + 0.95, failing code 0 + 0.95, no code 0 + 0.95; the
    code is the <answer> block's: a fenced block after </think> but outside <answer> is not run (decisions §4)."""
    responses = [
        answered(PASSING),
        answered(FAILING),
        GRAPH + "<answer>a + b</answer>",  # an answer block without a code block
        GRAPH + f"```python\n{PASSING}```",  # code, but no <answer> block
        BROKEN_GRAPH + f"<answer>```python\n{PASSING}```</answer>",  # passing code, no graph
    ]
    reward = GRPReward(outcome="code_exec", code_exec=code_exec)
    out = reward(batch(responses))
    assert [o.score for o in out] == pytest.approx([1 + R_GRAPH, R_GRAPH, R_GRAPH, R_GRAPH, 1.0])
    assert [o.diagnostics["acc"] for o in out] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert [o.diagnostics["R_graph"] for o in out] == pytest.approx([R_GRAPH] * 4 + [0.0])
    assert out[0].diagnostics["R_ers"] == pytest.approx(0.75) and out[0].diagnostics["code/passed"] == 1.0
    assert out[1].diagnostics["code/failed"] == 1.0 and out[1].diagnostics["pass_fraction"] == pytest.approx(1 / 3)
    assert out[2].diagnostics["code/no_code_block"] == 1.0 and out[2].diagnostics["no_answer"] == 0.0
    assert out[3].diagnostics["code/no_code_block"] == 1.0 and out[3].diagnostics["no_answer"] == 1.0
    assert out[4].diagnostics["parse_failed"] == 1.0 and reward.parse_errors == {"text outside a label block": 1}
    assert all(o.failed is None for o in out)
    assert set(out[0].diagnostics) <= set(reward.diagnostic_keys) and "code/passed" in reward.diagnostic_keys
    assert "code/passed" not in GRPReward.diagnostic_keys  # the math reward's keys are unchanged


def test_scae_packs_the_execution_outcome_and_its_advantages(code_exec):
    """combine=scae: pack_scae(r_acc, R_graph), correct -> 2 + R_graph, wrong -> R_graph - 3. One group of four:
    r_acc = [1, 1, 0, 0], R_graph = [0.95, 0, 0.95, 0]; mean accuracy 0.5, mean R_graph 0.475 in each stratum:
    A = [0.5 + 0.475, 0.5 + max(0, -0.475), -0.5 + min(0, 0.475), -0.5 - 0.475] (Eq. 14-16)."""
    responses = [
        answered(PASSING),
        BROKEN_GRAPH + f"<answer>```python\n{PASSING}```</answer>",
        answered(FAILING),
        "<think>never closed",  # truncated: no graph, no code
    ]
    out = GRPReward(combine="scae", outcome="code_exec", code_exec=code_exec)(batch(responses))
    scores = np.array([o.score for o in out])
    assert scores == pytest.approx([2 + R_GRAPH, 2.0, R_GRAPH - 3, -3.0])
    acc, aux = unpack_scae(scores)
    assert acc.tolist() == [1.0, 1.0, 0.0, 0.0] and aux == pytest.approx([R_GRAPH, 0.0, R_GRAPH, 0.0])
    adv = scae_advantages(acc, aux, np.array(["u"] * 4))
    assert adv == pytest.approx([0.975, 0.5, -0.5, -0.975])


def test_pass_fraction_is_the_outcome_term_under_sum_and_refused_under_scae():
    fraction = CodeExecReward(score="pass_fraction", sandbox=SANDBOX)
    out = GRPReward(outcome="code_exec", code_exec=fraction)(batch([answered(PARTIAL)]))
    assert out[0].score == pytest.approx(2 / 3 + R_GRAPH) and out[0].diagnostics["acc"] == 0.0
    with pytest.raises(ValueError, match="combine=scae needs an accuracy in"):
        GRPReward(combine="scae", outcome="code_exec", code_exec={"score": "pass_fraction"})


def test_a_broken_sandbox_or_missing_tests_mask_the_row_not_zero():
    broken = CodeExecReward(sandbox=Sandbox(timeout_s=1, python="/nonexistent/python3"))
    reward = GRPReward(outcome="code_exec", code_exec=broken)
    out = reward(batch([answered(PASSING), GRAPH + "<answer>none</answer>"]))
    assert out[0].failed.startswith("sandbox error") and out[0].diagnostics["code/sandbox_error"] == 1.0
    assert out[1].failed is None and out[1].score == pytest.approx(R_GRAPH)  # judged without the sandbox
    assert reward.failure_counts == {"sandbox error": 1} and "set python=" in reward.check_ready()
    no_tests = GRPReward(outcome="code_exec", code_exec={"sandbox": SANDBOX})(batch([answered(PASSING)], gold="3"))
    assert no_tests[0].failed.startswith("unusable ground truth")
    assert GRPReward().check_ready() is None


def test_bad_outcome_settings_are_refused():
    with pytest.raises(ValueError, match="reward.outcome='tests' is not valid; choose one of: answer, code_exec"):
        GRPReward(outcome="tests")
    with pytest.raises(ValueError, match="reward.code_exec is set but reward.outcome=answer"):
        GRPReward(code_exec={"score": "all_pass"})


def reward_config(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="score", overrides=list(overrides)).reward


def settings(sandbox):
    return {k: v for k, v in vars(sandbox).items() if not k.startswith("_")}


def test_grp_code_config_takes_code_execs_settings():
    reward = instantiate(reward_config("reward=grp_code"))
    plain = instantiate(reward_config("reward=code_exec"))
    assert isinstance(reward, GRPReward) and reward.outcome == "code_exec" and reward.combine == "sum"
    assert reward.code_exec.mode == "all_pass" and settings(reward.code_exec.sandbox) == settings(plain.sandbox)
    one_override = instantiate(reward_config("reward=grp", "reward.outcome=code_exec"))
    assert one_override.code_exec.mode == "all_pass" and settings(one_override.code_exec.sandbox) == settings(
        plain.sandbox
    )
    assert instantiate(reward_config("reward=grp")).code_exec is None  # math: unchanged


def test_through_the_verl_per_sample_reward_function():
    import sarl.backends.verl.reward as bridge

    cfg = {"_target_": "baselines.grp.GRPReward", "combine": "scae", "outcome": "code_exec", "code_exec": {}}

    async def run_all():
        return await asyncio.gather(
            *[bridge.compute_score("code", r, TESTS, {"uid": "u"}, reward=cfg) for r in (answered(PASSING), "x")]
        )

    a, b = asyncio.run(run_all())
    assert a["score"] == pytest.approx(2 + R_GRAPH) and a["code/passed"] == 1.0
    assert b["score"] == -3.0 and b["parse_failed"] == 1.0 and b["code/no_code_block"] == 1.0


def test_shipped_code_sft_traces_are_graphs_with_code_under_the_rl_prompt():
    """sarl/samples/sft/grp_code.jsonl (conf/data/sft_grp_code.yaml): each trace passes the synthesis checks
    (`graph_issues`, R_fmt = 1) with a compiling ```python block in <answer>, and its prompt is the RL stage's
    (the question + grp_code_rl's prompt_suffix), which is what grp_sample_code.txt renders (decisions §4)."""
    import ast

    from baselines.grp import graph_rewards
    from sarl.checking.code.sandbox import last_code_block
    from sarl.data.synthesize.inputs import load_prompt
    from sarl.data.synthesize.verify import graph_issues
    from sarl.formats.graph import parse_graph
    from sarl.launch.compose import compose_train_config

    suffix = compose_train_config(["+exp=grp_code_paper"])[0].data.prompt_suffix
    path = Path(__file__).resolve().parents[2] / "sarl" / "samples" / "sft" / "grp_code.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert 5 <= len(rows) <= 8
    for row in rows:
        prompt, text = row["prompt"][0]["content"], row["completion"][0]["content"]
        assert prompt.endswith(suffix)
        assert load_prompt("grp_sample_code.txt").render(question=prompt[: -len(suffix)]) == prompt
        parse = parse_graph(text)
        assert graph_issues(parse, [], "code", None) == [] and graph_rewards(parse)["R_fmt"] == 1.0
        ast.parse(last_code_block(parse.answer))
