"""The protocol every backend implements, and small shared pieces (detokenizer, chat messages).

A backend wraps one loaded model and its KV cache. The engine only ever appends tokens with
`forward` and cuts the cache back with `rollback`; the backend tracks what the cache holds.
`sync_cache` is the one operation that brings a cache in line with a token sequence.

A backend *module* (localspec.backends.llama.backend, localspec.backends.mlx.backend) implements BackendModule:
`peek_vocab` reads vocabulary facts without loading weights, `load` returns a Backend.

The error contract, the same for every backend (tests/test_backend_contract.py checks it on both):
- load: ModelFileError (missing, truncated, not a model), UnsupportedModelError (loadable but not
  usable for speculation), BackendUnavailableError (the library is missing).
- forward: ValueError for an empty batch (a caller bug); ContextOverflowError when the cache cannot
  take the tokens (nothing is appended); GenerationError when the library fails (the cache is left
  holding exactly `cached_tokens`).
- abort: `abort()` (from any thread) makes a forward in flight stop within a fraction of a second and
  raise Interrupted, with the cache holding exactly `cached_tokens`; while the flag is set every forward
  raises Interrupted at once; `abort(False)` clears it. A load can be cancelled the same way through the
  `cancel` event given to `load` (Interrupted).
- rollback: ValueError for a negative n_keep; n_keep >= len(cached_tokens) does nothing;
  UnsupportedModelError when the model's state cannot be cut back that far (`can_rollback` says so
  beforehand; rolling back to 0 always works).

Recurrent and hybrid models (Mamba, LFM2, Qwen3.5, ...) keep a state that is not a list of positions, so
it cannot simply be cut. Their backends roll back in one of two exact ways, chosen per call
(`rollback_route`): a snapshot the library kept for each of the last few positions of the latest batch
(llama.cpp's n_rs_seq), or the latest *checkpoint* (the state saved at some length P) restored, with the
tokens from P to n_keep fed again. A backend saves a checkpoint when asked (`checkpoint()`: later rollbacks
keep at least the tokens cached now; a drafter calls it before drafting token by token) and by itself
before a batch the snapshots could not undo. A rollback below the checkpoint, beyond the snapshots, is
refused (UnsupportedModelError), and `sync_cache` then starts over from an empty cache.
"""

from __future__ import annotations

import codecs
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

from localspec.backends.messages import ChatMessage, ChatToolCall  # noqa: F401 (re-exported: their old home)
from localspec.errors import ContextOverflowError, UnsupportedModelError
from localspec.vocab import VocabInfo

if TYPE_CHECKING:
    from localspec.backends.chat_template import ChatFormat


@dataclass(frozen=True)
class ModelInfo:
    backend: str  # the backend's name in localspec/backends/registry.py
    path: str
    name: str
    architecture: str
    device: str  # e.g. "CUDA (all 29 layers offloaded)", "Metal", "CPU (2 threads)"
    n_ctx: int
    n_params: int | None = None
    size_bytes: int | None = None
    recurrent: str = ""  # how a hybrid/recurrent model is rolled back, e.g. "hybrid (lfm2): ..."; "" for a KV cache

    @property
    def is_recurrent(self) -> bool:
        return bool(self.recurrent)


@dataclass(frozen=True)
class BlockLayout:
    """How a DFlash-family block drafter lays out its block, on either backend: the anchor (the last committed
    token) then masks; DSpark sampling from the anchor drafts from slot 0, the others from slot 1."""

    block_size: int  # the trained block (anchor and masks)
    dspark: bool  # a Markov head: a DSpark drafter
    sample_from_anchor: bool  # DSpark: slot 0 predicts the first draft token (else it is a bonus anchor)

    @property
    def method(self) -> str:
        return "dspark" if self.dspark else "dflash"

    @property
    def reads_anchor(self) -> bool:
        """Whether the block's slot 0 (the last committed token) predicts the first draft token."""
        return self.dspark and self.sample_from_anchor

    @property
    def n_draft_max(self) -> int:
        return self.block_size if self.reads_anchor else self.block_size - 1

    def block_tokens(self, n_draft: int) -> int:
        return n_draft if self.reads_anchor else n_draft + 1


@dataclass(frozen=True)
class TokenTable:
    """A vocabulary as a grammar engine reads it (decoding/grammar.py), from a backend's optional
    `token_table()`: either each token's bytes with `tokenize`, or a Hugging Face tokenizers JSON."""

    n_vocab: int  # the logits' width (ids past the tokenizer's own size are padding)
    eog: frozenset[int]  # end-of-generation tokens: allowed exactly where the grammar accepts
    pieces: Sequence[bytes] | None = None  # bytes by token id; control tokens prefixed with b"\xff"
    tokenize: Callable[[str], list[int]] | None = None  # text -> ids, no BOS, specials as plain text
    hf_json: str | None = None  # a tokenizers JSON (tokenizer.json), used instead of pieces


@dataclass(frozen=True)
class TopTwo:
    """Each row's best token and its runner-up with their logits, picked where the model runs (a backend's
    optional `forward_top2`, BackendSpec.top2_on_device) instead of whole rows handed to the host: all a greedy
    round reads (the verdict, and the near-ties' gaps). ids [n, 2] int, logits [n, 2] float32, best first
    (an exact tie goes to the lower id, as numpy's argmax)."""

    ids: np.ndarray
    logits: np.ndarray

    @classmethod
    def picked(cls, ids: np.ndarray, logits: np.ndarray) -> TopTwo:
        """From two picks a row in any order."""
        ids, logits = np.asarray(ids, dtype=np.int64), np.asarray(logits, dtype=np.float32)
        swap = (logits[:, 1] > logits[:, 0]) | ((logits[:, 1] == logits[:, 0]) & (ids[:, 1] < ids[:, 0]))
        return cls(np.where(swap[:, None], ids[:, ::-1], ids), np.where(swap[:, None], logits[:, ::-1], logits))

    @classmethod
    def of_rows(cls, rows: np.ndarray) -> TopTwo:
        """The same from whole rows [n, V] on the host (a batch too long for one device pass)."""
        rows = np.atleast_2d(rows)
        ids = np.argpartition(rows, rows.shape[1] - 2, axis=1)[:, -2:]
        return cls.picked(ids, np.take_along_axis(rows, ids, axis=1))

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def best(self) -> np.ndarray:
        return self.ids[:, 0]

    def near_ties(self, n: int, limit: float) -> list[tuple[int, int, int, float]]:
        """(row, best, runner-up, logit gap) of the first n rows whose runner-up is within `limit` of the best:
        sampling.greedy_rows' near-ties, read off the two picks."""
        gaps = self.logits[:n, 0] - self.logits[:n, 1]
        return [
            (int(i), int(self.ids[i, 0]), int(self.ids[i, 1]), float(gaps[i])) for i in np.flatnonzero(gaps < limit)
        ]


class Detokenizer(Protocol):
    """Turns a growing token stream into text, never splitting a UTF-8 character."""

    def add(self, tokens: Sequence[int]) -> str: ...

    def flush(self) -> str: ...


class ByteDetokenizer:
    """Incremental detokenizer over per-token byte pieces (llama.cpp's token_to_piece)."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self.piece = piece  # a token's bytes (the text resync aligns text by them)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, tokens: Sequence[int]) -> str:
        return self._utf8.decode(b"".join(self.piece(t) for t in tokens))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


@runtime_checkable
class Backend(Protocol):
    """One loaded model with its KV cache."""

    @property
    def info(self) -> ModelInfo: ...

    @property
    def n_vocab(self) -> int:
        """Width of the logits rows (may exceed the tokenizer's size: padded embeddings)."""
        ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens whose keys and values the cache holds, in order (read-only view)."""
        ...

    @property
    def eog_ids(self) -> frozenset[int]:
        """Tokens that end generation (EOS, EOT, <|im_end|>, ...)."""
        ...

    def vocab_info(self) -> VocabInfo: ...

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def detokenizer(self) -> Detokenizer: ...

    def chat_template(self) -> str | None:
        """The model's own Jinja chat template; None when it ships none."""
        ...

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        template: str | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for a conversation, rendered with `template` or else the model's own (which
        must exist: chat_template.choose_chat_format decides what a model without one gets); `tools`
        (OpenAI's tool definitions) go to the template as its `tools` variable, and `variables` as more of
        them (a request's chat_template_kwargs, e.g. Qwen3's enable_thinking)."""
        ...

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        """Append `tokens` to the cache in one batched pass.

        Returns float32 logits, [len(tokens), n_vocab] when all_logits else [1, n_vocab] for the
        last position. The array may be reused by the next call: copy what must outlive it.
        """
        ...

    def rollback(self, n_keep: int) -> None:
        """Drop every cached position from n_keep on."""
        ...

    def can_rollback(self, n_keep: int) -> bool:
        """Whether rollback(n_keep) would succeed now (always, for a KV cache)."""
        ...

    def checkpoint(self) -> None:
        """Later rollbacks keep at least the tokens cached now: a recurrent backend saves its state here
        (a KV cache needs nothing)."""
        ...

    def abort(self, on: bool = True) -> None:
        """Stop a forward in flight on another thread (it raises Interrupted); see the contract above."""
        ...

    def close(self) -> None: ...


class BackendModule(Protocol):
    """What the pipeline needs of a backend module."""

    NAME: str  # its name in localspec/backends/registry.py

    def probe(self) -> tuple[bool, str]:
        """Whether it can run here, and the device it runs on or why not. Loads no model."""
        ...

    def peek_vocab(self, path: str) -> VocabInfo:
        """Vocabulary facts from metadata or tokenizer files alone (no weights are read)."""
        ...

    def load(
        self,
        path: str,
        *,
        n_ctx: int,
        threads: int | None = None,
        n_gpu_layers: int = -1,
        cancel: threading.Event | None = None,
        max_draft: int = 0,
    ) -> Backend:
        """`max_draft`: the longest draft the engine will verify on this model, so a recurrent model can
        keep snapshots for that many positions (0: it drafts or decodes plainly; checkpoints serve)."""
        ...

    def check_path(self, path: str) -> None:
        """Raise ModelFileError when `path` cannot be a model for this backend (cheap: no weights)."""
        ...

    def device_for(self, path: str, *, threads: int | None, n_gpu_layers: int) -> str | None:
        """ModelInfo.device that load() would give, from metadata alone; None where only loading tells."""
        ...


RollbackRoute = Literal["none", "trim", "snapshot", "restore", "refused"]


def rollback_route(
    n_cached: int, n_keep: int, *, recurrent: bool, snapshot_reach: int = 0, checkpoint_at: int | None = None
) -> RollbackRoute:
    """How a backend can cut `n_cached` positions back to `n_keep` (see the module notes).

    snapshot_reach: positions the library's per-token snapshots can undo right now (0: none);
    checkpoint_at: the length at which the latest recurrent checkpoint was saved (None: none).
    """
    if n_keep >= n_cached:
        return "none"
    if not recurrent or n_keep == 0:
        return "trim"  # a KV cache; or a recurrent state cleared whole
    if n_cached - n_keep <= snapshot_reach:
        return "snapshot"
    if checkpoint_at is not None and checkpoint_at <= n_keep:
        return "restore"
    return "refused"


class CachedModel:
    """What the real backends (llama_cpp.LlamaCppBackend, mlx.MLXBackend) keep alike: their facts, the tokens
    their cache holds, and the checks and counts around a rollback. Each says how it would cut its cache back
    (`_route`, see rollback_route) and cuts it itself."""

    _info: ModelInfo
    _n_vocab: int
    _eog: frozenset[int]
    _tokens: list[int]
    rollback_routes: Counter[str]  # how rollbacks went ("trim", "snapshot", "restore", ...)

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        return self._info.n_ctx

    @property
    def cached_tokens(self) -> Sequence[int]:
        return self._tokens  # not copied: the engine reads it every round

    @property
    def eog_ids(self) -> frozenset[int]:
        return self._eog

    def can_rollback(self, n_keep: int) -> bool:
        return n_keep >= 0 and self._route(n_keep) != "refused"

    def _route(self, n_keep: int) -> RollbackRoute:
        raise NotImplementedError

    def _refused_state(self) -> str:
        """Why a recurrent state cannot go back further, for the refusal: "its state was saved at 12 tokens"."""
        raise NotImplementedError

    def _rollback_route(self, n_keep: int) -> RollbackRoute:
        """The route of rollback(n_keep), counted in rollback_routes: ValueError for a negative n_keep,
        UnsupportedModelError when the cache cannot go back that far."""
        if n_keep < 0:
            raise ValueError(f"rollback needs n_keep >= 0, got {n_keep}")
        route = self._route(n_keep)
        if route != "none":
            self.rollback_routes[route] += 1
        if route == "refused":
            raise UnsupportedModelError(
                f"{self._info.name} has recurrent layers: {self._refused_state()}, so it cannot drop "
                f"{len(self._tokens) - n_keep} tokens to keep {n_keep}",
                "this is a bug in the caller (it must checkpoint before drafting); plain decoding "
                "(--draft-method none) never rolls back",
            )
        return route

    def _check_room(self, n: int, hint: str) -> None:
        """ContextOverflowError unless the cache can take n more tokens."""
        if len(self._tokens) + n > self.n_ctx:
            raise ContextOverflowError(
                f"the context holds {self.n_ctx:,} tokens; {len(self._tokens):,} are cached and {n:,} more do not fit",
                hint,
            )


_PREFIX_TAIL = 64  # common_prefix: where two sequences usually part (rejected drafts), scanned one by one


def common_prefix(cached: Sequence[int], tokens: Sequence[int], *, limit: int) -> int:
    """Length of the shared prefix of a cache's tokens and a token sequence, at most `limit`.

    Called several times a round on contexts of thousands of tokens: Python lists compare in C without
    converting a token (numpy arrays of Python ints cost ~0.4 us a token, 1.5 ms for a 4k context), and
    the usual parting point, rejected drafts at the end, is found by scanning the last tokens."""
    n = min(len(cached), len(tokens), limit)
    if n <= 0:
        return 0
    if isinstance(cached, list) and isinstance(tokens, list):
        # The usual case, one extends the other (a text grown by a round): one comparison, one slice (tried where
        # the last tokens agree: where they part, drafts rejected at the end, the scan below finds it).
        if cached[n - 1] == tokens[n - 1]:
            if n == len(cached) and cached == tokens[:n] or n == len(tokens) and tokens == cached[:n]:
                return n
        head = max(n - _PREFIX_TAIL, 0)
        if cached[:head] == tokens[:head]:
            return next((i for i in range(head, n) if cached[i] != tokens[i]), n)
    diff = np.flatnonzero(np.asarray(cached[:n]) != np.asarray(tokens[:n]))
    return int(diff[0]) if diff.size else n


def rewind(backend: Backend | PicksTop2, tokens: Sequence[int], *, logits: bool) -> int:
    """Cut `backend`'s cache back to its common prefix with `tokens` (short of the last token with logits=True, so
    that one is fed again); the positions kept. What every sync feeds after it is tokens[kept:]."""
    limit = len(tokens) - 1 if logits else len(tokens)
    keep = common_prefix(backend.cached_tokens, tokens, limit=limit)
    if not backend.can_rollback(keep):
        keep = 0  # a recurrent state that cannot go back this far: start over (always possible)
    backend.rollback(keep)
    return keep


def sync_cache(backend: Backend, tokens: Sequence[int], *, logits: bool) -> tuple[int, np.ndarray | None]:
    """Make `backend`'s cache hold exactly `tokens`, reusing its common prefix.

    With logits=True at least the last token is (re)fed, and its logits row [V] is returned; with
    logits=False only what is missing is fed and None is returned. Returns (positions reused, row).
    """
    keep = rewind(backend, tokens, logits=logits)
    if keep >= len(tokens):
        return keep, None
    row = backend.forward(tokens[keep:], all_logits=False)[-1]
    return keep, (row if logits else None)


class PicksTop2(Protocol):
    """A Backend whose passes can hand back each row's best two tokens instead of rows (BackendSpec.top2_on_device)."""

    @property
    def cached_tokens(self) -> Sequence[int]: ...

    def can_rollback(self, n_keep: int) -> bool: ...

    def rollback(self, n_keep: int) -> None: ...

    def forward_top2(self, tokens: Sequence[int], *, all_rows: bool = True) -> TopTwo | None:
        """forward, but each row's (all_rows, else the last row's) best two tokens and their logits (TopTwo), picked
        where the model runs; None, having fed nothing, where it cannot now (the caller then uses forward)."""
        ...


class DrawsInPass(Protocol):
    """A Backend whose passes can hand back one token a row drawn where the model runs (BackendSpec.draws_on_device)."""

    def forward_draws(
        self,
        tokens: Sequence[int],
        temperature: float,
        rng: np.random.Generator,
        *,
        top_k: int = 0,
        probs: bool = True,
    ) -> list[int] | None:
        """forward, but each row's token drawn from softmax(logits / temperature), over the row's top_k logits alone
        where top_k > 0 (a new sampler's seed from `rng`); None, having fed nothing, where it cannot now (the caller
        then uses forward). `probs`: whether drawn_probs / drawn_candidates will be read for this pass (a plain
        or one-hot round reads the draws alone, and a backend may then leave the softmax where it was made)."""
        ...

    def commit_draws(self, tokens: Sequence[int]) -> None:
        """The last pass's first len(tokens) draws were emitted: their randomness is used up."""
        ...

    def drawn_probs(self, i: int) -> np.ndarray:
        """Row i's whole distribution in the last forward_draws pass, softmax(logits / temperature) [V] float32, the
        one its draw came from: a host array valid until the backend's next pass."""
        ...

    def drawn_candidates(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row i's top_k ids [k] and their softmax [k] (the distribution its draw came from) in the last forward_draws
        pass with a top_k: host copies."""
        ...


def sync_cache_top2(backend: PicksTop2, tokens: Sequence[int], *, logits: bool) -> tuple[int, TopTwo | None] | None:
    """sync_cache through the backend's picks: the last fed row's best two tokens instead of the row (with
    logits=True; None when nothing needed feeding with logits=False). None, having fed nothing, where the backend
    cannot pick: the caller then uses sync_cache. A backend switches from rows to picks at a cost (llama.cpp plans
    its graph again), so a greedy run reads its prompt this way too."""
    keep = rewind(backend, tokens, logits=logits)
    if keep >= len(tokens):
        return keep, None
    picks = backend.forward_top2(tokens[keep:], all_rows=False)
    return None if picks is None else (keep, picks)


def chat_prompt_tokens(
    backend: Backend,
    messages: Sequence[ChatMessage],
    fmt: ChatFormat | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> list[int]:
    """Render a conversation in `fmt` (default: chosen for the model, see choose_chat_format), with
    `tools` offered to the template when given, and tokenize it, specials included.

    Templates that write the BOS token themselves would get a second one from the tokenizer; drop it.
    """
    from localspec.backends.chat_template import choose_chat_format, conversation_text

    fmt = fmt or choose_chat_format(backend)
    text = conversation_text(backend, messages, fmt, tools, variables)
    tokens = backend.tokenize(text, add_special=True, parse_special=not fmt.raw)
    bos = backend.vocab_info().bos_id
    if bos is not None and len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
        tokens = tokens[1:]
    return tokens
