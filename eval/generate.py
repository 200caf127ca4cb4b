"""Sampling responses from a checkpoint: vLLM in-process (GPU), any OpenAI-compatible server, or
transformers (the last resort). Every back end uses the checkpoint's own chat template, one request per
(benchmark, problem, sample) with its own seed, and reports the response text, its length in tokens of the
checkpoint's tokenizer and why generation stopped ("length" = truncated at `max_tokens`).

Only the standard library is imported at module level: the vLLM back end also runs under the separate
vLLM environment (`.venv-vllm`), where this project's other dependencies are absent.
"""

from __future__ import annotations

import hashlib
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

from sarl.checking.openai_client import ChatClient, api_key_from_env, run_concurrently
from sarl.contract.token_count import TokenCounter
from sarl.serving.server import VLLM_CPU_ARGS, VLLM_CPU_ENV, VLLMServer

log = logging.getLogger(__name__)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class SamplingConfig:
    """Per-response sampling settings (defaults: Qwen3 thinking mode, from its model card)."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int | None = 20
    max_tokens: int = 32768
    chat_template_kwargs: dict[str, Any] = field(default_factory=lambda: {"enable_thinking": True})

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_tokens < 1:
            raise ValueError(
                f"bad sampling settings: temperature={self.temperature} (>= 0), top_p={self.top_p} (in (0, 1]), "
                f"max_tokens={self.max_tokens} (>= 1)"
            )

    def cache_identity(self) -> dict[str, Any]:
        """What makes two generations comparable (the cache key of a generation)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "chat_template_kwargs": dict(sorted(self.chat_template_kwargs.items())),
        }


@dataclass(frozen=True)
class GenerationRequest:
    """One response to sample: `key` = (benchmark, problem id, sample index)."""

    key: tuple[str, str, int]
    messages: list[dict[str, str]]
    seed: int


@dataclass
class Generation:
    """A sampled response. `n_tokens` counts generated tokens (the stop token included) with the checkpoint's
    tokenizer; None only when the server reported no usage and no tokenizer was available to count."""

    text: str
    n_tokens: int | None
    finish_reason: str
    token_count: str = "engine"  # "engine", "retokenized" or "unavailable"

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def to_record(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "n_tokens": self.n_tokens,
            "finish_reason": self.finish_reason,
            "truncated": self.truncated,
            "token_count": self.token_count,
        }


OnResult = Callable[[GenerationRequest, "Generation | None", "str | None"], None]


def sample_seed(base_seed: int, benchmark: str, problem_id: str, sample: int) -> int:
    """A per-sample seed: distinct for every sample (so repeats really differ), the same on every rerun."""
    raw = f"{int(base_seed)}|{benchmark}|{problem_id}|{int(sample)}".encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:4], "big") & 0x7FFFFFFF


class Generator(ABC):
    """Samples responses; `generate` calls `on_result(request, generation, None)` or `(request, None,
    error)` for each request as it finishes, so that the caller can cache it at once."""

    name = "generator"
    sampling: SamplingConfig  # what `generate` samples with; eval.run sets it per sampling setting of a protocol

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], on_result: OnResult) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model or connections."""


# ---------------------------------------------------------------------------------------------------------
# vLLM in-process
# ---------------------------------------------------------------------------------------------------------


class VLLMGenerator(Generator):
    """`vllm.LLM(model).chat(...)` in this process; requests go in chunks so that an interruption loses at
    most one chunk of work."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        sampling: SamplingConfig,
        dtype: str = "auto",
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        enforce_eager: bool = False,
        seed: int = 0,
        chunk_size: int = 1024,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        from vllm import LLM

        self.sampling = sampling
        self.chunk_size = max(1, int(chunk_size))
        self.llm = LLM(
            model=model,
            dtype=dtype,
            max_model_len=max_model_len,
            tensor_parallel_size=int(tensor_parallel_size),
            gpu_memory_utilization=float(gpu_memory_utilization),
            enforce_eager=bool(enforce_eager),
            seed=int(seed),
            **(engine_kwargs or {}),
        )

    def generate(self, requests: Sequence[GenerationRequest], on_result: OnResult) -> None:
        from vllm import SamplingParams

        s = self.sampling
        for start in range(0, len(requests), self.chunk_size):
            chunk = list(requests[start : start + self.chunk_size])
            params = [
                SamplingParams(
                    n=1,
                    temperature=s.temperature,
                    top_p=s.top_p,
                    top_k=int(s.top_k) if s.top_k else 0,  # 0: no top-k
                    max_tokens=s.max_tokens,
                    seed=r.seed,
                )
                for r in chunk
            ]
            outputs = self.llm.chat(
                [r.messages for r in chunk],
                sampling_params=params,
                chat_template_kwargs=dict(s.chat_template_kwargs),
                use_tqdm=True,
            )
            for request, output in zip(chunk, outputs):
                completion = output.outputs[0]
                finish = completion.finish_reason or "stop"
                on_result(request, Generation(completion.text, len(completion.token_ids), finish), None)


# ---------------------------------------------------------------------------------------------------------
# OpenAI-compatible server
# ---------------------------------------------------------------------------------------------------------


def response_text(message: dict[str, Any]) -> str:
    """The whole response of a chat reply. A server that splits the thinking off (vLLM's reasoning parser:
    `reasoning_content` / `reasoning`) gets it put back as `<think>...</think>` before the answer."""
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning and THINK_CLOSE not in content:
        return f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n\n{content.lstrip()}"
    return content


class OpenAIChatGenerator(Generator):
    """`/v1/chat/completions` on any OpenAI-compatible server (vLLM serving the checkpoint, including its CPU
    build). The server applies the checkpoint's chat template; `top_k` and `chat_template_kwargs` are vLLM
    extensions (set `top_k: null` and clear `chat_template_kwargs` for servers that reject them). Token
    counts come from the reply's `usage`; if a server gives none, `count_tokens` (the checkpoint's tokenizer)
    counts the text, and the record says so. `client`: the settings of its `sarl.checking.openai_client.ChatClient`
    (api_key, timeout_s, max_retries, backoff_s, ...), over CLIENT_DEFAULTS."""

    name = "openai"
    CLIENT_DEFAULTS: ClassVar[dict[str, Any]] = {"timeout_s": 3600.0, "max_retries": 5, "backoff_s": 1.0}

    def __init__(
        self,
        url: str,
        model: str,
        sampling: SamplingConfig,
        concurrency: int = 32,
        extra_body: dict[str, Any] | None = None,
        count_tokens: Callable[[str], int] | None = None,
        **client: Any,
    ) -> None:
        self.client = ChatClient(url, **{**self.CLIENT_DEFAULTS, **client})
        self.model = model
        self.sampling = sampling
        self.concurrency = int(concurrency)
        self.extra_body = dict(extra_body or {})
        self.count_tokens = count_tokens
        self.server: Any = None  # a vLLM server started for this generator (`openai_generator`), stopped by close()

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        s = self.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "n": 1,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
            "seed": request.seed,
        }
        if s.top_k:
            body["top_k"] = int(s.top_k)
        if s.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(s.chat_template_kwargs)
        return {**body, **self.extra_body}

    def parse(self, reply: dict[str, Any]) -> Generation:
        try:
            choice = reply["choices"][0]
            text = response_text(choice["message"])
        except (KeyError, IndexError, TypeError) as err:
            raise ValueError(f"reply without choices[0].message ({err}): {str(reply)[:300]}") from err
        finish = choice.get("finish_reason") or "stop"
        usage = reply.get("usage") or {}
        if isinstance(usage.get("completion_tokens"), int):
            return Generation(text, usage["completion_tokens"], finish)
        if self.count_tokens is not None:
            return Generation(text, self.count_tokens(text), finish, token_count="retokenized")
        return Generation(text, None, finish, token_count="unavailable")

    def _one(self, request: GenerationRequest) -> Generation:
        return self.parse(self.client.chat(self.payload(request)))

    def generate(self, requests: Sequence[GenerationRequest], on_result: OnResult) -> None:
        run_concurrently(requests, self._one, on_result, self.concurrency, desc=f"generating ({self.model})")

    def close(self) -> None:
        self.client.close()
        if self.server is not None:
            self.server.stop()


# ---------------------------------------------------------------------------------------------------------
# transformers (last resort)
# ---------------------------------------------------------------------------------------------------------


class TransformersGenerator(Generator):
    """`model.generate` one request at a time, seeded per request: slow, for CPUs and checks."""

    name = "transformers"

    def __init__(self, model: str, sampling: SamplingConfig, device: str = "auto", dtype: str = "auto") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.sampling = sampling
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        if not eos:
            raise ValueError(f"checkpoint {model} defines no end-of-sequence token; generation could not stop")
        self.eos_ids = sorted(set(eos))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]

    def _one(self, request: GenerationRequest) -> Generation:
        import torch

        s = self.sampling
        inputs = self.tokenizer.apply_chat_template(
            request.messages,
            add_generation_prompt=True,
            tokenize=True,
            return_tensors="pt",
            return_dict=True,
            **s.chat_template_kwargs,
        ).to(self.device)
        kwargs: dict[str, Any] = {"max_new_tokens": s.max_tokens, "pad_token_id": self.pad_id}
        if s.temperature > 0:
            kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=int(s.top_k or 0))
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        torch.manual_seed(request.seed)
        with torch.no_grad():
            out = self.model.generate(**inputs, eos_token_id=self.eos_ids, **kwargs)
        new = out[0, inputs["input_ids"].shape[1] :].tolist()
        stop = next((i for i, t in enumerate(new) if t in self.eos_ids), None)
        if stop is None:
            return Generation(self.tokenizer.decode(new, skip_special_tokens=True), len(new), "length")
        return Generation(self.tokenizer.decode(new[:stop], skip_special_tokens=True), stop + 1, "stop")

    def generate(self, requests: Sequence[GenerationRequest], on_result: OnResult) -> None:
        from tqdm import tqdm

        for request in tqdm(requests, desc="generating (transformers)", unit="resp", dynamic_ncols=True):
            try:
                generation = self._one(request)
            except (RuntimeError, ValueError) as err:  # e.g. a prompt longer than the model's context
                on_result(request, None, f"{type(err).__name__}: {err}")
                continue
            on_result(request, generation, None)


# ---------------------------------------------------------------------------------------------------------
# Builders: what conf/eval/generator/*.yaml name (`_target_`), called by eval.run through
# `hydra.utils.instantiate(cfg.generator, ckpt, sampling, run)`; every other key of the file is a setting.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    """What a generator gets from the evaluation run besides its settings."""

    name: str  # the run name (default served model name)
    run_dir: Any  # pathlib.Path of the run directory (server logs)
    seed: int


def vllm_generator(ckpt: str, sampling: SamplingConfig, run: RunInfo, **settings: Any) -> VLLMGenerator:
    """vLLM in-process on the checkpoint (conf/eval/generator/vllm.yaml); seeded with the run's seed."""
    return VLLMGenerator(ckpt, sampling, seed=run.seed, **settings)


def transformers_generator(ckpt: str, sampling: SamplingConfig, run: RunInfo, **settings: Any) -> TransformersGenerator:
    """transformers on the checkpoint (conf/eval/generator/transformers.yaml)."""
    return TransformersGenerator(ckpt, sampling, **settings)


def openai_generator(
    ckpt: str,
    sampling: SamplingConfig,
    run: RunInfo,
    url: str = "auto",
    model: str | None = None,
    api_key_env: str | None = "OPENAI_API_KEY",
    server: dict[str, Any] | None = None,
    **settings: Any,
) -> OpenAIChatGenerator:
    """An OpenAI-compatible server (conf/eval/generator/openai.yaml): the one at `url`, or, for url=auto, a vLLM
    server started on the checkpoint now (`server` settings) and stopped when the generator is closed. `model`:
    the served name (None: the run name); the API key comes from the environment variable `api_key_env`;
    response lengths are recounted with the checkpoint's tokenizer when the server reports no usage."""
    import sys
    from pathlib import Path

    served = str(model or run.name)
    started = None
    if str(url) == "auto":
        s = dict(server or {})
        cpu = bool(s.pop("cpu", False))
        started = VLLMServer(
            ckpt,
            served_name=served,
            python=str(s.pop("python", None) or sys.executable),
            extra_args=[*(VLLM_CPU_ARGS if cpu else ()), *s.pop("extra_args", [])],
            env=dict(VLLM_CPU_ENV) if cpu else {},
            log_path=Path(run.run_dir) / "vllm_server.log",
            **s,
        ).start()
        url = started.url
    try:
        gen = OpenAIChatGenerator(
            str(url),
            served,
            sampling,
            api_key=api_key_from_env(api_key_env),
            count_tokens=TokenCounter(ckpt) if Path(ckpt).is_dir() else None,
            **settings,
        )
    except BaseException:
        if started is not None:
            started.stop()
        raise
    gen.server = started
    return gen
