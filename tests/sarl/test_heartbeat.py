"""sarl.runtime.heartbeat: a step that prints nothing of its own says that it is running, how long so far, and how it
ended. No timing is asserted: the block waits until a heartbeat line has been said."""

import threading

import pytest

from sarl.runtime.heartbeat import heartbeat


def test_a_silent_step_is_announced_beats_and_ends_with_its_time():
    lines: list[str] = []
    beat = threading.Event()

    def say(line: str) -> None:
        lines.append(line)
        if "so far" in line:
            beat.set()

    with heartbeat(say, "loading x", every_s=0.01):
        assert beat.wait(30), "no heartbeat line while the block ran"
    assert lines[0] == "loading x ..."
    assert all(line.startswith("loading x: ") and line.endswith(" s so far") for line in lines[1:-1])
    assert lines[-1].startswith("loading x: done in ") and lines[-1].endswith(" s")


def test_a_failed_step_says_so_and_the_error_goes_on():
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="no weights"):
        with heartbeat(lines.append, "loading y", every_s=60):
            raise RuntimeError("no weights")
    assert lines[0] == "loading y ..." and lines[-1].startswith("loading y: failed after ")
