"""DFlash and DSpark block drafting on MLX: one non-causal pass of a small Qwen3-style drafter, in its
published Hugging Face layout (`dflash_config`: block_size, mask_token_id, target_layer_ids), drafts a block
from an mlx-lm target's hidden states (captured by localspec/backends/mlx/capture.py).

As llama.cpp's dflash graph (and z-lab's DFlash) computes it:
- context: the target layers' outputs at each position P, side by side, become g = hidden_norm(fc(features));
  every drafter layer keeps only K = k_norm(k_proj(g)) (roped at P) and V = v_proj(g): the drafter's cache
  holds the context as the target saw it, positions 0..N-2 (LOOKAHEAD 0: the features at P read context[0..P]);
- a draft embeds the block [last token, mask x n] with the target's embedding at positions N-1.., runs the
  layers (input_layernorm, q/k norms, attention over the context and the whole block, MLP) and reads every
  block position's logits through the final norm and the target's lm_head (a reduced vocabulary: its own
  lm_head and d2t). The block's K/V leave the cache again.
- DFlash drafts from positions 1..n. DSpark adds a Markov head: position i's logits get w2 . w1[previous
  token] (the previous one the argmax of position i-1's biased logits, the anchor for the first), and reads
  positions 0..n-1 when it samples from the anchor (else 1..n); its confidence head, sigmoid(proj . [hidden;
  w1[previous]]), stops the draft below the caller's min_confidence, as llama.cpp's p_min.
The block holds as many masks as the longest draft of the generation (prepare's max_k, clamped to the trained
block size): block positions see each other, so its length changes its logits (llama.cpp sizes it alike).

Layer ids: `target_layer_ids` name layer *outputs* (z-lab's convention); the capture reads layer inputs, so it
reads ids + 1 (llama.cpp's converter writes them the same way). Scalars as z-lab's drafter applies them:
the target's embedding scale times input_embedding_scale, output_multiplier, final_logit_softcapping.
DFlash2 (architectures DFlash2DraftModel: conv_kernel_size, conv_group_size, selector_rank, selector_top_k) adds
a dynamic causal convolution around each layer's attention and MLP and walks a lattice of each position's top-k
candidates with a selector, greedily: a deterministic draft (q one-hot), as localspec runs it on llama.cpp.
Sliding-window layers are refused with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends import heads
from localspec.backends.base import BlockLayout
from localspec.backends.heads import VocabMap, is_block_config, is_dspark_config
from localspec.backends.mlx.backend import MLXBackend
from localspec.backends.mlx.head import MLXHead, load_head_weights, read_head_dir
from localspec.errors import ModelFileError, UnsupportedModelError, UsageError

METHODS = ("dflash", "dspark")
_LABEL = {"dflash": "DFlash", "dspark": "DSpark"}


@dataclass(frozen=True)
class BlockConfig(BlockLayout):
    """A DFlash-family drafter's config.json (block_size, dspark and sample_from_anchor in BlockLayout)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    draft_vocab_size: int
    mask_token_id: int | None
    target_layer_ids: tuple[int, ...]  # layer outputs (the capture reads ids + 1)
    causal: bool
    dflash2: bool
    sliding: bool = False  # sliding-window layers (not built here: refused)
    conv_kernel_size: int = 0  # DFlash2: dynamic causal convolutions around attention and MLP
    conv_group_size: int = 0
    selector_rank: int = 0  # DFlash2: the candidate selector's codebooks
    selector_top_k: int = 0
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None


def read_config(head_path: str | Path) -> BlockConfig:
    p = Path(head_path).expanduser() / "config.json"
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError):
        raise ModelFileError(
            f"{head_path}: no readable config.json", "pass the drafter's Hugging Face directory"
        ) from None
    if not isinstance(raw, dict) or not is_block_config(raw):
        raise ModelFileError(
            f"{head_path} is not a DFlash or DSpark drafter (its config has no dflash_config)",
            "--draft-method dflash/dspark needs such a drafter; for a small draft model use --draft-method model",
        )
    dc = raw.get("dflash_config") or {}
    try:
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        vocab = int(raw["vocab_size"])
        return BlockConfig(
            hidden_size=hidden, intermediate_size=int(raw["intermediate_size"]), num_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads, num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads), rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta", 10000.0)), vocab_size=vocab,
            draft_vocab_size=int(raw.get("draft_vocab_size") or vocab),
            block_size=int(dc.get("block_size") or raw.get("block_size") or 16),
            mask_token_id=None if dc.get("mask_token_id") is None else int(dc["mask_token_id"]),
            target_layer_ids=tuple(int(i) for i in dc.get("target_layer_ids") or raw.get("target_layer_ids") or ()),
            causal=bool(raw.get("is_causal") or dc.get("causal") or False),
            dspark=is_dspark_config(raw),
            sample_from_anchor=bool(dc.get("sample_from_anchor", raw.get("sample_from_anchor", True))),
            dflash2="conv_kernel_size" in dc,
            sliding="sliding_attention" in (raw.get("layer_types") or []) or bool(dc.get("use_swa")),
            conv_kernel_size=int(dc.get("conv_kernel_size") or 0), conv_group_size=int(dc.get("conv_group_size") or 0),
            selector_rank=int(dc.get("selector_rank") or 0), selector_top_k=int(dc.get("selector_top_k") or 0),
            input_embedding_scale=float(dc.get("input_embedding_scale") or raw.get("input_embedding_scale") or 1.0),
            output_multiplier=float(dc.get("output_multiplier") or raw.get("output_multiplier") or 1.0),
            final_logit_softcapping=dc.get("final_logit_softcapping") or raw.get("final_logit_softcapping"),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{head_path}: not a usable DFlash config ({e})", "download the drafter again") from None


def check_head(
    method: str, head_path: str | Path, target_hidden: int | None = None, target_layers: int | None = None
) -> BlockConfig:
    """From config.json alone: a block drafter of this method, for a target of this width and depth."""
    cfg = read_config(head_path)
    name = Path(head_path).name
    label = _LABEL[method]
    if cfg.method != method:
        has = "has a Markov head, so it is a DSpark" if cfg.dspark else "has no Markov head, so it is a DFlash"
        raise UsageError(f"{name} {has} drafter", f"use --draft-method {cfg.method} with it")
    if cfg.dflash2 and (cfg.selector_top_k <= 0 or cfg.conv_group_size <= 0 or cfg.hidden_size % cfg.conv_group_size):
        raise ModelFileError(f"{name} is a DFlash2 drafter with unusable conv/selector settings", "download it again")
    if cfg.sliding:
        raise UnsupportedModelError(
            f"{name} has sliding-window attention layers, which localspec's MLX {label} drafter does not build",
            "convert it to GGUF and use --backend llama, or pick a drafter with full attention",
        )
    if cfg.mask_token_id is None:
        raise ModelFileError(f"{name} names no mask token (dflash_config.mask_token_id), which a {label} block is made of",
                             "download the drafter again")  # fmt: skip
    if cfg.block_size < 2 or not cfg.target_layer_ids:
        raise ModelFileError(f"{name} has no usable block_size / target_layer_ids", "the config may be damaged")
    if target_hidden is not None and cfg.hidden_size != target_hidden:
        raise UnsupportedModelError(
            f"{name} was made for a target with hidden size {cfg.hidden_size}, but the target has {target_hidden}",
            f"pick the {label} drafter trained for this target model",
        )
    if target_layers is not None and max(cfg.target_layer_ids) >= target_layers:
        raise UnsupportedModelError(
            f"{name} reads target layer {max(cfg.target_layer_ids)}, but the target has {target_layers} layers",
            f"pick the {label} drafter trained for this target model",
        )
    return cfg


def _build(cfg: BlockConfig, weights: Mapping[str, Any]) -> Any:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import qwen3

    args = qwen3.ModelArgs(
        model_type="qwen3", hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_attention_heads,
        rms_norm_eps=cfg.rms_norm_eps, vocab_size=cfg.vocab_size, num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=1 << 20, rope_theta=cfg.rope_theta, head_dim=cfg.head_dim, tie_word_embeddings=False,
    )  # fmt: skip

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
            self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.layers = [qwen3.TransformerBlock(args) for _ in range(cfg.num_layers)]
            self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            if "lm_head.weight" in weights:
                self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            if cfg.dspark:
                rank = weights["markov_head.markov_w1.weight"].shape[-1]
                self.markov_head = _Markov(
                    cfg.vocab_size, cfg.draft_vocab_size, rank, "confidence_head.proj.weight" in weights
                )
            if cfg.dflash2:
                for layer in self.layers:
                    layer.attention_conv = _DynamicConv()
                    layer.mlp_conv = _DynamicConv()
                self.candidate_selector = _Selector()

        def write_context(self, features: Any, caches: list[Any]) -> None:
            """K/V of each layer for context rows [n, F] (at the caches' offsets)."""
            g = self.hidden_norm(self.fc(features))[None]  # [1, n, E]
            n = g.shape[1]
            for layer, cache in zip(self.layers, caches):
                a = layer.self_attn
                k = a.k_norm(a.k_proj(g).reshape(1, n, a.n_kv_heads, -1)).transpose(0, 2, 1, 3)
                v = a.v_proj(g).reshape(1, n, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
                cache.update_and_fetch(a.rope(k, offset=cache.offset), v)

        def block(self, embeds: Any, caches: list[Any]) -> Any:
            """The final normed hidden rows [1, n, E] of the block (its K/V appended to the caches)."""
            h = embeds
            mask = "causal" if cfg.causal and h.shape[1] > 1 else None  # non-causal: every row sees the block
            for layer, cache in zip(self.layers, caches):
                if not cfg.dflash2:
                    h = h + layer.self_attn(layer.input_layernorm(h), mask, cache)
                    h = h + layer.mlp(layer.post_attention_layernorm(h))
                    continue
                x, kernel = layer.attention_conv.prepare(layer.input_layernorm(h))
                h = h + layer.attention_conv.finish(layer.self_attn(x, mask, cache), kernel)
                x, kernel = layer.mlp_conv.prepare(layer.post_attention_layernorm(h))
                h = h + layer.mlp_conv.finish(layer.mlp(x), kernel)
            return self.norm(h)

    def convolve(hidden: Any, dynamic: Any, base: Any) -> Any:
        """DFlash2's grouped causal convolution along the block: each position mixes the kernel's previous ones."""
        batch, length, width = hidden.shape
        groups = width // cfg.conv_group_size
        blocks = hidden.reshape(batch, length, groups, cfg.conv_group_size)
        dynamic = dynamic.reshape(batch, length, base.shape[0], groups, 1)
        out = mx.zeros_like(blocks)
        for offset in range(base.shape[0]):
            values = (
                blocks
                if offset == 0
                else mx.concatenate((mx.zeros_like(blocks[:, :offset]), blocks[:, :-offset]), axis=1)
            )
            out = out + base[offset].reshape(1, 1, groups, cfg.conv_group_size).astype(hidden.dtype) * values
            out = out + dynamic[:, :, offset] * values
        return out.reshape(hidden.shape)

    class _DynamicConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            groups = cfg.hidden_size // max(cfg.conv_group_size, 1)
            self.base_kernel = mx.zeros((2, cfg.conv_kernel_size, cfg.hidden_size))
            self.kernel_projection = nn.Linear(cfg.hidden_size, 2 * cfg.conv_kernel_size * groups, bias=False)

        def prepare(self, hidden: Any) -> tuple[Any, Any]:
            groups = hidden.shape[-1] // cfg.conv_group_size
            dynamic = self.kernel_projection(hidden).reshape(*hidden.shape[:-1], 2, cfg.conv_kernel_size, groups)
            return convolve(hidden, dynamic[..., 0, :, :], self.base_kernel[0]), dynamic[..., 1, :, :]

        def finish(self, hidden: Any, dynamic: Any) -> Any:
            return convolve(hidden, dynamic, self.base_kernel[1])

    class _Selector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.predecessor_codebook = nn.Embedding(cfg.vocab_size, cfg.selector_rank)
            self.successor_codebook = nn.Embedding(cfg.vocab_size, cfg.selector_rank)
            self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)

    class _Markov(nn.Module):
        def __init__(self, vocab: int, draft_vocab: int, rank: int, confidence: bool) -> None:
            super().__init__()
            self.markov_w1 = nn.Embedding(vocab, rank)
            self.markov_w2 = nn.Linear(rank, draft_vocab, bias=False)
            if confidence:
                self.proj = nn.Linear(cfg.hidden_size + rank, 1, bias=True)

    return Block()


class BlockDrafter(MLXHead, heads.BlockDrafter):
    """Drafts a block at a time with a DFlash or DSpark drafter on an MLX target (borrowed)."""

    layout: BlockConfig

    def __init__(self, target: MLXBackend, head_path: str | Path, *, method: str = "dflash") -> None:
        from mlx_lm.models.cache import KVCache

        if method not in METHODS:
            raise ValueError(f"not a block draft method: {method!r}")
        n_layers = len(target.model.layers)
        cfg = check_head(method, head_path, target.hidden_size, n_layers)
        _, weights = read_head_dir(head_path, f"a {_LABEL[method]} drafter")
        named = {k: v for k, v in weights.items() if k not in ("d2t", "t2d")}
        named = {("markov_head.proj." + k.split("confidence_head.proj.", 1)[1] if k.startswith("confidence_head.proj.") else k): v
                 for k, v in named.items()}  # fmt: skip
        named = {
            (k + ".weight" if k.endswith("_codebook") else k): v for k, v in named.items()
        }  # DFlash2's published names
        head = _build(cfg, weights)
        load_head_weights(
            head, named, f"{head_path}: its weights (as a {_LABEL[method]} drafter's)", "download the drafter again"
        )
        self.method = method
        self.layout = cfg
        self.lattice = cfg.dflash2
        self._head = head
        self._dtype = head.fc.weight.dtype
        self._caches = [KVCache() for _ in range(cfg.num_layers)]
        self._n_draft = cfg.n_draft_max
        self._vocab = VocabMap.from_offsets(weights.get("d2t"), target.n_vocab)
        # A target that scales its embeddings (Gemma) scales the block's too, as z-lab's drafter reads it.
        embed = target.embed_tokens
        self._embed_scale = float(getattr(embed, "embed_scale", getattr(target.text_model.model, "embed_scale", 1.0)))
        super().__init__(target, f"{method}:{Path(head_path).name}", [i + 1 for i in cfg.target_layer_ids])

    # -- the drafter's passes ---------------------------------------------------------------------

    def _write(self, context: Sequence[int], start: int, stop: int, *, output: bool) -> None:
        import mlx.core as mx

        self._head.write_context(self.target.features(start, stop).astype(self._dtype), self._caches)
        mx.eval([c.state for c in self._caches])

    def _block(self, anchor: int, pos: int) -> tuple[np.ndarray, np.ndarray | None]:
        """DSpark's Markov bias is in the logits; its confidence comes from its confidence head."""
        import mlx.core as mx

        raw, hidden = self._raw_block(anchor)
        rows = np.asarray(raw)
        if not self.layout.dspark:
            return np.stack([self._vocab(r) for r in rows]), None
        return self._markov(rows, np.asarray(hidden[0].astype(mx.float32)), anchor)

    def _lattice(self, anchor: int, pos: int, k: int) -> tuple[int, heads.LatticeStep]:
        """DFlash2: at each block position after the anchor, the top-k candidates by their logit, scored by that
        logit plus the selector's edge from the token before (predecessor codebook . projected hidden . successor
        codebook)."""
        import mlx.core as mx

        raw, hidden = self._raw_block(anchor)
        sel = self._head.candidate_selector
        top = self.layout.selector_top_k
        projected = np.asarray(sel.hidden_projection(hidden[0]).astype(mx.float32))
        logits = np.asarray(raw)
        n = min(k + 1, len(logits))
        candidates = np.argpartition(logits[1:n], -top, axis=-1)[:, -top:]  # [positions, top]
        # Only the codebook rows a walk can touch: the anchor's and the candidates' (not the vocabulary's).
        ids = np.unique(np.concatenate([[anchor], candidates.ravel()]))
        rows = mx.array(ids.astype(np.int32))
        pred = dict(zip(ids.tolist(), np.asarray(sel.predecessor_codebook(rows).astype(mx.float32))))
        succ = dict(zip(ids.tolist(), np.asarray(sel.successor_codebook(rows).astype(mx.float32))))

        def step(i: int, _index: int, previous: int) -> tuple[np.ndarray, np.ndarray]:
            cands = candidates[i - 1]
            book = np.stack([succ[int(c)] for c in cands])
            return cands, logits[i][cands] + (pred[previous] * projected[i] * book).sum(axis=-1)

        return n, step

    def _raw_block(self, anchor: int) -> tuple[Any, Any]:
        """(The block's raw logits [rows, V or the draft vocabulary], its final hidden rows [1, rows, E]); the
        block's K/V leave the caches again."""
        import mlx.core as mx

        cfg = self.layout
        n_block = cfg.block_tokens(self._n_draft)
        base = self._caches[0].offset
        tokens = mx.array([anchor] + [cfg.mask_token_id] * (n_block - 1), dtype=mx.uint32)[None]
        try:
            embeds = self.target.embed_tokens(tokens) * (self._embed_scale * cfg.input_embedding_scale)
            hidden = self._head.block(embeds.astype(self._dtype), self._caches)
            head = getattr(self._head, "lm_head", None)
            raw = (head(hidden) if head is not None else self.target.lm_head(hidden))[0].astype(mx.float32)
            raw = raw * cfg.output_multiplier
            if cfg.final_logit_softcapping:
                cap = float(cfg.final_logit_softcapping)
                raw = mx.tanh(raw / cap) * cap
            mx.eval(raw, hidden)
        finally:
            self._cut(base)
        return raw, hidden

    def _markov(self, rows: np.ndarray, hidden: np.ndarray, anchor: int) -> tuple[np.ndarray, np.ndarray | None]:
        """DSpark: each drafted row biased by w2 . w1[previous], the previous being the argmax of the row before."""
        import mlx.core as mx

        m = self._head.markov_head
        proj = getattr(m, "proj", None)
        out = np.stack([self._vocab(r) for r in rows])
        conf = np.zeros(len(rows), np.float32) if proj is not None else None
        prev = anchor
        for i in range(0 if self.layout.sample_from_anchor else 1, len(rows)):
            embedded = m.markov_w1(mx.array([prev], dtype=mx.int32))  # [1, R]: one row, not the table
            bias = m.markov_w2(embedded)[0].astype(mx.float32)
            if proj is not None:
                feature = mx.concatenate([mx.array(hidden[i])[None], embedded.astype(mx.float32)], axis=-1)
                score = proj(feature.astype(proj.weight.dtype))[0, 0].astype(mx.float32)
                mx.eval(bias, score)
                conf[i] = 1.0 / (1.0 + np.exp(-float(score.item())))  # type: ignore[index]
            biased = self._vocab(rows[i] + np.asarray(bias))
            out[i] = biased
            prev = int(np.argmax(biased))
        return out, conf
