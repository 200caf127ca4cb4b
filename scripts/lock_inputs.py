"""The sha256 of what requirements/{gpu,cpu}.lock are resolved from: pyproject.toml's requirements (dependencies and
every extra) and the CPU torch version. scripts/lock.sh writes it at the top of each lock; tests/test_lock.py
recomputes it, so a requirement edited without re-locking fails the tests.

Usage: python3 scripts/lock_inputs.py TORCH_CPU_VERSION
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def inputs_sha256(torch_cpu: str, pyproject: Path = PYPROJECT) -> str:
    project = tomllib.loads(pyproject.read_text())["project"]
    inputs = {
        "dependencies": project["dependencies"],
        "optional-dependencies": project.get("optional-dependencies", {}),
        "torch-cpu": torch_cpu,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 scripts/lock_inputs.py TORCH_CPU_VERSION")
    print(inputs_sha256(sys.argv[1]))
