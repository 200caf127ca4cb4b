"""Fixtures of the evaluation tests: defined in eval_helpers.py (which test modules import by that unique name)."""

from eval_helpers import (  # noqa: F401  (pytest finds fixtures by name in this module)
    chat_server,
    eval_data_dir,
    lm_eval_tasks,
    one_torch_thread,
    tiny_chat_model,
)
