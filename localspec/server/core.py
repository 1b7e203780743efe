"""The generation core under every protocol. An adapter (openai_routes.py, anthropic.py, responses_api.py) parses
its request into one GenerationRequest (requests.py), starts it here and renders the typed events this module
reads out of the job into its own wire format; nothing else about a generation differs between protocols.

    Core(served, model_name, metrics)      what every route shares; the app sets `scheduler` when it starts
    core.start(request, req) -> Run        the job queued (a 503 when the queue is full), cancelled if its
                                           client goes away
    run.events() -> AsyncIterator[Event]   the answer as it comes: ContentDelta, ReasoningDelta, and for a
                                           request that offered tools CallStart / ArgumentsDelta / CallEnd,
                                           then Finished (the outcome, content, calls, warnings) or Failed (an
                                           APIError)
    run.result() -> Finished               a non-streamed answer, whole (a failure raised as its APIError)
    run.close()                            stops the job (a no-op once it has finished): every route calls it
                                           in `finally`, so a client that goes away mid-stream stops the engine
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from localspec.decoding.stats import SpecStats
from localspec.server.errors import APIError
from localspec.server.metrics import Metrics
from localspec.server.notes import warnings_of
from localspec.server.reasoning import ReasoningDelta
from localspec.server.requests import GenerationRequest, Served
from localspec.server.scheduler import Job, Outcome
from localspec.server.tools import ArgumentsDelta, CallEnd, CallStart, ContentDelta, ToolCall, ToolEvent

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import Receive

    from localspec.server.scheduler import Scheduler


@dataclass(frozen=True)
class Finished:
    """How the answer ended: the outcome (finish reason, stats, the whole reasoning), the content sent (without
    the calls' text), the calls read out of it, and what the response says it did not do (notes.py: the
    request's fields not acted on, the calls' checks against their schemas), which every adapter renders."""

    outcome: Outcome
    text: str
    calls: list[ToolCall]
    warnings: list[str] = field(default_factory=list)

    @property
    def stats(self) -> SpecStats:
        return self.outcome.stats

    @property
    def finish_reason(self) -> str:
        return self.outcome.finish_reason

    @property
    def reasoning(self) -> str:
        return self.outcome.reasoning


@dataclass(frozen=True)
class Failed:
    """The generation could not run or went wrong; the stream ends with it."""

    error: APIError


Event = ContentDelta | ReasoningDelta | CallStart | ArgumentsDelta | CallEnd | Finished | Failed


class Run:
    """One queued job, read as events. The answer's text is read for tool calls when the request offered tools
    (tools.ToolStreamParser); with parallel_tool_calls false the job is stopped after its one call."""

    def __init__(self, job: Job, scheduler: Scheduler, metrics: Metrics, receive: Receive) -> None:
        self.job = job
        self.request = job.request
        self.scheduler = scheduler
        self.metrics = metrics
        self.reader = job.request.tools.parser() if job.request.tools else None
        self.watcher = asyncio.create_task(cancel_on_disconnect(receive, lambda: scheduler.cancel(job)))

    async def events(self) -> AsyncIterator[Event]:
        while True:
            item = await self.job.next()
            if isinstance(item, str):
                for event in self._text(item):
                    yield event
            elif isinstance(item, ReasoningDelta):  # a reasoning model's thinking, before the content
                yield item
            elif isinstance(item, APIError):
                if self.request.stream:  # (a non-streamed error is raised, and counted by the app's handler)
                    self.metrics.error(item.status)
                yield Failed(item)
                return
            else:
                for event in self.reader.finish() if self.reader is not None else []:
                    yield event
                yield self._finished(item)
                return

    async def result(self) -> Finished:
        async for event in self.events():
            if isinstance(event, Failed):
                raise event.error
            if isinstance(event, Finished):
                return event
        raise AssertionError("a job ended without an outcome")

    def close(self) -> None:
        self.watcher.cancel()
        self.scheduler.cancel(self.job)  # a no-op once it has finished

    def _text(self, text: str) -> list[ToolEvent]:
        if self.reader is None:
            return [ContentDelta(text)]
        events = self.reader.feed(text)
        if self.reader.done:
            self.job.stop.set()  # parallel_tool_calls false: nothing after the one call is wanted
        return events

    def _finished(self, outcome: Outcome) -> Finished:
        text = outcome.text if self.reader is None else "".join(self.reader.content)
        calls = [] if self.reader is None else list(self.reader.calls)
        return Finished(outcome, text, calls, warnings_of(self.request.notes, calls, self.request.tools))


@dataclass
class Core:
    """What every protocol's routes share: the requests' context, the served id, the error counters, and the
    scheduler (set by the app's lifespan)."""

    served: Served
    model_name: str
    metrics: Metrics
    scheduler: Scheduler | None = None

    def start(self, request: Request, req: GenerationRequest) -> Run:
        """Queue `req` (a 503 with Retry-After when the queue is full)."""
        assert self.scheduler is not None, "the app has not started"
        job = Job(req, asyncio.get_running_loop())
        self.scheduler.submit(job)
        return Run(job, self.scheduler, self.metrics, request.receive)


async def cancel_on_disconnect(receive: Receive, cancel: Callable[[], None]) -> None:
    """Wait for the client to go away (the body was read already, so the next message is the
    disconnect), then cancel its job."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel()
            return
