"""sarl.launch.format_preflight: a GRP run refuses a policy that does not write GRP's graph format (exit 2)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sarl.formats.graph import parse_graph
from sarl.launch.compose import compose_train_config
from sarl.launch.format_preflight import check_format, greedy_responses, parseable_share, transformers_generate
from sarl.runtime.errors import UserError
from sarl.train import main

REPO = Path(__file__).resolve().parents[3]
GRAPH = (
    '<think>\n<known>\n{"id": 1, "parents_id": [], "content": "x + y = 10"}\n</known>\n<aggregate>\n'
    '{"id": 2, "parents_id": [1], "content": "so x = 6"}\n</aggregate>\n</think>\n<answer>\\boxed{6}</answer>'
)
PLAIN = "<think>\nx + y = 10, so x = 6.\n</think>\n\nThe answer is \\boxed{6}."
CHECK = ["+exp=smoke", "reward=grp", "format_check.parser=sarl.formats.graph.parse_graph"]


def test_the_share_counts_parseable_responses_and_names_the_reasons():
    samples = [json.loads(x)["response"] for x in (REPO / "sarl/samples/responses.jsonl").read_text().splitlines()]
    share, reasons = parseable_share(samples, parse_graph)
    assert share == 0.0 and sum(reasons.values()) == len(samples) == 5  # SARL-style responses: no graph
    share, reasons = parseable_share([GRAPH, GRAPH, GRAPH, PLAIN], parse_graph)
    assert share == 0.75 and reasons == {"text outside a label block": 1}


def test_the_check_passes_at_the_threshold_and_stops_below_it():
    cfg, _ = compose_train_config([*CHECK, "format_check.n_prompts=4", "format_check.min_share=0.5"])
    seen = []

    def answers(*texts):
        return lambda prompts: seen.append(prompts) or list(texts)

    assert check_format(cfg, answers(GRAPH, GRAPH, PLAIN, PLAIN)) == 0.5
    assert len(seen[0]) == 4 and seen[0][0][0]["role"] == "user"  # the run's first four prompts
    with pytest.raises(
        UserError, match=r"format_check: 25% of 4 responses .* parse with sarl.formats.graph.parse_graph"
    ):
        check_format(cfg, answers(GRAPH, PLAIN, PLAIN, PLAIN))
    off, _ = compose_train_config(["+exp=smoke", "reward=grp"])
    assert check_format(off, answers(PLAIN)) is None  # no parser: no check
    sft, _ = compose_train_config([*CHECK, "algorithm=sft", "data=sft_smoke"])
    assert check_format(sft, answers(PLAIN)) is None  # the SFT stage that teaches the format is not checked
    bad, _ = compose_train_config([*CHECK, "format_check.parser=sarl.formats.graph.nope"])
    with pytest.raises(UserError, match=r"^format_check.parser='sarl.formats.graph.nope': not an importable function"):
        check_format(bad, answers(GRAPH))


@pytest.mark.parametrize("row", ["grpo_grp_math", "pasc_grpo_grp_math", "grp_math_paper"])
def test_grp_rows_check_the_format(row):
    cfg, _ = compose_train_config([f"+exp={row}"])
    assert cfg.format_check.parser == "sarl.formats.graph.parse_graph" and cfg.format_check.min_share == 0.5


def test_a_policy_that_cannot_write_the_format_stops_the_run_with_exit_2(tmp_path, chat_policy_dir):
    overrides = [*CHECK, "logger=none", f"paths.root={tmp_path}", f"model.path={chat_policy_dir}"]
    assert main([*overrides, "format_check.max_new_tokens=4", "format_check.n_prompts=2"]) == 2
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("metrics.jsonl"))


PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Name a prime."}]]


@pytest.mark.slow
def test_the_policy_answers_in_a_child_process(chat_policy_dir, monkeypatch):
    """sarl.train's own process never loads the policy: the child that does takes the model, and on a GPU its
    CUDA context, with it when it exits, before verl needs the GPU."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the policy was loaded in sarl.train's own process")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    responses = transformers_generate(chat_policy_dir, None, 4)(PROMPTS)
    monkeypatch.undo()
    assert responses == greedy_responses(chat_policy_dir, None, 4, PROMPTS)  # the same greedy answers
    assert len(responses) == 2 and all(isinstance(r, str) for r in responses)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_check_leaves_no_cuda_context_behind(chat_policy_dir):
    """In a fresh process (pytest's may hold CUDA already): after the check, CUDA was never initialised there."""
    code = (
        "import torch, sys; from sarl.launch.format_preflight import transformers_generate; "
        f"transformers_generate(sys.argv[1], None, 4)({PROMPTS!r}); print(torch.cuda.is_initialized())"
    )
    out = subprocess.run([sys.executable, "-c", code, chat_policy_dir], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
