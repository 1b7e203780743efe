"""OpenAI's Chat Completions and Completions (and llama-server's /tokenize, /detokenize) over the generation
core: a body becomes a GenerationRequest (requests.chat_request / completion_request), and the core's events
become a response body or the stream's chunks (responses.py).

    openai_router(core) -> APIRouter     the routes, mounted by app.create_app
    ERRORS                               OpenAI's error shape, for every path no other protocol owns
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from localspec.server.core import Core, Failed, Finished, Run
from localspec.server.errors import APIError, ErrorShape
from localspec.server.notes import with_warnings
from localspec.server.reasoning import ReasoningDelta
from localspec.server.requests import GenerationRequest, chat_request, check_model_id, completion_request
from localspec.server.responses import (
    ResponseIds,
    calls_finish_reason,
    chunk,
    full_response,
    sse,
    tool_chunks,
    usage_chunk,
)
from localspec.server.schemas import (
    FIELD_NAMES,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from localspec.server.tools import ArgumentsDelta, CallStart, ContentDelta

KEY_HINT = "send it as `Authorization: Bearer KEY`"
ERRORS = ErrorShape("", APIError.body, KEY_HINT, FIELD_NAMES)
CREATED = int(time.time())
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def openai_router(core: Core) -> APIRouter:
    router = APIRouter()
    pipeline = core.served.pipeline

    def model_card() -> dict[str, Any]:
        info = pipeline.target.info
        meta = {"backend": pipeline.backend, "target": info.path, "n_ctx": info.n_ctx,
                "draft": pipeline.options.draft if pipeline.has_draft_model else None,
                "draft_method": core.served.defaults.method, "aliases": list(core.served.model_ids[1:])}  # fmt: skip
        return {"id": core.model_name, "object": "model", "created": CREATED, "owned_by": "localspec", "meta": meta}

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        """The openai client's models.retrieve(): the served model under its id or an alias, else a 404."""
        check_model_id(model_id, core.served)
        return model_card()

    @router.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        req = await run_in_threadpool(chat_request, body, core.served)
        return await generation_response(core, request, req)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        req = await run_in_threadpool(completion_request, body, core.served)
        return await generation_response(core, request, req)

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        tokens = await run_in_threadpool(pipeline.target.tokenize, body.content, add_special=body.add_special)
        return {"tokens": tokens}

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        detok = pipeline.target.detokenizer()
        return {"content": detok.add(body.tokens) + detok.flush()}

    return router


async def generation_response(core: Core, request: Request, req: GenerationRequest) -> Response:
    run = core.start(request, req)
    ids = ResponseIds(req.endpoint, core.model_name)
    if req.stream:
        return StreamingResponse(stream(run, ids), media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        done = await run.result()
    finally:
        run.close()
    body = full_response(ids, req.echo + done.text, done.finish_reason, done.stats, done.calls, done.reasoning)
    return JSONResponse(with_warnings(body, done.warnings))


async def stream(run: Run, ids: ResponseIds) -> AsyncIterator[bytes]:
    usage = run.request.include_usage
    try:
        echo = run.request.echo  # /v1/completions' echo: the prompt is the first chunk's text
        yield sse(chunk(ids, text=echo, include_usage=usage) if echo else chunk(ids, role=True, include_usage=usage))
        async for event in run.events():
            if isinstance(event, ContentDelta):
                yield sse(chunk(ids, text=event.text, include_usage=usage))
            elif isinstance(event, CallStart | ArgumentsDelta):
                for body in tool_chunks(ids, [event], usage):
                    yield sse(body)
            elif isinstance(event, ReasoningDelta):  # a reasoning model's thinking, before the content
                yield sse(chunk(ids, reasoning=event.text, include_usage=usage))
            elif isinstance(event, Failed):
                yield sse(event.error.body())  # the stream ends with the error; the server serves on
            elif isinstance(event, Finished):
                finish = calls_finish_reason(event.finish_reason, event.calls)
                last = chunk(ids, finish_reason=finish, stats=event.stats, include_usage=usage)
                yield sse(with_warnings(last, event.warnings))
                if usage:
                    yield sse(usage_chunk(ids, event.stats))
        yield sse("[DONE]")
    finally:
        run.close()  # the client went away mid-stream: stop now (a no-op once finished)
