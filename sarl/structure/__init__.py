"""The structure reward (SARL) and what it is made of: steps, step embeddings, clustering and its kernels, the
reasoning map, small-world structure, its metrics and viewer, and the one reward interface every reward implements.

Imports nothing from the run machinery, the back ends, `eval` or `baselines` (docs/design.md, kept by a test)."""
