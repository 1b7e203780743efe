"""An independent reference for logits processing, written from the definitions (for tests only).

It shares no code with localspec.sampling and none of its shortcuts (no thresholds, no partial
sorts): every step looks at the whole vocabulary, one token at a time, in this order:

    temperature  p_i = exp(z_i / T) / sum_j exp(z_j / T)
    top-k        keep the k most likely tokens, renormalize
    top-p        keep the smallest set of most likely tokens whose mass reaches top_p, renormalize
    min-p        keep the tokens with p_i >= min_p * max_j p_j, renormalize

"Most likely first" breaks ties by the lower token id. A filter that is off (top_k 0 or >= V, top_p 1,
min_p 0) changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def reference_probs(
    logits: Sequence[float] | np.ndarray, *, t: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    z = [float(x) for x in np.asarray(logits).ravel()]
    p = _softmax([x / t for x in z])
    if 0 < top_k < len(p):
        p = _keep(p, set(_most_likely_first(p)[:top_k]))
    if top_p < 1.0:
        nucleus, mass = set(), 0.0
        for i in _most_likely_first(p):
            nucleus.add(i)
            mass += p[i]
            if mass >= top_p:
                break
        p = _keep(p, nucleus)
    if min_p > 0.0:
        floor = min_p * max(p)
        p = _keep(p, {i for i, x in enumerate(p) if x >= floor})
    return np.array(p, dtype=np.float64)


def reference_table(log_table: np.ndarray, **params: float) -> np.ndarray:
    """reference_probs on every row of a [..., V] array of logits."""
    rows = log_table.reshape(-1, log_table.shape[-1])
    return np.stack([reference_probs(r, **params) for r in rows]).reshape(log_table.shape)  # type: ignore[arg-type]


def _softmax(z: list[float]) -> list[float]:
    top = max(z)
    e = [math.exp(x - top) if x != -math.inf else 0.0 for x in z]
    total = math.fsum(e)
    return [x / total for x in e]


def _most_likely_first(p: list[float]) -> list[int]:
    return sorted(range(len(p)), key=lambda i: (-p[i], i))


def _keep(p: list[float], ids: set[int]) -> list[float]:
    total = math.fsum(p[i] for i in ids)
    return [p[i] / total if i in ids else 0.0 for i in range(len(p))]


def reference_runner_ups(logits: np.ndarray) -> list[tuple[int, int, float]]:
    """(best, runner-up, logit gap) for each row, by two plain arg-max passes a row (what the engine once did)."""
    out = []
    for row in np.array(logits, copy=True):
        best = int(np.argmax(row))
        top = float(row[best])
        row[best] = -np.inf
        second = int(np.argmax(row))
        out.append((best, second, top - float(row[second])))
    return out
