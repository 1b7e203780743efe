"""Verification rules: which draft tokens to keep and which token the target adds.

Names follow the paper and vLLM: a draft token is *accepted*; at the first rejection the target's
replacement is *recovered*; when all k pass, the target adds a *bonus* token. Pure functions; the
random generator is injected.

Shapes: k draft tokens d[k]; q [k, V] the draft's processed distributions (None: one-hot drafts,
as from n-gram lookup); p [k+1, V] the target's processed distributions, row i grading d[i] and
row k giving the bonus.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from localspec.sampling import sample
from localspec.softmax_rows import Row, SoftmaxRows, row_of

Kind = Literal["recovered", "bonus"]
RESIDUAL_TRIES = 32  # draws from p for one from the residual before it is computed whole (see _recover)


@dataclass(frozen=True)
class Verdict:
    n_accepted: int
    token: int  # the target's token after the accepted prefix
    kind: Kind


Probs = np.ndarray | SoftmaxRows  # an array, or rows read only as far as the rule's decisions need
Rule = Callable[[Sequence[int], "Probs | None", Probs, np.random.Generator], Verdict]


def verify_exact(draft: Sequence[int], q: Probs | None, p: Probs, rng: np.random.Generator) -> Verdict:
    """Speculative sampling (Leviathan et al., Chen et al.): output distributed exactly as p."""
    for i, d in enumerate(draft):
        p_i, q_i = row_of(p, i), None if q is None else row_of(q, i)
        if not _accepts(p_i, q_i, d, rng):
            return Verdict(i, _recover(p_i, q_i, d, rng), "recovered")
    return Verdict(len(draft), row_of(p, len(draft)).sample(rng), "bonus")


def _accepts(p: Row, q: Row | None, d: int, rng: np.random.Generator) -> bool:
    """Keep d with probability min(1, p(d) / q(d)) (q None: a one-hot draft, q(d) = 1). A uniform is drawn only
    where the ratio may be below 1; bounds on the rows' totals decide it unless the draw falls between them."""
    wq = 1.0 if q is None else q.weight(d)
    if wq <= 0.0:  # cannot happen for tokens sampled from q; treat as a rejection
        return False
    wp = p.weight(d)
    lo, hi = _ratio_bounds(wp, p, wq, q)
    if lo >= 1.0:
        return True
    u = rng.random()
    if u < lo or u >= hi:
        return u < lo
    return u < wp * _total(q) / (wq * p.total())


def _ratio_bounds(wa: float, a: Row, wb: float, b: Row | None) -> tuple[float, float]:
    """Bounds on a(t) / b(t) for a token of weights wa and wb (b None: b(t) = 1)."""
    a_lo, a_hi = a.total_bounds()
    b_lo, b_hi = (1.0, 1.0) if b is None else b.total_bounds()
    return wa * b_lo / (wb * a_hi), wa * b_hi / (wb * a_lo)


def _total(r: Row | None) -> float:
    return 1.0 if r is None else r.total()


def _recover(p: Row, q: Row | None, d: int, rng: np.random.Generator) -> int:
    """Draw from normalize(max(0, p - q)) (q None: p without d). Rows given whole are computed whole; lazy rows
    by rejection: x from p, kept with probability max(0, 1 - q(x) / p(x)), which keeps x with probability
    proportional to max(0, p(x) - q(x)), one draw from p a round on average. After RESIDUAL_TRIES misses (a
    residual of almost no mass) the residual is computed whole, which leaves the draw's distribution as it is."""
    if p.whole and (q is None or q.whole):
        return _recover_dense(p.dense(), None if q is None else q.dense(), d, rng)
    for _ in range(RESIDUAL_TRIES):
        x = p.sample(rng)
        if _keeps(p, q, d, x, rng):
            return x
    return _recover_dense(p.dense(), None if q is None else q.dense(), d, rng)


def _keeps(p: Row, q: Row | None, d: int, x: int, rng: np.random.Generator) -> bool:
    """Whether the residual's rejection step keeps x (drawn from p): with probability max(0, 1 - q(x) / p(x))."""
    if q is None:
        return x != d
    wq, wp = q.weight(x), p.weight(x)
    if wq <= 0.0:
        return True
    if wp <= 0.0:
        return False
    lo, hi = _ratio_bounds(wq, q, wp, p)  # q(x) / p(x)
    if lo >= 1.0:
        return False
    v = 1.0 - rng.random()  # keep iff q(x) / p(x) < v
    if hi < v or lo >= v:
        return hi < v
    return wq * p.total() / (wp * q.total()) < v


def _recover_dense(p_i: np.ndarray, q_i: np.ndarray | None, d: int, rng: np.random.Generator) -> int:
    """Draw from normalize(max(0, p_i - q_i)), the rows given whole."""
    if q_i is None:
        residual = p_i.copy()
        residual[d] = max(0.0, p_i[d] - 1.0)
    else:
        residual = np.maximum(p_i - q_i, 0.0)
    if residual.sum() <= 0.0:  # p == q up to rounding: rejection had ~zero probability
        residual = p_i
    return sample(residual, rng)


def verify_samples(draft: Sequence[int], samples: Iterable[int]) -> Verdict:
    """Accept while the target's own draws, one a row in order (taken only as far as the verdict needs), equal the
    draft: the match rule, and the exact rule for one-hot drafts (d is kept with probability p(d); a draw that is
    not d is a draw from p without d, the residual)."""
    draws = iter(samples)
    for i, d in enumerate(draft):
        x = int(next(draws))
        if x != d:
            return Verdict(i, x, "recovered")
    return Verdict(len(draft), int(next(draws)), "bonus")


def verify_match(draft: Sequence[int], q: Probs | None, p: Probs, rng: np.random.Generator) -> Verdict:
    """Accept while the target's own sample equals the draft (llama.cpp, mlx-lm). Lossless, accepts less."""
    return verify_samples(draft, (row_of(p, i).sample(rng) for i in range(len(draft) + 1)))


def verify_greedy(draft: Sequence[int], target_argmax: Iterable[int]) -> Verdict:
    """Temperature 0: keep the prefix where the draft equals the target's argmax. target_argmax [k+1] (or fewer:
    the rows up to the first rejection)."""
    return verify_samples(draft, target_argmax)


RULES: dict[str, Rule] = {"exact": verify_exact, "match": verify_match}
