"""One model, one generation at a time: a worker thread takes requests from a bounded FIFO queue and
runs them through the pipeline, handing text to the request's coroutine without ever waiting on it.

Cancelling a job (its client went away, or stopped reading for STALL_S) sets its stop event (the
engine ends after the round in flight) and aborts the forward pass in flight, so the next request
starts within one round. The KV caches stay as the last generation left them: the next request that
shares a prefix with it (a conversation's next turn) evaluates only its new tokens.

While no request waits, the same thread times auto's cost curve where it has none yet
(decoding.auto.idle_work), one piece (a pair of forward passes) at a time, checking the queue between
pieces: a request that arrives meanwhile starts once the piece in flight ends.

`Reply` is one job's text on its way out (reasoning split, stop strings, stalls); parallel_scheduler.py uses it
too, for `serve --parallel N`, where several jobs decode together.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from localspec.backends.registry import releasing
from localspec.decoding.auto import idle_curve, idle_work
from localspec.decoding.drafters import Drafter
from localspec.decoding.engine import Done
from localspec.decoding.stats import SpecStats
from localspec.errors import Interrupted, LocalspecError, error_text
from localspec.pipeline import Pipeline
from localspec.server.errors import APIError, from_exception
from localspec.server.metrics import Metrics
from localspec.server.reasoning import ReasoningDelta, Split
from localspec.server.requests import GenerationRequest
from localspec.server.responses import FINISH_REASONS
from localspec.server.stops import StopMatcher

STALL_S = 30.0  # a client that reads nothing for this long while text waits for it is treated as gone


@dataclass
class Outcome:
    """How a generation ended: the text sent, the finish reason, the run's stats."""

    text: str
    finish_reason: str  # "stop" | "length" | "cancelled"
    stats: SpecStats
    ttft_s: float  # from the request reaching the engine to its first text
    stop_string: str | None = None  # the request's stop string that ended it, if one did
    reasoning: str = ""  # the thinking split from the answer (reasoning.py); `text` is the content only


# What a job's channel carries: content deltas (str) and reasoning deltas, then an Outcome or an error.
Item = str | ReasoningDelta | Outcome | APIError


@dataclass(eq=False)
class Job:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    channel: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)
    stop: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    finished: bool = False  # its last item (Outcome or error) is on the way: nothing left to cancel
    pushed: int = 0  # items the engine put in the channel (engine thread only)
    read: int = 0  # items the request took out (event loop only)
    last_read: float = 0.0  # when the request last took one out
    backlog_since: float = 0.0  # when an item was pushed into an empty channel

    def push(self, item: Item) -> None:
        """From the engine thread: never blocks, whatever the client does."""
        if self.pushed == self.read:
            self.backlog_since = time.monotonic()
        self.pushed += 1
        try:
            self.loop.call_soon_threadsafe(self.channel.put_nowait, item)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
            self.cancelled = True

    async def next(self) -> Item:
        item = await self.channel.get()
        self.read += 1
        self.last_read = time.monotonic()
        return item

    def stalled(self, now: float) -> bool:
        """Text has waited unread for STALL_S (a long prompt pass before the first token is no stall)."""
        return self.pushed > self.read and now - max(self.last_read, self.backlog_since) > STALL_S


class Scheduler:
    def __init__(
        self, pipeline: Pipeline, *, max_queue: int, metrics: Metrics, log: Callable[[str], None] = print
    ) -> None:
        self.pipeline = pipeline
        self.max_queue = max_queue
        self.metrics = metrics
        self.log = log
        self._drafters: dict[str, Drafter] = {pipeline.options.draft_method: pipeline.drafter}
        self._waiting: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._current: Job | None = None
        self._closed = False
        self._recent_s: collections.deque[float] = collections.deque(maxlen=8)  # for Retry-After
        self._idle = idle_work(pipeline.drafter)  # auto's calibration between requests (None: nothing to time)
        self.idle_pieces = 0  # pieces of it run so far
        self._thread = threading.Thread(target=self._loop, name="localspec-serve-engine", daemon=True)
        self._thread.start()

    # -- from the event loop ------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue a job, or refuse it with 503 and Retry-After when max_queue requests already wait."""
        with self._cv:
            if self._closed:
                raise APIError(503, "the server is shutting down", None, "shutting_down")
            if self._full():
                retry = self._retry_after()
                raise APIError(503, f"the server is busy: {len(self._waiting)} requests are waiting "
                               f"(--max-queue {self.max_queue}); retry in about {retry} s",
                               None, "queue_full", {"Retry-After": str(retry)})  # fmt: skip
            self._waiting.append(job)
            self.metrics.waiting.set(len(self._waiting))
            self._cv.notify()

    def _full(self) -> bool:
        """No room for another request: one generates and max_queue wait (the caller holds the lock)."""
        busy = self._current is not None or bool(self._waiting)
        return busy and len(self._waiting) >= self.max_queue

    def cancel(self, job: Job) -> None:
        """Stop a job at once: dropped from the queue, or its generation aborted mid-pass."""
        with self._cv:
            if job.finished:
                return
            job.cancelled = True
            job.stop.set()
            if self._current is job:
                self.pipeline.abort()
            elif job in self._waiting:
                self._waiting.remove(job)
                self.metrics.waiting.set(len(self._waiting))
                job.finished = True
                job.push(APIError(499, "the client closed the request while it waited", None, "cancelled"))

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._closed = True
            for job in self._waiting:
                job.push(APIError(503, "the server is shutting down", None, "shutting_down"))
            self._waiting.clear()
            current = self._current
            self._cv.notify_all()
        if current is not None:
            self.cancel(current)
        self._thread.join(timeout)
        for drafter in self._drafters.values():
            if drafter is not self.pipeline.drafter:
                drafter.close()

    @property
    def depth(self) -> int:
        with self._cv:
            return len(self._waiting) + (self._current is not None)

    # -- the engine thread --------------------------------------------------------------------------

    @releasing
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closed and self._idle is None:
                    self._cv.wait()
                if self._closed:
                    return
                self.pipeline.abort(False)  # re-arm after a cancelled job's abort
                job = self._waiting.popleft() if self._waiting else None
                if job is not None:
                    self._current = job
                    self.metrics.waiting.set(len(self._waiting))
                    self.metrics.running.set(1)
            if job is None:
                self._idle_piece()
                continue
            t0 = time.perf_counter()
            try:
                self._run(job)
            finally:
                with self._cv:
                    self._current = None
                    self.metrics.running.set(0)
                    self._recent_s.append(time.perf_counter() - t0)
            if self._idle is None:  # a remembered curve the answer contradicted is timed again meanwhile
                self._idle = idle_work(self.pipeline.drafter)

    def _idle_piece(self) -> None:
        """One piece of idle-time calibration; the idle work ends when it wants no more, or fails."""
        assert self._idle is not None
        try:
            more = self._idle()
            self.idle_pieces += 1
        except Exception as e:  # noqa: BLE001 - timing passes must never take the server down
            self.log(f"auto: idle calibration stopped: {error_text(e)}")
            more = False
        if not more:
            self._idle_done()
            self._idle = None  # last: whoever sees no idle work pending sees what it left
            _, unstored = idle_curve(self.pipeline.drafter)
            note = f"; not remembered: {unstored}" if unstored else ""
            self.log(f"auto: cost curve timed between requests ({self.idle_pieces} pairs of passes so far{note})")

    def _idle_done(self) -> None:
        """What the idle work leaves behind, taken up before it is said to be over (nothing here)."""

    def _run(self, job: Job) -> None:
        try:
            outcome = self._generate(job)
        except Exception as e:  # noqa: BLE001 - an engine bug must not take the server down: tell this client
            self._failed(job, e)
            return
        self._succeeded(job, outcome)

    def _succeeded(self, job: Job, outcome: Outcome) -> None:
        with self._cv:
            job.finished = True
        self.metrics.finished(outcome.stats, outcome.finish_reason)
        self.log(request_line(job.request, outcome))
        job.push(outcome)

    def _failed(self, job: Job, e: Exception) -> None:
        """Tell the client why its generation could not run or went wrong (errors.from_exception says how)."""
        job.finished = True
        if isinstance(e, LocalspecError) and job.cancelled:
            return  # Interrupted before any token counts as a cancel, not an error
        refused = isinstance(e, APIError)  # the request asked for what cannot run here (a drafter that cannot be built)
        self.log(f"{job.request.endpoint} {'refused' if refused else 'failed'}: "
                 f"{e.message if isinstance(e, APIError) else error_text(e)}")  # fmt: skip
        job.push(from_exception(e))

    def _generate(self, job: Job) -> Outcome:
        reply = Reply(job, self.cancel)
        drafter = self._drafter(job.request.method)
        for event in self.pipeline.generate(job.request.prompt, job.request.config, stop=job.stop, drafter=drafter):
            if isinstance(event, Done):
                return reply.finish(event)
            reply.feed(event.text)
        raise AssertionError("the engine ended without a Done")

    def _drafter(self, method: str) -> Drafter:
        """The drafter a request asked for, built on first use. A method the loaded models cannot draft with
        is the request's mistake (400, not 500): requests.check_method refuses it from the headers, and this
        covers what only building finds out (a head file that does not load)."""
        if method not in self._drafters:
            try:
                self._drafters[method] = self.pipeline.new_drafter(method)
            except Interrupted:
                raise
            except LocalspecError as e:
                raise APIError(400, f"speculative.method {method} cannot draft on this server: {error_text(e)}",
                               "speculative.method", "invalid_value") from None  # fmt: skip
        return self._drafters[method]

    def _retry_after(self) -> int:
        mean = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 1.0
        return max(1, math.ceil(mean * (len(self._waiting) + 1)))


class Reply:
    """One job's text on its way to the client: reasoning split off, stop strings held back and matched,
    a stalled reader cancelled. The one-at-a-time and the parallel schedulers both stream through it."""

    def __init__(self, job: Job, cancel: Callable[[Job], None]) -> None:
        self.job = job
        self.cancel = cancel
        self.matcher = StopMatcher(job.request.stops)
        self.splitter = job.request.reasoning.splitter() if job.request.reasoning is not None else None
        self.t0 = time.perf_counter()
        self.ttft: float | None = None

    def feed(self, new_text: str) -> None:
        """A step's new text: pushed as far as no stop string may still begin in it."""
        job = self.job
        piece = self.splitter.feed(new_text) if self.splitter is not None else Split(content=new_text)
        if piece.reasoning:  # the thinking first, apart; stop strings apply to the content only
            self._first_text()
            job.push(ReasoningDelta(piece.reasoning))
        text = self.matcher.feed(piece.content)
        if text:
            self._first_text()
            job.push(text)
        if self.matcher.hit:
            job.stop.set()  # the engine checks it before the next round: nothing more is computed
        if job.stalled(time.monotonic()):
            self.cancel(job)

    def finish(self, done: Done) -> Outcome:
        """The held-back tail pushed; how the generation ended."""
        job, matcher, splitter = self.job, self.matcher, self.splitter
        last = splitter.finish() if splitter is not None and not matcher.hit else Split()
        if last.reasoning:
            job.push(ReasoningDelta(last.reasoning))
        tail = matcher.feed(last.content) + matcher.flush()
        if tail:
            job.push(tail)
        if job.cancelled:
            reason = "cancelled"
        elif matcher.hit:
            reason = "stop"
        else:
            reason = FINISH_REASONS.get(done.stats.stop_reason or "stopped", "stop")
        ttft_s = self.ttft if self.ttft is not None else time.perf_counter() - self.t0
        reasoning = "".join(splitter.reasoning) if splitter is not None else ""
        return Outcome(matcher.text, reason, done.stats, ttft_s, matcher.matched if reason == "stop" else None,
                       reasoning)  # fmt: skip

    def _first_text(self) -> None:
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.t0


def request_line(req: GenerationRequest, o: Outcome) -> str:
    """The one log line per request: what ran, how fast, how well the drafts did."""
    s = o.stats
    spec = ""
    if s.n_drafted:
        spec = f" · acceptance {s.acceptance_rate:.0%}, {s.mean_accepted_length:.2f} tokens/pass"
    choices = f" · {s.choices()}" if s.draft_method == "auto" and s.choices() else ""
    return (
        f"POST {req.path or ('/v1/chat/completions' if req.endpoint == 'chat' else '/v1/completions')}"
        f"{' (stream)' if req.stream else ''} · prompt {s.n_prompt} ({s.n_prompt_cached} cached, "
        f"{s.prompt_s * 1000:.0f} ms; first text after {o.ttft_s * 1000:.0f} ms) · "
        f"{s.n_generated} tokens at {s.decode_tps:.1f} tok/s · "
        f"{s.draft_method}{spec}{choices} · {o.finish_reason}"
    )
