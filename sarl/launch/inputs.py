"""What a row reads from disk, and fetching it where the network is (a cluster's login node) before the run goes
where it may not be (a compute node):

    python -m sarl.launch.inputs +exp=ROW [OVERRIDES ...]              # each model and data set: here or missing
    python -m sarl.launch.inputs --download +exp=ROW [OVERRIDES ...]   # fetch what is missing, then list again

Models are the exact ids the row composes: the policy (`model.path`, `model.tokenizer_path`) and the embedding model
of a reward that embeds (`embedding.model`, served by `embedding_server` when its url is `auto`), every weight file
of each (`huggingface_hub.snapshot_download`) into the Hugging Face cache (HF_HOME / HF_HUB_CACHE; HF_ENDPOINT's
Hub). Local directories, the bundled MiniLM and the policy being trained are the run's own and are only checked.
Data sets are the prepared files the row reads (`data.train_files`, `data.val_files`; `data.trl_train_files` on
TRL): each one under `paths.data_dir` is built by `python -m sarl.data.prepare dataset=NAME` (NAME: its folder, a
file of conf/data/); a file elsewhere is the user's and is only checked.

The exit status is 0 when everything is here (after the download), 1 when something is still missing.
"""

from __future__ import annotations

import logging
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from sarl.data.build import DataValidationError
from sarl.data.prepare import compose_prepare_config, prepare
from sarl.data.sources import DataSourceError
from sarl.launch.compose import compose_user_config
from sarl.runtime.errors import UserError, report_user_errors
from sarl.runtime.hub import hub_url, looks_like_local_path, offline_if_unreachable
from sarl.runtime.usage import Usage, asks_for_help, usage
from sarl.runtime.weights import is_hf_model, weights_cached

log = logging.getLogger("sarl.launch.inputs")

CONF_DATA = Path(__file__).resolve().parents[2] / "conf" / "data"
OWN_MODELS = ("bundled-minilm", "policy")  # the package's MiniLM; the policy being trained (embedding=policy_hidden)


@dataclass(frozen=True)
class Need:
    """One input of a row: a model (a Hub id or a directory) or a prepared data file, and how it is fetched."""

    kind: str  # "model" | "data"
    name: str  # the Hub id or directory; the data set's name
    path: str  # where it must be: the id again for a model, the prepared file for data
    fetch: str | None  # the command that fetches it; None: the user's own, nothing to fetch
    data_dir: str | None = None  # data: the paths.data_dir sarl.data.prepare writes it into

    def here(self) -> bool:
        if self.kind == "data":
            return Path(self.path).is_file()
        return model_here(self.path)


def model_here(model: str) -> bool:
    """A directory with a config.json and weights, or a Hub id whose config.json and weights are in the cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return is_hf_model(path)
    return weights_cached(model)


def row_models(cfg: DictConfig) -> list[str]:
    """The models the composed row loads by name, in order, without repeats."""
    names = [cfg.model.path, cfg.model.get("tokenizer_path")]
    if cfg.get("reward") is not None and cfg.reward.get("embedder") is not None and cfg.get("embedding") is not None:
        server = str(cfg.embedding.get("url") or "") == "auto" and cfg.get("embedding_server") is not None
        names.append(cfg.embedding_server.model if server else cfg.embedding.get("model"))
    out: list[str] = []
    for name in names:
        if name and str(name) not in OWN_MODELS and str(name) not in out:
            out.append(str(name))
    return out


def row_data(cfg: DictConfig) -> list[Need]:
    """The prepared data files the composed row reads, each with the command that builds it."""
    data_dir = Path(str(cfg.paths.data_dir)).expanduser().resolve()
    keys = ["train_files", "val_files"] + (["trl_train_files"] if cfg.backend.get("name") == "trl" else [])
    out: list[Need] = []
    for key in keys:
        value = cfg.data.get(key)
        if not value or str(value).startswith("pkg://"):  # shipped with the package
            continue
        path = Path(str(value)).expanduser().resolve()
        name = path.relative_to(data_dir).parts[0] if path.is_relative_to(data_dir) else None
        if name is None or not (CONF_DATA / f"{name}.yaml").is_file():
            out.append(Need("data", f"data.{key}", str(path), None))
            continue
        fetch = f"python -m sarl.data.prepare dataset={name} paths.data_dir={shlex.quote(str(data_dir))}"
        if all(n.fetch != fetch for n in out):
            out.append(Need("data", name, str(path), fetch, str(data_dir)))
    return out


def row_inputs(cfg: DictConfig) -> list[Need]:
    """Every input of the composed row (`row_models`, `row_data`)."""
    models = []
    for name in row_models(cfg):
        own = looks_like_local_path(name)
        models.append(Need("model", name, name, None if own else f"hf download {name}"))
    return models + row_data(cfg)


def download(need: Need) -> None:
    """Fetch one input: a model's every file from the Hub into the cache, a data set through sarl.data.prepare."""
    if need.fetch is None:
        return
    if need.kind == "model":
        from huggingface_hub import snapshot_download

        log.info("downloading %s", need.name)
        try:
            snapshot_download(need.name)
        except Exception as err:  # offline, unknown id, gated, network: one line with what to do
            raise UserError(
                f"model {need.name}: cannot download it from {hub_url()} ({type(err).__name__}: {err}); run this "
                "where the Hub can be reached, with a token for a gated model (hf auth login)"
            ) from err
        return
    log.info("preparing %s", need.name)
    try:
        quoted = str(need.data_dir).replace("\\", "\\\\").replace("'", "\\'")  # a Hydra quoted value: any path
        prepare(compose_prepare_config([f"dataset={need.name}", f"paths.data_dir='{quoted}'"]))
    except (DataSourceError, DataValidationError) as err:
        raise UserError(str(err)) from err


def inputs_table(needs: list[Need]) -> tuple[str, bool]:
    """One line per input (✓ here, ✗ missing and the command that fetches it) and whether all are here."""
    lines, ok = [], True
    for need in needs:
        here = need.here()
        ok &= here
        where = need.name if need.kind == "model" else f"{need.name} ({need.path})"
        fix = "" if here else f"  -> {need.fetch or 'yours: put it there'}"
        lines.append(f"{'✓' if here else '✗'} {need.kind:<5} {where}{fix}")
    return "\n".join(lines) + "\n", ok


USAGE = Usage(
    synopsis=(
        "python -m sarl.launch.inputs +exp=ROW [OVERRIDES ...]             # what the row reads: here or missing",
        "python -m sarl.launch.inputs --download +exp=ROW [OVERRIDES ...]  # fetch what is missing (needs the Hub)",
    ),
    about=(
        "List, and with --download fetch, exactly the models (every weight file, into the Hugging Face cache) and "
        "prepared data sets (sarl.data.prepare into paths.data_dir) that a row composes. Run it where the network "
        "is (a login node) before the row runs where it may not be."
    ),
    keys=(("paths.data_dir", "where the prepared sets are (default data/)"),),
    groups=(("+exp", "exp", "the paper row"),),
    more="scripts/gpu_session.sh runs it as its step 2 (docs/gpu.md).",
)


@report_user_errors("sarl.launch.inputs")  # a misspelt key, a failed download: one line, exit 2
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if asks_for_help(argv):
        sys.stdout.write(usage(USAGE))
        return 0
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per HTTP request of the downloads
    fetch = "--download" in argv
    overrides = [a for a in argv if a != "--download"]
    offline_if_unreachable()
    cfg, _ = compose_user_config(overrides)
    needs = row_inputs(cfg)
    if fetch:
        for need in needs:
            if not need.here():
                download(need)
    text, ok = inputs_table(needs)
    sys.stdout.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
