"""MTP: the target's own multi-token-prediction layers draft ahead: a GGUF that keeps them (llama.cpp), or a
Qwen3.5 / Qwen3-Next checkpoint directory that keeps its mtp.* weights, or a DeepSeek-V3 / GLM-4.5 / MiMo one
that keeps its MTP layer (MLX)."""

from __future__ import annotations

from pathlib import Path

from localspec.backends.registry import backend_spec, spec_for_path
from localspec.decoding.drafters import Drafter
from localspec.families.base import BuildContext, CheckContext, DrafterFamily

NAME = "mtp"


def _require(backend: str) -> None:
    backend_spec(backend).heads().require(NAME)


def _check(ctx: CheckContext) -> None:
    backend_spec(ctx.backend).heads().check(NAME, ctx.target, ctx.draft)


def _claims_target(target: str) -> bool:
    """Whether the target's own GGUF declares MTP (nextn) layers: then the target file as --draft means them
    (False when it cannot be read: its loader says why)."""
    from localspec.errors import LocalspecError
    from localspec.gguf_meta import read_gguf_header

    if Path(target).expanduser().is_dir():  # a model directory: its backend reads the config
        spec = spec_for_path(target)
        if NAME not in spec.head_families:
            return False
        try:
            spec.heads().check(NAME, target, None)
        except LocalspecError:
            return False
        return True
    try:
        header = read_gguf_header(target, check_size=False)
    except LocalspecError:
        return False
    return int(header.metadata.get(f"{header.architecture}.nextn_predict_layers", 0) or 0) > 0


def _build(ctx: BuildContext) -> Drafter:
    return backend_spec(ctx.backend).heads().build(NAME, ctx.target, ctx.head, ctx.n_gpu_layers)


MTP = DrafterFamily(
    name=NAME,
    summary="the target's own MTP layers, for GGUFs that keep them",
    build=_build,
    needs="own_head",
    sidecar_prefix=f"{NAME}-",
    claims=_claims_target,
    require=_require,
    check=_check,
    target_load={"load_mtp": True},  # llama.cpp skips those layers otherwise (MLX reads them itself)
    auto_drives=True,
)
