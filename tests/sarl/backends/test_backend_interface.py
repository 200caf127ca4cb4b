"""The back ends behind one interface (sarl/backends/base.py): each conf/backend/*.yaml names, by `impl`, a class
with the interface's methods and signatures; sarl.train, sarl.preflight and sarl.launch.pipeline compare no back
end's name and import no back end; a reward brings its own preflight items through its class."""

import ast
import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sarl.backends.base import BACKEND_METHODS, Backend, backend_class, backend_for
from sarl.contract.reward import RewardFunction, reward_hooks
from sarl.launch.compose import compose_train_config
from sarl.runtime.errors import UserError

ROOT = Path(__file__).resolve().parents[3]
BACKENDS = sorted(p.stem for p in (ROOT / "conf" / "backend").glob("*.yaml"))
GENERIC = ("sarl/train.py", "sarl/preflight.py", "sarl/launch/pipeline.py")


def parameters(function) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


@pytest.mark.parametrize("name", BACKENDS)
def test_each_backend_config_names_an_implementation_of_the_interface(name):
    cfg, _ = compose_train_config(["+exp=smoke", f"backend={name}", "train.dry_run=true"])
    backend = backend_for(cfg)
    assert isinstance(backend, Backend)
    assert type(backend).__module__.startswith(f"sarl.backends.{name.split('_')[0]}."), type(backend)
    for method in BACKEND_METHODS:
        assert parameters(getattr(backend, method)) == parameters(getattr(Backend, method)), (name, method)


def test_a_backend_that_is_not_one_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"backend.impl='sarl.backends.base.Nothing': not an importable class"):
        backend_class("sarl.backends.base.Nothing")
    with pytest.raises(UserError, match=r"is not a back end: it lacks refuse, dry_run, cheap_checks, launch"):
        backend_class("sarl.runtime.checks.Check")
    cfg, _ = compose_train_config(["+exp=smoke", "~backend.impl"])
    with pytest.raises(UserError, match="backend=trl names no implementation: set backend.impl"):
        backend_for(cfg)


def backend_branches(source: str, names: tuple[str, ...]) -> list[str]:
    """Where `source` compares a value with a back end's name or with `backend.name`, reads `backend.cpu`, or
    imports a back end's own modules (sarl.backends.<name>)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                if isinstance(operand, ast.Constant) and operand.value in names:
                    out.append(f"line {node.lineno}: compares with {operand.value!r}")
                if isinstance(operand, ast.Attribute) and operand.attr == "name" and _is_backend(operand.value):
                    out.append(f"line {node.lineno}: compares backend.name")
        elif isinstance(node, ast.Attribute) and node.attr == "cpu" and _is_backend(node.value):
            out.append(f"line {node.lineno}: reads backend.cpu")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            owner = node.func.value
            key = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            if _is_backend(owner) and key == "cpu":
                out.append(f"line {node.lineno}: reads backend.cpu")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for module in modules:
                if any(module == f"sarl.backends.{n}" or module.startswith(f"sarl.backends.{n}.") for n in names):
                    out.append(f"line {node.lineno}: imports {module}")
    return out


def _is_backend(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "backend"


def test_the_branch_finder_finds_each_kind_of_branch():
    source = (
        "from sarl.backends.trl import run\nimport sarl.backends.verl.cpu\n"
        "if cfg.backend.name == 'trl':\n    pass\nif cfg.backend.get('cpu'):\n    pass\n"
        "x = 'verl' != backend\ny = cfg.backend.cpu\nz = cfg.backend.get('impl')\nsay(cfg.backend.name)\n"
    )
    assert sorted(backend_branches(source, ("trl", "verl"))) == [
        "line 1: imports sarl.backends.trl",
        "line 2: imports sarl.backends.verl.cpu",
        "line 3: compares backend.name",
        "line 3: compares with 'trl'",
        "line 5: reads backend.cpu",
        "line 7: compares with 'verl'",
        "line 8: reads backend.cpu",
    ]


@pytest.mark.parametrize("path", GENERIC)
def test_the_entry_points_ask_the_backend_instead_of_naming_it(path):
    """sarl.train reads compose -> check -> launch; the preflight and the pipeline ask the back end and the reward
    for their items: none names a back end, reads its name, or imports one of them or a baseline."""
    names = tuple(sorted({*BACKENDS, "trl", "verl"}))
    source = (ROOT / path).read_text()
    assert backend_branches(source, names) == [], path
    tree = ast.parse(source)
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m.split(".")[0] == "baselines"], (path, imported)


def test_a_reward_brings_its_own_preflight_items_through_its_class():
    """The code sandbox of a code reward nested in GRP (reward=grp_code) and the MaxFlow attention model come from
    the reward classes' hooks, found from the `_target_`s without building a reward."""
    from sarl.backends.verl import preflight as verl_preflight

    cfg, _ = compose_train_config(["+exp=smoke", "reward=grp_code"])
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    hooks = reward_hooks(reward_cfg, "preflight_checks")
    owners = [h.__self__.__name__ for h in hooks]
    assert owners == ["GRPReward"], owners  # GRP's is CodeExecReward's own hook: asked once
    assert [c.name for c in verl_preflight.reward_checks(reward_cfg)] == ["code sandbox"]
    cfg, _ = compose_train_config(["+exp=smoke", "reward=grp", "reward.outcome=code_exec"])  # no CodeExecReward node
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    assert [c.name for c in verl_preflight.reward_checks(reward_cfg)] == ["code sandbox"]
    cfg, _ = compose_train_config(["+exp=smoke", "reward=grp"])  # outcome=answer: nothing runs code
    assert verl_preflight.reward_checks(OmegaConf.to_container(cfg.reward, resolve=True)) == []
    assert verl_preflight.reward_checks({"_target_": "baselines.lcs.LCSReward"}) == []
    assert RewardFunction.preflight_checks({}) == [] and RewardFunction.gpu_memory_items({}, 1, "x", 8) == ({}, [])

    maxflow = {"_target_": "baselines.maxflow.reward.MaxFlowReward", "device": "cuda:1", "model": "/nonexistent"}
    combined = {"_target_": "baselines.combine.WeightedSumReward", "components": [maxflow]}
    by_gpu, problems = verl_preflight.reward_gpu_items(combined, 2, "2 reward workers", 1024)
    assert by_gpu == {} and [p.name for p in problems] == ["memory plan"]  # its config.json cannot be had here
    assert verl_preflight.reward_gpu_items(combined, 2, "x", 1024, skip_missing=True) == ({}, [])
    assert verl_preflight.reward_gpu_items({"_target_": "baselines.lcs.LCSReward"}, 2, "x", 1024) == ({}, [])
