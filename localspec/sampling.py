"""Logits to probabilities (temperature, top-k, top-p, min-p) and sampling; numpy only.

The same processing is applied to the target's p and the draft's q, which is what makes the
exact rule lossless with respect to the processed target distribution. Order: temperature, then
top-k, top-p, min-p (as Hugging Face and vLLM apply them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.errors import UsageError

_NUCLEUS_START = 1024  # a partial sort of this many candidates is where a full sort used to begin (tests)
_TOPK_DELTA = 4.0  # first candidate window for top-k: logits within this much of the max (then widened)
_SAMPLE_BLOCK = 1024  # sample(): inverse CDF over block sums first, then inside one block


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UsageError(f"temperature must be >= 0, got {self.temperature}", "use 0 for greedy decoding")
        if self.top_k < 0:
            raise UsageError(f"top-k must be >= 0, got {self.top_k}", "use 0 to turn top-k off")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top-p must be in (0, 1], got {self.top_p}", "use 1.0 to turn top-p off")
        if not 0.0 <= self.min_p < 1.0:
            raise UsageError(f"min-p must be in [0, 1), got {self.min_p}", "use 0 to turn min-p off")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def plain_temperature(self) -> bool:
        """Sampled at a temperature alone: no filter reshapes softmax(logits / T), so a backend's own softmax and
        draws are the processed distribution (what draws inside a pass need)."""
        return not self.greedy and self.top_k == 0 and self.top_p == 1.0 and self.min_p == 0.0


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Processed probabilities for each row. [n, V] float32 logits -> [n, V] float64 probs."""
    # One float64 copy that each row is processed in, in place: with a 150k vocabulary every fresh
    # temporary is a megabyte of newly faulted pages, which costs more than the arithmetic.
    x = np.array(logits, dtype=np.float64)
    if x.ndim == 1:
        return _row_probs(x, params)
    for row in x:
        _row_probs(row, params)
    return x


def _row_probs(z: np.ndarray, params: SamplingParams) -> np.ndarray:
    """One row [V] of float64 logits, turned into probabilities in place (and returned).

    Follows the full-sort reference step by step (normalizing after each filter) but touches the
    whole vocabulary only with cheap vector passes: the filters work on a support of candidate tokens
    found by thresholds, and only that support is sorted.
    """
    if params.temperature > 0:
        z /= params.temperature
    vocab = z.shape[0]
    m = z.max()
    support: np.ndarray | None = None  # token ids still in play once a filter has cut; None: all
    if 0 < params.top_k < vocab:
        support = np.sort(_top_k_ids(z, m, params.top_k))
        p = np.exp(z[support] - m)
    else:
        np.subtract(z, m, out=z)
        p = np.exp(z, out=z)
    p /= p.sum()
    if params.top_p < 1.0:
        support, p = _top_p(support, p, params.top_p)
    if params.min_p > 0.0:
        keep = np.flatnonzero(p >= params.min_p * p.max())
        support = keep if support is None else support[keep]
        p = p[keep]
        p /= p.sum()
    if support is None:
        return p
    z.fill(0.0)
    z[support] = p
    return z


def _top_k_ids(z: np.ndarray, m: float, k: int) -> np.ndarray:
    """Ids of the k largest logits. Candidates come from a threshold below the max (one vector
    pass), widened until there are at least k; only they are partitioned."""
    vocab = z.shape[0]
    delta = _TOPK_DELTA
    while k <= vocab // 4 and delta <= 1024.0:
        cand = np.flatnonzero(z >= m - delta)
        if cand.size >= k:
            if cand.size > vocab // 4:
                break  # a flat row: partitioning everything is as cheap
            return cand[np.argpartition(z[cand], cand.size - k)[cand.size - k :]]
        delta *= 1.5  # logits thin out fast below the max: small steps keep the candidate set small
    return np.argpartition(z, vocab - k)[vocab - k :]


def _top_p(support: np.ndarray | None, p: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; ties go to the lower id,
    as a stable full sort would. p is over `support` (or the whole vocabulary when None). Over the
    whole vocabulary the candidates are the tokens above a probability threshold, lowered until their
    mass reaches top_p: the nucleus is then inside them, and only they are sorted."""
    tau = p.max() * 1e-3 if support is None else 0.0
    while True:
        cand = np.flatnonzero(p >= tau)  # ascending, so the stable sort below breaks ties by id
        order = cand[np.argsort(-p[cand], kind="stable")]
        cum = np.cumsum(p[order])
        if cum[-1] >= top_p or tau == 0.0:
            break
        tau = tau * 1e-4 if tau > 1e-250 else 0.0
    n_keep = min(int(np.searchsorted(cum, top_p)) + 1, order.shape[0])
    kept = np.sort(order[:n_keep])
    q = p[kept]
    q = q / q.sum()
    return (kept if support is None else support[kept]), q


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector [V] (need not be exactly normalized).

    Inverse CDF in two levels (block sums, then inside the chosen block), so a 150k vocabulary costs
    one vectorized reduction instead of a full cumulative sum.
    """
    n = p.shape[0]
    if n <= 4 * _SAMPLE_BLOCK:
        u = rng.random()
        cum = np.cumsum(p)
        return int(min(np.searchsorted(cum, u * cum[-1], side="right"), n - 1))
    return sample_in_blocks(p, block_sums(p), rng)


def block_sums(p: np.ndarray) -> np.ndarray:
    """The cumulative sums of p's blocks of _SAMPLE_BLOCK tokens (sample_in_blocks' table; one pass over p)."""
    return np.cumsum(np.add.reduceat(p, np.arange(0, p.shape[0], _SAMPLE_BLOCK)))


def sample_in_blocks(p: np.ndarray, cum_b: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from p given its block_sums: a block by its sums, then a token inside it (a row drawn from
    again and again makes the table once)."""
    x = rng.random() * cum_b[-1]
    b = int(min(np.searchsorted(cum_b, x, side="right"), cum_b.shape[0] - 1))
    lo = b * _SAMPLE_BLOCK
    seg = p[lo : lo + _SAMPLE_BLOCK]
    r = x - (cum_b[b - 1] if b > 0 else 0.0)
    j = int(np.searchsorted(np.cumsum(seg), r, side="right"))
    if j >= seg.shape[0] or seg[j] <= 0:  # rounding at the block's edges: stay on a token with weight
        nz = np.flatnonzero(seg > 0)
        after = nz[nz >= j]
        j = int(after[0]) if after.size else int(nz[-1])
    return lo + j


def greedy_rows(
    rows: np.ndarray, draft: Sequence[int], limit: float
) -> tuple[list[int], list[tuple[int, int, int, float]]]:
    """A greedy round's reading of the target's rows [n, V]: each row's arg-max, row by row, up to the first that
    differs from the draft token it grades (or the last row); and near_ties over the rows read. Each row is read
    twice, an arg-max and then a max with the best masked, the second pass while the row is still in the core's
    cache (the whole block does not fit it), and no row after a rejection is read at all."""
    rows = np.atleast_2d(rows)
    best: list[int] = []
    ties: list[tuple[int, int, int, float]] = []
    for i in range(rows.shape[0]):
        row = rows[i]
        b = int(row.argmax())
        top = row[b]
        row[b] = -np.inf
        try:
            gap = float(top - row.max())
            if gap < limit:
                ties.append((i, b, int(row.argmax()), gap))
        finally:
            row[b] = top
        best.append(b)
        if i >= len(draft) or draft[i] != b:
            break
    return best, ties
