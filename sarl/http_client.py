"""One HTTP client for the project's JSON APIs (embedding server, generation server, judge).

`JSONClient.post_json` sends one POST with retries over one pooled `httpx.Client`. Every attempt has a
total deadline: the answer is streamed and the deadline is checked between chunks, so a server that
trickles its body is cut off at the deadline plus at most one read timeout (httpx's own timeout is per
read, so such a server could otherwise hold a request forever). Connecting is bounded by the deadline too.
A server that trickles its status line and headers is bounded per read only (httpx gives no hook there).

What is retried is the caller's `RetryPolicy`: retryable statuses, exponential backoff with optional
jitter, and how a `Retry-After` header counts. A `parse` hook turns a 2xx answer into the caller's result;
it raises `UnusableResponse` for a body worth another try, any other exception ends the request at once.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, TypeVar

import httpx

T = TypeVar("T")

# Rate limiting, request timeout and server-side errors.
DEFAULT_RETRY_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))


class UnusableResponse(Exception):
    """Raised by a `parse` hook for a 2xx answer whose body cannot be used; the request is retried."""


class DeadlineExceeded(Exception):
    """An attempt whose complete answer did not arrive within its deadline."""


@dataclass(frozen=True)
class RetryPolicy:
    """Which failures are retried and how long to wait before attempt `n + 1`.

    The backoff is `min(backoff_s * 2**n, backoff_max_s)`, times a uniform factor in [0.5, 1) with
    `jitter`. A numeric `Retry-After` header (capped at `backoff_max_s`) is waited `"at_least"` (the longer
    of it and the backoff) or `"instead"` of the backoff.
    """

    max_retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    jitter: bool = False
    retry_status: frozenset[int] = DEFAULT_RETRY_STATUS
    retry_after: Literal["at_least", "instead"] = "at_least"

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff_s < 0 or self.backoff_max_s < 0:
            raise ValueError(
                f"bad retry policy: max_retries={self.max_retries}, backoff_s={self.backoff_s}, "
                f"backoff_max_s={self.backoff_max_s} (all must be >= 0)"
            )
        if self.retry_after not in ("at_least", "instead"):
            raise ValueError(f"retry_after must be 'at_least' or 'instead', not {self.retry_after!r}")

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt `attempt` (0-based)."""
        backoff = min(self.backoff_s * 2**attempt, self.backoff_max_s)
        if retry_after is not None:
            capped = min(retry_after, self.backoff_max_s)
            return capped if self.retry_after == "instead" else max(backoff, capped)
        return backoff * (0.5 + random.random() / 2) if self.jitter else backoff


@dataclass(frozen=True)
class AttemptFailure:
    """Why one attempt failed.

    `kind`: "timeout" (httpx timeout or the deadline), "unreachable" (connection or protocol error),
    "status" (a non-2xx answer, in `response`) or "unusable" (a 2xx answer the parse hook rejected).
    """

    kind: Literal["timeout", "unreachable", "status", "unusable"]
    error: BaseException | None = None
    response: httpx.Response | None = None

    def describe(self) -> str:
        """A one-line account: the exception, or the status and the start of the body."""
        if self.kind == "status" and self.response is not None:
            return f"HTTP {self.response.status_code}: {self.response.text[:300]}"
        if self.kind == "unusable" and self.response is not None:
            return f"HTTP {self.response.status_code} with an unusable body ({self.error})"
        return f"{type(self.error).__name__}: {self.error}"


class RequestFailed(Exception):
    """A request that failed for good: `retryable` is False for a status outside the retry policy, True
    when every attempt failed. `failure` is the last attempt's."""

    def __init__(self, failure: AttemptFailure, attempts: int, retryable: bool) -> None:
        super().__init__(f"{failure.describe()} (after {attempts} attempt{'s' if attempts != 1 else ''})")
        self.failure = failure
        self.attempts = attempts
        self.retryable = retryable


def retry_after_seconds(resp: httpx.Response | None) -> float | None:
    """Seconds from a numeric `Retry-After` header, if any."""
    value = resp.headers.get("retry-after") if resp is not None else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


class JSONClient:
    """POSTs JSON with a deadline per attempt and retries; thread-safe, picklable (the connection pool is
    made on first use and remade after unpickling or `close`).

    `timeout_s` is the total deadline of one attempt (connecting, sending, waiting and reading the whole
    answer); `read_timeout_s` (default: `timeout_s`) bounds each single read, so an attempt lasts at most
    about `timeout_s + read_timeout_s`.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        retry: RetryPolicy,
        read_timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
        max_connections: int | None = None,
    ) -> None:
        if timeout_s <= 0 or (read_timeout_s is not None and read_timeout_s <= 0):
            raise ValueError(f"timeout_s ({timeout_s}) and read_timeout_s ({read_timeout_s}) must be > 0")
        self.timeout_s = float(timeout_s)
        self.read_timeout_s = float(read_timeout_s) if read_timeout_s is not None else self.timeout_s
        self.retry = retry
        self.headers = dict(headers or {})
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        """The pooled `httpx.Client` (made on first use)."""
        with self._lock:
            if self._client is None:
                limits = httpx.Limits(
                    max_connections=self.max_connections, max_keepalive_connections=self.max_connections
                )
                self._client = httpx.Client(
                    headers=self.headers,
                    timeout=self._attempt_timeout(),
                    limits=limits,
                    trust_env=False,  # never route a local server through a proxy
                )
            return self._client

    def close(self) -> None:
        """Closes the connection pool (a later request opens a new one)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def post_json(
        self,
        url: str,
        body: Any,
        parse: Callable[[httpx.Response], T],
        *,
        on_attempt: Callable[[], None] | None = None,
        on_retry: Callable[[AttemptFailure, int, float], None] | None = None,
    ) -> T:
        """`parse(response)` of the first 2xx answer. `on_attempt()` is called before every attempt,
        `on_retry(failure, retry_number, delay_s)` before every wait. Raises `RequestFailed`."""
        attempts = self.retry.max_retries + 1
        for attempt in range(attempts):
            if on_attempt is not None:
                on_attempt()
            try:
                resp = self._attempt(url, body)
            except (httpx.TimeoutException, DeadlineExceeded) as err:
                failure = AttemptFailure("timeout", error=err)
            except httpx.TransportError as err:
                failure = AttemptFailure("unreachable", error=err)
            else:
                if resp.is_success:
                    try:
                        return parse(resp)
                    except UnusableResponse as err:
                        failure = AttemptFailure("unusable", error=err, response=resp)
                elif resp.status_code in self.retry.retry_status:
                    failure = AttemptFailure("status", response=resp)
                else:
                    raise RequestFailed(AttemptFailure("status", response=resp), attempt + 1, retryable=False)
            if attempt + 1 < attempts:
                delay = self.retry.delay(attempt, retry_after_seconds(failure.response))
                if on_retry is not None:
                    on_retry(failure, attempt + 1, delay)
                time.sleep(delay)
        raise RequestFailed(failure, attempts, retryable=True)

    def _attempt_timeout(self) -> httpx.Timeout:
        read = min(self.read_timeout_s, self.timeout_s)
        return httpx.Timeout(connect=self.timeout_s, read=read, write=read, pool=self.timeout_s)

    def _attempt(self, url: str, body: Any) -> httpx.Response:
        """One POST whose whole answer must arrive within `timeout_s`; returns it fully read."""
        deadline = time.monotonic() + self.timeout_s
        with self.client.stream("POST", url, json=body) as resp:
            raw = bytearray()
            for chunk in resp.iter_raw():
                raw += chunk
                if time.monotonic() > deadline:
                    raise DeadlineExceeded(
                        f"answer not complete within {self.timeout_s:g} s (the server is still sending)"
                    )
        # The wire bytes (still content-encoded): the new response decodes them as the original would.
        return httpx.Response(resp.status_code, headers=resp.headers, content=bytes(raw), request=resp.request)
