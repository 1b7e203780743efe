"""MTP: the target's own multi-token-prediction layers draft ahead (a GGUF that keeps them; llama.cpp)."""

from __future__ import annotations

from localspec.backends.registry import LLAMA
from localspec.decoding.drafters import Drafter
from localspec.families.base import BuildContext, CheckContext, DrafterFamily

NAME = "mtp"


def _require(backend: str) -> None:
    from localspec.backends import llama_ext

    llama_ext.require_family(NAME)


def _check(ctx: CheckContext) -> None:
    from localspec.backends.llama_mtp import check_target

    check_target(ctx.target)


def _claims_target(target: str) -> bool:
    """Whether the target's own GGUF declares MTP (nextn) layers: then the target file as --draft means them
    (False when it cannot be read: its loader says why)."""
    from localspec.errors import LocalspecError
    from localspec.gguf_meta import read_gguf_header

    try:
        header = read_gguf_header(target, check_size=False)
    except LocalspecError:
        return False
    return int(header.metadata.get(f"{header.architecture}.nextn_predict_layers", 0) or 0) > 0


def _build(ctx: BuildContext) -> Drafter:
    from localspec.backends.llama_cpp import LlamaCppBackend
    from localspec.backends.llama_mtp import MtpDrafter

    assert isinstance(ctx.target, LlamaCppBackend)  # the registry checked the backend
    return MtpDrafter(ctx.target)


MTP = DrafterFamily(
    name=NAME,
    summary="the target's own MTP layers, for GGUFs that keep them",
    build=_build,
    needs="own_head",
    backends=(LLAMA.name,),
    sidecar_prefix=f"{NAME}-",
    claims=_claims_target,
    require=_require,
    check=_check,
    target_load={"load_mtp": True},  # llama.cpp skips those layers otherwise
    auto_drives=True,
)
