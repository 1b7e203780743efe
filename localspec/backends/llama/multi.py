"""Several sequences in one llama.cpp context (serve --parallel): a sequence id each, one batch for all of them.

`LlamaParallel` makes a second context on a loaded target's model (the weights are shared, not loaded again)
with `n_seq_max` = sequences and a unified KV cache, so the sequences share the cells and each holds up to
`n_ctx_each` positions. Each sequence is a Backend of its own (`LlamaSequence`: its tokens, forward and rollback
on its sequence id, `llama_memory_seq_rm` per sequence), and `forward_many` puts several sequences' tokens in one
`llama_decode`, returning each part's logits rows. `share` gives one sequence another's cached prefix without
reading it (the cells are tagged with both sequence ids). Recurrent and hybrid targets are refused: their per-sequence
state snapshots are not built here (serve runs them with --parallel 1).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import llama_cpp
import numpy as np

from localspec.backends.llama.backend import LOG, LlamaCppBackend, abort_check, last_error
from localspec.backends.parallel_sequence import ParallelSequence
from localspec.errors import GenerationError, Interrupted, ModelFileError, UnsupportedModelError


@dataclass(frozen=True)
class Part:
    """One sequence's share of a batched pass."""

    seq: int
    tokens: Sequence[int]
    all_logits: bool = True  # every position's logits (a verify), else the last one's (a prompt)


class LlamaParallel:
    """A context holding `n_sequences` sequences of a loaded llama.cpp target."""

    prefill_apart = False  # prompt chunks ride in the pass: a batch costs its tokens, not rows x the longest
    pass_padded = False

    def __init__(self, target: LlamaCppBackend, n_sequences: int, n_ctx_each: int, n_batch: int = 512) -> None:
        if target.info.is_recurrent:
            raise UnsupportedModelError(
                f"{target.info.name} has recurrent layers, whose per-sequence state snapshots localspec does not keep",
                "serve it with --parallel 1",
            )
        if n_sequences < 1:
            raise ValueError(f"n_sequences must be >= 1, got {n_sequences}")
        self.target = target
        self._ctx: llama_cpp.llama_context_p | None = self._new_context(n_sequences, n_ctx_each, n_batch)
        self._n_batch = int(llama_cpp.llama_n_batch(self._ctx))
        self._batch: Any = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.sequences = [LlamaSequence(self, i, n_ctx_each) for i in range(n_sequences)]

    def _new_context(self, n_sequences: int, n_ctx_each: int, n_batch: int) -> llama_cpp.llama_context_p:
        model, _ = self.target.handle
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_sequences * n_ctx_each
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_sequences
        params.kv_unified = True  # the sequences share the cells: a long conversation may use what idle ones leave
        params.n_threads = self.target.threads
        params.n_threads_batch = self.target.threads
        params.no_perf = True
        with LOG.capture() as log:
            ctx: llama_cpp.llama_context_p | None = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise ModelFileError(
                f"llama.cpp could not create a context of {n_sequences} x {n_ctx_each:,} tokens: "
                f"{last_error(log) or 'no reason given'}",
                "lower --parallel or --n-ctx, or free memory",
            )
        if abort_check() is not None:
            llama_cpp.llama_set_abort_callback(ctx, abort_check(), self.target.abort_flag_pointer)
        return ctx

    @property
    def n_batch(self) -> int:
        return self._n_batch

    def pass_size(self, lengths: Sequence[int]) -> int:
        """Positions a pass over parts of these lengths computes: one batch of all their tokens."""
        return sum(lengths)

    def forward_many(
        self, parts: Sequence[tuple[int, Sequence[int]]], prefill: Sequence[tuple[int, Sequence[int]]] = ()
    ) -> list[np.ndarray]:
        """Append each (sequence index, tokens) in one pass (more where they overflow the batch size); every position's
        logits rows per part (copies), [len(tokens), V]. `prefill`: prompt chunks of other sequences that ride in the
        same pass, their logits not kept (a new sequence's prompt read between the others' steps)."""
        chunks = [Part(seq, tokens, all_logits=False) for seq, tokens in prefill]
        return self.forward_parts([Part(seq, tokens) for seq, tokens in parts] + chunks)[: len(parts)]

    def forward_parts(self, parts: Sequence[Part]) -> list[np.ndarray]:
        """Append each part's tokens to its sequence in as few decodes as the batch size allows (one, when they fit);
        return each part's logits rows (copies), [len(tokens) or 1, V]."""
        if not parts or any(not p.tokens for p in parts):
            raise ValueError("forward_many needs parts with at least one token each")
        if len({p.seq for p in parts}) != len(parts):
            raise ValueError("forward_many takes one part per sequence")
        for p in parts:
            self.sequences[p.seq].check_room(len(p.tokens))
        out: list[np.ndarray | None] = [None] * len(parts)
        group: list[int] = []
        size = 0
        for i, p in enumerate(parts):
            if len(p.tokens) > self._n_batch:
                out[i] = self._forward_long(p)
                continue
            if size + len(p.tokens) > self._n_batch:
                self._run_group([parts[j] for j in group], group, out)
                group, size = [], 0
            group.append(i)
            size += len(p.tokens)
        if group:
            self._run_group([parts[j] for j in group], group, out)
        return [o for o in out if o is not None]

    def _forward_long(self, part: Part) -> np.ndarray:
        rows = []
        for start in range(0, len(part.tokens), self._n_batch):
            chunk = part.tokens[start : start + self._n_batch]
            last = start + self._n_batch >= len(part.tokens)
            rows.append(self._decode([replace(part, tokens=chunk, all_logits=part.all_logits)])[0])
            if not (part.all_logits or last):
                rows.pop()
        return np.concatenate(rows) if part.all_logits else rows[-1]

    def _run_group(self, parts: list[Part], where: list[int], out: list[np.ndarray | None]) -> None:
        for i, rows in zip(where, self._decode(parts)):
            out[i] = rows

    def _decode(self, parts: Sequence[Part]) -> list[np.ndarray]:
        """One llama_decode of the parts; each part's rows, copied out of llama.cpp's buffer."""
        if ctypes.cast(self.target.abort_flag_pointer, ctypes.c_char_p).value:
            raise Interrupted("stopped before the forward pass")
        b = self._batch
        n = 0
        counts = []
        for p in parts:
            base = len(self.sequences[p.seq].cached_tokens)
            for j, t in enumerate(p.tokens):
                b.token[n] = t
                b.pos[n] = base + j
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = p.seq
                b.logits[n] = p.all_logits or j == len(p.tokens) - 1
                n += 1
            counts.append(len(p.tokens) if p.all_logits else 1)
        b.n_tokens = n
        with LOG.capture() as log:
            rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            for p in parts:  # a failed decode may leave part of the batch: cut back to what each sequence tracks
                llama_cpp.llama_memory_seq_rm(self._memory, p.seq, len(self.sequences[p.seq].cached_tokens), -1)
            if rc == 2:
                raise Interrupted("stopped during a forward pass")
            raise GenerationError(
                f"llama_decode failed (code {rc}): {last_error(log) or 'no reason given'}",
                "the shared KV cache may be full; lower --parallel or --max-tokens, or raise --n-ctx",
            )
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(self._ctx), shape=(sum(counts), self.target.n_vocab))
        out, start = [], 0
        for p, c in zip(parts, counts):
            out.append(logits[start : start + c].copy())
            self.sequences[p.seq].appended(p.tokens)
            start += c
        return out

    def share(self, src: int, dst: int, n: int) -> None:
        """Sequence `dst` holds the first `n` cached tokens of sequence `src` without reading them: in the unified
        cache their cells are tagged with `dst`'s sequence id as well (no copy). What `dst` held before is dropped.
        A common prefix (a system prompt, an agent's tool list) is read once for every sequence."""
        source = self.sequences[src].cached_tokens
        if not 0 < n <= len(source) or src == dst:
            raise ValueError(f"cannot share {n} tokens of sequence {src} (holding {len(source)}) with sequence {dst}")
        self.remove(dst, 0)
        llama_cpp.llama_memory_seq_cp(self._memory, src, dst, 0, n)
        self.sequences[dst].replaced(source[:n])

    def remove(self, seq: int, n_keep: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq, n_keep, -1):
            raise UnsupportedModelError(
                f"llama.cpp could not cut sequence {seq} back to {n_keep} tokens", "use --parallel 1"
            )

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:  # __init__ may have failed before making it
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None) is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        self.close()


class LlamaSequence(ParallelSequence):
    """One sequence of a LlamaParallel context, as a Backend (parallel_sequence.ParallelSequence: text, templates and facts from
    the target)."""

    def __init__(self, owner: LlamaParallel, index: int, n_ctx: int) -> None:
        super().__init__(owner.target, index, n_ctx)
        self._owner = owner

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        if not tokens:
            raise ValueError("forward needs at least one token")
        return self._owner.forward_parts([Part(self.index, tokens, all_logits)])[0]

    def rollback(self, n_keep: int) -> None:
        if self._rollback_route(n_keep) == "none":
            return
        self._owner.remove(self.index, n_keep)
        del self._tokens[n_keep:]


# -- the backend table's entry points for serve --parallel (registry.BackendSpec.parallel_module) ---------------


def open_parallel(model: LlamaCppBackend, n_sequences: int, n_ctx: int) -> LlamaParallel:
    return LlamaParallel(model, n_sequences, n_ctx)


def unbatchable(model: LlamaCppBackend) -> str:
    """Why the model's sequences cannot share a context: only recurrent layers (checked before this), so ""."""
    return ""


def batches_pay(model: LlamaCppBackend, n_gpu_layers: int) -> bool:
    """Several sequences per pass pay by default where the passes run on a GPU (a CPU's cost grows per token)."""
    return n_gpu_layers != 0 and bool(llama_cpp.llama_supports_gpu_offload())
