"""The attention implementation verl's models load with, and a patch that makes the critic honour it.

verl 0.9.1 builds the actor and the reference model from `HFModelConfig`, whose `hf_config` is read with
`attn_implementation = override_config.get("attn_implementation", "flash_attention_2")`
(verl/workers/config/model.py), and the PPO critic with `load_valuehead_model`, which passes
`attn_implementation="flash_attention_2"` whatever the config says (verl/utils/model.py). Where the
flash-attn package is not installed (`pip install -e .[gpu]` brings verl[vllm], which has none), both
stop at start-up with "FlashAttention2 has been toggled on, but it cannot be used".

`backend.attn_implementation` (conf/backend/verl.yaml) chooses: `auto` takes flash_attention_2 where
transformers can use it on this node and sdpa otherwise. sdpa is exact with verl's padding-free packing
(`use_remove_padding`): transformers builds a per-sequence mask from the packed position ids
(transformers/masking_utils.py, `find_packed_sequence_indices`); flash-attn is faster, not different.

Importing this module replaces `verl.utils.model.load_valuehead_model` by `load_valuehead_model` below;
`critic.model.external_lib` names this module, so verl imports it in every process that builds the
critic (`HFModelConfig.__post_init__` imports `external_lib`).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

CHOICES = ("auto", "flash_attention_2", "sdpa", "eager")
PATCH_MODULE = __name__  # what `critic.model.external_lib` names


def flash_attn_usable() -> bool:
    """Whether transformers can run flash_attention_2 here (the package installed and a CUDA device)."""
    from transformers.utils import is_flash_attn_2_available

    return bool(is_flash_attn_2_available())


def resolve_attn_implementation(requested: str, flash_available: bool | None = None) -> str:
    """The implementation every verl model (actor, reference, critic) loads with for `requested`."""
    if requested not in CHOICES:
        raise ValueError(f"backend.attn_implementation={requested!r}; choose one of: {', '.join(CHOICES)}")
    available = flash_attn_usable() if flash_available is None else flash_available
    if requested == "auto":
        return "flash_attention_2" if available else "sdpa"
    if requested == "flash_attention_2" and not available:
        raise ValueError(
            "backend.attn_implementation=flash_attention_2, but flash-attn cannot be used on this node "
            "(not installed, or no CUDA device): `pip install flash-attn --no-build-isolation`, "
            "or set backend.attn_implementation=auto (sdpa where flash-attn is missing)"
        )
    return requested


def load_valuehead_model(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool) -> Any:
    """verl's critic loader with the attention implementation of `model_config` (which verl set from
    `critic.model.override_config.attn_implementation`) instead of a hard-coded flash_attention_2.
    verl's own first route (a token-classification head with one label); its other route (TRL's value
    head) is left to verl's loader for models that have no such head."""
    from transformers import AutoModelForTokenClassification

    impl = getattr(model_config, "_attn_implementation", None) or "flash_attention_2"
    try:
        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path,
            torch_dtype=torch_dtype,
            config=model_config,
            attn_implementation=impl,
            trust_remote_code=trust_remote_code,
        )
    except ValueError as err:  # no token-classification class for this architecture
        log.info("no token-classification head for %s (%s); verl's value-head route", local_path, err)
        return _VERL_LOAD_VALUEHEAD(local_path, torch_dtype, model_config, trust_remote_code)


def _patch() -> Any:
    """Install `load_valuehead_model` in verl (once per process) and return verl's own loader."""
    import verl.utils.model as verl_model

    original = verl_model.load_valuehead_model
    verl_model.load_valuehead_model = load_valuehead_model
    return original


_VERL_LOAD_VALUEHEAD = _patch()
