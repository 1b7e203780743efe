"""llama.cpp's extended batch (llama_batch_ext), shared by the drafters that run a head beside the target
(EAGLE-3, MTP, DFlash/DSpark): rows of a token, an embedding or both, each with a position and an output
flag; one `process` call runs a batch through a context and turns llama.cpp's return code into our errors."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from localspec.backends.llama_cpp import _LOG, _last_error
from localspec.errors import GenerationError, Interrupted

# An embedding row of an M-RoPE model reads four positions (llama_batch_ext::set_token_pos); llama.cpp's own
# loops pass {p, p, p, 0}. A token row, or a row of any other model, reads only the first.
_POS4 = llama_cpp.llama_pos * 4


class ExtBatch:
    """A llama_batch_ext for one sequence (0); llama.cpp copies each row's embedding when it is added."""

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        self.ptr = llama_cpp.llama_batch_ext_init(ctx)
        self.n = 0

    def clear(self) -> None:
        llama_cpp.llama_batch_ext_clear(self.ptr)
        self.n = 0

    def add(self, token: int | None, embd: np.ndarray | None, pos: int, output: bool) -> int:
        """A row of a token, an embedding, or a token with an embedding; its index in the batch."""
        if token is None and embd is None:
            raise ValueError("a batch row needs a token or an embedding")
        e = None
        if embd is not None:
            row = np.ascontiguousarray(embd, dtype=np.float32)
            e = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.shape[-1])
        if token is None:
            idx = llama_cpp.llama_batch_ext_add_embd(self.ptr, 0, e)
        else:
            idx = llama_cpp.llama_batch_ext_add_token(self.ptr, 0, token)
            if idx >= 0 and e is not None and not llama_cpp.llama_batch_ext_set_embd_token(self.ptr, idx, e):
                idx = -2
        if idx < 0:
            raise GenerationError(f"llama.cpp refused a batch row (code {idx})", "lower --n-ctx or -k")
        llama_cpp.llama_batch_ext_set_pos(self.ptr, idx, _POS4(pos, pos, pos, 0))
        llama_cpp.llama_batch_ext_set_output_logits(self.ptr, idx, output)
        self.n += 1
        return idx

    def free(self) -> None:
        if self.ptr:
            llama_cpp.llama_batch_ext_free(self.ptr)
            self.ptr = None


def process(ctx, kind: int, batch: ExtBatch, *, what: str, hint: str) -> None:  # type: ignore[no-untyped-def]
    """Run `batch` through `ctx` (LLAMA_PROCESS_TYPE_ENCODE or _DECODE). Interrupted when the abort
    flag stopped it; GenerationError naming `what` failed otherwise."""
    with _LOG.capture() as log:
        rc = llama_cpp.llama_process(ctx, kind, batch.ptr)
    if rc == 2:
        raise Interrupted("stopped during a draft pass")
    if rc != 0:
        raise GenerationError(f"{what} failed (llama_process code {rc}): {_last_error(log) or 'no reason given'}", hint)


class HeadResources:
    """What a drafter beside the target owns in llama.cpp, freed once: its batch, its context and (unless it
    runs on the target's own model, as MTP does) its model. Such a drafter learns nothing from a round."""

    _batch: ExtBatch | None = None
    _ctx = None  # llama_context_p
    _model = None  # llama_model_p

    def observe(self, stats: object) -> None:
        pass

    def close(self) -> None:
        if self._batch is not None:
            self._batch.free()
            self._batch = None
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()
