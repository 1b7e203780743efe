"""Tool calls through `localspec serve`: the call formats read from answers (whole and streamed in random
pieces), the formats found from chat templates, the grammar that forces a call, and the OpenAI chat
endpoint with tools, driven by the real `openai` client (tiny GGUFs for the fast tests, the Qwen2.5-Coder
0.5B fixture, whose template renders tools, for real calls)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
uvicorn = pytest.importorskip("uvicorn")

from serve_process import httpx
from test_serve_inprocess import InProcess, served

from localspec.server.tools import (
    HERMES,
    LLAMA3,
    MISTRAL,
    ArgumentsDelta,
    CallEnd,
    CallStart,
    ContentDelta,
    ToolEvent,
    ToolFormat,
    ToolStreamParser,
    format_of_template,
    parse_answer,
)

CHAT = "/v1/chat/completions"

# -- reading calls out of answers -----------------------------------------------------------------------

Case = tuple[ToolFormat, str, str, list[tuple[str, Any]]]  # format, answer, content, [(name, arguments)]
CASES: dict[str, Case] = {
    "hermes-one": (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "",
                   [("get_weather", {"city": "Paris"})]),
    "hermes-text-then-two": (
        HERMES,
        'Let me look both up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris", "q": "a \\"}\\" b"}}\n'
        "</tool_call>\n",
        "Let me look both up.",
        [("get_weather", {"city": "Paris", "days": [1, 2]}), ("get_time", {"tz": "Europe/Paris", "q": 'a "}" b'})],
    ),
    "hermes-bare-json": (HERMES, '{"name": "get_weather", "arguments": {"city": "Oslo"}}', "",
                         [("get_weather", {"city": "Oslo"})]),
    "hermes-fenced": (HERMES, '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Oslo"\n  }\n}\n```',
                      "", [("get_weather", {"city": "Oslo"})]),
    "hermes-arguments-as-string": (HERMES, '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>', "",
                                   [("f", {"a": 1})]),
    "hermes-arguments-before-name": (HERMES, '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>', "",
                                     [("f", {"a": 1})]),
    "hermes-no-call": (HERMES, "Plain answer with <b>tags</b> and {braces}.\n", "Plain answer with <b>tags</b> and "
                       "{braces}.\n", []),
    "hermes-marker-without-call": (HERMES, "Use <tool_call> tags, like so.", "Use <tool_call> tags, like so.", []),
    "hermes-mid-text-json-is-content": (HERMES, 'As JSON: {"name": "x", "arguments": {}}',
                                        'As JSON: {"name": "x", "arguments": {}}', []),
    "llama3-one": (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Rome"}}', "",
                   [("get_weather", {"city": "Rome"})]),
    "llama3-python-tag-two": (LLAMA3, '<|python_tag|>{"type": "function", "name": "a", "parameters": {}}; '
                              '{"name": "b", "parameters": {"x": 1.5}}', "", [("a", {}), ("b", {"x": 1.5})]),
    "llama3-text": (LLAMA3, "The capital is Rome.", "The capital is Rome.", []),
    "mistral-marker": (MISTRAL, 'Checking. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lima"}, '
                       '"id": "a1b2c3d4e"}]', "Checking.", [("get_weather", {"city": "Lima"})]),
    "mistral-two-without-marker": (MISTRAL, '[{"name": "a", "arguments": {"k": [1, {"z": "]"}]}}, '
                                   '{"name": "b", "arguments": {}}]', "", [("a", {"k": [1, {"z": "]"}]}), ("b", {})]),
    "mistral-text": (MISTRAL, "[1, 2] is a list.", "[1, 2] is a list.", []),
}  # fmt: skip


def _calls(calls: list[Any]) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_parse_answer_reads_content_and_calls(case: Case) -> None:
    fmt, text, content, calls = case
    got_content, got_calls = parse_answer(text, fmt)
    assert got_content == content
    assert _calls(got_calls) == calls
    assert all(c.id.startswith("call_") and len(c.id) > 10 for c in got_calls)
    assert len({c.id for c in got_calls}) == len(got_calls)


def _stream(
    fmt: ToolFormat, pieces: list[str], max_calls: int | None = None
) -> tuple[list[ToolEvent], ToolStreamParser]:
    parser = ToolStreamParser(fmt, max_calls)
    events = [e for p in pieces for e in parser.feed(p)]
    return events + parser.finish(), parser


def _assemble(events: list[ToolEvent]) -> tuple[str, list[tuple[str, str]]]:
    """What a client puts together from the streamed events; checks their order on the way."""
    content, calls = "", []
    for e in events:
        if isinstance(e, ContentDelta):
            assert e.text
            content += e.text
        elif isinstance(e, CallStart):
            assert e.index == len(calls)  # calls come one after another, name first
            calls.append([e.name, ""])
        elif isinstance(e, CallEnd):  # after the call's last arguments, with the call as read whole
            assert e.index == len(calls) - 1 and (e.call.name, e.call.arguments) == tuple(calls[-1])
        else:
            assert isinstance(e, ArgumentsDelta) and e.text and e.index == len(calls) - 1
            calls[-1][1] += e.text
    return content, [(n, a) for n, a in calls]


def _random_pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_streamed_in_random_pieces_equals_whole(case: Case) -> None:
    fmt, text, _, _ = case
    content, calls = parse_answer(text, fmt)
    whole = (content, [(c.name, c.arguments) for c in calls])
    rng = random.Random(len(text))
    for pieces in [list(text), *(_random_pieces(text, rng) for _ in range(40))]:
        events, _ = _stream(fmt, pieces)
        assert _assemble(events) == whole, pieces


def test_text_that_may_start_a_marker_is_held_back_and_the_name_comes_first() -> None:
    parser = ToolStreamParser(HERMES)
    assert parser.feed("Sure, checking <tool") == [ContentDelta("Sure, checking")]
    assert parser.feed("_ca") == []  # could still be the marker
    start = parser.feed('ll>\n{"name": "get_weather", "arguments": {"ci')
    assert isinstance(start[0], CallStart) and start[0].name == "get_weather" and start[0].index == 0
    assert [e.text for e in start[1:] if isinstance(e, ArgumentsDelta)] == ['{"ci']
    assert _assemble(start + parser.feed('ty": "Paris"}}\n</tool_call>') + parser.finish())[1] == [
        ("get_weather", '{"city": "Paris"}')
    ]
    other = ToolStreamParser(HERMES)
    assert other.feed("a <tool") == [ContentDelta("a")]
    assert other.feed("box> b") == [ContentDelta(" <toolbox> b")]  # never a marker: sent as it was


def test_one_call_at_most_drops_the_rest_and_says_done() -> None:
    _, text, _, calls = CASES["hermes-text-then-two"]
    events, parser = _stream(HERMES, [text[:150], text[150:]], max_calls=1)
    assert parser.done and _calls(parser.calls) == calls[:1]
    assert _assemble(events)[1] == [(parser.calls[0].name, parser.calls[0].arguments)]
    assert parse_answer(text, HERMES, max_calls=1)[1][0].name == "get_weather"


def test_a_call_to_a_function_not_offered_is_content_whole_and_streamed() -> None:
    offered = frozenset({"get_weather"})
    text = 'Let me see. <tool_call>\n{"name": "setup", "arguments": {"name": "demo"}}\n</tool_call>'
    content, calls = parse_answer(text, HERMES, names=offered)
    assert calls == [] and content == text
    rng = random.Random(7)
    for pieces in [list(text), *(_random_pieces(text, rng) for _ in range(20))]:
        parser = ToolStreamParser(HERMES, names=offered)
        events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
        assert _assemble(events) == (text, []), pieces
    both = text + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = parse_answer(both, HERMES, names=offered)
    assert _calls(calls) == [("get_weather", {"city": "Oslo"})] and content == text


def test_a_call_cut_short_keeps_what_it_had() -> None:
    content, calls = parse_answer('Hi <tool_call>\n{"name": "f", "arguments": {"a": [1, ', HERMES)
    assert content == "Hi" and [(c.name, c.arguments) for c in calls] == [("f", '{"a": [1, ')]


# -- formats from chat templates -------------------------------------------------------------------------

QWEN_LIKE = '{%- if tools %}...<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>'
LLAMA31_LIKE = ('<|start_header_id|>ipython<|end_header_id|>{%- if tools %}Respond in the format '
                '{"name": function name, "parameters": dictionary of argument name and its value}'
                '{{- "<|python_tag|>" }}')  # fmt: skip
MISTRAL_LIKE = "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}[TOOL_CALLS]"


def test_format_of_template() -> None:
    assert format_of_template(QWEN_LIKE) is HERMES
    assert format_of_template(LLAMA31_LIKE) is LLAMA3
    assert format_of_template(MISTRAL_LIKE) is MISTRAL
    assert format_of_template("{% for m in messages %}{{ m.content }}{% endfor %}") is None


def test_a_chatml_model_without_tools_in_its_template_gets_the_family_format(tiny_ggufs: tuple[Path, ...]) -> None:
    """The tiny GGUFs carry SmolLM2's ChatML template, which renders no tools: Hermes' format is used."""
    from localspec.backends.base import ChatMessage, ChatToolCall, chat_prompt_tokens
    from localspec.backends.chat_template import CHATML_TOOLS
    from localspec.backends.llama import backend as llama_cpp
    from localspec.server.tools import tool_template

    b = llama_cpp.load(tiny_ggufs[0], n_ctx=512, threads=1)
    try:
        tmpl = tool_template(b, None)
        assert not isinstance(tmpl, str) and tmpl.fmt is HERMES and tmpl.chat_format.template == CHATML_TOOLS
        msgs = [ChatMessage("user", "Weather in Paris?"),
                ChatMessage("assistant", "", (ChatToolCall("call_1", "get_weather", {"city": "Paris"}),)),
                ChatMessage("tool", "18 C", tool_call_id="call_1")]  # fmt: skip
        tools = [WEATHER]
        text = b.detokenizer().add(chat_prompt_tokens(b, msgs, tmpl.chat_format, tools))
        assert '"name": "get_weather"' in text and "<tools>" in text
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
        assert "<tool_response>\n18 C\n</tool_response>" in text
    finally:
        b.close()


def test_tools_render_as_hugging_face_renders_them(qwen_pair: tuple[Path, Path]) -> None:
    """The llama.cpp backend's rendering of Qwen's template with tools, calls and results is Hugging Face's
    apply_chat_template(tools=...) of the same template (what the MLX backend calls)."""
    transformers = pytest.importorskip("transformers")
    import mlx_fixtures

    from localspec.backends.base import ChatMessage, ChatToolCall
    from localspec.backends.llama import backend as llama_cpp

    msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Paris & Rome?"),
            ChatMessage("assistant", "Checking <both>.", (ChatToolCall("call_1", "get_weather", {"city": "Paris"}),
                                                          ChatToolCall("call_2", "get_weather", {"city": "Rome"}))),
            ChatMessage("tool", '{"c": 18}', tool_call_id="call_1", name="get_weather"),
            ChatMessage("tool", '{"c": 21}', tool_call_id="call_2"), ChatMessage("user", "Thanks")]  # fmt: skip
    hf = transformers.AutoTokenizer.from_pretrained(str(mlx_fixtures.converted("qwen-0.5b")))
    b = llama_cpp.load(qwen_pair[1], n_ctx=256, threads=1)
    try:
        ours = b.apply_chat_template(msgs, tools=[WEATHER, LOCAL_TIME])
    finally:
        b.close()
    theirs = hf.apply_chat_template([m.template_dict() for m in msgs], tools=[WEATHER, LOCAL_TIME], tokenize=False,
                                    add_generation_prompt=True)  # fmt: skip
    assert ours == theirs
    assert '{"name": "get_weather", "arguments": {"city": "Rome"}}' in ours and "& Rome" in ours


def test_mistral_conversations_get_the_nine_character_call_ids_its_templates_require() -> None:
    from localspec.backends.base import ChatMessage, ChatToolCall
    from localspec.server.tool_requests import ToolUse

    msgs = [ChatMessage("assistant", "", (ChatToolCall("call_0123456789abcdef01234567", "f", {}),)),
            ChatMessage("tool", "ok", tool_call_id="call_0123456789abcdef01234567")]  # fmt: skip
    call_id = ToolUse(fmt=MISTRAL).messages(msgs)[0].tool_calls[0].id
    assert len(call_id) == 9 and call_id.isalnum()
    assert ToolUse(fmt=MISTRAL).messages(msgs)[1].tool_call_id == call_id
    assert ToolUse(fmt=HERMES).messages(msgs) == msgs


# -- the grammar for tool_choice required / named --------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}}  # fmt: skip
LOCAL_TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# Finite arguments: a random tiny model under the grammar must end its call within a few tokens.
SWITCH = {"type": "function", "function": {"name": "switch", "parameters": {"type": "object", "properties": {
    "on": {"type": "boolean"}, "room": {"enum": ["hall", "attic"]}}, "required": ["on", "room"],
    "additionalProperties": False}}}  # fmt: skip


def _functions(*tools: dict[str, Any]) -> list[Any]:
    from localspec.server.tools import FunctionSpec

    return [FunctionSpec(t["function"]["name"], t["function"]["parameters"]) for t in tools]


def test_the_call_grammar_accepts_exactly_valid_calls(qwen_pair: tuple[Path, Path]) -> None:
    """On Qwen's vocabulary (<tool_call> is one token there): valid calls pass, a wrong name, missing or
    invalid arguments and text before the call do not."""
    import llguidance

    from localspec.backends.llama import backend as llama_cpp
    from localspec.decoding import grammar
    from localspec.server.tools import call_grammar, lazy_call_grammar, tool_template

    b = llama_cpp.load(qwen_pair[1], n_ctx=256, threads=1)
    try:
        tmpl = tool_template(b, None)
        assert not isinstance(tmpl, str) and tmpl.fmt is HERMES and tmpl.chat_format.source == "model"
        tok = grammar.tokenizer_for(b)

        def accepts(lark: str, answer: str) -> bool:
            m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(lark), log_level=0)
            assert not m.is_error(), m.get_error()
            ids = b.tokenize(answer, add_special=False, parse_special=True)
            return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()

        one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
        two = one + '\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo"}}\n</tool_call>'
        both = call_grammar(tmpl, _functions(WEATHER, LOCAL_TIME), parallel=True)
        assert accepts(both, one) and accepts(both, two)
        single = call_grammar(tmpl, _functions(WEATHER, LOCAL_TIME), parallel=False)
        assert accepts(single, one) and not accepts(single, two)
        named = call_grammar(tmpl, _functions(LOCAL_TIME), parallel=False)
        assert not accepts(named, one)
        assert not accepts(both, one.replace("get_weather", "get_wether"))
        assert not accepts(both, one.replace(', "unit": "C"', ""))  # a required argument missing
        assert not accepts(both, one.replace('"C"', '"K"'))
        assert not accepts(both, "Sure! " + one)
        lazy = lazy_call_grammar(tmpl, _functions(WEATHER, LOCAL_TIME), parallel=True)  # tool_choice auto
        assert lazy is not None
        assert accepts(lazy, "Sure! " + one) and accepts(lazy, two) and accepts(lazy, "No call needed.")
        assert accepts(lazy, "")  # an empty answer
        assert not accepts(lazy, "Sure! " + one.replace("get_weather", "get_wether"))  # once a call opens, held
        assert not accepts(lazy, one.replace('"C"', '"K"'))
        assert not accepts(lazy, one + " and more text")  # calls end the answer
        assert not accepts(lazy, "<|fim_prefix|>")  # other special tokens are not text
    finally:
        b.close()


@pytest.mark.parametrize("fmt", [LLAMA3, MISTRAL], ids=["llama3", "mistral"])
def test_the_call_grammar_of_the_other_formats_compiles(fmt: ToolFormat) -> None:
    from localspec.backends.chat_template import ChatFormat
    from localspec.decoding import grammar
    from localspec.server.tools import ToolTemplate, call_grammar, lazy_call_grammar

    tmpl = ToolTemplate(ChatFormat("model"), fmt, (("[TOOL_CALLS]", 5, False),) if fmt is MISTRAL else ())
    text = call_grammar(tmpl, _functions(WEATHER, LOCAL_TIME), parallel=True)
    grammar.check(grammar.GrammarSpec("lark", text))
    key = json.loads(text.split("fn_0: ")[1].split(" %json")[0])
    assert ('"parameters": ' if fmt is LLAMA3 else '"arguments": ') in key
    if fmt is MISTRAL:
        assert text.startswith("start: <[5]>")
    assert lazy_call_grammar(tmpl, _functions(WEATHER), parallel=True) is None  # a call's start is not one token


# -- the server, fast: a tiny random model (its family's tool format), and a model without one -------------


@pytest.fixture(scope="module")
def tiny_server(tiny_ggufs: tuple[Path, ...]) -> Iterator[InProcess]:
    with served("--target", str(tiny_ggufs[0]), "--draft-method", "ngram", "--n-ctx", "1024", "--threads", "1") as s:
        yield s


def _client(s: InProcess) -> Any:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)


def _error(r: httpx.Response, param: str) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    return str(err["message"])


HELLO = [{"role": "user", "content": "Turn the hall light on."}]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice",
         "not among the tools offered"),
        ({"tool_choice": "required"}, "tool_choice", "requires tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "Input should be"),
        ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name",
         "letters, digits"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "offered twice"),
        ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools[0].type", "Input should be"),
        ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "string"}}}]},
         "tools[0].function.parameters", "schema of an object"),
        ({"functions": [WEATHER["function"]]}, "functions", "legacy"),
        ({"function_call": "auto"}, "function_call", "legacy"),
        ({"messages": [*HELLO, {"role": "tool", "content": "done"}]}, "messages[1].tool_call_id", "tool_call_id"),
        ({"messages": [*HELLO, {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1",
          "type": "function", "function": {"name": "switch", "arguments": "on, please"}}]}]},
         "messages[1].tool_calls[0].function.arguments", "JSON object"),
    ],
)  # fmt: skip
def test_tool_requests_that_cannot_be_honoured_are_a_400(
    tiny_server: InProcess, fields: dict[str, Any], param: str, words: str
) -> None:
    for stream in (False, True):
        assert words in _error(tiny_server.post(CHAT, {"messages": HELLO, "max_tokens": 4, **fields, "stream": stream}),
                               param)  # fmt: skip


def test_required_makes_even_a_random_model_call_with_valid_arguments(tiny_server: InProcess) -> None:
    """The grammar alone makes the call: the tiny model is random weights."""
    client = _client(tiny_server)
    for stream in (False, True):
        kw = {"model": tiny_server.name, "messages": HELLO, "tools": [SWITCH, WEATHER], "max_tokens": 60,
              "tool_choice": {"type": "function", "function": {"name": "switch"}}, "seed": 3}  # fmt: skip
        if stream:
            chunks = list(client.chat.completions.create(**kw, stream=True))
            finish = chunks[-1].choices[0].finish_reason
            parts = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
            assert parts[0].id.startswith("call_") and parts[0].type == "function" and parts[0].function.arguments == ""
            name, args = parts[0].function.name, "".join(p.function.arguments or "" for p in parts)
        else:
            r = client.chat.completions.create(**kw)
            finish, (call,) = r.choices[0].finish_reason, r.choices[0].message.tool_calls
            name, args = call.function.name, call.function.arguments
            assert r.choices[0].message.content is None
        assert finish == "tool_calls" and name == "switch"
        jsonschema.validate(json.loads(args), SWITCH["function"]["parameters"])


def test_tool_choice_none_renders_no_tools_and_reads_no_calls(tiny_server: InProcess) -> None:
    plain = tiny_server.post(CHAT, {"messages": HELLO, "max_tokens": 8, "temperature": 0}).json()
    none = tiny_server.post(CHAT, {"messages": HELLO, "max_tokens": 8, "temperature": 0, "tools": [SWITCH],
                                   "tool_choice": "none"}).json()  # fmt: skip
    auto = tiny_server.post(CHAT, {"messages": HELLO, "max_tokens": 8, "temperature": 0, "tools": [SWITCH]}).json()
    assert none["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] < auto["usage"]["prompt_tokens"]
    assert none["choices"][0]["message"] == plain["choices"][0]["message"]


def test_a_model_without_a_tool_format_is_a_400(gemma_path: Path) -> None:
    """Gemma 3 ships no template here, and its family has no tool format localspec knows."""
    with served("--target", str(gemma_path), "--draft-method", "none", "--n-ctx", "512", "--threads", "1") as s:
        msg = _error(s.post(CHAT, {"messages": HELLO, "tools": [SWITCH]}), "tools")
        assert "this model's chat template does not support tools" in msg
        history = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "switch", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "call_1",
                   "content": "done"}]  # fmt: skip
        _error(s.post(CHAT, {"messages": history}), "messages")
        none = s.post(CHAT, {"messages": HELLO, "max_tokens": 2, "tools": [SWITCH], "tool_choice": "none"})
        assert none.status_code == 200, none.text


# -- the server on Qwen2.5-Coder 0.5B: its own template, real calls -----------------------------------------


@pytest.fixture(scope="module")
def qwen_server(qwen_pair: tuple[Path, Path]) -> Iterator[InProcess]:
    with served("--target", str(qwen_pair[1]), "--draft-method", "ngram", "--n-ctx", "2048", "--threads", "2") as s:
        yield s


ASK = [{"role": "user", "content": "What is the weather in Paris, in Celsius?"}]


def test_a_tool_round_trip(qwen_server: InProcess) -> None:
    """A required call with valid arguments, its result sent back as a tool message, then a text answer."""
    client = _client(qwen_server)
    kw: dict[str, Any] = {"model": qwen_server.name, "tools": [WEATHER, LOCAL_TIME], "temperature": 0, "max_tokens": 80}
    first = client.chat.completions.create(messages=ASK, tool_choice="required", **kw)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert "paris" in args["city"].lower()
    history = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})},
    ]
    final = client.chat.completions.create(messages=history, tool_choice="none", **kw).choices[0]
    assert final.finish_reason in ("stop", "length") and not final.message.tool_calls
    assert final.message.content and "18" in final.message.content


@pytest.mark.slow  # about 15 s on a quiet 2-core CPU
def test_calls_streamed_equal_calls_returned_whole_and_two_calls_in_one_turn(qwen_server: InProcess) -> None:
    client = _client(qwen_server)
    ask = [{"role": "user", "content": "What are the weather (in Celsius) and the local time in Paris and in Tokyo?"}]
    kw: dict[str, Any] = {"model": qwen_server.name, "messages": ask, "tools": [WEATHER, LOCAL_TIME], "temperature": 0,
                          "max_tokens": 160, "tool_choice": "required"}  # fmt: skip
    client.chat.completions.create(**{**kw, "max_tokens": 1})  # the prompt cached, as for the two compared
    whole = client.chat.completions.create(**kw).choices[0]
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed: dict[int, list[str]] = {}
    for c in chunks:
        for t in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = streamed.setdefault(t.index, [t.function.name or "", ""])
            entry[1] += t.function.arguments or ""
    calls = [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert [tuple(streamed[i]) for i in sorted(streamed)] == calls
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "tool_calls"
    assert len(calls) >= 2, calls  # this model calls for both (greedy)
    for name, args in calls:
        schema = {"get_weather": WEATHER, "get_time": LOCAL_TIME}[name]["function"]["parameters"]
        jsonschema.validate(json.loads(args), schema)
    one = client.chat.completions.create(**kw, parallel_tool_calls=False).choices[0]
    assert len(one.message.tool_calls) == 1 and one.finish_reason == "tool_calls"
    get_time = {"type": "function", "function": {"name": "get_time"}}
    named = client.chat.completions.create(**{**kw, "tool_choice": get_time})
    assert [t.function.name for t in named.choices[0].message.tool_calls] == ["get_time"]


def test_auto_reads_the_calls_the_model_writes_and_parallel_false_stops_after_one(qwen_server: InProcess) -> None:
    client = _client(qwen_server)
    kw: dict[str, Any] = {"model": qwen_server.name, "messages": ASK, "tools": [WEATHER], "temperature": 0,
                          "max_tokens": 80}  # fmt: skip
    r = client.chat.completions.create(**kw).choices[0]
    assert r.finish_reason == "tool_calls" and [t.function.name for t in r.message.tool_calls] == ["get_weather"]
    assert "paris" in json.loads(r.message.tool_calls[0].function.arguments)["city"].lower()
    single = client.chat.completions.create(**kw, parallel_tool_calls=False).choices[0]
    assert len(single.message.tool_calls) == 1
