"""Auto's cost curve against busy spells and stale files: calibration in pairs that a busy spell cannot
poison (or that says it was too busy, and stores nothing), and a remembered curve that live rounds test
and replace when they contradict it. Fake backends on a fake clock: every timing is exact."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fakes import CostedBackend, FakeClock, scripted_draft, scripted_tokens
from test_adaptive import GREEDY, _run

from localspec.decoding.auto import AutoDrafter, auto_lookup
from localspec.decoding.calibrate import time_target_paired
from localspec.decoding.cost_cache import CONTRADICTION, CostStore, CurveCheck
from localspec.decoding.drafters import LazyModelDrafter, ModelDrafter, NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.policy import CostModel
from localspec.decoding.stats import RoundStats
from localspec.sampling import SamplingParams

REPEATS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 12  # text that repeats: suffix drafts pay


def true_cost(n: int) -> float:
    """The machine when quiet: T(1) as in the user's report, a CPU-like slope."""
    return 0.042 * (1 + 0.15 * (n - 1))


def _store(tmp_path: Path) -> CostStore:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    return CostStore.for_models(target=str(model), draft=None, backend="llama", device="CPU (2 threads)", threads=2)


def _saved_ratios(store: CostStore) -> dict[int, float] | None:
    """The stored curve as T(n) / T(1) (None: nothing stored)."""
    if not store.path.exists():
        return None
    target = {int(n): t for n, t in json.loads(store.path.read_text())["target_s"].items()}
    return {n: t / target[1] for n, t in target.items()}


def _true_ratios(sizes: list[int]) -> dict[int, float]:
    return {n: true_cost(n) / true_cost(1) for n in sizes}


def _generate(
    target: CostedBackend, drafter: AutoDrafter, clock: FakeClock, prompt: list[int], n: int, k: int
) -> tuple[list[RoundStats], Done]:
    return _run(target, drafter, clock, n, prompt, k)  # type: ignore[no-any-return]


Spell = Callable[[int, float], float]  # (pass index, clock) -> slowdown of that pass


def _spell_in_time(start: float, end: float, factor: float) -> Spell:
    return lambda i, now: factor if start <= now < end else 1.0


def _every(nth: int, factor: float, until: int) -> Spell:
    return lambda i, now: factor if i % nth == 0 and i <= until else 1.0


SPELLS = {
    # The user's case: T(1) timed quiet, then everything after it in a long busy spell.
    "from the first batch on": _spell_in_time(0.25, 30.0, 16.0),
    "the first second": _spell_in_time(0.0, 1.0, 16.0),
    "half way through": _spell_in_time(2.5, 100.0, 16.0),
    "a short burst": _spell_in_time(1.0, 1.4, 16.0),
    "a slower pace throughout": _spell_in_time(0.0, 100.0, 3.0),
    "every seventh pass preempted": _every(7, 16.0, until=62),  # the calibration's passes
}


@pytest.mark.parametrize("spell", SPELLS.values(), ids=SPELLS.keys())
def test_a_busy_spell_while_calibrating_stores_no_curve_or_a_right_one(tmp_path: Path, spell: Spell) -> None:
    store = _store(tmp_path)
    clock = FakeClock()
    target = CostedBackend(scripted_tokens(REPEATS), clock, lambda n: 0.0, name="target")
    target.cost = lambda n: true_cost(n) * spell(len(target.forward_calls), clock.now)  # type: ignore[method-assign]
    drafter = AutoDrafter(ngram=auto_lookup(), target=target, clock=clock, store=store)
    target.forward(REPEATS[:20])  # a served conversation's cache: calibrated on it where nobody waits
    pieces = 0
    while drafter.idle_step():
        pieces += 1
    assert list(target.cached_tokens) == REPEATS[:20]
    assert pieces == 1 + 3 * 10  # the warm-up, three pairs for each of ten batch sizes (2 .. 33)
    rounds, done = _generate(target, drafter, clock, REPEATS[:20], 40, 32)
    drafter.close()
    assert list(done.tokens) == REPEATS[20:60]
    saved = _saved_ratios(store)
    if saved is None:
        assert any("costs not stored: machine too busy to measure" in r.note for r in rounds)
        assert drafter.live.storable().startswith("machine too busy")
    else:
        assert {1, 2, 16, 33} <= set(saved)
        assert saved == pytest.approx(_true_ratios(sorted(saved)), rel=0.1)


def test_paired_timings_tell_a_busy_machine_from_a_slow_one() -> None:
    clock = FakeClock()
    target = CostedBackend(scripted_tokens(REPEATS), clock, lambda n: 3 * true_cost(n))
    target.forward(REPEATS[:20])
    steady = time_target_paired(target, [1, 2, 4, 8], reps=3, clock=clock)
    assert not steady.busy and steady.curve() == pytest.approx({n: 3 * true_cost(n) for n in (1, 2, 4, 8)})
    preempted = iter(np.random.default_rng(0).random(100) < 0.3)  # a third of the passes, at random
    target.cost = lambda n: true_cost(n) * (16.0 if next(preempted) else 1.0)  # type: ignore[method-assign]
    assert time_target_paired(target, [1, 2, 4, 8], reps=3, clock=clock).busy
    assert list(target.cached_tokens) == REPEATS[:20]


# -- a remembered curve is a hypothesis --------------------------------------------------------------------

STEEP = {1: 0.042, 2: 0.69, 4: 0.75, 8: 0.85, 16: 1.05, 24: 1.3, 33: 1.55}  # T(2..32) timed in a busy spell


def test_a_remembered_curve_sixteen_times_too_steep_is_caught_in_a_plain_answer_and_replaced(tmp_path: Path) -> None:
    """Plain rounds never time a batch: a check round (one token drafted: the lookup's next one, which holds
    here) does, now and then; the curve is dropped and measured afresh, and suffix drafts take over."""
    store = _store(tmp_path)
    store.save(CostModel(target=dict(STEEP)))
    clock = FakeClock()
    target = CostedBackend(scripted_tokens(REPEATS), clock, true_cost, name="target")
    drafter = AutoDrafter(ngram=auto_lookup(), target=target, clock=clock, store=store)
    rounds, done = _generate(target, drafter, clock, REPEATS[:20], 96, 32)
    assert list(done.tokens) == REPEATS[20:116]
    said = [i for i, r in enumerate(rounds) if "contradicted by live rounds" in r.note]
    assert len(said) == 1 and said[0] <= 8
    checks = [r for r in rounds[: said[0]] if r.source == "check"]
    assert checks and all(r.n_accepted == 1 for r in checks)  # the lookup's token: the checks paid for themselves
    assert sum(r.source != "none" and r.n_drafted > 0 for r in rounds[said[0] :]) >= 3  # suffix drafts now
    drafter.close()  # the curve as the answer's rounds refined it, once it has enough timings
    closed = _saved_ratios(store)
    assert closed is None or closed == pytest.approx(_true_ratios(sorted(closed)), rel=0.1)


INVERTED = {1: 0.516, 2: 0.302, 3: 0.33, 5: 0.4, 9: 0.55}  # T(1) > T(2): plain decoding looks slow


def test_a_remembered_curve_with_t1_above_t2_is_caught_in_a_drafting_answer_and_replaced(tmp_path: Path) -> None:
    """Model drafts win on that curve in every round, so no round is a 1-token pass: a check round (a
    plain one) is, now and then; the curve is dropped and measured afresh, and plain decoding (which wins
    here: the draft rarely matches) takes over."""

    def cost(n: int) -> float:
        return 0.3 * (1 + 0.1 * (n - 1))

    store = _store(tmp_path)
    store.save(CostModel(target=dict(INVERTED), draft_token=0.03))
    clock = FakeClock()
    fn = scripted_tokens(list(range(100, 400)))
    target = CostedBackend(fn, clock, cost, name="target")
    draft = CostedBackend(scripted_draft(fn, lambda pos: pos % 5 == 0), clock, lambda n: 0.03, name="draft")
    drafter = AutoDrafter(model=ModelDrafter(draft), target=target, clock=clock, store=store)
    rounds, done = _generate(target, drafter, clock, list(range(100, 120)), 96, 8)
    assert list(done.tokens) == list(range(120, 216))
    saved = _saved_ratios(store)
    assert saved is not None and saved == pytest.approx({n: cost(n) / cost(1) for n in saved}, rel=0.02)
    said = [i for i, r in enumerate(rounds) if "contradicted by live rounds" in r.note]
    assert len(said) == 1
    late = rounds[said[0] + 1 :]
    assert len(late) >= 20 and sum(r.n_drafted == 0 for r in late) >= 0.8 * len(late)


def test_a_right_remembered_curve_survives_its_checks_and_they_cost_little(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(CostModel(target={n: true_cost(n) for n in (1, 2, 4, 8, 16, 33)}))
    before = store.path.read_text()
    clock = FakeClock()
    unique = list(range(250, 10, -1))  # nothing repeats: plain decoding throughout
    target = CostedBackend(scripted_tokens(unique), clock, true_cost, name="target")
    drafter = AutoDrafter(ngram=auto_lookup(), target=target, clock=clock, store=store)
    rounds, done = _generate(target, drafter, clock, unique[:20], 200, 32)
    assert list(done.tokens) == unique[20:220]
    assert not any("contradicted" in r.note for r in rounds)
    checks = [r for r in rounds if "check" in r.note]
    assert 1 <= len(checks) <= 12  # they back off while the curve holds
    assert max(target.forward_calls[1:]) <= 2  # no re-measurement
    assert done.stats.decode_s <= 1.03 * 199 * true_cost(1)  # within the EXPLORE allowance
    assert store.path.read_text() == before  # neither dropped nor measured again


def test_a_curve_check_needs_pairs_and_a_median_beyond_the_factor() -> None:
    check = CurveCheck({1: 1.0, 2: 1.2, 9: 2.0})
    for seconds in (1.0, 1.2, 1.0, 1.2):  # plain, batch of 2, ...: as the curve says
        check.observe(1 if seconds == 1.0 else 2, seconds)
    assert check.deviation == pytest.approx(1.0) and not check.contradicted
    check.observe(9, 2.0 * CONTRADICTION * 1.1)  # one pair far off (a preempted pass): the median holds
    assert not check.contradicted
    check.observe(1, 1.0)
    check.observe(9, 2.0 * CONTRADICTION * 1.1)
    assert check.contradicted
    check.new_generation()
    assert check.observe(9, 2.0) is None  # no pair across answers


# -- the first answer on a machine: no stall, and a draft model that pays is tried ---------------------------


def _run_loading(
    target: CostedBackend, drafter: AutoDrafter, clock: FakeClock, prompt: list[int], n: int, k: int
) -> tuple[list[RoundStats], Done]:
    """A generation that, between rounds, waits for a draft model loading in the background: the round after
    the one that started the load has it (deterministic; a real answer goes on without waiting)."""
    from localspec.decoding.drafters import LazyModelDrafter

    rounds: list[RoundStats] = []
    done = None
    for ev in generate(
        target, drafter, prompt, GenerationConfig(max_tokens=n, num_draft=k, sampling=GREEDY), clock=clock
    ):
        if isinstance(ev, Done):
            done = ev
        elif ev.round is not None:
            rounds.append(ev.round)
        if isinstance(drafter.model, LazyModelDrafter):
            assert drafter.model.wait(30)
    assert done is not None
    return rounds, done


def test_a_first_answer_on_a_gpu_like_machine_tries_the_draft_model_without_a_calibration_stall(tmp_path: Path) -> None:
    """No remembered costs, a flat (GPU-like) curve, a cheap draft that agrees: the answer times T(1) in its
    first round, starts loading the draft model in the background in its second (which decodes on without
    it), probes it with a short draft in its third, and drafts long from then on. The target ran nothing but
    the prompt and one verify pass per round (no filler passes)."""
    from localspec.decoding.drafters import LazyModelDrafter

    def flat(n: int) -> float:
        return 0.020 + 0.0002 * (n - 1)

    import threading

    answer_thread = threading.current_thread()
    store = _store(tmp_path)
    clock = FakeClock()
    fn = scripted_tokens(list(range(10, 250)))
    target = CostedBackend(fn, clock, flat, name="target", device="CUDA (fake)")
    # The background read of the prompt costs the answer's clock nothing (it runs beside the rounds).
    draft_cost = lambda n: 0.002 if threading.current_thread() is answer_thread else 0.0  # noqa: E731
    draft = CostedBackend(scripted_draft(fn, lambda pos: True), clock, draft_cost, name="draft")
    drafter = AutoDrafter(
        ngram=auto_lookup(), model=LazyModelDrafter(lambda: draft, "draft"), target=target, clock=clock, store=store
    )
    rounds, done = _run_loading(target, drafter, clock, list(range(10, 30)), 150, 8)
    assert list(done.tokens) == list(range(30, 180))
    assert target.forward_calls == [20] + [r.n_drafted + 1 for r in rounds]  # verify passes only
    assert rounds[0].n_drafted == 0 and rounds[1].n_drafted == 0
    first = next(i for i, r in enumerate(rounds) if r.source == "model")  # T(2) timed first: the curve is flat
    assert 2 < first <= 5 and all(r.source == "check" for r in rounds[2:first])
    assert sum(r.source == "model" and r.n_drafted >= 6 for r in rounds) >= len(rounds) // 2
    assert done.stats.decode_s < 0.5 * 149 * flat(1)  # faster than plain decoding in the very first answer
    assert drafter.controller.costs.target_s(9) == pytest.approx(flat(9))  # learnt from the rounds
    drafter.close()
    saved = _saved_ratios(store)  # remembered once consistent (enough 1-token timings to judge them)
    if drafter.live.storable():
        assert saved is None and drafter.live.storable() == "too few 1-token timings"
    else:
        assert saved is not None and saved == pytest.approx({n: flat(n) / flat(1) for n in saved}, rel=0.01)


def test_the_first_answer_goes_on_while_the_draft_model_loads_and_reads_the_prompt(tmp_path: Path) -> None:
    """A draft model slow to load (here: until the test lets it) costs the first answer no stall: it loads, and
    reads the text so far, on a thread of its own while the target decodes, and the rounds after that use it."""
    import threading

    from localspec.decoding.drafters import LazyModelDrafter

    def flat(n: int) -> float:
        return 0.020 + 0.0002 * (n - 1)

    answer_thread = threading.current_thread()
    release = threading.Event()
    loaded_on: list[threading.Thread] = []
    reads: list[tuple[threading.Thread, int]] = []  # the draft's forward passes: (thread, tokens)

    def draft_cost(n: int) -> float:
        reads.append((threading.current_thread(), n))
        return 0.002 if threading.current_thread() is answer_thread else 0.0  # off the answer's clock

    clock = FakeClock()
    fn = scripted_tokens(list(range(10, 250)))
    target = CostedBackend(fn, clock, flat, name="target", device="CUDA (fake)")  # loads beside: no core taken
    draft = CostedBackend(scripted_draft(fn, lambda pos: True), clock, draft_cost, name="draft")

    def slow_load() -> CostedBackend:
        loaded_on.append(threading.current_thread())
        release.wait(10)  # a load that takes as long as the test wants (10 s at most, should it fail first)
        return draft

    lazy = LazyModelDrafter(slow_load, "draft")
    drafter = AutoDrafter(ngram=auto_lookup(), model=lazy, target=target, clock=clock, store=_store(tmp_path))
    prompt = list(range(10, 30))
    events = generate(
        target, drafter, prompt, GenerationConfig(max_tokens=150, num_draft=8, sampling=GREEDY), clock=clock
    )
    rounds = []
    for ev in events:
        if isinstance(ev, Done):
            break
        if ev.round is not None:
            rounds.append(ev.round)
        if len(rounds) == 40:
            break
    assert len(loaded_on) == 1 and loaded_on[0] is not answer_thread  # the load began beside the answer
    assert lazy.loading and not reads  # forty rounds decoded while it was still loading
    assert all(r.n_drafted == 0 or r.source != "model" for r in rounds)
    release.set()
    assert lazy.wait(30) and lazy.loaded_by == loaded_on[0].name
    assert reads[0][0] is not answer_thread and reads[0][1] >= len(prompt)  # it read the prompt there too
    rest = []
    for ev in events:  # waiting between rounds from here on, for the text it missed meanwhile (read beside too)
        rest.append(ev)
        assert lazy.wait(30)
    *rest, done = rest
    assert isinstance(done, Done) and list(done.tokens) == list(range(30, 180))
    assert all(thread is not answer_thread for thread, _ in reads[:2])
    later = [e.round for e in rest if e.round is not None]
    assert sum(r.source == "model" and r.n_accepted > 0 for r in later) >= 3  # then it drafts
    drafter.close()


def test_where_the_target_takes_every_core_no_answer_loads_or_reads_the_draft_model_beside_it(tmp_path: Path) -> None:
    """A CPU target on every core (the fake's "CPU"; llama.cpp's default threads): a draft model's load or read
    on another thread would take a core from the target's decode. So the first answer neither loads it nor
    reads into it, and starts no thread (counted); idle time (serve, chat) loads it on its own thread and reads
    the text the target holds into it; the next answer drafts with it and reads only its new tokens, inline."""
    import threading

    from localspec.decoding.auto import idle_work
    from localspec.decoding.drafters import LazyModelDrafter

    def flat(n: int) -> float:
        return 0.020 + 0.0002 * (n - 1)

    clock = FakeClock()
    fn = scripted_tokens(list(range(10, 250)))
    target = CostedBackend(fn, clock, flat, name="target")
    draft = CostedBackend(scripted_draft(fn, lambda pos: True), clock, lambda n: 0.002, name="draft")
    loaded_on: list[str] = []

    def load() -> CostedBackend:
        loaded_on.append(threading.current_thread().name)
        return draft

    lazy = LazyModelDrafter(load, "draft")
    drafter = AutoDrafter(ngram=auto_lookup(), model=lazy, target=target, clock=clock, store=_store(tmp_path))
    config = GenerationConfig(max_tokens=100, num_draft=8, sampling=GREEDY)
    threads = [threading.active_count() for _ in generate(target, drafter, list(range(10, 30)), config, clock=clock)]
    assert not loaded_on and not lazy.loaded and not draft.forward_calls  # the same setting loads beside elsewhere
    assert max(threads) == threads[0]
    step = idle_work(drafter)
    assert step is not None
    while step():
        pass
    here = threading.current_thread().name
    assert loaded_on == [here] and lazy.loaded_by == here  # loaded on the idle thread, which waits for it
    assert lazy.lag(target.cached_tokens) == 0 and len(draft.forward_calls) == 1  # the text so far, in one read
    assert idle_work(drafter) is None or not drafter._feed_due()
    read = sum(draft.forward_calls)
    events = list(generate(target, drafter, list(range(10, 140)), config, clock=clock))
    done = events[-1]
    assert isinstance(done, Done) and list(done.tokens) == list(range(140, 240))
    assert any(s.source == "model" and s.accepted > 0 for s in done.stats.sources)  # it drafts with it
    first_read = draft.forward_calls[1]  # catching up: the tokens of the 130 it had not read yet, in one batch
    assert read >= 110 and first_read <= 16
    drafter.close()


def test_a_draft_model_the_prior_rules_out_is_never_loaded_for_an_answer() -> None:
    """Before anything is measured, a draft token is priced at the draft's weights over the target's (files it
    knows before it loads): on a CPU-like curve a draft nearly as big as the target could not pay even with
    every token accepted, so no answer loads it; a small one is tried."""
    from dataclasses import replace

    from localspec.decoding.drafters import LazyModelDrafter

    loads: list[int] = []
    for size, tried in ((950_000, False), (100_000, True)):
        clock = FakeClock()
        fn = scripted_tokens(list(range(10, 250)))
        target = CostedBackend(fn, clock, true_cost, name="target", device="CUDA (fake)")  # an answer may load it
        target._info = replace(target.info, size_bytes=1_000_000)
        draft = CostedBackend(scripted_draft(fn, lambda pos: True), clock, lambda n: 0.0, name="draft")
        lazy = LazyModelDrafter(lambda d=draft: loads.append(size) or d, "draft", size_bytes=size)  # type: ignore[misc]
        drafter = AutoDrafter(ngram=auto_lookup(), model=lazy, target=target, clock=clock)
        _run_loading(target, drafter, clock, list(range(10, 30)), 60, 8)
        assert (size in loads) == tried
        drafter.close()


# -- long prompts: costs at the context length the answer runs at ---------------------------------------------


def test_the_live_curve_keeps_t1_per_context_length_and_its_shape_apart_from_it() -> None:
    from localspec.decoding.live_costs import LiveCurve, context_bucket

    assert [context_bucket(n) for n in (10, 1024, 1025, 2048, 5000, 8192, 30000)] == [0, 0, 1, 1, 3, 3, 5]
    live = LiveCurve()
    for _ in range(4):
        live.add_plain(500, 0.010)
    live.add_batch(500, 5, 0.016)
    live.add_batch(8000, 5, 0.050)  # no T(1) at 8k yet: a ratio to the short T(1) would say 5x, not 1.6x
    assert dict(live.ratios) == {5: pytest.approx([1.6])}
    assert live.curve(8000, 9)[1] == pytest.approx(0.010)  # until timed there, the nearest length's
    assert live.curve(500, 5)[5] == pytest.approx(0.010 * (1 + 0.15 * 4))  # one timing: the prior's line still
    live.add_batch(500, 5, 0.090, paired=0.055)  # a busy spell: slow, but in a pair with a slowed T(1)
    live.add_batch(500, 5, 0.016)
    live.add_plain(8000, 0.026)
    curve = live.curve(8000, 9)
    assert curve[1] == pytest.approx(0.026) and curve[5] == pytest.approx(0.026 * 1.6, rel=0.02)
    assert live.curve(500, 9)[5] == pytest.approx(0.016, rel=0.02)


def test_a_new_text_answer_that_timed_one_batch_size_in_pairs_leaves_a_curve_for_the_next_process() -> None:
    """Prose times T(2) a couple of times (1-token lookup drafts on the prior) and nothing longer: that is enough
    to store, so the next answer starts from T(1) and T(2) instead of learning afresh on the prior again."""
    from localspec.decoding.live_costs import MIN_JUDGED, LiveCurve

    live = LiveCurve()
    for i in range(MIN_JUDGED + 3):
        live.add_plain(300, 0.033 + 0.0002 * (i % 3))
    assert live.storable() == "too few batch sizes timed"
    live.add_batch(300, 2, 0.057, paired=0.033)
    assert live.storable() == "too few batch sizes timed"  # one timing of it: a preempted pass could be all it has
    live.add_batch(300, 2, 0.058, paired=0.0332)
    assert live.storable() == ""
    assert live.stored_curve() == pytest.approx({1: 0.0332, 2: 0.0332 * (0.057 / 0.033 + 0.058 / 0.0332) / 2})


def test_a_remembered_curve_follows_a_long_prompt_from_its_first_round_and_back() -> None:
    """A curve measured on a short context, then an agent's 8k-token prompt where every pass costs 2.6x:
    the first round at that length sets the pace (not twenty rounds of a slow average), and a short
    prompt afterwards gets the short pace back at once."""

    def cost_at(target: CostedBackend) -> Callable[[int], float]:
        return lambda n: (0.010 + 2e-6 * len(target.cached_tokens)) * (1 + 0.15 * (n - 1))

    script = [10 + (i * 7) % 240 for i in range(9000)]  # nothing repeats within a short span: plain rounds
    clock = FakeClock()
    target = CostedBackend(scripted_tokens(script), clock, lambda n: 0.0, name="target", n_ctx=16384)
    target.cost = cost_at(target)  # type: ignore[method-assign]
    short = {n: 0.0104 * (1 + 0.15 * (n - 1)) for n in (1, 2, 4, 8, 16, 33)}  # measured at ~200 tokens
    drafter = AutoDrafter(ngram=auto_lookup(), target=target, clock=clock, costs=CostModel(target=dict(short)))
    _generate(target, drafter, clock, script[:200], 4, 32)  # a short answer first
    assert drafter.controller.costs.target_s(1) == pytest.approx(0.0104, rel=0.01)
    target.rollback(0)
    _generate(target, drafter, clock, script[:8000], 4, 32)
    long_t1 = 0.010 + 2e-6 * 8001
    assert drafter.controller.costs.target_s(1) == pytest.approx(long_t1, rel=0.02)
    target.rollback(0)
    _generate(target, drafter, clock, script[:200], 1, 32)  # one token: the prompt pass only, no round
    drafter.propose(script[:201], 32, SamplingParams(), np.random.default_rng(0))
    assert drafter.controller.costs.target_s(1) == pytest.approx(0.0104, rel=0.02)  # the short pace again


def test_a_busy_spell_over_the_first_drafts_does_not_leave_a_first_answer_plain(tmp_path: Path) -> None:
    """Seen on a shared machine: T(1) timed quiet, then the first lookup drafts ran 15x slow; the curve said a
    batch costs 15 passes, plain decoding won, and with no batch timed again the answer stayed plain. One
    spell's timings stand for nothing on their own (the prior's slopes pool with them), and short lookup
    probes after plain rounds time batches in pairs (paid from EXPLORE): drafting comes back."""
    clock = FakeClock()
    target = CostedBackend(scripted_tokens(REPEATS * 3), clock, lambda n: 0.0, name="target")
    passes: list[int] = []

    def cost(n: int) -> float:
        passes.append(n)
        return true_cost(n) * (15.0 if 3 <= len(passes) <= 5 else 1.0)  # the prompt pass, one quiet T(1), a spell

    target.cost = cost  # type: ignore[method-assign]
    drafter = AutoDrafter(ngram=auto_lookup(), target=target, clock=clock, store=_store(tmp_path))
    rounds, done = _generate(target, drafter, clock, REPEATS[:20], 300, 32)
    assert list(done.tokens) == (REPEATS * 3)[20:320]
    assert sum(r.n_drafted > 0 for r in rounds[:6]) >= 2  # the drafts the spell slowed
    late = rounds[len(rounds) // 2 :]
    assert sum(r.n_drafted >= 8 for r in late) >= len(late) // 2  # long suffix drafts again
    assert done.stats.decode_s < 0.5 * 299 * true_cost(1)


def test_auto_forecasts_its_lookup_copy_for_the_parallel_policy() -> None:
    """serve --parallel asks each auto sequence what its next lookup draft is worth: one acceptance per token
    the suffix match would copy (auto's learnt acceptance by match length, longer matches surer), none without
    a match."""
    drafter = AutoDrafter(ngram=auto_lookup())
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    drafter.prepare([*text, *text[:4]], 8)
    copy = drafter.forecast([*text, *text[:4]], 8)
    assert copy is not None and 1 <= len(copy) <= 8 and all(0.0 < a < 1.0 for a in copy)
    assert drafter.forecast([*text, *text[:4]], 0) is None
    assert drafter.forecast([1, 2, 3, 4], 8) is None  # nothing to copy


def test_a_forecast_lookup_is_the_rounds_draft_made_once() -> None:
    """The round after a forecast drafts from the same lookup (a lookup moves the suffix drafter's anchor, so a
    second one for the same context could differ)."""
    from localspec.sampling import SamplingParams

    ngram = auto_lookup()
    calls: list[int] = []
    lookup = ngram.lookup
    ngram.lookup = lambda context, k: calls.append(k) or lookup(context, k)  # type: ignore[method-assign]
    drafter = AutoDrafter(ngram=ngram)
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    context = [*text, *text[:4]]
    drafter.prepare(context, 8)
    copy = drafter.forecast(context, 8)
    assert copy is not None and calls == [8]
    drafter.propose(context, 2, SamplingParams(temperature=0.0), np.random.default_rng(0))
    assert calls == [8]  # no second lookup for this context
    drafter.propose([*context, 9], 2, SamplingParams(temperature=0.0), np.random.default_rng(0))
    assert len(calls) == 2  # another context: a lookup of its own


# -- a plain round under auto: the host work of a plain round of `none`, and no more than a constant besides ------


class _WatchedDraft(CostedBackend):
    """A draft model that counts reads of its cache (each one what a lag check compares the whole text with)."""

    cache_reads = 0

    @property
    def cached_tokens(self) -> list[int]:
        self.cache_reads += 1
        return self._tokens


NEW_TEXT = [int(t) for t in np.random.default_rng(7).permutation(np.arange(300, 4400))]  # no token twice: no copy


def _plain_rounds(
    method: str,
    k: int,
    prompt: int,
    *,
    remembered: bool = True,
    tokens: int = 120,
    draft_token: float = 0.03,
    lazy: bool = False,
) -> tuple[list[int], list[int], _WatchedDraft]:
    """A greedy answer on new text, with auto over the lookup and a loaded draft model that the costs say does
    not pay (`remembered`; else no costs: auto learns them from the rounds, as a first run; `lazy`: a draft model
    not loaded yet, which on this CPU target no answer loads): the Python calls made from one round's event to the
    next (each a plain round), the target's passes, and the draft model."""
    import sys

    clock = FakeClock()
    vocab = {"n_vocab": 4400}
    target = CostedBackend(scripted_tokens(NEW_TEXT, **vocab), clock, true_cost, name="target", **vocab)
    draft = _WatchedDraft(scripted_tokens(NEW_TEXT[::-1], **vocab), clock, lambda n: draft_token, name="draft", **vocab)
    curve = {n: true_cost(n) for n in (1, 2, 4, 8, 16, 33)}
    costs = CostModel(target=curve, draft_token=draft_token) if remembered else None
    model = LazyModelDrafter(lambda: draft, "draft") if lazy else ModelDrafter(draft)
    drafter = (
        AutoDrafter(ngram=auto_lookup(target=target), model=model, target=target, clock=clock, costs=costs)
        if method == "auto"
        else NoDrafter()
    )
    calls = [0]

    def count(frame: object, event: str, arg: object) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    per_round: list[int] = []
    config = GenerationConfig(max_tokens=tokens, num_draft=k, sampling=GREEDY)
    sys.setprofile(count)
    try:
        for ev in generate(target, drafter, NEW_TEXT[:prompt], config, clock=clock):
            if not isinstance(ev, Done) and ev.round is not None:
                assert ev.round.n_drafted == 0 or not remembered  # new text: every round is plain (but probes)
                if ev.round.n_drafted == 0:
                    per_round.append(calls[0])
            calls[0] = 0
    finally:
        sys.setprofile(None)
    return per_round[2:], target.forward_calls, draft


def test_a_plain_round_under_auto_does_no_work_that_grows_and_touches_neither_draft_nor_more_logits() -> None:
    """Counted, not timed: auto's plain rounds run the target's passes of `none` (one token, one logits row
    each); the draft model is not touched (its cache compared with the text once an answer, not every round);
    and what auto adds to a round (the lookup, the plan, the bookkeeping) does not grow with the longest draft
    it may plan (k) or with the length of the text."""
    none, none_passes, _ = _plain_rounds("none", 0, 200)
    short, short_passes, draft = _plain_rounds("auto", 4, 200)
    assert short_passes == none_passes  # the same passes, the same rows read
    assert not draft.forward_calls and draft.cache_reads <= 1  # once for the answer, then counted
    wide, _, _ = _plain_rounds("auto", 32, 200)
    long, _, long_draft = _plain_rounds("auto", 32, 3000)
    assert long_draft.cache_reads <= 1
    base = np.median(short)
    assert np.median(wide) == base and np.median(long) == base  # no work per draft length or per text token
    assert base > np.median(none)  # (what it adds is counted: a lookup and a plan)


def test_a_plain_round_with_nothing_to_weigh_makes_no_plan() -> None:
    """New text, nothing to copy, and no model draft that could pay even with every token accepted (a draft as
    slow as the target, or a lazy draft model that no answer loads on this CPU target, learning or remembered
    costs): the round is plain without weighing any draft length. Counted: a round of `none` makes 117 Python
    calls; auto's made about 310 with a plan (350 while learning), and makes under 100 more than `none` now."""
    none, _, _ = _plain_rounds("none", 0, 200)
    base = np.median(none)
    slow, _, _ = _plain_rounds("auto", 32, 200, draft_token=0.06)
    lazy, _, draft = _plain_rounds("auto", 32, 200, lazy=True)
    learning, _, _ = _plain_rounds("auto", 32, 200, lazy=True, remembered=False)
    for auto in (slow, lazy, learning):
        assert base < np.median(auto) < base + 100
    assert not draft.forward_calls
