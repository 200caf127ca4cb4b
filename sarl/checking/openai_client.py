"""A small client for OpenAI-compatible `/chat/completions` endpoints (generation servers and judges).

Retries with jittered exponential backoff on 408, 409, 425, 429, 500, 502-504, timeouts, connection errors
and a 200 whose body is not JSON (a `Retry-After` header replaces the backoff); any other status fails at once.
Each attempt has a total deadline of `timeout_s` (`sarl.runtime.http_client.JSONClient`), and after `breaker_failures`
consecutive connection failures a circuit breaker fails requests at once for `breaker_cooldown_s`, then lets
one probe through (`sarl.runtime.http_client.CircuitBreaker`). `run_concurrently` maps a
function over items on a thread pool with a progress bar and hands every result or error to a callback as it
arrives, so callers can cache each one before the next finishes.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar
from urllib.parse import urlparse

from sarl.runtime.http_client import (
    BreakerPolicy,
    CircuitBreaker,
    JSONClient,
    RequestFailed,
    RetryPolicy,
    UnusableResponse,
)

if TYPE_CHECKING:
    import httpx

    from sarl.runtime.http_client import AttemptFailure

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_R = TypeVar("_R")

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ChatRequestError(RuntimeError):
    """A request that failed for good: a non-retryable status, or retries exhausted."""


def api_base(url: str) -> str:
    """`http://host:port` -> `http://host:port/v1`; a URL with a path is kept as given (no trailing slash)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"endpoint URL {url!r} is not an http(s) URL such as http://127.0.0.1:8000/v1")
    url = url.rstrip("/")
    return url if parsed.path.strip("/") else url + "/v1"


def api_key_from_env(name: str | None) -> str | None:
    """The API key in environment variable `name` (None when unset or empty)."""
    return (os.environ.get(name) or None) if name else None


class ChatClient:
    """POST `{base}/chat/completions` with retries; thread-safe (one httpx connection pool). `timeout_s` is
    the total time one attempt may take: a server that trickles its answer is cut off then. The circuit
    breaker (`breaker_failures` consecutive connection failures open it for `breaker_cooldown_s`; None: no
    breaker) fails requests at once while the server is down; they count in `counts["circuit_open"]`."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        breaker_failures: int | None = 5,
        breaker_cooldown_s: float = 30.0,
    ) -> None:
        self.base = api_base(url)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        retry = RetryPolicy(
            max_retries=self.max_retries,
            backoff_s=self.backoff_s,
            backoff_max_s=self.max_backoff_s,
            jitter=True,
            retry_status=RETRY_STATUS,
            retry_after="instead",
        )
        self.breaker = CircuitBreaker(BreakerPolicy(breaker_failures, breaker_cooldown_s), name=self.base)
        self._http = JSONClient(timeout_s=self.timeout_s, retry=retry, headers=headers, breaker=self.breaker)
        self.counts = {"requests": 0, "retries": 0, "failures": 0, "circuit_open": 0}
        self._lock = threading.Lock()

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def chat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The JSON reply to one chat request; ChatRequestError when it fails for good."""
        url = f"{self.base}/chat/completions"
        try:
            return self._http.post_json(
                url, payload, _json_body, on_attempt=lambda: self._count("requests"), on_retry=self._on_retry
            )
        except RequestFailed as err:
            self._count("failures")
            failure = err.failure
            if failure.kind == "open":
                self._count("circuit_open")
                asked = f"given up after {err.attempts} attempts" if err.attempts else "not asked"
                raise ChatRequestError(f"{url} {asked}: {failure.error}") from None
            if not err.retryable and failure.response is not None:
                raise ChatRequestError(
                    f"{url} answered HTTP {failure.response.status_code}: {failure.response.text[:500]}"
                ) from None
            raise ChatRequestError(
                f"{url} failed after {err.attempts} attempts; last error: {failure.describe()}"
            ) from None

    def _on_retry(self, failure: AttemptFailure, retry: int, delay: float) -> None:
        self._count("retries")
        log.debug("chat request failed (%s); retry %d in %.1fs", failure.describe(), retry, delay)

    def close(self) -> None:
        self._http.close()


def _json_body(reply: httpx.Response) -> dict[str, Any]:
    """The JSON of a 2xx reply; a body that is not JSON is worth another try."""
    try:
        return reply.json()
    except ValueError as err:
        raise UnusableResponse(f"not JSON: {err}") from None


def run_concurrently(
    items: Iterable[_T],
    fn: Callable[[_T], _R],
    on_result: Callable[[_T, _R | None, str | None], None],
    concurrency: int,
    desc: str,
    total: int | None = None,
) -> int:
    """Call `fn(item)` on `concurrency` threads; `on_result(item, result, None)` or `(item, None, error)`
    for each as it completes (in this thread). Returns the number of errors. Interrupting cancels the
    items not started yet."""
    from tqdm import tqdm

    items = list(items)
    errors = 0
    pending: dict[Future, _T] = {}
    iterator = iter(items)
    with (
        ThreadPoolExecutor(max_workers=max(1, int(concurrency))) as pool,
        tqdm(total=total or len(items), desc=desc, unit="req", dynamic_ncols=True) as bar,
    ):
        try:
            for item in iterator:
                pending[pool.submit(fn, item)] = item
                if len(pending) >= 2 * concurrency:
                    errors += _drain(pending, on_result, bar, FIRST_COMPLETED)
            while pending:
                errors += _drain(pending, on_result, bar, FIRST_COMPLETED)
        except BaseException:
            for future in pending:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return errors


def _drain(pending: dict[Future, Any], on_result: Callable, bar: Any, how: str) -> int:
    done, _ = wait(list(pending), return_when=how)
    errors = 0
    for future in done:
        item = pending.pop(future)
        try:
            result = future.result()
        except Exception as err:  # noqa: BLE001 - reported to the caller as this item's error
            errors += 1
            on_result(item, None, f"{type(err).__name__}: {err}")
        else:
            on_result(item, result, None)
        bar.update(1)
    return errors
