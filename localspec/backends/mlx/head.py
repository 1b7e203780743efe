"""What the drafters that run a head beside an MLX target share (EAGLE-3, DFlash/DSpark): the target's
hidden-state capture, the head's KV cache kept in line with the committed context, and the token-by-token
draft loop (a block drafter replaces `propose`).

The bookkeeping is llama/head.py's, on MLX arrays: the head's cache holds one *pair* per position, built from
the context's tokens and what the target computed for them (EAGLE-3: token P+1 with the fc projection of the
target's features at P). A pair is true for a new context while the tokens it was built from are unchanged,
so at every proposal the cache is cut back to the pairs still true and the missing ones are written in one
batch, whose last row gives the first draft token's logits and the head's state. Each draft token then goes
back in with the head's own state, one position further. `_written` is the context the pairs were built from.

A family says what differs: `LOOKAHEAD` (pair P needs context[0..P + LOOKAHEAD] unchanged), `_n_pairs`,
`_cut(n)`, `_run(context, start, stop)` (writes pairs) and, drafting token by token, `_step(token, state,
position)`; both of those return (logits [V] of the last row, the head's state).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from localspec.backends.base import common_prefix
from localspec.backends.mlx.backend import MLXBackend
from localspec.draft import EMPTY_DRAFT, Draft, sample_draft
from localspec.errors import ModelFileError
from localspec.sampling import SamplingParams


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


class MLXHeadDrafter(ABC):
    """A drafter with a head beside an MLX `target` (borrowed), whose hidden states it reads."""

    method: str
    LOOKAHEAD: ClassVar[int] = 0
    _capturing: bool = False  # this drafter turned the target's capture on (an __init__ may fail before)

    def __init__(self, target: MLXBackend, name: str, layer_ids: Sequence[int]) -> None:
        self.target = target
        self.name = name
        self._written: list[int] = []
        self._pos = 0  # while drafting: the next draft token's position
        self._state: Any = None  # while drafting: the head's state paired with it
        target.capture_layers(layer_ids)
        self._capturing = True

    # -- Drafter protocol -------------------------------------------------------------------------

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self._written = []
        self._cut(0)
        self.catch_up(context)

    def lag(self, context: Sequence[int]) -> int:
        return max(0, self._n_pairs(context) - self._n_valid(context))

    def catch_up(self, context: Sequence[int]) -> None:
        self._sync(context)

    def observe(self, stats: object) -> None:  # noqa: B027 (a head learns nothing from the round's stats)
        pass

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        pos = len(context) - self.LOOKAHEAD  # the first draft token's position: past the last pair
        k = min(k, self.target.n_ctx - len(context) + 1)
        if k <= 0 or pos < 1 or self._n_pairs(context) < pos:
            return EMPTY_DRAFT  # the target does not hold what the last pair reads
        out = self._sync(context, need_output=True)
        assert out is not None
        logits, self._state = out
        self._pos = pos
        tokens, q, note = sample_draft(logits, self._next, k, sampling, rng, min_confidence, self.target.eog_ids)
        return Draft(tokens, q, note, source=self.method)

    def close(self) -> None:
        if self._capturing:
            self.target.release_capture()
            self._capturing = False

    def __del__(self) -> None:
        self.close()

    # -- what a family says -----------------------------------------------------------------------

    @abstractmethod
    def _n_pairs(self, context: Sequence[int]) -> int:
        """Pairs this context can have now: those whose inputs the target holds."""

    @abstractmethod
    def _run(self, context: Sequence[int], start: int, stop: int) -> Any:
        """Write pairs start..stop-1 in one batch; a step drafter returns (the last row's logits [V], the head's
        state there)."""

    def _step(self, token: int, state: Any, position: int) -> tuple[np.ndarray, Any]:
        """Feed (a draft token, the head's own last state) at `position`; (logits [V], the new state)."""
        raise NotImplementedError(f"{type(self).__name__} drafts a block, not token by token")

    @abstractmethod
    def _cut(self, n: int) -> None:
        """Keep the head's cache's first n pairs."""

    # -- the head's cache -------------------------------------------------------------------------

    def _held(self, context: Sequence[int]) -> int:
        """Positions of `context` the target holds (their features are there)."""
        return common_prefix(self.target.cached_tokens, context, limit=len(context))

    def _n_valid(self, context: Sequence[int]) -> int:
        return max(0, common_prefix(self._written, context, limit=len(context)) - self.LOOKAHEAD)

    def _sync(self, context: Sequence[int], *, need_output: bool = False) -> Any:
        """Cut the head's cache back to the pairs still true for `context` and write the missing ones; with
        `need_output`, the last pair is (re)written so that its outputs come back."""
        n_pairs = self._n_pairs(context)
        keep = min(self._n_valid(context), n_pairs - 1 if need_output else n_pairs)
        self._cut(keep)
        self._written = list(context[: keep + self.LOOKAHEAD])
        if keep >= n_pairs:
            return None
        out = self._run(context, keep, n_pairs)
        self._written = list(context[: n_pairs + self.LOOKAHEAD])
        return out

    def _next(self, token: int) -> np.ndarray:
        logits, self._state = self._step(token, self._state, self._pos)
        self._pos += 1
        return logits
