"""The parts of pytest that KodCode's test files use, as plain Python run in the sandbox before them.

`sarl.data.code_tests.pytest_to_tests` puts this file's text at the top of a converted test file: the sandbox runs
`python -I -S` without site-packages, so `import pytest` is not possible there. It provides `pytest.raises`,
`pytest.approx`, `pytest.mark.parametrize`, `pytest.param`, `pytest.fixture` (fixtures of the same file),
`pytest.skip`, the `skip` / `skipif` / `xfail` marks (the test is not run), other marks as no-ops, the `capsys` and
`tmp_path` fixtures, and `_pytest_passes(test)`: runs one test function (or bound method) once per parameter set
with its fixtures filled in; it returns True or raises what the test raised.
"""

import contextlib as _contextlib
import io as _io
import itertools as _itertools
import math as _math
import pathlib as _pathlib
import re as _re
import sys as _sys
import tempfile as _tempfile
import types as _types


class _Skipped(Exception):
    pass


class _RaisesContext:
    def __init__(self, expected, match=None):
        self.expected, self.match, self.value, self.type = expected, match, None, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected):
            return False
        if self.match is not None and not _re.search(self.match, str(value)):
            raise AssertionError(f"Regex pattern {self.match!r} does not match {str(value)!r}")
        self.value, self.type = value, kind
        return True


def _raises(expected, *args, match=None, **kwargs):
    context = _RaisesContext(expected, match)
    if not args:
        return context
    with context:
        args[0](*args[1:], **kwargs)
    return context


class _Approx:
    def __init__(self, expected, rel=None, abs=None):
        self.expected, self.rel, self.abs = expected, 1e-6 if rel is None else rel, 1e-12 if abs is None else abs

    def _close(self, got, want):
        if isinstance(want, dict):
            return (
                isinstance(got, dict) and got.keys() == want.keys() and all(self._close(got[k], want[k]) for k in want)
            )
        if isinstance(want, (list, tuple)):
            return (
                isinstance(got, (list, tuple))
                and len(got) == len(want)
                and all(self._close(g, w) for g, w in zip(got, want))
            )
        if isinstance(want, (int, float, complex)) and not isinstance(want, bool):
            if not isinstance(got, (int, float, complex)):
                return False
            if got == want:
                return True
            if isinstance(want, float) and _math.isinf(want):
                return False
            return abs(got - want) <= max(self.rel * abs(want), self.abs)
        return got == want

    def __eq__(self, other):
        return self._close(other, self.expected)

    def __repr__(self):
        return f"approx({self.expected!r})"


class _Param:
    def __init__(self, *values, marks=(), id=None):
        self.values = values
        self.skip = any(
            getattr(m, "_pytest_skip", False) for m in (marks if isinstance(marks, (list, tuple)) else [marks])
        )


def _parametrize(argnames, argvalues, indirect=False, ids=None, scope=None):
    names = [n.strip() for n in argnames.split(",") if n.strip()] if isinstance(argnames, str) else list(argnames)

    def mark(test):
        test.__dict__.setdefault("_pytest_params", []).insert(0, (names, list(argvalues)))
        return test

    return mark


class _SkipMark:
    _pytest_skip = True

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            args[0]._pytest_skip = True
            return args[0]
        return self


def _skipif(condition, *args, reason=None, **kwargs):
    def mark(test):
        if condition:
            test._pytest_skip = True
        return test

    return mark


class _NoMark:
    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return self


class _Marks:
    parametrize = staticmethod(_parametrize)
    skipif = staticmethod(_skipif)
    skip = _SkipMark()
    xfail = _SkipMark()

    def __getattr__(self, name):
        return _NoMark()


def _fixture(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        args[0]._pytest_fixture = True
        return args[0]

    def mark(function):
        function._pytest_fixture = True
        return function

    return mark


def _skip(reason=""):
    raise _Skipped(reason)


class _CapSys:
    def __init__(self):
        self._out, self._err = _io.StringIO(), _io.StringIO()
        self._saved = (_sys.stdout, _sys.stderr)
        _sys.stdout, _sys.stderr = self._out, self._err

    def readouterr(self):
        out, err = self._out.getvalue(), self._err.getvalue()
        self._out.seek(0), self._out.truncate(), self._err.seek(0), self._err.truncate()
        return _types.SimpleNamespace(out=out, err=err)

    def close(self):
        _sys.stdout, _sys.stderr = self._saved


pytest = _types.SimpleNamespace(
    raises=_raises, approx=_Approx, mark=_Marks(), param=_Param, fixture=_fixture, skip=_skip, fail=AssertionError
)


def _pytest_fixture_value(name, namespace, stack):
    if name == "capsys":
        capture = _CapSys()
        stack.callback(capture.close)
        return capture
    if name == "tmp_path":
        return _pathlib.Path(_tempfile.mkdtemp(dir="."))
    function = namespace.get(name)
    if not getattr(function, "_pytest_fixture", False):
        raise NameError(f"fixture {name!r} not found")
    code = function.__code__
    args = {a: _pytest_fixture_value(a, namespace, stack) for a in code.co_varnames[: code.co_argcount]}
    value = function(**args)
    if isinstance(value, _types.GeneratorType):
        generator, value = value, next(value)
        stack.callback(lambda: next(generator, None))
    return value


def _pytest_passes(test):
    """Run `test` once per parameter set, fixtures filled in; True, or the exception of the first failure."""
    if getattr(test, "_pytest_skip", False):
        return True
    function = getattr(test, "__func__", test)
    owner = getattr(test, "__self__", None)
    code = function.__code__
    wanted = code.co_varnames[int(owner is not None) : code.co_argcount]
    sets = [{}]
    for names, values in getattr(test, "_pytest_params", []):
        rows = []
        for value in values:
            if isinstance(value, _Param):
                if value.skip:
                    continue
                value = value.values if len(names) > 1 else value.values[0]
            rows.append(dict(zip(names, value if len(names) > 1 else (value,))))
        sets = [{**a, **b} for a, b in _itertools.product(sets, rows)]
    for kwargs in sets:
        with _contextlib.ExitStack() as stack:
            if owner is not None and hasattr(owner, "setup_method"):
                owner.setup_method(function)
            for name in wanted:
                if name not in kwargs:
                    kwargs[name] = _pytest_fixture_value(name, globals(), stack)
            try:
                test(**{k: v for k, v in kwargs.items() if k in wanted})
            except _Skipped:
                pass
            if owner is not None and hasattr(owner, "teardown_method"):
                owner.teardown_method(function)
    return True
