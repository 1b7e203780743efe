"""The context without --n-ctx: the model's trained context (at most AUTO_MAX_N_CTX), bounded by the memory
its KV caches need, said at start; on a tiny GGUF trained for 32k, a 17k-token prompt is served, and one
beyond the context is still the clear 400."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.context_size import (
    AUTO_MAX_N_CTX,
    FALLBACK_N_CTX,
    ContextChoice,
    ModelShape,
    choose_n_ctx,
    memory_bound,
    model_shape,
)

TRAINED = 32768


@pytest.fixture(scope="module")
def trained_32k(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    from gguf_factory import write_tiny_llama

    path = tmp_path_factory.mktemp("ctx") / "tiny-32k.gguf"
    write_tiny_llama(path, smollm2_path, seed=0, context_length=TRAINED)
    return path


def test_the_shape_of_a_gguf_and_of_an_mlx_config(trained_32k: Path, tmp_path: Path) -> None:
    shape = model_shape(str(trained_32k))
    # 2 layers x 4 KV heads x (16 + 16) dims x 2 bytes
    assert shape.trained == TRAINED and shape.kv_bytes_per_token == 2 * 4 * 32 * 2
    assert shape.file_bytes == trained_32k.stat().st_size
    config = {"num_hidden_layers": 28, "hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
              "max_position_embeddings": 40960}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    mlx = model_shape(str(tmp_path))
    assert mlx == ModelShape(40960, 28 * 2 * 2 * 128 * 2, 1000)
    assert model_shape(str(tmp_path / "missing")) == ModelShape(None, None, 0)


def test_the_memory_bound_counts_every_cache_and_every_copy() -> None:
    gb = 1_000_000_000
    shapes = [ModelShape(32768, 100_000, 2 * gb), ModelShape(32768, 20_000, gb)]
    # (0.8 x 10 GB - 3 GB) / 2 for the caches, over 120 kB per token, rounded down to 256
    assert memory_bound(shapes, 1, 10 * gb) == int(2.5 * gb / 120_000) // 256 * 256
    assert memory_bound(shapes, 5, 10 * gb) == int(2.5 * gb / 600_000) // 256 * 256  # serve --parallel 4
    assert memory_bound(shapes, 1, None) is None and memory_bound([ModelShape(None, None, 0)], 1, gb) is None
    assert memory_bound(shapes, 1, gb) == 0  # the files alone do not fit: choose_n_ctx keeps the smallest


def test_the_choice_and_its_note(trained_32k: Path, tmp_path: Path) -> None:
    choice = choose_n_ctx(str(trained_32k))
    assert choice.n_ctx == TRAINED and choice.trained == TRAINED  # the tiny model's caches fit anywhere
    assert choice.note.startswith(f"context {TRAINED:,} tokens: the target's trained context ({TRAINED:,} tokens)")
    assert "the free memory holds the KV caches of about" in choice.note
    long = ContextChoice(AUTO_MAX_N_CTX, 131072, 10_000_000)
    assert f"at most {AUTO_MAX_N_CTX:,}" in long.note
    (tmp_path / "config.json").write_text("{}")
    assert choose_n_ctx(str(tmp_path)).n_ctx == FALLBACK_N_CTX  # the model names no trained context


def test_parallel_counts_its_sequences(trained_32k: Path) -> None:
    from localspec.cli import build_parser
    from localspec.options import model_options

    for argv, copies in ((["--parallel", "3"], 4), ([], 1), (["--parallel", "1"], 1)):
        args = build_parser().parse_args(["serve", "--target", str(trained_32k), *argv])
        opts = model_options(args)
        assert opts.n_ctx is None and opts.kv_copies == copies
    args = build_parser().parse_args(["run", "--target", str(trained_32k), "--n-ctx", "1024", "hi"])
    assert model_options(args).n_ctx == 1024


def test_serve_without_n_ctx_takes_a_17k_prompt_on_a_model_trained_for_32k(trained_32k: Path) -> None:
    from test_serve_inprocess import served

    with served("--target", str(trained_32k), "--draft-method", "none", "--threads", "2") as s:
        assert s.pipeline.target.n_ctx == TRAINED
        assert any(n.startswith(f"context {TRAINED:,} tokens") for n in s.pipeline.notes)
        words = "the agent reads a long prompt of tools and rules " * 1800
        n = len(s.pipeline.target.tokenize(words, add_special=False))
        assert 16_000 < n < 20_000
        body = {"messages": [{"role": "user", "content": words}], "max_tokens": 2}
        r = s.post("/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > 16_000
        too_long = {"messages": [{"role": "user", "content": words * 2}], "max_tokens": 2}
        r = s.post("/v1/chat/completions", too_long)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert f"maximum context length is {TRAINED}" in r.json()["error"]["message"]


@pytest.mark.mlx
def test_an_mlx_model_gets_its_trained_context(tmp_path: Path) -> None:
    """mlx-lm's config.json says the trained context (max_position_embeddings: 4096 in the tiny model's)."""
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    from mlx_tiny import build

    from localspec.options import ModelOptions
    from localspec.pipeline import load_pipeline

    config = json.loads((build(tmp_path / "m", seed=0) / "config.json").read_text())
    pipeline = load_pipeline(ModelOptions(target=str(tmp_path / "m"), backend="mlx", draft_method="none", n_ctx=None))
    try:
        assert pipeline.target.n_ctx == config["max_position_embeddings"] == pipeline.options.n_ctx
        assert pipeline.notes[-1].startswith("context 4,096 tokens: the target's trained context")
    finally:
        pipeline.close()
