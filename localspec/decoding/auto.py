"""`--draft-method auto`: pick each round's draft (suffix/n-gram lookup, model, or none) from measured
costs and acceptance.

AutoDrafter composes a lookup drafter (the suffix drafter, or prompt-lookup n-grams) and a model
drafter through the Drafter protocol only, and leaves the decisions to localspec.decoding.policy (pure)
and the cost curve to localspec.decoding.cost_learning (remembered, checked, or learnt from the rounds and
idle time; see there). While plain decoding wins, lookup proposals are still made and graded against the
text the target then writes, which measures their acceptance for free (exactly, at any temperature). Every
round's note says what was chosen and why; the run's SpecStats.sources totals it.

The draft model is loaded lazily: not before a round's plan wants it (on a thread of its own beside the
answer, LazyModelDrafter.start), or in idle time where a model draft may pay; never where the remembered
costs say it cannot pay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from localspec.backends.base import Backend
from localspec.decoding.cost_cache import CostStore
from localspec.decoding.cost_learning import IDLE_TOP, CostLearner
from localspec.decoding.drafters import Drafter, LazyModelDrafter, ModelDrafter, NgramDrafter, decode_takes_every_core
from localspec.decoding.live_costs import LiveCurve
from localspec.decoding.policy import DRAFT_RATIO, Controller, CostModel, Plan
from localspec.decoding.stats import RoundStats
from localspec.decoding.suffix import SuffixDrafter
from localspec.decoding.suffix_memory import SuffixMemory
from localspec.decoding.text_resync import text_codec
from localspec.draft import EMPTY_DRAFT, Draft
from localspec.errors import Interrupted, LocalspecError
from localspec.sampling import SamplingParams

SHADOWS = 8  # lookup proposals graded against the text that followed, at most this many pending
SHADOW_SPAN = 4  # ... each on its first tokens only
READ_INLINE = 32  # a lazy draft model catches up on at most this many tokens in a round; more, beside it
# Plain rounds planned without weighing draft lengths (see _plan_round), and why.
NO_COPY_NO_MODEL = Plan("none", 0, 0.0, 0.0, why="nothing to copy; no draft model in this answer")
NO_COPY_MODEL_CANNOT_PAY = Plan("none", 0, 0.0, 0.0, why="nothing to copy; a model draft cannot pay here")
SAVE_EVERY = 16  # rounds between readings of whether a model draft could pay at all (_model_may_pay)


def auto_ngram() -> NgramDrafter:
    """Prompt-lookup n-grams up to 5 tokens long (auto's lookup drafter before the suffix drafter)."""
    return NgramDrafter(max_ngram=5)


def auto_lookup(memory: SuffixMemory | None = None, target: Backend | None = None) -> SuffixDrafter:
    """The lookup drafter auto uses: suffix matches over the session (and `memory`'s earlier sessions),
    ungated (the policy decides); with `target`'s tokenizer, copies are followed across edits in bytes."""
    return SuffixDrafter(gate=False, memory=memory, codec=text_codec(target))


def draft_ratio(model: Drafter | None, target: Backend | None) -> float:
    """The prior share of T(1) a draft token costs: the draft's weights over the target's (a pass streams them
    all), where both sizes are known (a draft model not loaded yet may know its own); DRAFT_RATIO otherwise.
    Where even that share rules a model draft out, auto never loads the draft model for an answer."""
    draft = getattr(model, "backend", None)
    sizes = [getattr(getattr(b, "info", None), "size_bytes", None) for b in (draft, target)]
    sizes[0] = sizes[0] or getattr(model, "size_bytes", None)
    if sizes[0] and sizes[1]:
        return min(max(sizes[0] / sizes[1], 0.02), 1.0)
    return DRAFT_RATIO


class AutoDrafter:
    """Adaptive drafting over an n-gram drafter and/or a model drafter (the `auto` draft method).

    The longest draft it may choose is the k the engine asks for in each round (GenerationConfig.num_draft),
    so a k changed between generations takes effect at once. Its cost curve is `learner`'s (cost_learning.py).
    """

    method = "auto"

    def __init__(
        self,
        *,
        ngram: Drafter | None = None,
        model: Drafter | None = None,
        target: Backend | None = None,
        costs: CostModel | None = None,
        store: CostStore | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if ngram is None and model is None:
            raise ValueError("auto drafting needs a lookup drafter, a model drafter, or both")
        self.ngram = ngram  # any lookup drafter (suffix or n-gram): one-hot drafts, Draft.order = match length
        self._forecast: tuple[int, int, int, Draft] | None = None  # (context length, last token, k, its lookup)
        self.model = model
        self.target = target
        # Whether work on another thread beside an answer is free (the target leaves a core idle, or decodes on an
        # accelerator). Where it is not, the draft model is loaded, and reads text, only where nobody waits
        # (idle_step) or inline in a round that priced it, never beside the target's decode: see _model_plannable.
        self.beside = target is None or not decode_takes_every_core(target)
        self.clock = clock
        self.learner = CostLearner(target=target, costs=costs, store=store, clock=clock)
        self.controller = Controller(self.learner.initial, draft_ratio(model, target))
        parts = [p for p in (ngram.name if ngram else "", model.name if model else "") if p]
        self.name = "auto(" + "+".join(parts) + ")"
        self.max_k = 0
        self._plan: Plan | None = None
        self._order = 0
        self._catch_up_s = 0.0
        self._model_mark: tuple[int, int] | None = None  # (context length, the model's lag then): see _model_gap
        self.model_note = ""  # why the draft model was dropped mid-run, if it was
        self._shadows: list[tuple[list[int], int, int]] = []  # (proposal, n-gram order, context length then)
        self._can_pay = True  # see _model_may_pay
        self._can_pay_in = 0  # rounds until it is read again

    @property
    def live(self) -> LiveCurve:
        """The cost curve as this process's rounds (and idle pairs) timed it."""
        return self.learner.live

    @property
    def store(self) -> CostStore | None:
        return self.learner.store

    @store.setter
    def store(self, store: CostStore | None) -> None:
        self.learner.store = store

    # -- Drafter protocol -------------------------------------------------------------------------

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self.max_k = max_k
        self._shadows = []
        if self.ngram is not None:
            self.ngram.prepare(context, max_k)
        self.controller.new_generation()
        self.learner.new_generation(max_k)
        self._model_mark = None  # a new text: the model's cache is compared with it once
        self._can_pay_in = 0
        # The draft model does not read the prompt now: it catches up in one batch when a plan first needs it
        # (the policy counts that cost), so a run where model drafts never pay never pays for it.

    def model_can_pay(self) -> bool:
        """Whether the draft model could beat plain decoding here even if every draft token were accepted
        (True while its cost is unmeasured)."""
        return self.controller.model_can_pay(self.max_k)

    def save_costs(self) -> None:
        """Remember the costs: a learnt curve once it is consistent, a remembered one as the rounds refined it."""
        self.learner.save(self.controller)

    # -- idle time (serve between requests, chat between turns) -------------------------------------

    def idle_due(self) -> bool:
        """Whether timing passes are still wanted where nobody waits (no trusted curve yet), or the draft model
        is still to be loaded there (a lazy one that may pay)."""
        return self.learner.timing_due() or self._preload_due() or self._feed_due()

    def _preload_due(self) -> bool:
        model = self.model
        if not isinstance(model, LazyModelDrafter) or model.loaded or model.loading:
            return False
        return self.controller.model_can_pay(max(self.max_k, IDLE_TOP - 1))

    def _feed_due(self) -> bool:
        """Whether a loaded draft model that may pay has yet to read the text the target holds (the conversation
        so far): read where nobody waits, the next answer's catch-up is its new message only."""
        model = self.model.loaded_drafter if isinstance(self.model, LazyModelDrafter) else self.model
        target = self.target
        if not isinstance(model, ModelDrafter) or target is None or not target.cached_tokens:
            return False
        text = target.cached_tokens
        fits = len(text) - 1 <= model.backend.n_ctx
        return fits and model.lag(text) > 0 and self.controller.model_can_pay(max(self.max_k, IDLE_TOP - 1))

    def idle_step(self) -> bool:
        """One piece of idle work, run only where nobody waits: the draft model's load where a model draft may pay
        (an answer then finds it loaded), calibration (one pair of forward passes) on the target's cache, which it
        leaves as it found it, or the draft model's read of the text the target holds. True while more pieces are
        wanted."""
        if self._preload_due():
            self._preload()
            if not self.beside:
                return self.idle_due()  # the load was this piece
        if self.learner.timing_due():
            return self.learner.idle_step(self.controller) or self._feed_due()
        if self._feed_due():
            assert self.model is not None and self.target is not None
            self.model.catch_up(self.target.cached_tokens)
            self._model_mark = None  # its lag is read again
        return False

    def _preload(self) -> None:
        """Load the lazy draft model where nobody waits: on a thread of its own where the target leaves a core
        idle (an answer that starts meanwhile goes on beside it), else here, as one idle piece (an answer that
        starts meanwhile waits it out, as it waits out a timing piece: beside the decode it would cost more)."""
        model = self.model
        assert isinstance(model, LazyModelDrafter)
        if self.beside:
            model.start([])
            return
        try:
            model.load()
        except Interrupted:
            pass  # stopped (an answer's abort, or closing): loaded in a later idle piece
        except LocalspecError as e:
            self.model_note = f"auto: draft model dropped: {e}"
            self.model = None

    def forecast(self, context: Sequence[int], k: int) -> tuple[float, ...] | None:
        """The acceptance expected at each position of the lookup draft `context` has now (auto's learnt
        acceptance by match length, over the tokens the lookup would copy); None when it has none. serve
        --parallel's policy sizes this sequence's share of a pass from it (decoding/parallel.py)."""
        lookup = getattr(self.ngram, "lookup", None)  # a suffix drafter's ungated draft
        if lookup is None or k <= 0:
            return None
        d = lookup(context, k)
        self._forecast = (len(context), context[-1], k, d)  # propose takes it from here: one lookup a round
        if not d.tokens:
            return None
        return tuple(self.controller.ngram_acceptance(d.order + i).alpha for i in range(len(d.tokens)))

    def _lookup(self, context: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator) -> Draft:
        """The lookup draft for this round: the one forecast() found for this context, cut to k, or a new one
        (a lookup moves the suffix drafter's anchor, so it is not made twice for one context)."""
        assert self.ngram is not None
        cached, self._forecast = self._forecast, None
        if cached is not None and cached[:2] == (len(context), context[-1]) and k <= cached[2]:
            d = cached[3]
            return replace(d, tokens=list(d.tokens[:k])) if len(d.tokens) > k else d
        return self.ngram.propose(context, k, sampling, rng)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        ng = EMPTY_DRAFT
        self._order = 0
        if self.ngram is not None and k > 0:
            self._grade_shadows(context)
            ng = self._lookup(context, k, sampling, rng)
            self._order = ng.order if ng.tokens else 0
        self.learner.at_context(len(context), self.controller.costs)
        plan = self._plan_round(context, k, ng)
        plan = self.learner.steer(plan, k, len(ng.tokens))  # a check round for the cost curve, now and then
        self._plan = plan
        if ng.tokens and plan.method != "ngram":
            # Not used this round: grade it against the text that follows, for free.
            self._shadows.append((list(ng.tokens), self._order, len(context)))
            del self._shadows[:-SHADOWS]
        # A dropped draft model, and what became of the costs, are said once, in this round's note.
        said, self.model_note = _join(self.model_note, self.learner.take_note()), ""
        if plan.method == "model" and plan.probe and self.learner.slope_is_prior():
            return self._time_batch_first(context, ng, plan, said)
        if plan.method == "ngram":
            note = plan.note() + " " + (ng.note or f"{ng.source} match {self._order}")
            return Draft(ng.tokens[: plan.k], None, _join(said, note), ng.source, self._order)
        if plan.method == "model":
            assert self.model is not None
            gap = self._model_gap(context)
            self._catch_up_s = self._catch_up(context) if gap > 0 else 0.0
            if gap > 0:
                self.controller.costs.observe_catch_up(gap, self._catch_up_s)
            d = self.model.propose(
                context, plan.k, sampling, rng, min_confidence=max(min_confidence, plan.min_confidence)
            )
            self._model_mark = None  # the model's cache moved: its lag is read again next time
            note = _join(said, plan.note() + (f"; {d.note}" if d.note else ""))
            return Draft(d.tokens, d.q, note, d.source if d.source != "none" else "model")  # a head says its family
        if self.learner.checking:
            check = self.learner.check_draft(context, ng)
            return replace(check, note=_join(said, check.note))
        return Draft([], None, _join(said, plan.note()))

    def _time_batch_first(self, context: Sequence[int], ng: Draft, probe: Plan, said: str) -> Draft:
        """Instead of a first model probe while the curve's growth is still the prior's: the cheapest batch (one
        guessed token, kept if right), to time T(2). A model probe reads the whole text into the draft model (0.4 s of
        a 3.3 s answer on a 2-core CPU, where no model draft can pay); once batches are timed it is weighed on them."""
        self._plan = Plan("none", 0, probe.plain_rate, probe.plain_rate)
        guess = ng.tokens[:1] or [int(context[-1])]
        return Draft(list(guess), None, _join(said, "auto: T(2) timed before the draft model is tried"), "check")

    def _plan_round(self, context: Sequence[int], k: int, ng: Draft) -> Plan:
        """This round's plan. Where the lookup found nothing and no model draft could pay, plain decoding without
        weighing every draft length: on new text that is most rounds, and each would otherwise cost about as
        much host work as a round of `none` does in all."""
        plannable = self._model_plannable()
        if not ng.tokens and not plannable:
            return NO_COPY_NO_MODEL
        if not ng.tokens and not self._model_may_pay():
            return NO_COPY_MODEL_CANNOT_PAY
        self.learner.for_policy(self.controller.costs)
        gap = self._model_gap(context) if plannable else 0
        k_plan = self.learner.draft_cap(k)
        lookup, order = len(ng.tokens), self._order
        plan = self.controller.plan(k_plan, model=plannable, ngram_avail=lookup, ngram_order=order, model_gap=gap)
        if plan.method == "model" and not self._model_ready(context):
            plan = self.controller.plan(k_plan, model=False, ngram_avail=lookup, ngram_order=order)
        return plan

    def _model_may_pay(self) -> bool:
        """Whether a model draft could beat plain decoding with every token accepted (Controller.model_can_pay),
        read again every SAVE_EVERY rounds, each new answer, and after each model round: the costs move slowly."""
        if self._can_pay_in <= 0:
            self.learner.for_policy(self.controller.costs)
            self._can_pay = self.controller.model_can_pay(self.max_k)
            self._can_pay_in = SAVE_EVERY
        self._can_pay_in -= 1
        return self._can_pay

    def _model_plannable(self) -> bool:
        """Whether this round may plan a model draft. Not while a lazy draft model loads (and reads the text) on
        its own thread. Where the target's decode takes every core, not before it is loaded either: an answer
        never starts its load there. A load beside the decode would take a core from the target's threads, which
        wait for each other at every step of a pass: counted on 2 cores, the answer slowed by more than the whole
        load costs, where most answers draft little with the model and `run` (one answer) never earns the load
        back. So it loads where nobody waits (idle_step: serve before and between requests, chat before its first
        turn and between turns), and reads the text it missed inline, in a round whose plan priced that."""
        model = self.model
        if not isinstance(model, LazyModelDrafter):
            return model is not None
        return not model.loading and (self.beside or model.loaded)

    def _model_ready(self, context: Sequence[int]) -> bool:
        """Whether the draft model can draft this round. A lazy one not loaded yet starts loading, and reading
        the text so far, on a thread of its own (LazyModelDrafter.start): the answer goes on without it until it
        is ready, so neither costs the answer a stall. False when there is none, or it failed to load (auto
        then goes on without it, and says so once)."""
        if not isinstance(self.model, LazyModelDrafter):
            return self.model is not None
        try:
            if self.model.ready() and (not self.beside or self._model_gap(context) <= READ_INLINE):
                return True  # (where nothing runs beside the answer, the round catches the model up itself)
        except Interrupted:
            return False  # an abort stopped the load: it starts again when a round next wants the model
        except LocalspecError as e:
            self.model_note = f"auto: draft model dropped: {e}"
            self.model = None
            return False
        self._model_mark = None
        self.model.start(context)  # loaded where it is not, and the text read into it
        return False

    def _model_gap(self, context: Sequence[int]) -> int:
        """Tokens the draft model would first catch up on. Read from the model once, then counted: rounds the
        model does not draft only add tokens to the context (a model's lag compares its whole cache)."""
        assert self.model is not None
        if not isinstance(self.model, (ModelDrafter, LazyModelDrafter)):
            return self.model.lag(context)  # a head follows the target's own cache
        mark = self._model_mark
        if mark is None or mark[0] > len(context):
            mark = self._model_mark = (len(context), self.model.lag(context))
        return mark[1] + len(context) - mark[0]

    def _grade_shadows(self, context: Sequence[int]) -> None:
        """Score earlier unused n-gram proposals against what the target actually wrote.

        Under the exact rule a one-hot draft token d is accepted with probability p(d), which is also
        the chance the target itself emits d: so matching proposals against the emitted text measures
        n-gram acceptance without spending a verify pass, at any temperature.
        """
        pending = []
        for tokens, order, start in self._shadows:
            # Graded as a draft of at most SHADOW_SPAN tokens: a long proposal would otherwise wait that
            # many plain rounds for its verdict, and long matches would start drafting late.
            tokens = tokens[:SHADOW_SPAN]
            seen = context[start : start + len(tokens)]
            n = 0
            while n < len(seen) and seen[n] == tokens[n]:
                n += 1
            if n < len(seen) or len(seen) == len(tokens):
                self.controller.observe_lookup(order, n, len(tokens))
            else:
                pending.append((tokens, order, start))
        self._shadows = pending

    def observe(self, stats: RoundStats) -> None:
        self.learner.pace(stats, self.controller.costs)
        if self._plan is not None:
            # Catching the draft's cache up after plain rounds is a one-off, not the draft's per-token cost.
            drafting = replace(stats, draft_s=max(stats.draft_s - self._catch_up_s, 0.0)) if self._catch_up_s else stats
            self.controller.observe(self._plan, drafting, self._order)
            if self._plan.method == "model":
                self._can_pay_in = 0  # the draft's cost was timed again
        self.learner.observe(stats, self.controller)
        self._plan = None
        self._catch_up_s = 0.0

    def lag(self, context: Sequence[int]) -> int:
        return 0  # auto catches its model draft up itself, when a plan needs it

    def catch_up(self, context: Sequence[int]) -> None:
        pass

    def _catch_up(self, context: Sequence[int]) -> float:
        """Feed the draft model what it missed during plain or n-gram rounds, in one batch; its seconds."""
        assert self.model is not None
        t0 = self.clock()
        self.model.catch_up(context)
        self._model_mark = None
        return self.clock() - t0

    def close(self) -> None:
        self.save_costs()  # the curve as this run's rounds refined it
        for d in (self.ngram, self.model):
            if d is not None:
                d.close()


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def idle_work(drafter: Drafter) -> Callable[[], bool] | None:
    """A drafter's calibration for idle time, one piece a call (True while more pieces are wanted); None when
    it has none (not auto, or auto with a trusted curve)."""
    if isinstance(drafter, AutoDrafter) and drafter.idle_due():
        return drafter.idle_step
    return None


def idle_curve(drafter: Drafter) -> tuple[dict[int, float], str]:
    """What auto's timing passes measured so far: seconds by batch size ({} before enough sizes are timed), and
    why it was not stored ("" when it was: a busy machine's timings are used by this run, not remembered)."""
    if not isinstance(drafter, AutoDrafter):
        return {}, ""
    live = drafter.learner.live
    if why := live.timed_enough():
        return {}, why
    return live.stored_curve(), live.storable()
