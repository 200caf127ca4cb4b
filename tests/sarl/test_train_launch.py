"""What sarl.train hands to verl before a GPU run: the W&B settings in Ray's runtime_env, a reward server
every node can reach, and the cheap preflight checks before anything is launched."""

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from testkit import run_module, train_dry_run

pytest.importorskip("verl")
from sarl.backends.verl.config import build_verl_config  # noqa: E402
from sarl.launch.compose import compose_train_config
from sarl.runtime.network import is_loopback, routable_ip  # noqa: E402
from sarl.runtime.runs import wandb_env
from sarl.serving.auto import planned_embedding_server

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "fixtures" / "models"


# -- W&B in every process of the run ------------------------------------------------------------


def test_wandb_settings_travel_in_rays_runtime_env(tmp_path):
    """verl's trainer actor and workers run with the Ray daemons' environment (on several nodes those were
    started by `ray start` before sarl.train ran), so the W&B settings go into the runtime_env verl's
    run_ppo passes to ray.init."""
    run_dir = f"run_dir={tmp_path / 'run'}"
    proc = train_dry_run("+exp=grpo_sarl_math", "logger.entity=my-team", run_dir, env={"WANDB_MODE": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    env_vars = yaml.safe_load(proc.stdout)["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert env_vars["WANDB_RUN_ID"] == "grpo_sarl_math-run" and env_vars["WANDB_RESUME"] == "allow"
    assert env_vars["WANDB_ENTITY"] == "my-team"  # verl's tracker reads the entity from the environment
    assert env_vars["WANDB_DIR"] == str(tmp_path / "run")
    assert "WANDB_API_KEY" not in env_vars  # never written into a config file


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


@pytest.fixture
def listening_url():
    """A loopback socket that listens (the kernel completes the handshake; nothing is served)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_wandb_env_modes(tmp_path, listening_url):
    cfg, _ = compose_train_config(["+exp=grpo_sarl_math"])
    home = {"HOME": str(tmp_path)}
    assert wandb_env(cfg, "x", tmp_path / "r", home)["WANDB_MODE"] == "offline"  # no key anywhere
    online = {**home, "WANDB_API_KEY": "k", "WANDB_BASE_URL": listening_url}
    assert "WANDB_MODE" not in wandb_env(cfg, "x", tmp_path / "r", online)
    assert wandb_env(cfg, "x", tmp_path / "r", {**home, "WANDB_MODE": "disabled"})["WANDB_MODE"] == "disabled"
    assert wandb_env(cfg, "x", tmp_path / "r", {"WANDB_RUN_ID": "keep"})["WANDB_RUN_ID"] == "keep"  # a requeue
    cfg_none, _ = compose_train_config(["+exp=grpo_sarl_math", "logger=none"])
    assert wandb_env(cfg_none, "x", tmp_path / "r", home) == {}


def test_a_key_and_an_unreachable_wandb_host_go_offline_in_one_line(tmp_path, caplog):
    """A key on a shared home (`wandb login` wrote ~/.netrc) and a compute node without internet: offline at once,
    said once however often the run asks (sarl.train asks twice), instead of wandb.init's 90 s wait and raise."""
    cfg, _ = compose_train_config(["+exp=grpo_sarl_math"])
    url = f"http://127.0.0.1:{closed_port()}"
    host = url.removeprefix("http://")
    (tmp_path / ".netrc").write_text(f"machine {host.split(':')[0]}\n  login user\n  password secret\n")
    env = {"HOME": str(tmp_path), "WANDB_BASE_URL": url}
    caplog.set_level(logging.INFO, logger="sarl.runtime.runs")
    assert wandb_env(cfg, "x", tmp_path / "r", env)["WANDB_MODE"] == "offline"
    assert wandb_env(cfg, "x", tmp_path / "r", env)["WANDB_MODE"] == "offline"
    lines = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert lines == [
        f"W&B ({host}) cannot be reached from this node: WANDB_MODE=offline, the logs stay in the run "
        "directory's wandb/ (`wandb sync` them from a machine that reaches W&B)"
    ]
    assert wandb_env(cfg, "x", tmp_path / "r", {**env, "WANDB_MODE": "online"})["WANDB_MODE"] == "online"  # asked
    dry = wandb_env(cfg, "x", tmp_path / "r", {**env, "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}"}, False)
    assert "WANDB_MODE" not in dry  # a dry run connects to nothing


def test_the_probe_goes_through_the_proxy_the_environment_names(monkeypatch, listening_url):
    """A cluster whose nodes reach the internet only through a proxy: the proxy's address is what must open."""
    from sarl.runtime.network import reachable, route_address

    monkeypatch.setenv("HTTPS_PROXY", listening_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    assert route_address("https://api.wandb.ai") == ("127.0.0.1", int(listening_url.rsplit(":", 1)[1]))
    assert reachable("https://api.wandb.ai", timeout_s=1)
    monkeypatch.setenv("NO_PROXY", "api.wandb.ai")
    assert route_address("https://api.wandb.ai") == ("api.wandb.ai", 443)


def test_the_preflight_says_offline_when_the_host_cannot_be_reached(tmp_path, listening_url):
    from sarl.runtime.node_checks import check_wandb

    cfg, _ = compose_train_config(["+exp=grpo_sarl_math"])
    closed = {"HOME": str(tmp_path), "WANDB_API_KEY": "k", "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}"}
    row = check_wandb(cfg, closed)
    assert row.ok and row.detail.startswith("mode offline: 127.0.0.1:") and "cannot be reached" in row.detail
    row = check_wandb(cfg, {**closed, "WANDB_MODE": "online"})
    assert not row.ok and "cannot be reached" in row.detail and "WANDB_MODE=offline" in row.fix
    row = check_wandb(cfg, {**closed, "WANDB_BASE_URL": listening_url})
    assert row.ok and row.detail.startswith("mode online, key found")


ACTOR_ENV_SCRIPT = r"""
import os, sys, yaml, ray
from omegaconf import OmegaConf, read_write
from verl.trainer.main_ppo import run_ppo
from sarl.backends.verl.config import build_verl_config
from sarl.launch.compose import compose_train_config
from sarl.runtime.runs import experiment_name, wandb_env

model, run_dir, out = sys.argv[1:4]
cfg, choices = compose_train_config(["+exp=grpo_sarl_math", f"model.path={model}"])
env_vars = wandb_env(cfg, experiment_name(choices), __import__("pathlib").Path(run_dir), dict(os.environ))
verl_cfg = build_verl_config(cfg, OmegaConf.to_container(cfg.reward, resolve=True), run_dir, "e", env_vars=env_vars)
with read_write(verl_cfg.ray_kwargs.ray_init):
    verl_cfg.ray_kwargs.ray_init.num_cpus = 1
KEYS = ("WANDB_MODE", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR")
assert not any(k in os.environ for k in KEYS)

@ray.remote(num_cpus=0)
class EnvRunner:
    def run(self, config):
        with open(out, "w") as f:
            yaml.safe_dump({"seen": {k: os.environ.get(k) for k in KEYS}, "sent": env_vars}, f)

try:
    run_ppo(verl_cfg, task_runner_class=EnvRunner)
finally:
    ray.shutdown()
"""


@pytest.mark.slow
def test_the_trainer_actor_sees_the_wandb_settings(tmp_path):
    """verl's own run_ppo (ray.init with the config's runtime_env) and a task runner standing in for verl's:
    the actor's environment carries the settings although the launching process's environment does not. In a
    process of its own: a Ray of its own (RAY_ADDRESS=local), in a short temp path (Ray's socket paths are
    limited), with a HOME of its own (no Ray auth token another Ray left there)."""
    import shutil
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "RAY_"))}
    env.update(HOME=str(tmp_path), RAY_ADDRESS="local", RAY_TMPDIR=ray_tmp, RAY_gcs_server_port_wait_time_s="120")
    env.update(WANDB_API_KEY="k", WANDB_BASE_URL=f"http://127.0.0.1:{closed_port()}")  # a key, an unreachable host
    script = tmp_path / "actor_env.py"
    script.write_text(ACTOR_ENV_SCRIPT)
    out = tmp_path / "env.yaml"
    try:
        proc = subprocess.run(
            [sys.executable, str(script), str(MODELS / "qwen3_4b"), str(tmp_path / "run"), str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = yaml.safe_load(out.read_text())
    seen, sent = result["seen"], result["sent"]
    assert seen == {k: sent[k] for k in seen} and seen["WANDB_RUN_ID"] == "grpo_sarl_math-run"
    assert seen["WANDB_MODE"] == "offline"  # a key, and W&B cannot be reached


# -- several nodes: a reward server every node reaches ------------------------------------------


def test_one_node_keeps_the_server_on_loopback():
    cfg, _ = compose_train_config(["+exp=grpo_sarl_math"])
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    server = planned_embedding_server(cfg, reward_cfg)
    assert server.host == "127.0.0.1" and reward_cfg["embedder"]["url"] == server.url.rstrip("/")


def test_several_nodes_put_a_routable_url_into_verls_config(tmp_path):
    try:
        ip = routable_ip()
    except OSError as err:
        pytest.skip(f"this machine has no non-loopback route: {err}")
    proc = train_dry_run("+exp=grpo_sarl_math", "train.nnodes=2", env={"RAY_ADDRESS": f"{ip}:6379"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    url = yaml.safe_load(proc.stdout)["reward"]["custom_reward_function"]["reward_kwargs"]["reward"]["embedder"]["url"]
    host = url.split("//")[1].rsplit(":", 1)[0]
    assert host == ip and not is_loopback(host)
    cfg, _ = compose_train_config(["+exp=grpo_sarl_math", "train.nnodes=2"])
    os.environ["RAY_ADDRESS"] = f"{ip}:6379"
    try:
        server = planned_embedding_server(cfg, OmegaConf.to_container(cfg.reward, resolve=True))
    finally:
        del os.environ["RAY_ADDRESS"]
    assert server.host == "0.0.0.0" and server.advertise_host == ip  # listens on every interface


def test_several_nodes_refuse_a_loopback_embedding_url():
    proc = train_dry_run("+exp=grpo_sarl_math", "train.nnodes=2", "embedding.url=http://127.0.0.1:8000")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert "loopback" in lines[-1] and "train.nnodes=2" in lines[-1] and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "host,loop",
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("10.0.0.5", False),
        ("0.0.0.0", False),
    ],
)
def test_loopback_addresses(host, loop):
    assert is_loopback(host) is loop


# -- cheap checks before launch ----------------------------------------------------------------


def test_a_real_run_stops_before_launch_on_missing_data(tmp_path, caplog):
    from sarl.train import main

    try:
        import sarl.backends.verl.main  # noqa: F401
    except ImportError:
        pytest.skip("verl's V1 trainer stack is not importable here")
    assert main(["+exp=grpo_sarl_math", f"paths.root={tmp_path}", f"model.path={MODELS / 'qwen3_4b'}"]) == 2
    assert "data.train_files" in caplog.text and "python -m sarl.data.prepare dataset=aime_1983_2024" in caplog.text
    assert not (tmp_path / "runs").exists()


def test_a_real_run_stops_before_launch_on_an_overfull_gpu(tmp_path, caplog):
    """With the model's config at hand, the memory plan runs before anything is launched."""
    import pandas as pd

    from sarl.train import main

    data = tmp_path / "data"
    for name in ("aime_1983_2024/train.parquet", "aime25/test.parquet"):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"prompt": ["q"] * (933 if "train" in name else 30)}).to_parquet(data / name)
    rc = main(
        [
            "+exp=ppo_sarl_math",
            f"paths.root={tmp_path}",
            f"model.path={MODELS / 'qwen3_4b'}",
            f"embedding.model={MODELS / 'qwen3_embedding_0.6b'}",
            "backend.rollout_gpu_memory_utilization=0.85",
        ]
    )
    assert rc == 2
    assert "memory plan" in caplog.text and "backend.rollout_gpu_memory_utilization=0.65 (now 0.85)" in caplog.text
    assert not (tmp_path / "runs").exists()


# -- the preflight ----------------------------------------------------------------------------


def test_preflight_on_a_cpu_machine_reports_the_gpu_checks_failed(tmp_path):
    models = [f"model.path={MODELS / 'qwen3_4b'}", f"embedding.model={MODELS / 'qwen3_embedding_0.6b'}"]
    proc = run_module("sarl.preflight", "+exp=ppo_sarl_math", f"paths.root={tmp_path}", *models, env={"COLUMNS": "200"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) >= 3 and cells[0] in ("✓", "✗") and cells[1]:
            rows[cells[1]] = cells[0]
    assert rows["GPUs"] == "✗" and rows["torch / CUDA / driver"] == "✗" and rows["vllm"] == "✗"
    assert rows["embedding server"] == "✗"  # not started without a GPU
    assert rows["verl"] == "✓" and rows["attention"] == "✓" and rows["verl config"] == "✓"
    assert rows["memory plan"] == "✓" and rows["embedding server budget"] == "✓"
    assert rows["data"] == "✗"  # nothing prepared under tmp_path
    assert "pip install -r requirements/gpu.lock" in proc.stdout and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # the preflight writes nothing


def test_preflight_names_a_misspelt_override():
    proc = run_module("sarl.preflight", "+exp=grpo_sarl_math", "train.rollout_nn=8")
    assert proc.returncode == 2 and "rollout_nn" in proc.stderr and "Traceback" not in proc.stderr


def test_rollout_tensor_parallelism_fits_the_node(tmp_path):
    """verl's rollout spans 2 GPUs per vLLM replica by default; on a one-GPU node that cannot start."""

    def tp(*extra):
        cfg, choices = compose_train_config(["+exp=grpo_sarl_math", *extra])
        v = build_verl_config(cfg, OmegaConf.to_container(cfg.reward, resolve=True), str(tmp_path), "e")
        return v.actor_rollout_ref.rollout.tensor_model_parallel_size

    assert tp() == 2 and tp("train.n_gpus_per_node=1") == 1
    assert tp("backend.rollout_tensor_parallel_size=4") == 4
    with pytest.raises(ValueError, match="must divide train.n_gpus_per_node=8"):
        tp("backend.rollout_tensor_parallel_size=3")


def test_a_paper_row_refuses_the_shipped_sample_traces_on_a_real_back_end():
    """lcs_paper's SFT stage on the package's 6 sample traces would pass every size check on a cluster and train
    12 steps, then RL from that: refused with the command that writes the full set; the samples still serve
    backend=verl_cpu, dry runs and the tiny test policy, and a full set passed by path is taken."""
    from sarl.launch.compose import compose_train_config
    from sarl.launch.pipeline import stages_of
    from sarl.runtime.errors import UserError
    from sarl.train import check_paper_data

    for row, recipe in (("lcs_paper", "structured"), ("grp_math_paper", "grp_math"), ("grp_code_paper", "grp_code")):
        top, _ = compose_train_config([f"+exp={row}"])
        (sft,) = [s for s in stages_of(top) if s["name"] == "sft"]
        base = [f"+exp={row}", *sft["overrides"], "pipeline=null"]
        cfg, choices = compose_train_config(base)
        with pytest.raises(UserError, match=rf"sample traces .* recipe={recipe}\) and pass data.sft_files=PATH"):
            check_paper_data(cfg, choices)
        for allowed in (["backend=verl_cpu"], ["train.dry_run=true"], ["data.sft_files=/data/full.jsonl"]):
            cfg, choices = compose_train_config([*base, *allowed])
            check_paper_data(cfg, choices)
