"""Helpers and fixtures of the evaluation tests (imported by name: a test module importing `conftest` would get
whichever conftest.py pytest loaded first when several test directories run together).

Fixtures of the evaluation tests: the grader, tiny fixture benchmarks (tests/fixtures/eval/) written as verl
parquet, a tiny Qwen3 chat model trained here to answer them, and a loopback OpenAI-compatible chat server."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit import JSONHandler, LoopbackServer, closing_all

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "eval"

# A Qwen3-like chat template: <|im_start|>role\ncontent<|im_end|>; thinking on unless enable_thinking=false.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


# -- fixture benchmarks ------------------------------------------------------------------------------------


def fixture_rows() -> list[dict[str, Any]]:
    """tests/fixtures/eval/benchmarks.jsonl: each row's benchmark, prompt, gold or WildBench fields, the
    response the tiny model is trained to give and (WildBench) the score the test judge gives it."""
    lines = (FIXTURES / "benchmarks.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def row_messages(row: dict[str, Any]) -> list[dict[str, str]]:
    return row.get("conversation") or [{"role": "user", "content": row["question"]}]


def write_benchmarks(data_dir: Path, rows: list[dict[str, Any]]) -> dict[str, Path]:
    """Each benchmark as `<data_dir>/<name>/test.parquet` in the layout of the data preparation."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    by_bench: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_bench.setdefault(row["benchmark"], []).append(row)
    paths = {}
    for name, items in by_bench.items():
        lists = any(isinstance(r.get("gold"), list) for r in items)
        records = []
        for index, r in enumerate(items):
            info: dict[str, Any] = {"index": index, "id": r["id"]}
            if r["kind"] == "math":
                gold = r["gold"] if not lists or isinstance(r["gold"], list) else [r["gold"]]
            else:
                gold = ""
                info.update(
                    checklist=r["checklist"],
                    primary_tag=r["primary_tag"],
                    secondary_tags=r["secondary_tags"],
                    session_id=f"session-{r['id']}",
                    conversation=r["conversation"],
                )
            records.append(
                {
                    "data_source": name,
                    "prompt": row_messages(r),
                    "ability": "math" if r["kind"] == "math" else "open",
                    "reward_model": {"ground_truth": gold, "style": "rule"},
                    "extra_info": info,
                }
            )
        path = data_dir / name / "test.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(records), path)
        paths[name] = path
    return paths


@pytest.fixture
def eval_data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    write_benchmarks(data, fixture_rows())
    return data


# -- the tiny chat model -----------------------------------------------------------------------------------


def build_tiny_chat_model(path: Path, steps: int = 160) -> Path:
    """A tiny Qwen3 (2 layers, hidden 128, head_dim 64) with a byte-level BPE tokenizer and a Qwen3-like chat
    template, trained until it answers each fixture prompt with its fixture response: at the evaluation's sampling
    (eval.generate.SamplingConfig: temperature 0.6, top_p 0.95) every token of every response holds more than top_p
    of the probability (checked here; about 0.9997 at the least), so nucleus sampling keeps that token alone and the
    sampled answers are the fixture's on any machine, whatever its random draws or floating-point path."""
    import torch
    from testkit import tiny_qwen3

    from eval.generate import SamplingConfig
    from sarl.smoke.policy import build_tokenizer

    pairs = [(row_messages(r), r["response"]) for r in fixture_rows()]
    corpus = [" ".join(m["content"] for m in msgs) + "\n" + resp for msgs, resp in pairs] * 2
    corpus.append("user assistant system")
    hf = build_tokenizer(corpus, vocab_size=512)  # the smoke policy's tokenizer builder (Qwen3 chat markers)
    hf.chat_template = CHAT_TEMPLATE
    model = tiny_qwen3(hf, weights=True, seed=0, max_position_embeddings=512)
    seqs = []
    for messages, response in pairs:
        prompt = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
        p = hf(prompt, add_special_tokens=False)["input_ids"]
        a = hf(response + "<|im_end|>", add_special_tokens=False)["input_ids"]
        seqs.append((p, a))
    length = max(len(p) + len(a) for p, a in seqs)
    ids = torch.full((len(seqs), length), hf.pad_token_id)
    labels = torch.full((len(seqs), length), -100)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, (p, a) in enumerate(seqs):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
        mask[i, : len(p) + len(a)] = 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains several times faster on one thread of a busy machine
    try:
        for _ in range(steps):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.05, f"the tiny model did not learn its answers (loss {loss.item():.3f})"
    sampling = SamplingConfig()
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # position t predicts token t + 1
    targets, answer = labels[:, 1:], labels[:, 1:] != -100
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    p_answer = probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)[answer]
    assert p_answer.min().item() > sampling.top_p, (
        f"an answer token has {p_answer.min().item():.4f} of the probability at temperature {sampling.temperature}, "
        f"not more than top_p={sampling.top_p}: its sample would depend on the random draw"
    )
    model.generation_config.eos_token_id = hf.eos_token_id
    model.save_pretrained(path)
    hf.save_pretrained(path)
    return path


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Generation with the tiny model on one thread (faster than two contended ones); restored after. eval.run
    chooses its threads itself (`torch_threads: auto`), which takes OMP_NUM_THREADS as it is: 1 here too."""
    import torch

    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = omp


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from testkit import built_once

    return str(built_once(tmp_path_factory, "tiny_chat_model", build_tiny_chat_model))


def response_token_count(model_dir: str, text: str) -> int:
    """Tokens of a trained response plus the end-of-turn token: what a back end reports when it stops."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return len(tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"])


# -- a loopback OpenAI-compatible chat server ---------------------------------------------------------------

# respond(server, body) -> (status, payload[, headers]); payload JSON-able or bytes.
Responder = Callable[["FakeChatServer", dict[str, Any]], tuple]


def chat_reply(content: str | None, finish_reason: str = "stop", usage: dict | None = None, **message: Any) -> dict:
    reply = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": finish_reason,
            }
        ],
    }
    if usage is not None:
        reply["usage"] = usage
    return reply


class FakeChatServer:
    """`POST /v1/chat/completions` on 127.0.0.1; records every body; answers with `respond` (default: echo)."""

    def __init__(self, respond: Responder | None = None) -> None:
        self.respond = respond or (lambda server, body: (200, chat_reply("ok")))
        self.files: dict[str, str] = {}  # GET path -> text (e.g. a judge template served by URL)
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self._server = LoopbackServer(self._handler())
        self.url = f"{self._server.url}/v1"

    def close(self) -> None:
        self._server.close()

    def _handler(self) -> type[JSONHandler]:
        server = self

        class Handler(JSONHandler):
            def do_GET(self) -> None:
                text = server.files.get(self.path)
                if text is None:
                    self.send_json(404, b"not found")
                else:
                    self.send_json(200, text.encode())

            def do_POST(self) -> None:
                body = self.read_json()
                with server.lock:
                    server.requests.append(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if self.path != "/v1/chat/completions":
                        answer: tuple = (404, {"error": f"no route {self.path}"})
                    else:
                        answer = server.respond(server, body)
                    self.send_json(*answer)
                finally:
                    with server.lock:
                        server.in_flight -= 1

        return Handler


@pytest.fixture
def chat_server() -> Iterator[Callable[..., FakeChatServer]]:
    """Factory `chat_server(respond)`; every server is closed after the test."""
    yield from closing_all(FakeChatServer)


@pytest.fixture
def lm_eval_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder for lm-eval's `include_path` holding the task toy_qa on its fixture data (tests/fixtures/eval/
    lm_eval/), the datasets read offline into a cache of the test's own; skips where lm-eval is not installed."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    template = (FIXTURES / "lm_eval" / "toy_qa.yaml.in").read_text()
    (tasks / "toy_qa.yaml").write_text(template.replace("@DATA@", str(FIXTURES / "lm_eval" / "toy_qa.jsonl")))
    return tasks


RESPONSE_IN_PROMPT = re.compile(r"<<<(.*?)>>>", re.DOTALL)  # how tests/fixtures/eval/judge_template.md wraps it


def fixture_judge(delay_s: float = 0.0) -> Responder:
    """A judge that gives each fixture response the score its fixture row names (JSON, as WildBench asks)."""
    scores = {
        r["response"].split("</think>")[-1].strip(): r["judge_score"]
        for r in fixture_rows()
        if r["kind"] == "wildbench"
    }

    def respond(server: FakeChatServer, body: dict[str, Any]) -> tuple:
        if delay_s:
            time.sleep(delay_s)
        match = RESPONSE_IN_PROMPT.search(body["messages"][0]["content"])
        response = match.group(1).strip() if match else ""
        score = scores.get(response)
        if score is None:
            return 200, chat_reply('{"strengths": "", "weaknesses": "unknown response", "score": "2"}')
        return 200, chat_reply(json.dumps({"strengths": "fine", "weaknesses": "none", "score": str(score)}))

    return respond
