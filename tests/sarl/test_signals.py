"""SIGTERM/SIGHUP as an exception (sarl.runtime.signals), and `python -m sarl.train` stopping its real children
(the verl entry point and the embedding server, each in its own session) when it is terminated."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit import fake_vllm_python

from sarl.runtime.signals import Terminated, run_in_own_group, signals_as_exceptions

REPO = Path(__file__).resolve().parents[2]


def test_the_first_signal_raises_a_second_is_ignored_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    with pytest.raises(Terminated) as caught:
        with signals_as_exceptions():
            try:
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(5)  # interrupted: the handler raises here
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # during the clean-up: logged, not raised
    assert caught.value.signum == signal.SIGHUP and caught.value.exit_code == 129
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_an_embedding_server_interrupted_while_starting_is_stopped(tmp_path, monkeypatch):
    from sarl.serving.server import EmbeddingServer

    server = EmbeddingServer("m", python=str(fake_vllm_python(tmp_path)), log_path=tmp_path / "s.log")
    started = []

    def interrupted(*a, **k):
        started.append(server.proc)
        raise Terminated(signal.SIGTERM)  # as the handler raises it during the health check

    monkeypatch.setattr(server, "healthy", interrupted)
    try:
        with pytest.raises(Terminated):
            server.start()
        assert started[0].poll() is not None and not _group_alive(started[0].pid)
    finally:
        _kill_group(started[0].pid)


# The verl entry point's stand-in (sarl.train imports it first, as it imports the real one: nothing runs then):
# starts a grandchild in its process group, records its pid, and waits.
FAKE_VERL = """
import os, subprocess, time
if __name__ == "__main__":
    subprocess.Popen(["sleep", "600"])
    with open(os.path.join(os.environ["FAKE_PID_DIR"], "verl.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
"""


def _group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is alive (a zombie waiting for its parent is not)."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _kill_group(pgid: int) -> None:
    """Leave nothing behind when a test fails."""
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        if proc.poll() is not None:
            pytest.fail(f"sarl.train exited with {proc.returncode} first:\n{proc.communicate()[1][-4000:]}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {path.name} after {timeout_s} s:\n{proc.communicate()[1][-4000:]}")


@pytest.mark.slow
def test_sigterm_to_train_stops_verl_and_the_embedding_server_and_exits_143(tmp_path, tiny_qwen3_dir):
    pids = tmp_path / "pids"
    pids.mkdir()
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "fake_verl_entry.py").write_text(FAKE_VERL)
    data = tmp_path / "data"
    data.mkdir()
    import pandas as pd

    for name in ("train", "val"):  # sarl.train checks that they are parquet; the stand-in never reads them
        pd.DataFrame({"prompt": ["q"]}).to_parquet(data / f"{name}.parquet")
    args = [
        "+exp=grpo_sarl_math",
        f"paths.root={tmp_path}",
        f"model.path={tiny_qwen3_dir}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'val.parquet'}",
        "data.expected_count=null",
        "logger=none",
        "embedding.url=auto",
        "embedding.dim=3",  # the stand-in server's vectors (sarl.train embeds one text before launch)
        f"embedding_server.python={fake_vllm_python(tmp_path)}",
        "embedding_server.startup_timeout_s=60",
        "backend.entry_module=fake_verl_entry",
    ]
    env = {
        **os.environ,
        "FAKE_PID_DIR": str(pids),
        "PYTHONPATH": os.pathsep.join([str(modules), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "sarl.train", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    groups = []
    try:
        groups.append(_wait_for(pids / "vllm.pid", proc, 240))
        groups.append(_wait_for(pids / "verl.pid", proc, 120))  # started once the embedding server is healthy
        assert all(_group_alive(g) for g in groups)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=90)
        deadline = time.monotonic() + 5
        while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [name for name, g in zip(("embedding server", "verl entry point"), groups) if _group_alive(g)]
    finally:
        if proc.poll() is None:
            proc.kill()
        for g in groups:
            _kill_group(g)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-4000:]
    assert "received SIGTERM" in stderr and "Traceback" not in stderr
    assert not left, f"process groups still running: {left}"


def test_run_in_own_group_returns_the_exit_code_and_stops_the_whole_group_on_an_exception(tmp_path):
    """What sarl.train (verl) and the verl SFT launch (torchrun) share: the child leads its own group; an exception
    while waiting (here SIGALRM turned into one) stops the child and what it started, then propagates."""
    assert run_in_own_group([sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path, env=dict(os.environ)) == 3
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )

    def boom(*_):
        raise TimeoutError("stop waiting")

    previous = signal.signal(signal.SIGALRM, boom)
    signal.alarm(6)  # time for the child to start its grandchild, even on a loaded machine
    try:
        with pytest.raises(TimeoutError):
            run_in_own_group([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), grace_s=5)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{grandchild}/stat") as f:  # a zombie waiting for its reaper is gone too
            if f.read().split(") ")[1].startswith("Z"):
                break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the grandchild {grandchild} outlived its group")
