"""launcher=slurm_h100: settings and environment overrides, the sbatch script, the job's command, the
multi-node Ray plan, and (slow, as root) real jobs on a local single-node SLURM cluster: the smoke run
submitted through submitit, and a preempted job that is requeued and resumes."""

import json
import os
import pickle
import sys
import time
from pathlib import Path

import pytest
import submitit
from submitit.slurm.slurm import _make_sbatch_string

from sarl.backends.trl.metrics import read_metrics
from sarl.launch.slurm import (
    ModuleJob,
    SlurmSettings,
    executor_parameters,
    job_argv,
    settings,
    task_plan,
    train_argv,
)
from sarl.train import compose_train_config, main

SMALL = [
    "train.rollout_n=4",
    "train.train_batch_size=2",
    "train.ppo_mini_batch_size=2",
    "train.micro_batch_size_per_gpu=8",
    "data.max_response_length=96",
    "logger=none",
]
LOCAL_CLUSTER = [
    "launcher=slurm_h100",
    "launcher.partition=debug",
    "launcher.gpus_per_node=0",
    "launcher.mem_gb=null",
    "launcher.cpus_per_task=2",
    "launcher.time_min=30",
]


def test_launcher_config_composes_with_train_and_follows_the_trainer():
    cfg, choices = compose_train_config(["+exp=grpo_sarl_math", "launcher=slurm_h100", "train.nnodes=2"])
    assert choices["launcher"] == "slurm_h100"
    s = settings(cfg.launcher, env={})
    assert (s.name, s.partition, s.nodes, s.gpus_per_node, s.wait) == ("slurm_h100", "h100", 2, 8, False)
    assert s.log_dir == str(Path(cfg.paths.runs_dir) / "slurm")


def test_environment_overrides_win_and_are_typed():
    base = {"partition": "h100", "time_min": 60, "nodes": 1, "gpus_per_node": 8, "mem_gb": 100}
    env = {
        "SARL_SLURM_PARTITION": "h100-preempt",
        "SARL_SLURM_ACCOUNT": "proj42",
        "SARL_SLURM_QOS": "high",
        "SARL_SLURM_TIME_MIN": "90",
        "SARL_SLURM_NODES": "4",
        "SARL_SLURM_GPUS_PER_NODE": "4",
        "SARL_SLURM_CPUS_PER_TASK": "32",
        "SARL_SLURM_MEM_GB": "256",
    }
    s = settings(base, env=env)
    assert (s.partition, s.account, s.qos) == ("h100-preempt", "proj42", "high")
    assert (s.time_min, s.nodes, s.gpus_per_node, s.cpus_per_task, s.mem_gb) == (90, 4, 4, 32, 256.0)
    assert settings(base, env={"SARL_SLURM_NODES": ""}).nodes == 1  # empty: not set
    with pytest.raises(ValueError, match="SARL_SLURM_NODES='two'"):
        settings(base, env={"SARL_SLURM_NODES": "two"})
    with pytest.raises(ValueError, match="unknown launcher keys \\['partitoin'\\]"):
        settings({"partitoin": "x"}, env={})
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        settings({"nodes": 0}, env={})


def test_sbatch_script_carries_every_resource():
    s = SlurmSettings(
        partition="h100",
        account="proj42",
        qos="high",
        time_min=2880,
        nodes=2,
        gpus_per_node=8,
        cpus_per_task=64,
        mem_gb=480,
        additional={"constraint": "h100"},
        setup=["module load cuda"],
        signal_delay_s=120,
    )
    p = executor_parameters(s)
    assert p["slurm_partition"] == "h100" and p["tasks_per_node"] == 1 and p["nodes"] == 2
    ex = submitit.AutoExecutor(folder="/tmp/unused/%j", cluster="debug")  # renders parameters without sbatch
    assert ex.cluster == "debug"
    sbatch_params = {
        "job_name": p["name"],
        "partition": "h100",
        "account": "proj42",
        "qos": "high",
        "time": 2880,
        "nodes": 2,
        "ntasks_per_node": 1,
        "gpus_per_node": 8,
        "cpus_per_task": 64,
        "mem": "480GB",
        "signal_delay_s": 120,
        "additional_parameters": p["slurm_additional_parameters"],
        "setup": p["slurm_setup"],
    }
    script = _make_sbatch_string(command="python -m submitit.core._submit X", folder="/tmp/x/%j", **sbatch_params)
    for line in (
        "#SBATCH --partition=h100",
        "#SBATCH --account=proj42",
        "#SBATCH --qos=high",
        "#SBATCH --time=2880",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=64",
        "#SBATCH --mem=480GB",
        "#SBATCH --signal=USR2@120",
        "#SBATCH --constraint=h100",
        "module load cuda",
    ):
        assert line in script, line
    # no GPUs: no --gpus-per-node at all; unset account/qos/memory: left to SLURM
    bare = executor_parameters(SlurmSettings(partition="cpu"))
    assert "gpus_per_node" not in bare and "slurm_account" not in bare and "mem_gb" not in bare


def test_the_job_runs_the_same_overrides_with_the_local_launcher():
    argv = ["+exp=smoke", "launcher=slurm_h100", "launcher.wait=true", "+launcher.extra=1", "seed=3"]
    assert job_argv(argv) == ["+exp=smoke", "seed=3", "launcher=local"]
    cfg, _ = compose_train_config(["+exp=grpo_sarl_math", "launcher=slurm_h100"])
    assert train_argv(["x=1"], cfg) == ["x=1"]  # the allocation already matches the trainer
    cfg.launcher.nodes, cfg.launcher.gpus_per_node = 4, 4
    assert train_argv(["x=1"], cfg) == ["x=1", "train.nnodes=4", "train.n_gpus_per_node=4"]


def test_multi_node_plan_starts_a_ray_head_and_workers_and_one_driver():
    s = SlurmSettings(nodes=3, gpus_per_node=8, cpus_per_task=64, ray_port=6380)
    hosts = ["gpu01", "gpu02", "gpu03"]
    head = task_plan(0, hosts, s)
    assert head.runs_driver and head.env == {"RAY_ADDRESS": "gpu01:6380"}
    assert head.ray[:4] == ["ray", "start", "--head", "--port=6380"]
    assert "--num-gpus=8" in head.ray and "--num-cpus=64" in head.ray and "--block" not in head.ray
    workers = [task_plan(r, hosts, s) for r in (1, 2)]
    for w in workers:
        assert not w.runs_driver and w.env == {}
        assert w.ray[:3] == ["ray", "start", "--address=gpu01:6380"] and "--block" in w.ray
    single = task_plan(0, ["gpu01"], s)
    assert single.ray is None and single.runs_driver and single.env == {}


def test_checkpoint_requeues_the_same_job_and_pickles_without_its_process(tmp_path):
    job = ModuleJob("sarl.train", ["+exp=smoke", "launcher=local"], str(tmp_path), SlurmSettings(), "/usr/bin/python3")
    delayed = job.checkpoint()
    assert isinstance(delayed, submitit.helpers.DelayedSubmission) and delayed.function is job
    again = pickle.loads(pickle.dumps(delayed))
    assert again.function.command() == ["/usr/bin/python3", "-m", "sarl.train", "+exp=smoke", "launcher=local"]
    assert again.function._proc is None


@pytest.mark.parametrize("code", ["os.kill(os.getpid(), signal.SIGTERM)", "sys.exit(128 + signal.SIGTERM)"])
def test_a_run_ended_by_sigterm_waits_for_slurms_next_signal(code, tmp_path, capsys):
    """Killed by SIGTERM, or stopped on it and exiting 143 as sarl.train does (sarl.signals): the job waits for
    submitit's USR2 (checkpoint and requeue) instead of failing at once."""
    (tmp_path / "terminated_run.py").write_text(f"import os, signal, sys\n{code}\n")
    job = ModuleJob("terminated_run", [], str(tmp_path), SlurmSettings(signal_delay_s=0), sys.executable)
    with pytest.raises(RuntimeError, match="exited with"):
        job._run_driver({**os.environ, "PYTHONPATH": str(tmp_path)})
    assert "the run was terminated (SIGTERM); waiting for SLURM's next signal" in capsys.readouterr().out


# -- a real SLURM cluster --------------------------------------------------------------------


def _job_id_from(out: str) -> str:
    line = next(ln for ln in out.splitlines() if ln.startswith("submitted sarl.train as SLURM job "))
    return line.rsplit(" ", 1)[1]


@pytest.mark.slow
def test_smoke_training_job_runs_on_slurm_and_its_outputs_come_back(
    slurm_cluster, launch_policy_cache, tmp_path, capsys
):
    args = ["+exp=smoke", *SMALL, "backend.max_steps=2", f"paths.root={tmp_path}"]
    args += [f"model.build.cache_dir={launch_policy_cache}", *LOCAL_CLUSTER, "launcher.wait=true"]
    assert main(args) == 0, slurm_cluster.log_tail()
    out = capsys.readouterr().out
    job_id = _job_id_from(out)
    assert "stdout: " in out and "succeeded" in out
    runs = list((tmp_path / "runs" / "smoke").iterdir())
    assert [r.name.endswith(f"_j{job_id}") for r in runs] == [True]
    run = runs[0]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    assert (run / "final" / "config.json").exists()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["slurm_job_id"] == job_id and meta["choices"]["launcher"] == "local"
    log = (tmp_path / "runs" / "slurm" / job_id / f"{job_id}_0_log.out").read_text()
    assert "launcher=local" in log and "Job completed successfully" in log


@pytest.mark.slow
def test_a_preempted_job_is_requeued_and_resumes_from_its_checkpoint(slurm_cluster, launch_policy_cache, tmp_path):
    from sarl.launch.slurm import submit

    args = ["+exp=smoke", *SMALL, "backend.max_steps=6", "train.save_freq=1", f"paths.root={tmp_path}"]
    args += [f"model.build.cache_dir={launch_policy_cache}", "train.rollout_n=8", "train.micro_batch_size_per_gpu=16"]
    cfg, _ = compose_train_config([*args, *LOCAL_CLUSTER])
    job = submit(args, cfg.launcher)
    base = tmp_path / "runs" / "smoke"
    deadline = time.monotonic() + 300
    ckpt = None
    while time.monotonic() < deadline and not job.done():
        found = sorted(base.glob(f"*_j{job.job_id}/checkpoints/checkpoint-2/trainer_state.json"))
        if found:
            ckpt = found[0]
            break
        time.sleep(0.2)
    assert ckpt is not None, f"no checkpoint-2 before the preemption\n{slurm_cluster.log_tail()}"
    run = ckpt.parents[2]
    assert not (run / "final").exists(), "the run finished before it could be preempted"
    job._interrupt(timeout=False)  # preemption as SLURM does it: SIGTERM, then submitit's USR2
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and not (run / "summary.json").exists():
        time.sleep(1)
    assert job.result() == 0
    log = Path(str(job.paths.stdout)).read_text()
    assert "Requeued job" in log and "stopping the run and requeuing" in log, log[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] is not None and summary["steps"] == 6
    assert int(Path(summary["resumed_from"]).name.split("-")[1]) >= 2
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert list(base.iterdir()) == [run]  # the requeued job found its own run directory (same job id)
    assert run.name.endswith(f"_j{job.job_id}")


def test_eval_run_submits_itself_through_the_launcher(monkeypatch):
    """`python -m eval.run ... launcher=slurm_h100` hands the same command to sarl.launch.slurm.dispatch."""
    import sarl.launch.slurm as slurm
    from eval.run import main as eval_main

    calls = []
    monkeypatch.setattr(slurm, "dispatch", lambda module, argv, cfg: calls.append((module, list(argv), cfg)) or 0)
    argv = ["ckpt=/ckpts/step_100", "launcher=slurm_h100", "launcher.gpus_per_node=1"]
    assert eval_main(argv) == 0
    ((module, sent, cfg),) = calls
    assert module == "eval.run" and sent == argv
    assert cfg.name == "slurm_h100" and cfg.gpus_per_node == 1 and cfg.nodes == 1
