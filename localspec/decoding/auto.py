"""`--draft-method auto`: pick each round's draft (suffix/n-gram lookup, model, or none) from measured
costs and acceptance.

AutoDrafter composes a lookup drafter (the suffix drafter, or prompt-lookup n-grams) and a model
drafter through the Drafter protocol only, and leaves the decisions to localspec.decoding.policy (pure)
and the measurements to localspec.decoding.calibrate. While plain decoding wins, lookup proposals are
still made and graded against the text the target then writes, which measures their acceptance for free
(exactly, at any temperature). Every round's note says what was chosen and why; the run's
SpecStats.sources totals it.

No fixed cost: the cost curve comes from the on-disk cache (localspec.decoding.cost_cache) when this
pair was measured on this machine before, and is written back, refined by the run's own rounds, when
the drafter closes. Without a cached curve, calibration waits for the first round that has something
to draft (a plain run never pays for it), and the draft model's cache is filled only when its measured
cost leaves room for it to pay.

Calibration times the batch sizes in pairs with 1-token passes (calibrate.time_target_paired); a
machine too busy to measure keeps the curve for this answer only, says so in the round's note, and is
measured again on the next answer. A curve from the cache is a hypothesis: pairs of neighbouring rounds
(one a 1-token pass, one a batch) test it (cost_cache.CurveCheck), and where the rounds do not form such
pairs by themselves (a run that decodes plainly throughout, or drafts throughout) a check round makes one
now and then: a draft of one token in a plain run, a plain round in a drafting one, paid for from
EXPLORE of the rounds' time. A curve the rounds contradict is dropped from the cache and measured afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from localspec.backends.base import Backend
from localspec.decoding.calibrate import BUSY_SPREAD, measure
from localspec.decoding.cost_cache import CHECK_PAIRS, CONTRADICTION, CostStore, CurveCheck
from localspec.decoding.drafters import Drafter, LazyModelDrafter, NgramDrafter
from localspec.draft import EMPTY_DRAFT, Draft
from localspec.decoding.policy import EXPLORE, MAX_BACKOFF, CostModel, Controller, Plan
from localspec.decoding.suffix import SuffixDrafter
from localspec.sampling import SamplingParams
from localspec.decoding.stats import RoundStats
from localspec.errors import Interrupted, LocalspecError

SHADOWS = 8  # lookup proposals graded against the text that followed, at most this many pending
SHADOW_SPAN = 4  # ... each on its first tokens only
DRAFT_REPS = 3  # timings of the draft model on its first run here (the least is kept)
CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # batch sizes timed (plus the top one): the curve, not a guess
CALIBRATION_REPS = 3  # pairs per batch size: their median outlasts one pair that a busy spell split


def auto_ngram() -> NgramDrafter:
    """Prompt-lookup n-grams up to 5 tokens long (auto's lookup drafter before the suffix drafter)."""
    return NgramDrafter(max_ngram=5)


def auto_lookup() -> SuffixDrafter:
    """The lookup drafter auto uses: suffix matches over the session, ungated (the policy decides)."""
    return SuffixDrafter(gate=False)


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
        self.model = model
        self.target = target
        self.clock = clock
        self.store = store
        from_store = costs is None and store is not None
        if costs is None and store is not None:
            costs = store.load()
        # Only a remembered curve is checked: one measured in this process was timed in pairs just now.
        self.check = CurveCheck(dict(costs.target)) if from_store and costs is not None else None
        self._check_credit = 0.0  # seconds check rounds may still cost (EXPLORE of the rounds' time)
        self._checks_agreed = 0  # pairs in a row that agreed with the curve: checks back off
        self._checking = False  # this round is a check round
        self._remeasure = False  # the curve was contradicted: measure afresh in the next round
        self._unstored = ""  # why the costs in use must not be stored (empty: they may)
        self._cost_note = ""  # what became of the costs, said once in the next round's note
        self.controller = Controller(costs)
        self.calibrated_k = max(costs.target, default=0) - 1 if costs is not None else 0  # longest draft timed
        self._need_calibration = False
        parts = [p for p in (ngram.name if ngram else "", model.name if model else "") if p]
        self.name = "auto(" + "+".join(parts) + ")"
        self.max_k = 0
        self._plan: Plan | None = None
        self._order = 0
        self._catch_up_s = 0.0
        self._setup_s = 0.0  # this round's one-off seconds (calibration, loading the draft model)
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
        # Calibrating now would delay the first token: it waits for the first round with a draft to offer.
        self._need_calibration = self.calibrated_k < max_k and self.target is not None and max_k > 0
        # Nor does the draft model read the prompt now: it catches up in one batch when a plan first needs
        # it (the policy counts that cost), so a run where model drafts never pay never pays for it.

    def model_can_pay(self) -> bool:
        """Whether the draft model could beat plain decoding here even if every draft token were accepted
        (True while its cost is unmeasured)."""
        return self.controller.model_can_pay(self.max_k)

    def _calibrate(self, context: Sequence[int], max_k: int) -> None:
        # The target's cache holds the text so far. The draft is timed on a short prefix of it, which
        # keeps its state a prefix of the text. Batch sizes up to the top one, CALIBRATION_REPS times each
        # in pairs with a 1-token pass (refined by every round, then remembered on disk): a few seconds on
        # a CPU, once per machine.
        assert self.target is not None
        top = max_k + 1
        prefix = list(context[: max(2, min(17, len(context) - 1))])
        draft = self.model if self.controller.costs.draft_token is None else None
        sizes = [n for n in CALIBRATION_SIZES if n < top] + [top]
        # The draft's cost decides whether it is ever loaded again on this machine (a draft that cannot
        # pay is skipped unseen): the least of DRAFT_REPS timings, as noise on a shared machine only adds.
        calibration = measure(
            self.target, draft, prefix, max_batch=top, sizes=sizes, reps=CALIBRATION_REPS, clock=self.clock,
            draft_reps=DRAFT_REPS,
        )
        measured, costs = calibration.costs, self.controller.costs
        if measured.target:  # the whole curve up to the top: nothing of an older (perhaps contradicted) one stays
            costs.target = {n: t / costs.scale for n, t in measured.target.items()}
        if measured.draft_token is not None:
            costs.draft_token = measured.draft_token / costs.scale
        costs.rollback_round = measured.rollback_round
        if not measured.target:
            return
        self.check = None
        if calibration.busy:
            # Kept for this answer (the medians of pairs are the best guess there is), never stored.
            spread = f"timings spread {calibration.timings.spread:.0%} IQR/median, over {BUSY_SPREAD:.0%}"
            self._unstored = f"machine too busy to measure ({spread})"
            said = f"auto: costs not stored: {self._unstored}; measured again next answer"
            self._cost_note = _join(self._cost_note, said)
            return  # calibrated_k stays: the next answer measures again
        self._unstored = ""
        self.calibrated_k = max_k
        self.save_costs()

    def save_costs(self) -> None:
        if self.store is not None and not self._unstored:
            self.store.save(self.controller.costs)

    def _calibration_due(self, ngram_avail: int) -> bool:
        if self._remeasure:
            return self.target is not None and self.max_k > 0
        return self._need_calibration and (ngram_avail > 0 or (self.model is not None and self.model_can_pay()))

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator, *, min_confidence: float = 0.0
    ) -> Draft:
        ng = EMPTY_DRAFT
        self._order = 0
        if self.ngram is not None and k > 0:
            self._grade_shadows(context)
            ng = self.ngram.propose(context, k, sampling, rng)
            self._order = ng.order if ng.tokens else 0
        self._setup_s = 0.0
        if self._calibration_due(len(ng.tokens)):
            self._need_calibration = self._remeasure = False
            if self.controller.costs.draft_token is None:
                self._load_model()  # a lazy draft model is loaded only now, to be timed
            t0 = self.clock()
            self._calibrate(context, self.max_k)
            self._setup_s += self.clock() - t0
        gap = self.model.lag(context) if self.model is not None else 0
        plan = self.controller.plan(
            k, model=self.model is not None, ngram_avail=len(ng.tokens), ngram_order=self._order, model_gap=gap
        )
        if plan.method == "model" and not self._load_model():
            plan = self.controller.plan(k, model=False, ngram_avail=len(ng.tokens), ngram_order=self._order)
        self._checking = self._check_due(plan, k)
        if self._checking:
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
            d = self.model.propose(context, plan.k, sampling, rng, min_confidence=max(min_confidence, plan.min_confidence))
            note = _join(said, plan.note() + (f"; {d.note}" if d.note else ""))
            return Draft(d.tokens, d.q, note, d.source if d.source != "none" else "model")  # a head says its family
        if self._checking:
            return self._check_draft(context, said)
        return Draft([], None, _join(said, plan.note()))

    def _check_due(self, plan: Plan, k: int) -> bool:
        """Whether this round should check the remembered curve: make the round the other kind (a batch
        after a 1-token pass, or a 1-token pass after a batch) than the last, while the allowance lasts."""
        last = self.check.last if self.check is not None else None
        if last is None or k <= 0 or self._check_credit < 0:
            return False
        return (plan.method == "none") == (last[0] == 1)

    def _check_draft(self, context: Sequence[int], said: str) -> Draft:
        assert self.check is not None and self.check.last is not None
        if self.check.last[0] > 1:
            return Draft([], None, _join(said, "auto: plain, to check T(1) against the remembered costs"))
        # The cheapest batch: one token drafted (the last one again; verified like any draft, so harmless).
        note = _join(said, "auto: check T(2) against the remembered costs")
        return Draft([int(context[-1])], None, note, "check")

    def _check_curve(self, stats: RoundStats) -> None:
        """Test the remembered curve against this round, pay for a check round; drop a contradicted curve."""
        if self.check is None:
            return
        seconds = stats.verify_s - stats.rollback_s
        before = self.check.last
        deviation = self.check.observe(stats.n_drafted + 1, seconds)
        if self._checking and before is not None:
            # What the check cost over the round it replaced: the batch's extra seconds in a plain run; a
            # whole plain round (at most) where the run drafts. It backs off while the curve holds.
            cost = seconds - before[1] if stats.n_drafted else seconds
            self._check_credit -= max(cost, 0.0) * 2 ** min(self._checks_agreed, MAX_BACKOFF)
        else:
            self._check_credit += EXPLORE * seconds
        if deviation is not None:
            held = 1 / CONTRADICTION <= deviation <= CONTRADICTION
            self._checks_agreed = self._checks_agreed + 1 if held else 0
        if self.check.contradicted:
            self._drop_curve(self.check.deviation or 0.0)

    def _drop_curve(self, deviation: float) -> None:
        why = f"T(n)/T(1) {deviation:.2g}x its own over {CHECK_PAIRS} pairs of rounds"
        self._cost_note = f"auto: remembered costs contradicted by live rounds ({why}): dropped, measuring afresh"
        self.check = None
        if self.store is not None:
            self.store.drop()
        self._unstored = "contradicted by live rounds"  # until measured afresh
        self.calibrated_k = 0
        self._remeasure = self.target is not None

    def _load_model(self) -> bool:
        """Make sure the draft model is loaded (a lazy one loads now, its seconds kept out of the round's
        draft cost); False when there is none, or it failed to load (auto then goes on without it)."""
        if not isinstance(self.model, LazyModelDrafter) or self.model.loaded:
            return self.model is not None
        t0 = self.clock()
        try:
            self.model.load()
        except Interrupted:
            raise
        except LocalspecError as e:
            self.model_note = f"auto: draft model dropped: {e}"
            self.model = None
            return False
        finally:
            self._setup_s += self.clock() - t0
        return True

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
        if self._plan is not None:
            # Catching the draft's cache up after plain rounds is a one-off, not the draft's per-token cost.
            # So are calibration and loading the draft model.
            drafting = replace(stats, draft_s=max(stats.draft_s - self._catch_up_s - self._setup_s, 0.0))
            self.controller.observe(self._plan, drafting, self._order)
        self._check_curve(stats)
        self._plan = None
        self._checking = False
        self._catch_up_s = 0.0
        self._setup_s = 0.0

    def lag(self, context: Sequence[int]) -> int:
        return 0  # auto catches its model draft up itself, when a plan needs it

    def catch_up(self, context: Sequence[int]) -> None:
        pass

    def _catch_up(self, context: Sequence[int]) -> float:
        """Feed the draft model what it missed during plain or n-gram rounds, in one batch; its seconds."""
        assert self.model is not None
        t0 = self.clock()
        self.model.catch_up(context)
        return self.clock() - t0

    def close(self) -> None:
        self.save_costs()  # the curve as this run's rounds refined it
        for d in (self.ngram, self.model):
            if d is not None:
                d.close()


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)
