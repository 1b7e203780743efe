"""The ASGI app: every protocol's routes (openai_routes.py, anthropic.py, responses_api.py) over one generation
core (core.py), errors in the shape of the protocol whose path was asked, the API key, the body limit and CORS.

create_app(pipeline, settings) -> FastAPI      the scheduler starts with the app and stops with it
"""

from __future__ import annotations

import hmac
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec.options import GenerationSettings
from localspec.pipeline import Pipeline
from localspec.server import anthropic, ollama, openai_routes, responses_api
from localspec.server.core import Core
from localspec.server.errors import APIError, ErrorShape
from localspec.server.metrics import Metrics
from localspec.server.reasoning import DEFAULT_FORMAT
from localspec.server.requests import Served
from localspec.server.response_store import ResponseStore
from localspec.server.scheduler import Scheduler

if TYPE_CHECKING:
    from localspec.server.parallel_scheduler import ParallelTarget

DEFAULT_MAX_BODY = 8 * 1024 * 1024
OPEN_PATHS = ("/", "/health")  # answered without the API key (load balancers, `curl` checks, HEAD /)
# Each protocol's error shape, by the paths it owns; OpenAI's for every other path.
SHAPES: tuple[ErrorShape, ...] = (anthropic.ERRORS, responses_api.ERRORS, ollama.ERRORS)


def error_shape(path: str, shapes: Sequence[ErrorShape] = SHAPES) -> ErrorShape:
    return next((shape for shape in shapes if shape.owns(path)), openai_routes.ERRORS)


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
    pipeline: Pipeline,
    settings: ServerSettings,
    parallel: ParallelTarget | None = None,
    draft_parallel: ParallelTarget | str | None = None,
) -> FastAPI:
    """`parallel` (serve --parallel N > 1): the target's sequences, where the requests decode together
    (parallel_scheduler.py); `draft_parallel`: the draft model's, one per sequence (or why there are none)."""
    metrics = Metrics()
    served = Served(
        pipeline,
        settings.defaults,
        (settings.model_name, *settings.model_aliases),
        reasoning_format=settings.reasoning_format,
        parallel=parallel is not None,
    )
    core = Core(served, settings.model_name, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if parallel is None:
            core.scheduler = Scheduler(pipeline, max_queue=settings.max_queue, metrics=metrics, log=settings.log)
        else:
            from localspec.server.parallel_scheduler import ParallelScheduler

            core.scheduler = ParallelScheduler(pipeline, parallel, max_queue=settings.max_queue, metrics=metrics,
                                               log=settings.log, draft_batch=draft_parallel)  # fmt: skip
        try:
            yield
        finally:
            await run_in_threadpool(core.scheduler.close)

    app = FastAPI(title="localspec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    # -- errors, in the shape of the protocol whose path was asked ---------------------------------------

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        metrics.error(e.status)
        settings.log(f"{request.method} {request.url.path} {e.status} · {e.message}")
        return JSONResponse(error_shape(request.url.path).body(e), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return await api_error(request, error_shape(request.url.path).invalid(e.errors()))

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

    # GET and HEAD / (a client's reachability check: Claude Code sends HEAD /, Ollama's clients read "Ollama is
    # running") are answered by the Ollama adapter's route.

    @app.get("/health")
    async def health() -> dict[str, Any]:
        assert core.scheduler is not None
        return {"status": "ok", "model": settings.model_name, "queue": core.scheduler.depth}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    app.include_router(openai_routes.openai_router(core))
    app.include_router(anthropic.messages_router(core))
    app.include_router(responses_api.responses_router(core, ResponseStore()))
    app.include_router(ollama.ollama_router(core, settings.log))

    app.add_middleware(Guard, api_key=settings.api_key, max_body=settings.max_body_bytes, metrics=metrics)
    if settings.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["*"],
                           allow_headers=["*"])  # fmt: skip
    return app


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
            how = error_shape(scope["path"]).key_hint
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
        body = json.dumps(error_shape(scope["path"]).body(e)).encode()
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
