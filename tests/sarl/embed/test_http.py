"""HTTPEmbedder over real HTTP on loopback: a fake OpenAI-compatible server, failure
modes (down, slow, 5xx/429, 4xx, bad payloads) and, marked `vllm`, a real vLLM CPU server."""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
import time

import numpy as np
import pytest

from sarl.serving.http import HTTPEmbedder

VLLM_MODEL_NAME = "minilm"  # --served-model-name of the vllm_server fixture (conftest.py)


def make(url: str, **kwargs) -> HTTPEmbedder:
    kwargs.setdefault("model", "fake")
    kwargs.setdefault("backoff_s", 0.01)
    kwargs.setdefault("timeout_s", 5.0)
    return HTTPEmbedder(url=url, **kwargs)


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


# -- the happy path -------------------------------------------------------------------------


def test_packing_dedup_order_and_unit_norm(fake_server):
    server = fake_server(dim=8)
    distinct = [f"step {i}" for i in range(10)]
    texts = distinct + distinct[::3] + ["step 4", "step 4"]
    with make(server.url, batch_size=4) as emb:
        res = emb.embed(texts)
    assert res.failed == {}
    assert res.vectors.shape == (len(texts), 8)
    assert len(server.requests) == 3  # 10 distinct texts, 4 per request
    assert sorted(len(r["input"]) for r in server.requests) == [2, 4, 4]
    assert sorted(server.inputs) == sorted(distinct)  # each distinct text sent once
    for r in server.requests:
        assert r["model"] == "fake" and r["encoding_format"] == "base64"
    for i, t in enumerate(texts):
        np.testing.assert_allclose(res.vectors[i], unit(server.vector(t)), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(res.vectors, axis=1), 1.0, rtol=1e-6)
    assert emb.stats.requests == 3 and emb.stats.texts_embedded == 10
    assert emb.stats.retries == emb.stats.failed_requests == 0
    assert emb.dim == 8


def test_empty_input_sends_nothing(fake_server):
    server = fake_server()
    with make(server.url) as emb:
        res = emb.embed([])
    assert res.vectors.shape[0] == 0 and res.failed == {}
    assert server.requests == []


def test_requests_run_concurrently(fake_server):
    server = fake_server(delay_s=1.0)
    texts = [f"t{i}" for i in range(8)]
    with make(server.url, batch_size=1, max_concurrency=4) as emb:
        t0 = time.monotonic()
        res = emb.embed(texts)
        elapsed = time.monotonic() - t0
    assert res.failed == {}
    assert len(server.requests) == 8
    assert server.max_in_flight > 1
    assert server.max_in_flight <= 4
    # serial would take at least 8 s, four at a time about 2 s: 6 s of slack for a loaded machine
    assert elapsed < 8 * 1.0


def test_max_concurrency_one_is_serial(fake_server):
    server = fake_server(delay_s=0.05)
    with make(server.url, batch_size=1, max_concurrency=1) as emb:
        assert emb.embed(["a", "b", "c"]).failed == {}
    assert server.max_in_flight == 1


def test_works_inside_a_running_event_loop(fake_server):
    # verl may call the reward from inside asyncio; the sync path must not need its own loop.
    server = fake_server()
    emb = make(server.url, batch_size=2)

    async def call():
        return emb.embed(["x", "y", "z"])

    res = asyncio.run(call())
    emb.close()
    assert res.failed == {}


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_url_forms_and_health(fake_server, dead_url, suffix):
    server = fake_server()
    with make(server.url + suffix) as emb:
        assert emb.endpoint == f"{server.url}/v1/embeddings"
        assert emb.health(timeout_s=2.0)
        assert emb.embed(["a"]).failed == {}
    with make(dead_url) as emb:
        assert not emb.health(timeout_s=1.0)


def test_bearer_header_only_when_env_set(fake_server, monkeypatch):
    server = fake_server()
    monkeypatch.setenv("SARL_TEST_KEY", "sekrit")
    with make(server.url, api_key_env="SARL_TEST_KEY") as emb:
        emb.embed(["a"])
    monkeypatch.delenv("SARL_TEST_KEY")
    with make(server.url, api_key_env="SARL_TEST_KEY") as emb:
        emb.embed(["b"])
    with make(server.url, api_key_env=None) as emb:
        emb.embed(["c"])
    assert server.headers[0]["authorization"] == "Bearer sekrit"
    assert "authorization" not in server.headers[1]
    assert "authorization" not in server.headers[2]


def test_max_chars_truncates_before_sending(fake_server):
    server = fake_server()
    with make(server.url, max_chars=5) as emb:
        res = emb.embed(["abcdefgh", "abc", "123456"])
    assert res.failed == {}
    assert sorted(server.inputs) == ["123456"[:5], "abc", "abcde"]
    assert emb.stats.texts_truncated == 2
    np.testing.assert_allclose(res.vectors[0], unit(server.vector("abcde")), rtol=1e-6)


def test_extra_body_is_sent(fake_server):
    server = fake_server()
    with make(server.url, extra_body={"truncate_prompt_tokens": -1}) as emb:
        emb.embed(["a"])
    assert server.requests[0]["truncate_prompt_tokens"] == -1
    assert server.requests[0]["model"] == "fake"


def test_picklable_after_use(fake_server):
    server = fake_server()
    emb = make(server.url)
    emb.embed(["a"])
    clone = pickle.loads(pickle.dumps(emb))
    assert clone.embed(["b"]).failed == {}
    emb.close()
    clone.close()


# -- servers that fail ------------------------------------------------------------------------


def test_server_down_fails_every_text_fast(dead_url, caplog):
    texts = [f"s{i}" for i in range(5)] + ["s0"]
    # the retries of every request (the circuit breaker, which would cut them short, is tested in test_http_client.py)
    # refused connections fail at once: no attempt waits out its 20 s timeout (the bound below is well under one)
    with make(dead_url, batch_size=3, max_retries=3, backoff_s=0.01, breaker_failures=None, timeout_s=20.0) as emb:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="sarl.serving.http"):
            res = emb.embed(texts)
        elapsed = time.monotonic() - t0
    assert sorted(res.failed) == list(range(6))
    assert np.isnan(res.vectors).all()
    for reason in res.failed.values():
        assert reason.startswith(
            f"embedding server unreachable: {dead_url}/v1/embeddings after 4 attempts (ConnectError"
        )
    assert emb.stats.requests == 2 * 4  # two requests, max_retries + 1 attempts each
    assert emb.stats.retries == 2 * 3
    assert emb.stats.failed_requests == 2
    assert emb.stats.texts_embedded == 0
    assert emb.failure_counts["embedding server unreachable"] == 5
    assert any("retry 1/3" in r.getMessage() for r in caplog.records)
    assert elapsed < 10.0


def test_connection_closed_counts_attempts(closing_server):
    with make(closing_server.url, max_retries=2, backoff_s=0.01) as emb:
        res = emb.embed(["a", "b"])
    assert set(res.failed) == {0, 1}
    assert res.failed[0].startswith("embedding server unreachable: ")
    assert "after 3 attempts" in res.failed[0]
    assert closing_server.accepted == 3  # max_retries + 1 connections, no hidden retries


def test_slow_server_times_out(fake_server):
    release = threading.Event()

    def held(server, body):  # answers after 30 s, or once the test lets it go
        release.wait(30.0)
        return 200, server.embeddings_payload(body)

    server = fake_server(respond=held)
    try:
        with make(server.url, timeout_s=0.2, max_retries=1, backoff_s=0.01) as emb:
            t0 = time.monotonic()
            res = emb.embed(["a", "b", "c"])
            elapsed = time.monotonic() - t0
    finally:
        release.set()
    assert set(res.failed) == {0, 1, 2}
    for reason in res.failed.values():
        assert reason.startswith(f"embedding timeout: {server.url}/v1/embeddings after 2 attempts")
        assert "0.2 s" in reason
    assert len(server.requests) == 2
    assert emb.failure_counts["embedding timeout"] == 3
    assert elapsed < 10.0  # two cut attempts; one the timeout did not cut would take 30 s


@pytest.mark.parametrize("statuses", [(503, 503), (503, 429)])
def test_recovers_after_transient_errors(fake_server, statuses):
    script = [(s, {"error": {"message": "busy"}}) for s in statuses]
    server = fake_server(script=script)
    with make(server.url, max_retries=3, backoff_s=0.01) as emb:
        res = emb.embed(["a", "b", "c"])
    assert res.failed == {}
    assert emb.stats.retries == 2
    assert emb.stats.requests == 3
    assert emb.stats.failed_requests == 0
    assert emb.stats.texts_embedded == 3
    assert len(server.requests) == 3


def test_5xx_retries_exhausted(fake_server):
    server = fake_server(respond=lambda s, body: (500, {"error": {"message": "CUDA out of memory"}}))
    with make(server.url, max_retries=2) as emb:
        res = emb.embed(["a", "b"])
    assert len(server.requests) == 3
    reason = res.failed[0]
    assert reason.startswith(f"embedding server error: {server.url}/v1/embeddings after 3 attempts")
    assert "HTTP 500" in reason and "CUDA out of memory" in reason
    assert emb.stats.retries == 2 and emb.stats.failed_requests == 1


def test_400_is_not_retried(fake_server):
    msg = "This model's maximum context length is 512 tokens."
    server = fake_server(respond=lambda s, body: (400, {"object": "error", "message": msg, "code": 400}))
    with make(server.url, max_retries=3, split_on_client_error=False) as emb:
        res = emb.embed(["a", "b", "c"])
    assert len(server.requests) == 1
    assert emb.stats.retries == 0 and emb.stats.failed_requests == 1
    assert set(res.failed) == {0, 1, 2}
    assert res.failed[0].startswith("embedding server error: ")
    assert "HTTP 400" in res.failed[0] and msg in res.failed[0]


def test_400_for_one_text_fails_only_that_text(fake_server):
    def respond(server, body):
        if "BAD" in body["input"]:
            return 400, {"error": {"message": "input BAD is too long"}}
        return 200, server.embeddings_payload(body)

    server = fake_server(respond=respond)
    texts = ["a", "b", "BAD", "c", "d"]
    with make(server.url, batch_size=8, max_retries=3) as emb:
        res = emb.embed(texts)
    assert set(res.failed) == {2}
    assert "HTTP 400" in res.failed[2] and "input BAD is too long" in res.failed[2]
    assert server.inputs.count("a") == 2  # first in the whole request, then in its half
    assert emb.stats.retries == 0
    for i in (0, 1, 3, 4):
        np.testing.assert_allclose(res.vectors[i], unit(server.vector(texts[i])), rtol=1e-6)


def test_404_is_not_split_or_retried(fake_server):
    server = fake_server(respond=lambda s, body: (404, {"error": {"message": "model fake not found"}}))
    with make(server.url, max_retries=3) as emb:
        res = emb.embed(["a", "b", "c"])
    assert len(server.requests) == 1
    assert "HTTP 404" in res.failed[0] and "model fake not found" in res.failed[0]


# -- bad payloads -------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [8, None])
def test_bad_vectors_fail_only_their_text(fake_server, dim):
    server = fake_server(dim=8)
    texts = ["good 1", server.NAN_TEXT, "good 2", server.ZERO_TEXT, server.WRONG_DIM_TEXT, "good 3"]
    with make(server.url, dim=dim) as emb:
        res = emb.embed(texts)
    assert set(res.failed) == {1, 3, 4}
    assert res.failed[1].startswith("non-finite embedding:")
    assert res.failed[3].startswith("zero embedding:")
    assert res.failed[4] == "wrong embedding dimension: got 9, expected 8"
    for i in (0, 2, 5):
        np.testing.assert_allclose(res.vectors[i], unit(server.vector(texts[i])), rtol=1e-6)
    assert np.isnan(res.vectors[[1, 3, 4]]).all()
    assert emb.stats.failed_requests == 0


def _items(body, fn):
    return [fn(i, t) for i, t in enumerate(body["input"])]


MALFORMED = {
    "not json": lambda s, b: (200, b"<html>oops</html>"),
    "no data": lambda s, b: (200, {"object": "list"}),
    "data not a list": lambda s, b: (200, {"data": {"0": [1.0]}}),
    "too few": lambda s, b: (200, {"data": s.embeddings_payload(b)["data"][1:]}),
    "non-numeric": lambda s, b: (200, {"data": _items(b, lambda i, t: {"index": i, "embedding": ["x"] * 8})}),
    "nested": lambda s, b: (200, {"data": _items(b, lambda i, t: {"index": i, "embedding": [[1.0] * 8]})}),
    "duplicate index": lambda s, b: (200, {"data": _items(b, lambda i, t: {"index": 0, "embedding": [1.0] * 8})}),
    "index out of range": lambda s, b: (
        200,
        {"data": _items(b, lambda i, t: {"index": i + 5, "embedding": [1.0] * 8})},
    ),
    "item not an object": lambda s, b: (200, {"data": [1.0] * len(b["input"])}),
    "bad base64": lambda s, b: (200, {"data": _items(b, lambda i, t: {"index": i, "embedding": "not base64!"})}),
    "base64 of 3 bytes": lambda s, b: (200, {"data": _items(b, lambda i, t: {"index": i, "embedding": "AAAA"})}),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_response(fake_server, kind):
    server = fake_server(respond=MALFORMED[kind])
    with make(server.url, max_retries=3) as emb:
        res = emb.embed(["a", "b", "c"])
    assert set(res.failed) == {0, 1, 2}
    assert res.failed[0].startswith(f"bad embedding response: {server.url}/v1/embeddings (HTTP 200)")
    assert len(server.requests) == 1
    assert emb.stats.failed_requests == 1
    assert emb.failure_counts["bad embedding response"] == 3


def test_one_bad_request_does_not_spoil_others(fake_server):
    def respond(server, body):
        if "poison" in body["input"]:
            return 200, b"not json"
        return 200, server.embeddings_payload(body)

    server = fake_server(respond=respond)
    texts = ["a", "b", "poison", "c", "d", "e"]
    with make(server.url, batch_size=2, max_concurrency=3) as emb:
        res = emb.embed(texts)
    assert set(res.failed) == {2, 3}  # the request holding "poison" and "c"
    assert not np.isnan(res.vectors[[0, 1, 4, 5]]).any()


# -- real vLLM (CPU) --------------------------------------------------------------------------

SENTENCES = [
    "The derivative of x squared is two x.",
    "First, compute the sum of the first ten integers: 55.",
    "Therefore the answer is 42.",
    "Let n be the number of apples Alice has.",
    "We check the base case n = 1.",
    "Paris is the capital of France.",
    "Substituting back, we get y = 3.",
]


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_server_matches_sentence_transformers(vllm_server, minilm_dir):
    from sentence_transformers import SentenceTransformer

    texts = SENTENCES + SENTENCES[:2]  # duplicates too
    with HTTPEmbedder(
        url=vllm_server + "/v1", model=VLLM_MODEL_NAME, batch_size=3, max_concurrency=2, timeout_s=60.0, max_retries=1
    ) as emb:
        assert emb.health()
        res = emb.embed(texts)
    assert res.failed == {}
    assert res.vectors.shape == (len(texts), 384)
    assert emb.stats.requests == 3 and emb.stats.retries == 0
    model = SentenceTransformer(minilm_dir, device="cpu")
    ref = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    cos = np.sum(res.vectors * ref, axis=1)
    assert (cos > 0.99).all(), cos


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_base64_and_float_transports_agree(vllm_server):
    texts = SENTENCES + ["word " * 400]  # one over-long input, truncated by the server
    # one request at a time: each is then computed alone, as the same batch for both transports (concurrent ones
    # may share the server's batches differently, and another batch shape may round float32 differently)
    kwargs = dict(url=vllm_server, model=VLLM_MODEL_NAME, batch_size=4, max_concurrency=1, timeout_s=60.0)
    kwargs["extra_body"] = {"truncate_prompt_tokens": -1}
    with HTTPEmbedder(**kwargs) as b64, HTTPEmbedder(**kwargs, encoding_format="float") as floats:
        got_b64, got_float = b64.embed(texts), floats.embed(texts)
    assert got_b64.failed == got_float.failed == {}
    assert b64.encoding_format == "base64" and b64.stats.encoding_fallbacks == 0
    # Both carry the server's float32 values: equal to float32 precision (unit vectors).
    np.testing.assert_allclose(got_b64.vectors, got_float.vectors, rtol=1e-6, atol=1e-7)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_wrong_model_name_fails_cleanly(vllm_server):
    with HTTPEmbedder(url=vllm_server, model="no-such-model", max_retries=2) as emb:
        res = emb.embed(["a", "b"])
    assert set(res.failed) == {0, 1}
    assert res.failed[0].startswith("embedding server error: ")
    assert emb.stats.retries == 0


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_over_long_input(vllm_server, minilm_dir):
    # vLLM rejects a whole request (HTTP 400) when one input exceeds the model's context
    # (256 tokens for MiniLM): splitting isolates it; truncate_prompt_tokens=-1 avoids it.
    from sentence_transformers import SentenceTransformer

    texts = SENTENCES[:3] + ["word " * 400] + SENTENCES[3:5]
    with HTTPEmbedder(url=vllm_server, model=VLLM_MODEL_NAME, batch_size=8, timeout_s=60.0) as emb:
        res = emb.embed(texts)
    assert set(res.failed) == {3}
    assert res.failed[3].startswith("embedding server error: ")
    assert "HTTP 400" in res.failed[3] and "maximum context length" in res.failed[3]
    assert emb.stats.split_requests > 0 and emb.stats.retries == 0

    with HTTPEmbedder(
        url=vllm_server, model=VLLM_MODEL_NAME, batch_size=8, timeout_s=60.0, extra_body={"truncate_prompt_tokens": -1}
    ) as emb:
        res = emb.embed(texts)
    assert res.failed == {}
    assert emb.stats.requests == 1
    # sentence-transformers also truncates to 256 tokens (max_seq_length).
    ref = SentenceTransformer(minilm_dir, device="cpu").encode(texts, normalize_embeddings=True)
    cos = np.sum(res.vectors * ref, axis=1)
    assert (cos > 0.99).all(), cos


def test_requests_packed_by_token_budget(fake_server):
    from sarl.serving.http import estimate_tokens

    server = fake_server()
    short, long = [f"s{i}" for i in range(6)], ["x" * 400, "y" * 400]  # 2 and 101 estimated tokens
    assert estimate_tokens(short[0]) == 1 and estimate_tokens(long[0]) == 101
    texts = short[:3] + long + short[3:]
    with make(server.url, batch_size=4, max_concurrency=1, max_request_tokens=120) as emb:
        res = emb.embed(texts)
    assert res.failed == {}
    assert [r["input"] for r in server.requests] == [short[:3] + long[:1], long[1:] + short[3:]]
    server.requests.clear()
    with make(server.url, batch_size=4, max_concurrency=1, max_request_tokens=50) as emb:
        assert emb.embed(texts).failed == {}  # a text over the budget goes alone
    assert [r["input"] for r in server.requests] == [short[:3], long[:1], long[1:], short[3:]]
    with pytest.raises(ValueError, match="max_request_tokens"):
        make(server.url, max_request_tokens=0)


# -- transport encodings -------------------------------------------------------------------


def test_float_encoding_gives_the_same_vectors(fake_server):
    server = fake_server(dim=8)
    texts = ["alpha", "beta", "gamma"]
    with make(server.url) as b64, make(server.url, encoding_format="float") as floats:
        got_b64, got_float = b64.embed(texts), floats.embed(texts)
    assert [r["encoding_format"] for r in server.requests] == ["base64", "float"]
    assert got_b64.failed == got_float.failed == {}
    np.testing.assert_array_equal(got_b64.vectors, got_float.vectors)  # the fake's values are exact in float32
    with pytest.raises(ValueError, match="encoding_format"):
        make(server.url, encoding_format="binary")


def test_server_without_base64_falls_back_to_float_once(fake_server, caplog):
    def respond(server, body):
        if body["encoding_format"] == "base64":
            return 400, {"error": {"message": "encoding_format: Input should be 'float'"}}
        return 200, server.embeddings_payload(body)

    server = fake_server(respond=respond)
    with caplog.at_level(logging.WARNING), make(server.url, batch_size=2, max_concurrency=1) as emb:
        assert emb.embed(["a", "b", "c", "d"]).failed == {}
        assert emb.embed(["e"]).failed == {}
    assert [r["encoding_format"] for r in server.requests] == ["base64", "float", "float", "float"]
    assert emb.encoding_format == "float" and emb.stats.encoding_fallbacks == 1
    assert emb.stats.retries == 0 and emb.stats.texts_embedded == 5
    assert sum("rejected encoding_format=base64" in r.getMessage() for r in caplog.records) == 1


def test_base64_errors_about_the_texts_do_not_switch_to_float(fake_server):
    server = fake_server(script=[(400, {"error": {"message": "input is too long"}})])
    with make(server.url, split_on_client_error=False) as emb:
        assert set(emb.embed(["a"]).failed) == {0}
        assert emb.embed(["b"]).failed == {}
    assert [r["encoding_format"] for r in server.requests] == ["base64", "base64"]
    assert emb.encoding_format == "base64" and emb.stats.encoding_fallbacks == 0


def test_url_must_be_http():
    with pytest.raises(ValueError, match="auto"):
        HTTPEmbedder(url="auto", model="m")
