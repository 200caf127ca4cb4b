"""Hydra override strings: the key each names, and merging a second list into a first."""

from __future__ import annotations

from typing import Iterable


def override_key(override: str) -> str:
    """The key an override names: `+exp=x` -> exp, `model.path=p` -> model.path, `~a.b` -> a.b."""
    return override.split("=", 1)[0].lstrip("+~")


def named_keys(overrides: Iterable[str]) -> set[str]:
    """The keys a list of overrides names."""
    return {override_key(o) for o in overrides}


def merged_overrides(overrides: list[str], extra: list[str]) -> list[str]:
    """`overrides` with `extra` appended, an earlier override of a key that `extra` sets dropped."""
    replaced = named_keys(extra)
    return [o for o in overrides if override_key(o) not in replaced] + extra
