"""launcher=slurm_h100: settings and environment overrides, the sbatch script, the job's command, the
multi-node Ray plan, and (slow, as root) real jobs on a local single-node SLURM cluster: the smoke run
submitted through submitit, and a preempted job that is requeued and resumes."""

import ipaddress
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import submitit
from submitit.slurm.slurm import _make_sbatch_string
from testkit import smoke_small

from sarl.backends.trl.metrics import read_metrics
from sarl.launch.compose import compose_train_config
from sarl.train import main
from slurm.launcher import (
    ModuleJob,
    SlurmSettings,
    executor_parameters,
    head_ip_file,
    interface_ip,
    job_argv,
    node_ip_address,
    publish_head_ip,
    ray_cli,
    ray_head_command,
    ray_job_env,
    ray_worker_command,
    read_head_ip,
    running_ray_head,
    settings,
    train_argv,
)

SMALL = [*smoke_small(), "logger=none", "heldout=null"]
LOCAL_CLUSTER = [
    "launcher=slurm_h100",
    "launcher.partition=debug",
    "launcher.gpus_per_node=0",
    "launcher.mem_gb=null",  # --mem=0
    "launcher.cpus_per_task=2",
    "launcher.time_min=30",
]


def test_launcher_config_composes_with_train_and_follows_the_trainer():
    cfg, choices = compose_train_config(["+exp=grpo_sarl_math", "launcher=slurm_h100", "train.nnodes=2"])
    assert choices["launcher"] == "slurm_h100"
    s = settings(cfg.launcher, env={})
    assert (s.name, s.partition, s.nodes, s.gpus_per_node, s.wait) == ("slurm_h100", None, 2, 8, False)
    assert (s.time_min, s.mem_gb, s.gres) == (None, None, None)  # the cluster's (slurm.partitions)
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
        "srun_args": p["slurm_srun_args"],
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
    # the step's own CPUs: SLURM 22.05-23.02 do not pass the job's --cpus-per-task on to srun
    (srun,) = [ln for ln in script.splitlines() if ln.startswith("srun ")]
    assert "--cpus-per-task=64" in srun.split()
    # no GPUs: no --gpus-per-node at all; unset account/qos/memory: left to SLURM
    bare = executor_parameters(SlurmSettings(partition="cpu", time_min=60))
    assert "gpus_per_node" not in bare and "slurm_account" not in bare and bare["mem_gb"] == 0  # --mem=0: the node's
    with pytest.raises(ValueError, match="time_min is unresolved"):
        executor_parameters(SlurmSettings(partition="cpu"))
    gres = executor_parameters(SlurmSettings(partition="cpu", time_min=60, gpus_per_node=8, gres="gpu:8"))
    assert gres["slurm_gres"] == "gpu:8" and "gpus_per_node" not in gres
    assert "slurm_srun_args" not in bare  # no CPU count asked: srun's default, as the job's


def test_a_task_with_fewer_cpus_than_asked_is_told_how_to_give_srun_them(capsys, caplog):
    from slurm.launcher import report_task_cpus

    assert report_task_cpus(64, usable=64) == 64
    assert capsys.readouterr().out == "slurm.launcher: this task may use 64 CPUs (the job asked 64 per task)\n"
    assert not caplog.records
    report_task_cpus(64, usable=1)
    (warning,) = caplog.records
    assert "runs on 1 of the 64 CPUs" in warning.getMessage() and "SRUN_CPUS_PER_TASK=64" in warning.getMessage()


def test_the_job_runs_the_same_overrides_with_the_local_launcher():
    argv = ["+exp=smoke", "launcher=slurm_h100", "launcher.wait=true", "+launcher.extra=1", "seed=3"]
    assert job_argv(argv) == ["+exp=smoke", "seed=3", "launcher=local"]
    cfg, _ = compose_train_config(["+exp=grpo_sarl_math", "launcher=slurm_h100"])
    assert train_argv(["x=1"], cfg) == ["x=1"]  # the allocation already matches the trainer
    cfg.launcher.nodes, cfg.launcher.gpus_per_node = 4, 4
    assert train_argv(["x=1"], cfg) == ["x=1", "train.nnodes=4", "train.n_gpus_per_node=4"]


def test_ray_runs_from_the_jobs_interpreter_and_every_node_names_its_ip_address():
    python = "/work/venv/bin/python"
    head = ray_head_command(python, 6380, "10.1.0.1", 8, 64)
    assert head == [
        python,
        "-m",
        "ray.scripts.scripts",  # the job's own Ray, whatever `ray` is on PATH
        "start",
        "--head",
        "--port=6380",
        "--node-ip-address=10.1.0.1",
        "--num-gpus=8",
        "--num-cpus=64",
        "--block",  # a child this job stops by its process group
        "--disable-usage-stats",
    ]
    worker = ray_worker_command(python, "10.1.0.1", 6380, "10.1.0.2", 8, None)
    assert worker[:4] == [python, "-m", "ray.scripts.scripts", "start"]
    assert worker[4:] == ["--address=10.1.0.1:6380", "--node-ip-address=10.1.0.2", "--num-gpus=8", "--block"] + [
        "--disable-usage-stats"
    ]
    # the module exists in the installed Ray and runs as its command line
    proc = subprocess.run([*ray_cli(sys.executable), "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "version" in proc.stdout, proc.stderr[-2000:]


def test_a_node_ip_address_comes_from_the_interface_or_the_route_to_the_head_and_is_never_loopback():
    with pytest.raises(RuntimeError, match="loopback.*launcher.ray_interface='lo'"):
        node_ip_address("gpu01", 6379, "lo")
    with pytest.raises(RuntimeError, match="the head node's name 'localhost' resolves to a loopback address"):
        node_ip_address("localhost", 6379, None)
    with pytest.raises(ValueError, match="launcher.ray_interface='nosuch0': no IPv4 address.*interfaces are .*lo"):
        interface_ip("nosuch0")
    assert interface_ip("lo") == "127.0.0.1"
    for _, name in socket.if_nameindex():
        try:
            ip = interface_ip(name)
        except ValueError:
            continue
        if not ipaddress.ip_address(ip).is_loopback:  # a real network here: its address routes to itself
            assert node_ip_address(ip, 6379, None) == ip == node_ip_address("anything", 6379, name)


def test_the_head_publishes_its_address_once_per_start_of_the_job(tmp_path):
    assert head_ip_file(tmp_path, {}).name == "ray_head_ip.0"
    path = head_ip_file(tmp_path, {"SLURM_RESTART_COUNT": "2"})  # a requeued job never reads its last run's
    assert path.name == "ray_head_ip.2"
    with pytest.raises(TimeoutError, match="did not publish its address in .*ray_head_ip.2"):
        read_head_ip(path, timeout_s=0.2, poll_s=0.05)
    publish_head_ip(path, "10.1.0.1")
    assert read_head_ip(path, timeout_s=1) == "10.1.0.1" and [p.name for p in tmp_path.iterdir()] == [path.name]


# Stands in for the job's python: records its arguments (and RAY_ADDRESS, RAY_AUTH_MODE); as `-m
# ray.scripts.scripts start --head` it records its pid (whole: written aside, then renamed), starts a grandchild in
# its process group and waits, like `ray start --block`; any other command (a worker's `ray start`, the driver)
# ends at once.
FAKE_PYTHON = r"""#!/bin/sh
echo "$* RAY_ADDRESS=$RAY_ADDRESS RAY_AUTH_MODE=$RAY_AUTH_MODE" >> "$FAKE_DIR/calls"
case "$*" in
  *ray.scripts.scripts\ start\ --head*)
    sleep 600 &
    echo $$ > "$FAKE_DIR/head.pid.part" && mv "$FAKE_DIR/head.pid.part" "$FAKE_DIR/head.pid"
    wait ;;
esac
"""


class FakeJobEnvironment:
    """submitit.JobEnvironment of one task of a two-node job."""

    def __init__(self, rank, folder):
        self.job_id, self.global_rank, self.num_tasks = "77", rank, 2
        self.hostnames = ["gpu01", "gpu02"]
        self.paths = SimpleNamespace(folder=folder)


def _group_alive(pgid):
    """Whether any process of group `pgid` is alive (a zombie waiting for its parent is not)."""
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # Ray's node records go to <RAY_TMPDIR>/ray/
    return python


def test_the_head_node_starts_ray_as_its_child_runs_the_driver_and_stops_ray_by_its_process_group(
    fake_python, tmp_path, monkeypatch
):
    import slurm.launcher as launcher

    folder = tmp_path / "job"
    folder.mkdir()
    monkeypatch.setattr(submitit, "JobEnvironment", lambda: FakeJobEnvironment(0, folder))
    monkeypatch.setattr(launcher, "node_ip_address", lambda head, port, interface: "10.1.0.1")
    seen = {}

    def joined(expected, address, timeout_s, head):  # instead of ray.init: the head is up and published
        deadline = time.monotonic() + 30
        while not (tmp_path / "head.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.update(expected=expected, address=address, head=head.pid, published=(folder / "ray_head_ip.0").read_text())
        seen["pid"] = int((tmp_path / "head.pid").read_text())

    monkeypatch.setattr(launcher, "wait_for_ray_nodes", joined)
    record = tmp_path / "ray" / "ray_current_cluster"  # what `ray start` leaves for a later ray.init() there
    record.parent.mkdir()
    record.write_text("10.1.0.1:6380")
    s = SlurmSettings(nodes=2, gpus_per_node=8, cpus_per_task=64, ray_port=6380)
    job = ModuleJob("sarl.train", ["+exp=smoke", "launcher=local"], str(tmp_path), s, str(fake_python))
    assert job() == 0
    assert seen["expected"] == 2 and seen["address"] == "10.1.0.1:6380" and seen["published"] == "10.1.0.1"
    assert seen["pid"] == seen["head"]  # the Ray head is this job's own child, the leader of its group
    head_call, driver_call = (tmp_path / "calls").read_text().splitlines()
    assert head_call.startswith("-m ray.scripts.scripts start --head --port=6380 --node-ip-address=10.1.0.1 ")
    assert "--block" in head_call and head_call.endswith(" RAY_ADDRESS= RAY_AUTH_MODE=disabled")
    assert driver_call == "-m sarl.train +exp=smoke launcher=local RAY_ADDRESS=10.1.0.1:6380 RAY_AUTH_MODE=disabled"
    assert not _group_alive(seen["pid"])  # the head and the process it started, stopped by their group
    assert not (folder / "ray_head_ip.0").exists() and not record.exists()


def test_a_stopped_ray_head_leaves_another_clusters_record_alone(fake_python, tmp_path):
    record = tmp_path / "ray" / "ray_current_cluster"
    record.parent.mkdir()
    record.write_text("10.9.9.9:6379")  # somebody else's `ray start` on this node
    with running_ray_head(["sleep", "600"], "10.1.0.1:6380", os.environ) as head:
        assert head.poll() is None
    assert head.poll() is not None and record.read_text() == "10.9.9.9:6379"


def test_a_worker_node_joins_the_published_head_address_with_its_own(fake_python, tmp_path, monkeypatch):
    import slurm.launcher as launcher

    folder = tmp_path / "job"
    folder.mkdir()
    publish_head_ip(folder / "ray_head_ip.0", "10.1.0.1")
    monkeypatch.setattr(submitit, "JobEnvironment", lambda: FakeJobEnvironment(1, folder))
    routes = []
    monkeypatch.setattr(launcher, "node_ip_address", lambda head, port, interface: routes.append(head) or "10.1.0.2")
    s = SlurmSettings(nodes=2, gpus_per_node=8, ray_port=6380, ray_interface=None)
    assert ModuleJob("sarl.train", [], str(tmp_path), s, str(fake_python))() == 0
    assert routes == ["10.1.0.1"]  # its own address: the interface that routes to the head's
    (call,) = (tmp_path / "calls").read_text().splitlines()
    assert call == (
        "-m ray.scripts.scripts start --address=10.1.0.1:6380 --node-ip-address=10.1.0.2 --num-gpus=8 --block "
        "--disable-usage-stats RAY_ADDRESS= RAY_AUTH_MODE=disabled"
    )
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # the user's choice is every node's
    assert ray_job_env(os.environ)["RAY_AUTH_MODE"] == "token"
    assert ray_job_env({})["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"  # no 30 s drain per node at the end
    assert ray_job_env({"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "5"})["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "5"


@pytest.mark.slow
def test_a_real_ray_head_started_by_the_job_is_joined_and_stopped_by_its_process_group(tmp_path, monkeypatch):
    """The job's head command with the installed Ray, joined as the job joins it (wait_for_ray_nodes), with a
    token file in HOME as any earlier local `ray.init()` leaves one: the head and its clients agree on the
    authentication mode. Stopping the head's process group leaves no Ray process of it behind, nor the node's
    record of it. Ray's files go to a directory of this test (RAY_TMPDIR), not the machine's /tmp/ray."""
    import tempfile

    from sarl.runtime.network import free_port
    from slurm.launcher import wait_for_ray_nodes

    ips = [ip for ip in map(_ipv4, (n for _, n in socket.if_nameindex())) if ip and not ip.startswith("127.")]
    if not ips:
        pytest.skip("no network interface but loopback here (Ray uses a loopback head IP as the node's own)")
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("a" * 64)
    monkeypatch.setenv("HOME", str(home))
    ray_tmp = tempfile.mkdtemp(prefix="sarl-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    port = free_port()
    address = f"{ips[0]}:{port}"
    try:
        with running_ray_head(
            ray_head_command(sys.executable, port, ips[0], 0, 1), address, ray_job_env(os.environ)
        ) as head:
            wait_for_ray_nodes(1, address, 240, head)
            assert head.poll() is None
            # `ray start` writes the record only after its node is up (ray 2.60 ray/scripts/scripts.py, start:
            # write_ray_address after Node(...)), so a client can see the node before the record exists; it opens
            # the file, then writes (ray/_private/utils.py): an empty record is one being written.
            record = Path(ray_tmp) / "ray" / "ray_current_cluster"
            deadline = time.monotonic() + 60
            while not (record.exists() and record.read_text().strip()) and head.poll() is None:
                assert time.monotonic() < deadline, "no record of the cluster in 60 s"
                time.sleep(0.2)
            assert record.read_text().strip() == address
        deadline = time.monotonic() + 30
        while _group_alive(head.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _group_alive(head.pid)
        assert not record.exists()
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _ipv4(name):
    try:
        return interface_ip(name)
    except ValueError:
        return None


def test_checkpoint_requeues_the_same_job_and_pickles_without_its_process(tmp_path):
    job = ModuleJob("sarl.train", ["+exp=smoke", "launcher=local"], str(tmp_path), SlurmSettings(), "/usr/bin/python3")
    delayed = job.checkpoint()
    assert isinstance(delayed, submitit.helpers.DelayedSubmission) and delayed.function is job
    again = pickle.loads(pickle.dumps(delayed))
    assert again.function.command() == ["/usr/bin/python3", "-m", "sarl.train", "+exp=smoke", "launcher=local"]
    assert again.function._proc is None


@pytest.mark.parametrize("code", ["os.kill(os.getpid(), signal.SIGTERM)", "sys.exit(128 + signal.SIGTERM)"])
def test_a_run_ended_by_sigterm_waits_for_slurms_next_signal(code, tmp_path, capsys):
    """Killed by SIGTERM, or stopped on it and exiting 143 as sarl.train does (sarl.runtime.signals): the job waits for
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
    submission = (tmp_path / "runs" / "slurm" / job_id / f"{job_id}_submission.sh").read_text()
    (srun,) = [ln for ln in submission.splitlines() if ln.startswith("srun ")]
    assert "--cpus-per-task=2" in srun.split()  # the step's own, not only #SBATCH's
    assert "slurm.launcher: this task may use 2 CPUs (the job asked 2 per task)" in log


@pytest.mark.slow
def test_a_preempted_job_is_requeued_and_resumes_from_its_checkpoint(slurm_cluster, launch_policy_cache, tmp_path):
    from slurm.launcher import submit

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
    slurm_cluster.start_requeued_now(job.job_id)  # submitit requeued it; skip SLURM's hold before a restart
    slurm_cluster.wait_until(job.job_id, (run / "summary.json").exists, 400, "the requeued run did not finish")
    slurm_cluster.wait_until(job.job_id, job.done, 120, "the requeued job did not end")
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
    """`python -m eval.run ... launcher=slurm_h100` hands the same command to slurm.launcher.dispatch."""
    import slurm.launcher as launcher
    from eval.run import main as eval_main

    calls = []
    monkeypatch.setattr(launcher, "dispatch", lambda module, argv, cfg: calls.append((module, list(argv), cfg)) or 0)
    argv = ["ckpt=/ckpts/step_100", "launcher=slurm_h100", "launcher.gpus_per_node=1"]
    assert eval_main(argv) == 0
    ((module, sent, cfg),) = calls
    assert module == "eval.run" and sent == argv
    assert cfg.name == "slurm_h100" and cfg.gpus_per_node == 1 and cfg.nodes == 1


def test_a_dry_run_with_the_slurm_launcher_shows_the_job_and_submits_nothing(monkeypatch, tmp_path, capsys):
    """`launcher=slurm_h100 train.dry_run=true` (and eval.run's dry_run) print the job's resources and the command
    it runs on stderr beside the usual dry run, and submit nothing."""
    import slurm.launcher as launcher
    from eval.run import main as eval_main

    monkeypatch.setattr(launcher, "dispatch", lambda *a: pytest.fail("a dry run must not submit"))
    argv = ["+exp=grpo_sarl_math", "launcher=slurm_h100", "launcher.time_min=90", "train.dry_run=true"]
    assert main([*argv, f"paths.root={tmp_path}"]) == 0
    err = capsys.readouterr().err
    assert "# dry run: launcher=slurm_h100 would submit one SLURM job (nothing submitted):" in err
    plan = next(line for line in err.splitlines() if line.startswith("#   partition="))
    assert plan.startswith("#   partition=(the cluster's default) ")
    assert " nodes=1 gpus_per_node=8 cpus_per_task=64 mem_gb=(each node's whole) time=1:30:00" in plan
    job = next(line for line in err.splitlines() if line.startswith("#   the job runs"))
    assert job.endswith(" -m sarl.train +exp=grpo_sarl_math " + f"paths.root={tmp_path} launcher=local")
    assert not (tmp_path / "runs").exists()  # nothing written, nothing submitted

    assert eval_main(["protocol=grp", "dry_run=true", "launcher=slurm_h100", "launcher.gpus_per_node=1"]) == 0
    out, err = capsys.readouterr()
    assert "grp" in out and "gpus_per_node=1" in err and err.strip().endswith("-m eval.run protocol=grp launcher=local")


def test_waiting_for_a_job_prints_its_log_as_it_grows(tmp_path):
    """launcher.wait=true: the job's log reaches the console while the job runs (a queued job says so once), not
    all at once at its end."""
    import io

    from slurm.launcher import follow

    log = tmp_path / "job.out"
    out = io.StringIO()
    seen: list[str] = []

    class Job:
        job_id = "7"
        paths = SimpleNamespace(stdout=log)
        polls = 0

        def done(self):
            seen.append(out.getvalue())
            self.polls += 1
            if self.polls == 3:
                log.write_text("step 1/2\n")
            elif self.polls == 4:
                with log.open("a") as f:
                    f.write("step 2/2\n")
            return self.polls >= 5

    follow(Job(), poll_s=0, out=out)
    assert seen[2] == "job 7 is queued (squeue -j 7); its log follows here once it starts\n"
    assert seen[3].endswith("step 1/2\n") and "step 2/2" not in seen[3]  # the first line before the job ended
    assert out.getvalue().endswith("step 1/2\nstep 2/2\n")
