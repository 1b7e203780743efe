"""EAGLE-3: a one-layer head, given with --draft, that reads three of the target's layers: a GGUF head on
llama.cpp, the head's Hugging Face directory (original or "speculators" layout) on MLX."""

from __future__ import annotations

from collections.abc import Mapping

from localspec.backends.registry import LLAMA, MLX
from localspec.decoding.drafters import Drafter
from localspec.families.base import BuildContext, CheckContext, DrafterFamily

NAME = "eagle3"


def _require(backend: str) -> None:
    if backend == LLAMA.name:
        from localspec.backends.llama import ext as llama_ext

        llama_ext.require_family(NAME)


def _check(ctx: CheckContext) -> None:
    assert ctx.draft is not None  # the registry checks a head_file family was given one
    if ctx.backend == MLX.name:
        from localspec.backends.mlx.backend import peek_sizes
        from localspec.backends.mlx.eagle3 import check_head as check_mlx_head

        hidden, vocab, _ = peek_sizes(ctx.target)  # a Hub id: checked again when the target is loaded
        check_mlx_head(ctx.draft, hidden, vocab)
        return
    from localspec.backends.llama.eagle3 import check_head

    check_head(ctx.draft, ctx.target)


def _claims_config(config: Mapping[str, object]) -> bool:
    from localspec.backends.mlx.eagle3 import is_eagle3_config

    return is_eagle3_config(config)


def _build(ctx: BuildContext) -> Drafter:
    assert ctx.head is not None  # the registry checked a head was given
    if ctx.backend == MLX.name:
        from localspec.backends.mlx.backend import MLXBackend
        from localspec.backends.mlx.eagle3 import Eagle3Drafter as MLXEagle3Drafter

        assert isinstance(ctx.target, MLXBackend)
        return MLXEagle3Drafter(ctx.target, ctx.head)
    from localspec.backends.llama.backend import LlamaCppBackend
    from localspec.backends.llama.eagle3 import Eagle3Drafter

    assert isinstance(ctx.target, LlamaCppBackend)  # the registry checked the backend
    return Eagle3Drafter(ctx.target, ctx.head, n_gpu_layers=ctx.n_gpu_layers)


EAGLE3 = DrafterFamily(
    name=NAME,
    summary="an EAGLE-3 head given with --draft",
    build=_build,
    needs="head_file",
    backends=(LLAMA.name, MLX.name),
    head_architectures=(NAME,),
    sidecar_prefix=f"{NAME}-",
    require=_require,
    check=_check,
    claims_config=_claims_config,
    auto_drives=True,
)
