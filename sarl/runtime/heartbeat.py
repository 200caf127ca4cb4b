"""A line every few seconds while a step that prints nothing of its own runs (loading a model: importing torch and
transformers, reading the weights), so that no command is silent for longer than `every_s` and the user sees which
step the time goes to."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def heartbeat(say: Callable[[str], None], what: str, every_s: float = 5.0) -> Iterator[None]:
    """Say `what ...` now, `what: N s so far` every `every_s` seconds from a helper thread while the block runs,
    and `what: done in N s` at its end (also when it raises: then `what: failed after N s`)."""
    start = time.monotonic()
    stop = threading.Event()
    say(f"{what} ...")

    def beat() -> None:
        while not stop.wait(every_s):
            say(f"{what}: {time.monotonic() - start:.0f} s so far")

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        thread.join()
        elapsed = time.monotonic() - start
        say(f"{what}: done in {elapsed:.1f} s" if ok else f"{what}: failed after {elapsed:.1f} s")
