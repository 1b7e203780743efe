"""The batch that drafters reading the target's hidden states feed to llama.cpp (EAGLE-3, MTP).

A llama_batch_ext row carries a token and/or an embedding row, a position and an output flag; one
`process` call runs a batch through a context and turns llama.cpp's return code into our errors.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from localspec.backends.llama_cpp import _LOG, _last_error
from localspec.errors import GenerationError, Interrupted


class ExtBatch:
    """A llama_batch_ext: rows of (token and/or embedding, position, output flag) on sequence 0."""

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        self.ptr = llama_cpp.llama_batch_ext_init(ctx)
        self.n = 0

    def clear(self) -> None:
        llama_cpp.llama_batch_ext_clear(self.ptr)
        self.n = 0

    def add(self, token: int | None, embd: np.ndarray, pos: int, output: bool) -> int:
        """Append a row; its index in the batch (what llama_get_logits_ith and friends take)."""
        row = np.ascontiguousarray(embd, dtype=np.float32)  # llama.cpp copies it
        e = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.shape[-1])
        if token is None:
            idx = llama_cpp.llama_batch_ext_add_embd(self.ptr, 0, e)
        else:
            idx = llama_cpp.llama_batch_ext_add_token(self.ptr, 0, token)
            if idx >= 0 and not llama_cpp.llama_batch_ext_set_embd_token(self.ptr, idx, e):
                idx = -2
        if idx < 0:
            raise GenerationError(f"llama.cpp refused a batch row (code {idx})", "lower --n-ctx or -k")
        llama_cpp.llama_batch_ext_set_pos(self.ptr, idx, ctypes.byref(llama_cpp.llama_pos(pos)))
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
