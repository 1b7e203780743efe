"""llama.cpp's extended batch (llama_batch_ext) and the context a head runs in beside the target, shared by
the drafters that run one (EAGLE-3, MTP, DFlash/DSpark; backends.llama.head): rows of a token, an embedding
or both, each with a position and an output flag, run through the head's context in one pass whose
llama.cpp return code becomes our errors."""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.backends.llama import ext as llama_ext
from localspec.backends.llama.backend import LOG, LlamaCppBackend, abort_check, last_error
from localspec.errors import GenerationError, Interrupted, ModelFileError

# An embedding row of an M-RoPE model reads four positions (llama_batch_ext::set_token_pos); llama.cpp's own
# loops pass {p, p, p, 0}. A token row, or a row of any other model, reads only the first.
_POS4 = llama_cpp.llama_pos * 4

# A batch row: (token, embedding, position, output flag); a row has a token, an embedding or both.
Row = tuple[int | None, np.ndarray | None, int, bool]


class ExtBatch:
    """A llama_batch_ext for one sequence (0); llama.cpp copies each row's embedding when it is added."""

    def __init__(self, ctx: llama_cpp.llama_context_p) -> None:
        ptr = llama_cpp.llama_batch_ext_init(ctx)
        if not ptr:
            raise GenerationError("llama.cpp could not make a batch for a head", "lower --n-ctx, or free memory")
        self.ptr: llama_cpp.llama_batch_ext_p = ptr
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
            idx = int(llama_cpp.llama_batch_ext_add_embd(self.ptr, 0, e))
        else:
            idx = int(llama_cpp.llama_batch_ext_add_token(self.ptr, 0, token))
            if idx >= 0 and e is not None and not llama_cpp.llama_batch_ext_set_embd_token(self.ptr, idx, e):
                idx = -2
        if idx < 0:
            raise GenerationError(f"llama.cpp refused a batch row (code {idx})", "lower --n-ctx or -k")
        llama_cpp.llama_batch_ext_set_pos(self.ptr, idx, _POS4(pos, pos, pos, 0))
        llama_cpp.llama_batch_ext_set_output_logits(self.ptr, idx, output)
        self.n += 1
        return idx

    def free(self) -> None:
        """Once: the batch is unusable after."""
        llama_cpp.llama_batch_ext_free(self.ptr)


class HeadContext:
    """A head's llama.cpp context beside `target`, with its one batch: one sequence, the target's threads, the
    target's context as ctx_other, nextn rows out (of output rows when `masked`), stopped by the target's
    abort flag. `what` names the head in errors ("the EAGLE-3 head"), `hint` says what to do when a pass fails.

    `n_nextn`: the width of the nextn rows the head writes (its hidden size, or n_embd_out for MTP)."""

    def __init__(
        self,
        model: llama_cpp.llama_model_p,
        target: LlamaCppBackend,
        *,
        what: str,
        hint: str,
        n_ctx: int,
        n_nextn: int,
        masked: bool = True,
        ctx_type: int | None = None,
    ) -> None:
        self.what, self.hint = what, hint
        self.ptr = _new_context(model, target, what=what, n_ctx=n_ctx, masked=masked, ctx_type=ctx_type)
        try:
            self.batch = ExtBatch(self.ptr)
        except BaseException:
            llama_cpp.llama_free(self.ptr)
            raise
        self.memory: llama_cpp.llama_memory_t = llama_cpp.llama_get_memory(self.ptr)
        self.n_ubatch = int(llama_cpp.llama_n_ubatch(self.ptr))  # = n_batch: both are set alike
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
        self.n_nextn = n_nextn
        self._open = True

    def run(self, rows: Iterable[Row], kind: int = llama_cpp.LLAMA_PROCESS_TYPE_DECODE) -> int:
        """One pass over `rows` (LLAMA_PROCESS_TYPE_DECODE or _ENCODE); how many rows it had. Interrupted when
        the abort flag stopped it, GenerationError when it failed; either way none of its rows stays cached."""
        self.batch.clear()
        first = -1
        for token, embd, pos, output in rows:
            self.batch.add(token, embd, pos, output)
            first = pos if first < 0 else first
        if first < 0:
            raise ValueError("a pass needs at least one row")
        try:
            self._process(kind)
        except BaseException:
            self.cut(first)
            raise
        return self.batch.n

    def _process(self, kind: int) -> None:
        with LOG.capture() as log:
            rc = llama_cpp.llama_process(self.ptr, kind, self.batch.ptr)
        if rc == 2:
            raise Interrupted("stopped during a draft pass")
        if rc != 0:
            reason = last_error(log) or "no reason given"
            raise GenerationError(f"{self.what} failed (llama_process code {rc}): {reason}", self.hint)

    def cut(self, pos: int) -> None:
        """Drop every cached position from `pos` on."""
        llama_cpp.llama_memory_seq_rm(self.memory, 0, pos, -1)

    def next_pos(self) -> int:
        """The first position past the cache."""
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, 0)) + 1

    # The last pass's outputs, as copies (llama.cpp reuses its buffers).

    def logits_row(self, i: int) -> np.ndarray:
        """[V]: the logits of output row i."""
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ptr, i), shape=(self.n_vocab,)).copy()

    def logits_rows(self, n: int) -> np.ndarray:
        """[n, V]: the logits of the first n output rows."""
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.ptr), shape=(n, self.n_vocab)).copy()

    def nextn_row(self, i: int) -> np.ndarray:
        """[E]: the nextn row of output row i."""
        return np.ctypeslib.as_array(llama_ext.nextn_row(self.ptr, i), shape=(self.n_nextn,)).copy()

    def nextn_rows(self, n: int) -> np.ndarray:
        """[n, E]: the first n nextn rows."""
        return np.ctypeslib.as_array(llama_ext.nextn_rows(self.ptr), shape=(n, self.n_nextn)).copy()

    def close(self) -> None:
        if self._open:
            self._open = False
            self.batch.free()
            llama_cpp.llama_free(self.ptr)


def load_head_model(path: Path, n_gpu_layers: int, what: str) -> llama_cpp.llama_model_p:
    """A head's own GGUF as a llama_model (`what` names it in the error: "the EAGLE-3 head")."""
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
    with LOG.capture() as log:
        model: llama_cpp.llama_model_p | None = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        raise ModelFileError(f"llama.cpp could not load {what} {path}: {last_error(log)}", "the file may be damaged")
    return model


def _new_context(
    model: llama_cpp.llama_model_p,
    target: LlamaCppBackend,
    *,
    what: str,
    n_ctx: int,
    masked: bool,
    ctx_type: int | None,
) -> llama_cpp.llama_context_p:
    _, target_ctx = target.handle
    params = llama_cpp.llama_context_default_params()
    if ctx_type is not None:
        params.ctx_type = ctx_type
    params.ctx_other = target_ctx  # the head embeds tokens (and may read logits) with the target's weights
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = 512
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = target.threads
    params.no_perf = True
    with LOG.capture() as log:
        ctx: llama_cpp.llama_context_p | None = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise ModelFileError(f"llama.cpp could not create {what}'s context: {last_error(log)}", "lower --n-ctx")
    llama_ext.set_nextn_output(ctx, True, masked=masked)
    check = abort_check()
    if check is not None:  # the target's abort flag stops the head's passes too (Ctrl-C, Esc)
        llama_cpp.llama_set_abort_callback(ctx, check, target.abort_flag_pointer)
    return ctx
