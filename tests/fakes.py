"""A deterministic in-process backend for engine, controller and UI tests.

The "model" is a function from the context (token ids) to next-token logits. Tokens 0..255 are bytes,
256 is end-of-generation. It implements backends.base.Backend exactly, including rollback.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from localspec.backends.base import ByteDetokenizer, ChatMessage, ModelInfo, TokenTable, rollback_route
from localspec.errors import Interrupted, UnsupportedModelError
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
        device: str = "CPU",  # "CPU": its decode takes every core (drafters.decode_takes_every_core); "CUDA": not
    ) -> None:
        self._fn = logits_fn
        self._n_vocab = n_vocab
        self._n_ctx = n_ctx
        self._eog = eog
        self._tokens: list[int] = []
        self.forward_calls: list[int] = []  # batch sizes, for tests that count passes
        self.closed = False
        self.aborted = False
        self._info = ModelInfo("fake", f"/fake/{name}", name, "fake", device, n_ctx)

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

    def token_table(self) -> TokenTable:
        """For grammars (decoding/grammar.py): ids below 256 are their byte, the rest control tokens."""
        pieces = [bytes([i]) if i < 256 and i not in self._eog else b"\xff<%d>" % i for i in range(self._n_vocab)]
        return TokenTable(n_vocab=self._n_vocab, eog=self._eog, pieces=pieces, tokenize=self._tokenize_plain)

    def _tokenize_plain(self, text: str) -> list[int]:
        return self.tokenize(text)

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer(lambda t: bytes([t]) if t < 256 else b"")

    def chat_template(self) -> str | None:
        return "<role>content"  # stands for a template: apply_chat_template below is what renders

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True, template: str | None = None
    ) -> str:
        text = "".join(f"<{m.role}>{m.content}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def abort(self, on: bool = True) -> None:
        self.aborted = on

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        if self.aborted:
            raise Interrupted("fake backend: aborted")
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

    def can_rollback(self, n_keep: int) -> bool:
        return True

    def checkpoint(self) -> None:
        pass

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


def scripted_tokens(script: Sequence[int], *, n_vocab: int = N_VOCAB, fallback: int = 0) -> LogitsFn:
    """A model that writes `script` by absolute position: after a context of length n it predicts
    script[n] (with certainty: every other logit is -inf), then `fallback` past the script's end.
    Give the script's first tokens as the prompt."""

    def fn(context: Sequence[int]) -> np.ndarray:
        n = len(context)
        out = np.full(n_vocab, -np.inf, dtype=np.float32)
        out[script[n] if n < len(script) else fallback] = 0.0
        return out

    return fn


def without(fn: LogitsFn, tokens: Sequence[int] = (EOG,)) -> LogitsFn:
    """`fn` with the given tokens made impossible (-inf), e.g. a model that never ends generation."""
    banned = list(tokens)

    def wrapped(context: Sequence[int]) -> np.ndarray:
        out = np.array(fn(context), dtype=np.float32)
        out[banned] = -np.inf
        return out

    return wrapped


# -- scripted costs and acceptance (adaptive drafting tests) -----------------------------------------


class FakeClock:
    """A clock that only moves when a costed backend does work: timings in tests are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class CostedBackend(FakeBackend):
    """A FakeBackend whose forward of n tokens advances `clock` by cost(n) seconds.

    `cost` may be swapped mid-run (e.g. a draft that turns slow).
    """

    def __init__(self, logits_fn: LogitsFn, clock: FakeClock, cost: Callable[[int], float], **kw: object) -> None:
        super().__init__(logits_fn, **kw)  # type: ignore[arg-type]
        self.clock = clock
        self.cost = cost

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        self.clock.advance(self.cost(len(tokens)))
        return super().forward(tokens, all_logits=all_logits)


def scripted_draft(
    target_fn: LogitsFn, agree: Callable[[int], bool], seed: int = 99, *, confidence: float = 4.0
) -> LogitsFn:
    """A draft that copies the target when agree(len(context)) holds and is unrelated noise otherwise.

    At temperature 0 this scripts acceptance by position in the text: ~100% where it agrees, ~0% elsewhere.
    Where it agrees its logits are the target's times `confidence` (same argmax, sure of it), as a real
    draft tends to be sure where it matches.
    """
    other = hashed_logits(seed, order=2)

    def fn(context: Sequence[int]) -> np.ndarray:
        return target_fn(context) * confidence if agree(len(context)) else other(context)

    return fn


# -- additions for the chat app's tests (tests/test_tui*.py) ---------------------------------------------


def scripted(reply: str, *, marker: str = "<assistant>", wrong_every: int = 0) -> LogitsFn:
    """A model that answers every chat turn with `reply` (bytes after the last `marker`), then ends.

    With wrong_every=n it gets every n-th position wrong (a draft that is right most of the time).
    """
    script = list(reply.encode("utf-8")) + [EOG]
    mark = list(marker.encode("utf-8"))

    def fn(context: Sequence[int]) -> np.ndarray:
        start = _last_index(context, mark)
        pos = len(context) - start if start >= 0 else 0
        tok = script[min(pos, len(script) - 1)]
        if wrong_every and pos % wrong_every == wrong_every - 1 and tok != EOG:
            tok = (tok + 1) % 256
        out = np.full(N_VOCAB, -10.0, dtype=np.float32)
        out[tok] = 10.0
        return out

    return fn


def _last_index(context: Sequence[int], pattern: list[int]) -> int:
    """Index just past the last occurrence of pattern in context, or -1."""
    n = len(pattern)
    for i in range(len(context) - n, -1, -1):
        if list(context[i : i + n]) == pattern:
            return i + n
    return -1


class GatedBackend(FakeBackend):
    """A FakeBackend whose forward passes wait for a permit: tests release them one by one to look at
    the app between rounds."""

    def __init__(self, logits_fn: LogitsFn, **kwargs: object) -> None:
        import threading

        super().__init__(logits_fn, **kwargs)  # type: ignore[arg-type]
        self.gate = threading.Semaphore(0)
        self.open = False

    GATE_TIMEOUT = 30.0  # a test that fails before opening the gate must not hang the run

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        if not self.open and not self.gate.acquire(timeout=self.GATE_TIMEOUT):
            raise RuntimeError("gated fake backend: the test never released this pass")
        return super().forward(tokens, all_logits=all_logits)

    def release(self, n: int = 1) -> None:
        self.gate.release(n)

    def open_gate(self) -> None:
        self.open = True
        self.gate.release(1_000)


class FailingBackend(FakeBackend):
    """A FakeBackend that raises on its n-th forward pass (a backend failing mid-reply)."""

    def __init__(self, logits_fn: LogitsFn, *, fail_at: int, **kwargs: object) -> None:
        super().__init__(logits_fn, **kwargs)  # type: ignore[arg-type]
        self.fail_at = fail_at

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        if len(self.forward_calls) + 1 >= self.fail_at:
            raise RuntimeError("fake backend: device lost")
        return super().forward(tokens, all_logits=all_logits)


class RecurrentFakeBackend(FakeBackend):
    """A stand-in for a recurrent/hybrid model that holds callers to its rollback rules (backends.base):
    the latest batch of n tokens can be cut by up to min(n - 1, snapshots) positions, once; further only
    back to the latest checkpoint, whose tokens since are fed again (counted in `replayed`); anything else
    raises UnsupportedModelError, as the real backends do."""

    def __init__(self, logits_fn: LogitsFn, *, snapshots: int = 0, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(logits_fn, **kwargs)
        self._info = replace(self._info, recurrent="recurrent (fake): restores a saved state")
        self.snapshots = snapshots
        self._last_batch = 0
        self._ckpt: int | None = None
        self.replayed = 0
        self.checkpoints = 0
        self.routes: list[str] = []

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        if len(tokens) - 1 > self.snapshots:
            self.checkpoint()
        out = super().forward(tokens, all_logits=all_logits)
        self._last_batch = len(tokens)
        return out

    def _route(self, n_keep: int) -> str:
        reach = min(self._last_batch - 1, self.snapshots) if self._last_batch else 0
        return rollback_route(len(self._tokens), n_keep, recurrent=True, snapshot_reach=reach, checkpoint_at=self._ckpt)

    def can_rollback(self, n_keep: int) -> bool:
        return self._route(n_keep) != "refused"

    def rollback(self, n_keep: int) -> None:
        route = self._route(n_keep)
        if route == "none":
            return
        self.routes.append(route)
        if route == "refused":
            raise UnsupportedModelError(f"fake recurrent model: cannot roll back to {n_keep}", "")
        if route == "restore":
            assert self._ckpt is not None
            self.replayed += n_keep - self._ckpt
            self._last_batch = n_keep - self._ckpt
        else:
            self._last_batch = 0
        if n_keep == 0:
            self._ckpt = None
        del self._tokens[n_keep:]

    def checkpoint(self) -> None:
        if self._ckpt != len(self._tokens):
            self._ckpt = len(self._tokens)
            self.checkpoints += 1


class DrawingBackend(FakeBackend):
    """A FakeBackend that also draws each row's token inside its pass (Backend.forward_draws), as llama.cpp's dist
    sampler in the graph does: a pass's row i takes the i-th uniform after those committed (commit_draws), from a
    stream seeded by the caller's rng when the sampler is attached (its first draws after a pass of rows), and
    the token is the inverse CDF of softmax(logits / temperature) at it; drawn_probs(i) is that softmax. `commits`
    False: a caller's commits are lost, so every pass reuses the same uniforms; `probs_t` other than 1: drawn_probs
    at another temperature than the draws (what a rule must not see, either)."""

    def __init__(self, logits_fn: LogitsFn, *, commits: bool = True, probs_t: float = 1.0, **kw: object) -> None:
        super().__init__(logits_fn, **kw)  # type: ignore[arg-type]
        self.commits = commits
        self.probs_t = probs_t  # drawn_probs' temperature, as a multiple of the draws'
        self._stream: np.random.Generator | None = None  # None: no sampler attached
        self._uniforms: list[float] = []
        self._committed = 0
        self.row_calls: list[int] = []  # batch sizes of the passes that handed back rows
        self.draw_calls: list[int] = []  # ... and of those that handed back draws
        self._probs: list[np.ndarray] = []  # the last draws pass's rows' softmax
        self.probs_kept: list[bool] = []  # each draws pass's `probs`
        self._ids: list[np.ndarray] = []  # ... over these ids (all, or a top-k's)

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        self._stream = None  # rows: the sampler comes off the graph
        self.row_calls.append(len(tokens))
        return super().forward(tokens, all_logits=all_logits)

    def forward_draws(
        self,
        tokens: Sequence[int],
        temperature: float,
        rng: np.random.Generator,
        *,
        top_k: int = 0,
        probs: bool = True,
    ) -> list[int]:
        self.probs_kept.append(probs)
        if self._stream is None:
            self._stream = np.random.default_rng(int(rng.integers(0, 2**32 - 1)))
            self._uniforms, self._committed = [], 0
        rows = super().forward(tokens)
        while len(self._uniforms) < self._committed + len(tokens):
            self._uniforms.append(float(self._stream.random()))
        self.draw_calls.append(len(tokens))
        # top_k: llama.cpp's top-k sampler before the dist one, each row cut to its k best (ids kept beside)
        self._ids = [np.argsort(-row, kind="stable")[:top_k] if top_k else np.arange(len(row)) for row in rows]
        rows = [row[ids] for row, ids in zip(rows, self._ids)]
        self._probs = [_softmax(row / (temperature * self.probs_t)) for row in rows]
        us = [self._uniforms[self._committed + i] for i in range(len(rows))]
        return [int(ids[_inverse_cdf(row / temperature, u)]) for row, ids, u in zip(rows, self._ids, us)]

    def commit_draws(self, tokens: Sequence[int]) -> None:
        if self.commits:
            self._committed += len(tokens)

    def drawn_probs(self, i: int) -> np.ndarray:
        """Row i's softmax of the last forward_draws pass, float32 as llama.cpp's (only where the pass kept it)."""
        assert self.probs_kept[-1], "drawn_probs read from a pass made with probs=False"
        return self._probs[i]

    def drawn_candidates(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        assert self.probs_kept[-1], "drawn_candidates read from a pass made with probs=False"
        return self._ids[i].astype(np.int64), self._probs[i].copy()


def _softmax(z: np.ndarray) -> np.ndarray:
    w = np.exp(z.astype(np.float64) - np.max(z))
    return (w / w.sum()).astype(np.float32)


def _inverse_cdf(z: np.ndarray, u: float) -> int:
    """The token at cumulative probability u of softmax(z) (never one of probability 0)."""
    w = np.exp(z.astype(np.float64) - np.max(z))
    cum = np.cumsum(w / w.sum())
    i = int(np.searchsorted(cum, u, side="right"))
    return i if i < len(w) and w[i] > 0 else int(np.flatnonzero(w)[-1])
