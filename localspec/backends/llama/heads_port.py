"""llama.cpp's head drafters as the families' table reaches them (BackendSpec.heads_module): whether this build
can run a family, a pair of GGUF files checked from their headers, a drafter built on a loaded target. The
families name no backend: they ask this module, and each family's math is in this folder's modules."""

from __future__ import annotations

from localspec.backends.base import Backend
from localspec.backends.heads import HeadDrafter
from localspec.backends.llama import ext


def require(family: str) -> None:
    """BackendUnavailableError unless this llama.cpp build (and localspec) can run `family`."""
    ext.require_family(family)


def check(family: str, target: str, draft: str | None) -> None:
    """ModelFileError (or another LocalspecError) when `family` cannot run on these files."""
    if family == "mtp":
        from localspec.backends.llama.mtp import check_target

        check_target(target)
        return
    assert draft is not None  # the families' table checks a head file was given
    if family == "eagle3":
        from localspec.backends.llama.eagle3 import check_head

        check_head(draft, target)
        return
    from localspec.backends.llama.dflash import check_head as check_block

    check_block(family, draft, target)


def build(family: str, target: Backend, head: str | None, n_gpu_layers: int) -> HeadDrafter:
    """The family's drafter beside a loaded llama.cpp target (`head`: the head's GGUF, or the target's own)."""
    from localspec.backends.llama.backend import LlamaCppBackend

    assert isinstance(target, LlamaCppBackend)  # the families' table checked the backend
    if family == "mtp":
        from localspec.backends.llama.mtp import MtpDrafter

        return MtpDrafter(target)
    assert head is not None
    if family == "eagle3":
        from localspec.backends.llama.eagle3 import Eagle3Drafter

        return Eagle3Drafter(target, head, n_gpu_layers=n_gpu_layers)
    from localspec.backends.llama.dflash import BlockDrafter

    return BlockDrafter(target, head, method=family, n_gpu_layers=n_gpu_layers)
