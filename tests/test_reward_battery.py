"""Every reward of conf/reward/ scores whatever a policy writes: a battery of hostile responses (empty, markup only,
1 MB, 10,000 steps, NUL bytes, lone surrogates, invalid UTF-8, unbalanced tags, invisible characters, text past the
embedder's context, huge numbers, deep nesting) gets a finite score and never `failed` (issue 47.2): a masked row has
no advantage, so a response that could mask itself would switch off its own negative reward. Each case runs as a
group of 4 copies and beside normal siblings, bare and as the reasoning of a correct answer (the deeper paths: the
attention pass, the LCS reference, the embedded reasoning). Masks stay for the trusted side only (docs/decisions.md
"Masked outcomes, reward by reward").

Each reward is built from its conf/reward/*.yaml as `sarl.score` builds it; the stand-ins replace only the external
services: the embedding server (`ServerLikeEmbedder`: the in-process MiniLM of conf/embedding/local.yaml, which cuts
a text at its 256-token context, behind the checks a vLLM server makes) and the policy checkpoint of MaxFlow (a tiny
Qwen3). The code sandbox is the real one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from sarl.contract.reward import RolloutBatch, build_reward
from sarl.formats.tags import structured_prompt
from sarl.structure.embed.base import Embedder

CONF = Path(__file__).resolve().parents[1] / "conf"
REWARD_FILES = sorted(p.stem for p in (CONF / "reward").glob("*.yaml"))
GROUP = 4

# ---------------------------------------------------------------------------------------------------------------------
# The battery: what a policy can write
# ---------------------------------------------------------------------------------------------------------------------

WORDS = "the sum of two and three is five so we check it again "  # 12 words, 56 characters
DEEP = 5000


def megabyte() -> str:
    return (WORDS * ((1 << 20) // len(WORDS) + 1))[: 1 << 20]


CASES: dict[str, str] = {
    "empty": "",
    "whitespace": " \n\n\t\n " * 100,
    "think_only": "<think></think>",
    "boxed_empty": "\\boxed{}",
    "fence_empty": "```python\n```",
    "close_think_x50": "</think>" * 50,
    "structured_tags_only": "<think><rephrase></rephrase><verify></verify><summarize></summarize></think>",
    "grp_labels_only": "<think>\n<known>\n</known>\n<aggregate>\n</aggregate>\n</think>\n<answer></answer>",
    "one_megabyte": megabyte(),
    "ten_thousand_paragraphs": "\n\n".join(f"Step {i}: {WORDS}" for i in range(10_000)),
    "ten_thousand_tagged_steps": "\n".join(f"<verify> {i} plus one is {i + 1}." for i in range(10_000)),
    "ten_thousand_graph_nodes": "<known>\n"  # one block of 9,999 nodes whose parent lies outside it
    + json.dumps({"id": 0, "parents_id": [], "content": "two and three"})
    + "\n</known>\n<refine>\n"
    + "\n".join(json.dumps({"id": i, "parents_id": [0], "content": f"step {i}"}) for i in range(1, 10_000))
    + "\n</refine>",
    "graph_escaped_characters": "<known>\n"  # JSON escapes: ASCII text that decodes to a lone surrogate, a NUL
    + "\n".join('{"id": %d, "parents_id": [], "content": "\\%s"}' % (i, c) for i, c in enumerate(["ud800", "u0000"]))
    + "\n</known>",
    "identical_steps": "The same step again.\n\n" * 2000,
    "nul_bytes": "\x00" * 1000 + "<think>\x00</think>\x00\\boxed{\x005}\x00",
    "lone_surrogates": "\ud800<think>\udfff\n\n\ud800</think>\\boxed{\ud8005}",
    "invalid_utf8": (b"\xff\xfe\xfd\xc3\x28\xa0\xa1\xe2\x28\xa1" * 100).decode("utf-8", "replace") + "\\boxed{5}",
    "tagged_weird_characters": "\n".join(
        f"<verify> {c} holds" for c in ("\x00", "\ud800", "\udfff", "\ufffd", "\u200b", "\u202e", "\ufeff", "\x7f", "")
    ),
    "tagged_empty_steps": "<verify>" * 300,
    "tagged_many_steps": "\n".join(f"<verify> {i}." for i in range(250)),  # within MaxFlow's max_tokens: the flow
    "nested_think": "<think><think>x</think>",
    "unclosed_think_x1000": "<think>" * 1000,
    "answer_only_controls": "<think>Plan: add them.</think>\x00\x01\x7f\x9f\x1b",
    "answer_only_invisible": "<think>Plan: add them.</think>\u200b\ufeff\u202e",
    "invisible_and_rtl": "\u200b\u202e\ufeff" * 300 + "\n\n" + "\u202e5\u202c\u200b" + "\\boxed{\u200b5\u202e}",
    "past_embedder_context": " ".join(WORDS.split() * 4200),  # 50,400 words in one step
    "huge_boxed_number": "\\boxed{" + "9" * 10_000 + "}",
    "huge_power": "\\boxed{10^{100000}}",
    "huge_tower": "\\boxed{9^{9^{9^{9^{9}}}}}",
    "deep_braces": "\\boxed{" + "{" * DEEP + "5" + "}" * DEEP + "}",
    "unbalanced_braces": "\\boxed{" * DEEP + "5",
    "deep_json": "<think>\n<known>\n" + "[" * DEEP + "]" * DEEP + "\n</known>\n</think>",
    "fenced_nul": "```python\ndef add(a, b):\x00\n    return a + b\n```",
    "fenced_surrogate": "```python\ndef add(a, b):\n    return '\ud800'\n```",
    "fenced_deep_parens": "```python\nx = " + "(" * DEEP + ")" * DEEP + "\n```",
    "fenced_megabyte": "```python\n" + "# " + megabyte() + "\n```",
}

# ---------------------------------------------------------------------------------------------------------------------
# What a normal response looks like, per family of reward
# ---------------------------------------------------------------------------------------------------------------------

TESTS = {"tests": "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(5, 5) == 10\n"}
CODE = "```python\ndef add(a, b):\n    return a + b\n```"
QUESTION = "What is 2 plus 3?"


def node(i: int, parents: list[int], content: str) -> str:
    return json.dumps({"id": i, "parents_id": parents, "content": content})


GRAPH = (
    f"<known>\n{node(1, [], 'two')}\n{node(2, [], 'three')}\n</known>\n"
    f"<aggregate>\n{node(3, [1, 2], 'two plus three is five')}\n</aggregate>"
)


@dataclass(frozen=True)
class Family:
    """The rows a reward of one kind needs: its prompt, its ground truth, the final answer that is correct (after
    `</think>`), and two normal responses (one correct, one wrong)."""

    prompt: str
    gold: object
    final: str
    normal: tuple[str, str]


MATH = Family(
    QUESTION,
    "5",
    "The answer is \\boxed{5}.",
    (
        "<think>\nPlan: add two and three.\n\nCalc: 2 + 3 = 5.\n\nCheck: 5 - 3 = 2.\n</think>\n\\boxed{5}",
        "<think>\nPlan: multiply them.\n\nCalc: 2 * 3 = 6.\n</think>\n\\boxed{6}",
    ),
)
STRUCTURED = Family(
    structured_prompt(QUESTION),
    "5",
    "\\boxed{5}",
    (
        "<think>\n<decompose> We add 2 and 3.\n<formalize> 2 + 3 = 5.\n<verify> 5 - 3 = 2.\n</think>\n\\boxed{5}",
        "<think>\n<decompose> We multiply.\n<formalize> 2 * 3 = 6.\n</think>\n\\boxed{6}",
    ),
)
GRP = Family(
    QUESTION,
    "5",
    "<answer>\\boxed{5}</answer>",
    (f"<think>\n{GRAPH}\n</think>\n<answer>\\boxed{{5}}</answer>", f"<think>\n{GRAPH}\n</think>\n<answer>6</answer>"),
)
CODE_FAMILY = Family(
    "Write add(a, b).",
    TESTS,
    CODE,
    (
        f"<think>I add them.</think>\n{CODE}",
        "<think>I subtract.</think>\n```python\ndef add(a, b):\n    return a - b\n```",
    ),
)
GRP_CODE = Family(
    "Write add(a, b).",
    TESTS,
    f"<answer>\n{CODE}\n</answer>",
    (f"<think>\n{GRAPH}\n</think>\n<answer>\n{CODE}\n</answer>", f"<think>\n{GRAPH}\n</think>\n<answer>none</answer>"),
)

# Every conf/reward/*.yaml file: its family of rows and the settings the test changes (none but the stand-ins').
SETUPS: dict[str, Family] = {
    "code_exec": CODE_FAMILY,
    "empo": MATH,
    "empo_open_ended": MATH,
    "evol_rl": MATH,
    "ground_truth": MATH,
    "grp": GRP,
    "grp_code": GRP_CODE,
    "lcs": STRUCTURED,
    "lcs_maxflow": STRUCTURED,
    "maxflow": STRUCTURED,
    "sarl": MATH,
    "sarl_c_only": MATH,
    "sarl_l_only": MATH,
    "structured_accuracy": STRUCTURED,
    "ttrl": MATH,
}
MAXFLOW_TOKENS = 4096  # the tiny policy's attention pass on CPU: conf/reward/maxflow.yaml's 16384 would take minutes


def answered(body: str, family: Family) -> str:
    """`body` as the reasoning of a correct answer."""
    return f"<think>\n{body}\n</think>\n{family.final}"


# ---------------------------------------------------------------------------------------------------------------------
# Stand-ins for the external services
# ---------------------------------------------------------------------------------------------------------------------


class ServerLikeEmbedder(Embedder):
    """The embedding server as a reward meets it: the real MiniLM of conf/embedding/local.yaml (it cuts a text at its
    256-token context, as the server does with `truncate_prompt_tokens: -1`, conf/embedding/vllm_server.yaml), behind
    the checks of a vLLM server: a text with no characters (no tokens: "the prompt cannot be empty") or one that is
    not valid UTF-8 (a lone surrogate) is rejected."""

    def __init__(self, inner: Embedder) -> None:
        super().__init__(dim=inner.dim)
        self.inner = inner

    def _embed_unique(self, texts):
        reasons = {}
        for j, text in enumerate(texts):
            if not text:
                reasons[j] = "embedding server error: HTTP 400: the prompt cannot be empty"
            else:
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    reasons[j] = "embedding server error: HTTP 400: the input is not valid UTF-8"
        vectors, failed = self.inner._embed_unique([t if j not in reasons else "x" for j, t in enumerate(texts)])
        return vectors, {**failed, **reasons}


@pytest.fixture(scope="module")
def embedder():
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="score", overrides=["embedding=local"])
    return ServerLikeEmbedder(instantiate(cfg.embedding))


@pytest.fixture(scope="module")
def policy_path(tmp_path_factory, byte_tokenizer):
    """A tiny Qwen3 checkpoint (seeded random weights, eager attention): MaxFlow's policy."""
    from testkit import tiny_qwen3

    path = tmp_path_factory.mktemp("battery_policy")
    architecture = {"hidden_size": 64, "intermediate_size": 128, "head_dim": 32, "attn_implementation": "eager"}
    architecture.update(num_hidden_layers=5, max_position_embeddings=1 << 17)  # conf/reward/maxflow.yaml's 5 layers
    tiny_qwen3(byte_tokenizer, path, weights=True, seed=0, **architecture)
    return str(path)


@pytest.fixture(scope="module")
def rewards(embedder, policy_path):
    """name -> the reward its conf/reward/NAME.yaml builds, with the stand-ins (built once each)."""
    built = {}

    def get(name):
        if name not in built:
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                cfg = compose(config_name="score", overrides=[f"reward={name}"]).reward
            for node_cfg in [cfg, *cfg.get("components", {}).values()]:
                if "model" in node_cfg and "layers" in node_cfg:  # MaxFlow: the tiny policy on CPU
                    node_cfg.model, node_cfg.device, node_cfg.max_tokens = policy_path, "cpu", MAXFLOW_TOKENS
                elif "tokenizer" in node_cfg:  # GRP, LCS: the policy's tokens, as in training (model.path)
                    node_cfg.tokenizer = policy_path
            kwargs = {"embedder": embedder} if cfg.get("embedder") is not None else {}
            built[name] = build_reward(cfg, **kwargs)
        return built[name]

    return get


# ---------------------------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------------------------


def test_every_reward_file_has_a_family():
    assert REWARD_FILES and set(REWARD_FILES) == set(SETUPS), (
        f"conf/reward/ and SETUPS differ: give each new reward file its family of rows here: "
        f"{sorted(set(REWARD_FILES) ^ set(SETUPS))}"
    )


def battery_batch(family: Family, body: str) -> tuple[RolloutBatch, list[str]]:
    """Group "copies": 4 copies of the hostile response; group "mixed": the hostile response bare and as reasoning
    beside the two normal ones. Row labels name each row in a failure message."""
    hostile = [body] * GROUP
    mixed = [body, answered(body, family), *family.normal]
    responses = hostile + mixed
    labels = [f"copies[{k}]" for k in range(GROUP)] + ["mixed/bare", "mixed/answered", "normal/correct", "normal/wrong"]
    batch = RolloutBatch(
        prompts=[family.prompt] * len(responses),
        responses=responses,
        group_ids=["copies"] * GROUP + ["mixed"] * len(mixed),
        ground_truths=[family.gold] * len(responses),
        data_sources=["battery"] * len(responses),
    )
    return batch, labels


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", REWARD_FILES)
def test_hostile_responses_get_a_finite_score_and_are_never_masked(name, case, rewards):
    family = SETUPS.get(name)
    assert family is not None, f"conf/reward/{name}.yaml has no family in SETUPS"
    reward = rewards(name)
    batch, labels = battery_batch(family, CASES[case])
    outputs = reward(batch)
    assert len(outputs) == len(batch)
    bad = [(label, o.score, o.failed) for label, o in zip(labels, outputs) if o.failed or not math.isfinite(o.score)]
    assert not bad, f"{name} on {case}: {bad}"


# Where the battery must reach past a reward's early exits (an unanswered response never runs MaxFlow's attention
# pass, LCS's alignment or the sandbox): (reward, case, row, diagnostics the row shows; None: present).
DEEP_PATHS = [
    ("maxflow", "tagged_many_steps", "mixed/answered", {"acc": 1.0, "F": None, "over_max_tokens": 0.0}),
    ("maxflow", "ten_thousand_tagged_steps", "mixed/answered", {"acc": 1.0, "Q": 0.0, "over_max_tokens": 1.0}),
    ("lcs_maxflow", "ten_thousand_tagged_steps", "mixed/answered", {"maxflow/over_max_tokens": 1.0}),
    ("lcs", "ten_thousand_tagged_steps", "mixed/answered", {"acc": 1.0, "n_steps": 10_000.0, "r_lcs": None}),
    ("sarl", "ten_thousand_paragraphs", "mixed/answered", {"steps_capped": 1.0, "n_steps": 1024.0, "C": None}),
    ("evol_rl", "one_megabyte", "mixed/answered", {"valid": 1.0, "majority": 1.0, "novelty": None}),
    ("empo_open_ended", "answer_only_controls", "mixed/bare", {"no_answer": 1.0}),
    ("grp", "ten_thousand_graph_nodes", "mixed/answered", {"parse_failed": 0.0, "n_nodes": 10_000.0}),
    ("grp", "graph_escaped_characters", "mixed/answered", {"parse_failed": 0.0, "n_nodes": 2.0, "R_ers": None}),
    ("code_exec", "fenced_nul", "copies[0]", {"code/syntax_error": 1.0}),
    ("code_exec", "one_megabyte", "mixed/answered", {"code/passed": 1.0}),
    ("grp_code", "fenced_deep_parens", "mixed/answered", {"code/passed": 1.0}),
]


@pytest.mark.parametrize("name,case,row,expected", DEEP_PATHS, ids=[f"{n}-{c}" for n, c, _, _ in DEEP_PATHS])
def test_the_battery_reaches_past_the_early_exits(name, case, row, expected, rewards):
    batch, labels = battery_batch(SETUPS[name], CASES[case])
    diagnostics = rewards(name)(batch)[labels.index(row)].diagnostics
    for key, value in expected.items():
        assert key in diagnostics and (value is None or diagnostics[key] == value), (key, diagnostics)
