"""Benchmarks' tests as Python that raises on a failure, the ground truth `{"tests": SOURCE, "prelude": ..., "stdin":
...}` that `sarl.checking.code.sandbox` judges a program by (decisions §8):

- `tests`: run by the judge after the program, with the program's top-level names bound to it (plain values, or
  handles whose calls the program answers with plain data); each top-level `assert` is one test.
- `prelude`: run before the program (imports and helper functions of a HumanEval prompt, LiveCodeBench's imports);
  the program may redefine what it defines for its own use, the tests always see the prelude's. Empty for most sets.
- `stdin`: the program is a script that reads standard input (LiveCodeBench's stdin problems): the tests run it
  once per case through the judge's `run_program(stdin) -> stdout` (`sarl.checking.code.sandbox`).

One converter per source format: `pytest_to_tests` (KodCode's pytest files), `assert_tests` (MBPP's assert list),
`check_tests` (HumanEval's `check(candidate)`), `evalplus_tests` (EvalPlus's inputs/results loops), and
`livecodebench_tests` (LiveCodeBench's stdin/stdout and functional cases). A ValueError says why a row's tests
cannot be converted.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import pickle
import re
import zlib
from pathlib import Path
from typing import Any

PYTEST_SHIM = Path(__file__).with_name("pytest_shim.py").read_text(encoding="utf-8")
BUILTIN_FIXTURES = frozenset({"capsys", "tmp_path"})  # those pytest_shim provides
SOLUTION_MODULE = "solution"  # KodCode's tests import the function under test `from solution import ...`

# EvalPlus's `assertion` helper compares floats with numpy; the sandbox has no numpy (no site-packages), so its
# `import numpy as np` becomes this stand-in for the calls the helper makes (np.allclose as numpy defines it).
NUMPY_STANDIN = """
class _NumpyStandIn:
    class ndarray:
        pass

    float64 = float32 = float

    @staticmethod
    def _flat(x):
        if isinstance(x, (list, tuple)):
            return [y for item in x for y in _NumpyStandIn._flat(item)]
        return [x]

    @staticmethod
    def allclose(a, b, rtol=1e-05, atol=1e-08):
        a, b = _NumpyStandIn._flat(a), _NumpyStandIn._flat(b)
        if len(b) == 1 and len(a) > 1:
            b = b * len(a)
        if len(a) != len(b):
            return False
        return all(x == y or abs(x - y) <= atol + rtol * abs(y) for x, y in zip(a, b))

    isclose = allclose


np = _NumpyStandIn
"""
_NUMPY_IMPORT = re.compile(r"^import numpy as np[ \t]*$", re.MULTILINE)

# LiveCodeBench's import header (lcb_runner/evaluation/testing_util.py): put before every program it runs.
LCB_PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\nfrom heapq import *\n"
    "from bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\nfrom statistics import *\n"
    "from itertools import *\nfrom functools import *\nfrom operator import *\nfrom io import *\nfrom sys import *\n"
    "from json import *\nfrom builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\n"
    "import collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\nimport statistics\n"
    "import itertools\nimport functools\nimport operator\nimport io\nimport sys\nimport json\n"
    "sys.setrecursionlimit(50000)\n"
)

# stdin problems: the judge runs the program as a script once per case (`run_program(stdin) -> stdout`, given by
# sarl.checking.code.sandbox's judge); its output matches when the lines agree after stripping, token by token, numbers
# compared as decimals (LiveCodeBench's comparison). The comparison runs in the judge, never in the program's process.
STDIN_RUNNER = """
import decimal as _decimal


def _lcb_run(stdin):
    return run_program(stdin)


def _lcb_same(got, want):
    got, want = [g.strip() for g in got.strip().splitlines()], [w.strip() for w in want.strip().splitlines()]
    if got == want:
        return True
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        g, w = g.split(), w.split()
        if len(g) != len(w):
            return False
        for a, b in zip(g, w):
            if a != b:
                try:
                    if _decimal.Decimal(a) != _decimal.Decimal(b):
                        return False
                except _decimal.InvalidOperation:
                    return False
    return True


def _lcb_case(stdin, expected):
    return _lcb_same(_lcb_run(stdin), expected)
"""

# functional problems: each input line is one JSON argument of Solution().<func_name>; the result, a tuple as a
# list, equals the JSON output (LiveCodeBench's comparison).
CALL_RUNNER = """
import json as _json


def _lcb_call(func_name, inputs, expected):
    args = [_json.loads(line) for line in inputs.split("\\n") if line.strip()]
    got = getattr(Solution(), func_name)(*args)
    if isinstance(got, tuple):
        got = list(got)
    return got == _json.loads(expected)
"""


def gold(tests: str, prelude: str = "", stdin: bool = False) -> dict[str, Any]:
    """The ground truth of one problem; the tests must parse."""
    ast.parse(tests)
    if prelude:
        ast.parse(prelude)
    return {"tests": tests, "prelude": prelude, "stdin": bool(stdin)}


# ---------------------------------------------------------------------------------------------------------
# KodCode: a pytest file importing the function under test from `solution`
# ---------------------------------------------------------------------------------------------------------


class _Imports(ast.NodeTransformer):
    """`from solution import f` -> nothing (f is the program's), `import solution [as s]` -> a namespace of the
    program's names, `import pytest` / `from pytest import raises` -> the shim's."""

    def visit_Import(self, node: ast.Import) -> Any:
        out: list[ast.stmt] = []
        kept = []
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top == SOLUTION_MODULE:
                out.append(ast.parse(f"{alias.asname or top} = _types.SimpleNamespace(**globals())").body[0])
            elif top == "pytest":
                if alias.asname and alias.asname != "pytest":
                    out.append(ast.parse(f"{alias.asname} = pytest").body[0])
            else:
                kept.append(alias)
        if kept:
            out.insert(0, ast.Import(names=kept))
        return out or ast.Pass()

    def visit_ImportFrom(self, node: ast.ImportFrom) -> Any:
        module = (node.module or "").split(".")[0]
        if module == SOLUTION_MODULE and not node.level:
            renames = [f"{a.asname} = {a.name}" for a in node.names if a.asname and a.asname != a.name]
            return [ast.parse(line).body[0] for line in renames] or ast.Pass()
        if module == "pytest":
            return [ast.parse(f"{a.asname or a.name} = pytest.{a.name}").body[0] for a in node.names] or ast.Pass()
        return node


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target)


def _parametrized_names(function: ast.FunctionDef) -> set[str]:
    names: set[str] = set()
    for d in function.decorator_list:
        if isinstance(d, ast.Call) and _decorator_name(d).endswith("mark.parametrize") and d.args:
            first = d.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.update(n.strip() for n in first.value.split(",") if n.strip())
            elif isinstance(first, (ast.List, ast.Tuple)):
                names.update(e.value for e in first.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return names


def _is_fixture(function: ast.FunctionDef) -> bool:
    return any(_decorator_name(d).split(".")[-1] == "fixture" for d in function.decorator_list)


def _arguments(function: ast.FunctionDef, method: bool) -> list[str]:
    names = [a.arg for a in function.args.posonlyargs + function.args.args]
    return names[1:] if method else names


def pytest_to_tests(source: str) -> str:
    """A KodCode pytest file as tests that raise on a failure: the pytest stand-in (`pytest_shim.py`), the file
    with its `solution` and `pytest` imports replaced, then `assert _pytest_passes(test)` for every test
    function and every test method of a `Test*` class, in file order (each one test of the sandbox's count).
    ValueError: no tests, or a test that asks for a fixture neither the file nor the stand-in provides."""
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError) as err:
        raise ValueError(f"the test file does not parse: {err}") from err
    fixtures = {f.name for f in module.body if isinstance(f, ast.FunctionDef) and _is_fixture(f)}
    calls: list[str] = []

    def collect(function: ast.FunctionDef, call: str, method: bool) -> None:
        missing = set(_arguments(function, method)) - _parametrized_names(function) - fixtures - BUILTIN_FIXTURES
        if missing:
            raise ValueError(
                f"{function.name} asks for the pytest fixture(s) {sorted(missing)}, which are not provided"
            )
        calls.append(f"assert _pytest_passes({call}), {call!r}")

    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and not _is_fixture(node):
            collect(node, node.name, method=False)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    collect(item, f"{node.name}().{item.name}", method=True)
    if not calls:
        raise ValueError("the test file has no test functions (test*) or Test* classes")
    body = ast.unparse(ast.fix_missing_locations(_Imports().visit(module)))
    return gold_tests(PYTEST_SHIM, body, "\n".join(calls))


def gold_tests(*parts: str) -> str:
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip()) + "\n"


# ---------------------------------------------------------------------------------------------------------
# MBPP, HumanEval, EvalPlus
# ---------------------------------------------------------------------------------------------------------


def assert_tests(asserts: list[str], setup: str | list[str] | None = None) -> str:
    """MBPP: its setup code (`test_setup_code`, or the sanitized set's `test_imports`) and its assert lines."""
    setup_text = "\n".join(setup) if isinstance(setup, list) else (setup or "")
    if not asserts:
        raise ValueError("no assert lines")
    return gold_tests(setup_text, "\n".join(asserts))


def prompt_prelude(prompt: str, entry_point: str) -> str:
    """A HumanEval prompt without the function to be written: its imports and helper functions (HumanEval/10's
    `is_palindrome`, /32's `poly`), which the program may use without repeating them."""
    try:
        module = ast.parse(prompt)
    except SyntaxError as err:
        raise ValueError(f"the prompt does not parse: {err}") from err
    kept = [n for n in module.body if not (isinstance(n, ast.FunctionDef) and n.name == entry_point)]
    if len(kept) == len(module.body):
        raise ValueError(f"the prompt does not define the entry point {entry_point!r}")
    kept = [n for n in kept if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return ast.unparse(ast.Module(body=kept, type_ignores=[])) + "\n" if kept else ""


def check_tests(test: str, entry_point: str) -> str:
    """HumanEval (and HumanEval+): its `test` source, which defines `check(candidate)`, then `check(<entry>)`."""
    if not entry_point.isidentifier():
        raise ValueError(f"entry point {entry_point!r} is not a Python name")
    return gold_tests(without_numpy(test), f"check({entry_point})")


def without_numpy(test: str) -> str:
    """EvalPlus's tests with `import numpy as np` replaced by `NUMPY_STANDIN`."""
    return _NUMPY_IMPORT.sub(lambda _: NUMPY_STANDIN.strip("\n"), test)


def evalplus_tests(test: str, imports: list[str] | None = None) -> str:
    """MBPP+: its `test_imports` and its `test` (top-level loops over inputs and expected results)."""
    return gold_tests("\n".join(imports or []), without_numpy(test))


# ---------------------------------------------------------------------------------------------------------
# LiveCodeBench
# ---------------------------------------------------------------------------------------------------------


class _TextOnly(pickle.Unpickler):
    """LiveCodeBench's private cases are a pickled JSON string: unpickle plain data, never a class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: the cases are plain text")


def lcb_cases(value: Any) -> list[dict[str, Any]]:
    """LiveCodeBench test cases ([{"input", "output", "testtype"}]) from their JSON text, or from the
    base64(zlib(pickle(JSON))) text of the private cases of code_generation_lite."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str) or not value.strip():
        return []
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        pass
    try:
        text = _TextOnly(io.BytesIO(zlib.decompress(base64.b64decode(value)))).load()
        return json.loads(text)
    except Exception as err:  # base64, zlib, pickle and JSON errors alike: the cell is unreadable
        raise ValueError(f"test cases are neither JSON nor LiveCodeBench's compressed form ({err})") from err


def livecodebench_tests(public: Any, private: Any, metadata: Any) -> dict[str, Any]:
    """The ground truth of a LiveCodeBench problem from its public and private cases: stdin problems run the
    script per case (`STDIN_RUNNER`), functional ones call `Solution().<metadata func_name>` (`CALL_RUNNER`)."""
    cases = lcb_cases(public) + lcb_cases(private)
    if not cases:
        raise ValueError("no test cases")
    kinds = {c.get("testtype") for c in cases}
    if kinds == {"stdin"}:
        asserts = [f"assert _lcb_case({c['input']!r}, {c['output']!r}), 'case {n}'" for n, c in enumerate(cases)]
        return gold(gold_tests(STDIN_RUNNER, "\n".join(asserts)), LCB_PRELUDE, stdin=True)
    if kinds == {"functional"}:
        meta = json.loads(metadata) if isinstance(metadata, str) and metadata.strip() else (metadata or {})
        func = meta.get("func_name") if isinstance(meta, dict) else None
        if not isinstance(func, str) or not func.isidentifier():
            raise ValueError("a functional problem without metadata.func_name")
        asserts = [
            f"assert _lcb_call({func!r}, {c['input']!r}, {c['output']!r}), 'case {n}'" for n, c in enumerate(cases)
        ]
        return gold(gold_tests(CALL_RUNNER, "\n".join(asserts)), LCB_PRELUDE)
    raise ValueError(f"test types {sorted(map(str, kinds))}: expected all stdin or all functional")
