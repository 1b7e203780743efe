"""MTP on MLX for the DeepSeek-V3 / GLM-4.5 "nextn" layout: the checkpoint keeps its multi-token-prediction
layer as one more decoder layer, `model.layers.{num_hidden_layers}.*`, with `eh_proj`, `enorm`, `hnorm` and
`shared_head.norm` (and maybe `shared_head.head`) beside the usual attention and MoE weights; mlx-lm drops it
when it loads (its sanitize), so it is read from the checkpoint's safetensors, as backends/mlx_mtp.py does for
Qwen3.5's `mtp.*`. Per position, as DeepSeek-V3 defines it (llama.cpp's nextn graph alike):

    x      = eh_proj([enorm(embed(token)), hnorm(h)])     # embedding first
    out    = decoder_layer(x)                             # the target's own layer class, its own KV cache
    logits = lm_head(shared_head.norm(out))               # shared_head.head if the checkpoint has one

h is the target's last hidden state *before* its final norm (pre-norm, unlike Qwen3.5's), and drafting goes
on with the layer's own `out` (pre-norm) in h's place. Pairs as in mlx_head.py: pair P is (token P+1, h at P).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends.mlx import MLXBackend
from localspec.backends.mlx_capture import original_class
from localspec.backends.mlx_head import MLXHeadDrafter
from localspec.backends.mlx_mtp import MTP_HINT, safetensors_headers
from localspec.errors import ModelFileError

ARCHITECTURES = ("glm4_moe", "deepseek_v3")
_DECODER_PARTS = ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.")


def check_target(model_dir: str | Path, config: dict[str, Any]) -> int:
    """From config.json and the headers: 1 when the checkpoint keeps its nextn layer (one is built here);
    ModelFileError when it declares none or its files lack the weights."""
    name = Path(model_dir).name
    declared = int(config.get("num_nextn_predict_layers") or 0)
    prefix = f"model.layers.{int(config['num_hidden_layers'])}."
    present = any(k.startswith(prefix + "eh_proj") for k in safetensors_headers(Path(model_dir)))
    if not declared or not present:
        what = "declares no nextn (MTP) layer" if not declared else f"declares a nextn layer but holds no {prefix}eh_proj"
        raise ModelFileError(f"{name} {what} (mlx-lm's conversion drops it)", MTP_HINT)
    return 1


def _read(model_dir: Path, n_layers: int) -> dict[str, Any]:
    import mlx.core as mx

    prefix = f"model.layers.{n_layers}."
    headers = safetensors_headers(model_dir)
    files = sorted({f for k, (f, _) in headers.items() if k.startswith(prefix)})
    out: dict[str, Any] = {}
    for f in files:
        out |= {k[len(prefix) :]: v for k, v in mx.load(str(f)).items() if k.startswith(prefix)}
    return out


def _build(target: MLXBackend, weights: dict[str, Any]) -> Any:
    import mlx.core as mx
    import mlx.nn as nn

    inner = target.text_model
    args = inner.args
    n = len(inner.model.layers)
    layer_class = original_class(inner.model.layers[-1])
    e = args.hidden_size
    own_head = "shared_head.head.weight" in weights

    class SharedHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.RMSNorm(e, eps=args.rms_norm_eps)
            if own_head:
                self.head = nn.Linear(e, args.vocab_size, bias=False)

    class NextnHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enorm = nn.RMSNorm(e, eps=args.rms_norm_eps)
            self.hnorm = nn.RMSNorm(e, eps=args.rms_norm_eps)
            self.eh_proj = nn.Linear(2 * e, e, bias=False)
            self.decoder = layer_class(args, n)
            self.shared_head = SharedHead()

        def __call__(self, embeds: Any, h: Any, cache: Any) -> Any:
            from mlx_lm.models.base import create_attention_mask

            x = self.eh_proj(mx.concatenate([self.enorm(embeds), self.hnorm(h)], axis=-1))
            return self.decoder(x, create_attention_mask(x, cache), cache)

    # The decoder layer's own conversions (experts stacked) as the target's sanitize does them, on the last
    # main layer's prefix (a MoE layer like this one), then back to the module's names.
    decoder = {f"model.layers.{n - 1}.{k}": v for k, v in weights.items() if k.startswith(_DECODER_PARTS)}
    if hasattr(inner, "sanitize"):
        decoder = inner.sanitize(decoder)
    named = {f"decoder.{k[len(f'model.layers.{n - 1}.'):]}": v for k, v in decoder.items()}
    named |= {k: v for k, v in weights.items() if k.startswith(("eh_proj.", "enorm.", "hnorm.", "shared_head."))}
    head = NextnHead()
    try:
        head.load_weights(list(named.items()), strict=True)
    except ValueError as err:
        raise ModelFileError(f"{target.info.name}: its nextn layer's weights do not fit: {err}", MTP_HINT) from None
    mx.eval(head.parameters())
    return head


class NextnDrafter(MLXHeadDrafter):
    """Drafts with a DeepSeek-V3 / GLM-4.5 target's own nextn layer on MLX (the target borrowed)."""

    method = "mtp"
    LOOKAHEAD = 1

    def __init__(self, target: MLXBackend) -> None:
        from mlx_lm.models.cache import KVCache

        n_layers = len(target.model.layers)
        check_target(target.model_path, target.config)
        self._head = _build(target, _read(Path(target.model_path), n_layers))
        self._cache = KVCache()
        self._dtype = self._head.eh_proj.weight.dtype
        super().__init__(target, f"mtp:{target.info.name}", [n_layers])  # the last layer's output: pre-norm

    def _n_pairs(self, context: Sequence[int]) -> int:
        return max(0, min(len(context) - 1, self._held(context)))

    def _run(self, context: Sequence[int], start: int, stop: int) -> tuple[np.ndarray, Any]:
        return self._forward(list(context[start + 1 : stop + 1]), self.target.features(start, stop)[None])

    def _step(self, token: int, state: Any, position: int) -> tuple[np.ndarray, Any]:
        return self._forward([token], state)

    def _forward(self, tokens: list[int], h: Any) -> tuple[np.ndarray, Any]:
        import mlx.core as mx

        embeds = self.target.embed_tokens(mx.array(tokens, dtype=mx.uint32)[None]).astype(self._dtype)
        out = self._head(embeds, h.astype(self._dtype), self._cache)
        state = out[:, -1:]
        shared = self._head.shared_head
        normed = shared.norm(state)
        logits = (shared.head(normed) if hasattr(shared, "head") else self.target.lm_head(normed))[0, -1]
        logits = logits.astype(mx.float32)
        mx.eval(logits, state)
        return np.asarray(logits), state

    def _cut(self, n: int) -> None:
        if self._cache.offset > n:
            self._cache.trim(self._cache.offset - n)


def drafter(target: MLXBackend) -> NextnDrafter:
    """The MTP drafter for this layout (localspec.families.mtp picks the module by architecture)."""
    return NextnDrafter(target)
