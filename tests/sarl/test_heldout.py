"""The held-out before/after evaluation (sarl/reports/heldout.py) and the smoke run's held-out prompts."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from sarl.reports import heldout as ho
from sarl.smoke import DATA_DIR, make_data


def _sample(prompt: int, sr: float | None, correct: bool = False, **kw) -> ho.Sample:
    base = dict(n_steps=4, length=50, boxed=True, truncated=False, repeated_tags=False)
    base.update(kw)
    return ho.Sample(prompt=prompt, sr=sr, correct=correct, **base)


def test_shipped_heldout_prompts_are_disjoint_from_training_and_traces():
    read = lambda name: [json.loads(x) for x in (DATA_DIR / name).read_text().splitlines() if x.strip()]  # noqa: E731
    heldout, train, traces = read("heldout.trl.jsonl"), read("train.trl.jsonl"), read("traces.jsonl")
    assert len(heldout) == 64
    problems = [make_data.operation(r) for r in heldout]
    assert len(set(problems)) == len(problems)
    assert not set(problems) & {make_data.operation(r) for r in train + traces}
    ho.check_disjoint(heldout, train, "shipped")  # the text check the run makes
    for row in heldout:  # the gold is the arithmetic of the question
        a, op, b = make_data.operation(row)
        assert row["ground_truth"] == str(make_data.eval_op(a, b, op))


def test_make_data_rewrites_the_shipped_files_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(make_data, "DATA_DIR", tmp_path)
    make_data.main()
    for name in ("traces.jsonl", "train.trl.jsonl", "dpo.jsonl", "heldout.trl.jsonl"):
        assert (tmp_path / name).read_text() == (DATA_DIR / name).read_text(), name


def test_check_disjoint_names_a_shared_prompt():
    row = {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "ground_truth": "4"}
    with pytest.raises(ValueError, match="1 held-out prompts are training prompts too"):
        ho.check_disjoint([row], [row], "x.jsonl")


def test_summary_worked_values():
    # prompt 0: SR 0.2, 0.4 (mean 0.3); prompt 1: SR 0.6, one failed (mean 0.6)
    samples = [
        _sample(0, 0.2, correct=True, length=10),
        _sample(0, 0.4, length=30, truncated=True),
        _sample(1, 0.6, correct=True, length=20, repeated_tags=True),
        _sample(1, None, boxed=False, length=40),
    ]
    s = ho.summarize(samples)
    assert s["sr_mean"] == pytest.approx(0.45)  # mean of the per-prompt means 0.3 and 0.6
    assert s["sr_se"] == pytest.approx(np.std([0.3, 0.6], ddof=1) / math.sqrt(2))
    assert s["accuracy"] == pytest.approx(0.5)
    assert s["length"] == pytest.approx(25.0)
    assert (s["boxed"], s["truncated"], s["repeated_tags"]) == (0.75, 0.25, 0.25)
    assert (s["sr_failed"], s["samples"], s["prompts"]) == (1, 4, 2)


def test_paired_bootstrap_interval():
    before = {i: 0.5 for i in range(40)}
    # a constant shift has a zero-width interval at the shift
    lo, hi = ho.paired_bootstrap_ci(before, {i: 0.6 for i in range(40)}, n_boot=500)
    assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
    # pairing: prompt effects cancel, so a shift far below the spread between prompts is still detected
    rng = random.Random(0)
    base = {i: rng.uniform(0.0, 1.0) for i in range(40)}
    after = {i: v + 0.02 + rng.uniform(-0.005, 0.005) for i, v in base.items()}
    lo, hi = ho.paired_bootstrap_ci(base, after, n_boot=2000, seed=1)
    assert 0.0 < lo < 0.02 < hi
    # no effect: the interval covers zero
    noise = {i: v + rng.uniform(-0.05, 0.05) for i, v in base.items()}
    lo, hi = ho.paired_bootstrap_ci(base, noise, n_boot=2000)
    assert lo < 0 < hi
    # prompts present on one side only are left out; fewer than two pairs has no interval
    assert all(math.isnan(x) for x in ho.paired_bootstrap_ci({0: 0.1}, {0: 0.2, 1: 0.3}))


def test_delta_block_has_the_documented_keys():
    before = [_sample(p, 0.4 + 0.01 * p) for p in range(4) for _ in range(2)]
    after = [_sample(p, 0.5 + 0.01 * p, correct=True) for p in range(4) for _ in range(2)]
    d = ho.delta(before, after, n_boot=200, seed=0)
    assert d["sr_mean"] == pytest.approx(0.1)
    assert d["accuracy"] == pytest.approx(1.0)
    assert d["sr_delta_ci95"] == pytest.approx([0.1, 0.1])
    assert set(ho.DELTA_FIGURES) <= set(d)


def test_measure_on_real_structure_reward(tmp_path):
    from sarl.structure.embed.local import SentenceTransformerEmbedder
    from sarl.structure.reward import StructureReward

    reward = StructureReward(SentenceTransformerEmbedder(), variant="sarl", clustering="kmeans")
    good = "<think>\nI need 2 + 2.\n\nTwo and two make 4.\n\nCheck: 4 - 2 = 2.\n</think>\n\nThe answer is \\boxed{4}."
    twice = "<think>\nA.\n\n</think>\n\nB.</think> \\boxed{5}"
    samples = ho.measure([[(good, 30, False), (twice, 192, True)]], ["4"], reward)
    assert [s.correct for s in samples] == [True, False]
    assert [s.boxed for s in samples] == [True, True]
    assert [s.truncated for s in samples] == [False, True]
    assert [s.repeated_tags for s in samples] == [False, True]
    assert samples[0].n_steps == 3 and 0.0 <= samples[0].sr <= 1.5


def test_progress_says_how_far_at_most_every_interval_with_what_is_left():
    """No silent minute: a line at most `every_s` apart while tokens come, naming the prompts done, the batch's
    new tokens against the cap, the time so far and an upper bound of the time left."""
    from sarl.reports import heldout

    clock = iter([0.0, 0.0, 3.0, 11.0, 12.0, 25.0, 40.0])
    said: list[str] = []
    real = heldout.time.monotonic
    heldout.time.monotonic = lambda: next(clock)
    try:
        p = heldout.Progress("held-out before training", total=16, max_new_tokens=100, every_s=10.0, say=said.append)
        p.begin(8)
        for _ in range(4):  # the prompt, then 3 new tokens, at 3, 11 and 12 s
            p.put(None)
        p.end()
        p.begin(8)
        p.put(None)  # the prompt at 25 s: a line
        p.put(None)  # 40 s: another
    finally:
        heldout.time.monotonic = real
    assert len(said) == 3, said
    assert said[0].startswith("held-out before training: 0/16 prompts done, 2/100 new tokens of the next 8; 11 s")
    assert said[1].startswith("held-out before training: 8/16 prompts done, 0/100 new tokens of the next 8; 25 s")
    assert said[1].endswith("at most 25 s left")  # half the prompts in 25 s: at most as long again


def test_reporting_progress_changes_nothing_that_is_sampled(tiny_qwen3_dir):
    """The streamer only counts: the same seed samples the same responses with and without it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from sarl.reports.heldout import Progress, generate

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_qwen3_dir))
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    prompts = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(3)]
    kwargs = dict(n=2, max_new_tokens=8, temperature=1.0, seed=3, batch_prompts=2)
    said: list[str] = []
    plain = generate(model, tokenizer, prompts, **kwargs)
    shown = generate(model, tokenizer, prompts, **kwargs, progress=Progress("t", 3, 8, every_s=0.0, say=said.append))
    assert plain == shown and len(said) >= 2 and said[-1].startswith("t: 2/3 prompts done")
