"""vLLM OpenAI-compatible servers run as child processes: `VLLMServer` for any model (the
evaluation's generation server), `EmbeddingServer` for an embedding model (SARL App. B.2: a
standalone server for the embedding model on its own port, ~5% of one GPU's memory).

Started, health-checked and stopped by this program: it stops only the process group it
started, by id, on exit, on error and on interruption.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import httpx

from sarl.runtime.network import free_port
from sarl.runtime.signals import stop_process_group

log = logging.getLogger(__name__)


# Environment for vLLM's CPU build (tests, benchmark, laptops): offline, small KV cache.
VLLM_CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default reserves far more
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# vLLM's CPU build downcasts to float16 by default, which CPUs run slowly (SARL's GPU set-up keeps the default).
VLLM_CPU_ARGS = ("--dtype", "float32", "--enforce-eager")  # float16 is ~10x slower on CPUs; eager starts ~2x faster


class VLLMServer:
    """`python -m vllm.entrypoints.openai.api_server --model MODEL` (plus `--runner RUNNER` when given)."""

    label = "vLLM server"
    runner: str | None = None

    def __init__(
        self,
        model: str,
        served_name: str | None = None,
        python: str = sys.executable,
        host: str = "127.0.0.1",
        port: int | None = None,
        advertise_host: str | None = None,
        gpu_memory_utilization: float | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 600.0,
        log_path: str | Path | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.model = model
        self.served_name = served_name or model
        self.python = python
        self.host = host
        self.advertise_host = advertise_host or host
        self.port = port or free_port(host)
        self.gpu_memory_utilization = gpu_memory_utilization
        self.extra_args = list(extra_args)
        self.env = env or {}
        self.startup_timeout_s = startup_timeout_s
        self.max_model_len = max_model_len
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="sarl-vllm-")) / "server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """Where clients reach the server (its advertised address: the bound one unless bound on all interfaces)."""
        return f"http://{self.advertise_host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            *(["--runner", self.runner] if self.runner else []),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--served-model-name",
            self.served_name,
        ]
        if self.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.max_model_len is not None:
            cmd += ["--max-model-len", str(self.max_model_len)]
        return cmd + self.extra_args

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def start(self) -> VLLMServer:
        """Start the server and wait until /health answers; on failure nothing is left running."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        log.info("starting %s: %s (log %s)", self.label, " ".join(self.command()), self.log_path)
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        try:
            return self._wait_healthy()
        except (
            BaseException
        ):  # not healthy in time, or interrupted (Ctrl-C, sarl.runtime.signals.Terminated) while waiting
            self.stop()
            raise

    def _wait_healthy(self) -> VLLMServer:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise RuntimeError(
                    f"{self.label} exited with code {code} before becoming healthy; log tail:\n{self.log_tail()}"
                )
            if self.healthy():
                log.info("%s healthy at %s", self.label, self.url)
                return self
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.label} at {self.url} not healthy after {self.startup_timeout_s:.0f} s; "
                    f"log tail:\n{self.log_tail()}"
                )
            time.sleep(1.0)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout_s, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group (the one this object started), SIGKILL after `grace_s`."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process_group(proc, grace_s=grace_s)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class EmbeddingServer(VLLMServer):
    """`python -m vllm.entrypoints.openai.api_server --runner pooling` for one embedding model."""

    label = "embedding server"
    runner = "pooling"
