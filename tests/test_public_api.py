"""The public API: `from sarl import ...`, `from baselines import ...`, `from sarl.checking.grading import ...` for
the names the README and CONTRIBUTING use; each name is the object its defining module holds, loaded on first use."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sarl", "baselines", "sarl.checking.grading")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_its_defining_module_s_object(package):
    module = importlib.import_module(package)
    assert module.__all__ == list(module._PUBLIC) and len(set(module.__all__)) == len(module.__all__)
    for name, home in module._PUBLIC.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name
        assert home.startswith(package + "."), (name, home)  # the package's own modules only
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        module.nope  # noqa: B018


def test_importing_the_packages_loads_nothing_else():
    """`import sarl` (every `python -m sarl.*` command does it) loads no reward, embedder or torch."""
    code = (
        "import sys, sarl, baselines, sarl.checking.grading; imported = ('sarl.checking', 'sarl.checking.grading'); "
        "print(sorted(m for m in sys.modules if m.startswith(('sarl.', 'baselines.')) and m not in imported "
        "or m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_documents_import_public_names_only():
    """Every `from sarl import ...` (baselines, sarl.checking.grading) in the README and CONTRIBUTING names a public
    name."""
    text = "".join((ROOT / name).read_text() for name in ("README.md", "CONTRIBUTING.md"))
    found = re.findall(r"^from (sarl|baselines|sarl\.checking\.grading) import ([\w, ]+)$", text, re.MULTILINE)
    assert found, "the README shows the library use"
    for package, names in found:
        public = importlib.import_module(package).__all__
        assert {n.strip() for n in names.split(",")} <= set(public), (package, names)


def test_the_readme_s_library_example_runs():
    code = re.search(r"`{3}python\n(.*?)`{3}", (ROOT / "README.md").read_text(), re.DOTALL).group(1)
    check = code + "\nassert 0 < out[0].score <= 1.5 and {'C', 'L', 'n_steps'} <= set(out[0].diagnostics)\n"
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
