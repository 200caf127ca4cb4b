"""The lm-eval bridge: the request translation (sampling on, no fixed seed, all k repeats kept), the per-repeat
scoring, and one real `lm_eval.simple_evaluate` run on a local task against a loopback chat server."""

from collections import Counter
from types import SimpleNamespace

import pytest
from eval_helpers import chat_reply

from eval.generate import SamplingConfig
from eval.lm_eval_bridge import RepeatScorer, avg_at_k_filters, sampling_gen_kwargs


def test_gen_kwargs_sample_and_keep_the_tasks_stop_sequences():
    task = {"until": ["</s>", "Question:"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 256, "seed": 7}
    out = sampling_gen_kwargs(SamplingConfig(max_tokens=1024), "vllm", task)
    assert out == {
        "until": ["</s>", "Question:"],
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "max_gen_toks": 1024,
    }  # no seed: a seed in gen_kwargs makes every repeat identical
    api = sampling_gen_kwargs(SamplingConfig(top_k=None), "local-chat-completions", task)
    assert api["seed"] is None and "top_k" not in api  # null overrides lm-eval's fixed request seed 1234
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sampling_gen_kwargs(SamplingConfig(temperature=0.0), "vllm", task)


def test_filters_keep_all_k_repeats():
    assert avg_at_k_filters(None, 8) == [{"name": "none", "filter": [{"function": "take_first_k", "k": 8}]}]
    task_filters = [
        {
            "name": "strict-match",
            "filter": [{"function": "regex", "regex_pattern": "(A|B)"}, {"function": "take_first"}],
        },
        {"name": "flexible", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]},
    ]
    assert avg_at_k_filters(task_filters, 4) == [
        {
            "name": "strict-match",
            "filter": [{"function": "regex", "regex_pattern": "(A|B)"}, {"function": "take_first_k", "k": 4}],
        },
        {"name": "flexible", "filter": [{"function": "remove_whitespace"}, {"function": "take_first_k", "k": 4}]},
    ]
    with pytest.raises(ValueError, match="majority_vote"):
        avg_at_k_filters([{"name": "maj", "filter": [{"function": "majority_vote"}, {"function": "take_first"}]}], 4)


def test_repeat_scorer_scores_every_repeat_with_the_tasks_own_rule():
    seen = []

    def process_results(doc, results):
        seen.append(results)
        return {"exact_match": float(results[0] == doc["answer"]), "acc": results[0] == doc["answer"]}

    task = SimpleNamespace(process_results=process_results, config=SimpleNamespace(task="toy"))
    scorer = RepeatScorer(task, 4)
    assert scorer({"answer": "4"}, [["4", "5", "4", "4"]]) == {"exact_match": 0.75, "acc": 0.75}
    assert seen == [["4"], ["5"], ["4"], ["4"]]
    with pytest.raises(ValueError, match="expected 4 filtered responses"):
        scorer({"answer": "4"}, [["4"]])
    bad = RepeatScorer(SimpleNamespace(process_results=lambda d, r: {"f1": ("4", r[0])}, config=task.config), 1)
    with pytest.raises(TypeError, match="not a number"):
        bad({"answer": "4"}, [["4"]])


@pytest.mark.slow
def test_simple_evaluate_samples_k_times_and_scores_every_repeat(chat_server, lm_eval_tasks):
    from eval.lm_eval_bridge import run_lm_eval

    calls = Counter()
    # per question, the answers of its 4 repeats: 2+2 right 3 times of 4, 3*3 never, 10/2 always. The thinking
    # part names a wrong answer first: it must be cut (think_end_token) before the task's regex reads it.
    plan = {"2+2": ["4", "4", "7", "4"], "3*3": ["6", "8", "6", "1"], "10/2": ["5"] * 4}

    def respond(server, body):
        question = next(q for q in plan if q in body["messages"][-1]["content"])
        answer = plan[question][calls[question] % 4]
        calls[question] += 1
        return 200, chat_reply(f"<think>The answer is 0? No.</think>The answer is {answer}")

    server = chat_server(respond)
    out = run_lm_eval(
        ["toy_qa"],
        k=4,
        sampling=SamplingConfig(max_tokens=64),
        model_type="local-chat-completions",
        model_args={
            "model": "tiny",
            "base_url": f"{server.url}/chat/completions",
            "num_concurrent": 1,
            "max_retries": 1,
            "think_end_token": "</think>",
        },
        include_path=str(lm_eval_tasks),
        include_defaults=False,
        batch_size=1,
    )
    task = out["tasks"]["toy_qa"]
    assert task["lm_eval_task"] == "toy_qa_avg4"
    assert task["metrics"]["exact_match,strict-match"] == pytest.approx(100 * (0.75 + 0.0 + 1.0) / 3)
    assert task["n_docs"] == 3 and task["repeats_per_doc"] == [4]
    assert dict(calls) == {"2+2": 4, "3*3": 4, "10/2": 4}  # every repeat was requested
    bodies = server.requests
    assert all(b["seed"] is None for b in bodies)
    assert {(b["temperature"], b["top_p"], b["top_k"], b["max_tokens"]) for b in bodies} == {(0.6, 0.95, 20, 64)}
