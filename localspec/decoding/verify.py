"""Verification rules: which draft tokens to keep and which token the target adds.

Names follow the paper and vLLM: a draft token is *accepted*; at the first rejection the target's
replacement is *recovered*; when all k pass, the target adds a *bonus* token. Pure functions; the
random generator is injected.

Shapes: k draft tokens d[k]; q [k, V] the draft's processed distributions (None: one-hot drafts,
as from n-gram lookup); p [k+1, V] the target's processed distributions, row i grading d[i] and
row k giving the bonus.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from localspec.sampling import LazyProbabilities, sample

Kind = Literal["recovered", "bonus"]


@dataclass(frozen=True)
class Verdict:
    n_accepted: int
    token: int  # the target's token after the accepted prefix
    kind: Kind


Probs = np.ndarray | LazyProbabilities  # p: an array, or rows computed as the rule reads them
Rule = Callable[[Sequence[int], "np.ndarray | None", Probs, np.random.Generator], Verdict]


def verify_exact(draft: Sequence[int], q: np.ndarray | None, p: Probs, rng: np.random.Generator) -> Verdict:
    """Speculative sampling (Leviathan et al., Chen et al.): output distributed exactly as p."""
    for i, d in enumerate(draft):
        p_d = p[i, d]
        q_d = 1.0 if q is None else q[i, d]
        if q_d <= 0.0:  # cannot happen for tokens sampled from q; treat as a rejection
            return Verdict(i, _recover(p[i], q, i, d, rng), "recovered")
        if p_d >= q_d or rng.random() < p_d / q_d:
            continue
        return Verdict(i, _recover(p[i], q, i, d, rng), "recovered")
    return Verdict(len(draft), sample(p[len(draft)], rng), "bonus")


def _recover(p_i: np.ndarray, q: np.ndarray | None, i: int, d: int, rng: np.random.Generator) -> int:
    """Draw from normalize(max(0, p_i - q_i))."""
    if q is None:
        residual = p_i.copy()
        residual[d] = max(0.0, p_i[d] - 1.0)
    else:
        residual = np.maximum(p_i - q[i], 0.0)
    if residual.sum() <= 0.0:  # p == q up to rounding: rejection had ~zero probability
        residual = p_i
    return sample(residual, rng)


def verify_match(draft: Sequence[int], q: np.ndarray | None, p: Probs, rng: np.random.Generator) -> Verdict:
    """Accept while the target's own sample equals the draft (llama.cpp, mlx-lm). Lossless, accepts less."""
    for i, d in enumerate(draft):
        x = sample(p[i], rng)
        if x != d:
            return Verdict(i, x, "recovered")
    return Verdict(len(draft), sample(p[len(draft)], rng), "bonus")


def verify_greedy(draft: Sequence[int], target_argmax: np.ndarray) -> Verdict:
    """Temperature 0: keep the prefix where the draft equals the target's argmax. target_argmax [k+1]."""
    for i, d in enumerate(draft):
        t = int(target_argmax[i])
        if t != d:
            return Verdict(i, t, "recovered")
    return Verdict(len(draft), int(target_argmax[len(draft)]), "bonus")


RULES: dict[str, Rule] = {"exact": verify_exact, "match": verify_match}
