"""One node's part of a job started with plain `sbatch` (slurm/sbatch/verl_*.sbatch): the code the submitit job of
`launcher=slurm_h100` runs on each node (`slurm.launcher.ModuleJob.run_on_node`), with the job's shape read from
SLURM's environment instead of submitit's.

    python -m slurm.node [--folder DIR] [--ray-port 6379] [--ray-interface ib0] MODULE [OVERRIDES ...]

Run it once per node (`srun --ntasks-per-node=1 ...` on several nodes, directly in the batch script on one). On one
node it runs `python -m MODULE OVERRIDES launcher=local`; on several, node 0 starts a Ray head, publishes its
address in `--folder` (a directory every node sees), waits for the other nodes to join with their own
`--node-ip-address`, runs the driver with RAY_ADDRESS set and stops its Ray head by its process group; the other
nodes join the head and block while it is up. For `sarl.train` the trainer's `train.nnodes` and
`train.n_gpus_per_node` follow the allocation (SLURM_JOB_NUM_NODES, SLURM_GPUS_ON_NODE), as with submitit.

Run directory and resume: the driver is the same `sarl.train` command, so a requeued job (same SLURM_JOB_ID) finds
its run directory `..._j<jobid>` again and resumes from its last checkpoint; requeueing is the batch script's
(`scontrol requeue` on SLURM's warning signal) or SLURM's own (preemption), not this module's. SIGTERM (requeue,
preemption, scancel) stops the driver and the Ray head by their process groups and exits 143.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from sarl.runtime.signals import Terminated, signals_as_exceptions
from slurm.launcher import ModuleJob, SlurmSettings, job_argv

log = logging.getLogger("slurm.node")


def job_hosts(env: Mapping[str, str]) -> list[str]:
    """The job's node names in SLURM's order (node 0 first): `scontrol show hostnames $SLURM_JOB_NODELIST`."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise RuntimeError("SLURM_JOB_NODELIST is not set: run `python -m slurm.node` inside a SLURM job")
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def allocation_argv(module: str, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The driver's overrides: the launcher's replaced by `launcher=local` (slurm.launcher.job_argv) and, for
    sarl.train, the trainer's node and GPU counts set to the allocation's (`train.nnodes`, and
    `train.n_gpus_per_node` when the job has GPUs), as slurm.launcher.train_argv does for the submitit job."""
    out = job_argv(argv)
    if module != "sarl.train":
        return out
    out.append(f"train.nnodes={int(env.get('SLURM_JOB_NUM_NODES') or env.get('SLURM_NNODES') or 1)}")
    gpus = int(env.get("SLURM_GPUS_ON_NODE") or 0)
    if gpus:
        out.append(f"train.n_gpus_per_node={gpus}")
    return out


def node_settings(args: argparse.Namespace, env: Mapping[str, str]) -> SlurmSettings:
    """The settings the per-node code reads: Ray's port, interface and join timeout from the command line, the
    resources Ray announces from the allocation. signal_delay_s=0: a driver ended by SIGTERM fails at once (the
    batch script or SLURM requeues the job, not submitit)."""
    return SlurmSettings(
        name="sbatch",
        nodes=int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1),
        gpus_per_node=int(env.get("SLURM_GPUS_ON_NODE") or 0),
        cpus_per_task=int(env["SLURM_CPUS_PER_TASK"]) if env.get("SLURM_CPUS_PER_TASK") else None,
        signal_delay_s=0,
        ray_port=args.ray_port,
        ray_join_timeout_s=args.ray_join_timeout_s,
        ray_interface=args.ray_interface,
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m slurm.node", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--folder", help="multi-node: a directory every node sees (default: $SARL_ROOT/runs/slurm/<SLURM_JOB_ID>)"
    )
    p.add_argument("--ray-port", type=int, default=6379, help="the Ray head's port on node 0 (default 6379)")
    p.add_argument("--ray-interface", default=None, help="network interface Ray uses on every node (e.g. ib0)")
    p.add_argument("--ray-join-timeout-s", type=float, default=600, help="how long nodes wait for each other")
    p.add_argument("module", help="the module the driver runs: sarl.train or eval.run")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="its Hydra overrides")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s] %(message)s")
    env = os.environ if env is None else env
    args = parse_args(sys.argv[1:] if argv is None else argv)
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        log.error("SLURM_JOB_ID is not set: run `python -m slurm.node` inside a SLURM job (sbatch/srun)")
        return 2
    # where node 0 publishes the Ray head's address: conf/launcher/slurm_h100.yaml's log_dir (runs/slurm under the
    # paths.root default, SARL_ROOT or the working directory), one folder per job as submitit's
    folder = Path(args.folder or Path(env.get("SARL_ROOT") or ".") / "runs" / "slurm" / job_id)
    rank = int(env.get("SLURM_NODEID") or 0)
    hosts = job_hosts(env)
    if len(hosts) > 1:
        folder.mkdir(parents=True, exist_ok=True)
    job = ModuleJob(
        args.module,
        allocation_argv(args.module, args.overrides, env),
        os.getcwd(),
        node_settings(args, env),
        sys.executable,
    )
    try:
        with signals_as_exceptions():
            rc = job.run_on_node(rank, hosts, folder)
    except Terminated as err:
        log.error("%s: the run stopped, and its child processes with it", err)
        return err.exit_code
    except (RuntimeError, TimeoutError, ValueError) as err:  # the driver failed (log above), or the nodes did not meet
        log.error("%s", err)
        return 1
    if rank != 0:  # a worker's Ray ends when the head goes away: the job's status is the driver's
        log.info("Ray on node %d ended (%s)", rank, rc)
        return 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
