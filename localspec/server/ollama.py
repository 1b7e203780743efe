"""Ollama's API on localspec serve, for the clients that speak only it (the `ollama` packages, `codex --oss`,
editors' local-model providers): /api/version, /api/tags, /api/show, /api/ps, /api/chat, /api/generate,
/api/pull, and clear refusals for what localspec does not do (embeddings, building, copying, deleting and
pushing models). Errors have Ollama's shape, `{"error": "..."}`, on every /api/ path.

A thin adapter over the generation core (core.py): /api/chat and /api/generate bodies become the chat or
completion request they ask for (ollama_requests.py), and the core's events are rendered as Ollama's NDJSON
chunks (streamed, the default, as Ollama does) or as one body. Durations are nanoseconds, as Ollama reports
them: total_duration from the request's arrival, load_duration 0 (the model was loaded when the server
started), prompt_eval_count the whole prompt (its cached part is the `timings`' cache_n), prompt_eval_duration
the prompt pass, eval_count the generated tokens, eval_duration from the first generated token to the last;
`timings` carries localspec's speculative statistics, as on the OpenAI and Anthropic routes. Tool calls come
as Ollama sends them: each call whole, in the chunk where it ends, with its `id`, `function.index` and its
arguments as an object.

    ollama_router(core, log) -> APIRouter    the routes, mounted by app.create_app
    ERRORS                                   Ollama's error shape, for every path under /api
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from localspec import __version__
from localspec.server.core import Core, Failed, Finished, Run
from localspec.server.errors import APIError, ErrorShape
from localspec.server.ollama_models import (
    ModelCard,
    capabilities,
    chat_template,
    model_card,
    modelfile,
    parameters,
    rfc3339,
)
from localspec.server.ollama_pull import plan_pull, pull_lines, pull_result
from localspec.server.ollama_requests import (
    FIELD_NAMES,
    OllamaRequest,
    chat_generation,
    check_model,
    generate_generation,
)
from localspec.server.ollama_schemas import ChatRequest, GenerateRequest, ModelRequest
from localspec.server.reasoning import ReasoningDelta
from localspec.server.requests import Served
from localspec.server.responses import timings
from localspec.server.tools import CallEnd, ContentDelta, ToolCall

PREFIX = "/api"
# The Ollama release whose API this matches (tool call ids and `thinking` in /api/chat, context_length in
# /api/ps); clients that gate features on the version read it.
OLLAMA_VERSION = "0.14.0"
NDJSON = "application/x-ndjson"
Kind = Literal["chat", "generate"]
KEY_HINT = "set OLLAMA_API_KEY=KEY for the ollama clients (they send `Authorization: Bearer KEY`)"


def error_body(e: APIError) -> dict[str, Any]:
    return {"error": e.message}


ERRORS = ErrorShape(PREFIX, error_body, KEY_HINT, FIELD_NAMES)


@dataclass
class Cards:
    """The served model's card, found once (off the event loop: it reads the file's header)."""

    served: Served
    model_name: str
    _card: list[ModelCard] = field(default_factory=list)

    async def get(self) -> ModelCard:
        if not self._card:
            self._card.append(await run_in_threadpool(model_card, self.served, self.model_name))
        return self._card[0]


# -- rendering: a job's events -> Ollama's chunks ------------------------------------------------------------


@dataclass(frozen=True)
class Chunks:
    """The chunks of one answer: the model name the client asked for, /api/chat's `message` or /api/generate's
    `response`, and the clock that total_duration is read from."""

    kind: Kind
    model: str
    started: float  # time.perf_counter() when the request arrived

    def head(self, done: bool) -> dict[str, Any]:
        return {"model": self.model, "created_at": rfc3339(datetime.now(UTC)), "done": done}

    def piece(self, content: str = "", thinking: str = "", calls: Sequence[ToolCall] = (), first: int = 0,
              done: bool = False) -> dict[str, Any]:  # fmt: skip
        """A chunk with text, thinking or calls (`first`: the index of the first call among the answer's)."""
        out = self.head(done)
        if self.kind == "generate":
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
            return out
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = [call_body(c, first + i) for i, c in enumerate(calls)]
        out["message"] = message
        return out

    def final(self, done: Finished) -> dict[str, Any]:
        """The done chunk: why it ended, the counts and durations, and the speculative statistics."""
        stats = done.stats
        out = self.piece(done=True)
        out.update({
            "done_reason": done.finish_reason,
            "total_duration": nanoseconds(time.perf_counter() - self.started),
            "load_duration": 0,  # loaded when the server started
            "prompt_eval_count": stats.n_prompt,
            "prompt_eval_duration": nanoseconds(stats.prompt_s),
            "eval_count": stats.n_generated,
            "eval_duration": nanoseconds(stats.decode_s),
            "timings": timings(stats),
        })  # fmt: skip
        return out

    def loaded(self) -> dict[str, Any]:
        """The answer to a request with nothing to generate: Ollama's "load the model"."""
        return {**self.piece(done=True), "done_reason": "load"}


def call_body(call: ToolCall, index: int) -> dict[str, Any]:
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": arguments(call.arguments)}}


def arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the object Ollama sends; {} for arguments cut short (done_reason length)."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def nanoseconds(seconds: float) -> int:
    return int(seconds * 1e9)


async def ndjson(run: Run, chunks: Chunks) -> AsyncIterator[bytes]:
    """The core's events as Ollama's chunks, one a line: text and thinking as they come, each tool call whole
    in the chunk where it ends (Ollama streams no partial arguments), then the done chunk; an error is the last
    line, as Ollama's streams end."""
    try:
        async for event in run.events():
            if isinstance(event, ContentDelta):
                yield line(chunks.piece(content=event.text))
            elif isinstance(event, ReasoningDelta):
                yield line(chunks.piece(thinking=event.text))
            elif isinstance(event, CallEnd):
                yield line(chunks.piece(calls=[event.call], first=event.index))
            elif isinstance(event, Finished):
                yield line(chunks.final(event))
            elif isinstance(event, Failed):
                yield line(error_body(event.error))  # the server serves on
    finally:
        run.close()  # the client went away mid-stream: stop now (a no-op once finished)


async def whole(run: Run, chunks: Chunks) -> dict[str, Any]:
    """The answer as one body: the done chunk with the whole text, thinking and calls."""
    try:
        done = await run.result()
    finally:
        run.close()
    out = chunks.final(done)
    out.update(chunks.piece(content=done.text, thinking=done.reasoning, calls=done.calls, done=True))
    return out


def line(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# -- the routes ---------------------------------------------------------------------------------------------

NOT_DONE_HERE = {
    "/api/embed": "embeddings are not supported by localspec serve: it serves a generative model for speculative "
    "decoding; use an embedding server",
    "/api/embeddings": "embeddings are not supported by localspec serve: it serves a generative model for "
    "speculative decoding; use an embedding server",
    "/api/create": "localspec does not build models (no Modelfiles): serve a GGUF file or a catalog pair with "
    "`localspec serve --target FILE` or `--pair NAME`",
    "/api/copy": "localspec does not copy models: it serves one model, under its --model-name",
    "/api/delete": "localspec does not delete models: pulled files live in the Hugging Face cache (`hf cache "
    "delete` removes them)",
    "/api/push": "localspec does not push models to a registry",
    "/api/blobs/{digest}": "localspec does not build models (no Modelfiles, no blobs): serve a GGUF file with "
    "`localspec serve --target FILE`",
}
NOT_DONE_METHODS = {"/api/delete": ["DELETE"], "/api/blobs/{digest}": ["HEAD", "POST"]}


def ollama_router(core: Core, log: Callable[[str], None]) -> APIRouter:
    router = APIRouter()
    served = core.served
    cards = Cards(served, core.model_name)

    @router.api_route("/", methods=["GET", "HEAD"])
    async def running() -> Response:
        return PlainTextResponse("Ollama is running (localspec serve: Ollama's API under /api, OpenAI's under /v1)")

    @router.api_route("/api/version", methods=["GET", "HEAD"])
    async def version() -> dict[str, Any]:
        return {"version": OLLAMA_VERSION, "localspec": __version__}

    @router.api_route("/api/tags", methods=["GET", "HEAD"])
    async def tags() -> dict[str, Any]:
        return {"models": [(await cards.get()).tags_entry()]}

    @router.get("/api/ps")
    async def ps() -> dict[str, Any]:
        return {"models": [(await cards.get()).ps_entry(datetime.now(UTC))]}

    @router.post("/api/show")
    async def show(body: ModelRequest) -> dict[str, Any]:
        check_model(body.model_name, served)
        card = await cards.get()
        params = parameters(served.defaults, card.context_length)
        return {
            "modelfile": modelfile(served.pipeline.target.info.path, params),
            "parameters": params,
            "template": await run_in_threadpool(chat_template, served),
            "details": card.details,
            "model_info": card.model_info(verbose=bool(body.verbose)),
            "capabilities": await run_in_threadpool(capabilities, served),
            "modified_at": card.modified_at,
        }

    @router.post("/api/chat")
    async def chat(body: ChatRequest, request: Request) -> Response:
        started = time.perf_counter()
        req = await run_in_threadpool(chat_generation, body, served)
        return await respond(request, req, Chunks("chat", body.model, started), body.streams)

    @router.post("/api/generate")
    async def generate(body: GenerateRequest, request: Request) -> Response:
        started = time.perf_counter()
        req = await run_in_threadpool(generate_generation, body, served)
        return await respond(request, req, Chunks("generate", body.model, started), body.streams)

    async def respond(request: Request, req: OllamaRequest, chunks: Chunks, stream: bool) -> Response:
        if req.generation is None:  # nothing to generate: Ollama's "load the model"
            return JSONResponse(chunks.loaded())
        if req.num_ctx_note:
            log(f"{request.url.path}: {req.num_ctx_note}")
        run = core.start(request, req.generation)
        if stream:
            return StreamingResponse(ndjson(run, chunks), media_type=NDJSON,
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        return JSONResponse(await whole(run, chunks))

    @router.post("/api/pull")
    async def pull(body: ModelRequest) -> Response:
        plan = plan_pull(body.model_name, served)
        if body.stream is False:
            return JSONResponse(await pull_result(plan))
        return StreamingResponse((line(status) async for status in pull_lines(plan)), media_type=NDJSON)

    for path, why in NOT_DONE_HERE.items():
        router.add_api_route(path, refusal(why), methods=NOT_DONE_METHODS.get(path, ["POST"]))
    return router


def refusal(why: str) -> Callable[[], Any]:
    async def refuse() -> None:
        raise APIError(501, why, None, "not_supported")

    return refuse
