"""Teacher-synthesised SFT sets for the methods whose papers fine-tune before RL (GRP, Structured Reasoning):
`python -m sarl.data.synthesize recipe=NAME ...` (docs/synthesize.md).

- `__main__`: the command line (Hydra overrides of conf/synthesize.yaml), its messages and exit codes.
- `config`: the paths of conf/, the composition of conf/synthesize.yaml and its recipes, the recipe checks.
- `inputs`: the prompt templates (conf/synthesize/prompts/) and the problems of a source.
- `teacher`: the OpenAI-compatible teacher client, its reachability check and the vLLM server of `url=auto`.
- `context`: the run's `Context` and the per-problem `Tally` every pipeline carries.
- `verify`: the answer, graph-format, LLM-verifier and tag checks of a synthesised trace.
- `grp`: GRP's recipe (Sec. 3.1.3, App. C-D): verified traces translated into reasoning graphs.
- `structured`: Structured Reasoning's recipe (App. E.1, A.14): tagged samples and their selection.
- `run`: one run: the pipelines over the problems, the cache, the selection and the outputs.
"""
