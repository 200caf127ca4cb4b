#!/usr/bin/env bash
# The first GPU session, in one command on one 8-GPU node (docs/gpu.md section 3: estimated 1.5-2.5 hours,
# not yet measured), each step's output in runs/gpu_session/<date>_<time>/:
#   1. the stack: requirements/gpu.lock (the versions CI tests) and this package in .venv-gpu;
#   2. the paper row's inputs: its data prepared, its policy and embedding model downloaded;
#   3. `sarl.preflight` of grpo_sarl_math on this node (stack, driver, GPUs, memory plan, embedding server);
#   4. the one-GPU suite (`pytest -m gpu -k "not several_gpus"`);
#   5. the several-GPU runs (tests/gpu/test_gpu_verl.py::test_verl_steps_on_several_gpus): a tensor-parallel-2
#      rollout on 2 GPUs, then grpo_sarl_math on all 8 as the paper runs it (Qwen3-4B, the embedding
#      server at Qwen3-Embedding-0.6B), two steps.
# Usage, from the checkout on a login node:
#   srun --nodes=1 --gpus-per-node=8 --exclusive --time=03:00:00 [-p PARTITION] [-A ACCOUNT] scripts/gpu_session.sh
# SKIP_INSTALL=1 keeps an installed .venv-gpu; STEPS="4 5" runs only those steps; SARL_PYTHON: the Python 3.11 that
# makes .venv-gpu (default python3.11 on PATH; the lock is resolved for 3.11, step 1 says how to get it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-gpu}
STEPS=${STEPS:-"1 2 3 4 5"}
PYTHON=${SARL_PYTHON:-python3.11}  # requirements/gpu.lock is resolved for Python 3.11 (numpy 2.3, pandas 3.1: >= 3.11)

check_python() {  # before anything is written: one line naming how to get Python 3.11 when it is not here
  local version
  if ! version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
    echo "gpu_session.sh: no Python 3.11 here ($PYTHON not found): the lock is resolved for 3.11; get it with \`module load python/3.11\` (most clusters), \`uv python install 3.11\` or \`conda create -p .py311 python=3.11\`, then SARL_PYTHON=/path/to/python3.11" >&2
    exit 2
  fi
  if [ "$version" != "3.11" ]; then
    echo "gpu_session.sh: $PYTHON is Python $version; requirements/gpu.lock is resolved for 3.11: set SARL_PYTHON to a Python 3.11 (\`module load python/3.11\`, \`uv python install 3.11\`)" >&2
    exit 2
  fi
}

case " $STEPS " in *" 1 "*) [ "${SKIP_INSTALL:-0}" = 1 ] && [ -x "$VENV/bin/python" ] || check_python ;; esac
OUT="runs/gpu_session/$(date +%Y-%m-%d_%H-%M-%S)"
mkdir -p "$OUT"
export SARL_GPU_TEST_DATA_DIR=${SARL_GPU_TEST_DATA_DIR:-$PWD/data}
PY="$VENV/bin/python"

step() {  # step NUMBER NAME COMMAND...: run it, its output in $OUT/NUMBER_NAME.log, its time on the console
  local number=$1 name=$2
  shift 2
  case " $STEPS " in *" $number "*) ;; *) return 0 ;; esac
  local start=$SECONDS
  echo "[$(date +%H:%M:%S)] step $number ($name): $*"
  if "$@" >"$OUT/${number}_${name}.log" 2>&1; then
    echo "[$(date +%H:%M:%S)] step $number ($name): done in $((SECONDS - start)) s"
  else
    echo "[$(date +%H:%M:%S)] step $number ($name): FAILED after $((SECONDS - start)) s; see $OUT/${number}_${name}.log" >&2
    exit 1
  fi
}

install() {
  [ "${SKIP_INSTALL:-0}" = 1 ] && [ -x "$PY" ] && return 0
  [ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -r requirements/gpu.lock && "$PY" -m pip install -q --no-deps -e .
}

inputs() {  # the paper row's data and models, as missing_paper_inputs names them
  "$PY" -m sarl.data.prepare dataset=aime_1983_2024 "paths.data_dir=$SARL_GPU_TEST_DATA_DIR"
  "$PY" -m sarl.data.prepare dataset=aime25 "paths.data_dir=$SARL_GPU_TEST_DATA_DIR"
  "$VENV/bin/hf" download Qwen/Qwen3-4B  # grpo_sarl_math's model (conf/model/qwen3_4b.yaml, SARL Sec. 4.1)
  "$VENV/bin/hf" download Qwen/Qwen3-Embedding-0.6B
}

step 1 install install
step 2 inputs inputs
step 3 preflight "$PY" -m sarl.preflight +exp=grpo_sarl_math "paths.data_dir=$SARL_GPU_TEST_DATA_DIR"
step 4 one_gpu "$PY" -m pytest -m gpu -rA -k "not several_gpus" --basetemp="$OUT/one_gpu"
step 5 several_gpus "$PY" -m pytest -m gpu -rA -k several_gpus --basetemp="$OUT/several_gpus"
echo "all steps passed; logs and run directories in $OUT"
