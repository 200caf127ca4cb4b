"""One error path for every command: a setting or input that cannot work as given (`UserError`) is reported
as one or two lines on stderr naming the file, key or value and what to do, with exit code 2 and no
traceback, unless HYDRA_FULL_ERROR=1 or SARL_DEBUG=1 asks for one."""

from __future__ import annotations

import functools
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Callable

EXIT_USER_ERROR = 2
EXIT_INCOMPLETE = 3  # a command that finished with some items failed for good; a rerun resumes them
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
OVERRIDDEN_KEY = re.compile(r"Could not override '([^']+)'")  # Hydra's error for a key the config does not have


class UserError(ValueError):
    """A setting or input that cannot work as given; the message says which and what to do."""


def composition_error_message(err: Exception) -> str:
    """Hydra's or OmegaConf's composition error in one line: for an override of a key the config does not have,
    the nearest key (Hydra's advice, `+key=value`, would add a key that nothing reads); for an unknown option the
    line naming it followed by the valid options; else its first two lines."""
    unknown = _unknown_key(err)
    if unknown is not None:
        return unknown
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    search = next((i for i, line in enumerate(lines) if line.startswith("Config search path")), None)
    lines = lines[:search]  # Hydra's search path (its own config providers) adds nothing for the user
    head = next((i for i, line in enumerate(lines) if line.startswith("Available options")), None)
    if head is not None:  # an unknown option: the nearest ones, or all when there are few
        return _unknown_option(" ".join(lines[:head]), lines[head + 1 :]) or (
            " ".join(lines[:head]) + f" {lines[head]} " + ", ".join(lines[head + 1 :])
        )
    return " ".join(lines[:2]) or type(err).__name__


MISSING_OPTION = re.compile(r"Could not find '([\w/@.-]+)/([^'/]+)'")
FEW_OPTIONS = 12


def _unknown_option(text: str, options: list[str]) -> str | None:
    """`GROUP=NAME: no such option; did you mean X? (N options in conf/GROUP/)` for Hydra's "Could not find
    'GROUP/NAME'": the nearest names first (a group of ~50 paper rows is not dumped on one line), every option when
    the group has few."""
    import difflib

    found = MISSING_OPTION.search(text)
    if found is None or not options:
        return None
    group, name = found.groups()
    key = group.rpartition("/")[2]
    near = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(near)}?" if near else "no option is near it"
    if len(options) <= FEW_OPTIONS:
        return f"{key}={name}: no such option; {hint} (choose one of: {', '.join(options)})"
    return f"{key}={name}: no such option; {hint} ({len(options)} options in conf/{group}/; --help lists them)"


def _unknown_key(err: Exception) -> str | None:
    """`KEY: no such key; did you mean NEAREST?` for Hydra's "Could not override 'KEY'" on a key the config lacks
    (OmegaConf's key error, whose node leads to the composed config); None for any other error."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause, found = err.__cause__, OVERRIDDEN_KEY.search(str(err))
    node = getattr(cause, "parent_node", None)
    if found is None or node is None or not isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return None
    return f"{found.group(1)}: no such key; {did_you_mean(found.group(1), node._get_root())}"


def did_you_mean(key: str, cfg: Any) -> str:
    """`did you mean PATH?` with the key path of `cfg` (a DictConfig) nearest to `key` (difflib), Hydra's own
    `hydra.` keys left out unless `key` is one of them; or what to do when none is near."""
    import difflib

    from omegaconf import OmegaConf

    paths = [p for p in _key_paths(OmegaConf.to_container(cfg, resolve=False)) if p != key]
    if not key.startswith("hydra."):
        paths = [p for p in paths if p.split(".")[0] != "hydra"]
    near = difflib.get_close_matches(key, paths, n=1)
    return f"did you mean {near[0]}?" if near else "no key is near it: check the spelling against conf/"


def _key_paths(node: Any, prefix: str = "") -> list[str]:
    """Every key path of a nested dict (`a`, `a.b`, ...); lists are leaves."""
    out = []
    for key, value in node.items() if isinstance(node, dict) else ():
        out.append(f"{prefix}{key}")
        out += _key_paths(value, f"{prefix}{key}.")
    return out


def refuse_new_keys(overrides: list[str], cfg: Any, closed: tuple[str, ...]) -> None:
    """A UserError for an override `+SECTION.KEY=value` that adds a key to one of the `closed` sections of the
    composed `cfg`, whose keys the code reads by name only: the new key would be ignored (a misspelt key that
    Hydra's advice, add a +, lets through). Keys below an existing key (a free-form mapping) are not refused."""
    for override in overrides:
        key = override.partition("=")[0]
        section, dot, name = key.removeprefix("+").partition(".")
        if key.startswith("+") and not key.startswith("++") and section in closed and dot and "." not in name:
            why = f"no such key, and a new one under {section} is read by nothing"
            raise UserError(f"{key}: {why}; {did_you_mean(key[1:], cfg)}")


def debug_requested() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1" or os.environ.get("SARL_DEBUG") == "1"


def exit_code(body: Callable[[], int], on_error: Callable[[UserError], None], on_interrupt: Callable[[], None]) -> int:
    """A command's exit code: `body()`'s; a UserError is reported by `on_error` (one or two lines) and exits
    EXIT_USER_ERROR (raised again when a traceback is asked for, `debug_requested`), Ctrl-C calls `on_interrupt`
    (say what is kept and how to resume) and exits EXIT_INTERRUPTED."""
    try:
        return body()
    except UserError as err:
        if debug_requested():
            raise
        on_error(err)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        on_interrupt()
        return EXIT_INTERRUPTED


def report_user_errors(prog: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command's entry function: a UserError becomes `prog: message` on stderr and exit code 2."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except UserError as err:
                if debug_requested():
                    raise
                sys.stderr.write(f"{prog}: {err}\n")
                sys.exit(EXIT_USER_ERROR)

        return run

    return wrap


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def check_output_file(path: str | Path, key: str, inputs: tuple[str | Path | None, ...] = ()) -> Path:
    """Before any work: `path` may be written as a new or replaced regular file. Refuses a path that is
    anything else (a link, FIFO, device, directory: it would be replaced by a plain file), that is one of
    `inputs`, or whose directory cannot be created or written."""
    out = Path(path)
    try:
        st = out.lstat()
    except (FileNotFoundError, NotADirectoryError):  # a new file (its directory is checked below)
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = _kind(st.st_mode)
        raise UserError(f"{key}={out} is a {kind}, not a regular file; choose a file path (it is never replaced)")
    for inp in inputs:
        if inp is not None and _same_file(out, Path(inp)):
            raise UserError(f"{key}={out} is the input file {inp}; choose another {key} (inputs are never overwritten)")
    check_writable_dir(out.parent, key)
    return out


def check_writable_dir(directory: str | Path, key: str) -> Path:
    """`directory` exists (created if needed) and can be written; else a UserError naming `key`."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{key}: cannot create {d} ({err.strerror}); choose a writable location") from err
    if not d.is_dir() or not os.access(d, os.W_OK | os.X_OK):
        raise UserError(f"{key}: {d} is not a writable directory; choose a writable location")
    return d


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()
