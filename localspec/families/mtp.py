"""MTP: the target's own multi-token-prediction layers draft ahead: a GGUF that keeps them (llama.cpp), or a
Qwen3.5 / Qwen3-Next checkpoint directory that keeps its mtp.* weights, or a DeepSeek-V3 / GLM-4.5 / MiMo one
that keeps its MTP layer (MLX)."""

from __future__ import annotations

from pathlib import Path

from localspec.backends.registry import LLAMA, MLX
from localspec.decoding.drafters import Drafter
from localspec.families.base import BuildContext, CheckContext, DrafterFamily

NAME = "mtp"


def _require(backend: str) -> None:
    if backend == LLAMA.name:
        from localspec.backends.llama import ext as llama_ext

        llama_ext.require_family(NAME)


def _check(ctx: CheckContext) -> None:
    if ctx.backend == MLX.name:
        _check_mlx(ctx.target)
        return
    from localspec.backends.llama.mtp import check_target

    check_target(ctx.target)


def _check_mlx(target: str) -> None:
    import json

    from localspec.backends.mlx.mtp import check_target
    from localspec.errors import ModelFileError

    directory = Path(target).expanduser()
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        raise ModelFileError(f"{target}: no readable config.json", "pass a model directory") from None
    check_target(directory, config)


def _claims_target(target: str) -> bool:
    """Whether the target's own GGUF declares MTP (nextn) layers: then the target file as --draft means them
    (False when it cannot be read: its loader says why)."""
    from localspec.errors import LocalspecError
    from localspec.gguf_meta import read_gguf_header

    if Path(target).expanduser().is_dir():
        try:
            _check_mlx(target)
        except LocalspecError:
            return False
        return True
    try:
        header = read_gguf_header(target, check_size=False)
    except LocalspecError:
        return False
    return int(header.metadata.get(f"{header.architecture}.nextn_predict_layers", 0) or 0) > 0


def _build(ctx: BuildContext) -> Drafter:
    if ctx.backend == MLX.name:
        from localspec.backends.mlx.backend import MLXBackend
        from localspec.backends.mlx.mtp import drafter

        assert isinstance(ctx.target, MLXBackend)
        return drafter(ctx.target)
    from localspec.backends.llama.backend import LlamaCppBackend
    from localspec.backends.llama.mtp import MtpDrafter

    assert isinstance(ctx.target, LlamaCppBackend)  # the registry checked the backend
    return MtpDrafter(ctx.target)


MTP = DrafterFamily(
    name=NAME,
    summary="the target's own MTP layers, for GGUFs that keep them",
    build=_build,
    needs="own_head",
    backends=(LLAMA.name, MLX.name),
    sidecar_prefix=f"{NAME}-",
    claims=_claims_target,
    require=_require,
    check=_check,
    target_load={"load_mtp": True},  # llama.cpp skips those layers otherwise (MLX reads them itself)
    auto_drives=True,
)
