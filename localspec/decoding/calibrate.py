"""Short timing runs that seed auto's cost model (and bench's and doctor's cost tables).

They drive a real target backend and a real drafter. The target's cache ends as it began; a drafter's
state ends wherever its last proposal left it, which its next proposal resyncs from (Drafter protocol).

The target's curve is timed in pairs (time_target_paired): every batch of n > 1 tokens right after a
1-token pass, cycling through the sizes several times, and kept as ratios T(n) / T(1) of each pair. A busy
spell on a shared machine then slows both passes of a pair alike instead of one side of the curve; and a
machine too busy to measure shows itself in the spread of the 1-token timings, or of the ratios
(PairedTimings.busy), where one timing per size would have looked like any other curve.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.backends.base import Backend
from localspec.decoding.drafters import Drafter
from localspec.decoding.policy import CostModel
from localspec.sampling import SamplingParams

Stat = Callable[[list[float]], float]
_GREEDY = SamplingParams()
# IQR / median of the paired timings above this: too busy to measure. A quiet machine keeps forward
# passes within a few percent of each other (bench's MAX_SPREAD draws the same line for its tables).
BUSY_SPREAD = 0.25
MIN_JUDGED = 4  # fewer timings than this say nothing about their spread


def time_target(
    target: Backend,
    sizes: Sequence[int],
    *,
    reps: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    stat: Stat = min,
    warm_up: bool = True,
) -> dict[int, float]:
    """T(n) for each batch size n on the current cache, which is restored after each pass.

    Each size is timed `reps` times after one warm-up pass (`warm_up`) and summarized by `stat`: the
    minimum by default (noise on a shared machine only ever adds time), the median for reporting. The
    passes append copies of the last cached token and are rolled back.
    """
    n0 = len(target.cached_tokens)
    sizes = sorted({n for n in sizes if n >= 1 and n0 + n <= target.n_ctx})
    if n0 == 0 or not sizes:
        return {}
    filler = int(target.cached_tokens[-1])
    target.checkpoint()  # every pass is rolled back to here (a recurrent model restores its state)
    if warm_up:
        target.forward([filler], all_logits=False)
        target.rollback(n0)
    out: dict[int, float] = {}
    for n in sizes:
        samples = []
        for _ in range(reps):
            t0 = clock()
            target.forward([filler] * n, all_logits=True)
            samples.append(clock() - t0)
            target.rollback(n0)
        out[n] = float(stat(samples))
    return out


def spread_ratio(samples: Sequence[float]) -> float:
    """IQR / median of some timings (0 for fewer than MIN_JUDGED: too few to say)."""
    if len(samples) < MIN_JUDGED:
        return 0.0
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else 0.0


@dataclass(frozen=True)
class PairedTimings:
    """The target's timings in pairs: every 1-token pass, and for each n > 1 the (T(1), T(n)) pairs."""

    one: tuple[float, ...]
    pairs: dict[int, tuple[tuple[float, float], ...]]

    def ratios(self, n: int) -> list[float]:
        return [tn / t1 for t1, tn in self.pairs.get(n, ()) if t1 > 0]

    @property
    def spread(self) -> float:
        """The wider of two spreads (IQR / median): of the 1-token timings, and of every pair's ratio over its
        size's median ratio (pooled). The first sees a pace that changed during the run; the second, pairs
        that a spell split (one pass slowed, not the other)."""
        relative = []
        for n in self.pairs:
            r = self.ratios(n)
            mid = statistics.median(r) if r else 0.0
            relative += [x / mid for x in r] if mid > 0 else []
        return max(spread_ratio(self.one), spread_ratio(relative))

    @property
    def busy(self) -> bool:
        return self.spread > BUSY_SPREAD

    def curve(self) -> dict[int, float]:
        """T(1) as the median 1-token pass, T(n) as the median ratio to its neighbouring T(1) times that."""
        if not self.one:
            return {}
        t1 = statistics.median(self.one)
        out = {1: t1}
        for n, pairs in self.pairs.items():
            r = self.ratios(n)
            out[n] = statistics.median(r) * t1 if r else statistics.median(tn for _, tn in pairs)
        return out


def time_target_paired(
    target: Backend,
    sizes: Sequence[int],
    *,
    reps: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> PairedTimings:
    """Each batch size n > 1 timed `reps` times, each right after a 1-token pass, in an order rotated from
    one repetition to the next (no size always first). The cache ends as it began."""
    run = PairedRun(target, sizes, reps=reps, clock=clock)
    while run.step():
        pass
    return run.timings()


class PairedRun:
    """time_target_paired in pieces, for idle time: each step() is one piece (the warm-up pass, or one pair),
    on the cache as it is then (which it leaves as it found it), so a caller can stop between any two."""

    def __init__(
        self, target: Backend, sizes: Sequence[int], *, reps: int = 3, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.target, self.clock = target, clock
        batch = sorted({n for n in sizes if n > 1})
        rotations = [batch[i % len(batch) :] + batch[: i % len(batch)] for i in range(reps)] if batch else []
        self.order = [n for rotation in rotations for n in rotation]
        self.one: list[float] = []
        self.pairs: dict[int, list[tuple[float, float]]] = {n: [] for n in batch}
        self.last: tuple[int, float, float] | None = None  # the last piece: (n, T(1), T(n)); n = 1 for the warm-up
        self._warm = False

    def step(self) -> bool:
        """Time one piece; False when none is left (or the cache leaves no room to time anything)."""
        n0 = len(self.target.cached_tokens)
        if n0 == 0 or n0 + 1 > self.target.n_ctx:
            return False
        if not self._warm:
            self._warm = True
            t1 = time_target(self.target, [1], reps=1, clock=self.clock)[1]  # the warm-up, and a first T(1)
            self.one.append(t1)
            self.last = (1, t1, t1)
            return True
        while self.order:
            n = self.order.pop(0)
            if n0 + n > self.target.n_ctx:
                continue
            timed = time_target(self.target, [1, n], reps=1, clock=self.clock, warm_up=False)
            self.one.append(timed[1])
            self.pairs[n].append((timed[1], timed[n]))
            self.last = (n, timed[1], timed[n])
            return True
        return False

    def timings(self) -> PairedTimings:
        return PairedTimings(tuple(self.one), {n: tuple(p) for n, p in self.pairs.items() if p})


def time_rollback(
    target: Backend,
    k: int,
    *,
    reps: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    stat: Stat = min,
) -> float | None:
    """Seconds to cut a verify pass of k + 1 tokens back after a rejection half way (k // 2 drafts kept):
    next to nothing for a KV cache; a state restore and the kept tokens fed again for a recurrent model
    whose snapshots do not reach. The cache ends as it began."""
    n0 = len(target.cached_tokens)
    if n0 == 0 or k < 1 or n0 + k + 1 > target.n_ctx:
        return None
    filler = int(target.cached_tokens[-1])
    target.checkpoint()
    samples = []
    for _ in range(reps):
        target.forward([filler] * (k + 1), all_logits=True)
        t0 = clock()
        target.rollback(n0 + 1 + k // 2)
        samples.append(clock() - t0)
        target.rollback(n0)
    return float(stat(samples))


def time_drafter(
    drafter: Drafter,
    context: Sequence[int],
    *,
    tokens_per_draft: int = 4,
    reps: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    stat: Stat = min,
) -> float | None:
    """A drafter's seconds per drafted token, from timed greedy proposals continuing `context`.

    The first proposal is a warm-up that also brings the drafter's state in line with `context`.
    """
    if len(context) < 2:
        return None
    rng = np.random.default_rng(0)
    drafter.propose(context, 1, _GREEDY, rng)
    samples = []
    for _ in range(reps):
        t0 = clock()
        d = drafter.propose(context, tokens_per_draft, _GREEDY, rng)
        dt = clock() - t0
        if d.tokens:
            samples.append(dt / len(d.tokens))
    return float(stat(samples)) if samples else None


@dataclass(frozen=True)
class Calibration:
    costs: CostModel
    timings: PairedTimings  # the target's, behind costs.target

    @property
    def busy(self) -> bool:
        """Whether the machine was too busy for the curve to stand for it (PairedTimings.busy)."""
        return self.timings.busy


def measure(
    target: Backend,
    drafter: Drafter | None = None,
    context: Sequence[int] | None = None,
    *,
    max_batch: int,
    sizes: Sequence[int] | None = None,
    reps: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    stat: Stat = min,
    draft_reps: int | None = None,
) -> Calibration:
    """T(n) for n in `sizes` (default 1..max_batch) on the target's current cache, timed in pairs
    (time_target_paired, `reps` pairs a size), and the drafter's seconds per token on `context` (default:
    the target's cached tokens), timed `draft_reps` times (default: `reps`) and summarized by `stat`; with
    the paired timings behind the curve, which say whether it can be trusted."""
    costs = CostModel()
    wanted = [n for n in (sizes or range(1, max_batch + 1)) if n <= max_batch]
    timings = time_target_paired(target, wanted, reps=reps, clock=clock)
    costs.target.update(timings.curve())
    if target.info.is_recurrent:  # a KV cache is cut in microseconds: not worth two more passes
        costs.rollback_round = time_rollback(target, max_batch - 1, reps=reps, clock=clock, stat=stat) or 0.0
    if drafter is not None:
        ctx = list(context if context is not None else target.cached_tokens)
        costs.draft_token = time_drafter(
            drafter, ctx, tokens_per_draft=max(2, min(max_batch, 4)), reps=draft_reps or reps, clock=clock, stat=stat
        )
    return Calibration(costs, timings)
