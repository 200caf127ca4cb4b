"""WildBench v2 scoring (SARL Table 3; Lin et al. 2024, allenai/WildBench): an LLM judge scores each
response 1-10 with WildBench's score template; category scores and the WB Score macro.

- The judge prompt is WildBench's own `eval_template.score.v2.md` (read from a file or URL; the project does
  not copy it), filled as WildBench's `src/eval.py` does: `{$history}` = the earlier turns as
  "USER: ...\\n\\nASSISTANT: ...\\n\\n", `{$user_query}` = the last user turn, `{$model_output}` = the
  response with its thinking stripped, `{$checklist}` = one "- item" line per checklist entry.
- An empty response is not sent to the judge: it scores 1, as in WildBench's `src/eval.py`.
- The judge's reply is parsed as JSON (code fences allowed), else with WildBench's regex for `"score"`;
  a score outside 1..10, an empty reply or no score at all is a failed judgement: recorded with its reason,
  never turned into a number.
- Category score = (mean S - 5) * 2 * 10 over the tasks whose primary or secondary tags map to it (a task
  counts once per category, as the leaderboard's `_create_tables.py` does); WB Score = weighted macro.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from eval.cache import atomic_write_text, safe_name
from sarl.checking.openai_client import ChatClient, api_key_from_env, run_concurrently

log = logging.getLogger(__name__)

# WildBench tag -> merged category (allenai/WildBench leaderboard/data_dir/_create_tables.py `task_group_new`).
CATEGORY_OF_TAG: dict[str, str] = {
    "Information seeking": "Information/Advice seeking",
    "Advice seeking": "Information/Advice seeking",
    "Creative Writing": "Creative Tasks",
    "Editing": "Creative Tasks",
    "Brainstorming": "Creative Tasks",
    "Role playing": "Creative Tasks",
    "Others": "Creative Tasks",
    "Coding & Debugging": "Coding & Debugging",
    "Reasoning": "Planning & Reasoning",
    "Planning": "Planning & Reasoning",
    "Math": "Math & Data Analysis",
    "Data Analysis": "Math & Data Analysis",
}

# WB Score macro weights (WildBench leaderboard `weights_by_task`; decisions §3), divided by their sum 4.75.
CATEGORY_WEIGHTS: dict[str, float] = {
    "Creative Tasks": 0.5,
    "Planning & Reasoning": 1.25,
    "Math & Data Analysis": 1.0,
    "Information/Advice seeking": 0.75,
    "Coding & Debugging": 1.25,
}

# SARL Table 3's column names for the categories.
SHORT_NAMES: dict[str, str] = {
    "Creative Tasks": "Creative",
    "Planning & Reasoning": "Planning",
    "Math & Data Analysis": "Math",
    "Information/Advice seeking": "Info",
    "Coding & Debugging": "Code",
}

TEMPLATE_PLACEHOLDERS = ("{$history}", "{$user_query}", "{$model_output}", "{$checklist}")
EMPTY_RESPONSE_SCORE = 1.0  # WildBench src/eval.py: an empty model output is scored 1 without a judge call

# ---------------------------------------------------------------------------------------------------------
# Categories and scores
# ---------------------------------------------------------------------------------------------------------


def task_categories(primary_tag: str, secondary_tags: Sequence[str] | None) -> list[str]:
    """The merged categories a task counts in (each once), in the order of its tags."""
    out: list[str] = []
    for tag in [primary_tag, *(secondary_tags or [])]:
        if tag not in CATEGORY_OF_TAG:
            raise ValueError(f"WildBench tag {tag!r} is not known; known tags: {', '.join(CATEGORY_OF_TAG)}")
        category = CATEGORY_OF_TAG[tag]
        if category not in out:
            out.append(category)
    return out


def category_score(scores: Sequence[float]) -> float:
    """(mean S - 5) * 2 * 10: WildBench's adjusted score, 1..10 mapped onto -80..100 (decisions §3)."""
    if not scores:
        raise ValueError("a category score needs at least one task score")
    return (sum(scores) / len(scores) - 5.0) * 2.0 * 10.0


def category_scores(task_scores: Mapping[str, float], categories: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Score per merged category from per-task scores (tasks without a score are left out)."""
    members: dict[str, list[float]] = {}
    for task, score in task_scores.items():
        for category in categories[task]:
            members.setdefault(category, []).append(float(score))
    return {c: category_score(members[c]) for c in CATEGORY_WEIGHTS if c in members}


def wb_score_macro(category_scores: dict[str, float]) -> float:
    """The WB Score: sum of weight * category score over the five categories, divided by 4.75 (the sum of
    the weights), as the WildBench leaderboard computes `WB_score.task_macro` (decisions §3)."""
    unknown = set(category_scores) - set(CATEGORY_WEIGHTS)
    if unknown:
        raise ValueError(f"unknown WildBench categories {sorted(unknown)}; expected: {', '.join(CATEGORY_WEIGHTS)}")
    missing = [c for c in CATEGORY_WEIGHTS if c not in category_scores]
    if missing:
        raise ValueError(f"the WB Score needs all five categories; missing: {', '.join(missing)}")
    total = sum(CATEGORY_WEIGHTS.values())
    return sum(CATEGORY_WEIGHTS[c] * float(s) for c, s in category_scores.items()) / total


# ---------------------------------------------------------------------------------------------------------
# The judge prompt
# ---------------------------------------------------------------------------------------------------------


def load_template(source: str, cache_dir: str | Path | None = None, timeout_s: float = 30.0) -> str:
    """The judge template from a file or an http(s) URL (a fetched copy is kept in `cache_dir`); ValueError
    unless it has WildBench's four placeholders."""
    if re.match(r"https?://", source):
        cached = Path(cache_dir) / "templates" / safe_name(source) if cache_dir else None
        if cached is not None and cached.exists():
            text = cached.read_text(encoding="utf-8")
        else:
            import httpx

            try:
                reply = httpx.get(source, timeout=timeout_s, follow_redirects=True)
                reply.raise_for_status()
            except httpx.HTTPError as err:
                raise RuntimeError(
                    f"cannot fetch the WildBench judge template from {source} ({err}); download "
                    "evaluation/eval_template.score.v2.md from allenai/WildBench and set judge.template=FILE"
                ) from err
            text = reply.text
            if cached is not None:
                atomic_write_text(cached, text)
    else:
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"judge template {path} does not exist (judge.template)")
        text = path.read_text(encoding="utf-8")
    missing = [p for p in TEMPLATE_PLACEHOLDERS if p not in text]
    if missing:
        raise ValueError(f"judge template {source} lacks the placeholders {missing}; is it WildBench's score template?")
    return text


def history_and_query(conversation: Sequence[Mapping[str, str]]) -> tuple[str, str]:
    """WildBench's `{$history}` (earlier turns) and `{$user_query}` (the last turn) of a conversation."""
    if not conversation:
        raise ValueError("empty conversation: nothing to judge against")
    history = ""
    for message in conversation[:-1]:
        if message["role"] == "user":
            history += "USER: " + message["content"] + "\n\n"
        elif message["role"] == "assistant":
            history += "ASSISTANT: " + message["content"] + "\n\n"
    return history, conversation[-1]["content"]


def judge_prompt(
    template: str, conversation: Sequence[Mapping[str, str]], response: str, checklist: Sequence[str]
) -> str:
    """The filled judge prompt (WildBench src/eval.py, score mode, no word limit)."""
    history, query = history_and_query(conversation)
    checklist_md = "".join(f"- {item}\n" for item in checklist)
    prompt = template.replace("{$history}", history).replace("{$user_query}", query)
    return prompt.replace("{$model_output}", response).replace("{$checklist}", checklist_md)


# ---------------------------------------------------------------------------------------------------------
# The judge's reply
# ---------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_SCORE_QUOTED = re.compile(r'"score"\s*:\s*"([^"]*?)"')  # WildBench extract_values_from_json
_SCORE_BARE = re.compile(r'"score"\s*:\s*([0-9]+(?:\.[0-9]+)?)')


def parse_judgement(text: str | None) -> tuple[float | None, str | None]:
    """(score, None) for a usable judgement, (None, reason) otherwise."""
    if text is None or not text.strip():
        return None, "empty judge output"
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    raw: Any = None
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict) and "score" in parsed:
            raw = parsed["score"]
    except json.JSONDecodeError:
        pass
    if raw is None:
        match = _SCORE_QUOTED.search(body) or _SCORE_BARE.search(body)
        if match is None:
            return None, f"no score in the judge output: {text.strip()[:200]!r}"
        raw = match.group(1)
    try:
        score = float(str(raw).strip())
    except ValueError:
        return None, f"judge score {raw!r} is not a number"
    if not 1.0 <= score <= 10.0:
        return None, f"judge score {score:g} is outside 1..10"
    return score, None


class WildBenchJudge:
    """An OpenAI-compatible chat endpoint as WildBench judge (GPT-4o as the leaderboard uses, or a local
    vLLM judge): temperature 0, 1024 tokens, JSON mode, as WildBench's own evaluation. `client`: the settings
    of its `sarl.checking.openai_client.ChatClient` (api_key, timeout_s, max_retries, backoff_s, ...), over
    CLIENT_DEFAULTS."""

    CLIENT_DEFAULTS: ClassVar[dict[str, Any]] = {"timeout_s": 120.0, "max_retries": 6, "backoff_s": 2.0}

    def __init__(
        self,
        url: str,
        model: str,
        template: str,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        json_mode: bool = True,
        concurrency: int = 16,
        extra_body: dict[str, Any] | None = None,
        **client: Any,
    ) -> None:
        self.client = ChatClient(url, **{**self.CLIENT_DEFAULTS, **client})
        self.model = model
        self.template = template
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.json_mode = bool(json_mode)
        self.concurrency = int(concurrency)
        self.extra_body = dict(extra_body or {})

    def payload(self, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        return {**body, **self.extra_body}

    def judge_one(self, prompt: str) -> dict[str, Any]:
        """{"score": float | None, "failed": reason | None, "judge_output": raw text}; ChatRequestError if the
        endpoint fails for good (the caller records it as a failed judgement)."""
        reply = self.client.chat(self.payload(prompt))
        try:
            text = reply["choices"][0]["message"].get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            text = None
        score, failed = parse_judgement(text)
        return {"score": score, "failed": failed, "judge_output": text}

    def judge_many(self, items: Sequence[tuple[Any, str]], on_result) -> int:
        """Judge (key, prompt) pairs concurrently with a progress bar; `on_result(key, record)` for each,
        where a request that failed for good gives {"score": None, "failed": reason}. Returns the failures."""
        failures = 0

        def done(item: tuple[Any, str], record: dict[str, Any] | None, error: str | None) -> None:
            nonlocal failures
            if record is None:
                record = {"score": None, "failed": f"judge request failed: {error}", "judge_output": None}
            if record["failed"]:
                failures += 1
            on_result(item[0], record)

        run_concurrently(items, lambda item: self.judge_one(item[1]), done, self.concurrency, desc="judging")
        return failures

    def close(self) -> None:
        self.client.close()


def openai_judge(
    template_text: str, url: str, model: str, api_key_env: str | None, template: str, **settings: Any
) -> WildBenchJudge:
    """The judge conf/eval/judge/*.yaml describes (`_target_`; built by eval.run with `hydra.utils.instantiate`):
    any OpenAI-compatible chat endpoint at `url` serving `model`, with the API key from the environment variable
    `api_key_env`, scoring with `template_text` (the text of the template file or URL `template`)."""
    api_key = api_key_from_env(api_key_env)
    if api_key is None and "api.openai.com" in str(url):
        raise RuntimeError(
            f"the WildBench judge at {url} needs an API key in ${api_key_env} (judge.api_key_env); or point "
            "judge.url and judge.model at a local OpenAI-compatible judge, or skip WildBench: benchmarks.wildbench=[]"
        )
    return WildBenchJudge(str(url), str(model), template_text, api_key=api_key, **settings)
