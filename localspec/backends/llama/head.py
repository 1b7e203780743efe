"""A head beside a llama.cpp target (EAGLE-3, MTP, DFlash/DSpark): its model and context, and its passes.
The cache bookkeeping, the draft loop and the block proposal are every backend's (localspec/backends/heads.py);
what is llama.cpp's is here: the head's context (batch.py), its weights, the target's capture, and the writes.

A family says what differs: `_n_pairs(context)` and `LOOKAHEAD` (heads.py), and `_rows(context, start, stop)`:
the (token, embedding) input of each pair from `start` to `stop`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from localspec.backends import heads
from localspec.backends.llama.backend import LlamaCppBackend
from localspec.backends.llama.batch import HeadContext, load_head_model

# A pair's input at position P: (token, embedding), either may be None but not both.
PairAt = Callable[[int], tuple[int | None, np.ndarray | None]]


class LlamaHead(heads.HeadDrafter):
    """A head beside `target` (borrowed): owns the head's context and, unless it runs on the target's own
    weights (MTP), its model. A family's __init__ loads them with `_load_model` and `_open` inside
    `_closed_on_error`."""

    _model: llama_cpp.llama_model_p | None = None  # the head's own weights, freed with it
    _ctx: HeadContext | None = None

    def __init__(self, target: LlamaCppBackend, name: str, *, what: str, hint: str) -> None:
        super().__init__(target, name)
        self.target: LlamaCppBackend = target
        self._what = what  # the head in errors: "the EAGLE-3 head"
        self._hint = hint  # what to do when one of its passes fails

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
        from localspec.backends.llama import ext

        self.target.capture_layers(ext.target_layer_ids(model))  # checks the architecture again first
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

    def _free(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    # -- the head's cache -------------------------------------------------------------------------

    def _rows(self, context: Sequence[int], start: int, stop: int) -> PairAt:
        """The input of each pair P in start..stop-1 (valid until the target runs again)."""
        raise NotImplementedError(f"{type(self).__name__} writes no pairs")

    def _cut(self, n: int) -> None:
        self.ctx.cut(n)

    def _write(self, context: Sequence[int], start: int, stop: int, *, output: bool) -> Any:
        """Pairs in batches of the context's n_ubatch; with `output`, the last pair goes in a pass of its own with
        an output flag, so its row 0 holds the first draft token's logits and the head's state.

        A pass of its own, as in llama.cpp's loops: the heads' graphs do not pick output rows (MTP sets its
        nextn output before picking them), so in a batch with one output flag llama.cpp would hand back the
        first row's outputs, not the flagged one's."""
        silent = stop - 1 if output else stop  # pairs written without outputs
        pair = self._rows(context, start, stop)
        for first in range(start, silent, self.ctx.n_ubatch):
            last = min(first + self.ctx.n_ubatch, silent)
            self.ctx.run((*pair(p), p, False) for p in range(first, last))
            self._wrote(context, last)
        if not output:
            return None
        self.ctx.run([(*pair(silent), silent, True)])
        return self._outputs()

    def _outputs(self) -> tuple[np.ndarray, np.ndarray]:
        """The logits [V] and the head's state [E] of the last pass's one row."""
        return self.ctx.logits_row(0), self.ctx.nextn_row(0)


class StepDrafter(LlamaHead, heads.StepDrafter):
    """A head that drafts token by token (EAGLE-3, MTP) on llama.cpp: each draft token is one more row, with the
    head's own last state as its embedding."""

    def _step(self, token: int, state: Any, position: int) -> tuple[np.ndarray, Any]:
        self.ctx.run([(token, state, position, True)])
        return self._outputs()
