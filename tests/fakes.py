"""A deterministic in-process backend for engine, controller and UI tests.

The "model" is a function from the context (token ids) to next-token logits. Tokens 0..255 are bytes,
256 is end-of-generation. It implements backends.base.Backend exactly, including rollback.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from localspec.backends.base import ByteDetokenizer, ChatMessage, ModelInfo
from localspec.vocab import VocabInfo

EOG = 256
N_VOCAB = 257
LogitsFn = Callable[[Sequence[int]], np.ndarray]


class FakeBackend:
    def __init__(
        self,
        logits_fn: LogitsFn,
        *,
        n_vocab: int = N_VOCAB,
        n_ctx: int = 4096,
        name: str = "fake",
        eog: frozenset[int] = frozenset({EOG}),
    ) -> None:
        self._fn = logits_fn
        self._n_vocab = n_vocab
        self._n_ctx = n_ctx
        self._eog = eog
        self._tokens: list[int] = []
        self.forward_calls: list[int] = []  # batch sizes, for tests that count passes
        self.closed = False
        self._info = ModelInfo("fake", f"/fake/{name}", name, "fake", "CPU", n_ctx)

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    @property
    def eog_ids(self) -> frozenset[int]:
        return self._eog

    def vocab_info(self) -> VocabInfo:
        tokens = [bytes([i]).decode("latin-1") for i in range(256)] + ["<eog>"]
        return VocabInfo("fake", self._n_vocab, None, EOG, False, False, tokens[: self._n_vocab])

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer(lambda t: bytes([t]) if t < 256 else b"")

    def apply_chat_template(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m.role}>{m.content}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        if len(self._tokens) + len(tokens) > self._n_ctx:
            raise RuntimeError("fake backend: context overflow")
        self.forward_calls.append(len(tokens))
        rows = []
        for t in tokens:
            self._tokens.append(int(t))
            rows.append(self._fn(self._tokens))
        out = np.asarray(rows, dtype=np.float32)
        return out if all_logits else out[-1:]

    def rollback(self, n_keep: int) -> None:
        del self._tokens[n_keep:]

    def close(self) -> None:
        self.closed = True


def hashed_logits(seed: int, *, n_vocab: int = N_VOCAB, order: int = 2, sharpness: float = 3.0) -> LogitsFn:
    """A deterministic pseudo-random model: logits depend on the last `order` tokens."""

    def fn(context: Sequence[int]) -> np.ndarray:
        key = repr((seed, tuple(context[-order:]))).encode()
        rng = np.random.default_rng(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))
        return (rng.standard_normal(n_vocab) * sharpness).astype(np.float32)

    return fn


def noisy(fn: LogitsFn, seed: int, scale: float) -> LogitsFn:
    """A draft that resembles `fn`: same logits plus deterministic noise of the given scale."""
    base_noise = hashed_logits(seed + 10_000, n_vocab=N_VOCAB, order=2, sharpness=scale)

    def draft(context: Sequence[int]) -> np.ndarray:
        out = fn(context)
        return out + base_noise(context)[: out.shape[0]]

    return draft
