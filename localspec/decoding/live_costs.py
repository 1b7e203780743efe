"""The target's cost curve learnt from the rounds an answer runs anyway, per context length.

Every verify pass is a timing of T(n) at the size it verified, and a plain round is T(1): auto needs
no extra passes to learn the curve. LiveCurve keeps recent T(1) timings per context bucket (attention
grows with the context, so a long prompt's T(1) is its own) and each batch size's ratio T(n) / T(1)
to the 1-token pass right before it when there was one (a pair: a busy spell slows both), else to the
recent T(1) of its bucket, and summarizes both by medians (one preempted pass on a shared machine
moves nothing). Sizes timed fewer than MIN_RATIOS times follow a straight line T(n) = T(1) (1 + c (n - 1)),
c the median of the rounds' slopes pooled with PRIOR_WEIGHT slopes of C_PRIOR (so one or two passes a
busy spell slowed cannot end the exploring), within [0, C_MAX].
Idle-time calibration (pairs of a 1-token pass and a batch) feeds the same samples.

The curve is stored only when it is consistent: enough timings, plausible (cost_cache.plausible), and
not spread more than a busy machine spreads them (calibrate.BUSY_SPREAD).
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from localspec.decoding.calibrate import BUSY_SPREAD, MIN_JUDGED, spread_ratio

C_PRIOR = 0.15  # a CPU-like slope until a round says otherwise: lookup drafts of long matches pay, probes can
C_MAX = 1.0  # a batch token never costs more than a decode token of its own (beyond: a preempted pass)
T1_KEEP = 15  # recent 1-token timings per context bucket
T1_RECENT = 3  # ... the last of which set the pace a batch without a pair is compared with
RATIO_KEEP = 5  # recent ratios per batch size (a spell's ratios leave soon)
PRIOR_WEIGHT = 2  # prior slopes pooled with the rounds'

# Batch sizes with STORE_RATIOS ratios each before a curve may be stored (the spread judges them). One: a new-text
# answer times T(2) a couple of times and nothing longer, and with two sizes asked every such answer learnt afresh
# on the prior (a few percent of it). A curve of T(1) and T(2) gives the next process their ratio's power law for
# longer passes, which their first timings replace (policy.CostModel.observe_target); its checks test it.
STORE_SIZES = 1
STORE_RATIOS = 2
MIN_RATIOS = 3  # a size stands on its own from this many ratios on (the median of two is their mean)
BUCKET_BASE = 1024  # context buckets: up to 1k, 2k, 4k, 8k, 16k, ... tokens


def context_bucket(n_tokens: int) -> int:
    """0 for up to 1k tokens of context, then one more per doubling (2k, 4k, 8k, 16k, ...)."""
    return max(0, math.ceil(math.log2(max(n_tokens, 1) / BUCKET_BASE)))


def bucket_label(bucket: int) -> str:
    return f"<={BUCKET_BASE << bucket >> 10}k"


@dataclass
class LiveCurve:
    """T(1) per context bucket and T(n) / T(1) per batch size, from live rounds (and idle calibration)."""

    one: dict[int, collections.deque[float]] = field(default_factory=dict)  # bucket -> recent T(1) seconds
    ratios: dict[int, collections.deque[float]] = field(default_factory=dict)  # n -> recent T(n) / T(1)

    def add_plain(self, context: int, seconds: float) -> None:
        if seconds > 0:
            self.one.setdefault(context_bucket(context), collections.deque(maxlen=T1_KEEP)).append(seconds)

    def add_batch(self, context: int, n: int, seconds: float, paired: float | None = None) -> None:
        """A verify pass of n > 1 tokens: a ratio to the 1-token pass just before it (`paired`), else to its own
        bucket's recent T(1) (none until that is timed: another length's T(1) would put the context's growth
        into the curve's shape)."""
        own = self.one.get(context_bucket(context))
        t1 = paired if paired else statistics.median(list(own)[-T1_RECENT:]) if own else None
        if n > 1 and seconds > 0 and t1 is not None:
            self.ratios.setdefault(n, collections.deque(maxlen=RATIO_KEEP)).append(seconds / t1)

    def add_pair(self, context: int, t1: float, n: int, tn: float) -> None:
        """A calibration pair: a 1-token pass and a batch right after it (their own ratio)."""
        self.add_plain(context, t1)
        if n > 1 and t1 > 0 and tn > 0:
            self.ratios.setdefault(n, collections.deque(maxlen=RATIO_KEEP)).append(tn / t1)

    def t1(self, context: int) -> float | None:
        """Median T(1) of the context's bucket, or of the nearest bucket timed (None: none timed)."""
        if not self.one:
            return None
        b = context_bucket(context)
        nearest = min(self.one, key=lambda x: (abs(x - b), -x))
        return statistics.median(self.one[nearest])

    def wants_t1(self, context: int) -> bool:
        """Whether this context's bucket has too few 1-token timings to judge them (a drafting run's rounds
        time none: a plain round now and then does)."""
        return len(self.one.get(context_bucket(context), ())) < MIN_JUDGED

    def slope(self) -> float:
        """c in T(n) = T(1) (1 + c (n - 1)): the median of the rounds' slopes, within [0, C_MAX]."""
        slopes = [(r - 1) / (n - 1) for n, rs in self.ratios.items() for r in rs] + [C_PRIOR] * PRIOR_WEIGHT
        return min(max(statistics.median(slopes), 0.0), C_MAX)

    def shape(self, top: int) -> dict[int, float]:
        """T(n) / T(1) at 1, every size timed, and `top` (the line's, unless timed)."""
        out = {1: 1.0} | {n: statistics.median(rs) for n, rs in sorted(self.ratios.items()) if len(rs) >= MIN_RATIOS}
        if top > 1 and top not in out:
            out[top] = max(1.0 + self.slope() * (top - 1), max(out.values()))
        return out

    def curve(self, context: int, top: int) -> dict[int, float]:
        """Seconds by batch size at this context length (empty until a 1-token pass is timed)."""
        t1 = self.t1(context)
        return {} if t1 is None else {n: r * t1 for n, r in self.shape(top).items()}

    @property
    def spread(self) -> float:
        """The wider spread (IQR / median) of the 1-token timings in their buckets and of the ratios per size."""
        ones = _relative(self.one.values(), 1)
        rel = _relative(self.ratios.values(), STORE_RATIOS)
        return max(spread_ratio(ones), spread_ratio(rel))

    def timed_enough(self) -> str:
        """Why the timings do not make a curve yet ("" when they do, however busy the machine was)."""
        if max((len(ts) for ts in self.one.values()), default=0) < MIN_JUDGED:
            return "too few 1-token timings"
        if sum(len(rs) >= STORE_RATIOS for rs in self.ratios.values()) < STORE_SIZES:
            return "too few batch sizes timed"
        return ""

    def storable(self) -> str:
        """Why the curve must not be stored yet ("" when it may)."""
        if why := self.timed_enough():
            return why
        spread = self.spread
        if spread > BUSY_SPREAD:
            return f"machine too busy to measure (timings spread {spread:.0%} IQR/median, over {BUSY_SPREAD:.0%})"
        return ""

    def stored_curve(self) -> dict[int, float]:
        """The curve to remember: T(1) of the most timed bucket, the sizes timed at least STORE_RATIOS times."""
        bucket = max(self.one, key=lambda b: (len(self.one[b]), -b))
        t1 = statistics.median(self.one[bucket])
        sized = {n: statistics.median(rs) for n, rs in self.ratios.items() if len(rs) >= STORE_RATIOS}
        return {1: t1} | {n: r * t1 for n, r in sorted(sized.items())}


def _relative(groups: Iterable[collections.deque[float]], least: int) -> list[float]:
    """Every value over its own group's median (one median a group: this runs every round while learning)."""
    out: list[float] = []
    for values in groups:
        if len(values) >= least:
            mid = statistics.median(values)
            out.extend(v / mid for v in values)
    return out
