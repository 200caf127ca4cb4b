"""Launchers: submit sarl.train / eval.run jobs (slurm.py) and a local SLURM cluster for tests (local_slurm.py)."""
