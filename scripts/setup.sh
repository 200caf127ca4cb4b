#!/usr/bin/env bash
# Idempotent CPU set-up: .venv with exactly the versions of requirements/cpu.lock (the GPU node's versions of
# every package, torch's CPU wheel; scripts/lock.sh) and this project, editable. A second run with unchanged
# requirements does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=".venv/.sarl-setup-$(cat pyproject.toml requirements/cpu.lock | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setting up .venv (requirements/cpu.lock + sarl, editable) ..." >&2
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first, on its own: the lock's CPU wheel (never the CUDA build that an unpinned torch would pull)
  .venv/bin/python -m pip install -q "$(grep -E '^torch==' requirements/cpu.lock)"
  .venv/bin/python -m pip install -q -r requirements/cpu.lock
  .venv/bin/python -m pip install -q --no-deps -e .
  rm -f .venv/.sarl-setup-*
  touch "$stamp"
fi
