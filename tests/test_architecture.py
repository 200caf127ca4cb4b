"""The architecture as the tree holds it (docs/design.md "Layers"): the layers and who may import whom, no import
cycles, no re-exports, a root of entry points, files of one responsibility.

The import graph has an edge A -> B for every `import B` / `from B import x` in A, at module level or inside a
function (a deferred import still ties the two modules together: `sarl.train` importing the TRL runner
lazily while the runner imports `sarl.train` back is a cycle all the same). Read with `ast`: nothing is
imported.
"""

import ast
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sarl", "baselines", "eval", "slurm")

# Bottom to top. A module may import its own unit and the units of lower layers, nothing else: two units of one
# layer never import each other (the structure reward and the run machinery; the two back ends), and no import,
# deferred or not, climbs. A module belongs to the unit of its longest matching prefix. docs/design.md draws it.
LAYERS: list[dict[str, tuple[str, ...]]] = [
    {"contract": ("sarl.contract",)},
    {"structure reward": ("sarl.structure",), "run machinery": ("sarl.runtime",)},
    {"checking": ("sarl.checking",), "serving": ("sarl.serving",), "slurm": ("slurm",)},
    {"formats": ("sarl.formats",)},
    {"baselines": ("baselines",)},
    {"data": ("sarl.data", "sarl.smoke"), "reports": ("sarl.reports",)},
    {"trl back end": ("sarl.backends.trl",), "verl back end": ("sarl.backends.verl",), "backends": ("sarl.backends",)},
    {"launch": ("sarl.launch",)},
    {"entry points": ("sarl",), "bench": ("sarl.bench",), "eval": ("eval",)},
]
# The packages whose __init__ declares a public API: names loaded lazily from their defining modules
# (tests/test_public_api.py), not imported at module level.
PUBLIC_API = ("sarl", "baselines", "sarl/checking/grading")
ROOT_MODULES_MAX = 8  # sarl/*.py: the user-facing entry points
MODULE_LINES_MAX = 600


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages (a package is its __init__)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` refers to (`a.b.c` where c is an attribute of module a.b: a.b), or None."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import: resolve against the module's package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets.update(f"{base}.{a.name}" for a in node.names)
        graph[module] = {t for t in map(lambda n: _owner(n, modules), targets) if t and t != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_finds_a_deferred_import_cycle(tmp_path):
    (tmp_path / "sarl").mkdir()
    (tmp_path / "sarl" / "__init__.py").write_text("")
    (tmp_path / "sarl" / "train.py").write_text("def run():\n    from sarl.backends import runner\n")
    (tmp_path / "sarl" / "backends").mkdir()
    (tmp_path / "sarl" / "backends" / "__init__.py").write_text("")
    (tmp_path / "sarl" / "backends" / "runner.py").write_text("from ..train import run\n")
    (tmp_path / "sarl" / "util.py").write_text("import sarl.backends.runner\n")
    for package in ("baselines", "eval"):
        (tmp_path / package).mkdir()
    graph = import_graph(project_modules(tmp_path))
    assert graph["sarl.util"] == {"sarl.backends.runner"}
    assert find_cycle(graph) == ["sarl.backends.runner", "sarl.train", "sarl.backends.runner"]
    del graph["sarl.train"]
    assert find_cycle(graph) is None


def test_no_import_cycles():
    modules = project_modules()
    assert {"sarl.train", "sarl.runtime.runs", "baselines.lcs", "eval.run"} <= set(modules)
    cycle = find_cycle(import_graph(modules))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def unit_of(module: str) -> tuple[int, str]:
    """(layer index, unit name) of `module`: the unit whose prefix matches it longest."""
    best = None
    for i, layer in enumerate(LAYERS):
        for name, prefixes in layer.items():
            for p in prefixes:
                if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[2]):
                    best = (i, name, len(p))
    assert best is not None, f"{module} is in no layer: add its package to LAYERS (and to docs/design.md)"
    return best[0], best[1]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for a, deps in sorted(graph.items()):
        la, ua = unit_of(a)
        for b in sorted(deps):
            lb, ub = unit_of(b)
            if ub != ua and lb >= la:
                out.append(f"{a} ({ua}) imports {b} ({ub}): {'same layer' if lb == la else 'climbs a layer'}")
    return out


def package_tree(root: Path) -> None:
    """An empty package for each of PACKAGES under `root`: the fake trees the checks are tried on."""
    for package in PACKAGES:
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")


def test_layer_violations_are_found(tmp_path):
    package_tree(tmp_path)
    for sub in ("structure", "runtime", "backends", "backends/trl", "backends/verl"):
        (tmp_path / "sarl" / sub).mkdir()
        (tmp_path / "sarl" / sub / "__init__.py").write_text("")
    (tmp_path / "sarl" / "runtime" / "errors.py").write_text("")
    (tmp_path / "sarl" / "structure" / "reward.py").write_text("def f():\n    from sarl.runtime import errors\n")
    (tmp_path / "sarl" / "backends" / "trl" / "run.py").write_text("import sarl.backends.verl.config\n")
    (tmp_path / "sarl" / "backends" / "verl" / "config.py").write_text("from sarl.structure import reward\n")
    (tmp_path / "eval" / "run.py").write_text("")
    (tmp_path / "baselines" / "lcs.py").write_text("from eval import run\n")
    assert layer_violations(import_graph(project_modules(tmp_path))) == [
        "baselines.lcs (baselines) imports eval.run (eval): climbs a layer",
        "sarl.backends.trl.run (trl back end) imports sarl.backends.verl.config (verl back end): same layer",
        "sarl.structure.reward (structure reward) imports sarl.runtime.errors (run machinery): same layer",
    ]


def test_no_import_climbs_a_layer():
    """The structure reward imports nothing from the run machinery, the back ends, eval or baselines; the back
    ends do not import each other; nothing imports upwards."""
    violations = layer_violations(import_graph(project_modules()))
    assert not violations, "\n".join(violations)


def design_layers(text: str) -> list[set[str]]:
    """The packages of each row of docs/design.md's "Layers" table, bottom to top, as dotted prefixes."""
    rows = re.findall(r"^\| (\d+) [^|]*\| ([^|]*) \|", text.split("## Layers", 1)[1].split("\n## ", 1)[0], re.M)
    out: list[set[str]] = [set() for _ in rows]
    for number, cell in rows:
        for path in re.findall(r"`([^`]+)`", cell):
            path = path if "/" in path else "sarl/" + path  # `preflight.py` beside `sarl/train.py`
            dotted = path.removesuffix("/").removesuffix(".py").replace("/", ".")
            out[int(number)].add("sarl" if dotted.count(".") == 1 and path.endswith(".py") else dotted)
    return out


def test_the_design_card_draws_the_layers_the_test_holds():
    """docs/design.md's table of layers names, row by row, the packages of LAYERS (an entry point module as
    `sarl`): the drawing and the rule cannot drift apart."""
    drawn = design_layers((ROOT / "docs" / "design.md").read_text())
    held = [{p for prefixes in layer.values() for p in prefixes} for layer in LAYERS]
    assert drawn == held


def test_the_root_of_sarl_holds_only_entry_points():
    root = sorted(p.name for p in (ROOT / "sarl").glob("*.py"))
    assert len(root) <= ROOT_MODULES_MAX, root
    assert {"__init__.py", "train.py", "preflight.py", "score.py"} <= set(root)


def test_no_module_is_over_the_line_limit():
    long = {}
    for path in project_modules().values():
        n = len(path.read_text().splitlines())
        if n > MODULE_LINES_MAX:
            long[str(path.relative_to(ROOT))] = n
    assert not long, f"split these by responsibility (at most {MODULE_LINES_MAX} lines): {long}"


# Names every entry point module defines for itself (`python -m X` runs X.main; its --help text is X.USAGE), and the
# plain reference implementation of the clustering, which mirrors the compiled kernels name for name (tests hold
# each pair equal: tests/sarl/test_cluster_reference.py).
SAME_NAME_BY_ROLE = {"main", "run", "USAGE"}
MIRRORS = {"sarl/structure/reference.py"}


def public_definitions(root: Path = ROOT) -> dict[str, list[str]]:
    """Public top-level names (functions, classes, UPPER_CASE constants) -> the modules that define them."""
    found: dict[str, list[str]] = {}
    for path in project_modules(root).values():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
            else:
                continue
            for name in names:
                if not name.startswith("_"):
                    found.setdefault(name, []).append(path.relative_to(root).as_posix())
    return found


def test_each_public_name_is_defined_once():
    """Two modules defining one public name (a function, a class, a constant) leave a reader to guess which is meant
    and an import to pick the wrong one: each has one home, or a name of its own."""
    twins = {
        name: homes
        for name, homes in public_definitions().items()
        if name not in SAME_NAME_BY_ROLE and len([h for h in homes if h not in MIRRORS]) > 1
    }
    assert not twins, f"give each its own name, or import it from one home: {twins}"


def test_the_twin_finder_finds_a_twin(tmp_path):
    package_tree(tmp_path)
    (tmp_path / "sarl" / "a.py").write_text("LIMIT = 1\n\n\ndef load():\n    pass\n")
    (tmp_path / "eval" / "b.py").write_text("LIMIT = 2\n_load = 3\n\n\nclass load:\n    pass\n")
    found = public_definitions(tmp_path)
    assert found["LIMIT"] == ["sarl/a.py", "eval/b.py"] and found["load"] == ["sarl/a.py", "eval/b.py"]
    assert "_load" not in found


def test_one_home_per_name():
    """No re-exports: a package's __init__ imports nothing of the project at module level and has no __all__, and
    no module keeps an unused import of a project name (ruff's F401 silenced by `noqa`) except to run the imported
    modules' registrations. Every caller imports a name from the module that defines it."""
    for path in project_modules().values():
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "level", 0):
                continue
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if not any(n.split(".")[0] in PACKAGES for n in names):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            assert path.name != "__init__.py" or node.col_offset > 0, (
                f"{where}: a package __init__ re-exports; import the names from their modules"
            )
            assert "noqa: F401" not in lines[node.lineno - 1] or "register" in lines[node.lineno - 1], (
                f"{where}: an unused import of a project name (a re-export); import it where it is used"
            )
        if path.name == "__init__.py" and path.parent.relative_to(ROOT).as_posix() not in PUBLIC_API:
            assert "__all__" not in text, f"{path}: __all__ forwards names; import them from their modules instead"


# Imports at the top (docs/design.md "Layers"): a module's imports of the project are at module level, so that its
# first lines show what it depends on. An import stays inside a function only for a reason written on its line or
# the line above as `# deferred: REASON` (a measured import cost: "imports verl (~9 s)"; a real cycle: "cycle: X
# imports this module"), and such imports stay a small share of all.
DEFERRED_MARKER = re.compile(r"# deferred( \([^)]*\))?: \S")  # "# deferred: why", "# deferred (both): why"
DEFERRED_SHARE_MAX = 0.15


def project_imports(modules: dict[str, Path], root: Path = ROOT) -> tuple[int, list[tuple[str, int, bool]]]:
    """(module-level imports of the project, [(file, line, has a reason) for each import inside a function])."""
    top, deferred = 0, []
    for path in modules.values():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text, filename=str(path))
        import_lines = {
            i
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for i in range(n.lineno, n.end_lineno + 1)
        }

        def has_reason(node: ast.stmt) -> bool:
            """The marker on the statement's lines, or on the line above the run of imports it is part of."""
            above = node.lineno - 1
            while above in import_lines:
                above -= 1
            return any(DEFERRED_MARKER.search(line) for line in lines[max(above - 1, 0) : node.end_lineno])

        def visit(node: ast.AST, in_function: bool) -> None:
            nonlocal top
            for child in ast.iter_child_nodes(node):
                inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    names = [child.module or ""] if isinstance(child, ast.ImportFrom) else [a.name for a in child.names]
                    if getattr(child, "level", 0) or any(n.split(".")[0] in PACKAGES for n in names):
                        if not inside:
                            top += 1
                            continue
                        deferred.append((path.relative_to(root).as_posix(), child.lineno, has_reason(child)))
                visit(child, inside)

        visit(tree, False)
    return top, deferred


def test_deferred_imports_are_counted_and_need_a_reason(tmp_path):
    (tmp_path / "sarl").mkdir()
    (tmp_path / "sarl" / "__init__.py").write_text("")
    (tmp_path / "sarl" / "a.py").write_text(
        "import json\nfrom sarl import b\n\n\ndef f():\n    from sarl import c\n"
        "    # deferred: imports verl (~9 s)\n    from sarl import d\n"
        "    from . import e  # deferred: cycle: sarl.e imports this module\n    import os\n\n\n"
        "def g():\n    # deferred (both): imports torch\n    from sarl import f\n    import sarl.g\n\n"
        "    from sarl import h\n"
    )
    for package in ("baselines", "eval", "slurm"):
        (tmp_path / package).mkdir()
    top, deferred = project_imports(project_modules(tmp_path), tmp_path)
    assert top == 1
    assert deferred == [
        ("sarl/a.py", 6, False),
        ("sarl/a.py", 8, True),
        ("sarl/a.py", 9, True),
        ("sarl/a.py", 15, True),
        ("sarl/a.py", 16, True),
        ("sarl/a.py", 18, False),
    ]


def test_imports_of_the_project_are_at_module_level():
    top, deferred = project_imports(project_modules())
    share = len(deferred) / (top + len(deferred))
    assert share < DEFERRED_SHARE_MAX, f"{len(deferred)} of {top + len(deferred)} project imports are deferred"
    silent = [f"{file}:{line}" for file, line, reason in deferred if not reason]
    assert not silent, (
        "imports inside a function without a reason (`# deferred: why` on the line or the line above): "
        "move them to the top of the file, or say why they wait (an import cost, a cycle): " + ", ".join(silent)
    )


# The modules that configs name (`_target_`, `entry_module`, a format `parser`, ...) are imports too, made by
# Hydra or importlib at run time: each must exist (read with `ast`, nothing imported), and a config group's
# targets must come from the units that group is about.
DOTTED = re.compile(r"(?:sarl|baselines|eval|slurm)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
TARGET_OWNERS = {  # conf/ folder or key -> the module prefixes its dotted names may come from
    "reward/": ("sarl.structure", "baselines"),  # a reward: the SARL reward or a baseline's
    "embedding/": ("sarl.structure.embed", "sarl.serving"),  # an embedder: in process, or an embedding server's client
    "eval/": ("eval",),  # generators and judges of the evaluation
    "entry_module": ("sarl.backends",),  # a back end's entry point
    "recompose": ("sarl.backends",),  # a back end's second composition pass (sarl.launch.compose)
    "parser": ("sarl.formats",),  # the parser of an output format (sarl.launch.format_preflight)
    "adv_estimator_register": ("baselines",),  # a baseline's advantage estimator
    "pipeline_report": ("sarl.reports",),
}


def config_targets(conf: Path) -> list[tuple[str, str, str]]:
    """(file, dotted key, value) for every string value of conf/**/*.yaml that is a dotted name in the project."""
    out = []

    def walk(node: Any, key: str, file: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k), file)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]", file)
        elif isinstance(node, str) and DOTTED.fullmatch(node):
            out.append((file, key, node))

    for path in sorted(conf.rglob("*.yaml")):
        walk(yaml.safe_load(path.read_text()), "", path.relative_to(conf).as_posix())
    return out


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def target_problems(targets: list[tuple[str, str, str]], modules: dict[str, Path]) -> list[str]:
    out = []
    for file, key, value in targets:
        module = _owner(value, modules)
        attribute = value[len(module) + 1 :] if module else ""
        where = f"conf/{file}: {key}={value}"
        if module is None or "." in attribute or (attribute and attribute not in top_level_names(modules[module])):
            out.append(f"{where}: no such module or top-level name in the project")
            continue
        for owner, prefixes in TARGET_OWNERS.items():
            applies = file.startswith(owner) if owner.endswith("/") else key.rpartition(".")[2] == owner
            if applies and not any(module == p or module.startswith(p + ".") for p in prefixes):
                out.append(f"{where}: {owner} names modules of {', '.join(prefixes)}, not {module}")
    return out


def test_config_target_problems_are_found(tmp_path):
    package_tree(tmp_path)
    (tmp_path / "baselines" / "lcs.py").write_text("class LCSReward:\n    pass\n\n\ndef parse():\n    pass\n")
    (tmp_path / "eval" / "generate.py").write_text("def vllm_generator():\n    pass\n")
    (tmp_path / "conf" / "reward").mkdir(parents=True)
    (tmp_path / "conf" / "reward" / "lcs.yaml").write_text("_target_: baselines.lcs.LCSReward\n")
    (tmp_path / "conf" / "reward" / "bad.yaml").write_text("_target_: eval.generate.vllm_generator\n")
    (tmp_path / "conf" / "exp.yaml").write_text("format_check:\n  parser: baselines.lcs.parsed\nnote: sarl text\n")
    targets = config_targets(tmp_path / "conf")
    assert [t[1:] for t in targets] == [
        ("format_check.parser", "baselines.lcs.parsed"),
        ("_target_", "eval.generate.vllm_generator"),
        ("_target_", "baselines.lcs.LCSReward"),
    ]
    assert target_problems(targets, project_modules(tmp_path)) == [
        "conf/exp.yaml: format_check.parser=baselines.lcs.parsed: no such module or top-level name in the project",
        "conf/reward/bad.yaml: _target_=eval.generate.vllm_generator: reward/ names modules of sarl.structure, "
        "baselines, not eval.generate",
    ]


def test_configs_name_modules_that_exist_in_their_owners_units():
    targets = config_targets(ROOT / "conf")
    keys = {key.rpartition(".")[2] for _, key, _ in targets}
    assert {"_target_", "entry_module", "parser"} <= keys, keys
    problems = target_problems(targets, project_modules())
    assert not problems, "\n".join(problems)
