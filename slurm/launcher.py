"""`launcher=slurm_h100`: submit `sarl.train` (or `eval.run`) to SLURM with submitit.

    python -m sarl.train +exp=grpo_sarl_math launcher=slurm_h100 [launcher.account=ACC] [launcher.wait=true]

(The plain-`sbatch` scripts in slurm/sbatch/ run the same per-node code through `python -m slurm.node`.)

The job runs the same command with the same overrides, minus the launcher ones plus `launcher=local`,
in the submitting directory with the submitting interpreter and environment. Resources come from
conf/launcher/slurm_h100.yaml, and each of them can be overridden from the environment
(`SARL_SLURM_PARTITION`, `..._ACCOUNT`, `..._QOS`, `..._TIME_MIN`, `..._NODES`, `..._GPUS_PER_NODE`,
`..._CPUS_PER_TASK`, `..._MEM_GB`, `..._GRES`); the environment wins over the config. What is left null is the
cluster's (slurm.partitions): its default partition, that partition's time limit, each node's whole memory.

Preemption and time-outs: submitit asks SLURM for USR2 `signal_delay_s` before the time limit and
catches the preemption signal; `ModuleJob.checkpoint()` stops the run and hands submitit itself
again, and submitit requeues the job (`scontrol requeue`). A requeued job keeps its SLURM_JOB_ID,
so sarl.train finds the same run directory (`..._j<jobid>`), resumes from its last checkpoint and
logs to the same W&B run (the W&B run id derives from the run directory). A job an administrator
requeues (`scontrol requeue`) or that SLURM kills on preemption reruns the same submission and
resumes the same way.

Multi-node (nodes > 1): one task per node; node 0 starts a Ray head (`ray start --head --block`, a child
in its own session), publishes its IP address in the job's submitit folder (every node sees it), and every
other node joins it by that address (`ray start --address=HEAD_IP:PORT --block`). Ray is the job's own
(`python -m ray.scripts.scripts`, the module behind the `ray` console script, with the job's interpreter),
and every node gives Ray its IP address (`--node-ip-address`): that of `launcher.ray_interface`, else that
of the interface that routes to the head, never whatever Ray picks on a node with several networks. The same
interface carries verl's collectives (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, unless the user set them), and the
driver hands its run settings to every node's workers through Ray's runtime_env (sarl.runtime.runs.node_env).
Node 0 waits until all nodes have joined and runs the driver once, with RAY_ADDRESS set, so verl's trainer
uses the whole allocation; the embedding server (url "auto") is started by the driver, hence on the first
node. At the end node 0 stops its Ray head by the head's process group (never `ray stop`, which stops every
Ray on the node, other users' included).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from sarl.runtime.errors import UserError
from sarl.runtime.network import is_loopback, routable_ip
from sarl.runtime.signals import stop_process_group
from slurm import partitions

log = logging.getLogger("slurm.launcher")

# config key -> (environment variable, type)
ENV_OVERRIDES: dict[str, tuple[str, type]] = {
    "partition": ("SARL_SLURM_PARTITION", str),
    "account": ("SARL_SLURM_ACCOUNT", str),
    "qos": ("SARL_SLURM_QOS", str),
    "time_min": ("SARL_SLURM_TIME_MIN", int),
    "nodes": ("SARL_SLURM_NODES", int),
    "gpus_per_node": ("SARL_SLURM_GPUS_PER_NODE", int),
    "cpus_per_task": ("SARL_SLURM_CPUS_PER_TASK", int),
    "mem_gb": ("SARL_SLURM_MEM_GB", float),
    "gres": ("SARL_SLURM_GRES", str),
}


@dataclass(frozen=True)
class SlurmSettings:
    """The resolved launcher config (conf/launcher/slurm_h100.yaml, then the environment)."""

    name: str = "slurm_h100"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_min: int | None = None  # None: the partition's limit (slurm.partitions.resolve, at submission)
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem_gb: float | None = None  # None: each node's whole memory (--mem=0)
    gres: str | None = None  # e.g. "gpu:8": the GPUs asked with --gres instead of --gpus-per-node
    additional: dict[str, Any] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)
    signal_delay_s: int = 120
    max_num_timeout: int = 20
    log_dir: str = "runs/slurm"
    job_name: str | None = None
    wait: bool = False
    ray_port: int = 6379
    ray_join_timeout_s: float = 600
    ray_interface: str | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"launcher.nodes must be >= 1, got {self.nodes}")
        if self.time_min is not None and self.time_min < 1:
            raise ValueError(f"launcher.time_min must be >= 1 minute, got {self.time_min}")
        if self.gpus_per_node < 0:
            raise ValueError(f"launcher.gpus_per_node must be >= 0, got {self.gpus_per_node}")


def settings(launcher_cfg: Any, env: Mapping[str, str] | None = None) -> SlurmSettings:
    """SlurmSettings from the launcher config (a DictConfig or dict) with environment overrides."""
    from omegaconf import DictConfig, OmegaConf

    env = os.environ if env is None else env
    raw = (
        OmegaConf.to_container(launcher_cfg, resolve=True)
        if isinstance(launcher_cfg, DictConfig)
        else dict(launcher_cfg)
    )
    known = set(SlurmSettings.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown launcher keys {unknown}; known: {sorted(known)}")
    for key, (var, cast) in ENV_OVERRIDES.items():
        value = env.get(var)
        if value is None or value == "":
            continue
        try:
            raw[key] = cast(value)
        except ValueError as err:
            raise ValueError(f"{var}={value!r} is not a valid {cast.__name__} for launcher.{key}") from err
    raw["additional"] = dict(raw.get("additional") or {})
    raw["setup"] = list(raw.get("setup") or [])
    return SlurmSettings(**raw)


def executor_parameters(s: SlurmSettings) -> dict[str, Any]:
    """submitit AutoExecutor.update_parameters() arguments for settings `resolve`d against the cluster (None values
    are left out: SLURM's defaults). No memory given: each node's whole (--mem=0). `gres`: the GPUs as --gres."""
    if s.time_min is None:
        raise ValueError("launcher.time_min is unresolved: resolve the settings against the cluster first")
    params: dict[str, Any] = {
        "name": s.job_name or s.name,
        "timeout_min": s.time_min,
        "nodes": s.nodes,
        "tasks_per_node": 1,  # one task per node: it starts Ray there (multi-node) or runs the driver
        "gpus_per_node": s.gpus_per_node,
        "cpus_per_task": s.cpus_per_task,
        "mem_gb": 0 if s.mem_gb is None else s.mem_gb,  # 0: all of each node's memory
        "slurm_partition": s.partition,
        "slurm_account": s.account,
        "slurm_qos": s.qos,
        "slurm_signal_delay_s": s.signal_delay_s,
        "slurm_additional_parameters": dict(s.additional),
        "slurm_setup": list(s.setup),
        "stderr_to_stdout": True,
    }
    if s.cpus_per_task:  # the srun step's own: since SLURM 22.05 (until 23.11) it does not inherit the job's
        params["slurm_srun_args"] = [f"--cpus-per-task={s.cpus_per_task}"]
    if s.gres:  # clusters that count GPUs as generic resources only
        params["slurm_gres"] = s.gres
    if not s.gpus_per_node or s.gres:
        del params["gpus_per_node"]  # no --gpus-per-node=0 (a partition without GRES refuses it)
    return {k: v for k, v in params.items() if v is not None}


def job_argv(argv: Sequence[str]) -> list[str]:
    """The overrides the job runs with: the launcher's own removed, `launcher=local` added
    (so that the job runs instead of submitting itself again)."""
    out = []
    for arg in argv:
        key = arg.lstrip("+~").split("=", 1)[0]
        if key == "launcher" or key.startswith("launcher."):
            continue
        out.append(arg)
    return [*out, "launcher=local"]


def ray_cli(python: str) -> list[str]:
    """Ray's command line from the job's interpreter (the Ray installed beside the sarl it runs), not the first
    `ray` on PATH: `python -m ray.scripts.scripts`, the module the `ray` console script runs."""
    return [python, "-m", "ray.scripts.scripts"]


def _resources(num_gpus: int, num_cpus: int | None) -> list[str]:
    return [f"--num-gpus={num_gpus}"] + ([f"--num-cpus={num_cpus}"] if num_cpus else [])


def ray_head_command(python: str, port: int, node_ip: str, num_gpus: int, num_cpus: int | None) -> list[str]:
    """`ray start --head --block`: runs until stopped (by its process group, `stop_process_group`)."""
    cmd = [*ray_cli(python), "start", "--head", f"--port={port}", f"--node-ip-address={node_ip}"]
    return cmd + _resources(num_gpus, num_cpus) + ["--block", "--disable-usage-stats"]


def ray_worker_command(
    python: str, head_ip: str, port: int, node_ip: str, num_gpus: int, num_cpus: int | None
) -> list[str]:
    """`ray start --address=HEAD_IP:PORT --block`: joins the head and runs until stopped or the head goes away."""
    cmd = [*ray_cli(python), "start", f"--address={head_ip}:{port}", f"--node-ip-address={node_ip}"]
    return cmd + _resources(num_gpus, num_cpus) + ["--block", "--disable-usage-stats"]


SIOCGIFADDR = 0x8915  # Linux netdevice(7): an interface's address


def interface_ip(name: str) -> str:
    """The IPv4 address of network interface `name` on this node (Linux)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as err:
            names = ", ".join(n for _, n in socket.if_nameindex())
            raise ValueError(
                f"launcher.ray_interface={name!r}: no IPv4 address on {socket.gethostname()} ({err.strerror}); "
                f"its interfaces are {names}. Set launcher.ray_interface to one every node has, or null"
            ) from err
    return socket.inet_ntoa(packed[20:24])  # struct ifreq: the name (16 bytes), then a sockaddr_in


def interface_of(ip: str) -> str | None:
    """The name of this node's network interface with IPv4 address `ip` (None when none has it)."""
    for _, name in socket.if_nameindex():
        with contextlib.suppress(ValueError):
            if interface_ip(name) == ip:
                return name
    return None


COLLECTIVE_INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def with_collective_interface(env: dict[str, str], interface: str | None) -> dict[str, str]:
    """`env` with the interface verl's collectives use (it initialises `cpu:gloo,cuda:nccl`) set to Ray's, unless
    the user set them: GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME. Otherwise each resolves this node's host name,
    and a name that resolves to another network (or to loopback) hangs the rendezvous until NCCL's time-out.
    The driver's copy reaches every node's workers through Ray's runtime_env (sarl.runtime.runs.node_env)."""
    if not interface:
        return env
    out = dict(env)
    for var in COLLECTIVE_INTERFACE_VARS:
        out.setdefault(var, interface)
    log.info("collectives on %s (%s)", interface, ", ".join(f"{v}={out[v]}" for v in COLLECTIVE_INTERFACE_VARS))
    return out


def node_ip_address(head: str, port: int, interface: str | None) -> str:
    """This node's IP address for Ray: that of `interface` (launcher.ray_interface), else that of the interface
    that routes to `head` (the head's host name or address; on the head itself, its own address)."""
    ip = interface_ip(interface) if interface else routable_ip(socket.gethostbyname(head), allow_loopback=True)
    if is_loopback(ip):
        why = (
            f"launcher.ray_interface={interface!r} is a loopback interface"
            if interface
            else (f"the head node's name {head!r} resolves to a loopback address there")
        )
        raise RuntimeError(
            f"Ray would listen on {ip} (loopback) on {socket.gethostname()}: {why}; set launcher.ray_interface "
            "to the network interface the nodes reach each other on (e.g. ib0)"
        )
    return ip


def head_ip_file(folder: str | Path, env: Mapping[str, str]) -> Path:
    """Where the head node publishes its IP address: the job's submitit folder (which every node reads), one
    file per start of the job (SLURM_RESTART_COUNT), so that a requeued job never reads its last run's."""
    return Path(folder) / f"ray_head_ip.{env.get('SLURM_RESTART_COUNT') or 0}"


def publish_head_ip(path: Path, ip: str) -> None:
    """Write the head's address for the other nodes (`read_head_ip`)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(ip)
    os.replace(tmp, path)  # atomic: a reader sees the whole address or no file


def read_head_ip(path: Path, timeout_s: float, poll_s: float = 1.0) -> str:
    """The address the head node published, waiting up to `timeout_s` for it."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the Ray head did not publish its address in {path} within {timeout_s:.0f} s "
                "(launcher.ray_join_timeout_s); see node 0's log in the same folder"
            )
        time.sleep(poll_s)
    return path.read_text().strip()


def ray_job_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a multi-node job's Ray head, workers and driver: one authentication mode for all.
    `ray start --head` turns token authentication on when it finds a token file (~/.ray/auth_token, which any
    earlier local `ray.init()` writes), but `ray start --address` and `ray.init(address)` never turn it on by
    themselves (ray 2.60 ray/_private/authentication/authentication_token_setup.py
    maybe_enable_token_auth_if_token_available), so the workers and the driver would be refused. Without a
    RAY_AUTH_MODE of the user's, the job's Ray runs with `disabled`, what `ray start` does where there is no
    token file; with RAY_AUTH_MODE=token every node needs the token (RAY_AUTH_TOKEN or the file).
    The nodes stop without draining (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0, unless the user set it): on SIGTERM
    `ray start --block` otherwise waits 30 s per node for Ray Serve traffic to quiesce (ray 2.60
    ray/_private/node.py `_drain_node_before_shutdown`), and a job's nodes serve none; the run is over by then."""
    return {
        **environ,
        "RAY_AUTH_MODE": environ.get("RAY_AUTH_MODE") or "disabled",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": environ.get("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S") or "0",
    }


@contextlib.contextmanager
def running_ray_head(
    cmd: Sequence[str], address: str, env: Mapping[str, str], cwd: str | None = None
) -> Iterator[subprocess.Popen]:
    """The Ray head (`cmd`: `ray start --head --block`) as a child in its own session. On exit its process group
    is stopped and, if the node's record of the last cluster `ray start` started still names this head
    (`address`), that record goes too: `ray stop` removes it as well (ray 2.60 ray/scripts/scripts.py stop,
    `reset_ray_address`), and a later `ray.init()` on the node, anyone's, would try to join the dead head."""
    from ray._common.utils import get_ray_address_file

    head = subprocess.Popen(list(cmd), cwd=cwd, env=dict(env), start_new_session=True)
    try:
        yield head
    finally:
        stop_process_group(head)
        record = Path(get_ray_address_file(None))  # <RAY_TMPDIR or /tmp>/ray/ray_current_cluster
        with contextlib.suppress(FileNotFoundError):
            if record.read_text().strip() == address:
                record.unlink()


def report_task_cpus(asked: int | None, usable: int | None = None) -> int:
    """Say how many CPUs this task may run on (its affinity) against the `asked` per task, and warn when it is
    fewer: an srun step that did not get --cpus-per-task (SLURM 22.05 to 23.02 do not pass the job's on) runs
    Ray, the trainer's workers, vLLM and the reward workers on one CPU. Returns the usable count."""
    usable = len(os.sched_getaffinity(0)) if usable is None else usable
    per_task = asked or "the default"
    print(f"slurm.launcher: this task may use {usable} CPUs (the job asked {per_task} per task)", flush=True)
    if asked and usable < asked:
        log.warning(
            "this task runs on %d of the %d CPUs the job asked for each task: the srun step did not get "
            "--cpus-per-task (pass it to srun, or export SRUN_CPUS_PER_TASK=%d before srun)",
            usable,
            asked,
            asked,
        )
    return usable


class ModuleJob:
    """The submitit callable: `python -m MODULE ARGV` in WORKDIR, one per job; checkpointable.

    `checkpoint()` (called by submitit on preemption/time-out) stops the running module and returns a
    DelayedSubmission of this same job: the requeued job runs the same command, which resumes (same
    SLURM_JOB_ID, hence the same run directory and its last checkpoint)."""

    def __init__(self, module: str, argv: Sequence[str], workdir: str, settings: SlurmSettings, python: str):
        self.module = module
        self.argv = list(argv)
        self.workdir = workdir
        self.settings = settings
        self.python = python
        self._proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [self.python, "-m", self.module, *self.argv]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_proc"] = None
        return state

    def __call__(self) -> int:
        import submitit

        env_ = submitit.JobEnvironment()
        log.info("job %s task %d/%d on %s", env_.job_id, env_.global_rank, env_.num_tasks, socket.gethostname())
        return self.run_on_node(env_.global_rank, env_.hostnames, env_.paths.folder)

    def run_on_node(self, rank: int, hosts: Sequence[str], folder: str | Path) -> int:
        """This node's part of the job: on one node, the driver; on several, node `rank` of `hosts` (one task per
        node) starts the Ray head (rank 0, which then runs the driver) or joins it, meeting through `folder`, a
        directory every node sees."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        s = self.settings
        report_task_cpus(s.cpus_per_task)
        if len(hosts) <= 1:
            return self._run_driver(env)
        env = ray_job_env(env)
        address_file = head_ip_file(folder, env)
        if rank != 0:  # a worker node: joins the head and blocks while it is up
            head_ip = read_head_ip(address_file, s.ray_join_timeout_s)
            node_ip = node_ip_address(head_ip, s.ray_port, s.ray_interface)
            env = with_collective_interface(env, s.ray_interface or interface_of(node_ip))
            return self._run(ray_worker_command(self.python, head_ip, s.ray_port, node_ip, *self._ray_resources()), env)
        head_ip = node_ip_address(hosts[0], s.ray_port, s.ray_interface)
        env = with_collective_interface(env, s.ray_interface or interface_of(head_ip))
        address = f"{head_ip}:{s.ray_port}"
        cmd = ray_head_command(self.python, s.ray_port, head_ip, *self._ray_resources())
        log.info("Ray head: %s", shlex.join(cmd))
        with running_ray_head(cmd, address, env, cwd=self.workdir) as head:
            try:
                publish_head_ip(address_file, head_ip)
                wait_for_ray_nodes(len(hosts), address, s.ray_join_timeout_s, head)
                return self._run_driver({**env, "RAY_ADDRESS": address})
            finally:
                address_file.unlink(missing_ok=True)

    def _ray_resources(self) -> tuple[int, int | None]:
        return self.settings.gpus_per_node, self.settings.cpus_per_task

    def _run_driver(self, env: dict[str, str]) -> int:
        cmd = self.command()
        print(f"slurm.launcher: running {shlex.join(cmd)} in {self.workdir}", flush=True)
        rc = self._run(cmd, env)
        if rc in (-signal.SIGTERM, 128 + signal.SIGTERM):  # killed by it, or stopped on it (sarl.train: 143)
            # SLURM terminated the job's processes (preemption, requeue, cancel): its follow-up (submitit's
            # USR2 -> checkpoint() and requeue, or SIGKILL) decides what happens; fail only if none comes.
            print("slurm.launcher: the run was terminated (SIGTERM); waiting for SLURM's next signal", flush=True)
            time.sleep(self.settings.signal_delay_s)
        if rc != 0:
            raise RuntimeError(f"{shlex.join(cmd)} exited with {rc}")
        return rc

    def _run(self, cmd: list[str], env: dict[str, str]) -> int:
        self._proc = subprocess.Popen(cmd, cwd=self.workdir, env=env, start_new_session=True)
        try:
            # poll, not wait(): a blocking wait() holds Popen's lock, and submitit's signal handler (which runs
            # checkpoint() -> _stop_child() in this thread) could then never reap the child
            while (rc := self._proc.poll()) is None:
                time.sleep(0.5)
            return rc
        finally:
            self._stop_child()

    def _stop_child(self) -> None:
        if self._proc is not None:
            stop_process_group(self._proc)

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Preemption/time-out: stop the run (its last saved checkpoint is what the rerun resumes from)
        and requeue this same job."""
        import submitit

        print("slurm.launcher: preempted or timed out; stopping the run and requeuing", flush=True)
        self._stop_child()
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def wait_for_ray_nodes(expected: int, address: str, timeout_s: float, head: subprocess.Popen) -> None:
    """Block until the head (the child `head`) listens at `address` and `expected` Ray nodes are alive there."""
    import ray

    deadline = time.monotonic() + timeout_s
    host, port = address.rsplit(":", 1)
    while True:
        if head.poll() is not None:
            raise RuntimeError(f"the Ray head exited with {head.returncode} before all nodes joined; see the log above")
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Ray head did not listen at {address} within {timeout_s} s") from None
            time.sleep(1)
    ray.init(address=address)
    try:
        while True:
            alive = sum(1 for n in ray.nodes() if n.get("Alive"))
            if alive >= expected:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {alive}/{expected} Ray nodes joined {address} in {timeout_s} s")
            time.sleep(2)
    finally:
        ray.shutdown()


def submission_plan(module: str, argv: Sequence[str], launcher_cfg: Any, *, workdir: str | None = None) -> str:
    """What `dispatch` would submit, as a dry run prints it (stderr): the job's SLURM resources, its requeue rule,
    where its log goes and the command it runs. Nothing is submitted; sbatch need not be here."""
    try:
        s = settings(launcher_cfg)
    except ValueError as err:
        raise UserError(str(err)) from err
    hours, minutes = divmod(s.time_min or 0, 60)
    resources = {
        "partition": s.partition or "(the cluster's default)",
        "account": s.account or "(your default)",
        "qos": s.qos or "(default)",
        "nodes": s.nodes,
        "gpus_per_node": s.gpus_per_node,
        "gres": s.gres,
        "cpus_per_task": s.cpus_per_task,
        "mem_gb": s.mem_gb if s.mem_gb is not None else "(each node's whole)",
        "time": f"{hours}:{minutes:02d}:00" if s.time_min else "(the partition's limit)",
        "job_name": s.job_name or module.replace(".", "_"),
        **{f"additional.{k}": v for k, v in s.additional.items()},
    }
    job = ModuleJob(module, job_argv(argv), str(Path(workdir or os.getcwd()).resolve()), s, sys.executable)
    return "".join(
        [
            f"# dry run: launcher={s.name} would submit one SLURM job (nothing submitted):\n",
            "#   " + " ".join(f"{k}={v}" for k, v in resources.items() if v is not None) + "\n",
            f"#   requeued after up to {s.max_num_timeout} time-outs (USR2 {s.signal_delay_s} s before the end); "
            f"log: {Path(s.log_dir) / '<job id>'}/\n",
            *(f"#   setup: {line}\n" for line in s.setup),
            f"#   the job runs (in {job.workdir}): {shlex.join(job.command())}\n",
        ]
    )


def submit_module(module: str, argv: Sequence[str], launcher_cfg: Any, *, workdir: str | None = None):
    """Submit `python -m MODULE ARGV` (launcher overrides replaced by launcher=local) as a SLURM job;
    return the submitit job."""
    import shutil

    import submitit

    if shutil.which("sbatch") is None:
        raise UserError(
            "launcher=slurm_h100 needs SLURM's sbatch on PATH and there is none here: submit from a login node of "
            "the cluster, or run here with launcher=local"
        )
    try:
        s = settings(launcher_cfg)
    except ValueError as err:
        raise UserError(str(err)) from err
    s = partitions.resolve(s, partitions.cluster_partitions())
    folder = Path(s.log_dir) / "%j"
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=s.max_num_timeout)
    executor.update_parameters(**executor_parameters(replace(s, job_name=s.job_name or module.replace(".", "_"))))
    job = ModuleJob(module, job_argv(argv), str(Path(workdir or os.getcwd()).resolve()), s, sys.executable)
    return executor.submit(job)


def submit(argv: Sequence[str], launcher_cfg: Any):
    """Submit `python -m sarl.train ARGV`."""
    return submit_module("sarl.train", argv, launcher_cfg)


def train_argv(argv: Sequence[str], cfg: Any) -> list[str]:
    """sarl.train's overrides for the job: the trainer's node and GPU counts follow the allocation when the
    launcher's (possibly from the environment) differ from train.nnodes / train.n_gpus_per_node."""
    s = settings(cfg.launcher)
    extra = []
    if s.nodes != int(cfg.train.nnodes):
        extra.append(f"train.nnodes={s.nodes}")
    if s.gpus_per_node and s.gpus_per_node != int(cfg.train.n_gpus_per_node):
        extra.append(f"train.n_gpus_per_node={s.gpus_per_node}")
    return [*argv, *extra]


def follow(job: Any, poll_s: float = 2.0, out: Any = None) -> None:
    """Print the job's log as it grows, until the job has ended (its whole log then printed): a job that waits in
    the queue is said to, once; nothing is silent for longer than the job itself is."""
    out = out or sys.stdout
    path = Path(str(job.paths.stdout))
    offset, queued = 0, False
    while True:
        done = job.done()
        if path.exists():
            with path.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            if chunk:
                out.write(chunk.decode(errors="replace"))
                out.flush()
        elif not queued and not done:
            print(f"job {job.job_id} is queued (squeue -j {job.job_id}); its log follows here once it starts", file=out)
            out.flush()
            queued = True
        if done:
            return
        time.sleep(poll_s)


def dispatch(module: str, argv: Sequence[str], launcher_cfg: Any) -> int:
    """Submit, print the job id and log paths; with launcher.wait, print the job's log as it grows (`follow`) until
    the job ends and return 0 if it succeeded (1 if not)."""
    print(f"submitting {module} to SLURM (launcher=slurm_h100) ...", flush=True)
    job = submit_module(module, argv, launcher_cfg)
    print(f"submitted {module} as SLURM job {job.job_id}\n  stdout: {job.paths.stdout}\n  stderr: {job.paths.stderr}")
    sys.stdout.flush()
    if not settings(launcher_cfg).wait:
        return 0
    follow(job)
    try:
        job.result()
        ok = True
    except Exception as err:  # submitit raises the job's failure here
        log.error("SLURM job %s failed: %s", job.job_id, err)
        ok = False
    stdout = Path(str(job.paths.stdout))
    print(f"SLURM job {job.job_id}: {'succeeded' if ok else 'failed'} (log: {stdout})")
    return 0 if ok else 1
