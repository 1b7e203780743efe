"""The suffix drafter: its index on its own (matches, counts, memory bound, session reuse), its gate, and
the engine with it (greedy output equal to plain decoding, on fakes and on real llama.cpp tiny GGUFs)."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeBackend, hashed_logits, scripted_tokens, without

from localspec.decoding.auto import AutoDrafter, auto_lookup
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.policy import RESUMED, RESYNC, match_bucket
from localspec.decoding.resync import MAX_EDIT, MAX_NEW, WINDOW
from localspec.decoding.stats import RoundStats
from localspec.decoding.suffix import MAX_CANDIDATES, MAX_MATCH, SuffixDrafter, SuffixIndex
from localspec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
RNG = np.random.default_rng(0)


def _index(*docs: list[int], **kw: int) -> SuffixIndex:
    idx = SuffixIndex(**kw)
    for d in docs:
        idx.start(d)
    return idx


def _rebuilt_entries(idx: SuffixIndex) -> int:
    """Index entries a fresh index over the same kept documents would hold (ends with a continuation)."""
    return sum(1 for doc in idx.docs.values() for end in range(1, len(doc)) for m in idx.key_lengths if end >= m)


# -- matches -------------------------------------------------------------------------------------------


def test_longest_suffix_match_wins_over_more_recent_shorter_ones() -> None:
    old = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    recent = [50, 8, 9, 77, 78]  # "8 9" again, followed by something else
    idx = _index(old, recent)
    idx.start([40, 5, 6, 7, 8, 9])  # ends with the 5-token suffix "5 6 7 8 9" that only `old` has
    m = idx.match()
    assert m.length == 5 and len(m.positions) == 1
    assert idx.draft(m, 3) == [10, 11, 12]


def test_match_uses_the_long_key_and_extends_it_backwards() -> None:
    text = list(range(100, 140))
    idx = _index(text)
    idx.start([7, *text[:30]])  # the whole 30-token run matches, but only up to MAX_MATCH is compared
    m = idx.match()
    assert m.length == 30
    assert idx.draft(m, 5) == text[30:35]


def _longest_earlier(idx: SuffixIndex) -> tuple[int, set[tuple[int, int]]]:
    """What match() must find, by brute force: among the positions whose text before them ends with the current
    document's last tokens (the longest key that has any), the longest agreement with its end, at most
    MAX_MATCH, and every position that reaches it."""
    cur = idx.docs[idx.current]
    for m in idx.key_lengths:
        ends = [(d, e) for d, doc in idx.docs.items() for e in range(m, len(doc)) if doc[e - m : e] == cur[-m:]]
        if not ends:
            continue
        assert len(ends) <= MAX_CANDIDATES  # (the index keeps the most recent MAX_CANDIDATES of a key)
        lengths = {}
        for d, e in ends:
            doc, n = idx.docs[d], 0
            while n < min(MAX_MATCH, e, len(cur)) and doc[e - 1 - n] == cur[-1 - n]:
                n += 1
            lengths[(d, e)] = n
        best = max(lengths.values())
        return best, {p for p, n in lengths.items() if n == best}
    return 0, set()


def test_the_match_is_the_longest_earlier_agreement_on_random_texts() -> None:
    """Random texts over a few tokens (many short matches, some long copies), cut back and grown as rounds do."""
    rng = np.random.default_rng(5)
    for _ in range(60):
        idx = _index(*[list(rng.integers(0, 6, rng.integers(0, 120))) for _ in range(rng.integers(0, 3))])
        idx.start(list(rng.integers(0, 6, 30)))
        for _ in range(25):
            cur = idx.docs[idx.current]
            if rng.random() < 0.2:
                idx.truncate(int(rng.integers(2, len(cur) + 1)))
            elif rng.random() < 0.3:  # a copy of earlier text, longer than MAX_MATCH at times
                start = int(rng.integers(0, len(cur)))
                idx.extend(cur[start : start + int(rng.integers(1, 90))])
            else:
                idx.extend(list(rng.integers(0, 6, rng.integers(1, 6))))
            m = idx.match()
            assert (m.length, set(m.positions)) == _longest_earlier(idx)


def test_no_match_below_the_shortest_key() -> None:
    idx = _index([1, 2, 3, 4])
    idx.start([9, 9, 4])  # "4" alone occurred, but a one-token match is no match
    assert idx.match().length == 0


def test_the_current_suffix_does_not_match_itself_but_earlier_text_in_the_same_document_does() -> None:
    idx = _index([5, 6, 7, 1, 2, 3, 4, 5, 6, 7])  # "5 6 7" occurred at the start: continuation 1 2 3
    m = idx.match()
    assert m.length == 3 and idx.draft(m, 4) == [1, 2, 3, 4]
    idx.start([1, 2, 3])
    assert idx.match().length == 0 or idx.match().positions[0][0] != idx.current


# -- counts --------------------------------------------------------------------------------------------


def test_the_most_frequent_continuation_is_drafted_and_a_split_stops_the_draft() -> None:
    docs = [[1, 2, 3, 10, 11], [1, 2, 3, 10, 12], [1, 2, 3, 10, 12], [1, 2, 3, 20, 21]]
    idx = _index(*docs)
    idx.start([9, 2, 3])
    m = idx.match()
    assert m.length == 2 and len(m.positions) == 4
    # 10 follows 3 of 4 occurrences (p 0.75), then 12 follows 2 of those 3: 0.75 * 2/3 = 0.5 overall.
    assert idx.draft(m, 5, min_prob=0.5) == [10, 12]
    assert idx.draft(m, 5, min_prob=0.6) == [10]  # 0.5 < 0.6: the draft stops before the split
    assert idx.draft(m, 5, min_prob=0.8) == []


def test_occurrences_that_agree_draft_what_the_vote_would_and_stop_where_one_ends_or_parts() -> None:
    """Where every occurrence goes on the same way the draft is taken whole (one slice comparison each, not a vote a
    token), as the vote would take it; one that ends early or parts later brings the vote back at that point (an
    ended one votes no more)."""
    same = [[1, 2, 3, 10, 11, 12, 13]] * 3
    idx = _index(*same)
    idx.start([9, 2, 3])
    assert idx.draft(idx.match(), 4, min_prob=0.9) == [10, 11, 12, 13]
    short = _index(*same, [1, 2, 3, 10, 11])  # ends after 11: it has no vote from there, the others agree on
    short.start([9, 2, 3])
    assert short.draft(short.match(), 4, min_prob=0.9) == [10, 11, 12, 13]
    parts = _index(*same, [1, 2, 3, 10, 11, 99, 13])  # parts at the third token: 3 of 4 take 12
    parts.start([9, 2, 3])
    assert parts.draft(parts.match(), 4, min_prob=0.8) == [10, 11]
    assert parts.draft(parts.match(), 4, min_prob=0.7) == [10, 11, 12, 13]


def test_ties_go_to_the_most_recent_occurrence() -> None:
    idx = _index([1, 2, 3, 30], [1, 2, 3, 40])
    idx.start([2, 3])
    assert idx.draft(idx.match(), 1, min_prob=0.0) == [40]


def test_draft_length_grows_with_the_match_length() -> None:
    body = list(range(200, 300))
    d = SuffixDrafter(gate=False)
    d.prepare([*body, 1, 2, 3], 32)
    short = d.lookup([*body, 1, 2, 3, 7, 200, 201], 32)  # a 2-token match: at most 4 tokens
    assert short.order == 2 and short.tokens == [202, 203, 204, 205]
    d.prepare([*body, 1, 2, 3], 32)
    long = d.lookup([*body, 1, 2, 3, *body[:20]], 32)  # a 20-token match: up to 32
    assert long.order == 20 and long.tokens == body[20:52]


# -- memory bound ----------------------------------------------------------------------------------------


def test_memory_is_bounded_and_eviction_leaves_a_consistent_index() -> None:
    rng = np.random.default_rng(1)
    idx = SuffixIndex(max_tokens=500)
    for _ in range(20):
        idx.start([int(t) for t in rng.integers(0, 50, 120)])
        assert idx.n_tokens <= 500 + 120  # the current document is always kept
        assert idx.n_tokens == sum(len(d) for d in idx.docs.values())
    assert idx.n_tokens <= 500
    assert len(idx.docs) == 4
    # Every remaining entry points into a kept document; none of an evicted one survived.
    positions = [p for q in idx._keys.values() for p in q]
    assert all(d in idx.docs for d, _ in positions)
    assert all(len(q) <= MAX_CANDIDATES for q in idx._keys.values())
    assert idx.n_entries <= _rebuilt_entries(idx)


def test_candidates_per_key_are_capped_and_the_long_key_still_finds_an_old_copy() -> None:
    copy = list(range(300, 340))
    idx = SuffixIndex()
    idx.start(copy)
    for _ in range(3 * MAX_CANDIDATES):
        idx.start([1, 2, 5])  # "1 2" again and again
    assert len(idx._keys[(1, 2)]) == MAX_CANDIDATES
    idx.start([1, 2, *copy[:10]])
    m = idx.match()
    assert m.length == 10 and idx.draft(m, 5) == copy[10:15]


def test_truncate_removes_the_entries_beyond_the_cut() -> None:
    idx = _index([1, 2, 3, 4, 5, 6])
    before = idx.n_entries
    idx.truncate(3)
    assert idx.docs[idx.current] == [1, 2, 3] and idx.n_tokens == 3
    assert idx.n_entries < before and idx.n_entries == _rebuilt_entries(idx)
    idx.extend([4, 9])
    assert idx.n_entries == _rebuilt_entries(idx)


# -- session reuse -----------------------------------------------------------------------------------------


def test_an_earlier_answer_of_the_session_is_drafted_from() -> None:
    d = SuffixDrafter(gate=False)
    answer = list(range(500, 560))
    d.prepare([1, 2, 3], 32)
    d.lookup([1, 2, 3, *answer], 32)  # the first generation wrote `answer`
    d.prepare([4, 5, 6], 32)  # an unrelated new prompt: a new document, the old one stays
    got = d.lookup([4, 5, 6, *answer[:8]], 32)
    assert got.order == 8 and got.tokens == answer[8:24]


def test_a_next_turn_that_extends_the_last_text_is_not_indexed_twice() -> None:
    d = SuffixDrafter(gate=False)
    turn1 = [1, 2, 3, 4, 5, 6, 7, 8]
    d.prepare(turn1, 8)
    d.lookup([*turn1, 9, 10], 8)
    n_docs = len(d.index.docs)
    d.prepare([*turn1, 9, 10, 11, 12], 8)  # the chat's history plus a new message
    assert len(d.index.docs) == n_docs and d.index.n_tokens == 12
    assert d.index.n_entries == _rebuilt_entries(d.index)


def test_generation_that_rolls_back_in_the_context_resyncs() -> None:
    d = SuffixDrafter(gate=False)
    d.prepare([1, 2, 3, 4], 8)
    d.lookup([1, 2, 3, 4, 5, 6], 8)
    d.lookup([1, 2, 3, 4, 7], 8)  # not a continuation of what was seen: the document follows the context
    assert d.index.docs[d.index.current] == [1, 2, 3, 4, 7]
    assert d.index.n_entries == _rebuilt_entries(d.index)


# -- resync after an edit ------------------------------------------------------------------------------------

SOURCE = list(range(1000, 1060))  # a file shown earlier in the session


def _copying(prefix: list[int]) -> SuffixDrafter:
    """A drafter whose current text copied SOURCE[:20] after a prompt that holds SOURCE (an anchor)."""
    d = SuffixDrafter(gate=False)
    d.prepare([*SOURCE, 1, 2], 32)
    assert d.lookup([*SOURCE, 1, 2, *SOURCE[:20]], 32).order == 20  # a long match: the anchor
    return d


def test_a_rename_resumes_the_copy_right_after_the_substituted_token() -> None:
    d = _copying(SOURCE[:20])
    ctx = [*SOURCE, 1, 2, *SOURCE[:20], 7]  # 7 in place of SOURCE[20] (a renamed identifier)
    guess = d.lookup(ctx, 32)  # nothing verified yet: the one guess, a one-token substitution
    assert guess.order == RESYNC and guess.tokens == SOURCE[21:25]  # short: little evidence yet
    ctx.append(SOURCE[21])  # the text does resume copying: now confirmed by one token
    got = d.lookup(ctx, 32)
    assert got.order == RESYNC + 1 and got.tokens == SOURCE[22:26]
    assert d.index.match().length == 0  # the plain suffix match has nothing here


def test_an_insertion_resumes_the_copy_where_the_source_left_off() -> None:
    d = _copying(SOURCE[:20])
    got = d.lookup([*SOURCE, 1, 2, *SOURCE[:20], 7, 8, 9, *SOURCE[20:22]], 32)  # three tokens inserted
    assert got.order == RESYNC + 2 and got.tokens == SOURCE[22:26]
    # Remembered with the source token on each side as its context (a type hint after a parameter name).
    assert d._edits.subs == {(SOURCE[19], SOURCE[20]): (SOURCE[19], 7, 8, 9, SOURCE[20])}


def test_a_learned_insertion_is_made_again_in_the_same_context_only() -> None:
    source = [
        1019 if i == 40 else 1020 if i in (41, 51) else t for i, t in enumerate(SOURCE)
    ]  # (1019, 1020) again at 40
    d = SuffixDrafter(gate=False)
    d.prepare([*source, 1, 2], 32)
    d.lookup([*source, 1, 2, *source[:20]], 32)
    ctx = [*source, 1, 2, *source[:20], 7, 8, *source[20:23]]  # 7, 8 inserted between 1019 and 1020
    assert d.lookup(ctx, 32).tokens[:4] == source[23:27]
    ctx += source[23:38]
    ahead = d.lookup(ctx, 32).tokens
    assert ahead[:5] == [*source[38:41], 7, 8]  # at the next (1019, 1020) the insertion is drafted
    assert ahead[5:16] == source[41:52]  # ... and not before the 1020 at 51, which follows another token
    half = d.lookup([*ctx, *source[38:41], 7], 32)  # the text has begun it: the rest of it, then the source
    assert half.tokens[:3] == [8, 1020, source[42]]


def test_an_insertion_written_before_in_this_answer_resumes_the_copy_as_soon_as_it_is_complete() -> None:
    """Type hints at every signature: once `: str` was confirmed as an insertion, the next `: str` that the text
    writes where it left its source ends there, and the copy resumes at once (no token after it needed)."""
    d = _copying(SOURCE[:20])
    ctx = [*SOURCE, 1, 2, *SOURCE[:20], 7, 8, *SOURCE[20:30]]  # 7, 8 inserted after SOURCE[19]: confirmed
    assert d.lookup(ctx, 32).tokens[:4] == SOURCE[30:34]
    ctx += [7, 8]  # the same span again, after SOURCE[29] (another context)
    got = d.lookup(ctx, 32)
    assert got.tokens[:4] == SOURCE[30:34] and got.order == RESYNC + 1
    before = SuffixDrafter(gate=False)  # without the first one: nothing to go on yet
    before.prepare([*SOURCE, 1, 2], 32)
    before.lookup([*SOURCE, 1, 2, *SOURCE[:30]], 32)
    assert not before.lookup([*SOURCE, 1, 2, *SOURCE[:30], 7, 8], 32).tokens


def test_a_long_replacement_of_a_merged_token_resumes_the_copy() -> None:
    """BPE merges a type hint's last token with the source's next one (`]]:\n` for `):\n`): one source token
    replaced by eight; the copy resumes after the first token that follows it in the source."""
    d = _copying(SOURCE[:20])
    hint = [7, 8, 9, 10, 11, 12, 13, 14]  # in place of SOURCE[20]
    got = d.lookup([*SOURCE, 1, 2, *SOURCE[:20], *hint, SOURCE[21]], 32)
    assert got.order == RESYNC + 1 and got.tokens == SOURCE[22:26]


def test_a_deletion_resumes_the_copy_after_the_skipped_source_tokens() -> None:
    d = _copying(SOURCE[:20])
    got = d.lookup([*SOURCE, 1, 2, *SOURCE[:20], *SOURCE[23:26]], 32)  # SOURCE[20:23] left out
    assert got.order == RESYNC + 3 and got.tokens == SOURCE[26:32]


def test_a_confirmed_rename_is_made_in_later_drafts_and_stepped_over() -> None:
    source = [1020 if i in (30, 40) else t for i, t in enumerate(SOURCE)]  # SOURCE[20] comes back at 30, 40
    d = SuffixDrafter(gate=False)
    d.prepare([*source, 1, 2], 32)
    d.lookup([*source, 1, 2, *source[:20]], 32)
    ctx = [*source, 1, 2, *source[:20], 7, *source[21:23]]  # 1020 renamed to 7, confirmed by two tokens
    got = d.lookup(ctx, 32)
    assert got.tokens == source[23:27] and d._edits.subs == {(1020,): (7,)}
    ctx += [*source[23:30], 7, *source[31:34]]  # ... and the text renames it again at 30
    after = d.lookup(ctx, 32)  # the plain match is cut at the rename; the aligned copy runs further back
    assert d.index.match().length < 6 and after.order == RESYNC + 13
    assert after.tokens[:8] == [*source[34:40], 7, source[41]]  # the rename made at its next occurrence
    ctx += [*source[34:40], 7, *source[41:44]]  # the copy goes on through the next rename: 23 tokens since
    sure = d.lookup(ctx, 32)  # ... as sure as a plain match that long: it is ranked as one
    assert "resync" in sure.note and sure.order == RESYNC + 23 and sure.tokens[:4] == source[44:48]
    assert match_bucket(sure.order) == match_bucket(23)


def test_no_resync_when_the_tail_does_not_agree_with_the_source() -> None:
    d = _copying(SOURCE[:20])
    base = [*SOURCE, 1, 2, *SOURCE[:20]]
    assert d.lookup([*base, 7, 8], 32).tokens == []  # two new tokens: nothing confirms a resumed copy
    assert d.lookup([*base, 7, SOURCE[20], 8], 32).tokens == []  # a coincidence undone by the next token
    longer = [*base, *range(1, MAX_NEW + 2), SOURCE[21]]  # an edit writing more than MAX_NEW tokens
    assert d.lookup(longer, 32).tokens == []
    wider = [*base, 7, SOURCE[20 + MAX_EDIT + 1]]  # ... or replacing more than MAX_EDIT
    assert d.lookup(wider, 32).tokens == []


def test_the_anchor_is_dropped_past_the_window_and_resync_off_drafts_as_before() -> None:
    d = _copying(SOURCE[:20])
    far = [*SOURCE, 1, 2, *SOURCE[:20], *range(1, WINDOW + 1), SOURCE[30]]
    assert d.lookup(far, 32).tokens == [] and d._anchor is None
    off = SuffixDrafter(gate=False, resync=False)
    off.prepare([*SOURCE, 1, 2], 32)
    off.lookup([*SOURCE, 1, 2, *SOURCE[:20]], 32)
    assert off.lookup([*SOURCE, 1, 2, *SOURCE[:20], 7, SOURCE[21]], 32).tokens == []


def test_resync_drafts_have_their_own_acceptance_buckets() -> None:
    from localspec.decoding.policy import NGRAM_PRIOR

    assert [match_bucket(RESYNC + v) for v in (0, 1, 2, 3, 4, 7, 8, 15)] == [
        RESYNC + b for b in (0, 1, 2, 2, 4, 4, 8, 8)
    ]
    assert [match_bucket(RESYNC + v) for v in (RESUMED, 23, 40)] == [16, 16, 32]  # confirmed: a plain match's
    priors = [NGRAM_PRIOR[RESYNC + b] for b in (0, 1, 2, 4, 8)]
    assert priors == sorted(priors) and priors[0] < 0.5  # an unconfirmed guess is graded before it is drafted


def test_resync_keeps_greedy_output_equal_to_plain_decoding_through_renames() -> None:
    source = [int(t) for t in np.random.default_rng(3).integers(300, 400, 120)]
    edited = [7 if i % 15 == 9 else t for i, t in enumerate(source)]  # every 15th token renamed
    prompt = [*source, 1, 2]
    fn = without(scripted_tokens([*prompt, *edited], n_vocab=401, fallback=5), [])
    outs = {}
    for name, drafter in (
        ("plain", NoDrafter()),
        ("auto", AutoDrafter(ngram=auto_lookup())),
        ("suffix", SuffixDrafter()),
    ):
        cfg = GenerationConfig(max_tokens=len(edited), num_draft=16, sampling=GREEDY)
        *_, done = generate(FakeBackend(fn, n_vocab=401), drafter, prompt, cfg)
        assert isinstance(done, Done)
        outs[name] = list(done.tokens)
    assert outs["plain"] == edited and outs["auto"] == edited and outs["suffix"] == edited


# -- the gate (standalone `suffix`) ----------------------------------------------------------------------


def _round(n_drafted: int, n_accepted: int) -> RoundStats:
    return RoundStats(0, n_drafted, n_accepted, n_accepted + 1, 0.0, 0.0, "greedy", n_drafted)


def test_weak_matches_propose_nothing_and_failing_lengths_are_withheld() -> None:
    d = SuffixDrafter()
    weak = [1, 2, 3, 4, 9, 9, 9, 3, 4]  # "3 4" occurred before: a 2-token match (prior acceptance 0.3)
    d.prepare(weak, 8)
    assert d.lookup(weak, 8).tokens and d.propose(weak, 8, GREEDY, RNG).tokens == []
    body = list(range(100, 120))
    strong = [*body, 7, *body[:10]]  # a 10-token match: proposed at once
    d.prepare(strong, 16)
    first = d.propose(strong, 16, GREEDY, RNG)
    assert first.tokens == [*body[10:20], 7, *body[:5]] and match_bucket(first.order) == 8
    d.observe(_round(len(first.tokens), 0))  # ... and rejected, twice
    d.propose(strong, 16, GREEDY, RNG)
    d.observe(_round(10, 0))
    assert d.acceptance(10) < 0.5
    assert d.propose(strong, 16, GREEDY, RNG).tokens == []  # that match length has now failed: withheld


def test_withheld_proposals_are_graded_for_free_and_can_earn_the_gate_back() -> None:
    d = SuffixDrafter()
    d.accept[2].update(0, 4)
    d.accept[2].update(0, 4)
    ctx = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2]
    d.prepare(ctx, 8)
    low = d.acceptance(2)
    assert d.propose(ctx, 8, GREEDY, RNG).tokens == []  # withheld, but remembered
    d.propose([*ctx, 3, 4, 5, 6, 7], 8, GREEDY, RNG)  # the text went on exactly as it would have drafted
    assert d.acceptance(2) > low


# -- the engine with it ------------------------------------------------------------------------------------


TARGET = without(hashed_logits(3))
REPEAT = scripted_tokens([5, 6, 7, 8, 9, 10, 11, 12] * 12)  # a target that repeats a phrase


@pytest.mark.parametrize("k", [1, 4, 32])
@pytest.mark.parametrize("fn", [TARGET, REPEAT], ids=["hashed", "repeating"])
def test_engine_greedy_output_equals_plain_with_suffix_drafts(fn, k: int) -> None:  # type: ignore[no-untyped-def]
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 1, 5, 6]
    plain = list(generate(FakeBackend(fn), NoDrafter(), prompt, GenerationConfig(max_tokens=60, sampling=GREEDY)))[-1]
    spec = list(
        generate(
            FakeBackend(fn), SuffixDrafter(), prompt, GenerationConfig(max_tokens=60, num_draft=k, sampling=GREEDY)
        )
    )[-1]
    assert isinstance(plain, Done) and isinstance(spec, Done)
    assert spec.tokens == plain.tokens
    if fn is REPEAT and k == 32:
        assert spec.stats.n_accepted > 30 and spec.stats.n_rounds < 40  # long copies: few rounds


def test_engine_greedy_output_equals_plain_on_tiny_ggufs(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    from localspec.backends.base import ChatMessage, chat_prompt_tokens
    from localspec.backends.llama import backend as lb

    target = lb.load(tiny_ggufs[0], n_ctx=512)
    try:
        prompt = chat_prompt_tokens(target, [ChatMessage("user", "Repeat this:\ndef add(a, b):\n    return a + b\n")])
        config = GenerationConfig(max_tokens=48, num_draft=32, sampling=GREEDY)
        *_, plain = generate(target, NoDrafter(), prompt, config)
        assert isinstance(plain, Done)
        runs = {}
        for name, drafter in (
            ("suffix", SuffixDrafter()),
            ("suffix-ungated", SuffixDrafter(gate=False)),
            ("auto", AutoDrafter(ngram=auto_lookup(), target=target)),
        ):
            # (Random weights never repeat themselves.) The session already holds this answer, as after
            # a regenerated reply: the suffix drafts copy it, and the target verifies every copy.
            lookup = drafter.ngram if isinstance(drafter, AutoDrafter) else drafter
            lookup.prepare([*prompt, *plain.tokens], 32)  # type: ignore[union-attr]
            *_, done = generate(target, drafter, prompt, config)
            assert isinstance(done, Done)
            runs[name] = done
        assert runs["suffix"].tokens == runs["suffix-ungated"].tokens == runs["auto"].tokens == plain.tokens
        for name in ("suffix", "suffix-ungated"):
            s = runs[name].stats
            assert s.n_drafted > 0 and s.n_accepted >= 0.8 * s.n_drafted and s.n_rounds < 20, name
    finally:
        target.close()
