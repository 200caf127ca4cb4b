"""`python -m sarl.bench`: dispatch on `suite` (conf/bench.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from sarl.bench.code_exec import run_code_exec
from sarl.bench.common import busy_load, machine, print_machine, thread_settings
from sarl.bench.grading import run_grading
from sarl.bench.maxflow import run_maxflow
from sarl.bench.smoke import run_smoke
from sarl.runtime.errors import UserError, report_user_errors

SUITES = (
    "structure",
    "grading",
    "reward_step",
    "embed_http",
    "maxflow",
    "smoke_effect",
    "smoke",
    "code_exec",
    "export",
)


def effective_config(cfg: DictConfig) -> DictConfig:
    """The suite's section, with quick mode's sizes merged over it."""
    if cfg.suite not in SUITES:
        raise UserError(f"conf/bench.yaml: suite={cfg.suite!r} is not valid; choose one of: {', '.join(SUITES)}")
    section = cfg[cfg.suite]
    if cfg.quick and cfg.suite in cfg.quick_sizes:
        section = OmegaConf.merge(section, cfg.quick_sizes[cfg.suite])
    return section


def run(cfg: DictConfig, console: Console, out_dir: Path | None = None) -> dict:
    """The suite once; with `load=N` (N >= 1) under N busy processes, and the structure suite idle first, then
    loaded, in one run (`idle` and `loaded` results); the smoke suite starts and stops its busy processes itself
    (idle and loaded repeats alternate)."""
    load = int(cfg.get("load", 0) or 0)
    if load < 0:
        raise UserError(f"load={load}: the number of busy processes beside the benchmark, 0 or more")
    if load and cfg.suite == "structure":
        idle = run_once(cfg, console, out_dir, 0)
        loaded = run_once(cfg, console, out_dir, load)
        summarize_load(console, idle["structure"], loaded["structure"], load)
        return {**loaded, "load": load, "structure": {"idle": idle["structure"], "loaded": loaded["structure"]}}
    return {**run_once(cfg, console, out_dir, 0 if cfg.suite == "smoke" else load), "load": load}


def summarize_load(console: Console, idle: dict, loaded: dict, load: int) -> None:
    """Each family and method's speed-up over the naive loop, idle and under load, side by side."""
    from rich.table import Table

    table = Table(title=f"structure stage: speed-up over the naive loop, idle and beside {load} busy processes")
    for col in ("family", "method", "idle ours ms", "idle speed-up", "loaded ours ms", "loaded speed-up"):
        table.add_column(col, justify="right")
    for a, b in zip(idle["rows"], loaded["rows"]):
        table.add_row(
            a["family"],
            a["method"],
            f"{a['ours_ms']:.3f}",
            f"{a['speedup']:.1f}x",
            f"{b['ours_ms']:.3f}",
            f"{b['speedup']:.1f}x",
        )
    console.print(table)


def run_once(cfg: DictConfig, console: Console, out_dir: Path | None, load: int) -> dict:
    section = effective_config(cfg)
    with busy_load(load, float(cfg.load_max_s), console):
        return _run_suite(cfg, section, console, out_dir)


def _run_suite(cfg: DictConfig, section: DictConfig, console: Console, out_dir: Path | None) -> dict:
    start = machine()
    print_machine(console, "start", start)
    with thread_settings(cfg.threads, console) as threads:
        if cfg.suite == "structure":
            # deferred: imports numba, scipy and scikit-learn; only the suite asked for is loaded
            from sarl.bench.structure import run_structure

            result = run_structure(section, console)
        elif cfg.suite == "grading":
            result = run_grading(section, console)
        elif cfg.suite == "reward_step":
            # deferred: imports numba, scipy and scikit-learn; only the suite asked for is loaded
            from sarl.bench.reward_step import run_reward_step

            result = run_reward_step(section, console, threads=cfg.threads)
        elif cfg.suite == "embed_http":
            # deferred: imports numba, scipy and scikit-learn; only the suite asked for is loaded
            from sarl.bench.embed_http import run_embed_http

            result = run_embed_http(section, console)
        elif cfg.suite == "code_exec":
            result = run_code_exec(section, console)
        elif cfg.suite == "export":
            # deferred: imports torch, transformers and verl's model merger; only the suite asked for is loaded
            from sarl.bench.export import run_export

            result = run_export(section, console)
        elif cfg.suite == "smoke_effect":
            # deferred: imports pandas; only the suite asked for is loaded
            from sarl.bench.smoke_effect import run_smoke_effect

            result = run_smoke_effect(section, console, out_dir=out_dir)
        elif cfg.suite == "smoke":
            load = int(cfg.get("load", 0) or 0)
            result = run_smoke(section, console, load=load, load_max_s=float(cfg.load_max_s), out_dir=out_dir)
        else:
            result = run_maxflow(section, console)
    end = machine()
    print_machine(console, "end", end)
    return {
        "suite": cfg.suite,
        "config": OmegaConf.to_container(section),
        "machine_start": start,
        "machine_end": end,
        "threads": threads,
        cfg.suite: result,
    }


@hydra.main(version_base="1.3", config_path="../../conf", config_name="bench")
@report_user_errors("sarl.bench")
def main(cfg: DictConfig) -> None:
    console = Console(width=170)
    out_dir = Path(hydra.core.hydra_config.HydraConfig.get().runtime.output_dir)
    results = run(cfg, console, out_dir)
    out = out_dir / "bench.json"
    out.write_text(json.dumps(results, indent=2, default=float))
    console.print(f"results in {out}")


if __name__ == "__main__":
    main()
