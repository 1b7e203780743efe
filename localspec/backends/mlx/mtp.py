"""MTP on MLX: the target's own multi-token-prediction layer drafts ahead, for Qwen3.5 / Qwen3.6 / Qwen3-Next
checkpoints (hybrids included) that keep it.

mlx-lm drops the `mtp.*` weights when it loads (its sanitize), and many converted repositories ship without
them, so the layer is read from the checkpoint's own safetensors (headers first: a model without them is
refused with the reason) and built from the target's own decoder-layer class (a full-attention layer), so its
attention, MLP or MoE and norms are mlx-lm's. Per position, as these checkpoints define it:

    x      = fc([pre_fc_norm_embedding(embed(token)), pre_fc_norm_hidden(h)])   # embedding first
    out    = norm(mtp_layers(x))                                               # its own KV cache
    logits = the target's lm_head(out)

h is the target's hidden state after its final norm (post-norm, unlike DeepSeek-V3 / GLM "nextn", which read
it before; those, and MiMo's hidden-first order, are localspec/backends/mlx/nextn.py). Pairs (mlx/head.py): pair P is (token
P+1, h at P), so the cache holds positions 0..N-2 of a context of N tokens; drafting goes on with the layer's
own `out` in h's place. Norm shifts: an original checkpoint stores these norms as offsets from one (mlx-lm adds
1.0 to the target's when it loads one, found by its unconverted conv1d weights); the MTP norms get the same.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends.mlx.backend import MLXBackend
from localspec.backends.mlx.capture import original_class
from localspec.backends.mlx.head import MLXHeadDrafter, load_head_weights
from localspec.errors import ModelFileError, UnsupportedModelError

ARCHITECTURES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
MTP_HINT = "use the original Hugging Face checkpoint (it keeps the MTP weights), or another --draft-method"


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


def _mtp_name(key: str) -> str | None:
    """`fc.weight` for `mtp.fc.weight` (or `model.mtp.…`, `model.language_model.mtp.…`); None for others."""
    at = key.find("mtp.")
    return key[at + 4 :] if at >= 0 and (at == 0 or key[at - 1] == ".") else None


def check_target(model_dir: str | Path, config: dict[str, Any]) -> int:
    """From config.json and the safetensors headers: the number of MTP layers this checkpoint keeps.
    Raises UnsupportedModelError (architecture) or ModelFileError (no MTP weights)."""
    text = config.get("text_config") or config
    arch = str(text.get("model_type") or config.get("model_type"))
    name = Path(model_dir).name
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{name} is a {arch!r} model: localspec runs MTP on MLX for {', '.join(ARCHITECTURES)} and the "
            "DeepSeek-V3 / GLM-4.5 / MiMo layouts only",
            "on llama.cpp, MTP runs for more families; or use another --draft-method",
        )
    declared = int(text.get("mtp_num_hidden_layers") or config.get("mtp_num_hidden_layers") or 0)
    have = {
        n.split(".")[1] for k in safetensors_headers(Path(model_dir)) if (n := _mtp_name(k)) and n.startswith("layers.")
    }
    if not declared or not have:
        what = "declares no MTP layers" if not declared else "declares MTP layers but its files hold no mtp.* weights"
        raise ModelFileError(f"{name} {what} (mlx-lm's conversion drops them)", MTP_HINT)
    return len(have)


def _unsanitized(headers: dict[str, tuple[Path, list[int]]]) -> bool:
    """mlx-lm's test for an original checkpoint: a conv1d weight not yet moved to (C, K, 1)."""
    return any("conv1d.weight" in k and shape and shape[-1] != 1 for k, (_, shape) in headers.items())


def _read_mtp(model_dir: Path) -> tuple[dict[str, Any], bool]:
    """The MTP weights by their names inside the layer (fc.weight, layers.0.…), and whether norms need +1."""
    import mlx.core as mx

    headers = safetensors_headers(model_dir)
    files = sorted({f for k, (f, _) in headers.items() if _mtp_name(k)})
    weights: dict[str, Any] = {}
    for f in files:
        for k, v in mx.load(str(f)).items():
            name = _mtp_name(k)
            if name is not None:
                weights[name] = v
    return weights, _unsanitized(headers)


def _build(target: MLXBackend, n_layers: int, weights: dict[str, Any], shift: bool) -> Any:
    import mlx.core as mx
    import mlx.nn as nn

    inner = target.text_model
    args = inner.args
    fa = next(i for i, layer in enumerate(inner.model.layers) if not getattr(layer, "is_linear", False))
    layer_class = original_class(inner.model.layers[fa])
    e = args.hidden_size

    class MtpHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2 * e, e, bias=False)
            self.pre_fc_norm_embedding = nn.RMSNorm(e, eps=args.rms_norm_eps)
            self.pre_fc_norm_hidden = nn.RMSNorm(e, eps=args.rms_norm_eps)
            self.layers = [layer_class(args, fa) for _ in range(n_layers)]
            self.norm = nn.RMSNorm(e, eps=args.rms_norm_eps)

        def __call__(self, embeds: Any, h: Any, caches: list[Any]) -> Any:
            from mlx_lm.models.base import create_attention_mask

            x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(h)], axis=-1))
            for layer, cache in zip(self.layers, caches):
                x = layer(x, create_attention_mask(x, cache), cache)
            return self.norm(x)

    head = MtpHead()
    if shift:
        weights = {k: (v + 1.0 if v.ndim == 1 and k.endswith("norm.weight") else v) for k, v in weights.items()}
    if hasattr(inner, "sanitize"):  # the layer's own conversions (conv weights, expert stacking), as for the target
        prefixed = inner.sanitize({f"model.{k}": v for k, v in weights.items() if k.startswith("layers.")})
        weights = {**{k: v for k, v in weights.items() if not k.startswith("layers.")},
                   **{k[len("model."):]: v for k, v in prefixed.items() if k.startswith("model.layers.")}}  # fmt: skip
    load_head_weights(head, weights, f"{target.info.name}: its mtp.* weights", MTP_HINT)
    return head


class MtpDrafter(MLXHeadDrafter):
    """Drafts with the target's own MTP layer on MLX. Borrows the target, whose capture it turns on."""

    method = "mtp"
    LOOKAHEAD = 1  # pair P is (ctx[P+1], h[P])

    def __init__(self, target: MLXBackend) -> None:
        n_mtp = check_target(target.model_path, target.config)
        weights, unsanitized = _read_mtp(Path(target.model_path))
        # A converted checkpoint's norms are already shifted, an original one's not: as mlx-lm decides for the target.
        self._head = _build(target, n_mtp, weights, shift=unsanitized)
        from mlx_lm.models.cache import KVCache

        self._caches = [KVCache() for _ in self._head.layers]
        self._dtype = self._head.fc.weight.dtype
        self._final_norm = target.text_model.model.norm
        super().__init__(target, f"mtp:{target.info.name}", [len(target.model.layers)])

    def _n_pairs(self, context: Sequence[int]) -> int:
        return max(0, min(len(context) - 1, self._held(context)))

    def _run(self, context: Sequence[int], start: int, stop: int) -> tuple[np.ndarray, Any]:
        h = self._final_norm(self.target.features(start, stop))[None].astype(self._dtype)  # post-norm hidden
        return self._forward(list(context[start + 1 : stop + 1]), h)

    def _step(self, token: int, state: Any, position: int) -> tuple[np.ndarray, Any]:
        return self._forward([token], state)

    def _forward(self, tokens: list[int], h: Any) -> tuple[np.ndarray, Any]:
        import mlx.core as mx

        embeds = self.target.embed_tokens(mx.array(tokens, dtype=mx.uint32)[None]).astype(self._dtype)
        out = self._head(embeds, h, self._caches)
        state = out[:, -1:]
        logits = self.target.lm_head(state)[0, -1].astype(mx.float32)
        mx.eval(logits, state)
        return np.asarray(logits), state

    def _cut(self, n: int) -> None:
        for c in self._caches:
            if c.offset > n:
                c.trim(c.offset - n)


def drafter(target: MLXBackend) -> MtpDrafter:
    """The MTP drafter for this layout (localspec.families.mtp picks the module by architecture)."""
    return MtpDrafter(target)
