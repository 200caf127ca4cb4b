"""The embedded default run: a tiny Qwen3-architecture policy, shipped reasoning traces, CPU only.

`python -m sarl.train +exp=smoke` builds the policy from `conf/model/tiny_qwen3.yaml`
(tokenizer trained on the shipped traces, a short supervised warm start on them), then runs
GRPO with the real structure reward. The data files in `data/` are written by
`python -m sarl.smoke.make_data` (deterministic; regenerate and commit after changing it).
"""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
