"""localspec.convert_gguf pieces that need no model: tensor names, config, the Q/K un-permutation."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.convert_gguf import _unpermute, hf_name, model_config
from localspec.errors import UnsupportedModelError


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py, LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("shape", [(64, 32), (64,)])
def test_unpermute_inverts_llama_cpp_permute(shape: tuple[int, ...]) -> None:
    w = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    permuted = _llama_cpp_permute(w, 4)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(_unpermute(permuted, 4), w)


def test_tensor_names() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("blk.3.attn_q.bias") == "model.layers.3.self_attn.q_proj.bias"
    assert hf_name("blk.11.ffn_down.weight") == "model.layers.11.mlp.down_proj.weight"
    assert hf_name("blk.0.attn_norm.weight") == "model.layers.0.input_layernorm.weight"
    assert hf_name("rope_freqs.weight") is None


def test_config_from_metadata() -> None:
    meta = {
        "general.architecture": "qwen2", "qwen2.block_count": 24, "qwen2.embedding_length": 896,
        "qwen2.feed_forward_length": 4864, "qwen2.attention.head_count": 14, "qwen2.attention.head_count_kv": 2,
        "qwen2.rope.freq_base": 1e6, "qwen2.attention.layer_norm_rms_epsilon": 1e-6, "qwen2.context_length": 32768,
        "tokenizer.ggml.eos_token_id": 151645,
    }  # fmt: skip
    cfg = model_config(meta, {"token_embd.weight", "output.weight"}, n_vocab=151936)
    assert cfg["model_type"] == "qwen2" and cfg["num_key_value_heads"] == 2 and cfg["vocab_size"] == 151936
    assert cfg["tie_word_embeddings"] is False and cfg["eos_token_id"] == 151645
    assert model_config(meta, {"token_embd.weight"}, n_vocab=151936)["tie_word_embeddings"] is True
    with pytest.raises(UnsupportedModelError):
        model_config({"general.architecture": "mamba"}, set(), n_vocab=10)


def test_glm4moe_names_and_config_keep_the_mtp_layer() -> None:
    """GLM-4.5's MoE and MTP tensors under the names mlx-lm's glm4_moe and localspec's nextn drafter read; the
    trunk's layer count without the MTP block; llama.cpp's routing defaults (no groups, scale 1)."""
    assert hf_name("blk.2.nextn.eh_proj.weight", "glm4moe") == "model.layers.2.eh_proj.weight"
    assert hf_name("blk.2.nextn.shared_head_norm.weight", "glm4moe") == "model.layers.2.shared_head.norm.weight"
    assert hf_name("blk.1.exp_probs_b.bias", "glm4moe") == "model.layers.1.mlp.gate.e_score_correction_bias"
    assert hf_name("blk.1.ffn_up_exps.weight", "glm4moe") == "model.layers.1.mlp.switch_mlp.up_proj.weight"
    assert hf_name("blk.1.post_attention_norm.weight", "glm4moe") == "model.layers.1.post_attention_layernorm.weight"
    assert hf_name("blk.1.nextn.eh_proj.weight") is None  # not a llama tensor
    meta = {
        "general.architecture": "glm4moe", "glm4moe.block_count": 3, "glm4moe.embedding_length": 64,
        "glm4moe.feed_forward_length": 128, "glm4moe.attention.head_count": 4, "glm4moe.attention.head_count_kv": 2,
        "glm4moe.rope.dimension_count": 8, "glm4moe.leading_dense_block_count": 1, "glm4moe.expert_count": 4,
        "glm4moe.expert_used_count": 2, "glm4moe.expert_shared_count": 1, "glm4moe.expert_feed_forward_length": 32,
        "glm4moe.nextn_predict_layers": 1,
    }  # fmt: skip
    cfg = model_config(meta, {"token_embd.weight", "output.weight", "blk.0.attn_q_norm.weight"}, n_vocab=300)
    assert cfg["model_type"] == "glm4_moe" and cfg["num_hidden_layers"] == 2 and cfg["num_nextn_predict_layers"] == 1
    assert cfg["partial_rotary_factor"] == 0.5 and cfg["head_dim"] == 16 and cfg["use_qk_norm"] is True
    assert cfg["routed_scaling_factor"] == 1.0 and cfg["norm_topk_prob"] is False and cfg["n_group"] == 1
    with pytest.raises(UnsupportedModelError, match="gating"):
        model_config({**meta, "glm4moe.expert_gating_func": 1}, set(), n_vocab=300)
