"""Evaluation, the harness at the top beside `sarl.train`: `python -m eval.run ckpt=...` (avg@k on the math benchmarks,
WildBench, lengths, truncation and structure statistics; SARL Sec. 4.1). Answers are graded by `sarl.checking.grading`,
programs judged by `sarl.checking.code`, judges asked through `sarl.checking.openai_client`: the checking the training
rewards share, one layer below.

Modules: data (benchmark parquet), generate (vLLM / OpenAI-compatible server / transformers), wildbench (judge prompt,
parsing, categories, WB Score), results (aggregation, tables, files, W&B), cache (resumable per-sample cache, atomic
writes), lm_eval_bridge (avg@k on lm-evaluation-harness tasks), code (the code benchmarks), run (the entry point) with
its parts: config (conf/eval.yaml composed, the run's names), protocol (the plan), responses (generation, its cache),
scoring (structure statistics, judging, per-benchmark scores) and select (the checkpoint a paper reports).
"""
