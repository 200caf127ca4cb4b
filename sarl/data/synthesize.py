"""Teacher-synthesised SFT sets for the methods whose papers fine-tune before RL.

    python -m sarl.data.synthesize recipe=grp_math source=deepscaler input_file=deepscaler.json \\
        teacher.url=http://HOST:PORT/v1 teacher.model=NAME
    python -m sarl.data.synthesize recipe=grp_code source=kodcode input_file=kodcode_sft_r1.parquet ...
    python -m sarl.data.synthesize recipe=structured source=s1k input_file=s1k.parquet ...
    python -m sarl.data.synthesize recipe=grp_math teacher.url=auto teacher.model=/path/to/model   # starts vLLM

Recipes (conf/synthesize/recipe/, each number cited there):

- GRP (`grp_math`, `grp_code`; GRP Sec. 3.1.3, App. C-D): per problem, sample a trace from the teacher and
  verify its final answer against the gold with `eval.grading`, regenerating up to a bound (grp_code reads the
  data set's own test-verified R1 trace instead); translate the verified trace into the graph format with
  App. C's prompt; check the graph with the project's parser (`baselines.grp.parse_graph` and the format
  rules of Sec. 3.2.1) and, optionally, with the teacher as App. D's verifier (node-label consistency,
  parent-child coherence); on a failure re-translate with the failures as feedback, up to a bound. A verified
  trace that never becomes a valid graph is kept as a plain CoT example ("mixed reasoning formats").
- Structured Reasoning (`structured`; Sec. 3/4.1 Eq. 1, App. E.1, A.8, A.14): answer each question several
  times with randomised tag orderings through the fill-in-the-middle prefix of App. A.14; keep the samples
  that are correct (`eval.grading`) and pass the tag checker (`baselines.structured_prompt`); then keep the
  problems with the lowest correctness rate (at least one correct) and the richest tag usage.

Writes, under `out_dir`: `train.parquet` (verl's multi-turn SFT layout: a `messages` column), `train.trl.jsonl`
(TRL's conversational prompt-completion rows: loss on the completion only), `manifest.json` (teacher, prompt
files and their SHA-256, counts per stage, rejection reasons) and `cache.jsonl` (one line per finished
problem, keyed by problem, prompts, recipe and teacher: a rerun asks the teacher nothing for those).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import random
import re
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from sarl.errors import UserError, check_output_file, check_writable_dir, composition_error_message, debug_requested

log = logging.getLogger("sarl.data.synthesize")

CONF_DIR = Path(__file__).resolve().parent.parent.parent / "conf"
SYNTH_DIR = CONF_DIR / "synthesize"
PROMPTS_DIR = SYNTH_DIR / "prompts"
METHODS = ("grp", "structured")
TASKS = ("math", "code")
EXIT_INCOMPLETE = 3
EXIT_INTERRUPTED = 130
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


# ---------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------


def register_recipes(store: Any = None) -> None:
    """Every conf/synthesize/recipe/NAME.yaml as option NAME of the `recipe` group of conf/synthesize.yaml."""
    from hydra.core.config_store import ConfigStore

    store = store or ConfigStore.instance()
    for path in sorted((SYNTH_DIR / "recipe").glob("*.yaml")):
        store.store(group="recipe", name=path.stem, node=OmegaConf.load(path), package="recipe")


def compose_synthesize_config(overrides: list[str]) -> DictConfig:
    """conf/synthesize.yaml with Hydra overrides; a misspelt key or an unknown recipe is a UserError."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_recipes()
    # sarl.data.prepare registers a `dataset` config group in Hydra's process-wide ConfigStore when it is
    # imported; here `dataset` is a plain key (source=prepared), which Hydra would read as that group
    repo = ConfigStore.instance().repo
    hidden = repo.pop("dataset", None)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_synthesize"):
            cfg = compose(config_name="synthesize", overrides=overrides)
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(composition_error_message(err)) from err
    finally:
        if hidden is not None:
            repo["dataset"] = hidden
    cfg.out_dir = str(Path(str(cfg.out_dir)).resolve())
    return cfg


# ---------------------------------------------------------------------------------------------------------
# Prompt files
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """A prompt template from conf/synthesize/prompts/: its text without the leading `##` provenance lines,
    and the SHA-256 of that text (what the manifest and the cache key record)."""

    name: str
    text: str
    sha256: str

    def render(self, **values: str) -> str:
        """`{name}` placeholders replaced in one pass (a value is never searched again, so a question that
        contains "{trace}" stays as written); other braces (JSON, LaTeX) are kept."""
        missing = [m for m in dict.fromkeys(_PLACEHOLDER.findall(self.text)) if m in values and values[m] is None]
        if missing:
            raise ValueError(f"prompt {self.name}: no value for {missing}")
        return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), self.text)


def load_prompt(name: str, prompts_dir: Path = PROMPTS_DIR) -> Prompt:
    path = prompts_dir / name
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist; the recipe's prompts.* names a file of {prompts_dir}")
    lines = path.read_text(encoding="utf-8").split("\n")
    while lines and lines[0].startswith("##"):
        lines.pop(0)
    text = "\n".join(lines)
    text = text[:-1] if text.endswith("\n") else text  # the editor's final newline is not part of the prompt
    return Prompt(name, text, hashlib.sha256(text.encode("utf-8")).hexdigest())


# ---------------------------------------------------------------------------------------------------------
# Problems
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Problem:
    """One problem: its id, question, accepted gold answers (empty for code) and, for a recipe that reads
    traces from the data set, the data set's verified trace."""

    id: str
    question: str
    golds: list[str]
    trace: str | None = None


def _truthy(value: Any) -> bool:
    return (
        value is True
        or (isinstance(value, (int, float)) and value == 1)
        or str(value).strip().lower()
        in (
            "true",
            "1",
            "yes",
            "pass",
            "passed",
        )
    )


def _trace_text(value: Any) -> str | None:
    """A trace column: a string, or a conversation (list of {role|from, content|value}) -> its last
    non-user turn (KodCode-V1-SFT-R1's `conversations`)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, list):
        for turn in reversed(value):
            if isinstance(turn, Mapping):
                role = turn.get("role", turn.get("from"))
                text = turn.get("content", turn.get("value"))
                if role not in ("user", "human", "system") and isinstance(text, str) and text.strip():
                    return text.strip()
    return None


def load_problems(cfg: DictConfig) -> tuple[list[Problem], dict[str, Any], Counter]:
    """The problems of `source` (the recipe's paper data when null), the source record for the manifest and
    the rows skipped, by reason."""
    from eval.grading import extract_answer, gold_answers
    from sarl.data.sources import DataSourceError, load_local_file

    sources = OmegaConf.to_container(OmegaConf.load(SYNTH_DIR / "sources.yaml"), resolve=True)
    name = cfg.source or cfg.recipe.source
    if name not in sources:
        raise UserError(
            f"source={name} is not known; choose one of: {', '.join(sources)} (conf/synthesize/sources.yaml)"
        )
    spec = sources[name]
    fields = {**(spec.get("fields") or {}), **OmegaConf.to_container(cfg.fields)}
    skipped: Counter = Counter()
    if spec["format"] == "prepared":
        if not cfg.dataset:
            raise UserError("source=prepared needs dataset=NAME (a set built by python -m sarl.data.prepare)")
        path = Path(cfg.paths.data_dir) / str(cfg.dataset) / f"{cfg.split}.trl.jsonl"
        if not path.is_file():
            raise UserError(
                f"dataset={cfg.dataset}: {path} does not exist; "
                f"build it: python -m sarl.data.prepare dataset={cfg.dataset}"
            )
        data_cfg = CONF_DIR / "data" / f"{cfg.dataset}.yaml"
        suffix = cfg.strip_suffix
        data_spec = OmegaConf.load(data_cfg) if data_cfg.is_file() else OmegaConf.create({})
        if data_spec.get("prompt_style") == "structured":
            raise UserError(
                f"dataset={cfg.dataset} holds tagged prompts (prompt_style: structured), not plain questions; "
                "use its plain counterpart (e.g. dataset=aime_1983_2024)"
            )
        if suffix is None:
            suffix = data_spec.get("prompt_suffix")
        try:
            loaded = load_local_file(str(cfg.dataset), path)
        except DataSourceError as err:
            raise UserError(str(err)) from err
        rows = []
        for r in loaded.rows:
            info = r.get("extra_info") or {}
            question = str(info.get("user_prompt", ""))
            if suffix and question.endswith(suffix):
                question = question[: -len(suffix)]
            rows.append(
                {"id": info.get("id", info.get("index")), "question": question, "answer": r.get("ground_truth")}
            )
        fields = {"id": "id", "question": "question", "answer": "answer"}
        record = {**loaded.record, "source": "prepared", "dataset": cfg.dataset, "stripped_suffix": suffix}
    else:
        if not cfg.input_file:
            raise UserError(
                f"source={name} reads a local copy of its data: pass input_file=/path/to/file "
                f"(.json, .jsonl, .parquet or .csv; {spec.get('about', 'see conf/synthesize/sources.yaml')})"
            )
        try:
            loaded = load_local_file(name, Path(str(cfg.input_file)))
        except DataSourceError as err:
            raise UserError(str(err)) from err
        rows, record = loaded.rows, {**loaded.record, "source": name}
    needs_trace = cfg.recipe.get("trace_source") == "dataset"
    needs_gold = cfg.recipe.task == "math"
    for key in ("question",) + (("trace",) if needs_trace else ()) + (("answer",) if needs_gold else ()):
        col = fields.get(key)
        if not col or (rows and col not in rows[0]):
            raise UserError(
                f"source={name}: fields.{key}={col} is not a column of the input "
                f"(columns: {', '.join(list(rows[0])[:20])}); "
                f"set fields.{key}=COLUMN"
            )
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        rid = row.get(fields["id"]) if fields.get("id") else None
        pid = str(rid) if rid not in (None, "") else f"{name}-{i}"
        question = row.get(fields["question"])
        if not isinstance(question, str) or not question.strip():
            skipped["no_question"] += 1
            continue
        if pid in seen:
            skipped["duplicate_id"] += 1
            continue
        golds: list[str] = []
        if needs_gold:
            raw = row.get(fields["answer"])
            if spec.get("answer_from") == "boxed":
                raw = extract_answer(raw) if isinstance(raw, str) else None
            try:
                golds = gold_answers(raw) if raw is not None else []
            except ValueError:
                golds = []
            if not golds:
                skipped["no_gold_answer"] += 1
                continue
        trace = None
        if needs_trace:
            ok_col = fields.get("trace_ok")
            if ok_col and not _truthy(row.get(ok_col)):
                skipped["trace_not_verified"] += 1
                continue
            trace = _trace_text(row.get(fields["trace"]))
            if trace is None:
                skipped["no_trace"] += 1
                continue
        seen.add(pid)
        problems.append(Problem(pid, question.strip(), golds, trace))
        if cfg.limit is not None and len(problems) >= int(cfg.limit):
            break
    if not problems:
        raise UserError(f"source={name}: no usable problem in the input (skipped: {dict(skipped)})")
    return problems, record, skipped


# ---------------------------------------------------------------------------------------------------------
# The teacher
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Reply:
    content: str
    reasoning: str
    finish_reason: str | None


class Teacher:
    """Chat completions from an OpenAI-compatible server through `eval.openai_client.ChatClient` (the
    project's HTTP client: a total deadline per attempt, retries)."""

    def __init__(self, url: str, model: str, t: Mapping[str, Any]) -> None:
        from eval.openai_client import ChatClient, api_key_from_env

        self.model = model
        self.extra_body = dict(t.get("extra_body") or {})
        self.client = ChatClient(
            url,
            api_key=api_key_from_env(t.get("api_key_env")),
            timeout_s=float(t["timeout_s"]),
            max_retries=int(t["max_retries"]),
            backoff_s=float(t["backoff_s"]),
        )

    def chat(self, messages: list[dict[str, Any]], sampling: Mapping[str, Any], extra: Mapping[str, Any] = ()) -> Reply:
        payload = {"model": self.model, "messages": messages, **dict(sampling), **self.extra_body, **dict(extra)}
        payload = {k: v for k, v in payload.items() if v is not None}
        body = self.client.chat(payload)
        try:
            choice = body["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError, AttributeError):
            return Reply("", "", "malformed")
        content = message.get("content")
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        return Reply(
            content if isinstance(content, str) else "",
            reasoning if isinstance(reasoning, str) else "",
            choice.get("finish_reason"),
        )

    @property
    def requests(self) -> int:
        return self.client.counts["requests"]

    def close(self) -> None:
        self.client.close()


def check_teacher(url: str, model: str, timeout_s: float = 10.0, key: str = "teacher") -> list[str] | None:
    """Once, before any work: the server answers `GET {base}/models`. A connection failure is a UserError;
    when the server lists its models and `model` is not among them, a UserError naming the ones it serves.
    Returns the served names (None when the server does not list them)."""
    import httpx

    from eval.openai_client import api_base

    try:
        base = api_base(url)
    except ValueError as err:
        raise UserError(f"{key}.url: {err}") from err
    try:
        resp = httpx.get(f"{base}/models", timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as err:
        raise UserError(
            f"{key}.url={url} is unreachable ({type(err).__name__}: {err}); start the server or fix the URL"
            + (", or pass teacher.url=auto to start vLLM on teacher.model" if key == "teacher" else "")
        ) from err
    try:
        served = [m["id"] for m in resp.json()["data"]] if resp.is_success else None
    except (ValueError, KeyError, TypeError):
        served = None
    if served is not None and model not in served:
        raise UserError(f"{key}.model={model} is not served by {url}; it serves: {', '.join(served) or 'nothing'}")
    return served


@contextlib.contextmanager
def teacher_endpoint(cfg: DictConfig, out_dir: Path) -> Iterator[str]:
    """The teacher's URL: `teacher.url`, or for `auto` a vLLM server on `teacher.model` started the way
    `eval.run` starts its generation server (`sarl.embed.server.VLLMServer`) and stopped by its process id
    when the command ends."""
    t = cfg.teacher
    if t.url != "auto":
        yield str(t.url)
        return
    from sarl.embed.server import VLLM_CPU_ARGS, VLLM_CPU_ENV, VLLMServer

    s = t.server
    server = VLLMServer(
        str(t.model),
        served_name=str(t.model),
        python=str(s.python or sys.executable),
        port=s.port,
        gpu_memory_utilization=s.gpu_memory_utilization,
        max_model_len=s.max_model_len,
        extra_args=[*(VLLM_CPU_ARGS if s.cpu else ()), *[str(a) for a in s.extra_args]],
        env=dict(VLLM_CPU_ENV) if s.cpu else {},
        startup_timeout_s=s.startup_timeout_s,
        log_path=out_dir / "teacher_vllm_server.log",
    )
    try:
        server.start()
    except Exception as err:  # noqa: BLE001 - a server that does not come up is the user's to fix
        raise UserError(
            f"teacher.url=auto: vLLM did not start on teacher.model={t.model} ({err}); log: {server.log_path}"
        ) from err
    try:
        yield server.url + "/v1"
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------


def _reason(text: str) -> str:
    """A rejection reason with its numbers replaced by N (so reasons count together in the manifest)."""
    return re.sub(r"-?\d+", "N", text)


def full_trace(reply: Reply) -> str:
    """The teacher's answer as one response: `<think>reasoning</think>` before the content when the server
    returns the reasoning separately (vLLM's reasoning parser, DeepSeek's API)."""
    content = reply.content.strip()
    if reply.reasoning.strip():
        return f"<think>\n{reply.reasoning.strip()}\n</think>\n\n{content}"
    return content


def graph_issues(parse: Any, golds: Sequence[str], task: str, grader: Any) -> list[tuple[str, str]]:
    """(violation type, message naming the node) for a translated graph: the parse error of
    `baselines.grp.parse_graph`, GRP's format rules (Sec. 3.2.1: known nodes have no parents, an aggregate
    node > 1 parent, a refine node exactly 1, an aggregate or refine label wraps exactly one node, nodes in
    one label are parallel), parents that are no node, cycles, and the answer: present, and for math equal to
    the gold (`eval.grading`). Empty when the graph passes."""
    import networkx as nx

    from baselines.grp import _gradable, reasoning_graph
    from eval.grading import extract_answer

    if parse.error is not None:
        return [("format", parse.error)]
    issues: list[tuple[str, str]] = []
    ids = {n.id for n in parse.nodes}
    for n in parse.nodes:
        for p in n.parents:
            if p not in ids:
                issues.append(("dangling_parent", f"node {n.id} lists parent {p}, which is no node"))
    g, _ = reasoning_graph(parse)
    if not nx.is_directed_acyclic_graph(g):
        cycle = [u for u, _ in nx.find_cycle(g)]
        issues.append(("cycle", f"nodes {cycle} form a cycle; a node's parents must come before it"))
    block_size = [len(b) for b in parse.blocks]
    for n in parse.nodes:
        k = len(set(g.predecessors(n.id)))
        if n.label == "known" and k != 0:
            issues.append(("known_has_parents", f"node {n.id} (<known>) has parents; a known node has none"))
        elif n.label == "aggregate" and k < 2:
            issues.append(("aggregate_parents", f"node {n.id} (<aggregate>) has {k} parent(s); it needs more than one"))
        elif n.label == "refine" and k != 1:
            issues.append(("refine_parents", f"node {n.id} (<refine>) has {k} parents; it needs exactly one"))
        if n.label in ("aggregate", "refine") and block_size[n.block] != 1:
            issues.append(
                (
                    f"{n.label}_block_size",
                    f"node {n.id}: its <{n.label}> block holds {block_size[n.block]} nodes; it must wrap exactly one",
                )
            )
    for b, members in enumerate(parse.blocks):
        inside = set(members)
        for nid in members:
            bad = sorted(set(g.predecessors(nid)) & inside)
            if bad:
                issues.append(
                    (
                        "not_parallel",
                        f"node {nid} has parent(s) {bad} in its own label block; nodes in one block must be parallel",
                    )
                )
    if not parse.answer:
        issues.append(("no_answer", "there is no non-empty <answer>...</answer> after </think>"))
    elif task == "math":
        pred = extract_answer(_gradable(parse.answer))
        if pred is None or not grader.check_any(pred, golds).ok:
            issues.append(("answer_mismatch", "the <answer> block does not state the trace's verified final answer"))
    return issues


def parse_verdict(text: str) -> dict[str, Any] | None:
    """The verifier's JSON verdict (App. D) {"passed": bool, "issues": [...]}, or None if there is none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        obj = json.loads(text[start : end + 1])
    except (ValueError, RecursionError):
        return None
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("passed"), bool)
        or not isinstance(obj.get("issues", []), list)
    ):
        return None
    issues = [i for i in obj.get("issues", []) if isinstance(i, dict)]
    if obj["passed"] == bool(issues):  # "passed" must agree with the issues
        return None
    return {"passed": obj["passed"], "issues": issues}


def structured_issues(text: str) -> list[tuple[str, str]]:
    """Why a response fails the tag checker (`baselines.structured_prompt`: `format_score` 1 and no unknown
    tag): [(reason, message)], empty when it passes."""
    from baselines.structured_prompt import format_score, parse_structured
    from eval.grading import extract_answer

    p = parse_structured(text, "tags")
    if format_score(p) == 1.0 and p.unknown_tags == 0:
        return []
    out = []
    if not p.closed:
        out.append(("not_closed", "the reasoning is not closed by </think>"))
    if not any(s.tag for s in p.steps):
        out.append(("no_tagged_step", "no step starts with one of the tags"))
    if p.untagged_prefix:
        out.append(("untagged_prefix", "the reasoning starts with text before the first tag"))
    if p.unknown_tags:
        out.append(("unknown_tags", f"{p.unknown_tags} tag(s) that are not among the allowed ones"))
    if extract_answer(p.text) is None:
        out.append(("no_boxed_answer", "no \\boxed{ } answer after </think>"))
    return out or [("format", "the response fails the format check")]


# ---------------------------------------------------------------------------------------------------------
# Per-problem pipelines (run on a thread pool; every teacher call goes through `Teacher`)
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Context:
    recipe: dict[str, Any]
    teacher: Teacher  # samples the traces
    grader: Any
    prompts: dict[str, Prompt]
    seed: int
    translator: Teacher | None = None  # GRP: translates and verifies (None: the teacher)

    @property
    def graph_teacher(self) -> Teacher:
        return self.translator or self.teacher


@dataclass
class Tally:
    stages: Counter = field(default_factory=Counter)
    rejections: Counter = field(default_factory=Counter)

    def reject(self, stage: str, reason: str) -> None:
        self.rejections[f"{stage}/{_reason(reason)}"] += 1


def _verified(ctx: Context, problem: Problem, reply: Reply) -> str | None:
    """None when the reply is a usable, correct trace; else the rejection reason."""
    from eval.grading import extract_answer

    if reply.finish_reason == "length":
        return "truncated"
    trace = full_trace(reply)
    if not trace:
        return "empty"
    if ctx.recipe["task"] == "code":
        return None
    pred = extract_answer(trace)
    if pred is None:
        return "no_answer"
    return None if ctx.grader.check_any(pred, problem.golds).ok else "wrong_answer"


def unusable_gold(ctx: Context, problem: Problem, tally: Tally) -> bool:
    """A math problem none of whose gold answers math-verify can parse could never verify a trace: it is
    rejected (`input/gold_does_not_parse`) before any teacher call."""
    if ctx.recipe["task"] != "math" or any(ctx.grader.parses(g).ok for g in problem.golds):
        return False
    tally.reject("input", "gold_does_not_parse")
    return True


def synthesize_grp(problem: Problem, ctx: Context) -> dict[str, Any]:
    """GRP Sec. 3.1.3 for one problem: a verified trace, its graph translation checked and re-translated with
    feedback (App. C-D), or the trace kept as plain CoT when no valid graph comes out."""
    r, tally = ctx.recipe, Tally()
    tally.stages["problems"] += 1
    if r["trace_source"] == "teacher" and unusable_gold(ctx, problem, tally):
        return {"id": problem.id, "examples": [], **_tally(tally)}
    student_prompt = ctx.prompts["sample"].render(question=problem.question)
    trace = None
    if r["trace_source"] == "dataset":
        trace = problem.trace
        tally.stages["traces_from_dataset"] += 1
    else:
        for attempt in range(1 + int(r["sample"]["max_retries"])):
            tally.stages["sample_requests"] += 1
            reply = ctx.teacher.chat([{"role": "user", "content": student_prompt}], r["sample"]["sampling"])
            why = _verified(ctx, problem, reply)
            if why is None:
                trace = full_trace(reply)
                tally.stages["traces_verified"] += 1
                tally.stages["verified_first_try" if attempt == 0 else "verified_after_regeneration"] += 1
                break
            tally.reject("sample", why)
    examples: list[dict[str, str]] = []
    if trace is None:
        tally.stages["no_verified_trace"] += 1
        return {"id": problem.id, "examples": examples, **_tally(tally)}
    translate = ctx.prompts["translate"].render(question=problem.question, trace=trace)
    request, graph = translate, None
    t = r["translate"]
    for attempt in range(int(t["max_attempts"])):
        tally.stages["translate_requests"] += 1
        reply = ctx.graph_teacher.chat([{"role": "user", "content": request}], t["sampling"])
        candidate = reply.content.strip()
        if reply.finish_reason == "length":
            issues = [("truncated", "the translation was cut off by the length limit; write it more concisely")]
        else:
            from baselines.grp import parse_graph

            issues = graph_issues(parse_graph(candidate), problem.golds, r["task"], ctx.grader)
        stage = "check"
        if not issues and t["llm_verify"]:
            stage = "verify"
            issues = _llm_verify(ctx, problem, candidate, tally)
        if not issues:
            graph = candidate
            tally.stages["graphs_first_try" if attempt == 0 else "graphs_after_feedback"] += 1
            break
        for kind, _ in dict.fromkeys(issues):
            tally.reject(stage, kind)
        feedback = "\n".join(f"- [{kind}] {msg}" for kind, msg in dict.fromkeys(issues))
        request = ctx.prompts["refine"].render(translation_prompt=translate, graph=candidate, feedback=feedback)
    if graph is not None:
        examples.append({"kind": "graph", "prompt": student_prompt, "completion": graph})
    else:  # a candidate for the mixed-format remainder; `cot_remainder` decides on it in `grp_examples`
        tally.stages["unconverted"] += 1
        examples.append({"kind": "cot", "prompt": student_prompt, "completion": trace})
    return {"id": problem.id, "examples": examples, **_tally(tally)}


def _llm_verify(ctx: Context, problem: Problem, graph: str, tally: Tally) -> list[tuple[str, str]]:
    """App. D's check by the teacher: [] when it passes, else the issues; a verdict that is not the asked
    JSON is asked again, up to `verify_attempts` times, then rejects the graph."""
    v = ctx.recipe["translate"]
    request = ctx.prompts["verify"].render(question=problem.question, graph=graph)
    for _ in range(int(v["verify_attempts"])):
        tally.stages["verify_requests"] += 1
        reply = ctx.graph_teacher.chat([{"role": "user", "content": request}], v["verify_sampling"])
        verdict = parse_verdict(reply.content)
        if verdict is None:
            tally.reject("verify", "unparseable_verdict")
            continue
        out = []
        for issue in verdict["issues"]:
            kind = issue.get("type") if issue.get("type") in ("node_label", "parent_child") else "other"
            out.append((kind, f"node {issue.get('node')}: {issue.get('problem', '')}".strip()))
        return out
    return [("unparseable_verdict", "the verification could not be completed")]


def grp_examples(results: Sequence[dict[str, Any]], keep: Mapping[str, Any], seed: int, stages: Counter) -> list[dict]:
    """The graph examples and the mixed-format remainder (GRP Sec. 3.1.3, "Supervised Fine-Tuning with Mixed
    Reasoning Formats"): the unconverted CoT traces if `keep.keep`, a fixed hashed share `keep.fraction` of
    them (decided here, after the cache, so changing it asks the teacher nothing)."""
    out = []
    for res in results:
        for ex in res["examples"]:
            if ex["kind"] == "cot" and not (keep["keep"] and _share(res["id"], seed) < float(keep["fraction"])):
                stages["unconverted_dropped"] += 1
                continue
            out.append({"id": res["id"], **ex})
    return out


def _share(key: str, seed: int) -> float:
    """A deterministic number in [0, 1) per (seed, key): which unconverted traces a fraction keeps."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def _tally(t: Tally) -> dict[str, Any]:
    return {"stages": dict(t.stages), "rejections": dict(t.rejections)}


def structured_request(ctx: Context, problem: Problem, tags: Sequence[str]) -> tuple[list[dict[str, Any]], dict, str]:
    """(messages, extra body, the text the reply continues) of one App. A.14 fill-in-the-middle request.

    prefill "deepseek": the assistant message of App. A.14 verbatim (`reasoning_content` = the prefix,
    `prefix: True`, DeepSeek's prefix completion); "continue": the prefix as the start of the assistant turn
    inside `<think>` with `continue_final_message` (vLLM's way); "none": no prefix."""
    prompt = ctx.prompts["sample"].render(question=problem.question, tags=", ".join(f"<{t}>" for t in tags))
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    prefix = ctx.prompts["prefill"].text
    mode = ctx.recipe["prefill"]
    if mode == "deepseek":
        messages.append({"role": "assistant", "reasoning_content": prefix, "content": "", "prefix": True})
        return messages, {}, prefix
    if mode == "continue":
        messages.append({"role": "assistant", "content": "<think>\n" + prefix})
        return messages, {"continue_final_message": True, "add_generation_prompt": False}, prefix
    return messages, {}, ""


def _structured_text(reply: Reply, mode: str, prefix: str) -> str:
    """The whole response of a prefilled request: the prefix joined to what the teacher continued."""
    if mode == "deepseek":
        return f"<think>\n{prefix}{reply.reasoning.rstrip()}\n</think>\n\n{reply.content.strip()}"
    if mode == "continue":
        return f"<think>\n{prefix}{reply.content}".rstrip()
    return full_trace(reply)


def synthesize_structured(problem: Problem, ctx: Context) -> dict[str, Any]:
    """Structured Reasoning App. E.1 for one question: `samples_per_problem` answers with randomised tag
    orderings, each checked for correctness (`eval.grading`) and format (the tag checker); the selection
    across problems happens in `select_structured`."""
    from baselines.structured_prompt import TAGS, parse_structured
    from eval.grading import extract_answer

    r, tally = ctx.recipe, Tally()
    tally.stages["problems"] += 1
    samples: list[dict[str, Any]] = []
    if unusable_gold(ctx, problem, tally):
        return {"id": problem.id, "samples": samples, **_tally(tally)}
    for k in range(int(r["samples_per_problem"])):
        digest = hashlib.sha256(f"{ctx.seed}:{problem.id}:{k}".encode("utf-8", "surrogatepass")).digest()
        tags = list(TAGS)
        random.Random(int.from_bytes(digest[:8], "little")).shuffle(tags)
        messages, extra, prefix = structured_request(ctx, problem, tags)
        mode = r["prefill"]
        text, correct, issues = "", False, []
        for attempt in range(1 + int(r["format_retries"])):
            tally.stages["sample_requests"] += 1
            reply = ctx.teacher.chat(messages, r["sampling"], extra)
            text = _structured_text(reply, mode, prefix)
            if reply.finish_reason == "length":
                tally.reject("sample", "truncated")
                issues = [("truncated", "")]
                break
            pred = extract_answer(text)
            correct = pred is not None and ctx.grader.check_any(pred, problem.golds).ok
            issues = structured_issues(text)
            if not issues:
                break
            for kind, _ in issues:
                tally.reject("format", kind)
            if attempt < int(r["format_retries"]):  # re-ask in a follow-up turn, the failure as feedback
                tally.stages["format_reasks"] += 1
                feedback = "; ".join(msg for _, msg in issues)
                tags_text = ", ".join(f"<{t}>" for t in tags)
                messages = [
                    messages[0],
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": ctx.prompts["feedback"].render(feedback=feedback, tags=tags_text)},
                ]
                extra, prefix, mode = {}, "", "none"
        tally.stages["samples"] += 1
        tally.stages["samples_correct"] += int(correct)
        format_ok = not issues
        tally.stages["samples_format_ok"] += int(format_ok)
        if not correct and not (issues and issues[0][0] == "truncated"):
            tally.reject("sample", "wrong_answer" if extract_answer(text) is not None else "no_answer")
        entry: dict[str, Any] = {"correct": correct, "format_ok": format_ok}
        if correct and format_ok:
            parsed = parse_structured(text, "tags")
            entry.update(
                completion=text, distinct_tags=len(parsed.tag_counts), tag_steps=sum(parsed.tag_counts.values())
            )
        samples.append(entry)
    return {"id": problem.id, "samples": samples, **_tally(tally)}


def select_structured(
    results: Sequence[dict[str, Any]], questions: Mapping[str, str], keep: int, stages: Counter, rejections: Counter
) -> list[dict[str, str]]:
    """App. E.1's filter: among problems with at least one correct, well-formatted sample, keep the `keep`
    with the lowest correctness rate, then the richest tag usage (distinct tags, then tagged steps), ties by
    id; each contributes its richest sample, with the structured prompt I of Eq. 2 (all 23 tags in the
    paper's order) as the student's prompt."""
    from baselines.structured_prompt import structured_prompt

    ranked = []
    for res in results:
        valid = [s for s in res["samples"] if s.get("completion")]
        if not valid:
            rejections["select/no_valid_sample"] += 1
            continue
        best = max(valid, key=lambda s: (s["distinct_tags"], s["tag_steps"]))
        rate = sum(s["correct"] for s in res["samples"]) / len(res["samples"])
        ranked.append((rate, -best["distinct_tags"], -best["tag_steps"], res["id"], best))
    ranked.sort(key=lambda x: x[:4])
    stages["problems_with_valid_sample"] = len(ranked)
    chosen = ranked[:keep]
    if len(ranked) > keep:
        rejections["select/beyond_keep"] += len(ranked) - keep
    return [
        {"id": pid, "kind": "structured", "prompt": structured_prompt(questions[pid]), "completion": best["completion"]}
        for _, _, _, pid, best in chosen
    ]


# ---------------------------------------------------------------------------------------------------------
# Cache and outputs
# ---------------------------------------------------------------------------------------------------------


def cache_key(
    problem: Problem, teacher_model: str, prompts: Mapping[str, Prompt], recipe: Mapping[str, Any], seed: int
) -> str:
    """What one problem's result depends on: the problem, the teacher, the prompt files and the recipe's
    per-problem settings (not the selection across problems)."""
    per_problem = {k: v for k, v in recipe.items() if k not in ("select", "cot_remainder", "source")}
    blob = json.dumps(
        {
            "id": problem.id,
            "question": problem.question,
            "golds": problem.golds,
            "trace": problem.trace,
            "teacher": teacher_model,
            "prompts": {k: p.sha256 for k, p in sorted(prompts.items())},
            "recipe": per_problem,
            "seed": seed,
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def read_cache(path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """key -> cached result (the last line per key wins), and the number of unreadable lines skipped (an
    interrupted write leaves at most one)."""
    out: dict[str, dict[str, Any]] = {}
    bad = 0
    if not path.is_file():
        return out, bad
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            out[obj["key"]] = obj["result"]
        except (ValueError, KeyError, TypeError):
            bad += 1
    return out, bad


def sft_rows(examples: Sequence[dict[str, str]], recipe: str, data_source: str) -> tuple[list[dict], list[dict]]:
    """(verl parquet rows, TRL jsonl rows) of the examples.

    verl 0.9.1's SFT trainer (`verl.utils.dataset.multiturn_sft_dataset`) reads the `messages` column (loss on
    the assistant turns); TRL 1.16's `SFTTrainer` reads conversational prompt-completion rows, whose loss is
    on the completion only (`completion_only_loss` defaults to on for them)."""
    parquet, trl = [], []
    for ex in examples:
        user = {"role": "user", "content": ex["prompt"]}
        assistant = {"role": "assistant", "content": ex["completion"]}
        parquet.append(
            {
                "messages": [user, assistant],
                "extra_info": {"id": ex["id"], "kind": ex["kind"], "recipe": recipe, "data_source": data_source},
            }
        )
        trl.append({"prompt": [user], "completion": [assistant]})
    return parquet, trl


# ---------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------

PROMPT_ROLES = {
    "grp": ("sample", "translate", "refine", "verify"),
    "structured": ("sample", "prefill", "feedback"),
}


def check_recipe(recipe: Mapping[str, Any]) -> None:
    if recipe.get("method") not in METHODS or recipe.get("task") not in TASKS:
        raise UserError(
            f"recipe {recipe.get('name')}: method={recipe.get('method')} task={recipe.get('task')}; "
            f"method must be one of {METHODS} and task one of {TASKS}"
        )
    if recipe["method"] == "structured" and recipe.get("prefill") not in ("deepseek", "continue", "none"):
        raise UserError(f"recipe.prefill={recipe.get('prefill')} is not valid; choose deepseek, continue or none")
    if recipe["method"] == "grp" and recipe.get("trace_source") not in ("teacher", "dataset"):
        raise UserError(f"recipe.trace_source={recipe.get('trace_source')} is not valid; choose teacher or dataset")


def synthesize(cfg: DictConfig) -> tuple[dict[str, Any], int]:
    """Runs the recipe; returns the manifest and the exit code (0, or EXIT_INCOMPLETE when some problems
    failed for good: a rerun resumes them)."""
    from eval.grading import default_grader
    from eval.openai_client import run_concurrently
    from sarl.data.sources import sha256_file
    from sarl.data.writers import write_json, write_jsonl, write_parquet

    recipe = OmegaConf.to_container(cfg.recipe, resolve=True)
    check_recipe(recipe)
    t = cfg.teacher
    if not t.url:
        raise UserError(
            "teacher.url is not set: pass teacher.url=http://HOST:PORT/v1 (an OpenAI-compatible server) "
            "or teacher.url=auto"
        )
    if not t.model:
        raise UserError(
            "teacher.model is not set: pass teacher.model=NAME (the served model; "
            "for teacher.url=auto a local model path)"
        )
    out_dir = check_writable_dir(Path(str(cfg.out_dir)), "out_dir")
    for name in ("train.parquet", "train.trl.jsonl", "manifest.json", "cache.jsonl"):
        check_output_file(out_dir / name, "out_dir")  # each a regular file (or none yet), before any work
    prompts = {role: load_prompt(str(recipe["prompts"][role])) for role in PROMPT_ROLES[recipe["method"]]}
    problems, source_record, skipped = load_problems(cfg)
    cache_path = out_dir / "cache.jsonl"
    cached, bad_lines = read_cache(cache_path)
    tr = cfg.translator
    if recipe["method"] != "grp" or (tr.url is None and tr.model is None):
        tr_url = tr_model = None
    elif tr.url == "auto" or not tr.url or not tr.model:
        raise UserError(
            f"translator.url={tr.url} translator.model={tr.model}: give both, as a running server's URL and its "
            "model (only the teacher can be started with url=auto), or neither to translate with the teacher"
        )
    else:
        tr_url, tr_model = str(tr.url), str(tr.model)
    models = str(t.model) if tr_model is None else f"{t.model} | translator {tr_url} {tr_model}"
    keys = {p.id: cache_key(p, models, prompts, recipe, int(cfg.seed)) for p in problems}
    todo = [p for p in problems if keys[p.id] not in cached]
    results: dict[str, dict[str, Any]] = {p.id: cached[keys[p.id]] for p in problems if keys[p.id] in cached}
    failed: dict[str, str] = {}
    calls = 0
    started_server = False
    with teacher_endpoint(cfg, out_dir) as url:
        started_server = t.url == "auto"
        if todo:
            check_teacher(url, str(t.model))
            t_settings = OmegaConf.to_container(t, resolve=True)
            teacher = Teacher(url, str(t.model), t_settings)
            translator = None
            if tr_url is not None:
                check_teacher(tr_url, tr_model, key="translator")
                translator = Teacher(tr_url, tr_model, t_settings)
            ctx = Context(recipe, teacher, default_grader(), prompts, int(cfg.seed), translator)
            work: Callable[[Problem, Context], dict[str, Any]] = (
                synthesize_grp if recipe["method"] == "grp" else synthesize_structured
            )
            lock = threading.Lock()
            with cache_path.open("a", encoding="utf-8") as cache:

                def on_result(p: Problem, res: dict[str, Any] | None, err: str | None) -> None:
                    if err is not None:
                        failed[p.id] = err
                        return
                    results[p.id] = res
                    with lock:
                        cache.write(
                            json.dumps({"key": keys[p.id], "id": p.id, "result": res}, ensure_ascii=False) + "\n"
                        )
                        cache.flush()

                try:
                    run_concurrently(
                        todo, lambda p: work(p, ctx), on_result, int(cfg.concurrency), f"synthesize {recipe['name']}"
                    )
                finally:
                    calls = teacher.requests + (translator.requests if translator else 0)
                    teacher.close()
                    if translator:
                        translator.close()

    stages: Counter = Counter()
    rejections: Counter = Counter({f"input/{k}": v for k, v in skipped.items()})
    ordered = [results[p.id] for p in problems if p.id in results]
    for res in ordered:
        stages.update(res["stages"])
        rejections.update(res["rejections"])
    if recipe["method"] == "structured":
        questions = {p.id: p.question for p in problems}
        examples = select_structured(ordered, questions, int(recipe["select"]["keep"]), stages, rejections)
    else:
        examples = grp_examples(ordered, recipe["cot_remainder"], int(cfg.seed), stages)
    for ex in examples:
        stages[f"examples_{ex['kind']}"] += 1
    stages["examples"] = len(examples)
    parquet_rows, trl_rows = sft_rows(examples, recipe["name"], str(source_record.get("source")))
    outputs: dict[str, Any] = {}
    parquet, trl = out_dir / "train.parquet", out_dir / "train.trl.jsonl"
    if not examples:  # no stale set from an earlier run beside a manifest that lists none
        for stale in (parquet, trl):
            stale.unlink(missing_ok=True)
    else:
        write_parquet(parquet_rows, parquet)
        write_jsonl(trl_rows, trl)
        outputs = {
            "rows": len(examples),
            "parquet": parquet.name,
            "trl": trl.name,
            "sha256": {"parquet": sha256_file(parquet), "trl": sha256_file(trl)},
        }
    complete = not failed
    manifest = {
        "recipe": recipe["name"],
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": complete,
        "teacher": {"url": str(t.url), "model": str(t.model), "started_vllm": started_server},
        "translator": {"url": tr_url, "model": tr_model} if tr_model else "the teacher",
        "prompts": {
            role: {"file": f"conf/synthesize/prompts/{p.name}", "sha256": p.sha256} for role, p in prompts.items()
        },
        "source": source_record,
        "problems": {
            "total": len(problems),
            "finished": len(ordered),
            "from_cache": len(problems) - len(todo),
            "failed": len(failed),
        },
        "teacher_requests_this_run": calls,
        "counts": dict(sorted(stages.items())),
        "rejections": dict(sorted(rejections.items())),
        "failed": [{"id": k, "error": v} for k, v in sorted(failed.items())],
        "cache": {"file": cache_path.name, "unreadable_lines": bad_lines},
        "outputs": outputs,
        "config": {"recipe": recipe, "seed": int(cfg.seed), "concurrency": int(cfg.concurrency)},
    }
    write_json(manifest, out_dir / "manifest.json")
    if failed:
        log.error(
            "%d problem(s) failed for good (listed in manifest.json); rerun the same command to retry them", len(failed)
        )
    if not examples:
        log.warning("no SFT example came out; see the rejections in %s", out_dir / "manifest.json")
    log.info("%s: %d examples in %s", recipe["name"], len(examples), out_dir)
    return manifest, 0 if complete else EXIT_INCOMPLETE


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s] %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = compose_synthesize_config(argv)
        _, code = synthesize(cfg)
        return code
    except UserError as err:
        if debug_requested():
            raise
        sys.stderr.write(f"sarl.data.synthesize: {err}\n")
        return 2
    except KeyboardInterrupt:
        log.warning("interrupted; finished problems are cached: rerun the same command to resume")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
