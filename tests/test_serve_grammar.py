"""`response_format` through `localspec serve` (a real server process, the real openai client): answers under
json_schema validate against the schema (jsonschema), json_object answers parse, streaming too, the stats
and /metrics cover constrained answers, and formats that cannot be honoured are refused with a 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from serve_process import ServeProcess, httpx  # noqa: E402
from test_serve import metrics  # noqa: E402

CHAT = "/v1/chat/completions"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
ASKS = [
    "Give me a person as JSON.",
    "Describe a doctor who lives in London, as JSON.",
    "A retired teacher from Tokyo, in JSON please.",
    'Example: {"name": "Ann", "age": 30, "city": "Paris"}. Now another person.',
    "Who is the oldest person you can think of? Answer in JSON.",
]


@pytest.fixture(scope="module")
def server(smollm2_path) -> Iterator[ServeProcess]:  # type: ignore[no-untyped-def]
    """A real small model (SmolLM2 135M) drafting with suffix lookup."""
    s = ServeProcess("--target", str(smollm2_path), "--draft-method", "suffix", "--n-ctx", "1024",
                     "--model-name", "small")  # fmt: skip
    yield s
    s.close()


def _ask(client, content: str, **kw: Any):  # type: ignore[no-untyped-def]
    kw.setdefault("max_tokens", 60)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="small", messages=[{"role": "user", "content": content}], **kw)


def _valid(text: str, schema: dict[str, Any]) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


def test_json_schema_answers_validate(server: ServeProcess) -> None:
    client = server.client()
    before = metrics(server)
    timings = []
    for i, ask in enumerate(ASKS[:3]):
        r = _ask(client, ask, response_format=FORMAT, temperature=0 if i % 2 else 0.8, seed=i)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        _valid(r.choices[0].message.content, PERSON)
        timings.append(r.model_extra["timings"])
    # The speculative stats cover constrained answers like any other: in timings and in /metrics.
    assert all(t["draft_method"] == "suffix" for t in timings)
    assert sum(t["draft_n_accepted"] for t in timings) > 0
    after = metrics(server)
    delta = after["localspec:spec_decode_num_accepted_tokens_total"] - before.get(
        "localspec:spec_decode_num_accepted_tokens_total", 0.0)  # fmt: skip
    assert delta == sum(t["draft_n_accepted"] for t in timings)
    assert all(len(t["acceptance_by_position"]) > 0 for t in timings if t["draft_n"])
    assert all(t["grammar_ms"] > 0 for t in timings)  # the matcher's own time, for the constrained answers


@pytest.mark.slow
def test_json_schema_streamed_and_json_object(server: ServeProcess) -> None:
    client = server.client()
    chunks = list(_ask(client, ASKS[1], response_format=FORMAT, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    _valid(text, PERSON)
    r = _ask(client, 'Reply with a JSON object with one key "answer": what is 2 + 2?',
             response_format={"type": "json_object"})  # fmt: skip
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    # Non-strict schemas are enforced the same way.
    loose = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": False}}
    _valid(_ask(client, ASKS[0], response_format=loose).choices[0].message.content, PERSON)


def test_completions_take_response_format(server: ServeProcess) -> None:
    body = {"prompt": "A person as JSON: ", "max_tokens": 60, "temperature": 0, "response_format": FORMAT}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    _valid(choice["text"], PERSON)


@pytest.mark.parametrize(
    ("fmt", "param", "words"),
    [
        ({"type": "xml"}, "response_format.type", "unknown"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}},
         "response_format.json_schema.schema", "objectx"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}},
         "response_format.json_schema.schema", "cannot be compiled"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema", "json_schema.schema"),
    ],
)  # fmt: skip
def test_formats_that_cannot_be_honoured_are_refused(server: ServeProcess, fmt: dict, param: str, words: str) -> None:
    bodies = ((CHAT, {"messages": [{"role": "user", "content": "Hi"}]}), ("/v1/completions", {"prompt": "Hi"}))
    for path, body in bodies:
        r = httpx.post(f"{server.url}{path}", json={**body, "response_format": fmt}, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and words in err["message"], err
    with pytest.raises(openai.BadRequestError):
        _ask(server.client(), "Hi", response_format=fmt)


@pytest.mark.slow
def test_twenty_prompts_on_qwen_validate(qwen_pair) -> None:  # type: ignore[no-untyped-def]
    """The qwen2.5-coder 1.5B target with its 0.5B draft (model drafting): 20 schema answers, all valid.

    A sampled answer may pad with whitespace where the model would rather stop (1 in 20-60 at T = 0.7, the same
    before and after a change of the random streams), so the limit is what the grammar allows, not a typical
    length: at most 14 gaps of JSON_WHITESPACE (<= 42 characters each), a name of <= 24 characters (<= 6 each,
    escaped) and the fixed keys make under 800 characters, so under 800 tokens. A "length" finish is a bug."""
    target, draft = qwen_pair
    s = ServeProcess("--target", str(target), "--draft", str(draft), "--draft-method", "model", "--n-ctx", "2048",
                     "--model-name", "small")  # fmt: skip
    try:
        client = s.client()
        for i in range(20):
            ask = f"{ASKS[i % len(ASKS)]} (variant {i})"
            r = _ask(client, ask, response_format=FORMAT, temperature=0.7 if i % 2 else 0, seed=i, max_tokens=800)
            assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
            _valid(r.choices[0].message.content, PERSON)
    finally:
        s.close()
