"""Drafting in parallel: how many draft tokens each of several sequences gets in one shared target pass.

Pure: no backends, no clocks. Several sequences share each forward pass, so a draft token costs what it
adds to the whole batch, T(n + 1) - T(n), not what it would cost alone. The plan maximises the expected
accepted tokens per second of the whole pass:

    rate(j_1..j_N) = sum_i E_i(j_i) / (sum_i j_i d_i + T(N + sum_i j_i))
    E_i(j)         = 1 + s_i(1) + ... + s_i(j),  s_i(m) = P(the first m drafts of sequence i are accepted)

Each E_i is concave (s_i(m) never grows with m), so for a given total the best split takes draft tokens in
order of their survival per cost; the plan walks that order one token at a time and keeps the best prefix.
Each sequence's acceptances come from its drafter's forecast where it makes one (auto: what its lookup would
copy, at its learnt acceptance by match length), else from what its drafted rounds showed
(parallel_decoder.ParallelDecoder).
The empty prefix is plain batched decoding, so the plan is never expected to be slower than it; as auto, drafts
must beat it by policy.MARGIN (a smaller expected gain is within timing noise, and a loss on a steep T(n)).
A right-padded batch (MLX) computes rows x its longest part instead of the sum: T(N (1 + max_i j_i)) then
replaces T(N + sum_i j_i); besides the walk's prefixes the plan then weighs every sequence drafting up to m
tokens, for each m (under that cost the best plans give many sequences the same length, which the walk in
survival order passes by). With one
sequence the prefixes are j = 0..k and the rate is auto's (policy.Controller.best, less its rollback term).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localspec.decoding.policy import MARGIN, survival


@dataclass(frozen=True)
class Candidate:
    """One sequence's drafting prospects this pass."""

    alphas: tuple[float, ...]  # acceptance of each draft position given the ones before (len = its longest draft)
    draft_s: float = 0.0  # seconds per draft token (a draft model's step; ~0 for lookup)


@dataclass(frozen=True)
class ParallelPlan:
    lengths: tuple[int, ...]  # draft tokens per sequence
    expected: float  # tokens the pass is expected to emit, all sequences together
    seconds: float  # what the pass is expected to cost (drafts and the target's batch)
    plain_rate: float  # tokens per second of plain batched decoding (every length 0)

    @property
    def rate(self) -> float:
        return self.expected / self.seconds if self.seconds > 0 else 0.0

    @property
    def batch(self) -> int:
        return len(self.lengths) + sum(self.lengths)


def summed(lengths: Sequence[int]) -> int:
    """Positions a pass computes when every part costs its own length (one llama.cpp batch)."""
    return sum(lengths)


def plan_parallel(
    candidates: Sequence[Candidate],
    target_s: Callable[[int], float],
    pass_size: Callable[[Sequence[int]], int] = summed,
    *,
    padded: bool = False,
) -> ParallelPlan:
    """The draft lengths that maximise the pass's expected tokens per second; `target_s(n)`: T(n).
    `pass_size`: positions a pass over parts of these lengths (1 + draft) computes; `padded`: it is a
    right-padded batch (MLX), rows x the longest, so one long draft among short ones costs every row its length."""
    n = len(candidates)
    if n == 0:
        return ParallelPlan((), 0.0, 0.0, 0.0)
    t = _memo(target_s)
    t_plain = t(pass_size([1] * n))
    if math.isnan(t_plain) or t_plain <= 0:
        return ParallelPlan((0,) * n, float(n), 0.0, 0.0)  # nothing measured: the caller explores
    plain_rate = n / t_plain
    best = ParallelPlan((0,) * n, float(n), t_plain, plain_rate)
    plans = _walk(_token_order(candidates, target_s), candidates, t, pass_size, plain_rate)
    if padded:
        plans += [
            _even(candidates, m, t, pass_size, plain_rate) for m in range(1, max(len(c.alphas) for c in candidates) + 1)
        ]
    top = max(plans, key=lambda p: p.rate, default=best)
    return top if top.rate > plain_rate * (1.0 + MARGIN) else best  # as auto: a gain within timing noise is none


def _memo(target_s: Callable[[int], float]) -> Callable[[int], float]:
    """T(n) asked once per size within one plan (a padded pass has few sizes; interpolation is not free)."""
    seen: dict[int, float] = {}

    def t(size: int) -> float:
        if size not in seen:
            seen[size] = target_s(size)
        return seen[size]

    return t


def _walk(
    order: list[tuple[int, float]], candidates: Sequence[Candidate], t: Callable[[int], float],
    pass_size: Callable[[Sequence[int]], int], plain_rate: float,
) -> list[ParallelPlan]:  # fmt: skip
    """A plan per prefix of the token order (every draft token most worth its cost first)."""
    lengths = [0] * len(candidates)
    expected, draft_cost = float(len(candidates)), 0.0
    plans = []
    for i, held in order:
        lengths[i] += 1
        expected += held
        draft_cost += candidates[i].draft_s
        plans.append(
            ParallelPlan(tuple(lengths), expected, draft_cost + t(pass_size([1 + j for j in lengths])), plain_rate)
        )
    return plans


def _even(
    candidates: Sequence[Candidate], m: int, t: Callable[[int], float], pass_size: Callable[[Sequence[int]], int],
    plain_rate: float,
) -> ParallelPlan:  # fmt: skip
    """Every sequence drafting up to m tokens: a padded pass's cost is set by its longest draft, so the best
    plans give many sequences the same length, which the walk in survival order passes by."""
    lengths = tuple(min(m, len(c.alphas)) for c in candidates)
    expected = len(candidates) + sum(sum(survival(c.alphas)[:j]) for c, j in zip(candidates, lengths))
    draft_cost = sum(c.draft_s * j for c, j in zip(candidates, lengths))
    return ParallelPlan(lengths, expected, draft_cost + t(pass_size([1 + j for j in lengths])), plain_rate)


def _token_order(candidates: Sequence[Candidate], target_s: Callable[[int], float]) -> list[tuple[int, float]]:
    """Every draft token as (sequence, survival), most worth its cost first; within a sequence in order."""
    n, total = len(candidates), sum(len(c.alphas) for c in candidates)
    slope = max(target_s(n + total) - target_s(n), 0.0) / total if total else 0.0
    tokens = []
    for i, c in enumerate(candidates):
        for m, held in enumerate(survival(c.alphas)):
            tokens.append((held / (c.draft_s + slope + 1e-12), i, m, held))
    tokens.sort(key=lambda t: (-t[0], t[1], t[2]))  # a sequence's survival never grows: its order holds
    return [(i, held) for _, i, _, held in tokens]
