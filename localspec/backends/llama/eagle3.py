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

from localspec.backends.llama import ext as llama_ext
from localspec.backends.llama.backend import LlamaCppBackend, read_header
from localspec.backends.llama.head import PairAt, StepDrafter
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


class Eagle3Drafter(StepDrafter):
    """Drafts with an EAGLE-3 head on a llama.cpp target. Owns the head (model and context); borrows
    the target, whose layer capture it turns on."""

    method = "eagle3"
    LOOKAHEAD = 1  # pair P is (ctx[P+1], g[P]): the cache holds positions 0..len-2

    def __init__(self, target: LlamaCppBackend, head_path: str | Path, *, n_gpu_layers: int = -1) -> None:
        llama_ext.require_family("eagle3")
        check_head(head_path, target.info.path)
        what, hint = "the EAGLE-3 head", "lower --n-ctx or -k, or use --draft-method model"
        super().__init__(target, f"eagle3:{Path(head_path).stem}", what=what, hint=hint)
        with self._closed_on_error():
            model = self._load_model(Path(head_path), n_gpu_layers)
            self._capture(model)
            self._open(model, n_ctx=target.n_ctx, n_nextn=int(llama_cpp.llama_model_n_embd(model)))

    def _n_pairs(self, context: Sequence[int]) -> int:
        """One per position P <= N-2 whose features the target holds."""
        return max(0, min(len(context) - 1, self._held(context)))

    def _rows(self, context: Sequence[int], start: int, stop: int) -> PairAt:
        g = self._encode(self.target.features(start, stop))  # [n, E]
        return lambda p: (context[p + 1], g[p - start])

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """The head's fc projection of target features [n, 3 * E_target] -> g rows [n, E]."""
        ctx = self.ctx
        out = np.empty((len(features), ctx.n_nextn), np.float32)
        base = ctx.next_pos()  # the encoder ignores positions
        for start in range(0, len(features), ctx.n_ubatch):
            chunk = features[start : start + ctx.n_ubatch]
            ctx.run(((None, row, base + j, True) for j, row in enumerate(chunk)), llama_cpp.LLAMA_PROCESS_TYPE_ENCODE)
            out[start : start + len(chunk)] = ctx.nextn_rows(len(chunk))
        return out
