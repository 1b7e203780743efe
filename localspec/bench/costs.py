"""The cost curve `localspec bench` reports: every timing kept, its spread shown, and a verdict.

Each batch size n > 1 is timed right after a 1-token pass (calibrate.time_target over the sizes
(1, n)), cycling through the sizes several times, so a busy spell on a shared machine slows T(1) and
T(n) alike instead of one of them. Every timing is kept (pooled over the bench's repetitions); the
curve is their median per size, shown with min-max and the spread IQR/median.

The timings cannot carry the analytic bound (bench shows "bound: not shown") when

- any size's timings (or the draft's per-token ones) spread more than MAX_SPREAD, as IQR/median:
  a quiet machine keeps forward passes within a few percent of each other, a busy one does not;
- the median curve is one no machine has (cost_cache.plausible, the test auto's stored costs pass
  too): a batch of n > 1 tokens under MIN_BATCH_RATIO of one token's pass, or a smaller batch over
  MAX_INVERSION times a larger one.

- the machine's 1-minute load average (os.getloadavg) when the timings ran exceeded its CPU count:
  more threads wanted to run than there were cores, so some forward passes waited for one. (The
  measuring process's own threads count too: with --threads all CPUs it brings the load up to about
  the CPU count by itself, so more than that means other work wanted the same cores.)

With fewer than MIN_TIMINGS timings of a size its spread says nothing: the verdict notes it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from localspec.decoding.calibrate import PairedTimings
from localspec.decoding.cost_cache import MAX_INVERSION, MIN_BATCH_RATIO, plausible
from localspec.decoding.policy import CostModel

MAX_SPREAD = 0.25  # IQR / median of one size's timings above this: unreliable
MIN_TIMINGS = 3  # fewer timings of a size tell nothing about their spread


@dataclass(frozen=True)
class Spread:
    """One size's timings (seconds), summarized."""

    median: float
    low: float
    high: float
    q1: float
    q3: float
    count: int

    @property
    def iqr_ratio(self) -> float:
        return (self.q3 - self.q1) / self.median if self.median > 0 else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "q1": self.q1,
            "q3": self.q3,
            "iqr_over_median": self.iqr_ratio,
            "count": self.count,
        }


@dataclass(frozen=True)
class Load:
    """How busy the machine was when a measurement ran: the 1-minute load average and the CPUs it had."""

    average: float | None  # None where the OS has no load average
    cpus: int

    @property
    def high(self) -> bool:
        """More runnable threads than CPUs: some forward passes waited for a core."""
        return self.average is not None and self.average > self.cpus

    def describe(self) -> str:
        if self.average is None:
            return f"load average unknown on this OS ({self.cpus} CPUs)"
        return f"load average {self.average:.1f} on {self.cpus} CPUs"

    def to_json(self) -> dict[str, Any]:
        return {"load_avg_1m": self.average, "cpus": self.cpus, "high": self.high}


def current_load() -> Load:
    """The machine's load right now (the CPUs this process may run on)."""
    try:
        average: float | None = os.getloadavg()[0]
    except (OSError, AttributeError):
        average = None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Load(average, cpus)


def load_reason(loads: Sequence[Load]) -> list[str]:
    """Why timings taken under these loads cannot be trusted ([] when none was high)."""
    high = [x for x in loads if x.high]
    if not high:
        return []
    worst = max(high, key=lambda x: x.average or 0.0)
    return [f"machine busy while timing: {worst.describe()} (over 1 runnable thread per CPU)"]


def spread(samples: Sequence[float]) -> Spread:
    """Median, min-max and quartiles of at least one timing."""
    data = sorted(samples)
    q1, q3 = data[0], data[-1]
    if len(data) >= 2:
        q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    return Spread(statistics.median(data), data[0], data[-1], q1, q3, len(data))


@dataclass
class CostSamples:
    """Every timing of one cost measurement (or several pooled), in seconds."""

    target: dict[int, list[float]] = field(default_factory=dict)
    draft_token: list[float] = field(default_factory=list)
    rollback: list[float] = field(default_factory=list)

    @classmethod
    def of_pairs(cls, timed: PairedTimings) -> CostSamples:
        """Every timing of a paired measurement: each 1-token pass as a T(1), each batch as its T(n)."""
        target = {1: list(timed.one), **{n: [tn for _, tn in pairs] for n, pairs in timed.pairs.items()}}
        return cls(target={n: ts for n, ts in target.items() if ts})

    def extend(self, other: CostSamples) -> None:
        for n, ts in other.target.items():
            self.target.setdefault(n, []).extend(ts)
        self.draft_token.extend(other.draft_token)
        self.rollback.extend(other.rollback)

    def model(self) -> CostModel:
        """The median of each cost."""
        target = {n: statistics.median(ts) for n, ts in sorted(self.target.items()) if ts}
        draft = statistics.median(self.draft_token) if self.draft_token else None
        rollback = statistics.median(self.rollback) if self.rollback else 0.0
        return CostModel(target=target, draft_token=draft, rollback_round=rollback)

    def spreads(self) -> dict[int, Spread]:
        return {n: spread(ts) for n, ts in sorted(self.target.items()) if ts}

    def draft_spread(self) -> Spread | None:
        return spread(self.draft_token) if self.draft_token else None

    def to_json(self) -> dict[str, Any]:
        draft = self.draft_spread()
        return {
            "target_s": {str(n): {**s.to_json(), "samples": self.target[n]} for n, s in self.spreads().items()},
            "draft_token_s": None if draft is None else {**draft.to_json(), "samples": self.draft_token},
            "rollback_round_s": self.rollback,
        }


def keeping(into: list[float]) -> Callable[[list[float]], float]:
    """A `stat` for calibrate's timers that keeps every timing in `into` and returns their median."""

    def stat(samples: list[float]) -> float:
        into.extend(samples)
        return statistics.median(samples)

    return stat


@dataclass(frozen=True)
class Verdict:
    """Whether a cost curve's timings can carry the analytic bound, and why not."""

    reasons: tuple[str, ...] = ()  # why the timings cannot be trusted (empty: they can)
    notes: tuple[str, ...] = ()  # caveats that do not withhold the bound

    @property
    def reliable(self) -> bool:
        return not self.reasons

    def to_json(self) -> dict[str, Any]:
        return {
            "reliable": self.reliable,
            "reasons": list(self.reasons),
            "notes": list(self.notes),
        }


def judge(curve: dict[int, float], samples: CostSamples, loads: Sequence[Load] = ()) -> Verdict:
    """The verdict on a median curve (seconds by batch size), the timings behind it, and the machine's
    load when they ran."""
    reasons = [*_curve_reasons(curve), *_spread_reasons(samples), *load_reason(loads)]
    counts = [len(ts) for ts in samples.target.values()]
    notes = []
    if not counts or min(counts) < MIN_TIMINGS:
        n = min(counts, default=0)
        notes.append(f"{n} timing(s) of some batch size: too few to judge their spread (need {MIN_TIMINGS})")
    return Verdict(tuple(reasons), tuple(notes))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _curve_reasons(curve: dict[int, float]) -> list[str]:
    """Why the curve is implausible (cost_cache.plausible), naming the first culprit; [] if it is not."""
    if plausible(curve):
        return []
    t1 = curve.get(1)
    if not t1:
        return ["T(1) was not measured"]
    cheap = [n for n in sorted(curve) if n > 1 and curve[n] < MIN_BATCH_RATIO * t1]
    if cheap:
        why = f"no batch costs under {MIN_BATCH_RATIO:g}x one token's pass"
        return [f"{_versus(curve, cheap[0], 1)}: {why}"]
    for n in sorted(curve):
        for m in sorted(k for k in curve if k > n and curve[n] > MAX_INVERSION * curve[k]):
            why = f"no batch costs over {MAX_INVERSION:g}x a larger one"
            return [f"{_versus(curve, n, m)}: {why}"]
    return ["the curve cannot be this machine's"]


def _versus(curve: dict[int, float], n: int, m: int) -> str:
    """`T(n) = 74.6 ms is 0.04x T(1) = 2015.7 ms`"""
    ratio = curve[n] / curve[m]
    return f"T({n}) = {_ms(curve[n])} is {ratio:.{2 if ratio < 1 else 1}f}x T({m}) = {_ms(curve[m])}"


def _spread_reasons(samples: CostSamples) -> list[str]:
    """The sizes (and the draft) whose timings spread more than MAX_SPREAD, worst first."""
    named = [(f"T({n})", s) for n, s in samples.spreads().items()]
    draft = samples.draft_spread()
    if draft is not None:
        named.append(("draft", draft))
    wide = [(name, s) for name, s in named if s.count >= MIN_TIMINGS and s.iqr_ratio > MAX_SPREAD]
    if not wide:
        return []
    wide.sort(key=lambda x: -x[1].iqr_ratio)
    shown = ", ".join(f"{name} {s.iqr_ratio:.0%}" for name, s in wide[:3]) + (", ..." if len(wide) > 3 else "")
    return [f"timings spread over {MAX_SPREAD:.0%} (IQR/median): {shown}"]
