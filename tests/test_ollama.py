"""Ollama's API on `localspec serve` with the real `ollama` client package: a tiny random GGUF in process for
the metadata routes, the wire format, options and refusals; Qwen2.5-Coder 0.5B (its own template renders
tools, its vocabulary has FIM tokens) for a real tool call and a fill-in-the-middle answer; /api/pull against
the fake Hub (tests/hub_server.py); --ollama-port with a real `localspec serve` process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ollama = pytest.importorskip("ollama")
jsonschema = pytest.importorskip("jsonschema")

from hub_server import FakeHub
from serve_process import ServeProcess, free_port, httpx
from test_reasoning import THINKING_TEMPLATE
from test_serve_inprocess import InProcess, TinyGGUFs, served

HI = [{"role": "user", "content": "Hi"}]
GREEDY = {"temperature": 0, "num_predict": 8}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
# Closed values only: a random model held to a free string would write it until num_predict ends it.
ANSWER = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]}},
          "required": ["ok", "size"], "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tiny_ggufs: TinyGGUFs) -> Iterator[InProcess]:
    with served("--target", str(tiny_ggufs[0]), "--draft-method", "ngram", "--n-ctx", "1024", "--threads", "1") as s:
        yield s


def client(s: InProcess) -> Any:
    return ollama.Client(host=s.url)


def refused(s: InProcess, method: str, path: str, body: dict[str, Any] | None, status: int) -> str:
    """The error of a request that must be refused: Ollama's shape, `{"error": "..."}` and nothing else."""
    r = httpx.request(method, f"{s.url}{path}", json=body, timeout=60)
    assert r.status_code == status, (path, r.status_code, r.text)
    assert list(r.json()) == ["error"] and isinstance(r.json()["error"], str), r.text
    return str(r.json()["error"])


# -- the metadata routes ------------------------------------------------------------------------------------


def test_list_show_ps_and_version_describe_the_served_model(tiny: InProcess, tiny_ggufs: TinyGGUFs) -> None:
    c = client(tiny)
    (entry,) = c.list().models
    assert entry.model == "tiny-target:latest"
    assert entry.size == tiny_ggufs[0].stat().st_size and len(entry.digest) == 64
    d = entry.details
    assert (d.format, d.family, d.families, d.quantization_level) == ("gguf", "llama", ["llama"], "F32")
    assert d.parameter_size.endswith("M")  # a few million random weights
    raw = httpx.get(f"{tiny.url}/api/tags").json()["models"][0]
    assert raw["name"] == raw["model"] == "tiny-target:latest"  # the field `codex --oss` compares names with

    for name in ("tiny-target", "tiny-target:latest", "TINY-target"):  # the tag and the case do not matter
        show = c.show(name)
        assert show.capabilities == ["completion", "tools"]  # SmolLM2's ChatML family renders tools; no FIM, no think
        assert show.modelinfo["llama.context_length"] == 1024  # what a request can use (serve's --n-ctx) ...
        assert show.modelinfo["localspec.trained_context_length"] == 2048  # ... and what the file says
        assert show.modelinfo["general.architecture"] == "llama" and show.modelinfo["tokenizer.ggml.tokens"] is None
        assert "<|im_start|>" in show.template and "num_ctx" in show.parameters and show.details == d
    verbose = httpx.post(f"{tiny.url}/api/show", json={"model": "tiny-target", "verbose": True}).json()
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) == 49152

    (loaded,) = c.ps().models
    assert (loaded.model, loaded.context_length, loaded.size_vram, loaded.digest) == (
        "tiny-target:latest", 1024, 0, entry.digest)  # fmt: skip
    assert httpx.get(f"{tiny.url}/api/version").json()["version"].count(".") == 2
    assert httpx.head(f"{tiny.url}/api/version").status_code == 200
    assert "Ollama is running" in httpx.get(f"{tiny.url}/").text  # some clients' health check
    assert httpx.head(f"{tiny.url}/").status_code == 200  # Claude Code's first request


def test_an_mlx_model_is_described_from_its_directory(tmp_path: Path) -> None:
    pytest.importorskip("mlx_lm")
    import mlx_tiny

    path = mlx_tiny.build(tmp_path / "model", seed=1)
    with served("--target", str(path), "--backend", "mlx", "--draft-method", "ngram", "--n-ctx", "256") as s:
        c = client(s)
        (entry,) = c.list().models
        d = entry.details
        assert (d.format, d.family, d.quantization_level) == ("safetensors", "qwen2", "F32")
        assert entry.size == sum(f.stat().st_size for f in path.iterdir()) and len(entry.digest) == 64
        info = c.show("model").modelinfo
        assert info["qwen2.context_length"] == 256 and info["localspec.trained_context_length"] == 4096
        assert c.chat(model="model", messages=HI, options={"num_predict": 3}).eval_count == 3


# -- chat and generate --------------------------------------------------------------------------------------


def test_chat_whole_and_streamed_give_the_same_answer_with_ollamas_counts(tiny: InProcess) -> None:
    c = client(tiny)
    whole = c.chat(model="tiny-target", messages=HI, options=GREEDY)
    assert whole.done and whole.done_reason == "length" and whole.message.role == "assistant"
    assert whole.eval_count == 8 and whole.prompt_eval_count > 5
    for duration in (whole.total_duration, whole.prompt_eval_duration, whole.eval_duration):
        assert isinstance(duration, int) and 0 < duration < whole.total_duration + 1  # nanoseconds
    assert whole.total_duration > 1_000  # (a few ms at least: nanoseconds, not seconds)

    chunks = list(c.chat(model="tiny-target:latest", messages=HI, options=GREEDY, stream=True))
    assert [ch.done for ch in chunks] == [False] * (len(chunks) - 1) + [True] and len(chunks) > 2
    assert "".join(ch.message.content for ch in chunks) == whole.message.content
    assert chunks[-1].done_reason == "length" and chunks[-1].eval_count == 8
    assert chunks[-1].prompt_eval_count == whole.prompt_eval_count  # the whole prompt, though cached now

    # Ollama streams unless told not to: NDJSON, one chunk a line; the last carries localspec's `timings`.
    r = httpx.post(f"{tiny.url}/api/chat", json={"model": "tiny-target", "messages": HI, "options": GREEDY})
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert "".join(x["message"]["content"] for x in lines) == whole.message.content and lines[-1]["done"]
    timings = lines[-1]["timings"]  # the speculative statistics, as on /v1 and /v1/messages
    assert timings["draft_method"] == "ngram" and timings["predicted_n"] == 8 and timings["cache_n"] > 0
    body = httpx.post(f"{tiny.url}/api/chat", json={"model": "tiny-target", "messages": HI, "options": GREEDY,
                                                   "stream": False}).json()  # fmt: skip
    assert body["message"]["content"] == whole.message.content and body["timings"]["predicted_n"] == 8


def test_generate_raw_and_templated(tiny: InProcess) -> None:
    c = client(tiny)
    raw = c.generate(model="tiny-target", prompt="Once upon a time", raw=True, options=GREEDY)
    assert raw.done and raw.eval_count == 8 and raw.prompt_eval_count == 4  # the prompt as it is: 4 tokens
    streamed = list(c.generate(model="tiny-target", prompt="Once upon a time", raw=True, options=GREEDY, stream=True))
    assert "".join(ch.response for ch in streamed) == raw.response
    templated = c.generate(model="tiny-target", prompt="Hi", system="Be brief.", options=GREEDY)
    assert templated.prompt_eval_count > 10  # the chat template's turns around the prompt
    chat = c.chat(model="tiny-target", messages=[{"role": "system", "content": "Be brief."}, *HI], options=GREEDY)
    assert templated.response == chat.message.content  # the same prompt as the conversation


def test_format_schema_is_enforced_by_the_grammar(tiny: InProcess) -> None:
    c = client(tiny)
    for stream in (False, True):
        kw = {"model": "tiny-target", "messages": HI, "format": ANSWER, "options": {"num_predict": 200}}
        if stream:
            text = "".join(ch.message.content for ch in c.chat(**kw, stream=True))
        else:
            text = c.chat(**kw).message.content
        jsonschema.validate(json.loads(text), ANSWER)  # a random model, held to the schema
    r = c.generate(model="tiny-target", prompt="Data:", raw=True, format=ANSWER, options={"num_predict": 200})
    jsonschema.validate(json.loads(r.response), ANSWER)


def test_options_stop_seed_num_predict_and_num_ctx(tiny: InProcess) -> None:
    c = client(tiny)
    text = c.generate(model="tiny-target", prompt="Count:", raw=True, options={"temperature": 0, "num_predict": 24})
    cut = text.response[len(text.response) // 2 :][:4]
    stopped = c.generate(model="tiny-target", prompt="Count:", raw=True,
                         options={"temperature": 0, "num_predict": 24, "stop": [cut]})  # fmt: skip
    assert stopped.done_reason == "stop" and text.response.startswith(stopped.response) and cut not in stopped.response
    sampled = [c.generate(model="tiny-target", prompt="Count:", raw=True,
                          options={"temperature": 1.0, "seed": 7, "num_predict": 12}).response for _ in range(2)]  # fmt: skip
    assert sampled[0] == sampled[1]

    small = c.generate(model="tiny-target", prompt="Count:", raw=True, options={"num_ctx": 10, "num_predict": -1})
    assert small.done_reason == "length" and small.prompt_eval_count + small.eval_count == 10  # the context asked for
    big = c.generate(model="tiny-target", prompt="Count:", raw=True, options={"num_ctx": 100_000, "num_predict": 3})
    assert big.eval_count == 3  # a larger context than serve's is capped at it
    assert "options.num_ctx 3 leaves no room" in refused(tiny, "POST", "/api/generate", {
        "model": "tiny-target", "prompt": "Count: one two", "raw": True, "options": {"num_ctx": 3}}, 400)  # fmt: skip
    loaded = c.generate(model="tiny-target", prompt="Count:", raw=True,
                        options={"num_thread": 64, "use_mmap": False, "num_gpu": 99, "repeat_penalty": 1.0,
                                 "num_predict": 2})  # fmt: skip
    assert loaded.eval_count == 2  # load-time options and neutral penalties: accepted, serve's flags stay


def test_requests_with_nothing_to_generate_are_ollamas_load(tiny: InProcess) -> None:
    c = client(tiny)
    assert c.chat(model="tiny-target", messages=[]).done_reason == "load"
    assert c.generate(model="tiny-target", prompt="", keep_alive="10m").done_reason == "load"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [
        ("POST", "/api/chat", {"model": "llama3", "messages": HI}, 404, "model 'llama3' not found"),
        ("POST", "/api/chat", {"messages": HI}, 400, "model is required"),
        ("POST", "/api/show", {"model": "llama3"}, 404, "tiny-target:latest"),
        ("POST", "/api/chat", {"model": "tiny-target", "messages": [{"role": "user", "content": "?",
                                                                      "images": ["aGk="]}]}, 400, "reads text only"),
        ("POST", "/api/generate", {"model": "tiny-target", "prompt": "?", "images": ["aGk="]}, 400, "reads text only"),
        ("POST", "/api/chat", {"model": "tiny-target", "messages": HI, "options": {"repeat_penalty": 1.1}}, 400,
         "options.repeat_penalty 1.1: not supported"),
        ("POST", "/api/chat", {"model": "tiny-target", "messages": HI, "options": {"mirostat": 2}}, 400,
         "options.mirostat"),
        ("POST", "/api/chat", {"model": "tiny-target", "messages": HI, "options": {"warmth": 3}}, 400,
         "options.warmth is not an option"),
        ("POST", "/api/chat", {"model": "tiny-target", "messages": HI, "options": {"temperature": "hot"}}, 400,
         "options.temperature: Input should be a valid number"),
        ("POST", "/api/chat", {"model": "tiny-target", "messages": HI, "think": True}, 400,
         '"tiny-target" does not support thinking'),
        ("POST", "/api/chat", {"model": "tiny-target", "messages": HI, "format": "xml"}, 400, 'use "json"'),
        ("POST", "/api/chat", {"model": "tiny-target", "messages": HI, "logprobs": True}, 400, "logprobs"),
        ("POST", "/api/chat", {"model": "tiny-target", "messages": HI, "tools": [WEATHER], "format": "json"}, 400,
         "format cannot be combined with tools"),
        ("POST", "/api/generate", {"model": "tiny-target", "prompt": "?", "template": "{{ .Prompt }}"}, 400,
         "template: localspec renders prompts with the model's own chat template"),
        ("POST", "/api/generate", {"model": "tiny-target", "prompt": "?", "context": [1, 2, 3]}, 400,
         "send the conversation to /api/chat"),
        ("POST", "/api/generate", {"model": "tiny-target", "prompt": "?", "raw": True, "system": "x"}, 400,
         "raw mode does not support system"),
        ("POST", "/api/generate", {"model": "tiny-target", "prompt": "def ", "suffix": "\n"}, 400,
         "fill-in-the-middle needs the model's FIM tokens"),
        ("POST", "/api/generate", {"model": "tiny-target", "prompt": "", "keep_alive": 0}, 400,
         "keeps its model loaded"),
        ("POST", "/api/generate", {"model": "tiny-target", "prompt": "?", "keep_alive": "soon"}, 400,
         "is not a duration"),
        ("POST", "/api/embed", {"model": "tiny-target", "input": "?"}, 501, "embeddings are not supported"),
        ("POST", "/api/embeddings", {"model": "tiny-target", "prompt": "?"}, 501, "embeddings are not supported"),
        ("POST", "/api/create", {"model": "mine", "from": "tiny-target"}, 501, "does not build models"),
        ("POST", "/api/copy", {"source": "tiny-target", "destination": "x"}, 501, "does not copy models"),
        ("DELETE", "/api/delete", {"model": "tiny-target"}, 501, "Hugging Face cache"),
        ("POST", "/api/push", {"model": "tiny-target"}, 501, "does not push"),
        ("POST", "/api/pull", {"model": "llama3.2:3b"}, 404, "localspec's catalog"),
        ("POST", "/api/chat", None, 400, "needs a JSON body"),
        ("GET", "/api/unknown", None, 404, "no route GET /api/unknown"),
    ],
)  # fmt: skip
def test_what_localspec_cannot_do_is_refused_in_ollamas_shape(
    tiny: InProcess, method: str, path: str, body: dict[str, Any] | None, status: int, words: str
) -> None:
    assert words in refused(tiny, method, path, body, status)
    if body is not None and path in ("/api/chat", "/api/generate") and status != 404:
        assert words in refused(tiny, method, path, {**body, "stream": True}, status)  # refused before it streams


def test_the_ollama_client_raises_the_refusal(tiny: InProcess) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client(tiny).chat(model="llama3", messages=HI)
    assert e.value.status_code == 404 and "model 'llama3' not found" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client(tiny).embed(model="tiny-target", input="hello")
    assert e.value.status_code == 501


# -- thinking: a template that opens a think block, on the tiny model -----------------------------------------


@pytest.fixture(scope="module")
def thinker(tiny_ggufs: TinyGGUFs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    """The tiny model with a Qwen3-like template: the generation prompt opens a think block (closed at once when
    enable_thinking is false). Random weights never close it: the whole answer is thinking."""
    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    with served("--target", str(tiny_ggufs[0]), "--draft-method", "ngram", "--n-ctx", "1024", "--threads", "1",
                "--chat-template", str(template)) as s:  # fmt: skip
        yield s


def test_think_splits_the_thinking_out_and_false_asks_the_template_not_to_think(thinker: InProcess) -> None:
    c = client(thinker)
    assert "thinking" in c.show("tiny-target").capabilities
    for think in (None, True, "high"):  # left out: split, as Ollama does for a model that thinks
        r = c.chat(model="tiny-target", messages=HI, think=think, options=GREEDY)
        assert r.message.thinking and r.message.content == "" and r.eval_count == 8
    chunks = list(c.chat(model="tiny-target", messages=HI, think=True, options=GREEDY, stream=True))
    assert "".join(ch.message.thinking or "" for ch in chunks) == r.message.thinking
    off = c.chat(model="tiny-target", messages=HI, think=False, options=GREEDY)
    assert not off.message.thinking and off.message.content  # the prompt closed the block: all content
    assert off.prompt_eval_count > r.prompt_eval_count
    generated = c.generate(model="tiny-target", prompt="Hi", think=True, options=GREEDY)
    assert generated.thinking == r.message.thinking and generated.response == ""  # /api/generate's `thinking`
    # An earlier answer's thinking goes back to the template as its reasoning_content.
    turns = [*HI, {"role": "assistant", "content": "Hello.", "thinking": "A greeting."}, *HI]
    without = [*HI, {"role": "assistant", "content": "Hello."}, *HI]
    counts = [c.chat(model="tiny-target", messages=m, options={"num_predict": 1}).prompt_eval_count
              for m in (turns, without)]  # fmt: skip
    assert counts[0] > counts[1]


# -- a real model: tool calls, fill-in-the-middle ------------------------------------------------------------


@pytest.fixture(scope="module")
def coder(qwen_pair: tuple[Path, Path]) -> Iterator[InProcess]:
    """Qwen2.5-Coder 0.5B: its template renders tools, its vocabulary has FIM tokens."""
    with served("--target", str(qwen_pair[1]), "--draft-method", "ngram", "--n-ctx", "2048", "--threads", "2",
                "--model-name", "coder") as s:  # fmt: skip
        yield s


ASK = [{"role": "user", "content": "What is the weather in Paris, in Celsius?"}]


def test_a_tool_call_whole_and_streamed_then_its_result_answered(coder: InProcess) -> None:
    c = client(coder)
    kw: dict[str, Any] = {"model": "coder", "tools": [WEATHER], "options": {"temperature": 0, "num_predict": 80}}
    assert c.show("coder").capabilities == ["completion", "tools", "insert"]
    first = c.chat(messages=ASK, **kw)
    (call,) = first.message.tool_calls
    assert first.done_reason == "stop" and call.function.name == "get_weather"
    assert isinstance(call.function.arguments, dict) and "paris" in call.function.arguments["city"].lower()
    jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])
    # Streamed, each call comes whole in one chunk, in Ollama's wire form: an id, its index, the arguments an object.
    r = httpx.post(f"{coder.url}/api/chat", json={"messages": ASK, **kw}, timeout=300)
    chunks = [json.loads(line) for line in r.text.splitlines()]
    streamed = [tc for ch in chunks for tc in ch["message"].get("tool_calls", ())]
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in streamed] == [
        (call.function.name, dict(call.function.arguments))]  # fmt: skip
    assert streamed[0]["id"].startswith("call_") and streamed[0]["function"]["index"] == 0 and chunks[-1]["done"]

    # The result goes back as a `tool` message naming the function; with no tools offered now, the model answers.
    history = [*ASK, first.message, {"role": "tool", "tool_name": "get_weather",
                                      "content": json.dumps({"temperature": 18, "sky": "sunny"})}]  # fmt: skip
    final = c.chat(model="coder", messages=history, options=kw["options"])
    assert not final.message.tool_calls and "18" in final.message.content


def test_format_json_answers_an_object(coder: InProcess) -> None:
    ask = [{"role": "user", "content": "Give the capital of France as JSON, with the key capital."}]
    r = client(coder).chat(model="coder", messages=ask, format="json", options={"temperature": 0, "num_predict": 40})
    assert r.done_reason == "stop" and "paris" in json.loads(r.message.content)["capital"].lower()


def test_generate_with_a_suffix_fills_the_middle(coder: InProcess) -> None:
    c = client(coder)
    prefix, suffix = "def ", "(a, b):\n    return a * b\n\nprint(multiply(2, 3))\n"
    kw: dict[str, Any] = {"model": "coder", "prompt": prefix, "suffix": suffix,
                          "options": {"temperature": 0, "num_predict": 24, "stop": ["\n\n"]}}  # fmt: skip
    r = c.generate(**kw)
    assert "multiply" in r.response and r.done
    assert "".join(ch.response for ch in c.generate(**kw, stream=True)) == r.response


# -- /api/pull: localspec pull for the catalog's pairs ------------------------------------------------------

T_REPO, T_FILE = "test-org/tiny-target-GGUF", "tiny-target-f32.gguf"
D_REPO, D_FILE = "test-org/tiny-draft-GGUF", "tiny-draft-f32.gguf"
CATALOG = f"""
[[pair]]
name = "tiny-pair"
description = "generated test pair"
num_draft = 3
hardware = "tests"
[pair.llama]
target = {{ repo = "{T_REPO}", file = "{T_FILE}" }}
draft = {{ repo = "{D_REPO}", file = "{D_FILE}" }}
size_gb = 0.05
"""


@pytest.fixture
def hub(tiny_ggufs: TinyGGUFs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A fake Hub holding the tiny pair, a private HF cache, and a user catalog naming the pair."""
    from huggingface_hub import constants

    h = FakeHub()
    h.add_repo(T_REPO, {T_FILE: tiny_ggufs[0]})
    h.add_repo(D_REPO, {D_FILE: tiny_ggufs[1]})
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))  # no saved token to the fake
    (tmp_path / "catalog.toml").write_text(CATALOG)
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(tmp_path / "catalog.toml"))
    with h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


def test_pull_downloads_a_catalog_pair_with_ollamas_status_lines(tiny: InProcess, hub: FakeHub, tmp_path: Path) -> None:
    c = client(tiny)
    assert c.pull("tiny-target").status == "success"  # the served model: here already
    lines = list(c.pull("tiny-pair", stream=True))
    assert lines[0].status == "pulling manifest" and lines[-1].status == "success"
    progress = [p for p in lines if p.status.startswith("pulling ") and p.total]
    assert {p.digest for p in progress} == {f"{T_REPO}/{T_FILE}", f"{D_REPO}/{D_FILE}"}
    assert all(p.completed == p.total for p in progress if p is progress[-1])
    assert "localspec serve --pair tiny-pair" in lines[-2].status
    cached = sorted(p.name for p in (tmp_path / "hf" / "hub").rglob("*.gguf"))
    assert cached == sorted([T_FILE, D_FILE])
    assert c.pull("tiny-pair:latest").status == "success"  # again, not streamed: nothing left to download
    with pytest.raises(ollama.ResponseError) as e:
        list(c.pull("llama3.2", stream=True))
    assert e.value.status_code == 404 and "tiny-pair" in e.value.error  # the catalog's pairs, named


# -- --ollama-port: the same server where Ollama clients look ---------------------------------------------


def test_ollama_port_serves_the_same_server_on_a_second_port(tiny_ggufs: TinyGGUFs) -> None:
    port = free_port()
    s = ServeProcess("--target", str(tiny_ggufs[0]), "--draft-method", "none", "--n-ctx", "256", "--threads", "1",
                     "--ollama-port", str(port), api_key="sekret")  # fmt: skip
    try:
        c = ollama.Client(host=f"127.0.0.1:{port}", headers={"Authorization": "Bearer sekret"})  # OLLAMA_HOST's form
        assert c.list().models[0].model == "tiny-target:latest"
        assert c.chat(model="tiny-target", messages=HI, options={"num_predict": 2}).eval_count == 2
        assert httpx.get(f"{s.url}/api/version", headers=s.headers()).status_code == 200  # and on --port too
        assert f"OLLAMA_HOST=127.0.0.1:{port}" in s.log()
        r = httpx.get(f"http://127.0.0.1:{port}/api/tags")  # no key: Ollama's error shape, saying how to send it
        assert r.status_code == 401 and "OLLAMA_API_KEY" in r.json()["error"]
    finally:
        s.close()


def test_a_taken_ollama_port_fails_before_the_models_load(tiny_ggufs: TinyGGUFs) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "localspec.cli", "serve", "--target", str(tiny_ggufs[0]),
                              "--port", str(free_port()), "--ollama-port", str(port)],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in run.stderr and "is Ollama itself running" in run.stderr
    assert "loading" not in run.stderr
