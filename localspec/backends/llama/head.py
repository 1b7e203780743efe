"""What the drafters that run a head beside a llama.cpp target share (EAGLE-3, MTP, DFlash/DSpark): the head's
context and model, and its cache kept in line with the committed context.

The head's cache holds one *pair* per position: a row built from the context's tokens and what the target
computed for them (EAGLE-3: token P+1 with the fc projection of the target's features at P; MTP: token P
with the target's nextn state at P-1; DFlash: the target's features at P alone). A pair is true for a new
context while the tokens it was built from are unchanged and the target still holds what it read, so at every
proposal (and in catch_up) the cache is cut back to the pairs still true and the missing ones are written, in
batches. `_written` is the context the cache's pairs were built from (what holds if a write fails midway).

A family says only what differs:
- `_n_pairs(context)`: how many pairs a context can have now (the target must hold what they read);
- `LOOKAHEAD`: pair P needs context[0..P + LOOKAHEAD] unchanged (1 for EAGLE-3, whose pair P holds token P+1);
- `_rows(context, start, stop)`: the (token, embedding) input of each pair from `start` to `stop`;
- `propose`: the draft. StepDrafter drafts token by token (EAGLE-3, MTP); a block drafter decodes a block.
Such a drafter learns nothing from a round (observe does nothing).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import llama_cpp
import numpy as np

from localspec.backends.base import common_prefix
from localspec.backends.llama.backend import LlamaCppBackend
from localspec.backends.llama.batch import HeadContext, load_head_model
from localspec.draft import EMPTY_DRAFT, Draft, sample_draft
from localspec.sampling import SamplingParams

# A pair's input at position P: (token, embedding), either may be None but not both.
PairAt = Callable[[int], tuple[int | None, np.ndarray | None]]


class HeadDrafter(ABC):
    """A drafter with a head beside `target` (borrowed): owns the head's context and, unless it runs on the
    target's own weights (MTP), its model. A family's __init__ loads them with `_load_model` and `_open`
    inside `_closed_on_error`."""

    method: str
    LOOKAHEAD: ClassVar[int] = 0
    _model: llama_cpp.llama_model_p | None = None  # the head's own weights, freed with it
    _ctx: HeadContext | None = None
    _capturing: bool = False  # this drafter turned the target's hidden-state capture on

    def __init__(self, target: LlamaCppBackend, name: str, *, what: str, hint: str) -> None:
        self.target = target
        self.name = name
        self._what = what  # the head in errors: "the EAGLE-3 head"
        self._hint = hint  # what to do when one of its passes fails
        self._written: list[int] = []

    # -- building (a family's __init__) -----------------------------------------------------------

    @contextmanager
    def _closed_on_error(self) -> Iterator[None]:
        """Free what was built so far if building fails."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def _load_model(self, path: Path, n_gpu_layers: int) -> llama_cpp.llama_model_p:
        """The head's own weights, freed with the drafter."""
        self._model = load_head_model(path, n_gpu_layers, self._what)
        return self._model

    def _capture(self, model: llama_cpp.llama_model_p) -> None:
        """Have the target keep the hidden states of the layers the head reads (turned off with the drafter,
        so that a method run after this one on the same target does not pay for them)."""
        from localspec.backends.llama import ext as llama_ext

        self.target.capture_layers(llama_ext.target_layer_ids(model))  # checks the architecture again first
        self._capturing = True

    def _open(
        self,
        model: llama_cpp.llama_model_p,
        *,
        n_ctx: int,
        n_nextn: int,
        masked: bool = True,
        ctx_type: int | None = None,
    ) -> HeadContext:
        """The head's context on `model` (HeadContext says what the options mean), freed with the drafter."""
        self._ctx = HeadContext(
            model, self.target, what=self._what, hint=self._hint, n_ctx=n_ctx, n_nextn=n_nextn, masked=masked,
            ctx_type=ctx_type,
        )  # fmt: skip
        return self._ctx

    @property
    def ctx(self) -> HeadContext:
        """The head's context (a closed drafter has none: using one is a caller bug)."""
        if self._ctx is None:
            raise RuntimeError(f"the drafter {self.name} is closed")
        return self._ctx

    # -- Drafter protocol -------------------------------------------------------------------------

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self._written = []
        self.ctx.cut(0)
        self.catch_up(context)

    def lag(self, context: Sequence[int]) -> int:
        return max(0, self._n_pairs(context) - self._n_valid(context))

    def catch_up(self, context: Sequence[int]) -> None:
        self._sync(context, output=False)

    def observe(self, stats: object) -> None:  # noqa: B027 (a head learns nothing from the round's stats)
        pass

    def close(self) -> None:
        if self._capturing:
            self.target.release_capture()
            self._capturing = False
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()

    # -- what a family says -----------------------------------------------------------------------

    @abstractmethod
    def _n_pairs(self, context: Sequence[int]) -> int:
        """Pairs this context can have now: those whose inputs the target holds."""

    @abstractmethod
    def _rows(self, context: Sequence[int], start: int, stop: int) -> PairAt:
        """The input of each pair P in start..stop-1 (valid until the target runs again)."""

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

    def _sync(self, context: Sequence[int], *, output: bool) -> None:
        """Cut the head's cache back to the pairs still true for `context` and write the missing ones. With
        `output`, the last pair goes in a pass of its own with an output flag (re-fed if it was there), so its
        row 0 holds the first draft token's logits and the head's state.

        A pass of its own, as in llama.cpp's loops: the heads' graphs do not pick output rows (MTP sets its
        nextn output before picking them), so in a batch with one output flag llama.cpp would hand back the
        first row's outputs, not the flagged one's."""
        n_pairs = self._n_pairs(context)
        if output and n_pairs == 0:
            raise ValueError(f"no pair to draft from: the target holds nothing {self._what} reads here")
        silent = n_pairs - 1 if output else n_pairs  # pairs written without outputs
        keep = min(self._n_valid(context), silent)
        self.ctx.cut(keep)
        self._written = list(context[: keep + self.LOOKAHEAD])
        if keep >= n_pairs:
            return
        pair = self._rows(context, keep, n_pairs)
        for start in range(keep, silent, self.ctx.n_ubatch):
            stop = min(start + self.ctx.n_ubatch, silent)
            self.ctx.run((*pair(p), p, False) for p in range(start, stop))
            self._written = list(context[: stop + self.LOOKAHEAD])
        if output:
            self.ctx.run([(*pair(silent), silent, True)])
            self._written = list(context[: n_pairs + self.LOOKAHEAD])


class StepDrafter(HeadDrafter):
    """A head that drafts token by token (EAGLE-3, MTP): the last pair's output is the first draft token's
    distribution, and each draft token goes back in with the head's own state, one position further, for the
    next. The head's logits are over the target's vocabulary, so its q rows go straight to the exact rule."""

    def __init__(self, target: LlamaCppBackend, name: str, *, what: str, hint: str) -> None:
        super().__init__(target, name, what=what, hint=hint)
        self._pos = 0  # while drafting: the next draft token's position
        self._state = np.empty(0, np.float32)  # while drafting: the head's state paired with it

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
        self._sync(context, output=True)
        logits, self._state = self._outputs()
        self._pos = pos
        tokens, q, note = sample_draft(logits, self._step, k, sampling, rng, min_confidence, self.target.eog_ids)
        return Draft(tokens, q, note, source=self.method)

    def _step(self, token: int) -> np.ndarray:
        """Feed (draft token, the head's own last state) at the next position; its logits [V]."""
        self.ctx.run([(token, self._state, self._pos, True)])
        logits, self._state = self._outputs()
        self._pos += 1
        return logits

    def _outputs(self) -> tuple[np.ndarray, np.ndarray]:
        """The logits [V] and the head's state [E] of the last pass's one row."""
        return self.ctx.logits_row(0), self.ctx.nextn_row(0)
