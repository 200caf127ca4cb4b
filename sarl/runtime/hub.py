"""The Hugging Face Hub from this machine: whether it can be reached, offline mode when it cannot (so that neither a
command nor its child processes spend minutes on retries), and whether a model a command names can be had here.

`offline_if_unreachable()` runs first in `sarl.train`, `eval.run`, `sarl.preflight` and `sarl.data.prepare`: one
TCP connection toward the Hub (HF_ENDPOINT, else huggingface.co:443; through HTTPS_PROXY where it applies), tried
once per process; when it does not open, HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 are set (inherited by every
child; `datasets` follows HF_HUB_OFFLINE) unless the user set either. It says nothing then: a one-line error stays
one line, and an error that depends on the Hub says so itself (`check_model_source`, `sarl.data.sources`);
`offline_note()` is the line a command prints once its checks have passed (sarl.train and eval.run at their start,
the preflight's Hub row). `check_model_source` refuses, before anything is built or written, a model that is
neither a local checkpoint directory nor a Hub id in the local cache or on a Hub that can be reached.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from sarl.runtime.errors import UserError
from sarl.runtime.network import reachable

log = logging.getLogger("sarl.runtime.hub")

DEFAULT_ENDPOINT = "https://huggingface.co"
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
TRUE = ("1", "on", "yes", "true")


def hub_url() -> str:
    """The Hub this process would download from: HF_ENDPOINT, else huggingface.co."""
    return os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


def hub_address() -> tuple[str, int]:
    """(host, port) of the Hub this process would download from: HF_ENDPOINT's, else huggingface.co:443."""
    url = urlsplit(hub_url())
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection toward the Hub opens within `timeout_s` (through the environment's proxy where one
    applies: sarl.runtime.network.reachable); asked once per process and address."""
    return reachable(hub_url(), timeout_s)


def offline_requested() -> bool:
    """Whether the environment puts the Hub libraries offline (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE true)."""
    return any(os.environ.get(name, "").strip().lower() in TRUE for name in OFFLINE_VARS)


_SWITCHED: list[bool] = []  # offline_if_unreachable put this process offline


def offline_note() -> str | None:
    """The line saying this process went offline because the Hub cannot be reached; None when it did not."""
    if not _SWITCHED:
        return None
    return "the Hugging Face Hub (%s:%d) cannot be reached: offline mode, models come from the local cache" % (
        hub_address()
    )


def offline_if_unreachable() -> None:
    """HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 in this process's environment (and so its children's) when the
    Hub cannot be reached and the user set neither: models then come from the local cache at once instead of
    after minutes of retries. Silent (`offline_note()` is the line to print once the command's checks passed).
    Call it before huggingface_hub is imported (it reads the variable then); if it already was, its flag is set
    too."""
    if any(name in os.environ for name in OFFLINE_VARS) or hub_reachable():
        return
    for name in OFFLINE_VARS:
        os.environ[name] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")  # it copied the flag when imported
    if datasets_config is not None and os.environ.get("HF_DATASETS_OFFLINE") is None:
        datasets_config.HF_HUB_OFFLINE = datasets_config.HF_DATASETS_OFFLINE = True
    _SWITCHED.append(True)
    log.debug("%s", offline_note())


def hub_cache_dir() -> str:
    """Where huggingface_hub keeps downloaded models (HF_HUB_CACHE, else HF_HOME/hub)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def looks_like_local_path(name: str) -> bool:
    """A local path rather than a Hub id (`name` or `org/name`): it starts with / . or ~, has more than one
    separator, or it or its first part exists here."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name):
        return True
    return Path(name).exists() or ("/" in name and Path(name.split("/")[0]).is_dir())


def check_model_source(key: str, value: str, filename: str = "config.json", dry_run: bool = False) -> str | None:
    """Before anything is built or written: `key=value` names a model this machine can load: a directory with
    `filename`, or a Hub id whose `filename` is in the local cache or that a reachable Hub can serve. Otherwise a
    UserError naming the key, the value and what to do; except that a dry run (which loads nothing) only gets
    back a note for a Hub id it could not fetch now."""
    path = Path(value).expanduser()
    if path.is_dir():
        if not (path / filename).is_file():
            raise UserError(f"{key}={value} has no {filename}: not a Hugging Face checkpoint directory")
        return None
    if looks_like_local_path(value):
        raise UserError(f"{key}={value} is not a directory; give a checkpoint directory (one with {filename})")
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(value, filename)
    except ValueError as err:  # huggingface_hub's HFValidationError: not a valid repo id
        raise UserError(f"{key}={value}: no such directory, and not a Hub model id (name or org/name)") from err
    if isinstance(cached, str):
        return None
    reachable = hub_reachable()
    if reachable and not offline_requested():
        return None
    why = "offline (HF_HUB_OFFLINE=1)" if reachable else "unreachable"
    problem = f"{key}={value}: no such directory, and not in the Hugging Face cache ({hub_cache_dir()})"
    problem += f" with the hub {why}"
    if dry_run:
        return f"{problem}; the dry run goes on, a real run needs it there (hf download {value})"
    raise UserError(f"{problem}: give a local checkpoint directory or download the model first (hf download {value})")
