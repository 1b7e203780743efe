"""The engine on deterministic fake backends: speculative output equals plain decoding, stats add up,
every stop condition ends the run where it should, seeds reproduce, and the KV cache is reused."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from fakes import (
    EOG,
    N_VOCAB,
    FakeBackend,
    hashed_logits,
    noisy,
    scripted_tokens,
    without,
)

from localspec.decoding.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, Step, generate
from localspec.errors import ContextOverflowError, UsageError
from localspec.sampling import SamplingParams

TARGET = without(hashed_logits(1))  # never ends by itself: runs stop on max_tokens unless a test says
PROMPT = list(b"The quick brown fox jumps over the lazy dog. The quick brown")
GREEDY = SamplingParams(temperature=0.0)


def _drafter(kind: str, fn=TARGET, *, noise: float = 2.0, n_ctx: int = 4096) -> Drafter:
    if kind == "none":
        return NoDrafter()
    if kind == "ngram":
        return NgramDrafter()
    if kind == "model":
        return ModelDrafter(FakeBackend(noisy(fn, 5, noise), n_ctx=n_ctx, name="draft"))
    if kind == "self":
        return ModelDrafter(FakeBackend(fn, n_ctx=n_ctx, name="self-draft"))
    raise AssertionError(kind)


def _run(
    target: FakeBackend,
    drafter: Drafter,
    prompt: Sequence[int] = PROMPT,
    *,
    stop: threading.Event | None = None,
    **config,
) -> tuple[list[Step], Done]:
    config.setdefault("sampling", GREEDY)
    events = list(generate(target, drafter, prompt, GenerationConfig(**config), stop=stop))
    done = events[-1]
    assert isinstance(done, Done)
    steps = [e for e in events[:-1] if isinstance(e, Step)]
    assert len(steps) == len(events) - 1
    return steps, done


def _plain(fn=TARGET, prompt: Sequence[int] = PROMPT, n: int = 60, n_ctx: int = 4096) -> list[int]:
    """Plain greedy decoding without the engine: argmax, one token at a time."""
    ctx, out = list(prompt), []
    while len(out) < n and len(ctx) <= n_ctx:
        t = int(np.argmax(fn(ctx)))
        if t == EOG:
            break
        out.append(t)
        ctx.append(t)
    return out


# -- greedy equivalence ------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("kind", ["none", "ngram", "model"])
def test_speculative_greedy_equals_plain_greedy(kind: str, k: int) -> None:
    target = FakeBackend(TARGET)
    steps, done = _run(target, _drafter(kind), max_tokens=60, num_draft=k)
    assert list(done.tokens) == _plain(n=60)
    assert done.stats.stop_reason == "max_tokens"
    assert done.text == bytes(done.tokens).decode("utf-8", errors="replace")
    assert [t for s in steps for t in s.tokens] == list(done.tokens)
    if kind != "none":
        assert done.stats.n_drafted > 0, "the test should exercise drafting"
        # One batched target pass per round plus the prompt pass: fewer passes than tokens when drafts land.
        assert len(target.forward_calls) == done.stats.n_rounds + 1


COPY_TEXT = list(
    b"def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n"
)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_ngram_on_text_that_repeats_itself(k: int) -> None:
    """Prompt lookup on repetitive text: long accepted runs, partial rejections, same output as plain."""
    fn = scripted_tokens(COPY_TEXT, fallback=ord("."))
    prompt = COPY_TEXT[:30]
    _, done = _run(FakeBackend(fn), NgramDrafter(), prompt, max_tokens=len(COPY_TEXT) - 30 + 5, num_draft=k)
    assert list(done.tokens) == _plain(fn, prompt, n=len(COPY_TEXT) - 30 + 5)
    s = done.stats
    assert s.n_accepted > 0.25 * s.n_generated and s.n_accepted < s.n_drafted


def test_ngram_and_model_drafts_land_sometimes_and_miss_sometimes() -> None:
    for kind in ("ngram", "model"):
        _, done = _run(FakeBackend(TARGET), _drafter(kind), max_tokens=120, num_draft=4)
        assert 0 < done.stats.n_accepted < done.stats.n_drafted, kind


@pytest.mark.parametrize("k", [1, 4, 8])
def test_draft_equal_to_target_accepts_everything_greedy(k: int) -> None:
    _, done = _run(FakeBackend(TARGET), _drafter("self"), max_tokens=50, num_draft=k)
    assert done.stats.n_drafted > 0
    assert done.stats.n_accepted == done.stats.n_drafted
    assert list(done.tokens) == _plain(n=50)


@pytest.mark.parametrize("rule", ["exact", "match"])
def test_draft_equal_to_target_at_temperature(rule: str) -> None:
    """With q == p the exact rule accepts every draft; the match rule accepts fewer but never breaks."""
    _, done = _run(
        FakeBackend(TARGET), _drafter("self"), max_tokens=50, num_draft=4, rule=rule,
        sampling=SamplingParams(temperature=0.8, seed=3),
    )  # fmt: skip
    assert done.stats.n_drafted > 0
    if rule == "exact":
        assert done.stats.n_accepted == done.stats.n_drafted
    else:
        assert done.stats.n_accepted < done.stats.n_drafted


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_fully_accepted_draft_earns_the_bonus_token(k: int, temperature: float) -> None:
    """After all k drafts pass, the target's last row gives one more token: a draft identical to the target
    makes k+1 tokens per target pass. Dropping the bonus keeps the output right and only loses speed, so
    count the tokens of every round (the last one drafts fewer where the token budget ends)."""
    max_tokens = 40
    target = FakeBackend(TARGET)
    sampling = SamplingParams(temperature=temperature, seed=3)
    steps, done = _run(target, _drafter("self"), max_tokens=max_tokens, num_draft=k, sampling=sampling)
    rounds = [st.round for st in steps if st.round is not None]
    assert [r.n_drafted for r in rounds[:-1]] == [k] * (len(rounds) - 1)
    for st in steps[1:]:
        r = st.round
        assert r is not None and r.n_accepted == r.n_drafted and r.kind == "bonus"
        assert r.n_emitted == len(st.tokens) == r.n_drafted + 1
        assert st.origins == ("draft",) * r.n_drafted + ("target",)
    assert len(done.tokens) == max_tokens
    assert done.stats.n_rounds == -(-(max_tokens - 1) // (k + 1))  # the prompt pass's token, then k+1 a round
    assert len(target.forward_calls) == 1 + done.stats.n_rounds


# -- stats -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["none", "ngram", "model"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.9, seed=11)], ids=["greedy", "t0.9"])
def test_stats_are_consistent(kind: str, sampling: SamplingParams) -> None:
    k = 4
    steps, done = _run(FakeBackend(TARGET), _drafter(kind), max_tokens=80, num_draft=k, sampling=sampling)
    s = done.stats
    rounds = [st.round for st in steps if st.round is not None]
    assert steps[0].round is None and len(steps[0].tokens) == 1  # the first token is the prompt pass's
    assert s.n_generated == len(done.tokens) == sum(len(st.tokens) for st in steps) == 80
    assert s.n_generated == 1 + sum(r.n_emitted for r in rounds)
    assert s.n_rounds == len(rounds)
    assert [r.index for r in rounds] == list(range(len(rounds)))
    assert s.n_drafted == sum(r.n_drafted for r in rounds)
    assert s.n_accepted == sum(r.n_accepted for r in rounds)
    for st in steps[1:]:
        if not st.tokens:  # the detokenizer's flush at the end (an incomplete UTF-8 sequence)
            assert st.round is None and st is steps[-1]
            continue
        r = st.round
        assert r is not None and 0 <= r.n_accepted <= r.n_drafted <= r.k <= k
        assert r.n_emitted == len(st.tokens) == r.n_accepted + 1  # no EOG in this run: nothing cut
        assert st.origins == ("draft",) * r.n_accepted + ("target",)
        assert r.kind == ("bonus" if r.n_accepted == r.n_drafted else "recovered")
    # Recomputed from what the rounds emitted, not from stats.py's formulas: tokens per target pass
    # (each round's step), accepted drafts (tokens of draft origin) over drafted, and per position.
    round_steps = [st for st in steps if st.round is not None]
    assert s.mean_accepted_length == pytest.approx(np.mean([len(st.tokens) for st in round_steps]) if rounds else 0.0)
    from_draft = sum(st.origins.count("draft") for st in round_steps)
    drafted = sum(r.n_drafted for r in rounds)
    assert s.acceptance_rate == pytest.approx(from_draft / drafted if drafted else 0.0)
    by_position = [(sum(r.n_drafted > i for r in rounds), sum(r.n_accepted > i for r in rounds)) for i in range(k)]
    by_position = [(d, a) for d, a in by_position if d]
    assert s.drafted_by_position == tuple(d for d, _ in by_position)
    assert s.accepted_by_position == tuple(a for _, a in by_position)
    assert s.acceptance_by_position == pytest.approx([a / d for d, a in by_position])
    # Accepting position i+1 needs position i accepted: the counts never grow with the position.
    assert all(a >= b for a, b in itertools.pairwise(s.accepted_by_position))
    assert all(a >= b for a, b in itertools.pairwise(s.drafted_by_position))
    assert s.rule == ("greedy" if sampling.greedy else "exact")
    assert s.draft_method == kind and s.num_draft == (0 if kind == "none" else k)
    assert s.n_prompt == len(PROMPT) and s.temperature == sampling.temperature
    if kind == "none":
        assert s.n_drafted == 0 and s.mean_accepted_length == 1.0 and s.acceptance_by_position == ()


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_greedy_acceptance_by_position_is_non_increasing(kind: str) -> None:
    """When every round drafts the full k, acceptance by position can only fall with the position."""
    k = 5
    steps, done = _run(FakeBackend(TARGET), _drafter(kind, noise=1.0), max_tokens=150, num_draft=k)
    rates = done.stats.acceptance_by_position
    full = [st.round for st in steps if st.round is not None and st.round.n_drafted == k]
    if kind == "model":  # a model always drafts k, except near the token budget's end
        assert len(full) >= done.stats.n_rounds - 5
    # Recompute from the full rounds only (a short round may lift a later position's ratio).
    acc = [sum(r.n_accepted > i for r in full) / len(full) for i in range(k)]
    assert all(a >= b for a, b in itertools.pairwise(acc))
    assert len(rates) <= k and all(0.0 <= r <= 1.0 for r in rates)
    assert rates[0] > 0


def test_acceptance_by_position_is_conditional_on_the_position_being_drafted() -> None:
    """Each position's rate divides by the rounds that drafted that position. A short round (here the last,
    cut to k=1 by the token budget, and rejected) lowers only position 1: the rates can then rise with
    the position even at temperature 0. The counts themselves never rise."""
    script = list(b"abcdefghijklmnopqrstuvwxyz")
    draft_script = list(script)
    draft_script[13] = ord("Z")  # the draft disagrees at one position only: the last round's
    drafter = ModelDrafter(FakeBackend(scripted_tokens(draft_script)))
    _, done = _run(FakeBackend(scripted_tokens(script)), drafter, script[:2], max_tokens=1 + 5 * 2 + 2, num_draft=4)
    s = done.stats
    assert (s.drafted_by_position, s.accepted_by_position) == ((3, 2, 2, 2), (2, 2, 2, 2))
    assert s.acceptance_by_position == pytest.approx((2 / 3, 1.0, 1.0, 1.0))


def test_stats_with_an_injected_clock() -> None:
    ticks = itertools.count()
    target = FakeBackend(TARGET)
    config = GenerationConfig(max_tokens=20, num_draft=3)
    events = list(generate(target, _drafter("ngram"), PROMPT, config, clock=lambda: float(next(ticks))))
    s = events[-1].stats
    assert s.prompt_s == 1.0  # one tick for the prompt pass
    assert s.n_rounds > 0 and s.draft_s == s.n_rounds and s.verify_s == s.n_rounds  # one tick each
    assert s.decode_s > 0 and s.decode_tps == pytest.approx((len(events[-1].tokens) - 1) / s.decode_s)
    assert s.prompt_tps == len(PROMPT)  # the whole prompt in one tick


# -- stopping ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 7, 13, 31])
@pytest.mark.parametrize("kind", ["none", "ngram", "model", "self"])
def test_max_tokens_is_respected_exactly(kind: str, max_tokens: int) -> None:
    target = FakeBackend(TARGET)
    _, done = _run(target, _drafter(kind), max_tokens=max_tokens, num_draft=5)
    assert len(done.tokens) == done.stats.n_generated == max_tokens
    assert list(done.tokens) == _plain(n=max_tokens)
    assert done.stats.stop_reason == "max_tokens"
    # The budget shrinks k near the end: no round verifies tokens it could not emit.
    assert len(target.cached_tokens) <= len(PROMPT) + max_tokens


# A script whose continuation repeats the prompt, so prompt lookup drafts it, EOG included.
EOG_SCRIPT = [*b"abcdefgh", EOG, *b"xyabcdefgh", EOG]
EOG_PROMPT = EOG_SCRIPT[:13]  # ... EOG x y a b -> the target continues c d e f g h EOG


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("kind", ["none", "ngram", "self"])
def test_eog_stops_generation(kind: str, k: int) -> None:
    fn = scripted_tokens(EOG_SCRIPT)
    target = FakeBackend(fn)
    drafter = ModelDrafter(FakeBackend(fn)) if kind == "self" else _drafter(kind)
    steps, done = _run(target, drafter, EOG_PROMPT, max_tokens=50, num_draft=k)
    assert done.text == "cdefgh" and list(done.tokens) == list(b"cdefgh")
    assert done.stats.stop_reason == "eog"
    assert EOG not in [t for s in steps for t in s.tokens]
    assert done.stats.n_generated == 6 == 1 + sum(s.round.n_emitted for s in steps if s.round is not None)


def test_eog_inside_an_accepted_draft_cuts_the_round() -> None:
    """Prompt lookup proposes "... g h EOG x y"; the target accepts through EOG; output stops before it."""
    target = FakeBackend(scripted_tokens(EOG_SCRIPT))
    steps, done = _run(target, NgramDrafter(), EOG_PROMPT, max_tokens=50, num_draft=8)
    assert list(done.tokens) == list(b"cdefgh") and done.stats.stop_reason == "eog"
    last = steps[-1].round
    assert last is not None
    assert last.n_accepted >= 1 and last.n_emitted < last.n_accepted + 1  # EOG itself was a draft token
    assert steps[-1].origins == ("draft",) * len(steps[-1].tokens)


def test_eog_as_the_first_token() -> None:
    target = FakeBackend(scripted_tokens([*b"ab", EOG]))
    steps, done = _run(target, _drafter("ngram"), list(b"ab"), max_tokens=10, num_draft=4)
    assert done.tokens == () and done.text == "" and done.stats.stop_reason == "eog"
    assert done.stats.n_generated == 0 and done.stats.n_rounds == 0


@pytest.mark.parametrize("kind", ["none", "ngram", "model"])
def test_prompt_longer_than_the_context_is_refused(kind: str) -> None:
    target = FakeBackend(TARGET, n_ctx=len(PROMPT))
    with pytest.raises(ContextOverflowError):
        _run(target, _drafter(kind, n_ctx=len(PROMPT)), max_tokens=10)
    with pytest.raises(ContextOverflowError):
        _run(FakeBackend(TARGET, n_ctx=10), _drafter(kind, n_ctx=10), max_tokens=10)


def test_empty_prompt_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        _run(FakeBackend(TARGET), NoDrafter(), [], max_tokens=10)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("kind", ["none", "ngram", "model", "self"])
def test_context_filling_mid_generation_stops_with_reason_context(kind: str, k: int) -> None:
    n_ctx = len(PROMPT) + 20
    target = FakeBackend(TARGET, n_ctx=n_ctx)
    _, done = _run(target, _drafter(kind, n_ctx=n_ctx), max_tokens=100, num_draft=k)
    assert done.stats.stop_reason == "context"
    # Every position of the window is used: the last token comes from the logits at the last slot.
    assert len(target.cached_tokens) == n_ctx
    assert len(done.tokens) == n_ctx - len(PROMPT) + 1
    assert list(done.tokens) == _plain(n=100, n_ctx=n_ctx)


def test_stop_event_set_before_the_run_ends_after_the_first_token() -> None:
    stop = threading.Event()
    stop.set()
    _, done = _run(FakeBackend(TARGET), _drafter("ngram"), stop=stop, max_tokens=50, num_draft=4)
    assert done.stats.stop_reason == "stopped" and len(done.tokens) == 1


def test_stop_event_set_mid_generation() -> None:
    stop = threading.Event()
    config = GenerationConfig(max_tokens=200, num_draft=3, sampling=GREEDY)
    events = generate(FakeBackend(TARGET), _drafter("model"), PROMPT, config, stop=stop)
    n_steps = 0
    for event in events:
        if isinstance(event, Done):
            break
        n_steps += 1
        if n_steps == 4:
            stop.set()
    assert isinstance(event, Done)
    assert event.stats.stop_reason == "stopped"
    assert n_steps == 4 and event.stats.n_rounds == 3
    assert list(event.tokens) == _plain(n=len(event.tokens))


# -- seeds ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["none", "ngram", "model"])
@pytest.mark.parametrize("rule", ["exact", "match"])
def test_same_seed_same_output_different_seed_different_output(kind: str, rule: str) -> None:
    def tokens(seed: int) -> tuple[int, ...]:
        sampling = SamplingParams(temperature=1.0, seed=seed)
        _, done = _run(FakeBackend(TARGET), _drafter(kind), max_tokens=40, num_draft=4, rule=rule, sampling=sampling)
        assert done.stats.seed == seed
        return done.tokens

    assert tokens(42) == tokens(42)
    assert tokens(42) != tokens(43)


def test_no_seed_picks_and_reports_one() -> None:
    sampling = SamplingParams(temperature=1.0)
    _, a = _run(FakeBackend(TARGET), NoDrafter(), max_tokens=30, sampling=sampling)
    replay = SamplingParams(temperature=1.0, seed=a.stats.seed)
    _, b = _run(FakeBackend(TARGET), NoDrafter(), max_tokens=30, sampling=replay)
    assert a.tokens == b.tokens


# -- KV cache reuse -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["none", "ngram", "model"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.9, seed=5)], ids=["greedy", "t0.9"])
def test_second_turn_reuses_the_cached_prefix(kind: str, sampling: SamplingParams) -> None:
    target = FakeBackend(TARGET)
    drafter = _drafter(kind)
    _, first = _run(target, drafter, max_tokens=30, num_draft=4, sampling=sampling)
    assert first.stats.n_prompt_cached == 0
    second_prompt = [*PROMPT, *first.tokens, *b" And then?"]
    calls_before = len(target.forward_calls)
    _, second = _run(target, drafter, second_prompt, max_tokens=30, num_draft=4, sampling=sampling)
    assert second.stats.n_prompt_cached > len(PROMPT)
    assert second.stats.n_prompt_cached <= len(second_prompt) - 1
    # The prompt pass only evaluated what the cache lacked.
    assert target.forward_calls[calls_before] == len(second_prompt) - second.stats.n_prompt_cached
    _, fresh = _run(FakeBackend(TARGET), _drafter(kind), second_prompt, max_tokens=30, num_draft=4, sampling=sampling)
    assert second.tokens == fresh.tokens
    assert fresh.stats.n_prompt_cached == 0


def test_prompt_identical_to_the_cache_still_evaluates_its_last_token() -> None:
    target = FakeBackend(TARGET)
    _run(target, NoDrafter(), max_tokens=5)
    _, again = _run(target, NoDrafter(), max_tokens=5)
    assert again.stats.n_prompt_cached == len(PROMPT) - 1
    assert list(again.tokens) == _plain(n=5)


def test_unrelated_second_prompt_rolls_the_cache_back() -> None:
    target = FakeBackend(TARGET)
    drafter = _drafter("model")
    _run(target, drafter, max_tokens=20, num_draft=3)
    other = list(b"Completely different text")
    _, done = _run(target, drafter, other, max_tokens=20, num_draft=3)
    assert done.stats.n_prompt_cached == 0
    assert list(done.tokens) == _plain(prompt=other, n=20)


# -- config ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"rule": "nope"}, {"num_draft": -1}, {"max_tokens": 0}])
def test_bad_config_is_a_usage_error(kwargs: dict) -> None:
    with pytest.raises(UsageError):
        GenerationConfig(**kwargs)


def test_k_zero_is_plain_decoding() -> None:
    target = FakeBackend(TARGET)
    _, done = _run(target, _drafter("model"), max_tokens=20, num_draft=0)
    assert list(done.tokens) == _plain(n=20) and done.stats.n_drafted == 0
    assert target.forward_calls[1:] == [1] * 19


def test_draft_with_a_padded_vocabulary() -> None:
    """A draft whose logits rows are wider than the target's (padded embeddings) still verifies exactly."""
    wide = 300

    def draft_fn(ctx: Sequence[int]) -> np.ndarray:
        out = np.full(wide, -np.inf, dtype=np.float32)
        out[:257] = TARGET(ctx)
        return out

    drafter = ModelDrafter(FakeBackend(draft_fn, n_vocab=wide))
    sampling = SamplingParams(temperature=0.7, seed=1)
    _, done = _run(FakeBackend(TARGET), drafter, max_tokens=30, num_draft=4, sampling=sampling)
    assert done.stats.n_accepted == done.stats.n_drafted > 0
    _, plain = _run(FakeBackend(TARGET), NoDrafter(), max_tokens=30, sampling=sampling)
    assert len(done.tokens) == len(plain.tokens) == 30


@pytest.mark.parametrize("rule", ["exact", "match"])
@pytest.mark.parametrize("kind", ["none", "ngram", "model"])
def test_top_k_1_at_temperature_equals_greedy(kind: str, rule: str) -> None:
    """Filters leave a one-hot p and q: the sampling path must then reproduce greedy decoding exactly."""
    sampling = SamplingParams(temperature=1.3, top_k=1, seed=9)
    _, done = _run(FakeBackend(TARGET), _drafter(kind), max_tokens=60, num_draft=4, rule=rule, sampling=sampling)
    assert list(done.tokens) == _plain(n=60)
    assert done.stats.rule == rule


def test_stats_to_dict_is_json_ready() -> None:
    _, done = _run(FakeBackend(TARGET), _drafter("ngram"), max_tokens=30, num_draft=3)
    d = json.loads(json.dumps(done.stats.to_dict()))
    assert d["n_generated"] == 30 and d["stop_reason"] == "max_tokens"
    assert d["mean_accepted_length"] == pytest.approx(done.stats.mean_accepted_length)
    assert d["acceptance_by_position"] == list(done.stats.acceptance_by_position)


@pytest.mark.parametrize("draft_ctx", [len(PROMPT) - 5, len(PROMPT) + 1, len(PROMPT) + 12])
def test_draft_with_a_smaller_window_than_the_target(draft_ctx: int) -> None:
    """A draft whose context is smaller (an MLX sliding-window cache is capped) drafts less, then nothing;
    the run goes on as plain decoding instead of overflowing the draft's cache."""
    draft = FakeBackend(TARGET, n_ctx=draft_ctx)
    _, done = _run(FakeBackend(TARGET), ModelDrafter(draft), max_tokens=40, num_draft=5)
    assert list(done.tokens) == _plain(n=40) and done.stats.stop_reason == "max_tokens"
    assert len(draft.cached_tokens) <= draft_ctx
    if draft_ctx > len(PROMPT):
        assert 0 < done.stats.n_drafted == done.stats.n_accepted
    else:
        assert done.stats.n_drafted == 0


def test_draft_tokens_outside_the_target_vocabulary_are_rejected_not_fed() -> None:
    """A draft with a larger vocabulary (padding ids) may propose ids the target cannot embed."""
    from fakes import N_VOCAB, FakeBackend, hashed_logits

    target_fn = hashed_logits(3)

    def wide_draft(context):  # type: ignore[no-untyped-def]
        out = np.full(N_VOCAB + 40, -1e9, dtype=np.float32)
        out[:N_VOCAB] = target_fn(context)
        if len(context) % 3 == 0:
            out[N_VOCAB + 7] = 1e3  # now and then the draft insists on a padding id
        return out

    class Guarded(FakeBackend):
        def forward(self, tokens, *, all_logits=True):  # type: ignore[no-untyped-def]
            assert max(tokens) < N_VOCAB, "target was fed an id outside its vocabulary"
            return super().forward(tokens, all_logits=all_logits)

    for temperature in (0.0, 1.0):
        cfg = GenerationConfig(max_tokens=40, num_draft=4, sampling=SamplingParams(temperature=temperature, seed=5))
        spec = list(
            generate(Guarded(target_fn), ModelDrafter(FakeBackend(wide_draft, n_vocab=N_VOCAB + 40)), [1, 2, 3], cfg)
        )[-1]
        assert isinstance(spec, Done) and all(t < N_VOCAB for t in spec.tokens)
        if temperature == 0.0:
            plain = list(generate(FakeBackend(target_fn), NoDrafter(), [1, 2, 3], cfg))[-1]
            assert spec.tokens == plain.tokens


def test_greedy_near_ties_are_marked_with_position_and_gap() -> None:
    """At temperature 0 a choice whose runner-up is within NEAR_TIE_GAP logits is listed (where batched
    and one-token arithmetic may part); clear choices are not, and sampling runs list none."""
    from localspec.decoding.drafters import NgramDrafter
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.decoding.stats import NEAR_TIE_GAP
    from localspec.sampling import SamplingParams

    def logits(tokens: list[int]) -> np.ndarray:
        row = np.zeros(N_VOCAB, dtype=np.float32)
        n = len(tokens)
        row[65 + n % 3] = 5.0
        if n % 4 == 0:  # every fourth step: a runner-up 0.05 below
            row[66 + n % 3] = 5.0 - NEAR_TIE_GAP / 2
        return row

    def ties(temperature: float) -> tuple[tuple[int, ...], list]:  # type: ignore[type-arg]
        target = FakeBackend(logits)
        config = GenerationConfig(max_tokens=24, num_draft=4, sampling=SamplingParams(temperature=temperature, seed=1))
        done = [e for e in generate(target, NgramDrafter(), [65, 66, 67], config) if isinstance(e, Done)][0]
        return done.tokens, list(done.stats.near_ties)

    tokens, found = ties(0.0)
    prompt_len = 3
    expected = [i for i in range(len(tokens)) if (prompt_len + i) % 4 == 0]
    assert [t.position for t in found] == expected and expected
    for t in found:
        assert t.token == tokens[t.position] and abs(t.gap - NEAR_TIE_GAP / 2) < 1e-4 and t.runner_up == t.token + 1
    assert ties(0.7)[1] == []
