"""The policy behind `--draft-method auto`: measured costs and acceptance in, this round's plan out.

Pure: no backends, no clocks. Speculation pays only when the tokens a round is expected to emit
outweigh what the round costs:

    rate(method, j) = E(alpha, j) / (draft_cost(j) + T(j + 1) + (1 - alpha**j) R)   tokens per second
    E(alpha, j)     = 1 + alpha + ... + alpha**j                       (expected tokens per round)
    plain rate      = 1 / T(1)

R is what cutting the target back after a rejection costs: nothing for a KV cache, a state restore
and the kept tokens fed again for a recurrent or hybrid model whose snapshots do not reach (measured
from the rounds, as RoundStats.rollback_s).

T(n) is the target's time for a batch of n tokens and draft_cost(j) is j times the draft model's time
per token (about zero for n-gram lookup). All of these are measured: the rounds time them
(localspec.decoding.live_costs), idle-time calibration adds sizes the rounds did not reach, every
round's own draft/verify seconds keep them current, and one common factor follows how busy the machine
is, so plain and speculative estimates do not drift apart. Acceptance alpha is a decayed
success count per draft source (per matched n-gram length for prompt lookup), so it follows the text.
Each round takes the option with the best rate, plain decoding included.

A lookup draft copies text, and a copy that has held for longer is likelier to hold on: its i-th token
extends a match of L + i tokens (L: the match the draft starts from). So lookup acceptance is kept per
match length (in buckets), as the chance that a copy of that length goes on one more token, and a draft
of j tokens is expected to emit 1 + sum over m <= j of prod over i < m of alpha(L + i) tokens. (Measured on
the agentic suite's recorded answers, benchmarks/hazard.py: a copy of 8-15 tokens goes on 94% of the time,
16-31 99%, 32+ 99.3%, where the acceptance of whole drafts by their starting match is much lower; one
alpha per draft would cut long copies short.) Model drafts keep one alpha (the geometric sum above).

A model draft must actually run to be measured, so while plain decoding wins it is re-probed on a small
allowance of the plain decoding time (EXPLORE), halved after each probe that changes nothing, and never
when even perfect acceptance could not pay. Model drafts stop early at a token the draft itself doubts
(a threshold from the costs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from localspec.decoding.stats import RoundStats

Method = Literal["none", "ngram", "model"]

COST_DECAY = 0.15  # EMA weight of a new n-gram lookup timing
COMMON_RATE = 0.1  # log-EMA weight of a round's timing on the machine's overall pace
SHAPE_RATE = 0.15  # ... and on the cost of that batch size (or of a draft token) itself
NEW_SIZE_CLIP = 1.5  # a size's first timing sets its cost, within this factor of the curve's guess
ACCEPT_DECAY = 0.85  # per-round decay of acceptance counts: memory of roughly 7 rounds
CONFIDENCE_SCALE = 0.5  # see Controller._with_confidence
MARGIN = 0.03  # speculation must beat plain decoding by this much (timing noise)
# ... and by this much where the copy's acceptance is still its prior alone (no draft or withheld proposal of its
# length graded yet): the priors sit near what pays on a CPU's steep T(n), where a wrong guess costs two tokens'
# time and a right one saves one (new prose that echoes the prompt). The free grading settles it soon.
PRIOR_MARGIN = 0.10
EXPLORE = 0.03  # model-draft re-probes may cost at most this share of the plain decoding time between them
MAX_BACKOFF = 5  # ... and that allowance halves after each probe that does not change the decision, 2**5 at most
DRAFT_REPS = 3  # the draft model's first timings: the least of them stands until this many (noise only adds)
CATCH_UP_ROUNDS = 8  # a draft model that fell behind is caught up once: its cost is spread over this many rounds
# A draft token's cost as a share of T(1) until it is timed: the draft's size over the target's where both are
# known (AutoDrafter passes it), else this. Its catch-up prior per token takes the same share of what a target
# token costs in the largest batch measured: a prompt read in one batch, not token by token.
DRAFT_RATIO = 0.5
# Priors (weight of about two rounds): optimistic enough to try, quickly overruled.
MODEL_PRIOR = 0.6
# Lookup drafts (n-gram, suffix): the chance that a copy of a given length goes on one more token, in
# buckets of that length (see match_bucket; a draft's i-th token is a copy of its match + i tokens).
# A suffix draft that resumes a copy after an edit (localspec.decoding.resync) has Draft.order RESYNC + v,
# v the context tokens since the edit that confirm it: its own buckets (v = 0, 1, 2-3, 4-7, 8-15; from
# RESUMED on it counts as a plain match of v tokens). An unconfirmed guess (v = 0) starts below what pays,
# so it is graded for free (withheld proposals) first.
RESYNC = 1 << 10
RESUMED = 16  # a copy resumed after an edit, confirmed by this many tokens, is as sure as a plain match
NGRAM_PRIOR = {1: 0.15, 2: 0.3, 3: 0.45, 4: 0.55, 5: 0.65, 8: 0.85, 16: 0.93, 32: 0.97}
NGRAM_PRIOR |= {RESYNC: 0.3, RESYNC + 1: 0.6, RESYNC + 2: 0.7, RESYNC + 4: 0.8, RESYNC + 8: 0.85}


def match_bucket(length: int) -> int:
    """Lookup acceptance is tracked per match length, in buckets that double: 1, 2, 3, 4, 5-7, 8-15, 16-31, 32+
    (resync drafts: RESYNC + 0, 1, 2-3, 4-7, 8-15 verified tokens; from RESUMED on, a plain match's)."""
    if length >= RESYNC:
        verified = length - RESYNC
        if verified < RESUMED:
            return RESYNC + next(b for b in (8, 4, 2, 1, 0) if verified >= b)
        length = verified
    for b in (32, 16, 8, 5, 4, 3, 2):
        if length >= b:
            return b
    return 1


def ngram_prior(length: int) -> float:
    return NGRAM_PRIOR[match_bucket(length)]


def survival(alphas: Sequence[float]) -> list[float]:
    """P(the first m draft tokens are all accepted) for m = 1..len(alphas), given each one's acceptance
    after the ones before it were accepted."""
    out, p = [], 1.0
    for a in alphas:
        p *= a
        out.append(p)
    return out


def expected_tokens(alpha: float, j: int) -> float:
    """Tokens a round emits with j drafts each accepted with probability alpha (geometric model)."""
    if j <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(j + 1)
    return (1.0 - alpha ** (j + 1)) / (1.0 - alpha)


@dataclass(frozen=True)
class _Shape:
    """Unscaled T(n) from the measured sizes: measured sizes exact, interpolated between them (as numpy.interp
    does), the first size's cost below them; beyond them the measured growth goes on as a power of n,
    T(first..last) ~ n**b (one size: a CPU-like 15% per extra token). Not the last slope: a CPU's batches grow
    cheaper per token with size (a 2-core CPU measured 0.66 T(1) per token from 5 to 6 tokens, 0.36 from 16 to
    32), and a curve known only to 6 tokens would rule out the long copies that would measure it further."""

    sizes: list[int]
    times: list[float]
    power: float

    @classmethod
    def of(cls, target: dict[int, float]) -> _Shape:
        sizes = sorted(target)
        times = [target[n] for n in sizes]
        if len(sizes) < 2:
            return cls(sizes, times, 0.0)
        growth = math.log(max(times[-1], 1e-12) / max(times[0], 1e-12)) / math.log(sizes[-1] / sizes[0])
        return cls(sizes, times, min(max(growth, 0.0), 1.0))

    def extend(self, bases: list[float], n_max: int) -> None:
        """Append T(n) for n = len(bases) .. n_max to `bases`: one loop, no call per size (what a round adds must
        not grow with the longest draft it weighs: tests/test_auto_costs.py counts the calls)."""
        sizes, times = self.sizes, self.times
        j = 0
        for n in range(len(bases), n_max + 1):
            if not sizes:
                t = math.nan
            elif len(sizes) == 1:
                t = times[0] if n == sizes[0] else times[0] * (1.0 + 0.15 * (n - sizes[0]))
            elif n > sizes[-1]:
                t = times[-1] * (n / sizes[-1]) ** self.power
            elif n <= sizes[0]:
                t = times[0]
            else:
                while sizes[j + 1] <= n:  # sizes[j] <= n < sizes[j + 1], or n is the last size
                    j += 1
                    if j == len(sizes) - 1:
                        break
                if n == sizes[j]:
                    t = times[j]
                else:  # as numpy.interp computes it
                    t = (times[j + 1] - times[j]) / (sizes[j + 1] - sizes[j]) * (n - sizes[j]) + times[j]
            bases.append(t)


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
    rollback_round: float = 0.0  # seconds to cut the target back after a rejection (recurrent state restores)
    # The sizes' costs and the unscaled curve made from them (unscaled_curve), extended as far as a plan has read.
    _curve: tuple[tuple[tuple[int, float], ...], list[float]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def copy(self) -> CostModel:
        return CostModel(
            dict(self.target), self.draft_token, self.ngram_round, self.scale, self.catch_up_token, self.rollback_round
        )

    def rollback_s(self, all_accepted: float, j: int) -> float:
        """Expected rollback seconds of a round with j drafts, all accepted with probability `all_accepted`."""
        return (1.0 - all_accepted) * self.rollback_round if j > 0 else 0.0

    def observe_rollback(self, seconds: float) -> None:
        self.rollback_round += COST_DECAY * (seconds - self.rollback_round)

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

    def target_curve(self, n_max: int) -> np.ndarray:
        """[T(1), ..., T(n_max)] as target_s gives them."""
        return self.scale * np.array(self.unscaled_curve(n_max)[1 : n_max + 1])

    def unscaled_curve(self, n_max: int) -> list[float]:
        """[nan, T(1) / scale, ..., T(n) / scale] for some n >= n_max, indexed by size. Plain floats made once per
        change of the sizes' costs: auto plans every round on a few sizes, where numpy's calls (~1 us each) cost
        more than the arithmetic. The sizes' costs are set in several places (observe_target, cost learning,
        calibration), so their contents are the cache's key, not a flag each would have to raise."""
        key = tuple(self.target.items())
        if self._curve is None or self._curve[0] != key:
            self._curve = (key, [math.nan])
        bases = self._curve[1]
        if len(bases) <= n_max:
            _Shape.of(self.target).extend(bases, n_max)
        return bases

    def draft_s(self) -> float | None:
        return None if self.draft_token is None else self.scale * self.draft_token

    def _base(self, n: int) -> float:
        return self.target[n] if n in self.target else self.unscaled_curve(n)[n]

    def observe_target(self, n: int, seconds: float) -> None:
        if not self.target:
            self.target[n] = seconds / self.scale
            return
        r = _ratio(seconds, self.target_s(n))
        base = self._base(n)
        if n not in self.target:
            # A size never timed had only an inter- or extrapolated guess: its first timing replaces it (within
            # NEW_SIZE_CLIP of the guess, so one preempted pass cannot price it out), and says nothing of the
            # machine's pace. Blending it in at SHAPE_RATE would keep a curve known to 6 tokens pricing long
            # copies by its extrapolation for dozens of rounds, and store that guess as if it were measured.
            self.target[n] = base * min(max(r, 1.0 / NEW_SIZE_CLIP), NEW_SIZE_CLIP)
            return
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
            "rollback_round_s": self.rollback_round,
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

    @property
    def graded(self) -> bool:
        """Whether any draft (or withheld proposal) was graded here: else alpha is the prior alone."""
        return self.accepted + self.rejected > 0

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
    why: str = ""  # a plain plan made without weighing the options: why there were none

    @property
    def gain(self) -> float:
        return self.rate / self.plain_rate if self.plain_rate > 0 else 1.0

    def note(self) -> str:
        if self.method == "none" and self.why:
            return f"auto: plain ({self.why})"
        if self.method == "none":
            return f"auto: plain (best speculation est. {self.gain:.2f}x)"
        tag = "probe " if self.probe else ""
        return f"auto: {tag}{self.method} k={self.k} (alpha {self.alpha:.2f}, est. {self.gain:.2f}x)"


class Controller:
    """The decisions, separate from the drafting: costs in, plan out. Pure apart from its own state."""

    def __init__(self, costs: CostModel | None = None, draft_ratio: float = DRAFT_RATIO) -> None:
        self.costs = costs.copy() if costs is not None else CostModel()
        self.draft_ratio = draft_ratio  # a draft token's share of T(1) until the draft is timed
        self.model_accept = Acceptance(MODEL_PRIOR)
        self.ngram_accept = {n: Acceptance(p) for n, p in NGRAM_PRIOR.items()}
        self.probe_credit = 0.0  # plain decoding seconds since the last model probe
        self.probe_fails = 0  # model probes in a row that left plain decoding ahead
        # Draft-model timings so far (a remembered cost counts as settled): until DRAFT_REPS, the least of
        # them stands and probes go on, so one probe in a busy spell cannot rule the draft out for good.
        self.draft_timings = DRAFT_REPS if self.costs.draft_token is not None else 0
        self._least_draft = math.inf

    def ngram_acceptance(self, order: int) -> Acceptance:
        """How often a copy of `order` tokens (a lookup match, extended by the draft so far) goes on."""
        return self.ngram_accept[match_bucket(order)]

    def observe_lookup(self, order: int, n_accepted: int, n_drafted: int) -> None:
        """A lookup draft from a match of `order` tokens, graded: its i-th token counts for length order + i."""
        if n_drafted <= 0:
            return
        held: dict[int, int] = {}
        for i in range(n_accepted):
            b = match_bucket(order + i)
            held[b] = held.get(b, 0) + 1
        broke = match_bucket(order + n_accepted) if n_accepted < n_drafted else None
        for b in {*held, *([broke] if broke is not None else [])}:
            n = held.get(b, 0)
            self.ngram_accept[b].update(n, n + (1 if b == broke else 0))

    def _alphas(self, method: Method, order: int, k_max: int) -> list[float]:
        """Each draft position's acceptance, given the ones before it were accepted."""
        if method == "model":
            return [self.model_accept.alpha] * k_max
        return [self.ngram_acceptance(order + i).alpha for i in range(k_max)]

    def best(self, method: Method, k_max: int, order: int = 0, extra: float = 0.0) -> Plan:
        """The best draft length for one source (ignoring plain decoding); `extra`: seconds added per round.
        A plain loop over the lengths: auto plans every round, and on up to 32 lengths this takes a few
        microseconds where numpy's dozen calls took 16-26."""
        plain = self.plain_rate()
        if k_max <= 0:
            return Plan("none", 0, plain, plain)
        alphas = self._alphas(method, order, k_max)
        bases = self.costs.unscaled_curve(k_max + 1)
        scale, rollback_round = self.costs.scale, self.costs.rollback_round
        fixed, per_token = self._draft_cost_terms(method)
        held, accepted = 1.0, 0.0  # P(the first j all accepted); the sum of those for 1..j
        top, top_rate = 1, -1.0
        for j in range(1, k_max + 1):
            held *= alphas[j - 1]
            accepted += held
            draft = fixed if per_token is None else j * per_token
            cost = draft + scale * bases[j + 1] + (1.0 - held) * rollback_round + extra  # T(j + 1) verifies j
            rate = (1.0 + accepted) / cost if cost > 0 else 0.0
            if rate > top_rate:  # the first of equal rates: the shortest draft
                top, top_rate = j, rate
        return Plan(method, top, top_rate, plain, alphas[0])

    def plain_rate(self) -> float:
        t1 = self.costs.target_s(1)
        return 1.0 / t1 if t1 and t1 > 0 and not math.isnan(t1) else 0.0

    def _draft_cost_terms(self, method: Method, optimistic: bool = False) -> tuple[float, float | None]:
        """What a draft costs: (seconds a round, None) for a lookup, (0, seconds a token) for the model;
        `optimistic`: the prior's cost where it is lower than a timing not yet settled."""
        if method == "ngram":
            return self.costs.ngram_round, None
        d = self.costs.draft_s()
        prior = self.draft_ratio * self.costs.target_s(1)
        return 0.0, prior if d is None else min(d, prior) if optimistic else d

    def catch_up_s(self, n_tokens: int) -> float:
        """Seconds for the draft model to read n tokens it missed: measured, else from the draft's cost, else
        the draft's share (draft_ratio) of a target token's cost in the largest batch measured."""
        if self.costs.catch_up_token is not None or self.costs.draft_token is not None or n_tokens <= 0:
            return self.costs.catch_up_s(n_tokens)
        n = max(self.costs.target)
        per = self.costs.target_s(n) / n if n > 1 else 0.25 * self.costs.target_s(1)
        return n_tokens * self.draft_ratio * per

    def model_can_pay(self, k_max: int) -> bool:
        """Whether a model draft could beat plain decoding even with every draft token accepted
        (True while the costs are unknown: only a measurement can say no)."""
        if 1 not in self.costs.target or not self.draft_settled:
            return True
        return self.ceiling("model", k_max) > self.plain_rate() * (1.0 + MARGIN)

    @property
    def draft_settled(self) -> bool:
        """Whether the draft model's cost rests on DRAFT_REPS timings (or was remembered)."""
        return self.draft_timings >= DRAFT_REPS

    def plan(self, k_max: int, *, model: bool, ngram_avail: int = 0, ngram_order: int = 0, model_gap: int = 0) -> Plan:
        """This round's plan: the best of plain, n-gram (when a match of ngram_avail tokens exists), model.

        model_gap: tokens the draft model would first have to catch up on (after plain or n-gram rounds).
        """
        plain = self.plain_rate()
        if k_max <= 0:
            return Plan("none", 0, plain, plain)
        if 1 not in self.costs.target:  # nothing measured yet: a plain round measures T(1)
            return Plan("none", 0, 0.0, 0.0)
        catch_up = self.catch_up_s(model_gap) / CATCH_UP_ROUNDS
        options: list[Plan] = []
        if ngram_avail > 0:
            options.append(self.best("ngram", min(k_max, ngram_avail), ngram_order))
        if model:
            options.append(self.best("model", k_max, extra=catch_up))
        if not options:
            return Plan("none", 0, plain, plain)
        top = max(options, key=lambda p: p.rate)
        if top.rate > plain * (1.0 + self._margin(top, ngram_order)):
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
            if self.draft_timings == 0:
                allowance = math.inf  # never timed: the first probe is the measurement (a short draft, k <= 2)
            # The catch-up a probe entails is not charged to the allowance (it grows with every plain round,
            # and pays off if the probe does), but a probe must be able to win with it, spread as a plan
            # spreads it: after a long plain stretch on a CPU the draft's catch-up alone rules a probe out.
            # Before the draft is timed, on its prior costs: the first probe of every conversation would
            # otherwise read the whole prompt into the draft model inside the answer (2.3-2.8 s of a 6.6 s
            # answer on a 455-token prompt, on this CPU) where no draft could pay.
            # A timing not yet settled rules nothing out (a busy spell): the prior's cost where it is lower.
            unsettled = not self.draft_settled
            could_win = self.ceiling("model", k_max, extra=catch_up, optimistic=unsettled) > plain * (1.0 + MARGIN)
            if allowance >= probe_cost and could_win:
                self.probe_credit = 0.0
                self.probe_fails += 1
                m = next(p for p in options if p.method == "model")
                return Plan("model", k, m.rate, plain, m.alpha, probe=True)
        return Plan("none", 0, top.rate, plain, top.alpha)

    def _margin(self, plan: Plan, order: int) -> float:
        """What a plan must gain over plain decoding: PRIOR_MARGIN for a copy whose acceptance is its prior alone."""
        if plan.method == "ngram" and not self.ngram_acceptance(order).graded:
            return PRIOR_MARGIN
        return MARGIN

    def ceiling(
        self, method: Method, k_max: int, ngram_avail: int = 0, extra: float = 0.0, optimistic: bool = False
    ) -> float:
        """The best rate a source could reach if every draft token were accepted (`extra`: seconds added per round;
        `optimistic`: see _draft_cost_terms)."""
        k_top = k_max if method == "model" else min(k_max, max(ngram_avail, 1))
        if k_top <= 0:
            return 0.0
        bases = self.costs.unscaled_curve(k_top + 1)
        scale = self.costs.scale
        fixed, per_token = self._draft_cost_terms(method, optimistic)
        top = 0.0
        for j in range(1, k_top + 1):
            cost = (fixed if per_token is None else j * per_token) + scale * bases[j + 1] + extra
            rate = (j + 1) / cost if cost > 0 else math.inf
            if rate > top:
                top = rate
        return top

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
        self.costs.observe_target(stats.n_drafted + 1, stats.verify_s - stats.rollback_s)
        if stats.n_accepted < stats.n_drafted:
            self.costs.observe_rollback(stats.rollback_s)
        if method == "model":
            self._observe_draft(stats.n_drafted, stats.draft_s)
            self.model_accept.update(stats.n_accepted, stats.n_drafted)
        elif method == "ngram":
            self.costs.observe_ngram(stats.draft_s)
            self.observe_lookup(ngram_order, stats.n_accepted, stats.n_drafted)

    def _observe_draft(self, n_tokens: int, seconds: float) -> None:
        if self.draft_settled:
            self.costs.observe_draft(n_tokens, seconds)
            return
        self.draft_timings += 1
        self._least_draft = min(self._least_draft, seconds / n_tokens / self.costs.scale)
        self.costs.draft_token = self._least_draft

    def new_generation(self) -> None:
        self.model_accept.soften(0.25)
        for a in self.ngram_accept.values():
            a.soften(0.25)
        self.probe_credit, self.probe_fails = 0.0, 0
