"""The draft/target vocabulary compatibility rule (llama.cpp's), one test per rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localspec.errors import IncompatiblePairError
from localspec.vocab import (
    CHECK_START_TOKEN_ID,
    MAX_VOCAB_SIZE_DIFFERENCE,
    VocabInfo,
    check_compatible,
    incompatibilities,
)


def _tokens(n: int) -> list[str]:
    return ["<unk>", "<s>", "</s>", "<pad>", "<mask>"] + [f"tok{i}" for i in range(5, n)]


BASE = VocabInfo("gpt2", 1000, 1, 2, True, False, _tokens(1000))


def _one(target: VocabInfo, draft: VocabInfo) -> str:
    diffs = incompatibilities(target, draft)
    assert len(diffs) == 1, diffs
    return diffs[0]


def test_identical_vocabularies_are_compatible() -> None:
    assert incompatibilities(BASE, replace(BASE, tokens=list(BASE.tokens))) == []
    check_compatible(BASE, BASE, target_name="t", draft_name="d")


def test_vocabulary_type() -> None:
    msg = _one(BASE, replace(BASE, vocab_type="llama"))
    assert "type" in msg and "'gpt2'" in msg and "'llama'" in msg


def test_add_bos_flag() -> None:
    msg = _one(BASE, replace(BASE, add_bos=False))
    assert "BOS" in msg and "True" in msg and "False" in msg


def test_add_eos_flag() -> None:
    msg = _one(BASE, replace(BASE, add_eos=True))
    assert "EOS" in msg and "True" in msg and "False" in msg


def test_bos_id_when_bos_is_added() -> None:
    msg = _one(BASE, replace(BASE, bos_id=7))
    assert "BOS" in msg and "1" in msg and "7" in msg


def test_bos_id_ignored_when_neither_adds_bos() -> None:
    target = replace(BASE, add_bos=False)
    assert incompatibilities(target, replace(target, bos_id=7)) == []


def test_eos_id() -> None:
    msg = _one(BASE, replace(BASE, eos_id=9))
    assert "EOS" in msg and "2" in msg and "9" in msg


@pytest.mark.parametrize("gap", [1, MAX_VOCAB_SIZE_DIFFERENCE])
def test_size_difference_up_to_128_is_allowed(gap: int) -> None:
    draft = replace(BASE, n_vocab=BASE.n_vocab + gap, tokens=_tokens(BASE.n_vocab + gap))
    assert incompatibilities(BASE, draft) == []
    assert incompatibilities(draft, BASE) == []


def test_size_difference_over_128() -> None:
    n = BASE.n_vocab + MAX_VOCAB_SIZE_DIFFERENCE + 1
    draft = replace(BASE, n_vocab=n, tokens=_tokens(n))
    msg = _one(BASE, draft)
    assert "129" in msg and "1,000" in msg and "1,129" in msg and "128" in msg
    assert "129" in _one(draft, BASE)


def test_token_text_from_id_5() -> None:
    tokens = list(BASE.tokens)
    tokens[CHECK_START_TOKEN_ID] = "other"
    tokens[700] = "other700"
    msg = _one(BASE, replace(BASE, tokens=tokens))
    assert "2 ids" in msg and "id 5" in msg and "'tok5'" in msg and "'other'" in msg and "id 700" in msg


def test_token_text_below_id_5_is_not_compared() -> None:
    tokens = list(BASE.tokens)
    tokens[:CHECK_START_TOKEN_ID] = ["a", "b", "c", "d", "e"]
    assert incompatibilities(BASE, replace(BASE, tokens=tokens)) == []


def test_token_text_listing_is_capped() -> None:
    tokens = [f"x{i}" for i in range(BASE.n_vocab)]
    msg = _one(BASE, replace(BASE, tokens=tokens))
    assert f"{BASE.n_vocab - CHECK_START_TOKEN_ID} ids" in msg
    assert msg.count("id ") == 3  # max_listed


def test_token_text_compared_over_the_common_range_only() -> None:
    n = BASE.n_vocab + 50
    draft = replace(BASE, n_vocab=n, tokens=[*BASE.tokens, *(f"extra{i}" for i in range(50))])
    assert incompatibilities(BASE, draft) == []


def test_every_difference_is_listed_and_the_error_names_both_models() -> None:
    draft = VocabInfo("llama", 32000, 5, 6, False, True, [f"y{i}" for i in range(32000)])
    diffs = incompatibilities(BASE, draft)
    assert len(diffs) == 7  # type, add-BOS, add-EOS, BOS id (the target adds BOS), EOS id, size, text
    with pytest.raises(IncompatiblePairError) as err:
        check_compatible(BASE, draft, target_name="big.gguf", draft_name="small.gguf")
    assert "small.gguf" in err.value.message and "big.gguf" in err.value.message
    assert "ngram" in err.value.hint


def test_from_gguf_metadata_defaults() -> None:
    spm = VocabInfo.from_gguf_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"]})
    assert spm.add_bos and not spm.add_eos and spm.n_vocab == 2 and spm.bos_id is None
    bpe = VocabInfo.from_gguf_metadata(
        {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.eos_token_id": 0}
    )
    assert not bpe.add_bos and bpe.eos_id == 0
    assert VocabInfo.from_gguf_metadata({}).vocab_type == "unknown"
