#!/usr/bin/env bash
# The first GPU session, in one command from a login node of the cluster (docs/gpu.md section 3: estimated 1.5-2.5
# hours, not yet measured). What needs the network runs here; what needs GPUs goes to SLURM. Each step's output is in
# runs/gpu_session/<date>_<time>/NUMBER_NAME.log, its time on the console:
#   1. install: the stack of $LOCK (requirements/gpu.lock: the versions CI tests) and this package in $VENV, with a
#      Python 3.11 (the lock is resolved for it);
#   2. inputs: exactly the models and data sets the row trains with (`python -m sarl.launch.inputs --download
#      --no-eval`), into the Hugging Face cache (HF_HOME: one the GPU nodes share) and paths.data_dir (the held-out
#      sets eval.run reads later: the same command without --no-eval);
#   3. preflight: `sarl.preflight` of the row on a GPU node (srun): stack, driver, GPUs, memory plan, inputs;
#   4. row: the row itself, two steps, submitted through `launcher=slurm_h100` as any run is, then its final
#      checkpoint's weights checked;
#   5. one_gpu: the one-GPU suite (`pytest -m gpu -k "not several_gpus"`) on a GPU node (srun);
#   6. several_gpus: the several-GPU runs (tests/gpu/test_gpu_verl.py::test_verl_steps_on_several_gpus: a tensor-
#      parallel-2 rollout on 2 GPUs, then grpo_sarl_math on all 8 as the paper runs it) on a whole node (srun).
# Usage, from the checkout:
#   SARL_SLURM_PARTITION=h100 SARL_SLURM_ACCOUNT=proj42 scripts/gpu_session.sh
# The partition and account reach every step's srun and the row's launcher (unset: the cluster's default partition
# and your default account). STEPS="4 5" runs only those steps; SKIP_INSTALL=1 keeps an installed $VENV;
# SARL_PYTHON: the Python 3.11 that makes $VENV (default python3.11 on PATH; step 1 says how to get it);
# ROW (default grpo_sarl_math) and ROW_ARGS (more overrides of the row, steps 2-4); GPUS (default 8): the GPUs per
# node steps 3, 4 and 6 ask for; DATA_DIR (default data/): where the prepared sets go; SESSION_DIR (default
# runs/gpu_session): where the session's folder goes.
# CI rehearses steps 1-4 against a local SLURM cluster and a stand-in Hub, with the GPU lock and GPUS=0
# ROW_ARGS="backend=verl_cpu ..." (verl's trainer on the node's stack, without a GPU): tests/slurm/test_gpu_session.py.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-gpu}
LOCK=${LOCK:-requirements/gpu.lock}
STEPS=${STEPS:-"1 2 3 4 5 6"}
ROW=${ROW:-grpo_sarl_math}
ROW_ARGS=${ROW_ARGS:-}
GPUS=${GPUS:-8}
DATA_DIR=${DATA_DIR:-$PWD/data}
PYTHON=${SARL_PYTHON:-python3.11}  # the locks are resolved for Python 3.11 (numpy 2.3, pandas 3.1: >= 3.11)

check_python() {  # before anything is written: one line naming how to get Python 3.11 when it is not here
  local version
  if ! version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
    echo "gpu_session.sh: no Python 3.11 here ($PYTHON not found): the lock is resolved for 3.11; get it with \`module load python/3.11\` (most clusters), \`uv python install 3.11\` or \`conda create -p .py311 python=3.11\`, then SARL_PYTHON=/path/to/python3.11" >&2
    exit 2
  fi
  if [ "$version" != "3.11" ]; then
    echo "gpu_session.sh: $PYTHON is Python $version; $LOCK is resolved for 3.11: set SARL_PYTHON to a Python 3.11 (\`module load python/3.11\`, \`uv python install 3.11\`)" >&2
    exit 2
  fi
}

case " $STEPS " in *" 1 "*) [ "${SKIP_INSTALL:-0}" = 1 ] && [ -x "$VENV/bin/python" ] || check_python ;; esac
OUT="${SESSION_DIR:-$PWD/runs/gpu_session}/$(date +%Y-%m-%d_%H-%M-%S)"
mkdir -p "$OUT"
export SARL_GPU_TEST_DATA_DIR=${SARL_GPU_TEST_DATA_DIR:-$DATA_DIR}
PY="$VENV/bin/python"
read -r -a row_args <<<"$ROW_ARGS"
row=("+exp=$ROW" "paths.data_dir=$DATA_DIR" "${row_args[@]}")

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

on_node() {  # on_node GPUS MINUTES COMMAND...: the command as one task on one node of the cluster (srun)
  local gpus=$1 minutes=$2
  shift 2
  local args=(--nodes=1 --ntasks=1 "--time=$minutes")
  [ -n "${SARL_SLURM_PARTITION:-}" ] && args+=("--partition=$SARL_SLURM_PARTITION")
  [ -n "${SARL_SLURM_ACCOUNT:-}" ] && args+=("--account=$SARL_SLURM_ACCOUNT")
  if [ "$gpus" -gt 0 ]; then args+=("--gpus-per-node=$gpus" --cpus-per-task=$((gpus * 8))); fi
  [ "$gpus" -ge 8 ] && args+=(--exclusive)
  srun "${args[@]}" "$@"
}

install() {
  [ "${SKIP_INSTALL:-0}" = 1 ] && [ -x "$PY" ] && return 0
  [ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "$(grep -E '^torch==' "$LOCK")"  # torch first: the lock's build, on its own
  "$PY" -m pip install -q -r "$LOCK" && "$PY" -m pip install -q --no-deps -e .
}

train_row() {  # two steps of the row through the launcher, then its final checkpoint's weights
  "$PY" -m sarl.train "${row[@]}" "run_dir=$OUT/row" train.total_training_steps=2 train.save_freq=2 \
    launcher=slurm_h100 launcher.wait=true "launcher.gpus_per_node=$GPUS" launcher.time_min=120 \
    "launcher.log_dir=$OUT/slurm"
  "$PY" -c 'import sys; from pathlib import Path; from sarl.runtime.weights import weights_problem
problem = weights_problem(Path(sys.argv[1])); print(problem or f"{sys.argv[1]}: the weights are there and load"); sys.exit(1 if problem else 0)' "$OUT/row/final"
}

step 1 install install
step 2 inputs "$PY" -m sarl.launch.inputs --download --no-eval "${row[@]}"
step 3 preflight on_node "$GPUS" 30 "$PY" -m sarl.preflight "${row[@]}"
step 4 row train_row
step 5 one_gpu on_node 1 90 "$PY" -m pytest -m gpu -rA -k "not several_gpus" --basetemp="$OUT/one_gpu"
step 6 several_gpus on_node "$GPUS" 90 "$PY" -m pytest -m gpu -rA -k several_gpus --basetemp="$OUT/several_gpus"
echo "all steps passed; logs and run directories in $OUT"
