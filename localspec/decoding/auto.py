"""`--draft-method auto`: pick each round's draft (n-gram, model, or none) from measured costs and acceptance.

AutoDrafter composes an n-gram drafter and a model drafter through the Drafter protocol only, and
leaves the decisions to localspec.decoding.policy (pure) and the first measurements to
localspec.decoding.calibrate. While plain decoding wins, n-gram proposals are still made and graded
against the text the target then writes, which measures their acceptance for free (exactly, at any
temperature). Every round's note says what was chosen and why; the run's SpecStats.sources totals it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from localspec.backends.base import Backend
from localspec.decoding.calibrate import calibrate
from localspec.decoding.drafters import EMPTY_DRAFT, Draft, Drafter, NgramDrafter
from localspec.decoding.policy import MARGIN, NGRAM_PRIOR, CostModel, Controller, Plan
from localspec.decoding.sampling import SamplingParams
from localspec.decoding.stats import RoundStats

SHADOWS = 8  # n-gram proposals graded against the text that followed, at most this many pending


def auto_ngram() -> NgramDrafter:
    """The n-gram drafter auto uses: matches up to 5 tokens long, each length with its own acceptance."""
    return NgramDrafter(max_ngram=max(NGRAM_PRIOR))



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
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if ngram is None and model is None:
            raise ValueError("auto drafting needs an n-gram drafter, a model drafter, or both")
        self.ngram = ngram
        self.model = model
        self.target = target
        self.clock = clock
        self.controller = Controller(costs)
        self.calibrated_k = max(costs.target, default=0) - 1 if costs is not None else 0  # longest draft timed
        parts = [p for p in ("ngram" if ngram else "", model.name if model else "") if p]
        self.name = "auto(" + "+".join(parts) + ")"
        self.max_k = 0
        self._plan: Plan | None = None
        self._order = 0
        self._catch_up_s = 0.0
        self._shadows: list[tuple[list[int], int, int]] = []  # (proposal, n-gram order, context length then)

    # -- Drafter protocol -------------------------------------------------------------------------

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self.max_k = max_k
        self._shadows = []
        if self.ngram is not None:
            self.ngram.prepare(context, max_k)
        self.controller.new_generation()
        if self.calibrated_k < max_k and self.target is not None and max_k > 0:
            self._calibrate(context, max_k)
        if self.model is not None and self.model_can_pay():
            self.model.prepare(context, max_k)  # else the draft catches up only if a probe ever needs it

    def model_can_pay(self) -> bool:
        """Whether the draft model could beat plain decoding here even if every draft token were accepted."""
        c = self.controller
        return c.ceiling("model", self.max_k) > c.plain_rate() * (1.0 + MARGIN) or 1 not in c.costs.target

    def _calibrate(self, context: Sequence[int], max_k: int) -> None:
        # The target's cache holds the prompt now. The draft is timed on a short prefix of the prompt,
        # which keeps its state a prefix of the text. A few batch sizes (the rest interpolated, then
        # refined by every round): about a second on a CPU.
        assert self.target is not None
        top = max_k + 1
        prefix = list(context[: max(2, min(17, len(context) - 1))])
        draft = self.model if self.controller.costs.draft_token is None else None
        measured = calibrate(
            self.target, draft, prefix, max_batch=top, reps=2, clock=self.clock, sizes=(1, 2, 3, top // 2 + 1, top)
        )
        costs = self.controller.costs
        costs.target.update({n: t / costs.scale for n, t in measured.target.items()})
        if measured.draft_token is not None:
            costs.draft_token = measured.draft_token / costs.scale
        costs.rollback_round = measured.rollback_round
        if measured.target:
            self.calibrated_k = max_k

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator, *, min_confidence: float = 0.0
    ) -> Draft:
        ng = EMPTY_DRAFT
        self._order = 0
        if self.ngram is not None and k > 0:
            self._grade_shadows(context)
            ng = self.ngram.propose(context, k, sampling, rng)
            self._order = ng.order if ng.tokens else 0
        gap = self.model.lag(context) if self.model is not None else 0
        plan = self.controller.plan(
            k, model=self.model is not None, ngram_avail=len(ng.tokens), ngram_order=self._order, model_gap=gap
        )
        self._plan = plan
        if ng.tokens and plan.method != "ngram":
            # Not used this round: grade it against the text that follows, for free.
            self._shadows.append((list(ng.tokens), self._order, len(context)))
            del self._shadows[:-SHADOWS]
        if plan.method == "ngram":
            return Draft(ng.tokens[: plan.k], None, plan.note() + f" n-gram order {self._order}", "ngram", self._order)
        if plan.method == "model":
            assert self.model is not None
            self._catch_up_s = self._catch_up(context) if gap > 0 else 0.0
            if gap > 0:
                self.controller.costs.observe_catch_up(gap, self._catch_up_s)
            d = self.model.propose(context, plan.k, sampling, rng, min_confidence=max(min_confidence, plan.min_confidence))
            note = plan.note() + (f"; {d.note}" if d.note else "")
            return Draft(d.tokens, d.q, note, "model")
        return Draft([], None, plan.note())

    def _grade_shadows(self, context: Sequence[int]) -> None:
        """Score earlier unused n-gram proposals against what the target actually wrote.

        Under the exact rule a one-hot draft token d is accepted with probability p(d), which is also
        the chance the target itself emits d: so matching proposals against the emitted text measures
        n-gram acceptance without spending a verify pass, at any temperature.
        """
        pending = []
        for tokens, order, start in self._shadows:
            seen = context[start : start + len(tokens)]
            n = 0
            while n < len(seen) and seen[n] == tokens[n]:
                n += 1
            if n < len(seen) or len(seen) == len(tokens):
                self.controller.ngram_acceptance(order).update(n, len(tokens))
            else:
                pending.append((tokens, order, start))
        self._shadows = pending

    def observe(self, stats: RoundStats) -> None:
        if self._plan is not None:
            # Catching the draft's cache up after plain rounds is a one-off, not the draft's per-token cost.
            drafting = replace(stats, draft_s=max(stats.draft_s - self._catch_up_s, 0.0))
            self.controller.observe(self._plan, drafting, self._order)
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
        return self.clock() - t0

    def close(self) -> None:
        for d in (self.ngram, self.model):
            if d is not None:
                d.close()
