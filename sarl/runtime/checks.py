"""A preflight check's result and the error that refuses a run before launch: what `python -m sarl.preflight`
prints as one table row (✓ or ✗, what it saw, the fix) and what `sarl.train` raises when a cheap check fails (one
line per failure, exit code 2). The checks themselves live with what they check (`sarl/preflight.py`, the back
ends)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from sarl.runtime.errors import UserError


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


class PreflightError(UserError):
    """A cheap check failed before launch; the message lists each failure and its fix."""


def raise_failed(checks: Iterable[Check]) -> None:
    """Raise PreflightError naming every failed check and its fix; nothing when all passed."""
    failed = [c for c in checks if not c.ok]
    if failed:
        raise PreflightError("; ".join(f"{c.name}: {c.detail}" + (f" -> {c.fix}" if c.fix else "") for c in failed))
