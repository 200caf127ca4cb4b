"""SFT traces (`data.sft_files`, TRL jsonl) as conversational prompt-completion rows, and the SFT max length: what
both back ends' SFT read. A row {"prompt": [...], "completion": [...]} is taken as it is, a row {"messages": [...]}
split before its last message (the target, an assistant turn)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sarl.runtime.errors import UserError
from sarl.runtime.files import read_jsonl


def sft_max_length(cfg: DictConfig) -> int:
    """`algorithm.max_length`, or prompt + response length when null."""
    if cfg.algorithm.get("max_length"):
        return int(cfg.algorithm.max_length)
    return int(cfg.train.max_prompt_length) + int(cfg.train.max_response_length)


def sft_rows(path: Path) -> list[dict[str, list[dict]]]:
    """The traces of `path` as conversational prompt-completion rows (module docstring); a malformed row is a
    UserError naming its line."""
    if not path.exists():
        raise UserError(f"data.sft_files={path} does not exist; write the SFT set first (sarl.data.synthesize)")
    out = []
    for i, row in enumerate(read_jsonl(path, "data.sft_files")):
        where = f"{path}:{i + 1}"
        if "messages" in row and "prompt" not in row:
            messages = row["messages"]
            if not (isinstance(messages, list) and len(messages) >= 2):
                raise UserError(f"{where}: 'messages' must list at least a prompt and the assistant's reply")
            prompt, completion = messages[:-1], messages[-1:]
        else:
            prompt, completion = row.get("prompt"), row.get("completion")
        for name, value in (("prompt", prompt), ("completion", completion)):
            if not (isinstance(value, list) and value and all(_is_message(m) for m in value)):
                raise UserError(f"{where}: '{name}' must be a non-empty list of chat messages ({{role, content}})")
        if completion[-1]["role"] != "assistant":
            raise UserError(
                f"{where}: the target (last message) must be an assistant turn, not {completion[-1]['role']!r}"
            )
        out.append({"prompt": prompt, "completion": completion})
    return out


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
