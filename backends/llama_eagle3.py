"""EAGLE-3 drafting on llama.cpp: a one-layer head that reads three of the target's layers.

The loop follows llama.cpp's own (common/speculative.cpp, common_speculative_impl_draft_eagle3):
- the target keeps the inputs of the head's three layers for every cached position
  (LlamaCppBackend.capture_layers; natively, no per-tensor callback);
- the head ENCODEs those features into g rows (its fc projection), then DECODEs pairs: at position P
  the pair (token[P+1], g[P]), so the head's cache holds positions 0..N-2 of a context of N tokens;
- drafting feeds (draft token, the head's own pre-norm state) step by step from position N-1 on.
The head's logits are over the target's vocabulary (a reduced head vocabulary is mapped back by its
d2t tensor inside the graph), so its q rows go straight to the exact rule.

Rollback: the head's cache is cut back to the pairs still true for the new context at every proposal
(the drafter's own state; the target's is the engine's job).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.backends import llama_ext
from localspec.backends.base import common_prefix
from localspec.backends.llama_batch import ExtBatch, HeadResources, head_context, load_head_model, process
from localspec.backends.llama_cpp import LlamaCppBackend, read_header
from localspec.draft import EMPTY_DRAFT, Draft, sample_draft
from localspec.sampling import SamplingParams
from localspec.errors import ModelFileError, UnsupportedModelError

ARCH = "eagle3"


def head_layers(head_path: str | Path, n_target_layer: int) -> list[int]:
    """The target layers a head reads: its `eagle3.target_layers`, else llama.cpp's convention."""
    meta = read_header(head_path).metadata
    ids = meta.get(f"{ARCH}.target_layers")
    if ids:
        return [int(i) for i in ids]
    return [2, n_target_layer // 2, n_target_layer - 3]


def check_head(head_path: str | Path, target_path: str | Path) -> None:
    """From the two headers alone: the head is an EAGLE-3 head made for this target, and the target's
    architecture can hand over its hidden states (llama.cpp aborts the process when it cannot).
    Raises ModelFileError or UnsupportedModelError."""
    head = read_header(head_path)
    target = read_header(target_path)
    name = Path(head_path).name
    if head.architecture != ARCH:
        raise ModelFileError(
            f"{name} is a {head.architecture!r} model, not an EAGLE-3 head (architecture 'eagle3')",
            "--draft-method eagle3 needs an EAGLE-3 head GGUF; for a small draft model use --draft-method model",
        )
    t_meta, arch = target.metadata, target.architecture
    n_layer = int(t_meta.get(f"{arch}.block_count") or 0)
    llama_ext.check_capture_architecture(
        arch, model_name=Path(target_path).name, layer_ids=head_layers(head_path, n_layer), n_layer=n_layer
    )
    want, have = head.metadata.get(f"{ARCH}.target_hidden_size"), t_meta.get(f"{arch}.embedding_length")
    if want is not None and have is not None and int(want) != int(have):
        raise UnsupportedModelError(
            f"{name} was made for a target with hidden size {want}, but {Path(target_path).name} has {have}",
            "pick the EAGLE-3 head trained for this target model",
        )


class Eagle3Drafter(HeadResources):
    """Drafts with an EAGLE-3 head on a llama.cpp target. Owns the head (model and context); borrows
    the target, whose layer capture it turns on."""

    method = "eagle3"

    def __init__(self, target: LlamaCppBackend, head_path: str | Path, *, n_gpu_layers: int = -1) -> None:
        llama_ext.require_family("eagle3")
        check_head(head_path, target.info.path)
        self.target = target
        self.name = f"eagle3:{Path(head_path).stem}"
        self._model = None
        self._ctx = None
        self._batch: ExtBatch | None = None
        try:
            self._model = load_head_model(Path(head_path), n_gpu_layers, "the EAGLE-3 head")
            self._layers = llama_ext.target_layer_ids(self._model)
            target.capture_layers(self._layers)  # checks the architecture again before enabling anything
            self._ctx = head_context(self._model, target, what="the EAGLE-3 head", n_ctx=target.n_ctx)
            self._batch = ExtBatch(self._ctx)
            self._n_ubatch = int(llama_cpp.llama_n_ubatch(self._ctx))
            self._n_embd = int(llama_cpp.llama_model_n_embd(self._model))
            self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model)))
            self._memory = llama_cpp.llama_get_memory(self._ctx)
        except BaseException:
            self.close()
            raise
        # The context whose pairs the head's cache holds: positions 0..len-2 (pair P = (ctx[P+1], g[P])).
        self._written: list[int] = []
        self._pos = 0  # while drafting: the next draft token's position, and the head state it pairs with
        self._state = np.empty(0, np.float32)

    # -- Drafter protocol -------------------------------------------------------------------------

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self._written = []
        llama_cpp.llama_memory_seq_rm(self._memory, 0, 0, -1)
        self.catch_up(context)

    def lag(self, context: Sequence[int]) -> int:
        return max(0, self._n_pairs(context) - self._n_valid(context))

    def catch_up(self, context: Sequence[int]) -> None:
        self._sync(context, output=False)

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator, *, min_confidence: float = 0.0
    ) -> Draft:
        pos = len(context) - 1  # where the first draft token goes
        k = min(k, self.target.n_ctx - len(context) + 1)
        if k <= 0 or len(context) < 2 or self._n_pairs(context) < pos:
            return EMPTY_DRAFT  # no features for the last position (e.g. the target did not take it in)
        logits, self._state = self._sync(context, output=True)
        self._pos = pos
        tokens, q, note = sample_draft(logits, self._step, k, sampling, rng, min_confidence, self.target.eog_ids)
        return Draft(tokens, q, note, source="eagle3")

    def _step(self, token: int) -> np.ndarray:
        """Feed (draft token, the head's own last state) at the next position; its logits [V]."""
        self._batch.clear()  # type: ignore[union-attr]
        self._batch.add(token, self._state, self._pos, True)  # type: ignore[union-attr]
        logits, self._state = self._decode_last()
        self._pos += 1
        return logits

    # -- the head's cache -------------------------------------------------------------------------

    def _n_pairs(self, context: Sequence[int]) -> int:
        """Pairs this context can have: one per position P <= N-2 whose features the target holds."""
        have = common_prefix(self.target.cached_tokens, context, limit=len(context))
        return max(0, min(len(context) - 1, have))

    def _n_valid(self, context: Sequence[int]) -> int:
        """Pairs in the head's cache still true for `context`: pair P needs context[0..P+1] unchanged."""
        return max(0, common_prefix(self._written, context, limit=len(context)) - 1)

    def _sync(self, context: Sequence[int], *, output: bool) -> tuple[np.ndarray, np.ndarray]:
        """Cut the head's cache back to the pairs still true, write the missing ones; with `output`,
        return the logits [V] and pre-norm state [E] of the last pair (re-fed if it was already there).

        The last pair goes in a batch of its own: the head's graph does not pick output rows, so in a
        batch with one output flag llama.cpp would hand back the first row's logits, not the flagged one.
        """
        n_pairs = self._n_pairs(context)
        if output and n_pairs == 0:
            raise ValueError("no pair to draft from: the target holds no features for this context")
        keep = min(self._n_valid(context), n_pairs - 1 if output else n_pairs)
        llama_cpp.llama_memory_seq_rm(self._memory, 0, keep, -1)
        self._written = list(context[: keep + 1])  # what holds if a write below fails or is aborted
        if keep >= n_pairs:
            return np.empty(0, np.float32), np.empty(0, np.float32)
        g = self._encode(self.target.features(keep, n_pairs))  # [n, E]
        silent = n_pairs - 1 if output else n_pairs  # pairs written without outputs
        for start in range(keep, silent, self._n_ubatch):
            self._batch.clear()  # type: ignore[union-attr]
            for p in range(start, min(start + self._n_ubatch, silent)):
                self._batch.add(context[p + 1], g[p - keep], p, False)  # type: ignore[union-attr]
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE)
        self._written = list(context[: silent + 1])
        if not output:
            return np.empty(0, np.float32), np.empty(0, np.float32)
        self._batch.clear()  # type: ignore[union-attr]
        self._batch.add(context[n_pairs], g[n_pairs - 1 - keep], n_pairs - 1, True)  # type: ignore[union-attr]
        result = self._decode_last()
        self._written = list(context[: n_pairs + 1])
        return result

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """The head's fc projection of target features [n, 3 * E_target] -> g rows [n, E]."""
        out = np.empty((len(features), self._n_embd), np.float32)
        base = int(llama_cpp.llama_memory_seq_pos_max(self._memory, 0)) + 1  # the encoder ignores positions
        for start in range(0, len(features), self._n_ubatch):
            chunk = features[start : start + self._n_ubatch]
            self._batch.clear()  # type: ignore[union-attr]
            for j, row in enumerate(chunk):
                self._batch.add(None, row, base + j, True)  # type: ignore[union-attr]
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE)
            ptr = llama_ext.nextn_rows(self._ctx)
            out[start : start + len(chunk)] = np.ctypeslib.as_array(ptr, shape=(len(chunk), self._n_embd))
        return out

    def _decode_last(self) -> tuple[np.ndarray, np.ndarray]:
        """Decode the batch; the logits [V] and pre-norm state [E] of its last row (copies)."""
        self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE)
        last = self._batch.n - 1  # type: ignore[union-attr]
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, last), shape=(self._n_vocab,)).copy()
        state = np.ctypeslib.as_array(llama_ext.nextn_row(self._ctx, last), shape=(self._n_embd,)).copy()
        return logits, state

    def _process(self, kind: int) -> None:
        process(
            self._ctx, kind, self._batch, what="the EAGLE-3 head",  # type: ignore[arg-type]
            hint="lower --n-ctx or -k, or use --draft-method model",
        )
