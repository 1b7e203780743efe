"""DFlash and DSpark block drafting on llama.cpp: one non-causal pass drafts a whole block.

The loop follows llama.cpp's own (common/speculative.cpp, common_speculative_impl_draft_dflash; DSpark is
the same loop with `is_dspark`):
- the target keeps the inputs of the drafter's target layers for every cached position
  (LlamaCppBackend.capture_layers); those features, the layers side by side, are DECODEd into the
  drafter as embedding rows at the target's positions: the drafter's graph projects them (fc) and writes
  only their K/V, so its cache holds the context as the target saw it, positions 0..N-2;
- a draft decodes one block [last token, mask x n] at positions N-1.. with non-causal attention
  (llama_set_causal_attn) and reads every position's logits; the block's own K/V are dropped after.
- DFlash reads positions 1..n; DSpark (a Markov head biases each position by the one before it, in the
  graph) reads 0..n-1 when it samples from the anchor, else 1..n like DFlash; with a confidence head it
  stops where that head's score falls below the caller's min_confidence (llama.cpp's p_min).
- DFlash2 (a selector, llama_model_dflash_selector_top_k > 0) walks the lattice of top-k candidates its
  graph writes to the nextn rows, greedily, as llama.cpp does: a deterministic (one-hot) draft.
The block holds as many masks as the longest draft of the generation (prepare's max_k, clamped to the
trained block size), as llama.cpp sizes it by --draft-max: non-causal positions see each other, so a
block's length changes its logits, and a shorter k only truncates the draft.

q: every block position's logits are computed in one pass from the context alone (DSpark's Markov chain
follows the argmax inside the graph), so the draft token at position i is drawn from the processed
softmax of position i, and that row is its q for the exact rule.

Rollback: the drafter's cache is cut back to the features still true for the new context at every
proposal (the drafter's own state; the target's is the engine's job).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.backends import heads
from localspec.backends.base import BlockLayout
from localspec.backends.llama import ext as llama_ext
from localspec.backends.llama.backend import LlamaCppBackend, read_header
from localspec.backends.llama.head import LlamaHead, PairAt
from localspec.errors import ModelFileError, UnsupportedModelError, UsageError

ARCH = "dflash"  # DFlash, DFlash2 and DSpark drafters all convert to this architecture
METHODS = ("dflash", "dspark")
_LABEL = {"dflash": "DFlash", "dspark": "DSpark"}


@dataclass(frozen=True)
class BlockHead(BlockLayout):
    """What a block drafter's header says (llama.cpp reads the same keys): block_size from dflash.block_size,
    dspark from a markov_w1 tensor, sample_from_anchor from dflash.sample_from_anchor."""

    causal: bool  # dflash.attention.causal: attention inside the block (non-causal unless it says so)
    confidence: bool  # DSpark's confidence head (conf_proj)
    mask_token: int | None  # tokenizer.ggml.mask_token_id
    target_layers: tuple[int, ...]  # dflash.target_layers: the target layers whose inputs it reads
    n_embd: int


def read_block_head(head_path: str | Path) -> BlockHead:
    header = read_header(head_path)
    meta = header.metadata
    names = {t.name for t in header.tensors}
    mask = meta.get("tokenizer.ggml.mask_token_id")
    return BlockHead(
        block_size=int(meta.get(f"{ARCH}.block_size", 16)),
        dspark="markov_w1.weight" in names,
        sample_from_anchor=bool(meta.get(f"{ARCH}.sample_from_anchor", True)),
        causal=bool(meta.get(f"{ARCH}.attention.causal", False)),
        confidence="conf_proj.weight" in names,
        mask_token=None if mask is None else int(mask),
        target_layers=tuple(int(i) for i in meta.get(f"{ARCH}.target_layers") or ()),
        n_embd=int(meta.get(f"{ARCH}.embedding_length") or 0),
    )


def check_head(method: str, head_path: str | Path, target_path: str | Path) -> BlockHead:
    """From the two headers alone: the file is a block drafter of this method, made for a target of this
    width, and the target's architecture can hand over its hidden states (llama.cpp aborts the process
    when it cannot). Raises ModelFileError, UsageError or UnsupportedModelError."""
    header = read_header(head_path)
    name = Path(head_path).name
    label = _LABEL[method]
    if header.architecture != ARCH:
        raise ModelFileError(
            f"{name} is a {header.architecture!r} model, not a {label} drafter (architecture 'dflash')",
            f"--draft-method {method} needs a {label} drafter GGUF; for a small draft model use --draft-method model",
        )
    head = read_block_head(head_path)
    if head.method != method:
        has = (
            "has a Markov head (markov_w1), so it is a DSpark"
            if head.dspark
            else "has no Markov head, so it is a DFlash"
        )
        raise UsageError(f"{name} {has} drafter", f"use --draft-method {head.method} with it")
    if head.mask_token is None:
        raise ModelFileError(
            f"{name} names no mask token (tokenizer.ggml.mask_token_id), which a {label} block is made of",
            "convert the drafter again with llama.cpp's convert_hf_to_gguf.py",
        )
    if head.block_size < 2 or not head.target_layers:
        raise ModelFileError(
            f"{name} has no usable {ARCH}.block_size / {ARCH}.target_layers metadata", "the file may be damaged"
        )
    target = read_header(target_path)
    t_meta, arch = target.metadata, target.architecture
    n_layer = int(t_meta.get(f"{arch}.block_count") or 0)
    llama_ext.check_capture_architecture(
        arch, model_name=Path(target_path).name, layer_ids=head.target_layers, n_layer=n_layer
    )
    have = t_meta.get(f"{arch}.embedding_length")
    if have is not None and head.n_embd and int(have) != head.n_embd:
        raise UnsupportedModelError(
            f"{name} was made for a target with hidden size {head.n_embd}, but {Path(target_path).name} has {have}",
            f"pick the {label} drafter trained for this target model",
        )
    return head


class BlockDrafter(LlamaHead, heads.BlockDrafter):
    """Drafts a block at a time with a DFlash or DSpark drafter on a llama.cpp target. Owns the drafter
    (model and context); borrows the target, whose layer capture it turns on."""

    layout: BlockHead

    def __init__(
        self, target: LlamaCppBackend, head_path: str | Path, *, method: str = "dflash", n_gpu_layers: int = -1
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"not a block draft method: {method!r}")
        llama_ext.require_family(method)
        self.layout = check_head(method, head_path, target.info.path)
        self.method = method
        what, hint = f"the {_LABEL[method]} drafter", "lower --n-ctx or -k, or use --draft-method model"
        super().__init__(target, f"{method}:{Path(head_path).stem}", what=what, hint=hint)
        self._n_draft = self.layout.n_draft_max
        with self._closed_on_error():
            model = self._load_model(Path(head_path), n_gpu_layers)
            self._capture(model)
            self._top_k = llama_ext.dflash_selector_top_k(model)  # > 0: DFlash2's selector lattice
            self.lattice = self._top_k > 0
            # As llama.cpp: DSpark's confidence and DFlash2's lattice come back as nextn rows (all rows for the lattice).
            n_ctx = target.n_ctx + self.layout.block_size  # a block past the target's last position fits
            n_embd = int(llama_cpp.llama_model_n_embd(model))
            ctx = self._open(model, n_ctx=n_ctx, n_nextn=n_embd, masked=self._top_k == 0)
            llama_cpp.llama_set_causal_attn(ctx.ptr, self.layout.causal)
            self._mask = int(llama_cpp.llama_vocab_mask(llama_cpp.llama_model_get_vocab(model)))

    # -- the drafter's passes ---------------------------------------------------------------------

    def _rows(self, context: Sequence[int], start: int, stop: int) -> PairAt:
        features = self.target.features(start, stop)  # [n, layers * E_target], a view: used at once
        return lambda p: (None, features[p - start])

    def _block(self, anchor: int, pos: int) -> tuple[np.ndarray, np.ndarray | None]:
        logits, nextn = self._decode_block(anchor, pos)
        return logits, (nextn[:, 0] if self.layout.dspark and self.layout.confidence else None)

    def _lattice(self, anchor: int, pos: int, k: int) -> tuple[int, heads.LatticeStep]:
        """Row i of the nextn rows: top_k candidate ids, then top_k x top_k scores, one row of successors per
        predecessor (the graph's own)."""
        _, lattice = self._decode_block(anchor, pos)
        top_k = self._top_k

        def step(i: int, pred: int, _token: int) -> tuple[np.ndarray, np.ndarray]:
            row = lattice[i]
            return row[:top_k], row[top_k + pred * top_k : top_k + (pred + 1) * top_k]

        return min(k + 1, len(lattice)), step

    def _decode_block(self, anchor: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Decode [anchor, mask x n] from `pos`; (logits [rows, V], nextn rows [rows, E]) copies. The
        block's K/V leave the cache again: it holds the target's features only."""
        ctx = self.ctx
        n_block = self.layout.block_tokens(self._n_draft)
        outputs = self._top_k == 0  # DFlash2 reads its lattice from the nextn rows, not logits
        try:
            ctx.run((anchor if i == 0 else self._mask, None, pos + i, outputs) for i in range(n_block))
            logits = ctx.logits_rows(n_block) if outputs else np.empty((0, ctx.n_vocab), np.float32)
            read_nextn = self._top_k > 0 or (self.layout.dspark and self.layout.confidence)
            nextn = ctx.nextn_rows(n_block) if read_nextn else np.empty((0, ctx.n_nextn), np.float32)
        finally:
            ctx.cut(pos)
        return logits, nextn
