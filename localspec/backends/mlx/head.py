"""A head beside an MLX target (EAGLE-3, MTP, DFlash/DSpark): the target's hidden-state capture, the head's KV
caches, and reading a head's published Hugging Face directory. The cache bookkeeping, the draft loop and the block
proposal are every backend's (localspec/backends/heads.py).

A family says what differs: `LOOKAHEAD` and `_n_pairs` (heads.py), `_write(context, start, stop, output=)`: the
pairs from `start` to `stop` in one batch, returning the last row's (logits [V], the head's state); and, drafting
token by token, `_forward(tokens, state)`, which `_write` and each draft step call.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends import heads
from localspec.backends.mlx.backend import MLXBackend
from localspec.errors import ModelFileError


def read_head_dir(path: str | Path, what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, every tensor of its *.safetensors) of a head in its published Hugging Face layout."""
    import mlx.core as mx

    d = Path(path).expanduser()
    files = sorted(d.glob("*.safetensors")) if d.is_dir() else []
    if not (d / "config.json").is_file() or not files:
        raise ModelFileError(
            f"{path}: not {what} directory (config.json and *.safetensors)",
            "pass the head's Hugging Face directory (e.g. from `huggingface-cli download REPO --local-dir DIR`)",
        )
    import json

    try:
        config = json.loads((d / "config.json").read_text())
        weights: dict[str, Any] = {}
        for f in files:
            weights.update(mx.load(str(f)))
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelFileError(f"{path}: cannot read {what}: {e}", "download the head again") from None
    return config, weights


def load_head_weights(head: Any, weights: dict[str, Any], what: str, hint: str) -> None:
    """Load a head module's weights (every parameter, nothing left over) and materialize them; ModelFileError
    naming `what` when they do not fit its shapes or names."""
    import mlx.core as mx

    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ModelFileError(f"{what} do not fit: {e}", hint) from None
    mx.eval(head.parameters())


class MLXHead(heads.HeadDrafter):
    """A head beside an MLX `target` (borrowed), whose hidden states it reads; its caches are mlx-lm KV caches,
    one per head layer (a family's __init__ makes `_caches` before this one runs)."""

    _caches: list[Any]

    def __init__(self, target: MLXBackend, name: str, layer_ids: Sequence[int]) -> None:
        super().__init__(target, name)
        self.target: MLXBackend = target
        target.capture_layers(layer_ids)
        self._capturing = True

    def _cut(self, n: int) -> None:
        for c in self._caches:
            if c.offset > n:
                c.trim(c.offset - n)


class StepDrafter(MLXHead, heads.StepDrafter):
    """A head that drafts token by token (EAGLE-3, MTP) on MLX: each draft token runs the head one position
    further, its own last state in place of the target's."""

    def _step(self, token: int, state: Any, position: int) -> tuple[np.ndarray, Any]:
        return self._forward([token], state)

    @abstractmethod
    def _forward(self, tokens: list[int], state: Any) -> tuple[np.ndarray, Any]:
        """Run `tokens` with their states [1, n, E] through the head (appending to its caches); (logits [V] of the
        last row over the target's vocabulary, the head's state there [1, 1, E])."""
