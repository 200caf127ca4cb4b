"""The plain-sbatch scripts (slurm/sbatch/): valid bash, the resources of conf/launcher/slurm_h100.yaml, the per-node
code they run (`python -m slurm.node`), and (slow, as root) the single-node script submitted to a local single-node
SLURM cluster running the smoke job to completion, then preempted by its time-limit signal and resumed."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from testkit import smoke_small

from sarl.backends.trl.metrics import read_metrics
from slurm.node import allocation_argv, main, node_settings, parse_args

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "slurm" / "sbatch"
SCRIPTS = ["verl_single_node.sbatch", "verl_multi_node.sbatch"]
AGENTS = "wandb_agents.sbatch"  # W&B sweep agents as an array job (sweeps without a server: sarl.launch.sweep)
SMOKE = ["+exp=smoke", *smoke_small(), "logger=none", "heldout=null"]
# the local cluster's shape instead of the scripts' H100 nodes (command-line options win over #SBATCH lines)
LOCAL_CLUSTER = ["--partition=debug", "--gpus-per-node=0", "--cpus-per-task=2", "--mem=0", "--time=30"]


def directives(name):
    return dict(
        line[len("#SBATCH --") :].split("=", 1)
        for line in (SBATCH / name).read_text().splitlines()
        if line.startswith("#SBATCH --") and "=" in line
    )


@pytest.mark.parametrize("name", [*SCRIPTS, AGENTS])
def test_every_sbatch_script_is_valid_bash(name):
    proc = subprocess.run(["bash", "-n", str(SBATCH / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in SBATCH.glob("*.sbatch")) == sorted([*SCRIPTS, AGENTS])


def test_the_agents_script_asks_for_one_run_s_resources_and_is_not_requeued():
    launcher = OmegaConf.load(ROOT / "conf" / "launcher" / "slurm_h100.yaml")
    d = directives(AGENTS)
    assert "partition" not in d and "time" not in d  # the cluster's default partition and its limit, as the launcher
    assert int(d["cpus-per-task"]) == launcher.cpus_per_task and d["mem"] == "0" and launcher.mem_gb is None
    assert "#SBATCH --requeue" not in (SBATCH / AGENTS).read_text()


def test_the_agents_script_outside_slurm_or_without_a_sweep_id_says_what_to_do(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(SBATCH / AGENTS)], cwd=tmp_path, env=env, capture_output=True, text=True)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "sbatch --array=0-N" in line and "python -m sarl.train -m sweep.name=" in line
    env["SLURM_JOB_ID"] = "1"
    proc = subprocess.run(["bash", str(SBATCH / AGENTS)], cwd=tmp_path, env=env, capture_output=True, text=True)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and line.startswith("wandb_agents.sbatch: no sweep id")


@pytest.mark.parametrize("name", SCRIPTS)
def test_sbatch_resources_are_the_submitit_launchers(name):
    """The scripts ask for what `launcher=slurm_h100` asks for, one task per node, and requeue as it does."""
    launcher = OmegaConf.load(ROOT / "conf" / "launcher" / "slurm_h100.yaml")
    d = directives(name)
    assert "partition" not in d and launcher.partition is None  # the cluster's default partition
    assert "time" not in d and launcher.time_min is None  # that partition's limit
    assert int(d["cpus-per-task"]) == launcher.cpus_per_task and d["mem"] == "0" and launcher.mem_gb is None
    assert "#SBATCH --gres=gpu:8" in (SBATCH / name).read_text()  # the GRES route, said where it is taken
    assert d["signal"] == f"B:USR2@{launcher.signal_delay_s}" and d["ntasks-per-node"] == "1"
    assert int(d["gpus-per-node"]) == 8 and d["open-mode"] == "append"
    assert "#SBATCH --requeue" in (SBATCH / name).read_text()
    assert int(d["nodes"]) == (1 if "single" in name else 2)
    assert f"SARL_MAX_REQUEUES:-{launcher.max_num_timeout}" in (SBATCH / name).read_text()


def test_the_driver_runs_the_same_overrides_with_the_allocations_nodes_and_gpus():
    env = {"SLURM_JOB_NUM_NODES": "4", "SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_PER_TASK": "64"}
    argv = ["+exp=grpo_sarl_math", "launcher=slurm_h100", "launcher.nodes=2", "seed=1"]
    assert allocation_argv("sarl.train", argv, env) == [
        "+exp=grpo_sarl_math",
        "seed=1",
        "launcher=local",
        "train.nnodes=4",
        "train.n_gpus_per_node=8",
    ]
    assert allocation_argv("sarl.train", ["+exp=smoke"], {"SLURM_JOB_NUM_NODES": "1"}) == [
        "+exp=smoke",
        "launcher=local",
        "train.nnodes=1",  # no GPUs in the job: the trainer's own GPU count stays
    ]
    assert allocation_argv("eval.run", ["ckpt=/c"], env) == ["ckpt=/c", "launcher=local"]
    s = node_settings(parse_args(["--ray-port", "6380", "--ray-interface", "ib0", "sarl.train", "x=1"]), env)
    assert (s.nodes, s.gpus_per_node, s.cpus_per_task, s.ray_port, s.ray_interface) == (4, 8, 64, 6380, "ib0")
    assert s.signal_delay_s == 0  # the batch script or SLURM requeues, not submitit: no waiting for its signal


def test_outside_a_slurm_job_the_node_entry_point_says_so(caplog):
    assert main(["sarl.train", "+exp=smoke"], env={}) == 2
    assert "SLURM_JOB_ID is not set" in caplog.text


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_run_outside_slurm_says_to_submit_it(name, tmp_path):
    """`bash slurm/sbatch/NAME` instead of `sbatch ...`: one line saying how to submit it, exit 2, nothing run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        ["bash", str(SBATCH / name), "+exp=smoke"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"{name}: not inside a SLURM job (SLURM_JOB_ID is unset): submit it with `sbatch ")
    assert "launcher=slurm_h100" in line and not any(tmp_path.iterdir())


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    """The job's interpreter replaced by a script that records its arguments and ends at once."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls"\n')
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    return tmp_path / "calls"


def test_one_node_runs_the_driver_and_a_worker_node_joins_the_published_head(fake_python, tmp_path, monkeypatch):
    import slurm.launcher as launcher
    import slurm.node as node

    env = {"SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_PER_TASK": "2"}
    monkeypatch.setattr(node, "job_hosts", lambda env: ["vm"])
    assert node.main(["--folder", str(tmp_path / "unused"), "sarl.train", "+exp=smoke"], env=env) == 0
    assert fake_python.read_text().splitlines() == ["-m sarl.train +exp=smoke launcher=local train.nnodes=1"]
    assert not (tmp_path / "unused").exists()  # one node: nothing to meet through
    fake_python.unlink()

    folder = tmp_path / "job"
    folder.mkdir()
    launcher.publish_head_ip(folder / "ray_head_ip.0", "10.1.0.1")  # what node 0 of this job wrote
    monkeypatch.setattr(node, "job_hosts", lambda env: ["gpu01", "gpu02"])
    monkeypatch.setattr(launcher, "node_ip_address", lambda head, port, interface: "10.1.0.2")
    env = {**env, "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8"}
    assert node.main(["--folder", str(folder), "--ray-port", "6380", "sarl.train", "+exp=x"], env=env) == 0
    assert fake_python.read_text().splitlines() == [
        "-m ray.scripts.scripts start --address=10.1.0.1:6380 --node-ip-address=10.1.0.2 --num-gpus=8 "
        "--num-cpus=2 --block --disable-usage-stats"
    ]


# -- the local SLURM cluster ------------------------------------------------------------------


def sbatch(script, args, out, env):
    proc = subprocess.run(
        ["sbatch", "--parsable", *LOCAL_CLUSTER, f"--output={out}", str(SBATCH / script), *args],
        cwd=ROOT,  # the scripts run in the submitting directory: the repository root
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


@pytest.fixture
def job_env(slurm_cluster):
    """The submitting environment: this interpreter, and this checkout first on the path (sbatch passes the
    environment on to the job)."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, **slurm_cluster.env, "SARL_PYTHON": sys.executable, "PYTHONPATH": path}


@pytest.mark.slow
def test_the_single_node_script_runs_the_smoke_job_on_slurm(slurm_cluster, launch_policy_cache, job_env, tmp_path):
    args = [*SMOKE, "backend.max_steps=2", f"paths.root={tmp_path}", f"model.build.cache_dir={launch_policy_cache}"]
    out = tmp_path / "job.out"
    job_id = sbatch("verl_single_node.sbatch", args, out, job_env)
    terminal = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    slurm_cluster.wait_until(job_id, lambda: slurm_cluster.job_state(job_id) in terminal, 600, "the job did not end")
    log = out.read_text(errors="replace")
    assert slurm_cluster.job_state(job_id) == "COMPLETED", log[-4000:]
    assert "sarl.train exited with 0" in log and "launcher=local train.nnodes=1" in log
    assert "slurm.launcher: this task may use 2 CPUs (the job asked 2 per task)" in log  # the batch step's
    (run,) = (tmp_path / "runs" / "smoke").iterdir()
    assert run.name.endswith(f"_j{job_id}")  # the run directory the submitit job would name
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    assert (run / "final" / "config.json").exists()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["slurm_job_id"] == job_id and meta["choices"]["launcher"] == "local"


@pytest.mark.slow
def test_the_single_node_script_requeues_on_the_time_limit_signal_and_resumes(
    slurm_cluster, launch_policy_cache, job_env, tmp_path
):
    """USR2 to the batch shell, as SLURM sends it 120 s before the time limit (--signal=B:USR2@120): the script
    requeues the job, the run stops, and the requeued job (same id) resumes in the same run directory."""
    args = [*SMOKE, "backend.max_steps=6", "train.save_freq=1", f"paths.root={tmp_path}"]
    args += [f"model.build.cache_dir={launch_policy_cache}", "train.rollout_n=8", "train.micro_batch_size_per_gpu=16"]
    out = tmp_path / "job.out"
    job_id = sbatch("verl_single_node.sbatch", args, out, job_env)
    base = tmp_path / "runs" / "smoke"

    def checkpoint_2():
        return sorted(base.glob(f"*_j{job_id}/checkpoints/checkpoint-2/trainer_state.json"))

    slurm_cluster.wait_until(job_id, checkpoint_2, 300, "no checkpoint-2 before the signal")
    run = checkpoint_2()[0].parents[2]
    assert not (run / "final").exists(), "the run finished before the signal"
    slurm_cluster.command("scancel", "--batch", "--signal=USR2", job_id)
    slurm_cluster.start_requeued_now(job_id)  # the script requeued it; skip SLURM's hold before a restart
    slurm_cluster.wait_until(job_id, lambda: (run / "summary.json").exists(), 600, "the requeued run did not finish")
    slurm_cluster.wait_until(job_id, lambda: slurm_cluster.job_state(job_id) == "COMPLETED", 120, "the job did not end")
    log = out.read_text(errors="replace")
    assert "the time limit is near; requeuing job" in log and log.count("(start 1)") == 1, log[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] is not None and summary["steps"] == 6
    assert int(Path(summary["resumed_from"]).name.split("-")[1]) >= 2
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert list(base.iterdir()) == [run]  # the requeued job found its own run directory (same job id)
    assert re.search(r"sarl\.train exited with 0\s*$", log)


@pytest.mark.slow
def test_an_array_of_wandb_agents_runs_one_agent_per_task(slurm_cluster, job_env, tmp_path):
    """The W&B route up to the agent: `sbatch --array=0-2 wandb_agents.sbatch ID` on the local cluster starts three
    array tasks, each running `wandb agent --count 1 ID` (a stand-in for wandb records its arguments; a real agent
    needs a W&B server)."""
    calls = tmp_path / "calls"
    wandb = tmp_path / "wandb"
    wandb.write_text(f'#!/bin/sh\necho "$SLURM_ARRAY_TASK_ID $*" >> "{calls}"\n')
    wandb.chmod(0o755)
    env = {**job_env, "SARL_WANDB": str(wandb)}
    proc = subprocess.run(
        ["sbatch", "--parsable", "--array=0-2", *LOCAL_CLUSTER, f"--output={tmp_path}/agent-%a.out",
         str(SBATCH / AGENTS), "me/sarl/abc123"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]

    def three():
        return calls.exists() and len(calls.read_text().splitlines()) == 3

    slurm_cluster.wait_until(job_id, three, 120, "the three agents did not run")
    assert sorted(calls.read_text().splitlines()) == [f"{i} agent --count 1 me/sarl/abc123" for i in range(3)]
