"""The output formats more than one part of the project reads or writes: Structured Reasoning's step tags
(`tags`), GRP's graph blocks (`graph`) and DPO's preference pairs (`pairs`). The rewards score them, the data
pipeline builds them and the back ends redraw them; none of those imports another's module for it. Above the
grading helpers of `eval` (answers are read with them), below the baselines, data and back ends."""
