"""Faults of a real embedding server during training: a vLLM CPU server (MiniLM, served as "minilm") that the
tests pause (SIGSTOP), kill (SIGKILL) and start again on the same port, under the structure reward with the
HTTP embedder, through TRL's reward adapter and through a real `python -m sarl.train` run.

What must hold: a failed reward is left out (None to TRL, never its `failed_score`) and counted; the client's
circuit breaker opens while the server is down (requests then fail at once) and closes when it answers again;
the rewards come back after a restart; a server that stays dead stops the run after `train.max_failed_steps`
steps with exit code 1, one line, and the failure count in `summary.json`.

Needs .venv-vllm (scripts/setup_vllm_cpu.sh); CI sets SARL_REQUIRE_VLLM=1, which turns a missing environment
into a failure. About two vLLM start-ups (two minutes each on a loaded 2-core machine) and a short smoke run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit import VLLM_VENV, vllm_python_or_skip

from sarl.contract.reward import RewardsFailedError
from sarl.runtime.network import free_port
from sarl.serving.http import HTTPEmbedder
from sarl.serving.server import VLLM_CPU_ARGS, VLLM_CPU_ENV, EmbeddingServer
from sarl.structure.embed.local import bundled_minilm_path

pytest.importorskip("trl")

from testkit import smoke_small  # noqa: E402

from sarl.backends.trl.rewards import TRLReward  # noqa: E402
from sarl.structure.reward import StructureReward  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
MODEL_NAME = "minilm"
DIM = 384  # all-MiniLM-L6-v2

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


class ControlledServer:
    """A real vLLM CPU embedding server on a fixed port that the test pauses, kills and starts again."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.starts = 0
        self.server: EmbeddingServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.server is not None and self.server.proc is not None and self.server.proc.poll() is None

    def start(self) -> None:
        self.starts += 1
        self.server = EmbeddingServer(
            bundled_minilm_path(),
            served_name=MODEL_NAME,
            python=str(VLLM_VENV / "bin" / "python"),
            port=self.port,
            env=VLLM_CPU_ENV,
            extra_args=VLLM_CPU_ARGS,
            startup_timeout_s=400,
            log_path=self.log_dir / f"server{self.starts}.log",
        )
        try:
            self.server.start()
        except (RuntimeError, TimeoutError) as err:
            pytest.fail(str(err))

    def signal(self, sig: signal.Signals) -> None:
        """`sig` to the server's process group (the one this test started: start_new_session)."""
        assert self.server is not None and self.server.proc is not None
        os.killpg(self.server.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.server.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.alive:
            self.signal(signal.SIGCONT)  # a paused server could not handle the SIGTERM
            self.server.stop()


@pytest.fixture(scope="module")
def vllm(tmp_path_factory) -> ControlledServer:
    vllm_python_or_skip()
    server = ControlledServer(tmp_path_factory.mktemp("vllm_faults"))
    server.start()
    yield server
    server.stop()


def ensure_running(server: ControlledServer) -> None:
    if not server.alive:
        server.start()


# -- the reward path -------------------------------------------------------------------------------

THINK = "<think>Let x be 2.\n\nThen x + x = 4.\n\nCheck: 4 - 2 = 2.\n\nSo the sum is 4.</think> So \\boxed{4}."
COMPLETIONS = [[{"role": "assistant", "content": THINK.replace("2", str(d))}] for d in (2, 3, 5, 7)]
PROMPTS = [[{"role": "user", "content": "What is x + x?"}]] * 4


def test_rewards_through_a_server_paused_killed_and_restarted(vllm):
    """Eight reward steps (four completions of one prompt each) against the real server:
    healthy; paused (timeouts, the breaker opens); still paused (refused at once, nothing sent); resumed
    (the probe closes the breaker); killed (refused connections, the breaker opens); two more dead steps (the
    third fully failed step in a row stops the run); started again on its port (the rewards come back)."""
    ensure_running(vllm)
    emb = HTTPEmbedder(
        url=vllm.url,
        model=MODEL_NAME,
        dim=DIM,
        timeout_s=3.0,
        max_retries=1,
        backoff_s=0.1,
        breaker_failures=2,
        breaker_cooldown_s=2.0,
    )
    reward = StructureReward(emb)
    adapter = TRLReward(reward, num_generations=4, max_failed_steps=3)

    def step() -> list[float | None]:
        return adapter(prompts=PROMPTS, completions=COMPLETIONS)

    healthy = step()
    assert all(isinstance(s, float) for s in healthy) and emb.breaker.state == "closed"

    vllm.signal(signal.SIGSTOP)  # hung: connections open, nothing answers
    try:
        assert step() == [None] * 4  # left out, not scored failed_score (0.0)
        assert emb.breaker.state == "open" and emb.breaker.opens == 1
        sent = emb.stats.requests
        assert step() == [None] * 4
        assert emb.stats.requests == sent and emb.stats.circuit_open_requests >= 1  # failed at once, nothing sent
    finally:
        vllm.signal(signal.SIGCONT)
    time.sleep(2.5)  # past the cool-down: the next request is the probe (a wait, not a timed assertion)
    assert step() == pytest.approx(healthy)  # the same texts, the same rewards
    assert emb.breaker.state == "closed" and adapter.failed_streak == 0

    vllm.kill()
    assert step() == [None] * 4
    assert emb.breaker.state == "open" and emb.breaker.opens == 2
    assert step() == [None] * 4
    with pytest.raises(RewardsFailedError, match="every reward failed in 3 consecutive steps"):
        step()
    assert adapter.failed_total == 5 * 4
    reasons = {r.split(":")[0] for r in emb.failure_counts}
    assert {"embedding timeout", "embedding circuit open", "embedding server unreachable"} <= reasons, reasons

    vllm.start()  # the same port
    time.sleep(2.5)
    assert step() == pytest.approx(healthy)
    assert emb.breaker.state == "closed" and adapter.failed_streak == 0 and adapter.failed_total == 20
    emb.close()


# -- a real training run -----------------------------------------------------------------------------


def test_training_stops_after_max_failed_steps_when_the_server_is_killed(vllm, policy_cache, tmp_path):
    """`python -m sarl.train +exp=smoke` with the HTTP embedder on the real server, killed once step 1 is
    logged: the next steps' rewards all fail and are left out (the circuit breaker opens on the way), the
    second such step stops the run with exit code 1 and one line, and summary.json counts the failed rewards."""
    ensure_running(vllm)
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "sarl.train",
        "+exp=smoke",
        "logger=none",
        f"paths.root={tmp_path}",
        f"model.build.cache_dir={policy_cache}",
        f"run_dir={run_dir}",
        *smoke_small(48),
        "heldout=null",
        "backend.max_steps=8",
        "train.max_failed_steps=2",
        "embedding=vllm_server",
        f"embedding.url={vllm.url}",
        f"embedding.model={MODEL_NAME}",
        f"embedding.dim={DIM}",
        "embedding.timeout_s=5",
        "embedding.max_retries=1",
        "embedding.backoff_s=0.1",
        "embedding.breaker_failures=2",  # step 2's two refused attempts open it: step 3 fails at once
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "SARL_DEBUG": ""}
    log_path = tmp_path / "train.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            metrics = run_dir / "metrics.jsonl"
            deadline = time.monotonic() + 400
            while not (metrics.exists() and metrics.read_text().strip()):
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no step logged in 400 s"
                time.sleep(0.2)
            vllm.kill()
            code = proc.wait(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = log_path.read_text()
    assert code == 1, out[-3000:]
    stopped = [line for line in out.splitlines() if "training stopped:" in line]
    assert len(stopped) == 1 and "every reward failed in 2 consecutive steps" in stopped[0], out[-3000:]
    assert "Traceback" not in out
    assert "circuit breaker open" in out and "embedding circuit open" in out
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    assert rows[0]["step"] == 1 and rows[0]["reward/failed"] == 0
    assert rows[-1]["reward/failed"] == 8 and rows[-1]["reward/left_out"] == 8  # the first fully failed step
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed_rewards"] == 2 * 8 and summary["steps"] == rows[-1]["step"]
    assert "every reward failed in 2 consecutive steps" in summary["stopped"]
    assert not (run_dir / "final").exists()
