"""MTP drafting on llama.cpp: the target's own multi-token-prediction (nextn) layers draft ahead.

The loop follows llama.cpp's (common/speculative.cpp, common_speculative_impl_draft_mtp):
- the target is loaded with its MTP layers (load_mtp) and keeps its nextn state h[P] for every cached
  position (LlamaCppBackend.keep_nextn_states); h[P] is the hidden state that predicts token P+1;
- a second context of type MTP on the same model runs the head. At position P it holds the pair
  (token[P], h[P-1]), with zeros for h[-1], so for a context of N tokens its cache holds positions
  0..N-1, and the last pair's output is the first draft token's distribution;
- drafting feeds (draft token, the head's own nextn state) step by step from position N on, re-using
  the single head autoregressively (llama.cpp's mode for qwen35, glm4moe, deepseek2, ...).
The head's logits are over the target's vocabulary (it shares the target's output), so its q rows go
straight to the exact rule.

Rollback: the head's cache is cut back to the pairs still true for the new context at every proposal
(pairs written while drafting carry the head's own states, not the target's, so they never count).

Models with several MTP heads (step35, mimo2, hy_v3 with n_layer_nextn > 1), which llama.cpp chains one
head per draft step, are refused for now.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.backends import llama_ext
from localspec.backends.base import common_prefix
from localspec.backends.llama_batch import ExtBatch, HeadResources, head_context, process
from localspec.backends.llama_cpp import LlamaCppBackend, read_header
from localspec.draft import EMPTY_DRAFT, Draft, sample_draft
from localspec.sampling import SamplingParams
from localspec.errors import UnsupportedModelError

# Architectures with an MTP graph in the llama.cpp vendored by llama-cpp-python 0.3.36 (src/models/*.cpp,
# LLM_GRAPH_TYPE_DECODER_MTP). Creating an MTP context on any other one fails; on these, a GGUF without
# the MTP block's tensors aborts the process (GGML_ASSERT in the graph), hence check_target.
MTP_ARCHITECTURES = frozenset({
    "deepseek2", "deepseek32", "deepseek4", "glm4moe", "glm-dsa", "glm5-next", "qwen3next", "qwen35",
    "qwen35moe", "step35", "mimo2", "bailingmoe3", "cohere2moe", "nemotron_h_moe", "hy_v3",
})  # fmt: skip

_MTP_HINT = (
    "--draft-method mtp needs a target GGUF that keeps its MTP layers (often released as \"...-MTP-GGUF\"), "
    "e.g. GLM-4.5-Air, Qwen3.5 or DeepSeek-V3 converted with them; otherwise use --draft-method ngram or model"
)


def mtp_layers(target_path: str | Path) -> int:
    """How many MTP heads the target GGUF declares (`<arch>.nextn_predict_layers`; 0: none)."""
    header = read_header(target_path)
    return int(header.metadata.get(f"{header.architecture}.nextn_predict_layers") or 0)


def check_target(target_path: str | Path) -> None:
    """From the header alone: the target can draft for itself with MTP here. Raises UnsupportedModelError
    (before llama.cpp sees anything that would abort the process)."""
    header = read_header(target_path)
    name, arch = Path(target_path).name, header.architecture
    n_mtp = mtp_layers(target_path)
    if n_mtp == 0:
        raise UnsupportedModelError(f"{name} has no MTP layers (no {arch}.nextn_predict_layers)", _MTP_HINT)
    if arch not in MTP_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{name} declares {n_mtp} MTP layer(s), but this llama.cpp has no MTP graph for {arch!r} models",
            "`pip install -U llama-cpp-python` may add it; until then use --draft-method ngram or model",
        )
    first = int(header.metadata.get(f"{arch}.block_count") or 0) - n_mtp  # the MTP blocks come last
    if not any(t.name.startswith(f"blk.{first}.") for t in header.tensors):
        raise UnsupportedModelError(
            f"{name} declares {n_mtp} MTP layer(s), but the file holds no weights for them (block {first})",
            _MTP_HINT,
        )
    if n_mtp > 1:
        raise UnsupportedModelError(
            f"{name} has {n_mtp} chained MTP heads; localspec drives models with a single MTP head only so far",
            "use --draft-method ngram or model with this target",
        )


class MtpDrafter(HeadResources):
    """Drafts with the target's own MTP head on llama.cpp. Owns the head's context (and its cache);
    borrows the target, which must have been loaded with load_mtp, and whose nextn states it turns on."""

    method = "mtp"

    def __init__(self, target: LlamaCppBackend) -> None:
        self._ctx = None
        self._batch: ExtBatch | None = None
        llama_ext.require_family("mtp")
        check_target(target.info.path)
        if not target.mtp_loaded:
            raise UnsupportedModelError(
                f"{target.info.name} was loaded without its MTP layers",
                "load the target for --draft-method mtp (localspec does so when that method is chosen at load time)",
            )
        self.target = target
        self.name = f"mtp:{Path(target.info.path).stem}"
        try:
            model, _ = target.handle
            self._ctx = head_context(
                model, target, what="the MTP head", n_ctx=target.n_ctx, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP
            )
            self._batch = ExtBatch(self._ctx)
            self._n_batch = int(llama_cpp.llama_n_batch(self._ctx))
            self._n_embd = int(llama_cpp.llama_model_n_embd_out(model))
            self._n_vocab = target.n_vocab
            self._memory = llama_cpp.llama_get_memory(self._ctx)
            target.keep_nextn_states()
        except BaseException:
            self.close()
            raise
        self._written: list[int] = []  # the context whose pairs the head's cache holds (one per position)
        self._pos = 0  # while drafting: the next draft token's position
        self._state = np.empty(0, np.float32)  # while drafting: the head's nextn state for that position
        self._zeros = np.zeros(self._n_embd, np.float32)  # h[-1], paired with the first token

    # -- Drafter protocol -------------------------------------------------------------------------

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        self._written = []
        llama_cpp.llama_memory_seq_rm(self._memory, 0, 0, -1)
        self.catch_up(context)

    def lag(self, context: Sequence[int]) -> int:
        return max(0, self._n_pairs(context) - self._n_valid(context))

    def catch_up(self, context: Sequence[int]) -> None:
        self._sync(context, output=False)

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator, *, min_confidence: float = 0.0
    ) -> Draft:
        k = min(k, self.target.n_ctx - len(context) + 1)
        if k <= 0 or not context or self._n_pairs(context) < len(context):
            return EMPTY_DRAFT  # no target state for the last position (e.g. the target did not take it in)
        logits, self._state = self._sync(context, output=True)
        self._pos = len(context)
        tokens, q, note = sample_draft(logits, self._step, k, sampling, rng, min_confidence, self.target.eog_ids)
        return Draft(tokens, q, note, source="mtp")

    def _step(self, token: int) -> np.ndarray:
        """Feed (draft token, the head's own last state) at the next position; its logits [V]."""
        self._batch.clear()  # type: ignore[union-attr]
        self._batch.add(token, self._state, self._pos, True)  # type: ignore[union-attr]
        logits, self._state = self._decode_last()
        self._pos += 1
        return logits

    # -- the head's cache -------------------------------------------------------------------------

    def _n_pairs(self, context: Sequence[int]) -> int:
        """Pairs this context can have: pair P needs the target's state at P-1."""
        have = common_prefix(self.target.cached_tokens, context, limit=len(context))
        return min(len(context), have + 1)

    def _n_valid(self, context: Sequence[int]) -> int:
        """Pairs in the head's cache still true for `context`: pair P needs context[0..P] unchanged."""
        return common_prefix(self._written, context, limit=len(context))

    def _sync(self, context: Sequence[int], *, output: bool) -> tuple[np.ndarray, np.ndarray]:
        """Cut the head's cache back to the pairs still true, write the missing ones; with `output`,
        return the logits [V] and nextn state [E] of the last pair (re-fed if it was already there).

        The last pair goes in a batch of its own, as in llama.cpp's loop: MTP graphs set their nextn
        output before picking the output rows, so in a batch with one output flag llama.cpp would hand
        back the first row's state, not the flagged one's.
        """
        n_pairs = self._n_pairs(context)
        if output and n_pairs == 0:
            raise ValueError("no pair to draft from: the context is empty")
        keep = min(self._n_valid(context), n_pairs - 1 if output else n_pairs)
        llama_cpp.llama_memory_seq_rm(self._memory, 0, keep, -1)
        self._written = list(context[:keep])  # what holds if a write below fails or is aborted
        if keep >= n_pairs:
            return np.empty(0, np.float32), np.empty(0, np.float32)
        base = max(keep - 1, 0)
        h = self.target.nextn_states(base, n_pairs - 1)  # h[P-1] for P in keep..n_pairs-1
        silent = n_pairs - 1 if output else n_pairs  # pairs written without outputs
        for start in range(keep, silent, self._n_batch):
            stop = min(start + self._n_batch, silent)
            self._batch.clear()  # type: ignore[union-attr]
            for p in range(start, stop):
                self._batch.add(context[p], h[p - 1 - base] if p > 0 else self._zeros, p, False)  # type: ignore[union-attr]
            self._process()
            self._written = list(context[:stop])
        if not output:
            return np.empty(0, np.float32), np.empty(0, np.float32)
        p = n_pairs - 1
        self._batch.clear()  # type: ignore[union-attr]
        self._batch.add(context[p], h[p - 1 - base] if p > 0 else self._zeros, p, True)  # type: ignore[union-attr]
        result = self._decode_last()
        self._written = list(context[:n_pairs])
        return result

    def _decode_last(self) -> tuple[np.ndarray, np.ndarray]:
        """Decode a batch of one output row; its logits [V] and nextn state [E] (copies)."""
        self._process()
        last = self._batch.n - 1  # type: ignore[union-attr]
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, last), shape=(self._n_vocab,)).copy()
        state = np.ctypeslib.as_array(llama_ext.nextn_row(self._ctx, last), shape=(self._n_embd,)).copy()
        return logits, state

    def _process(self) -> None:
        process(
            self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self._batch,  # type: ignore[arg-type]
            what="the MTP head", hint="lower --n-ctx or -k, or use --draft-method ngram",
        )
