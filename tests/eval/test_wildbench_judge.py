"""The WildBench judge protocol against a loopback OpenAI-compatible endpoint: good JSON, bad JSON, empty
output, 429 then success, timeouts; the prompt as WildBench fills it; the template from a file or URL."""

import json
import threading
import time

import pytest
from eval_helpers import FIXTURES, chat_reply

from eval.wildbench import WildBenchJudge, history_and_query, judge_prompt, load_template, parse_judgement
from sarl.checking.openai_client import ChatClient, ChatRequestError, api_base

TEMPLATE = (FIXTURES / "judge_template.md").read_text()


def make_judge(url, **kw):
    kw = {"max_retries": 2, "backoff_s": 0.01, "timeout_s": 5.0, "concurrency": 4, **kw}
    return WildBenchJudge(url, "judge-model", TEMPLATE, **kw)


def collect(judge, items):
    out = {}
    failures = judge.judge_many(items, lambda key, record: out.__setitem__(key, record))
    return out, failures


@pytest.mark.parametrize(
    "text,score",
    [
        ('{"strengths": "clear", "weaknesses": "none", "score": "8"}', 8.0),
        ('```json\n{"strengths": "a", "weaknesses": "b", "score": 6}\n```', 6.0),
        ('{"strengths": "says "hi" twice", "weaknesses": "x", "score": "7"}', 7.0),  # broken JSON: WildBench's regex
        ('analysis... "score": 9.5 done', 9.5),
        ('{"score": "10"}', 10.0),
        ('{"score": "1"}', 1.0),
    ],
)
def test_parse_judgement_reads_scores(text, score):
    assert parse_judgement(text) == (score, None)


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "empty judge output"),
        (None, "empty judge output"),
        ("   \n", "empty judge output"),
        ("The response is good.", "no score"),
        ('{"strengths": "a", "weaknesses": "b"}', "no score"),
        ('{"score": "eleven"}', "not a number"),
        ('{"score": "11"}', "outside 1..10"),
        ('{"score": 0}', "outside 1..10"),
    ],
)
def test_parse_judgement_failures_carry_a_reason_not_a_score(text, reason):
    score, why = parse_judgement(text)
    assert score is None and reason in why


def test_prompt_is_filled_as_wildbench_fills_it():
    conversation = [
        {"role": "user", "content": "I need a trip plan."},
        {"role": "assistant", "content": "Where to?"},
        {"role": "user", "content": "Plan a day in Paris."},
    ]
    history, query = history_and_query(conversation)
    assert history == "USER: I need a trip plan.\n\nASSISTANT: Where to?\n\n"
    assert query == "Plan a day in Paris."
    prompt = judge_prompt(TEMPLATE, conversation, "Louvre, then lunch.", ["Whole day?", "Realistic?"])
    assert "[history]\nUSER: I need a trip plan.\n\nASSISTANT: Where to?\n\n\n[query]\nPlan a day in Paris.\n" in prompt
    assert "<<<Louvre, then lunch.>>>" in prompt
    assert "[checklist]\n- Whole day?\n- Realistic?\n\n" in prompt
    assert "{$" not in prompt
    with pytest.raises(ValueError, match="empty conversation"):
        history_and_query([])


def test_good_json_is_scored_and_the_request_is_wildbenchs(chat_server):
    server = chat_server(lambda s, body: (200, chat_reply('{"strengths": "s", "weaknesses": "w", "score": "8"}')))
    out, failures = collect(make_judge(server.url), [("t1", "PROMPT")])
    assert failures == 0
    assert out["t1"]["score"] == 8.0 and out["t1"]["failed"] is None
    body = server.requests[0]
    assert body["model"] == "judge-model"
    assert body["messages"] == [{"role": "user", "content": "PROMPT"}]
    assert body["temperature"] == 0.0 and body["max_tokens"] == 1024
    assert body["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(
    "content,reason",
    [("I liked it.", "no score"), ("", "empty judge output"), (None, "empty judge output")],
)
def test_bad_or_empty_judge_output_is_a_failed_judgement(chat_server, content, reason):
    server = chat_server(lambda s, body: (200, chat_reply(content)))
    out, failures = collect(make_judge(server.url), [("t1", "PROMPT")])
    assert failures == 1
    assert out["t1"]["score"] is None and reason in out["t1"]["failed"]
    assert len(server.requests) == 1  # a judge that answered is not asked again


@pytest.mark.parametrize("status", [429, 500, 503])
def test_429_or_5xx_then_success_is_retried_with_backoff(chat_server, status):
    calls = []

    def respond(server, body):
        calls.append(time.monotonic())
        if len(calls) == 1:
            return status, {"error": "slow down"}, {"Retry-After": "0.2"}
        return 200, chat_reply('{"score": "7"}')

    server = chat_server(respond)
    judge = make_judge(server.url)
    out, failures = collect(judge, [("t1", "PROMPT")])
    assert failures == 0 and out["t1"]["score"] == 7.0
    assert len(server.requests) == 2
    assert calls[1] - calls[0] >= 0.19  # Retry-After honoured
    assert judge.client.counts == {"requests": 2, "retries": 1, "failures": 0, "circuit_open": 0}


def test_endless_429_fails_after_the_retries(chat_server):
    server = chat_server(lambda s, body: (429, {"error": "quota"}))
    out, failures = collect(make_judge(server.url, max_retries=2), [("t1", "PROMPT")])
    assert failures == 1
    assert out["t1"]["score"] is None and "failed after 3 attempts" in out["t1"]["failed"]
    assert "HTTP 429" in out["t1"]["failed"]
    assert len(server.requests) == 3


def test_client_error_is_not_retried(chat_server):
    server = chat_server(lambda s, body: (400, {"error": "bad request"}))
    out, failures = collect(make_judge(server.url), [("t1", "PROMPT")])
    assert failures == 1 and "HTTP 400" in out["t1"]["failed"]
    assert len(server.requests) == 1


# A judge that holds its answer this long (or until the test lets it go): an attempt the deadline did not cut would
# take that long, so a bound well under it shows the cut without being a benchmark a loaded machine could miss.
HOLD_S = 30.0


def test_timeout_is_retried_then_recorded_as_failed(chat_server):
    release = threading.Event()

    def respond(server, body):
        release.wait(HOLD_S)
        return 200, chat_reply('{"score": "9"}')

    server = chat_server(respond)
    start = time.monotonic()
    try:
        out, failures = collect(make_judge(server.url, timeout_s=0.25, max_retries=1), [("t1", "PROMPT")])
        took = time.monotonic() - start
    finally:
        release.set()
    assert failures == 1
    assert out["t1"]["score"] is None and "DeadlineExceeded: answer not complete within 0.25 s" in out["t1"]["failed"]
    assert len(server.requests) == 2
    assert took < 10.0  # two cut attempts; one uncut would take HOLD_S


def test_timeout_then_success(chat_server):
    release = threading.Event()

    def respond(server, body):
        if len(server.requests) == 1:
            release.wait(HOLD_S)
        return 200, chat_reply('{"score": "4"}')

    server = chat_server(respond)
    try:  # a deadline a prompt answer on loopback meets on a loaded machine too
        out, failures = collect(make_judge(server.url, timeout_s=1.0), [("t1", "PROMPT")])
    finally:
        release.set()
    assert failures == 0 and out["t1"]["score"] == 4.0


def test_judgements_run_concurrently_and_each_is_reported(chat_server):
    def respond(server, body):
        time.sleep(0.2)
        n = body["messages"][0]["content"]
        return 200, chat_reply(json.dumps({"score": n}))

    server = chat_server(respond)
    items = [(f"t{i}", str(i)) for i in range(1, 9)]
    out, failures = collect(make_judge(server.url, concurrency=4), items)
    assert failures == 0
    assert {k: r["score"] for k, r in out.items()} == {f"t{i}": float(i) for i in range(1, 9)}
    assert 2 <= server.max_in_flight <= 4


def test_api_key_is_sent_as_bearer_token(chat_server):
    server = chat_server(lambda s, body: (200, chat_reply('{"score": "5"}')))
    client = ChatClient(server.url, api_key="sk-test")
    assert client._http.client.headers.get("authorization") == "Bearer sk-test"
    assert client.chat({"model": "m", "messages": []})["choices"][0]["message"]["content"] == '{"score": "5"}'
    client.close()


def test_api_base_normalises_the_url():
    assert api_base("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_base("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert api_base("https://api.openai.com/v1") == "https://api.openai.com/v1"
    with pytest.raises(ValueError, match="not an http"):
        api_base("127.0.0.1:8000")


def test_dead_endpoint_fails_with_the_reason(unused_port_url):
    client = ChatClient(unused_port_url, max_retries=1, backoff_s=0.01, timeout_s=2.0)
    with pytest.raises(ChatRequestError, match="ConnectError"):
        client.chat({"model": "m", "messages": []})


@pytest.fixture
def unused_port_url():
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused at once
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        sock.close()


def test_template_from_file_url_and_validation(tmp_path, chat_server):
    assert load_template(str(FIXTURES / "judge_template.md")) == TEMPLATE
    server = chat_server()
    server.files["/eval_template.score.v2.md"] = TEMPLATE
    url = server.url.replace("/v1", "") + "/eval_template.score.v2.md"
    assert load_template(url, cache_dir=tmp_path) == TEMPLATE
    server.files.clear()  # the fetched copy is kept: no second download
    assert load_template(url, cache_dir=tmp_path) == TEMPLATE
    bad = tmp_path / "bad.md"
    bad.write_text("Rate this: {$model_output}")
    with pytest.raises(ValueError, match="lacks the placeholders"):
        load_template(str(bad))
    with pytest.raises(FileNotFoundError, match="judge.template"):
        load_template(str(tmp_path / "missing.md"))
    with pytest.raises(RuntimeError, match="cannot fetch"):
        load_template(server.url.replace("/v1", "") + "/nothing-here.md", cache_dir=tmp_path / "other")
