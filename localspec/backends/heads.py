"""What every head drafter shares, on any backend (EAGLE-3, MTP, DFlash/DSpark on llama.cpp and MLX): the head's
cache kept in line with the committed context, the token-by-token draft loop, the block drafter's proposal with
DSpark's confidence cut and DFlash2's lattice walk, and the map from a head's own vocabulary to the target's.
A backend's head module adds its forward passes on its own arrays; a family's adds its math.

The head's cache holds one *pair* per position: a row built from the context's tokens and what the target computed
for them (EAGLE-3: token P+1 with the fc projection of the target's features at P; MTP: token P or P+1 with the
target's hidden state one position back; DFlash: the target's features at P alone). A pair is true for a new
context while the tokens it was built from are unchanged and the target still holds what it read, so at every
proposal (and in catch_up) the cache is cut back to the pairs still true and the missing ones are written.
`_written` is the context the cache's pairs were built from (what holds if a write fails midway).

What a head says:
- `LOOKAHEAD`: pair P needs context[0..P + LOOKAHEAD] unchanged (1 where pair P holds token P+1);
- `_n_pairs(context)`: how many pairs a context can have now (the target must hold what they read);
- `_cut(n)`: keep the head cache's first n pairs; `_write(context, start, stop, output=)`: write pairs
  start..stop-1, and with `output` return the last pair's outputs (a step drafter's (logits [V], state));
- `_free()`: free the head's own resources (its capture of the target is released here).
A step drafter adds `_step(token, state, position) -> (logits [V], state)`; a block drafter `_block` and, for a
lattice, `_lattice`. A head learns nothing from a round (observe does nothing).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from localspec.backends.base import BlockLayout, common_prefix
from localspec.draft import EMPTY_DRAFT, Draft, sample_draft
from localspec.sampling import SamplingParams


class HeadTarget(Protocol):
    """What a head reads of the target it runs beside (both backends' Backend has it)."""

    n_ctx: int
    eog_ids: frozenset[int]

    @property
    def cached_tokens(self) -> Sequence[int]: ...

    def release_capture(self) -> None: ...


class HeadDrafter(ABC):
    """A drafter with a head beside `target` (borrowed), whose cache follows the committed context."""

    method: str
    LOOKAHEAD: ClassVar[int] = 0
    _capturing: bool = False  # this drafter turned the target's capture on (an __init__ may fail before)

    def __init__(self, target: Any, name: str) -> None:
        self.target = target
        self.name = name
        self._written: list[int] = []

    # -- Drafter protocol -------------------------------------------------------------------------

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self._written = []
        self._cut(0)
        self.catch_up(context)

    def lag(self, context: Sequence[int]) -> int:
        return max(0, self._n_pairs(context) - self._n_valid(context))

    def catch_up(self, context: Sequence[int]) -> None:
        self._sync(context, output=False)

    def observe(self, stats: object) -> None:  # noqa: B027 (a head learns nothing from the round's stats)
        pass

    def close(self) -> None:
        if self._capturing:
            self.target.release_capture()  # so that a method run next on this target pays for no capture
            self._capturing = False
        self._free()

    def __del__(self) -> None:
        self.close()

    # -- what a head says -------------------------------------------------------------------------

    @abstractmethod
    def _n_pairs(self, context: Sequence[int]) -> int:
        """Pairs this context can have now: those whose inputs the target holds."""

    @abstractmethod
    def _cut(self, n: int) -> None:
        """Keep the head cache's first n pairs."""

    @abstractmethod
    def _write(self, context: Sequence[int], start: int, stop: int, *, output: bool) -> Any:
        """Write pairs start..stop-1 (calling `_wrote` as parts land, if it writes in parts); with `output`, the
        last pair's outputs."""

    def _free(self) -> None:  # noqa: B027 (a head on the target's own weights owns nothing more)
        """Free the head's own resources (idempotent)."""

    # -- the head's cache -------------------------------------------------------------------------

    def _held(self, context: Sequence[int]) -> int:
        """Positions of `context` the target holds (its states and features are there)."""
        return common_prefix(self.target.cached_tokens, context, limit=len(context))

    def _n_valid(self, context: Sequence[int]) -> int:
        """Pairs in the head's cache still true for `context`: pair P needs context[0..P + LOOKAHEAD] unchanged."""
        return max(0, common_prefix(self._written, context, limit=len(context)) - self.LOOKAHEAD)

    def _ready(self, context: Sequence[int], n: int) -> bool:
        """Whether the head can hold n >= 1 pairs of `context` now (the target holds what they read)."""
        return n >= 1 and self._n_pairs(context) >= n

    def _wrote(self, context: Sequence[int], n: int) -> None:
        """The head's cache holds the first n pairs of `context`."""
        self._written = list(context[: n + self.LOOKAHEAD])

    def _sync(self, context: Sequence[int], *, output: bool) -> Any:
        """Cut the head's cache back to the pairs still true for `context` and write the missing ones; with
        `output`, the last pair is (re)written and its outputs come back."""
        n_pairs = self._n_pairs(context)
        if output and n_pairs == 0:
            raise ValueError(f"{self.name}: no pair to draft from (the target holds nothing the head reads here)")
        keep = min(self._n_valid(context), n_pairs - 1 if output else n_pairs)
        self._cut(keep)
        self._wrote(context, keep)
        if keep >= n_pairs:
            return None
        out = self._write(context, keep, n_pairs, output=output)
        self._wrote(context, n_pairs)
        return out


class StepDrafter(HeadDrafter):
    """A head that drafts token by token (EAGLE-3, MTP): the last pair's output is the first draft token's
    distribution, and each draft token goes back in with the head's own state, one position further, for the
    next. Its logits are over the target's vocabulary, so its q rows go straight to the exact rule."""

    _pos = 0  # while drafting: the next draft token's position
    _state: Any = None  # while drafting: the head's state paired with it

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        pos = len(context) - self.LOOKAHEAD  # the first draft token's position: past the last pair
        k = min(k, self.target.n_ctx - len(context) + 1)
        if k <= 0 or not self._ready(context, pos):
            return EMPTY_DRAFT  # no target state for the last pair (e.g. the target did not take it in)
        logits, self._state = self._sync(context, output=True)
        self._pos = pos
        tokens, q, note = sample_draft(logits, self._next, k, sampling, rng, min_confidence, self.target.eog_ids)
        return Draft(tokens, q, note, source=self.method)

    @abstractmethod
    def _step(self, token: int, state: Any, position: int) -> tuple[np.ndarray, Any]:
        """Feed (a draft token, the head's own last state) at `position`; (logits [V], the new state)."""

    def _next(self, token: int) -> np.ndarray:
        logits, self._state = self._step(token, self._state, self._pos)
        self._pos += 1
        return logits


# DFlash2's lattice: step(i, index, token) -> (candidate ids, their scores) at block position i, given the
# candidate taken before (its index among the previous position's candidates, and its token; the anchor first).
LatticeStep = Callable[[int, int, int], tuple[np.ndarray, np.ndarray]]


class BlockDrafter(HeadDrafter):
    """A head that drafts a block at a time (DFlash, DSpark, DFlash2): its cache holds the target's features at
    positions 0..N-2, and one pass over the block [last token, mask x n] drafts. The block holds as many masks as
    the longest draft of the generation (prepare's max_k, clamped to the trained block size), as llama.cpp sizes
    it by --draft-max: block positions see each other, so its length changes its logits, and a smaller k only
    truncates the draft."""

    LOOKAHEAD = 0  # the features at P read context[0..P]
    layout: BlockLayout  # the drafter's block
    lattice: bool = False  # DFlash2: a selector walks the lattice of candidates (a deterministic draft)
    _n_draft = 1  # drafts per block (prepare's max_k, clamped)

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self._n_draft = max(1, min(max_k, self.layout.n_draft_max))
        super().prepare(context, max_k)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        pos = len(context) - 1  # the block's anchor (the last committed token) goes here
        k = min(k, self._n_draft, self.target.n_ctx - len(context) + 1)
        if k <= 0 or not self._ready(context, pos):
            return EMPTY_DRAFT  # no features for a position before the anchor (the target did not take it in)
        self._sync(context, output=False)
        anchor = context[-1]
        if self.lattice:
            n, step = self._lattice(anchor, pos, k)
            tokens, note = walk_lattice(n, step, anchor, min_confidence, self.target.eog_ids)
            return Draft(tokens, None, note, source=self.method)  # deterministic: its q is one-hot
        rows, confidence = self._block(anchor, pos)
        first = 1 - int(self.layout.reads_anchor)  # the block slot of the first draft token
        return block_draft(rows[first : first + k], None if confidence is None else confidence[first : first + k],
                           sampling, rng, min_confidence, self.target.eog_ids, self.method)  # fmt: skip

    def _n_pairs(self, context: Sequence[int]) -> int:
        """Positions whose features the draft may use: before the anchor, and held by the target."""
        return max(0, min(len(context) - 1, self._held(context)))

    @abstractmethod
    def _block(self, anchor: int, pos: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The block [anchor, mask x n] at `pos`: each slot's logits over the target's vocabulary [rows, V] and
        DSpark's confidence per slot (None without a confidence head). Its K/V leave the head's cache again."""

    def _lattice(self, anchor: int, pos: int, k: int) -> tuple[int, LatticeStep]:
        """DFlash2: (the block positions to walk, counting the anchor's, and the candidates at each)."""
        raise NotImplementedError(f"{type(self).__name__} has no selector lattice")


def block_draft(
    rows: np.ndarray,
    confidence: np.ndarray | None,
    sampling: SamplingParams,
    rng: np.random.Generator,
    min_confidence: float,
    eog: frozenset[int],
    source: str,
) -> Draft:
    """The draft from a block's rows [k, V] (each drawn from its own row: the block is one pass over the context,
    so that row is its q), cut where DSpark's confidence head scores below min_confidence. The confidence head is
    DSpark's stopping rule (llama.cpp's p_min); without one, each draft token's own probability decides."""
    note = ""
    if confidence is not None and min_confidence > 0:
        low = np.flatnonzero(confidence < min_confidence)
        if len(low):
            rows = rows[: low[0]]
            note = f"draft stopped at position {low[0] + 1}: confidence head {confidence[low[0]]:.2f} < {min_confidence:.2f}"
        min_confidence = 0.0
    if len(rows) == 0:
        return Draft([], None, note, source=source)
    at = iter(rows[1:])
    tokens, q, stop = sample_draft(rows[0], lambda _token: next(at), len(rows), sampling, rng, min_confidence, eog)
    return Draft(tokens, q, note or stop, source=source)


def walk_lattice(
    n: int, step: LatticeStep, anchor: int, min_confidence: float, eog: frozenset[int]
) -> tuple[list[int], str]:
    """DFlash2, greedily as llama.cpp walks it: from the anchor, the best-scoring candidate at each block position
    1..n-1 given the one taken before; stops where the best one's share of its position's softmax falls below
    min_confidence, and after an end-of-generation token."""
    tokens: list[int] = []
    index, token = 0, anchor
    for i in range(1, n):
        candidates, scores = step(i, index, token)
        best = int(np.argmax(scores))
        if min_confidence > 0:
            conf = float(1.0 / np.exp(scores - scores[best]).sum())
            if conf < min_confidence:
                return tokens, f"draft stopped at position {i}: confidence {conf:.2f} < {min_confidence:.2f}"
        index, token = best, int(candidates[best])
        tokens.append(token)
        if token in eog:
            break
    return tokens, ""


@dataclass(frozen=True)
class VocabMap:
    """A head's logits over its own (maybe reduced) vocabulary, as logits over the target's: -inf where the head
    cannot draft. Published heads store the map as `d2t` offsets: target id = draft id + d2t[draft id]."""

    ids: np.ndarray | None  # the target id of each head id; None: the head's ids are the target's
    n_vocab: int  # the target's vocabulary

    @classmethod
    def from_offsets(cls, d2t: Any, n_vocab: int) -> VocabMap:
        if d2t is None:
            return cls(None, n_vocab)
        offsets = np.asarray(d2t, dtype=np.int64)
        return cls(np.arange(len(offsets)) + offsets, n_vocab)

    def __call__(self, row: np.ndarray) -> np.ndarray:
        if self.ids is None and len(row) == self.n_vocab:
            return row
        out = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        out[self.ids if self.ids is not None else np.arange(len(row))] = row
        return out


# -- a head given as a Hugging Face directory: which family its config.json is (the families' table asks) -----


def is_eagle3_config(raw: Mapping[str, Any]) -> bool:
    """Whether a config.json is an EAGLE-3 head's (either layout)."""
    archs = " ".join(raw.get("architectures") or []).lower()
    return raw.get("speculators_model_type") == "eagle3" or "eagle3" in archs


def is_block_config(raw: Mapping[str, Any]) -> bool:
    """Whether a config.json is a DFlash or DSpark block drafter's."""
    archs = " ".join(raw.get("architectures") or []).lower()
    return "dflash_config" in raw or "dflash" in archs or "dspark" in archs


def is_dspark_config(raw: Mapping[str, Any]) -> bool:
    """Whether a block drafter's config.json has DSpark's Markov head."""
    archs = " ".join(raw.get("architectures") or []).lower()
    dc = raw.get("dflash_config") or {}
    return "dspark" in archs or any(k in raw or k in dc for k in ("markov_rank", "markov_head_type"))
