"""Checks on tokens drawn where the model runs (Backend.forward_draws) against the rows the same pass hands back."""

from __future__ import annotations

import numpy as np
from test_verify import chi2_sf


def pit(draws: list[list[int]], rows: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """Randomized probability integral transforms of draws[pass][row] under softmax(rows[row] / temperature):
    uniform on [0, 1) exactly when every draw follows its row's distribution."""
    z = rows.astype(np.float64) / temperature
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    below = np.cumsum(p, axis=1) - p  # F(x-): the mass of the ids below x
    return np.array([below[i, x] + rng.random() * p[i, x] for one in draws for i, x in enumerate(one)])


def uniform_pvalue(u: np.ndarray, bins: int = 20) -> float:
    counts = np.histogram(u, bins=bins, range=(0.0, 1.0))[0]
    e = len(u) / bins
    return chi2_sf(float(((counts - e) ** 2 / e).sum()), bins - 1)


def softmax_rows(rows: np.ndarray, t: float) -> np.ndarray:
    """softmax(rows / t) per row, float64: what a backend's drawn_probs or drawn_candidates must equal."""
    z = np.asarray(rows, dtype=np.float64) / t
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
