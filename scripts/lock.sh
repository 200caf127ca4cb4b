#!/usr/bin/env bash
# Resolve the two lock files from pyproject.toml (uv pip compile; uv is installed into a throw-away venv if absent):
#
#   requirements/gpu.lock  what a GPU node installs: sarl[gpu,dev] (verl[vllm], vLLM, the CUDA build of torch),
#                          for x86_64 Linux (manylinux_2_28), Python 3.11.
#   requirements/cpu.lock  what scripts/setup.sh and CI install: sarl[dev], every package at its gpu.lock version
#                          (gpu.lock is the constraint), except torch: the CPU wheel TORCH_CPU (gpu.lock's torch has
#                          no CPU build on PyPI). tests/test_lock.py fails when the two diverge otherwise.
#
# Each lock starts with the sha256 of the inputs it was resolved from; tests/test_lock.py fails when pyproject.toml's
# requirements changed since. Run after editing dependencies: `bash scripts/lock.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_CPU="2.13.0"
PLATFORM="x86_64-manylinux_2_28"
PYVER="3.11"

UV=${UV:-$(command -v uv || true)}
if [ -z "$UV" ]; then
  tools=$(mktemp -d)
  trap 'rm -rf "$tools"' EXIT
  python3 -m venv "$tools/venv" && "$tools/venv/bin/python" -m pip install -q uv
  UV="$tools/venv/bin/uv"
fi
inputs=$(python3 scripts/lock_inputs.py "$TORCH_CPU")
work=$(mktemp -d)

compile() {  # compile OUT [uv args...]
  local out=$1
  shift
  "$UV" pip compile pyproject.toml --python-version "$PYVER" --python-platform "$PLATFORM" --no-header \
    --no-emit-find-links --quiet "$@" -o "$work/body"
  {
    echo "# $(basename "$out"): written by scripts/lock.sh from pyproject.toml; do not edit by hand."
    echo "# inputs-sha256: $inputs"
    cat "$work/body"
  } >"$out"
}

compile requirements/gpu.lock --extra gpu --extra dev
grep -E '^[A-Za-z0-9_.-]+==' requirements/gpu.lock | grep -v '^torch==' >"$work/constraints.txt"
echo "torch==$TORCH_CPU" >"$work/override.txt"
compile requirements/cpu.lock --extra dev -c "$work/constraints.txt" --override "$work/override.txt" \
  --find-links "${TORCH_WHEELS:-/opt/wheels}"
# the constraint file's temporary path is not part of the lock
sed -i "s|-c $work/constraints.txt|-c requirements/gpu.lock|; s|--override $work/override.txt|torch: the CPU wheel|" \
  requirements/cpu.lock
rm -rf "$work"
echo "lock: requirements/gpu.lock ($(grep -cE '^[A-Za-z0-9_.-]+==' requirements/gpu.lock) packages)," \
  "requirements/cpu.lock ($(grep -cE '^[A-Za-z0-9_.-]+==' requirements/cpu.lock) packages)" >&2
