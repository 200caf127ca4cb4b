"""Evaluation: answer grading (`eval.grading`), shared by the baseline rewards and the benchmarks."""
