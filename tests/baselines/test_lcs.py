"""Structured Reasoning's prompt, tagged-step parser and format score, and the LCS group reward
(Structured Reasoning Sec. 4.3 Eq. 6-7, App. A.4, A.8) on hand-worked cases and through both backends' adapters."""

from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from baselines.lcs import LCSReward, lcs_matches, lcs_rewards, length_ratio, pair_score, weighted_lcs_share
from sarl.contract.reward import Reward, RolloutBatch
from sarl.formats.tags import (
    TAGS,
    TOP_TAGS,
    format_score,
    parse_structured,
    randomized_prompt,
    randomized_tags,
    structured_prompt,
)

CONF = str(Path(__file__).resolve().parents[2] / "conf")

# ------------------------------------------------------------------------------------------- the prompt


def test_the_papers_23_tags_and_prompt():
    assert len(TAGS) == 23 and TAGS[0] == "rephrase" and TAGS[-1] == "intuition" and "case_analysis" in TAGS
    assert structured_prompt("What is 2+3?", ["verify", "summarize"]) == (
        "Please use the following tags at the beginning of each sentence in your reasoning: <verify>, <summarize>.\n"
        "What is 2+3?\n"
        "Please reason step by step, and put your final answer within \\boxed{ }."
    )
    full = structured_prompt("Q")
    assert full.index("<rephrase>") < full.index("<inference>") < full.index("<intuition>")
    with pytest.raises(ValueError, match="unknown tags"):
        structured_prompt("Q", ["verify", "ponder"])


def test_tag_randomisation_keeps_the_top_five_and_adds_zero_to_five_shuffled():
    extras, firsts = set(), set()
    for seed in range(300):
        tags = randomized_tags(np.random.default_rng(seed))
        assert set(TOP_TAGS) <= set(tags) <= set(TAGS) and len(set(tags)) == len(tags)
        extras.add(len(tags) - 5)
        firsts.add(tags[0])
    assert extras == {0, 1, 2, 3, 4, 5} and len(firsts) > 5  # every count drawn; order shuffled
    assert randomized_prompt("Q", 0, "row-7") == randomized_prompt("Q", 0, "row-7")  # reproducible per row
    assert len({randomized_prompt("Q", 0, f"row-{i}") for i in range(20)}) > 10
    with pytest.raises(ValueError, match="max_extra"):
        randomized_tags(np.random.default_rng(0), max_extra=19)


# ------------------------------------------------------------------------------------------- the parser

RESPONSE = (
    "<think>Let me see.\n<rephrase> We need x.</rephrase>\n\n<inference>So x=2 <foo>.\n<Verify> check."
    "</think>\n\nThe answer is \\boxed{2}."
)


def test_tagged_steps_start_at_a_tag_and_closing_tags_are_optional():
    p = parse_structured(RESPONSE)
    assert [s.tag for s in p.steps] == [None, "rephrase", "inference", "verify"]  # case-insensitive
    assert [s.text for s in p.steps] == ["Let me see.", "We need x.", "So x=2 <foo>.", "check."]
    assert [p.text[s.start : s.end] for s in p.steps] == [
        "Let me see.",
        "<rephrase> We need x.</rephrase>",
        "<inference>So x=2 <foo>.",
        "<Verify> check.",
    ]
    assert p.untagged_prefix and p.unknown_tags == 1 and p.closed and not p.truncated
    assert p.answer == "The answer is \\boxed{2}." and p.text[p.answer_start :] == p.answer
    assert p.tag_sequence == ["", "rephrase", "inference", "verify"]
    assert format_score(p) == 0.0  # untagged text before the first tag


def test_reasoning_span_rules_and_free_form_steps():
    truncated = parse_structured("<think><verify> a\n<verify> b")
    assert truncated.truncated and not truncated.closed and len(truncated.steps) == 2 and truncated.answer == ""
    template_opened = parse_structured("<assumption> a</think> \\boxed{1}")  # <think> was in the prompt
    assert template_opened.closed and [s.tag for s in template_opened.steps] == ["assumption"]
    assert format_score(template_opened) == 1.0
    plain = parse_structured("<assumption> a\n<verify> \\boxed{1}")
    assert plain.no_think and plain.answer_start is None and len(plain.steps) == 2
    free = parse_structured("<think> one\n\n two \n\n\n\nthree</think>x", mode="paragraphs")
    assert [s.text for s in free.steps] == ["one", "two", "three"] and all(s.tag is None for s in free.steps)
    assert [free.text[s.start : s.end] for s in free.steps] == ["one", "two", "three"]
    assert parse_structured(None).steps == [] and parse_structured("").answer == ""  # never raises
    with pytest.raises(ValueError, match="step mode"):
        parse_structured("x", mode="sentences")


@pytest.mark.parametrize(
    "response, mode, expected",
    [
        ("<think><verify> a\n<summarize> b</think> so \\boxed{3}", "tags", 1.0),
        ("<think>intro <verify> a</think> \\boxed{3}", "tags", 0.0),  # untagged prefix
        ("<think><verify> a</think> so 3", "tags", 0.0),  # no \boxed{} answer
        ("<think><verify> a \\boxed{3}", "tags", 0.0),  # truncated
        ("<think>just text</think> \\boxed{3}", "tags", 0.0),  # no tag at all
        ("<think>just text</think> \\boxed{3}", "paragraphs", 1.0),  # free-form: any step will do
    ],
)
def test_format_score(response, mode, expected):
    assert format_score(parse_structured(response, mode)) == expected


# ------------------------------------------------------------------------------------------ Eq. (6)-(7)


def test_length_suppression_factor():
    assert length_ratio(10, 5) == 0.25  # l_i > l_j: l_j / (2 l_i)
    assert length_ratio(5, 10) == 0.75  # else 1 - l_i / (2 l_j)
    assert length_ratio(7, 7) == 0.5
    assert length_ratio(0, 4) == 1.0 and length_ratio(4, 0) == 0.0 and length_ratio(0, 0) == 0.5


def test_lcs_by_dynamic_programming_and_its_tie_rule():
    assert lcs_matches(["a", "b", "c", "a"], ["b", "a", "c", "a"]) == [(0, 1), (2, 2), (3, 3)]
    assert lcs_matches([], ["a"]) == [] and lcs_matches(["", "a"], ["", "a"]) == [(1, 1)]  # "" matches nothing
    # two LCSs of length 1: the tie skips r_i's last step first, so x (lengths 1 and 1) is matched, not y
    assert lcs_matches(["x", "y"], ["y", "x"]) == [(0, 1)]
    assert weighted_lcs_share(["x", "y"], [1, 9], ["y", "x"], [9, 1]) == pytest.approx(0.5 * 1 / 10)


def dp_matches(a, b):
    """The LCS pairs by the plain O(|a| |b|) DP table and the module's tie rule: the reference of `lcs_matches`."""
    n, m = len(a), len(b)
    dp = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            dp[i][j] = dp[i - 1][j - 1] + 1 if a[i - 1] and a[i - 1] == b[j - 1] else max(dp[i - 1][j], dp[i][j - 1])
    pairs, i, j = [], n, m
    while i > 0 and j > 0:
        if a[i - 1] and a[i - 1] == b[j - 1]:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif dp[i - 1][j] >= dp[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


def test_bit_parallel_lcs_reads_the_dp_table_and_keeps_its_tie_rule():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        alphabet = ["", *TAGS[: rng.integers(1, 6)]]  # few tags: many ties
        a, b = ([str(t) for t in rng.choice(alphabet, size=rng.integers(0, 30))] for _ in range(2))
        assert lcs_matches(a, b) == dp_matches(a, b), (a, b)
    a, b = ([str(t) for t in rng.choice(["", *TAGS], size=300)] for _ in range(2))
    assert lcs_matches(a, b) == dp_matches(a, b)
    long = lcs_matches(["verify"] * 10_000, ["verify", "summarize"] * 5_000)  # 10^8 cells: a few ms
    assert long == [(k, 2 * k) for k in range(5_000)]


def test_pair_score_cases():
    assert pair_score(0.3, True, True) == 0.3
    assert pair_score(0.3, False, False) == -0.3
    assert pair_score(0.3, True, False) == pytest.approx(0.7)
    assert pair_score(0.3, False, True) == pytest.approx(-0.7)


def test_lcs_rewards_hand_worked():
    """r0: vs r1 both correct, matches a (10 vs 5: ratio 0.25) and b (10 vs 20: 0.75): (2.5 + 7.5)/20 = 0.5;
    vs r2 (wrong, nothing in common): 1 - 0 = 1; mean 0.75. r1: a (5 vs 10: 0.75 -> 3.75), b (20 vs 10:
    0.25 -> 5): 8.75/25 = 0.35, and 1 -> 0.675. r2 (wrong) vs two correct with no common tag: -1."""
    got = lcs_rewards([["a", "b"], ["a", "b"], ["c"]], [[10, 10], [5, 20], [3]], [True, True, False])
    assert got == pytest.approx([0.75, 0.675, -1.0])
    assert lcs_rewards([["a"], ["a"]], [[4], [4]], [False, False]) == [0.0, 0.0]  # none correct: no reference
    assert lcs_rewards([["a"]], [[4]], [True]) == [0.0]  # a group of one: no pair
    assert lcs_rewards([[], ["a"]], [[], [3]], [True, True]) == [0.0, 0.0]  # L_i = 0 -> share 0
    # the untagged step matches nothing but counts in L_0 = 8: a (2 vs 2, ratio 0.5) gives 1/8; L_1 = 2 gives 1/2
    assert lcs_rewards([["", "a"], ["a"]], [[6, 2], [2]], [True, True]) == pytest.approx([0.125, 0.5])
    with pytest.raises(ValueError, match="one entry per completion"):
        lcs_rewards([["a"]], [[1], [2]], [True])
    with pytest.raises(ValueError, match="tags but"):
        lcs_rewards([["a", "b"]], [[1]], [True])
    with pytest.raises(ValueError, match="negative"):
        lcs_rewards([["a"]], [[-1]], [True])


# --------------------------------------------------------------------------------------------- reward

GROUP = [
    "<think><assumption> let x be two\n<verify> x is two</think> so \\boxed{2}",
    "<think><assumption> let x be two now\n<inference> so\n<verify> ok</think> \\boxed{2}",
    "<think><inference> guess three</think> \\boxed{3}",
]


def expected_scores(responses, correct, format_weight=1.0):
    parsed = [parse_structured(r) for r in responses]
    r = lcs_rewards([p.tag_sequence for p in parsed], [[len(s.text.split()) for s in p.steps] for p in parsed], correct)
    return [x + format_weight * format_score(p) for x, p in zip(r, parsed)]


def test_lcs_reward_on_a_group(grader):
    reward = LCSReward(grader=grader)
    outs = reward(RolloutBatch(prompts=["Q"] * 3, responses=GROUP, ground_truths=["2"] * 3, group_ids=["g"] * 3))
    assert [o.score for o in outs] == pytest.approx(expected_scores(GROUP, [True, True, False]))
    assert [o.diagnostics["acc"] for o in outs] == [1.0, 1.0, 0.0]
    assert all(o.diagnostics["group_size"] == 3 and o.diagnostics["format"] == 1.0 for o in outs)
    # r0 vs r1: assumption (4 vs 5 words: 1 - 4/10 = 0.6 -> 2.4) and verify (3 vs 1: 1/6 -> 0.5), L_0 = 7
    assert outs[0].diagnostics["r_lcs"] == pytest.approx(((2.4 + 0.5) / 7 + 1.0) / 2)


def test_a_group_with_no_correct_completion_has_no_lcs_term(grader):
    """Structured Reasoning Sec. 4.3: "The LCS reward requires at least one correct completion as reference".
    Gold 7, every answer wrong: r_lcs = 0 for all, so the score is the format score alone (1.0 each). Under
    Eq. (6) as it stands ("both incorrect": -L_lcs/L_i) r0 would be -(2.4 + 0.5)/7 vs r1 and 0 vs r2 (no tag
    in common), i.e. -0.207. A row without a gold answer is no reference either."""
    reward = LCSReward(grader=grader)
    outs = reward(
        RolloutBatch(
            prompts=["Q"] * 4, responses=[*GROUP, GROUP[0]], ground_truths=["7", "7", "7", None], group_ids=["g"] * 4
        )
    )
    assert [o.score for o in outs[:3]] == [1.0, 1.0, 1.0]
    assert [o.diagnostics["r_lcs"] for o in outs[:3]] == [0.0, 0.0, 0.0]
    assert [o.diagnostics["no_reference"] for o in outs] == [1.0] * 4
    assert outs[3].failed == "no ground truth" and outs[0].diagnostics["group_size"] == 3
    # gold 3: r2 is the reference; r0 vs r1 (both wrong) -(2.4 + 0.5)/7, vs r2 (no common tag) -1 + 0
    one_correct = reward(RolloutBatch(prompts=["Q"] * 3, responses=GROUP, ground_truths=["3"] * 3, group_ids=["g"] * 3))
    assert [o.diagnostics["no_reference"] for o in one_correct] == [0.0] * 3
    assert one_correct[0].diagnostics["r_lcs"] == pytest.approx((-(2.4 + 0.5) / 7 - 1.0) / 2)


def test_lcs_reward_groups_by_id_whatever_the_row_order(grader):
    reward = LCSReward(grader=grader)
    responses = [GROUP[2], "<think><verify> x</think> \\boxed{5}", GROUP[0], GROUP[1], "<think>no tags</think> 5"]
    gids = ["g", "h", "g", "g", "h"]
    outs = reward(
        RolloutBatch(prompts=["Q"] * 5, responses=responses, ground_truths=["2", "5", "2", "2", "5"], group_ids=gids)
    )
    g = expected_scores([GROUP[2], GROUP[0], GROUP[1]], [False, True, True])
    h = expected_scores([responses[1], responses[4]], [True, False])
    assert [o.score for o in outs] == pytest.approx([g[0], h[0], g[1], g[2], h[1]])


def test_rows_without_gold_fail_and_leave_the_group(grader):
    batch = RolloutBatch(prompts=["Q"] * 3, responses=GROUP, ground_truths=["2", None, "2"], group_ids=["g"] * 3)
    outs = LCSReward(grader=grader, failed_score=-9.0)(batch)
    assert outs[1].failed == "no ground truth" and outs[1].score == -9.0 and "r_lcs" not in outs[1].diagnostics
    assert [outs[0].score, outs[2].score] == pytest.approx(expected_scores([GROUP[0], GROUP[2]], [True, False]))
    assert outs[0].diagnostics["group_size"] == 2


def test_step_lengths_in_tokenizer_tokens(grader, byte_tokenizer):
    reward = LCSReward(tokenizer=byte_tokenizer, format_weight=0.0, grader=grader)
    assert reward.count_tokens("plan calc") == len(byte_tokenizer("plan calc", add_special_tokens=False).input_ids)
    outs = reward(RolloutBatch(prompts=["Q"] * 2, responses=GROUP[:2], ground_truths=["2"] * 2, group_ids=["g"] * 2))
    parsed = [parse_structured(r) for r in GROUP[:2]]
    lengths = [[reward.count_tokens(s.text) for s in p.steps] for p in parsed]
    assert [o.score for o in outs] == pytest.approx(lcs_rewards([p.tag_sequence for p in parsed], lengths, [1, 1]))


class CharTokenizer:
    """One token per character: a tokenizer whose counts differ from whitespace words."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text)))}


def test_step_lengths_are_tokens_not_words(grader):
    """Structured Reasoning Sec. 4.3: l_ik are token lengths. Characters: a = (5, 6), b = (10, 2), both correct.
    a: ratios 1 - 5/20 = 3/4 and 2/12 = 1/6, L_lcs = 3/4*5 + 1/6*6 = 4.75 of 11; b: 5/20 and 1 - 2/12,
    L_lcs = 2.5 + 5/3 of 12. In words (2, 1) and (1, 1) the rewards would be 1/3 and 5/8."""
    a = "<think><verify> ab cd <summarize> efghij</think> \\boxed{2}"
    b = "<think><verify> abcdefghij <summarize> xy</think> \\boxed{2}"
    batch = RolloutBatch(prompts=["Q"] * 2, responses=[a, b], ground_truths=["2"] * 2, group_ids=["g"] * 2)
    chars = LCSReward(tokenizer=CharTokenizer(), format_weight=0.0, grader=grader)(batch)
    assert [o.score for o in chars] == pytest.approx([4.75 / 11, (2.5 + 5 / 3) / 12])
    words = LCSReward(tokenizer=None, format_weight=0.0, grader=grader)(batch)
    assert [o.score for o in words] == pytest.approx([1 / 3, 5 / 8])


def test_rows_count_step_lengths_with_their_policys_tokenizer():
    """conf/reward/lcs.yaml: the row's model (the SFT checkpoint in a pipeline's RL stage), in JOINT too."""
    from sarl.launch.compose import compose_train_config

    r1 = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    assert compose_train_config(["+exp=lcs_paper"])[0].reward.tokenizer == r1
    assert compose_train_config(["+exp=lcs_maxflow_paper"])[0].reward.components.lcs.tokenizer == r1
    assert compose_train_config(["+exp=grpo_lcs_math", "model.path=/ckpt"])[0].reward.tokenizer == "/ckpt"


def test_lcs_config_instantiates():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="score", overrides=["reward=lcs"]).reward
    reward = instantiate(cfg)
    assert isinstance(reward, LCSReward) and isinstance(reward, Reward) and LCSReward.group_reward
    assert reward.lcs_weight == 1.0 and reward.format_weight == 1.0
    assert reward.count_tokens.name == "whitespace words"  # no model group (sarl.score)


# ------------------------------------------------------------------------------------------- backends


@pytest.mark.slow  # imports verl (~7 s)
def test_through_the_verl_group_path(grader, byte_tokenizer):
    """What SarlTrainer._compute_reward_colocate runs on a sampled batch (`score_sessions`): TransferQueue rows in
    completion order, token ids decoded, the gold from verl's reward_model column, one reward call per batch."""
    pytest.importorskip("transfer_queue")
    from sarl.backends.verl.trainer import score_sessions
    from sarl.contract.metrics import row_metrics

    order = [2, 0, 1]  # the order the sessions finished in
    ids = [byte_tokenizer(t, add_special_tokens=False)["input_ids"] for t in ["question a", *GROUP]]
    columns = {
        "prompts": [ids[0]] * 3,
        "responses": [ids[1 + i] for i in order],
        "reward_model": [{"ground_truth": "2", "style": "rule"}] * 3,
        "data_source": ["math"] * 3,
        "extra_info": [{"index": 0}] * 3,
    }
    _, infos, per_row = score_sessions(
        LCSReward(grader=grader),
        [f"u_{i}_0" for i in order],
        columns,
        lambda t: byte_tokenizer.decode(t, skip_special_tokens=True),
    )
    expected = expected_scores(GROUP, [True, True, False])
    assert [i["score"] for i in per_row] == pytest.approx([expected[i] for i in order])
    metrics = row_metrics(infos)
    assert metrics["reward/failed"] == 0 and "reward/r_lcs/mean" in metrics


def test_through_the_trl_reward_function(grader):
    trl_rewards = pytest.importorskip("sarl.backends.trl.rewards")
    fn = trl_rewards.TRLReward(LCSReward(grader=grader), num_generations=3)
    scores = fn(prompts=["Q"] * 3, completions=GROUP, ground_truth=["2"] * 3)
    assert scores == pytest.approx(expected_scores(GROUP, [True, True, False]))
