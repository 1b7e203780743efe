"""`--draft-method auto`: pick each round's draft (n-gram, model, or none) from measured costs and acceptance.

Speculation pays only when the tokens a round is expected to emit outweigh what the round costs:

    rate(method, j) = E(alpha, j) / (draft_cost(j) + T(j + 1))      tokens per second
    E(alpha, j)     = 1 + alpha + ... + alpha**j                       (expected tokens per round)
    plain rate      = 1 / T(1)

T(n) is the target's time for a batch of n tokens and draft_cost(j) is j times the draft model's time
per token (about zero for n-gram lookup). All of these are measured: a short calibration on the first
generation seeds them, and every round's own draft/verify seconds keep them current (one common factor
follows how busy the machine is, so plain and speculative estimates do not drift apart). Acceptance
alpha is a decayed success count per draft source (per matched n-gram length for prompt lookup), so it
follows the text. Each round takes the option with the best rate, plain decoding included.

While plain decoding wins, n-gram proposals are still made and graded against the text the target
then writes, which measures their acceptance for free (exactly, at any temperature); a model draft
must actually run to be measured, so it is re-probed on a small allowance of the plain decoding time
(EXPLORE), halved after each probe that changes nothing, and never when even perfect acceptance could
not pay. Model drafts stop early at a token the draft itself doubts (a threshold from the costs).
Every round's note says what was chosen and why; AutoDrafter.summary() totals it.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from localspec.backends.base import Backend, common_prefix
from localspec.spec.drafters import EMPTY_DRAFT, Draft, ModelDrafter, NgramDrafter
from localspec.spec.sampling import SamplingParams
from localspec.spec.stats import RoundStats

Method = Literal["none", "ngram", "model"]

COST_DECAY = 0.15  # EMA weight of a new n-gram lookup timing
COMMON_RATE = 0.1  # log-EMA weight of a round's timing on the machine's overall pace
SHAPE_RATE = 0.15  # ... and on the cost of that batch size (or of a draft token) itself
ACCEPT_DECAY = 0.85  # per-round decay of acceptance counts: memory of roughly 7 rounds
CONFIDENCE_SCALE = 0.5  # see Controller._with_confidence
MARGIN = 0.03  # speculation must beat plain decoding by this much (timing noise)
EXPLORE = 0.03  # model-draft re-probes may cost at most this share of the plain decoding time between them
MAX_BACKOFF = 5  # ... and that allowance halves after each probe that does not change the decision, 2**5 at most
CATCH_UP_ROUNDS = 8  # a draft model that fell behind is caught up once: its cost is spread over this many rounds
SHADOWS = 8  # n-gram proposals graded against the text that followed, at most this many pending
# Priors (weight of about two rounds): optimistic enough to try, quickly overruled.
MODEL_PRIOR = 0.6
NGRAM_PRIOR = {1: 0.15, 2: 0.3, 3: 0.45, 4: 0.55, 5: 0.65}  # by the length of the matched n-gram


def auto_ngram() -> NgramDrafter:
    """The n-gram drafter auto uses: matches up to 5 tokens long, each length with its own acceptance."""
    return NgramDrafter(max_ngram=max(NGRAM_PRIOR))


def expected_tokens(alpha: float, j: int) -> float:
    """Tokens a round emits with j drafts each accepted with probability alpha (geometric model)."""
    if j <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(j + 1)
    return (1.0 - alpha ** (j + 1)) / (1.0 - alpha)


@dataclass
class CostModel:
    """Measured seconds: target forward by batch size, draft model per token, n-gram lookup per round.

    `target` and `draft_token` hold the shape (relative costs, from calibration and refined online);
    `scale` follows how fast the machine runs right now. A busy spell on a shared machine slows plain
    and speculative rounds alike, so one common factor carries it and the comparison between them
    does not go stale while only one of them runs.
    """

    target: dict[int, float] = field(default_factory=dict)  # n -> seconds for a forward of n tokens (x scale)
    draft_token: float | None = None  # seconds per draft-model token (x scale)
    ngram_round: float = 0.0
    scale: float = 1.0
    catch_up_token: float | None = None  # seconds per token when the draft model catches up in one batch

    def copy(self) -> CostModel:
        return CostModel(dict(self.target), self.draft_token, self.ngram_round, self.scale, self.catch_up_token)

    def catch_up_s(self, n_tokens: int) -> float:
        """Seconds for the draft to take in n tokens it missed (prior: a batch token costs 1/4 of a decode one)."""
        if n_tokens <= 0:
            return 0.0
        per = self.catch_up_token if self.catch_up_token is not None else 0.25 * (self.draft_token or 0.0)
        return n_tokens * per * self.scale

    def observe_catch_up(self, n_tokens: int, seconds: float) -> None:
        if n_tokens >= 4:  # a batch too small says little about the per-token cost of a big one
            per = seconds / n_tokens / self.scale
            old = self.catch_up_token
            self.catch_up_token = per if old is None else old + COST_DECAY * (per - old)

    def target_s(self, n: int) -> float:
        """T(n), interpolated between measured sizes; beyond them, linear in the last measured slope."""
        return self.scale * self._base(n)

    def draft_s(self) -> float | None:
        return None if self.draft_token is None else self.scale * self.draft_token

    def _base(self, n: int) -> float:
        if n in self.target:
            return self.target[n]
        if not self.target:
            return math.nan
        sizes = sorted(self.target)
        times = [self.target[s] for s in sizes]
        if len(sizes) == 1:
            return times[0] * (1.0 + 0.15 * (n - sizes[0]))  # prior: a CPU-like 15% per extra token
        if n < sizes[0]:
            return times[0]
        if n > sizes[-1]:
            slope = max((times[-1] - times[-2]) / (sizes[-1] - sizes[-2]), 0.0)
            return times[-1] + slope * (n - sizes[-1])
        return float(np.interp(n, sizes, times))

    def observe_target(self, n: int, seconds: float) -> None:
        if not self.target:
            self.target[n] = seconds / self.scale
            return
        r = _ratio(seconds, self.target_s(n))
        base = self._base(n)
        self.scale *= r**COMMON_RATE  # the machine's pace: moves every estimate
        self.target[n] = base * r**SHAPE_RATE  # this batch size's own cost

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        per = seconds / n_tokens
        if self.draft_token is None:
            self.draft_token = per / self.scale
        else:
            self.draft_token *= _ratio(per, self.scale * self.draft_token) ** (COMMON_RATE + SHAPE_RATE)

    def observe_ngram(self, seconds: float) -> None:
        self.ngram_round += COST_DECAY * (seconds - self.ngram_round)

    def as_dict(self) -> dict[str, object]:
        return {
            "target_s": {str(k): self.target_s(k) for k in sorted(self.target)},
            "draft_token_s": self.draft_s(),
        }


def _ratio(observed: float, predicted: float) -> float:
    """observed / predicted, clipped: one preempted round on a busy machine must not swing the model."""
    if not predicted or predicted <= 0 or math.isnan(predicted) or observed <= 0:
        return 1.0
    return min(max(observed / predicted, 0.25), 4.0)


class Acceptance:
    """Decayed counts of accepted and rejected draft positions: alpha = P(next draft token accepted)."""

    def __init__(self, prior: float, weight: float = 2.0) -> None:
        self.prior, self.weight = prior, weight
        self.accepted = 0.0
        self.rejected = 0.0
        self.rounds = 0

    @property
    def alpha(self) -> float:
        a = self.accepted + self.prior * self.weight
        return a / (self.accepted + self.rejected + self.weight)

    def update(self, n_accepted: int, n_drafted: int) -> None:
        self.accepted = self.accepted * ACCEPT_DECAY + n_accepted
        self.rejected = self.rejected * ACCEPT_DECAY + (1 if n_accepted < n_drafted else 0)
        self.rounds += 1

    def soften(self, keep: float) -> None:
        """A new generation: keep some of what was learned as a prior, let the new text speak quickly."""
        self.accepted *= keep
        self.rejected *= keep


@dataclass(frozen=True)
class Plan:
    method: Method
    k: int
    rate: float  # predicted tokens/s of this choice
    plain_rate: float  # predicted tokens/s of plain decoding
    alpha: float = 0.0
    probe: bool = False
    min_confidence: float = 0.0

    @property
    def gain(self) -> float:
        return self.rate / self.plain_rate if self.plain_rate > 0 else 1.0

    def note(self) -> str:
        if self.method == "none":
            return f"auto: plain (best speculation est. {self.gain:.2f}x)"
        tag = "probe " if self.probe else ""
        return f"auto: {tag}{self.method} k={self.k} (alpha {self.alpha:.2f}, est. {self.gain:.2f}x)"


class Controller:
    """The decisions, separate from the drafting: costs in, plan out. Pure apart from its own state."""

    def __init__(self, costs: CostModel | None = None) -> None:
        self.costs = costs.copy() if costs is not None else CostModel()
        self.model_accept = Acceptance(MODEL_PRIOR)
        self.ngram_accept = {n: Acceptance(p) for n, p in NGRAM_PRIOR.items()}
        self.probe_credit = 0.0  # plain decoding seconds since the last model probe
        self.probe_fails = 0  # model probes in a row that left plain decoding ahead

    def ngram_acceptance(self, order: int) -> Acceptance:
        order = max(1, min(order, max(NGRAM_PRIOR)))
        return self.ngram_accept[order]

    def best(self, method: Method, k_max: int, order: int = 0, extra: float = 0.0) -> Plan:
        """The best draft length for one source (ignoring plain decoding); `extra`: seconds added per round."""
        plain = self.plain_rate()
        acc = self.model_accept if method == "model" else self.ngram_acceptance(order)
        alpha = acc.alpha
        best = Plan("none", 0, plain, plain)
        for j in range(1, k_max + 1):
            cost = self._draft_cost(method, j) + self.costs.target_s(j + 1) + extra
            rate = expected_tokens(alpha, j) / cost if cost > 0 else 0.0
            if best.method == "none" or rate > best.rate:
                best = Plan(method, j, rate, plain, alpha)
        return best

    def plain_rate(self) -> float:
        t1 = self.costs.target_s(1)
        return 1.0 / t1 if t1 and t1 > 0 and not math.isnan(t1) else 0.0

    def _draft_cost(self, method: Method, j: int) -> float:
        if method == "ngram":
            return self.costs.ngram_round
        d = self.costs.draft_s()
        return j * (d if d is not None else 0.5 * self.costs.target_s(1))

    def plan(
        self, k_max: int, *, model: bool, ngram_avail: int = 0, ngram_order: int = 0, model_gap: int = 0
    ) -> Plan:
        """This round's plan: the best of plain, n-gram (when a match of ngram_avail tokens exists), model.

        model_gap: tokens the draft model would first have to catch up on (after plain or n-gram rounds).
        """
        plain = self.plain_rate()
        if k_max <= 0:
            return Plan("none", 0, plain, plain)
        if 1 not in self.costs.target:  # nothing measured yet: a plain round measures T(1)
            return Plan("none", 0, 0.0, 0.0)
        catch_up = self.costs.catch_up_s(model_gap) / CATCH_UP_ROUNDS
        options: list[Plan] = []
        if ngram_avail > 0:
            options.append(self.best("ngram", min(k_max, ngram_avail), ngram_order))
        if model:
            options.append(self.best("model", k_max, extra=catch_up))
        if not options:
            return Plan("none", 0, plain, plain)
        top = max(options, key=lambda p: p.rate)
        if top.rate > plain * (1.0 + MARGIN):
            if top.method == "model":
                self.probe_fails, self.probe_credit = 0, 0.0
            return self._with_confidence(top)
        # Plain decoding wins on current estimates. N-gram acceptance keeps being measured for free (the
        # drafter grades its proposals against the text that follows); a model draft has to be tried,
        # so it is re-probed on an allowance of EXPLORE of the plain time, halved after each miss, and
        # only if it could win at all (with every token accepted).
        if model:
            self.probe_credit += self.costs.target_s(1)
            k = min(k_max, 2)
            probe_cost = k * (self.costs.draft_s() or 0.0) + self.costs.target_s(k + 1) - self.costs.target_s(1)
            allowance = self.probe_credit * EXPLORE / 2 ** min(self.probe_fails, MAX_BACKOFF)
            # (Catching the draft up is left out: it grows with every plain round, and pays off if the probe does.)
            if allowance >= probe_cost and self.ceiling("model", k_max) > plain * (1.0 + MARGIN):
                self.probe_credit = 0.0
                self.probe_fails += 1
                m = next(p for p in options if p.method == "model")
                return Plan("model", k, m.rate, plain, m.alpha, probe=True)
        return Plan("none", 0, top.rate, plain, top.alpha)

    def ceiling(self, method: Method, k_max: int, ngram_avail: int = 0) -> float:
        """The best rate a source could reach if every draft token were accepted."""
        k_top = k_max if method == "model" else min(k_max, max(ngram_avail, 1))
        rates = [(j + 1) / (self._draft_cost(method, j) + self.costs.target_s(j + 1)) for j in range(1, k_top + 1)]
        return max(rates, default=0.0)

    def _with_confidence(self, plan: Plan) -> Plan:
        """Model drafts stop at a token whose confidence c cannot pay for itself: c * rate < d + dT.

        Halved, because a draft's top probability understates how often the target agrees with it
        (where both are sure, they agree); capped so that confident runs are never cut.
        """
        if plan.method != "model":
            return plan
        d = self.costs.draft_s() or 0.0
        dt = max(self.costs.target_s(plan.k + 1) - self.costs.target_s(plan.k), 0.0)
        threshold = min(CONFIDENCE_SCALE * plan.rate * (d + dt), 0.6)
        return Plan(plan.method, plan.k, plan.rate, plan.plain_rate, plan.alpha, plan.probe, threshold)

    def observe(self, plan: Plan, stats: RoundStats, ngram_order: int = 0) -> None:
        method = plan.method if stats.n_drafted > 0 else "none"
        self.costs.observe_target(stats.n_drafted + 1, stats.verify_s)
        if method == "model":
            self.costs.observe_draft(stats.n_drafted, stats.draft_s)
            self.model_accept.update(stats.n_accepted, stats.n_drafted)
        elif method == "ngram":
            self.costs.observe_ngram(stats.draft_s)
            self.ngram_acceptance(ngram_order).update(stats.n_accepted, stats.n_drafted)

    def new_generation(self) -> None:
        self.model_accept.soften(0.25)
        for a in self.ngram_accept.values():
            a.soften(0.25)
        self.probe_credit, self.probe_fails = 0.0, 0


def calibrate(
    target: Backend,
    draft: Backend | None,
    *,
    max_batch: int,
    reps: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    stat: Callable[[list[float]], float] = min,
    sizes: Sequence[int] | None = None,
) -> CostModel:
    """Measure T(1..max_batch) and the draft's seconds per token on the current caches, then restore them.

    Each size is timed `reps` times after one warm-up pass and summarized by `stat`: the minimum by
    default (noise on a shared machine only ever adds time), the median for reporting. The forwards append
    copies of the last cached token and are rolled back, so the caches end as they began.
    """
    costs = CostModel()
    n0 = len(target.cached_tokens)
    if n0 == 0 or n0 + max_batch > target.n_ctx:
        return costs
    filler = int(target.cached_tokens[-1])
    target.forward([filler], all_logits=False)  # warm-up
    target.rollback(n0)
    for n in sorted(set(sizes)) if sizes else range(1, max_batch + 1):
        if n > max_batch:
            continue
        samples = []
        for _ in range(reps):
            t0 = clock()
            target.forward([filler] * n, all_logits=True)
            samples.append(clock() - t0)
            target.rollback(n0)
        costs.target[n] = float(stat(samples))
    if draft is not None and len(draft.cached_tokens) > 0:
        m0 = len(draft.cached_tokens)
        tok = int(draft.cached_tokens[-1])
        n_tok = max(2, min(max_batch, 4)) * reps
        if m0 + n_tok + 1 <= draft.n_ctx:
            draft.forward([tok], all_logits=False)  # warm-up
            samples = []
            for _ in range(n_tok):
                t0 = clock()
                draft.forward([tok], all_logits=False)
                samples.append(clock() - t0)
            draft.rollback(m0)
            costs.draft_token = float(stat(samples))
    return costs


class AutoDrafter:
    """Adaptive drafting over an n-gram drafter and/or a model drafter (the `auto` draft method)."""

    method = "auto"

    def __init__(
        self,
        *,
        ngram: NgramDrafter | None = None,
        model: ModelDrafter | None = None,
        target: Backend | None = None,
        costs: CostModel | None = None,
        max_k: int = 8,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if ngram is None and model is None:
            raise ValueError("auto drafting needs an n-gram drafter, a model drafter, or both")
        self.ngram = ngram
        self.model = model
        self.target = target
        self.max_k = max_k
        self.clock = clock
        self.controller = Controller(costs)
        self.calibrated = costs is not None and bool(costs.target)
        parts = [p for p in ("ngram" if ngram else "", model.name if model else "") if p]
        self.name = "auto(" + "+".join(parts) + ")"
        self._plan: Plan | None = None
        self._order = 0
        self._catch_up_s = 0.0
        self._shadows: list[tuple[list[int], int, int]] = []  # (proposal, n-gram order, context length then)
        self.decisions: Counter[str] = Counter()
        self.drafted_k: Counter[str] = Counter()

    # -- Drafter protocol -------------------------------------------------------------------------

    def prepare(self, context: Sequence[int]) -> None:
        self._shadows = []
        if self.ngram is not None:
            self.ngram.prepare(context)
        self.controller.new_generation()
        if not self.calibrated and self.target is not None:
            self._calibrate(context)
        if self.model is not None and self.model_can_pay():
            self.model.prepare(context)  # else the draft catches up only if a probe ever needs it

    def model_can_pay(self) -> bool:
        """Whether the draft model could beat plain decoding here even if every draft token were accepted."""
        c = self.controller
        return c.ceiling("model", self.max_k) > c.plain_rate() * (1.0 + MARGIN) or 1 not in c.costs.target

    def _calibrate(self, context: Sequence[int]) -> None:
        # The target's cache holds the prompt now. The draft needs a little context to be timed on;
        # a short prefix of the prompt keeps its cache a prefix of the text.
        draft = self.model.backend if self.model is not None else None
        if draft is not None and common_prefix(draft.cached_tokens, context, limit=len(context) - 1) == 0:
            draft.rollback(0)
            draft.forward(list(context[: max(1, min(32, len(context) - 1))]), all_logits=False)
        # A few batch sizes (the rest interpolated, then refined by every round): about a second on a CPU.
        top = self.max_k + 1
        measured = calibrate(
            self.target, draft, max_batch=top, reps=2, clock=self.clock, sizes=(1, 2, 3, top // 2 + 1, top)  # type: ignore[arg-type]
        )
        costs = self.controller.costs
        costs.target.update({n: t / costs.scale for n, t in measured.target.items()})
        if measured.draft_token is not None:
            costs.draft_token = measured.draft_token / costs.scale
        self.calibrated = bool(measured.target)

    def propose(self, context: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator) -> Draft:
        k = min(k, self.max_k)
        ng = EMPTY_DRAFT
        self._order = 0
        if self.ngram is not None and k > 0:
            self._grade_shadows(context)
            ng = self.ngram.propose(context, k, sampling, rng)
            self._order = self.ngram.last_order if ng.tokens else 0
        gap = self._model_gap(context)
        plan = self.controller.plan(
            k, model=self.model is not None, ngram_avail=len(ng.tokens), ngram_order=self._order, model_gap=gap
        )
        self._plan = plan
        key = ("probe " if plan.probe else "") + plan.method
        self.decisions[key] += 1
        if ng.tokens and plan.method != "ngram":
            # Not used this round: grade it against the text that follows, for free.
            self._shadows.append((list(ng.tokens), self._order, len(context)))
            del self._shadows[:-SHADOWS]
        if plan.method == "ngram":
            self.drafted_k[key] += plan.k
            return Draft(ng.tokens[: plan.k], None, plan.note() + f" n-gram order {self._order}")
        if plan.method == "model":
            assert self.model is not None
            self._catch_up_s = self._catch_up(context)
            if gap > 0:
                self.controller.costs.observe_catch_up(gap, self._catch_up_s)
            self.model.min_confidence = plan.min_confidence
            d = self.model.propose(context, plan.k, sampling, rng)
            self.drafted_k[key] += len(d.tokens)
            note = plan.note() + (f"; {d.note}" if d.note else "")
            return Draft(d.tokens, d.q, note)
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

    def _model_gap(self, context: Sequence[int]) -> int:
        if self.model is None:
            return 0
        return len(context) - 1 - common_prefix(self.model.backend.cached_tokens, context, limit=len(context) - 1)

    def observe(self, stats: RoundStats) -> None:
        if self._plan is not None:
            # Catching the draft's cache up after plain rounds is a one-off, not the draft's per-token cost.
            drafting = replace(stats, draft_s=max(stats.draft_s - self._catch_up_s, 0.0))
            self.controller.observe(self._plan, drafting, self._order)
        self._plan = None
        self._catch_up_s = 0.0

    def _catch_up(self, context: Sequence[int]) -> float:
        """Feed the draft model what it missed during plain or n-gram rounds, in one batch; its seconds."""
        assert self.model is not None
        backend = self.model.backend
        keep = common_prefix(backend.cached_tokens, context, limit=len(context) - 1)
        if keep >= len(context) - 1:
            return 0.0
        t0 = self.clock()
        backend.rollback(keep)
        backend.forward(context[keep:-1], all_logits=False)
        return self.clock() - t0

    def close(self) -> None:
        if self.model is not None:
            self.model.close()

    # -- reporting --------------------------------------------------------------------------------

    def summary(self) -> str:
        """What auto did over its lifetime, e.g. `plain 40, model 12 (mean k 3.1), probe model 2`."""
        parts = []
        for key, n in sorted(self.decisions.items(), key=lambda kv: -kv[1]):
            if key.endswith("none"):
                parts.append(f"{key.replace('none', 'plain')} {n}")
            else:
                parts.append(f"{key} {n} (mean k {self.drafted_k[key] / n:.1f})")
        return ", ".join(parts) or "no rounds"
