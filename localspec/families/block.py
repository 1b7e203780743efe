"""DFlash and DSpark: block drafters, given with --draft, that draft a whole block in one pass from the
target's hidden states: a GGUF on llama.cpp (both convert to one architecture; a DSpark file has a Markov
head), the drafter's Hugging Face directory (`dflash_config`) on MLX."""

from __future__ import annotations

from collections.abc import Mapping

from localspec.backends.registry import LLAMA, MLX
from localspec.decoding.drafters import Drafter
from localspec.families.base import BuildContext, CheckContext, DrafterFamily

DFLASH, DSPARK = "dflash", "dspark"
ARCHITECTURE = DFLASH


def _require(name: str, backend: str) -> None:
    if backend == LLAMA.name:
        from localspec.backends.llama import ext as llama_ext

        llama_ext.require_family(name)


def _check(name: str, ctx: CheckContext) -> None:
    assert ctx.draft is not None  # the registry checks a head_file family was given one
    if ctx.backend == MLX.name:
        from localspec.backends.mlx.backend import peek_sizes
        from localspec.backends.mlx.dflash import check_head as check_mlx_head

        hidden, _, layers = peek_sizes(ctx.target)  # a Hub id: checked again when the target is loaded
        check_mlx_head(name, ctx.draft, hidden, layers)
        return
    from localspec.backends.llama.dflash import check_head

    check_head(name, ctx.draft, ctx.target)


def _claims_config(config: Mapping[str, object], dspark: bool) -> bool:
    from localspec.backends.mlx.dflash import is_block_config, is_dspark_config

    return is_block_config(config) and is_dspark_config(config) == dspark


def _is_dspark(path: str) -> bool:
    """A Markov head's tensor (markov_w1) makes a block drafter a DSpark one; False when unreadable."""
    from localspec.errors import LocalspecError
    from localspec.gguf_meta import read_gguf_header

    try:
        header = read_gguf_header(path, check_size=False)
    except LocalspecError:
        return False
    return any(t.name.startswith("markov_w1") for t in header.tensors)


def _build(name: str, ctx: BuildContext) -> Drafter:
    assert ctx.head is not None  # the registry checked a head was given
    if ctx.backend == MLX.name:
        from localspec.backends.mlx.backend import MLXBackend
        from localspec.backends.mlx.dflash import BlockDrafter as MLXBlockDrafter

        assert isinstance(ctx.target, MLXBackend)
        return MLXBlockDrafter(ctx.target, ctx.head, method=name)
    from localspec.backends.llama.backend import LlamaCppBackend
    from localspec.backends.llama.dflash import BlockDrafter

    assert isinstance(ctx.target, LlamaCppBackend)  # the registry checked the backend
    return BlockDrafter(ctx.target, ctx.head, method=name, n_gpu_layers=ctx.n_gpu_layers)


def _family(name: str, summary: str, claims: bool) -> DrafterFamily:
    return DrafterFamily(
        name=name,
        summary=summary,
        build=lambda ctx: _build(name, ctx),
        needs="head_file",
        backends=(LLAMA.name, MLX.name),
        head_architectures=(ARCHITECTURE,),
        sidecar_prefix=f"{name}-",
        claims=(lambda path: _is_dspark(path) == claims),
        claims_config=(lambda config: _claims_config(config, claims)),
        require=lambda backend: _require(name, backend),
        check=lambda ctx: _check(name, ctx),
        auto_drives=True,
    )


DFLASH_FAMILY = _family(DFLASH, "a DFlash block drafter given with --draft", claims=False)
DSPARK_FAMILY = _family(DSPARK, "a DSpark block drafter (DFlash with a Markov head) given with --draft", claims=True)
