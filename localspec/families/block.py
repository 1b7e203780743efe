"""DFlash and DSpark: block drafters, given with --draft, that draft a whole block in one pass from the
target's hidden states (llama.cpp). Both convert to one GGUF architecture; a DSpark file has a Markov head."""

from __future__ import annotations

from localspec.backends.registry import LLAMA
from localspec.decoding.drafters import Drafter
from localspec.families.base import BuildContext, CheckContext, DrafterFamily

DFLASH, DSPARK = "dflash", "dspark"
ARCHITECTURE = DFLASH


def _require(name: str, backend: str) -> None:
    from localspec.backends import llama_ext

    llama_ext.require_family(name)


def _check(name: str, ctx: CheckContext) -> None:
    from localspec.backends.llama_dflash import check_head

    assert ctx.draft is not None  # the registry checks a head_file family was given one
    check_head(name, ctx.draft, ctx.target)


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
    from localspec.backends.llama_cpp import LlamaCppBackend
    from localspec.backends.llama_dflash import BlockDrafter

    assert isinstance(ctx.target, LlamaCppBackend) and ctx.head is not None  # the registry checked both
    return BlockDrafter(ctx.target, ctx.head, method=name, n_gpu_layers=ctx.n_gpu_layers)


def _family(name: str, summary: str, claims: bool) -> DrafterFamily:
    return DrafterFamily(
        name=name,
        summary=summary,
        build=lambda ctx: _build(name, ctx),
        needs="head_file",
        backends=(LLAMA.name,),
        head_architectures=(ARCHITECTURE,),
        sidecar_prefix=f"{name}-",
        claims=(lambda path: _is_dspark(path) == claims),
        require=lambda backend: _require(name, backend),
        check=lambda ctx: _check(name, ctx),
        auto_drives=True,
    )


DFLASH_FAMILY = _family(DFLASH, "a DFlash block drafter given with --draft", claims=False)
DSPARK_FAMILY = _family(DSPARK, "a DSpark block drafter (DFlash with a Markov head) given with --draft", claims=True)
