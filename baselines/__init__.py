"""Baseline rewards behind the one reward interface: ground truth, TTRL, EMPO, EVOL-RL, and DPO pairs (SPEC 2)."""
