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
