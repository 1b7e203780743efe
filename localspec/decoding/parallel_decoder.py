"""Several sequences decoded together (serve --parallel): one target pass verifies every sequence's draft.

Each sequence is an engine.Run, driven through its parts (begin, next_round, draft, settle, emit, finish), so it
is graded and rolled back with the same exact rule as a single run; only the target pass is shared. The draft
lengths come from decoding/parallel.plan_parallel on the measured T(n) of the whole batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from localspec.backends.base import Backend
from localspec.decoding.drafters import Drafter
from localspec.decoding.engine import Event, GenerationConfig, Run
from localspec.decoding.parallel import Candidate, plan_parallel
from localspec.decoding.policy import MODEL_PRIOR, Acceptance, CostModel
from localspec.decoding.stats import RoundStats, StopReason
from localspec.errors import Interrupted


class BatchTarget(Protocol):
    """A target holding several sequences (llama/multi.LlamaParallel, mlx/multi.MLXParallel in localspec/backends/):
    one pass appends each (sequence index, tokens) to its sequence and returns every position's logits rows per part.
    `pass_size(lengths)`: positions a pass over parts of these lengths computes (the sum, or rows x the
    longest for a right-padded batch, `pass_padded`); `prefill_apart`: prompt chunks are read in a forward of
    their own."""

    prefill_apart: bool
    pass_padded: bool

    def forward_many(
        self, parts: Sequence[tuple[int, Sequence[int]]], prefill: Sequence[tuple[int, Sequence[int]]] = ()
    ) -> list[np.ndarray]: ...

    def pass_size(self, lengths: Sequence[int]) -> int: ...


@dataclass(frozen=True)
class Job:
    """One sequence decoded in parallel: `seq` its index in the BatchTarget, `target` that sequence's own Backend
    (prompt passes, rollback)."""

    seq: int
    target: Backend
    drafter: Drafter
    prompt: Sequence[int]
    config: GenerationConfig
    stop: threading.Event | None = None
    model_drafts: bool = False  # its drafter may draft with a model, whose steps every sequence of the pass waits for


@dataclass(frozen=True)
class PassStats:
    """One shared target pass: how many sequences, how many tokens, what share of them were drafts."""

    n_sequences: int
    n_tokens: int
    n_drafted: int
    target_s: float

    @property
    def draft_share(self) -> float:
        return self.n_drafted / self.n_tokens if self.n_tokens else 0.0


@dataclass
class _Member:
    run: Run
    seq: int
    accept: Acceptance
    draft_token_s: float = 0.0
    model_drafts: bool = False  # Job.model_drafts


class ParallelDecoder:
    """Decodes several sequences together: each pass drafts for every active sequence (lengths from the
    parallel policy, decoding/parallel.py, on the measured T(n) of the whole batch), verifies all of them in one target
    pass, and grades and rolls back each sequence with the same exact rule as a single run.

    Keys name the sequences; `add` reads a prompt and returns its first events; `step` runs one shared pass
    and returns every sequence's events, a Done for each that ended (its sequence is then free).
    `planned=False` gives every sequence its full draft length (the fixed-k baseline).
    """

    def __init__(
        self,
        batch: BatchTarget,
        *,
        clock: Callable[[], float] = time.perf_counter,
        costs: CostModel | None = None,
        planned: bool = True,
    ) -> None:
        self.batch = batch
        self.clock = clock
        self.costs = costs or CostModel()
        self.planned = planned
        self.members: dict[object, _Member] = {}
        self.last_pass: PassStats | None = None

    def add(self, key: object, job: Job) -> list[Event]:
        if key in self.members:
            raise ValueError(f"sequence {key!r} is already decoding")
        run = Run(job.target, job.drafter, job.prompt, job.config, job.stop, self.clock)
        prior = self._draft_prior() if job.model_drafts else 0.0
        member = _Member(run, job.seq, Acceptance(MODEL_PRIOR), prior, job.model_drafts)
        events, reason = _collect(run.begin())
        if reason is not None:
            return events + list(run.finish(reason))
        self.members[key] = member
        return events

    def cancel(self, key: object) -> list[Event]:
        """End a sequence now (a disconnect): its Done says "stopped"."""
        member = self.members.pop(key, None)
        return [] if member is None else list(member.run.finish("stopped"))

    def step(self, prefill: Sequence[tuple[int, Sequence[int]]] = ()) -> list[tuple[object, Event]]:
        """One shared pass. `prefill`: (sequence index, prompt chunk) pairs of sequences not yet added, read in the same
        pass (BatchTarget.forward_many), so a long prompt does not stop the others' streams."""
        out: list[tuple[object, Event]] = []
        ready: dict[object, int] = {}
        for key, member in list(self.members.items()):
            reason, k = member.run.next_round()
            if reason is not None:
                out += [(key, e) for e in member.run.finish(reason)]
                del self.members[key]
            else:
                ready[key] = k if member.run.drafter.method != "none" else 0
        if not ready:
            if prefill:
                self.batch.forward_many([], prefill)
            return out
        lengths = self._lengths(ready)
        pending = {key: self.members[key].run.draft(lengths[key]) for key in ready}
        parts = [(self.members[key].seq, pending[key].batch) for key in ready]
        apart = self.batch.prefill_apart
        t0 = self.clock()
        try:
            rows = self.batch.forward_many(parts, prefill) if prefill and not apart else self.batch.forward_many(parts)
            seconds = self.clock() - t0
            if prefill and apart:
                self.batch.forward_many([], prefill)
        except Interrupted:
            for key in ready:
                self.members[key].run.drop_round()
                out += [(key, e) for e in self.members.pop(key).run.finish("stopped")]
            return out
        n_tokens = sum(len(p.batch) for p in pending.values())
        size = self.batch.pass_size([len(b) for _, b in parts])
        self.costs.observe_target(size + (0 if apart else sum(len(c) for _, c in prefill)), seconds)
        self.last_pass = PassStats(len(ready), n_tokens, n_tokens - len(ready), seconds)
        for (key, p), logits in zip(pending.items(), rows):
            member = self.members[key]
            step = member.run.settle(p, logits, t0)
            self._learn(member, step[2])
            events, reason = _collect(member.run.emit(step))
            out += [(key, e) for e in events]
            if reason is not None:
                out += [(key, e) for e in member.run.finish(reason)]
                del self.members[key]
        return out

    def _lengths(self, ready: dict[object, int]) -> dict[object, int]:
        """Each sequence's draft length this pass: its budget, or the parallel policy's share of it."""
        if not self.planned:
            return dict(ready)
        candidates = [self._candidate(self.members[key], k) for key, k in ready.items()]
        plan = plan_parallel(candidates, self.costs.target_s, self.batch.pass_size, padded=self.batch.pass_padded)
        return dict(zip(ready, plan.lengths))

    def _candidate(self, member: _Member, k: int) -> Candidate:
        """A sequence's prospects: its drafter's own forecast for the draft it has now where it makes one (auto:
        what its lookup would copy, at its learnt acceptance), else the acceptance its drafted rounds showed."""
        forecast = getattr(member.run.drafter, "forecast", None)  # optional (AutoDrafter)
        alphas = forecast(member.run.context, k) if forecast is not None and k > 0 else None
        return Candidate(tuple(alphas[:k]) if alphas else (member.accept.alpha,) * k, member.draft_token_s)

    def _draft_prior(self) -> float:
        """Seconds per model draft token before a sequence's own are measured: the remembered cost, else a
        quarter of T(1) (a cautious guess: free drafts would make the first passes stall every sequence)."""
        known = self.costs.draft_s()
        if known:
            return known
        t1 = self.costs.target_s(1)
        return 0.25 * t1 if t1 == t1 and t1 > 0 else 0.0  # NaN: nothing measured yet

    def _learn(self, member: _Member, stats: RoundStats) -> None:
        if stats.n_drafted == 0:
            return
        member.accept.update(stats.n_accepted, stats.n_drafted)
        if member.model_drafts:  # a lookup's draft costs ~nothing per token: only a model's steps are timed
            per = stats.draft_s / stats.n_drafted
            member.draft_token_s = (
                per if not member.draft_token_s else member.draft_token_s + 0.3 * (per - member.draft_token_s)
            )


def _collect(events: Iterator[Event]) -> tuple[list[Event], StopReason | None]:
    """A generator's events and its return value."""
    out: list[Event] = []
    while True:
        try:
            out.append(next(events))
        except StopIteration as done:
            return out, done.value
