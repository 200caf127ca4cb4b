"""Benchmarks, each measured in one run and printed with the machine, its load and the date.

    python -m sarl.bench                        # suite=structure: clustering + graph stage vs scikit-learn
    python -m sarl.bench suite=grading          # answer grading throughput and cheap rejections
    python -m sarl.bench suite=reward_step      # the reward stage of one paper training step on CPU
    python -m sarl.bench suite=embed_http       # HTTP embedding client vs the same model in-process
    python -m sarl.bench suite=maxflow          # MaxFlow step importance vs networkx
    python -m sarl.bench suite=smoke load=2     # the tiny policy idle vs beside 2 busy processes; first commands
    python -m sarl.bench quick=true             # tiny sizes (what the tests run)

Sizes live in conf/bench.yaml. Timings are medians of alternating repeats; no test asserts a timing.
"""
