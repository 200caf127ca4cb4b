"""The attention implementation verl's models load with, and a patch that makes the critic honour it.

verl 0.9.1 builds the actor and the reference model from `HFModelConfig`, whose `hf_config` is read with
`attn_implementation = override_config.get("attn_implementation", "flash_attention_2")`
(verl/workers/config/model.py), and the PPO critic with `load_valuehead_model`, which passes
`attn_implementation="flash_attention_2"` whatever the config says (verl/utils/model.py). Where the
flash-attn package is not installed (`requirements/gpu.lock` brings verl[vllm], which has none), both
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

import functools
import importlib
import logging
from typing import Any

from sarl.runtime.checks import Check

log = logging.getLogger(__name__)

CHOICES = ("auto", "flash_attention_2", "sdpa", "eager")
ATTENTION_MODULE = __name__  # what `critic.model.external_lib` names


FLASH_ATTN_FIX = (
    "reinstall flash-attn against the installed torch (pip install flash-attn --no-build-isolation), "
    "or set backend.attn_implementation=sdpa"
)


@functools.cache
def flash_attn_import_error() -> str | None:
    """Why flash-attn's compiled CUDA extension does not import in this process (the exception's type and the
    first line of its message, shortened), or None where it imports. `flash_attn` imports
    `flash_attn.flash_attn_interface`, which imports the extension `flash_attn_2_cuda`: a wheel built for another
    torch fails there ("undefined symbol: ..."), which the package metadata that transformers reads cannot show."""
    try:
        importlib.import_module("flash_attn")
        importlib.import_module("flash_attn.flash_attn_interface")
    except Exception as err:  # ImportError (an ABI mismatch, a missing library), OSError, RuntimeError
        first = next(iter(str(err).strip().splitlines()), "")
        first = first if len(first) <= 200 else first[:197] + "..."
        return f"{type(err).__name__}: {first}" if first else type(err).__name__
    return None


@functools.cache
def flash_attn_usable() -> bool:
    """Whether flash_attention_2 can run here: transformers finds the package and a CUDA device, and the package's
    compiled extension really imports (once per process; where it does not, the reason and the fix are logged)."""
    from transformers.utils import is_flash_attn_2_available

    if not is_flash_attn_2_available():
        return False
    err = flash_attn_import_error()
    if err is not None:
        log.warning(
            "flash-attn is installed but does not import (%s): backend.attn_implementation=auto uses sdpa; %s",
            err,
            FLASH_ATTN_FIX,
        )
        return False
    return True


def check_flash_attn(installed: str | None) -> Check:
    """The preflight's flash-attn row for version `installed` of the package (None: not installed, sdpa is used): an
    installed flash-attn whose compiled extension does not import fails (every worker would fail at model load)."""
    if not installed:
        return Check("flash-attn", True, "not installed: backend.attn_implementation=auto uses sdpa (exact, slower)")
    err = flash_attn_import_error()
    if err is not None:
        return Check(
            "flash-attn", False, f"flash-attn {installed} installed but does not import: {err}", FLASH_ATTN_FIX
        )
    return Check("flash-attn", True, f"flash-attn {installed}, usable: {flash_attn_usable()}")


def check_attention(requested: str) -> Check:
    """The preflight's attention row: what actor, reference and critic load with for `backend.attn_implementation`."""
    try:
        impl = resolve_attn_implementation(requested)
    except ValueError as err:
        return Check("attention", False, str(err), "backend.attn_implementation=auto")
    return Check("attention", True, f"actor, reference and critic load with {impl}")


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
            "(not installed, not importable, or no CUDA device): `pip install flash-attn --no-build-isolation`, "
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
