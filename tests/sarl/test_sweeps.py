"""Every W&B sweep in sweeps/ expands (grid) into `python -m sarl.train` commands whose Hydra overrides compose,
land on the configured back end and, on verl, build a verl trainer config that verl's own validation accepts,
with the swept value in place."""

import itertools
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from sarl.launch.compose import compose_train_config
from sarl.runtime.runs import experiment_name
from sarl.structure.steps import parse_steps
from sarl.train import check_supported

pytest.importorskip("verl")
from sarl.backends.verl.config import build_verl_config, validate_verl_config  # noqa: E402

SWEEPS_DIR = Path(__file__).resolve().parents[2] / "sweeps"
SWEEPS = sorted(p.name for p in SWEEPS_DIR.glob("*.yaml"))


def load_sweep(name: str) -> dict:
    return yaml.safe_load((SWEEPS_DIR / name).read_text(encoding="utf-8"))


def grid(sweep: dict) -> list[dict]:
    """W&B's grid: the cartesian product of every parameter's `values`; a `value` is fixed."""
    names, choices = [], []
    for name, spec in sweep["parameters"].items():
        if "values" in spec:
            choices.append(list(spec["values"]))
        elif "value" in spec:
            choices.append([spec["value"]])
        else:
            raise AssertionError(f"parameter {name!r} has neither `values` nor `value` (a grid needs one)")
        names.append(name)
    return [dict(zip(names, combo)) for combo in itertools.product(*choices)]


def command_line(sweep: dict, params: dict) -> list[str]:
    """The argv a W&B agent runs: ${env} dropped, ${interpreter} -> python, ${args_no_hyphens} -> key=value."""
    argv = []
    for part in sweep["command"]:
        if part == "${env}":
            continue
        if part == "${interpreter}":
            argv.append("python")
        elif part == "${args_no_hyphens}":
            argv.extend(f"{k}={v}" for k, v in params.items())
        else:
            assert "${" not in str(part), f"unsupported W&B macro {part!r}"
            argv.append(str(part))
    return argv


def test_every_axis_of_the_issue_has_a_sweep():
    swept = {k for name in SWEEPS for k in load_sweep(name)["parameters"] if len(grid(load_sweep(name))) > 1}
    assert {"reward", "reward.clustering", "reward.k_rule", "reward.delimiter", "seed"} <= swept
    ablation = load_sweep("reward_ablation.yaml")["parameters"]["reward"]["values"]
    assert ablation == ["sarl", "sarl_c_only", "sarl_l_only"]


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_is_a_wandb_grid_calling_sarl_train(name):
    sweep = load_sweep(name)
    assert sweep["method"] == "grid"
    assert sweep["name"]
    cmd = sweep["command"]
    assert cmd[:4] == ["${env}", "${interpreter}", "-m", "sarl.train"]
    assert cmd.count("${args_no_hyphens}") == 1
    # the experiment is pinned either in the command or as a swept parameter, exactly once
    exp = [c for c in cmd if str(c).startswith("+exp=")] + [k for k in sweep["parameters"] if k == "+exp"]
    assert len(exp) == 1, f"{name}: pin +exp once (command literal or parameter)"
    for value in (v for combo in grid(sweep) for v in combo.values()):
        assert not isinstance(value, bool), "W&B writes booleans as True/False; put them in the command instead"


def sweep_cases():
    for name in SWEEPS:
        sweep = load_sweep(name)
        for i, params in enumerate(grid(sweep)):
            yield pytest.param(name, params, id=f"{Path(name).stem}-{i}")


@pytest.mark.parametrize("name,params", list(sweep_cases()))
def test_every_combination_composes_and_validates_on_verl(name, params, tmp_path, tiny_qwen3_dir):
    sweep = load_sweep(name)
    argv = command_line(sweep, params)
    assert argv[:3] == ["python", "-m", "sarl.train"]
    overrides = argv[3:] + [f"model.path={tiny_qwen3_dir}"]
    cfg, choices = compose_train_config(overrides)
    check_supported(cfg, choices)
    # the swept values are the ones in the composed config
    for key, value in params.items():
        if key == "+exp":
            assert choices["exp"] == value
        elif key in ("reward", "algorithm", "data", "model", "embedding", "backend"):
            assert choices[key] == value
        else:
            assert OmegaConf.select(cfg, key) == value, f"{key}: {OmegaConf.select(cfg, key)!r} != {value!r}"
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    vcfg = build_verl_config(cfg, reward_cfg, str(tmp_path), experiment_name(choices))
    validate_verl_config(vcfg)
    assert vcfg.data.seed == cfg.seed


def test_ablation_variants_reach_the_reward():
    sweep = load_sweep("reward_ablation.yaml")
    variants = []
    for params in grid(sweep):
        cfg, _ = compose_train_config(command_line(sweep, params)[3:])
        variants.append(cfg.reward.variant)
        assert cfg.reward.clustering == "kmeans"  # the math row's clustering (SARL Table 6) is kept
    assert variants == ["sarl", "c_only", "l_only"]


def test_delimiter_sweep_splits_steps_as_documented():
    """The swept delimiters arrive as regular expressions and cut a response as the sweep's comment says."""
    sweep = load_sweep("step_delimiter.yaml")
    text = "<think>Plan.\n\nCompute a.\nCompute b.\n  \nCheck.</think> 42"
    expected = {
        r"\n\n": ["Plan.", "Compute a.\nCompute b.\n  \nCheck."],
        r"\n": ["Plan.", "Compute a.", "Compute b.", "Check."],
        r"\n\s*\n": ["Plan.", "Compute a.\nCompute b.", "Check."],
    }
    seen = []
    for params in grid(sweep):
        cfg, _ = compose_train_config(command_line(sweep, params)[3:])
        assert cfg.reward.delimiter_regex is True
        re.compile(cfg.reward.delimiter)
        steps = parse_steps(text, cfg.reward.delimiter, cfg.reward.no_think, regex=True).steps
        assert steps == expected[cfg.reward.delimiter], cfg.reward.delimiter
        seen.append(cfg.reward.delimiter)
    assert seen == list(expected)
    # the regex default gives the plain-string default's steps
    assert parse_steps(text, "\n\n", "whole").steps == expected[r"\n\n"]


def test_k_rule_sweep_reaches_the_reward_with_its_documented_k():
    """Every swept rule lands in reward.k_rule on the KMeans math setting and gives the k the sweep's comment lists."""
    from sarl.structure.cluster import kmeans_k

    sweep = load_sweep("k_rule.yaml")
    comment = (SWEEPS_DIR / "k_rule.yaml").read_text(encoding="utf-8")
    rules = []
    for params in grid(sweep):
        cfg, choices = compose_train_config(command_line(sweep, params)[3:])
        assert choices["exp"] == "grpo_sarl_math" and cfg.reward.clustering == "kmeans"
        rule = cfg.reward.k_rule
        documented = re.search(rf"^#\s+{re.escape(rule)}\s.*M=12 -> (\d+), M=80 -> (\d+)$", comment, re.M)
        assert documented, f"{rule} has no worked values in the sweep's comment"
        assert (kmeans_k(12, rule=rule), kmeans_k(80, rule=rule)) == tuple(map(int, documented.groups()))
        rules.append(rule)
    assert rules[0] == "sqrt" and len(set(rules)) == len(rules) >= 4


# -- sweeps without a W&B server: the multirun (sarl.launch.sweep) ------------------------------------------------


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_runs_as_a_multirun_naming_each_run_as_the_wandb_agent_does(name, tiny_qwen3_dir, tmp_path):
    """`python -m sarl.train -m sweep.name=NAME` expands the same grid as W&B (same order, same overrides), and a
    point's name is the one `sarl.train` gives the W&B agent's run of that point (run directory and W&B name)."""
    from sarl.launch import sweep as sweeps
    from sarl.runtime.runs import wandb_env

    stem = Path(name).stem
    spec = load_sweep(name)
    points = sweeps.expand([f"sweep.name={stem}"])
    assert len(points) == len(grid(spec))
    for point, params in zip(points, grid(spec)):
        agent = command_line(spec, params)[3:]  # what the W&B agent runs: the file's command, its point's params
        assert set(agent) <= set(point) | {f"{k}={v}" for k, v in params.items()}
        assert {o for o in point if not o.startswith("sweep.")} == set(agent) - {f"sweep.name={stem}"}
        multirun_cfg, _ = compose_train_config([*point, f"model.path={tiny_qwen3_dir}"])
        agent_cfg, agent_choices = compose_train_config([*agent, f"model.path={tiny_qwen3_dir}"])
        label = sweeps.run_point(agent_cfg, agent_choices)
        assert label == (stem, multirun_cfg.sweep.point) == (stem, sweeps.point_label(params))
        assert "sweep.point" not in " ".join(agent)  # the agent's run finds its name from the sweep file
        agent_cfg.sweep.point = label[1]
        env = wandb_env(agent_cfg, "row", tmp_path)
        assert (env["WANDB_NAME"], env["WANDB_RUN_GROUP"]) == (f"{stem}/{label[1]}", stem)


def test_hydra_sweep_syntax_expands_lists_stay_values_and_a_bad_override_is_one_line():
    from sarl.launch import sweep as sweeps

    points = sweeps.expand(["+exp=smoke", "seed=0,1", "train.temperature=0.6,1.0", "reward.weights=[1,2]"])
    assert len(points) == 4 and all("reward.weights=[1,2]" in p for p in points)
    assert [p[-1] for p in points] == [
        "sweep.point='seed=0,train.temperature=0.6'",
        "sweep.point='seed=0,train.temperature=1.0'",
        "sweep.point='seed=1,train.temperature=0.6'",
        "sweep.point='seed=1,train.temperature=1.0'",
    ]
    assert all("sweep.name=multirun" in p for p in points)
    with pytest.raises(Exception, match="multirun: "):
        sweeps.expand(["seed=0,,"])
    with pytest.raises(Exception, match="sweeps/nope.yaml does not exist; choose one of: clustering"):
        sweeps.expand(["sweep.name=nope"])


@pytest.mark.slow
def test_a_small_grid_trains_here_and_each_point_has_its_own_named_run(policy_cache, tmp_path):
    """`python -m sarl.train -m +exp=smoke seed=0,1 ...`: both points train on CPU, one after another, each in
    runs/smoke/multirun/seed=N/<date>_<time> with its model; the SLURM launcher's dry run shows one job per point."""
    import subprocess
    import sys

    from testkit import REPO, smoke_small

    args = ["-m", "+exp=smoke", "seed=0,1", *smoke_small(), "backend.max_steps=1", "heldout=null", "logger=none",
            f"paths.root={tmp_path}", f"model.build.cache_dir={policy_cache}"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "sarl.train", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "multirun: 2 point(s) done" in proc.stderr
    base = tmp_path / "runs" / "smoke" / "multirun"
    assert sorted(p.name for p in base.iterdir()) == ["seed=0", "seed=1"]
    for point in ("seed=0", "seed=1"):
        (run,) = (base / point).iterdir()
        assert (run / "final" / "config.json").is_file()
        assert f"seed: {point[-1]}" in (run / "config.yaml").read_text()
    plan = subprocess.run([sys.executable, "-m", "sarl.train", *args, "launcher=slurm_h100", "train.dry_run=true"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert plan.stderr.count("would submit one SLURM job") == 2, plan.stderr[-3000:]
    jobs = [line for line in plan.stderr.splitlines() if line.startswith("#   the job runs")]
    assert len(jobs) == 2 and "seed=0" in jobs[0] and "seed=1" in jobs[1], plan.stderr[-3000:]
