"""The one interface of a training back end, and the back end a config names.

`conf/backend/<name>.yaml` names its implementation by `impl` (a class, `module.Class`, built without arguments once
per run); `sarl.train` composes the config, asks the back end what it refuses and runs the checks, then launches:

    backend = backend_for(cfg)
    why = backend.refuse(cfg)                      # None, or why this back end cannot run the row (exit 2)
    backend.dry_run(cfg, choices, run_dir, argv)   # train.dry_run=true: its config on stdout, the command on stderr
    backend.cheap_checks(cfg, choices, run_dir)    # no network, no GPU, seconds: a failed one refuses the run
    backend.launch(cfg, choices, run_dir)          # the trainer, to its final model; the exit code
    backend.preflight(cfg, choices, stages)        # `python -m sarl.preflight`: every row of its table
    backend.stage_checks(cfg, run_dir, ...)        # a pipeline stage's own rows (a verl SFT stage's memory plan)

The back ends do not import this module (two units of one layer never import each other, tests/test_architecture.py):
they satisfy the protocol by their methods, and tests/sarl/backends/test_backend_interface.py holds each
`conf/backend/*.yaml` to it. A reward adds its own rows to a back end's checks through its class
(`RewardFunction.preflight_checks`, `gpu_memory_items` in sarl/contract/reward.py), read without building it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from omegaconf import DictConfig

from sarl.runtime.checks import Check
from sarl.runtime.errors import UserError


@runtime_checkable
class Backend(Protocol):
    """A trainer sarl.train can run a composed row on (conf/backend/*.yaml's `impl`)."""

    def refuse(self, cfg: DictConfig) -> str | None:
        """Why this back end cannot run `cfg` and what to choose instead (sarl.train raises UnsupportedOnBackend
        with it, exit 2), or None."""
        ...

    def dry_run(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path, overrides: list[str]) -> int:
        """`train.dry_run=true`: the trainer's config on stdout and the command on stderr; nothing is written or
        started. `overrides`: the command line's."""
        ...

    def cheap_checks(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path) -> list[Check]:
        """What sarl.train checks before `launch` (no network, no GPU, seconds): a failed one refuses the run with
        one line (PreflightError, exit 2). May raise UserError for what no check row can say."""
        ...

    def launch(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path) -> int:
        """The training run to its final model in `run_dir` (after `cheap_checks`); the exit code."""
        ...

    def preflight(self, cfg: DictConfig, choices: dict[str, Any], stages: list[Check]) -> list[Check]:
        """Every row of `python -m sarl.preflight`'s table for this row; `stages`: a pipeline row's stages' own
        rows (sarl.preflight composes the stages, each stage's back end checks it: `stage_checks`)."""
        ...

    def stage_checks(
        self, cfg: DictConfig, run_dir: Path, experiment: str, stage: str, allow_download: bool = True
    ) -> list[Check]:
        """The rows of one composed run `cfg` that are planned before its row runs (a verl SFT run's memory plan):
        a pipeline's stage `stage`, or the row itself (`stage` empty)."""
        ...


BACKEND_METHODS = ("refuse", "dry_run", "cheap_checks", "launch", "preflight", "stage_checks")


def backend_class(dotted: str) -> type:
    """The class `backend.impl` names (`module.Class`), checked against `Backend`; UserError if it cannot be
    imported or lacks a method."""
    module, _, name = dotted.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        cls = None
    if not isinstance(cls, type):
        raise UserError(f"backend.impl={dotted!r}: not an importable class (module.Class, e.g. conf/backend/verl.yaml)")
    missing = [m for m in BACKEND_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise UserError(
            f"backend.impl={dotted!r} is not a back end: it lacks {', '.join(missing)} (sarl.backends.base)"
        )
    return cls


def backend_for(cfg: DictConfig) -> Backend:
    """The back end `cfg.backend` names by `impl`, built for one run."""
    dotted = cfg.backend.get("impl")
    if not dotted:
        raise UserError(
            f"backend={cfg.backend.get('name')} names no implementation: set backend.impl to its class "
            "(module.Class, as conf/backend/verl.yaml does)"
        )
    return backend_class(str(dotted))()
