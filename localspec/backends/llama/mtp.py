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

from localspec.backends.llama import ext as llama_ext
from localspec.backends.llama.backend import LlamaCppBackend, read_header
from localspec.backends.llama.head import PairAt, StepDrafter
from localspec.errors import UnsupportedModelError

# Architectures with an MTP graph in the llama.cpp vendored by llama-cpp-python 0.3.36 (src/models/*.cpp,
# LLM_GRAPH_TYPE_DECODER_MTP). Creating an MTP context on any other one fails; on these, a GGUF without
# the MTP block's tensors aborts the process (GGML_ASSERT in the graph), hence check_target.
MTP_ARCHITECTURES = frozenset({
    "deepseek2", "deepseek32", "deepseek4", "glm4moe", "glm-dsa", "glm5-next", "qwen3next", "qwen35",
    "qwen35moe", "step35", "mimo2", "bailingmoe3", "cohere2moe", "nemotron_h_moe", "hy_v3",
})  # fmt: skip

_MTP_HINT = (
    '--draft-method mtp needs a target GGUF that keeps its MTP layers (often released as "...-MTP-GGUF"), '
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


class MtpDrafter(StepDrafter):
    """Drafts with the target's own MTP head on llama.cpp. Owns the head's context (and its cache);
    borrows the target, which must have been loaded with load_mtp, and whose nextn states it turns on."""

    method = "mtp"
    LOOKAHEAD = 0  # pair P is (token[P], h[P-1])

    def __init__(self, target: LlamaCppBackend) -> None:
        llama_ext.require_family("mtp")
        check_target(target.info.path)
        if not target.mtp_loaded:
            raise UnsupportedModelError(
                f"{target.info.name} was loaded without its MTP layers",
                "load the target for --draft-method mtp (localspec does so when that method is chosen at load time)",
            )
        what, hint = "the MTP head", "lower --n-ctx or -k, or use --draft-method ngram"
        super().__init__(target, f"mtp:{Path(target.info.path).stem}", what=what, hint=hint)
        with self._closed_on_error():
            model, _ = target.handle
            n_embd_out = int(llama_cpp.llama_model_n_embd_out(model))
            self._open(model, n_ctx=target.n_ctx, n_nextn=n_embd_out, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
            target.keep_nextn_states()
            self._zeros = np.zeros(n_embd_out, np.float32)  # h[-1], paired with the first token

    def _n_pairs(self, context: Sequence[int]) -> int:
        """Pair P needs the target's state at P-1."""
        return min(len(context), self._held(context) + 1)

    def _rows(self, context: Sequence[int], start: int, stop: int) -> PairAt:
        first = max(start - 1, 0)
        h = self.target.nextn_states(first, stop - 1)  # h[P-1] for P in start..stop-1
        return lambda p: (context[p], h[p - 1 - first] if p > 0 else self._zeros)
