"""Which model architectures keep a recurrent state, from metadata alone (no weights loaded), and what
that costs speculative decoding. `doctor` and the model picker say it before anything loads; the
backends find out for themselves at load (llama.cpp: llama_model_is_recurrent/hybrid; MLX: the cache
types) and put the same in ModelInfo.recurrent.

The names are llama.cpp's GGUF `general.architecture` values (vendored src/llama-arch.cpp,
llm_arch_is_recurrent / llm_arch_is_hybrid / llm_arch_supports_rs_rollback) and mlx-lm's
config.json `model_type` values.
"""

from __future__ import annotations

from typing import Literal

GGUF_RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
GGUF_HYBRID = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen3next",
    "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01",
})  # fmt: skip
# llama.cpp keeps per-token snapshots (n_rs_seq) for these: a verify pass is cut back without a restore.
GGUF_SNAPSHOTS = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe", "lfm2",
    "lfm2moe", "bailingmoe3",
})  # fmt: skip

MLX_RECURRENT = frozenset({"mamba", "mamba2", "rwkv7"})
MLX_HYBRID = frozenset({
    "lfm2", "lfm2_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "jamba", "granitemoehybrid", "nemotron_h",
    "recurrent_gemma", "plamo2", "kimi_linear", "bailing_moe_linear", "olmo_hybrid", "falcon_h1",
})  # fmt: skip


Naming = Literal["gguf", "hf"]  # GGUF `general.architecture` values, or config.json `model_type` values
GGUF: Naming = "gguf"
HF: Naming = "hf"
_TABLES: dict[Naming, tuple[frozenset[str], frozenset[str]]] = {
    GGUF: (GGUF_RECURRENT, GGUF_HYBRID),
    HF: (MLX_RECURRENT, MLX_HYBRID),
}


def kind(architecture: str | None, naming: Naming) -> str:
    """ "recurrent", "hybrid" or "" for an architecture name in a naming (GGUF's or config.json's)."""
    arch = (architecture or "").lower()
    recurrent, hybrid = _TABLES[naming]
    return "recurrent" if arch in recurrent else "hybrid" if arch in hybrid else ""


def describe(architecture: str | None, naming: Naming) -> str:
    """One line for doctor and the picker: what the architecture keeps and what a rollback costs; "" for
    attention-only models."""
    k = kind(architecture, naming)
    if not k:
        return ""
    arch = (architecture or "").lower()
    if naming == GGUF and arch in GGUF_SNAPSHOTS:
        cost = "llama.cpp keeps snapshots for the drafted tokens (memory for k copies of the recurrent state)"
    else:
        cost = "each rejected draft restores a saved state and feeds the kept tokens again (one extra small batch)"
    return f"{k} ({arch}): speculative decoding works; {cost}"


def describe_path(path: str) -> str:
    """describe() for a model file (GGUF header) or model directory (config.json); "" when unreadable or
    not local (a Hub repo id: nothing is downloaded to find out)."""
    import json
    from pathlib import Path

    p = Path(path).expanduser()
    try:
        if p.is_dir():
            return describe(json.loads((p / "config.json").read_text()).get("model_type"), HF)
        if not p.is_file():
            return ""
        from localspec.gguf_meta import read_gguf_header

        return describe(read_gguf_header(p, check_size=False).architecture, GGUF)
    except Exception:  # a model the pair check will reject with its own, better message
        return ""
