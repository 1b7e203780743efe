"""Write tiny random GGUF models for fast real-llama.cpp tests: llama (or qwen2) targets, EAGLE-3 heads, DFlash
and DSpark block drafters, glm4moe targets with an MTP (nextn) layer, and the recurrent/hybrid families mamba
(every layer a selective state space) and lfm2 (short convolutions beside attention layers).

The tokenizer metadata (gpt2 BPE, 49,152 tokens, chat template) is copied from the SmolLM2 fixture,
so prompts tokenize like a real model; the weights are random, untied and small (a few MB). Tensor
names and shapes follow the vendored llama.cpp (src/models/mamba.cpp, src/models/lfm2.cpp; ggml shapes
are the numpy ones reversed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localspec.gguf_meta import read_gguf_header

_TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
)  # fmt: skip


def write_tiny_llama(
    path: Path,
    tokenizer_source: Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_ff: int = 128,
    scale: float = 0.5,
    base: dict[str, np.ndarray] | None = None,
    noise: float = 0.0,
    chatless: bool = False,
    arch: str = "llama",
    added: tuple[str, ...] = (),
    context_length: int = 2048,
) -> dict[str, np.ndarray]:
    """Write a random model to `path`; return its tensors (pass them as `base` with `noise` for a
    similar "draft" model). Weights are float32, so batched and single-token passes agree closely.
    `chatless`: no chat template, and no special token but token 0 as BOS and EOS (a base model of
    an unknown family). `arch`: "llama" or another architecture with the same tensors (e.g. "qwen2").
    `added`: control tokens with these texts after the vocabulary's own (e.g. a family's FIM tokens)."""
    meta = dict(read_gguf_header(tokenizer_source, full=True).metadata)
    if added:
        meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"], *added]
        meta["tokenizer.ggml.token_type"] = [*meta["tokenizer.ggml.token_type"], *(3 for _ in added)]  # CONTROL
    if chatless:
        meta.pop("tokenizer.chat_template", None)
        meta["tokenizer.ggml.bos_token_id"] = meta["tokenizer.ggml.eos_token_id"] = 0  # <|endoftext|> in SmolLM2's
        keep = {0}
        meta["tokenizer.ggml.token_type"] = [
            t if i in keep else 1 for i, t in enumerate(meta["tokenizer.ggml.token_type"])
        ]
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    tensors = _random_tensors(_tensor_shapes(n_vocab, n_embd, n_layer, n_ff), seed, scale, base, noise, n_embd)

    def hparams(w) -> None:  # type: ignore[no-untyped-def]
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head)
        w.add_rope_dimension_count(n_embd // n_head)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)

    _write(path, arch, f"tiny-{arch}-{seed}", meta, tensors, n_embd, n_layer, hparams, context_length)
    return tensors


def write_tiny_eagle3(
    path: Path,
    tokenizer_source: Path,
    *,
    target_layers: tuple[int, int, int],
    target_n_embd: int = 64,
    seed: int = 10,
    n_head: int = 4,
    n_ff: int = 128,
    draft_vocab: int | None = None,
    d2t_ids: list[int] | None = None,
    hidden_size: int | None = None,
) -> np.ndarray | None:
    """A random EAGLE-3 head (architecture `eagle3`, as llama.cpp's converter writes one): fc over three
    target layers, one decoder layer, its own lm_head; it embeds tokens with the target's weights.
    `draft_vocab`: a reduced head vocabulary of that many random ids mapped to target ids by a `d2t`
    tensor; `d2t_ids`: the same with these target ids.
    `hidden_size`: the target hidden size written in the metadata (default: target_n_embd).
    Returns the d2t map (target id per head id), None without one."""
    import gguf

    meta = dict(read_gguf_header(tokenizer_source, full=True).metadata)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    n_embd = target_n_embd  # the head embeds with the target's token_embd, so the widths agree
    rng = np.random.default_rng(seed)
    d2t = None
    n_out = n_vocab
    if draft_vocab is not None:
        d2t_ids = list(rng.choice(n_vocab, size=draft_vocab, replace=False))
    if d2t_ids is not None:
        d2t = np.array(sorted(d2t_ids), dtype=np.int64)
        n_out = len(d2t)

    def w_(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    tensors = {
        "fc.weight": w_(n_embd, 3 * target_n_embd),
        "output_norm.weight": np.ones(n_embd, np.float32),
        "output.weight": w_(n_out, n_embd, scale=8.0),  # peaked draft distributions
        "blk.0.attn_norm.weight": np.ones(n_embd, np.float32),
        "blk.0.attn_norm_2.weight": np.ones(n_embd, np.float32),
        "blk.0.attn_q.weight": w_(n_embd, 2 * n_embd),
        "blk.0.attn_k.weight": w_(n_embd, 2 * n_embd),
        "blk.0.attn_v.weight": w_(n_embd, 2 * n_embd),
        "blk.0.attn_output.weight": w_(n_embd, n_embd),
        "blk.0.ffn_norm.weight": np.ones(n_embd, np.float32),
        "blk.0.ffn_gate.weight": w_(n_ff, n_embd),
        "blk.0.ffn_up.weight": w_(n_ff, n_embd),
        "blk.0.ffn_down.weight": w_(n_embd, n_ff),
    }
    w = gguf.GGUFWriter(str(path), "eagle3")
    w.add_name(f"tiny-eagle3-{seed}")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_array("eagle3.target_layers", [int(i) for i in target_layers])
    w.add_uint32("eagle3.target_hidden_size", hidden_size or target_n_embd)
    for key in _TOKENIZER_KEYS:
        if key in meta:
            add_metadata(w, key, meta[key])
    for name, t in tensors.items():
        w.add_tensor(name, t)
    if d2t is not None:
        w.add_tensor("d2t", d2t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d2t


def write_tiny_dflash(
    path: Path,
    tokenizer_source: Path,
    *,
    target_layers: tuple[int, ...],
    target_n_embd: int = 64,
    seed: int = 20,
    n_layer: int = 1,
    n_head: int = 4,
    n_ff: int = 128,
    block_size: int = 8,
    dspark: bool = False,
    sample_from_anchor: bool = True,
    confidence: bool = False,
    markov_rank: int = 16,
    d2t_ids: list[int] | None = None,
    mask_token: int | None = -1,
    hidden_size: int | None = None,
    selector_top_k: int = 0,
) -> None:
    """A random DFlash drafter (architecture `dflash`, as llama.cpp's converter writes one; tensors as
    src/models/dflash.cpp loads them): fc over the target layers' inputs, an encoder norm, Qwen3-style
    decoder layers (q/k norms); it embeds tokens, and without `d2t_ids` computes logits, with the
    target's weights (ctx_other). `dspark`: a Markov head (markov_w1/w2), which makes it DSpark;
    `confidence`: DSpark's confidence head. `d2t_ids`: a reduced draft vocabulary of these target ids,
    with its own lm_head. `mask_token`: the block's mask id (-1: the vocabulary's last id; None: none
    written). `hidden_size`: the width written in the metadata (default: target_n_embd). `selector_top_k`
    > 0: a DFlash2 drafter (dynamic convolutions in each layer, a selector lattice of that many candidates)."""
    import gguf

    meta = dict(read_gguf_header(tokenizer_source, full=True).metadata)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    n_embd = target_n_embd  # the drafter embeds with the target's token_embd, so the widths agree
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)

    def w_(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    # numpy shapes: ggml's reversed ({n_embd_inp, n_embd} is (n_embd, n_embd_inp))
    tensors = {
        "fc.weight": w_(n_embd, len(target_layers) * target_n_embd),
        "enc.output_norm.weight": ones(n_embd),
        "output_norm.weight": ones(n_embd),
    }
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors |= {
            b + "attn_norm.weight": ones(n_embd),
            b + "attn_q.weight": w_(n_head * head_dim, n_embd),
            b + "attn_k.weight": w_(n_head * head_dim, n_embd),
            b + "attn_v.weight": w_(n_head * head_dim, n_embd),
            b + "attn_output.weight": w_(n_embd, n_head * head_dim),
            b + "attn_q_norm.weight": ones(head_dim),
            b + "attn_k_norm.weight": ones(head_dim),
            b + "ffn_norm.weight": ones(n_embd),
            b + "ffn_gate.weight": w_(n_ff, n_embd),
            b + "ffn_up.weight": w_(n_ff, n_embd),
            b + "ffn_down.weight": w_(n_embd, n_ff),
        }
    n_out = n_vocab
    d2t = None
    if d2t_ids is not None:
        d2t = np.array(sorted(d2t_ids), dtype=np.int64)
        n_out = len(d2t)
        tensors["output.weight"] = w_(n_out, n_embd, scale=8.0)  # peaked draft distributions
    conv_kernel, conv_group, selector_rank = 3, 16, 8
    if selector_top_k:
        projected = 2 * conv_kernel * (n_embd // conv_group)
        for i in range(n_layer):
            for part in ("attn", "ffn"):
                tensors[f"blk.{i}.{part}_conv_base"] = w_(2, conv_kernel, n_embd, scale=0.5)
                tensors[f"blk.{i}.{part}_conv_proj.weight"] = w_(projected, n_embd, scale=0.1)
        tensors["selector_predecessor.weight"] = w_(n_vocab, selector_rank, scale=4.0)
        tensors["selector_successor.weight"] = w_(n_vocab, selector_rank, scale=4.0)
        tensors["selector_hidden.weight"] = w_(selector_rank, n_embd)
    if dspark:
        tensors["markov_w1.weight"] = w_(n_vocab, markov_rank, scale=4.0)
        tensors["markov_w2.weight"] = w_(n_out, markov_rank, scale=4.0)
        if confidence:
            tensors["conf_proj.weight"] = w_(1, n_embd + markov_rank)
            tensors["conf_proj.bias"] = np.zeros(1, np.float32)

    w = gguf.GGUFWriter(str(path), "dflash")
    w.add_name(f"tiny-{'dspark' if dspark else 'dflash'}-{seed}")
    w.add_context_length(2048)
    w.add_embedding_length(hidden_size or n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_array("dflash.target_layers", [int(i) for i in target_layers])
    w.add_uint32("dflash.block_size", block_size)
    if selector_top_k:
        w.add_uint32("dflash.conv_kernel_size", conv_kernel)
        w.add_uint32("dflash.conv_group_size", conv_group)
        w.add_uint32("dflash.selector_rank", selector_rank)
        w.add_uint32("dflash.selector_top_k", selector_top_k)
    if dspark:
        w.add_bool("dflash.sample_from_anchor", sample_from_anchor)
        w.add_bool("dflash.has_confidence_head", confidence)
    for key in _TOKENIZER_KEYS:
        if key in meta:
            add_metadata(w, key, meta[key])
    if mask_token is not None:
        w.add_mask_token_id(n_vocab - 1 if mask_token < 0 else mask_token)
    for name, t in tensors.items():
        w.add_tensor(name, t)
    if d2t is not None:
        w.add_tensor("d2t", d2t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_mamba(
    path: Path,
    tokenizer_source: Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    d_state: int = 8,
    d_conv: int = 4,
    dt_rank: int = 4,
    scale: float = 0.5,
    base: dict[str, np.ndarray] | None = None,
    noise: float = 0.0,
) -> dict[str, np.ndarray]:
    """A random Mamba (v1) model: recurrent in every layer, and one llama.cpp keeps no snapshots for
    (llm_arch_supports_rs_rollback), so every rollback restores a checkpoint."""
    meta = dict(read_gguf_header(tokenizer_source, full=True).metadata)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    d_inner = 2 * n_embd  # llama.cpp supports only an expansion factor of 2
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, n_embd),
        "output_norm.weight": (n_embd,),
        "output.weight": (n_vocab, n_embd),
    }
    for i in range(n_layer):
        b = f"blk.{i}."
        shapes |= {
            b + "attn_norm.weight": (n_embd,),
            b + "ssm_in.weight": (2 * d_inner, n_embd),
            b + "ssm_conv1d.weight": (d_inner, d_conv),
            b + "ssm_conv1d.bias": (d_inner,),
            b + "ssm_x.weight": (dt_rank + 2 * d_state, d_inner),
            b + "ssm_dt.weight": (d_inner, dt_rank),
            b + "ssm_dt.bias": (d_inner,),
            b + "ssm_a": (d_inner, d_state),
            b + "ssm_d": (d_inner,),
            b + "ssm_out.weight": (n_embd, d_inner),
        }
    tensors = _random_tensors(shapes, seed, scale, base, noise, n_embd)
    if base is None:
        for i in range(n_layer):
            # A = -exp(A_log) < 0 keeps the state decaying (stable), as the converter writes it.
            tensors[f"blk.{i}.ssm_a"] = -np.exp(np.abs(tensors[f"blk.{i}.ssm_a"])).astype(np.float32)

    def hparams(w) -> None:  # type: ignore[no-untyped-def]
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        w.add_uint32("mamba.ssm.conv_kernel", d_conv)
        w.add_uint32("mamba.ssm.inner_size", d_inner)
        w.add_uint32("mamba.ssm.state_size", d_state)
        w.add_uint32("mamba.ssm.time_step_rank", dt_rank)
        w.add_layer_norm_rms_eps(1e-5)

    _write(path, "mamba", f"tiny-mamba-{seed}", meta, tensors, n_embd, n_layer, hparams)
    return tensors


def write_tiny_lfm2(
    path: Path,
    tokenizer_source: Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    layers: str = "cacac",
    l_cache: int = 3,
    scale: float = 0.5,
    base: dict[str, np.ndarray] | None = None,
    noise: float = 0.0,
) -> dict[str, np.ndarray]:
    """A random LFM2 model: `layers` spells each layer, c a short-convolution (recurrent) layer, a an
    attention layer. A hybrid llama.cpp keeps per-token snapshots for (n_rs_seq)."""
    meta = dict(read_gguf_header(tokenizer_source, full=True).metadata)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    head_dim = n_embd // n_head
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, n_embd),
        "token_embd_norm.weight": (n_embd,),  # LFM2's output norm (llama.cpp keeps the converter's name)
        "output.weight": (n_vocab, n_embd),
    }
    for i, kind in enumerate(layers):
        b = f"blk.{i}."
        shapes |= {
            b + "attn_norm.weight": (n_embd,),
            b + "ffn_norm.weight": (n_embd,),
            b + "ffn_gate.weight": (n_ff, n_embd),
            b + "ffn_up.weight": (n_ff, n_embd),
            b + "ffn_down.weight": (n_embd, n_ff),
        }
        if kind == "a":
            shapes |= {
                b + "attn_q_norm.weight": (head_dim,),
                b + "attn_k_norm.weight": (head_dim,),
                b + "attn_q.weight": (n_embd, n_embd),
                b + "attn_k.weight": (n_head_kv * head_dim, n_embd),
                b + "attn_v.weight": (n_head_kv * head_dim, n_embd),
                b + "attn_output.weight": (n_embd, n_embd),
            }
        else:
            shapes |= {
                b + "shortconv.conv.weight": (n_embd, l_cache),
                b + "shortconv.in_proj.weight": (3 * n_embd, n_embd),
                b + "shortconv.out_proj.weight": (n_embd, n_embd),
            }
    tensors = _random_tensors(shapes, seed, scale, base, noise, n_embd)

    def hparams(w) -> None:  # type: ignore[no-untyped-def]
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv([n_head_kv if kind == "a" else 0 for kind in layers])
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_uint32("lfm2.shortconv.l_cache", l_cache)

    _write(path, "lfm2", f"tiny-lfm2-{seed}", meta, tensors, n_embd, len(layers), hparams)
    return tensors


def write_tiny_glm4moe(
    path: Path,
    tokenizer_source: Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_expert: int = 2,
    n_ff_exp: int = 32,
    n_mtp: int = 1,
    mtp_declared: int | None = None,
    favoured: tuple[int, ...] = (),
    scale: float = 0.5,
    norm_spread: float = 0.0,
) -> dict[str, np.ndarray]:
    """A random GLM-4.5-style model (architecture `glm4moe`, src/models/glm4-moe.cpp), attention only:
    `n_layer` dense trunk layers (leading_dense_block_count = n_layer), then `n_mtp` MTP blocks, each an
    MoE decoder layer (`n_expert` experts, one used, one shared expert) with the nextn projections
    (eh_proj over [enorm(token embedding), hnorm(h)]) and the model's output as its head.
    `mtp_declared`: the nextn_predict_layers written in the metadata (default n_mtp; a file that
    declares MTP layers whose weights were dropped, as trunk-only quantizations do).
    `favoured`: token ids whose output rows are scaled up, so the trunk and the (random) MTP head both put
    most of their mass on them and drafts get accepted as well as rejected.
    `norm_spread`: every norm weight 1 + spread x N(0, 1) instead of one, so which hidden state feeds the MTP
    layer (before or after a norm) changes its drafts."""
    meta = dict(read_gguf_header(tokenizer_source, full=True).metadata)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    head_dim = n_embd // n_head
    n_kv = n_head_kv * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, n_embd),
        "output_norm.weight": (n_embd,),
        "output.weight": (n_vocab, n_embd),
    }
    for i in range(n_layer + n_mtp):
        b = f"blk.{i}."
        shapes |= {
            b + "attn_norm.weight": (n_embd,),
            b + "attn_q.weight": (n_head * head_dim, n_embd),
            b + "attn_k.weight": (n_kv, n_embd),
            b + "attn_v.weight": (n_kv, n_embd),
            b + "attn_output.weight": (n_embd, n_head * head_dim),
            b + "post_attention_norm.weight": (n_embd,),
        }
        if i < n_layer:
            shapes |= {
                b + "ffn_gate.weight": (n_ff, n_embd),
                b + "ffn_up.weight": (n_ff, n_embd),
                b + "ffn_down.weight": (n_embd, n_ff),
            }
            continue
        shapes |= {
            b + "ffn_gate_inp.weight": (n_expert, n_embd),
            b + "exp_probs_b.bias": (n_expert,),
            b + "ffn_gate_exps.weight": (n_expert, n_ff_exp, n_embd),
            b + "ffn_up_exps.weight": (n_expert, n_ff_exp, n_embd),
            b + "ffn_down_exps.weight": (n_expert, n_embd, n_ff_exp),
            b + "ffn_gate_shexp.weight": (n_ff_exp, n_embd),
            b + "ffn_up_shexp.weight": (n_ff_exp, n_embd),
            b + "ffn_down_shexp.weight": (n_embd, n_ff_exp),
            b + "nextn.eh_proj.weight": (n_embd, 2 * n_embd),
            b + "nextn.enorm.weight": (n_embd,),
            b + "nextn.hnorm.weight": (n_embd,),
        }
    tensors = _random_tensors(shapes, seed, scale, None, 0.0, n_embd)
    if norm_spread:
        rng = np.random.default_rng(seed + 1000)
        for name in [n for n in tensors if n.endswith("norm.weight")]:
            tensors[name] = (1.0 + norm_spread * rng.standard_normal(tensors[name].shape)).astype(np.float32)
    declared = n_mtp if mtp_declared is None else mtp_declared
    if favoured:  # flat logits, but for these tokens: they lead both heads' top-k, without certainty
        tensors["output.weight"] /= np.float32(8.0)
        tensors["output.weight"][list(favoured)] *= np.float32(6.0)

    def hparams(w) -> None:  # type: ignore[no-untyped-def]
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_rope_dimension_count(head_dim)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_uint32("glm4moe.leading_dense_block_count", n_layer)
        w.add_uint32("glm4moe.expert_count", n_expert)
        w.add_uint32("glm4moe.expert_used_count", 1)
        w.add_uint32("glm4moe.expert_shared_count", 1)
        w.add_uint32("glm4moe.expert_feed_forward_length", n_ff_exp)
        w.add_uint32("glm4moe.nextn_predict_layers", declared)

    # block_count counts the MTP blocks too (llama.cpp's n_layer_all); the trunk is the first n_layer.
    _write(path, "glm4moe", f"tiny-glm4moe-{seed}", meta, tensors, n_embd, n_layer + declared, hparams)
    return tensors


def _random_tensors(
    shapes: dict[str, tuple[int, ...]],
    seed: int,
    scale: float,
    base: dict[str, np.ndarray] | None,
    noise: float,
    n_embd: int,
) -> dict[str, np.ndarray]:
    """Norms at one, the rest Gaussian (or `base` plus noise: a similar draft); float32 throughout."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            t = np.ones(shape, dtype=np.float32)
        elif base is not None:
            t = base[name] + rng.standard_normal(shape).astype(np.float32) * noise
        else:
            t = (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)
        tensors[name] = t.astype(np.float32)
    if base is None:
        tensors["token_embd.weight"] *= np.float32(np.sqrt(n_embd) * 2)  # visible embeddings
        tensors["output.weight"] *= np.float32(8.0)  # peaked next-token distributions
    return tensors


def _write(
    path: Path,
    arch: str,
    name: str,
    meta: dict,
    tensors: dict[str, np.ndarray],
    n_embd: int,
    n_layer: int,
    hparams,
    context_length: int = 2048,
) -> None:  # type: ignore[no-untyped-def]
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    hparams(w)
    w.add_vocab_size(len(meta["tokenizer.ggml.tokens"]))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key in _TOKENIZER_KEYS:
        if key in meta:
            add_metadata(w, key, meta[key])
    for tname, t in tensors.items():
        w.add_tensor(tname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tensor_shapes(n_vocab: int, n_embd: int, n_layer: int, n_ff: int) -> dict[str, tuple[int, ...]]:
    # numpy shapes (row-major): GGUF stores them reversed, so [n_vocab, n_embd] is ggml's {n_embd, n_vocab}
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, n_embd),
        "output_norm.weight": (n_embd,),
        "output.weight": (n_vocab, n_embd),
    }
    for i in range(n_layer):
        b = f"blk.{i}."
        shapes |= {
            b + "attn_norm.weight": (n_embd,),
            b + "attn_q.weight": (n_embd, n_embd),
            b + "attn_k.weight": (n_embd, n_embd),
            b + "attn_v.weight": (n_embd, n_embd),
            b + "attn_output.weight": (n_embd, n_embd),
            b + "ffn_norm.weight": (n_embd,),
            b + "ffn_gate.weight": (n_ff, n_embd),
            b + "ffn_up.weight": (n_ff, n_embd),
            b + "ffn_down.weight": (n_embd, n_ff),
        }
    return shapes


def add_metadata(w, key: str, value: object) -> None:  # type: ignore[no-untyped-def]
    """Write one metadata value copied from a parsed header, with its GGUF type chosen from Python's."""
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, list):
        w.add_array(key, value)
    else:
        raise TypeError(f"unsupported metadata {key}: {type(value)}")
