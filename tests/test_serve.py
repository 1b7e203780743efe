"""`localspec serve` as clients use it: a real server process on a loopback port, the real `openai`
client (and plain HTTP for what the client hides), real llama.cpp on tiny GGUFs (fast) and the Qwen
fixture pair (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
parser = pytest.importorskip("prometheus_client.parser")

from serve_process import ServeProcess, httpx

from localspec.options import FIXED_K

PROMPT = "Write a short story about a robot who learns to paint."


@pytest.fixture(scope="module")
def server(tiny_ggufs) -> Iterator[ServeProcess]:  # type: ignore[no-untyped-def]
    """Target and a similar draft, model drafting (k 3), a small context and body limit."""
    target, draft, _ = tiny_ggufs
    s = ServeProcess("--target", str(target), "--draft", str(draft), "--draft-method", "model", "-k", "3",
                     "--n-ctx", "512", "--max-body-bytes", "65536", "--model-name", "tiny")  # fmt: skip
    yield s
    s.close()


def chat(client, content: str = PROMPT, **kw: Any):  # type: ignore[no-untyped-def]
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], **kw)


def stream_text(stream) -> tuple[list[Any], str]:  # type: ignore[no-untyped-def]
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def metrics(s: ServeProcess) -> dict[str, float]:
    """Every sample of /metrics, keyed `name{label=value,...}`."""
    r = httpx.get(f"{s.url}/metrics", headers=s.headers())
    assert r.status_code == 200
    out: dict[str, float] = {}
    for family in parser.text_string_to_metric_families(r.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


@pytest.mark.parametrize(
    ("stops", "pieces", "sent", "hit"),
    [
        (["END"], ["abc E", "N", "D tail"], ["abc ", "", ""], True),  # split over three pieces
        (["END", "xy"], ["abc E", "N", "x", "D more"], ["abc ", "", "EN", "xD more"], False),  # never whole
        (["\n\n", "STOP"], ["one\n", "\ntwo"], ["one", ""], True),
        (["aa"], ["ba", "a"], ["b", ""], True),
    ],
)
def test_stop_matcher_holds_back_only_possible_stops(stops, pieces, sent, hit) -> None:  # type: ignore[no-untyped-def]
    from localspec.server.stops import StopMatcher

    m = StopMatcher(stops)
    assert [m.feed(p) for p in pieces] == sent
    assert m.hit == hit
    tail = m.flush()
    full = "".join(pieces)
    assert m.text == (full[: min(full.find(x) for x in stops if x in full)] if hit else full)
    assert tail == ("" if hit else full[len("".join(sent)) :])


# -- chat and completion, streamed and not -----------------------------------------------------------


def test_chat_plain_and_streamed_agree_with_stats(server: ServeProcess) -> None:
    client = server.client()
    r = chat(client)
    text = r.choices[0].message.content
    assert r.object == "chat.completion" and r.model == "tiny" and r.choices[0].message.role == "assistant"
    assert text and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 24 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    chunks, streamed = stream_text(chat(client, stream=True))
    assert streamed == text  # greedy: the same answer streamed
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices[0].finish_reason == r.choices[0].finish_reason
    t = last.model_extra["timings"]
    assert t["predicted_n"] == r.usage.completion_tokens
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)


def test_stats_fields_present_and_consistent(server: ServeProcess) -> None:
    r = chat(server.client(), max_tokens=40)
    t = r.model_extra["timings"]
    for key in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second", "draft_n",
                "draft_n_accepted", "acceptance_rate", "mean_accepted_length", "acceptance_by_position",
                "draft_method", "draft_sources"):  # fmt: skip
        assert key in t, key
    assert t["draft_method"] == "model" and t["k"] == 3
    assert t["predicted_n"] == r.usage.completion_tokens
    assert t["prompt_n"] + t["cache_n"] == r.usage.prompt_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == t["cache_n"]
    assert 0 <= t["draft_n_accepted"] <= t["draft_n"] and t["draft_n"] > 0
    assert t["acceptance_rate"] == pytest.approx(t["draft_n_accepted"] / t["draft_n"])
    # tokens per target pass: what the rounds added after the prompt pass's first token
    assert t["mean_accepted_length"] == pytest.approx((t["predicted_n"] - 1) / t["rounds"])
    assert sum(t["accepted_by_position"]) == t["draft_n_accepted"] and sum(t["drafted_by_position"]) == t["draft_n"]
    if t["predicted_n"] > 1:
        assert t["predicted_per_second"] == pytest.approx((t["predicted_n"] - 1) / (t["predicted_ms"] / 1000), rel=1e-6)
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 40
    assert sum(t["draft_sources"].values()) == t["rounds"]


def test_completion_plain_streamed_and_usage(server: ServeProcess) -> None:
    client = server.client()
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=20, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    chunks = list(client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == r.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason


def test_chat_include_usage_and_raw_sse_format(server: ServeProcess) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}, "some_unknown_field": {"x": 1}}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] >= 1
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length") and "timings" in events[-2]
    assert all(e["usage"] is None for e in events[:-1])


def test_list_content_parts_and_system_message(server: ServeProcess) -> None:
    client = server.client()
    parts = client.chat.completions.create(model="tiny", max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]}])  # fmt: skip
    plain = client.chat.completions.create(model="tiny", max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello world"}])  # fmt: skip
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


# -- stop strings, seeds, equality with `run` ----------------------------------------------------------


def test_stop_string_split_across_tokens_never_leaks(server: ServeProcess) -> None:
    client = server.client()
    plain = {"speculative": {"method": "none"}}
    # Plain decoding streams one token per delta: pick a stop string across two tokens' text.
    chunks, text = stream_text(chat(client, max_tokens=40, stream=True, extra_body=plain))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    stop = None
    for i in range(len(pieces) - 1, 0, -1):
        a, b = pieces[i - 1], pieces[i]
        candidate = a[-2:] + b[:2]
        start = sum(len(p) for p in pieces[: i - 1]) + len(a) - len(a[-2:])
        if len(a) >= 1 and len(b) >= 1 and text.find(candidate) == start and len(candidate) >= 2:
            stop = candidate
            break
    assert stop is not None, pieces
    cut = text[: text.index(stop)]
    for extra in (plain, {}):  # one token per delta, and whole speculative rounds per delta
        r = chat(client, max_tokens=40, stop=[stop, "\x00never"], extra_body=extra)
        assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
        chunks, streamed = stream_text(chat(client, max_tokens=40, stop=stop, stream=True, extra_body=extra))
        assert streamed == cut  # nothing of the stop string, not even its first characters, went out
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_same_seed_same_text(server: ServeProcess) -> None:
    client = server.client()
    kw = {"temperature": 1.0, "max_tokens": 24}
    first = chat(client, seed=42, **kw).choices[0].message.content
    assert chat(client, seed=42, **kw).choices[0].message.content == first
    others = {chat(client, seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert others != {first}  # the seed is used, not ignored


def test_greedy_output_equals_run(server: ServeProcess, tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    target, draft, _ = tiny_ggufs
    prompt = "Explain why the sky is blue."
    run = subprocess.run([sys.executable, "-m", "localspec.cli", "run", prompt, "--target", str(target), "--draft",
                          str(draft), "--draft-method", "model", "-k", "3", "--n-ctx", "512", "--max-tokens", "32",
                          "--json"], capture_output=True, text=True, check=False, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    expected = json.loads(run.stdout)
    r = chat(server.client(), prompt, max_tokens=32)
    assert r.choices[0].message.content == expected["text"]
    assert r.usage.completion_tokens == expected["stats"]["n_generated"]


def test_speculative_extension_per_request(server: ServeProcess) -> None:
    client = server.client()
    plain = chat(client, extra_body={"speculative": {"method": "none"}}).model_extra["timings"]
    assert plain["draft_method"] == "none" and plain["draft_n"] == 0
    ngram = chat(client, extra_body={"speculative": {"method": "ngram", "k": 2}}).model_extra["timings"]
    assert ngram["draft_method"] == "ngram" and ngram["k"] == 2
    # serve's -k 3 is its own method's; another method without k drafts its own default length
    assert chat(client, extra_body={"speculative": {"method": "ngram"}}).model_extra["timings"]["k"] == FIXED_K
    assert chat(client, extra_body={"speculative": {"method": "model"}}).model_extra["timings"]["k"] == 3
    with pytest.raises(openai.BadRequestError, match="speculative.method"):
        chat(client, extra_body={"speculative": {"method": "magic"}})


def _head_method_errors(s: ServeProcess) -> dict[str, dict[str, Any]]:
    """Each head family asked for per request: its error (400 expected), by method."""
    from localspec.families import registry

    out = {}
    for fam in registry.head_families():
        body = {"messages": HELLO, "max_tokens": 4, "speculative": {"method": fam.name}}
        err = _assert_openai_error(_post(s, CHAT, json=body), 400, code="invalid_value")
        assert err["type"] == "invalid_request_error" and err["param"] == "speculative.method", err
        assert f"speculative.method {fam.name} cannot draft on this server" in err["message"]
        out[fam.name] = err
    return out


def test_a_head_method_the_draft_model_cannot_run_is_a_400(server: ServeProcess) -> None:
    """A head family asked of a server whose draft is an ordinary model: the client's mistake (400, which
    the openai client does not retry), saying why; not a 500 from building the drafter."""
    errors = _head_method_errors(server)
    assert "not an EAGLE-3 head" in errors["eagle3"]["message"]
    assert "not a DFlash drafter" in errors["dflash"]["message"]
    assert "no MTP layers" in errors["mtp"]["message"]
    # Checked before the request is queued: a stream is refused with a 400 too, not begun and then ended
    # by an error event.
    streamed = _post(server, CHAT, json={"messages": HELLO, "stream": True, "speculative": {"method": "eagle3"}})
    assert _assert_openai_error(streamed, 400)["param"] == "speculative.method"
    with pytest.raises(openai.BadRequestError):  # max_retries=0 aside, a 400 is never retried
        chat(server.client(), extra_body={"speculative": {"method": "eagle3"}})
    assert chat(server.client(), max_tokens=2).choices[0].message.content is not None  # still serving


@pytest.fixture(scope="module")
def glm_mtp(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """A tiny glm4moe target whose file keeps an MTP layer."""
    from gguf_factory import write_tiny_glm4moe

    path = tmp_path_factory.mktemp("serve-mtp") / "glm4moe-mtp.gguf"
    write_tiny_glm4moe(path, smollm2_path, seed=0)
    return path


def test_mtp_on_a_target_loaded_without_its_layers_is_a_400(glm_mtp: Path) -> None:
    """The target's file has MTP layers, but the server loaded it for plain decoding (without them)."""
    s = ServeProcess("--target", str(glm_mtp), "--draft-method", "none", "--n-ctx", "256")
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 4, "speculative": {"method": "mtp"}}
        err = _assert_openai_error(_post(s, "/v1/completions", json=body), 400, code="invalid_value")
        assert err["param"] == "speculative.method" and "loaded without" in err["message"], err
        assert "--draft-method mtp" in err["message"]
    finally:
        s.close()
    own = ServeProcess("--target", str(glm_mtp), "--draft-method", "mtp", "--n-ctx", "256")
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 4, "speculative": {"method": "mtp"}}
        r = _post(own, "/v1/completions", json=body)
        assert r.status_code == 200 and r.json()["timings"]["draft_method"] == "mtp", r.text
    finally:
        own.close()


def test_a_head_method_the_server_has_the_head_for_runs_per_request(eagle3_pair: tuple[Path, Path]) -> None:
    """The check up front refuses only what cannot run: with an EAGLE-3 head loaded (auto drives it), a
    request may ask for eagle3 itself; a draft model it has not got is still a 400."""
    target, head = eagle3_pair
    s = ServeProcess("--target", str(target), "--draft", str(head), "--draft-method", "auto", "--n-ctx", "512")
    try:
        body = {"messages": HELLO, "max_tokens": 8, "temperature": 0, "speculative": {"method": "eagle3", "k": 2}}
        r = _post(s, CHAT, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["timings"]["draft_method"] == "eagle3"
        err = _assert_openai_error(_post(s, CHAT, json={**body, "speculative": {"method": "model"}}), 400)
        assert err["param"] == "speculative.method" and "needs a draft model" in err["message"]
    finally:
        s.close()


SETTINGS_ONLY = """
import json, sys
from fastapi.testclient import TestClient
from localspec.cli import build_parser
from localspec.commands.first_use import model_options_from_args
from localspec.commands.serve import build_server
args = build_parser().parse_args(["serve", "--target", sys.argv[1], "--draft-method", "none", "--n-ctx", "256",
                                  "--threads", "1", "--temperature", "0.7", "--seed", "9", "--max-tokens", "3"])
app, pipeline, name = build_server(args, model_options_from_args(args))
try:
    with TestClient(app) as client:
        for body in ({}, {"seed": 4, "max_tokens": 2, "temperature": 0}):
            r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], **body})
            print(json.dumps(r.json()))
finally:
    pipeline.close()
"""


def test_requests_are_serves_generation_settings_with_their_fields_replaced(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    """serve's flags are a GenerationSettings; a request replaces the fields it sets."""
    r = subprocess.run([sys.executable, "-c", SETTINGS_ONLY, str(tiny_ggufs[0])], capture_output=True, text=True,
                       check=False, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    defaults, replaced = (json.loads(line) for line in r.stdout.splitlines())
    t = defaults["timings"]
    assert (t["seed"], t["rule"], defaults["usage"]["completion_tokens"]) == (9, "exact", 3)  # serve's flags
    t = replaced["timings"]
    assert (t["seed"], t["rule"], replaced["usage"]["completion_tokens"]) == (4, "greedy", 2)  # the request's


# -- the cache, the queue, disconnects -------------------------------------------------------------------


def test_second_turn_reuses_the_cache(server: ServeProcess) -> None:
    client = server.client()
    messages = [{"role": "user", "content": "Tell me about the moon and its phases in detail, please."}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And the sun?"}]  # fmt: skip
    second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    t = second.model_extra["timings"]
    assert t["cache_n"] >= first.usage.prompt_tokens  # the whole first turn came from the cache
    assert t["prompt_n"] <= second.usage.prompt_tokens - first.usage.prompt_tokens  # only the new tokens ran


def test_four_concurrent_clients_get_complete_answers(server: ServeProcess) -> None:
    client = server.client()
    prompts = [f"Give me {n} reasons to learn {topic}." for n, topic in
               ((3, "Python"), (5, "music"), (2, "chess"), (4, "cooking"))]  # fmt: skip
    expected = [chat(client, p, max_tokens=32).choices[0].message.content for p in prompts]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            if i % 2:
                results[i] = stream_text(chat(server.client(), prompts[i], max_tokens=32, stream=True))[1]
            else:
                results[i] = chat(server.client(), prompts[i], max_tokens=32).choices[0].message.content
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors
    assert [results[i] for i in range(4)] == expected


def _wait_idle(s: ServeProcess, timeout: float = 10.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(s)
        if m["localspec:num_requests_running"] == 0 and m["localspec:num_requests_waiting"] == 0:
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.05)


def test_disconnect_mid_stream_frees_the_server(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    s = ServeProcess("--target", str(tiny_ggufs[0]), "--draft-method", "none", "--n-ctx", "2048", "--max-queue", "0")
    try:
        before = metrics(s)["localspec:generation_tokens_total"]
        body = {"prompt": "Count: 1 2 3", "max_tokens": 2000, "stream": True, "temperature": 0.7, "seed": 1}
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]  # the generation runs
            assert any('"text"' in g for g in got)
            busy = httpx.post(f"{s.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert busy.status_code == 503 and int(busy.headers["retry-after"]) >= 1  # --max-queue 0: no waiting
            assert busy.json()["error"]["code"] == "queue_full"
        # The client has gone: the generation stops at once, far short of its 2000 tokens.
        m = _wait_idle(s, timeout=5.0)
        generated = m["localspec:generation_tokens_total"] - before
        assert 0 < generated < 2000
        assert m["localspec:request_success_total{finished_reason=abort}"] == 1
        ok = httpx.post(f"{s.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    finally:
        s.close()


# -- errors -------------------------------------------------------------------------------------------------


def _post(s: ServeProcess, path: str, **kw: Any) -> httpx.Response:
    return httpx.post(f"{s.url}{path}", headers={**s.headers(), **kw.pop("headers", {})}, timeout=60, **kw)


def _assert_openai_error(r: httpx.Response, status: int, *, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    return err


CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
USAGE = "stream_options.include_usage"


@pytest.mark.parametrize(
    ("send", "status", "code", "param"),
    [
        ({"content": b'{"messages": [', "headers": {"content-type": "application/json"}}, 400, "invalid_json", None),
        ({"json": {"messages": "hello"}}, 400, "invalid_type", "messages"),
        ({"json": {"messages": HELLO, "max_tokens": "many"}}, 400, "invalid_type", "max_tokens"),
        ({"json": {"messages": []}}, 400, "invalid_value", "messages"),
        ({"json": {"model": "tiny"}}, 400, "invalid_value", "messages"),
        ({"json": {"messages": HELLO, "n": 2}}, 400, "invalid_value", "n"),
        ({"json": {"messages": HELLO, "logprobs": True}}, 400, "unsupported_parameter", "logprobs"),
        ({"json": {"messages": HELLO, "temperature": -1}}, 400, "invalid_value", None),
        ({"json": {"messages": [{"role": "function", "content": "x"}]}}, 400, "invalid_value", "messages[0].role"),
        ({"json": {"messages": HELLO, "model": "gpt-4"}}, 404, "model_not_found", "model"),
        # strict types: nothing is coerced (a bool is no int, a string no number, "yes" no bool)
        ({"json": {"messages": HELLO, "max_tokens": True}}, 400, "invalid_type", "max_tokens"),
        ({"json": {"messages": HELLO, "max_tokens": "10"}}, 400, "invalid_type", "max_tokens"),
        ({"json": {"messages": HELLO, "max_tokens": 10.0}}, 400, "invalid_type", "max_tokens"),
        ({"json": {"messages": HELLO, "stream": "yes"}}, 400, "invalid_type", "stream"),
        ({"json": {"messages": HELLO, "stream": 1}}, 400, "invalid_type", "stream"),
        ({"json": {"messages": HELLO, "temperature": True}}, 400, "invalid_type", "temperature"),
        ({"json": {"messages": HELLO, "top_p": "0.5"}}, 400, "invalid_type", "top_p"),
        ({"json": {"messages": HELLO, "temperature": "0.5"}}, 400, "invalid_type", "temperature"),
        ({"json": {"messages": HELLO, "seed": "7"}}, 400, "invalid_type", "seed"),
        ({"json": {"messages": HELLO, "stop": 5}}, 400, "invalid_type", "stop"),
        ({"json": {"messages": HELLO, "speculative": {"k": "2"}}}, 400, "invalid_type", "speculative.k"),
        ({"json": {"messages": HELLO, "stream_options": {"include_usage": 1}}}, 400, "invalid_type", USAGE),
        ({"json": {"messages": [{"role": "user", "content": 5}]}}, 400, "invalid_type", "messages[0].content"),
        ({"json": {"messages": [{"role": True, "content": "x"}]}}, 400, "invalid_type", "messages[0].role"),
    ],
)
def test_request_errors_are_openai_shaped(server: ServeProcess, send: dict[str, Any], status: int, code: str,
                                          param: str | None) -> None:  # fmt: skip
    err = _assert_openai_error(_post(server, CHAT, **send), status, code=code)
    assert err["param"] == param
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


def test_ints_for_numbers_and_nulls_for_optional_fields_are_accepted(server: ServeProcess) -> None:
    """Strict, not stricter: an integer where a number is expected, and JSON null where OpenAI's fields are
    optional (clients send `"stop": null`, `"stream": null`)."""
    nulls = {key: None for key in ("model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                                   "n", "stream", "stream_options", "logprobs", "speculative",
                                   "max_completion_tokens", "top_logprobs")}  # fmt: skip
    r = _post(server, CHAT, json={"messages": HELLO, **nulls})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text  # null stream: not streamed
    ints = {"messages": HELLO, "max_tokens": 4, "temperature": 1, "top_p": 1, "min_p": 0, "seed": 3}
    r = _post(server, CHAT, json=ints)
    assert r.status_code == 200, r.text
    assert r.json()["timings"]["seed"] == 3
    done = _post(server, "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "echo": None, "prompt_tokens": None})
    assert done.status_code == 200, done.text
    tok = _post(server, "/tokenize", json={"content": "hi", "add_special": "yes"})
    _assert_openai_error(tok, 400, code="invalid_type")


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(
    ("path", "fields", "param", "code"),
    [
        (CHAT, {"functions": [WEATHER["function"]]}, "functions", "unsupported_parameter"),  # tools: test_tools.py
        (CHAT, {"function_call": {"name": "get_weather"}}, "function_call", "unsupported_parameter"),
        (CHAT, {"response_format": {"type": "xml"}}, "response_format.type", "invalid_value"),
        (CHAT, {"logit_bias": {"15": 5}}, "logit_bias", "unsupported_parameter"),
        (CHAT, {"presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
        ("/v1/completions", {"best_of": 3}, "best_of", "unsupported_parameter"),
    ],
)  # fmt: skip
def test_fields_serve_cannot_honour_are_refused_not_ignored(
    server: ServeProcess, path: str, fields: dict[str, Any], param: str, code: str
) -> None:
    """An agent that sends legacy functions (or a suffix, penalties, ...) must never get an answer made as if it had
    not."""
    base: dict[str, Any] = {"messages": HELLO} if path == CHAT else {"prompt": "def f(x):"}
    for stream in (False, True):
        err = _assert_openai_error(_post(server, path, json={**base, **fields, "stream": stream}), 400, code=code)
        assert err["param"] == param and "localspec serve" in err["message"]
    # Their idle values ask for nothing and are accepted, as OpenAI's clients send them.
    idle = {"tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "logit_bias": {},
            "presence_penalty": 0, "frequency_penalty": 0.0}  # fmt: skip
    assert _post(server, CHAT, json={"messages": HELLO, "max_tokens": 2, **idle}).status_code == 200
    plain = {"prompt": "def f(x):", "max_tokens": 2, "suffix": "", "echo": False, "best_of": 1}
    assert _post(server, "/v1/completions", json=plain).status_code == 200


COMPLETIONS = "/v1/completions"
HI = {"prompt": "Once upon a time", "max_tokens": 4}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"temperature": "0.5"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"seed": 1.5}, "seed"),
        ({"echo": "yes"}, "echo"),
        ({"echo": 1}, "echo"),
        ({"suffix": 5}, "suffix"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": [1.5, 2]}, "prompt"),
        ({"speculative": {"method": 3}}, "speculative.method"),
    ],
)
def test_completion_request_types_are_strict(server: ServeProcess, fields: dict[str, Any], param: str) -> None:
    """/v1/completions reads its body as strictly as chat: a bool is no number, a string no bool or number."""
    err = _assert_openai_error(_post(server, COMPLETIONS, json={**HI, **fields}), 400, code="invalid_type")
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_a_head_method_on_completions_is_a_400_too(server: ServeProcess) -> None:
    """eagle3 with an ordinary draft model: a 400 naming why on /v1/completions as on chat, streamed or not."""
    for stream in (False, True):
        body = {**HI, "stream": stream, "speculative": {"method": "eagle3"}}
        err = _assert_openai_error(_post(server, COMPLETIONS, json=body), 400, code="invalid_value")
        assert err["param"] == "speculative.method" and "not an EAGLE-3 head" in err["message"], err


def test_echo_repeats_the_prompt_before_the_completion(server: ServeProcess) -> None:
    """OpenAI's echo: the text starts with the prompt (streamed: the prompt is the first chunk); usage counts
    the same tokens as without echo."""
    client = server.client()
    prompt = "The robot picked up a brush and"
    plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
    echoed = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    assert echoed.usage.prompt_tokens == plain.usage.prompt_tokens
    assert echoed.usage.completion_tokens == plain.usage.completion_tokens
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, echo=True,
                                            stream=True))  # fmt: skip
    assert chunks[0].choices[0].text == prompt
    assert "".join(c.choices[0].text for c in chunks) == echoed.choices[0].text
    # Token ids echo as their text.
    ids = _post(server, "/tokenize", json={"content": prompt}).json()["tokens"]
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0, echo=True)
    assert by_ids.choices[0].text == echoed.choices[0].text
    # A stop string ends the completion, never the echoed prompt (which contains it).
    stopped = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, echo=True,
                                        stop=["robot"])  # fmt: skip
    assert stopped.choices[0].text.startswith(prompt)
    err = _assert_openai_error(_post(server, COMPLETIONS, json={**HI, "echo": True, "logprobs": 2}), 400)
    assert err["param"] == "logprobs"


def test_a_suffix_on_a_model_without_fim_tokens_is_a_400(server: ServeProcess) -> None:
    """The tiny models have SmolLM2's vocabulary: no FIM tokens, so fill-in-the-middle is refused, saying why;
    echo with a suffix is refused on any model (as OpenAI refuses it); an empty suffix asks for nothing."""
    for stream in (False, True):
        body = {**HI, "suffix": "\n    return x", "stream": stream}
        err = _assert_openai_error(_post(server, COMPLETIONS, json=body), 400, code="unsupported_parameter")
        assert err["param"] == "suffix" and "FIM tokens" in err["message"], err
        assert "tiny-llama-0 has none" in err["message"], err  # the model's own name (its GGUF's general.name)
    both = _assert_openai_error(_post(server, COMPLETIONS, json={**HI, "suffix": "x", "echo": True}), 400)
    assert both["param"] == "echo" and "suffix" in both["message"]
    with pytest.raises(openai.BadRequestError, match="FIM tokens"):
        server.client().completions.create(model="tiny", prompt="def f(x):", suffix="\n    return y", max_tokens=4)
    assert _post(server, COMPLETIONS, json={**HI, "suffix": ""}).status_code == 200


def test_wrong_http_method_is_an_invalid_request(server: ServeProcess) -> None:
    """405 in OpenAI's shape: the request's mistake (invalid_request_error), with the methods allowed."""
    r = httpx.get(f"{server.url}{CHAT}")
    err = _assert_openai_error(r, 405, code="method_not_allowed")
    assert err["type"] == "invalid_request_error" and "GET" in err["message"]
    assert r.headers.get("allow") == "POST"
    assert _assert_openai_error(httpx.post(f"{server.url}/v1/models"), 405)["type"] == "invalid_request_error"


def test_context_overflow_and_body_limit(server: ServeProcess) -> None:
    long = "word " * 700  # beyond --n-ctx 512
    err = _assert_openai_error(_post(server, CHAT, json={"messages": [{"role": "user", "content": long}]}), 400,
                               code="context_length_exceeded")  # fmt: skip
    assert "512" in err["message"] and "prompt is" in err["message"]
    huge = {"messages": [{"role": "user", "content": "x" * 70_000}]}  # beyond --max-body-bytes 65536
    _assert_openai_error(_post(server, CHAT, json=huge), 413, code="request_too_large")
    with pytest.raises(openai.BadRequestError) as e:  # the openai client sees the same
        chat(server.client(), long)
    assert e.value.code == "context_length_exceeded"
    assert chat(server.client(), max_tokens=2).choices[0].message.content is not None  # still serving


def test_api_key_required_and_compared_and_cors(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    s = ServeProcess("--target", str(tiny_ggufs[0]), "--draft-method", "ngram", "--n-ctx", "512",
                     "--cors-origin", "http://app.example", api_key="s3cret")  # fmt: skip
    try:
        assert httpx.get(f"{s.url}/health").status_code == 200  # open, for load balancers
        preflight = httpx.options(f"{s.url}{CHAT}", headers={"Origin": "http://app.example",
                                                            "Access-Control-Request-Method": "POST"})  # fmt: skip
        assert preflight.headers["access-control-allow-origin"] == "http://app.example"
        other = httpx.options(f"{s.url}{CHAT}", headers={"Origin": "http://evil.example",
                                                        "Access-Control-Request-Method": "POST"})  # fmt: skip
        assert other.headers.get("access-control-allow-origin") != "http://evil.example"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.post(f"{s.url}{CHAT}", json={"messages": HELLO}, headers=headers)
            _assert_openai_error(r, 401, code="invalid_api_key")
        # Keys that share the real one's start: all of it compared, not a prefix of it (nor of them).
        for near in ("s3cr", "s3cra", "s3crXXXX", "s3cre", "s3cret2", "s3cret s3cret", "S3CRET"):
            for headers in ({"Authorization": f"Bearer {near}"}, {"X-API-Key": near}):
                r = httpx.post(f"{s.url}{CHAT}", json={"messages": HELLO, "max_tokens": 1}, headers=headers)
                _assert_openai_error(r, 401, code="invalid_api_key")
        assert httpx.get(f"{s.url}/v1/models", headers={"X-API-Key": "s3cret"}).status_code == 200
        assert httpx.get(f"{s.url}/v1/models").status_code == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0).models.list()
        models = s.client().models.list()
        assert [m.id for m in models.data] == ["tiny-target"]  # the target's file name
        r = s.client().chat.completions.create(model="tiny-target", messages=HELLO, max_tokens=4)
        assert r.choices[0].message.content is not None
    finally:
        s.close()


def test_models_health_and_cors_off(server: ServeProcess) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"] and models.data[0].owned_by == "localspec"
    h = httpx.get(f"{server.url}/health").json()
    assert h["status"] == "ok"
    r = httpx.options(f"{server.url}{CHAT}", headers={"Origin": "http://evil.example",
                                                      "Access-Control-Request-Method": "POST"})  # fmt: skip
    assert "access-control-allow-origin" not in r.headers


# -- metrics ------------------------------------------------------------------------------------------------


def test_metrics_parse_and_match_the_responses(server: ServeProcess) -> None:
    _wait_idle(server)
    before = metrics(server)
    client = server.client()
    responses = [chat(client, f"Question {i}: what is {i} + {i}?", max_tokens=16) for i in range(3)]
    usages = [r.usage for r in responses]
    timings = [r.model_extra["timings"] for r in responses]
    chunks, _ = stream_text(chat(client, "One more, streamed.", max_tokens=16, stream=True,
                                 stream_options={"include_usage": True}))  # fmt: skip
    usages.append(chunks[-1].usage)
    timings.append(chunks[-1].model_extra["timings"])
    after = metrics(server)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert sum(delta(f"localspec:request_success_total{{finished_reason={r}}}") for r in ("stop", "length")) == 4
    assert delta("localspec:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta("localspec:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("localspec:spec_decode_num_draft_tokens_total") == sum(t["draft_n"] for t in timings)
    assert delta("localspec:spec_decode_num_accepted_tokens_total") == sum(t["draft_n_accepted"] for t in timings)
    per_pos = sum(delta(f"localspec:spec_decode_num_accepted_tokens_per_pos_total{{position={p}}}") for p in range(3))
    assert per_pos == delta("localspec:spec_decode_num_accepted_tokens_total")
    assert after["localspec:num_requests_running"] == 0 and after["localspec:num_requests_waiting"] == 0


def test_metrics_counters_equal_one_requests_stats(server: ServeProcess) -> None:
    _wait_idle(server)
    before = metrics(server)
    r = chat(server.client(), "Describe a forest at dawn.", max_tokens=24)
    t = r.model_extra["timings"]
    after = metrics(server)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("localspec:prompt_tokens_total") == r.usage.prompt_tokens
    assert delta("localspec:prompt_tokens_cached_total") == t["cache_n"]
    assert delta("localspec:generation_tokens_total") == r.usage.completion_tokens
    assert delta("localspec:spec_decode_num_draft_tokens_total") == t["draft_n"]
    assert delta("localspec:spec_decode_num_accepted_tokens_total") == t["draft_n_accepted"]
    assert delta("localspec:spec_decode_num_drafts_total") == (t["drafted_by_position"] or [0])[0]
    for pos, accepted in enumerate(t["accepted_by_position"]):
        assert delta(f"localspec:spec_decode_num_accepted_tokens_per_pos_total{{position={pos}}}") == accepted
    assert delta(f"localspec:request_success_total{{finished_reason={r.choices[0].finish_reason}}}") == 1


def test_errors_are_counted(server: ServeProcess) -> None:
    before = metrics(server).get("localspec:request_errors_total{status=400}", 0.0)
    _post(server, CHAT, json={"messages": []})
    assert metrics(server)["localspec:request_errors_total{status=400}"] == before + 1


# -- the command line -------------------------------------------------------------------------------------


def test_print_vllm_uses_the_catalogs_base_models() -> None:
    r = subprocess.run([sys.executable, "-m", "localspec.cli", "serve", "--pair", "qwen2.5-coder-1.5b", "--print-vllm",
                        "-k", "5"], capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.strip()
    assert cmd.startswith("vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct --speculative-config ")
    config = json.loads(cmd.split("--speculative-config ")[1].split(" --")[0].strip("'"))
    assert config == {"method": "draft_model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "num_speculative_tokens": 5}
    ngram = subprocess.run([sys.executable, "-m", "localspec.cli", "serve", "--pair", "qwen2.5-coder-1.5b",
                            "--print-vllm", "--draft-method", "ngram"], capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert '"method": "ngram"' in ngram.stdout and '"num_speculative_tokens": 4' in ngram.stdout
    bare = subprocess.run([sys.executable, "-m", "localspec.cli", "serve", "--print-vllm", "--target", "x.gguf"],
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert bare.returncode == 2 and "needs a catalog pair" in bare.stderr and "Traceback" not in bare.stderr
    default = subprocess.run([sys.executable, "-m", "localspec.cli", "serve", "--print-vllm"],
                             capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert default.returncode == 0 and default.stdout.startswith("vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct ")


def test_bad_server_flags_are_refused_before_loading(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    r = subprocess.run([sys.executable, "-m", "localspec.cli", "serve", "--target", str(tiny_ggufs[0]), "--port", "-5"],
                       capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "--port -5" in r.stderr and "Traceback" not in r.stderr


def test_non_loopback_host_without_key_warns(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    s = ServeProcess("--target", str(tiny_ggufs[0]), "--draft-method", "none", "--n-ctx", "256", "--host", "0.0.0.0")
    try:
        assert "warning: serving on 0.0.0.0 without --api-key" in s.log()
    finally:
        s.close()
    quiet = ServeProcess("--target", str(tiny_ggufs[0]), "--draft-method", "none", "--n-ctx", "256")
    try:
        assert "warning" not in quiet.log()
    finally:
        quiet.close()


# -- the real pair (slow) -------------------------------------------------------------------------------


@pytest.mark.slow
def test_qwen_pair_chat_streams_with_stats_and_reuses_the_cache(qwen_pair: tuple[Path, Path]) -> None:
    target, draft = qwen_pair
    s = ServeProcess("--target", str(target), "--draft", str(draft), "--n-ctx", "2048", "--model-name", "qwen")
    try:
        client = s.client()
        messages = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
        chunks, text = stream_text(client.chat.completions.create(model="qwen", messages=messages, max_tokens=24,
                                                                  temperature=0, stream=True))  # fmt: skip
        assert text.strip()
        t = chunks[-1].model_extra["timings"]
        assert t["draft_method"] == "auto" and t["predicted_n"] == 24 and t["auto_choice"]
        first_prompt = t["prompt_n"] + t["cache_n"]
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Now add type hints."}]
        second = client.chat.completions.create(model="qwen", messages=messages, max_tokens=4, temperature=0)
        t2 = second.model_extra["timings"]
        assert t2["cache_n"] >= first_prompt + 12  # the first prompt and (most of) its answer
        assert t2["prompt_n"] < 40  # only the new user turn and the template around it
    finally:
        s.close()
