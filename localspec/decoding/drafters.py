"""Drafters: who writes the k tokens ahead. A draft model, n-gram prompt lookup, or nobody.

Every drafter implements the Drafter protocol; the engine and the auto drafter use nothing else.
A drafter owns its own state (a model drafter its draft model's cache) and brings it in line with
the committed context itself, through backends.base.sync_cache.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, cast

import numpy as np

from localspec.backends.base import Backend, DrawsInPass, common_prefix, rewind, sync_cache, sync_cache_top2
from localspec.backends.registry import draws_in_pass, picks_top2
from localspec.decoding.stats import RoundStats
from localspec.draft import EMPTY_DRAFT, Draft, sample_draft
from localspec.sampling import SamplingParams
from localspec.softmax_rows import Row, SoftmaxRows, SparseRow

# A draft drawn where its model runs comes from the softmax of its row's best DRAFT_TOP_K logits (at the run's
# temperature): the exact rule holds for any draft distribution it is given, and this one comes back as k numbers
# a token instead of a whole row (llama.cpp's own speculative example drafts from the top 10). The tokens it drops
# carry the draft's least likely guesses, the ones the target rejects most.
DRAFT_TOP_K = 64


class Drafter(Protocol):
    method: str  # "model" | "ngram" | "none" | "auto"
    name: str

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        """A new generation starts from `context` (the prompt) and drafts at most max_k per round."""
        ...

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        """Up to k tokens continuing `context` (every token committed so far). Drafters that sample stop
        before a token whose own probability is below min_confidence (llama.cpp's p_min)."""
        ...

    def observe(self, stats: RoundStats) -> None:
        """What the round made of the last proposal (adaptive drafters learn from it)."""
        ...

    def lag(self, context: Sequence[int]) -> int:
        """Tokens of `context` this drafter would first have to take in before drafting (0: none)."""
        ...

    def catch_up(self, context: Sequence[int]) -> None:
        """Take in what `lag` counts now, in one batch (auto calls it after rounds it drafted without us)."""
        ...

    def close(self) -> None:
        """Free the drafter's own state. Models it was given stay open: the pipeline owns them."""
        ...


class Stateless:
    """Defaults for drafters without a cache of their own."""

    def observe(self, stats: RoundStats) -> None:
        pass

    def lag(self, context: Sequence[int]) -> int:
        return 0

    def catch_up(self, context: Sequence[int]) -> None:
        pass

    def close(self) -> None:
        pass


class NoDrafter(Stateless):
    """Plain decoding through the same engine path: the baseline every speedup is measured against."""

    method = "none"
    name = "none"

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        pass

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        return EMPTY_DRAFT


# llama-lookup's thresholds for its context cache (common/ngram-cache.cpp, the "lax" set), by n-gram
# length 1..4: how often the n-gram must have been seen, and the share its most frequent continuation
# must hold, before that continuation is drafted. Longer n-grams use the 4-gram values.
LAX_MIN_COUNT = (2, 2, 1, 1)
LAX_MIN_SHARE = (0.66, 0.5, 0.5, 0.5)


class NgramDrafter(Stateless):
    """Prompt lookup over the context's own n-grams (n = max_ngram down to min_ngram).

    Gated (the `ngram` method): as llama-lookup drafts from its context cache, each draft token is the
    most frequent continuation of the longest n-gram ending the text so far (the draft included) whose
    statistics are strong enough (LAX_MIN_COUNT, LAX_MIN_SHARE); the draft ends where none is, so a
    weak match (a pair seen once, a word with many different continuations) proposes nothing and costs
    no wider verify. Ungated: copy what followed the latest occurrence of the longest matching n-gram.

    The index grows incrementally with the context, so a round costs O(new tokens + k * max_ngram).
    """

    method = "ngram"
    name = "ngram"

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1, gate: bool = False) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.gate = gate
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> position right after its latest occurrence
        self._next: dict[tuple[int, ...], dict[int, int]] = {}  # n-gram -> continuation token -> count
        self._n_indexed = 0  # the context is append-only within a generation; this much is indexed

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self._index.clear()
        self._next.clear()
        self._n_indexed = 0

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        if k <= 0 or len(context) < 2:
            return EMPTY_DRAFT
        self._extend_index(context)
        if self.gate:
            return self._likely_draft(context, k)
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            at = self._index.get(tuple(context[-n:]))
            if at is not None:
                return Draft(list(context[at : at + k]), None, source="ngram", order=n)
        return EMPTY_DRAFT

    def _likely_draft(self, context: Sequence[int], k: int) -> Draft:
        tail = list(context[-self.max_ngram :])
        tokens: list[int] = []
        order = 0
        while len(tokens) < k:
            token, n = self._likely_next(tail)
            if token is None:
                break
            order = order or n
            tokens.append(token)
            tail = (tail + [token])[-self.max_ngram :]
        return Draft(tokens, None, source="ngram", order=order) if tokens else EMPTY_DRAFT

    def _likely_next(self, tail: Sequence[int]) -> tuple[int | None, int]:
        """The continuation of the longest n-gram ending `tail` that passes the thresholds, and that n."""
        for n in range(min(self.max_ngram, len(tail)), self.min_ngram - 1, -1):
            counts = self._next.get(tuple(tail[-n:]))
            if not counts:
                continue
            token, best = max(counts.items(), key=lambda kv: kv[1])
            total = sum(counts.values())
            i = min(n, len(LAX_MIN_COUNT)) - 1
            if total >= LAX_MIN_COUNT[i] and best >= LAX_MIN_SHARE[i] * total:
                return token, n
        return None, 0

    def _extend_index(self, context: Sequence[int]) -> None:
        if self._n_indexed > len(context):
            self.prepare(context, 0)
        # Index n-grams that end before the last token, so a lookup finds an *earlier* occurrence.
        for end in range(max(self._n_indexed, 1), len(context)):
            nxt = context[end]
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                key = tuple(context[end - n : end])
                self._index[key] = end
                counts = self._next.setdefault(key, {})
                counts[nxt] = counts.get(nxt, 0) + 1
        self._n_indexed = len(context)


_LOCKS: weakref.WeakKeyDictionary[Backend, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


@contextmanager
def holding(backend: Backend) -> Iterator[None]:
    """The draft model to oneself: a background read of the prompt (LazyModelDrafter.start) and another drafter
    over the same model (serve keeps one per method) take turns. Uncontended, it costs a lock's acquire."""
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(backend, threading.Lock())
    with lock:
        yield


class ModelDrafter:
    """A small draft model through the same backend interface; owns the draft model's cache (not the model).

    min_confidence > 0 (from the caller, per proposal) stops a draft before a token whose draft
    probability is below it: a token the draft itself doubts is rarely accepted and costs a draft pass
    and a wider verify.
    """

    method = "model"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend.info.name
        # Greedy drafts without a confidence cut need each step's best token only: where the backend picks it
        # on its device (BackendSpec.top2_on_device), no whole row reaches the host.
        self._top2 = picks_top2(backend)
        # Sampled drafts at plain temperature: each step's token drawn where the model runs, with its softmax row,
        # which is copied (q for the rule) but never passed over on the host (BackendSpec.draws_on_device).
        self._draws = draws_in_pass(backend)

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        # Prefill all but the last token; propose() feeds the rest and gets the first draft's logits.
        if len(context) - 1 <= self.backend.n_ctx:  # a prompt beyond the draft's window: no drafts
            self.catch_up(context)

    def lag(self, context: Sequence[int]) -> int:
        return len(context) - 1 - common_prefix(self.backend.cached_tokens, context, limit=len(context) - 1)

    def catch_up(self, context: Sequence[int]) -> None:
        with holding(self.backend):
            # Through the picks where drafts use them: a backend switched between rows and picks re-plans its pass.
            if not self._top2 or sync_cache_top2(self.backend, context[:-1], logits=False) is None:  # type: ignore[arg-type]
                sync_cache(self.backend, context[:-1], logits=False)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        # The draft's window may be smaller than the target's (e.g. a capped sliding-window cache): the
        # cache ends holding context + k - 1 tokens, so draft less, then nothing, rather than overflow.
        k = min(k, self.backend.n_ctx - len(context) + 1)
        if k <= 0:
            return EMPTY_DRAFT
        with holding(self.backend):
            if self._top2 and sampling.greedy and min_confidence <= 0:
                tokens = self._greedy_picks(context, k)
                if tokens is not None:
                    return Draft(tokens, None, source="model")
            if self._draws and sampling.plain_temperature:
                drawn = self._drawn_draft(context, k, sampling.temperature, rng, min_confidence)
                if drawn is not None:
                    return drawn
            _, logits = sync_cache(self.backend, context, logits=True)
            assert logits is not None
            # The next round keeps at least `context`: a recurrent draft saves its state here, since the
            # one-token passes below leave no snapshot that reaches back this far.
            self.backend.checkpoint()
            tokens, q, note = sample_draft(logits, self._step, k, sampling, rng, min_confidence, self.backend.eog_ids)
        return Draft(tokens, q, note, source="model")

    def _step(self, token: int) -> np.ndarray:
        return self.backend.forward([token], all_logits=False)[-1]

    def _drawn_draft(
        self, context: Sequence[int], k: int, temperature: float, rng: np.random.Generator, min_confidence: float
    ) -> Draft | None:
        """sample_draft's loop on the backend's draws, one pass a token: each token drawn where the model runs from
        the softmax of its row's DRAFT_TOP_K best logits, which comes back beside it (k numbers) as q; None, having
        fed nothing, where the backend cannot draw."""
        backend = cast(DrawsInPass, self.backend)
        model = self.backend
        top_k = min(DRAFT_TOP_K, model.n_vocab)
        fed = list(context[rewind(model, context, logits=True) :])
        draws = backend.forward_draws(fed, temperature, rng, top_k=top_k)
        if draws is None:
            self._draws = False
            return None
        backend.commit_draws(fed)  # the last row's draw is the draft's first token; no row's uniform is used twice
        model.checkpoint()  # as propose's row path: the next round keeps at least `context`
        tokens: list[int] = []
        rows: list[Row] = []
        row, note = len(fed) - 1, ""
        while True:
            token = draws[row]
            q = SparseRow(*backend.drawn_candidates(row), model.n_vocab)
            conf = q.weight(token)
            if conf < min_confidence:
                note = f"draft stopped at position {len(tokens) + 1}: confidence {conf:.2f} < {min_confidence:.2f}"
                break
            tokens.append(token)
            rows.append(q)
            if len(tokens) >= k or token in model.eog_ids:
                break
            step = backend.forward_draws([token], temperature, rng, top_k=top_k)
            if step is None:  # the chain was refused mid-draft: the tokens so far are a whole draft
                break
            backend.commit_draws([token])
            draws, row = step, 0
        return Draft(tokens, SoftmaxRows.of_rows(rows, model.n_vocab) if tokens else None, note, source="model")

    def _greedy_picks(self, context: Sequence[int], k: int) -> list[int] | None:
        """sample_draft's greedy loop on the backend's picks, one pass a token; None, having fed nothing, where the
        backend cannot pick."""
        backend = self.backend
        synced = sync_cache_top2(backend, context, logits=True)  # type: ignore[arg-type]
        if synced is None:
            self._top2 = False
            return None
        picks = synced[1]
        assert picks is not None
        backend.checkpoint()  # as propose's row path: the next round keeps at least `context`
        tokens = [int(picks.best[-1])]
        while len(tokens) < k and tokens[-1] not in backend.eog_ids:
            tokens.append(int(backend.forward_top2([tokens[-1]], all_rows=False).best[-1]))  # type: ignore[attr-defined]
        return tokens

    def observe(self, stats: RoundStats) -> None:
        pass

    def close(self) -> None:
        pass


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def decode_takes_every_core(target: Backend) -> bool:
    """Whether the target's decode already keeps every CPU core busy (a CPU target on as many threads as there
    are cores, as llama.cpp's default; a partly offloaded one too). Work beside it on another thread (a draft
    model's load, its read of the text) then finds no idle core: it takes one from the target's threads, which
    wait for each other at every step of a pass, and the answer slows by more than the work itself costs
    (benchmarks/auto_tax.py, 2 cores, a 1.5B target: with a 0.5B draft loaded and fed beside the decode, the
    target's plain passes took 90 ms against 44 under `none`, and a first answer ran at 0.5-0.6x of plain).
    False for a target on an accelerator."""
    device = target.info.device
    if not device.startswith("CPU") and "rest on CPU" not in device:
        return False
    threads = getattr(target, "threads", None)
    cores = usable_cores()
    return not isinstance(threads, int) or threads >= cores


class LazyModelDrafter:
    """A ModelDrafter whose draft model is loaded the first time a round wants it, off the answer's path.

    `auto` holds its model draft this way: a run whose rounds never want a model draft never pays for loading
    one, and one that does goes on without it while `start` loads it and reads the text so far into it on a
    thread of its own; `ready` says when it can draft. Until then the drafter has read nothing, so its lag is
    the whole context. `load` and the Drafter methods load it on the calling thread (waiting for a load in
    progress), for a caller that wants it now.
    """

    method = "model"

    def __init__(self, load: Callable[[], Backend], name: str, *, size_bytes: int | None = None) -> None:
        self._load = load
        self._drafter: ModelDrafter | None = None
        self.name = name
        self.size_bytes = size_bytes  # the model's weights, known before it loads (auto's prior cost of a token)
        self._job: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()  # close(): a load in progress skips reading the text
        self.loaded_by: str = ""  # the name of the thread that loaded the model (where its load cost fell)

    @property
    def loaded(self) -> bool:
        return self._drafter is not None

    def start(self, context: Sequence[int]) -> None:
        """Load the model if it is not yet, and read `context` into it (all but its last token, as catch_up;
        nothing when it is empty), on a thread of its own."""
        if self._job is not None:
            return
        self._error = None
        self._job = threading.Thread(
            target=self._background, args=(list(context),), name="localspec-draft-load", daemon=True
        )
        self._job.start()

    def _background(self, context: list[int]) -> None:
        try:
            drafter = self._made()
            if context and not self._stop.is_set():
                drafter.catch_up(context)
        except BaseException as e:  # handed to the drafting thread by ready()
            self._error = e

    def _made(self) -> ModelDrafter:
        if self._drafter is None:
            backend = self._load()
            self.loaded_by = threading.current_thread().name
            self._drafter = ModelDrafter(backend)
        return self._drafter

    @property
    def loading(self) -> bool:
        return self._job is not None and self._job.is_alive()

    @property
    def loaded_drafter(self) -> ModelDrafter | None:
        """The drafter over the loaded model, once no load or read runs beside (None until then)."""
        return None if self.loading else self._drafter

    def ready(self) -> bool:
        """Whether the model can draft now without waiting (a background load done). Raises what the load
        raised, once; an interrupted load may be started again."""
        if self._job is None:
            return self._drafter is not None
        if self._job.is_alive():
            return False
        self._job = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._drafter is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background load (tests, and close); whether none is running now."""
        job = self._job
        if job is not None:
            job.join(timeout)
        return not self.loading

    def load(self) -> ModelDrafter:
        self.wait()
        self._job = None
        return self._made()

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        if self._drafter is not None and not self.loading:
            self._drafter.prepare(context, max_k)

    def lag(self, context: Sequence[int]) -> int:
        if self._drafter is None or self.loading:
            return max(len(context) - 1, 0)
        return self._drafter.lag(context)

    def catch_up(self, context: Sequence[int]) -> None:
        self.load().catch_up(context)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        return self.load().propose(context, k, sampling, rng, min_confidence=min_confidence)

    def observe(self, stats: RoundStats) -> None:
        if self._drafter is not None:
            self._drafter.observe(stats)

    def close(self) -> None:
        self._stop.set()
        self.wait()
        if self._drafter is not None:
            self._drafter.close()
