"""A model's config.json, from a local directory, the Hugging Face cache or the Hub: what the memory plans and
the embedder choice read of a model without loading it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def find_model_config(path_or_repo: str, allow_download: bool = False) -> dict[str, Any] | None:
    """A model's config.json: from a local directory, the local Hugging Face cache, or (allow_download)
    the Hub. None where it cannot be had."""
    local = Path(os.path.expanduser(path_or_repo))
    if local.is_dir():
        f = local / "config.json"
        return json.loads(f.read_text()) if f.exists() else None
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    try:
        cached = try_to_load_from_cache(path_or_repo, "config.json")
    except Exception:  # an invalid repo id
        return None
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text())
    if not allow_download:
        return None
    try:
        return json.loads(Path(hf_hub_download(path_or_repo, "config.json")).read_text())
    except Exception:
        return None
