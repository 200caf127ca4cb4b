"""The config folder, and paths and JSONL inputs named in config: `pkg://package/path` for files shipped inside a
package, and JSONL files read row by row with the failing line named."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the source checkout: conf/, docs/, README.md
CONF_DIR = REPO_ROOT / "conf"  # the repository's Hydra configs (train, eval, data, ...)


def resolve_path(path: str) -> Path:
    """A path from config; `pkg://package/relative/path` names a file shipped inside a package."""
    if path.startswith("pkg://"):
        package, _, rel = path[len("pkg://") :].partition("/")
        return Path(str(resources.files(package).joinpath(rel)))
    return Path(path)


def read_jsonl(path: Path, what: str) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"{what} file {path} does not exist; prepare the data set first (sarl.data.prepare)")
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{i + 1}: not JSON ({err})") from err
    if not rows:
        raise ValueError(f"{what} file {path} has no rows")
    return rows
