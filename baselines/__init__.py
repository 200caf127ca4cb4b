"""Baseline rewards behind the one reward interface (decisions §2): ground truth, TTRL, EMPO, EVOL-RL, DPO pairs;
and the other structure-aware methods of the papers: GRP/PASC-GRPO (GRP), LCS and MaxFlow (Structured Reasoning),
with a weighted-sum combinator for joint rewards."""
