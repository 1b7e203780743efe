"""Hidden states out of an mlx-lm target without forking mlx-lm: the layers to read get a subclass of their
own class (`layer.__class__` swapped), whose `__call__` notes its input and otherwise runs the original.

Swapping the class keeps the module's parameter tree, weight loading and quantization as they are, and the
computation is the same (the tap only keeps a reference to an array MLX computes anyway), so the target's
logits are bit-identical to plain decoding. Layer ids name a layer's *input* (the residual stream before
layer i, as llama.cpp's capture does); id n_layers names the last layer's output (before the final norm).

`FeatureStore` keeps what a head has not read yet: per forward pass one [n, len(ids) * E] chunk, with its
first position, so the backend can cut it back on rollback like its cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_TAPS: dict[int, list[tuple[LayerTap, int, bool]]] = {}  # id(layer) -> [(a tap, its slot, reads the output)]
_CLASSES: dict[type, type] = {}  # original layer class -> its tapped subclass


def _tapped(cls: type) -> type:
    """The subclass of `cls` whose call hands its input (or output) to the layer's taps."""
    if cls not in _CLASSES:

        def __call__(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
            taps = _TAPS.get(id(self), ())
            for tap, slot, output in taps:
                if not output:
                    tap.rows[slot] = x
            out = cls.__call__(self, x, *args, **kwargs)
            for tap, slot, output in taps:
                if output:
                    tap.rows[slot] = out
            return out

        _CLASSES[cls] = type(f"Tapped{cls.__name__}", (cls,), {"__call__": __call__})
    return _CLASSES[cls]


def original_class(layer: Any) -> type:
    """A layer's own class, under a tap's subclass if it has one."""
    cls = type(layer)
    return cls.__bases__[0] if cls in _CLASSES.values() else cls


class LayerTap:
    """Reads the inputs of `layer_ids` of `model` (an mlx-lm model) at every forward pass; `take()` gives the
    last pass's [n, len(ids) * E] rows, the layers side by side in the order given. `close()` puts the
    layers' classes back."""

    def __init__(self, model: Any, layer_ids: Sequence[int]) -> None:
        layers = list(model.layers)
        n = len(layers)
        bad = [i for i in layer_ids if not 0 <= i <= n]
        if bad or not layer_ids:
            raise ValueError(f"layer ids {list(layer_ids)} outside 0..{n} (the target has {n} layers)")
        self.ids = tuple(int(i) for i in layer_ids)
        self.rows: list[Any] = [None] * len(self.ids)
        self._layers: dict[int, tuple[Any, type]] = {}
        for slot, i in enumerate(self.ids):
            layer, output = (layers[i], False) if i < n else (layers[n - 1], True)
            if id(layer) not in self._layers:
                if any(tap is not self for tap, _, _ in _TAPS.get(id(layer), ())):
                    raise ValueError(f"layer {i} is read by another tap already (one head per target)")
                self._layers[id(layer)] = (layer, type(layer))
                layer.__class__ = _tapped(type(layer))
            _TAPS.setdefault(id(layer), []).append((self, slot, output))

    def take(self) -> Any:
        """The last pass's rows [n, len(ids) * E], in the model's dtype (lazy: evaluate with the logits)."""
        import mlx.core as mx

        if any(r is None for r in self.rows):
            raise RuntimeError("no forward pass ran through the tapped layers")
        out = mx.concatenate([r[0] for r in self.rows], axis=-1)
        self.rows = [None] * len(self.ids)
        return out

    def close(self) -> None:
        for key, (layer, cls) in self._layers.items():
            _TAPS.pop(key, None)
            layer.__class__ = cls
        self._layers = {}


class FeatureStore:
    """Captured rows by position: chunks [(first position, [n, F] array)], in order and contiguous."""

    def __init__(self) -> None:
        self._chunks: list[tuple[int, Any]] = []

    @property
    def end(self) -> int:
        """One past the last position held."""
        return self._chunks[-1][0] + self._chunks[-1][1].shape[0] if self._chunks else 0

    @property
    def start(self) -> int:
        return self._chunks[0][0] if self._chunks else self.end

    def add(self, at: int, rows: Any) -> None:
        if self._chunks and at != self.end:
            raise ValueError(f"features for position {at} after {self.end}: positions must follow on")
        self._chunks.append((at, rows))

    def get(self, start: int, stop: int) -> Any:
        """Rows [stop - start, F] for positions start..stop-1 (all held)."""
        import mlx.core as mx

        if not self.start <= start <= stop <= self.end:
            raise ValueError(f"features {start}..{stop} asked, {self.start}..{self.end} held")
        parts = [
            rows[max(start - at, 0) : min(stop - at, rows.shape[0])]
            for at, rows in self._chunks
            if at < stop and at + rows.shape[0] > start
        ]
        if not parts:
            return mx.zeros((0, self._chunks[0][1].shape[1]) if self._chunks else (0, 0))
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)

    def trim(self, n_keep: int) -> None:
        """Drop positions >= n_keep (a rollback)."""
        kept = []
        for at, rows in self._chunks:
            if at >= n_keep:
                break
            kept.append((at, rows[: n_keep - at] if at + rows.shape[0] > n_keep else rows))
        self._chunks = kept

    def clear(self) -> None:
        self._chunks = []
