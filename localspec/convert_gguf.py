"""Turn a GGUF model into an mlx-lm model directory, so the same weights run on the MLX backend.

    python -m localspec.convert_gguf MODEL.gguf OUT_DIR [--dtype float16|float32]

Every tensor is dequantized with the `gguf` package (MLX cannot read K-quant GGUF blocks), renamed
to the Hugging Face names mlx-lm expects, and written as safetensors shards; config.json comes from
the GGUF metadata and the tokenizer is rebuilt from it (the same builders transformers uses for GGUF
tokenizers). Supported architectures: qwen2, llama and glm4moe (GLM-4.5: its MTP layer is kept, under the
Hugging Face names `model.layers.{N}.eh_proj` ..., which localspec's MLX MTP drafter reads and mlx-lm's own
loader drops). The output is unquantized: 2 bytes per weight in float16, 4 in float32; quantize it
afterwards with `mlx_lm.convert -q` if you want.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from localspec.errors import LocalspecError, ModelFileError, UnsupportedModelError
from localspec.gguf_meta import read_gguf_header

SUPPORTED = ("qwen2", "llama", "glm4moe")
_INSTALL_HINT = "install the MLX extra, which brings them: `pip install 'localspec[mlx]'`"
_SHARD_BYTES = 1 << 30

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# GLM-4.5 (glm4moe): a norm after attention, q/k norms, MoE layers (experts stacked as mlx-lm's switch_mlp) and
# the MTP layer's own tensors (llama.cpp's nextn.*, Hugging Face's names).
_GLM4MOE_NAMES = {
    **{k: v for k, v in _LAYER_NAMES.items() if k != "ffn_norm"},
    "post_attention_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "nextn.eh_proj": "eh_proj",
    "nextn.enorm": "enorm",
    "nextn.hnorm": "hnorm",
    "nextn.shared_head_norm": "shared_head.norm",
    "nextn.shared_head_head": "shared_head.head",
    "nextn.embed_tokens": "embed_tokens",
}
_BIAS_NAMES = {"exp_probs_b": "mlp.gate.e_score_correction_bias"}  # a "bias" tensor that is its own weight
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"^blk\.(\d+)\.([\w.]+)\.(weight|bias)$")
_TOP = re.compile(r"^(\w+)\.(weight|bias)$")


def hf_name(name: str, arch: str = "llama") -> str | None:
    """The mlx-lm (Hugging Face) name of a GGUF tensor, or None for tensors mlx-lm does not use."""
    if m := _BLOCK.match(name):
        layer, part, kind = m.groups()
        if arch == "glm4moe" and part in _BIAS_NAMES:
            return f"model.layers.{layer}.{_BIAS_NAMES[part]}"
        names = _GLM4MOE_NAMES if arch == "glm4moe" else _LAYER_NAMES
        return f"model.layers.{layer}.{names[part]}.{kind}" if part in names else None
    if m := _TOP.match(name):
        part, kind = m.groups()
        return f"{_TOP_NAMES[part]}.{kind}" if part in _TOP_NAMES else None
    return None


def model_config(meta: dict[str, Any], tensor_names: set[str], n_vocab: int) -> dict[str, Any]:
    arch = str(meta.get("general.architecture"))
    if arch not in SUPPORTED:
        raise UnsupportedModelError(
            f"cannot convert a {arch!r} GGUF to mlx-lm form (supported: {', '.join(SUPPORTED)})",
            "use the model with --backend llama, or get an mlx-lm version of it (mlx-community on the Hub)",
        )

    def key(k: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{k}", default)

    n_heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    config: dict[str, Any] = {
        "model_type": arch,
        "architectures": [{"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}.get(arch, "")],
        "hidden_size": hidden,
        "num_hidden_layers": int(key("block_count")),
        "intermediate_size": int(key("feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(key("attention.head_count_kv", n_heads)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 4096)),
        "vocab_size": n_vocab,
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    head_dim = key("rope.dimension_count")
    if arch == "llama" and head_dim is not None and int(head_dim) != hidden // n_heads:
        config["head_dim"] = int(head_dim)
    if arch == "glm4moe":
        config |= _glm4moe_config(meta, tensor_names, config)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    if eos is not None:
        config["eos_token_id"] = int(eos)
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if bos is not None:
        config["bos_token_id"] = int(bos)
    return config


def _glm4moe_config(meta: dict[str, Any], tensor_names: set[str], base: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm's glm4_moe arguments from llama.cpp's glm4moe metadata, with llama.cpp's defaults (no expert
    groups, unnormalised top-k weights unless expert_weights_norm, scale 1 where none is written)."""

    def key(k: str, default: Any = None) -> Any:
        return meta.get(f"glm4moe.{k}", default)

    gating = key("expert_gating_func")
    if gating not in (None, 0, 2):  # llama.cpp: 0 none (its default, sigmoid here), 1 softmax, 2 sigmoid
        raise UnsupportedModelError(f"cannot convert a glm4moe GGUF with expert gating function {gating}",
                                    "use the model with --backend llama")  # fmt: skip
    n_mtp = int(key("nextn_predict_layers", 0) or 0)
    head_dim = int(key("attention.key_length", base["hidden_size"] // base["num_attention_heads"]))
    n_rot = int(key("rope.dimension_count", head_dim))
    return {
        "model_type": "glm4_moe",
        "architectures": ["Glm4MoeForCausalLM"],
        "num_hidden_layers": base["num_hidden_layers"] - n_mtp,  # block_count counts the MTP layers too
        "num_nextn_predict_layers": n_mtp,
        "head_dim": head_dim,
        "partial_rotary_factor": n_rot / head_dim,
        "first_k_dense_replace": int(key("leading_dense_block_count", 0)),
        "n_routed_experts": int(key("expert_count")),
        "num_experts_per_tok": int(key("expert_used_count")),
        "n_shared_experts": int(key("expert_shared_count", 0)) or None,
        "moe_intermediate_size": int(key("expert_feed_forward_length")),
        "norm_topk_prob": bool(key("expert_weights_norm", False)),
        "routed_scaling_factor": float(key("expert_weights_scale", 0.0)) or 1.0,
        "n_group": 1,
        "topk_group": 1,
        "use_qk_norm": "blk.0.attn_q_norm.weight" in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "rope_scaling": None,
    }


def _glm4moe_heads(names: set[str], config: dict[str, Any]) -> dict[str, str]:
    """The MTP layer's shared head, where the GGUF leaves it out (llama.cpp then uses the model's final norm
    and output): {Hugging Face name it needs: the model tensor to copy}."""
    out: dict[str, str] = {}
    for i in range(
        config["num_hidden_layers"], config["num_hidden_layers"] + config.get("num_nextn_predict_layers", 0)
    ):
        b = f"blk.{i}.nextn."
        if b + "eh_proj.weight" not in names:
            continue
        if b + "shared_head_norm.weight" not in names:
            out[f"model.layers.{i}.shared_head.norm.weight"] = "output_norm.weight"
        if b + "shared_head_head.weight" not in names:
            out[f"model.layers.{i}.shared_head.head.weight"] = (
                "output.weight" if "output.weight" in names else "token_embd.weight"
            )
    return out


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation for llama models (convert_hf_to_gguf.py's `permute`)."""
    # llama.cpp viewed each head's rows as [2, half] and stored them as [half, 2]; view as stored, swap back.
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def iter_tensors(path: Path, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(mlx-lm name, dequantized float32 array in [out, in] order) for every tensor mlx-lm uses."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    arch = {"glm4_moe": "glm4moe"}.get(config["model_type"], config["model_type"])
    copies = _glm4moe_heads({t.name for t in reader.tensors}, config) if arch == "glm4moe" else {}
    for t in reader.tensors:
        name = hf_name(t.name, arch)
        if name is None:
            continue
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape(tuple(int(d) for d in reversed(t.shape)))  # GGUF lists dims fastest-first
        for copy in [c for c, source in copies.items() if source == t.name]:
            yield copy, w
        if config["model_type"] == "llama":
            if t.name.endswith("attn_q.weight") or t.name.endswith("attn_q.bias"):
                w = _unpermute(w, config["num_attention_heads"])
            elif t.name.endswith("attn_k.weight") or t.name.endswith("attn_k.bias"):
                w = _unpermute(w, config["num_key_value_heads"])
        yield name, w


def build_tokenizer(meta: dict[str, Any]) -> Any:
    """A transformers fast tokenizer rebuilt from the GGUF tokenizer metadata (no torch needed)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            add_gguf_special_tokens,
            select_tokenizer_builder,
            set_split_regex,
        )
    except ImportError as e:
        raise LocalspecError(
            f"rebuilding the tokenizer needs transformers 5 (transformers.integrations.gguf): {e}",
            "upgrade it with `pip install -U transformers`, or install the MLX extra: `pip install 'localspec[mlx]'`",
        ) from None

    fields = {
        name: meta[f"tokenizer.{k}"]
        for k, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{k}" in meta
    }
    tok = select_tokenizer_builder(str(meta.get("general.architecture")), fields.get("tokenizer_type"))(fields)
    tok = add_gguf_special_tokens(tok, fields)
    tok = set_split_regex(tok, fields)
    tokens = fields["tokens"]
    for attr, k in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("pad_token", "padding_token_id"),
                    ("unk_token", "unknown_token_id")):  # fmt: skip
        i = meta.get(f"tokenizer.ggml.{k}")
        if i is not None:
            setattr(tok, attr, tokens[int(i)])
    if "tokenizer.chat_template" in meta:
        tok.chat_template = meta["tokenizer.chat_template"]
    # llama.cpp's defaults: SPM vocabularies add BOS unless told otherwise, BPE ones do not.
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", fields.get("tokenizer_type") == "llama"))
    for attr, value in (
        ("add_bos_token", add_bos),
        ("add_eos_token", bool(meta.get("tokenizer.ggml.add_eos_token", False))),
    ):
        if hasattr(tok, attr):
            try:
                setattr(tok, attr, value)
            except (AttributeError, ValueError):
                pass
    return tok


def convert(gguf_path: str | Path, out_dir: str | Path, *, dtype: str = "float16", log: Any = None) -> Path:
    """Write an mlx-lm model directory for `gguf_path` at `out_dir` (atomically: a temp dir, then rename)."""
    src = Path(gguf_path).expanduser()
    out = Path(out_dir).expanduser()
    np_dtype = {"float16": np.float16, "float32": np.float32}.get(dtype)
    if np_dtype is None:
        raise LocalspecError(f"unknown dtype {dtype!r}", "choose float16 or float32")
    header = read_gguf_header(src, full=True)  # the tokenizer is rebuilt from it, merges included
    meta = header.metadata
    names = {t.name for t in header.tensors}
    embd = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise ModelFileError(f"{src} has no token_embd.weight tensor", "is this a language model GGUF?")
    config = model_config(meta, names, n_vocab=int(embd.shape[1]))
    if out.exists() and any(out.iterdir()):
        raise LocalspecError(f"{out} exists and is not empty", "choose a new output directory")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write_weights(src, tmp, config, np_dtype, log)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        build_tokenizer(meta).save_pretrained(str(tmp))
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_weights(src: Path, out: Path, config: dict[str, Any], np_dtype: Any, log: Any) -> None:
    try:
        from safetensors.numpy import save_file
    except ImportError as e:
        raise LocalspecError(f"writing safetensors needs the safetensors package: {e}", _INSTALL_HINT) from None

    shard: dict[str, np.ndarray] = {}
    size = 0
    files: list[Path] = []
    index: dict[str, str] = {}

    def flush() -> None:
        nonlocal shard, size
        if shard:
            f = out / f"model-{len(files) + 1:05d}.safetensors"
            save_file(shard, str(f))
            files.append(f)
            index.update({k: f.name for k in shard})
            if log:
                log(f"wrote {f.name} ({size / 2**20:.0f} MiB)")
        shard, size = {}, 0

    for name, w in iter_tensors(src, config):
        w = np.ascontiguousarray(w.astype(np_dtype))
        if size + w.nbytes > _SHARD_BYTES:
            flush()
        shard[name] = w
        size += w.nbytes
    flush()
    # Rename to the usual N-of-M pattern once the count is known (mlx-lm loads model*.safetensors).
    final: dict[str, str] = {}
    for i, f in enumerate(files, 1):
        name = f"model-{i:05d}-of-{len(files):05d}.safetensors"
        f.rename(out / name)
        final.update({k: name for k, v in index.items() if v == f.name})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": final}, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localspec.convert_gguf", description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", help="the .gguf model file")
    parser.add_argument("out", help="output directory (must not exist or be empty)")
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    args = parser.parse_args(argv)
    try:
        out = convert(args.gguf, args.out, dtype=args.dtype, log=lambda s: print(s, file=sys.stderr))
    except LocalspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
