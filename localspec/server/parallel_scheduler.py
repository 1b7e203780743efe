"""Several generations at once (`serve --parallel N`, N > 1): up to N requests decode together in one
parallel_decoder.ParallelDecoder over the target's parallel sequences, one sequence per request: a
LlamaParallel context on llama.cpp (localspec/backends/llama/multi.py), an MLXParallel batch on MLX
(localspec/backends/mlx/multi.py).

Each decoder step is one shared target pass: every running sequence's next token and draft (lengths from the
parallel policy, decoding/parallel.py, on the measured T(n) of the whole batch), and chunks of the prompts of
requests just admitted (at most n_batch/2 prompt tokens a step), so a long prompt does not freeze the others'
streams. Each sequence's text goes to its client through the same Reply as the one-at-a-time scheduler (stop
strings, reasoning split, stalled readers). A cancel or a stop string sets the job's stop event: the sequence
ends before the next pass and is free.

Sequences and prefix reuse: a sequence keeps its last conversation's tokens after the request ends. A new
request takes the free sequence whose cached tokens share the longest prefix with its prompt (a conversation's
next turn finds its own sequence while nobody else took it). When another sequence, busy or free, holds a
longer prefix of the prompt (the same system prompt and tools, a sibling agent's conversation), that prefix is
shared into the new one (llama.cpp: the unified KV cache's cells tagged with both sequence ids, nothing copied
or read; MLX: the rows copied in every layer, nothing read). Either way the request reads only the rest of its
prompt.

Drafters: lookup drafters (none, ngram, suffix) keep only their sequence's text, so every sequence gets its
own. The draft model has parallel sequences too (serve.open_draft_parallel: a second LlamaParallel context or
MLXParallel batch on the draft's weights), so `model` and `auto` get a drafter of their own over their
sequence's draft cache, which also keeps the conversation for its next turn; their draft steps run one sequence
after another, and the parallel policy weighs their measured cost per token. Where the draft model cannot
decode in parallel (recurrent layers), it serves one sequence at a time: the first request that asks for it gets
it, and requests that ask for it while it is taken draft by lookup instead (auto without its model for `auto`,
which keeps choosing lookups or none by their measured worth; n-gram lookup for the others: their stats say
`ngram`). Heads read the target's hidden states, which the parallel sequences do not capture: a head method is
refused under --parallel (serve.resolve_parallel, a 400 per request), and `auto` whose draft is a head drafts
without it.

A sequence whose drafter read the suffix memory (suffix, auto) writes its prompt and answer there when it
ends, as a single generation does; each keeps its own claim (SuffixMemory.take_claim).

While no request runs, auto's idle-time calibration (scheduler.py) times the target's cost curve on its own
context, one piece at a time; the sizes it timed become the decoder's T(n) where its passes have not measured
them, so a new server plans drafts for sizes it has not run yet from measurements, not a guess.

Requests waiting for a free sequence are the queue: its bound and the 503 are as in scheduler.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from localspec.backends.base import Backend, common_prefix
from localspec.backends.registry import releasing
from localspec.decoding.auto import idle_curve
from localspec.decoding.drafters import Drafter
from localspec.decoding.engine import Done, Event, Step
from localspec.decoding.parallel_decoder import BatchTarget, ParallelDecoder
from localspec.decoding.parallel_decoder import Job as SequenceJob
from localspec.decoding.policy import CostModel
from localspec.errors import ContextOverflowError, UsageError, error_text
from localspec.pipeline import Pipeline
from localspec.server.metrics import Metrics
from localspec.server.scheduler import Job, Reply, Scheduler

PER_SEQUENCE = ("none", "ngram", "suffix")  # drafters cheap enough to make one per sequence
BUSY_FALLBACK = "ngram"  # what a sequence drafts with while another holds the model drafter it asked for


class ParallelTarget(BatchTarget, Protocol):
    """The target's parallel sequences (LlamaParallel, MLXParallel): each a Backend of its own, sharing one batch."""

    sequences: list[Backend]  # type: ignore[misc]
    n_batch: int

    def share(self, src: int, dst: int, n: int) -> None: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class _Seat:
    """An admitted request: its sequence, its prompt and how much of it the sequence holds, its drafter."""

    job: Job
    seq: int
    prompt: list[int]
    fed: int  # prompt tokens in the sequence's cache
    cached: int  # of those, reused from the sequence's earlier conversation
    reply: Reply
    drafter: Drafter
    lent: str | None  # the shared drafter's method it holds (None: its own drafter)
    t0: float
    started: bool = False  # added to the decoder (its first token is out)
    prompt_s: float = 0.0
    remember: Callable[[str], None] | None = None  # its drafter read the suffix memory: its text goes there
    model_drafts: bool = False  # its drafter may draft with a model (its steps cost every sequence of a pass)


class ParallelScheduler(Scheduler):
    def __init__(
        self, pipeline: Pipeline, batch: ParallelTarget, *, max_queue: int, metrics: Metrics,
        log: Callable[[str], None] = print, draft_batch: ParallelTarget | str | None = None,
    ) -> None:  # fmt: skip
        self.batch = batch
        self.n_sequences = len(batch.sequences)
        self.draft_batch = draft_batch if not isinstance(draft_batch, str) else None
        if isinstance(draft_batch, str):
            log(f"note: the draft model drafts for one request at a time ({draft_batch}); the others look up")
        if pipeline.draft_slot.available and not pipeline.draft_note:
            pipeline.draft_slot.get()  # now, not inside a pass that every running sequence would wait for
        self.decoder = ParallelDecoder(batch, costs=_prior_costs(pipeline))
        self._head_unused = bool(pipeline.options.auto_head) and not pipeline.draft_note
        if self._head_unused:
            log(
                f"note: auto drafts without its {pipeline.options.auto_head} head here: a head reads the target's "
                "hidden states, which the sequences of --parallel do not capture (serve with --parallel 1 to use it)"
            )
        self._seats: dict[Job, _Seat] = {}
        self._lent: set[str] = set()
        self._prefill_budget = max(1, batch.n_batch // 2)
        super().__init__(pipeline, max_queue=max_queue, metrics=metrics, log=log)

    @property
    def depth(self) -> int:
        with self._cv:
            return len(self._waiting) + len(self._seats)

    def _full(self) -> bool:
        return len(self._waiting) >= self.max_queue + self.n_sequences - len(self._seats)

    def close(self, timeout: float = 10.0) -> None:
        super().close(timeout)
        if not self._thread.is_alive():
            self.batch.close()
            if self.draft_batch is not None:
                self.draft_batch.close()

    # -- the engine thread --------------------------------------------------------------------------

    @releasing
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._seats and not self._closed and self._idle is None:
                    self._cv.wait()
                if self._closed:
                    if not self._seats:
                        return
                    for seat in self._seats.values():  # shutting down: each ends before the next pass
                        seat.job.cancelled = True
                        seat.job.stop.set()
                self._admit()
                idle = not self._seats and self._idle is not None
            if idle:
                self._idle_piece()
                continue
            try:
                self._tick()
            except Exception as e:  # noqa: BLE001 - a failed pass (a full KV cache) ends the running requests, not the server
                self._fail_all(e)

    def _idle_done(self) -> None:
        self._adopt_curve()

    def _adopt_curve(self) -> None:
        """After idle-time calibration (auto's, on the target's own context while no request runs): the sizes
        it timed that the decoder's passes have not, as the decoder's T(n) prior (in the decoder's scale). Timings
        a busy machine spread too widely to remember still serve here: every pass refines them."""
        timed, _ = idle_curve(self.pipeline.drafter)
        costs = self.decoder.costs
        for n, seconds in sorted(timed.items()):
            if n not in costs.target:
                costs.target[n] = seconds / costs.scale

    def _admit(self) -> None:
        """Waiting jobs into free sequences, oldest first (the caller holds the lock)."""
        while self._waiting and len(self._seats) < self.n_sequences and not self._closed:
            job = self._waiting.popleft()
            try:
                seat = self._seat(job)
            except Exception as e:  # noqa: BLE001 - this request's mistake or failure, told to its client
                self._failed(job, e)
                continue
            self._seats[job] = seat
        self.metrics.waiting.set(len(self._waiting))
        self.metrics.running.set(len(self._seats))

    def _seat(self, job: Job) -> _Seat:
        prompt = self.pipeline.prompt_tokens(job.request.prompt)
        n_ctx = self.batch.sequences[0].n_ctx
        if not prompt:
            raise UsageError("the prompt is empty", "give the model some text to continue")
        if len(prompt) >= n_ctx:  # refused here, before its chunks share a pass with the others
            raise ContextOverflowError(f"the prompt is {len(prompt):,} tokens but a sequence's context holds {n_ctx:,}",
                                       "raise --n-ctx (memory permitting) or shorten the prompt")  # fmt: skip
        seq = self._best_sequence(prompt)
        keep = self._reuse(seq, prompt)
        drafter, lent, models = self._seat_drafter(job.request.method, seq)
        return _Seat(job, seq, prompt, keep, keep, Reply(job, self.cancel), drafter, lent, time.perf_counter(),
                     model_drafts=models)  # fmt: skip

    def _best_sequence(self, prompt: list[int]) -> int:
        """The free sequence whose cache shares the longest prefix with the prompt (the emptiest on a tie)."""
        taken = {seat.seq for seat in self._seats.values()}
        free = [i for i in range(self.n_sequences) if i not in taken]
        cached = {i: self.batch.sequences[i].cached_tokens for i in free}
        return max(free, key=lambda i: (common_prefix(cached[i], prompt, limit=len(prompt)), -len(cached[i])))

    def _reuse(self, seq: int, prompt: list[int]) -> int:
        """Keep the longest cached prefix of the prompt in `seq`: its own, or a longer one another sequence (busy or
        not) holds, shared into it (LlamaParallel.share). How many prompt tokens it then holds."""
        limit = len(prompt) - 1  # the last prompt token is read for its logits
        own = common_prefix(self.batch.sequences[seq].cached_tokens, prompt, limit=limit)
        held = {i: s.cached_tokens for i, s in enumerate(self.batch.sequences) if i != seq}
        others = {i: common_prefix(tokens, prompt, limit=limit) for i, tokens in held.items()}
        donor = max(others, key=lambda i: others[i], default=None)
        if donor is not None and others[donor] > own:
            self.batch.share(donor, seq, others[donor])
            return others[donor]
        self.batch.sequences[seq].rollback(own)
        return own

    def _seat_drafter(self, method: str, seq: int) -> tuple[Drafter, str | None, bool]:
        """(the drafter, the shared drafter's method it was lent or None, whether it may draft with a model)."""
        if method in PER_SEQUENCE:
            return self.pipeline.new_drafter(method), None, False
        if method == "auto" and self._head_unused:  # a head reads hidden states the sequences do not capture
            return self.pipeline.new_drafter("auto", lookup_only=True), None, False
        if self.draft_batch is not None and method in ("model", "auto"):
            # auto starts from its lookups (nearly free) and loads its draft sequence when it wants model drafts: its
            # cost per token is learnt, not assumed; `model` drafts with the model from its first round
            return self.pipeline.new_drafter(method, draft=self.draft_batch.sequences[seq]), None, method == "model"
        if method in self._lent:  # auto adapts its lookups alone; anything else looks up n-grams
            busy = self.pipeline.new_drafter("auto", lookup_only=True) if method == "auto" else None
            return busy or self.pipeline.new_drafter(BUSY_FALLBACK), None, False
        drafter = self._drafter(method)
        self._lent.add(method)
        return drafter, method, True

    def _tick(self) -> None:
        """Start the seats whose prompts are read (one alone reads its prompt whole); one shared pass with the
        next chunks of the others' prompts (several arriving together are read together)."""
        chunks: list[tuple[int, list[int]]] = []
        unstarted = [s for s in self._seats.values() if not s.started]
        alone = not self.decoder.members and len(unstarted) == 1  # nobody to share a pass with: read it whole
        budget = self._prefill_budget if self.decoder.members else self.batch.n_batch  # nobody's stream to stall
        for seat in unstarted:
            if seat.job.stop.is_set():
                self._release(seat)
                continue
            rest = len(seat.prompt) - 1 - seat.fed
            if rest <= 0 or alone:
                self._start(seat)
            elif budget > 0:
                n = min(rest, budget)
                chunks.append((seat.seq, seat.prompt[seat.fed : seat.fed + n]))
                budget -= n
        if not self.decoder.members and not chunks:
            return
        before = self.decoder.last_pass
        events = self.decoder.step(chunks)
        by_seq = {s.seq: s for s in self._seats.values()}
        for seq, chunk in chunks:
            by_seq[seq].fed += len(chunk)
        if self.decoder.last_pass is not None and self.decoder.last_pass is not before:
            self.metrics.passed(self.decoder.last_pass)
        for key, event in events:
            self._handle(self._seats[key], event)  # type: ignore[index]

    def _start(self, seat: _Seat) -> None:
        req = seat.job.request
        target = self.batch.sequences[seat.seq]
        job = SequenceJob(seat.seq, target, seat.drafter, seat.prompt, req.config, seat.job.stop,
                          model_drafts=seat.model_drafts)  # fmt: skip
        seat.started = True
        memory = self.pipeline.memory
        if memory is not None:
            memory.release()
        try:
            events = self.decoder.add(seat.job, job)  # the drafter's prepare may claim the memory
        except Exception as e:  # noqa: BLE001 - this request's failure (a prompt too long for its sequence)
            self._failed(seat.job, e)
            self._release(seat)
            return
        finally:
            seat.remember = memory.take_claim() if memory is not None else None
        seat.prompt_s = time.perf_counter() - seat.t0
        for event in events:
            self._handle(seat, event)

    def _handle(self, seat: _Seat, event: Event) -> None:
        if isinstance(event, Step):
            seat.reply.feed(event.text)
            return
        assert isinstance(event, Done)
        self._remember(seat, event)
        stats = replace(event.stats, n_prompt_cached=seat.cached, prompt_s=seat.prompt_s)
        outcome = seat.reply.finish(replace(event, stats=stats))
        self._release(seat)
        self._succeeded(seat.job, outcome)

    def _remember(self, seat: _Seat, done: Done) -> None:
        """The prompt and answer into the suffix memory, as a single generation's (pipeline._remembered)."""
        memory, seen = self.pipeline.memory, seat.remember
        if memory is not None and seen is not None:
            name = memory.remember([*seat.prompt, *done.tokens])
            if name is not None:
                seen(name)

    def _release(self, seat: _Seat) -> None:
        """The seat's sequence and drafter are free again (a cancelled job is owed no answer)."""
        self.decoder.cancel(seat.job)
        with self._cv:
            self._seats.pop(seat.job, None)
            self.metrics.running.set(len(self._seats))
            self._recent_s.append((time.perf_counter() - seat.t0) / self.n_sequences)
            if seat.job.cancelled and not seat.job.finished:
                seat.job.finished = True  # its client is gone: nothing to tell
        if seat.lent is not None:
            self._lent.discard(seat.lent)
        else:
            seat.drafter.close()

    def _fail_all(self, e: Exception) -> None:
        self.log(f"a shared pass failed: {error_text(e)}; its {len(self._seats)} requests end")
        for seat in list(self._seats.values()):
            self._release(seat)
            if not seat.job.finished:
                self._failed(seat.job, e)
        self.decoder = ParallelDecoder(self.batch, costs=self.decoder.costs)


def _prior_costs(pipeline: Pipeline) -> CostModel:
    """The target's measured costs, if an earlier run kept them (T(n) of the whole batch, refined each pass)."""
    try:
        return pipeline.cost_store.load() or CostModel()
    except (OSError, ValueError):
        return CostModel()
