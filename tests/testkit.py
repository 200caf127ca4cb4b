"""Builders shared by the tests (importable from any test module: tests/ is on the path through tests/conftest.py).

- `tiny_qwen3`: the one tiny model of the tests, a Qwen3 of the smoke policy's shape (sarl.smoke.policy
  TINY_QWEN3) for a given tokenizer, as a config or with seeded random weights, optionally saved with the tokenizer.
- `verl_config_for`: a composed config and the verl config built from it, validated by the pinned verl;
  `stage_overrides`: what makes a row one stage of its pipeline.
- `verl_paper_rows`, `pipeline_rows`, `structured_prompt_rows`: the conf/exp/ rows the tests go through, derived
  from the `paper:` blocks (sarl.runtime.rows) and the composed configs, never listed by hand.
- `smoke_small`, `HELDOUT_SMALL`: the overrides that shrink the smoke run (`+exp=smoke`) for a test;
  `bench_config`: conf/bench.yaml composed.
- `run_python`, `run_module`: `python <script>`, `python -m <module>` in a child process, as a user runs them
  from the checkout; `train_dry_run`: `python -m sarl.train` with `train.dry_run=true`; `without_vllm`: the
  environment of a child process that cannot import vLLM (a CPU-only machine).
- `LoopbackServer`: a threading server on 127.0.0.1 in a daemon thread, what every fake endpoint runs on (an HTTP
  one with a `JSONHandler`, or a raw TCP one with a socketserver handler, as `ClosingServer`, which counts the
  connections it accepts and closes at once: fixture `closing_server`); `closing_all`: the body of a fixture
  that hands out servers and closes them after the test; `fake_vllm_python`: a stand-in for
  `python -m vllm.entrypoints.openai.api_server`, serving on one in its own process; `Stopwatch`: how long a
  request to one took.
"""

from __future__ import annotations

import functools
import json
import os
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
VLLM_VENV = REPO / ".venv-vllm"  # vLLM's CPU build (scripts/setup_vllm_cpu.sh)
VLLM_STAMP = VLLM_VENV / ".sarl-vllm-cpu-stamp"  # written by that script once the environment is complete
T = TypeVar("T")


# -- fake endpoints -------------------------------------------------------------------------------


class LoopbackServer:
    """`handler` served by a threading server on 127.0.0.1 (`port` 0: a free one) in a daemon thread, started
    at once; `close()` stops it without waiting for handlers still at work (daemon threads, no block on close).
    `handler` is an HTTP one (a `JSONHandler`) or, for a raw TCP server, any socketserver handler (the
    connection is closed when its `handle()` returns)."""

    def __init__(self, handler: type, port: int = 0) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # handlers still sleeping must not hold teardown
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until the server is closed (a stand-in process serves until it is stopped)."""
        self._thread.join()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class JSONHandler(BaseHTTPRequestHandler):
    """The request handler of the fake HTTP endpoints: HTTP/1.1 (kept alive, as the clients pool their
    connections), no access log, JSON bodies in and out."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        """`payload` as JSON (bytes as they are) with its length and `headers`; a client that has given up
        (a timeout test) is no error."""
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass


class ClosingServer:
    """A TCP server on 127.0.0.1 that accepts connections and closes them at once (reading nothing), counting
    them in `accepted`."""

    def __init__(self) -> None:
        self.accepted = 0
        lock = threading.Lock()
        server = self

        class Count(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with lock:
                    server.accepted += 1

        self._server = LoopbackServer(Count)
        self.port, self.url = self._server.port, self._server.url

    def close(self) -> None:
        self._server.close()


def closing_all(make: Callable[..., T]) -> Iterator[Callable[..., T]]:
    """The body of a factory fixture (`yield from closing_all(FakeServer)`): the test gets a factory calling
    `make`, and everything made through it is closed after the test."""
    made: list[Any] = []

    def factory(*args: Any, **kwargs: Any) -> T:
        made.append(make(*args, **kwargs))
        return made[-1]

    yield factory
    for thing in made:
        thing.close()


# The stand-in vLLM's script: `serve_fake_vllm` of this module on the arguments vLLM would get.
FAKE_VLLM = """import sys
sys.path.insert(0, {tests!r})
from testkit import serve_fake_vllm
serve_fake_vllm(sys.argv[1:], {settings!r})
"""


def fake_vllm_python(folder: Path, chat: Sequence[tuple[str, str]] = (), argv_file: Path | None = None) -> Path:
    """An executable to pass as a vLLM server's interpreter (`embedding_server.python`, `teacher.server.python`):
    it runs `serve_fake_vllm` (same pid, by exec) on the arguments of `python -m vllm.entrypoints.openai.api_server`.
    `chat`: (text, content) pairs; a chat request is answered with the content of the first pair whose text is in
    its last message ("" is in every one). `argv_file`: where the server's arguments (after the module) go, as
    JSON."""
    settings = json.dumps({"chat": [list(pair) for pair in chat], "argv_file": str(argv_file) if argv_file else None})
    script = folder / "fake_vllm.py"
    script.write_text(FAKE_VLLM.format(tests=str(Path(__file__).parent), settings=settings))
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    python.chmod(0o755)
    return python


def serve_fake_vllm(argv: list[str], settings: str) -> None:
    """The stand-in vLLM (the process of `fake_vllm_python`), serving until it is stopped on 127.0.0.1 at `--port`:
    /health; /v1/models (the `--served-model-name`); /v1/embeddings, 3-d vectors; /v1/chat/completions, the
    answers of `settings`. With FAKE_PID_DIR set it writes its pid to FAKE_PID_DIR/vllm.pid once it serves."""
    import argparse

    wanted = json.loads(settings)
    chat = wanted["chat"]
    args = argv[argv.index("vllm.entrypoints.openai.api_server") + 1 :]
    if wanted["argv_file"]:
        Path(wanted["argv_file"]).write_text(json.dumps(args))
    parser = argparse.ArgumentParser()
    for flag in ("--host", "--port", "--served-model-name"):
        parser.add_argument(flag)
    opts, _ = parser.parse_known_args(args)
    if opts.host != "127.0.0.1":
        raise SystemExit(f"the stand-in vLLM serves on loopback only, not on --host {opts.host}")

    class Handler(JSONHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self.send_json(200, b"")
            elif self.path == "/v1/models":
                self.send_json(200, {"data": [{"id": opts.served_model_name}]})
            else:
                self.send_json(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            body = self.read_json()
            if self.path == "/v1/embeddings":
                data = [{"index": i, "embedding": [1.0 + len(t), 2.0, 3.0]} for i, t in enumerate(body["input"])]
                self.send_json(200, {"data": data})
                return
            text = body["messages"][-1]["content"] if self.path == "/v1/chat/completions" else None
            content = next((content for needle, content in chat if text is not None and needle in text), None)
            if content is None:
                self.send_json(404, {"error": f"no route {self.path} or no answer for the last message {text!r}"})
                return
            message = {"role": "assistant", "content": content}
            self.send_json(200, {"choices": [{"message": message, "finish_reason": "stop"}]})

    server = LoopbackServer(Handler, int(opts.port))
    if os.environ.get("FAKE_PID_DIR"):
        Path(os.environ["FAKE_PID_DIR"], "vllm.pid").write_text(str(os.getpid()))
    print("fake vllm on", server.port, flush=True)
    server.wait()


def run_root(tmp_path_factory) -> Path:
    """The test run's temporary directory, the same for every pytest-xdist worker (above each worker's own)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def shared_dir(tmp_path_factory, name: str) -> Path:
    """A directory `name` of the whole test run, the same for every pytest-xdist worker (created if missing)."""
    path = run_root(tmp_path_factory) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """A directory `name` that `build(path)` fills once for the whole test run: shared by every pytest-xdist worker
    (`make test` runs one per core), built by the first that asks while the others wait on a file lock, instead of
    once per worker. A build that failed half-way is removed and redone by the next that asks."""
    import shutil

    from filelock import FileLock

    root = run_root(tmp_path_factory)
    path, done = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            build(path)
            done.touch()
    return path


class Stopwatch:
    """`with Stopwatch() as took: ...`, then `took.s`: the seconds the block ran (exception or not)."""

    def __enter__(self) -> Stopwatch:
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.monotonic() - self._t0


# -- child processes ------------------------------------------------------------------------------

# how a user runs the commands: offline (the models the tests use ship inside PyPI packages), mistakes reported
# in a line or two (no Hydra trace, no debug traceback)
USER_ENV = {"HF_HUB_OFFLINE": "1", "HYDRA_FULL_ERROR": "0", "SARL_DEBUG": "0"}


def run_python(
    *args: object, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """`python <args>` (this interpreter) in a child process from the checkout's root, with this process's
    environment, USER_ENV and then `env` on top; its stdout and stderr captured as text."""
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **USER_ENV, **(env or {})},
    )


def run_module(module: str, *args: object, **how: Any) -> subprocess.CompletedProcess[str]:
    """`python -m <module> <args>` as `run_python` runs it."""
    return run_python("-m", module, *args, **how)


def without_vllm(where: Path) -> dict[str, str]:
    """The environment of a child process in which vLLM is not installed, whether or not this one has it: a
    `sitecustomize.py` written into `where` (put first on PYTHONPATH) sets `sys.modules["vllm"] = None`, Python's
    own way to block a module, so that `import vllm` fails and `importlib.util.find_spec("vllm")` is None."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text('import sys\n\nsys.modules["vllm"] = None  # as if not installed\n')
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(where), os.environ.get("PYTHONPATH")) if p)}


def train_dry_run(*overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m sarl.train <overrides> train.dry_run=true` (run_module): the configs it would launch, as YAML
    on stdout; nothing is started or written."""
    return run_module("sarl.train", *overrides, "train.dry_run=true", env=env)


# -- configs, runs and models --------------------------------------------------------------------


def bench_config(overrides: Sequence[str] = ()):
    """conf/bench.yaml composed with `overrides`, as `python -m sarl.bench` composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="bench", overrides=list(overrides))


def smoke_small(response_length: int = 96) -> list[str]:
    """Overrides that shrink `+exp=smoke` for a test: 2 prompts x 4 rollouts a step, answers cut at
    `response_length` tokens. The number of steps and the held-out evaluation (`heldout=null`, or
    HELDOUT_SMALL) are each test's own."""
    return [
        "train.rollout_n=4",
        "train.train_batch_size=2",
        "train.ppo_mini_batch_size=2",
        "train.micro_batch_size_per_gpu=8",
        f"data.max_response_length={response_length}",
    ]


# the smoke run's held-out before/after evaluation at its smallest: 2 prompts x 2 samples
HELDOUT_SMALL = ["heldout.n_prompts=2", "heldout.samples_per_prompt=2", "heldout.bootstrap=100"]


def tiny_qwen3(tokenizer, path: str | Path | None = None, *, weights: bool = False, seed: int = 0, **architecture: Any):
    """A tiny Qwen3 for `tokenizer`: its `Qwen3Config` (TINY_QWEN3 with `architecture`'s keys replacing its
    entries), or with `weights` a `Qwen3ForCausalLM` with random weights drawn after `torch.manual_seed(seed)`.
    With `path`, it is saved there (config, or config and weights) with the tokenizer, so that it loads from the
    path as a checkpoint does."""
    from sarl.smoke.policy import qwen3_config

    config = qwen3_config(tokenizer, **architecture)
    built = config
    if weights:
        import torch
        from transformers import Qwen3ForCausalLM

        torch.manual_seed(seed)
        built = Qwen3ForCausalLM(config)
    if path is not None:
        built.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return built


def verl_config_for(overrides: Sequence[str], tmp_path, model_dir: str | Path | None = None, *, validate: bool = True):
    """(cfg, verl config) of `overrides` (e.g. ["+exp=grpo_sarl_math"]) with the policy at `model_dir` (a local
    tiny checkpoint, or a directory with a model's config.json: verl's validation loads the model config and there
    is no hub here; None: the row's own model), the row checked as sarl.train checks it (`check_supported`) and,
    with `validate`, the verl config validated by verl."""
    from omegaconf import OmegaConf

    from sarl.backends.verl.config import build_verl_config, validate_verl_config
    from sarl.launch.compose import compose_train_config
    from sarl.runtime.runs import experiment_name
    from sarl.train import check_supported

    cfg, choices = compose_train_config([*overrides, *([f"model.path={model_dir}"] if model_dir else [])])
    check_supported(cfg, choices)
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    vcfg = build_verl_config(cfg, reward_cfg, str(tmp_path), experiment_name(choices))
    if validate:
        validate_verl_config(vcfg)
    return cfg, vcfg


def stage_overrides(exp: str, stage: str) -> list[str]:
    """The overrides that make `+exp=<exp>` the stage named `stage` of its pipeline, as sarl.launch.pipeline
    composes it (the stage's own, then `pipeline=null`); none for a run that is no pipeline."""
    from sarl.launch.compose import compose_train_config
    from sarl.launch.pipeline import stages_of

    top, _ = compose_train_config([f"+exp={exp}"])
    if not top.get("pipeline"):
        return []
    return [*next(s for s in stages_of(top) if s["name"] == stage)["overrides"], "pipeline=null"]


# -- the rows -------------------------------------------------------------------------------------


@functools.cache
def _composed(exp: str):
    from sarl.launch.compose import compose_train_config

    return compose_train_config([f"+exp={exp}"])[0]


@functools.cache
def verl_paper_rows() -> tuple[str, ...]:
    """The conf/exp/ runs that are a row of a paper table and whose composed config runs on verl."""
    from sarl.runtime.rows import paper_experiments

    return tuple(e for e in paper_experiments() if _composed(e).backend.name == "verl")


@functools.cache
def pipeline_rows() -> tuple[str, ...]:
    """The conf/exp/ runs on verl that are a pipeline of stages (sarl.launch.pipeline): the paper-faithful rows of
    Structured Reasoning and GRP, an SFT stage of the paper's Hub model, then RL from its checkpoint."""
    from sarl.runtime.rows import experiments

    return tuple(e for e in experiments() if _composed(e).backend.name == "verl" and _composed(e).get("pipeline"))


@functools.cache
def structured_prompt_rows() -> tuple[str, ...]:
    """The conf/exp/ runs of one stage that train on tagged prompts (data.prompt_style structured): Structured
    Reasoning's rewards on SARL's setting, next to its paper-faithful pipelines (`pipeline_rows`)."""
    from sarl.runtime.rows import experiments

    return tuple(
        e
        for e in experiments()
        if _composed(e).data.get("prompt_style") == "structured" and not _composed(e).get("pipeline")
    )


def vllm_python_or_skip() -> str:
    """.venv-vllm's interpreter, or a skip (a failure under SARL_REQUIRE_VLLM=1, as in CI) when the environment is
    missing or incomplete."""
    import pytest

    python = VLLM_VENV / "bin" / "python"
    if not python.exists() or not VLLM_STAMP.exists():
        msg = f"{VLLM_VENV} is {'incomplete' if python.exists() else 'missing'}: run scripts/setup_vllm_cpu.sh"
        if os.environ.get("SARL_REQUIRE_VLLM") == "1":
            pytest.fail(f"SARL_REQUIRE_VLLM=1 but {msg}")
        pytest.skip(msg)
    return str(python)


# -- the chain a researcher runs: train -> eval.run on the run directory -> the table ---------------------------------

CHAIN_EVAL = ("protocol=smoke", "limit=2", "generator=transformers")  # 2 held-out prompts x 4 samples each


def evaluate_run(ckpt: Path, root: Path, *extra: str, logger: str = "none") -> tuple[dict, str]:
    """`python -m eval.run ckpt=<ckpt> protocol=smoke` as a user types it after training (the first 2 held-out
    prompts; results under `root/runs/eval/`), asserted to exit 0; (the results, what it logged)."""
    proc = run_module(
        "eval.run",
        f"ckpt={ckpt}",
        *CHAIN_EVAL,
        f"logger={logger}",
        f"paths.root={root}",
        f"cache_dir={root}/cache",
        *extra,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    evals = root / "runs" / "eval"
    found = [p for p in evals.rglob("results.json") if "select" not in p.relative_to(evals).parts]
    path = max(found, key=lambda p: p.stat().st_mtime_ns)  # the evaluation just written (select/: its held-out runs)
    return json.loads(path.read_text()), proc.stderr


def tabulated(root: Path, row: str) -> tuple[float, str]:
    """The row's held-out cell as the table code builds it (notebooks/_paper.py, the SARL Table 2 code over the
    smoke protocol's column) from the results under `root/runs/eval/`: (its value, its printed text)."""
    sys.path.insert(0, str(REPO / "notebooks"))
    import _paper

    results = _paper.load_results(root / "runs" / "eval", [row], "smoke")
    table = _paper.accuracy_table("chain", "chain", (("", row, row),), results, _paper.SMOKE_BENCHMARKS)
    return table.attrs["values"][row]["smoke_heldout"], str(table.iloc[0, 1])


def assert_chain(train_run: Path, row: str, model: Path, root: Path) -> dict:
    """The handoffs after `sarl.train +exp=ROW`: `eval.run ckpt=<its run directory>` evaluates the run's final model
    `model` (and says so), names the results after the row, and the table's cell is the result's number."""
    results, logged = evaluate_run(train_run, root)
    assert results["run"]["ckpt"] == str(model), results["run"]
    assert f"{train_run} is a run directory: evaluating its final model {model}" in logged, logged[-3000:]
    assert (results["run"]["trained_by"] or {}).get("row") == row, results["run"]
    value = results["math"]["benchmarks"]["smoke_heldout"]["avg_at_k"]
    cell, printed = tabulated(root, row)
    assert cell == value and printed == f"{value:.2f}", (cell, printed, value)
    return results
