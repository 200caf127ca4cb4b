"""A small client for OpenAI-compatible `/chat/completions` endpoints (generation servers and judges).

Retries with exponential backoff on 429, 5xx, timeouts and connection errors (a `Retry-After` header is
honoured); any other status fails at once. `run_concurrently` maps a function over items on a thread pool
with a progress bar and hands every result or error to a callback as it arrives, so callers can cache each
one before the next finishes.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterable, TypeVar
from urllib.parse import urlparse

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

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
    """POST `{base}/chat/completions` with retries; thread-safe (one httpx connection pool)."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
    ) -> None:
        import httpx

        self.base = api_base(url)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(headers=headers, timeout=self.timeout_s, trust_env=False)
        self.counts = {"requests": 0, "retries": 0, "failures": 0}
        self._lock = threading.Lock()

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass
        return min(self.backoff_s * 2**attempt, self.max_backoff_s) * (0.5 + random.random() / 2)

    def chat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The JSON reply to one chat request; ChatRequestError when it fails for good."""
        import httpx

        url = f"{self.base}/chat/completions"
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            self._count("requests")
            retry_after = None
            try:
                reply = self._client.post(url, json=payload)
            except (httpx.TimeoutException, httpx.TransportError) as err:
                last = f"{type(err).__name__}: {err}"
            else:
                if reply.status_code == 200:
                    try:
                        return reply.json()
                    except ValueError as err:
                        last = f"HTTP 200 with a body that is not JSON ({err})"
                elif reply.status_code in RETRY_STATUS:
                    last = f"HTTP {reply.status_code}: {reply.text[:300]}"
                    retry_after = reply.headers.get("retry-after")
                else:
                    self._count("failures")
                    raise ChatRequestError(f"{url} answered HTTP {reply.status_code}: {reply.text[:500]}")
            if attempt < self.max_retries:
                self._count("retries")
                delay = self._delay(attempt, retry_after)
                log.debug("chat request failed (%s); retry %d in %.1fs", last, attempt + 1, delay)
                time.sleep(delay)
        self._count("failures")
        raise ChatRequestError(f"{url} failed after {self.max_retries + 1} attempts; last error: {last}")

    def close(self) -> None:
        self._client.close()


def run_concurrently(
    items: Iterable[T],
    fn: Callable[[T], R],
    on_result: Callable[[T, R | None, str | None], None],
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
    pending: dict[Future, T] = {}
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
