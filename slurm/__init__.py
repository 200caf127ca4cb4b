"""Everything cluster-facing.

- `slurm.launcher`: `launcher=slurm_h100`, which submits `sarl.train` / `eval.run` with submitit (one task per node,
  a Ray head and workers on several nodes, requeue on preemption and time-out).
- `slurm.node`: one node's part of a job started by plain `sbatch` (slurm/sbatch/*.sbatch): the same code as the
  submitit job runs on each node.
- `slurm.local_cluster`: a real single-node SLURM cluster on this machine, for the tests.
"""
