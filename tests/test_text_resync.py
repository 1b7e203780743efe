"""Resync in bytes (localspec.decoding.text_resync): edits found and made as text, whatever the tokenizer did."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakes import FakeBackend, scripted_tokens, without

from localspec.decoding.auto import AutoDrafter, auto_lookup
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.policy import RESYNC
from localspec.decoding.suffix import SuffixDrafter
from localspec.decoding.text_resync import GUESS_MIN, TextAnchor, TextCodec, TextEdits, follow, text_codec
from localspec.sampling import SamplingParams

SOURCE = b"def merge_intervals(intervals):\n    ordered = sorted(intervals, key=len)\n    return ordered\n"


def _anchor() -> TextAnchor:
    return TextAnchor(0, 0, 0, 0)  # the text began copying SOURCE at its start


def test_a_rename_is_learnt_from_its_first_occurrence_and_made_at_the_next() -> None:
    edits = TextEdits()
    cur = b"def merge_spans(spans):\n    ordered = sorted(sp"
    r = follow(_anchor(), SOURCE, cur, edits)
    assert r is not None and r.pending == b"ans"  # half way through the known rename ...
    assert SOURCE[r.resume :].startswith(b", key=len)")  # ... then the source
    # Learnt as whole words, each where it first differed: a rename of `intervals` is not one of `intervalsx`.
    assert edits.subs == {b"merge_intervals": b"merge_spans", b"intervals": b"spans"}
    start = SOURCE.index(b"    ordered")
    assert edits.apply(SOURCE, start, len(SOURCE)) == b"    ordered = sorted(spans, key=len)\n    return ordered\n"


def test_an_insertion_resumes_the_copy_and_its_recurrence_ends_a_draft() -> None:
    source = b"def area(r):\n    return r * r\n\n\nclass Disc:\n    def area(r):\n        return 3 * r * r\n"
    edits = TextEdits()
    cur = b"def area(r: float) -> float:\n    re"
    r = follow(_anchor(), source, cur, edits)
    assert r is not None and source[r.resume :].startswith(b"turn r * r")
    # `)` -> `: float) -> float`: the replaced byte is kept inside, so it is two insertions, each keyed by the
    # 8 source bytes before it and the one after; never a substitution of every `)`.
    assert edits.inserts == {b"f area(r)": b": float", b" area(r):": b" -> float"} and not edits.subs
    start = source.index(b"\n\n\nclass")
    # The method's signature has the same bytes around `)`: whether the text types a hint there too is a guess
    # either way, so a draft stops there instead of betting.
    assert edits.apply(source, start, len(source)) == b"\n\n\nclass Disc:\n    def area(r"
    nested = source.index(b"    def area(r)") + len(b"    def area(r")
    anchor = TextAnchor(0, nested, 0, 0)
    typed = b": float) -> float:\n        return 3"
    again = follow(anchor, source, typed, edits)  # ... and where the text does type them, the copy goes on
    assert again is not None and source[again.resume :].startswith(b" * r * r")


def test_nothing_resumes_until_enough_bytes_after_an_edit_confirm_it() -> None:
    edits = TextEdits()
    base = b"def merge_intervals(intervals):\n    "
    assert follow(_anchor(), SOURCE, base + b"xyz" + b"o" * (GUESS_MIN - 1), edits) is None
    assert follow(_anchor(), SOURCE, b"def merge_intervals(intervals):\n    zzzz qqqq wwww", edits) is None
    assert not edits.subs and not edits.inserts


def _qwen_codec(path: Path) -> tuple[TextCodec, object]:
    from localspec.backends.llama import backend as llama_cpp

    target = llama_cpp.load(path, n_ctx=256, threads=1)
    codec = text_codec(target)
    assert codec is not None
    return codec, target


def test_a_rename_whose_tokens_differ_by_context_is_followed_in_bytes(qwen_pair: tuple[Path, Path]) -> None:
    """Qwen2.5 writes `(intervals` as one token before `)` and `(int` `ervals` before `,`: in tokens the renamed
    text matches nothing after the rename; in bytes the copy resumes and the rename is made at its next use."""
    codec, target = _qwen_codec(qwen_pair[1])
    try:
        prompt = codec.encode("Rename intervals to spans:\n" + SOURCE.decode())
        edited = SOURCE.replace(b"intervals", b"spans").decode()
        split = edited.index("= sorted(") + len("= sorted(")
        so_far = codec.encode(edited[:split])
        want = codec.encode(edited[split:])
        by_bytes = SuffixDrafter(gate=False, codec=codec)
        by_tokens = SuffixDrafter(gate=False)
        for d in (by_bytes, by_tokens):
            d.prepare(prompt, 32)
            for n in range(1, len(so_far) + 1):  # the answer as it is written, a token a round
                got = d.lookup([*prompt, *so_far[:n]], 32)
        got = by_bytes.lookup([*prompt, *so_far], 32)
        assert "resync" in got.note and got.order > RESYNC
        assert got.tokens[:6] == want[:6]  # `spans`, then the source's `, key=len)` ...
        assert by_tokens.lookup([*prompt, *so_far], 32).tokens[:6] != want[:6]
    finally:
        target.close()  # type: ignore[attr-defined]


def test_greedy_output_equals_plain_decoding_with_text_resync_through_edits() -> None:
    """Drafts are only proposals: with the byte resync on (a fake backend's tokens are bytes), greedy output is
    still exactly plain decoding's, through renames and insertions."""
    source = SOURCE * 3
    edited = source.replace(b"intervals", b"spans").replace(b"(spans)", b"(spans: list)")
    prompt = list(b"Edit this:\n" + source + b"\n")
    answer = list(edited)
    fn = without(scripted_tokens([*prompt, *answer], n_vocab=300, fallback=5), [])
    outs = {}
    for name, drafter in (
        ("plain", NoDrafter()),
        ("auto", AutoDrafter(ngram=auto_lookup(target=FakeBackend(fn, n_vocab=300)))),
        ("suffix", SuffixDrafter(codec=text_codec(FakeBackend(fn, n_vocab=300)))),
    ):
        cfg = GenerationConfig(max_tokens=len(answer), num_draft=16, sampling=SamplingParams(temperature=0.0))
        *_, done = generate(FakeBackend(fn, n_vocab=300), drafter, prompt, cfg)
        assert isinstance(done, Done)
        outs[name] = list(done.tokens)
    assert outs["plain"] == answer and outs["auto"] == answer and outs["suffix"] == answer


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_follow_never_drafts_bytes_the_source_does_not_hold_after_random_edits(seed: int) -> None:
    rng = np.random.default_rng(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"(x)", b": int", b"\n    ", b" = ", b"return"]
    source = b" ".join(words[i] for i in rng.integers(0, len(words), 60))
    cur = bytearray()
    edits = TextEdits()
    anchor = _anchor()
    for i in range(0, len(source), 7):
        chunk = source[i : i + 7]
        cur += chunk if rng.random() > 0.2 else b"zz"  # now and then an edit
        r = follow(anchor, source, bytes(cur), edits)
        if r is not None:
            assert 0 <= r.resume <= len(source)
            assert anchor.cur <= len(cur) and anchor.src <= len(source)


def test_a_rename_is_made_at_whole_words_only() -> None:
    source = b"amount = 1\ntotal(amount, amounts)\n"
    edits = TextEdits()
    edits.learn(source, 0, len(b"amount"), b"value_sum")
    assert edits.apply(source, 0, len(source)) == b"value_sum = 1\ntotal(value_sum, amounts)\n"


def test_a_copy_of_an_earlier_edit_does_not_take_the_source_away() -> None:
    """The second signature's hint matches the first one's in the answer (a long match): the copy of the file
    must still resume from the file, not from the answer's first function, once the hint ends."""
    source = b"def f(a):\n    return a * 2\n\n\ndef g(a):\n    return a + 1\n"
    answer = b"def f(a: List[int]) -> List[int]:\n    return a * 2\n\n\ndef g(a: List[int]) -> int:\n    re"
    backend = FakeBackend(lambda ctx: np.zeros(300, np.float32), n_vocab=300)  # byte tokens
    d = SuffixDrafter(gate=False, codec=text_codec(backend))
    prompt = list(b"Add hints:\n" + source + b"\n")
    d.prepare(prompt, 32)
    for n in range(1, len(answer) + 1):  # a token (here a byte) a round
        got = d.lookup([*prompt, *answer[:n]], 32)
    assert bytes(got.tokens).startswith(b"turn a + 1")
