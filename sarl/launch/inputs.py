"""What a row reads from disk, and fetching it where the network is (a cluster's login node) before the run goes
where it may not be (a compute node):

    python -m sarl.launch.inputs +exp=ROW [OVERRIDES ...]              # each model and data set: here or missing
    python -m sarl.launch.inputs --download +exp=ROW [OVERRIDES ...]   # fetch what is missing, then list again
    python -m sarl.launch.inputs --no-eval +exp=ROW [OVERRIDES ...]    # only what training reads

Models are the exact ids the row composes: the policy (`model.path`, `model.tokenizer_path`) and the embedding model
of a reward that embeds (`embedding.model`, served by `embedding_server` when its url is `auto`), every weight file
of each (`huggingface_hub.snapshot_download`) into the Hugging Face cache (HF_HOME / HF_HUB_CACHE; HF_ENDPOINT's
Hub). Local directories, the bundled MiniLM and the policy being trained are the run's own and are only checked.
Data sets are the files the row reads (`data.train_files`, `data.val_files`, `data.sft_files`, `data.dpo_files`;
`data.trl_train_files` on TRL): each one under `paths.data_dir` is built by `python -m sarl.data.prepare
dataset=NAME` (NAME: its folder, a file of conf/data/); a package sample set that a paper row refuses is listed with
the command that writes the paper's set (a teacher run: listed, not run); a file elsewhere is the user's and is only
checked. A pipeline row's stages are each composed as the pipeline composes them (`STAGE:key=value` applies to that
stage); a stage that starts from an earlier one loads that stage's model.
Held-out sets are the benchmarks `python -m eval.run` reads to evaluate the row by its paper's protocol (each
protocol of the paper of its tables, or of its note: `sarl.runtime.rows.row_protocols`; composed without `+exp`,
the protocol eval.run uses unless told), each prepared like a data set into the same `paths.data_dir`; a
protocol's own file (the smoke run's, in the package) is only checked. `--no-eval` leaves them out. Not listed: the
WildBench judge, an endpoint (`judge.url`, docs/evaluation.md).

The exit status is 0 when everything is here (after the download), 1 when something is still missing.
"""

from __future__ import annotations

import logging
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sarl.data.build import DataValidationError
from sarl.data.prepare import compose_prepare_config, prepare
from sarl.data.sources import DataSourceError
from sarl.launch.compose import compose_user_config
from sarl.launch.pipeline import split_stage_overrides, stage_configs
from sarl.runtime.errors import UserError, report_user_errors
from sarl.runtime.files import CONF_DIR, resolve_path
from sarl.runtime.hub import hub_url, looks_like_local_path, offline_if_unreachable
from sarl.runtime.rows import row_protocols
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
    use: str = ""  # what reads it, where not the row's training: "eval.run protocol=NAME"

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


SAMPLES = "pkg://sarl.samples/"  # the hand-written sample sets shipped in the package (sarl/samples/)
DATA_KEYS = ("train_files", "val_files", "sft_files", "dpo_files")  # + trl_train_files on TRL


def shipped_sample(cfg: DictConfig) -> tuple[str, str] | None:
    """(data key, value) of a data file of the run that is one of the package's sample sets, or None."""
    for key in ("sft_files", "train_files", "trl_train_files", "dpo_files"):
        value = cfg.data.get(key)
        if isinstance(value, str) and value.startswith(SAMPLES):
            return f"data.{key}", value
    return None


def is_paper_row(cfg: DictConfig, choices: dict[str, Any]) -> bool:
    """A row that reproduces a paper's table or figure: a conf/exp/*_paper.yaml file, or one naming a table."""
    paper = cfg.get("paper") or {}
    return str(choices.get("exp") or "").endswith("_paper") or bool(paper.get("tables"))


def refuses_samples(cfg: DictConfig, choices: dict[str, Any]) -> bool:
    """Whether the run may not train on the package's sample sets: a paper row on a back end that does not declare
    `backend.sample_data: true` (backend=verl_cpu), not a dry run, not the tiny policy (sarl.train refuses it)."""
    return is_paper_row(cfg, choices) and not (
        cfg.backend.get("sample_data") or cfg.train.dry_run or cfg.model.get("build")
    )


def row_data(cfg: DictConfig, choices: dict[str, Any] | None = None, stage: str = "") -> list[Need]:
    """The data files the composed row (or its pipeline's `stage`) reads, each with the command that makes it: a
    prepared set `sarl.data.prepare` builds, a sample set a paper row refuses (the command that writes the full set,
    its data group's `synthesize_hint`), or a file of the user's own (no command)."""
    data_dir = Path(str(cfg.paths.data_dir)).expanduser().resolve()
    keys = [*DATA_KEYS, *(["trl_train_files"] if cfg.backend.get("name") == "trl" else [])]
    prefix = f"{stage}:" if stage else ""
    out: list[Need] = []
    for key in keys:
        value = cfg.data.get(key)
        if not value:
            continue
        if str(value).startswith("pkg://"):  # shipped with the package: fine unless a paper row would train on it
            if str(value).startswith(SAMPLES) and choices is not None and refuses_samples(cfg, choices):
                how = cfg.data.get("synthesize_hint") or "write the paper's set"
                out.append(Need("data", f"{prefix}data.{key}", str(value), f"{how}, then {prefix}data.{key}=PATH"))
            continue
        path = Path(str(value)).expanduser().resolve()
        name = path.relative_to(data_dir).parts[0] if path.is_relative_to(data_dir) else None
        if name is None or not (CONF_DATA / f"{name}.yaml").is_file():
            out.append(Need("data", f"{prefix}data.{key}", str(path), None))
            continue
        fetch = f"python -m sarl.data.prepare dataset={name} paths.data_dir={shlex.quote(str(data_dir))}"
        out.append(Need("data", name, str(path), fetch, str(data_dir)))
    return out


def eval_protocol(name: str | None = None) -> DictConfig:
    """An evaluation protocol (None: the one `eval.run` uses unless told) as conf/eval.yaml composes it."""
    from hydra import compose, initialize_config_dir

    overrides = [] if name is None else [f"eval/protocol@protocol={name}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_inputs"):
        return compose(config_name="eval", overrides=overrides).protocol


def protocol_benchmarks(protocol: DictConfig) -> list[tuple[str, str | None]]:
    """(benchmark, the protocol's own file or None) of every benchmark of a composed protocol (`benchmarks.math` and
    the like resolved), in order, without repeats."""
    files = OmegaConf.to_container(protocol.files, resolve=True) if protocol.get("files") else {}
    names = [str(name) for group in protocol.benchmarks for name in group.names or []]
    return [(name, files.get(name)) for name in dict.fromkeys(names)]


def row_heldout(cfg: DictConfig) -> list[Need]:
    """The held-out sets `eval.run` reads to evaluate the row by each protocol of its paper (a run with no `paper:`
    block, composed without `+exp`: by the protocol `eval.run` uses unless told): a benchmark is read from
    `<paths.data_dir>/<name>/test.parquet` (eval.data.benchmark_path), which `sarl.data.prepare dataset=NAME` writes;
    a protocol's own file is only checked."""
    data_dir = Path(str(cfg.paths.data_dir)).expanduser().resolve()
    paper = cfg.get("paper")
    protocols = [None] if paper is None else row_protocols(OmegaConf.to_container(paper, resolve=True))
    out: list[Need] = []
    for protocol in map(eval_protocol, protocols):
        use = f"eval.run protocol={protocol.name}"
        for name, file in protocol_benchmarks(protocol):
            if file is not None:
                out.append(Need("data", name, str(resolve_path(file)), None, use=use))
                continue
            fetch = f"python -m sarl.data.prepare dataset={name} paths.data_dir={shlex.quote(str(data_dir))}"
            path = str(data_dir / name / "test.parquet")
            if (CONF_DATA / f"{name}.yaml").is_file():
                out.append(Need("data", name, path, fetch, str(data_dir), use))
            else:  # a set no data config builds yet: nothing --download can run until one is written
                out.append(Need("data", name, path, f"write conf/data/{name}.yaml, then {fetch}", None, use))
    return out


def row_inputs(
    cfg: DictConfig, choices: dict[str, Any] | None = None, stage: str = "", models: bool = True
) -> list[Need]:
    """Every input of the composed row or stage (`row_models` unless `models` is False, `row_data`)."""
    needs = []
    for name in row_models(cfg) if models else []:
        own = looks_like_local_path(name)
        needs.append(Need("model", name, name, None if own else f"hf download {name}"))
    return needs + row_data(cfg, choices, stage)


def inputs_of(cfg: DictConfig, choices: dict[str, Any], overrides: list[str], heldout: bool = True) -> list[Need]:
    """The inputs of a row, or of each stage of a pipeline row (composed as sarl.launch.pipeline composes them; a
    stage that starts from an earlier one loads that stage's model, not one of the Hub's), then, with `heldout`, the
    held-out sets its evaluation reads (`row_heldout`); each once, the first use named."""
    if cfg.get("pipeline"):
        needs = []
        for stage, stage_cfg in stage_configs(cfg, overrides):
            needs += row_inputs(stage_cfg, choices, stage["name"], models=not stage["init_from"])
    else:
        needs = row_inputs(cfg, choices)
    needs += row_heldout(cfg) if heldout else []
    out: list[Need] = []
    for need in needs:
        if all((n.kind, n.path, n.fetch) != (need.kind, need.path, need.fetch) for n in out):
            out.append(need)
    return out


def download(need: Need) -> None:
    """Fetch one input: a model's every file from the Hub into the cache, a data set through sarl.data.prepare."""
    if need.fetch is None or (need.kind == "data" and need.data_dir is None):  # the user's own, or a teacher run
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
        where += f", held out: {need.use}" if need.use else ""
        fix = "" if here else f"  -> {need.fetch or 'yours: put it there'}"
        lines.append(f"{'✓' if here else '✗'} {need.kind:<5} {where}{fix}")
    return "\n".join(lines) + "\n", ok


USAGE = Usage(
    synopsis=(
        "python -m sarl.launch.inputs +exp=ROW [OVERRIDES ...]             # what the row reads: here or missing",
        "python -m sarl.launch.inputs --download +exp=ROW [OVERRIDES ...]  # fetch what is missing (needs the Hub)",
        "python -m sarl.launch.inputs --no-eval +exp=ROW [OVERRIDES ...]   # without the held-out sets of eval.run",
    ),
    about=(
        "List, and with --download fetch, exactly the models (every weight file, into the Hugging Face cache) and "
        "prepared data sets (sarl.data.prepare into paths.data_dir) that a row composes, and the held-out sets that "
        "eval.run reads to evaluate it by its paper's protocol. Run it where the network is (a login node) before "
        "the row runs where it may not be."
    ),
    keys=(("paths.data_dir", "where the prepared sets are (default data/)"),),
    groups=(("+exp", "exp", "the paper row"),),
    more="scripts/gpu_session.sh runs it, with --no-eval, as its step 2 (docs/gpu.md).",
)


FLAGS = ("--download", "--no-eval")


@report_user_errors("sarl.launch.inputs")  # a misspelt key, a failed download: one line, exit 2
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if asks_for_help(argv):
        sys.stdout.write(usage(USAGE))
        return 0
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per HTTP request of the downloads
    unknown = [a for a in argv if a.startswith("-") and a not in FLAGS]
    if unknown:
        raise UserError(f"{unknown[0]}: not an option; the options are {', '.join(FLAGS)} (and --help)")
    fetch, heldout = "--download" in argv, "--no-eval" not in argv
    overrides = [a for a in argv if a not in FLAGS]
    offline_if_unreachable()
    cfg, choices = compose_user_config(split_stage_overrides(overrides)[0])  # `STAGE:key=value`: that stage's only
    needs = inputs_of(cfg, choices, overrides, heldout)
    if fetch:
        for need in needs:
            if not need.here():
                download(need)
    text, ok = inputs_table(needs)
    sys.stdout.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
