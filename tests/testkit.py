"""Builders shared by the tests (importable from any test module: tests/ is on the path through tests/conftest.py).

- `tiny_qwen3`: the one tiny model of the tests, a Qwen3 of the smoke policy's shape (sarl.backends.trl.policy
  TINY_QWEN3) for a given tokenizer, as a config or with seeded random weights, optionally saved with the tokenizer.
- `verl_config_for`: a composed config and the verl config built from it, validated by the pinned verl.
- `verl_paper_rows`: the paper rows (conf/exp/ `paper:` blocks, sarl.rows) that run on the verl back end.
- `smoke_small`, `HELDOUT_SMALL`: the overrides that shrink the smoke run (`+exp=smoke`) for a test.
- `LoopbackServer`: a threading HTTP server on 127.0.0.1 in a daemon thread, what the fake endpoints run on.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Sequence


class LoopbackServer:
    """`handler` served by a threading HTTP server on 127.0.0.1 (`port` 0: a free one) in a daemon thread, started
    at once; `close()` stops it without waiting for handlers still at work (daemon threads, no block on close)."""

    def __init__(self, handler: type, port: int = 0) -> None:
        import threading
        from http.server import ThreadingHTTPServer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # handlers still sleeping must not hold teardown
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def smoke_small(response_length: int = 96) -> list[str]:
    """Overrides that shrink `+exp=smoke` for a test: 2 prompts x 4 rollouts a step, answers cut at
    `response_length` tokens. The number of steps and the held-out evaluation (`heldout=null`, or
    HELDOUT_SMALL) are each test's own."""
    return [
        "train.rollout_n=4",
        "train.train_batch_size=2",
        "train.ppo_mini_batch_size=2",
        "train.micro_batch_size_per_gpu=8",
        f"data.max_response_length={response_length}",
    ]


# the smoke run's held-out before/after evaluation at its smallest: 2 prompts x 2 samples
HELDOUT_SMALL = ["heldout.n_prompts=2", "heldout.samples_per_prompt=2", "heldout.bootstrap=100"]


def tiny_qwen3(tokenizer, path: str | Path | None = None, *, weights: bool = False, seed: int = 0, **architecture: Any):
    """A tiny Qwen3 for `tokenizer`: its `Qwen3Config` (TINY_QWEN3 with `architecture`'s keys replacing its
    entries), or with `weights` a `Qwen3ForCausalLM` with random weights drawn after `torch.manual_seed(seed)`.
    With `path`, it is saved there (config, or config and weights) with the tokenizer, so that it loads from the
    path as a checkpoint does."""
    from sarl.backends.trl.policy import qwen3_config

    config = qwen3_config(tokenizer, **architecture)
    built = config
    if weights:
        import torch
        from transformers import Qwen3ForCausalLM

        torch.manual_seed(seed)
        built = Qwen3ForCausalLM(config)
    if path is not None:
        built.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return built


def verl_config_for(overrides: Sequence[str], tmp_path, model_dir: str, *, validate: bool = True):
    """(cfg, verl config) of `overrides` (e.g. ["+exp=grpo_sarl_math"]) with the policy at `model_dir` (a local
    tiny checkpoint: verl's validation loads the model config and there is no hub here), the row checked as
    sarl.train checks it (`check_supported`) and, with `validate`, the verl config validated by verl."""
    from omegaconf import OmegaConf

    from sarl.backends.verl.config import build_verl_config, validate_verl_config
    from sarl.train import check_supported, compose_train_config, experiment_name

    cfg, choices = compose_train_config([*overrides, f"model.path={model_dir}"])
    check_supported(cfg, choices)
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    vcfg = build_verl_config(cfg, reward_cfg, str(tmp_path), experiment_name(choices))
    if validate:
        validate_verl_config(vcfg)
    return cfg, vcfg


@functools.cache
def verl_paper_rows() -> tuple[str, ...]:
    """The conf/exp/ runs that are a row of a paper table and whose composed config runs on verl."""
    from sarl.rows import paper_experiments
    from sarl.train import compose_train_config

    return tuple(e for e in paper_experiments() if compose_train_config([f"+exp={e}"])[0].backend.name == "verl")
