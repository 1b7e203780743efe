"""EAGLE-3: a one-layer head, given with --draft, that reads three of the target's layers (llama.cpp)."""

from __future__ import annotations

from localspec.backends.registry import LLAMA
from localspec.decoding.drafters import Drafter
from localspec.families.base import BuildContext, CheckContext, DrafterFamily

NAME = "eagle3"


def _require() -> None:
    from localspec.backends import llama_ext

    llama_ext.require_family(NAME)


def _check(ctx: CheckContext) -> None:
    from localspec.backends.llama_eagle3 import check_head

    assert ctx.draft is not None  # the registry checks a head_file family was given one
    check_head(ctx.draft, ctx.target)


def _build(ctx: BuildContext) -> Drafter:
    from localspec.backends.llama_cpp import LlamaCppBackend
    from localspec.backends.llama_eagle3 import Eagle3Drafter

    assert isinstance(ctx.target, LlamaCppBackend) and ctx.head is not None  # the registry checked both
    return Eagle3Drafter(ctx.target, ctx.head, n_gpu_layers=ctx.n_gpu_layers)


EAGLE3 = DrafterFamily(
    name=NAME,
    summary="an EAGLE-3 head given with --draft",
    build=_build,
    needs="head_file",
    backends=(LLAMA.name,),
    head_architectures=(NAME,),
    sidecar_prefix=f"{NAME}-",
    require=_require,
    check=_check,
    auto_drives=True,
)
