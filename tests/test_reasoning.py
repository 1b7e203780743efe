"""Reasoning models through `localspec serve`: the splitter that takes the `<think>` block out of an answer
(whole, and streamed cut at every position), and the chat and Messages routes with a thinking template.

No fixture model is a reasoning model, so the served one is made to think honestly: Qwen2.5-Coder 0.5B with
a chat template (`--chat-template FILE`, as llama-server's `--chat-template-file`) that writes earlier
answers' reasoning in think blocks and opens one in the generation prompt, as Qwen3's and DeepSeek-R1's
templates do. Asked the same question as an earlier turn, the model (greedy) repeats that turn's thinking,
closes the block and answers: a real generation whose text holds `</think>` and no opening tag."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
uvicorn = pytest.importorskip("uvicorn")

from test_serve_inprocess import InProcess, served

from localspec.server.reasoning import ReasoningSplitter, Split, opened_in_prompt, split_answer

# -- the splitter -----------------------------------------------------------------------------------------

OPENED = "<think>\n"
Case = tuple[str, str, str, Split]  # format, prompt's opening, answer, (reasoning, content)
CASES: dict[str, Case] = {
    "no-block": ("deepseek", "", "Plain answer.\n", Split("", "Plain answer.\n")),
    "block-then-answer": ("deepseek", "", "<think>\nLet me add.\n\n2 + 2 = 4.\n</think>\n\nIt is 4.",
                          Split("Let me add.\n\n2 + 2 = 4.", "It is 4.")),
    "whitespace-before-the-tag": ("deepseek", "", "\n <think>a</think>b", Split("a", "b")),
    "forced-open": ("deepseek", OPENED, "Thinking here.\n</think>\n\nThe answer.",
                    Split("Thinking here.", "The answer.")),
    "forced-open-never-closed": ("deepseek", OPENED, "Still thinking when max_tokens came \n",
                                 Split("Still thinking when max_tokens came", "")),
    "empty-block": ("deepseek", "", "<think>\n\n</think>\n\nHi", Split("", "Hi")),
    "tag-lookalikes-inside": ("deepseek", "", "<think>a </thi b <think> c</think>d </think> e",
                              Split("a </thi b <think> c", "d </think> e")),
    "a-later-block-is-content": ("deepseek", "", "Answer <think>x</think>", Split("", "Answer <think>x</think>")),
    "angle-bracket-content": ("deepseek", "", "<b>bold</b>", Split("", "<b>bold</b>")),
    "auto-is-deepseek": ("auto", OPENED, "r</think>c", Split("r", "c")),
    "none-keeps-it-inline": ("none", OPENED, "Thinking.\n</think>\n\nAnswer.",
                             Split("", "<think>\nThinking.\n</think>\n\nAnswer.")),
    "none-without-opening": ("none", "", "<think>x</think>y", Split("", "<think>x</think>y")),
}  # fmt: skip


def streamed(case: Case, pieces: list[str]) -> Split:
    fmt, opened, _, _ = case
    splitter = ReasoningSplitter(fmt, opened=opened)
    out = [splitter.feed(p) for p in pieces] + [splitter.finish()]
    assert "".join(splitter.reasoning) == "".join(s.reasoning for s in out)  # what it keeps is what it sent
    return Split("".join(s.reasoning for s in out), "".join(s.content for s in out))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_split_answer(case: Case) -> None:
    fmt, opened, text, want = case
    assert split_answer(text, fmt, opened=opened) == want


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_streamed_cut_at_every_position_equals_whole(case: Case) -> None:
    text, want = case[2], case[3]
    for i in range(len(text) + 1):
        assert streamed(case, [text[:i], text[i:]]) == want, i
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert streamed(case, [text[:i], text[i:j], text[j:]]) == want, (i, j)
    assert streamed(case, list(text)) == want


def test_a_tag_split_across_pieces_is_never_sent_in_part() -> None:
    splitter = ReasoningSplitter(opened=OPENED)
    assert splitter.feed("one\n</th") == Split("one", "")
    assert splitter.feed("ink") == Split()
    assert splitter.feed(">\n\nTwo") == Split("", "Two")
    splitter = ReasoningSplitter()
    assert splitter.feed("<thi") == Split()  # could still open a block
    assert splitter.feed("nk>\nx  ") == Split("x", "")  # trailing blanks wait: they may end the reasoning
    assert splitter.feed(" y") == Split("   y", "")


def test_opened_in_prompt() -> None:
    assert opened_in_prompt("<|im_start|>assistant\n<think>\n") == "<think>\n"
    assert opened_in_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n") == ""  # Qwen3, thinking off
    assert opened_in_prompt("<|im_start|>assistant\n") == ""


# -- the server, with a template that thinks ----------------------------------------------------------------

THINKING_TEMPLATE = (  # ChatML, with Hermes' tool calls, and think blocks
    "{%- if tools -%}{{- '<|im_start|>system\\nYou may call these functions:\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson -}}{{- '\\n' -}}{%- endfor -%}"
    '{{- \'</tools>\\nCall one as <tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.role == 'assistant' and message.reasoning_content -%}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message.content or '' -}}"
    "{%- for call in message.tool_calls or [] -%}"
    '{{- \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' -}}'
    "{{- call.function.arguments | tojson -}}{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)
QUESTION = "What is 17 + 25? Think first."
THOUGHT = "17 + 25: 17 + 20 is 37, and 37 + 5 is 42."
ANSWER = "17 + 25 = 42."
CHAT = [
    {"role": "system", "content": "You think inside <think> tags, then answer."},
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT},
    {"role": "user", "content": QUESTION},
]


@pytest.fixture(scope="module")
def thinking_server(qwen_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    with served("--target", str(qwen_pair[1]), "--draft-method", "ngram", "--n-ctx", "2048", "--threads", "2",
                "--chat-template", str(template)) as s:  # fmt: skip
        yield s


def _client(s: InProcess) -> Any:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)


KW: dict[str, Any] = {"messages": CHAT, "temperature": 0, "max_tokens": 60}


def test_reasoning_content_whole_and_streamed(thinking_server: InProcess) -> None:
    client = _client(thinking_server)
    r = client.chat.completions.create(model=thinking_server.name, **KW)
    message, timings = r.choices[0].message, r.model_extra["timings"]
    reasoning = message.model_extra["reasoning_content"]
    assert "37" in reasoning and "<think>" not in reasoning and "</think>" not in reasoning
    assert "42" in message.content and "think>" not in message.content
    assert r.choices[0].finish_reason == "stop"
    assert timings["draft_n"] > 0 and timings["rounds"] > 0  # speculation ran on the thinking answer
    chunks = list(client.chat.completions.create(model=thinking_server.name, stream=True, **KW))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    kinds = ["r" if (d.model_extra or {}).get("reasoning_content") else "c" for d in deltas if d.content or
             (d.model_extra or {}).get("reasoning_content")]  # fmt: skip
    assert kinds == sorted(kinds, reverse=True) and "r" in kinds and "c" in kinds  # all reasoning, then content
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == message.content


def test_chat_template_kwargs_reach_the_template(thinking_server: InProcess) -> None:
    """Qwen3's switch: enable_thinking false closes the think block in the prompt, so the answer is all content."""
    thinking = thinking_server.post("/v1/chat/completions", KW).json()
    body = {**KW, "chat_template_kwargs": {"enable_thinking": False}}
    plain = thinking_server.post("/v1/chat/completions", body).json()
    assert plain["usage"]["prompt_tokens"] > thinking["usage"]["prompt_tokens"]  # the closed block was rendered
    message = plain["choices"][0]["message"]
    assert "reasoning_content" not in message and "think>" not in message["content"] and "42" in message["content"]
    for bad in ({"messages": []}, {"add_generation_prompt": False}):  # what localspec sets itself
        r = thinking_server.post("/v1/chat/completions", {**KW, "chat_template_kwargs": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
    r = thinking_server.post("/v1/chat/completions", {**KW, "chat_template_kwargs": "enable_thinking=false"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


def test_reasoning_format_none_keeps_it_inline(thinking_server: InProcess) -> None:
    split = thinking_server.post("/v1/chat/completions", KW).json()["choices"][0]["message"]
    inline = thinking_server.post("/v1/chat/completions", {**KW, "reasoning_format": "none"}).json()
    message = inline["choices"][0]["message"]
    assert "reasoning_content" not in message
    assert message["content"].startswith("<think>\n" + split["reasoning_content"])
    assert message["content"].endswith("</think>\n\n" + split["content"])
    bad = thinking_server.post("/v1/chat/completions", {**KW, "reasoning_format": "hidden"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_format"


def test_stop_strings_apply_to_the_content_only(thinking_server: InProcess) -> None:
    """ "37" is in the thinking: it does not stop the answer; "42" in the content does."""
    r = thinking_server.post("/v1/chat/completions", {**KW, "stop": ["37", "42"]}).json()
    message = r["choices"][0]["message"]
    assert "37" in message["reasoning_content"] and "42" not in message["content"]
    assert message["content"] and r["choices"][0]["finish_reason"] == "stop"


def test_a_grammar_from_the_first_token_leaves_no_room_to_think(thinking_server: InProcess) -> None:
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "sum", "schema": schema, "strict": True}}
    r = thinking_server.post("/v1/chat/completions", {**KW, "response_format": fmt}).json()
    message = r["choices"][0]["message"]
    assert "reasoning_content" not in message and isinstance(json.loads(message["content"])["sum"], int)


def test_earlier_reasoning_goes_to_the_template_which_decides(thinking_server: InProcess, qwen_pair: Any) -> None:
    """This template writes an earlier answer's reasoning_content; Qwen2.5's own does not use the field."""

    def prompt_tokens(s: InProcess, with_reasoning: bool) -> int:
        history = CHAT if with_reasoning else [{k: v for k, v in m.items() if k != "reasoning_content"} for m in CHAT]
        r = s.post("/v1/chat/completions", {"messages": history, "max_tokens": 1})
        return int(r.json()["usage"]["prompt_tokens"])

    assert prompt_tokens(thinking_server, True) > prompt_tokens(thinking_server, False)
    with served("--target", str(qwen_pair[1]), "--draft-method", "none", "--n-ctx", "1024", "--threads", "2") as s:
        assert prompt_tokens(s, True) == prompt_tokens(s, False)
        r = s.post("/v1/chat/completions", {**KW, "max_tokens": 8}).json()
        assert "reasoning_content" not in r["choices"][0]["message"]  # a model that does not think is unaffected


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = "What is the weather in Paris?"
PLAN = "The user wants the weather in Paris, so I call get_weather."
TOOL_TURN = [
    {"role": "user", "content": ASK},
    {"role": "assistant", "content": "", "reasoning_content": PLAN, "tool_calls": [{"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"celsius": 18})},
    {"role": "assistant", "content": "It is 18 degrees in Paris."},
    {"role": "user", "content": ASK},
]  # fmt: skip


def test_reasoning_comes_out_before_the_tool_calls_are_read(thinking_server: InProcess) -> None:
    client = _client(thinking_server)
    kw: dict[str, Any] = {
        "model": thinking_server.name,
        "messages": TOOL_TURN,
        "tools": [WEATHER],
        "temperature": 0,
        "max_tokens": 80,
    }
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert "get_weather" in choice.message.model_extra["reasoning_content"]
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    parts = [t for d in deltas for t in d.tool_calls or []]
    assert reasoning == choice.message.model_extra["reasoning_content"] and not "".join(d.content or "" for d in deltas)
    assert parts[0].function.name == "get_weather"
    assert "".join(p.function.arguments or "" for p in parts) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_anthropic_thinking_blocks_whole_and_streamed(thinking_server: InProcess) -> None:
    client = anthropic.Anthropic(base_url=thinking_server.url, api_key="none", max_retries=0)
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": THOUGHT, "signature": ""},
                                                 {"type": "text", "text": ANSWER}]},
               {"role": "user", "content": QUESTION}]  # fmt: skip
    kw: dict[str, Any] = {
        "model": thinking_server.name,
        "max_tokens": 1024,
        "messages": history,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": CHAT[0]["content"],
        "extra_body": {"temperature": 0},
    }  # (this SDK takes no `temperature` argument)
    msg = client.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert "37" in msg.content[0].thinking and msg.content[0].signature == ""
    assert "42" in msg.content[1].text and msg.stop_reason == "end_turn"
    with client.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in msg.content]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    at = deltas.index("signature_delta")  # the thinking block ends with its (empty) signature, then the text
    assert set(deltas[:at]) == {"thinking_delta"} and set(deltas[at + 1 :]) == {"text_delta"}


def test_random_pieces_of_a_real_answer(thinking_server: InProcess) -> None:
    """The server's raw text (reasoning_format none) split in random pieces gives the server's own split."""
    split = thinking_server.post("/v1/chat/completions", KW).json()["choices"][0]["message"]
    raw = thinking_server.post("/v1/chat/completions", {**KW, "reasoning_format": "none"}).json()
    text = raw["choices"][0]["message"]["content"].removeprefix(OPENED)
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(text) + 1), 6))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert streamed(("deepseek", OPENED, text, Split()), pieces) == Split(split["reasoning_content"],
                                                                              split["content"])  # fmt: skip


def test_serve_reasoning_format_sets_the_default(qwen_pair: tuple[Path, Path], tmp_path: Path) -> None:
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    with served("--target", str(qwen_pair[1]), "--draft-method", "none", "--n-ctx", "1024", "--threads", "2",
                "--chat-template", str(template), "--reasoning-format", "none") as s:  # fmt: skip
        inline = s.post("/v1/chat/completions", KW).json()["choices"][0]["message"]
        split = s.post("/v1/chat/completions", {**KW, "reasoning_format": "deepseek"}).json()["choices"][0]["message"]
    assert inline["content"].startswith(OPENED) and "reasoning_content" not in inline
    assert split["reasoning_content"] and OPENED + split["reasoning_content"] in inline["content"]
