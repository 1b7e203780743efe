"""Hybrid and recurrent models on the MLX backend: tiny random mlx-lm Qwen3.5 (Gated DeltaNet beside
attention) and Mamba models. Their ArraysCache layers cannot be trimmed; the backend keeps their state
before a batch and restores it, re-feeding the kept tokens (localspec/backends/mlx/backend.py).

MLX on the CPU computes in float32: batched and one-token passes agree to about 1e-5 here; TOL is far
above that and far below what a stale recurrent state gives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.mlx

FAMILIES = ("qwen3_5", "mamba")
TOL = 2e-3


@pytest.fixture(scope="module")
def hybrid_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    import mlx_tiny

    root = tmp_path_factory.mktemp("mlx-hybrid")
    out = {}
    for family, config in (("qwen3_5", mlx_tiny.QWEN35_CONFIG), ("mamba", mlx_tiny.MAMBA_CONFIG)):
        target = mlx_tiny.build(root / f"{family}-target", seed=1, config=config)
        draft = mlx_tiny.build(root / f"{family}-draft", seed=2, base=target, noise=0.1, config=config)
        out[family] = (target, draft)
    return out


def _load(path: Path, n_ctx: int = 512):  # type: ignore[no-untyped-def]
    from localspec.backends.mlx import backend

    return backend.load(str(path), n_ctx=n_ctx)


def _run(target, drafter, prompt: list[int], *, n: int, k: int = 4, **sampling):  # type: ignore[no-untyped-def]
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    config = GenerationConfig(max_tokens=n, num_draft=k, sampling=SamplingParams(**sampling))
    done = list(generate(target, drafter, prompt, config))[-1]
    assert isinstance(done, Done)
    return done


def _plain_logits(backend, tokens: list[int]) -> np.ndarray:  # type: ignore[no-untyped-def]
    backend.rollback(0)
    row = backend.forward(tokens[:1], all_logits=False)[-1]
    for t in tokens[1:]:
        row = backend.forward([t], all_logits=False)[-1]
    return np.array(row)


@pytest.mark.parametrize("family", FAMILIES)
def test_loads_and_says_it_is_hybrid(hybrid_models, family: str) -> None:  # type: ignore[no-untyped-def]
    b = _load(hybrid_models[family][0])
    kind = "hybrid" if family == "qwen3_5" else "recurrent"
    assert b.info.recurrent.startswith(f"{kind} ({family})")


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request: pytest.FixtureRequest, hybrid_models):  # type: ignore[no-untyped-def]
    from localspec.decoding.drafters import NoDrafter

    t_path, d_path = hybrid_models[request.param]
    target, draft = _load(t_path), _load(d_path)
    prompt = target.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n")
    plain = _run(target, NoDrafter(), prompt, n=32)
    return target, draft, prompt, plain


@pytest.mark.parametrize("k", range(1, 9))
def test_speculative_greedy_equals_plain_greedy(loaded, k: int) -> None:  # type: ignore[no-untyped-def]
    from localspec.decoding.drafters import ModelDrafter, NgramDrafter

    target, draft, prompt, plain = loaded
    target.rollback_routes.clear()
    spec = _run(target, ModelDrafter(draft), prompt, n=32, k=k)
    ngram = _run(target, NgramDrafter(), prompt, n=32, k=k)
    assert spec.tokens == plain.tokens
    assert ngram.tokens == plain.tokens
    assert spec.stats.n_drafted > 0 and spec.stats.n_accepted < spec.stats.n_drafted
    assert target.rollback_routes["restore"] > 0 and target.rollback_routes["refused"] == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_after_a_partial_round_the_next_logits_equal_plain_decoding(hybrid_models, family: str) -> None:  # type: ignore[no-untyped-def]
    b = _load(hybrid_models[family][0])
    prompt = b.tokenize("The quick brown fox")
    drafts = b.tokenize(" jumps", add_special=False)[:5]
    b.forward(prompt, all_logits=False)
    n_before = len(b.cached_tokens)
    b.forward(drafts)
    b.rollback(n_before + 2)
    assert b.rollback_routes == {"restore": 1}
    after = np.array(b.forward([120], all_logits=False)[-1])
    np.testing.assert_allclose(after, _plain_logits(b, [*prompt, *drafts[:2], 120]), atol=TOL)


def test_rollback_before_the_saved_state_is_refused_clearly(hybrid_models) -> None:  # type: ignore[no-untyped-def]
    from localspec.backends.base import sync_cache
    from localspec.errors import UnsupportedModelError

    b = _load(hybrid_models["qwen3_5"][0])
    prompt = b.tokenize("The quick brown fox")
    b.forward(prompt, all_logits=False)
    b.checkpoint()
    for t in (100, 101, 102):
        b.forward([t], all_logits=False)
    assert not b.can_rollback(len(prompt) - 2) and b.can_rollback(len(prompt) + 1)
    with pytest.raises(UnsupportedModelError) as e:
        b.rollback(len(prompt) - 2)
    assert "recurrent layers" in e.value.message and f"saved at {len(prompt)} tokens" in e.value.message
    keep, row = sync_cache(b, [*prompt[:-2], 50], logits=True)
    assert keep == 0 and row is not None
    np.testing.assert_allclose(row, _plain_logits(b, [*prompt[:-2], 50]), atol=TOL)


@pytest.mark.slow  # about 4 minutes on a busy 2-core CPU
def test_exact_rule_through_a_hybrid_target_keeps_its_distribution(hybrid_models) -> None:  # type: ignore[no-untyped-def]
    from test_verify import joint_check

    from localspec.decoding.drafters import ModelDrafter
    from localspec.sampling import SamplingParams, probabilities

    window, k = 3, 2
    target, draft = _load(hybrid_models["qwen3_5"][0]), _load(hybrid_models["qwen3_5"][1])
    prompt = target.tokenize("The number")
    sampling = SamplingParams(temperature=1.5, top_k=2)
    expected: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == window:
            expected[prefix] = prob
            return
        p = probabilities(_plain_logits(target, [*prompt, *prefix]), sampling)
        for x in np.flatnonzero(p):
            walk((*prefix, int(x)), prob * float(p[x]))

    walk((), 1.0)
    drafter = ModelDrafter(draft)

    def draw(seed: int) -> tuple[int, ...]:
        return _run(target, drafter, prompt, n=window, k=k, temperature=1.5, top_k=2, seed=seed).tokens

    failure = joint_check(draw, expected, 800)
    assert failure is None, failure
    assert target.rollback_routes["restore"] > 0
