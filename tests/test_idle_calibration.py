"""auto's cost curve timed where nobody waits: `serve` between requests (on the scheduler's thread, which owns
the model), in pieces that yield to a request at once. The scheduler and pipeline are the real ones; the
target is a fake whose forward passes can be held, so a request provably arrives in the middle of a piece."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeBackend, LogitsFn, scripted_tokens

from localspec.decoding.auto import AutoDrafter, auto_lookup, idle_work
from localspec.decoding.engine import GenerationConfig
from localspec.options import ModelOptions
from localspec.pipeline import DraftSlot, Pipeline
from localspec.sampling import SamplingParams
from localspec.server.metrics import Metrics
from localspec.server.requests import GenerationRequest
from localspec.server.scheduler import Job, Outcome, Scheduler

SCRIPT = list(range(40, 240))
PROMPT = SCRIPT[:21]


class HeldBackend(FakeBackend):
    """A fake target that logs each forward pass with the idle pieces run so far, and can hold one."""

    def __init__(self, fn: LogitsFn, pieces: Callable[[], int]) -> None:
        super().__init__(fn)
        self.pieces = pieces
        self.log: list[tuple[int, int]] = []  # (tokens in the pass, idle pieces done before it)
        self.hold_at = -1  # hold this forward pass (counted from 0) until released
        self.hold_at_pieces: int | None = None  # ... or the first pass once this many idle pieces are done
        self.entered = threading.Event()
        self.release = threading.Event()

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        done = self.pieces()
        self.log.append((len(tokens), done))
        if (len(self.log) - 1 == self.hold_at or done == self.hold_at_pieces) and not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(30)
        return super().forward(tokens, all_logits=all_logits)


def _pipeline(target: HeldBackend, options: ModelOptions | None = None) -> Pipeline:
    drafter = AutoDrafter(ngram=auto_lookup(), target=target)
    options = options or ModelOptions(target="/fake/target", draft_method="auto")
    return Pipeline(options, "fake", target, DraftSlot(), drafter)


def test_idle_work_is_only_for_auto_without_a_trusted_curve() -> None:
    from localspec.decoding.drafters import NoDrafter
    from localspec.decoding.policy import CostModel

    assert idle_work(NoDrafter()) is None
    assert idle_work(AutoDrafter(ngram=auto_lookup(), target=FakeBackend(scripted_tokens(SCRIPT)))) is not None
    remembered = CostModel(target={1: 0.03, 2: 0.04, 9: 0.09})
    target = FakeBackend(scripted_tokens(SCRIPT))
    assert idle_work(AutoDrafter(ngram=auto_lookup(), target=target, costs=remembered)) is None


def test_idle_time_loads_a_draft_model_that_may_pay_before_an_answer_wants_it() -> None:
    """Where nobody waits, a lazy draft model that a model draft may pay for is loaded (on a thread of its own:
    the idle loop goes on at once), so that no answer waits for it; where the costs say it cannot pay, never."""
    from localspec.decoding.drafters import LazyModelDrafter
    from localspec.decoding.policy import CostModel

    loaded_on: list[str] = []
    draft = FakeBackend(scripted_tokens(SCRIPT), name="draft")

    def load() -> FakeBackend:
        loaded_on.append(threading.current_thread().name)
        return draft

    flat = CostModel(target={1: 0.03, 2: 0.031, 9: 0.035, 33: 0.05}, draft_token=0.003)  # a draft that pays
    lazy = LazyModelDrafter(load, "draft")
    gpu = FakeBackend(scripted_tokens(SCRIPT), device="CUDA (fake)")  # a load beside takes no core from it
    drafter = AutoDrafter(ngram=auto_lookup(), model=lazy, target=gpu, costs=flat)
    step = idle_work(drafter)
    assert step is not None and step() is False  # a trusted curve: the load is all there is to do
    assert lazy.wait(10) and lazy.loaded and loaded_on == ["localspec-draft-load"]
    assert not draft.forward_calls  # nothing read into it yet: no text is known
    assert idle_work(drafter) is None
    steep = CostModel(target={1: 0.03, 2: 0.06, 9: 0.27, 33: 0.99}, draft_token=0.03)  # it cannot pay here
    never = LazyModelDrafter(load, "draft")
    assert idle_work(AutoDrafter(ngram=auto_lookup(), model=never, target=draft, costs=steep)) is None
    assert not never.loaded and len(loaded_on) == 1


def test_serve_times_the_curve_between_requests_and_a_request_waits_at_most_one_piece() -> None:
    schedulers: list[Scheduler] = []
    target = HeldBackend(scripted_tokens(SCRIPT), lambda: schedulers[0].idle_pieces if schedulers else -1)
    # Passes: the filler context, the warm-up piece (a warm-up pass and a timed one), the pair (1, 2), then
    # the pair (1, 3), whose second pass is held until the request is queued.
    target.hold_at = 6
    pipeline = _pipeline(target)
    logs: list[str] = []
    scheduler = Scheduler(pipeline, max_queue=4, metrics=Metrics(), log=logs.append)
    schedulers.append(scheduler)
    try:
        assert target.entered.wait(30)  # the idle thread is inside a piece now
        config = GenerationConfig(max_tokens=8, sampling=SamplingParams(temperature=0.0))
        request = GenerationRequest("completion", PROMPT, config, "auto", (), False, False)

        async def submit() -> Outcome:
            job = Job(request, asyncio.get_running_loop())
            scheduler.submit(job)
            target.release.set()
            while True:
                item = await job.next()
                if isinstance(item, Outcome):
                    return item
                assert isinstance(item, str)

        outcome = asyncio.run(submit())
        assert outcome.stats.n_generated == 8
        # The prompt pass came right after the held piece ended (three pieces done).
        prompt_pass = next(i for i, (n, _) in enumerate(target.log) if n == len(PROMPT))
        assert prompt_pass == target.hold_at + 1 and target.log[prompt_pass][1] == 3  # right after that piece
        # Nothing of the calibration ran inside the answer: the answer's passes all saw the same piece count.
        answer = [done for _, done in target.log[prompt_pass : prompt_pass + 1 + outcome.stats.n_rounds]]
        assert set(answer) == {3}
    finally:
        target.release.set()
        scheduler.close()
    drafter = pipeline.drafter
    assert isinstance(drafter, AutoDrafter)
    assert drafter.live.one and drafter.live.ratios  # the pieces fed the live curve
    assert target.cached_tokens[: len(PROMPT)] == PROMPT  # the timing passes rolled back what they added


@pytest.mark.asyncio
async def test_chat_times_the_curve_before_its_first_turn_and_between_turns_and_a_new_message_stops_it(
    tmp_path: Path,
) -> None:
    """Once the models load, before any message, auto's curve is timed (as between turns, while the user
    types); a message sent meanwhile waits out the piece in flight only, its reply has no timing pass inside
    it, and the timing goes on after the reply."""
    from fakes import scripted
    from textual.widgets import Input

    from localspec.options import GenerationSettings
    from localspec.tui.app import ChatApp

    reply = "Sure, here it is."
    app_ref: list[ChatApp] = []
    target = HeldBackend(scripted(reply), lambda: app_ref[0].chat.idle_pieces if app_ref else -1)
    target.hold_at_pieces = 2  # the first pass of the third piece is held

    def load(options: ModelOptions) -> Pipeline:
        return _pipeline(target, options)

    app = ChatApp(
        options=ModelOptions(target="/fake/target", draft_method="auto"),
        settings=GenerationSettings(max_tokens=40, seed=0),
        loader=load,
        save_dir=tmp_path,
    )
    app_ref.append(app)

    async def send(pilot, text: str) -> None:  # type: ignore[no-untyped-def]
        app.chat.query_one("#prompt", Input).focus()
        await pilot.press(*text, "enter")

    async def until(pilot, cond) -> None:  # type: ignore[no-untyped-def]
        for _ in range(1500):
            if cond():
                return
            await pilot.pause(0.02)
        raise AssertionError("timed out")

    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, target.entered.is_set)  # no message yet: a timing piece is in flight
        assert not app.chat.transcript.turns and app.chat.idle_pieces == 2
        held = len(target.log) - 1
        await send(pilot, "go")
        await pilot.pause(0.1)
        assert len(target.log) - 1 == held  # the reply waits for the piece in flight
        target.release.set()
        turns = app.chat.transcript.turns
        await until(pilot, lambda: len(turns) == 1 and turns[0].stats is not None)
        assert turns[0].reply == reply
        # The held pass opened a pair: its batch ends the piece, then the reply (prompt pass and rounds) runs
        # with no timing pass inside it.
        assert target.log[held][0] == 1 and target.log[held + 1][0] > 1 and target.log[held + 1][1] == 2
        stats = turns[0].stats
        assert stats is not None
        answer = {done for _, done in target.log[held + 2 : held + 3 + stats.n_rounds]}
        assert answer == {3}
        await until(pilot, lambda: app.chat.idle_pieces > 3)  # between turns, the timing goes on
        app.chat.stop_and_wait()


@pytest.mark.asyncio
async def test_chat_loads_the_draft_model_before_its_first_turn_where_nobody_waits(tmp_path: Path) -> None:
    """A draft model that may pay (the remembered costs say so) is loaded as soon as the models are, before any
    message and off the UI thread, not inside the first reply; on a CPU target that takes every core the load
    runs on the engine's own idle thread, so a reply can never decode beside it."""
    from fakes import scripted
    from textual.widgets import Input

    from localspec.decoding.drafters import LazyModelDrafter
    from localspec.decoding.policy import CostModel
    from localspec.options import GenerationSettings
    from localspec.tui.app import ChatApp

    reply = "Sure, here it is."
    target = FakeBackend(scripted(reply))
    loaded_on: list[str] = []

    def load_draft() -> FakeBackend:
        loaded_on.append(threading.current_thread().name)
        return FakeBackend(scripted(reply), name="draft")

    flat = CostModel(target={1: 0.03, 2: 0.031, 9: 0.035, 33: 0.05}, draft_token=0.003)  # a draft that pays
    lazy = LazyModelDrafter(load_draft, "draft")

    def load(options: ModelOptions) -> Pipeline:
        drafter = AutoDrafter(ngram=auto_lookup(), model=lazy, target=target, costs=flat)
        return Pipeline(options, "fake", target, DraftSlot(), drafter)

    app = ChatApp(
        options=ModelOptions(target="/fake/target", draft_method="auto"),
        settings=GenerationSettings(max_tokens=40, seed=0),
        loader=load,
        save_dir=tmp_path,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(1500):
            if lazy.loaded and app.chat.idle.is_set():
                break
            await pilot.pause(0.02)
        assert lazy.loaded and not app.chat.transcript.turns  # before the first message
        assert loaded_on == [lazy.loaded_by] and loaded_on[0] != threading.main_thread().name
        assert loaded_on[0] != "localspec-draft-load"  # not beside: on the idle worker itself
        app.chat.query_one("#prompt", Input).focus()
        await pilot.press(*"go", "enter")
        turns = app.chat.transcript.turns
        for _ in range(1500):
            if len(turns) == 1 and turns[0].stats is not None:
                break
            await pilot.pause(0.02)
        stats = turns[0].stats
        assert turns[0].reply == reply and stats is not None
        assert any(s.source == "model" and s.drafted > 0 for s in stats.sources)  # it drafted with it
        assert len(loaded_on) == 1
        app.chat.stop_and_wait()


def test_timings_too_spread_to_remember_still_give_this_run_its_curve_and_say_why() -> None:
    """A busy machine's timing passes are not stored (a later run would trust them), but they are what this run
    measured: serve --parallel takes them as its decoder's prior, and the log says they were not remembered."""
    from localspec.decoding.auto import idle_curve
    from localspec.decoding.drafters import NoDrafter

    drafter = AutoDrafter(ngram=auto_lookup(), target=FakeBackend(scripted_tokens(SCRIPT)))
    live = drafter.learner.live
    assert idle_curve(drafter) == ({}, "too few 1-token timings")
    for t1, t4, t8 in [(0.01, 0.02, 0.03), (0.03, 0.02, 0.09), (0.01, 0.06, 0.03), (0.05, 0.02, 0.04)]:
        live.add_plain(100, t1)
        live.add_batch(100, 4, t4, paired=t1)
        live.add_plain(100, t1)
        live.add_batch(100, 8, t8, paired=t1)
    curve, why = idle_curve(drafter)
    assert sorted(curve) == [1, 4, 8] and all(s > 0 for s in curve.values())
    assert "too busy" in why
    assert idle_curve(NoDrafter()) == ({}, "")
