"""A paper's evaluation protocol (conf/eval/protocol/<name>.yaml) resolved into a plan: per benchmark its kind, the
samples per problem, the metrics and the sampling settings (docs/decisions.md §3.1). `eval.run` generates and
scores by this plan; `dry_run=true` prints it.

A protocol file has `name`, `paper`, `sampling` (overrides of conf/eval.yaml's `sampling:` keys), `sweep` (null,
or one sampling key with a list of values: every benchmark is run once per value, e.g. the maximum response
lengths of Structured Reasoning Tables 2-3) and `benchmarks`, a list of groups {names, kind, n, metrics[,
max_tokens]}. Kinds: math (answers graded by sarl.checking.grading), wildbench (judged), code (scored by running the
benchmark's tests). An optional `files` maps a benchmark to its own data file (a path or `pkg://package/path`,
eval.data): the smoke protocol's held-out prompts ship in the package, so they need no `sarl.data.prepare`; every
other benchmark is read from `<paths.data_dir>/<name>/test.parquet`. A group of kind math may name the prompt
template that asks its benchmarks (`prompt: NAME`, conf/eval/prompt/NAME.yaml; none or null: each benchmark's
prepared prompt): `eval.prompts`. A paper that asked the models it trained otherwise than the models it started from
or compared against names one per model kind, `prompt: {trained: NAME, base: NAME}` (Structured Reasoning: its
trained rows with the tagged template, the untrained models without the tags, docs/decisions.md §3.1). `model_kind`
(conf/eval.yaml) says which the checkpoint is: `trained`, `base`, or `auto`: trained when a `sarl.train` run wrote it
(its meta.json at or above the checkpoint, `eval.config.training_run`), else base.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from eval.data import KINDS, Problem, benchmark_path, load_benchmark
from eval.generate import SamplingConfig
from eval.metrics import check_metric
from eval.prompts import PREPARED, BenchmarkPrompt, ask, benchmark_prompt, format_prompts
from sarl.runtime import torch_threads
from sarl.runtime.checkpoints import is_run_or_checkpoint
from sarl.runtime.errors import UserError, check_writable_dir
from sarl.runtime.files import CONF_DIR
from sarl.runtime.hub import check_model_source

log = logging.getLogger(__name__)

MODEL_KINDS = ("trained", "base")  # a checkpoint a row trained | a model it starts from or is compared with
SCORING = {"math": "answer graded (sarl.checking.grading)", "wildbench": "judged (eval.wildbench)", "code": "execution"}
SAMPLING_KEYS = tuple(f.name for f in dataclasses.fields(SamplingConfig))
DATA_CONF = CONF_DIR / "data"


@dataclass(frozen=True)
class BenchmarkPlan:
    """One benchmark of a protocol at one setting of its sweep."""

    name: str  # the benchmark: its data directory, cache key and per-sample seeds
    label: str  # its key in results.json: the name, or `name/<sweep key>=<value>`
    kind: str  # math | wildbench | code
    n: int  # samples per problem (one per seed for pass@1_seeds)
    metrics: tuple[str, ...]
    sampling: SamplingConfig
    sweep: tuple[str, Any] | None = None  # (sampling key, value)
    file: str | None = None  # the protocol's own data file (`files:`); None: <paths.data_dir>/<name>/test.parquet
    prompt: BenchmarkPrompt | None = None  # how it is asked (eval.prompts); None: its prepared messages

    def path(self, data_dir: str | Path) -> Path:
        """The benchmark's data file."""
        return benchmark_path(data_dir, self.name, self.file)

    @property
    def ks(self) -> list[int]:
        """The k of every avg@k / pass@k metric."""
        return sorted({self.n if m == "avg@k" else 1 if m == "pass@1_seeds" else int(m[5:]) for m in self.metrics})

    @property
    def seeds(self) -> int | None:
        """The seeds of a mean ± std over seeds (sample s of each problem is drawn with seed s)."""
        return self.n if "pass@1_seeds" in self.metrics else None

    def describe(self) -> dict[str, Any]:
        return {
            "benchmark": self.name,
            "label": self.label,
            "kind": self.kind,
            "scoring": SCORING[self.kind],
            "n": self.n,
            "k": self.ks if self.kind != "wildbench" else None,
            "seeds": self.seeds,
            "metrics": list(self.metrics),
            "sampling": self.sampling.cache_identity(),
            "sweep": list(self.sweep) if self.sweep else None,
            "file": self.file,
            "prompt": self.prompt.describe() if self.prompt else None,
        }


@dataclass(frozen=True)
class Plan:
    protocol: str
    paper: str
    entries: tuple[BenchmarkPlan, ...]
    model_kind: str = "trained"  # whose prompts the entries carry (MODEL_KINDS)
    by_kind: tuple[str, ...] = ()  # the benchmarks whose prompt depends on the model kind

    @property
    def sweep_key(self) -> str | None:
        return next((e.sweep[0] for e in self.entries if e.sweep), None)

    def groups(self) -> list[tuple[SamplingConfig, list[BenchmarkPlan]]]:
        """The entries by sampling settings, in plan order: each group is generated with one setting."""
        out: dict[str, tuple[SamplingConfig, list[BenchmarkPlan]]] = {}
        for e in self.entries:
            key = repr(sorted(e.sampling.cache_identity().items()))
            out.setdefault(key, (e.sampling, []))[1].append(e)
        return list(out.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.protocol,
            "paper": self.paper,
            "model_kind": self.model_kind,
            "prompt_by_model_kind": list(self.by_kind),
            "benchmarks": [e.describe() for e in self.entries],
        }


def sampling_config(cfg: DictConfig, overrides: dict[str, Any] | None = None) -> SamplingConfig:
    """conf/eval.yaml's `sampling:` with a protocol's overrides."""
    s = {**OmegaConf.to_container(cfg.sampling, resolve=True), **(overrides or {})}
    return SamplingConfig(
        temperature=float(s["temperature"]),
        top_p=float(s["top_p"]),
        top_k=int(s["top_k"]) if s["top_k"] else None,
        max_tokens=int(s["max_tokens"]),
        chat_template_kwargs=dict(s["chat_template_kwargs"] or {}),
    )


def _sampling(cfg: DictConfig, where: str, overrides: dict[str, Any]) -> SamplingConfig:
    unknown = sorted(set(overrides) - set(SAMPLING_KEYS))
    if unknown:
        raise UserError(f"{where}: sampling keys {unknown} not known; choose from: {', '.join(SAMPLING_KEYS)}")
    try:
        return sampling_config(cfg, overrides)
    except (ValueError, TypeError) as err:
        raise UserError(f"{where}: {err}") from err


def model_kind(cfg: DictConfig) -> str:
    """The configured model kind (`model_kind`), `trained` while it is `auto` and no checkpoint is resolved yet."""
    kind = str(cfg.get("model_kind") or "auto")
    if kind not in (*MODEL_KINDS, "auto"):
        raise UserError(f"model_kind={kind!r}: choose one of: auto, {', '.join(MODEL_KINDS)}")
    return "trained" if kind == "auto" else kind


def _group_template(group: DictConfig, kind: str, where: str) -> tuple[Any, bool]:
    """(the template a benchmark group names for this model kind, whether it names one per kind)."""
    template = group.get("prompt")
    if not OmegaConf.is_dict(template):
        return template, False
    given = set(template.keys())
    if given != set(MODEL_KINDS):
        raise UserError(
            f"{where}: prompt for {list(group.names)} names {sorted(given)}; a prompt per model kind names exactly "
            f"{', '.join(MODEL_KINDS)} (a template name or null each)"
        )
    return template[kind], True


def resolve_plan(cfg: DictConfig, kind: str | None = None) -> Plan:
    """The plan of `cfg.protocol` (with `cfg.only`, when set, keeping only those benchmarks), its prompts those of
    model kind `kind` (None: `cfg.model_kind`, `trained` while auto)."""
    p = cfg.protocol
    name = str(p.name)
    where = f"protocol {name} (conf/eval/protocol/{name}.yaml)"
    model = kind or model_kind(cfg)
    if model not in MODEL_KINDS:
        raise UserError(f"model_kind={model!r}: choose one of: auto, {', '.join(MODEL_KINDS)}")
    by_kind: list[str] = []
    base = OmegaConf.to_container(p.sampling, resolve=True) or {}
    sweep = OmegaConf.to_container(p.sweep, resolve=True) if p.sweep else {}
    if len(sweep) > 1:
        raise UserError(f"{where}: sweep names {sorted(sweep)}; a protocol sweeps one sampling key")
    sweep_values = [(key, v) for key, values in sweep.items() for v in values] or [None]
    files = OmegaConf.to_container(p.files, resolve=True) if p.get("files") else {}
    if not isinstance(files, dict):
        raise UserError(f"{where}: files must map benchmark names to data files, not {files!r}")
    override = cfg.get("prompt")  # conf/eval.yaml `prompt`: every math group asked so (`prepared`: as prepared)
    entries: list[BenchmarkPlan] = []
    for point in sweep_values:
        for group in p.benchmarks:
            kind = str(group.kind)
            if kind not in KINDS:
                raise UserError(f"{where}: kind {kind!r} not known; choose one of: {', '.join(KINDS)}")
            n = group.n
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise UserError(f"{where}: n={n!r} for {list(group.names)}: must be an integer >= 1")
            metrics = tuple(str(m) for m in group.metrics)
            if kind != "wildbench":
                for m in metrics:
                    try:
                        check_metric(m, n)
                    except ValueError as err:
                        raise UserError(f"{where}: {err}") from err
            overrides = {**base, **({"max_tokens": group.max_tokens} if group.get("max_tokens") else {})}
            if point is not None:
                overrides[point[0]] = point[1]
            sampling = _sampling(cfg, where, overrides)
            template, per_kind = _group_template(group, model, where)
            if (template is not None or per_kind) and kind != "math":
                raise UserError(f"{where}: prompt for {list(group.names)}: only kind math groups name one")
            if override is not None and kind == "math":
                template, per_kind = (None if str(override) == PREPARED else override), False
            if per_kind:
                by_kind += [str(b) for b in group.names or [] if str(b) not in by_kind]
            for bench in group.names or []:
                label = str(bench) if point is None else f"{bench}/{point[0]}={point[1]}"
                file = files.get(str(bench))
                prompt = benchmark_prompt(str(bench), None if template is None else str(template), file)
                entries.append(BenchmarkPlan(str(bench), label, kind, n, metrics, sampling, point, file, prompt))
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{where}: a benchmark is listed twice: {labels}")
    unused = sorted(set(files) - {e.name for e in entries})
    if unused:
        raise UserError(f"{where}: files names {unused}, not benchmarks of the protocol")
    if cfg.get("only"):
        known = list(dict.fromkeys(e.name for e in entries))
        unknown = [b for b in cfg.only if b not in known]
        if unknown:
            raise UserError(f"only={list(cfg.only)}: {unknown} not in {where}; choose from: {', '.join(known)}")
        entries = [e for e in entries if e.name in set(cfg.only)]
    if not entries:
        raise UserError(f"{where} names no benchmarks: set benchmarks.math and/or benchmarks.wildbench")
    kept = {e.name for e in entries}
    return Plan(name, str(p.paper), tuple(entries), model, tuple(b for b in by_kind if b in kept))


def check_eval_config(cfg: DictConfig, here: bool = True) -> None:
    """Everything that can be checked before any model is loaded or any work done; a UserError names the
    first key that cannot work. `here=False` (a job about to be submitted to SLURM): the checkpoint and the
    cache directory are paths of the compute nodes, so only that a checkpoint is given and the settings."""
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise UserError("no checkpoint: python -m eval.run ckpt=/path/to/checkpoint")
    if here and str(cfg.generator.get("url", "auto")) == "auto":  # else an OpenAI-compatible server has the model
        if not is_run_or_checkpoint(str(cfg.ckpt)):  # those are resolved to their model by eval.run, after the checks
            check_model_source(
                "ckpt", str(cfg.ckpt)
            )  # a model directory, or a Hub id in the cache or on a reachable Hub
    s = cfg.sampling
    for key, value, ok, what in (
        ("sampling.n", s.n, lambda v: v >= 1, "an integer >= 1"),
        ("sampling.n_wildbench", s.n_wildbench, lambda v: v >= 1, "an integer >= 1"),
        ("sampling.max_tokens", s.max_tokens, lambda v: v >= 1, "an integer >= 1"),
        ("sampling.temperature", s.temperature, lambda v: v >= 0, "a number >= 0"),
        ("sampling.top_p", s.top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
        ("limit", cfg.limit, lambda v: v is None or v >= 1, "null or an integer >= 1"),
        ("structure.batch_size", cfg.structure.batch_size, lambda v: v >= 1, "an integer >= 1"),
    ):
        if isinstance(value, bool) or not (value is None or isinstance(value, (int, float))) or not ok(value):
            raise UserError(f"{key}={value!r}: must be {what}")
    torch_threads.check_setting(cfg.get("torch_threads", "auto"), "torch_threads")
    if here:
        check_writable_dir(cfg.cache_dir, "cache_dir")


def prepare_hint(name: str) -> str:
    """How to build a benchmark's data: the prepare command, and whether its data config exists yet."""
    command = f"python -m sarl.data.prepare dataset={name}"
    if not (DATA_CONF / f"{name}.yaml").is_file():
        command += f" (conf/data/{name}.yaml is not written yet: add it first)"
    return command


def check_runnable(plan: Plan, data_dir: str | Path) -> None:
    """A UserError naming the first benchmark whose data is missing (and how to prepare it)."""
    for e in plan.entries:
        path = e.path(data_dir)
        if e.file and not path.is_file():  # the protocol's own file: nothing to prepare
            raise UserError(f"benchmark {e.name!r} of protocol {plan.protocol}: {e.file} ({path}) is not a file")
        if not path.exists():
            raise UserError(
                f"benchmark {e.name!r} of protocol {plan.protocol}: {path} does not exist; prepare it first "
                f"({prepare_hint(e.name)}) or set paths.data_dir"
            )


def format_plan(plan: Plan, data_dir: str | Path) -> str:
    """The plan as the dry run prints it: one line per benchmark run."""
    groups = plan.groups()
    lines = [
        f"protocol {plan.protocol} ({plan.paper}): {len(plan.entries)} benchmark runs, {len(groups)} sampling "
        f"setting(s); data under {data_dir}",
    ]
    header = ("benchmark", "kind", "scoring", "n", "k", "seeds", "metrics", "max_tokens", "temp", "top_p", "top_k",
              "prompt")  # fmt: skip
    rows = [header]
    for e in plan.entries:
        s = e.sampling
        rows.append(
            (
                e.label,
                e.kind,
                SCORING[e.kind].split(" ")[0],
                str(e.n),
                ",".join(map(str, e.ks)) if e.kind != "wildbench" else "-",
                str(e.seeds) if e.seeds else "-",
                ",".join(e.metrics),
                str(s.max_tokens),
                f"{s.temperature:g}",
                f"{s.top_p:g}",
                str(s.top_k) if s.top_k else "-",
                (e.prompt.template if e.prompt and e.prompt.template else "prepared"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    kwargs = {repr(e.sampling.chat_template_kwargs) for e in plan.entries}
    lines.append(f"chat_template_kwargs: {', '.join(sorted(kwargs))}")
    if plan.by_kind:
        other = next(k for k in MODEL_KINDS if k != plan.model_kind)
        lines.append(
            f"model_kind {plan.model_kind}: {', '.join(plan.by_kind)} asked with the prompt for {plan.model_kind} "
            f"models (model_kind=auto: trained for a checkpoint a sarl.train run wrote, else base; model_kind={other} "
            "shows the other)"
        )
    lines += format_prompts([e for e in plan.entries if e.prompt])
    shipped = {e.name: e.file for e in plan.entries if e.file}
    lines += [f"data of {n}: {file}" for n, file in shipped.items()]
    missing = {e.name: e for e in plan.entries if not e.path(data_dir).exists()}
    for n, e in missing.items():
        lines.append(f"data missing: {n}: " + (f"{e.file} does not exist" if e.file else prepare_hint(n)))
    if any(e.kind == "code" for e in plan.entries):
        lines.append("code benchmarks: each sample's last code block runs against the tests (code.sandbox)")
    return "\n".join(lines) + "\n"


@dataclass
class Benchmark:
    """A planned benchmark with its problems, as the stages of eval.run use it."""

    name: str
    kind: str  # "math" | "wildbench" | "code"
    problems: list[Problem]
    n_samples: int
    plan: BenchmarkPlan | None = None

    @property
    def label(self) -> str:
        return self.plan.label if self.plan else self.name


def load_benchmarks(cfg: DictConfig, entries: Iterable[BenchmarkPlan]) -> list[Benchmark]:
    """The problems of each planned benchmark (each file read once), asked by the benchmark's prompt."""
    read: dict[str, list[Problem]] = {}
    asked: dict[tuple[str, str], list[Problem]] = {}
    out = []
    for e in entries:
        if e.name not in read:
            read[e.name] = load_benchmark(e.path(cfg.paths.data_dir), e.name, e.kind, cfg.limit)
        key = (e.name, repr(e.prompt.describe()) if e.prompt else "")
        if key not in asked:
            asked[key] = ask(read[e.name], e.name, e.prompt) if e.prompt else read[e.name]
        out.append(Benchmark(e.name, e.kind, asked[key], e.n, e))
        log.info("%s (%s): %d problems x %d samples", e.label, e.kind, len(asked[key]), e.n)
    return out
