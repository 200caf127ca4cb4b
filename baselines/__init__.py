"""Baseline rewards behind the one reward interface (SPEC 2): ground truth, TTRL, EMPO, EVOL-RL, DPO pairs;
and the other structure-aware methods of the seeds: GRP/PASC-GRPO (seed 003), LCS and MaxFlow (seed 004),
with a weighted-sum combinator for joint rewards."""
