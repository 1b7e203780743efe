"""MTP on MLX for the layouts that keep the multi-token-prediction layer as one more decoder layer beside two
input norms and a projection; mlx-lm drops it when it loads (its sanitize), so it is read from the checkpoint's
safetensors, as localspec/backends/mlx/mtp.py does for Qwen3.5's `mtp.*`. Per position:

    DeepSeek-V3 / GLM-4.5 "nextn" (`model.layers.{num_hidden_layers}.*`), as llama.cpp's nextn graph runs it:
        x = eh_proj([enorm(embed(token)), hnorm(h)])   # embedding first; h after the target's final norm
        out = shared_head.norm(decoder_layer(x)); logits = lm_head(out)  # shared_head.head if it has one
        drafting goes on with `out` (normed) in h's place
      and pairs as llama.cpp's: pair P is (token P, h at P - 1) at position P, h at -1 being zeros. (vLLM and
      the training code leave that first pair out; it shifts every logit a little, and with it localspec's
      drafts on MLX equal llama.cpp's round by round: tests/test_mlx_nextn.py, on the same converted GGUF.)
    MiMo (`model.mtp_layers.0.*`, its Hugging Face modeling):
        x = input_proj([hidden_layernorm(h), token_layernorm(embed(token))])  # hidden first; h after the norm
        out = final_layernorm(decoder_layer(x)); logits = lm_head(out); drafting goes on with `out`

The decoder layer is the target's own class (attention, MLP or MoE as the target has them). MiMo's pairs are
mlx/head.py's: pair P is (token P+1, h at P).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends.mlx.backend import MLXBackend
from localspec.backends.mlx.capture import original_class
from localspec.backends.mlx.head import MLXHeadDrafter, load_head_weights
from localspec.backends.mlx.mtp import MTP_HINT, safetensors_headers
from localspec.errors import ModelFileError

_DECODER_PARTS = ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.")


@dataclass(frozen=True)
class Layout:
    prefix: str  # where the layer's tensors live; {n}: the target's number of layers
    embed_norm: str
    hidden_norm: str
    proj: str
    hidden_first: bool  # the projection reads [hidden, embedding] (MiMo), else [embedding, hidden]
    post_norm: bool  # h is the target's hidden state after its final norm; the layer's output is normed too
    out_norm: str  # the norm before the logits ("shared_head.norm" or "final_layernorm")

    def at(self, n_layers: int) -> str:
        return self.prefix.format(n=n_layers)


NEXTN = Layout(
    "model.layers.{n}.", "enorm", "hnorm", "eh_proj", hidden_first=False, post_norm=True, out_norm="shared_head.norm"
)
MIMO = Layout("model.mtp_layers.0.", "token_layernorm", "hidden_layernorm", "input_proj", hidden_first=True,
              post_norm=True, out_norm="final_layernorm")  # fmt: skip
LAYOUTS = {"glm4_moe": NEXTN, "deepseek_v3": NEXTN, "mimo": MIMO}
ARCHITECTURES = tuple(LAYOUTS)


def _layout(config: dict[str, Any]) -> Layout:
    return LAYOUTS[str(config.get("model_type"))]


def check_target(model_dir: str | Path, config: dict[str, Any]) -> int:
    """From config.json and the headers: 1 when the checkpoint keeps its MTP layer (one is built here);
    ModelFileError when it declares none or its files lack the weights."""
    name = Path(model_dir).name
    layout = _layout(config)
    declared = int(config.get("num_nextn_predict_layers") or 0)
    want = layout.at(int(config["num_hidden_layers"])) + layout.proj
    present = any(k.startswith(want) for k in safetensors_headers(Path(model_dir)))
    if not declared or not present:
        what = "declares no MTP (nextn) layer" if not declared else f"declares an MTP layer but holds no {want}"
        raise ModelFileError(f"{name} {what} (mlx-lm's conversion drops it)", MTP_HINT)
    return 1


def _read(model_dir: Path, prefix: str) -> dict[str, Any]:
    import mlx.core as mx

    headers = safetensors_headers(model_dir)
    files = sorted({f for k, (f, _) in headers.items() if k.startswith(prefix)})
    out: dict[str, Any] = {}
    for f in files:
        out |= {k[len(prefix) :]: v for k, v in mx.load(str(f)).items() if k.startswith(prefix)}
    return out


def _build(target: MLXBackend, layout: Layout, weights: dict[str, Any]) -> Any:
    import mlx.core as mx
    import mlx.nn as nn

    inner = target.text_model
    args = inner.args
    n = len(inner.model.layers)
    layer_class = original_class(inner.model.layers[-1])
    e = args.hidden_size
    eps = args.rms_norm_eps

    class NextnHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_norm = nn.RMSNorm(e, eps=eps)
            self.hidden_norm = nn.RMSNorm(e, eps=eps)
            self.proj = nn.Linear(2 * e, e, bias=False)
            self.decoder = (
                layer_class(args, n) if "layer_idx" in layer_class.__init__.__code__.co_varnames else layer_class(args)
            )
            self.out_norm = nn.RMSNorm(e, eps=eps)
            if "shared_head.head.weight" in weights:
                self.head = nn.Linear(e, args.vocab_size, bias=False)

        def __call__(self, embeds: Any, h: Any, cache: Any) -> Any:
            """(the state drafting goes on with, the row the logits read)."""
            from mlx_lm.models.base import create_attention_mask

            parts = [self.embed_norm(embeds), self.hidden_norm(h)]
            x = self.proj(mx.concatenate(parts[::-1] if layout.hidden_first else parts, axis=-1))
            out = self.decoder(x, create_attention_mask(x, cache), cache)
            normed = self.out_norm(out)
            return (normed if layout.post_norm else out), normed

    # The decoder layer's own conversions (experts stacked) as the target's sanitize does them, on the last
    # main layer's prefix (a MoE layer like this one), then back to the module's names.
    decoder = {f"model.layers.{n - 1}.{k}": v for k, v in weights.items() if k.startswith(_DECODER_PARTS)}
    if hasattr(inner, "sanitize"):
        decoder = inner.sanitize(decoder)
    named = {f"decoder.{k[len(f'model.layers.{n - 1}.') :]}": v for k, v in decoder.items()}
    own = {layout.embed_norm: "embed_norm", layout.hidden_norm: "hidden_norm", layout.proj: "proj",
           layout.out_norm: "out_norm", "shared_head.head": "head"}  # fmt: skip
    named |= {own[k.rsplit(".", 1)[0]] + "." + k.rsplit(".", 1)[1]: v for k, v in weights.items()
              if k.rsplit(".", 1)[0] in own}  # fmt: skip
    head = NextnHead()
    load_head_weights(head, named, f"{target.info.name}: its MTP layer's weights", MTP_HINT)
    return head


class NextnDrafter(MLXHeadDrafter):
    """Drafts with the target's own MTP layer in the nextn or MiMo layout on MLX (the target borrowed)."""

    method = "mtp"
    LOOKAHEAD = 1

    def __init__(self, target: MLXBackend) -> None:
        from mlx_lm.models.cache import KVCache

        n_layers = len(target.model.layers)
        check_target(target.model_path, target.config)
        self._layout = _layout(target.config)
        self._head = _build(target, self._layout, _read(Path(target.model_path), self._layout.at(n_layers)))
        self._cache = KVCache()
        self._dtype = self._head.proj.weight.dtype
        self._final_norm = target.text_model.model.norm
        super().__init__(target, f"mtp:{target.info.name}", [n_layers])  # the last layer's output

    def _n_pairs(self, context: Sequence[int]) -> int:
        return max(0, min(len(context) - 1, self._held(context)))

    def _run(self, context: Sequence[int], start: int, stop: int) -> tuple[np.ndarray, Any]:
        h = self.target.features(start, stop)
        return self._forward(
            list(context[start + 1 : stop + 1]), (self._final_norm(h) if self._layout.post_norm else h)[None]
        )

    def _step(self, token: int, state: Any, position: int) -> tuple[np.ndarray, Any]:
        return self._forward([token], state)

    def _forward(self, tokens: list[int], h: Any) -> tuple[np.ndarray, Any]:
        import mlx.core as mx

        embeds = self.target.embed_tokens(mx.array(tokens, dtype=mx.uint32)[None]).astype(self._dtype)
        state, normed = self._head(embeds, h.astype(self._dtype), self._cache)
        state, normed = state[:, -1:], normed[:, -1:]
        head = getattr(self._head, "head", None)
        logits = (head(normed) if head is not None else self.target.lm_head(normed))[0, -1].astype(mx.float32)
        mx.eval(logits, state)
        return np.asarray(logits), state

    def _cut(self, n: int) -> None:
        if self._cache.offset > n:
            self._cache.trim(self._cache.offset - n)


class LlamaPairsDrafter(NextnDrafter):
    """The nextn layout with llama.cpp's pairs: pair P is (token P, h at P - 1), zeros for h at -1."""

    LOOKAHEAD = 0

    def _n_pairs(self, context: Sequence[int]) -> int:
        return min(len(context), self._held(context) + 1)  # pair P needs the target's state at P - 1

    def _run(self, context: Sequence[int], start: int, stop: int) -> tuple[np.ndarray, Any]:
        import mlx.core as mx

        first = max(start - 1, 0)
        h = self.target.features(first, stop - 1) if stop - 1 > first else None
        if start == 0:  # the first pair's state: zeros
            zero = mx.zeros((1, self.target.hidden_size or 0), self._dtype)
            h = zero if h is None else mx.concatenate([zero, h.astype(self._dtype)], axis=0)
        assert h is not None
        return self._forward(list(context[start:stop]), self._final_norm(h)[None])


def drafter(target: MLXBackend) -> NextnDrafter:
    """The MTP drafter for this layout (localspec.families.mtp picks the module by architecture)."""
    return LlamaPairsDrafter(target) if _layout(target.config) is NEXTN else NextnDrafter(target)
