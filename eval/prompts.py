"""How a protocol asks each benchmark: a prompt template (conf/eval/prompt/NAME.yaml) applied at evaluation to
the benchmark's raw question, or the prompt the benchmark was prepared with (docs/decisions.md §3.1 "Prompts").

A template file has `system` (the system turn, or null), optional `tags` (Structured Reasoning's step tags, for
`{tags}`) and two parts: `math` (a question with an answer: math, reading comprehension) and `choice` (a multiple-
choice question, a conf/data set of builder `choice`), each with `user` (the user turn), `answer` (how the answer
is read: `boxed`, the last \\boxed{}; `answer_line`, the letter of the last "Answer: X"; both after the thinking,
`sarl.checking.grading.extract`) and, for `choice`, `option` and `separator` (how the options are written).
Placeholders: {question}, {options}, {letters} ("A, B, C or D"), {letter_set} ("ABCD"), {tags}; any other
brace is text (`\\boxed{}`).

A protocol's benchmark group names its template (`prompt: NAME`) or none (`prompt: null`: each benchmark's
prepared prompt, the data file's own messages). `prompt=NAME` / `prompt=prepared` on the command line
(conf/eval.yaml) asks every math benchmark of the plan so instead. The raw question of a prepared row is its
`extra_info.question` where the row has one, else its prepared prompt read back through the prompt its
conf/data/NAME.yaml builds (`data_template`); a row that prompt does not build is a one-line error.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from omegaconf import OmegaConf

from sarl.checking.grading.extract import extract_answer, extract_answer_line
from sarl.data.benchmark_sets import LETTERS
from sarl.runtime.errors import UserError
from sarl.runtime.files import CONF_DIR

PROMPT_DIR = CONF_DIR / "eval" / "prompt"
DATA_CONF_DIR = CONF_DIR / "data"
PARTS = ("math", "choice")
ANSWERS = ("boxed", "answer_line")
PREPARED = "prepared"  # `prompt=prepared`: every benchmark as its data set was prepared
PLACEHOLDERS = ("question", "options", "letters", "letter_set", "tags")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
# the conf/data builders whose prompt is the question (or passage and question) and a suffix or template
QUESTION_BUILDERS = ("math", "math_solution", "stratified", "reading")
STRUCTURED_STYLES = ("structured", "structured_fixed")  # sarl.data.build.PROMPT_STYLES but plain


@dataclass(frozen=True)
class Template:
    """One way of asking: the system turn (None: none), the user turn with its placeholders, how the options are
    written (multiple choice) and how the answer is read. `question_format`: how {question} is written when it is
    not the problem as its source gives it (a code set's `code_format`)."""

    system: str | None
    user: str
    answer: str = "boxed"
    option: str | None = None
    separator: str = "\n"
    tags: tuple[str, ...] = ()
    question_format: str | None = None

    def slots(self) -> list[str]:
        return _PLACEHOLDER.findall(self.user)

    def render(self, question: str, options: Sequence[str] | None = None) -> list[dict[str, str]]:
        """The chat messages asking `question` (and its options)."""
        values = {"question": question, "tags": ", ".join(f"<{t}>" for t in self.tags)}
        if self.option is not None:
            if not options:
                raise ValueError("a multiple-choice template needs the question's options")
            values.update(_option_values(self, options))
        user = _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.user)  # one pass: the question is not re-read
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*system, {"role": "user", "content": user}]

    def question_of(self, messages: Sequence[dict[str, str]], options: Sequence[str] | None = None) -> str | None:
        """The question these messages ask under this template (its inverse), or None if it does not write them."""
        users = [m for m in messages if m.get("role") == "user"]
        systems = [m["content"] for m in messages if m.get("role") == "system"]
        if len(users) != 1 or systems != ([self.system] if self.system is not None else []):
            return None
        known = _option_values(self, options) if self.option is not None and options else {}
        parts, pos = [], 0
        for m in _PLACEHOLDER.finditer(self.user):
            parts.append(re.escape(self.user[pos : m.start()]))
            name = m.group(1)
            if name == "question":
                parts.append("(?P<question>.*)")
            elif name == "tags":
                parts.append("(?:<[A-Za-z_]+>(?:, <[A-Za-z_]+>)*)")  # a per-row draw of the tags (App. A.4)
            elif name in known:
                parts.append(re.escape(known[name]))
            else:
                return None
            pos = m.end()
        parts.append(re.escape(self.user[pos:]))
        found = re.fullmatch("".join(parts), users[0]["content"], re.DOTALL)
        return found.group("question") if found and "question" in found.groupdict() else None

    def describe(self) -> dict[str, Any]:
        out = {"system": self.system, "user": self.user, "answer": self.answer}
        if self.option is not None:
            out.update(option=self.option, separator=self.separator)
        if self.question_format:
            out["question_format"] = self.question_format
        return out

    def form(self) -> tuple:
        """What two templates must share to ask alike: everything but the tags drawn into {tags}."""
        return (self.system, self.user, self.answer, self.option, self.separator, self.question_format)


def _option_values(t: Template, options: Sequence[str]) -> dict[str, str]:
    letters = LETTERS[: len(options)]
    written = [
        t.option.replace("{letter}", letter).replace("{text}", str(text)) for letter, text in zip(letters, options)
    ]
    phrase = letters[0] if len(letters) == 1 else ", ".join(letters[:-1]) + " or " + letters[-1]
    return {"options": t.separator.join(written), "letters": phrase, "letter_set": letters}


@dataclass(frozen=True)
class BenchmarkPrompt:
    """How one benchmark of a plan is asked: by `template` (a conf/eval/prompt/ name; None: as prepared) with its
    `part` (math | choice), or as prepared. `form`: the resulting template (None where the prepared prompt is not
    known from a config: a conversation, a shipped file, a benchmark without conf/data/NAME.yaml)."""

    template: str | None
    part: str
    form: Template | None
    source: str

    @property
    def answer(self) -> str:
        return self.form.answer if self.form else "boxed"

    def describe(self) -> dict[str, Any]:
        return {"template": self.template, "part": self.part, "source": self.source,
                **(self.form.describe() if self.form else {})}  # fmt: skip


# -- the files --------------------------------------------------------------------------------------------------


def template_names() -> list[str]:
    return sorted(p.stem for p in PROMPT_DIR.glob("*.yaml"))


def load_templates(name: str) -> dict[str, Template]:
    """The parts of conf/eval/prompt/NAME.yaml; a UserError names a missing file or a malformed key."""
    path = PROMPT_DIR / f"{name}.yaml"
    where = f"conf/eval/prompt/{name}.yaml"
    if not path.is_file():
        raise UserError(f"prompt {name!r}: {where} does not exist; choose one of: {', '.join(template_names())}")
    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    system, tags = spec.get("system"), tuple(str(t) for t in spec.get("tags") or ())
    if system is not None and not isinstance(system, str):
        raise UserError(f"{where}: system must be a string or null, not {system!r}")
    out = {}
    for part in PARTS:
        p = spec.get(part)
        if p is None:
            continue
        if not isinstance(p, dict) or not isinstance(p.get("user"), str):
            raise UserError(f"{where}: {part}.user must be a string")
        answer = str(p.get("answer", "boxed"))
        if answer not in ANSWERS:
            raise UserError(f"{where}: {part}.answer={answer!r}; choose one of: {', '.join(ANSWERS)}")
        option = p.get("option") if part == "choice" else None
        t = Template(system, p["user"], answer, option, str(p.get("separator", "\n")), tags)
        if "question" not in t.slots():
            raise UserError(f"{where}: {part}.user has no {{question}}")
        if part == "choice" and (not isinstance(option, str) or "{letter}" not in option or "{text}" not in option):
            raise UserError(f"{where}: choice.option must write {{letter}} and {{text}}, not {option!r}")
        if part == "math" and {"options", "letters", "letter_set"} & set(t.slots()):
            raise UserError(f"{where}: math.user names options; only the choice part has them")
        if "tags" in t.slots() and not tags:
            raise UserError(f"{where}: {part}.user names {{tags}} but the file lists no tags")
        out[part] = t
    if not out:
        raise UserError(f"{where}: no `math` or `choice` part")
    return out


def data_config(name: str) -> dict[str, Any] | None:
    """conf/data/NAME.yaml with the files of its `defaults` under it (None when there is no such file)."""
    path = DATA_CONF_DIR / f"{name}.yaml"
    if not path.is_file():
        return None
    node = OmegaConf.load(path)
    merged = OmegaConf.create()
    for base in node.get("defaults") or []:
        if str(base) != "_self_":
            merged = OmegaConf.merge(merged, OmegaConf.create(data_config(str(base)) or {}))
    node = OmegaConf.merge(merged, {k: v for k, v in node.items() if k != "defaults"})
    return OmegaConf.to_container(node, resolve=False)


def part_of(data: dict[str, Any] | None) -> str:
    """Which part of a template asks a data set's questions: `choice` for a multiple-choice set, else `math`."""
    return "choice" if data and data.get("builder") == "choice" else "math"


def data_template(data: dict[str, Any]) -> Template | None:
    """The prompt a conf/data set is built with (sarl/data/build.py, benchmark_sets.py, code_sets.py) as a
    template; None for a set whose prompt is a conversation (WildBench, OpenRubrics) or not built from a config
    (shipped SFT traces)."""
    builder, style = data.get("builder"), data.get("prompt_style") or "plain"
    system = data.get("system_prompt") or None
    suffix = data.get("prompt_suffix") or ""
    if builder == "code" or (builder == "problems" and data.get("ability") == "code"):
        return Template(system, "{question}" + suffix, question_format=str(data.get("code_format") or "problem"))
    if builder not in (*QUESTION_BUILDERS, "choice"):
        return None
    if style in STRUCTURED_STYLES:  # the tagged template: conf/eval/prompt/structured.yaml (its test holds it)
        tagged = load_templates("structured")["math"]
        user = tagged.user
        if builder == "choice":  # the structured wrap of the question and its options (sarl/data/benchmark_sets.py)
            user = user.replace("{question}", "{question}\n\n{options}")
            return Template(system, user, "boxed", "({letter}) {text}", "\n", tagged.tags)
        return Template(system, user, "boxed", tags=tagged.tags)
    if builder == "choice":
        return Template(system, "{question}\n\n{options}" + suffix, "boxed", "({letter}) {text}", "\n")
    return Template(system, "{question}" + suffix)


# -- a plan's prompts ---------------------------------------------------------------------------------------------


def benchmark_prompt(name: str, template: str | None, file: str | None) -> BenchmarkPrompt:
    """How benchmark `name` is asked: by template `template` (None: as prepared; `file`: the protocol's own file)."""
    data = None if file else data_config(name)
    part = part_of(data)
    if template is None:
        if file:
            return BenchmarkPrompt(None, part, None, f"{file}: its own messages")
        if data is None:
            return BenchmarkPrompt(None, part, None, f"as prepared (no conf/data/{name}.yaml)")
        return BenchmarkPrompt(None, part, data_template(data), f"as prepared: conf/data/{name}.yaml")
    parts = load_templates(template)
    if part not in parts:
        raise UserError(f"prompt {template!r}: conf/eval/prompt/{template}.yaml has no `{part}` part for {name}")
    return BenchmarkPrompt(template, part, parts[part], f"conf/eval/prompt/{template}.yaml")


def ask(problems: list, bench: str, prompt: BenchmarkPrompt) -> list:
    """The problems asked by `prompt`'s template (as they are when it asks as prepared): each problem's raw question
    (`extra_info.question`, else read back from its prepared prompt) in the template."""
    if prompt.template is None:
        return problems
    data = data_config(bench)
    prepared = data_template(data) if data else None
    fix = f"re-prepare it (python -m sarl.data.prepare dataset={bench}) or ask it as prepared (prompt={PREPARED})"
    out = []
    for p in problems:
        options = p.extra_info.get("options")
        options = [str(o) for o in options] if options is not None else None
        question = p.extra_info.get("question")
        if not isinstance(question, str):
            if prepared is None:
                raise UserError(
                    f"benchmark {bench!r}: {prompt.source} asks its raw question, and its rows have no "
                    f"extra_info.question nor a conf/data/{bench}.yaml prompt to read it from; {fix}"
                )
            question = prepared.question_of(p.messages, options)
            if question is None:
                raise UserError(
                    f"benchmark {bench!r}, problem {p.id!r}: its prompt is not the one conf/data/{bench}.yaml builds, "
                    f"so its question cannot be read back for {prompt.source}; {fix}"
                )
        try:
            messages = prompt.form.render(question, options)
        except ValueError as err:
            raise UserError(f"benchmark {bench!r}, problem {p.id!r}: {prompt.source}: {err}") from err
        out.append(dataclasses.replace(p, messages=messages))
    return out


def answer_reader(answer: str) -> Callable[..., str | None]:
    """The function reading a response's answer for a template's `answer`."""
    return {"boxed": extract_answer, "answer_line": extract_answer_line}[answer]


def format_prompts(entries: Sequence[Any]) -> list[str]:
    """The dry run's prompt lines: each distinct prompt once, with the benchmarks it asks."""
    groups: dict[str, tuple[BenchmarkPrompt, list[str], str]] = {}
    for e in entries:
        p = e.prompt
        key = repr((e.kind, p.template, p.part, p.form.describe() if p.form else p.source))
        groups.setdefault(key, (p, [], e.kind))[1].append(e.name)
    lines = ["prompts ({question}: each problem's raw question; newlines shown as \\n):"]
    for prompt, names, kind in groups.values():
        names = list(dict.fromkeys(names))
        if prompt.template:
            source = f"{prompt.source} ({prompt.part})"
        else:
            source = "as prepared (conf/data/<benchmark>.yaml)" if prompt.form else prompt.source
        lines.append(f"  {', '.join(names)}: {source}")
        if prompt.form is None:
            lines.append("    the data file's own chat messages")
            continue
        f = prompt.form
        lines.append("    system: " + (_shown(f.system) if f.system is not None else "-"))
        lines.append("    user:   " + _shown(f.user))
        if f.option is not None:
            lines.append(f"    option: {_shown(f.option)}, joined by {_shown(f.separator)}")
        if f.tags:
            lines.append(f"    tags:   {', '.join(f'<{t}>' for t in f.tags)}")
        if f.question_format:
            lines.append(f"    question written as code_format {f.question_format}")
        lines.append("    answer: " + ANSWER_TEXT[f.answer] if kind == "math" else "    answer: " + ANSWER_TEXT[kind])
    return lines


ANSWER_TEXT = {
    "boxed": "the last \\boxed{} after the thinking",
    "answer_line": "the letter of the last 'Answer: X' after the thinking",
    "code": "the last code block, run against the tests",
    "wildbench": "judged",
}


def _shown(text: str) -> str:
    return text.replace("\n", "\\n")
