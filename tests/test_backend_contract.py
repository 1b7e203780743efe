"""The error contract of localspec/backends/base.py, checked the same way on both backends (llama.cpp and MLX)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localspec.backends.base import Backend, BackendModule, sync_cache
from localspec.errors import ContextOverflowError, ModelFileError

sys.path.insert(0, str(Path(__file__).parent))

N_CTX = 256


@pytest.fixture(scope="module")
def mlx_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    import mlx_tiny

    return mlx_tiny.build(tmp_path_factory.mktemp("contract-mlx") / "m", seed=1)


@pytest.fixture(params=["llama", "mlx"])
def loaded(request: pytest.FixtureRequest) -> Iterator[tuple[BackendModule, Backend, str]]:
    from localspec.backends.registry import backend_spec

    if request.param == "llama":
        path = str(request.getfixturevalue("tiny_ggufs")[0])
    else:
        path = str(request.getfixturevalue("mlx_model_dir"))
    module = backend_spec(request.param).module()
    backend = module.load(path, n_ctx=N_CTX, threads=1)
    try:
        yield module, backend, path
    finally:
        backend.close()


def test_forward_of_nothing_is_a_caller_bug(loaded) -> None:  # type: ignore[no-untyped-def]
    _, backend, _ = loaded
    with pytest.raises(ValueError):
        backend.forward([])


def test_a_full_context_is_a_context_overflow_and_appends_nothing(loaded) -> None:  # type: ignore[no-untyped-def]
    _, backend, _ = loaded
    backend.forward([1] * (N_CTX - 2), all_logits=False)
    with pytest.raises(ContextOverflowError) as e:
        backend.forward([2, 3, 4])
    assert "--n-ctx" in e.value.hint
    assert len(backend.cached_tokens) == N_CTX - 2
    backend.forward([5, 6])  # exactly full is fine
    assert len(backend.cached_tokens) == N_CTX


def test_rollback_rules(loaded) -> None:  # type: ignore[no-untyped-def]
    _, backend, _ = loaded
    first = backend.forward([1, 2, 3, 4], all_logits=True).copy()
    with pytest.raises(ValueError):
        backend.rollback(-1)
    backend.rollback(10)  # beyond what is cached: nothing happens
    assert list(backend.cached_tokens) == [1, 2, 3, 4]
    backend.rollback(2)
    assert list(backend.cached_tokens) == [1, 2]
    again = backend.forward([3, 4], all_logits=True)
    np.testing.assert_allclose(again, first[2:], atol=1e-3)


def test_sync_cache_reuses_the_common_prefix(loaded) -> None:  # type: ignore[no-untyped-def]
    _, backend, _ = loaded
    keep, row = sync_cache(backend, [5, 6, 7, 8], logits=True)
    assert keep == 0 and row is not None and list(backend.cached_tokens) == [5, 6, 7, 8]
    keep, row2 = sync_cache(backend, [5, 6, 7, 8], logits=True)
    assert keep == 3 and row2 is not None  # the last token is fed again to get its logits
    np.testing.assert_allclose(row2, row, atol=1e-3)
    keep, none = sync_cache(backend, [5, 6, 9], logits=False)
    assert keep == 2 and none is None and list(backend.cached_tokens) == [5, 6, 9]


def test_loading_a_missing_model_is_a_model_file_error(loaded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    module, _, _ = loaded
    missing = str(tmp_path / "missing-model.gguf")
    with pytest.raises(ModelFileError):
        module.check_path(missing)
    with pytest.raises(ModelFileError):
        module.load(missing, n_ctx=N_CTX)
    with pytest.raises(ModelFileError):
        module.peek_vocab(missing)


def test_backend_modules_have_their_names(loaded) -> None:  # type: ignore[no-untyped-def]
    module, backend, path = loaded
    assert module.NAME in ("llama", "mlx")
    module.check_path(path)
    assert module.peek_vocab(path).n_vocab > 0
    assert backend.vocab_info().n_vocab == module.peek_vocab(path).n_vocab
