"""The teacher: chat completions from an OpenAI-compatible server (`Teacher`, its `Reply`), the check that the
server answers and serves the model (`check_teacher`), the vLLM server started for `teacher.url=auto`
(`teacher_endpoint`) and a reply as one response text (`full_trace`)."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from omegaconf import DictConfig

from sarl.checking.openai_client import ChatClient, api_base, api_key_from_env
from sarl.runtime.errors import UserError
from sarl.serving.server import VLLM_CPU_ARGS, VLLM_CPU_ENV, VLLMServer


@dataclass
class Reply:
    content: str
    reasoning: str
    finish_reason: str | None


class Teacher:
    """Chat completions from an OpenAI-compatible server through `sarl.checking.openai_client.ChatClient` (the
    project's HTTP client: a total deadline per attempt, retries)."""

    def __init__(self, url: str, model: str, t: Mapping[str, Any]) -> None:
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
    `eval.run` starts its generation server (`sarl.serving.server.VLLMServer`) and stopped by its process id
    when the command ends."""
    t = cfg.teacher
    if t.url != "auto":
        yield str(t.url)
        return

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


def full_trace(reply: Reply) -> str:
    """The teacher's answer as one response: `<think>reasoning</think>` before the content when the server
    returns the reasoning separately (vLLM's reasoning parser, DeepSeek's API)."""
    content = reply.content.strip()
    if reply.reasoning.strip():
        return f"<think>\n{reply.reasoning.strip()}\n</think>\n\n{content}"
    return content
