"""Drafters: n-gram prompt lookup against a brute-force reference, and the model drafter's cache."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import EOG, FakeBackend, hashed_logits, scripted_tokens

from localspec.backends.base import common_prefix
from localspec.decoding.drafters import ModelDrafter, NgramDrafter, NoDrafter
from localspec.draft import EMPTY_DRAFT
from localspec.sampling import SamplingParams, probabilities

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def _lookup(context: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Brute force: longest suffix n-gram with an earlier occurrence, the latest one, what followed."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):  # occurrences ending before the last token
            if context[start : start + n] == suffix:
                return context[start + n : start + n + k]
    return []


def _propose(d: NgramDrafter, context: list[int], k: int) -> list[int]:
    draft = d.propose(context, k, GREEDY, RNG)
    assert draft.q is None
    return draft.tokens


def test_latest_earlier_occurrence() -> None:
    d = NgramDrafter(max_ngram=1)
    #         0  1  2  3  4  5  6
    context = [5, 1, 6, 7, 5, 2, 5]
    assert _propose(d, context, 2) == [2, 5]  # "5" last seen before the end at index 4


def test_prefers_longer_ngrams() -> None:
    d = NgramDrafter(max_ngram=3)
    # "8 9" occurs at 0 (followed by 1) and "7 8 9" at 4 (followed by 2); "9" alone latest at 6 -> 3.
    context = [8, 9, 1, 0, 7, 8, 9, 2, 9, 3, 7, 8, 9]
    assert _propose(d, context, 1) == [2]
    d2 = NgramDrafter(max_ngram=2)
    assert _propose(d2, context, 1) == [2]  # "8 9" latest earlier occurrence at 5 -> 2
    d1 = NgramDrafter(max_ngram=1)
    assert _propose(d1, context, 1) == [3]


def test_proposes_at_most_k() -> None:
    context = [1, 2, 3, 4, 5, 6, 7, 1]
    for k in range(1, 10):
        assert _propose(NgramDrafter(), context, k) == [2, 3, 4, 5, 6, 7, 1][:k]


def test_nothing_without_a_match() -> None:
    d = NgramDrafter()
    assert _propose(d, [1, 2, 3, 4], 4) == []
    assert _propose(d, [7], 4) == []
    assert _propose(d, [], 4) == []
    assert d.propose([1, 1, 1], 0, GREEDY, RNG) is EMPTY_DRAFT


def test_min_ngram_excludes_short_matches() -> None:
    context = [1, 2, 3, 9, 4, 3]
    assert _propose(NgramDrafter(min_ngram=1), context, 1) == [9]
    assert _propose(NgramDrafter(min_ngram=2), context, 1) == []


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 1), (4, 2), (1, 1)])
def test_index_stays_right_as_the_context_grows(seed: int, max_ngram: int, min_ngram: int) -> None:
    """One drafter over a context growing by 1..5 tokens at a time equals a brute-force lookup each time."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 6, size=300).tolist()  # a small alphabet: many repeats
    d = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    d.prepare(tokens[:10], 8)
    n = 10
    while n < len(tokens):
        ctx = tokens[:n]
        k = int(rng.integers(1, 6))
        assert _propose(d, ctx, k) == _lookup(ctx, k, max_ngram, min_ngram), n
        n += int(rng.integers(1, 6))


def test_prepare_resets_for_a_new_generation() -> None:
    d = NgramDrafter()
    assert _propose(d, [1, 2, 3, 1, 2], 2) == [3, 1]
    d.prepare([9, 8], 8)
    assert _propose(d, [9, 8, 7, 9], 2) == [8, 7]  # nothing of the old context left in the index
    # A shorter context than the one indexed, without prepare(), also starts over.
    assert _propose(d, [4, 5, 4], 2) == [5, 4]


def test_same_length_different_context_needs_prepare() -> None:
    """The index assumes an append-only context within one generation; prepare() starts a new one."""
    d = NgramDrafter()
    _propose(d, [1, 2, 3, 1], 2)
    d.prepare([5, 6, 7, 5], 8)
    assert _propose(d, [5, 6, 7, 5], 2) == [6, 7]


# -- the gated n-gram drafter (the `ngram` method): llama-lookup's context-cache statistics ----------------


def _likely(context: list[int], k: int, max_ngram: int = 4) -> list[int]:
    """Brute force of llama.cpp's context-cache draft: per token, the longest n-gram ending the text (draft
    included) seen often enough whose most frequent continuation holds a large enough share."""
    min_count, min_share = (2, 2, 1, 1), (0.66, 0.5, 0.5, 0.5)
    out: list[int] = []
    while len(out) < k:
        text = context + out
        pick = None
        for n in range(min(max_ngram, len(text)), 0, -1):
            follow: dict[int, int] = {}
            for start in range(len(context) - n):  # occurrences whose continuation is committed text
                if context[start : start + n] == text[-n:]:
                    follow[context[start + n]] = follow.get(context[start + n], 0) + 1
            if follow:
                tok, best = max(follow.items(), key=lambda kv: kv[1])  # first seen wins a tie, as dicts keep order
                total = sum(follow.values())
                if total >= min_count[min(n, 4) - 1] and best >= min_share[min(n, 4) - 1] * total:
                    pick = tok
                    break
        if pick is None:
            break
        out.append(pick)
    return out


def test_gated_ngram_skips_a_pair_seen_once_and_an_ambiguous_word() -> None:
    gated = NgramDrafter(max_ngram=4, gate=True)
    # "5" seen once before (followed by 6): one sighting of a single token is not evidence (needs 2).
    assert _propose(NgramDrafter(max_ngram=4), [5, 6, 1, 2, 5], 2) == [6, 1]
    assert _propose(gated, [5, 6, 1, 2, 5], 2) == []
    # "5" seen 3 times with 3 different continuations: no continuation holds 66%.
    gated.prepare([], 8)
    assert _propose(gated, [5, 1, 5, 2, 5, 3, 5], 2) == []
    # "5" followed by 6 twice out of three: 66% holds it; then "5 6" seen twice, both followed by 7.
    gated.prepare([], 8)
    assert _propose(gated, [5, 6, 7, 5, 6, 7, 5, 3, 5], 3) == [6, 7, 5]


def test_gated_ngram_copies_a_repeated_block_in_full() -> None:
    block = [10, 11, 12, 13, 14, 15, 16, 17]
    context = [1, *block, 2, 3, *block[:3]]
    # "10 11 12" seen once: a 3-gram needs one sighting, and its continuation is the block's rest.
    assert _propose(NgramDrafter(max_ngram=4, gate=True), context, 8) == [13, 14, 15, 16, 17, 2, 3, 10]


@pytest.mark.parametrize("seed", range(6))
def test_gated_index_equals_brute_force_as_the_context_grows(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 5, size=240).tolist()
    d = NgramDrafter(max_ngram=4, gate=True)
    d.prepare(tokens[:8], 8)
    n = 8
    while n < len(tokens):
        ctx = tokens[:n]
        k = int(rng.integers(1, 7))
        assert _propose(d, ctx, k) == _likely(ctx, k), n
        n += int(rng.integers(1, 6))


def test_no_drafter() -> None:
    d = NoDrafter()
    d.prepare([1, 2], 8)
    assert d.propose([1, 2, 1], 4, GREEDY, RNG) is EMPTY_DRAFT
    assert (d.method, d.name) == ("none", "none")


# -- ModelDrafter ---------------------------------------------------------------------------------------


def test_model_drafter_greedy_follows_its_model_and_keeps_its_cache_in_step() -> None:
    fn = hashed_logits(3)
    backend = FakeBackend(fn, name="tiny")
    d = ModelDrafter(backend)
    assert d.name == "tiny" and d.method == "model"
    prompt = [10, 20, 30, 40]
    d.prepare(prompt, 8)
    assert list(backend.cached_tokens) == prompt[:-1]
    draft = d.propose(prompt, 3, GREEDY, RNG)
    ctx, expect = list(prompt), []
    for _ in range(3):
        expect.append(int(np.argmax(fn(ctx))))
        ctx.append(expect[-1])
    assert draft.tokens == expect and draft.q is None
    assert list(backend.cached_tokens) == prompt + expect[:-1]  # the last draft token is never fed
    # The engine accepted one draft token and the target added its own: the drafter rolls back to it.
    context = [*prompt, expect[0], 99]
    d.propose(context, 2, GREEDY, RNG)
    assert list(backend.cached_tokens[: len(context)]) == context
    # expect[0] was still cached: only the target's token 99 was evaluated, then one draft step.
    assert backend.forward_calls[-2:] == [1, 1]


def test_model_drafter_sampled_q_rows() -> None:
    fn = hashed_logits(4, sharpness=1.0)
    d = ModelDrafter(FakeBackend(fn))
    prompt = [1, 2, 3]
    d.prepare(prompt, 8)
    sampling = SamplingParams(temperature=0.7, top_k=50)
    draft = d.propose(prompt, 4, sampling, np.random.default_rng(1))
    assert len(draft.tokens) == 4 and draft.q is not None and draft.q.shape == (4, 257)
    q = np.asarray(draft.q)  # rows read lazily by the rule; whole, they are the processed rows
    np.testing.assert_allclose(q.sum(axis=1), 1.0)
    ctx = list(prompt)
    for tok, row in zip(draft.tokens, q):
        assert row[tok] > 0
        np.testing.assert_allclose(row, probabilities(fn(ctx), sampling))
        ctx.append(tok)


def test_model_drafter_stops_at_eog() -> None:
    script = [1, 2, 3, 4, EOG, 5, 6]
    d = ModelDrafter(FakeBackend(scripted_tokens(script)))
    d.prepare(script[:2], 8)
    assert d.propose(script[:2], 8, GREEDY, RNG).tokens == [3, 4, EOG]


def test_model_drafter_close_leaves_the_model_to_its_owner() -> None:
    # The pipeline owns the draft model (bench runs several drafters over one loaded model).
    backend = FakeBackend(hashed_logits(1))
    ModelDrafter(backend).close()
    assert not backend.closed


# -- common_prefix ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cached", "tokens", "limit", "expected"),
    [
        ([], [1, 2], 5, 0),
        ([1, 2, 3], [], 5, 0),
        ([1, 2, 3], [1, 2, 3], 5, 3),
        ([1, 2, 3], [1, 2, 3], 2, 2),
        ([1, 2, 3], [1, 2, 3, 4], 3, 3),
        ([1, 2, 3, 4], [1, 2], 9, 2),
        ([1, 2, 3], [1, 9, 3], 5, 1),
        ([1, 2, 3], [9, 2, 3], 5, 0),
        ([1, 2, 3], [1, 2, 3], 0, 0),
        ([1, 2, 3], [1, 2, 3], -1, 0),
    ],
)
def test_common_prefix(cached: list[int], tokens: list[int], limit: int, expected: int) -> None:
    assert common_prefix(cached, tokens, limit=limit) == expected


def test_common_prefix_of_long_sequences_parting_anywhere() -> None:
    """Lists take a fast path (compared in C, the tail scanned); every parting point, and arrays, agree with a
    plain scan."""
    rng = np.random.default_rng(0)
    base = [int(t) for t in rng.integers(0, 1000, 300)]
    for cut in (0, 1, 100, 235, 236, 250, 299, 300):
        other = base[:cut] + [1000 + t for t in base[cut:]]
        for a, b in ((base, other), (other, base), (np.array(base), other), (tuple(base), other)):
            for limit in (300, 240, 10):
                expected = min(cut, limit)
                assert common_prefix(a, b, limit=limit) == expected, (cut, limit, type(a))
    assert common_prefix(base, base + [1, 2], limit=999) == 300


def test_model_drafter_never_overflows_its_window() -> None:
    backend = FakeBackend(hashed_logits(3), n_ctx=10)
    d = ModelDrafter(backend)
    d.prepare(list(range(8)), 8)
    assert len(d.propose(list(range(8)), 5, GREEDY, RNG).tokens) == 3  # 8 + 3 - 1 = 10 cached
    assert len(backend.cached_tokens) == 10
    assert len(d.propose(list(range(10)), 5, GREEDY, RNG).tokens) == 1
    assert d.propose(list(range(11)), 5, GREEDY, RNG) is EMPTY_DRAFT
    d.prepare(list(range(20)), 8)  # a prompt longer than the window: no prefill, no drafts
    assert len(backend.cached_tokens) <= 10
    assert d.propose(list(range(21)), 5, GREEDY, RNG) is EMPTY_DRAFT
