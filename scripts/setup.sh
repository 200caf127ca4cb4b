#!/usr/bin/env bash
# Idempotent CPU set-up: .venv with torch==2.13.0 (CPU wheel) and this project, editable, with
# its dev extra. A second run with unchanged requirements does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=".venv/.sarl-setup-$(cat pyproject.toml scripts/constraints-cpu.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setting up .venv (torch CPU wheel + sarl[dev]) ..." >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c scripts/constraints-cpu.txt torch==2.13.0
  .venv/bin/python -m pip install -q -c scripts/constraints-cpu.txt -e ".[dev]"
  rm -f .venv/.sarl-setup-*
  touch "$stamp"
fi
