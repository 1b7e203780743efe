"""Ollama's API on localspec serve, for the clients that speak only it (the `ollama` packages, `codex --oss`,
editors' local-model providers): /api/version, /api/tags, /api/show, /api/ps, /api/chat, /api/generate,
/api/pull, and clear refusals for what localspec does not do (embeddings, building, copying, deleting and
pushing models). Errors have Ollama's shape, `{"error": "..."}`, on every /api/ path.

/api/chat and /api/generate go through the chat and completion paths (ollama_requests.py): the answer is read
from the job's events by `answer_chunks` and rendered as Ollama's NDJSON chunks (streamed, the default, as
Ollama does) or one body. Durations are nanoseconds, as Ollama reports them: total_duration from the request's
arrival, load_duration 0 (the model was loaded when the server started), prompt_eval_count the whole prompt
(its cached part is the `timings`' cache_n), prompt_eval_duration the prompt pass, eval_count the generated
tokens, eval_duration from the first generated token to the last; `timings` carries localspec's speculative
statistics, as on the OpenAI and Anthropic routes. Tool calls come as Ollama sends them: each call whole, in
the chunk where it ends, with its `id`, `function.index` and its arguments as an object.

    ollama_router(service) -> APIRouter      the routes, mounted by app.create_app
    is_api_path(path) -> bool                paths whose errors take Ollama's shape
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
from localspec.server.errors import APIError
from localspec.server.metrics import Metrics
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
from localspec.server.ollama_requests import OllamaRequest, chat_generation, check_model, generate_generation
from localspec.server.ollama_schemas import ChatRequest, GenerateRequest, ModelRequest
from localspec.server.reasoning import ReasoningDelta
from localspec.server.requests import GenerationRequest, Served
from localspec.server.responses import timings
from localspec.server.scheduler import Job, Outcome
from localspec.server.tools import ContentDelta, ToolCall

PREFIX = "/api/"
# The Ollama release whose API this matches (tool call ids and `thinking` in /api/chat, context_length in
# /api/ps); clients that gate features on the version read it.
OLLAMA_VERSION = "0.14.0"
NDJSON = "application/x-ndjson"
Kind = Literal["chat", "generate"]
StartJob = Callable[[Request, GenerationRequest], tuple[Job, Callable[[], None]]]


def is_api_path(path: str) -> bool:
    return path.startswith(PREFIX) or path == PREFIX.rstrip("/")


def error_body(e: APIError) -> dict[str, Any]:
    return {"error": e.message}


@dataclass
class OllamaService:
    """What the routes need from the app: the requests' context, the served name, how to queue a job (and
    cancel it when its client goes away), the error counters and the log."""

    served: Served
    model_name: str
    start: StartJob
    metrics: Metrics
    log: Callable[[str], None]
    _card: list[ModelCard] = field(default_factory=list)

    async def card(self) -> ModelCard:
        """The served model's card, found once (off the event loop: it reads the file's header)."""
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

    def final(self, outcome: Outcome) -> dict[str, Any]:
        """The done chunk: why it ended, the counts and durations, and the speculative statistics."""
        stats = outcome.stats
        out = self.piece(done=True)
        out.update({
            "done_reason": outcome.finish_reason,
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


async def answer_chunks(job: Job, chunks: Chunks) -> AsyncIterator[dict[str, Any]]:
    """The job's events as Ollama's chunks: text, thinking and whole tool calls as they come (done false), then
    the done chunk. An error is raised (a stream turns it into its last line)."""
    reader = job.request.tools.parser() if job.request.tools else None
    sent = 0  # calls sent so far
    while True:
        item = await job.next()
        if isinstance(item, APIError):
            raise item
        if isinstance(item, ReasoningDelta):
            yield chunks.piece(thinking=item.text)
            continue
        if reader is not None:  # the text is read for calls: content, and each call once it is whole
            events = reader.feed(item) if isinstance(item, str) else reader.finish()
            if reader.done:
                job.stop.set()  # one call at most was asked for: nothing after it is wanted
            text = "".join(e.text for e in events if isinstance(e, ContentDelta))
            calls = reader.calls[sent:]
            if text or calls:
                yield chunks.piece(content=text, calls=calls, first=sent)
            sent += len(calls)
        elif isinstance(item, str):
            yield chunks.piece(content=item)
        if isinstance(item, Outcome):
            yield chunks.final(item)
            return


async def ndjson(job: Job, chunks: Chunks, end: Callable[[], None], metrics: Metrics) -> AsyncIterator[bytes]:
    try:
        async for chunk in answer_chunks(job, chunks):
            yield line(chunk)
    except APIError as e:
        metrics.error(e.status)  # (a non-streamed error is counted by its handler)
        yield line(error_body(e))  # the stream ends with the error, as Ollama's does; the server serves on
    finally:
        end()  # the client went away mid-stream: stop now (a no-op once finished)


async def whole(job: Job, chunks: Chunks, end: Callable[[], None]) -> dict[str, Any]:
    """The answer as one body: the chunks' text, thinking and calls joined into the done chunk."""
    content: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    last: dict[str, Any] = {}
    try:
        async for chunk in answer_chunks(job, chunks):
            part = chunk.get("message", chunk)
            content.append(part.get("content", part.get("response", "")))
            thinking.append(part.get("thinking", ""))
            calls.extend(part.get("tool_calls", ()))
            last = chunk
    finally:
        end()
    part = last.get("message", last)
    part["content" if "message" in last else "response"] = "".join(content)
    if any(thinking):
        part["thinking"] = "".join(thinking)
    if calls:
        part["tool_calls"] = calls
    return last


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


def ollama_router(service: OllamaService) -> APIRouter:
    router = APIRouter()
    served = service.served

    @router.api_route("/", methods=["GET", "HEAD"])
    async def running() -> Response:
        return PlainTextResponse("Ollama is running (localspec serve: Ollama's API under /api, OpenAI's under /v1)")

    @router.api_route("/api/version", methods=["GET", "HEAD"])
    async def version() -> dict[str, Any]:
        return {"version": OLLAMA_VERSION, "localspec": __version__}

    @router.api_route("/api/tags", methods=["GET", "HEAD"])
    async def tags() -> dict[str, Any]:
        return {"models": [(await service.card()).tags_entry()]}

    @router.get("/api/ps")
    async def ps() -> dict[str, Any]:
        return {"models": [(await service.card()).ps_entry(datetime.now(UTC))]}

    @router.post("/api/show")
    async def show(body: ModelRequest) -> dict[str, Any]:
        check_model(body.model_name, served)
        card = await service.card()
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
        if req.generation is None:
            return JSONResponse(chunks.loaded())
        if req.num_ctx_note:
            service.log(f"{request.url.path}: {req.num_ctx_note}")
        job, end = service.start(request, req.generation)
        if stream:
            return StreamingResponse(ndjson(job, chunks, end, service.metrics), media_type=NDJSON,
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        return JSONResponse(await whole(job, chunks, end))

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
