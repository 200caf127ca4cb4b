"""`--help` and `-h` of the project's commands: what the command does, its main keys and the config groups a user picks
from, each group's options read from conf/ (so the list never drifts from the files). Hydra's composition never sees
the flag: `sarl.train --help` used to reach the command line's key check and fail on `--help` as a Hydra override.

    if asks_for_help(argv):
        sys.stdout.write(usage(USAGE))
        return 0
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from sarl.runtime.files import CONF_DIR

HELP_FLAGS = ("--help", "-h")
WIDTH = 120


@dataclass(frozen=True)
class Usage:
    """One command's help: its synopsis lines, what it does, its main keys (key, what) and the config groups a user
    picks from (the key on the command line, its folder under conf/, what it chooses)."""

    synopsis: tuple[str, ...]
    about: str
    keys: tuple[tuple[str, str], ...] = ()
    groups: tuple[tuple[str, str, str], ...] = ()
    more: str = ""
    notes: tuple[str, ...] = field(default=())


def asks_for_help(argv: list[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv)


def options(folder: str) -> list[str]:
    """The options of a config group: the YAML files of conf/<folder>/ (their names without `.yaml`)."""
    return sorted(p.stem for p in (CONF_DIR / folder).glob("*.yaml"))


def usage(u: Usage) -> str:
    """The help text of `u`, every group's options listed from conf/."""
    lines = [*u.synopsis, "", *textwrap.wrap(u.about, WIDTH), ""]
    if u.keys:
        lines.append("Main keys (KEY=VALUE, Hydra overrides; a misspelt key is named with the nearest one):")
        width = max(len(k) for k, _ in u.keys) + 2
        for key, what in u.keys:
            lines += textwrap.wrap(what, WIDTH, initial_indent=f"  {key:<{width}}", subsequent_indent=" " * (width + 2))
        lines.append("")
    if u.groups:
        lines.append("Groups (GROUP=OPTION):")
        for key, folder, what in u.groups:
            lines.append(f"  {key}=  {what} (conf/{folder}/)")
            lines += textwrap.wrap(
                ", ".join(options(folder)), WIDTH, initial_indent="      ", subsequent_indent="      "
            )
        lines.append("")
    lines += [*u.notes]
    if u.more:
        lines.append(u.more)
    return "\n".join(lines).rstrip() + "\n"
