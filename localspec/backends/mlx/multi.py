"""Several sequences of one loaded mlx-lm target, decoded in one batched forward (serve --parallel on MLX).

mlx-lm's own batching (BatchKVCache) keeps every row on one shared time axis with left padding, so a row
cannot be cut back alone; speculation cuts each sequence back by its own rejected drafts every pass. Here
each attention layer gets a `_BatchCache` over one buffer [sequences, kv heads, capacity, head dim]: row r holds
sequence r's keys at positions 0..length_r - 1, and a rollback only lowers length_r (the cells above are
masked and later overwritten). The model's own layers run unchanged: they read `offset` (an array, one
RoPE offset per row, as for BatchKVCache), call `update_and_fetch` (each row's new keys are written at its
own length) and build their mask through `make_mask`: query j of row b sees the keys at 0..length_b + j.

A pass is right-padded: B rows of the longest part's length. The padding costs compute, so
`pass_size` reports B x longest (the parallel policy plans on it: equal draft lengths are cheap, one long
draft among short ones is not). Prompt chunks of newly admitted sequences are read in their own forward
after the pass (`prefill_apart`): padding every row to a 256-token chunk would cost far more than a pass.

Only models whose every layer uses a plain KVCache run here (Gemma 3's sliding windows included: backends.mlx
keeps them whole and the window is in the mask, which `make_mask` builds per row too). A rotating cache or
recurrent layers (ArraysCache) are refused with the reason (serve them with --parallel 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localspec.backends.mlx.backend import MLXBackend, make_cache
from localspec.backends.parallel_sequence import ParallelSequence
from localspec.errors import GenerationError, Interrupted, UnsupportedModelError

STEP = 256  # buffer growth, in positions (as mlx-lm's caches grow)
CHUNK = 256  # a prompt is read this many tokens per forward


@dataclass
class _Pass:
    """What every layer's cache needs during one batched forward."""

    rows: tuple[int, ...]  # sequence of each batch row
    starts: tuple[int, ...]  # each row's length before the pass (its RoPE offset and write position)
    width: int  # key positions each row attends over: max(starts) + padded length
    offsets: Any  # mx.array [B]
    query_pos: Any  # mx.array [B, 1, L, 1]: each query's position
    key_pos: Any  # mx.array [1, 1, 1, width]
    index: Any  # mx.array [B] of rows, or None when the rows are one contiguous run
    masks: dict[int | None, Any] = field(default_factory=dict)  # by window size (None: full causal)

    def mask(self, window: int | None) -> Any:
        """Query j of row b sees keys 0..start_b + j (the last `window` of them for a sliding-window layer)."""
        if window not in self.masks:
            m = self.key_pos <= self.query_pos
            self.masks[window] = m if window is None else m & (self.query_pos < self.key_pos + window)
        return self.masks[window]


class _BatchCache:
    """One attention layer's keys and values for every sequence (see the module docstring)."""

    def __init__(self, owner: MLXParallel) -> None:
        self._owner = owner
        self.keys: Any = None
        self.values: Any = None

    @property
    def offset(self) -> Any:
        return self._owner.current.offsets

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None, **_: Any) -> Any:
        return self._owner.current.mask(window_size or None)

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        mx = self._owner.mx
        p = self._owner.current
        n = keys.shape[2]
        self._grow(max(s + n for s in p.starts), keys, values)
        for b, (row, start) in enumerate(zip(p.rows, p.starts)):
            self.keys[row, :, start : start + n, :] = keys[b]
            self.values[row, :, start : start + n, :] = values[b]
        if p.index is None:
            lo, hi = p.rows[0], p.rows[-1] + 1
            return self.keys[lo:hi, :, : p.width, :], self.values[lo:hi, :, : p.width, :]
        k = mx.take(self.keys[:, :, : p.width, :], p.index, axis=0)
        v = mx.take(self.values[:, :, : p.width, :], p.index, axis=0)
        return k, v

    def _grow(self, need: int, keys: Any, values: Any) -> None:
        mx = self._owner.mx
        have = 0 if self.keys is None else self.keys.shape[2]
        if need <= have:
            return
        more = -(-(need - have) // STEP) * STEP
        n_sequences = len(self._owner.sequences)
        k = mx.zeros((n_sequences, keys.shape[1], more, keys.shape[3]), keys.dtype)
        v = mx.zeros((n_sequences, values.shape[1], more, values.shape[3]), values.dtype)
        self.keys = k if self.keys is None else mx.concatenate([self.keys, k], axis=2)
        self.values = v if self.values is None else mx.concatenate([self.values, v], axis=2)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        if self.keys is not None:
            self.keys[dst, :, :n, :] = self.keys[src, :, :n, :]
            self.values[dst, :, :n, :] = self.values[src, :, :n, :]


class MLXParallel:
    """`n_sequences` sequences of a loaded MLX target, decoded together (the weights are the target's own)."""

    pass_padded = True  # a pass costs rows x its longest part
    prefill_apart = True  # prompt chunks are read in their own forward

    def __init__(self, target: MLXBackend, n_sequences: int, n_ctx_each: int) -> None:
        if n_sequences < 1:
            raise ValueError(f"n_sequences must be >= 1, got {n_sequences}")
        check_batchable(target)
        import mlx.core as mx

        self.mx = mx
        self.target = target
        self.sequences = [MLXSequence(self, i, n_ctx_each) for i in range(n_sequences)]
        self.layers = [_BatchCache(self) for _ in make_cache(target.model, target.config)]
        self.current: _Pass | None = None  # type: ignore[assignment]
        self.n_batch = CHUNK * 2

    # -- the batch ----------------------------------------------------------------------------------

    def pass_size(self, lengths: Sequence[int]) -> int:
        """Positions a pass over parts of these lengths computes (right padding included)."""
        return len(lengths) * max(lengths) if lengths else 0

    def forward_many(
        self, parts: Sequence[tuple[int, Sequence[int]]], prefill: Sequence[tuple[int, Sequence[int]]] = ()
    ) -> list[np.ndarray]:
        """Append each (sequence index, tokens) in one batched forward; every position's logits rows per part (copies),
        [len(tokens), V]. `prefill`: prompt chunks of other sequences, read after it, one forward each (their
        logits not kept)."""
        if len({seq for seq, _ in parts}) != len(parts):
            raise ValueError("forward_many takes one part per sequence")
        out = self._forward([(seq, list(tokens)) for seq, tokens in parts], all_logits=True) if parts else []
        for seq, tokens in prefill:
            self.sequences[seq].forward(tokens, all_logits=False)
        return out

    def _forward(self, parts: list[tuple[int, list[int]]], *, all_logits: bool) -> list[np.ndarray]:
        mx = self.mx
        if any(not tokens for _, tokens in parts):
            raise ValueError("forward_many needs parts with at least one token each")
        if self.target._aborted:
            raise Interrupted("stopped before the forward pass")
        for seq, tokens in parts:
            self.sequences[seq].check_room(len(tokens))
        order = [seq for seq, _ in parts]
        parts = sorted(parts)
        longest = max(len(tokens) for _, tokens in parts)
        inputs = mx.array([tokens + [0] * (longest - len(tokens)) for _, tokens in parts], dtype=mx.uint32)
        self.current = self._plan([seq for seq, _ in parts], longest)
        try:
            logits = self.target.model(inputs, cache=self.layers)  # [B, L, V]
            spans = [(0, len(t)) if all_logits else (len(t) - 1, len(t)) for _, t in parts]
            rows = [logits[b, lo:hi].astype(mx.float32) for b, (lo, hi) in enumerate(spans)]
            mx.eval(rows, *[(c.keys, c.values) for c in self.layers])
        except Exception as e:
            raise GenerationError(
                f"MLX batched forward failed: {type(e).__name__}: {e}", "see the message above"
            ) from e
        finally:
            self.current = None  # type: ignore[assignment]
        by_seq: dict[int, np.ndarray] = {}
        for (seq, tokens), r in zip(parts, rows):
            self.sequences[seq].appended(tokens)
            by_seq[seq] = np.asarray(r)
        return [by_seq[seq] for seq in order]

    def _plan(self, rows: list[int], longest: int) -> _Pass:
        mx = self.mx
        starts = [len(self.sequences[r].cached_tokens) for r in rows]
        width = max(starts) + longest
        key_pos = mx.arange(width)[None, None, None, :]
        query_pos = mx.array(starts)[:, None, None, None] + mx.arange(longest)[None, None, :, None]
        contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
        index = None if contiguous else mx.array(rows)
        return _Pass(tuple(rows), tuple(starts), width, mx.array(starts), query_pos, key_pos, index)

    def share(self, src: int, dst: int, n: int) -> None:
        """Sequence `dst` holds the first `n` cached tokens of sequence `src` (copied in every layer; not read
        again)."""
        source = self.sequences[src].cached_tokens
        if not 0 < n <= len(source) or src == dst:
            raise ValueError(f"cannot share {n} tokens of sequence {src} (holding {len(source)}) with sequence {dst}")
        for layer in self.layers:
            layer.copy_prefix(src, dst, n)
        self.mx.eval(*[(c.keys, c.values) for c in self.layers if c.keys is not None])
        self.sequences[dst].replaced(source[:n])

    def close(self) -> None:
        self.layers = []


def unbatchable(target: MLXBackend) -> str:
    """Why the target's layers cannot share an MLXParallel batch (a cache other than a plain KVCache), else ""."""
    from mlx_lm.models.cache import KVCache

    kinds = Counter(type(c).__name__ for c in make_cache(target.model, target.config))
    other = sorted(k for k in kinds if k != KVCache.__name__)
    if not other:
        return ""
    why = {"RotatingKVCache": "sliding-window layers", "ArraysCache": "recurrent layers"}
    reasons = ", ".join(f"{why.get(k, 'layers')} ({k})" for k in other)
    return f"{target.info.name} has {reasons}, which localspec's batched MLX cache does not hold per sequence"


def open_parallel(model: MLXBackend, n_sequences: int, n_ctx: int) -> MLXParallel:
    return MLXParallel(model, n_sequences, n_ctx)


def batches_pay(model: MLXBackend, n_gpu_layers: int) -> bool:
    """Several sequences per pass pay by default on Metal (on a CPU the cost grows per token)."""
    return model.info.device.startswith("Metal")


def check_batchable(target: MLXBackend) -> None:
    """UnsupportedModelError unless every layer of the target keeps a plain KVCache."""
    why = unbatchable(target)
    if why:
        raise UnsupportedModelError(why, "serve it with --parallel 1")


class MLXSequence(ParallelSequence):
    """One sequence of an MLXParallel batch, as a Backend (parallel_sequence.ParallelSequence: text, templates and facts from
    the target)."""

    def __init__(self, owner: MLXParallel, index: int, n_ctx: int) -> None:
        super().__init__(owner.target, index, n_ctx)
        self._owner = owner

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        """Append tokens to this sequence alone (a prompt: CHUNK tokens per forward)."""
        if not tokens:
            raise ValueError("forward needs at least one token")
        self.check_room(len(tokens))
        tokens = list(tokens)
        rows = []
        for start in range(0, len(tokens), CHUNK):
            rows.append(self._owner._forward([(self.index, tokens[start : start + CHUNK])], all_logits=all_logits)[0])
        return np.concatenate(rows) if all_logits else rows[-1]

    def rollback(self, n_keep: int) -> None:
        if self._rollback_route(n_keep) == "none":
            return
        del self._tokens[n_keep:]  # the cells above are masked until overwritten
