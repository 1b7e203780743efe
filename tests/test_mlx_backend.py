"""The MLX backend on tiny random mlx-lm models built by the tests (see tests/mlx_tiny.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from localspec.errors import BackendUnavailableError

sys.path.insert(0, str(Path(__file__).parent))

PROMPT = "<|im_start|>user\nWrite a poem about the sea.<|im_end|>\n<|im_start|>assistant\n"


# -- without mlx: the install message ---------------------------------------------------------------


def test_missing_mlx_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec import pipeline
    from localspec.backends.mlx import backend
    from localspec.options import ModelOptions

    monkeypatch.setitem(sys.modules, "mlx", None)  # makes `import mlx...` raise ImportError
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    with pytest.raises(BackendUnavailableError) as e:
        backend.load("whatever", n_ctx=128)
    assert "pip install 'localspec[mlx]'" in str(e.value)
    # With mlx unimportable the backends' table says it is not installed (no monkeypatching of localspec).
    with pytest.raises(BackendUnavailableError) as e2:
        pipeline.load_pipeline(ModelOptions(target="t", draft="d", backend="mlx"))
    assert "localspec[mlx]" in str(e2.value)


# -- tiny models ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    import mlx_tiny

    root = tmp_path_factory.mktemp("mlx-models")
    target = mlx_tiny.build(root / "target", seed=1)
    return {
        "target": target,
        "noisy": mlx_tiny.build(root / "noisy", seed=2, base=target, noise=0.1),
        "other_vocab": mlx_tiny.build(root / "other", seed=3, swap=(97, 98)),
    }


def _load(path: Path, n_ctx: int = 1024):  # type: ignore[no-untyped-def]
    from localspec.backends.mlx import backend

    return backend.load(str(path), n_ctx=n_ctx, threads=None, n_gpu_layers=-1)


def _run(target, drafter, prompt: list[int], *, n: int, k: int = 4, temperature: float = 0.0):  # type: ignore[no-untyped-def]
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    config = GenerationConfig(max_tokens=n, num_draft=k, sampling=SamplingParams(temperature=temperature, seed=0))
    done = [e for e in generate(target, drafter, prompt, config) if isinstance(e, Done)][0]
    return done


@pytest.mark.mlx
def test_backend_basics(models: dict[str, Path]) -> None:
    from localspec.backends.base import Backend, ChatMessage

    b = _load(models["target"], n_ctx=64)
    assert isinstance(b, Backend)
    assert b.info.backend == "mlx" and b.info.architecture == "qwen2"
    assert b.n_vocab == 272 and b.n_ctx == 64
    assert b.eog_ids == frozenset({256, 257})  # <|im_end|> (eos) and <|endoftext|>
    ids = b.tokenize("a<|im_end|>")
    assert ids == [97, 256]
    assert b.tokenize("a<|im_end|>", parse_special=False)[0] == 97 and 256 not in b.tokenize(
        "<|im_end|>", parse_special=False
    )
    assert (
        b.apply_chat_template([ChatMessage("user", "hi")]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    logits = b.forward(ids)
    assert logits.shape == (2, 272) and logits.dtype == np.float32
    assert b.forward([98], all_logits=False).shape == (1, 272)
    assert list(b.cached_tokens) == [97, 256, 98]
    b.rollback(1)
    assert list(b.cached_tokens) == [97]
    from localspec.errors import ContextOverflowError

    with pytest.raises(ContextOverflowError):
        b.forward([1] * 64)
    b.close()


@pytest.mark.mlx
def test_detokenizer_is_utf8_safe(models: dict[str, Path]) -> None:
    b = _load(models["target"])
    text = " ünïcode 😀 and 中文"
    ids = b.tokenize(text)
    d = b.detokenizer()
    parts = [d.add([t]) for t in ids]
    assert "".join(parts) + d.flush() == text  # the leading space survives, unlike mlx-lm's BPE detokenizer
    assert all("\ufffd" not in p for p in parts)
    assert parts[ids.index(0xF0)] == ""  # a 4-byte character waits for its last byte
    assert (
        b.detokenizer().add(b.tokenize("<|im_start|>x<|im_end|>")) == "x"
    )  # control tokens render as nothing, as on llama.cpp


@pytest.mark.mlx
def test_speculative_greedy_equals_plain_greedy(models: dict[str, Path]) -> None:
    from localspec.decoding.drafters import ModelDrafter, NoDrafter

    target = _load(models["target"])
    prompt = target.tokenize(PROMPT)
    plain = _run(target, NoDrafter(), prompt, n=48)
    spec = _run(target, ModelDrafter(_load(models["noisy"])), prompt, n=48)
    assert spec.tokens == plain.tokens
    assert len(spec.tokens) == 48
    # The noisy draft agrees partly: some rounds accept, some reject.
    assert 0.2 < spec.stats.acceptance_rate < 0.95, spec.stats.acceptance_rate
    assert spec.stats.n_rounds < plain.stats.n_rounds


@pytest.mark.mlx
def test_self_draft_accepts_everything(models: dict[str, Path]) -> None:
    from localspec.decoding.drafters import ModelDrafter

    target = _load(models["target"])
    prompt = target.tokenize(PROMPT)
    done = _run(target, ModelDrafter(_load(models["target"])), prompt, n=40, k=4)
    assert done.stats.n_drafted > 0
    assert done.stats.n_accepted == done.stats.n_drafted


def _kv(backend) -> list[tuple[np.ndarray, np.ndarray]]:  # type: ignore[no-untyped-def]
    out = []
    for c in backend.cache:
        assert c.offset == len(backend.cached_tokens)
        keys, values = c.keys_and_values() if c.keys is not None else (None, None)
        out.append((np.asarray(keys), np.asarray(values)))
    return out


@pytest.mark.mlx
def test_rollback_leaves_cache_as_plain_decoding(models: dict[str, Path]) -> None:
    prompt = list(PROMPT.encode())[:20]
    a, b = _load(models["target"]), _load(models["target"])
    a.forward(prompt)
    b.forward(prompt)
    a.forward([10, 20, 30, 40])  # a verify pass of 4 whose last two are rejected
    a.rollback(len(prompt) + 2)
    b.forward([10, 20])
    assert list(a.cached_tokens) == list(b.cached_tokens)
    for (ka, va), (kb, vb) in zip(_kv(a), _kv(b)):
        assert ka.shape == kb.shape
        np.testing.assert_allclose(ka, kb, rtol=0, atol=1e-5)
        np.testing.assert_allclose(va, vb, rtol=0, atol=1e-5)
    # The trimmed positions are overwritten, not attended to: both continue identically.
    np.testing.assert_allclose(a.forward([50, 60]), b.forward([50, 60]), rtol=0, atol=1e-4)


@pytest.mark.mlx
def test_cache_after_speculative_run_matches_plain_run(models: dict[str, Path]) -> None:
    from localspec.decoding.drafters import ModelDrafter, NoDrafter

    spec_t, plain_t = _load(models["target"]), _load(models["target"])
    prompt = spec_t.tokenize(PROMPT)
    spec = _run(spec_t, ModelDrafter(_load(models["noisy"])), prompt, n=30)
    plain = _run(plain_t, NoDrafter(), prompt, n=30)
    assert spec.stats.n_accepted < spec.stats.n_drafted  # rollbacks after partial acceptance happened
    assert spec.tokens == plain.tokens
    assert list(spec_t.cached_tokens) == list(plain_t.cached_tokens)
    for (ka, va), (kb, vb) in zip(_kv(spec_t), _kv(plain_t)):
        np.testing.assert_allclose(ka, kb, rtol=0, atol=1e-4)
        np.testing.assert_allclose(va, vb, rtol=0, atol=1e-4)


@pytest.mark.mlx
def test_equals_mlx_lm_stream_generate(models: dict[str, Path]) -> None:
    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from mlx_lm.utils import load as mlx_load

    from localspec.decoding.drafters import ModelDrafter

    n, k = 40, 3
    model, tokenizer = mlx_load(str(models["target"]))
    draft_model, _ = mlx_load(str(models["noisy"]))
    target = _load(models["target"])
    prompt = target.tokenize(PROMPT)
    theirs = [
        r.token
        for r in stream_generate(
            model,
            tokenizer,
            prompt,
            max_tokens=n,
            draft_model=draft_model,
            num_draft_tokens=k,
            sampler=lambda x: mx.argmax(x, axis=-1),
        )
    ]
    ours = _run(target, ModelDrafter(_load(models["noisy"])), prompt, n=n, k=k)
    assert len(ours.tokens) >= 20
    if ours.stats.stop_reason == "eog":  # mlx-lm's stop set is narrower; it emits the stop token itself
        assert theirs[len(ours.tokens)] in target.eog_ids
    assert list(ours.tokens) == theirs[: len(ours.tokens)]


@pytest.mark.mlx
def test_pair_with_different_vocabularies_is_refused(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.backends.mlx import backend
    from localspec.errors import IncompatiblePairError
    from localspec.options import ModelOptions
    from localspec.pipeline import load_pipeline

    def no_load(*a, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("weights were loaded before the vocabulary check")

    monkeypatch.setattr(backend, "load", no_load)
    opts = ModelOptions(target=str(models["target"]), draft=str(models["other_vocab"]), backend="mlx")
    with pytest.raises(IncompatiblePairError) as e:
        load_pipeline(opts)
    assert "token text differs for 2 ids" in str(e.value)
    # Same tokenizer, different weights: accepted.
    assert backend.peek_vocab(str(models["target"])) == backend.peek_vocab(str(models["noisy"]))


GEMMA_TINY = {
    "model_type": "gemma3_text", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
    "num_attention_heads": 2, "head_dim": 16, "num_key_value_heads": 1, "vocab_size": 272,
    "query_pre_attn_scalar": 16, "sliding_window": 8, "sliding_window_pattern": 2,
}  # fmt: skip


@pytest.mark.mlx
def test_sliding_window_model_rolls_back_past_its_window(tmp_path: Path) -> None:
    """Gemma 3: a full cache with the windowed mask equals mlx-lm's rotating cache, and trims anywhere."""
    pytest.importorskip("mlx_lm")
    import mlx.core as mx
    import mlx_tiny
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    path = mlx_tiny.build(tmp_path / "gemma", seed=5, config=GEMMA_TINY)
    b = _load(path, n_ctx=256)
    assert b.n_ctx == 256 and "full cache" in b.info.device
    model, _ = load_model(path)
    ref_cache = make_prompt_cache(model)  # mlx-lm's own: rotating caches of 8 on the sliding layers
    seq = [int(t) for t in np.random.default_rng(0).integers(0, 256, 30)]
    ref = [np.asarray(model(mx.array([[t]]), cache=ref_cache)[0, -1]) for t in seq]  # one token at a time
    ours = [b.forward(seq[:5])[-1]]
    pos = 5
    while pos < len(seq):  # verify-like passes of 4, keeping 2 of them, well past the window
        out = b.forward(seq[pos : pos + 4] + [7, 7])
        b.rollback(pos + len(seq[pos : pos + 4]))
        ours += list(out[: len(seq[pos : pos + 4])])
        pos += 4
    for i in range(4, len(seq)):
        np.testing.assert_allclose(ours[i - 4], ref[i], rtol=0, atol=1e-4, err_msg=f"position {i}")


@pytest.mark.mlx
def test_unknown_sliding_window_model_caps_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlx_lm")
    import mlx_tiny

    from localspec.backends.mlx import backend

    monkeypatch.setattr(backend, "_WINDOW_IN_MASK", frozenset())  # as for a model not known to be exact
    b = _load(mlx_tiny.build(tmp_path / "gemma", seed=5, config=dict(GEMMA_TINY, sliding_window=32)), n_ctx=1024)
    assert b.n_ctx == 31 and "sliding-window cache cannot roll back" in b.info.device
    b.forward(list(range(20)))
    b.forward(list(range(11)))
    b.rollback(25)  # still exact: the window has not wrapped
    assert len(b.cached_tokens) == 25


@pytest.mark.mlx
def test_cli_run_on_mlx(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from localspec.cli import main

    common = ["run", "--backend", "mlx", "--target", str(models["target"]), "--draft", str(models["noisy"]), "--draft-method", "model",
              "--max-tokens", "16", "-k", "3", "--threads", "2", "--n-gpu-layers", "0", "--json"]  # fmt: skip
    assert main([*common, "Write a poem."]) == 0
    greedy = json.loads(capsys.readouterr().out)
    assert greedy["stats"]["backend"] == "mlx" and greedy["stats"]["rule"] == "greedy"
    assert greedy["stats"]["n_generated"] == 16 and greedy["stats"]["n_drafted"] > 0
    # Sampling through the exact rule: reproducible for a seed.
    sampled = [common + ["--temperature", "0.8", "--top-p", "0.95", "--seed", "7", "Write a poem."]] * 2
    outs = []
    for argv in sampled:
        assert main(argv) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["tokens"] == outs[1]["tokens"] and outs[0]["stats"]["rule"] == "exact"
