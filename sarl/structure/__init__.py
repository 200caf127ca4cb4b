"""The structure reward (SARL) and what it is made of: steps, step embeddings, clustering and its kernels, the
reasoning map, small-world structure and its viewer. The reward interface it implements is `sarl.contract`.

Imports nothing from the run machinery, the back ends, `eval` or `baselines` (docs/design.md, kept by a test)."""
