"""Evaluation: `python -m eval.run ckpt=...` (avg@k on the math benchmarks, WildBench, lengths, truncation and
structure statistics; SARL Sec. 4.1) and the answer grading shared with the baseline rewards (`eval.grading`).

Modules: grading (answers, equivalence, avg@k), data (benchmark parquet), generate (vLLM / OpenAI-compatible
server / transformers), wildbench (judge prompt, parsing, categories, WB Score), results (aggregation, tables,
files, W&B), cache (resumable per-sample cache, atomic writes), openai_client (retries, concurrency),
lm_eval_bridge (avg@k on lm-evaluation-harness tasks), run (the entry point) with its parts: config (conf/eval.yaml
composed, the run's names), protocol (the plan), responses (generation, its cache) and scoring (structure statistics,
judging, per-benchmark scores).
"""
