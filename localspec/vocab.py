"""Vocabulary facts of a model and the rule that decides whether a draft can serve a target.

The rule is llama.cpp's (common/speculative.cpp): same vocabulary type, same BOS/EOS where they are
used, sizes within 128, identical token text from id 5 up. Draft token ids are fed straight to the
target, so any mismatch makes the draft propose the wrong tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.errors import IncompatiblePairError

MAX_VOCAB_SIZE_DIFFERENCE = 128
CHECK_START_TOKEN_ID = 5


@dataclass(frozen=True)
class VocabInfo:
    vocab_type: str  # llama.cpp tokenizer model: "gpt2", "llama", ...; for HF tokenizers the class family
    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    tokens: Sequence[str]  # token text by id

    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> VocabInfo:
        tokens = meta.get("tokenizer.ggml.tokens") or []
        model = str(meta.get("tokenizer.ggml.model", "unknown"))
        # llama.cpp's defaults when the flags are absent: SPM adds BOS, BPE does not.
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama"))
        return cls(
            vocab_type=model,
            n_vocab=len(tokens),
            bos_id=_opt_int(meta.get("tokenizer.ggml.bos_token_id")),
            eos_id=_opt_int(meta.get("tokenizer.ggml.eos_token_id")),
            add_bos=add_bos,
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            tokens=tokens,
        )


def _opt_int(v: object) -> int | None:
    return None if v is None else int(v)  # type: ignore[call-overload]


def incompatibilities(target: VocabInfo, draft: VocabInfo, *, max_listed: int = 3) -> list[str]:
    """Every way the draft's vocabulary differs from the target's; empty when compatible."""
    diffs: list[str] = []
    if target.vocab_type != draft.vocab_type:
        diffs.append(f"vocabulary type differs: target {target.vocab_type!r}, draft {draft.vocab_type!r}")
    if target.add_bos != draft.add_bos:
        diffs.append(f"add-BOS flag differs: target {target.add_bos}, draft {draft.add_bos}")
    if target.add_eos != draft.add_eos:
        diffs.append(f"add-EOS flag differs: target {target.add_eos}, draft {draft.add_eos}")
    if target.add_bos and target.bos_id != draft.bos_id:
        diffs.append(f"BOS token differs: target {target.bos_id}, draft {draft.bos_id}")
    if target.eos_id != draft.eos_id:
        diffs.append(f"EOS token differs: target {target.eos_id}, draft {draft.eos_id}")
    gap = abs(target.n_vocab - draft.n_vocab)
    if gap > MAX_VOCAB_SIZE_DIFFERENCE:
        diffs.append(
            f"vocabulary sizes differ by {gap} (target {target.n_vocab:,}, draft {draft.n_vocab:,}; "
            f"at most {MAX_VOCAB_SIZE_DIFFERENCE} allowed)"
        )
    n = min(target.n_vocab, draft.n_vocab, len(target.tokens), len(draft.tokens))
    mismatched = [i for i in range(CHECK_START_TOKEN_ID, n) if target.tokens[i] != draft.tokens[i]]
    if mismatched:
        shown = ", ".join(
            f"id {i}: target {target.tokens[i]!r} vs draft {draft.tokens[i]!r}" for i in mismatched[:max_listed]
        )
        diffs.append(f"token text differs for {len(mismatched):,} ids ({shown})")
    return diffs


def check_compatible(target: VocabInfo, draft: VocabInfo, *, target_name: str, draft_name: str) -> None:
    diffs = incompatibilities(target, draft)
    if diffs:
        raise IncompatiblePairError(
            f"draft {draft_name} cannot serve target {target_name}: " + "; ".join(diffs),
            "pick a draft from the same model family and tokenizer (see `localspec models`), "
            "or use --draft-method ngram, which needs no draft model",
        )
