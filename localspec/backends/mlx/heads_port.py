"""MLX's head drafters as the families' table reaches them (BackendSpec.heads_module): a head's Hugging Face
directory (or the target's own MTP layers) checked from config.json before any weights load, and a drafter built
on a loaded target. Every family runs wherever mlx-lm does, so `require` has nothing to refuse."""

from __future__ import annotations

import json
from pathlib import Path

from localspec.backends.base import Backend
from localspec.backends.heads import HeadDrafter
from localspec.errors import ModelFileError


def require(family: str) -> None:
    """Every head family runs on any mlx-lm install."""


def check(family: str, target: str, draft: str | None) -> None:
    """ModelFileError (or another LocalspecError) when `family` cannot run on these directories."""
    if family == "mtp":
        _check_mtp(target)
        return
    from localspec.backends.mlx.backend import peek_sizes

    assert draft is not None  # the families' table checks a head was given
    hidden, vocab, layers = peek_sizes(target)  # a Hub id: checked again when the target is loaded
    if family == "eagle3":
        from localspec.backends.mlx.eagle3 import check_head

        check_head(draft, hidden, vocab)
        return
    from localspec.backends.mlx.dflash import check_head as check_block

    check_block(family, draft, hidden, layers)


def _check_mtp(target: str) -> None:
    from localspec.backends.mlx.mtp import check_target

    directory = Path(target).expanduser()
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        raise ModelFileError(f"{target}: no readable config.json", "pass a model directory") from None
    check_target(directory, config)


def build(family: str, target: Backend, head: str | None, n_gpu_layers: int) -> HeadDrafter:
    """The family's drafter beside a loaded MLX target (`head`: the head's directory; MTP reads the target)."""
    from localspec.backends.mlx.backend import MLXBackend

    assert isinstance(target, MLXBackend)  # the families' table checked the backend
    if family == "mtp":
        from localspec.backends.mlx.mtp import drafter

        return drafter(target)
    assert head is not None
    if family == "eagle3":
        from localspec.backends.mlx.eagle3 import Eagle3Drafter

        return Eagle3Drafter(target, head)
    from localspec.backends.mlx.dflash import BlockDrafter

    return BlockDrafter(target, head, method=family)
