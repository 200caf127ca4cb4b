"""Client for an OpenAI-compatible `/v1/embeddings` server.

SARL App. B.2 / decisions §1.2 "Embeddings": step texts are embedded by
Qwen/Qwen3-Embedding-0.6B served with vLLM. The client packs distinct texts into
requests of `batch_size`, sends them concurrently over one pooled client
(`sarl.runtime.http_client.JSONClient`: a total deadline per attempt, capped exponential backoff
on transient errors, a circuit breaker that fails requests at once while the server is down),
and reports every text it could not embed with a reason; it never
invents a vector. Vectors travel as base64 float32 by default (`encoding_format`), which
is much cheaper to decode than JSON floats.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Literal

import httpx
import numpy as np

from sarl.runtime.http_client import (
    AttemptFailure,
    BreakerPolicy,
    CircuitBreaker,
    JSONClient,
    RequestFailed,
    RetryPolicy,
)
from sarl.structure.embed.base import Embedder

log = logging.getLogger(__name__)

# Client errors that can come from one bad text (too long, empty, ...): a request with
# several texts is split in halves so that only the offending texts fail.
_SPLIT_STATUS = frozenset({400, 413, 422})
_MAX_MESSAGE = 300


@dataclass
class HTTPEmbedderStats:
    """Counters since the embedder was made.

    `requests` counts every HTTP attempt (retries and split halves included);
    `failed_requests` the requests that gave no vectors in the end (one rejected with a
    4xx and then split counts as failed, its halves are counted on their own);
    `circuit_open_requests` those among them refused unsent by the open circuit breaker
    (how often it opened: `HTTPEmbedder.breaker.opens`).
    """

    requests: int = 0
    retries: int = 0
    failed_requests: int = 0
    split_requests: int = 0
    texts_embedded: int = 0
    texts_truncated: int = 0
    encoding_fallbacks: int = 0
    circuit_open_requests: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _RequestFailed(Exception):
    """A request whose texts all fail with `reason` (already prefixed by its category)."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def _base_url(url: str) -> str:
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base


def _short(text: str, limit: int = _MAX_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _server_message(resp: httpx.Response) -> str:
    """The error message of an OpenAI/vLLM error body, else the raw body."""
    try:
        body = resp.json()
    except ValueError:
        return _short(resp.text) or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return _short(err["message"])
        if isinstance(err, str):
            return _short(err)
        if body.get("message"):
            return _short(body["message"])
        if body.get("detail"):
            return _short(body["detail"])
    return _short(resp.text)


class HTTPEmbedder(Embedder):
    """Embeds texts through an OpenAI-compatible embeddings server (e.g. vLLM).

    `url` is the server base (`http://host:port`, with or without `/v1`). Texts longer
    than `max_chars` are cut before sending. Extra request fields (e.g. vLLM's
    `{"truncate_prompt_tokens": -1}`, which truncates over-long inputs to the model's
    context instead of rejecting them) go in `extra_body`. Connection errors,
    timeouts, 408, 429 and 5xx are retried after `min(backoff_s * 2**attempt,
    backoff_max_s)` seconds; other 4xx are not, but with `split_on_client_error` a
    request of several texts answered 400/413/422 is split in halves so that only the
    rejected texts fail. `timeout_s` is the total time one attempt may take (a server
    that trickles its answer is cut off then). `encoding_format` "base64" (little-endian
    float32, as vLLM sends it) is decoded with numpy; "float" asks for JSON floats. A
    server that rejects a base64 request (400/422, naming the encoding in its message) before
    any base64 answer succeeded is asked again with "float"; if that works, the embedder
    keeps to "float" from then on (counted in `stats.encoding_fallbacks`, logged once).
    With `max_request_tokens`, a request also ends before its estimated tokens (UTF-8
    bytes / 4 per text) would pass that budget, so long texts go in smaller requests; a
    text over the budget goes alone. After `breaker_failures` consecutive connection-level
    failures (refused, reset, timed out; over all threads) the circuit breaker opens: for
    `breaker_cooldown_s` every request fails at once (reason "embedding circuit open",
    counted in `stats.circuit_open_requests`) instead of paying its retries and backoff,
    then one request probes the server and an answer closes the breaker
    (`sarl.runtime.http_client.CircuitBreaker`; `breaker_failures: null` disables it).
    """

    def __init__(
        self,
        *,
        url: str,
        model: str,
        batch_size: int = 256,
        max_concurrency: int = 8,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        api_key_env: str | None = "OPENAI_API_KEY",
        dim: int | None = None,
        max_chars: int | None = None,
        split_on_client_error: bool = True,
        extra_body: dict[str, Any] | None = None,
        encoding_format: Literal["base64", "float"] = "base64",
        max_request_tokens: int | None = None,
        breaker_failures: int | None = 5,
        breaker_cooldown_s: float = 30.0,
    ) -> None:
        super().__init__(dim=dim)
        if batch_size < 1 or max_concurrency < 1 or max_retries < 0:
            raise ValueError("batch_size and max_concurrency must be >= 1, max_retries >= 0")
        if timeout_s <= 0 or backoff_s < 0 or backoff_max_s < 0:
            raise ValueError("timeout_s must be > 0, backoff_s and backoff_max_s >= 0")
        if encoding_format not in ("base64", "float"):
            raise ValueError(f"encoding_format must be 'base64' or 'float', not {encoding_format!r}")
        if max_request_tokens is not None and max_request_tokens < 1:
            raise ValueError(f"max_request_tokens must be >= 1 or None, not {max_request_tokens}")
        if max_chars is not None and max_chars < 1:
            raise ValueError("max_chars must be >= 1 or None")
        if not str(url).startswith(("http://", "https://")):
            raise ValueError(
                f"embedding url {url!r} is not an http(s) URL; give embedding.url=http://HOST:PORT "
                "(url 'auto' is resolved by sarl.train, which starts the server itself)"
            )
        self.base_url = _base_url(url)
        self.endpoint = f"{self.base_url}/v1/embeddings"
        self.model = model
        self.batch_size = int(batch_size)
        self.max_concurrency = int(max_concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self.api_key_env = api_key_env
        self.max_chars = max_chars
        self.split_on_client_error = split_on_client_error
        self.extra_body = dict(extra_body or {})
        self.encoding_format = encoding_format
        self.max_request_tokens = max_request_tokens
        # kept by the embedder, so its state outlives `close` (the pool is remade, the breaker is not)
        self.breaker = CircuitBreaker(BreakerPolicy(breaker_failures, breaker_cooldown_s), name=self.endpoint)
        self._base64_answered = False  # a base64 request has succeeded: its errors are not the format's
        self.stats = HTTPEmbedderStats()
        self._lock = threading.Lock()
        self._http: JSONClient | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def _client(self) -> JSONClient:
        # Made on first use, so that the API key is read where the embedder runs (e.g. a Ray worker).
        with self._lock:
            if self._http is None:
                key = os.environ.get(self.api_key_env) if self.api_key_env else None
                retry = RetryPolicy(
                    max_retries=self.max_retries, backoff_s=self.backoff_s, backoff_max_s=self.backoff_max_s
                )
                self._http = JSONClient(
                    timeout_s=self.timeout_s,
                    retry=retry,
                    headers={"Authorization": f"Bearer {key}"} if key else None,
                    max_connections=self.max_concurrency,
                    breaker=self.breaker,
                )
            return self._http

    def close(self) -> None:
        """Closes the HTTP connection pool (a later call opens a new one)."""
        with self._lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()

    def __enter__(self) -> HTTPEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Picklable (e.g. shipped to a Ray worker): the client and lock are remade there.
        state = self.__dict__.copy()
        state["_http"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def health(self, timeout_s: float = 5.0) -> bool:
        """True when `GET {base}/health` answers 2xx within `timeout_s`."""
        try:
            resp = self._client().client.get(f"{self.base_url}/health", timeout=timeout_s)
        except httpx.HTTPError as exc:
            log.debug("health check of %s failed: %r", self.base_url, exc)
            return False
        return resp.is_success

    # -- embedding ---------------------------------------------------------------------

    def _embed_unique(self, texts: list[str]) -> tuple[list[np.ndarray | None], dict[int, str]]:
        if self.max_chars is not None:
            cut = sum(len(t) > self.max_chars for t in texts)
            if cut:
                self._count(texts_truncated=cut)
                texts = [t[: self.max_chars] for t in texts]
        starts = self._request_starts(texts)
        chunks = [texts[s:e] for s, e in zip(starts, starts[1:] + [len(texts)])]
        workers = min(self.max_concurrency, len(chunks))
        if workers <= 1:
            results = [self._embed_chunk(c) for c in chunks]
        else:
            # Threads, not asyncio: the reward may run inside verl's event loop.
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sarl-embed")
            try:
                results = list(pool.map(self._embed_chunk, chunks))
            finally:  # on an interrupt, return at once instead of waiting out every retry
                pool.shutdown(wait=False, cancel_futures=True)
        vectors: list[np.ndarray | None] = []
        reasons: dict[int, str] = {}
        for start, (vecs, errs) in zip(starts, results):
            vectors.extend(vecs)
            reasons.update({start + k: r for k, r in errs.items()})
        return vectors, reasons

    def _request_starts(self, texts: list[str]) -> list[int]:
        """Index of the first text of every request: at most `batch_size` texts and, with
        `max_request_tokens`, at most that many estimated tokens (unless one text alone)."""
        if self.max_request_tokens is None:
            return list(range(0, len(texts), self.batch_size))
        starts: list[int] = []
        size = tokens = 0
        for i, text in enumerate(texts):
            cost = estimate_tokens(text)
            if not starts or size == self.batch_size or tokens + cost > self.max_request_tokens:
                starts.append(i)
                size = tokens = 0
            size += 1
            tokens += cost
        return starts

    def _embed_chunk(self, texts: list[str]) -> tuple[list[np.ndarray | None], dict[int, str]]:
        """Vectors of one request's texts; on a client error, halves are tried apart."""
        try:
            return list(self._post(texts)), {}
        except _RequestFailed as exc:
            if len(texts) > 1 and exc.status in _SPLIT_STATUS and self.split_on_client_error:
                # e.g. vLLM answers 400 for the whole request when one input is longer
                # than the model's context: halve until the offending texts stand alone.
                log.info("%s; splitting %d texts to isolate the rejected ones", exc.reason, len(texts))
                self._count(split_requests=1)
                mid = len(texts) // 2
                left_v, left_r = self._embed_chunk(texts[:mid])
                right_v, right_r = self._embed_chunk(texts[mid:])
                return left_v + right_v, {**left_r, **{mid + k: r for k, r in right_r.items()}}
            if exc.status is not None:  # transport and parse failures were logged already
                log.warning("%s (%d texts, not retried)", exc.reason, len(texts))
            return [None] * len(texts), dict.fromkeys(range(len(texts)), exc.reason)
        except Exception as exc:  # never let one request take the whole batch down
            log.exception("unexpected error embedding %d texts at %s", len(texts), self.endpoint)
            self._count(failed_requests=1)
            reason = f"embedding client error: {type(exc).__name__}: {_short(str(exc))}"
            return [None] * len(texts), dict.fromkeys(range(len(texts)), reason)

    def _post(self, texts: list[str]) -> list[np.ndarray]:
        """One request with retries; raises `_RequestFailed` once it cannot succeed."""
        encoding = self.encoding_format
        try:
            vectors = self._post_as(texts, encoding)
        except _RequestFailed as exc:
            if encoding != "base64" or exc.status not in (400, 422) or self._base64_answered:
                raise
            if "base64" not in exc.reason.lower() and "encoding" not in exc.reason.lower():
                raise  # rejected for its texts (e.g. too long): the caller splits or fails them
            # If the texts were the problem after all, the float request fails the same way.
            vectors = self._post_as(texts, "float")
            with self._lock:
                switched, self.encoding_format = self.encoding_format == "base64", "float"
                if switched:
                    self.stats.encoding_fallbacks += 1
            if switched:
                log.warning(
                    "%s rejected encoding_format=base64 (%s) but answered float; using float from now on "
                    "(set encoding_format: float for this server)",
                    self.endpoint,
                    exc.reason,
                )
            return vectors
        if encoding == "base64":
            self._base64_answered = True
        return vectors

    def _post_as(self, texts: list[str], encoding: str) -> list[np.ndarray]:
        body = {**self.extra_body, "model": self.model, "input": texts, "encoding_format": encoding}
        try:
            vectors = self._client().post_json(
                self.endpoint,
                body,
                lambda resp: self._parse(resp, len(texts)),
                on_attempt=lambda: self._count(requests=1),
                on_retry=self._log_retry,
            )
        except RequestFailed as exc:
            self._count(failed_requests=1)
            failure = exc.failure
            if failure.kind == "open":
                self._count(circuit_open_requests=1)
                asked = f"given up after {exc.attempts} attempts" if exc.attempts else "not asked"
                reason = f"embedding circuit open: {self.endpoint} {asked} ({failure.error})"
                log.debug("%s (%d texts failed)", reason, len(texts))
                raise _RequestFailed(reason) from None
            if not exc.retryable:
                assert failure.response is not None  # only a status outside the policy is not retried
                status = failure.response.status_code
                message = _server_message(failure.response)
                reason = f"embedding server error: {self.endpoint} answered HTTP {status}: {message}"
                raise _RequestFailed(reason, status=status) from None
            category, detail = self._describe(failure)
            reason = f"{category}: {self.endpoint} after {exc.attempts} attempts {detail}"
            log.warning("%s (%d texts failed)", reason, len(texts))
            raise _RequestFailed(reason) from None
        self._count(texts_embedded=len(texts))
        return vectors

    def _describe(self, failure: AttemptFailure) -> tuple[str, str]:
        """(category, detail) of a failed attempt, for reasons and logs."""
        if failure.kind == "timeout":
            err = failure.error
            return "embedding timeout", (
                f"(no answer within {self.timeout_s:g} s; {type(err).__name__}: {_short(str(err))})"
            )
        if failure.kind == "unreachable":
            err = failure.error
            return "embedding server unreachable", f"({type(err).__name__}: {_short(str(err)) or 'connection failed'})"
        assert failure.response is not None
        return "embedding server error", f"(HTTP {failure.response.status_code}: {_server_message(failure.response)})"

    def _log_retry(self, failure: AttemptFailure, retry: int, delay: float) -> None:
        self._count(retries=1)
        category, detail = self._describe(failure)
        log.warning("%s: %s %s; retry %d/%d in %.2f s", category, self.endpoint, detail, retry, self.max_retries, delay)

    def _parse(self, resp: httpx.Response, n: int) -> list[np.ndarray]:
        """Vectors ordered by `data[*].index`; raises `_RequestFailed` if malformed."""
        try:
            payload = resp.json()
            data = payload["data"]
            if not isinstance(data, list):
                raise ValueError(f"'data' is a {type(data).__name__}, not a list")
            if len(data) != n:
                raise ValueError(f"{len(data)} embeddings for {n} inputs")
            out: list[np.ndarray | None] = [None] * n
            for pos, item in enumerate(data):
                index = item.get("index", pos)
                if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
                    raise ValueError(f"bad index {index!r}")
                if out[index] is not None:
                    raise ValueError(f"index {index} appears twice")
                vec = _decode(item["embedding"])
                if vec.ndim != 1 or vec.dtype.kind not in "iuf":
                    raise ValueError(f"embedding {index} is not a flat list of numbers")
                out[index] = vec.astype(np.float64)
        except _RequestFailed:
            raise
        except Exception as exc:  # JSON, key, type and shape errors alike
            self._count(failed_requests=1)
            reason = (
                f"bad embedding response: {self.endpoint} (HTTP {resp.status_code}): "
                f"{type(exc).__name__}: {_short(str(exc))}"
            )
            log.warning("%s (%d texts failed)", reason, n)
            raise _RequestFailed(reason) from None
        return out  # type: ignore[return-value]  # every slot was filled above

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)


def estimate_tokens(text: str) -> int:
    """A rough token count for request packing: UTF-8 bytes / 4 (BPE on English averages about 4)."""
    return len(text.encode("utf-8")) // 4 + 1


def _decode(embedding: Any) -> np.ndarray:
    """A vector from a base64 string (little-endian float32) or a list of numbers."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding, validate=True), dtype="<f4")
    return np.asarray(embedding)
