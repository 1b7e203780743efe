"""Claude Code's requests as it sends them, on `localspec serve`: a `role: "system"` entry inside `messages`,
22 agent tools (some with `propertyNames`), adaptive thinking, `output_config.effort`, `context_management`
and a billing line that changes on every request, through the real `anthropic` client against the app in
this process (real llama.cpp on the tiny GGUFs); the one rule for fields that cannot be honoured (notes.py),
the tool schemas' keywords (schema_fit.py), and prefix reuse across turns."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")

from agent_tools import AGENT_TOOLS, UNENFORCED
from serve_process import httpx
from test_serve_inprocess import InProcess, TinyGGUFs, served

from localspec.decoding import grammar
from localspec.decoding.schema_fit import argument_errors, fit

KEY = "s3cret"
MODEL = "tiny"
BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27"]
SYSTEM_TEXT = [
    "You are a coding agent working in the user's terminal. Keep answers short.",
    "Use the tools to read and change files; never guess a file's contents. " * 12,
]


def system_blocks(turn: int) -> list[dict[str, Any]]:
    """Claude Code's system list: a billing line that changes every request, then the system prompt."""
    billing = f"x-anthropic-billing-header: cc_version=2.1.197.a{turn}; cc_entrypoint=cli; cch=0f{turn:03d}e;"
    blocks = [{"type": "text", "text": billing}]
    blocks += [{"type": "text", "text": t, "cache_control": {"type": "ephemeral"}} for t in SYSTEM_TEXT]
    return blocks


FIRST_TURN = [
    {"role": "user", "content": [{"type": "text", "text": "<reminder>The project is a small Python package.</reminder>"},
                                 {"type": "text", "text": "What does setup.py do?"}]},
    {"role": "system", "content": "The working directory is /home/user/demo; git status is clean."},
]  # fmt: skip


def claude_code_body(turn: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": MODEL, "max_tokens": 8, "system": system_blocks(turn), "messages": messages,
        "tools": AGENT_TOOLS, "tool_choice": {"type": "auto"}, "thinking": {"type": "adaptive"},
        "metadata": {"user_id": "user_0123_account__session_4567"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"}, "extra_body": {"temperature": 1},
    }  # fmt: skip


def client(s: InProcess) -> Any:
    return anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module", params=[1, 2], ids=["parallel-1", "parallel-2"])
def server(request: pytest.FixtureRequest, tiny_ggufs: TinyGGUFs) -> Iterator[InProcess]:
    with served("--target", str(tiny_ggufs[0]), "--draft-method", "ngram", "--n-ctx", "8192", "--threads", "2",
                "--model-name", MODEL, "--api-key", KEY, "--parallel", str(request.param)) as s:  # fmt: skip
        yield s


# -- the tool schemas ---------------------------------------------------------------------------------------


def test_agent_tool_schemas_fit_the_grammar() -> None:
    """Every agent tool compiles; keywords that constrain nothing (propertyNames {"type": "string"}, formats
    llguidance does not know, $schema) are no obstacle, and only SetEnv's constraining ones are left out."""
    from localspec.backends.chat_template import ChatFormat
    from localspec.server.tool_requests import function_spec
    from localspec.server.tools import HERMES, ToolTemplate, call_grammar

    assert len(AGENT_TOOLS) >= 20
    specs = []
    for i, tool in enumerate(AGENT_TOOLS):
        schema = tool["input_schema"]
        f = fit(schema)
        assert not f.error, (tool["name"], f.error)
        assert f.unenforced == UNENFORCED.get(tool["name"], ()), tool["name"]
        specs.append(function_spec(f"tools[{i}]", tool["name"], schema, strict=False))
    task = fit(next(t for t in AGENT_TOOLS if t["name"] == "Task")["input_schema"])
    assert "propertyNames" not in json.dumps(task.schema)  # it allowed every key: gone, nothing else changed
    assert task.schema["properties"]["env"]["additionalProperties"] == {"type": "string"}
    assert list(task.schema["properties"]) == ["description", "prompt", "subagent_type", "env"]  # order kept
    fetch = fit(next(t for t in AGENT_TOOLS if t["name"] == "WebFetch")["input_schema"])
    assert fetch.schema["properties"]["url"]["format"] == "uri"  # a format llguidance checks stays
    text = call_grammar(ToolTemplate(ChatFormat("model"), HERMES), specs, parallel=True)
    grammar.check(grammar.GrammarSpec("lark", text))
    strict_unknown_format = fit({"type": "object", "properties": {"p": {"type": "string", "format": "regex"}}})
    assert strict_unknown_format.unenforced == () and "format" not in json.dumps(strict_unknown_format.schema)


def test_a_keyword_the_grammar_cannot_enforce_is_checked_after_generation() -> None:
    schema = next(t for t in AGENT_TOOLS if t["name"] == "SetEnv")["input_schema"]
    assert argument_errors(schema, {"variables": {"PATH": "/bin"}, "tags": ["a", "b"]}) == []
    errors = argument_errors(schema, {"variables": {"path": "/bin"}, "tags": ["a", "a"]})
    assert any(e.startswith("tags: ") and "non-unique" in e for e in errors), errors
    assert any(e.startswith("variables: ") and "'path' does not match" in e for e in errors), errors
    assert fit({"type": "string", "pattern": "(?<=a)b"}).error.startswith("regex parse error")


# -- Claude Code's conversation -----------------------------------------------------------------------------


def test_a_claude_code_conversation_reads_only_the_new_tokens(server: InProcess) -> None:
    """Two turns as Claude Code sends them: both 200, the hints it sends said back in `warnings`, and the
    second turn, whose billing line changed, reuses the whole first prompt from the cache (on --parallel 2
    too): it reads only its new tokens."""
    c = client(server)
    first = c.beta.messages.create(**claude_code_body(1, FIRST_TURN), betas=BETAS)
    t1 = first.model_extra["timings"]
    assert first.usage.input_tokens > 2000  # 22 tools, the system prompt: an agent's long prefix
    warnings = first.model_extra["warnings"]
    assert any(w.startswith("output_config.effort 'high': accepted, not acted on") for w in warnings), warnings
    assert any(w.startswith("context_management: accepted, not acted on") for w in warnings), warnings
    reply = [block.model_dump(exclude_none=True) for block in first.content]
    reply = [b for b in reply if b["type"] != "text" or b["text"]] or [{"type": "text", "text": "Let me look."}]
    second_turn = [*copy.deepcopy(FIRST_TURN), {"role": "assistant", "content": reply},
                   {"role": "user", "content": "And what does the README say?"}]  # fmt: skip
    second = c.beta.messages.create(**claude_code_body(2, second_turn), betas=BETAS)
    t2 = second.model_extra["timings"]
    assert t2["cache_n"] >= first.usage.input_tokens, (t1, t2)  # the whole first prompt came from the cache
    assert t2["prompt_n"] == second.usage.input_tokens - t2["cache_n"]
    assert t2["prompt_n"] < 60, t2  # the new turn (and the answer's last token), not the 2000-token prefix
    events = list(c.beta.messages.create(**claude_code_body(3, second_turn), betas=BETAS, stream=True))  # as sent
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.model_extra["timings"]["cache_n"] >= t2["cache_n"]  # the same prompt again: all of it cached
    assert delta.model_extra["warnings"] == warnings  # the same hints, said on the stream's message_delta
    metrics = httpx.get(f"{server.url}/metrics", headers={"x-api-key": KEY}).text
    cached = next(line for line in metrics.splitlines() if line.startswith("localspec:prompt_tokens_cached_total"))
    assert float(cached.split()[-1]) >= t2["cache_n"]


def test_the_billing_line_is_dropped_and_system_entries_are_folded(server: InProcess) -> None:
    """The prompt is the one without the billing line, with the system entry's text after the system prompt."""
    c = client(server)
    as_sent = c.messages.count_tokens(model=MODEL, system=system_blocks(7), messages=FIRST_TURN).input_tokens
    folded = [*SYSTEM_TEXT, "\n\n", FIRST_TURN[1]["content"]]
    plain = c.messages.count_tokens(model=MODEL, system=[{"type": "text", "text": t} for t in folded],
                                    messages=FIRST_TURN[:1]).input_tokens  # fmt: skip
    assert as_sent == plain
    string_system = "x-anthropic-billing-header: cch=1;\n" + "".join(SYSTEM_TEXT)
    assert c.messages.count_tokens(model=MODEL, system=string_system, messages=FIRST_TURN).input_tokens == plain
    bad = [{"role": "user", "content": "Hi"}, {"role": "system", "content": [{"type": "tool_use", "id": "t",
                                                                               "name": "Bash", "input": {}}]}]  # fmt: skip
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=MODEL, max_tokens=2, messages=bad)
    assert "messages[1].content[0]" in e.value.body["error"]["message"]


def test_a_constraint_the_grammar_leaves_out_is_reported_and_strict_refuses_it(server: InProcess) -> None:
    """SetEnv's uniqueItems and patterned propertyNames: a forced call (random weights: the grammar alone
    makes it) comes back with a warning that says the arguments were checked; the same tool marked strict is
    a 400 naming the keywords."""
    c = client(server)
    set_env = next(t for t in AGENT_TOOLS if t["name"] == "SetEnv")
    m = c.messages.create(model=MODEL, max_tokens=120, messages=[{"role": "user", "content": "Set HOME."}],
                          tools=[set_env], tool_choice={"type": "tool", "name": "SetEnv"},
                          extra_body={"temperature": 0})  # fmt: skip
    assert [b.type for b in m.content] == ["tool_use"], m
    (warning,) = m.model_extra["warnings"]
    assert warning.startswith("call 1 (SetEnv): the grammar does not enforce the schema's propertyNames, "
                              "uniqueItems; the arguments were checked after generation: ")  # fmt: skip
    assert warning.endswith("valid") == (argument_errors(set_env["input_schema"], m.content[0].input) == [])
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Set HOME."}],
                          tools=[{**set_env, "strict": True}])  # fmt: skip
    assert "strict" in (msg := e.value.body["error"]["message"]) and "propertyNames, uniqueItems" in msg


def test_reasoning_effort_head_and_get_root(server: InProcess) -> None:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
            "reasoning_effort": "low"}  # fmt: skip
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    assert r.json()["warnings"] == ["reasoning_effort 'low': accepted, not acted on (localspec serve has no effort "
                                    "setting; a model that thinks thinks as its chat template makes it)"]  # fmt: skip
    streamed = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": True},
                          headers={"Authorization": f"Bearer {KEY}"}).text  # fmt: skip
    assert streamed.count('"warnings"') == 1  # on the last chunk
    plain = httpx.post(f"{server.url}/v1/chat/completions", json={k: v for k, v in body.items()
                                                                  if k != "reasoning_effort"},
                       headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert "warnings" not in plain.json()
    assert httpx.head(f"{server.url}/").status_code == 200  # no key needed: a reachability check
    assert httpx.get(f"{server.url}/").status_code == 200  # the same route answers Ollama's clients' check


def test_an_answer_schema_takes_the_same_keywords_and_refuses_what_it_cannot_enforce(server: InProcess) -> None:
    """response_format (and output_config.format): keywords that constrain nothing pass; one the grammar cannot
    enforce is a 400 naming it, since the answer is to match the schema."""
    free_keys = {"type": "object", "properties": {"ok": {"type": "boolean"}, "env": {
        "type": "object", "propertyNames": {"type": "string"}, "maxProperties": 0}}, "required": ["ok", "env"],
        "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}  # fmt: skip
    unique = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                        "uniqueItems": True}}}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}"}
    for schema, status in ((free_keys, 200), (unique, 400)):
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        body = {"model": MODEL, "max_tokens": 30, "messages": [{"role": "user", "content": "Hi"}],
                "response_format": fmt}  # fmt: skip
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == status, r.text
    assert "uniqueItems" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "response_format.json_schema.schema"
