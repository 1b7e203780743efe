"""The ASGI app: OpenAI's routes over one Scheduler, the API key, the body limit and CORS.

create_app(pipeline, settings) -> FastAPI      the scheduler starts with the app and stops with it
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec.options import GenerationSettings
from localspec.pipeline import Pipeline
from localspec.server import anthropic
from localspec.server.errors import APIError
from localspec.server.metrics import Metrics
from localspec.server.notes import warnings_of, with_warnings
from localspec.server.reasoning import DEFAULT_FORMAT, ReasoningDelta
from localspec.server.requests import (
    GenerationRequest,
    Served,
    chat_request,
    check_model_id,
    completion_request,
)
from localspec.server.responses import (
    ResponseIds,
    calls_finish_reason,
    chunk,
    full_response,
    sse,
    tool_chunks,
    usage_chunk,
)
from localspec.server.scheduler import Job, Outcome, Scheduler
from localspec.server.schemas import (
    FIELD_NAMES,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

if TYPE_CHECKING:
    from localspec.server.crowd_scheduler import Slots

DEFAULT_MAX_BODY = 8 * 1024 * 1024
KEY_HINT = "send it as `Authorization: Bearer KEY`"
OPEN_PATHS = ("/", "/health")  # answered without the API key (load balancers, `curl` checks, HEAD /)


@dataclass(frozen=True)
class ServerSettings:
    model_name: str  # the id /v1/models lists and responses carry
    defaults: GenerationSettings  # serve's flags: what a request gets for each field it leaves out
    model_aliases: tuple[str, ...] = ()  # other ids a request may name (the catalog pair under --model-name)
    api_key: str | None = None
    max_queue: int = 16
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY
    reasoning_format: str = DEFAULT_FORMAT  # serve --reasoning-format: a thinking model's think block, split or inline
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))


def create_app(
    pipeline: Pipeline, settings: ServerSettings, slots: Slots | None = None, draft_slots: Slots | str | None = None
) -> FastAPI:
    """`slots` (serve --parallel N > 1): the requests decode together in them (crowd_scheduler.py); `draft_slots`:
    the draft model's, one per sequence (or why there are none)."""
    metrics = Metrics()
    served = Served(
        pipeline,
        settings.defaults,
        (settings.model_name, *settings.model_aliases),
        reasoning_format=settings.reasoning_format,
        crowd=slots is not None,
    )
    state: dict[str, Scheduler] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if slots is None:
            state["scheduler"] = Scheduler(pipeline, max_queue=settings.max_queue, metrics=metrics, log=settings.log)
        else:
            from localspec.server.crowd_scheduler import CrowdScheduler

            state["scheduler"] = CrowdScheduler(pipeline, slots, max_queue=settings.max_queue, metrics=metrics,
                                                log=settings.log, draft_slots=draft_slots)  # fmt: skip
        try:
            yield
        finally:
            await run_in_threadpool(state["scheduler"].close)

    app = FastAPI(title="localspec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    # -- errors in OpenAI's shape ---------------------------------------------------------------------

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        metrics.error(e.status)
        settings.log(f"{request.method} {request.url.path} {e.status} · {e.message}")
        body = anthropic.error_body(e) if anthropic.is_messages_path(request.url.path) else e.body()
        return JSONResponse(body, status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        if anthropic.is_messages_path(request.url.path):
            return await api_error(request, anthropic.validation_error(e.errors()))
        return await api_error(request, validation_error(e))

    @app.exception_handler(404)
    async def not_found(request: Request, e: Exception) -> JSONResponse:
        return await api_error(
            request, APIError(404, f"no route {request.method} {request.url.path}", None, "not_found")
        )

    @app.exception_handler(405)
    async def not_allowed(request: Request, e: Exception) -> JSONResponse:
        allow = getattr(e, "headers", None) or {}  # Starlette's 405 says which methods the route takes
        return await api_error(request, APIError(405, f"{request.method} is not allowed on {request.url.path}",
                                                 None, "method_not_allowed", dict(allow)))  # fmt: skip

    # -- routes ---------------------------------------------------------------------------------------

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> dict[str, Any]:
        """What a client's reachability check asks (Claude Code sends HEAD /): the server is up."""
        return {"status": "ok", "model": settings.model_name}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": settings.model_name, "queue": state["scheduler"].depth}

    def model_card() -> dict[str, Any]:
        info = pipeline.target.info
        meta = {"backend": pipeline.backend, "target": info.path, "n_ctx": info.n_ctx,
                "draft": pipeline.options.draft if pipeline.has_draft_model else None,
                "draft_method": settings.defaults.method, "aliases": list(settings.model_aliases)}  # fmt: skip
        return {"id": settings.model_name, "object": "model", "created": CREATED, "owned_by": "localspec", "meta": meta}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        """The openai client's models.retrieve(): the served model under its id or an alias, else a 404."""
        check_model_id(model_id, served)
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        req = await run_in_threadpool(chat_request, body, served)
        return await generation_response(request, req)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        req = await run_in_threadpool(completion_request, body, served)
        return await generation_response(request, req)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        tokens = await run_in_threadpool(pipeline.target.tokenize, body.content, add_special=body.add_special)
        return {"tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        detok = pipeline.target.detokenizer()
        return {"content": detok.add(body.tokens) + detok.flush()}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    def start_job(request: Request, req: GenerationRequest) -> tuple[Job, Callable[[], None]]:
        """Queue a job (503 when the queue is full) and cancel it if its client goes away; the callable
        returned ends both (a no-op once the job has finished). For the Messages routes."""
        scheduler = state["scheduler"]
        job = Job(req, asyncio.get_running_loop())
        scheduler.submit(job)
        watcher = asyncio.create_task(cancel_on_disconnect(request.receive, lambda: scheduler.cancel(job)))

        def end() -> None:
            watcher.cancel()
            scheduler.cancel(job)

        return job, end

    app.include_router(anthropic.messages_router(anthropic.MessagesService(served, settings.model_name, start_job,
                                                                           metrics)))  # fmt: skip

    async def generation_response(request: Request, req: GenerationRequest) -> Response:
        scheduler = state["scheduler"]
        job = Job(req, asyncio.get_running_loop())
        scheduler.submit(job)
        watcher = asyncio.create_task(cancel_on_disconnect(request.receive, lambda: scheduler.cancel(job)))
        ids = ResponseIds(req.endpoint, settings.model_name)
        if req.stream:
            return StreamingResponse(stream(job, ids, scheduler, watcher), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        reader = req.tools.parser() if req.tools else None  # the answer is read for tool calls
        try:
            while True:
                item = await job.next()
                if isinstance(item, APIError):
                    raise item
                if isinstance(item, str) and reader is not None:
                    reader.feed(item)
                    if reader.done:
                        job.stop.set()  # parallel_tool_calls false: nothing after the one call is wanted
                if isinstance(item, Outcome):
                    if reader is None:
                        return JSONResponse(with_warnings(full_response(ids, req.echo + item.text, item.finish_reason,
                                                                        item.stats, reasoning=item.reasoning),
                                                          req.notes))  # fmt: skip
                    reader.finish()
                    body = full_response(ids, "".join(reader.content), item.finish_reason, item.stats, reader.calls,
                                         item.reasoning)  # fmt: skip
                    return JSONResponse(with_warnings(body, warnings_of(req.notes, reader.calls, req.tools)))
        finally:
            watcher.cancel()
            scheduler.cancel(job)  # a no-op once it has finished

    async def stream(
        job: Job, ids: ResponseIds, scheduler: Scheduler, watcher: asyncio.Task[None]
    ) -> AsyncIterator[bytes]:
        usage = job.request.include_usage
        reader = job.request.tools.parser() if job.request.tools else None
        try:
            echo = job.request.echo  # /v1/completions' echo: the prompt is the first chunk's text
            first = chunk(ids, text=echo, include_usage=usage) if echo else chunk(ids, role=True, include_usage=usage)
            yield sse(first)
            while True:
                item = await job.next()
                if isinstance(item, str) and reader is not None:
                    for body in tool_chunks(ids, reader.feed(item), usage):
                        yield sse(body)
                    if reader.done:
                        job.stop.set()  # parallel_tool_calls false: nothing after the one call is wanted
                elif isinstance(item, str):
                    yield sse(chunk(ids, text=item, include_usage=usage))
                elif isinstance(item, ReasoningDelta):  # a reasoning model's thinking, before the content
                    yield sse(chunk(ids, reasoning=item.text, include_usage=usage))
                elif isinstance(item, APIError):
                    metrics.error(item.status)  # (a non-streamed error is counted by its handler)
                    yield sse(item.body())  # the stream ends with the error; the server serves on
                    break
                else:
                    finish = item.finish_reason
                    if reader is not None:
                        for body in tool_chunks(ids, reader.finish(), usage):
                            yield sse(body)
                        finish = calls_finish_reason(finish, reader.calls)
                    calls = reader.calls if reader is not None else []
                    last = chunk(ids, finish_reason=finish, stats=item.stats, include_usage=usage)
                    yield sse(with_warnings(last, warnings_of(job.request.notes, calls, job.request.tools)))
                    if usage:
                        yield sse(usage_chunk(ids, item.stats))
                    break
            yield sse("[DONE]")
        finally:
            watcher.cancel()
            scheduler.cancel(job)  # the client went away mid-stream: stop now (a no-op once finished)

    app.add_middleware(Guard, api_key=settings.api_key, max_body=settings.max_body_bytes, metrics=metrics)
    if settings.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["*"],
                           allow_headers=["*"])  # fmt: skip
    return app


CREATED = int(time.time())


def validation_error(e: RequestValidationError) -> APIError:
    errors = e.errors()
    first = errors[0] if errors else {}
    param = error_param(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(": "),
                        None, "invalid_json")  # fmt: skip
    if first.get("type") == "missing" and not param:
        return APIError(400, "the request needs a JSON body", None, "invalid_value")
    got = f", got {json.dumps(first['input'])[:40]}" if "input" in first and first.get("type") != "missing" else ""
    return APIError(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}{got}", param, "invalid_type")


def error_param(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """A validation error's location as OpenAI names a parameter (`messages[0].content`): field names
    and list indexes, without pydantic's `body` prefix and the union member tags (`str`, `list[int]`)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in FIELD_NAMES:
            out += f".{part}" if out else part
    return out or None


async def cancel_on_disconnect(receive: Receive, cancel: Callable[[], None]) -> None:
    """Wait for the client to go away (the body was read already, so the next message is the
    disconnect), then cancel its job."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel()
            return


class Guard:
    """Plain ASGI middleware in front of everything: the API key (compared in constant time) and the
    body size limit (413 before the app reads a byte more than the limit)."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body: int, metrics: Metrics) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body = max_body
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._needs_key(scope) and not self._authorized(scope):
            how = anthropic.KEY_HINT if anthropic.is_messages_path(scope["path"]) else KEY_HINT
            await self._refuse(send, APIError(401, f"Incorrect or missing API key: {how}", None, "invalid_api_key"),
                               scope)  # fmt: skip
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self._read_body(scope, receive)
            if body is None:
                await self._refuse(send, APIError(413, f"the request body is larger than {self.max_body:,} bytes "
                                                  "(the server's --max-body-bytes)", None, "request_too_large"),
                                   scope)  # fmt: skip
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def _needs_key(self, scope: Scope) -> bool:
        """A key is set, and this is no CORS preflight (browsers send those without one) nor an open path."""
        return self.api_key is not None and scope["method"] != "OPTIONS" and scope["path"] not in OPEN_PATHS

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        assert self.api_key is not None
        return hmac.compare_digest(given, self.api_key)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None once it passes the limit (a declared length says so before reading)."""
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return None
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk_ = message.get("body", b"")
            size += len(chunk_)
            if size > self.max_body:
                return None
            parts.append(chunk_)
            if not message.get("more_body", False):
                break
        return b"".join(parts)

    async def _refuse(self, send: Send, e: APIError, scope: Scope) -> None:
        self.metrics.error(e.status)
        body = json.dumps(anthropic.error_body(e) if anthropic.is_messages_path(scope["path"]) else e.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if e.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": e.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, receive: Receive) -> Callable[[], Awaitable[Message]]:
    """A receive that hands the app the body read already, then the client's later messages (disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
