"""Rows of softmax(logits / T) that are read only as far as a decision needs: the exact rule's p and q.

A sampled round needs, per verified row, one token's probability (p(d) against q(d)), a draw (a draft token, the
bonus token) or, once, a draw from the residual. Each is decided from the row's *head*, the tokens whose scaled
logit is within HEAD_SPAN of the max (exact weights, found with two vector passes: a max and a comparison), and
a bound on its *tail*: every other token weighs less than e^-HEAD_SPAN of the max's, so the tail holds at most
V e^-HEAD_SPAN of the mass (3e-4 at 150k tokens). Only a decision the tail could flip (that rare) pays a full
exp pass; every decision is the one the whole softmax makes with the same uniform draws, so the output is
distributed exactly as before. Weights are float32, as llama.cpp's own softmax; sums are float64.

Rows with top-k, top-p or min-p are the whole processed row (sampling.probabilities), read as they always were.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from localspec.sampling import SamplingParams, block_sums, probabilities, sample, sample_in_blocks

HEAD_SPAN = 20.0  # the head: scaled logits within this of the max (the tail's weights are each below e^-20)
_TAIL_SLACK = 1.0 + 1e-4  # float32 rounding at the threshold: a tail weight may exceed e^-HEAD_SPAN by an ulp
_DENSE_WORDS = 4  # a head in more than 1/4 of the mask's 8-token words: the whole row is computed at once


@dataclass
class RowWork:
    """Whole-row passes made so far (tests count them): head searches, and full exp passes (a tail or a dense
    row, each once per row at most)."""

    heads: int = 0
    full: int = 0


WORK = RowWork()


class Row(Protocol):
    """One processed distribution over the vocabulary: unnormalised weights, their total (bounded until known)."""

    whole: bool  # computed whole (no tail left to bound): read as a dense row, with one uniform a draw

    def weight(self, token: int) -> float:
        """The token's unnormalised weight (its probability times the row's total)."""
        ...

    def total_bounds(self) -> tuple[float, float]:
        """Bounds on the total weight, without a full pass."""
        ...

    def total(self) -> float:
        """The total weight, exactly (a full pass the first time, where the bounds differ)."""
        ...

    def sample(self, rng: np.random.Generator) -> int: ...

    def dense(self) -> np.ndarray:
        """The whole normalised row, float64 [V]."""
        ...


class DenseRow:
    """A row given whole (normalised): a test's table, a filtered row, a grammar-masked draft row."""

    whole = True

    def __init__(self, p: np.ndarray) -> None:
        self.p = p

    def weight(self, token: int) -> float:
        return float(self.p[token])

    def total_bounds(self) -> tuple[float, float]:
        return 1.0, 1.0

    def total(self) -> float:
        return 1.0

    def sample(self, rng: np.random.Generator) -> int:
        return sample(self.p, rng)

    def dense(self) -> np.ndarray:
        return self.p


class DrawnRow:
    """softmax(z / T) as the backend made it where the model runs, whole, in host memory (llama.cpp's dist sampler
    copies it beside its draw), with the one token it drew from it: a probability is one read, the first draw is
    that token (no host pass), and a further draw (the residual's rejection loop, after the first was refused)
    an inverse-CDF draw over block sums made once for the row. `p` stays unchanged while the row is read (the
    backend's buffer until its next pass, or a copy)."""

    whole = False  # the residual is drawn by rejection from p, starting with the backend's draw

    def __init__(self, p: np.ndarray, draw: int | None = None) -> None:
        self.p = p
        self._draw = draw
        self._blocks: np.ndarray | None = None  # sampling.block_sums, for draws after the first

    def weight(self, token: int) -> float:
        return float(self.p[token])

    def total_bounds(self) -> tuple[float, float]:
        return 1.0, 1.0  # normalised where it was made (float32 rounding aside, as every softmax)

    def total(self) -> float:
        return 1.0

    def sample(self, rng: np.random.Generator) -> int:
        if self._draw is not None:
            x, self._draw = self._draw, None
            return x
        if self._blocks is None:
            self._blocks = block_sums(self.p)
        return sample_in_blocks(self.p, self._blocks, rng)

    def dense(self) -> np.ndarray:
        return self.p.astype(np.float64)


class SparseRow:
    """A distribution over a few tokens (a draft drawn from its top-k logits' softmax: DrawsInPass.drawn_candidates),
    every other token at 0: read by a search among the ids, never a pass over the vocabulary."""

    whole = True

    def __init__(self, ids: np.ndarray, p: np.ndarray, width: int) -> None:
        order = np.argsort(ids)
        self.ids, self.p, self.width = ids[order], p[order], width

    def weight(self, token: int) -> float:
        at = int(np.searchsorted(self.ids, token))
        return float(self.p[at]) if at < self.ids.shape[0] and self.ids[at] == token else 0.0

    def total_bounds(self) -> tuple[float, float]:
        return 1.0, 1.0

    def total(self) -> float:
        return 1.0

    def sample(self, rng: np.random.Generator) -> int:
        return int(self.ids[sample(self.p, rng)])

    def dense(self) -> np.ndarray:
        out = np.zeros(self.width, dtype=np.float64)
        out[self.ids] = self.p
        return out


class SoftmaxRow:
    """softmax(z / T) for one row of logits z [V], its head computed at once and its tail only when asked."""

    def __init__(self, logits: np.ndarray, temperature: float, known: int | None = None) -> None:
        z = np.asarray(logits, dtype=np.float32)
        self._z = z  # the caller keeps it unchanged while the row is read (a copy, or this round's output)
        self._scale = np.float32(1.0 / temperature)
        WORK.heads += 1
        self._max, self._ids = _head(z, np.float32(HEAD_SPAN * temperature), known)  # ids None: a flat row, all
        self._w = self._weights(self._ids)
        self._cum = np.cumsum(self._w, dtype=np.float64)
        self.head_total = float(self._cum[-1])
        n_tail = 0 if self._ids is None else z.shape[0] - self._ids.size
        self._tail_bound = n_tail * math.exp(-HEAD_SPAN) * _TAIL_SLACK
        self._tail: np.ndarray | None = None  # the tail's weights, 0 on the head (made by _tail_weights)
        self._tail_total = 0.0 if self._ids is None else None
        self.whole = self._ids is None

    def _weights(self, ids: np.ndarray | None) -> np.ndarray:
        """exp((z - max) / T), float32, over `ids` (None: every token, a full pass)."""
        if ids is None:
            WORK.full += 1
            w = np.subtract(self._z, self._max)
        else:
            w = self._z[ids] - self._max
        w *= self._scale
        return np.exp(w, out=w)

    def weight(self, token: int) -> float:
        if self._ids is None:
            return float(self._w[token])
        at = int(np.searchsorted(self._ids, token))
        if at < self._ids.size and self._ids[at] == token:
            return float(self._w[at])
        return float(self._weights(np.array([token]))[0])  # a tail token: the same arithmetic as the tail pass

    def total_bounds(self) -> tuple[float, float]:
        if self._tail_total is not None:
            t = self.head_total + self._tail_total
            return t, t
        return self.head_total, self.head_total + self._tail_bound

    def total(self) -> float:
        if self._tail_total is None:
            self._tail_weights()
        assert self._tail_total is not None
        return self.head_total + self._tail_total

    def _tail_weights(self) -> np.ndarray:
        assert self._ids is not None  # a row computed whole has no tail
        if self._tail is None:
            self._tail = self._weights(None)
            self._tail[self._ids] = 0.0
            self._tail_total = float(self._tail.sum(dtype=np.float64))
        return self._tail

    def sample(self, rng: np.random.Generator) -> int:
        """A draw: the head with probability head/total (the bound decides it but for the rare draws near the
        edge), then a token inside the part chosen, from a fresh uniform."""
        if self._ids is None:  # one inverse-CDF draw over the row, as sampling.sample on the processed row
            return sample(self._w, rng)
        u = rng.random()
        _, hi = self.total_bounds()
        if u * hi >= self.head_total and u * self.total() >= self.head_total:
            return sample(self._tail_weights(), rng)
        at = int(np.searchsorted(self._cum, rng.random() * self.head_total, side="right"))
        return int(self._ids[min(at, self._ids.size - 1)])

    def dense(self) -> np.ndarray:
        if self._ids is None:
            out = self._w.astype(np.float64)
        else:
            out = self._tail_weights().astype(np.float64)
            out[self._ids] = self._w
        return out / self.total()


def _head(z: np.ndarray, span: np.floating, known: int | None) -> tuple[np.floating, np.ndarray | None]:
    """The row's max and the ids of the tokens within `span` of it (None: too many, a flat row). A `known` token
    (the draft token the row grades) bounds the max from below: the tokens within `span` of it hold the max and
    the head, which saves the max pass where they are few."""
    if known is not None and 0 <= known < z.shape[0]:  # (a draft token outside the target's vocabulary: no hint)
        near = _ids_at_least(z, z[known] - span)
        if near is not None:
            m = z[near].max()
            return m, near[z[near] >= m - span]
    m = z.max()
    return m, _ids_at_least(z, m - span)


def _ids_at_least(z: np.ndarray, threshold: np.floating) -> np.ndarray | None:
    """np.flatnonzero(z >= threshold), or None when the hits are many. numpy's nonzero walks a 150k mask a byte at
    a time (30 us); here the mask is read as 8-byte words and only the words holding a hit are searched."""
    n = z.shape[0]
    mask = np.empty(-(-n // 8) * 8, dtype=bool)
    mask[n:] = False
    np.greater_equal(z, threshold, out=mask[:n])
    words = np.flatnonzero(mask.view(np.uint64) != 0)
    if words.size > mask.shape[0] // (8 * _DENSE_WORDS):
        return None
    rows, cols = np.nonzero(mask.reshape(-1, 8)[words])
    return words[rows] * 8 + cols


def row(logits: np.ndarray, params: SamplingParams, known: int | None = None) -> Row:
    """One row of logits [V] as the processed distribution at temperature > 0 (filters: the whole row). `known`: a
    token the row will be asked about (a draft token), a hint for finding the head."""
    if params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0:
        return DenseRow(probabilities(logits, params))
    return SoftmaxRow(logits, params.temperature, known)


class SoftmaxRows(NDArrayOperatorsMixin):
    """[n, V] processed distributions, each row made the first time it is read (the rule reads the rows up to its
    first rejection). Reads as the array would too (rows[i], rows[i, t], np.asarray(rows), q > 0, q - q2), at a
    full pass a row."""

    def __init__(self, n: int, width: int, make: Callable[[int], Row]) -> None:
        self.shape = (n, width)
        self._make = make
        self._rows: dict[int, Row] = {}

    @classmethod
    def of_logits(cls, logits: np.ndarray, params: SamplingParams, draft: Sequence[int] = ()) -> SoftmaxRows:
        """Rows over logits [n, V], which stay unchanged while the rows are read; row i grades draft[i] (if any)."""
        z = np.atleast_2d(logits)
        return cls(z.shape[0], z.shape[1], lambda i: row(z[i], params, draft[i] if i < len(draft) else None))

    @classmethod
    def of_rows(cls, rows: list[Row], width: int) -> SoftmaxRows:
        return cls(len(rows), width, rows.__getitem__)

    def row(self, i: int) -> Row:
        if not -self.shape[0] <= i < self.shape[0]:
            raise IndexError(f"row {i} of {self.shape[0]}")
        i %= self.shape[0]
        r = self._rows.get(i)
        if r is None:
            r = self._rows[i] = self._make(i)
        return r

    @property
    def rows_made(self) -> int:
        return len(self._rows)

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self.row(i).dense() for i in range(self.shape[0]))

    def __getitem__(self, key: object) -> np.ndarray | float:
        if isinstance(key, (int, np.integer)):
            return self.row(int(key)).dense()
        if isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, (int, np.integer)) for k in key):
            r = self.row(int(key[0]))  # type: ignore[call-overload]
            return r.weight(int(key[1])) / r.total()  # type: ignore[call-overload]
        return np.asarray(self)[key]  # type: ignore[index]

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: object, **kwargs: object) -> object:
        whole = [np.asarray(x) if isinstance(x, SoftmaxRows) else x for x in inputs]
        return getattr(ufunc, method)(*whole, **kwargs)

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        out = np.stack(list(self)) if self.shape[0] else np.zeros(self.shape)
        return out if dtype is None else out.astype(dtype)


def row_of(rows: np.ndarray | SoftmaxRows, i: int) -> Row:
    """Row i of an array of distributions or of lazy rows."""
    return rows.row(i) if isinstance(rows, SoftmaxRows) else DenseRow(np.asarray(rows[i]))
