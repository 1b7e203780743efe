"""MTP on MLX: the target's own multi-token-prediction layer drafts ahead, in each of the layouts checkpoints keep
it in. mlx-lm drops the layer when it loads (its sanitize), and many converted repositories ship without it, so
it is read from the checkpoint's own safetensors (headers first: a model without it is refused with the reason)
and built from the target's own decoder-layer class, so its attention, MLP or MoE and norms are mlx-lm's. Per
position, in every layout:

    x      = proj([embed_norm(embed(token)), hidden_norm(h)])   # MiMo: [hidden_norm(h), embed_norm(embed(token))]
    out    = out_norm(decoder layers(x))                         # its own KV caches
    logits = lm_head(out)                                        # the layer's own head where it has one
    drafting goes on with `out` in h's place

h is the target's hidden state after its final norm. The layouts (`LAYOUTS`, by the target's model_type):
- Qwen3.5 / Qwen3.6 / Qwen3-Next (`mtp.*`: fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm, layers.N):
  one or more full-attention layers of the target's class; an original checkpoint stores its norms as offsets
  from one (mlx-lm adds 1.0 to the target's when it loads one, found by its unconverted conv1d weights), and the
  MTP norms get the same.
- DeepSeek-V3 / GLM-4.5 "nextn" (`model.layers.{num_hidden_layers}.*`: eh_proj, enorm, hnorm, shared_head.norm,
  shared_head.head if it has one), as llama.cpp's nextn graph runs it.
- MiMo (`model.mtp_layers.0.*`: input_proj, token_layernorm, hidden_layernorm, final_layernorm), its Hugging
  Face modeling.
Pairs (localspec/backends/heads.py): pair P is (token P+1, h at P), so the cache holds positions 0..N-2 of a
context of N tokens; for nextn, as llama.cpp pairs them (LlamaPairsDrafter): pair P is (token P, h at P - 1) at
position P, h at -1 being zeros. (vLLM and the training code leave that first pair out; it shifts every logit a
little, and with it localspec's drafts on MLX equal llama.cpp's round by round: tests/test_mlx_nextn.py, on the
same converted GGUF.)
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends.mlx.backend import MLXBackend
from localspec.backends.mlx.capture import original_class
from localspec.backends.mlx.head import StepDrafter, load_head_weights
from localspec.errors import ModelFileError, UnsupportedModelError

MTP_HINT = "use the original Hugging Face checkpoint (it keeps the MTP weights), or another --draft-method"
_DECODER_PARTS = ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.")


@dataclass(frozen=True)
class Layout:
    """Where a checkpoint keeps its MTP layer and what its parts are called."""

    prefix: str  # where the layer's tensors live; {n}: the target's number of layers; "mtp.": under any parent
    embed_norm: str
    hidden_norm: str
    proj: str
    out_norm: str  # the norm before the logits
    hidden_first: bool  # the projection reads [hidden, embedding] (MiMo), else [embedding, hidden]
    full_attention: bool  # layers.N.* of the target's full-attention layer class (Qwen3.5), else one decoder layer
    declared_by: str  # the config key that says how many MTP layers there are

    def at(self, n_layers: int) -> str:
        return self.prefix.format(n=n_layers)


QWEN35 = Layout("mtp.", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc", "norm", hidden_first=False,
                full_attention=True, declared_by="mtp_num_hidden_layers")  # fmt: skip
NEXTN = Layout("model.layers.{n}.", "enorm", "hnorm", "eh_proj", "shared_head.norm", hidden_first=False,
               full_attention=False, declared_by="num_nextn_predict_layers")  # fmt: skip
MIMO = Layout("model.mtp_layers.0.", "token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm",
              hidden_first=True, full_attention=False, declared_by="num_nextn_predict_layers")  # fmt: skip
LAYOUTS = {"qwen3_5": QWEN35, "qwen3_5_moe": QWEN35, "qwen3_next": QWEN35, "glm4_moe": NEXTN, "deepseek_v3": NEXTN,
           "mimo": MIMO}  # fmt: skip
ARCHITECTURES = tuple(LAYOUTS)


def safetensors_headers(model_dir: Path) -> dict[str, tuple[Path, list[int]]]:
    """Every tensor's (file, shape) from the safetensors headers alone."""
    out: dict[str, tuple[Path, list[int]]] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            raise ModelFileError(f"{f}: not a readable safetensors file", "download the model again") from None
        out |= {k: (f, list(v.get("shape", []))) for k, v in header.items() if k != "__metadata__"}
    return out


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("text_config") or config


def layout(config: dict[str, Any], name: str = "the target") -> Layout:
    """The layout of this checkpoint's MTP layer, by its architecture; UnsupportedModelError for any other."""
    arch = str(_text_config(config).get("model_type") or config.get("model_type"))
    if arch not in LAYOUTS:
        raise UnsupportedModelError(
            f"{name} is a {arch!r} model: localspec runs MTP on MLX for {', '.join(ARCHITECTURES)} only",
            "on llama.cpp, MTP runs for more families; or use another --draft-method",
        )
    return LAYOUTS[arch]


def _inner_name(key: str, layout: Layout, n_layers: int) -> str | None:
    """A tensor's name inside the layer (`fc.weight`, `layers.0.…`) for one of its keys; None for others. Qwen3.5's
    `mtp.` may sit under any parent (`model.mtp.…`, `model.language_model.mtp.…`)."""
    if layout is not QWEN35:
        prefix = layout.at(n_layers)
        return key[len(prefix) :] if key.startswith(prefix) else None
    at = key.find("mtp.")
    return key[at + 4 :] if at >= 0 and (at == 0 or key[at - 1] == ".") else None


def check_target(model_dir: str | Path, config: dict[str, Any]) -> int:
    """From config.json and the safetensors headers: the number of MTP layers this checkpoint keeps (built here).
    Raises UnsupportedModelError (architecture) or ModelFileError (none declared, or no weights for them)."""
    name = Path(model_dir).name
    kind = layout(config, name)
    text = _text_config(config)
    declared = int(text.get(kind.declared_by) or config.get(kind.declared_by) or 0)
    n_layers = int(text.get("num_hidden_layers") or 0)
    names = [n for k in safetensors_headers(Path(model_dir)) if (n := _inner_name(k, kind, n_layers)) is not None]
    if kind.full_attention:
        layers = {n.split(".")[1] for n in names if n.startswith("layers.")}
        missing = "its files hold no mtp.* weights"
    else:
        layers = {"0"} if any(n.startswith(kind.proj) for n in names) else set()
        missing = f"holds no {kind.at(n_layers)}{kind.proj}"
    if not declared or not layers:
        what = "declares no MTP layers" if not declared else f"declares MTP layers but {missing}"
        raise ModelFileError(f"{name} {what} (mlx-lm's conversion drops them)", MTP_HINT)
    return len(layers)


def _unsanitized(headers: dict[str, tuple[Path, list[int]]]) -> bool:
    """mlx-lm's test for an original checkpoint: a conv1d weight not yet moved to (C, K, 1)."""
    return any("conv1d.weight" in k and shape and shape[-1] != 1 for k, (_, shape) in headers.items())


def _read(model_dir: Path, kind: Layout, n_layers: int) -> tuple[dict[str, Any], bool]:
    """The layer's weights by their names inside it, and whether its norms need +1 (an original checkpoint)."""
    import mlx.core as mx

    headers = safetensors_headers(model_dir)
    files = sorted({f for k, (f, _) in headers.items() if _inner_name(k, kind, n_layers) is not None})
    weights: dict[str, Any] = {}
    for f in files:
        for k, v in mx.load(str(f)).items():
            name = _inner_name(k, kind, n_layers)
            if name is not None:
                weights[name] = v
    return weights, _unsanitized(headers)


def _named(weights: dict[str, Any], kind: Layout, inner: Any, at: int) -> dict[str, Any]:
    """The weights by the head module's names. The decoder layers go through the target's own sanitize (its
    conversions: conv weights, experts stacked) as `model.layers.{at + i}`: for one decoder layer the last main
    layer's index, which has its kind of MLP (a MoE layer like this one)."""
    own = {kind.embed_norm: "embed_norm", kind.hidden_norm: "hidden_norm", kind.proj: "proj",
           kind.out_norm: "out_norm", "shared_head.head": "head"}  # fmt: skip
    if kind.full_attention:
        layers = {f"model.layers.{at + int(k.split('.')[1])}.{k.split('.', 2)[2]}": v
                  for k, v in weights.items() if k.startswith("layers.")}  # fmt: skip
    else:
        layers = {f"model.layers.{at}.{k}": v for k, v in weights.items() if k.startswith(_DECODER_PARTS)}
    if hasattr(inner, "sanitize"):
        layers = inner.sanitize(layers)
    named = {}
    for k, v in layers.items():
        if k.startswith("model.layers."):
            _, _, index, rest = k.split(".", 3)
            named[f"layers.{int(index) - at}.{rest}"] = v
    for k, v in weights.items():
        module, _, leaf = k.rpartition(".")
        if module in own:
            named[f"{own[module]}.{leaf}"] = v
    return named


def _build(target: MLXBackend, kind: Layout, n_mtp: int, weights: dict[str, Any], shift: bool) -> Any:
    import mlx.core as mx
    import mlx.nn as nn

    inner = target.text_model
    args = inner.args
    n = len(inner.model.layers)
    # Qwen3.5: the first full-attention layer's class at its index (the index picks attention over DeltaNet);
    # else the last main layer's class at index n (the index picks MoE over a dense MLP).
    fa = next(i for i, layer in enumerate(inner.model.layers) if not getattr(layer, "is_linear", False))
    source, index = (fa, fa) if kind.full_attention else (n - 1, n)
    layer_class = original_class(inner.model.layers[source])
    takes_index = "layer_idx" in layer_class.__init__.__code__.co_varnames
    e = args.hidden_size
    eps = args.rms_norm_eps

    class MtpHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_norm = nn.RMSNorm(e, eps=eps)
            self.hidden_norm = nn.RMSNorm(e, eps=eps)
            self.proj = nn.Linear(2 * e, e, bias=False)
            self.layers = [layer_class(args, index) if takes_index else layer_class(args) for _ in range(n_mtp)]
            self.out_norm = nn.RMSNorm(e, eps=eps)
            if "shared_head.head.weight" in weights:
                self.head = nn.Linear(e, args.vocab_size, bias=False)

        def __call__(self, embeds: Any, h: Any, caches: list[Any]) -> Any:
            """The normed output rows [1, n, E]: the logits' input and the state drafting goes on with."""
            from mlx_lm.models.base import create_attention_mask

            parts = [self.embed_norm(embeds), self.hidden_norm(h)]
            x = self.proj(mx.concatenate(parts[::-1] if kind.hidden_first else parts, axis=-1))
            for layer, cache in zip(self.layers, caches):
                x = layer(x, create_attention_mask(x, cache), cache)
            return self.out_norm(x)

    if shift:  # an original checkpoint's norms are offsets from one, as mlx-lm decides for the target
        weights = {k: (v + 1.0 if v.ndim == 1 and k.endswith("norm.weight") else v) for k, v in weights.items()}
    head = MtpHead()
    load_head_weights(head, _named(weights, kind, inner, 0 if kind.full_attention else n - 1),
                      f"{target.info.name}: its MTP layer's weights", MTP_HINT)  # fmt: skip
    return head


class MtpDrafter(StepDrafter):
    """Drafts with the target's own MTP layer on MLX (the target borrowed, its capture turned on)."""

    method = "mtp"
    LOOKAHEAD = 1  # pair P is (ctx[P+1], h[P])

    def __init__(self, target: MLXBackend) -> None:
        from mlx_lm.models.cache import KVCache

        n_mtp = check_target(target.model_path, target.config)
        n_layers = len(target.model.layers)
        kind = layout(target.config)
        weights, unsanitized = _read(Path(target.model_path), kind, n_layers)
        self._head = _build(target, kind, n_mtp, weights, shift=unsanitized)
        self._caches = [KVCache() for _ in self._head.layers]
        self._dtype = self._head.proj.weight.dtype
        self._final_norm = target.text_model.model.norm
        super().__init__(target, f"mtp:{target.info.name}", [n_layers])  # the last layer's output

    def _n_pairs(self, context: Sequence[int]) -> int:
        return max(0, min(len(context) - 1, self._held(context)))

    def _write(self, context: Sequence[int], start: int, stop: int, *, output: bool) -> tuple[np.ndarray, Any]:
        h = self._final_norm(self.target.features(start, stop))[None]  # the hidden state after the final norm
        return self._forward(list(context[start + 1 : stop + 1]), h)

    def _forward(self, tokens: list[int], h: Any) -> tuple[np.ndarray, Any]:
        import mlx.core as mx

        embeds = self.target.embed_tokens(mx.array(tokens, dtype=mx.uint32)[None]).astype(self._dtype)
        state = self._head(embeds, h.astype(self._dtype), self._caches)[:, -1:]
        head = getattr(self._head, "head", None)
        logits = (head(state) if head is not None else self.target.lm_head(state))[0, -1].astype(mx.float32)
        mx.eval(logits, state)
        return np.asarray(logits), state


class LlamaPairsDrafter(MtpDrafter):
    """The nextn layout with llama.cpp's pairs: pair P is (token P, h at P - 1), zeros for h at -1."""

    LOOKAHEAD = 0

    def _n_pairs(self, context: Sequence[int]) -> int:
        return min(len(context), self._held(context) + 1)  # pair P needs the target's state at P - 1

    def _write(self, context: Sequence[int], start: int, stop: int, *, output: bool) -> tuple[np.ndarray, Any]:
        import mlx.core as mx

        first = max(start - 1, 0)
        h = self.target.features(first, stop - 1) if stop - 1 > first else None
        if start == 0:  # the first pair's state: zeros
            zero = mx.zeros((1, self.target.hidden_size or 0), self._dtype)
            h = zero if h is None else mx.concatenate([zero, h.astype(self._dtype)], axis=0)
        assert h is not None
        return self._forward(list(context[start:stop]), self._final_norm(h)[None])


def drafter(target: MLXBackend) -> MtpDrafter:
    """The MTP drafter for this checkpoint's layout (localspec.families.mtp builds it)."""
    return LlamaPairsDrafter(target) if layout(target.config) is NEXTN else MtpDrafter(target)
