"""A total deadline per request for the three HTTP clients (embedder, generation, judge), against real
loopback servers that trickle their body or their status line and headers; the shared client's retry policy
and its circuit breaker, against a loopback server stopped and started again (`sarl.runtime.http_client`)."""

from __future__ import annotations

import json
import logging
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from testkit import JSONHandler, LoopbackServer, Stopwatch, closing_all

from eval.generate import GenerationRequest, OpenAIChatGenerator, SamplingConfig
from sarl.checking.openai_client import ChatClient, ChatRequestError
from sarl.serving.http import HTTPEmbedder

DEADLINE_S = 1.0
TRICKLE_GAP_S = 0.5
TRICKLE_BYTES = 40  # 20 s of trickling: what a client with only a per-read timeout waits out per attempt


def embeddings_answer(body: dict[str, Any]) -> dict[str, Any]:
    data = [{"index": i, "embedding": [float(len(t)), 1.0, 2.0]} for i, t in enumerate(body["input"])]
    return {"object": "list", "data": data}


def chat_answer(body: dict[str, Any]) -> dict[str, Any]:
    message = {"role": "assistant", "content": "fine"}
    return {"choices": [{"message": message, "finish_reason": "stop"}], "usage": {"completion_tokens": 2}}


class TrickleServer:
    """Loopback HTTP server: the first `trickle` POSTs get a 200 whose body comes one byte per
    `TRICKLE_GAP_S` (never faster than a per-read timeout would notice); later ones get `answer(body)`."""

    def __init__(self, answer: Callable[[dict[str, Any]], dict[str, Any]], trickle: int, port: int = 0) -> None:
        self.answer = answer
        self.trickle = trickle
        self.posts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = LoopbackServer(self._handler(), port)
        self.url = self._server.url

    def close(self) -> None:
        self._stop.set()
        self._server.close()

    def _handler(self) -> type[JSONHandler]:
        server = self

        class Handler(JSONHandler):
            def do_POST(self) -> None:
                body = self.read_json()
                with server._lock:
                    server.posts += 1
                    trickle = server.posts <= server.trickle
                if not trickle:
                    self.send_json(200, server.answer(body))
                    return
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(TRICKLE_BYTES))
                    self.end_headers()
                    for _ in range(TRICKLE_BYTES):
                        if server._stop.wait(TRICKLE_GAP_S):
                            return
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what the deadline is for

        return Handler


@pytest.fixture
def trickle_server() -> Iterator[Callable[..., TrickleServer]]:
    """Factory: `trickle_server(answer, trickle=n)`; all closed after the test."""
    yield from closing_all(TrickleServer)


def deadline_embedder(url: str) -> HTTPEmbedder:
    """The embedder of the deadline tests: DEADLINE_S per attempt, one retry."""
    return HTTPEmbedder(url=url, model="m", timeout_s=DEADLINE_S, max_retries=1, backoff_s=0.01)


# An attempt ends within the deadline plus one trickle gap (1.5 s). Before the deadline existed, each attempt took
# the whole trickle (20 s): the bound asserted is well under one whole trickle, a correctness bound on the deadline
# that a loaded CI machine keeps, not a benchmark.
TRICKLE_BOUND_S = 10.0


def test_embedder_gives_up_at_the_deadline(trickle_server):
    server = trickle_server(embeddings_answer, trickle=2)
    with deadline_embedder(server.url) as emb, Stopwatch() as took:
        res = emb.embed(["a", "bb"])
    assert took.s < TRICKLE_BOUND_S, took.s
    assert set(res.failed) == {0, 1}
    assert res.failed[0].startswith(f"embedding timeout: {server.url}/v1/embeddings after 2 attempts")
    assert f"no answer within {DEADLINE_S:g} s" in res.failed[0] and "DeadlineExceeded" in res.failed[0]
    assert emb.stats.requests == 2 and emb.stats.retries == 1 and emb.stats.failed_requests == 1


def test_embedder_retries_after_a_trickled_attempt(trickle_server):
    server = trickle_server(embeddings_answer, trickle=1)
    with deadline_embedder(server.url) as emb, Stopwatch() as took:
        res = emb.embed(["a", "bb"])
    assert took.s < TRICKLE_BOUND_S, took.s  # one cut attempt, then a prompt answer
    assert res.failed == {}
    assert res.vectors.shape == (2, 3)
    assert emb.stats.requests == 2 and emb.stats.retries == 1 and emb.stats.failed_requests == 0


def test_judge_client_gives_up_at_the_deadline(trickle_server):
    server = trickle_server(chat_answer, trickle=2)
    client = ChatClient(server.url, timeout_s=DEADLINE_S, max_retries=1, backoff_s=0.01)
    with Stopwatch() as took, pytest.raises(ChatRequestError, match="failed after 2 attempts.*DeadlineExceeded"):
        client.chat({"model": "m", "messages": []})
    client.close()
    assert took.s < TRICKLE_BOUND_S, took.s
    assert client.counts == {"requests": 2, "retries": 1, "failures": 1, "circuit_open": 0}


def test_judge_client_retries_after_a_trickled_attempt(trickle_server):
    server = trickle_server(chat_answer, trickle=1)
    client = ChatClient(server.url, timeout_s=DEADLINE_S, max_retries=1, backoff_s=0.01)
    with Stopwatch() as took:
        reply = client.chat({"model": "m", "messages": []})
    client.close()
    assert took.s < TRICKLE_BOUND_S, took.s  # one cut attempt, then a prompt answer
    assert reply["choices"][0]["message"]["content"] == "fine"
    assert client.counts == {"requests": 2, "retries": 1, "failures": 0, "circuit_open": 0}


def test_generation_client_reports_a_trickled_request_as_failed(trickle_server):
    server = trickle_server(chat_answer, trickle=1)
    gen = OpenAIChatGenerator(server.url, "m", SamplingConfig(), timeout_s=DEADLINE_S, max_retries=0, backoff_s=0.01)
    results: list[tuple[Any, str | None]] = []
    with Stopwatch() as took:
        gen.generate(
            [GenerationRequest(("b", "p", 0), [{"role": "user", "content": "hi"}], seed=1)],
            lambda request, generation, error: results.append((generation, error)),
        )
    gen.close()
    assert took.s < TRICKLE_BOUND_S, took.s
    [(generation, error)] = results
    assert generation is None and "DeadlineExceeded" in error and "after 1 attempts" in error
    assert gen.client.counts == {"requests": 1, "retries": 0, "failures": 1, "circuit_open": 0}


# -- the shared client's policy ------------------------------------------------------------------


def test_retry_delays():
    from sarl.runtime.http_client import RetryPolicy

    plain = RetryPolicy(backoff_s=1.0, backoff_max_s=5.0)
    assert [plain.delay(n, None) for n in range(4)] == [1.0, 2.0, 4.0, 5.0]
    assert plain.delay(0, 3.0) == 3.0 and plain.delay(2, 1.0) == 4.0  # Retry-After at least
    assert plain.delay(0, 60.0) == 5.0  # capped
    instead = RetryPolicy(backoff_s=1.0, backoff_max_s=5.0, retry_after="instead", jitter=True)
    assert instead.delay(2, 0.0) == 0.0 and instead.delay(0, 60.0) == 5.0
    assert all(1.0 <= instead.delay(1, None) < 2.0 for _ in range(50))
    with pytest.raises(ValueError, match="retry_after"):
        RetryPolicy(retry_after="never")  # type: ignore[arg-type]


def test_unusable_body_is_retried_other_parse_errors_are_not(trickle_server):
    from sarl.runtime.http_client import JSONClient, RequestFailed, RetryPolicy, UnusableResponse

    server = trickle_server(chat_answer, trickle=0)
    client = JSONClient(timeout_s=5.0, retry=RetryPolicy(max_retries=2, backoff_s=0.0))
    calls: list[int] = []

    def unusable(resp: httpx.Response) -> None:
        calls.append(resp.status_code)
        raise UnusableResponse("no choices")

    with pytest.raises(RequestFailed, match="unusable body") as info:
        client.post_json(server.url, {}, unusable)
    assert info.value.retryable and info.value.attempts == 3 and len(calls) == 3

    def broken(resp: httpx.Response) -> None:
        raise KeyError("choices")

    with pytest.raises(KeyError):
        client.post_json(server.url, {}, broken)
    assert server.posts == 4
    client.close()


# -- a server that trickles its status line and headers ------------------------------------------

HEADER_GAP_S = 0.5
TRICKLED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Pad: " + b"p" * 70 + b"\r\n"
# 120 bytes at one per 0.5 s: a client bounded per read only waits a minute for the headers


class HeaderTrickleServer:
    """Raw loopback HTTP/1.1 server (a TCP one: http.server would send its status line at once), keep-alive:
    POSTs number `trickle_from` and later (1-based, over all connections) get their status line and headers one
    byte per `HEADER_GAP_S`; earlier ones a prompt answer."""

    def __init__(self, trickle_from: int) -> None:
        self.trickle_from = trickle_from
        self.posts = 0
        self.connections = 0
        self._stop = threading.Event()
        self._server = LoopbackServer(self._handler())
        self.url = self._server.url

    def _handler(self) -> type[socketserver.StreamRequestHandler]:
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                server.connections += 1
                try:
                    server.serve(self.rfile, self.wfile)
                except OSError:
                    pass  # the client gave up: what the deadline is for

        return Handler

    def serve(self, reader, writer) -> None:
        while not self._stop.is_set():
            length = None
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if line == b"" or length is None:
                return
            reader.read(length)
            self.posts += 1
            body = json.dumps({"ok": self.posts}).encode()
            head = TRICKLED_HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode()
            if self.posts < self.trickle_from:
                writer.write(head + body)
                continue
            for byte in head:
                if self._stop.wait(HEADER_GAP_S):
                    return
                writer.write(bytes([byte]))
            writer.write(body)

    def close(self) -> None:
        self._stop.set()
        self._server.close()


@pytest.fixture
def header_trickle_server() -> Iterator[Callable[[int], HeaderTrickleServer]]:
    yield from closing_all(HeaderTrickleServer)


# A correctness bound on the deadline, not a benchmark: the whole trickle would take a minute per attempt.
HEAD_BOUND_S = 10.0


@pytest.mark.parametrize("trickle_from", [1, 2], ids=["new connection", "pooled connection"])
def test_trickled_headers_end_at_the_deadline(header_trickle_server, trickle_from):
    """The status line and headers count against the attempt's deadline too, on a new connection and on a
    kept-alive one from the pool (the second POST reuses the first's connection)."""
    from sarl.runtime.http_client import JSONClient, RequestFailed, RetryPolicy

    server = header_trickle_server(trickle_from)
    client = JSONClient(timeout_s=DEADLINE_S, retry=RetryPolicy(max_retries=0))
    if trickle_from == 2:
        assert client.post_json(server.url, {}, lambda r: r.json()) == {"ok": 1}
    with Stopwatch() as took, pytest.raises(RequestFailed, match="DeadlineExceeded") as info:
        client.post_json(server.url, {}, lambda r: r.json())
    client.close()
    assert took.s < HEAD_BOUND_S, took.s
    assert info.value.failure.kind == "timeout" and info.value.attempts == 1
    assert server.connections == 1 and server.posts == trickle_from


def test_embedder_with_trickled_headers_fails_its_texts_within_the_deadline(header_trickle_server):
    server = header_trickle_server(1)
    with deadline_embedder(server.url) as emb, Stopwatch() as took:
        res = emb.embed(["a", "bb"])
    assert took.s < HEAD_BOUND_S, took.s
    assert set(res.failed) == {0, 1} and "DeadlineExceeded" in res.failed[0]
    assert emb.stats.requests == 2 and emb.stats.failed_requests == 1


def test_judge_client_with_trickled_headers_fails_within_the_deadline(header_trickle_server):
    server = header_trickle_server(1)
    client = ChatClient(server.url, timeout_s=DEADLINE_S, max_retries=0)
    with Stopwatch() as took, pytest.raises(ChatRequestError, match="DeadlineExceeded"):
        client.chat({"model": "m", "messages": []})
    client.close()
    assert took.s < HEAD_BOUND_S, took.s


# -- the circuit breaker ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_and_lets_one_probe_through():
    from sarl.runtime.http_client import BreakerPolicy, CircuitBreaker

    clock = Clock()
    breaker = CircuitBreaker(BreakerPolicy(failures=3, cooldown_s=10.0), name="srv", clock=clock)
    for _ in range(2):
        assert breaker.allow() is None
        breaker.record(connection_failed=True)
    breaker.record(connection_failed=False)  # any answer resets the run
    assert breaker.state == "closed" and breaker.streak == 0
    for _ in range(3):
        assert breaker.allow() is None
        breaker.record(connection_failed=True)
    assert breaker.state == "open" and breaker.opens == 1 and breaker.is_open()
    refusal = breaker.allow()
    assert refusal == (
        "circuit open: srv failed 3 consecutive connection attempts (breaker failures=3, cooldown_s=10); "
        "next probe in 10.0 s"
    )
    clock.now += 9.9
    assert breaker.allow() is not None and breaker.rejected == 2
    clock.now += 0.2  # cooled down: half-open, one probe
    assert not breaker.is_open()
    assert breaker.allow() is None and breaker.state == "half_open"
    assert "a probe request is under way" in breaker.allow()  # a second caller waits for the probe's outcome
    breaker.record(connection_failed=True)  # the probe failed: open for a new cool-down
    assert breaker.state == "open" and breaker.opens == 2 and breaker.allow() is not None
    clock.now += 10.1
    assert breaker.allow() is None
    breaker.release()  # the probe was interrupted: the next caller probes instead
    assert breaker.allow() is None
    breaker.record(connection_failed=False)
    assert breaker.state == "closed" and breaker.allow() is None and breaker.rejected == 4
    with pytest.raises(ValueError, match="failures must be >= 1"):
        BreakerPolicy(failures=0)
    off = CircuitBreaker(BreakerPolicy(failures=None))
    for _ in range(100):
        off.record(connection_failed=True)
    assert off.allow() is None and off.opens == 0


def test_breaker_fails_fast_while_the_server_is_down_and_closes_when_it_is_back(trickle_server):
    """A loopback server stopped, then started again on its port: after two refused attempts the client fails
    every request at once (no attempt, no backoff), and after the cool-down one probe finds the server back."""
    import pickle

    from sarl.runtime.http_client import BreakerPolicy, JSONClient, RequestFailed, RetryPolicy

    server = trickle_server(chat_answer, trickle=0)
    port = int(server.url.rsplit(":", 1)[1])
    retry = RetryPolicy(max_retries=3, backoff_s=0.01)
    client = JSONClient(timeout_s=5.0, retry=retry, breaker=BreakerPolicy(failures=2, cooldown_s=0.5))
    attempts: list[int] = []
    post = lambda: client.post_json(server.url, {}, lambda r: r.json(), on_attempt=lambda: attempts.append(1))  # noqa: E731
    assert post()["choices"]
    server.close()
    client.close()  # a dead server's kept-alive connections die with it (this one's handler thread would live on)

    with pytest.raises(RequestFailed) as first:
        post()
    assert first.value.failure.kind == "open" and first.value.attempts == 2  # the breaker cut its retries short
    for _ in range(5):
        with pytest.raises(RequestFailed, match="CircuitOpen: circuit open: .* failed 2 consecutive") as info:
            post()
        assert info.value.attempts == 0 and info.value.retryable
    assert len(attempts) == 1 + 2 and client.breaker.opens == 1 and client.breaker.rejected == 6
    clone = pickle.loads(pickle.dumps(client))  # a copy (e.g. in a Ray worker) starts closed
    assert clone.breaker.state == "closed" and client.breaker.state == "open"

    server = trickle_server(chat_answer, trickle=0, port=port)
    time.sleep(0.6)  # past the cool-down (a wait, not a timed assertion)
    assert post()["choices"]  # the probe
    assert client.breaker.state == "closed" and client.breaker.streak == 0
    assert post()["choices"] and len(attempts) == 5
    client.close()


def test_embedder_threads_stop_paying_retries_once_the_breaker_opens(trickle_server, caplog):
    """Eight requests on four threads to a dead server: without the breaker each pays 4 attempts and 3
    backoffs (32 attempts); with it the attempts stop at the threshold plus those already under way."""
    server = trickle_server(embeddings_answer, trickle=0)
    url = server.url
    server.close()
    texts = [f"t{i}" for i in range(8)]
    kwargs = dict(url=url, model="m", batch_size=1, max_concurrency=4, max_retries=3, backoff_s=0.05, timeout_s=5.0)
    with HTTPEmbedder(**kwargs, breaker_failures=3, breaker_cooldown_s=60.0) as emb:
        with caplog.at_level(logging.WARNING, logger="sarl.runtime.http_client"):
            res = emb.embed(texts)
    assert set(res.failed) == set(range(8))
    assert emb.stats.requests <= 3 + 4 and emb.breaker.opens == 1
    assert emb.stats.circuit_open_requests >= 8 - 4 and emb.stats.failed_requests == 8
    opened = [r for r in res.failed.values() if r.startswith(f"embedding circuit open: {url}/v1/embeddings ")]
    assert len(opened) == emb.stats.circuit_open_requests
    assert emb.failure_counts["embedding circuit open"] == len(opened)
    assert any("circuit breaker open" in r.getMessage() for r in caplog.records)
    with HTTPEmbedder(**kwargs, breaker_failures=None) as plain:
        assert set(plain.embed(texts).failed) == set(range(8))
    assert plain.stats.requests == 8 * 4 and plain.stats.circuit_open_requests == 0


def test_judge_client_counts_requests_refused_by_the_open_breaker(trickle_server):
    server = trickle_server(chat_answer, trickle=0)
    url = server.url
    server.close()
    client = ChatClient(url, timeout_s=5.0, max_retries=1, backoff_s=0.01, breaker_failures=2, breaker_cooldown_s=60)
    with pytest.raises(ChatRequestError, match="failed after 2 attempts.*ConnectError"):
        client.chat({"model": "m", "messages": []})
    with pytest.raises(ChatRequestError, match="not asked: circuit open"):
        client.chat({"model": "m", "messages": []})
    client.close()
    assert client.counts == {"requests": 2, "retries": 1, "failures": 2, "circuit_open": 1}
