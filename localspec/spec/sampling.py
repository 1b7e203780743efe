"""Logits to probabilities (temperature, top-k, top-p, min-p) and sampling; numpy only.

The same processing is applied to the target's p and the draft's q, which is what makes the
exact rule lossless with respect to the processed target distribution. Order: temperature, then
top-k, top-p, min-p (as Hugging Face and vLLM apply them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from localspec.errors import UsageError

_NUCLEUS_START = 1024  # candidates partially sorted for top-p before falling back to a full sort


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


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Processed probabilities for each row. [n, V] float32 logits -> [n, V] float64 probs."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 1:
        return _row_probs(x, params)
    return np.stack([_row_probs(row, params) for row in x])


def _row_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    # [V]
    z = logits / params.temperature if params.temperature > 0 else logits.copy()
    vocab = z.shape[0]
    if 0 < params.top_k < vocab:
        keep = np.argpartition(z, vocab - params.top_k)[vocab - params.top_k :]
        masked = np.full_like(z, -np.inf)
        masked[keep] = z[keep]
        z = masked
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if params.top_p < 1.0:
        p = _top_p(p, params.top_p)
    if params.min_p > 0.0:
        p = np.where(p >= params.min_p * p.max(), p, 0.0)
        p /= p.sum()
    return p


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (partial sort)."""
    vocab = p.shape[0]
    m = min(_NUCLEUS_START, vocab)
    while True:
        cand = np.argpartition(p, vocab - m)[vocab - m :] if m < vocab else np.arange(vocab)
        order = cand[np.argsort(-p[cand], kind="stable")]
        cum = np.cumsum(p[order])
        if cum[-1] >= top_p or m == vocab:
            n_keep = int(np.searchsorted(cum, top_p)) + 1
            out = np.zeros_like(p)
            kept = order[: min(n_keep, m)]
            out[kept] = p[kept]
            return out / out.sum()
        m = min(vocab, m * 8)


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector [V] (need not be exactly normalized)."""
    cum = np.cumsum(p)
    u = rng.random() * cum[-1]
    return int(min(np.searchsorted(cum, u, side="right"), p.shape[0] - 1))


def greedy(logits: np.ndarray) -> np.ndarray:
    """Argmax per row: [n, V] -> [n]."""
    return np.argmax(logits, axis=-1)
