"""MLX backend: an mlx-lm model with its prompt cache, rolled back by trimming.

Loads an mlx-lm model directory (config.json, *.safetensors, tokenizer files) or a Hugging Face repo
id. A speculative round appends k+1 positions and then drops the rejected ones: attention caches are
trimmed; the recurrent layers of hybrid and recurrent models (mlx-lm's ArraysCache: Mamba, LFM2,
Qwen3.5, Qwen3-Next, ...) cannot be cut, so their state is kept before a batch that may be rolled back
(MLX arrays are immutable and these caches replace them whole, so keeping the old references costs
nothing) and restored, with the kept tokens fed again (backends.base describes the contract). Other
caches that cannot be trimmed are refused at load, before the weights are materialized.

mlx and mlx-lm are imported lazily, so this module imports on any machine; `load` and `peek_vocab`
say how to install them when they are missing.
"""

from __future__ import annotations

import atexit
import copy
import json
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends.base import (
    ByteDetokenizer,
    CachedModel,
    ChatMessage,
    Detokenizer,
    ModelInfo,
    RollbackRoute,
    TokenTable,
    TopTwo,
    rollback_route,
)
from localspec.errors import (
    BackendUnavailableError,
    GenerationError,
    Interrupted,
    ModelFileError,
    UnsupportedModelError,
)
from localspec.fim import FIM_END_TEXTS, FimTokens, find_fim_tokens
from localspec.vocab import VocabInfo

NAME = "mlx"
INSTALL_HINT = "install it with `pip install 'localspec[mlx]'` (on Linux this brings mlx[cpu])"
_ROOM_HINT = "raise --n-ctx (memory permitting) or shorten the prompt"

# Token texts that end a turn in common chat formats; llama.cpp treats them as end-of-generation too.
_EOG_TEXTS = frozenset(
    {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "<|eom_id|>",
     "</s>", "<|return|>", "<|call|>"}
)  # fmt: skip

_TOKENIZER_PATTERNS = ["*.json", "tokenizer.model", "*.tiktoken", "tiktoken.model", "*.txt", "*.jinja"]

# Whether forward_top2 picks (and forward_draws draws) on MLX's CPU device too. On a GPU the picks keep the rows
# [n, V] on the device and hand the host [n, 2]; on mlx[cpu] the rows are in host memory already (np.asarray shares them, no copy) and
# numpy's arg-max over them is cheaper than MLX's (benchmarks/mlx_top2_cost.py, a 151,936-token vocabulary: about
# 0.04 ms a row on the host against 0.3 ms a row for MLX's two arg-max passes, both hidden by the pass itself).
# Tests turn it on to run the GPU's path here.
PICK_ON_CPU = False


# -- module API (backends.base.BackendModule; used by localspec.pipeline) ------------------------------------------------------------


def probe() -> tuple[bool, str]:
    try:
        import mlx.core as mx

        metal = bool(getattr(mx, "metal", None) and mx.metal.is_available())
        device = str(mx.default_device())
    except Exception as e:
        return False, f"installed but unusable here: {e}"
    if metal:
        return True, "installed, runs on Metal (Apple GPU)"
    where = "Linux" if sys.platform.startswith("linux") else sys.platform
    return True, f"installed, CPU only on {where} ({device}); slow, for testing"


def peek_vocab(path: str) -> VocabInfo:
    """The vocabulary facts of a model, from its tokenizer files alone (no weights are read)."""
    _require_mlx()
    model_path = resolve(path, tokenizer_only=True)
    return _vocab_info(_load_tokenizer(model_path))


def peek_sizes(path: str) -> tuple[int | None, int | None, int | None]:
    """(hidden size, vocabulary, layers) from a local model directory's config.json (a vision-language model's
    text_config), each None when unknown: a Hub id, or a config without it. A head's fit is checked from these
    before any weights load."""
    cfg_path = Path(path).expanduser() / "config.json"
    try:
        raw = json.loads(cfg_path.read_text())
    except (OSError, ValueError):
        return None, None, None
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}

    def size(key: str) -> int | None:
        value = raw.get(key, text.get(key))
        return int(value) if isinstance(value, int) else None

    return size("hidden_size"), size("vocab_size"), size("num_hidden_layers")


def release_thread() -> None:
    """Destroy the MLX streams the calling thread made (mlx >= 0.32 asks each thread that used it to, the
    main one included; else the process may abort at exit with "terminate called without an active
    exception"). A later MLX call in the thread makes new ones."""
    mx = sys.modules.get("mlx.core")
    if mx is not None and hasattr(mx, "clear_streams"):
        mx.clear_streams()


_AT_EXIT: list[bool] = []


def _release_at_exit() -> None:
    """The main thread's streams, at interpreter exit (registered once)."""
    if not _AT_EXIT:
        atexit.register(release_thread)
        _AT_EXIT.append(True)


def check_path(path: str) -> None:
    """ModelFileError unless `path` can name an mlx-lm model: a model directory, or a Hub repo id."""
    p = Path(path).expanduser()
    if p.exists():
        resolve(path)
    elif path.count("/") != 1 or path.startswith((".", "/", "~")):
        raise ModelFileError(f"model not found: {path}", _MODEL_DIR_HINT)


def device_for(path: str, *, threads: int | None, n_gpu_layers: int) -> str | None:
    """None: MLX's device names a note on the cache size, known only once the model is built."""
    return None


def load(
    path: str,
    *,
    n_ctx: int,
    threads: int | None = None,
    n_gpu_layers: int = -1,
    cancel: threading.Event | None = None,
    max_draft: int = 0,
    load_mtp: bool = False,
) -> MLXBackend:
    """Load a model for speculative decoding. `threads`, `n_gpu_layers` and `max_draft` do not apply to MLX
    (a recurrent state is kept by reference, whatever the draft length), nor `load_mtp` (the MTP drafter reads
    the mtp.* weights from the checkpoint itself, localspec/backends/mlx/mtp.py).
    `cancel` is checked before the weights are materialized (the one long step)."""
    _require_mlx()
    import mlx.core as mx
    from mlx_lm.utils import load_model

    _release_at_exit()
    model_path = resolve(path)
    try:
        # lazy: the weights are materialized at mx.eval below, after the cache check.
        model, config = load_model(model_path, lazy=True)
    except FileNotFoundError as e:
        raise ModelFileError(f"{path}: not a complete mlx-lm model directory ({e})", _MODEL_DIR_HINT) from None
    except ValueError as e:
        raise UnsupportedModelError(
            f"mlx-lm cannot build the model in {path}: {e}", "check that mlx-lm is up to date"
        ) from None
    n_ctx, cache_note = _check_cache(model, config, path, n_ctx)
    if cancel is not None and cancel.is_set():
        raise Interrupted(f"loading {path} was cancelled")
    mx.eval(model.parameters())
    tokenizer = _load_tokenizer(model_path, eos_token_ids=config.get("eos_token_id"))
    return MLXBackend(model, tokenizer, config, path=path, model_path=model_path, n_ctx=n_ctx, note=cache_note)


_MODEL_DIR_HINT = (
    "pass an mlx-lm model directory (config.json, model*.safetensors, tokenizer files) or a Hub repo id "
    "such as mlx-community/Qwen2.5-Coder-1.5B-Instruct-4bit; a .gguf file runs on --backend llama "
    "(or convert it with `python -m localspec.convert_gguf FILE OUT_DIR`)"
)


def resolve(path: str, *, tokenizer_only: bool = False) -> Path:
    """A local model directory for `path`: the directory itself, or a Hub snapshot of a repo id."""
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelFileError(f"{p} has no config.json, so it is not an mlx-lm model directory", _MODEL_DIR_HINT)
        return p
    if p.exists():
        raise ModelFileError(f"{p} is a file; the MLX backend loads a model directory", _MODEL_DIR_HINT)
    if path.count("/") != 1 or path.startswith((".", "/", "~")):
        raise ModelFileError(f"model not found: {path}", _MODEL_DIR_HINT)
    from huggingface_hub import snapshot_download
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    try:
        return Path(
            snapshot_download(path, allow_patterns=_TOKENIZER_PATTERNS if tokenizer_only else DEFAULT_ALLOW_PATTERNS)
        )
    except Exception as e:  # huggingface_hub raises many kinds; all mean "could not get it"
        raise ModelFileError(
            f"cannot get {path} from the Hugging Face Hub: {type(e).__name__}: {e}",
            "check the repo id and your network, or pass a local mlx-lm model directory",
        ) from None


def _require_mlx() -> None:
    try:
        import mlx.core  # noqa: F401
        import mlx_lm  # noqa: F401
    except ImportError as e:
        raise BackendUnavailableError(f"the MLX backend needs mlx and mlx-lm: {e}", INSTALL_HINT) from None


# Models whose sliding-window layers take the window from the attention mask they build (passing
# window_size to create_attention_mask), not from the cache's size. For these a plain KVCache with the
# windowed mask computes exactly what mlx-lm's RotatingKVCache does, and it can be trimmed at any length.
_WINDOW_IN_MASK = frozenset({"gemma3_text", "gemma3"})


def make_cache(model: Any, config: dict) -> list[Any]:
    """mlx-lm's prompt cache for `model`, with rotating caches made plain where that is exact."""
    from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

    cache = make_prompt_cache(model)
    if config.get("model_type") in _WINDOW_IN_MASK:
        cache = [KVCache() if isinstance(c, RotatingKVCache) and c.keep == 0 else c for c in cache]
    return cache


def _is_recurrent(cache: Any) -> bool:
    from mlx_lm.models.cache import ArraysCache

    return isinstance(cache, ArraysCache)


def _leaves(cache: Sequence[Any]) -> list[Any]:
    """Every layer's caches, a CacheList (Falcon-H1: a recurrent and an attention cache per layer) opened."""
    from mlx_lm.models.cache import CacheList

    return [leaf for c in cache for leaf in (c.caches if isinstance(c, CacheList) else (c,))]


def recurrent_kind(cache: Sequence[Any]) -> str:
    """ "recurrent" (every layer keeps a state), "hybrid" (some do) or "" (attention only)."""
    leaves = _leaves(cache)
    n = sum(_is_recurrent(c) for c in leaves)
    return "" if n == 0 else "recurrent" if n == len(leaves) else "hybrid"


def _check_cache(model: Any, config: dict, path: str, n_ctx: int) -> tuple[int, str]:
    """Refuse caches that cannot be rolled back; cap the context where a sliding window limits rollback."""
    from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

    cache = make_cache(model, config)
    stuck = sorted({type(c).__name__ for c in _leaves(cache) if not c.is_trimmable() and not _is_recurrent(c)})
    if stuck:
        arch = config.get("model_type", "unknown")
        raise UnsupportedModelError(
            f"{path} ({arch}) keeps a cache ({', '.join(stuck)}) that localspec cannot roll back, and "
            "speculative decoding must drop the draft tokens the target rejects",
            "pick a model with attention or Mamba-style recurrent layers, e.g. Qwen2.5, Llama, Gemma 3, Qwen3.5 or LFM2",
        )
    windows = [c.max_size for c in cache if isinstance(c, RotatingKVCache)]
    if windows:
        # A rotating cache overwrites old entries once full, after which trimming cannot restore them.
        cap = min(windows) - 1
        if n_ctx > cap:
            return cap, f"context capped at {cap} tokens: the sliding-window cache cannot roll back once full"
    elif any(isinstance(c, RotatingKVCache) for c in make_prompt_cache(model)):
        return n_ctx, "sliding-window layers keep a full cache (trimmable)"
    return n_ctx, ""


def _load_tokenizer(model_path: Path, eos_token_ids: Any = None) -> Any:
    from mlx_lm.utils import load_tokenizer

    try:
        return load_tokenizer(model_path, eos_token_ids=eos_token_ids)
    except (OSError, ValueError) as e:
        raise ModelFileError(f"cannot load the tokenizer in {model_path}: {e}", _MODEL_DIR_HINT) from None


# -- vocabulary facts -----------------------------------------------------------------------------


def _vocab_type(tokenizer: Any) -> str:
    """llama.cpp's name for the tokenizer family: gpt2 (byte-level BPE), llama (SPM), t5 (unigram)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return type(tokenizer).__name__
    model = json.loads(backend.to_str()).get("model", {})
    kind = model.get("type", "unknown")
    if kind == "BPE":
        return "llama" if model.get("byte_fallback") else "gpt2"
    return {"Unigram": "t5", "WordPiece": "bert", "WordLevel": "wordlevel"}.get(kind, str(kind).lower())


def _vocab_info(wrapper: Any) -> VocabInfo:
    tok = wrapper._tokenizer
    n = len(tok)
    with_special = tok.encode("a", add_special_tokens=True)
    without = tok.encode("a", add_special_tokens=False)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    extra = len(with_special) > len(without)
    return VocabInfo(
        vocab_type=_vocab_type(tok),
        n_vocab=n,
        bos_id=bos,
        eos_id=eos,
        add_bos=extra and bos is not None and with_special[0] == bos,
        add_eos=extra and eos is not None and with_special[-1] == eos,
        tokens=tok.convert_ids_to_tokens(list(range(n))),
    )


# -- the backend ----------------------------------------------------------------------------------


class MLXBackend(CachedModel):
    """One mlx-lm model and its prompt cache; implements localspec.backends.base.Backend."""

    def __init__(
        self, model: Any, tokenizer: Any, config: dict, *, path: str, model_path: Path, n_ctx: int, note: str = ""
    ) -> None:
        import mlx.core as mx

        self._mx = mx
        self.model_path = model_path  # the model's directory (a head may read more of its checkpoint)
        self.model = model
        self.tokenizer = tokenizer  # mlx-lm TokenizerWrapper
        self.config = config
        self.cache = make_cache(model, config)
        self._tokens: list[int] = []
        self._recurrent = recurrent_kind(self.cache)
        self._ckpt: tuple[int, list[Any]] | None = None  # (cached tokens, recurrent layers' saved states)
        self.rollback_routes: Counter[str] = Counter()  # how rollbacks went ("trim", "restore", ...)
        self._n_forward = 0
        self._aborted = False
        self._picks_pay = mx.default_device().type == mx.DeviceType.gpu  # rows on a GPU: picks spare their copy
        self.reads: Counter[str] = Counter()  # what passes handed the host: "rows", "picks" (top-2), "draws"
        self._n_vocab = self._logits_width()
        self._eog = self._find_eog()
        self._piece_bytes = _byte_pieces(tokenizer._tokenizer)
        self._special_ids = frozenset(int(i) for i, t in tokenizer._tokenizer.added_tokens_decoder.items() if t.special)
        self._vocab: VocabInfo | None = None
        self._token_table: TokenTable | None = None
        self._tap: Any = None  # capture.LayerTap while a head reads the target's hidden states
        self._drawn: Any = None  # the last forward_draws pass's softmax rows (an mx.array [n, V], or [n, top_k])
        self._candidates: Any = None  # ... with a top_k: their ids [n, top_k]
        self._features: Any = None  # capture.FeatureStore: the tapped rows of every cached position
        self._capture_users = 0
        device = "Metal" if mx.metal.is_available() else "CPU (mlx)"
        if note:
            device += f"; {note}"
        self._info = ModelInfo(
            backend=NAME,
            path=str(path),
            name=_display_name(path),
            architecture=str(config.get("model_type", "unknown")),
            device=device,
            n_ctx=n_ctx,
            n_params=_count_params(model),
            size_bytes=sum(f.stat().st_size for f in model_path.glob("model*.safetensors")) or None,
            recurrent=(
                f"{self._recurrent} ({config.get('model_type', 'unknown')}): a rollback restores the saved "
                "recurrent state and re-feeds the kept tokens"
                if self._recurrent
                else ""
            ),
        )

    # -- facts ------------------------------------------------------------------------------------

    def vocab_info(self) -> VocabInfo:
        if self._vocab is None:
            self._vocab = _vocab_info(self.tokenizer)
        return self._vocab

    # -- text -------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        tok = self.tokenizer._tokenizer
        return list(tok.encode(text, add_special_tokens=add_special, split_special_tokens=not parse_special))

    def fim_tokens(self) -> FimTokens | None:
        """The fill-in-the-middle tokens, found in the tokenizer's vocabulary by their known texts (as llama.cpp
        finds them in a GGUF's); None unless all three are there."""
        return find_fim_tokens(self.tokenizer._tokenizer.get_vocab())

    def token_table(self) -> TokenTable:
        """The vocabulary for a grammar (decoding/grammar.py): the fast tokenizer's own JSON."""
        if self._token_table is None:
            backend = getattr(self.tokenizer._tokenizer, "backend_tokenizer", None)
            if backend is None:
                raise UnsupportedModelError(
                    f"{self._info.name} has no fast (Rust) tokenizer, which constrained output needs",
                    "drop response_format, or convert the tokenizer to tokenizer.json",
                )
            backend = copy.copy(backend)  # as llguidance does: no padding or truncation in the copy
            backend.no_padding()
            backend.no_truncation()
            self._token_table = TokenTable(n_vocab=self._n_vocab, eog=self._eog, hf_json=backend.to_str())
        return self._token_table

    def detokenizer(self) -> Detokenizer:
        if self._piece_bytes is not None:
            pieces = self._piece_bytes
            return ByteDetokenizer(lambda t: pieces[t] if 0 <= t < len(pieces) else b"")
        return _StreamingDetokenizer(self.tokenizer.detokenizer, self._special_ids)

    def chat_template(self) -> str | None:
        return self.tokenizer.chat_template if self.tokenizer.has_chat_template else None

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        template: str | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        if template is not None:  # a family's or the user's template, rendered as for llama.cpp
            from localspec.backends.chat_template import render_chat

            tok = self.tokenizer._tokenizer
            return render_chat(
                template, messages, add_generation_prompt=add_generation_prompt,
                bos_token=tok.bos_token or "", eos_token=tok.eos_token or "", tools=tools, variables=variables,
            )  # fmt: skip
        if not self.tokenizer.has_chat_template:
            raise GenerationError(
                f"{self.info.name} ships no chat template", "give one with --chat-template, or use --raw"
            )
        from localspec.backends.chat_template import check_variables

        msgs = [m.template_dict() for m in messages]
        extra: dict[str, Any] = {"tools": list(tools)} if tools else {}
        extra.update(check_variables(variables))  # transformers hands extra keyword arguments to the template
        return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **extra)  # fmt: skip

    # -- the cache --------------------------------------------------------------------------------

    # A long prompt is fed in chunks, so that abort() (checked between them) stops it soon: MLX itself
    # cannot be interrupted inside a pass.
    CHUNK = 256

    def abort(self, on: bool = True) -> None:
        self._aborted = on

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        tail = self._lead_in(tokens, all_logits)
        logits = self.forward_device(tail, all_logits=all_logits)
        self.reads["rows"] += logits.shape[0]
        return np.asarray(logits)  # [n, V] float32 (MLX evaluates here)

    def forward_top2(self, tokens: Sequence[int], *, all_rows: bool = True) -> TopTwo | None:
        """forward, but each row's best two tokens and their logits (all rows, or the last one), picked by MLX where
        the model runs: only those [n, 2] are evaluated, so on a GPU no whole row reaches the host. None, having fed
        nothing, where that does not pay (MLX on the CPU, unless PICK_ON_CPU) or a head reads the passes' hidden
        states (capture_layers): the caller then uses forward."""
        if not tokens:
            raise ValueError("forward needs at least one token")
        if not (self._picks_pay or PICK_ON_CPU) or self._tap is not None:
            return None
        tail = self._lead_in(tokens, all_rows)
        ids, logits = self._pass(tail, all_rows, _top_two)
        self.reads["picks"] += ids.shape[0]
        return TopTwo(np.asarray(ids).astype(np.int64), np.asarray(logits))

    def forward_draws(
        self,
        tokens: Sequence[int],
        temperature: float,
        rng: np.random.Generator,
        *,
        top_k: int = 0,
        probs: bool = True,
    ) -> list[int] | None:
        """forward, but each row's token drawn from softmax(logits / temperature) (over the row's top_k logits alone
        where top_k > 0) by MLX where the model runs (mx.random.categorical over the lazy rows, a Gumbel-max): only
        the ids are evaluated, and the softmax beside them stays where it was made until read (drawn_probs,
        drawn_candidates), so on a GPU no whole row reaches the host (`probs` changes nothing: what is not read is
        never evaluated). Each pass draws with a key of its own from `rng`, so no draw's randomness is used
        twice and commit_draws has nothing to do. None, having fed nothing, as forward_top2."""
        if not tokens:
            raise ValueError("forward needs at least one token")
        if not (self._picks_pay or PICK_ON_CPU) or self._tap is not None:
            return None
        seed = int(rng.integers(0, 2**32 - 1))
        tail = self._lead_in(tokens, True)
        if top_k > 0:
            ids, self._candidates, self._drawn = self._pass(
                tail, True, lambda r: _draw_top(r, temperature, seed, top_k)
            )
        else:
            ids, self._drawn = self._pass(tail, True, lambda rows: _draw(rows, temperature, seed))
        draws = [int(t) for t in np.asarray(ids)]
        self.reads["draws"] += len(draws)
        return draws

    def commit_draws(self, tokens: Sequence[int]) -> None:
        """Nothing to mark: every pass's draws have a key of their own (forward_draws)."""

    def drawn_probs(self, i: int) -> np.ndarray:
        """Row i's softmax(logits / T) of the last forward_draws pass, made beside the draws where the model runs
        (on Apple silicon in memory the host shares: reading a few numbers of it moves no row)."""
        if self._drawn is None:
            raise GenerationError("no forward_draws pass to read probabilities from", "please report this")
        return np.asarray(self._drawn[i])

    def drawn_candidates(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row i's top_k ids and their softmax of the last forward_draws pass with a top_k."""
        if self._drawn is None or self._candidates is None:
            raise GenerationError("no forward_draws pass with a top-k to read candidates from", "please report this")
        return np.asarray(self._candidates[i]).astype(np.int64), np.array(self._drawn[i])

    def _lead_in(self, tokens: Sequence[int], all_rows: bool) -> Sequence[int]:
        """What a pass does before its last part: the room check, the recurrent checkpoint, and a long prompt's
        parts but the last (all_rows False) fed in chunks. Returns the tokens left for the last part."""
        self._check_room(len(tokens), _ROOM_HINT)
        if self._recurrent and len(tokens) > 1:
            self.checkpoint()  # a batch may be cut back (the engine's verify): keep the state before it
        if len(tokens) > self.CHUNK and not all_rows:
            for start in range(0, len(tokens) - self.CHUNK, self.CHUNK):
                self.forward_device(tokens[start : start + self.CHUNK], all_logits=False)
            tokens = tokens[(len(tokens) - 1) // self.CHUNK * self.CHUNK :]
        return tokens

    def forward_device(self, tokens: Sequence[int], *, all_logits: bool = True) -> Any:
        """forward() without the copy to host memory: an mx.array [n, V] float32."""
        return self._pass(tokens, all_logits, None)[0]

    def _pass(
        self, tokens: Sequence[int], all_logits: bool, pick: Callable[[Any], tuple[Any, ...]] | None
    ) -> tuple[Any, ...]:
        """One pass: its logits [n, V] float32, or what `pick` makes of them (then only that is evaluated)."""
        mx = self._mx
        if not tokens:
            raise ValueError("forward needs at least one token")
        if self._aborted:
            raise Interrupted("stopped before the forward pass")
        self._check_room(len(tokens), _ROOM_HINT)
        x = mx.array(list(tokens), dtype=mx.uint32)[None]  # [1, n]
        try:
            out = self.model(x, cache=self.cache)  # [1, n, V]
            if not all_logits:
                out = out[:, -1:, :]
            out = out[0].astype(mx.float32)  # [n, V]
            results = (out,) if pick is None else pick(out)
            rows = self._tap.take() if self._tap is not None else None
            mx.eval(*results) if rows is None else mx.eval(*results, rows)
        except Exception as e:
            self._resync()
            raise GenerationError(f"MLX forward pass failed: {type(e).__name__}: {e}", "see the message above") from e
        if rows is not None:
            self._features.add(len(self._tokens), rows)
        self._tokens.extend(int(t) for t in tokens)
        self._n_forward += 1
        if self._n_forward % 256 == 0:  # as mlx-lm's generate does: return freed buffers now and then
            mx.clear_cache()
        return results

    def _resync(self) -> None:
        """After a failed pass, cut every layer's cache back to the tokens we know it holds."""
        if self._recurrent:  # a recurrent state may be half-updated: start over (the next sync refills it)
            self._reset()
            return
        n = len(self._tokens)
        for c in self.cache:
            extra = c.size() - n if hasattr(c, "size") else 0
            if extra > 0:
                c.trim(extra)
        if any(getattr(c, "offset", n) != n for c in self.cache):  # could not repair: start afresh
            self._reset()
        elif self._features is not None:
            self._features.trim(n)

    def _reset(self) -> None:
        """An empty cache (and no features)."""
        self.cache = make_cache(self.model, self.config)
        self._tokens.clear()
        self._ckpt = None
        if self._features is not None:
            self._features.clear()

    def _route(self, n_keep: int) -> RollbackRoute:
        ckpt = self._ckpt[0] if self._ckpt is not None else None
        return rollback_route(len(self._tokens), n_keep, recurrent=bool(self._recurrent), checkpoint_at=ckpt)

    def _refused_state(self) -> str:
        return f"its state was saved at {self._ckpt[0]} tokens" if self._ckpt else "no state was saved"

    def checkpoint(self) -> None:
        """Keep the recurrent layers' state at the current length (references: MLX arrays are immutable)."""
        if self._recurrent and (self._ckpt is None or self._ckpt[0] != len(self._tokens)):
            self._ckpt = (len(self._tokens), [_save_state(c) for c in _leaves(self.cache) if _is_recurrent(c)])

    def rollback(self, n_keep: int) -> None:
        from mlx_lm.models.cache import trim_prompt_cache

        route = self._rollback_route(n_keep)
        if route == "none":
            return
        if self._recurrent:
            self._restore(n_keep)
            return
        n_drop = len(self._tokens) - n_keep
        if self._features is not None:
            self._features.trim(n_keep)
        trimmed = trim_prompt_cache(self.cache, n_drop)
        if trimmed != n_drop:
            self._resync()
            raise UnsupportedModelError(
                f"the MLX cache dropped {trimmed} of {n_drop} positions on rollback",
                "the model's cache cannot be rolled back this far; lower --n-ctx",
            )
        del self._tokens[n_keep:]

    def _restore(self, n_keep: int) -> None:
        """Back to the checkpoint (or empty, for n_keep = 0): trim the attention caches to it, put the
        recurrent states back, then feed the kept tokens after it again."""
        if n_keep == 0 or self._ckpt is None:
            self._reset()
            return
        pos, saved = self._ckpt
        if self._features is not None:
            self._features.trim(pos)
        states = iter(saved)
        for c in _leaves(self.cache):
            if _is_recurrent(c):
                _load_state(c, next(states))
            else:  # every attention cache holds the tracked tokens
                c.trim(len(self._tokens) - pos)
        replay = self._tokens[pos:n_keep]
        del self._tokens[pos:]
        for start in range(0, len(replay), self.CHUNK):
            self.forward_device(replay[start : start + self.CHUNK], all_logits=False)

    # -- hidden states for a head drafter (localspec/backends/mlx/capture.py) -------------------------------------

    def capture_layers(self, layers: Sequence[int]) -> None:
        """From the next forward on, keep the inputs of `layers` (id n_layers: the last layer's output) for every
        cached position (features()), until each caller has called release_capture(). What was cached before
        has no features, so the cache starts empty. ValueError for a layer the model does not have."""
        from localspec.backends.mlx.capture import FeatureStore, LayerTap

        if self._tap is None or self._tap.ids != tuple(layers):
            if self._tap is not None:
                self._tap.close()
            self._tap = None
            self._tap = LayerTap(self.model, layers)
            self._features = FeatureStore()
            self._reset()
        self._capture_users += 1

    def release_capture(self) -> None:
        """A caller of capture_layers no longer needs the features; the last one puts the layers back."""
        self._capture_users = max(0, self._capture_users - 1)
        if self._capture_users == 0 and self._tap is not None:
            self._tap.close()
            self._tap, self._features = None, None

    def features(self, start: int, stop: int) -> Any:
        """[stop - start, len(layers) * E] (an mx.array in the model's dtype): the captured layer inputs at cached
        positions start..stop-1, the layers side by side in the order given to capture_layers."""
        if self._features is None or stop > len(self._tokens):
            raise ValueError(f"no features for positions {start}..{stop} ({len(self._tokens)} cached)")
        return self._features.get(start, stop)

    @property
    def hidden_size(self) -> int | None:
        """The width of the residual stream (config.json's hidden_size, or its text_config's)."""
        size = self.config.get("hidden_size") or (self.config.get("text_config") or {}).get("hidden_size")
        return int(size) if size else None

    @property
    def embed_tokens(self) -> Any:
        """The model's token embedding module (a head embeds its tokens with it)."""
        inner = getattr(self.model, "language_model", self.model)
        return inner.model.embed_tokens

    @property
    def text_model(self) -> Any:
        """The language model inside (a vision-language wrapper's `language_model`, else the model)."""
        return getattr(self.model, "language_model", self.model)

    @property
    def lm_head(self) -> Any:
        """The model's output projection: a callable [.., E] -> [.., V] (tied models: the embedding as linear)."""
        inner = getattr(self.model, "language_model", self.model)
        head = getattr(inner, "lm_head", None)
        return head if head is not None else inner.model.embed_tokens.as_linear

    def close(self) -> None:
        if self._tap is not None:
            self._tap.close()
            self._tap, self._features = None, None
        self.cache = []
        self._tokens = []
        self.model = None

    # -- helpers ----------------------------------------------------------------------------------

    def _logits_width(self) -> int:
        mx = self._mx
        from mlx_lm.models.cache import make_prompt_cache

        for cfg in (self.config, self.config.get("text_config") or {}):
            if isinstance(cfg.get("vocab_size"), int):
                return int(cfg["vocab_size"])
        # Not in the config where we look: ask the model (one forward of one token).
        probe = self.model(mx.array([[0]], dtype=mx.uint32), cache=make_prompt_cache(self.model))
        return int(probe.shape[-1])

    def _find_eog(self) -> frozenset[int]:
        tok = self.tokenizer._tokenizer
        ids = {int(i) for i in self.tokenizer.eos_token_ids}
        if tok.eos_token_id is not None:
            ids.add(int(tok.eos_token_id))
        # Only whole added tokens count: a plain-text "</s>" in a BPE vocabulary is ordinary text.
        for i, t in tok.added_tokens_decoder.items():
            if str(t) in _EOG_TEXTS or str(t) in FIM_END_TEXTS:  # llama.cpp ends at the FIM pad/separators too
                ids.add(int(i))
        return frozenset(ids)


class _StreamingDetokenizer:
    """Adapts mlx-lm's streaming detokenizers (which hold back incomplete UTF-8) to add/flush."""

    def __init__(self, detok: Any, skip: frozenset[int]) -> None:
        self._d = detok
        self._skip = skip  # control tokens render as nothing, as on llama.cpp

    def add(self, tokens: Sequence[int]) -> str:
        for t in tokens:
            if t not in self._skip:
                self._d.add_token(int(t))
        return self._d.last_segment

    def flush(self) -> str:
        self._d.finalize()
        return self._d.last_segment


def _byte_pieces(tok: Any) -> list[bytes] | None:
    """Per-token bytes for a byte-level BPE tokenizer (GPT-2 alphabet), else None.

    With exact bytes per token, base.ByteDetokenizer streams text as llama.cpp does: UTF-8 safe and
    without the leading-space trimming of mlx-lm's BPE detokenizer.
    """
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return None
    from mlx_lm.tokenizer_utils import _byte_decoder

    decoder = _byte_decoder()
    added = {int(i): t for i, t in tok.added_tokens_decoder.items()}
    pieces: list[bytes] = []
    for i, text in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
        if i in added or text is None:
            # As llama.cpp renders them: control tokens as nothing, other added tokens as their text.
            t = added.get(i)
            pieces.append(b"" if t is None or t.special else str(t).encode("utf-8"))
        elif all(c in decoder for c in text):
            pieces.append(bytes(decoder[c] for c in text))
        else:
            pieces.append(text.encode("utf-8"))
    return pieces


def _top_two(rows: Any) -> tuple[Any, Any]:
    """Each row's best two ids [n, 2] (uint32) and their logits [n, 2], best first, as numpy's arg-max picks them: MLX's
    arg-max gives an exact tie to the lower id (its CPU and Metal reductions both), and the runner-up is the arg-max
    with the best masked, so ties go the same way there too (a top-k or partition picks among ties in any order)."""
    import mlx.core as mx

    best = mx.argmax(rows, axis=1, keepdims=True)  # [n, 1]
    second = mx.argmax(mx.put_along_axis(rows, best, mx.array(-mx.inf, rows.dtype), axis=1), axis=1, keepdims=True)
    ids = mx.concatenate([best, second], axis=1)
    return ids, mx.take_along_axis(rows, ids, axis=1)


def _draw(rows: Any, temperature: float, seed: int) -> tuple[Any, Any]:
    """One id a row [n], drawn from softmax(rows / temperature) with the key `seed`, and that softmax [n, V]."""
    import mlx.core as mx

    scaled = rows * (1.0 / temperature)
    return mx.random.categorical(scaled, axis=-1, key=mx.random.key(seed)), mx.softmax(scaled, axis=-1)


def _draw_top(rows: Any, temperature: float, seed: int, k: int) -> tuple[Any, Any, Any]:
    """One id a row [n], drawn from the softmax of each row's k best logits / temperature with the key `seed`; those
    ids [n, k] and that softmax [n, k] (which k among tied logits is the partition's choice, and the draw's too)."""
    import mlx.core as mx

    scaled = rows * (1.0 / temperature)
    ids = mx.argpartition(-scaled, kth=k - 1, axis=-1)[:, :k]
    top = mx.take_along_axis(scaled, ids, axis=-1)
    pick = mx.random.categorical(top, axis=-1, key=mx.random.key(seed))
    return mx.take_along_axis(ids, pick[:, None], axis=-1)[:, 0], ids, mx.softmax(top, axis=-1)


def _save_state(cache: Any) -> list[Any]:
    """An ArraysCache's arrays (the list copied: layers replace its items, never change an array in place)."""
    return [list(cache.cache), cache.left_padding, cache.lengths]


def _load_state(cache: Any, saved: list[Any]) -> None:
    arrays, cache.left_padding, cache.lengths = saved
    cache.cache = list(arrays)


def _count_params(model: Any) -> int | None:
    from mlx.utils import tree_flatten

    try:
        return int(sum(v.size for _, v in tree_flatten(model.parameters())))
    except Exception:
        return None


def _display_name(path: str) -> str:
    p = Path(path).expanduser()
    return p.name if p.exists() else path
