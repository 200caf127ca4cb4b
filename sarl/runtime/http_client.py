"""One HTTP client for the project's JSON APIs (embedding server, generation server, judge).

`JSONClient.post_json` sends one POST with retries over one pooled `httpx.Client`. Every attempt has a
total deadline (connecting, sending, the status line, the headers and the body): httpx's own timeout is
per read, so a server trickling one byte at a time could otherwise hold a request forever. The client's
connections come from a network back end (`_DeadlineBackend`) whose every socket read and write waits
at most the time left before the calling thread's deadline, so an attempt ends at its deadline whatever
part of the answer the server trickles.

A circuit breaker (`BreakerPolicy`, `CircuitBreaker`) stops a dead or hung server from costing every
request its full retries and backoff in sequence: after `failures` consecutive connection-level failures
(refused, reset, timed out) the breaker opens and every request fails at once ("circuit open", counted)
for `cooldown_s`; then one request goes through as a probe (half-open): an answer closes the breaker,
another connection-level failure opens it for a new cool-down.

What is retried is the caller's `RetryPolicy`: retryable statuses, exponential backoff with optional
jitter, and how a `Retry-After` header counts. A `parse` hook turns a 2xx answer into the caller's result;
it raises `UnusableResponse` for a body worth another try, any other exception ends the request at once.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, TypeVar

import httpcore
import httpx

log = logging.getLogger(__name__)

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
    "status" (a non-2xx answer, in `response`), "unusable" (a 2xx answer the parse hook rejected) or
    "open" (not sent: the circuit breaker is open, `error` is the `CircuitOpen`).
    """

    kind: Literal["timeout", "unreachable", "status", "unusable", "open"]
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
    when every attempt failed or the circuit breaker refused it (`failure.kind == "open"`). `failure` is
    the last attempt's; `attempts` counts the attempts sent."""

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


class CircuitOpen(Exception):
    """A request refused without being sent: the circuit breaker is open."""


@dataclass(frozen=True)
class BreakerPolicy:
    """When the circuit breaker opens and for how long.

    `failures`: consecutive connection-level failed attempts (refused, reset, timed out, past the
    deadline; counted over all of the client's threads, reset by any answer, even an error status)
    that open it; None disables the breaker. `cooldown_s`: how long it stays open, failing every
    request at once, before it lets one probe through.
    """

    failures: int | None = 5
    cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if self.failures is not None and self.failures < 1:
            raise ValueError(f"breaker failures must be >= 1 or None (no breaker), not {self.failures}")
        if not self.cooldown_s >= 0:
            raise ValueError(f"breaker cooldown_s must be >= 0, not {self.cooldown_s}")


class CircuitBreaker:
    """closed --(`failures` consecutive connection failures)--> open --(`cooldown_s`)--> half-open: one
    probe request goes through --(an answer)--> closed, --(a connection failure)--> open again.

    Thread-safe. Counts `opens` (times it opened) and `rejected` (requests refused while open). The
    state is not pickled: a copy (e.g. in a Ray worker) starts closed. `clock` is for tests.
    """

    def __init__(
        self, policy: BreakerPolicy, name: str = "server", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self.state: Literal["closed", "open", "half_open"] = "closed"
        self.streak = 0  # consecutive connection failures
        self.opens = 0
        self.rejected = 0
        self._opened_at = 0.0
        self._probe_out = False

    def __getstate__(self) -> dict[str, Any]:
        return {"policy": self.policy, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["policy"], state["name"])  # type: ignore[misc]

    @property
    def enabled(self) -> bool:
        return self.policy.failures is not None

    def _cooldown_left(self) -> float:
        return self._opened_at + self.policy.cooldown_s - self._clock()

    def allow(self) -> str | None:
        """None when a request may be sent (half-open: this one is the probe); else why not (counted)."""
        if not self.enabled:
            return None
        with self._lock:
            if self.state == "closed":
                return None
            left = self._cooldown_left()
            if self.state == "open" and left <= 0:
                self.state, self._probe_out = "half_open", False
            if self.state == "half_open" and not self._probe_out:
                self._probe_out = True
                return None
            self.rejected += 1
            wait = f"next probe in {left:.1f} s" if left > 0 else "a probe request is under way"
            return (
                f"circuit open: {self.name} failed {self.streak} consecutive connection attempts "
                f"(breaker failures={self.policy.failures}, cooldown_s={self.policy.cooldown_s:g}); {wait}"
            )

    def is_open(self) -> bool:
        """Open and still cooling down (a request now would be refused)."""
        with self._lock:
            return self.enabled and self.state == "open" and self._cooldown_left() > 0

    def record(self, connection_failed: bool) -> None:
        """The outcome of a sent attempt: a connection-level failure, or any answer."""
        if not self.enabled:
            return
        with self._lock:
            if not connection_failed:
                if self.state != "closed":
                    log.warning("%s answers again: circuit breaker closed", self.name)
                self.state, self.streak, self._probe_out = "closed", 0, False
                return
            self.streak += 1
            if self.state == "half_open" or (self.state == "closed" and self.streak >= self.policy.failures):
                self.state, self._opened_at, self._probe_out = "open", self._clock(), False
                self.opens += 1
                log.warning(
                    "%s: %d consecutive connection failures, circuit breaker open: requests fail at once "
                    "for %g s, then one probe",
                    self.name,
                    self.streak,
                    self.policy.cooldown_s,
                )

    def release(self) -> None:
        """An attempt that ended without an outcome (an interrupt): a probe it held may be sent again."""
        with self._lock:
            if self.state == "half_open":
                self._probe_out = False


# -- a total deadline per attempt -----------------------------------------------------------------

_deadline = threading.local()  # .at (time.monotonic) and .total (s) of the calling thread's attempt


def _bounded(timeout: float | None) -> float | None:
    """`timeout` cut to the time left before this thread's deadline; DeadlineExceeded when none is left."""
    at = getattr(_deadline, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded(f"answer not complete within {_deadline.total:g} s")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose reads and writes wait at most until the calling thread's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, _bounded(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network back end with `_DeadlineStream` connections (pooled connections keep them)."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_tcp(host, port, _bounded(timeout), local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        return _DeadlineStream(self._inner.connect_unix_socket(path, _bounded(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _deadline_transport(limits: httpx.Limits) -> httpx.HTTPTransport:
    """httpx's transport over `_DeadlineBackend` (httpx has no public hook for the network back end)."""
    transport = httpx.HTTPTransport(limits=limits, trust_env=False)
    pool = getattr(transport, "_pool", None)
    if not isinstance(getattr(pool, "_network_backend", None), httpcore.NetworkBackend):
        raise RuntimeError(
            f"httpx {httpx.__version__} / httpcore {httpcore.__version__} no longer keep the connection pool's "
            "network back end at transport._pool._network_backend: sarl.runtime.http_client needs updating"
        )
    pool._network_backend = _DeadlineBackend(pool._network_backend)
    return transport


class JSONClient:
    """POSTs JSON with a deadline per attempt, retries and a circuit breaker; thread-safe, picklable (the
    connection pool is made on first use and remade after unpickling or `close`).

    `timeout_s` is the total deadline of one attempt (connecting, sending, waiting and reading the whole
    answer, status line and headers included); `read_timeout_s` (default: `timeout_s`) bounds each single
    read. `breaker` is a `BreakerPolicy` (default `BreakerPolicy()`: 5 failures, 30 s) or a
    `CircuitBreaker` the caller keeps (its state then outlives `close`); a refused request raises
    `RequestFailed` with `failure.kind == "open"` and no attempt sent.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        retry: RetryPolicy,
        read_timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
        max_connections: int | None = None,
        breaker: BreakerPolicy | CircuitBreaker | None = None,
    ) -> None:
        if timeout_s <= 0 or (read_timeout_s is not None and read_timeout_s <= 0):
            raise ValueError(f"timeout_s ({timeout_s}) and read_timeout_s ({read_timeout_s}) must be > 0")
        self.timeout_s = float(timeout_s)
        self.read_timeout_s = float(read_timeout_s) if read_timeout_s is not None else self.timeout_s
        self.retry = retry
        self.headers = dict(headers or {})
        self.max_connections = max_connections
        self.breaker = breaker if isinstance(breaker, CircuitBreaker) else CircuitBreaker(breaker or BreakerPolicy())
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
                    transport=_deadline_transport(limits),
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
        """`parse(response)` of the first 2xx answer. `on_attempt()` is called before every attempt sent,
        `on_retry(failure, retry_number, delay_s)` before every wait. Raises `RequestFailed`; at once
        (no wait, no further attempt) while the circuit breaker is open."""
        attempts = self.retry.max_retries + 1
        for attempt in range(attempts):
            refusal = self.breaker.allow()
            if refusal is not None:
                raise RequestFailed(AttemptFailure("open", error=CircuitOpen(refusal)), attempt, retryable=True)
            if on_attempt is not None:
                on_attempt()
            try:
                resp = self._attempt(url, body)
            except (httpx.TimeoutException, DeadlineExceeded) as err:
                self.breaker.record(connection_failed=True)
                failure = AttemptFailure("timeout", error=err)
            except httpx.TransportError as err:
                self.breaker.record(connection_failed=True)
                failure = AttemptFailure("unreachable", error=err)
            except BaseException:
                self.breaker.release()
                raise
            else:
                self.breaker.record(connection_failed=False)
                if resp.is_success:
                    try:
                        return parse(resp)
                    except UnusableResponse as err:
                        failure = AttemptFailure("unusable", error=err, response=resp)
                elif resp.status_code in self.retry.retry_status:
                    failure = AttemptFailure("status", response=resp)
                else:
                    raise RequestFailed(AttemptFailure("status", response=resp), attempt + 1, retryable=False)
            if attempt + 1 < attempts and not self.breaker.is_open():
                delay = self.retry.delay(attempt, retry_after_seconds(failure.response))
                if on_retry is not None:
                    on_retry(failure, attempt + 1, delay)
                time.sleep(delay)
        raise RequestFailed(failure, attempts, retryable=True)

    def _attempt_timeout(self) -> httpx.Timeout:
        read = min(self.read_timeout_s, self.timeout_s)
        return httpx.Timeout(connect=self.timeout_s, read=read, write=read, pool=self.timeout_s)

    def _attempt(self, url: str, body: Any) -> httpx.Response:
        """One POST whose whole answer (status line, headers, body) must arrive within `timeout_s`."""
        _deadline.at, _deadline.total = time.monotonic() + self.timeout_s, self.timeout_s
        try:
            return self.client.post(url, json=body)
        except httpx.TimeoutException as err:
            if time.monotonic() >= _deadline.at:  # a read or write cut short by the deadline
                raise DeadlineExceeded(f"answer not complete within {self.timeout_s:g} s") from err
            raise
        finally:
            _deadline.at = None
