"""llama.cpp's extended batch (llama_batch_ext), shared by the drafters that run a head beside the target
(EAGLE-3, MTP, DFlash/DSpark): rows of a token, an embedding or both, each with a position and an output
flag; one `process` call runs a batch through a context and turns llama.cpp's return code into our errors."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.backends import llama_ext
from localspec.backends.llama_cpp import _LOG, LlamaCppBackend, _abort_check, _last_error
from localspec.errors import GenerationError, Interrupted, ModelFileError

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


def load_head_model(path: Path, n_gpu_layers: int, what: str):  # type: ignore[no-untyped-def]
    """A head's own GGUF as a llama_model (`what` names it in the error: "the EAGLE-3 head")."""
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
    with _LOG.capture() as log:
        model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        raise ModelFileError(f"llama.cpp could not load {what} {path}: {_last_error(log)}", "the file may be damaged")
    return model


def head_context(  # type: ignore[no-untyped-def]
    model, target: LlamaCppBackend, *, what: str, n_ctx: int, masked: bool = True, ctx_type: int | None = None
):
    """A context for a head beside `target`: one sequence, the target's threads, the target's context as
    ctx_other, nextn rows out (of output rows when `masked`), stopped by the target's abort flag."""
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
    with _LOG.capture() as log:
        ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise ModelFileError(f"llama.cpp could not create {what}'s context: {_last_error(log)}", "lower --n-ctx")
    llama_ext.set_nextn_output(ctx, True, masked=masked)
    if _abort_check() is not None:  # the target's abort flag stops the head's passes too (Ctrl-C, Esc)
        llama_cpp.llama_set_abort_callback(ctx, _abort_check(), target.abort_flag_pointer)
    return ctx
