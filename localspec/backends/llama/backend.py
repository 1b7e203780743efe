"""llama.cpp backend on llama-cpp-python's low-level API.

One batched `llama_decode` per `forward`, with a logits flag on every position the engine grades;
rollback is `llama_memory_seq_rm` on the single sequence. Logits are returned as a numpy view of
llama.cpp's own buffer (no copy): valid until the next forward on the same model.

Recurrent and hybrid models (Mamba, LFM2, Qwen3.5, Qwen3-Next, Granite-H, ...) roll back as
backends.base describes. Where llama.cpp supports it (llm_arch_supports_rs_rollback: Qwen3.5, LFM2,
Nemotron-H, ...) the context keeps `n_rs_seq` = max_draft per-token snapshots of the recurrent state, and
`llama_memory_seq_rm` restores one: the last batch of n tokens can be cut by up to min(n - 1, n_rs_seq)
positions, once (llama.cpp writes snapshot slots only for the positions of the latest batch, and a
pending rollback is single-use). Everything else goes through a checkpoint: the recurrent part of the
state (llama_state_seq_get_data_ext with PARTIAL_ONLY; the attention KV is cut with seq_rm as usual),
restored with the tokens since fed again, as llama.cpp's server does for such targets.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from localspec.backends.base import (
    ByteDetokenizer,
    CachedModel,
    ChatMessage,
    ModelInfo,
    RollbackRoute,
    TokenTable,
    TopTwo,
    rollback_route,
)
from localspec.backends.chat_template import render_chat
from localspec.backends.llama import samplers
from localspec.errors import (
    GenerationError,
    Interrupted,
    ModelFileError,
    UnsupportedModelError,
)
from localspec.fim import FimTokens
from localspec.gguf_meta import GGUFHeader, read_gguf_header
from localspec.vocab import VocabInfo

NAME = "llama"


class LlamaLog:
    """llama.cpp's log goes to one process-wide callback. Keep it quiet, but let each load or decode
    capture the lines written while it ran (they explain a failure); captures on other threads do not mix."""

    def __init__(self) -> None:
        self._local = threading.local()

    def write(self, text: str) -> None:
        lines = getattr(self._local, "lines", None)
        if lines is not None:
            lines.append(text)
        if os.environ.get("LOCALSPEC_LLAMA_VERBOSE"):
            sys.stderr.write(text)

    @contextmanager
    def capture(self) -> Iterator[deque[str]]:
        lines: deque[str] = deque(maxlen=40)
        outer = getattr(self._local, "lines", None)
        self._local.lines = lines
        try:
            yield lines
        finally:
            self._local.lines = outer


LOG = LlamaLog()  # the drafters' heads capture their passes' lines here too


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    LOG.write(text.decode("utf-8", errors="replace"))


@functools.cache
def _init_llama() -> None:
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()


@functools.cache
def probe() -> tuple[bool, str]:
    try:
        kind = gpu_kind()
    except Exception as e:  # a build whose shared library loads but does not initialise
        return False, f"llama.cpp does not initialise: {e}"
    if kind:
        return True, f"{kind} build: layers offload to the GPU"
    return True, "CPU build (this llama-cpp-python has no GPU offload)"


def gpu_kind() -> str | None:
    """The GPU backend this llama-cpp-python build has ("CUDA", "Metal", ...), or None for CPU only."""
    if not llama_cpp.llama_supports_gpu_offload():
        return None
    libs = " ".join(p.name.lower() for p in (Path(llama_cpp.__file__).parent / "lib").glob("*"))
    for key, name in (("cuda", "CUDA"), ("metal", "Metal"), ("hip", "ROCm"), ("vulkan", "Vulkan"), ("sycl", "SYCL")):
        if key in libs:
            return name
    return "Metal" if sys.platform == "darwin" else "GPU"


def read_header(path: str | Path, *, check_size: bool = True) -> GGUFHeader:
    """Validated GGUF header (parsed once per file version: peek_vocab and load both need it)."""
    return read_gguf_header(path, check_size=check_size)


def peek_vocab(path: str | Path) -> VocabInfo:
    """Vocabulary facts from the GGUF header alone (the weights need not be there yet)."""
    return VocabInfo.from_gguf_metadata(read_header(path, check_size=False).metadata)


def check_path(path: str | Path) -> None:
    """ModelFileError unless `path` is a complete GGUF file (header and size checked; no weights read)."""
    read_header(path)


def device_for(path: str | Path, *, threads: int | None, n_gpu_layers: int) -> str | None:
    """ModelInfo.device as load() will give it, from the header alone (None where it cannot tell): auto
    finds its remembered costs by it before the target loads."""
    meta = read_header(path, check_size=False).metadata
    n_layer = meta.get(f"{meta.get('general.architecture')}.block_count")
    if not isinstance(n_layer, int):
        return None
    return _device(n_layer, threads or os.cpu_count() or 1, n_gpu_layers)


def _device(n_layer: int, threads: int, n_gpu_layers: int) -> str:
    gpu = gpu_kind()
    if gpu is None:
        return f"CPU ({threads} threads)"
    if n_gpu_layers < 0 or n_gpu_layers > n_layer:
        return f"{gpu} (all {n_layer} layers offloaded)"
    if n_gpu_layers == 0:
        return f"CPU ({threads} threads; {gpu} available but not used)"
    return f"{gpu} ({n_gpu_layers} of {n_layer} layers offloaded, rest on CPU)"


def load(
    path: str | Path,
    *,
    n_ctx: int = 4096,
    threads: int | None = None,
    n_gpu_layers: int = -1,
    cancel: threading.Event | None = None,
    max_draft: int = 0,
    load_mtp: bool = False,
) -> LlamaCppBackend:
    return LlamaCppBackend(
        path,
        n_ctx=n_ctx,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        cancel=cancel,
        max_draft=max_draft,
        load_mtp=load_mtp,
    )


# Whether forward_top2 picks on a CPU build too. On a GPU the picks save copying whole rows off the device and the
# host's pass over them; on a CPU the rows are in memory already and llama.cpp's top-k in the graph costs more than
# the host's arg-max (measured with a 151,936-token vocabulary: about 1 ms for one row, 5 ms a row for 9, against
# tens of microseconds a row on the host). The same holds for forward_draws' sampler. Tests turn it on to run the
# same graph path here.
PICK_ON_CPU = False


def _output_on_gpu(n_layer: int, n_gpu_layers: int) -> bool:
    """Whether llama.cpp runs the output layer (the logits) on a GPU: a GPU build with every layer offloaded."""
    return gpu_kind() is not None and (n_gpu_layers < 0 or n_gpu_layers > n_layer)


@functools.cache
def abort_check() -> Callable[[ctypes.c_void_p], bool] | None:
    """ggml's abort callback, as a native function: libc's strlen on a 2-byte flag buffer is 0 until the
    flag is set. ggml calls it between graph nodes, so a Python callback (and the GIL) there would cost
    about a millisecond per forward; this costs nothing. None where libc cannot be found."""
    try:
        libc = ctypes.CDLL(None) if sys.platform != "win32" else ctypes.cdll.msvcrt
        address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    return llama_cpp.ggml_abort_callback(address) if address else None


class LlamaCppBackend(CachedModel):
    """A GGUF model with its context (KV cache) on one sequence."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int,
        threads: int | None,
        n_gpu_layers: int,
        n_batch: int = 512,
        cancel: threading.Event | None = None,
        max_draft: int = 0,
        load_mtp: bool = False,
    ) -> None:
        """`load_mtp`: load the model's MTP (nextn) layers too, for --draft-method mtp (llama.cpp skips
        them otherwise)."""
        _init_llama()
        p = Path(path).expanduser()
        self._header = read_header(p)
        self._meta = self._header.metadata
        self._abort_flag = ctypes.create_string_buffer(2)  # non-empty string: abort (see abort_check)
        self._load_mtp = load_mtp
        self._model: llama_cpp.llama_model_p | None = self._load_model(p, n_gpu_layers, cancel)
        self._ctx: llama_cpp.llama_context_p | None = None
        self._batch = None
        try:
            self._vocab = llama_cpp.llama_model_get_vocab(self._model)
            self._recurrent = self._recurrent_kind()
            self._threads = threads or os.cpu_count() or 1
            self._ctx = self._new_context(n_ctx, n_batch, max_draft if self._recurrent else 0)
            self._n_rs_seq = int(llama_cpp.llama_n_rs_seq(self._ctx))  # 0 where llama.cpp cannot snapshot this arch
            self._last_batch = 0  # tokens in the latest decode whose snapshots are still unused (0: none)
            self._ckpt: _Checkpoint | None = None
            self.rollback_routes: Counter[str] = Counter()  # how rollbacks went ("snapshot", "restore", ...)
            self._n_batch = int(llama_cpp.llama_n_batch(self._ctx))  # llama.cpp may lower it
            self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
            self._memory = llama_cpp.llama_get_memory(self._ctx)
            self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
            self._tokens: list[int] = []
            self._captured: tuple[int, ...] = ()  # layers whose inputs are kept per position (EAGLE-3)
            self._features: np.ndarray | None = None  # [n_ctx, len(captured) * n_embd]
            self._capture_users = 0  # head drafters that asked for the capture and have not released it
            self._nextn: np.ndarray | None = None  # [n_ctx, n_embd_out]: the states an MTP head reads
            self._pieces: dict[int, bytes] = {}
            self._token_table: TokenTable | None = None
            self._eog = frozenset(t for t in range(self._n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t))
            self._chain: _DeviceChain | None = None  # the sampler in the graph (top-2 picks or draws), if any
            self._refused: set[str] = set()  # chain kinds llama.cpp would not run in the graph: never asked again
            # What passes handed the host: "rows" (whole), "picks" (top-2 rows), "draws" (one sampled token a row).
            self.reads: Counter[str] = Counter()
            self._info = self._describe(p, n_gpu_layers)
            self._picks_pay = _output_on_gpu(int(llama_cpp.llama_model_n_layer(self._model)), n_gpu_layers)
        except BaseException:
            self.close()
            raise

    # -- loading ----------------------------------------------------------------------------------

    def _load_model(self, p: Path, n_gpu_layers: int, cancel: threading.Event | None) -> llama_cpp.llama_model_p:
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
        params.load_mtp = self._load_mtp
        if cancel is not None:
            # llama.cpp stops loading when this returns False (it is called as tensors load).
            keep_going = llama_cpp.llama_progress_callback(lambda progress, data: not cancel.is_set())
            params.progress_callback = keep_going
        with LOG.capture() as log:
            model: llama_cpp.llama_model_p | None = llama_cpp.llama_model_load_from_file(str(p).encode("utf-8"), params)
        if not model and cancel is not None and cancel.is_set():
            raise Interrupted(f"loading {p.name} was cancelled")
        if not model:
            reason = last_error(log) or "llama.cpp gave no reason"
            raise ModelFileError(
                f"llama.cpp could not load {p}: {reason}",
                "the file may be damaged or use an architecture this llama-cpp-python build does not know "
                "(`pip install -U llama-cpp-python`)",
            )
        return model

    def _recurrent_kind(self) -> str:
        """ "recurrent" (Mamba, RWKV), "hybrid" (recurrent beside attention layers) or "" (KV cache only)."""
        if llama_cpp.llama_model_is_recurrent(self._model):
            return "recurrent"
        return "hybrid" if llama_cpp.llama_model_is_hybrid(self._model) else ""

    def _new_context(self, n_ctx: int, n_batch: int, n_rs_seq: int) -> llama_cpp.llama_context_p:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch  # >= n_rs_seq + 1: a verify batch stays in one ubatch, as snapshots need
        params.n_seq_max = 1
        params.n_rs_seq = n_rs_seq
        if hasattr(params, "n_outputs_max_per_seq"):  # a sampler in the graph (forward_top2) may pick every row
            params.n_outputs_max_per_seq = n_batch
        params.n_threads = self._threads
        params.n_threads_batch = self._threads
        params.no_perf = True
        with LOG.capture() as log:
            ctx: llama_cpp.llama_context_p | None = llama_cpp.llama_init_from_model(self._model, params)
        if ctx and abort_check() is not None:
            llama_cpp.llama_set_abort_callback(ctx, abort_check(), ctypes.cast(self._abort_flag, ctypes.c_void_p))
        if not ctx:
            raise ModelFileError(
                f"llama.cpp could not create a context of {n_ctx:,} tokens: {last_error(log) or 'no reason given'}",
                "lower --n-ctx, or free memory",
            )
        return ctx

    def _describe(self, p: Path, n_gpu_layers: int) -> ModelInfo:
        device = _device(llama_cpp.llama_model_n_layer(self._model), self._threads, n_gpu_layers)
        return ModelInfo(
            backend=NAME,
            path=str(p),
            name=str(self._meta.get("general.name") or p.stem),
            architecture=self._header.architecture,
            device=device,
            n_ctx=llama_cpp.llama_n_ctx(self._ctx),
            n_params=int(llama_cpp.llama_model_n_params(self._model)),
            size_bytes=int(llama_cpp.llama_model_size(self._model)),
            recurrent=self._describe_rollback(),
        )

    def _describe_rollback(self) -> str:
        if not self._recurrent:
            return ""
        from localspec.recurrent import GGUF_SNAPSHOTS

        if self._n_rs_seq:
            how = f"llama.cpp snapshots undo up to {self._n_rs_seq} drafted tokens"
        elif self._header.architecture in GGUF_SNAPSHOTS:
            how = "no snapshots kept (no drafts to verify)"
        else:
            how = "no snapshots for this architecture in llama.cpp"
        return f"{self._recurrent} ({self._header.architecture}): {how}; longer rollbacks restore a saved state and re-feed the kept tokens"

    # -- Backend protocol -------------------------------------------------------------------------

    def vocab_info(self) -> VocabInfo:
        return VocabInfo.from_gguf_metadata(self._meta)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer(self.piece)

    def token_table(self) -> TokenTable:
        """The vocabulary for a grammar (decoding/grammar.py); built once (one call per token)."""
        if self._token_table is None:
            self._token_table = TokenTable(
                n_vocab=self._n_vocab,
                eog=self._eog,
                pieces=[self._grammar_piece(t) for t in range(self._n_vocab)],
                tokenize=self._tokenize_plain,
            )
        return self._token_table

    def fim_tokens(self) -> FimTokens | None:
        """The fill-in-the-middle tokens as llama.cpp reads them: the GGUF's tokenizer.ggml.fim_*_token_id,
        else found by their known texts (Qwen, CodeLlama, StarCoder, DeepSeek, ...); None unless all three."""
        ids = [int(f(self._vocab)) for f in (llama_cpp.llama_vocab_fim_pre, llama_cpp.llama_vocab_fim_suf,
                                              llama_cpp.llama_vocab_fim_mid)]  # fmt: skip
        return FimTokens(*ids) if all(0 <= i < self._n_vocab for i in ids) else None

    def _grammar_piece(self, token: int) -> bytes:
        """A token's bytes with specials rendered; control tokens (and added <...> tokens) marked with 0xff."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 256, 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, True)
        text = buf.raw[:n]
        attr = llama_cpp.llama_vocab_get_attr(self._vocab, token)
        user_control = attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED and text.startswith(b"<") and text.endswith(b">")
        return b"\xff" + text if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or user_control else text

    def _tokenize_plain(self, text: str) -> list[int]:
        return self.tokenize(text, add_special=False, parse_special=False)

    def chat_template(self) -> str | None:
        return self._meta.get("tokenizer.chat_template") or None

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        template: str | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        template = template or self.chat_template()
        if template is None:
            raise GenerationError(
                f"{self.info.name} ships no chat template", "give one with --chat-template, or use --raw"
            )
        return render_chat(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._special_text("tokenizer.ggml.bos_token_id"),
            eos_token=self._special_text("tokenizer.ggml.eos_token_id"),
            tools=tools,
            variables=variables,
        )

    def _special_text(self, key: str) -> str:
        tid = self._meta.get(key)
        tokens = self._meta.get("tokenizer.ggml.tokens") or []
        return tokens[tid] if tid is not None and 0 <= tid < len(tokens) else ""

    def abort(self, on: bool = True) -> None:
        self._abort_flag[0] = b"x" if on else b"\0"

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        if not tokens:
            raise ValueError("forward needs at least one token")
        if self._abort_flag.value:
            raise Interrupted("stopped before the forward pass")
        self._check_room(len(tokens), "raise --n-ctx (memory permitting), or lower --max-tokens")
        if self._recurrent and len(tokens) - 1 > self._n_rs_seq:
            self.checkpoint()  # the engine may cut this batch back further than the snapshots reach
        self._use_chain(None)  # whole rows: a pass with a sampler attached leaves them unwritten
        if len(tokens) > self._n_batch:
            return self._forward_chunked(tokens, all_logits)
        self._decode(tokens, all_logits)
        n_out = len(tokens) if all_logits else 1
        self.reads["rows"] += n_out
        ptr = llama_cpp.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self._n_vocab))

    def forward_top2(self, tokens: Sequence[int], *, all_rows: bool = True) -> TopTwo | None:
        """forward, but each row's best two tokens and their logits come back (all rows, or the last one), picked
        by a top-2 sampler in the model's graph (llama.cpp's backend sampling, on the GPU that runs the output
        layer), and no whole row is copied to the host. None, having fed nothing, where that does not pay or this
        build cannot (the output layer on the CPU, no backend sampling, a head reading the passes): the caller
        then uses forward. Switching between the two re-plans llama.cpp's graph, so a caller stays on
        one (the engine: forward for the prompt, this for every greedy round after it)."""
        if not tokens:
            raise ValueError("forward needs at least one token")
        if (all_rows and len(tokens) > self._n_batch) or not self._use_chain(("top2",)):
            return None
        self._decode_in_parts(tokens, all_rows)
        assert self._chain is not None
        picks = self._chain.picks(self._ctx, len(tokens) if all_rows else 1)
        self.reads["picks"] += len(picks)
        return picks

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
        where top_k > 0) by a sampler in the model's graph (llama.cpp's backend sampling, on the GPU that runs the
        output layer): one id a row reaches the host, and beside it (`probs`) the softmax it came from (drawn_probs;
        with top_k, drawn_candidates). Without `probs` only the ids are copied (samplers.KeepOnly), unless a chain
        that copies the softmax is attached already: changing chains re-plans llama.cpp's graph, and the copy is
        cheaper than a re-plan every time a run's rounds alternate.
        A new sampler's seed comes from `rng`. The draws are llama.cpp's transactional ones: a pass's row i uses
        the i-th uniform after those committed (commit_draws), so the caller commits each draw it emits, and a
        draw it drops (after a rejection) never shaped the output. None, having fed nothing, where that does not
        pay or this build cannot (as forward_top2)."""
        if not tokens:
            raise ValueError("forward needs at least one token")
        key = ("draw", float(temperature), int(top_k), True)
        if not probs and not (self._chain is not None and self._chain.key == key and self._chain.attached):
            key = key[:3] + (False,)
        if len(tokens) > self._n_batch or not self._use_chain(key, rng):
            return None
        self._decode_in_parts(tokens, True)
        draws = [int(llama_cpp.llama_get_sampled_token_ith(self._ctx, i)) for i in range(len(tokens))]
        self.reads["draws"] += len(draws)
        return draws

    def commit_draws(self, tokens: Sequence[int]) -> None:
        """The last pass's first len(tokens) draws were emitted: their uniforms are used up."""
        assert self._chain is not None and self._chain.key[0] == "draw"
        for t in tokens:
            llama_cpp.llama_sampler_accept(self._chain.chain, t)

    def drawn_probs(self, i: int) -> np.ndarray:
        """Row i's softmax(logits / T) of the last forward_draws pass, as the dist sampler computed it in the graph
        and llama.cpp copied it to the host beside the draw (a view of llama.cpp's buffer, valid until the next
        pass): the rule reads a few numbers of it, not the row."""
        ptr = llama_cpp.llama_get_sampled_probs_ith(self._ctx, i)
        if not ptr or llama_cpp.llama_get_sampled_probs_count_ith(self._ctx, i) != self._n_vocab:
            raise GenerationError(
                f"llama.cpp's dist sampler gave no probabilities for output row {i}",
                "set LOCALSPEC_LLAMA_VERBOSE=1 to see llama.cpp's log",
            )
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))

    def drawn_candidates(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row i's top_k ids and their softmax of the last forward_draws pass with a top_k (copies, k numbers each)."""
        n = llama_cpp.llama_get_sampled_candidates_count_ith(self._ctx, i)
        ids = llama_cpp.llama_get_sampled_candidates_ith(self._ctx, i)
        probs = llama_cpp.llama_get_sampled_probs_ith(self._ctx, i)
        if not n or not ids or not probs or llama_cpp.llama_get_sampled_probs_count_ith(self._ctx, i) != n:
            raise GenerationError(
                f"llama.cpp's top-k dist sampler gave no candidates for output row {i}",
                "set LOCALSPEC_LLAMA_VERBOSE=1 to see llama.cpp's log",
            )
        return np.ctypeslib.as_array(ids, shape=(n,)).astype(np.int64), np.ctypeslib.as_array(probs, shape=(n,)).copy()

    def _decode_in_parts(self, tokens: Sequence[int], all_rows: bool) -> None:
        if self._abort_flag.value:
            raise Interrupted("stopped before the forward pass")
        self._check_room(len(tokens), "raise --n-ctx (memory permitting), or lower --max-tokens")
        if self._recurrent and len(tokens) - 1 > self._n_rs_seq:
            self.checkpoint()
        for start in range(0, len(tokens), self._n_batch):  # a long prompt's last row: in parts, as forward's
            if start and self._abort_flag.value:
                raise Interrupted("stopped between parts of a long forward pass")
            self._decode(tokens[start : start + self._n_batch], all_rows)

    def _use_chain(self, key: tuple[str | float, ...] | None, rng: np.random.Generator | None = None) -> bool:
        """Attach the sampler chain `key` names to the sequence (("top2",), ("draw", temperature, top_k, probs)), or detach any
        (None); whether it is attached as asked. A chain is made fresh for each attach (llama.cpp initialises
        one for its graph once), a draw chain with a seed from `rng`."""
        if key is not None and self._chain is not None and self._chain.key == key and self._chain.attached:
            return True
        if self._chain is not None:
            self._chain.detach(self._ctx)
            self._chain.free()
            self._chain = None
        if key is None:
            return True
        kind = str(key[0])
        if not (self._picks_pay or PICK_ON_CPU):
            return False  # the logits are on the host already: its own passes over them are cheaper (PICK_ON_CPU)
        if self._captured or self._nextn is not None:
            return False  # a head reads this context's passes: leave its graph as the head expects
        if kind in self._refused or not _DeviceChain.available():
            return False
        seed = int(rng.integers(0, 2**32 - 1)) if rng is not None else 0
        chain = _DeviceChain(key, seed)
        if not chain.attach(self._ctx):
            chain.free()
            self._refused.add(kind)
            return False
        self._chain = chain
        return True

    def _forward_chunked(self, tokens: Sequence[int], all_logits: bool) -> np.ndarray:
        parts = []
        for start in range(0, len(tokens), self._n_batch):
            chunk = tokens[start : start + self._n_batch]
            last = start + self._n_batch >= len(tokens)
            if self._abort_flag.value:
                raise Interrupted("stopped between parts of a long forward pass")
            self._decode(chunk, all_logits)
            if all_logits or last:
                n_out = len(chunk) if all_logits else 1
                self.reads["rows"] += n_out
                ptr = llama_cpp.llama_get_logits(self._ctx)
                parts.append(np.ctypeslib.as_array(ptr, shape=(n_out, self._n_vocab)).copy())
        return np.concatenate(parts) if all_logits else parts[-1]

    def _decode(self, tokens: Sequence[int], all_logits: bool) -> None:
        b = self._batch
        n_past = len(self._tokens)
        n = len(tokens)
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = n_past + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = all_logits
        b.logits[n - 1] = True
        with LOG.capture() as log:
            rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            self._after_failed_decode(n_past)
            if rc == 2:  # the abort callback said stop
                raise Interrupted("stopped during a forward pass")
            raise GenerationError(
                f"llama_decode failed (code {rc}): {last_error(log) or 'no reason given'}",
                "this usually means the KV cache is full or out of memory; lower --n-ctx or --num-draft",
            )
        if self._captured:
            self._keep_features(n_past, n)
        if self._nextn is not None:
            self._keep_nextn(n_past, n)
        self._tokens.extend(int(t) for t in tokens)
        self._last_batch = n

    def _after_failed_decode(self, n_past: int) -> None:
        """A failed decode may leave part of the batch in the cache: cut back to what we track. A recurrent
        state may be half-updated, so it starts over empty (the next sync_cache feeds the tokens again)."""
        if self._recurrent:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, 0, -1)
            self._tokens.clear()
            self._ckpt = None
            self._last_batch = 0
        else:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, n_past, -1)

    # -- rollback ---------------------------------------------------------------------------------

    def _route(self, n_keep: int) -> RollbackRoute:
        reach = min(self._last_batch - 1, self._n_rs_seq) if self._last_batch else 0
        ckpt = self._ckpt.pos if self._ckpt is not None else None
        return rollback_route(
            len(self._tokens), n_keep, recurrent=bool(self._recurrent), snapshot_reach=reach, checkpoint_at=ckpt
        )

    # -- hidden states for drafters that read them (EAGLE-3, MTP) --------------------------------

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def abort_flag_pointer(self) -> ctypes.c_void_p:
        """The flag abort() sets, for the abort callback of a context that runs with this one (a head)."""
        return ctypes.cast(self._abort_flag, ctypes.c_void_p)

    @property
    def handle(self) -> tuple[llama_cpp.llama_model_p, llama_cpp.llama_context_p]:
        """(llama_model, llama_context) pointers, for a drafter that runs a head on this target."""
        if self._model is None or self._ctx is None:
            raise ValueError(f"{self._info.name} is closed")
        return self._model, self._ctx

    def capture_layers(self, layers: Sequence[int]) -> None:
        """From the next forward on, keep the inputs of `layers` for every cached position (features()),
        until each caller has called release_capture().

        UnsupportedModelError when the architecture lacks llama.cpp's capture hook (enabling it there
        would abort the process) or a layer does not exist; nothing is enabled then.
        """
        from localspec.backends.llama import ext as llama_ext

        n_layer = int(llama_cpp.llama_model_n_layer(self._model))
        llama_ext.check_capture_architecture(
            self._info.architecture, model_name=self._info.name, layer_ids=layers, n_layer=n_layer
        )
        self._capture_users += 1
        if tuple(layers) == self._captured:
            return
        for lid in set(self._captured) - set(layers):
            llama_ext.set_layer_capture(self._ctx, lid, False)
        for lid in layers:
            llama_ext.set_layer_capture(self._ctx, lid, True)
        n_embd = int(llama_cpp.llama_model_n_embd(self._model))
        self._captured = tuple(layers)
        self._features = np.zeros((self.n_ctx, len(layers) * n_embd), dtype=np.float32)
        self.rollback(0)  # positions cached before now have no features: the next forward recomputes them

    def release_capture(self) -> None:
        """A caller of capture_layers no longer needs the layer inputs; the last one turns the capture off
        (the cache stays as it is)."""
        from localspec.backends.llama import ext as llama_ext

        self._capture_users = max(0, self._capture_users - 1)
        if self._capture_users:
            return
        if self._ctx is not None:
            for lid in self._captured:
                llama_ext.set_layer_capture(self._ctx, lid, False)
        self._captured, self._features = (), None

    def features(self, start: int, stop: int) -> np.ndarray:
        """[stop - start, len(layers) * n_embd]: the captured layer inputs at cached positions, the
        layers side by side in the order given to capture_layers (a view: copy what must outlive a forward)."""
        if self._features is None or stop > len(self._tokens):
            raise ValueError(f"no features for positions {start}..{stop} ({len(self._tokens)} cached)")
        return self._features[start:stop]

    def _keep_features(self, n_past: int, n: int) -> None:
        from localspec.backends.llama import ext as llama_ext

        assert self._features is not None
        n_embd = self._features.shape[1] // len(self._captured)
        for k, lid in enumerate(self._captured):
            rows = np.ctypeslib.as_array(llama_ext.layer_inputs(self._ctx, lid), shape=(n, n_embd))
            self._features[n_past : n_past + n, k * n_embd : (k + 1) * n_embd] = rows

    @property
    def mtp_loaded(self) -> bool:
        """Whether the model was loaded with its MTP (nextn) layers (load_mtp)."""
        return self._load_mtp

    def keep_nextn_states(self) -> None:
        """From the next forward on, keep the nextn state (the hidden state an MTP head reads with the
        next token) of every cached position: nextn_states()."""
        from localspec.backends.llama import ext as llama_ext

        if self._nextn is not None:
            return
        llama_ext.set_nextn_output(self._ctx, True, masked=False)  # every row, not only those with logits
        n_embd = int(llama_cpp.llama_model_n_embd_out(self._model))
        self._nextn = np.zeros((self.n_ctx, n_embd), dtype=np.float32)
        self.rollback(0)  # positions cached before now have no states: the next forward recomputes them

    def nextn_states(self, start: int, stop: int) -> np.ndarray:
        """[stop - start, n_embd_out]: the kept nextn states at cached positions (a view)."""
        if self._nextn is None or stop > len(self._tokens):
            raise ValueError(f"no nextn states for positions {start}..{stop} ({len(self._tokens)} cached)")
        return self._nextn[start:stop]

    def _keep_nextn(self, n_past: int, n: int) -> None:
        from localspec.backends.llama import ext as llama_ext

        assert self._nextn is not None
        rows = np.ctypeslib.as_array(llama_ext.nextn_rows(self._ctx), shape=(n, self._nextn.shape[1]))
        self._nextn[n_past : n_past + n] = rows

    def rollback(self, n_keep: int) -> None:
        route = self._rollback_route(n_keep)
        if route == "none":
            return
        if route == "restore":
            self._restore_checkpoint(n_keep)
            return
        if not llama_cpp.llama_memory_seq_rm(self._memory, 0, n_keep, -1):
            raise UnsupportedModelError(
                f"llama.cpp could not roll the cache of {self._info.name} back to {n_keep} tokens",
                "speculative decoding needs a model whose cache can be cut back; use --draft-method none",
            )
        del self._tokens[n_keep:]
        self._last_batch = 0  # a snapshot is single-use: the next rollback needs a new batch or a checkpoint
        if n_keep == 0:
            self._ckpt = None

    def _refused_state(self) -> str:
        saved = f"its state was saved at {self._ckpt.pos} tokens" if self._ckpt else "no state was saved"
        return f"it can undo {self._n_rs_seq} tokens of its latest batch from snapshots and {saved}"

    def checkpoint(self) -> None:
        """Save the recurrent part of the state at the current length (see the module notes)."""
        if not self._recurrent:
            return
        n = len(self._tokens)
        if self._ckpt is not None and self._ckpt.pos == n:
            return  # same tokens, same state (a rollback below the checkpoint drops it)
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = llama_cpp.llama_state_seq_get_size_ext(self._ctx, 0, flags)
        buf = self._ckpt.data if self._ckpt is not None and len(self._ckpt.data) >= size else (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data_ext(self._ctx, buf, size, 0, flags)
        if written == 0:
            raise GenerationError(
                f"llama.cpp could not save the recurrent state of {self._info.name}", "see the message above"
            )
        self._ckpt = _Checkpoint(n, buf, int(written))

    def _restore_checkpoint(self, n_keep: int) -> None:
        """Back to the checkpoint's state, the attention cache cut to match, then the kept tokens fed again."""
        ckpt = self._ckpt
        assert ckpt is not None
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        if llama_cpp.llama_state_seq_set_data_ext(self._ctx, ckpt.data, ckpt.size, 0, flags) == 0:
            raise GenerationError(
                f"llama.cpp could not restore the recurrent state of {self._info.name}", "see the message above"
            )
        llama_cpp.llama_memory_seq_rm(self._memory, 0, ckpt.pos, -1)  # the attention layers' KV beyond it
        replay = self._tokens[ckpt.pos : n_keep]
        del self._tokens[ckpt.pos :]
        self._last_batch = 0
        if replay:
            self._forward_chunked(replay, False)

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None) is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_chain", None) is not None:
            self._chain.free()  # after the context that held it
            self._chain = None
        if getattr(self, "_model", None) is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()


class _DeviceChain:
    """A sampler chain attached to sequence 0: llama.cpp then runs it on each output row in the graph and copies
    what it gives instead of the row. ("top2",): a top-2 sampler, each row's two best tokens and their logits
    (the picks' rows lie n_vocab apart in llama.cpp's output buffer). ("draw", T, K, P): temperature T, a top-K
    sampler where K > 0, and a seeded dist sampler, one token a row drawn from softmax(logits / T) (over the
    top K), and that softmax where P (samplers.KeepOnly leaves the rest on the device)."""

    def __init__(self, key: tuple[str | float, ...], seed: int) -> None:
        self.key = key
        self.chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self.keep: samplers.KeepOnly | None = None  # the chain's last sampler, while the chain lives (it calls it)
        if key[0] == "top2":
            llama_cpp.llama_sampler_chain_add(self.chain, llama_cpp.llama_sampler_init_top_k(2))
        else:
            llama_cpp.llama_sampler_chain_add(self.chain, llama_cpp.llama_sampler_init_temp(float(key[1])))
            if int(key[2]) > 0:
                llama_cpp.llama_sampler_chain_add(self.chain, llama_cpp.llama_sampler_init_top_k(int(key[2])))
            llama_cpp.llama_sampler_chain_add(self.chain, llama_cpp.llama_sampler_init_dist(seed))
            if samplers.available():  # the scaled logits stay on the device (and the softmax, where it is not read)
                self.keep = samplers.KeepOnly(probs=bool(key[3]))
                llama_cpp.llama_sampler_chain_add(self.chain, self.keep.sampler)
        self.attached = False

    @staticmethod
    def available() -> bool:
        """Whether this llama-cpp-python has backend sampling (older builds do not)."""
        needed = ("llama_set_sampler", "llama_get_sampled_logits_ith", "llama_get_sampled_candidates_ith",
                  "llama_get_sampled_token_ith")  # fmt: skip
        return all(hasattr(llama_cpp, name) for name in needed)

    def attach(self, ctx: llama_cpp.llama_context_p) -> bool:
        """Whether llama.cpp took it into the graph (it says why not in its log)."""
        with LOG.capture():
            self.attached = bool(llama_cpp.llama_set_sampler(ctx, 0, self.chain))
        return self.attached

    def detach(self, ctx: llama_cpp.llama_context_p) -> None:
        if self.attached:
            with LOG.capture():
                llama_cpp.llama_set_sampler(ctx, 0, None)
            self.attached = False

    def picks(self, ctx: llama_cpp.llama_context_p, n: int) -> TopTwo:
        """The picks of the last pass's n output rows (n = 1: its last position's; else every position's): native
        calls for the first row's address and the last's (the rows' spacing checked), then plain reads of the n
        pairs: a few dozen numbers, where array work (strided views, swaps by mask) cost several times more."""
        ids, logits = self._row(ctx, 0 if n > 1 else -1)  # by position in the batch; -1: its last
        if n == 1:  # a draft step
            return TopTwo(*_pairs([_ordered(ids[0], ids[1], logits[0], logits[1])]))
        last_ids, last_logits = self._row(ctx, n - 1)
        si, sl = _spacing(ids, last_ids, n), _spacing(logits, last_logits, n)
        pairs = [_ordered(ids[i * si], ids[i * si + 1], logits[i * sl], logits[i * sl + 1]) for i in range(n)]
        return TopTwo(*_pairs(pairs))

    def _row(self, ctx: llama_cpp.llama_context_p, i: int) -> tuple[Any, Any]:
        """Row i's pointers to its two candidate ids and their logits."""
        ids = llama_cpp.llama_get_sampled_candidates_ith(ctx, i)
        logits = llama_cpp.llama_get_sampled_logits_ith(ctx, i)
        if not ids or not logits or llama_cpp.llama_get_sampled_logits_count_ith(ctx, i) != 2:
            raise GenerationError(
                f"llama.cpp's top-2 sampler gave no picks for output row {i}",
                "set LOCALSPEC_LLAMA_VERBOSE=1 to see llama.cpp's log",
            )
        return ids, logits

    def free(self) -> None:
        llama_cpp.llama_sampler_free(self.chain)


def _spacing(first: Any, last: Any, n: int) -> int:
    """How many elements apart n rows lie in one buffer, from pointers to the first row and the last."""
    size = ctypes.sizeof(first._type_)
    step, rest = divmod(ctypes.addressof(last.contents) - ctypes.addressof(first.contents), (n - 1) * size)
    if rest or step <= 0:
        raise GenerationError("llama.cpp's top-2 picks are not laid out one row apart", "please report this")
    return step


def _ordered(a: int, b: int, la: float, lb: float) -> tuple[int, int, float, float]:
    """Two picks best first (an exact tie: the lower id first, as numpy's arg-max)."""
    if lb > la or (lb == la and b < a):
        return b, a, lb, la
    return a, b, la, lb


def _pairs(rows: list[tuple[int, int, float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """[n, 2] ids and [n, 2] float32 logits from rows of (best, runner-up, their logits)."""
    return (
        np.array([(a, b) for a, b, _, _ in rows], dtype=np.int64),
        np.array([(la, lb) for _, _, la, lb in rows], dtype=np.float32),
    )


@dataclass
class _Checkpoint:
    pos: int  # cached tokens when it was saved
    data: ctypes.Array[ctypes.c_uint8]  # llama_state_seq_get_data_ext output (recurrent state only)
    size: int


def last_error(log: Sequence[str]) -> str:
    """The captured line that best explains a failure: the last naming an error, else the last one."""
    lines = [line.strip() for line in log if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return (errors or lines or [""])[-1]
