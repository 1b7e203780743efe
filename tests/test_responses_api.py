"""OpenAI's Responses API on `localspec serve` (POST /v1/responses): the real `openai` client against the app in
this process on a real uvicorn server, real llama.cpp on the tiny GGUFs (random weights: the grammar makes their
calls and JSON), and Qwen2.5-Coder 0.5B with a thinking template for reasoning. Every body and stream event is
also validated against the openai package's own pydantic models (the client builds its objects without
validating them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from pydantic import TypeAdapter
from serve_process import httpx
from test_reasoning import ANSWER, QUESTION, THINKING_TEMPLATE, THOUGHT
from test_serve_inprocess import InProcess, TinyGGUFs, served

from localspec.decoding.drafters import Drafter
from localspec.errors import ModelFileError
from localspec.families import registry
from localspec.families.base import BuildContext, DrafterFamily

Response = openai.types.responses.Response
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(openai.types.responses.ResponseStreamEvent)
PATH = "/v1/responses"
MODEL = "tiny"
SWITCH = {
    "type": "function",
    "name": "switch",
    "description": "Switch a light on or off.",
    "parameters": {
        "type": "object",
        "properties": {"room": {"type": "string", "maxLength": 12}, "on": {"type": "boolean"}},
        "required": ["room", "on"],
        "additionalProperties": False,
    },
    "strict": True,
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                                        "maximum": 150}},
    "required": ["name", "age"],
    "additionalProperties": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_ggufs: TinyGGUFs) -> Iterator[InProcess]:
    with served("--target", str(tiny_ggufs[0]), "--draft-method", "ngram", "--n-ctx", "1024", "--threads", "1",
                "--model-name", MODEL) as s:  # fmt: skip
        yield s


def client(s: InProcess) -> Any:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)


def create(s: InProcess, **kw: Any) -> tuple[Any, dict[str, Any]]:
    """responses.create, greedy: the client's object, and the raw body validated against openai's Response."""
    kw.setdefault("model", MODEL)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 16)
    raw = client(s).responses.with_raw_response.create(**kw)
    body = raw.http_response.json()
    Response.model_validate(body)
    return raw.parse(), body


def stream_events(s: InProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream's events as sent (SSE), each validated against openai's ResponseStreamEvent."""
    r = httpx.post(f"{s.url}{PATH}", json={"model": MODEL, "temperature": 0, **body, "stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    events = []
    for raw in r.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in raw.splitlines())
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        STREAM_EVENT.validate_python(data)
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def check_item_order(events: list[dict[str, Any]]) -> None:
    """Each item is added, then its pieces come, then it is done, before the next item is added."""
    open_index = None
    for e in events:
        if e["type"] == "response.output_item.added":
            assert open_index is None, "an item was added while another was still open"
            open_index = e["output_index"]
        elif e["type"] == "response.output_item.done":
            assert e["output_index"] == open_index
            open_index = None
        elif "output_index" in e:
            assert e["output_index"] == open_index, e
    assert open_index is None


def assert_error(r: httpx.Response, param: str | None, *words: str, status: int = 400) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error"), err
    assert all(w in err["message"] for w in words), err
    return err


# -- answers ----------------------------------------------------------------------------------------------


def test_a_plain_response(server: InProcess) -> None:
    r, body = create(server, input="Tell me about the sea.", metadata={"run": "1"}, user="u1")
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL and r.created_at > 0
    assert r.status in ("completed", "incomplete") and r.error is None
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [c.type for c in message.content] == ["output_text"] and r.output_text == message.content[0].text
    assert 1 <= r.usage.output_tokens <= 16 and r.usage.input_tokens > 5
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.metadata == {"run": "1"} and r.user == "u1" and r.store is True and r.temperature == 0
    timings = body["timings"]  # localspec's speculative statistics, as on the other routes
    assert timings["draft_method"] == "ngram" and timings["predicted_n"] == r.usage.output_tokens


def test_max_output_tokens_makes_an_incomplete_response(server: InProcess) -> None:
    r, _ = create(server, input="Tell me a long story about the sea.", max_output_tokens=3)
    assert r.usage.output_tokens == 3 and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens" and r.output[0].status == "incomplete"


def test_streamed_events_come_in_order_and_join_to_the_answer(server: InProcess) -> None:
    events = stream_events(server, {"input": "Tell me about the sea.", "max_output_tokens": 16})
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    check_item_order(events)
    final = events[-1]["response"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text and final["output"][0]["content"][0]["text"] == text
    assert next(e for e in events if e["type"] == "response.output_text.done")["text"] == text
    assert events[0]["response"]["id"] == final["id"] and events[0]["response"]["status"] == "in_progress"
    assert final["usage"]["output_tokens"] >= 1 and final["timings"]["draft_method"] == "ngram"
    assert client(server).responses.retrieve(final["id"]).output_text == text  # a streamed response is stored too
    # the same answer as the client streams it
    streamed = list(client(server).responses.create(model=MODEL, input="Tell me about the sea.", temperature=0,
                                                    max_output_tokens=16, stream=True))  # fmt: skip
    assert streamed[-1].response.output_text == text


def test_a_required_function_call_whole_and_streamed(server: InProcess) -> None:
    """The grammar alone makes the call: the tiny model is random weights."""
    kw = {"input": "Turn the hall light on.", "tools": [SWITCH], "tool_choice": "required", "max_output_tokens": 60,
          "parallel_tool_calls": False}  # fmt: skip
    r, _ = create(server, **kw)
    assert r.status == "completed" and r.parallel_tool_calls is False
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "switch" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), SWITCH["parameters"])
    assert r.tool_choice == "required" and r.tools[0].name == "switch"
    events = stream_events(server, kw)
    check_item_order(events)
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    jsonschema.validate(json.loads(args), SWITCH["parameters"])
    at = next(i for i, e in enumerate(events) if e["type"] == "response.function_call_arguments.done")
    assert events[at]["arguments"] == args and events[at + 1]["type"] == "response.output_item.done"  # at its end
    assert events[at + 1]["item"]["arguments"] == args and events[at + 1]["item"]["status"] == "completed"


def test_a_named_function_and_a_function_call_output_follow_up(server: InProcess) -> None:
    prompts = record_prompts(server)
    first, _ = create(server, input="Turn the hall light on.", tools=[SWITCH], max_output_tokens=60,
                      tool_choice={"type": "function", "name": "switch"})  # fmt: skip
    call = next(item for item in first.output if item.type == "function_call")
    output = "The hall light is on (id 4711)."
    follow = [{"role": "user", "content": "Turn the hall light on."},
              {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": output}]  # fmt: skip
    r, _ = create(server, input=follow, tools=[SWITCH], max_output_tokens=8)
    assert r.status in ("completed", "incomplete") and r.usage.input_tokens > first.usage.input_tokens
    assert output in prompts[-1]  # the tool's output, as the template renders it


TAGS = {
    "type": "function",
    "name": "tag",
    "description": "Tag the light.",
    "parameters": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                                             "maxItems": 2, "uniqueItems": True}},
                   "required": ["tags"], "additionalProperties": False},
    "strict": False,
}  # fmt: skip


def test_a_keyword_the_grammar_leaves_out_is_checked_and_said_in_warnings(server: InProcess) -> None:
    """uniqueItems is beyond the grammar: the call is made under the rest of the schema and checked after
    generation, and the response (whole, and the stream's final one) says so in `warnings`; strict is a 400."""
    kw = {"input": "Tag the light.", "tools": [TAGS], "tool_choice": "required", "max_output_tokens": 60,
          "parallel_tool_calls": False}  # fmt: skip
    r, body = create(server, **kw)
    (call,) = [item for item in r.output if item.type == "function_call"]
    (warning,) = body["warnings"]
    assert warning.startswith("call 1 (tag): the grammar does not enforce the schema's uniqueItems; the arguments "
                              "were checked after generation: ")  # fmt: skip
    unique = len(set(tags := json.loads(call.arguments)["tags"])) == len(tags)
    assert warning.endswith(": valid") == unique, (warning, tags)
    final = stream_events(server, kw)[-1]["response"]
    assert final["warnings"][0].startswith("call 1 (tag): the grammar does not enforce the schema's uniqueItems")
    strict = httpx.post(f"{server.url}{PATH}", json={"model": MODEL, **kw, "tools": [{**TAGS, "strict": True}]})
    assert_error(strict, "tools[0].function.parameters", "strict", "uniqueItems")


def test_a_function_in_a_namespace_is_called_by_its_name_and_namespace(server: InProcess) -> None:
    """Codex CLI groups tools in namespaces: the model is offered lights__switch, the client gets switch in lights."""
    prompts = record_prompts(server)
    lights = {"type": "namespace", "name": "lights", "description": "The house's lights.", "tools": [SWITCH]}
    kw = {"input": "Turn the hall light on.", "tools": [lights], "tool_choice": "required", "max_output_tokens": 60,
          "parallel_tool_calls": False}  # fmt: skip
    r, body = create(server, **kw)
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert (call.name, call.namespace) == ("switch", "lights") and r.tools[0].type == "namespace"
    jsonschema.validate(json.loads(call.arguments), SWITCH["parameters"])
    assert "lights__switch" in prompts[-1]
    events = stream_events(server, kw)
    check_item_order(events)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["name"], i["namespace"]) for i in done if i["type"] == "function_call"] == [("switch", "lights")]
    follow = [{"role": "user", "content": "Turn the hall light on."},
              {"type": "function_call", "call_id": "call_1", "name": "switch", "namespace": "lights",
               "arguments": '{"room": "hall", "on": true}'},
              {"type": "function_call_output", "call_id": "call_1", "output": "done (id 4711)"}]  # fmt: skip
    again, _ = create(server, input=follow, tools=[lights], max_output_tokens=4)
    assert again.status in ("completed", "incomplete") and "lights__switch" in prompts[-1] and "4711" in prompts[-1]


def test_a_custom_tool_is_called_with_its_text_as_input(server: InProcess) -> None:
    """A custom (freeform) tool is offered as a function of one string, `input`; its call comes back as a
    custom_tool_call whose input is that string, and a custom_tool_call_output answers it."""
    prompts = record_prompts(server)
    shell = {"type": "custom", "name": "shell", "description": "Run a shell command line."}
    kw = {"input": "List the files.", "tools": [shell], "tool_choice": {"type": "custom", "name": "shell"},
          "max_output_tokens": 40,
          "parallel_tool_calls": False}  # fmt: skip
    r, body = create(server, **kw)
    (call,) = [item for item in r.output if item.type == "custom_tool_call"]
    assert call.name == "shell" and call.call_id.startswith("call_") and isinstance(call.input, str)
    assert body["tools"] == [{**shell, "format": {"type": "text"}}] and "`input`" in prompts[-1]
    events = stream_events(server, kw)
    check_item_order(events)
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert item["type"] == "custom_tool_call" and item["input"] == done["input"]
    follow = [{"role": "user", "content": "List the files."},
              {"type": "custom_tool_call", "call_id": "call_2", "name": "shell", "input": "ls -1"},
              {"type": "custom_tool_call_output", "call_id": "call_2", "output": "a.txt b.txt (4712)"}]  # fmt: skip
    again, _ = create(server, input=follow, tools=[shell], max_output_tokens=4)
    assert again.status in ("completed", "incomplete")
    assert '"input": "ls -1"' in prompts[-1] and "4712" in prompts[-1]


def test_local_shell_is_called_with_the_command_as_its_action(server: InProcess) -> None:
    """The local_shell tool is offered as a function taking the command as an array of strings; its call comes back
    as a local_shell_call whose action holds that command, and a local_shell_call_output answers it."""
    prompts = record_prompts(server)
    kw = {"input": "List the files.", "tools": [{"type": "local_shell"}], "tool_choice": "required",
          "parallel_tool_calls": False, "max_output_tokens": 60}  # fmt: skip
    r, body = create(server, **kw)
    (call,) = [item for item in r.output if item.type == "local_shell_call"]
    assert call.call_id.startswith("call_") and call.action.type == "exec"
    assert body["tools"] == [{"type": "local_shell"}]
    if call.status == "completed":
        assert call.action.command and all(isinstance(part, str) for part in call.action.command)
    else:  # the random weights' strings run on: cut short, the call has no command
        assert call.action.command == []
    assert "local_shell" in prompts[-1]
    events = stream_events(server, kw)
    check_item_order(events)
    item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert item["type"] == "local_shell_call" and item["action"]["type"] == "exec"
    follow = [{"role": "user", "content": "List the files."},
              {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_3", "status": "completed",
               "action": {"type": "exec", "command": ["ls", "-1"], "env": {}}},
              {"type": "local_shell_call_output", "id": "call_3", "output": "a.txt b.txt (4713)"}]  # fmt: skip
    again, _ = create(server, input=follow, tools=[{"type": "local_shell"}], max_output_tokens=4)
    assert again.status in ("completed", "incomplete")
    assert '"command": ["ls", "-1"]' in prompts[-1] and "4713" in prompts[-1]


def test_a_local_shell_action_is_what_the_model_wrote() -> None:
    from localspec.server.responses_api import shell_action

    whole = shell_action('{"command": ["ls", "-1"], "working_directory": "/tmp", "timeout_ms": 5000}')
    assert whole["command"] == ["ls", "-1"] and whole["working_directory"] == "/tmp" and whole["timeout_ms"] == 5000
    assert whole["type"] == "exec" and whole["env"] == {}
    assert shell_action('{"command": ["ls", "-') == {"type": "exec", "command": [], "env": {}}


def test_text_format_json_schema_validates(server: InProcess) -> None:
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    r, body = create(server, input="A person, as JSON.", text=fmt, max_output_tokens=80)
    assert r.status == "completed", r.output_text
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert body["text"]["format"]["name"] == "person" and body["timings"]["grammar_ms"] > 0
    loose, _ = create(server, input="Anything, as JSON.", text={"format": {"type": "json_object"}},
                      max_output_tokens=80)  # fmt: skip
    assert loose.status == "completed" and isinstance(json.loads(loose.output_text), dict)


def test_previous_response_id_continues_the_stored_conversation(server: InProcess) -> None:
    prompts = record_prompts(server)
    first, _ = create(server, input="My name is Zed.", instructions="Be brief.")
    follow, _ = create(server, input="What is my name?", previous_response_id=first.id)
    assert follow.previous_response_id == first.id
    whole = [{"role": "user", "content": "My name is Zed."},
             {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
             {"role": "user", "content": "What is my name?"}]  # fmt: skip
    again, _ = create(server, input=whole)
    # The follow-up read the first turn and its answer (its instructions are not carried over, as on OpenAI).
    assert follow.usage.input_tokens == again.usage.input_tokens > first.usage.input_tokens
    assert prompts[-2] == prompts[-1] and "My name is Zed." in prompts[-2] and "Be brief." not in prompts[-2]
    assert client(server).responses.retrieve(first.id).output_text == first.output_text
    unstored, _ = create(server, input="Forget this.", store=False)
    r = httpx.post(f"{server.url}{PATH}", json={"input": "Hi", "previous_response_id": unstored.id}, timeout=60)
    assert_error(r, "previous_response_id", "no stored response")


def record_prompts(s: InProcess) -> list[str]:
    """The text of each prompt the engine reads from now on (the pipeline's generate, spied on)."""
    prompts: list[str] = []
    generate = s.pipeline.generate

    def spy(prompt: list[int], *args: Any, **kw: Any) -> Any:
        detok = s.pipeline.target.detokenizer()
        prompts.append(detok.add(prompt) + detok.flush())
        return generate(prompt, *args, **kw)

    s.pipeline.generate = spy  # type: ignore[method-assign]
    return prompts


# -- refusals: 400s in OpenAI's shape, never a 500 -----------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"previous_response_id": "resp_nothere"}, "previous_response_id", "no stored response"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "cannot search the web"),
        ({"tools": [{"type": "file_search"}]}, "tools[0].type", "built-in tools"),
        ({"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]}, "tools[0].tools[0].type",
         "inside a namespace"),
        ({"tools": [{"type": "custom", "name": "patch", "format": {"type": "grammar", "syntax": "lark",
                                                                   "definition": "start: /.+/"}}]},
         "tools[0].format", "free text"),
        ({"tools": [SWITCH], "tool_choice": {"type": "file_search"}}, "tool_choice.type", "function and custom tools only"),
        ({"tools": [SWITCH], "tool_choice": "sometimes"}, "tool_choice", "Input should be"),
        ({"tool_choice": "required"}, "tool_choice", "requires tools"),
        ({"include": ["file_search_call.results"]}, "include", "built-in tools"),
        ({"include": ["message.output_text.logprobs"]}, "include", "logprobs"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type", "unknown"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "needs its schema"),
        ({"text": {"verbosity": "low"}}, "text.verbosity", "verbose"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "does not think"),
        ({"reasoning": {"effort": "enormous"}}, "reasoning.effort", "unknown"),
        ({"background": True}, "background", "background"),
        ({"truncation": "auto"}, "truncation", "nothing is dropped"),
        ({"conversation": "conv_1"}, "conversation", "previous_response_id"),
        ({"max_output_tokens": 0}, "max_output_tokens", "at least 1"),
        ({"max_output_tokens": "10"}, "max_output_tokens", "valid integer"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0].type", "text only"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type", "not supported"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "not supported"),
        ({"input": [{"type": "function_call", "call_id": "c1", "name": "switch", "arguments": "on"}]},
         "input[0].arguments", "JSON object"),
        ({"input": []}, "input", "give the conversation"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content", "valid string"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_a_400(server: InProcess, fields: dict[str, Any], param: str, words: str) -> None:
    for stream in (False, True):
        body = {"model": MODEL, "input": "Hi", "max_output_tokens": 4, **fields, "stream": stream}
        assert_error(httpx.post(f"{server.url}{PATH}", json=body, timeout=60), param, *words.split(" | "))


def test_bad_bodies_and_unknown_ids(server: InProcess) -> None:
    bad_json = httpx.post(f"{server.url}{PATH}", content=b'{"input": ', headers={"content-type": "application/json"})
    assert assert_error(bad_json, None, "not valid JSON")["code"] == "invalid_json"
    other = httpx.post(f"{server.url}{PATH}", json={"model": "gpt-5", "input": "Hi"}, timeout=60)
    assert assert_error(other, "model", "does not exist", status=404)["code"] == "model_not_found"
    assert_error(httpx.get(f"{server.url}{PATH}/resp_nothere", timeout=10), "response_id", "no stored", status=404)
    with pytest.raises(openai.BadRequestError):
        client(server).responses.create(model=MODEL, input="Hi", previous_response_id="resp_nothere")


def test_a_failure_while_generating_is_an_error_and_response_failed(tiny_ggufs: TinyGGUFs) -> None:
    """A drafter that fails only when built: found out after the stream began, so the stream says it."""

    def build(ctx: BuildContext) -> Drafter:
        raise ModelFileError("unbuildable.gguf is truncated", "download it again")

    fam = DrafterFamily(name="unbuildable", summary="fails when built (a test family)", build=build)
    registry.register(fam)
    try:
        with served("--target", str(tiny_ggufs[0]), "--draft-method", "none", "--n-ctx", "256", "--threads",
                    "1", "--model-name", MODEL) as s:  # fmt: skip
            body = {"input": "Hi", "max_output_tokens": 4, "speculative": {"method": fam.name}}
            kinds = [e["type"] for e in stream_events(s, body)]
            assert kinds == ["response.created", "response.in_progress", "error", "response.failed"]
            failed = stream_events(s, body)[-1]["response"]
            assert failed["status"] == "failed" and "truncated" in failed["error"]["message"]
            r = httpx.post(f"{s.url}{PATH}", json={"model": MODEL, **body}, timeout=60)
            assert_error(r, "speculative.method", "truncated")
    finally:
        registry.unregister(fam.name)


# -- reasoning, from a model that thinks ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def thinking_server(qwen_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    with served("--target", str(qwen_pair[1]), "--draft-method", "ngram", "--n-ctx", "2048", "--threads", "2",
                "--chat-template", str(template), "--model-name", MODEL) as s:  # fmt: skip
        yield s


def test_reasoning_comes_back_as_a_reasoning_item_whole_and_streamed(thinking_server: InProcess) -> None:
    """The earlier turn's thinking goes in as a reasoning item; asked again, the model (greedy) repeats it."""
    conversation = [
        {"role": "system", "content": "You think inside <think> tags, then answer."},
        {"role": "user", "content": QUESTION},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": THOUGHT}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": ANSWER}]},
        {"role": "user", "content": QUESTION},
    ]
    kw = {"input": conversation, "max_output_tokens": 60, "reasoning": {"summary": "auto"},
          "include": ["reasoning.encrypted_content"]}  # fmt: skip
    r, _ = create(thinking_server, **kw)
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    summary = reasoning.summary[0].text
    assert "37" in summary and "think>" not in summary and reasoning.encrypted_content == summary
    assert "42" in r.output_text and "think>" not in r.output_text and r.status == "completed"
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = stream_events(thinking_server, kw)
    check_item_order(events)
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert thought == summary and text == r.output_text
    done = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["reasoning", "message"]
    # An effort is a hint nothing here acts on: accepted where the model thinks, and said (the rule, notes.py).
    _, body = create(thinking_server, **{**kw, "reasoning": {"effort": "high", "summary": "auto"}})
    assert body["warnings"] == ["reasoning.effort 'high': accepted, not acted on (localspec serve has no effort "
                                "setting; a model that thinks thinks as its chat template makes it)"]  # fmt: skip
    assert "warnings" not in create(thinking_server, **kw)[1]
