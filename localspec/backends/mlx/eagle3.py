"""EAGLE-3 drafting on MLX: a one-layer head, in its published Hugging Face layout, that reads three of an
mlx-lm target's layers (captured by localspec/backends/mlx/capture.py).

The head is built from mlx-lm's own llama classes (Attention, MLP, RMSNorm), its attention widened to the
concatenation it reads. Per position, as llama.cpp's eagle3 graph (and vLLM's) computes it:

    g      = fc(features)                                # the three target layers' inputs, side by side
    x      = [input_layernorm(embed(token)), hidden_norm(g)]
    h      = attention(x) + (hidden_norm(g) if norm_before_residual else g)
    out    = mlp(post_attention_layernorm(h)) + h        # the head's state (fed back as g when drafting)
    logits = lm_head(norm(out))                          # over the draft vocabulary; d2t maps it to the target's

Pairs (localspec/backends/heads.py): pair P is (token P+1, g at P), so the head's cache holds positions 0..N-2 of a context
of N tokens and drafting goes on from position N-1 with the head's own state.

Layouts: the original (`midlayer.*`, config `draft_vocab_size`) and the "speculators" one (`layers.0.*`,
config `transformer_layer_config`, `eagle_aux_hidden_state_layer_ids`, `norm_before_residual`;
`norm_before_fc`: an RMSNorm over the features before fc). Heads of more than one layer are refused. `d2t` holds
offsets (target id = draft id + d2t[draft id]). A head without its own `embed_tokens` uses the target's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends.heads import VocabMap, is_eagle3_config
from localspec.backends.mlx.backend import MLXBackend
from localspec.backends.mlx.head import StepDrafter, load_head_weights, read_head_dir
from localspec.errors import ModelFileError, UnsupportedModelError

WHAT = "an EAGLE-3 head"
_LAYER_PREFIXES = ("midlayer.", "layers.0.")


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Mapping[str, Any] | None
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    layer_ids: tuple[int, ...] | None  # None: llama.cpp's and vLLM's default (2, n/2, n-3)
    norm_before_residual: bool
    max_position_embeddings: int
    norm_before_fc: bool = False  # an RMSNorm over the concatenated features before fc (EAGLE-3.1 heads)
    num_layers: int = 1

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Eagle3Config:
        """The original flat llama config, or the speculators one (a `transformer_layer_config` inside)."""
        layer = dict(raw.get("transformer_layer_config") or raw)
        try:
            hidden = int(layer["hidden_size"])
            heads = int(layer["num_attention_heads"])
            vocab = int(layer.get("vocab_size") or raw["vocab_size"])
            ids = raw.get("eagle_aux_hidden_state_layer_ids") or raw.get("target_layer_ids")
            return cls(
                hidden_size=hidden,
                intermediate_size=int(layer["intermediate_size"]),
                num_attention_heads=heads,
                num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
                head_dim=int(layer["head_dim"]) if layer.get("head_dim") else None,
                rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
                rope_theta=float(layer.get("rope_theta", 10000.0)),
                rope_scaling=layer.get("rope_scaling"),
                vocab_size=vocab,
                draft_vocab_size=int(raw.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab),
                target_hidden_size=int(raw.get("target_hidden_size") or layer.get("target_hidden_size") or hidden),
                layer_ids=tuple(int(i) for i in ids) if ids else None,
                norm_before_residual=bool(raw.get("norm_before_residual", False)),
                max_position_embeddings=int(layer.get("max_position_embeddings") or 4096),
                norm_before_fc=bool(raw.get("norm_before_fc", False)),
                num_layers=int(layer.get("num_hidden_layers") or 1),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFileError(f"not an EAGLE-3 head config: {e}", "pass the head's Hugging Face directory") from None

    def target_layers(self, n_layers: int) -> tuple[int, ...]:
        return self.layer_ids if self.layer_ids else (2, n_layers // 2, n_layers - 3)


def check_head(head_path: str | Path, target_hidden: int | None, target_vocab: int | None) -> Eagle3Config:
    """From config.json alone: an EAGLE-3 head made for a target of this hidden size and vocabulary."""
    import json

    p = Path(head_path).expanduser() / "config.json"
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError):
        raise ModelFileError(
            f"{head_path}: no readable config.json", "pass the head's Hugging Face directory"
        ) from None
    if not is_eagle3_config(raw):
        raise ModelFileError(
            f"{head_path} is not an EAGLE-3 head (its config names {raw.get('architectures') or 'no architecture'})",
            "--draft-method eagle3 needs an EAGLE-3 head; for a small draft model use --draft-method model",
        )
    cfg = Eagle3Config.from_dict(raw)
    name = Path(head_path).name
    if cfg.num_layers != 1:
        raise UnsupportedModelError(
            f"{name} has {cfg.num_layers} decoder layers; localspec's MLX EAGLE-3 head builds the usual one",
            "use a one-layer EAGLE-3 head, or convert it to GGUF for --backend llama",
        )
    if target_hidden is not None and cfg.target_hidden_size != target_hidden:
        raise UnsupportedModelError(
            f"{name} was made for a target with hidden size {cfg.target_hidden_size}, but the target has {target_hidden}",
            "pick the EAGLE-3 head trained for this target model",
        )
    if target_vocab is not None and cfg.vocab_size > target_vocab:
        raise UnsupportedModelError(
            f"{name} drafts over {cfg.vocab_size} token ids, the target has {target_vocab}",
            "pick the EAGLE-3 head trained for this target model",
        )
    return cfg


def _build_head(cfg: Eagle3Config, has_embed: bool) -> Any:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import llama
    from mlx_lm.models.base import create_attention_mask

    args = llama.ModelArgs(
        model_type="llama", hidden_size=cfg.hidden_size, num_hidden_layers=1,
        intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_attention_heads,
        rms_norm_eps=cfg.rms_norm_eps, vocab_size=cfg.draft_vocab_size, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings, num_key_value_heads=cfg.num_key_value_heads,
        rope_theta=cfg.rope_theta, rope_scaling=dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        tie_word_embeddings=False,
    )  # fmt: skip

    class Eagle3Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            e = cfg.hidden_size
            self.fc = nn.Linear(3 * cfg.target_hidden_size, e, bias=False)
            if cfg.norm_before_fc:
                self.input_norm = nn.RMSNorm(3 * cfg.target_hidden_size, eps=cfg.rms_norm_eps)
            attn = llama.Attention(args)
            head_dim = attn.head_dim
            attn.q_proj = nn.Linear(2 * e, cfg.num_attention_heads * head_dim, bias=False)
            attn.k_proj = nn.Linear(2 * e, cfg.num_key_value_heads * head_dim, bias=False)
            attn.v_proj = nn.Linear(2 * e, cfg.num_key_value_heads * head_dim, bias=False)
            self.self_attn = attn
            self.mlp = llama.MLP(args)
            self.input_layernorm = nn.RMSNorm(e, eps=cfg.rms_norm_eps)
            self.hidden_norm = nn.RMSNorm(e, eps=cfg.rms_norm_eps)
            self.post_attention_layernorm = nn.RMSNorm(e, eps=cfg.rms_norm_eps)
            self.norm = nn.RMSNorm(e, eps=cfg.rms_norm_eps)
            self.lm_head = nn.Linear(e, cfg.draft_vocab_size, bias=False)
            if has_embed:
                self.embed_tokens = nn.Embedding(cfg.vocab_size, e)

        def __call__(self, embeds: Any, g: Any, cache: Any) -> tuple[Any, Any]:
            """embeds, g: [1, n, E]; (logits [1, n, Vd], the head's state [1, n, E])."""
            gn = self.hidden_norm(g)
            x = mx.concatenate([self.input_layernorm(embeds), gn], axis=-1)
            h = self.self_attn(x, create_attention_mask(x, cache), cache) + (gn if cfg.norm_before_residual else g)
            out = self.mlp(self.post_attention_layernorm(h)) + h
            return self.lm_head(self.norm(out)), out

    return Eagle3Head()


def _head_weights(weights: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """The module's weights by its own names, and d2t (None without one)."""
    out: dict[str, Any] = {}
    d2t = None
    for name, w in weights.items():
        if name == "d2t":
            d2t = w
            continue
        if name == "t2d" or "rotary_emb.inv_freq" in name:
            continue  # the target-to-draft mask and cached RoPE tables: unused here
        for prefix in _LAYER_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        out[name] = w
    return out, d2t


class Eagle3Drafter(StepDrafter):
    """Drafts with an EAGLE-3 head on an MLX target. Borrows the target, whose layer capture it turns on."""

    method = "eagle3"
    LOOKAHEAD = 1  # pair P is (ctx[P+1], g[P]): the cache holds positions 0..len-2

    def __init__(self, target: MLXBackend, head_path: str | Path) -> None:
        from mlx_lm.models.cache import KVCache

        cfg = check_head(head_path, target.hidden_size, target.n_vocab)
        config, weights = read_head_dir(head_path, WHAT)
        named, d2t = _head_weights(weights)
        head = _build_head(cfg, has_embed="embed_tokens.weight" in named)
        load_head_weights(head, named, f"{head_path}: its weights (as an EAGLE-3 head's)", "download the head again")
        self._dtype = head.fc.weight.dtype  # the head computes in its own weights' dtype
        self._cfg = cfg
        self._head = head
        self._caches = [KVCache()]
        self._embed = head.embed_tokens if "embed_tokens.weight" in named else target.embed_tokens
        n_layers = len(target.model.layers)
        self._vocab = VocabMap.from_offsets(d2t, target.n_vocab)
        super().__init__(target, f"eagle3:{Path(head_path).name}", cfg.target_layers(n_layers))

    def _n_pairs(self, context: Sequence[int]) -> int:
        return max(0, min(len(context) - 1, self._held(context)))

    def _write(self, context: Sequence[int], start: int, stop: int, *, output: bool) -> tuple[np.ndarray, Any]:
        features = self.target.features(start, stop).astype(self._dtype)
        if self._cfg.norm_before_fc:
            features = self._head.input_norm(features)
        g = self._head.fc(features)[None]
        return self._forward(list(context[start + 1 : stop + 1]), g)

    def _forward(self, tokens: list[int], g: Any) -> tuple[np.ndarray, Any]:
        import mlx.core as mx

        embeds = self._embed(mx.array(tokens, dtype=mx.uint32)[None]).astype(self._dtype)
        logits, state = self._head(embeds, g, self._caches[0])
        last = logits[0, -1].astype(mx.float32)
        state = state[:, -1:]
        mx.eval(last, state)
        return self._vocab(np.asarray(last)), state
