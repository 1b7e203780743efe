"""The adaptive (`auto`) drafting controller on fake backends with scripted costs and acceptance.

Costs come from a fake clock that moves only when a fake model runs, so every decision here is
deterministic; no assertion depends on real timing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from fakes import (
    N_VOCAB,
    CostedBackend,
    FakeBackend,
    FakeClock,
    hashed_logits,
    scripted_draft,
    without,
)

from localspec.decoding.auto import AutoDrafter, auto_ngram
from localspec.decoding.calibrate import MIN_JUDGED, measure
from localspec.decoding.drafters import ModelDrafter, NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.policy import (
    NEW_SIZE_CLIP,
    Controller,
    CostModel,
    expected_tokens,
    match_bucket,
    survival,
)
from localspec.decoding.stats import RoundStats
from localspec.sampling import SamplingParams

TARGET = without(hashed_logits(1))
PROMPT = list(b"def add(a, b):\n    return a + b\n")
GREEDY = SamplingParams(temperature=0.0)


def _by_position_script(script: list[int], fallback: int):  # type: ignore[no-untyped-def]
    """A model that writes `script` by absolute position (certain of every token), then `fallback`."""

    def fn(context):  # type: ignore[no-untyped-def]
        out = np.full(N_VOCAB, -10.0, dtype=np.float32)
        out[script[len(context)] if len(context) < len(script) else fallback] = 10.0
        return out

    return fn


def gpu_like(n: int) -> float:  # a batch is nearly free
    return 0.010 + 0.0005 * (n - 1)


def cpu_like(n: int) -> float:  # a CPU-like curve: a batch of 4 costs ~1.6x one token
    return 0.010 * (1 + 0.2 * (n - 1))


def _auto(
    clock: FakeClock,
    target_cost: Callable[[int], float],
    draft_cost: Callable[[int], float],
    agree: Callable[[int], bool],
    *,
    ngram: bool = False,
    target_fn=TARGET,
    costs: CostModel | None = None,
) -> tuple[CostedBackend, AutoDrafter]:
    target = CostedBackend(target_fn, clock, target_cost, name="target")
    draft = CostedBackend(scripted_draft(target_fn, agree), clock, draft_cost, name="draft")
    drafter = AutoDrafter(
        ngram=auto_ngram() if ngram else None, model=ModelDrafter(draft), target=target, clock=clock, costs=costs
    )
    return target, drafter


def _run(target, drafter, clock, n: int, prompt=PROMPT, k: int = 8):  # type: ignore[no-untyped-def]
    rounds: list[RoundStats] = []
    done = None
    for ev in generate(
        target, drafter, prompt, GenerationConfig(max_tokens=n, num_draft=k, sampling=GREEDY), clock=clock
    ):
        if isinstance(ev, Done):
            done = ev
        elif ev.round is not None:
            rounds.append(ev.round)
    assert done is not None
    return rounds, done


def _plain_tokens(n: int, fn=TARGET, prompt=PROMPT) -> tuple[int, ...]:
    *_, done = generate(FakeBackend(fn), NoDrafter(), prompt, GenerationConfig(max_tokens=n, sampling=GREEDY))
    assert isinstance(done, Done)
    return done.tokens


def _by_position(rounds: list[RoundStats], lo: int, hi: int) -> list[RoundStats]:
    """Rounds that started with between lo and hi tokens generated."""
    out, pos = [], 1  # the first token comes from the prompt pass
    for r in rounds:
        if lo <= pos < hi:
            out.append(r)
        pos += r.n_emitted
    return out


def _mean_drafted(rounds: list[RoundStats]) -> float:
    return sum(r.n_drafted for r in rounds) / len(rounds)


# -- the cost model and the plan ------------------------------------------------------------------


def test_expected_tokens_is_the_geometric_sum() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_a_lookup_draft_counts_each_token_for_the_match_length_it_extends() -> None:
    """Token i of a draft from a 6-token match extends a copy of 6 + i tokens: its verdict goes to that
    length's bucket (5-7, 8-15, ...), the first rejected token as the one failure."""
    c = Controller(CostModel(target={1: 0.03}))
    before = {b: (a.accepted, a.rejected) for b, a in c.ngram_accept.items()}
    c.observe_lookup(6, 4, 8)  # lengths 6, 7 (bucket 5) and 8, 9 (bucket 8) held; 10 (bucket 8) broke
    after = {b: (a.accepted, a.rejected) for b, a in c.ngram_accept.items()}
    changed = {b for b in after if after[b] != before[b]}
    assert changed == {5, 8}
    assert after[5] == (2.0, 0.0) and after[8] == (2.0, 1.0)
    c.observe_lookup(40, 3, 3)  # all held: no failure anywhere
    assert c.ngram_accept[match_bucket(40)].accepted == 3.0 and c.ngram_accept[32].rejected == 0.0
    assert survival([0.5, 0.5, 1.0]) == [0.5, 0.25, 0.25]


def test_copies_that_held_earn_long_drafts_from_a_middling_match() -> None:
    """A match of 9 tokens where copies of 16+ tokens almost never break: the draft runs to the full 32,
    where one acceptance figure for the whole draft (its first token's, lower) would stop it at the
    flat part of this CPU-like batch curve (8 to 16 tokens cost about the same)."""
    curve = {1: 1.0, 2: 1.7, 3: 2.4, 4: 2.8, 5: 3.6, 8: 7.0, 16: 8.0, 32: 14.0}
    sizes = sorted(curve)
    t = lambda n: 0.035 * float(np.interp(n, sizes, [curve[s] for s in sizes]))
    c = Controller(CostModel(target={n: t(n) for n in range(1, 34)}))
    for _ in range(4):
        c.observe_lookup(16, 24, 24)  # copies of 16 to 39 tokens held, round after round
        c.observe_lookup(9, 6, 6)
    c.observe_lookup(9, 6, 7)  # one broke at 15 tokens
    assert 0.9 < c.ngram_acceptance(9).alpha < 0.96 < c.ngram_acceptance(16).alpha
    plan = c.plan(32, model=False, ngram_avail=32, ngram_order=9)
    assert plan.method == "ngram" and plan.k == 32
    one_alpha = max(range(1, 33), key=lambda j: expected_tokens(plan.alpha, j) / t(j + 1))
    assert one_alpha <= 16  # what the first token's acceptance alone would have chosen


def test_cost_model_interpolates_and_extrapolates() -> None:
    c = CostModel(target={1: 0.010, 3: 0.014})
    assert c.target_s(2) == pytest.approx(0.012)
    # Beyond, the measured growth goes on as a power of n (0.014 * (5 / 3) ** (log 1.4 / log 3)), under a straight line.
    assert c.target_s(5) == pytest.approx(0.014 * (5 / 3) ** (math.log(1.4) / math.log(3)))
    assert c.target_s(5) < 0.018
    c.observe_target(1, 0.020)
    assert 0.010 < c.target_s(1) < 0.020  # moves towards new measurements, smoothed


def test_a_size_never_timed_takes_its_first_timing_and_the_pace_stays() -> None:
    """A curve remembered to 6 tokens guesses T(33) by its power law; the first 33-token pass replaces the guess
    (the guess was wrong, not the machine's pace), where blending it in at SHAPE_RATE kept long copies priced by
    the guess for dozens of rounds. A size already timed still moves smoothly, and a first timing far off its guess
    (a preempted pass) moves it by NEW_SIZE_CLIP at most."""
    c = CostModel(target={n: cpu_like(n) for n in range(1, 7)})
    guess = c.target_s(33)
    c.observe_target(33, 0.85 * guess)
    assert c.target_s(33) == pytest.approx(0.85 * guess, rel=1e-12)
    assert c.scale == 1.0 and c.target_s(1) == cpu_like(1)
    c.observe_target(33, 0.70 * guess)  # timed before: smoothed, and part of it is the machine's pace
    assert 0.70 * guess < c.target_s(33) < 0.85 * guess and c.scale < 1.0
    guess = c.target_s(20)
    c.observe_target(20, 5.0 * guess)
    assert c.target_s(20) == pytest.approx(NEW_SIZE_CLIP * guess, rel=1e-12)


@pytest.mark.parametrize(
    "target", [{5: 0.1}, {1: 0.03, 4: 0.05}, {2: 0.05, 3: 0.07, 9: 0.1}, {n: cpu_like(n) for n in (1, 2, 4, 8, 16, 33)}]
)
def test_the_whole_cost_curve_at_once_is_target_s_at_every_size(target: dict[int, float]) -> None:
    costs = CostModel(target=dict(target), scale=1.3)  # one size (the prior's slope), below, between, beyond
    assert costs.target_curve(40) == pytest.approx([costs.target_s(n) for n in range(1, 41)])


@pytest.mark.parametrize(
    "target", [{1: 0.03, 4: 0.05}, {2: 0.05, 3: 0.07, 9: 0.1}, {n: cpu_like(n) for n in (1, 2, 4, 8)}]
)
def test_the_curve_interpolates_between_sizes_and_grows_as_a_power_beyond(target: dict[int, float]) -> None:
    """Against numpy's interpolation and the power law written out: the plans read the curve as plain floats, made
    in a loop of their own, and then extended when a plan weighs longer drafts."""
    costs = CostModel(target=dict(target))
    sizes = sorted(target)
    power = min(max(math.log(target[sizes[-1]] / target[sizes[0]]) / math.log(sizes[-1] / sizes[0]), 0.0), 1.0)
    assert costs.unscaled_curve(3)[1:4] == pytest.approx(np.interp([1, 2, 3], sizes, [target[n] for n in sizes]))
    curve = costs.unscaled_curve(20)  # extended past the sizes measured
    inside = np.interp(np.arange(1, sizes[-1] + 1), sizes, [target[n] for n in sizes])
    beyond = [target[sizes[-1]] * (n / sizes[-1]) ** power for n in range(sizes[-1] + 1, 21)]
    assert curve[1:21] == pytest.approx([*inside, *beyond], rel=1e-12)


def test_the_curve_follows_a_size_whose_cost_moved() -> None:
    """The curve is cached for the rounds that plan on it, and made again when a round refines a size's cost."""
    costs = CostModel(target={1: 0.03, 4: 0.06})
    assert costs.target_s(2) == pytest.approx(0.04)
    costs.target[4] = 0.09  # as observe_target, cost_learning and calibration set it
    assert costs.target_s(2) == pytest.approx(0.05)
    assert costs.unscaled_curve(8)[8] == pytest.approx(0.09 * 2 ** (math.log(3) / math.log(4)))


def test_plan_follows_costs_and_acceptance() -> None:
    gpu = Controller(CostModel(target={n: gpu_like(n) for n in range(1, 10)}, draft_token=0.001))
    for _ in range(10):
        gpu.model_accept.update(8, 8)
    plan = gpu.plan(8, model=True)
    assert plan.method == "model" and plan.k >= 6 and plan.gain > 3

    slow = Controller(CostModel(target={n: gpu_like(n) for n in range(1, 10)}, draft_token=0.012))
    for _ in range(10):
        slow.model_accept.update(8, 8)
    assert slow.plan(8, model=True).method == "none"  # even a perfect draft slower than the target loses

    # Free n-gram drafts with a good record win on a CPU-like batch curve where the model would not.
    cpu = Controller(CostModel(target={n: cpu_like(n) for n in range(1, 10)}, draft_token=0.008))
    for _ in range(10):
        cpu.observe_lookup(3, 5, 5)
        cpu.model_accept.update(1, 4)
    plan = cpu.plan(8, model=True, ngram_avail=6, ngram_order=3)
    assert plan.method == "ngram" and plan.k >= 4


def test_calibration_measures_the_batch_curve_and_restores_the_caches() -> None:
    clock = FakeClock()
    target = CostedBackend(TARGET, clock, cpu_like)
    draft = CostedBackend(TARGET, clock, lambda n: 0.004 * n)
    target.forward(PROMPT)
    drafter = ModelDrafter(draft)
    costs = measure(target, drafter, PROMPT, max_batch=5, clock=clock).costs
    assert costs.target == pytest.approx({n: cpu_like(n) for n in range(1, 6)})
    assert costs.draft_token == pytest.approx(0.004)
    assert list(target.cached_tokens) == PROMPT
    # The drafter resyncs from wherever timing left it: its next proposal is a fresh drafter's.
    fresh = ModelDrafter(CostedBackend(TARGET, FakeClock(), lambda n: 0.0))
    rng = np.random.default_rng(0)
    assert drafter.propose(PROMPT, 4, GREEDY, rng).tokens == fresh.propose(PROMPT, 4, GREEDY, rng).tokens


# -- whole runs through the engine ----------------------------------------------------------------


def test_auto_output_equals_plain_greedy() -> None:
    clock = FakeClock()
    target, drafter = _auto(clock, gpu_like, lambda n: 0.001, lambda pos: pos % 50 < 30, ngram=True)
    _, done = _run(target, drafter, clock, 200)
    assert done.tokens == _plain_tokens(200)
    assert done.stats.draft_method == "auto"


def test_cheap_draft_with_perfect_acceptance_drafts_long() -> None:
    clock = FakeClock()
    target, drafter = _auto(clock, gpu_like, lambda n: 0.001, lambda pos: True)
    rounds, done = _run(target, drafter, clock, 200)
    assert sum(r.n_drafted == 0 for r in rounds) <= 1 + MIN_JUDGED
    assert _mean_drafted(rounds[1:]) >= 6
    drafts = [r for r in rounds if r.source != "check"]  # not the guessed tokens that time T(2) before the first probe
    assert sum(r.n_accepted for r in drafts) == sum(r.n_drafted for r in drafts)
    # The first round times T(1); the next ones time T(2) (a guessed token each) until the curve's growth is no
    # longer the prior's; then the draft model is tried and drafts, with a plain round now and then until T(1) is
    # timed often enough to judge (no stored costs here).
    first = next(i for i, r in enumerate(rounds) if r.source == "model")
    assert first <= 4 and all(r.source == "check" for r in rounds[1:first])
    assert rounds[first].note.startswith(("auto: probe model k=2", "auto: model k="))
    timing = [r for r in rounds[first + 1 :] if r.note.startswith("auto: plain, to time T(1)")]
    assert len(timing) <= MIN_JUDGED
    assert all(r.note.startswith("auto: model k=") for r in rounds[first + 1 :] if r.k > 0 and r not in timing)


def test_backs_off_when_acceptance_drops_and_returns_when_it_recovers() -> None:
    clock = FakeClock()
    n0 = len(PROMPT)
    good = lambda pos: not (n0 + 150 <= pos < n0 + 300)
    target, drafter = _auto(clock, gpu_like, lambda n: 0.001, good)
    rounds, done = _run(target, drafter, clock, 600)
    before = _by_position(rounds, 20, 150)
    during = _by_position(rounds, 200, 300)
    after = _by_position(rounds, 450, 600)
    assert _mean_drafted(before) >= 6
    # Once the draft stops matching, auto drafts little or nothing, and says so.
    assert _mean_drafted(during) <= 1.0
    assert sum(r.note.startswith("auto: plain") for r in during) >= len(during) // 2
    # A re-probe finds the draft matching again and long drafts come back.
    assert _mean_drafted(after) >= 6
    assert done.tokens == _plain_tokens(600)


def test_the_draft_is_timed_more_than_once_so_a_busy_spell_does_not_stick(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Remembered on disk, a draft cost measured in a busy spell would keep the draft model unloaded on
    this machine for good (auto skips a draft that cannot pay without looking at it again). So the least
    of the first DRAFT_REPS timings stands, probes go on until there are that many, and only then is the
    draft's cost settled (and stored)."""
    from localspec.decoding.cost_cache import CostStore
    from localspec.decoding.policy import DRAFT_REPS

    c = Controller(CostModel(target={n: cpu_like(n) for n in range(1, 10)}))
    probe = c.plan(8, model=True)  # never timed: the first probe comes at once
    assert probe.probe and probe.k == 2
    slow = 20 * 0.3 * gpu_like(1)  # another process had the cores: a draft token as dear as six target ones
    c.observe(probe, RoundStats(1, 2, 2, 3, 2 * slow, cpu_like(3), "spec", 2))
    assert not c.draft_settled and c.model_can_pay(8)  # unsettled: one timing rules nothing out
    for _ in range(DRAFT_REPS - 1):
        c.observe(probe, RoundStats(2, 2, 2, 3, 2 * 0.3 * gpu_like(1), cpu_like(3), "spec", 2))
    assert c.draft_settled and c.costs.draft_s() == pytest.approx(0.3 * gpu_like(1))
    # An unsettled draft cost is not remembered.
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    store = CostStore.for_models(target=str(model), draft=None, backend="llama", device="CPU", threads=2)
    clock = FakeClock()
    target, drafter = _auto(clock, gpu_like, lambda n: slow, lambda pos: True)
    drafter.store = store
    store.save(CostModel(target={n: gpu_like(n) for n in (1, 2, 4, 9)}))
    drafter.controller = Controller(CostModel(target={n: gpu_like(n) for n in (1, 2, 4, 9)}))
    _run(target, drafter, clock, 20)
    drafter.save_costs()
    assert drafter.controller.draft_timings == 1 and store.load().draft_token is None  # type: ignore[union-attr]


def test_turns_speculation_off_when_the_draft_is_too_slow() -> None:
    clock = FakeClock()
    # A draft token costs more than a target token: even 100% acceptance cannot pay. Measured on the
    # first round (calibration waits for a round with a draft to offer, so not before the first token).
    target, drafter = _auto(clock, gpu_like, lambda n: 1.2 * gpu_like(n), lambda pos: True)
    rounds, done = _run(target, drafter, clock, 300)
    drafted = [r for r in rounds if r.n_drafted > 0 and r.source != "check"]
    assert drafted and all(r.note.startswith("auto: probe model k=2") for r in drafted)  # timings, not plans
    first = rounds.index(drafted[0])  # the first once T(2) is timed (the slope no longer the prior's), then on the
    assert all(r.source == "check" for r in rounds[1:first]) and first <= 4 and len(drafted) <= 3  # allowance
    assert all(r.note.startswith("auto: plain") for r in rounds if r.k > 0 and r.n_drafted == 0)
    assert done.stats.prompt_s == pytest.approx(gpu_like(len(PROMPT)))  # the prompt pass alone
    # Decode time is plain decoding's plus the probes (the draft catching up and a batch of 3 verified).
    assert 0 < done.stats.decode_s - 299 * gpu_like(1) < 0.08 * 299 * gpu_like(1)
    # With those costs remembered (a later run), nothing is measured again and the draft is never touched.
    clock2 = FakeClock()
    settled = replace(drafter.controller.costs.copy(), draft_token=1.2 * gpu_like(1))  # as a store hands it back
    target2, again = _auto(clock2, gpu_like, lambda n: 1.2 * gpu_like(n), lambda pos: True, costs=settled)
    _, done2 = _run(target2, again, clock2, 300)
    assert done2.stats.decode_s == pytest.approx(299 * gpu_like(1), rel=1e-6)
    assert again.model.backend.forward_calls == []  # type: ignore[union-attr]


def test_reprobes_back_off_while_the_draft_keeps_missing() -> None:
    clock = FakeClock()
    target, drafter = _auto(clock, gpu_like, lambda n: 0.001 + 0.0001 * (n - 1), lambda pos: False)
    rounds, done = _run(target, drafter, clock, 1000)
    assert sum(r.n_drafted == 0 for r in rounds) >= 0.95 * len(rounds)
    probes = [i for i, r in enumerate(rounds) if "probe" in r.note]
    assert 3 <= len(probes) <= 8
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert all(b >= a - 1 for a, b in zip(gaps, gaps[1:])) and gaps[-1] > gaps[0]  # (-1: rounding at the cap)
    # What the probes cost stays within the exploration allowance (3% of plain time, plus rounding), apart
    # from the one calibration (in the first round's drafting time).
    assert done.stats.decode_s - rounds[0].draft_s <= 1.04 * 999 * gpu_like(1)


def test_no_probe_when_catching_the_draft_up_rules_out_a_win() -> None:
    """A CPU curve measured here: a 16-token model draft accepted whole would beat plain decoding by 5%,
    so a draft in step with the text is re-probed now and then. But after a long plain stretch the
    draft must first read everything it missed (about a quarter of a draft token each), and spread over
    the rounds a plan spreads it, that rules out any win: no probe then (one cost 0.9 s in a bench run)."""
    shape = {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.5, 16: 6.3, 17: 6.5, 33: 11.7}
    costs = CostModel(target={n: 0.03 * r for n, r in shape.items()}, draft_token=0.6 * 0.03)
    assert Controller(costs).ceiling("model", 32) > 1.03 / 0.03  # could pay, with no catch-up

    def probes(gap: Callable[[int], int]) -> int:
        c = Controller(costs)
        return sum(c.plan(32, model=True, model_gap=gap(i)).probe for i in range(400))

    assert probes(lambda i: 0) >= 1
    assert probes(lambda i: 200 + i) == 0  # the prompt and every plain token since


def test_turns_off_when_the_draft_slows_down_mid_run() -> None:
    clock = FakeClock()
    target, drafter = _auto(clock, gpu_like, lambda n: 0.001, lambda pos: True)
    slow_after = len(PROMPT) + 150
    draft = drafter.model.backend  # type: ignore[union-attr]
    draft.cost = lambda n: 0.001 * n if len(draft.cached_tokens) < slow_after else 1.5 * gpu_like(n)  # type: ignore[attr-defined]
    rounds, _ = _run(target, drafter, clock, 450)
    assert _mean_drafted(_by_position(rounds, 20, 140)) >= 6
    late = _by_position(rounds, 300, 450)
    assert sum(r.n_drafted == 0 for r in late) >= 0.8 * len(late)


def test_ngram_is_chosen_on_text_that_repeats_its_input() -> None:
    # The target copies the prompt (a code edit that repeats its input); the model draft is slow.
    body = list(b"for item in items:\n    total += item.price * item.count\n" * 3)
    script = PROMPT + body[:60] + body
    fn = _by_position_script(script, ord(" "))
    prompt = script[: len(PROMPT) + 60]
    clock = FakeClock()
    target, drafter = _auto(clock, cpu_like, lambda n: 0.009 * n, lambda pos: False, ngram=True, target_fn=fn)
    rounds, done = _run(target, drafter, clock, 120, prompt=prompt)
    ngram_rounds = [r for r in rounds if "ngram" in r.note and r.n_drafted > 0]
    assert len(ngram_rounds) >= len(rounds) // 2
    assert done.stats.mean_accepted_length > 3
    assert not any(" model k=" in r.note and "probe" not in r.note for r in rounds)


def test_stats_count_the_decisions() -> None:
    clock = FakeClock()
    target, drafter = _auto(clock, gpu_like, lambda n: 1.2 * gpu_like(n), lambda pos: True)
    rounds, done = _run(target, drafter, clock, 100)
    by_source = {s.source: s for s in done.stats.sources}
    assert done.stats.choices().startswith("plain ")
    assert sum(s.rounds for s in done.stats.sources) == done.stats.n_rounds == len(rounds)
    assert by_source["none"].rounds == sum(1 for r in rounds if r.n_drafted == 0)


def test_model_drafter_stops_at_low_confidence_only_when_asked() -> None:
    # Draft: sure of itself for 3 tokens (copies the target x 4), then unsure (plain hashed logits).
    n0 = len(PROMPT)

    def fn(context):  # type: ignore[no-untyped-def]
        return TARGET(context) * (10.0 if len(context) < n0 + 3 else 0.05)

    rng = np.random.default_rng(0)
    default = ModelDrafter(FakeBackend(fn))
    default.prepare(PROMPT, 6)
    assert len(default.propose(PROMPT, 6, GREEDY, rng).tokens) == 6  # off by default: drafts all k
    cautious = ModelDrafter(FakeBackend(fn))
    cautious.prepare(PROMPT, 6)
    d = cautious.propose(PROMPT, 6, GREEDY, rng, min_confidence=0.5)
    assert len(d.tokens) == 3 and "confidence" in d.note


def test_ngram_acceptance_is_learned_during_plain_rounds_for_free() -> None:
    # A steep batch curve (a batch of 2 costs 1.5x one), where a failed n-gram draft is expensive. Unused
    # n-gram proposals are graded against the text the target then writes, so auto learns that the text
    # repeats without spending a verify pass on it, and n-gram drafting takes over.
    steep = lambda n: 0.010 * (1 + 0.5 * (n - 1))
    body = list(b"for item in items:\n    total += item.price * item.count\n" * 3)
    script = PROMPT + body[:60] + body
    fn = _by_position_script(script, ord(" "))
    clock = FakeClock()
    known = CostModel(target={n: steep(n) for n in range(1, 10)}, draft_token=0.009)  # remembered: no calibration
    target, drafter = _auto(clock, steep, lambda n: 0.009 * n, lambda pos: False, ngram=True, target_fn=fn, costs=known)
    rounds, done = _run(target, drafter, clock, 120, prompt=script[: len(PROMPT) + 60])
    first = next(i for i, r in enumerate(rounds) if "ngram" in r.note and r.n_drafted > 0)
    assert first <= 8  # once a withheld proposal of its length was graded (a prior alone must gain PRIOR_MARGIN)
    assert not any("probe" in r.note for r in rounds)  # the slow draft model is never worth a look
    assert sum("ngram" in r.note for r in rounds) >= len(rounds) // 2
    assert done.stats.decode_s < 0.85 * 119 * steep(1)  # faster than plain decoding, on a steep curve


def test_the_first_probe_needs_a_draft_that_could_pay_on_prior_costs() -> None:
    """Before the draft model is ever timed, a probe that must first read the prompt into it is judged on
    prior costs (a draft token: the draft's share of T(1); reading: that share of a batched target token).
    The curve measured on this CPU for Qwen2.5-Coder 1.5B (T(2) 1.8x, T(7) 4.5x T(1)) with the 0.5B (0.44 of
    its size): no probe after a 455-token prompt (each conversation's first probe cost 2.3-2.8 s there).
    A GPU-like curve probes at once, and so does this CPU for a draft a twentieth of the target's size."""
    cpu = {1: 0.047, 2: 0.084, 3: 0.112, 4: 0.138, 5: 0.158, 6: 0.189, 7: 0.210}
    assert not Controller(CostModel(target=cpu), draft_ratio=0.44).plan(32, model=True, model_gap=455).probe
    gpu = Controller(CostModel(target={n: gpu_like(n) for n in (1, 2, 4, 9, 33)}), draft_ratio=0.44)
    first = gpu.plan(32, model=True, model_gap=455)
    assert first.probe and first.method == "model"
    tiny = Controller(CostModel(target=cpu), draft_ratio=0.05)
    assert tiny.plan(32, model=True, model_gap=40).probe
    # One timing in a busy spell rules nothing out while unsettled: the prior's cost where it is lower.
    busy = Controller(CostModel(target={n: gpu_like(n) for n in (1, 2, 4, 9, 33)}, draft_token=0.05))
    busy.draft_timings = 1
    assert any(busy.plan(32, model=True).probe for _ in range(1000))  # on the allowance, as re-probes are


def test_the_draft_ratio_comes_from_the_models_sizes(smollm2_path) -> None:  # type: ignore[no-untyped-def]
    from localspec.backends.llama import backend as lb
    from localspec.decoding.auto import draft_ratio
    from localspec.decoding.policy import DRAFT_RATIO

    t = lb.load(str(smollm2_path), n_ctx=128, threads=1)
    try:
        assert draft_ratio(ModelDrafter(t), t) == 1.0
        assert draft_ratio(None, t) == DRAFT_RATIO and draft_ratio(ModelDrafter(t), None) == DRAFT_RATIO
    finally:
        t.close()


def test_a_copy_on_its_prior_alone_must_gain_more_than_timing_noise() -> None:
    """On this CPU's steep curve (T(2) 1.9x, T(4) 3.0x T(1), as auto stored it for Qwen2.5-Coder 1.5B) a copy of 8 tokens
    with its prior acceptance (0.85) is estimated at a few percent over plain: within what a wrong prior costs (a
    generated docstring echoing the prompt: a 3-token draft rejected at once cost 2 tokens' time). It waits until
    one draft or withheld proposal of its length is graded; graded well, the same estimate drafts."""
    from localspec.decoding.policy import MARGIN, PRIOR_MARGIN, Controller, CostModel

    cpu = {1: 0.0325, 2: 0.0618, 3: 0.0785, 4: 0.0966, 5: 0.1169}
    fresh = Controller(CostModel(target=dict(cpu)))
    est = fresh.best("ngram", 4, 8)
    assert 1.0 + 2 * MARGIN < est.gain < 1.0 + PRIOR_MARGIN, est  # the case the wider margin is for (1.07x)
    assert fresh.plan(4, model=False, ngram_avail=4, ngram_order=8).method == "none"
    graded = Controller(CostModel(target=dict(cpu)))
    graded.observe_lookup(8, 1, 1)  # one withheld proposal of a copy this long came true
    plan = graded.plan(4, model=False, ngram_avail=4, ngram_order=8)
    assert plan.method == "ngram" and plan.k >= 1, plan


def test_a_first_answer_times_a_batch_before_a_model_probe_could_read_the_prompt_into_the_draft() -> None:
    """Cold (no remembered curve), the curve's growth is the prior's until batches are timed. On a 2-core CPU's
    curve (T(2) 1.85x T(1), measured for Qwen2.5-Coder 1.5B) with a loaded draft model a fifth of the target's cost
    per token, a probe on the prior would read the prompt into the draft (0.4 s of a 3.3 s answer there) where no
    model draft can pay. A one-token batch or two are timed first; then the model is never touched."""
    steep = lambda n: 0.033 * (1 + 0.85 * (n - 1))  # noqa: E731
    clock = FakeClock()
    target, drafter = _auto(clock, steep, lambda n: 0.2 * 0.033 * n, lambda pos: True)
    rounds, done = _run(target, drafter, clock, 96)
    timed = [r for r in rounds if r.source == "check"]
    assert 1 <= len(timed) <= 3 and all("T(2) timed" in r.note for r in timed)
    assert not any(r.source == "model" for r in rounds)
    assert drafter.model.backend.forward_calls == []  # type: ignore[union-attr]
    # What the timings cost: their batches' extra time over plain rounds (the probe and its model drafts cost
    # 8% of plain decoding here before).
    assert done.stats.decode_s <= 95 * steep(1) + len(timed) * (steep(2) - steep(1)) + 1e-9
