"""Tiny random head drafters in their published Hugging Face layouts, for the MLX head tests.

`write_eagle3` writes an EAGLE-3 head for a tiny mlx-lm target (tests/mlx_tiny.py): the original layout
(`midlayer.*`, a flat llama config with `draft_vocab_size`) or the "speculators" one (`layers.0.*`, the
llama config under `transformer_layer_config`, `eagle_aux_hidden_state_layer_ids`). `from_gguf_eagle3`
turns a tiny EAGLE-3 GGUF (tests/gguf_factory.py) into the same layout, so both backends draft with the
same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

ORIGINAL, SPECULATORS = "original", "speculators"


def _llama_config(
    hidden: int, heads: int, kv_heads: int, ff: int, vocab: int, eps: float, theta: float
) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
        "num_hidden_layers": 1, "intermediate_size": ff, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "rms_norm_eps": eps, "rope_theta": theta, "vocab_size": vocab, "max_position_embeddings": 4096,
    }  # fmt: skip


def eagle3_tensors(rng: np.random.Generator, *, hidden: int, target_hidden: int, heads: int, kv_heads: int, ff: int,
                   n_out: int, scale: float = 8.0) -> dict[str, np.ndarray]:  # fmt: skip
    """Random weights by the head module's own names (no layer prefix)."""

    def w(*shape: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * s / np.sqrt(shape[-1])).astype(np.float32)

    head_dim = hidden // heads

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)

    return {
        "fc.weight": w(hidden, 3 * target_hidden),
        "self_attn.q_proj.weight": w(heads * head_dim, 2 * hidden),
        "self_attn.k_proj.weight": w(kv_heads * head_dim, 2 * hidden),
        "self_attn.v_proj.weight": w(kv_heads * head_dim, 2 * hidden),
        "self_attn.o_proj.weight": w(hidden, heads * head_dim),
        "mlp.gate_proj.weight": w(ff, hidden),
        "mlp.up_proj.weight": w(ff, hidden),
        "mlp.down_proj.weight": w(hidden, ff),
        "input_layernorm.weight": norm(),
        "hidden_norm.weight": norm(),
        "post_attention_layernorm.weight": norm(),
        "norm.weight": norm(),
        "lm_head.weight": w(n_out, hidden, s=scale),  # peaked draft distributions
    }


_LAYER_PARTS = ("self_attn.", "mlp.", "input_layernorm.", "hidden_norm.", "post_attention_layernorm.")


def save_eagle3(out: Path, tensors: dict[str, np.ndarray], config: dict[str, Any], *, layout: str,
                layer_ids: tuple[int, ...], d2t: np.ndarray | None = None, norm_before_residual: bool = False) -> Path:  # fmt: skip
    """Write the head directory in `layout` (ORIGINAL or SPECULATORS). `d2t`: absolute target ids per draft
    id, written as the published offsets."""
    import mlx.core as mx

    prefix = "midlayer." if layout == ORIGINAL else "layers.0."
    named = {(prefix + k if k.startswith(_LAYER_PARTS) else k): mx.array(v) for k, v in tensors.items()}
    n_out = tensors["lm_head.weight"].shape[0]
    if d2t is not None:
        named["d2t"] = mx.array((np.asarray(d2t) - np.arange(len(d2t))).astype(np.int64))
    if layout == ORIGINAL:
        cfg = {**config, "draft_vocab_size": n_out, "eagle_aux_hidden_state_layer_ids": list(layer_ids),
               "target_hidden_size": tensors["fc.weight"].shape[1] // 3, "norm_before_residual": norm_before_residual}  # fmt: skip
    else:
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": config, "draft_vocab_size": n_out,
               "eagle_aux_hidden_state_layer_ids": list(layer_ids), "norm_before_residual": norm_before_residual,
               "target_hidden_size": tensors["fc.weight"].shape[1] // 3}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), named)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def write_eagle3(out: Path, target_config: dict[str, Any], *, seed: int, layer_ids: tuple[int, ...],
                 layout: str = ORIGINAL, draft_vocab: int | None = None, heads: int = 4, kv_heads: int = 2,
                 ff: int = 128, norm_before_residual: bool = False) -> Path:  # fmt: skip
    """A random EAGLE-3 head for a tiny target (its hidden size and vocabulary); `draft_vocab`: a reduced
    head vocabulary of that many random target ids (d2t)."""
    rng = np.random.default_rng(seed)
    hidden, vocab = int(target_config["hidden_size"]), int(target_config["vocab_size"])
    d2t = np.sort(rng.choice(vocab, size=draft_vocab, replace=False)) if draft_vocab else None
    tensors = eagle3_tensors(rng, hidden=hidden, target_hidden=hidden, heads=heads, kv_heads=kv_heads, ff=ff,
                             n_out=draft_vocab or vocab)  # fmt: skip
    config = _llama_config(hidden, heads, kv_heads, ff, vocab, 1e-6, 10000.0)
    return save_eagle3(out, tensors, config, layout=layout, layer_ids=layer_ids, d2t=d2t,
                       norm_before_residual=norm_before_residual)  # fmt: skip


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter permutes q/k rows for its interleaved RoPE; Hugging Face weights rotate halves."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def from_gguf_eagle3(gguf_path: Path, out: Path, *, layout: str = ORIGINAL) -> Path:
    """The same head as a Hugging Face directory (the GGUF's tensors renamed, q/k un-permuted)."""
    import gguf

    r = gguf.GGUFReader(str(gguf_path))
    meta = {f.name: f for f in r.fields.values()}

    def value(key: str) -> Any:
        f = meta[key]
        return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else [f.parts[i].tolist()[0] for i in f.data]

    t = {x.name: np.array(x.data) for x in r.tensors}
    hidden, heads, kv_heads = (
        value("eagle3.embedding_length"),
        value("eagle3.attention.head_count"),
        value("eagle3.attention.head_count_kv"),
    )
    names = {
        "fc.weight": "fc.weight", "output_norm.weight": "norm.weight", "output.weight": "lm_head.weight",
        "blk.0.attn_norm.weight": "input_layernorm.weight", "blk.0.attn_norm_2.weight": "hidden_norm.weight",
        "blk.0.attn_q.weight": "self_attn.q_proj.weight", "blk.0.attn_k.weight": "self_attn.k_proj.weight",
        "blk.0.attn_v.weight": "self_attn.v_proj.weight", "blk.0.attn_output.weight": "self_attn.o_proj.weight",
        "blk.0.ffn_norm.weight": "post_attention_layernorm.weight", "blk.0.ffn_gate.weight": "mlp.gate_proj.weight",
        "blk.0.ffn_up.weight": "mlp.up_proj.weight", "blk.0.ffn_down.weight": "mlp.down_proj.weight",
    }  # fmt: skip
    tensors = {hf: t[g].astype(np.float32) for g, hf in names.items()}
    tensors["self_attn.q_proj.weight"] = _unpermute(tensors["self_attn.q_proj.weight"], heads)
    tensors["self_attn.k_proj.weight"] = _unpermute(tensors["self_attn.k_proj.weight"], kv_heads)
    vocab = len(value("tokenizer.ggml.tokens")) if "tokenizer.ggml.tokens" in meta else int(value("eagle3.vocab_size"))
    config = _llama_config(hidden, heads, kv_heads, value("eagle3.feed_forward_length"), vocab,
                           value("eagle3.attention.layer_norm_rms_epsilon"), value("eagle3.rope.freq_base"))  # fmt: skip
    layer_ids = tuple(int(i) for i in value("eagle3.target_layers"))
    d2t = t["d2t"].astype(np.int64) if "d2t" in t else None
    return save_eagle3(out, tensors, config, layout=layout, layer_ids=layer_ids, d2t=d2t)


def _gguf(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(metadata values, tensors) of a small GGUF."""
    import gguf

    r = gguf.GGUFReader(str(path))
    meta: dict[str, Any] = {}
    for f in r.fields.values():
        if not f.data:
            continue
        vals = [f.parts[i].tolist() for i in f.data]
        vals = [
            bytes(v).decode(errors="replace") if f.types and f.types[-1] == gguf.GGUFValueType.STRING else v[0]
            for v in vals
        ]
        meta[f.name] = vals[0] if len(vals) == 1 and not (f.types and f.types[0] == gguf.GGUFValueType.ARRAY) else vals
    return meta, {x.name: np.array(x.data) for x in r.tensors}


def from_gguf_dflash(gguf_path: Path, out: Path) -> Path:
    """A tiny DFlash / DSpark / DFlash2 GGUF (tests/gguf_factory.py) as the Hugging Face directory it converts from
    (llama.cpp's converter in reverse: target layer ids minus one, d2t as offsets; NeoX RoPE, so q/k as they are)."""
    import mlx.core as mx

    meta, t = _gguf(gguf_path)
    a = "dflash"
    n_layer = int(meta[f"{a}.block_count"])
    names = {"fc.weight": "fc.weight", "enc.output_norm.weight": "hidden_norm.weight", "output_norm.weight": "norm.weight",
             "output.weight": "lm_head.weight", "markov_w1.weight": "markov_head.markov_w1.weight",
             "markov_w2.weight": "markov_head.markov_w2.weight", "conf_proj.weight": "confidence_head.proj.weight",
             "conf_proj.bias": "confidence_head.proj.bias"}  # fmt: skip
    parts = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}  # fmt: skip
    for i in range(n_layer):
        names |= {f"blk.{i}.{g}.weight": f"layers.{i}.{h}.weight" for g, h in parts.items()}
        for g, h in (("attn", "attention_conv"), ("ffn", "mlp_conv")):  # DFlash2's dynamic convolutions
            names |= {f"blk.{i}.{g}_conv_base": f"layers.{i}.{h}.base_kernel",
                      f"blk.{i}.{g}_conv_proj.weight": f"layers.{i}.{h}.kernel_projection.weight"}  # fmt: skip
    names |= {"selector_predecessor.weight": "candidate_selector.predecessor_codebook",
              "selector_successor.weight": "candidate_selector.successor_codebook",
              "selector_hidden.weight": "candidate_selector.hidden_projection.weight"}  # fmt: skip
    weights = {hf: mx.array(t[g].astype(np.float32)) for g, hf in names.items() if g in t}
    vocab = len(meta["tokenizer.ggml.tokens"])
    dspark = "markov_w1.weight" in t
    if "d2t" in t:
        d2t = t["d2t"].astype(np.int64)
        weights["d2t"] = mx.array(d2t - np.arange(len(d2t)))
    heads = int(meta[f"{a}.attention.head_count"])
    hidden = int(meta[f"{a}.embedding_length"])
    config = {
        "architectures": ["DSparkDraftModel" if dspark else "DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": hidden, "num_hidden_layers": n_layer, "intermediate_size": int(meta[f"{a}.feed_forward_length"]),
        "num_attention_heads": heads, "num_key_value_heads": int(meta[f"{a}.attention.head_count_kv"]),
        "head_dim": int(meta.get(f"{a}.attention.key_length") or hidden // heads),
        "rms_norm_eps": float(meta[f"{a}.attention.layer_norm_rms_epsilon"]), "rope_theta": float(meta[f"{a}.rope.freq_base"]),
        "vocab_size": vocab, "draft_vocab_size": len(t["d2t"]) if "d2t" in t else vocab,
        "dflash_config": {"block_size": int(meta[f"{a}.block_size"]), "mask_token_id": int(meta["tokenizer.ggml.mask_token_id"]),
                          "target_layer_ids": [int(i) - 1 for i in meta[f"{a}.target_layers"]]},
    }  # fmt: skip
    if dspark:
        config["sample_from_anchor"] = bool(meta.get(f"{a}.sample_from_anchor", True))
    if f"{a}.selector_top_k" in meta:  # DFlash2
        config["architectures"] = ["DFlash2DraftModel"]
        config["dflash_config"] |= {k: int(meta[f"{a}.{k}"]) for k in (
            "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def _random_layer(layer: Any, rng: np.random.Generator, echo: bool, prefix: str) -> dict[str, Any]:
    """A decoder layer's parameters, random (norms near one), by `prefix` + name; `echo`: its attention and MLP
    outputs zero, so the layer passes its input through."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    out: dict[str, Any] = {}
    for name, v in tree_flatten(layer.parameters()):
        shape = tuple(v.shape)
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            w = 0.1 * rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        if echo and name.endswith(("o_proj.weight", "down_proj.weight")):
            w = np.zeros(shape)
        out[prefix + name] = mx.array(w.astype(np.float32))
    return out


def add_mtp(model_dir: Path, *, seed: int, echo: bool = False) -> Path:
    """Give a tiny Qwen3.5 model directory one MTP layer, as original checkpoints keep it: `mtp.*` tensors
    (in their own file, which mlx-lm's loader drops) and `mtp_num_hidden_layers` in config.json. The layer is
    the model's own full-attention decoder layer class with random weights; `echo`: a layer that passes the
    hidden state through (zero attention and MLP outputs, fc reading the hidden half only), so its draft is
    the target's own next-token distribution one position back and repeats get accepted."""
    import mlx.core as mx
    from mlx_lm.models import qwen3_5

    config = json.loads((model_dir / "config.json").read_text())
    args = qwen3_5.TextModelArgs.from_dict(config)
    fa = args.full_attention_interval - 1
    rng = np.random.default_rng(seed)
    e = args.hidden_size
    weights = _random_layer(qwen3_5.DecoderLayer(args, fa), rng, echo, "mtp.layers.0.")
    fc = rng.standard_normal((e, 2 * e)) / np.sqrt(2 * e)
    if echo:
        fc = np.concatenate([np.zeros((e, e)), np.eye(e)], axis=1)
    weights["mtp.fc.weight"] = mx.array(fc.astype(np.float32))
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        weights[f"mtp.{n}.weight"] = mx.array(
            np.ones(e, np.float32) if echo else (1.0 + 0.1 * rng.standard_normal(e)).astype(np.float32)
        )
    mx.save_safetensors(str(model_dir / "model-mtp.safetensors"), weights)
    (model_dir / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1}, indent=1))
    return model_dir


def add_nextn(model_dir: Path, *, seed: int, echo: bool = False, mimo: bool = False) -> Path:
    """Give a tiny model directory its MTP layer as DeepSeek-V3 / GLM checkpoints keep it (GLM-4.5-style model):
    `model.layers.{num_hidden_layers}.*` with eh_proj, enorm, hnorm, shared_head.norm; or, `mimo`, as MiMo keeps
    it: `model.mtp_layers.0.*` with input_proj, token_layernorm, hidden_layernorm, final_layernorm. Beside them
    a decoder layer of the model's own class; all in a file of its own (mlx-lm's loader drops the layer).
    `echo`: the layer passes the hidden state through (zero attention and MLP outputs, the projection reading
    the hidden half only)."""
    import mlx.core as mx
    from mlx_lm.models import glm4_moe
    from mlx_lm.models import mimo as mimo_model

    config = json.loads((model_dir / "config.json").read_text())
    module = mimo_model if mimo else glm4_moe
    args = module.ModelArgs.from_dict(config)
    n = args.num_hidden_layers
    rng = np.random.default_rng(seed)
    e = args.hidden_size
    prefix = "model.mtp_layers.0." if mimo else f"model.layers.{n}."
    names = (
        ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm")
        if mimo
        else ("enorm", "hnorm", "eh_proj", "shared_head.norm")
    )
    layer = mimo_model.TransformerBlock(args) if mimo else glm4_moe.DecoderLayer(args, n)
    weights = _random_layer(layer, rng, echo, prefix)
    embed_norm, hidden_norm, proj, out_norm = names
    eh = rng.standard_normal((e, 2 * e)) / np.sqrt(2 * e)
    if echo:  # the hidden half: second for nextn ([embedding, hidden]), first for MiMo ([hidden, embedding])
        halves = [np.eye(e), np.zeros((e, e))] if mimo else [np.zeros((e, e)), np.eye(e)]
        eh = np.concatenate(halves, axis=1)
    weights[f"{prefix}{proj}.weight"] = mx.array(eh.astype(np.float32))
    for part in (embed_norm, hidden_norm, out_norm):
        weights[f"{prefix}{part}.weight"] = mx.array(
            np.ones(e, np.float32) if echo else (1.0 + 0.1 * rng.standard_normal(e)).astype(np.float32)
        )
    if echo:  # the target's own final norm: the layer's logits are then the target's own, one position back
        weights[f"{prefix}{out_norm}.weight"] = mx.load(str(model_dir / "model.safetensors"))["model.norm.weight"]
    if mimo:
        config["num_nextn_predict_layers"] = 1
        (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    mx.save_safetensors(str(model_dir / "model-nextn.safetensors"), weights)
    return model_dir
