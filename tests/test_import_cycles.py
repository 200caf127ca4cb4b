"""No import cycles among the project's modules (sarl/, baselines/, eval/).

The graph has an edge A -> B for every `import B` / `from B import x` in A, at module level or inside a
function (a deferred import still ties the two modules together: `sarl.train` importing the TRL runner
lazily while the runner imports `sarl.train` back is a cycle all the same). Read with `ast`: nothing is
imported.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sarl", "baselines", "eval")


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
    assert {"sarl.train", "sarl.runs", "baselines.lcs", "eval.run"} <= set(modules)
    cycle = find_cycle(import_graph(modules))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
