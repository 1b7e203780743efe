"""EAGLE-3: a one-layer head, given with --draft, that reads three of the target's layers: a GGUF head on
llama.cpp, the head's Hugging Face directory (original or "speculators" layout) on MLX."""

from __future__ import annotations

from collections.abc import Mapping

from localspec.backends.registry import backend_spec
from localspec.decoding.drafters import Drafter
from localspec.families.base import BuildContext, CheckContext, DrafterFamily

NAME = "eagle3"


def _require(backend: str) -> None:
    backend_spec(backend).heads().require(NAME)


def _check(ctx: CheckContext) -> None:
    assert ctx.draft is not None  # the registry checks a head_file family was given one
    backend_spec(ctx.backend).heads().check(NAME, ctx.target, ctx.draft)


def _claims_config(config: Mapping[str, object]) -> bool:
    from localspec.backends.heads import is_eagle3_config

    return is_eagle3_config(config)


def _build(ctx: BuildContext) -> Drafter:
    assert ctx.head is not None  # the registry checked a head was given
    return backend_spec(ctx.backend).heads().build(NAME, ctx.target, ctx.head, ctx.n_gpu_layers)


EAGLE3 = DrafterFamily(
    name=NAME,
    summary="an EAGLE-3 head given with --draft",
    build=_build,
    needs="head_file",
    head_architectures=(NAME,),
    sidecar_prefix=f"{NAME}-",
    require=_require,
    check=_check,
    claims_config=_claims_config,
    auto_drives=True,
)
