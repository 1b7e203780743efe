"""DFlash and DSpark: block drafters, given with --draft, that draft a whole block in one pass from the
target's hidden states: a GGUF on llama.cpp (both convert to one architecture; a DSpark file has a Markov
head), the drafter's Hugging Face directory (`dflash_config`) on MLX."""

from __future__ import annotations

from collections.abc import Mapping

from localspec.backends.registry import backend_spec
from localspec.decoding.drafters import Drafter
from localspec.families.base import BuildContext, CheckContext, DrafterFamily

DFLASH, DSPARK = "dflash", "dspark"
ARCHITECTURE = DFLASH


def _require(name: str, backend: str) -> None:
    backend_spec(backend).heads().require(name)


def _check(name: str, ctx: CheckContext) -> None:
    assert ctx.draft is not None  # the registry checks a head_file family was given one
    backend_spec(ctx.backend).heads().check(name, ctx.target, ctx.draft)


def _claims_config(config: Mapping[str, object], dspark: bool) -> bool:
    from localspec.backends.heads import is_block_config, is_dspark_config

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
    return backend_spec(ctx.backend).heads().build(name, ctx.target, ctx.head, ctx.n_gpu_layers)


def _family(name: str, summary: str, claims: bool) -> DrafterFamily:
    return DrafterFamily(
        name=name,
        summary=summary,
        build=lambda ctx: _build(name, ctx),
        needs="head_file",
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
