"""Short timing runs that seed auto's cost model (and bench's and doctor's cost tables).

They drive a real target backend and a real drafter. The target's cache ends as it began; a drafter's
state ends wherever its last proposal left it, which its next proposal resyncs from (Drafter protocol).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from localspec.backends.base import Backend
from localspec.decoding.drafters import Drafter
from localspec.decoding.policy import CostModel
from localspec.sampling import SamplingParams

Stat = Callable[[list[float]], float]
_GREEDY = SamplingParams()


def time_target(
    target: Backend,
    sizes: Sequence[int],
    *,
    reps: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    stat: Stat = min,
) -> dict[int, float]:
    """T(n) for each batch size n on the current cache, which is restored after each pass.

    Each size is timed `reps` times after one warm-up pass and summarized by `stat`: the minimum by
    default (noise on a shared machine only ever adds time), the median for reporting. The passes append
    copies of the last cached token and are rolled back.
    """
    n0 = len(target.cached_tokens)
    sizes = sorted({n for n in sizes if n >= 1 and n0 + n <= target.n_ctx})
    if n0 == 0 or not sizes:
        return {}
    filler = int(target.cached_tokens[-1])
    target.checkpoint()  # every pass is rolled back to here (a recurrent model restores its state)
    target.forward([filler], all_logits=False)  # warm-up
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


def calibrate(
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
) -> CostModel:
    """T(n) for n in `sizes` (default 1..max_batch) on the target's current cache, and the drafter's
    seconds per token on `context` (default: the target's cached tokens), timed `draft_reps` times
    (default: `reps`)."""
    costs = CostModel()
    wanted = [n for n in (sizes or range(1, max_batch + 1)) if n <= max_batch]
    costs.target.update(time_target(target, wanted, reps=reps, clock=clock, stat=stat))
    if target.info.is_recurrent:  # a KV cache is cut in microseconds: not worth two more passes
        costs.rollback_round = time_rollback(target, max_batch - 1, reps=reps, clock=clock, stat=stat) or 0.0
    if drafter is not None:
        ctx = list(context if context is not None else target.cached_tokens)
        costs.draft_token = time_drafter(drafter, ctx, tokens_per_draft=max(2, min(max_batch, 4)), reps=draft_reps or reps, clock=clock, stat=stat)
    return costs
