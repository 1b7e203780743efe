"""`--draft-method auto`: pick each round's draft (suffix/n-gram lookup, model, or none) from measured
costs and acceptance.

AutoDrafter composes a lookup drafter (the suffix drafter, or prompt-lookup n-grams) and a model
drafter through the Drafter protocol only, and leaves the decisions to localspec.decoding.policy (pure)
and the measurements to localspec.decoding.calibrate. While plain decoding wins, lookup proposals are
still made and graded against the text the target then writes, which measures their acceptance for free
(exactly, at any temperature). Every round's note says what was chosen and why; the run's
SpecStats.sources totals it.

No fixed cost, and no stall: the cost curve comes from the on-disk cache (localspec.decoding.cost_cache)
when this pair was measured on this machine before. Without one, an answer never stops to calibrate: it
learns the curve from its own rounds (localspec.decoding.live_costs: every verify pass times T(n) at the
size it verified, a plain round times T(1), per context length), starting from a prior slope that lets
lookup drafts and short model probes pay where a flat (GPU-like) curve makes them pay. Timing passes that
need filler run only where nobody waits (idle_step: serve between requests, chat between turns), in
pieces of one pair each, and feed the same curve. A learnt curve is stored once it is consistent (enough
timings, plausible, not spread like a busy machine's); a busy machine's is used for the answer and said.

A curve from the cache is a hypothesis: pairs of neighbouring rounds (one a 1-token pass, one a batch)
test it (cost_cache.CurveCheck), and where the rounds do not form such pairs by themselves (a run that
decodes plainly throughout, or drafts throughout) a check round makes one now and then: a draft of one
token in a plain run (the lookup's next one where it has one), paid for from CHECK_SHARE (1%) of the plain
rounds' time, and a plain round in a drafting one, from EXPLORE of the drafting rounds' time. A curve the
rounds contradict is dropped from the cache and learnt afresh from the rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from localspec.backends.base import Backend
from localspec.decoding.calibrate import PairedRun
from localspec.decoding.cost_cache import CHECK_PAIRS, CONTRADICTION, CostStore, CurveCheck
from localspec.decoding.drafters import Drafter, LazyModelDrafter, ModelDrafter, NgramDrafter
from localspec.decoding.live_costs import LiveCurve, context_bucket
from localspec.decoding.policy import DRAFT_RATIO, EXPLORE, MAX_BACKOFF, Controller, CostModel, Plan
from localspec.decoding.stats import RoundStats
from localspec.decoding.suffix import SuffixDrafter
from localspec.decoding.suffix_memory import SuffixMemory
from localspec.draft import EMPTY_DRAFT, Draft
from localspec.errors import Interrupted, LocalspecError
from localspec.sampling import SamplingParams

SHADOWS = 8  # lookup proposals graded against the text that followed, at most this many pending
SHADOW_SPAN = 4  # ... each on its first tokens only
CALIBRATION_SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32)  # batch sizes timed in idle time (plus the top one)
CALIBRATION_REPS = 3  # pairs per batch size: their median outlasts one pair that a busy spell split
IDLE_TOP = 33  # the top size timed in idle time before any answer said its k (auto's default k + 1)
IDLE_TRIES = 3  # idle calibrations per drafter at most (a machine too busy to measure stays so for a while)
SAVE_EVERY = 16  # rounds between writes of a learnt curve
CHECK_SHARE = 0.01  # checks of a remembered curve may cost at most this share of plain rounds' time
READ_INLINE = 32  # a lazy draft model catches up on at most this many tokens in a round; more, beside it
FILLER = "The quick brown fox jumps over the lazy dog. " * 2  # idle timing on an empty cache needs a context


def auto_ngram() -> NgramDrafter:
    """Prompt-lookup n-grams up to 5 tokens long (auto's lookup drafter before the suffix drafter)."""
    return NgramDrafter(max_ngram=5)


def auto_lookup(memory: SuffixMemory | None = None) -> SuffixDrafter:
    """The lookup drafter auto uses: suffix matches over the session (and `memory`'s earlier sessions),
    ungated (the policy decides)."""
    return SuffixDrafter(gate=False, memory=memory)


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
    so a k changed between generations takes effect at once.
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
        self.clock = clock
        self.store = store
        from_store = costs is None and store is not None
        if costs is None and store is not None:
            costs = store.load()
        # Only a remembered curve is checked (a learnt one is the rounds' own medians).
        self.check = CurveCheck(dict(costs.target)) if from_store and costs is not None else None
        self.live = LiveCurve()  # the curve as this process's rounds (and idle pairs) time it
        # No remembered curve: learn it from the rounds (never a calibration inside an answer).
        self.learning = costs is None and target is not None
        self._since_save = SAVE_EVERY  # rounds since a learnt curve was last written (the first is written at once)
        self._prev_plain: float | None = None  # the last round's seconds if it was a 1-token pass at this length
        self._lookup_probes = 0  # lookup probes in a row while learning (each costs twice the last, up to 2**5)
        self._busy_said = False  # a busy machine's curve, not stored, said once an answer
        self._idle_run: PairedRun | None = None
        self._idle_tries = 0
        self._idle_later = False  # the last idle calibration found the machine busy: again after the next answer
        self._context = 0  # this round's context length (the cost curve depends on it)
        # A remembered curve's pace per context bucket (attention grows with the context): restored when an
        # answer comes back to a length seen before; a length not seen yet takes its pace from its first round.
        self._bucket: int | None = None
        self._bucket_scale: dict[int, float] = {}
        self._fresh_bucket = False
        self._check_credit = 0.0  # seconds check rounds may still cost (a share of the rounds' time)
        self._checks_agreed = 0  # pairs in a row that agreed with the curve: checks back off
        self._checking = False  # this round is a check round
        self._cost_note = ""  # what became of the costs, said once in the next round's note
        self.controller = Controller(costs, draft_ratio(model, target))
        parts = [p for p in (ngram.name if ngram else "", model.name if model else "") if p]
        self.name = "auto(" + "+".join(parts) + ")"
        self.max_k = 0
        self._plan: Plan | None = None
        self._order = 0
        self._catch_up_s = 0.0
        self._model_mark: tuple[int, int] | None = None  # (context length, the model's lag then): see _model_gap
        self.model_note = ""  # why the draft model was dropped mid-run, if it was
        self._shadows: list[tuple[list[int], int, int]] = []  # (proposal, n-gram order, context length then)

    # -- Drafter protocol -------------------------------------------------------------------------

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self.max_k = max_k
        self._shadows = []
        if self.ngram is not None:
            self.ngram.prepare(context, max_k)
        self.controller.new_generation()
        if self.check is not None:
            self.check.new_generation()
        self._busy_said = False
        self._idle_later = False
        self._prev_plain = None
        self._model_mark = None  # a new text: the model's cache is compared with it once
        # The draft model does not read the prompt now: it catches up in one batch when a plan first needs it
        # (the policy counts that cost), so a run where model drafts never pay never pays for it.

    def model_can_pay(self) -> bool:
        """Whether the draft model could beat plain decoding here even if every draft token were accepted
        (True while its cost is unmeasured)."""
        return self.controller.model_can_pay(self.max_k)

    def save_costs(self) -> None:
        """Remember the costs: a learnt curve once it is consistent, a remembered one as the rounds refined it."""
        if self.store is None:
            return
        costs = self.controller.costs
        draft = costs.draft_s() if self.controller.draft_settled else None
        if self.learning:
            if self.live.storable():
                return
            self._since_save = 0
            self.store.save(CostModel(target=self.live.stored_curve(), draft_token=draft))
            return
        self.store.save(replace(costs.copy(), draft_token=None if draft is None else costs.draft_token))

    def _learn(self, n: int, seconds: float) -> None:
        """One round's verify pass into the live curve; a learnt curve written now and then, when consistent."""
        if n == 1:
            self.live.add_plain(self._context, seconds)
        else:
            self.live.add_batch(self._context, n, seconds, paired=self._prev_plain)
        self._prev_plain = seconds if n == 1 else None
        if not self.learning:
            return
        self._since_save += 1
        why = self.live.storable()
        if not why and self._since_save >= SAVE_EVERY:
            self.save_costs()
        elif why.startswith("machine too busy") and not self._busy_said:
            self._busy_said = True
            self._cost_note = _join(self._cost_note, f"auto: costs not stored: {why}; the rounds go on measuring")

    def _explore_k(self) -> int:
        """While learning, drafts grow by doubling past the largest batch timed: the prior's slope is a guess,
        and at a long context on a CPU a batch of 33 can cost 29 single-token passes (seen at 8.7k tokens)."""
        timed = max(self.live.ratios, default=1)
        return max(2, 2 * (timed - 1))

    def _use_live(self, context: int) -> None:
        """While learning: the costs at this context length as the rounds (and idle pairs) timed them."""
        costs = self.controller.costs
        curve = self.live.curve(context, max(self.max_k, 1) + 1)
        costs.target = {n: t / costs.scale for n, t in curve.items()}

    # -- idle time (serve between requests, chat between turns) -------------------------------------

    def idle_due(self) -> bool:
        """Whether timing passes are still wanted where nobody waits (no trusted curve yet), or the draft model
        is still to be loaded there (a lazy one that may pay)."""
        return self._timing_due() or self._preload_due()

    def _timing_due(self) -> bool:
        if not self.learning or self.target is None:
            return False
        return self._idle_run is not None or (self._idle_tries < IDLE_TRIES and not self._idle_later)

    def _preload_due(self) -> bool:
        model = self.model
        if not isinstance(model, LazyModelDrafter) or model.loaded or model.loading:
            return False
        return self.controller.model_can_pay(max(self.max_k, IDLE_TOP - 1))

    def idle_step(self) -> bool:
        """One piece of idle work: the draft model's load begun on a thread of its own where a model draft may
        pay (an answer then finds it loaded), or calibration (one pair of forward passes) on the target's cache,
        which it leaves as it found it; run only where nobody waits. True while more pieces are wanted."""
        if self._preload_due():
            assert isinstance(self.model, LazyModelDrafter)
            self.model.start([])
        if not self._timing_due():
            return False
        target = self.target
        assert target is not None
        if not target.cached_tokens:  # a server just started: time on a short filler context
            target.forward(target.tokenize(FILLER, add_special=True, parse_special=False), all_logits=False)
        if self._idle_run is None:
            self._idle_tries += 1
            top = max(self.max_k + 1, IDLE_TOP)
            sizes = [n for n in CALIBRATION_SIZES if n < top] + [top]
            self._idle_run = PairedRun(target, sizes, reps=CALIBRATION_REPS, clock=self.clock)
        run = self._idle_run
        if run.step() and run.last is not None:
            n, t1, tn = run.last
            self.live.add_pair(len(target.cached_tokens), t1, n, tn)
            return True
        self._idle_run = None
        if self.live.storable():
            self._idle_later = True
        else:
            self._idle_tries = IDLE_TRIES  # measured: nothing more to do where nobody waits
            self.save_costs()
        return False

    def forecast(self, context: Sequence[int], k: int) -> tuple[float, ...] | None:
        """The acceptance expected at each position of the lookup draft `context` has now (auto's learnt
        acceptance by match length, over the tokens the lookup would copy); None when it has none. serve
        --parallel's crowd policy sizes this sequence's share of a pass from it (decoding/crowd.py)."""
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
        self._context = len(context)
        if self.learning:
            self._use_live(len(context))
        else:
            self._enter_bucket(context_bucket(len(context)))
        loading = self._model_loading()
        gap = self._model_gap(context) if self.model is not None and not loading else 0
        k_plan = min(k, self._explore_k()) if self.learning else k
        plan = self.controller.plan(
            k_plan,
            model=self.model is not None and not loading,
            ngram_avail=len(ng.tokens),
            ngram_order=self._order,
            model_gap=gap,
        )
        if plan.method == "model" and not self._model_ready(context):
            plan = self.controller.plan(k_plan, model=False, ngram_avail=len(ng.tokens), ngram_order=self._order)
        if self.learning and plan.method != "none":
            self._lookup_probes = 0
        self._checking = self._check_due(plan, k, len(ng.tokens))
        if self._checking and self.learning and plan.method == "none":
            # Plain decoding wins on a learnt curve: a short lookup draft right after a plain round times a batch
            # in a pair, so a curve that a busy spell made steep is corrected (paid from EXPLORE, backing off).
            self._lookup_probes += 1
            plan = Plan("ngram", min(len(ng.tokens), 2), plan.rate, plan.plain_rate, plan.alpha, probe=True)
        elif self._checking:
            plan = Plan("none", 0, plan.plain_rate, plan.plain_rate)
        self._plan = plan
        if ng.tokens and plan.method != "ngram":
            # Not used this round: grade it against the text that follows, for free.
            self._shadows.append((list(ng.tokens), self._order, len(context)))
            del self._shadows[:-SHADOWS]
        # A dropped draft model, and what became of the costs, are said once, in this round's note.
        said, self.model_note, self._cost_note = _join(self.model_note, self._cost_note), "", ""
        if plan.method == "ngram":
            note = plan.note() + " " + (ng.note or f"{ng.source} match {self._order}")
            return Draft(ng.tokens[: plan.k], None, _join(said, note), ng.source, self._order)
        if plan.method == "model":
            assert self.model is not None
            self._catch_up_s = self._catch_up(context) if gap > 0 else 0.0
            if gap > 0:
                self.controller.costs.observe_catch_up(gap, self._catch_up_s)
            d = self.model.propose(
                context, plan.k, sampling, rng, min_confidence=max(min_confidence, plan.min_confidence)
            )
            self._model_mark = None  # the model's cache moved: its lag is read again next time
            note = _join(said, plan.note() + (f"; {d.note}" if d.note else ""))
            return Draft(d.tokens, d.q, note, d.source if d.source != "none" else "model")  # a head says its family
        if self._checking:
            return self._check_draft(context, said, ng)
        return Draft([], None, _join(said, plan.note()))

    def _check_due(self, plan: Plan, k: int, lookup: int = 0) -> bool:
        """Whether this round should check the remembered curve: make the round the other kind (a batch
        after a 1-token pass, or a 1-token pass after a batch) than the last, while the allowance lasts. While
        learning, whether a drafting round should be a plain one instead, to time T(1) at this length, or a
        plain one a short lookup draft (when there is one), to time a batch in a pair with the round before."""
        if k <= 0 or self._check_credit < 0:
            return False
        if self.learning:  # a run that drafts throughout times T(1) now and then: every ratio rests on it
            paid = plan.plain_rate > 0 and self._check_credit * plan.plain_rate >= 1.0  # a whole T(1) saved up
            if plan.method == "none":
                return paid and lookup > 0 and self._prev_plain is not None
            return paid and not plan.probe and self.live.wants_t1(self._context)
        last = self.check.last if self.check is not None else None
        return last is not None and (plan.method == "none") == (last[0] == 1)

    def _check_draft(self, context: Sequence[int], said: str, lookup: Draft) -> Draft:
        if self.learning:
            return Draft([], None, _join(said, "auto: plain, to time T(1) for the cost curve"))
        assert self.check is not None and self.check.last is not None
        if self.check.last[0] > 1:
            return Draft([], None, _join(said, "auto: plain, to check T(1) against the remembered costs"))
        # The cheapest batch: one token drafted, the lookup's next one where it has one (the check then pays for
        # itself when it holds), else the last one again (verified like any draft, so harmless).
        guess = lookup.tokens[:1] or [int(context[-1])]
        note = _join(said, "auto: check T(2) against the remembered costs")
        return Draft(list(guess), None, note, "check")

    def _check_curve(self, stats: RoundStats) -> None:
        """Test the remembered curve against this round, pay for a check round; drop a contradicted curve."""
        seconds = stats.verify_s - stats.rollback_s
        if self.check is None:
            # Learning: a round timed for the curve costs at most itself, from EXPLORE of the rounds' time; lookup
            # probes that keep finding plain decoding ahead cost twice as much each time.
            backoff = 2 ** min(self._lookup_probes, MAX_BACKOFF) if stats.n_drafted else 1
            self._check_credit += -seconds * backoff if self._checking else EXPLORE * seconds
            return
        before = self.check.last
        deviation = self.check.observe(stats.n_drafted + 1, seconds)
        if self._checking and before is not None:
            # What the check cost over the round it replaced: the batch's extra seconds in a plain run, less a
            # plain round for a token it drafted and got accepted; a whole plain round (at most) where the run
            # drafts. It backs off while the curve holds.
            cost = seconds - before[1] * (1 + stats.n_accepted) if stats.n_drafted else seconds
            self._check_credit -= max(cost, 0.0) * 2 ** min(self._checks_agreed, MAX_BACKOFF)
        else:  # a plain answer (auto cannot help there) pays CHECK_SHARE for its checks; a drafting one EXPLORE
            self._check_credit += (EXPLORE if stats.n_drafted else CHECK_SHARE) * seconds
        if deviation is not None:
            held = 1 / CONTRADICTION <= deviation <= CONTRADICTION
            self._checks_agreed = self._checks_agreed + 1 if held else 0
        if self.check.contradicted:
            self._drop_curve(self.check.deviation or 0.0)

    def _drop_curve(self, deviation: float) -> None:
        why = f"T(n)/T(1) {deviation:.2g}x its own over {CHECK_PAIRS} pairs of rounds"
        self._cost_note = f"auto: remembered costs contradicted by live rounds ({why}): dropped, learning afresh"
        self.check = None
        if self.store is not None:
            self.store.drop()
        self.learning = self.target is not None  # learnt afresh from the rounds (and idle pairs)
        self._since_save = SAVE_EVERY

    def _model_loading(self) -> bool:
        """Whether the draft model is loading (and reading the text) in the background: no model rounds till then."""
        return isinstance(self.model, LazyModelDrafter) and self.model.loading

    def _model_ready(self, context: Sequence[int]) -> bool:
        """Whether the draft model can draft this round. A lazy one not loaded yet starts loading, and reading
        the text so far, on a thread of its own (LazyModelDrafter.start): the answer goes on without it until it
        is ready, so neither costs the answer a stall. False when there is none, or it failed to load (auto
        then goes on without it, and says so once)."""
        if not isinstance(self.model, LazyModelDrafter):
            return self.model is not None
        try:
            if self.model.ready() and self._model_gap(context) <= READ_INLINE:
                return True
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

    def _enter_bucket(self, bucket: int) -> None:
        if bucket == self._bucket:
            return
        costs = self.controller.costs
        if self._bucket is not None:
            self._bucket_scale[self._bucket] = costs.scale
        self._bucket = bucket
        known = self._bucket_scale.get(bucket)
        if known is not None:
            costs.scale = known
        self._fresh_bucket = known is None

    def _first_at_length(self, n: int, seconds: float) -> None:
        """The first round at a context length not seen yet sets the pace outright (the common factor's slow
        average would take some twenty rounds to follow an 8k prompt's doubled T(1)), within 4x either way."""
        self._fresh_bucket = False
        costs = self.controller.costs
        predicted = costs.target_s(n)
        if seconds > 0 and predicted > 0 and not np.isnan(predicted):
            costs.scale *= min(max(seconds / predicted, 0.25), 4.0)

    def observe(self, stats: RoundStats) -> None:
        if self._fresh_bucket and not self.learning:
            self._first_at_length(stats.n_drafted + 1, stats.verify_s - stats.rollback_s)
        if self._plan is not None:
            # Catching the draft's cache up after plain rounds is a one-off, not the draft's per-token cost.
            drafting = replace(stats, draft_s=max(stats.draft_s - self._catch_up_s, 0.0)) if self._catch_up_s else stats
            self.controller.observe(self._plan, drafting, self._order)
        self._learn(stats.n_drafted + 1, stats.verify_s - stats.rollback_s)
        self._check_curve(stats)
        self._plan = None
        self._checking = False
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
