"""Anthropic's Messages API on `localspec serve`: the real `anthropic` client (and plain HTTP for what the
client hides) against the app in this process on a real uvicorn server, real llama.cpp on the tiny GGUFs."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")

from serve_process import httpx
from test_serve_inprocess import ForwardGate, InProcess, TinyGGUFs, served

from localspec.decoding.drafters import Drafter
from localspec.errors import ModelFileError
from localspec.families import registry
from localspec.families.base import BuildContext, DrafterFamily

KEY = "s3cret"
MODEL = "tiny"
HI = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


@pytest.fixture(scope="module")
def server(tiny_ggufs: TinyGGUFs) -> Iterator[InProcess]:
    target, draft, _ = tiny_ggufs
    with served("--target", str(target), "--draft", str(draft), "--draft-method", "model", "-k", "3",
                "--n-ctx", "512", "--threads", "1", "--model-name", MODEL, "--api-key", KEY,
                "--max-body-bytes", "65536") as s:  # fmt: skip
        yield s


def client(s: InProcess, **kw: Any) -> Any:
    kw.setdefault("api_key", KEY)
    return anthropic.Anthropic(base_url=s.url, max_retries=0, **kw)


def create(s: InProcess, **kw: Any) -> Any:
    """messages.create, greedy (this SDK has no `temperature` argument any more: it goes as an extra field)."""
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", HI)
    kw.setdefault("max_tokens", 24)
    kw["extra_body"] = {"temperature": 0, **kw.get("extra_body", {})}
    return client(s).messages.create(**kw)


def post(s: InProcess, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{s.url}{path}", json=body, headers={"x-api-key": KEY, **headers}, timeout=60)


def assert_error(r: httpx.Response, status: int, kind: str, *words: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert all(w in body["error"]["message"] for w in words), body
    return body


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event."""
    out = []
    for raw in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in raw.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


# -- answers ----------------------------------------------------------------------------------------------


def test_a_text_round_trip(server: InProcess) -> None:
    m = create(server)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert 1 <= m.usage.output_tokens <= 24
    t = m.model_extra["timings"]  # localspec's speculative statistics, as on the OpenAI routes
    assert t["predicted_n"] == m.usage.output_tokens and t["draft_method"] == "model" and t["draft_n"] > 0
    assert t["prompt_n"] + t["cache_n"] == m.usage.input_tokens


def test_the_prompt_is_rendered_as_the_chat_route_renders_it(server: InProcess) -> None:
    """A system prompt (string or text blocks) and text blocks reach the model as /v1/chat/completions
    would give them: the same prompt tokens, the same greedy answer."""
    system = "You answer in one sentence."
    m = create(server, system=system, max_tokens=8)
    as_chat = [{"role": "system", "content": system}, *HI]
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "max_tokens": 8, "temperature": 0,
                                                 "messages": as_chat}).json()  # fmt: skip
    assert m.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert m.content[0].text == chat["choices"][0]["message"]["content"]
    blocks = [{"role": "user", "content": [{"type": "text", "text": HI[0]["content"]}]}]
    as_blocks = create(server, system=[{"type": "text", "text": system}], max_tokens=8, messages=blocks)
    assert as_blocks.usage.input_tokens == m.usage.input_tokens and as_blocks.content[0].text == m.content[0].text
    longer = create(server, system=system + " Never more than ten words.", max_tokens=1)
    assert longer.usage.input_tokens > m.usage.input_tokens  # the system prompt is in


def test_stop_sequences_and_max_tokens(server: InProcess) -> None:
    text = create(server).content[0].text
    stop = text[6:9]
    assert len(text) >= 9 and stop.strip(), f"the greedy answer is too short to cut: {text!r}"
    m = create(server, stop_sequences=["never appears \x00", stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text[: text.find(stop)]
    short = create(server, max_tokens=3)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    assert text.startswith(short.content[0].text)


def test_streaming_events_in_order_and_the_same_answer(server: InProcess) -> None:
    plain = create(server)
    events = list(create(server, stream=True))
    kinds = [e.type for e in events]
    n = kinds.count("content_block_delta")
    assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * n, "content_block_stop",
                     "message_delta", "message_stop"]  # fmt: skip
    start = events[0].message
    assert start.id.startswith("msg_") and start.content == [] and start.usage.input_tokens == plain.usage.input_tokens
    assert events[1].index == 0 and events[1].content_block.type == "text"
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == plain.content[0].text
    end = events[-2]
    assert end.delta.stop_reason == plain.stop_reason and end.usage.output_tokens == plain.usage.output_tokens
    assert end.model_extra["timings"]["predicted_n"] == plain.usage.output_tokens
    greedy = {"temperature": 0}
    with client(server).messages.stream(model=MODEL, messages=HI, max_tokens=24, extra_body=greedy) as stream:
        final = stream.get_final_message()  # the SDK's own accumulation of the events
    assert final.content[0].text == plain.content[0].text and final.stop_reason == plain.stop_reason
    # On the wire: `event:` names that match the data's type, a ping early on.
    r = post(server, "/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 4, "stream": True})
    wire = sse_events(r.text)
    assert all(name == data["type"] for name, data in wire) and "ping" in [name for name, _ in wire]
    assert r.headers["content-type"].startswith("text/event-stream")


def test_streamed_stop_sequence(server: InProcess) -> None:
    text = create(server).content[0].text
    stop = text[6:9]
    events = list(create(server, stream=True, stop_sequences=[stop]))
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == text[: text.find(stop)]
    end = next(e for e in events if e.type == "message_delta")
    assert end.delta.stop_reason == "stop_sequence" and end.delta.stop_sequence == stop


def test_count_tokens_is_the_prompt_messages_renders(server: InProcess) -> None:
    system = "Be brief."
    m = create(server, system=system, max_tokens=2)
    counted = client(server).messages.count_tokens(model=MODEL, system=system, messages=HI)
    assert counted.input_tokens == m.usage.input_tokens


# -- errors in Anthropic's shape --------------------------------------------------------------------------


def test_errors_in_anthropic_shape(server: InProcess) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        create(server, model="claude-sonnet-4-5")
    assert nf.value.body["error"]["type"] == "not_found_error" and "`tiny`" in nf.value.body["error"]["message"]
    assert_error(post(server, "/v1/messages", {"model": MODEL, "messages": HI}), 400, "invalid_request_error",
                 "max_tokens", "Field required")  # fmt: skip
    bad_block = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text"}]}]}
    assert_error(post(server, "/v1/messages", bad_block), 400, "invalid_request_error", "messages[0].content[0].text")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as img:
        create(server, messages=[{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}])
    assert "image blocks are not supported" in img.value.body["error"]["message"]
    # A hint the served model cannot follow is accepted and said back (notes.py's rule): this one does not think.
    enabled = create(server, thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2)
    assert [b.type for b in enabled.content] == ["text"]
    assert any(w.startswith("thinking enabled: accepted, not acted on") for w in enabled.model_extra["warnings"])
    adaptive = create(server, thinking={"type": "adaptive"}, max_tokens=2)  # the model may (and does not) think
    assert adaptive.content and "warnings" not in adaptive.model_extra
    with pytest.raises(anthropic.BadRequestError) as mcp:
        create(server, extra_body={"temperature": 0, "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]})
    assert "mcp_servers" in mcp.value.body["error"]["message"]
    thought = [*HI, {"role": "assistant", "content": [{"type": "thinking", "thinking": "Hm.", "signature": "x"},
                                                       {"type": "text", "text": "Once."}]}, *HI]  # fmt: skip
    plain = [*HI, {"role": "assistant", "content": "Once."}, *HI]
    counts = [create(server, messages=turns, max_tokens=1).usage.input_tokens for turns in (thought, plain)]
    assert counts[0] == counts[1]  # an earlier turn's thinking is left out of the prompt
    prefill = [*HI, {"role": "assistant", "content": "Once upon"}]
    with pytest.raises(anthropic.BadRequestError) as pre:
        create(server, messages=prefill)
    assert "prefill" in pre.value.body["error"]["message"]
    assert_error(post(server, "/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 0}), 400,
                 "invalid_request_error", "max_tokens must be at least 1")  # fmt: skip
    assert_error(httpx.get(f"{server.url}/v1/messages", headers={"x-api-key": KEY}), 405, "invalid_request_error")
    assert_error(post(server, "/v1/messages/batches", {}), 404, "not_found_error")
    huge = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x" * 70_000}]}
    assert_error(post(server, "/v1/messages", huge), 413, "request_too_large", "--max-body-bytes")
    assert create(server, max_tokens=2).content  # still serving


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"temperature": "0.5"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_k": 2.5}, "top_k"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"speculative": {"k": "2"}}, "speculative.k"),
    ],
)
def test_request_types_are_strict(server: InProcess, fields: dict[str, Any], where: str) -> None:
    """A boolean is no number and a string no boolean or number, as on the OpenAI routes: a 400 naming the field."""
    body = {"model": MODEL, "messages": HI, "max_tokens": 4, **fields}
    assert_error(post(server, "/v1/messages", body), 400, "invalid_request_error", f"{where}:")


def test_a_head_method_with_an_ordinary_draft_is_a_400(server: InProcess) -> None:
    """speculative.method eagle3 on a server whose draft is an ordinary model: a 400 saying why, streamed or not
    (checked before the stream begins), never a 500 that the SDK would retry."""
    for stream in (False, True):
        body = {"model": MODEL, "messages": HI, "max_tokens": 4, "stream": stream, "speculative": {"method": "eagle3"}}
        assert_error(post(server, "/v1/messages", body), 400, "invalid_request_error", "speculative.method eagle3",
                     "not an EAGLE-3 head")  # fmt: skip
    with pytest.raises(anthropic.BadRequestError):
        create(server, extra_body={"temperature": 0, "speculative": {"method": "eagle3"}})


def test_api_key_as_x_api_key_or_bearer(server: InProcess) -> None:
    with pytest.raises(anthropic.AuthenticationError) as e:
        client(server, api_key="wrong").messages.create(model=MODEL, messages=HI, max_tokens=2)
    assert e.value.body["error"]["type"] == "authentication_error" and "x-api-key" in e.value.body["error"]["message"]
    assert_error(httpx.post(f"{server.url}/v1/messages/count_tokens", json={"model": MODEL, "messages": HI}), 401,
                 "authentication_error")  # fmt: skip
    assert client(server).messages.create(model=MODEL, messages=HI, max_tokens=2).content  # x-api-key
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=KEY, api_key=None, max_retries=0)
    assert bearer.messages.create(model=MODEL, messages=HI, max_tokens=2).content  # Authorization: Bearer
    versioned = post(server, "/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 2},
                     **{"anthropic-version": "2023-06-01", "anthropic-beta": "some-beta-2025"})  # fmt: skip
    assert versioned.status_code == 200 and versioned.json()["type"] == "message"


# -- errors the engine finds, a full queue ----------------------------------------------------------------


def _unbuildable() -> DrafterFamily:
    def build(ctx: BuildContext) -> Drafter:
        raise ModelFileError("unbuildable.gguf is truncated", "download it again")

    return DrafterFamily(name="unbuildable", summary="fails when built (a test family)", build=build)


def test_an_error_mid_stream_is_an_error_event(server: InProcess) -> None:
    fam = _unbuildable()
    registry.register(fam)
    try:
        body = {"model": MODEL, "messages": HI, "max_tokens": 4, "stream": True, "speculative": {"method": fam.name}}
        wire = sse_events(post(server, "/v1/messages", body).text)
        assert wire[0][0] == "message_start" and wire[-1][0] == "error"
        error = wire[-1][1]
        assert error["error"]["type"] == "invalid_request_error" and "truncated" in error["error"]["message"]
        with pytest.raises(anthropic.APIStatusError) as e:  # the SDK raises it
            list(create(server, stream=True, extra_body={"speculative": {"method": fam.name}}))
        assert "truncated" in str(e.value)
        with pytest.raises(anthropic.BadRequestError):  # not streamed: a plain 400
            create(server, extra_body={"speculative": {"method": fam.name}})
        assert create(server, max_tokens=2, extra_body={"speculative": {"method": "ngram"}}).content
    finally:
        registry.unregister(fam.name)


def test_a_full_queue_is_overloaded(tiny_ggufs: TinyGGUFs) -> None:
    with served("--target", str(tiny_ggufs[0]), "--draft-method", "none", "--n-ctx", "256", "--threads", "1",
                "--max-queue", "0") as s:  # fmt: skip
        gate = ForwardGate(s.pipeline.target, hold_call=2)
        first = threading.Thread(target=s.post, args=("/v1/messages", {"model": s.name, "messages": HI,
                                                                        "max_tokens": 4}))  # fmt: skip
        first.start()
        try:
            assert gate.entered.wait(30), "the first request never reached the held forward"
            r = post(s, "/v1/messages", {"model": s.name, "messages": HI, "max_tokens": 4})
            assert_error(r, 503, "overloaded_error", "busy")
            assert int(r.headers["retry-after"]) >= 1
        finally:
            gate.open()
            first.join(30)


# -- tools ------------------------------------------------------------------------------------------------

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                            "required": ["city"]}}  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ONE_CALL = {"type": "any", "disable_parallel_tool_use": True}


def test_a_forced_call_is_a_tool_use_block_plain_and_streamed(server: InProcess) -> None:
    """tool_choice any (one call) or a named tool make the answer a call, held to the input schema by the
    grammar: a tool_use block, stop_reason tool_use; streamed as a tool_use block with input_json_delta pieces."""
    for choice in (ONE_CALL, {"type": "tool", "name": "get_weather"}):
        m = create(server, messages=ASK, tools=[WEATHER], tool_choice=choice, max_tokens=60)
        assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"], m
        block = m.content[0]
        assert block.id.startswith("toolu_") and block.name == "get_weather"
        assert block.input["city"] in ("Paris", "Rome")
    events = list(create(server, messages=ASK, tools=[WEATHER], tool_choice=ONE_CALL, max_tokens=60, stream=True))
    kinds = [e.type for e in events]
    n = kinds.count("content_block_delta")
    assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * n, "content_block_stop",
                     "message_delta", "message_stop"]  # fmt: skip
    start = events[1].content_block
    assert start.type == "tool_use" and start.name == "get_weather" and start.input == {}
    assert start.id.startswith("toolu_")
    assert all(e.delta.type == "input_json_delta" for e in events[2 : 2 + n])
    assert json.loads("".join(e.delta.partial_json for e in events[2 : 2 + n])) == block.input
    assert events[-2].delta.stop_reason == "tool_use"
    with client(server).messages.stream(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=ONE_CALL,
                                        max_tokens=60, extra_body={"temperature": 0}) as stream:  # fmt: skip
        final = stream.get_final_message()  # the SDK's own accumulation of the pieces
    assert [(b.type, b.name, b.input) for b in final.content] == [("tool_use", "get_weather", block.input)]


def test_a_tool_result_round_trip_renders_as_the_chat_route_does(server: InProcess) -> None:
    """The call comes back as the assistant's tool_use, its result as a tool_result: the prompt is the one
    /v1/chat/completions renders for the same turns (tool_calls, a `tool` message), and count_tokens agrees."""
    call = create(server, messages=ASK, tools=[WEATHER], tool_choice=ONE_CALL, max_tokens=60).content[0]
    use = {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}
    turns = [*ASK, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    m = create(server, messages=turns, tools=[WEATHER], max_tokens=8)
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use") and m.content
    openai_turns = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]  # fmt: skip
    tools = [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                               "parameters": WEATHER["input_schema"]}}]  # fmt: skip
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "messages": openai_turns, "tools": tools,
                                                 "max_tokens": 8, "temperature": 0}).json()  # fmt: skip
    assert m.usage.input_tokens == chat["usage"]["prompt_tokens"], chat
    counted = client(server).messages.count_tokens(model=MODEL, messages=turns, tools=[WEATHER])
    assert counted.input_tokens == m.usage.input_tokens
    without = client(server).messages.count_tokens(model=MODEL, messages=ASK).input_tokens
    assert client(server).messages.count_tokens(model=MODEL, messages=ASK, tools=[WEATHER]).input_tokens > without


def test_the_request_maps_onto_the_chat_body() -> None:
    """Anthropic's tool_use / tool_result / tool_choice as OpenAI's tool_calls, `tool` messages and
    tool_choice (the chat path takes it from there)."""
    from localspec.server.anthropic import chat_body
    from localspec.server.anthropic_schemas import MessagesRequest

    body = MessagesRequest.model_validate({
        "model": MODEL, "max_tokens": 5, "system": [{"type": "text", "text": "S"}], "tools": [WEATHER],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "stop_sequences": ["\n\n"],
        "messages": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                          "content": [{"type": "text", "text": "timeout"}]},
                                         {"type": "text", "text": "Try again?"}]},
        ]})  # fmt: skip
    chat = chat_body(body).model_dump(exclude_none=True)
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False and chat["stop"] == ["\n\n"]
    function = {"name": "get_weather", "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}
    assert chat["tools"] == [{"type": "function", "function": function}]
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assistant, tool = chat["messages"][2], chat["messages"][3]
    call = {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert assistant["tool_calls"] == [{"id": "toolu_1", "type": "function", "function": call}]
    assert tool == {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: timeout"}
    named = MessagesRequest.model_validate({"model": MODEL, "max_tokens": 5, "messages": ASK, "tools": [WEATHER],
                                            "tool_choice": {"type": "tool", "name": "get_weather"}})  # fmt: skip
    assert chat_body(named).model_dump()["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_tool_errors_in_anthropic_shape(server: InProcess) -> None:
    def refused(**kw: Any) -> str:
        with pytest.raises(anthropic.BadRequestError) as e:
            create(server, **kw)
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
        return str(e.value.body["error"]["message"])

    assert "Anthropic's own tools" in refused(tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert "input_schema" in refused(tools=[{"name": "f"}])
    assert "get_time" in refused(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_time"})
    assert "needs the name" in refused(tools=[WEATHER], tool_choice={"type": "tool"})
    user_call = [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}]
    assert "belong in assistant messages" in refused(messages=user_call)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    use = {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [image]}
    turns = [*ASK, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    assert "image blocks are not supported" in refused(messages=turns, tools=[WEATHER])


def test_structured_output_follows_the_schema(server: InProcess) -> None:
    """output_config.format (and the beta's output_format) hold the answer to the JSON schema: the random
    tiny model's answer parses and validates, and ends there."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                               "score": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["answer", "score"], "additionalProperties": False}  # fmt: skip
    compact = {**schema, "x-guidance": {"whitespace_flexible": False}}  # (random weights would pad with blanks)
    fmt = {"type": "json_schema", "schema": compact}
    for extra in ({"output_config": {"format": fmt}}, {"output_format": fmt}):
        m = create(server, max_tokens=60, extra_body={"temperature": 0, **extra})
        assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["text"], m
        jsonschema.validate(json.loads(m.content[0].text), schema)
    bad = {"model": MODEL, "messages": HI, "max_tokens": 4, "output_config": {"format": {"type": "xml"}}}
    assert_error(post(server, "/v1/messages", bad), 400, "invalid_request_error", "output_config.format.type")


def test_an_agent_shaped_request_streams(server: InProcess) -> None:
    """What a coding agent sends: the beta query flag and headers, system blocks with cache_control,
    metadata, tools whose schemas carry `$schema`, temperature 1, adaptive thinking, fields this server
    has no use for (context_management): an answer streams."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "required": ["command"],
              "properties": {"command": {"type": "string"}}, "additionalProperties": False}  # fmt: skip
    body = {
        "model": MODEL, "max_tokens": 16, "stream": True, "temperature": 1, "metadata": {"user_id": "user_abc"},
        "system": [{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "List the files.",
                                                   "cache_control": {"type": "ephemeral"}}]}],
        "tools": [{"name": "Bash", "description": "Run a command", "input_schema": schema}],
        "thinking": {"type": "adaptive"}, "context_management": {"edits": []},
    }  # fmt: skip
    r = httpx.post(f"{server.url}/v1/messages?beta=true", json=body, timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01",
                            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"})  # fmt: skip
    assert r.status_code == 200, r.text
    names = [name for name, _ in sse_events(r.text)]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names


def test_the_stop_matcher_says_which_stop_string_ended_the_text() -> None:
    from localspec.server.stops import StopMatcher

    m = StopMatcher(["END", "xy", "E"])
    assert [m.feed(p) for p in ("abc x", "yEND")] == ["abc ", ""]
    assert m.hit and m.matched == "xy"  # the first to appear in the text, not the first in the list
    assert StopMatcher(["END"]).matched is None
