"""EmbeddingServer lifecycle failures: they raise clear errors and leave no process behind."""

import os
import sys

import pytest

from sarl.serving.server import EmbeddingServer


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_server_that_exits_reports_its_log(tmp_path):
    # The training venv has no vLLM: the module import fails at once.
    server = EmbeddingServer("some-model", python=sys.executable, startup_timeout_s=60, log_path=tmp_path / "s.log")
    with pytest.raises(RuntimeError, match="(?s)exited with code 1.*No module named 'vllm'"):
        server.start()
    assert server.proc is None


def test_server_that_never_becomes_healthy_times_out_and_is_stopped(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho pretending to load a model\nsleep 600 &\nwait\n")
    fake.chmod(0o755)
    server = EmbeddingServer("m", python=str(fake), startup_timeout_s=3, log_path=tmp_path / "s.log")
    seen = {}
    real_stop = server.stop

    def spy_stop(*a, **k):
        seen["pid"] = server.proc.pid
        real_stop(*a, **k)

    server.stop = spy_stop
    with pytest.raises(TimeoutError, match="(?s)not healthy after 3 s.*pretending to load a model"):
        server.start()
    assert not _alive(seen["pid"])
    # the background child of the shell was in the same process group and is gone too
    assert not any(
        _alive(int(p)) and open(f"/proc/{p}/cmdline", "rb").read().startswith(b"sleep\x00600")
        for p in os.listdir("/proc")
        if p.isdigit() and _safe_pgid(int(p)) == seen["pid"]
    )


def _safe_pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_command_carries_port_runner_and_memory_share():
    cmd = EmbeddingServer("Qwen/Qwen3-Embedding-0.6B", port=8123, gpu_memory_utilization=0.05).command()
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag, value in [("--runner", "pooling"), ("--port", "8123"), ("--gpu-memory-utilization", "0.05")]:
        assert cmd[cmd.index(flag) + 1] == value
