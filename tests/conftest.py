"""Shared fixtures: generated tiny GGUF models and the cached real fixture models."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from fixture_models import fetch

    return fetch("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from fixture_models import fetch

    return fetch("gemma3-270m")


@pytest.fixture(scope="session")
def qwen_pair() -> tuple[Path, Path]:
    from fixture_models import fetch

    return fetch("qwen-1.5b"), fetch("qwen-0.5b")


@pytest.fixture(scope="session")
def tiny_ggufs(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> tuple[Path, Path, Path]:
    """(target, similar draft, unrelated model): tiny random llama GGUFs with SmolLM2's tokenizer."""
    from gguf_factory import write_tiny_llama

    d = tmp_path_factory.mktemp("tiny-gguf")
    target, draft, other = d / "tiny-target.gguf", d / "tiny-draft.gguf", d / "tiny-other.gguf"
    base = write_tiny_llama(target, smollm2_path, seed=0)
    write_tiny_llama(draft, smollm2_path, seed=1, base=base, noise=0.02)
    write_tiny_llama(other, smollm2_path, seed=2)
    return target, draft, other


# pyproject's timeout (900 s) bounds every test; a test not marked slow gets a tighter bound, so a hang
# (a gate never released, a worker never joined) fails that test in minutes instead of stalling CI.
# Only the test's own body counts: a first run may spend longer fetching the fixture models.
FAST_TEST_TIMEOUT = 240


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(FAST_TEST_TIMEOUT, func_only=True))


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """What starts outside a test's own fixtures (a module's server, started before them) keeps off the user's
    cache too: a directory for the whole session, which each test's own (_private_cost_cache) overrides."""
    d = tmp_path_factory.mktemp("session-cache")
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("LOCALSPEC_CACHE_DIR", str(d))
        yield d


@pytest.fixture(autouse=True)
def _private_cost_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Auto's remembered costs go to a fresh directory per test, never to the user's cache."""
    d = tmp_path_factory.mktemp("cost-cache")
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="session")
def hybrid_ggufs(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, tuple[Path, Path]]:
    """family -> (target, similar draft): tiny random recurrent/hybrid GGUFs with SmolLM2's tokenizer.
    mamba: recurrent in every layer, no llama.cpp snapshots; lfm2: short convolutions beside attention,
    with snapshots (n_rs_seq)."""
    from gguf_factory import write_tiny_lfm2, write_tiny_mamba

    d = tmp_path_factory.mktemp("hybrid-gguf")
    out: dict[str, tuple[Path, Path]] = {}
    # Draft noise chosen so that greedy drafts are partly accepted (some rounds reject) on both.
    for family, write, noise in (("mamba", write_tiny_mamba, 0.02), ("lfm2", write_tiny_lfm2, 0.06)):
        target, draft = d / f"{family}-target.gguf", d / f"{family}-draft.gguf"
        base = write(target, smollm2_path, seed=0)
        write(draft, smollm2_path, seed=1, base=base, noise=noise)
        out[family] = (target, draft)
    return out


@pytest.fixture(scope="session")
def eagle3_pair(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> tuple[Path, Path]:
    """(target, EAGLE-3 head made for it): a tiny random 4-layer llama and a head reading layers 0, 2, 3.
    The head's name starts with `eagle3-`, as llama.cpp's sidecar files do."""
    from gguf_factory import write_tiny_eagle3, write_tiny_llama

    d = tmp_path_factory.mktemp("eagle3-pair")
    target, head = d / "tiny-target-4l.gguf", d / "eagle3-tiny-head.gguf"
    write_tiny_llama(target, smollm2_path, seed=0, n_layer=4)
    write_tiny_eagle3(head, smollm2_path, target_layers=(0, 2, 3))
    return target, head
