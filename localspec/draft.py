"""What a drafter hands the engine: the draft tokens and, for a model draft, the distributions they were
drawn from; and the sampling loop every model-like drafter (a draft model, a head) shares.

Below the engine and the backends alike: a head drafter behind the backend boundary builds Drafts
without importing the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from localspec.sampling import SamplingParams
from localspec.softmax_rows import Row, SoftmaxRows, row


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    q: np.ndarray | SoftmaxRows | None  # [len(tokens), V] processed draft distributions; None: one-hot (no model)
    note: str = ""  # why the drafter proposed this (shown in RoundStats.note)
    source: str = "none"  # which kind of drafter wrote it (RoundStats.source)
    order: int = (
        0  # lookup drafts: length of the matched context (the evidence behind the draft); policy.RESYNC + v: a resync
    )


EMPTY_DRAFT = Draft([], None)


def sample_draft(
    logits: np.ndarray,
    step: Callable[[int], np.ndarray],
    k: int,
    sampling: SamplingParams,
    rng: np.random.Generator,
    min_confidence: float,
    eog: frozenset[int],
) -> tuple[list[int], SoftmaxRows | None, str]:
    """Draw up to k draft tokens: the first from `logits` [V], each next from step(token) -> logits [V].

    Returns (tokens, q [len, V] the processed rows they were drawn from (None when greedy), note). Stops
    before a token whose own probability is below min_confidence, and after an end-of-generation token
    (drafting past the end of the answer is wasted work).
    """
    tokens: list[int] = []
    width = np.shape(logits)[-1]
    # Each sampled row's logits are kept (the next step overwrites the backend's buffer) in one [k, V] float32
    # buffer; the rule reads them again only where its decisions need more than the row's head.
    kept = None if sampling.greedy else np.empty((k, width), dtype=np.float32)
    rows: list[Row] = []
    note = ""
    while True:
        if kept is None:
            tok = int(np.argmax(logits))
            conf = _top_probability(logits, tok) if min_confidence > 0 else 1.0
        else:
            z = kept[len(tokens)]
            np.copyto(z, logits)
            q = row(z, sampling)
            rows.append(q)
            tok = q.sample(rng)
            conf = _confidence(q, tok, min_confidence) if min_confidence > 0 else 1.0
        if conf < min_confidence:
            note = f"draft stopped at position {len(tokens) + 1}: confidence {conf:.2f} < {min_confidence:.2f}"
            break
        tokens.append(tok)
        if len(tokens) >= k or tok in eog:
            break
        logits = step(tok)
    q_rows = SoftmaxRows.of_rows(rows[: len(tokens)], width) if kept is not None and tokens else None
    return tokens, q_rows, note


def _confidence(q: Row, token: int, threshold: float) -> float:
    """The token's probability, or a bound on it on the same side of `threshold` (exact only near it)."""
    lo, hi = q.total_bounds()
    w = q.weight(token)
    if w / hi >= threshold:  # at least this: not below
        return w / hi
    if w / lo < threshold:  # at most this: below
        return w / lo
    return w / q.total()


_TOP_SPAN = 16.0  # logits further below the top add at most V e^-16 (1.7% at 150k tokens) to softmax's sum


def _top_probability(logits: np.ndarray, top: int) -> float:
    """softmax(logits)[top], `top` the arg-max, for the confidence cut: 1 / sum(exp(z - max z)) over the logits
    within _TOP_SPAN of the max (a comparison pass; exp only where it matters, not over the whole vocabulary)."""
    z = np.asarray(logits, dtype=np.float32)
    m = z[top]
    near = z[z > m - _TOP_SPAN]
    return float(1.0 / np.exp(near - m).sum())
