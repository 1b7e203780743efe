"""Tiny random mlx-lm models, written to disk as real model directories, for the MLX backend tests.

The tokenizer is byte-level BPE over the 256 bytes (no merges) plus ChatML specials, so any text
round-trips and the model directory loads through mlx-lm's own loader. Embeddings are untied: a
tied tiny model echoes its input, which makes any draft look good.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
N_VOCAB = 272  # 256 bytes + 3 specials, padded like real models pad their embeddings

CONFIG = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": N_VOCAB,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}

# Hybrid and recurrent families (mlx-lm's ArraysCache layers): Qwen3.5 (Gated DeltaNet beside attention
# every second layer) and Mamba (recurrent in every layer). Untied, like CONFIG.
QWEN35_CONFIG = {
    "model_type": "qwen3_5", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": N_VOCAB,
    "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "full_attention_interval": 2, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}  # fmt: skip
MAMBA_CONFIG = {
    "model_type": "mamba", "vocab_size": N_VOCAB, "hidden_size": 32, "intermediate_size": 64, "state_size": 4,
    "num_hidden_layers": 2, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True, "time_step_rank": 4,
    "tie_word_embeddings": False,
}  # fmt: skip


def write_tokenizer(out: Path, *, swap: tuple[int, int] | None = None) -> None:
    """A byte-level tokenizer; `swap` exchanges two byte tokens' ids (a different vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = [bytes_to_unicode()[b] for b in range(256)]
    if swap is not None:
        a, b = swap
        alphabet[a], alphabet[b] = alphabet[b], alphabet[a]
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIALS}, replace_extra_special_tokens=False)
    fast.save_pretrained(str(out))


def build(
    out: Path,
    *,
    seed: int,
    base: Path | None = None,
    noise: float = 0.0,
    config: dict | None = None,
    swap: tuple[int, int] | None = None,
) -> Path:
    """Write a model dir. With `base`, copy its weights and add Gaussian noise of `noise` x each tensor's std."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    cfg = dict(CONFIG if config is None else config)
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    if base is not None:
        weights = mx.load(str(base / "model.safetensors"))
        # Noise relative to each tensor's spread, so every layer is perturbed alike.
        weights = {k: v + noise * mx.std(v) * mx.random.normal(v.shape) for k, v in weights.items()}
    else:
        model_class, args_class = _get_classes(cfg)
        model = model_class(args_class.from_dict(cfg))
        # Wider than the default init so the logits are peaked, like a trained model's.
        weights = {k: _init(k, v.shape) for k, v in tree_flatten(model.parameters())}
        for k in [k for k in weights if k.endswith("lm_head.weight")]:  # qwen3_5 nests it in language_model
            weights[k] = weights[k] * 4.0
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(out, swap=swap)
    return out


def _init(name: str, shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    import mlx.core as mx

    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * mx.random.normal(shape)
    if len(shape) == 1:  # biases
        return 0.1 * mx.random.normal(shape)
    return mx.random.normal(shape) / shape[-1] ** 0.5


# A DeepSeek-V3-style MoE model (GLM-4.5): routed and shared experts after a first dense layer; it declares
# one nextn (MTP) layer, which tests/mlx_heads.add_nextn writes.
GLM4_MOE_CONFIG = {
    "model_type": "glm4_moe", "vocab_size": N_VOCAB, "hidden_size": 64, "intermediate_size": 128,
    "max_position_embeddings": 4096, "moe_intermediate_size": 32, "norm_topk_prob": True, "num_attention_heads": 4,
    "n_group": 1, "head_dim": 16, "topk_group": 1, "n_shared_experts": 1, "n_routed_experts": 4,
    "routed_scaling_factor": 1.0, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "use_qk_norm": True,
    "tie_word_embeddings": False, "attention_bias": False, "partial_rotary_factor": 0.5, "num_nextn_predict_layers": 1,
}  # fmt: skip

# MiMo (Qwen2-like) declaring one MTP layer, kept as model.mtp_layers.0.* (tests/mlx_heads.add_mimo_mtp).
MIMO_CONFIG = {**CONFIG, "model_type": "mimo", "architectures": ["MiMoForCausalLM"], "num_hidden_layers": 2,
               "num_nextn_predict_layers": 1}  # fmt: skip
