"""A total deadline per request for the three HTTP clients (embedder, generation, judge), against a real
loopback server that trickles its answer, and the shared client's retry policy (`sarl.http_client`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from eval.generate import GenerationRequest, OpenAIChatGenerator, SamplingConfig
from eval.openai_client import ChatClient, ChatRequestError
from sarl.embed.http import HTTPEmbedder

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

    def __init__(self, answer: Callable[[dict[str, Any]], dict[str, Any]], trickle: int) -> None:
        self.answer = answer
        self.trickle = trickle
        self.posts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with server._lock:
                    server.posts += 1
                    trickle = server.posts <= server.trickle
                raw = b" " * TRICKLE_BYTES if trickle else json.dumps(server.answer(body)).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    if not trickle:
                        self.wfile.write(raw)
                        return
                    for byte in raw:
                        if server._stop.wait(TRICKLE_GAP_S):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what the deadline is for

        return Handler


@pytest.fixture
def trickle_server() -> Iterator[Callable[..., TrickleServer]]:
    """Factory: `trickle_server(answer, trickle=n)`; all closed after the test."""
    servers: list[TrickleServer] = []

    def make(answer: Callable[[dict[str, Any]], dict[str, Any]], trickle: int) -> TrickleServer:
        servers.append(TrickleServer(answer, trickle))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


# Bounds: an attempt ends within the deadline plus one trickle gap (1.5 s); the assertions allow 2x the
# deadline per attempt. Before the deadline existed, each attempt took the whole trickle (20 s).


def test_embedder_gives_up_at_the_deadline(trickle_server):
    server = trickle_server(embeddings_answer, trickle=2)
    with HTTPEmbedder(url=server.url, model="m", timeout_s=DEADLINE_S, max_retries=1, backoff_s=0.01) as emb:
        t0 = time.monotonic()
        res = emb.embed(["a", "bb"])
        elapsed = time.monotonic() - t0
    assert elapsed < 2 * 2 * DEADLINE_S, elapsed
    assert set(res.failed) == {0, 1}
    assert res.failed[0].startswith(f"embedding timeout: {server.url}/v1/embeddings after 2 attempts")
    assert f"no answer within {DEADLINE_S:g} s" in res.failed[0] and "DeadlineExceeded" in res.failed[0]
    assert emb.stats.requests == 2 and emb.stats.retries == 1 and emb.stats.failed_requests == 1


def test_embedder_retries_after_a_trickled_attempt(trickle_server):
    server = trickle_server(embeddings_answer, trickle=1)
    with HTTPEmbedder(url=server.url, model="m", timeout_s=DEADLINE_S, max_retries=1, backoff_s=0.01) as emb:
        t0 = time.monotonic()
        res = emb.embed(["a", "bb"])
        elapsed = time.monotonic() - t0
    assert elapsed < 2 * DEADLINE_S + 1.0, elapsed  # one cut attempt, then a prompt answer
    assert res.failed == {}
    assert res.vectors.shape == (2, 3)
    assert emb.stats.requests == 2 and emb.stats.retries == 1 and emb.stats.failed_requests == 0


def test_judge_client_gives_up_at_the_deadline(trickle_server):
    server = trickle_server(chat_answer, trickle=2)
    client = ChatClient(server.url, timeout_s=DEADLINE_S, max_retries=1, backoff_s=0.01)
    t0 = time.monotonic()
    with pytest.raises(ChatRequestError, match="failed after 2 attempts.*DeadlineExceeded"):
        client.chat({"model": "m", "messages": []})
    elapsed = time.monotonic() - t0
    client.close()
    assert elapsed < 2 * 2 * DEADLINE_S, elapsed
    assert client.counts == {"requests": 2, "retries": 1, "failures": 1}


def test_judge_client_retries_after_a_trickled_attempt(trickle_server):
    server = trickle_server(chat_answer, trickle=1)
    client = ChatClient(server.url, timeout_s=DEADLINE_S, max_retries=1, backoff_s=0.01)
    t0 = time.monotonic()
    reply = client.chat({"model": "m", "messages": []})
    elapsed = time.monotonic() - t0
    client.close()
    assert elapsed < 2 * DEADLINE_S + 1.0, elapsed  # one cut attempt, then a prompt answer
    assert reply["choices"][0]["message"]["content"] == "fine"
    assert client.counts == {"requests": 2, "retries": 1, "failures": 0}


def test_generation_client_reports_a_trickled_request_as_failed(trickle_server):
    server = trickle_server(chat_answer, trickle=1)
    gen = OpenAIChatGenerator(server.url, "m", SamplingConfig(), timeout_s=DEADLINE_S, max_retries=0, backoff_s=0.01)
    results: list[tuple[Any, str | None]] = []
    t0 = time.monotonic()
    gen.generate(
        [GenerationRequest(("b", "p", 0), [{"role": "user", "content": "hi"}], seed=1)],
        lambda request, generation, error: results.append((generation, error)),
    )
    elapsed = time.monotonic() - t0
    gen.close()
    assert elapsed < 2 * DEADLINE_S, elapsed
    [(generation, error)] = results
    assert generation is None and "DeadlineExceeded" in error and "after 1 attempts" in error
    assert gen.client.counts == {"requests": 1, "retries": 0, "failures": 1}


# -- the shared client's policy ------------------------------------------------------------------


def test_retry_delays():
    from sarl.http_client import RetryPolicy

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
    from sarl.http_client import JSONClient, RequestFailed, RetryPolicy, UnusableResponse

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
