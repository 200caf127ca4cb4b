"""Sweeps without a W&B server: a grid of `sarl.train` runs as a Hydra-style multirun, here or through the project's
SLURM launcher, named as the W&B agent's runs of the same grid are.

    python -m sarl.train -m sweep.name=reward_ablation [KEY=VALUE ...]      # sweeps/reward_ablation.yaml's grid
    python -m sarl.train -m +exp=grpo_sarl_math reward=sarl,sarl_c_only seed=0,1   # Hydra's sweep syntax
    python -m sarl.train -m sweep.name=seeds launcher=slurm_h100                   # one SLURM job per point

`-m` (`--multirun`) expands the command line into its points, Hydra's way (`key=a,b` is a sweep, `key=[a,b]` one
list value; Hydra's own override parser reads them), and, with `sweep.name=NAME`, also the W&B grid of
`sweeps/NAME.yaml`: its command's fixed overrides and the cartesian product of its parameters (W&B's `grid`
method, parameters in the file's order). Each point then runs as one `sarl.train` command, one after another, or
is submitted as its own job when a launcher other than `local` is chosen.

Names. A point's run is named `<sweep>/<key=value,...>` by its swept keys: `sweep.point`, set by the multirun, or,
under `wandb agent` (which passes `sweep.name=NAME` from the sweep file's command and the point's parameters),
computed from the sweep file's parameter keys and this run's values of them. Both routes give the same name: the
run directory `<runs>/<exp>/<sweep>/<point>/<date>_<time>` and the W&B run's name (WANDB_NAME) and group
(WANDB_RUN_GROUP, the sweep).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from sarl.runtime.errors import UserError
from sarl.runtime.files import CONF_DIR

SWEEPS_DIR = CONF_DIR.parent / "sweeps"
MULTIRUN_FLAGS = ("-m", "--multirun")
GROUP_KEYS = ("reward", "algorithm", "data", "model", "embedding", "backend", "launcher", "logger")


def sweep_path(name: str) -> Path:
    path = SWEEPS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
        raise UserError(f"sweep.name={name}: sweeps/{name}.yaml does not exist; choose one of: {known}")
    return path


def load_sweep(name: str) -> dict[str, Any]:
    """sweeps/NAME.yaml, a W&B grid sweep calling `sarl.train`; a UserError for another method."""
    sweep = yaml.safe_load(sweep_path(name).read_text(encoding="utf-8"))
    if sweep.get("method") != "grid":
        raise UserError(f"sweeps/{name}.yaml: method {sweep.get('method')!r}; only W&B's grid method runs without W&B")
    return sweep


def grid(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """The points of a W&B grid: every combination of the parameters' `values` (a `value` is one), in order."""
    keys, choices = [], []
    for key, spec in sweep["parameters"].items():
        keys.append(key)
        choices.append(list(spec["values"]) if "values" in spec else [spec["value"]])
    return [dict(zip(keys, combo)) for combo in itertools.product(*choices)]


def fixed_overrides(sweep: dict[str, Any]) -> list[str]:
    """The overrides the sweep's command passes to every run (its words after `sarl.train`, W&B's macros left out)."""
    cmd = [str(c) for c in sweep["command"]]
    start = cmd.index("sarl.train") + 1
    return [c for c in cmd[start:] if not c.startswith("${")]


def value_text(value: Any) -> str:
    """A value as W&B's `${args_no_hyphens}` writes it on the command line."""
    return str(value)


def point_label(params: dict[str, Any]) -> str:
    """`key=value,...` of a point's swept keys (the exp file's `+exp` written as `exp`)."""
    return ",".join(f"{k.lstrip('+')}={value_text(v)}" for k, v in params.items())


def expand(args: list[str]) -> list[list[str]]:
    """The points of a multirun command line (without `-m`): each one's `sarl.train` arguments, with
    `sweep.name` and `sweep.point` set so that every point's run is named by what it sweeps."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    staged = [a for a in args if ":" in a.split("=", 1)[0]]  # STAGE:key=value overrides pass through as given
    try:
        parsed = OverridesParser.create().parse_overrides([a for a in args if a not in staged])
    except Exception as err:  # hydra's OverrideParseException: one line naming the argument
        raise UserError(f"multirun: {err}") from None
    given = {o.get_key_element(): o for o in parsed}
    name = str(given["sweep.name"].value()) if "sweep.name" in given else None
    axes: dict[str, list[str]] = {}  # key -> its values, in order: the sweep file's, then the command line's
    labelled: list[str] = []
    if name:
        sweep = load_sweep(name)
        for override in fixed_overrides(sweep):
            key, _, value = override.partition("=")
            axes[key] = [value]
        for key, spec in sweep["parameters"].items():
            axes[key] = [value_text(v) for v in (spec["values"] if "values" in spec else [spec["value"]])]
            labelled.append(key)  # the W&B agent's run names every parameter of the file (run_point)
    for key, o in given.items():
        if key in ("sweep.name", "sweep.point"):
            continue
        axes[key] = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        if o.is_sweep_override() and key not in labelled:
            labelled.append(key)
    points = []
    for combo in itertools.product(*axes.values()):
        pairs = dict(zip(axes, combo))
        label = point_label({k: pairs[k] for k in labelled}) or "default"
        points.append(
            [
                *(f"{k}={v}" for k, v in pairs.items()),
                *staged,
                f"sweep.name={name or 'multirun'}",
                f"sweep.point='{label}'",
            ]
        )  # fmt: skip (quoted: the label holds = and ,)
    return points


def run_subdir(experiment: str, name: str, point: str) -> str:
    """`<experiment>/<sweep>/<point>`: where under the runs directory a sweep's run goes (no `/` inside a part)."""
    return "/".join(part.replace("/", "_") for part in (experiment, name, point))


def run_point(cfg: DictConfig, choices: dict[str, Any]) -> tuple[str, str] | None:
    """(sweep name, point label) of this run, or None outside a sweep: `sweep.point` as the multirun set it, else
    (a W&B agent's run) the sweep file's parameters' values in this run."""
    name = cfg.get("sweep", {}).get("name") if cfg.get("sweep") else None
    if not name:
        return None
    if cfg.sweep.get("point"):
        return str(name), str(cfg.sweep.point)
    params = load_sweep(str(name))["parameters"]
    values = {}
    for key in params:
        bare = key.lstrip("+")
        if bare == "exp" or bare in GROUP_KEYS:
            values[key] = choices.get(bare)
        else:
            found = OmegaConf.select(cfg, bare, default=None)
            values[key] = OmegaConf.to_container(found) if OmegaConf.is_config(found) else found
    return str(name), point_label(values)
