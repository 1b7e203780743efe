"""`localspec chat`: Pilot tests that drive the real app.

Real engine + real tiny model (SmolLM2-135M through llama.cpp) for the end-to-end paths: pick backend
and pair, chat, stats, stop, engine error. Fake backends only where a test must hold the engine still
(gated) or needs a failure or a flood that a real model cannot give on demand.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakes import (
    CostedBackend,
    FailingBackend,
    FakeBackend,
    FakeClock,
    GatedBackend,
    hashed_logits,
    noisy,
    scripted,
    without,
)
from textual.pilot import Pilot
from textual.widgets import Input, Markdown, OptionList, Select, Static

from localspec.commands import chat as chat_command
from localspec.decoding.drafters import ModelDrafter
from localspec.decoding.engine import Done, Step
from localspec.options import GenerationSettings, ModelOptions
from localspec.pipeline import Pipeline
from localspec.tui import models as tui_models
from localspec.tui.app import ChatApp
from localspec.tui.chat_screen import ChatScreen
from localspec.tui.live import fmt_acceptance, fmt_accepted_length, fmt_tps
from localspec.tui.models import BackendStatus
from localspec.tui.settings_screen import SettingsScreen
from localspec.tui.setup_screen import SetupScreen
from localspec.tui.widgets import ReplyMessage, StatsPanel

SIZE = (140, 44)
REPLY = "Sure. Here is **bold** text and `code`:\n\n```python\nprint('hi')\n```\n\nDone."


class TickClock:
    """Each reading is one tick later: tokens/s become a pure function of the engine's clock reads."""

    def __init__(self, step: float = 0.01) -> None:
        self.step = step
        self.n = 0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.n += 1
            return self.n * self.step


def fake_loader(
    target: FakeBackend, draft: FakeBackend | None = None, clock: Callable[[], float] | None = None
) -> Callable[[ModelOptions], Pipeline]:
    from localspec.decoding.drafters import NgramDrafter
    from localspec.pipeline import DraftSlot

    def load(options: ModelOptions) -> Pipeline:
        drafter = ModelDrafter(draft) if draft is not None else NgramDrafter()
        slot = DraftSlot.holding(draft)
        return Pipeline(options.with_method(drafter.method), "fake", target, slot, drafter, clock=clock or TickClock())

    return load


def fake_app(target: FakeBackend, draft: FakeBackend | None = None, *, tmp_path: Path, **settings: object) -> ChatApp:
    clock = TickClock()
    return ChatApp(
        options=ModelOptions(target="/fake/target", draft="/fake/draft", draft_method="model"),
        settings=GenerationSettings(**settings),  # type: ignore[arg-type]
        loader=fake_loader(target, draft, clock),
        clock=clock,
        save_dir=tmp_path,
    )


def text_of(widget: Static) -> str:
    return str(widget.render())


async def until(pilot: Pilot, cond: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    waited = 0.0
    while not cond():
        if waited > timeout:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await pilot.pause(0.02)
        waited += 0.02


async def settle(app: ChatApp, pilot: Pilot) -> None:
    """Wait for every worker, then for the UI to take in what they posted."""
    await app.workers.wait_for_complete()
    await pilot.pause()
    await until(pilot, lambda: not app.chat.generating and not app.loading, what="generation to end")
    await pilot.pause()


async def send(pilot: Pilot, text: str) -> None:
    pilot.app.chat.query_one("#prompt", Input).focus()
    await pilot.press(*text, "enter")


def assert_panel_holds(panel: StatsPanel, stats: object) -> None:
    assert panel.stats is stats and not panel.live
    assert fmt_tps(stats) in text_of(panel.query_one("#stat-tps", Static))  # type: ignore[arg-type]
    assert fmt_acceptance(stats) in text_of(panel.query_one("#stat-acceptance", Static))  # type: ignore[arg-type]
    assert fmt_accepted_length(stats) in text_of(panel.query_one("#stat-length", Static))  # type: ignore[arg-type]


class EngineReplies:
    """What the engine itself produced for each reply of a loaded app: its steps, and its Done or the
    exception that ended it. The on-screen text is compared with this, never with what the UI streamed."""

    def __init__(self, app: ChatApp) -> None:
        assert app.pipeline is not None
        self.replies: list[EngineReply] = []
        real = app.pipeline.generate

        def recording(*a: object, **kw: object) -> Iterator[Step | Done]:
            reply = EngineReply()
            self.replies.append(reply)
            try:
                for event in real(*a, **kw):  # type: ignore[arg-type]
                    if isinstance(event, Done):
                        reply.done = event
                    else:
                        reply.steps.append(event)
                    yield event
            except Exception as e:  # not GeneratorExit: the app closes the stream once it has Done
                reply.error = e
                raise

        app.pipeline.generate = recording  # type: ignore[method-assign]


@dataclass
class EngineReply:
    steps: list[Step] = field(default_factory=list)
    done: Done | None = None
    error: Exception | None = None

    @property
    def text(self) -> str:
        """The engine's final text: Done.text, or for a failed reply all it yielded before failing."""
        assert (self.done is None) != (self.error is None), "the reply has not ended"
        return self.done.text if self.done is not None else "".join(st.text for st in self.steps)


def hold_redraws(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the next redraw on, keep what the engine streams in the buffer (30 s between redraws): the end
    of a reply then finds text not drawn yet, which must still reach the screen."""
    from localspec.tui import stream

    monkeypatch.setattr(stream, "RENDER_MIN_INTERVAL", 30.0)
    monkeypatch.setattr(stream, "RENDER_MAX_INTERVAL", 30.0)


def on_screen(view: ReplyMessage) -> str:
    """The reply as displayed: the Markdown document's source (plain mode) or the coloured tokens' text."""
    if view.colour:
        return str(view.query_one(".reply-tokens", Static).render())
    return view.query_one(".reply-markdown", Markdown).source


# -- real model ------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_pick_backend_and_pair_then_chat_with_real_model(smollm2_path: Path, tmp_path: Path) -> None:
    clock = TickClock()
    app = ChatApp(
        settings=GenerationSettings(max_tokens=24),
        clock=clock,
        save_dir=tmp_path,
        load_defaults=ModelOptions("", threads=1),
    )
    async with app.run_test(size=SIZE) as pilot:
        setup = app.screen
        assert isinstance(setup, SetupScreen)
        backends = setup.query_one("#backends", OptionList)
        await until(pilot, lambda: backends.option_count == 2, what="backend probe")
        assert [backends.get_option_at_index(i).id for i in range(2)] == ["llama", "mlx"]
        assert not backends.get_option("llama").disabled  # this llama-cpp-python build runs here
        assert "build" in str(backends.get_option("llama").prompt)  # CPU / CUDA / Metal build, said

        await pilot.press("enter")  # keyboard: take the highlighted backend
        setup.query_one("#target", Input).value = str(smollm2_path)  # as pasted; typing is tested below
        setup.query_one("#draft", Input).value = str(smollm2_path)
        setup.query_one("#method", Select).value = "model"  # auto, the default, would decode plainly on a CPU
        await until(pilot, lambda: setup.check is not None and setup.check.ok, what="pair check")
        assert "compatible" in text_of(setup.query_one("#pair-status", Static))
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.pipeline is not None, what="models to load")
        await pilot.pause()
        assert app.screen is app.chat
        engine = EngineReplies(app)

        await send(pilot, "Say hi")
        await settle(app, pilot)
        turn = app.chat.transcript.turns[0]
        stats = turn.stats
        done = engine.replies[0].done
        assert done is not None and stats is done.stats and turn.error is None and done.text.strip()
        assert stats.n_generated <= 24 and stats.draft_method == "model"
        view = app.chat.query_one(ReplyMessage)
        assert on_screen(view) == view.text == turn.reply == done.text  # every chunk reached the screen
        # tokens/s from the injected clock: the engine read it a whole number of ticks apart
        ticks = stats.decode_s / clock.step
        assert abs(ticks - round(ticks)) < 1e-6
        assert stats.decode_tps == pytest.approx((stats.n_generated - 1) / (round(ticks) * clock.step))
        assert_panel_holds(app.chat.query_one(StatsPanel), stats)
        # The model drafting for itself at temperature 0 accepts every draft, except where batched and
        # one-token arithmetic part at a near-tie of the top two logits (as in test_llama_backend.py).
        assert stats.n_drafted > 0
        ties, position = {t.position for t in stats.near_ties}, 0
        for step in engine.replies[0].steps:
            r = step.round
            if r is not None and r.n_accepted < r.n_drafted:
                assert position + r.n_accepted in ties, (position, r, stats.near_ties)
            position += len(step.tokens)
        assert f"{stats.n_generated} tokens" in text_of(view.query_one(".reply-stats", Static))

        await send(pilot, "And now say bye")  # second turn: chat template, KV cache reused
        await settle(app, pilot)
        second = app.chat.transcript.turns[1]
        assert second.stats is not None and second.stats.n_prompt_cached > 0
        assert len(app.chat.query(ReplyMessage)) == 2
        assert_panel_holds(app.chat.query_one(StatsPanel), second.stats)


@pytest.mark.asyncio
async def test_stop_mid_generation_with_real_model(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = ModelOptions(target=str(smollm2_path), draft_method="ngram", threads=1)
    app = ChatApp(options=opts, settings=GenerationSettings(max_tokens=400), save_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None, what="models to load")
        engine = EngineReplies(app)
        # An answer that runs to the token limit (5 s on one thread here): counting to 300 ends by itself after
        # 121 tokens (2 s), which a busy machine finished before the escape was handled.
        await send(pilot, "Write a long story about a dragon who learns to cook. Make it at least 1000 words.")
        await until(pilot, lambda: bool(app.chat.turn and app.chat.turn.reply), what="first tokens")
        hold_redraws(monkeypatch)
        await pilot.pause(0.5)  # text streams on, most of it not drawn yet
        assert app.chat.generating
        await pilot.press("escape")
        await settle(app, pilot)
        turn = app.chat.transcript.turns[0]
        assert turn.stats is not None and turn.stats.stop_reason == "stopped"
        assert 0 < turn.stats.n_generated < 400
        done = engine.replies[0].done
        assert done is not None and done.text.strip() and done.stats is turn.stats
        view = app.chat.query_one(ReplyMessage)
        assert on_screen(view) == view.text == turn.reply == done.text  # all the engine wrote before the stop
        assert app.chat.query_one(ReplyMessage).has_class("-stopped")
        assert "stopped" in text_of(app.chat.query_one(ReplyMessage).query_one(".reply-stats", Static))
        assert app.chat.transcript.messages()[-1].role == "assistant"  # the partial reply stays in context
        assert "stopped" in text_of(app.chat.query_one("#status", Static))
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert "stopped" not in text_of(app.chat.query_one("#status", Static))  # a new chat starts clean


@pytest.mark.asyncio
async def test_esc_while_reading_a_long_prompt_stops_at_once(smollm2_path: Path, tmp_path: Path) -> None:
    """Esc must not wait for the prompt pass (seconds long here); the next reply then runs normally."""
    import time as _time

    opts = ModelOptions(target=str(smollm2_path), draft_method="none", threads=2, n_ctx=8192)
    app = ChatApp(options=opts, settings=GenerationSettings(max_tokens=8), save_dir=tmp_path)
    long_prompt = "Summarise: " + " ".join(f"item {i} is blue and round." for i in range(700))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None, what="models to load")
        app.chat.query_one("#prompt", Input).value = long_prompt
        app.chat.query_one("#prompt", Input).focus()
        await pilot.press("enter")
        await until(pilot, lambda: app.chat.live is not None, what="the prompt pass to start")
        await pilot.pause(0.2)
        t0 = _time.monotonic()
        await pilot.press("escape")
        await until(pilot, lambda: not app.chat.generating, timeout=60, what="the reply to stop")
        assert _time.monotonic() - t0 < 3.0  # the whole prompt pass takes several seconds on this CPU
        turn = app.chat.transcript.turns[0]
        assert turn.stats is not None and turn.stats.stop_reason == "stopped" and turn.stats.n_generated == 0
        await pilot.press("ctrl+n")  # a fresh chat: the next prompt is short
        await send(pilot, "Say hi.")
        await settle(app, pilot)
        second = app.chat.transcript.turns[0]
        assert second.stats is not None and second.stats.stop_reason in ("eog", "max_tokens") and second.reply


@pytest.mark.asyncio
async def test_engine_error_shows_in_app_and_chat_goes_on(smollm2_path: Path, tmp_path: Path) -> None:
    opts = ModelOptions(target=str(smollm2_path), draft_method="ngram", n_ctx=256, threads=1)
    app = ChatApp(options=opts, settings=GenerationSettings(max_tokens=8), save_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None, what="models to load")
        prompt = app.chat.query_one("#prompt", Input)
        prompt.value = "please repeat " * 150  # a paste longer than the 256-token context: the engine refuses
        prompt.focus()
        await pilot.press("enter")
        await settle(app, pilot)
        failed = app.chat.transcript.turns[0]
        assert failed.error is not None and "context holds 256" in failed.error
        assert app.chat.query_one(ReplyMessage).has_class("-error")
        assert "context holds 256" in text_of(app.chat.query_one("#status", Static))
        assert app.is_running

        await send(pilot, "Hi")  # the failed turn stays on screen but out of the model's context
        await settle(app, pilot)
        ok = app.chat.transcript.turns[1]
        assert ok.stats is not None and ok.error is None
        await pilot.press("ctrl+s")
        await pilot.pause()
        saved = app.last_saved
        assert saved is not None and saved.parent == tmp_path
        text = saved.read_text()
        assert "please repeat" in text and "context holds 256" in text and ok.reply in text


@pytest.mark.asyncio
async def test_picker_refuses_an_incompatible_pair(smollm2_path: Path, gemma_path: Path, tmp_path: Path) -> None:
    app = ChatApp(save_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        setup = app.screen
        assert isinstance(setup, SetupScreen)
        setup.query_one("#target", Input).value = str(smollm2_path)
        setup.query_one("#draft", Input).value = str(gemma_path)
        await until(pilot, lambda: setup.check is not None, what="pair check")
        assert not setup.check.ok  # type: ignore[union-attr]
        status = text_of(setup.query_one("#pair-status", Static))
        assert "✗" in status and "differ" in status  # the reason, from the vocabulary rule
        assert "draft method below" in status and "--draft-method" not in status  # the fix is on this screen
        await pilot.press("ctrl+s")
        await pilot.pause(0.5)
        await app.workers.wait_for_complete()
        assert app.pipeline is None and app.screen is setup


def test_probe_backends_lists_both_with_reasons() -> None:
    found = {b.name: b for b in tui_models.probe_backends()}
    assert set(found) == {"llama", "mlx"}
    assert found["llama"].usable and "build" in found["llama"].detail
    assert found["mlx"].detail  # usable or not, it says why


# -- fake engines: states a real model cannot be held in ---------------------------------------------------


@pytest.mark.asyncio
async def test_intermediate_states_with_a_gated_engine(tmp_path: Path) -> None:
    target = GatedBackend(scripted(REPLY))
    draft = FakeBackend(scripted(REPLY, wrong_every=3))
    app = fake_app(target, draft, tmp_path=tmp_path, k=4)
    async with app.run_test(size=SIZE) as pilot:
        try:
            await until(pilot, lambda: app.pipeline is not None)
            engine = EngineReplies(app)
            await send(pilot, "go")
            target.release(3)  # the prompt pass and two verify rounds
            await until(
                pilot,
                lambda: (
                    app.chat.live is not None and app.chat.live.stats is not None and app.chat.live.stats.n_rounds >= 2
                ),
            )
            await pilot.pause(0.2)
            chat = app.chat
            panel = chat.query_one(StatsPanel)
            assert chat.generating and panel.live
            assert "live" in text_of(panel.query_one("#stats-title", Static))
            view = chat.query_one(ReplyMessage)
            shown = "".join(st.text for st in engine.replies[0].steps)  # the engine is held: all it wrote so far
            assert shown and REPLY.startswith(shown) and len(shown) < len(REPLY)
            assert on_screen(view) == view.text == shown
            assert "Generating" in text_of(chat.query_one("#status", Static))
            # the UI stays responsive while the engine is busy: typing works
            await pilot.press("a", "b")
            assert chat.query_one("#prompt", Input).value == "ab"
            await pilot.press("enter")  # refused politely while a reply runs; the text stays
            assert chat.query_one("#prompt", Input).value == "ab"
            await pilot.press("escape")
            target.open_gate()
            await settle(app, pilot)
            turn = chat.transcript.turns[0]
            done = engine.replies[0].done
            assert turn.stats is not None and turn.stats.stop_reason == "stopped" and done is not None
            assert len(done.text) < len(REPLY) and REPLY.startswith(done.text)
            assert on_screen(view) == view.text == turn.reply == done.text
            assert_panel_holds(panel, turn.stats)
        finally:
            target.open_gate()  # a failed assertion must not leave the engine waiting on the gate


@pytest.mark.asyncio
async def test_fast_model_updates_merge(tmp_path: Path) -> None:
    long_reply = "word " * 300
    target, draft = FakeBackend(scripted(long_reply)), FakeBackend(scripted(long_reply))
    app = fake_app(target, draft, tmp_path=tmp_path, k=2, max_tokens=4000)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None)
        engine = EngineReplies(app)
        await send(pilot, "go")
        await settle(app, pilot)
        turn = app.chat.transcript.turns[0]
        assert turn.reply == long_reply and turn.stats is not None
        assert turn.stats.n_rounds >= 450
        assert app.chat.renders <= turn.stats.n_rounds // 4  # far fewer redraws than engine steps
        view = app.chat.query_one(ReplyMessage)
        assert on_screen(view) == view.text == engine.replies[0].text == long_reply


@pytest.mark.asyncio
async def test_backend_error_mid_reply_keeps_the_transcript(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class GatedFailing(GatedBackend, FailingBackend):
        """Waits for a permit before each pass, and fails on its n-th."""

    target = GatedFailing(scripted(REPLY), fail_at=5)
    app = fake_app(target, FakeBackend(scripted(REPLY)), tmp_path=tmp_path, k=2)
    async with app.run_test(size=SIZE) as pilot:
        try:
            await until(pilot, lambda: app.pipeline is not None)
            engine = EngineReplies(app)
            hold_redraws(monkeypatch)  # after the first redraw, the text waits in the buffer
            await send(pilot, "go")
            target.release(1)  # the prompt pass: its token is drawn at once
            await until(pilot, lambda: bool(app.chat.query_one(ReplyMessage).text), what="the first token")
            target.open_gate()  # three rounds, not drawn yet, then the failure
            await settle(app, pilot)
        finally:
            target.open_gate()
        turn = app.chat.transcript.turns[0]
        assert turn.error is not None and "device lost" in turn.error
        failed = engine.replies[0]
        assert failed.done is None and "device lost" in str(failed.error)
        assert failed.text and REPLY.startswith(failed.text) and len(failed.text) < len(REPLY)
        view = app.chat.query_one(ReplyMessage)
        # the text the engine wrote before the failure stays, all of it, on screen and in the transcript
        assert view.has_class("-error") and on_screen(view) == view.text == turn.reply == failed.text
        assert "device lost" in text_of(view.query_one(".reply-stats", Static))
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.last_saved is not None and "device lost" in app.last_saved.read_text()
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert not app.chat.transcript.turns and not app.chat.query(ReplyMessage)


@pytest.mark.asyncio
async def test_token_colours_toggle_with_legend(tmp_path: Path) -> None:
    app = fake_app(FakeBackend(scripted(REPLY)), FakeBackend(scripted(REPLY, wrong_every=3)), tmp_path=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None)
        engine = EngineReplies(app)
        await send(pilot, "go")
        await settle(app, pilot)
        assert not app.chat.query_one("#legend").display
        await pilot.press("ctrl+t")
        await pilot.pause()
        view = app.chat.query_one(ReplyMessage)
        assert app.chat.query_one("#legend").display and view.has_class("-colour")
        assert {o for _, o in view.segments} == {"draft", "target"}
        assert "".join(s for s, _ in view.segments) == REPLY
        assert on_screen(view) == engine.replies[0].text == REPLY
        await pilot.press("ctrl+t")
        assert not view.has_class("-colour")


@pytest.mark.asyncio
async def test_poor_match_says_a_better_draft_is_the_fix(tmp_path: Path) -> None:
    target, draft = FakeBackend(hashed_logits(1)), FakeBackend(hashed_logits(2))
    app = fake_app(target, draft, tmp_path=tmp_path, max_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None)
        await send(pilot, "go")
        await settle(app, pilot)
        stats = app.chat.transcript.turns[0].stats
        assert stats is not None and stats.mean_accepted_length < 2
        advice = app.chat.query_one("#stat-advice", Static)
        assert advice.display and "larger k does not" in text_of(advice)


def plain_auto_app(tmp_path: Path) -> ChatApp:
    """auto over a draft model that costs what the target costs, on a CPU-like clock where a batch of n
    tokens costs n single ones (SmolLM2 as its own draft on 2 cores): every round is decoded plainly."""
    from localspec.decoding.auto import AutoDrafter, auto_lookup
    from localspec.decoding.drafters import ModelDrafter
    from localspec.decoding.policy import CostModel
    from localspec.pipeline import DraftSlot

    clock = FakeClock()
    target = CostedBackend(scripted(REPLY), clock, lambda n: 0.01 * n, name="target")
    draft = CostedBackend(scripted(REPLY), clock, lambda n: 0.01 * n, name="draft")
    # Measured by an earlier answer (a first one probes the draft model once, to time it).
    remembered = CostModel(target={n: 0.01 * n for n in (1, 2, 4, 8, 16, 33)}, draft_token=0.01)

    def load(options: ModelOptions) -> Pipeline:
        drafter = AutoDrafter(
            ngram=auto_lookup(), model=ModelDrafter(draft), target=target, clock=clock, costs=remembered
        )
        return Pipeline(options, "fake", target, DraftSlot.holding(draft), drafter, clock=clock)

    return ChatApp(
        options=ModelOptions(target="/fake/target", draft="/fake/draft", draft_method="auto"),
        settings=GenerationSettings(k=32, max_tokens=60, seed=0),
        loader=load,
        clock=clock,
        save_dir=tmp_path,
    )


def visible_in(panel: StatsPanel, widget: Static) -> bool:
    """Whether `widget` is on screen inside the (scrollable) panel without scrolling it."""
    region = widget.region
    return bool(region.height) and panel.region.contains_region(region)


@pytest.mark.asyncio
async def test_auto_decoding_plainly_says_what_it_chose_and_why(tmp_path: Path) -> None:
    from localspec.report import advice

    app = plain_auto_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None)
        await send(pilot, "go")
        await settle(app, pilot)
        stats = app.chat.transcript.turns[0].stats
        assert stats is not None and stats.draft_method == "auto" and stats.n_drafted == 0 and stats.n_rounds > 30
        panel = app.chat.query_one(StatsPanel)
        acceptance = text_of(panel.query_one("#stat-acceptance", Static))
        assert acceptance == "acceptance no drafts" and "0/0" not in acceptance
        # auto's choices (the round sources, as the CLI summary words them) and its reason, at the top
        choices = panel.query_one("#stat-choices", Static)
        assert text_of(choices) == f"auto chose {stats.choices()}" == "auto chose plain 100%"
        reason = panel.query_one("#stat-advice", Static)
        assert advice(stats) is not None and text_of(reason) == "⚠ " + advice(stats)
        assert "measured not to pay" in text_of(reason)
        assert visible_in(panel, choices) and visible_in(panel, reason)
        # one histogram row (every round produced one token), not one per length up to k + 1 = 33
        histogram = text_of(panel.query_one("#stat-histogram", Static)).splitlines()
        assert histogram[0] == "accepted length per round" and len(histogram) == 2
        assert histogram[1].split()[0] == "1" and histogram[1].split()[-1] == str(stats.n_rounds)
        assert "no drafts" in text_of(app.chat.query_one(ReplyMessage).query_one(".reply-stats", Static))


@pytest.mark.asyncio
async def test_histogram_shows_the_lengths_that_occur_on_a_compact_scale(tmp_path: Path) -> None:
    base = hashed_logits(1)
    target, draft = (FakeBackend(without(base)), FakeBackend(without(noisy(base, 5, scale=1.0))))
    app = fake_app(target, draft, tmp_path=tmp_path, k=32, max_tokens=400)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None)
        await send(pilot, "go")
        await settle(app, pilot)
        assert app.chat.live is not None
        lengths = app.chat.live.length_series
        assert len(set(lengths)) > 8  # many different accepted lengths, up to k + 1 = 33
        rows = text_of(app.chat.query_one("#stat-histogram", Static)).splitlines()[1:]
        assert 1 < len(rows) <= 8  # a compact scale: ranges of lengths, not a row per length
        shown = {label: int(count) for label, _, count in (row.split() for row in rows)}
        for label, count in shown.items():  # each row counts the rounds whose length falls in its range
            lo, _, hi = label.partition("-")
            assert count == sum(int(lo) <= n <= int(hi or lo) for n in lengths) > 0, label
        assert sum(shown.values()) == len(lengths) and any("-" in label for label in shown)


@pytest.mark.asyncio
async def test_settings_screen_edits_generation(tmp_path: Path) -> None:
    app = fake_app(FakeBackend(scripted(REPLY)), FakeBackend(scripted(REPLY)), tmp_path=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None)
        await pilot.press("f2")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, SettingsScreen)
        dialog.query_one("#set-num_draft", Input).value = "x"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is dialog and "not a number" in text_of(dialog.query_one("#settings-error", Static))
        dialog.query_one("#set-num_draft", Input).value = "2"
        dialog.query_one("#set-temperature", Input).value = "0.7"
        dialog.query_one("#set-seed", Input).value = "7"
        dialog.query_one("#set-max_tokens", Input).value = "12"
        dialog.query_one("#set-system", Input).value = "Be brief."
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
        s = app.settings
        assert (s.num_draft, s.temperature, s.seed, s.max_tokens, s.system) == (2, 0.7, 7, 12, "Be brief.")
        await send(pilot, "go")
        await settle(app, pilot)
        stats = app.chat.transcript.turns[0].stats
        assert stats is not None and stats.num_draft == 2 and stats.seed == 7 and stats.n_generated == 12
        assert app.chat.transcript.messages()[0].content == "Be brief."


@pytest.mark.asyncio
async def test_unusable_backend_is_shown_with_its_reason(tmp_path: Path) -> None:
    probe = lambda: [
        BackendStatus("llama", "llama.cpp", True, "CUDA build: layers offload to the GPU"),
        BackendStatus("mlx", "MLX", False, "not installed: pip install 'localspec[mlx]'"),
    ]
    app = ChatApp(probe=probe, save_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        ol = app.screen.query_one("#backends", OptionList)
        await until(pilot, lambda: ol.option_count == 2)
        mlx = ol.get_option("mlx")
        assert mlx.disabled and "not installed" in str(mlx.prompt)
        assert "CUDA" in str(ol.get_option("llama").prompt)


@pytest.mark.asyncio
async def test_pull_a_catalog_pair_from_the_picker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from localspec import catalog, hub

    downloaded = threading.Event()
    gate = threading.Semaphore(0)
    name = next(iter(catalog.load_catalog().pairs))

    def resolve(pair: str, backend: str, **kw: object) -> tuple[str, str]:
        if pair == name and downloaded.is_set():
            return str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf")
        raise catalog.CatalogError(f"{pair} is not downloaded", f"localspec pull {pair}")

    def pull(pair: str, backend: str, *, progress: Callable, cancel: threading.Event, **kw: object) -> None:
        for done in (0, 50, 100):
            if not gate.acquire(timeout=30):
                raise RuntimeError("the test never released the pull")
            progress(hub.ProgressEvent("t.gguf", "org/t", "target", done * 10**6, 100 * 10**6, 1e6, 1.0, done == 100))
        downloaded.set()

    monkeypatch.setattr(catalog, "resolve_pair", resolve)
    monkeypatch.setattr(hub, "pull_pair", pull)
    app = ChatApp(save_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        try:
            setup = app.screen
            assert isinstance(setup, SetupScreen)
            pairs = setup.query_one("#pairs", OptionList)
            await until(pilot, lambda: pairs.option_count > 0 and pairs.get_option_at_index(0).id == name)
            assert "not downloaded" in str(pairs.get_option(name).prompt) and "GB" in str(pairs.get_option(name).prompt)
            pairs.focus()
            pairs.highlighted = 0
            await pilot.press("ctrl+d")
            gate.release(2)
            await until(pilot, lambda: "50.0 MB / 100.0 MB" in text_of(setup.query_one("#pair-status", Static)))
            bar = setup.query_one("#pull-progress")
            assert bar.display and bar.progress == 50  # type: ignore[attr-defined]
            await pilot.press("down", "up")  # the UI answers while the pull runs
            gate.release(1)
            await until(pilot, lambda: setup.pulling is None)
            await pilot.pause()
            assert "downloaded" in str(pairs.get_option(name).prompt)
            assert setup.query_one("#target", Input).value == str(tmp_path / "t.gguf")
            assert setup.query_one("#draft", Input).value == str(tmp_path / "d.gguf")
        finally:
            gate.release(10)  # a failed assertion must not leave the pull worker waiting


def cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `localspec` subprocess: an empty Hugging Face cache that may not download."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "LOCALSPEC_CATALOG")}
    return {**env, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "TERM": "xterm-256color"}  # fmt: skip


def test_chat_without_a_terminal_refuses_at_once_and_points_to_run(
    tiny_ggufs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    # Before: the app drew itself into the pipe and waited for keys until killed (here: the timeout).
    chat = [sys.executable, "-m", "localspec.cli", "chat"]
    cases = [
        ([*chat, "--target", str(tiny_ggufs[0])], {"stdin": subprocess.DEVNULL}),  # cron, nohup, CI
        (chat, {"input": "hello\n"}),  # a prompt piped in: no models given, the default pair not downloaded
        ([*chat, "--target", str(tmp_path / "missing.gguf"), "--yes"], {"stdin": subprocess.DEVNULL}),
    ]
    for argv, stdin in cases:
        env = cli_env(tmp_path)
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, **stdin)  # type: ignore[call-overload]
        assert out.returncode == 2, (argv, out.stderr)
        err = out.stderr
        first = err.splitlines()[0]
        assert first == "error: `localspec chat` is a terminal app, and no terminal is attached to its stdin and stderr"
        assert 'hint: for a prompt without a terminal (a script, a pipe, CI) use `localspec run "PROMPT"`' in err
        assert out.stdout == "" and "\x1b" not in err and "Traceback" not in err
        # refused before anything was read or loaded: the missing file and the missing pair go unmentioned
        assert "missing.gguf" not in err and "not downloaded" not in err
    assert not (tmp_path / "hf").exists()


def run_in_terminal(argv: list[str], env: dict[str, str], *, stderr_to_pipe: bool = False) -> TerminalRun:
    """Start `argv` on a pseudo-terminal (120x40), stdin and stdout on it, stderr too unless piped."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    stderr = subprocess.PIPE if stderr_to_pipe else slave
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=stderr, env=env, start_new_session=True)
    os.close(slave)
    run = TerminalRun(proc, master)
    threading.Thread(target=run.read, daemon=True).start()
    return run


@dataclass
class TerminalRun:
    proc: subprocess.Popen[bytes]
    master: int
    screen: bytearray = field(default_factory=bytearray)  # all the process wrote to the terminal

    def read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the process closed the terminal
                return
            if not chunk:
                return
            self.screen += chunk

    def wait_for_output(self, n_bytes: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while len(self.screen) < n_bytes and self.proc.poll() is None and time.monotonic() < end:
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def test_chat_on_a_terminal_starts_the_app_and_ctrl_q_quits(
    tiny_ggufs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "localspec.cli", "chat", "--target", str(tiny_ggufs[0]), "--draft-method", "none",
            "--threads", "1"]  # fmt: skip
    run = run_in_terminal(argv, cli_env(tmp_path))
    try:
        run.wait_for_output(4000, timeout=120)  # the app drew its screen
        assert run.proc.poll() is None, bytes(run.screen).decode(errors="replace")
        assert b"localspec chat" in run.screen and b"No reply yet" in run.screen  # its title and stats panel
        time.sleep(1.0)
        os.write(run.master, b"\x11")  # Ctrl+Q
        assert run.proc.wait(timeout=60) == 0
        assert b"terminal app" not in run.screen
    finally:
        run.stop()
    # stdin a terminal but stderr (where the app draws) redirected: refused the same way, naming stderr
    run = run_in_terminal(argv, cli_env(tmp_path), stderr_to_pipe=True)
    try:
        assert run.proc.wait(timeout=60) == 2
        assert run.proc.stderr is not None
        assert b"no terminal is attached to its stderr\n" in run.proc.stderr.read()
    finally:
        run.stop()


def test_cli_chat_options_skip_the_pickers(monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, tmp_path: Path) -> None:
    from localspec import cli

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: the default pair is not downloaded
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for var in ("HF_HUB_CACHE", "LOCALSPEC_CATALOG", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)

    seen: dict[str, ChatApp] = {}
    monkeypatch.setattr(ChatApp, "run", lambda self: seen.setdefault("app", self))
    monkeypatch.setattr(chat_command, "require_terminal", lambda: None)  # pytest's stdin is no terminal
    rc = cli.main(["chat", "--target", str(smollm2_path), "--draft-method", "ngram", "-k", "3", "--temperature", "0.5"])
    assert rc == 0
    app = seen["app"]
    assert app.options is not None and app.options.target == str(smollm2_path) and app.options.draft_method == "ngram"
    assert app.settings.num_draft == 3 and app.settings.temperature == 0.5
    seen.clear()
    # no models given, the default pair not downloaded and no terminal to ask: the picker opens, saying why
    assert cli.main(["chat"]) == 0 and seen["app"].options is None
    assert "add --yes" in (seen["app"].notice or "")


@pytest.mark.asyncio
async def test_ctrl_q_quits_mid_reply_and_closes_the_models(tmp_path: Path) -> None:
    target = GatedBackend(scripted(REPLY))
    draft = FakeBackend(scripted(REPLY))
    app = fake_app(target, draft, tmp_path=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        try:
            await until(pilot, lambda: app.pipeline is not None)
            await send(pilot, "go")
            target.release(2)
            await until(pilot, lambda: bool(app.chat.turn and app.chat.turn.reply))
            target.open_gate()  # the round in flight finishes; the engine sees the stop and returns
            await pilot.press("ctrl+q")
            await until(pilot, lambda: not app.is_running, timeout=10, what="the app to exit")
        finally:
            target.open_gate()
    assert target.closed and draft.closed


# -- one pipeline for the CLI and the app ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_settings_k_reaches_the_engine_for_auto_and_fixed_methods(tmp_path: Path) -> None:
    # F2's k is the engine's k, and auto's longest draft: a k raised above the one the app started with
    # is used, not silently capped (draft = target and batches cost nothing under the tick clock, so auto
    # drafts as long as it may).
    long_reply = "one two three four five six seven eight nine ten " * 12
    for method in ("auto", "model"):
        target, draft = (FakeBackend(scripted(long_reply)), FakeBackend(scripted(long_reply)))
        clock = TickClock()
        app = ChatApp(
            options=ModelOptions(target="/fake/target", draft="/fake/draft", draft_method=method),
            settings=GenerationSettings(k=4, max_tokens=200),
            loader=fake_pipeline_loader(target, draft, clock),
            clock=clock,
            save_dir=tmp_path,
        )
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.pipeline is not None)
            await pilot.press("f2")
            await pilot.pause()
            app.screen.query_one("#set-num_draft", Input).value = "12"
            await pilot.press("ctrl+s")
            await pilot.pause()
            rounds: list[int] = []
            real_generate = app.pipeline.generate  # type: ignore[union-attr]

            def recording(*a, **kw):  # type: ignore[no-untyped-def]
                for ev in real_generate(*a, **kw):
                    if getattr(ev, "round", None) is not None:
                        rounds.append(ev.round.n_drafted)
                    yield ev

            app.pipeline.generate = recording  # type: ignore[method-assign, union-attr]
            await send(pilot, "go")
            await settle(app, pilot)
            stats = app.chat.transcript.turns[0].stats
            assert stats is not None and stats.draft_method == method and stats.num_draft == 12
            assert max(rounds) > 8, (method, rounds)  # longer than either default k


def fake_pipeline_loader(
    target: FakeBackend, draft: FakeBackend, clock: Callable[[], float]
) -> Callable[[ModelOptions], Pipeline]:
    """Loads like the real pipeline (the drafter for the chosen method, built by make_drafter) over fakes."""
    from localspec.pipeline import DraftSlot, make_drafter

    def load(options: ModelOptions) -> Pipeline:
        drafter = make_drafter(options.draft_method, target, draft, clock=clock)
        return Pipeline(options, "fake", target, DraftSlot.holding(draft), drafter, clock=clock)

    return load


def test_the_same_pair_gets_the_same_draft_method_in_run_and_chat(
    monkeypatch: pytest.MonkeyPatch, tiny_ggufs: tuple[Path, Path, Path]
) -> None:
    import json
    import subprocess

    from localspec import cli

    t, d = str(tiny_ggufs[0]), str(tiny_ggufs[1])
    out = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", "Hi", "--target", t, "--draft", d, "--max-tokens", "4",
         "--threads", "1", "--json"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    run_method = json.loads(out.stdout)["stats"]["draft_method"]
    seen: dict[str, ChatApp] = {}
    monkeypatch.setattr(ChatApp, "run", lambda self: seen.setdefault("app", self))
    monkeypatch.setattr(chat_command, "require_terminal", lambda: None)  # pytest's stdin is no terminal
    assert cli.main(["chat", "--target", t, "--draft", d]) == 0
    assert seen["app"].options is not None and seen["app"].options.draft_method == run_method == "auto"
    seen.clear()
    assert cli.main(["chat"]) == 0  # the picker's default for models picked in the app
    assert seen["app"].load_defaults.draft_method == run_method


@pytest.mark.asyncio
async def test_final_stats_in_the_app_equal_run_json(tiny_ggufs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    import json
    import subprocess

    t, d = str(tiny_ggufs[0]), str(tiny_ggufs[1])
    out = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", "Tell me a story", "--target", t, "--draft", d,
         "--draft-method", "model", "-k", "3", "--temperature", "0.8", "--seed", "11", "--max-tokens", "40",
         "--threads", "1", "--json"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    expected = json.loads(out.stdout)
    opts = ModelOptions(target=t, draft=d, draft_method="model", threads=1)
    app = ChatApp(
        options=opts, settings=GenerationSettings(k=3, temperature=0.8, seed=11, max_tokens=40), save_dir=tmp_path
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.pipeline is not None, what="models to load")
        await send(pilot, "Tell me a story")
        await settle(app, pilot)
        turn = app.chat.transcript.turns[0]
        assert turn.stats is not None and turn.reply
        got = json.loads(json.dumps(turn.stats.to_dict()))
        timings = {"prompt_s", "decode_s", "draft_s", "verify_s", "rollback_s", "prompt_tps", "decode_tps"}
        assert {k: v for k, v in got.items() if k not in timings} == {
            k: v for k, v in expected["stats"].items() if k not in timings
        }
        assert turn.reply == expected["text"] and app.chat.query_one(ReplyMessage).text == expected["text"]


@pytest.mark.asyncio
async def test_picker_offers_head_methods_only_when_the_files_fit(
    eagle3_pair: tuple[Path, Path], tiny_ggufs: tuple[Path, Path, Path], smollm2_path: Path, tmp_path: Path
) -> None:
    from gguf_factory import write_tiny_llama

    target, head = eagle3_pair
    qwen2 = tmp_path / "qwen2-target.gguf"  # an architecture whose graph cannot hand over hidden states
    write_tiny_llama(qwen2, smollm2_path, seed=0, n_layer=4, arch="qwen2")
    app = ChatApp(
        settings=GenerationSettings(max_tokens=6), save_dir=tmp_path, load_defaults=ModelOptions("", threads=1)
    )
    async with app.run_test(size=SIZE) as pilot:
        setup = app.screen
        assert isinstance(setup, SetupScreen)
        await until(pilot, lambda: setup.query_one("#backends", OptionList).option_count == 2, what="backend probe")
        method = setup.query_one("#method", Select)
        note = setup.query_one("#method-note", Static)

        async def offered_for(t: Path, d: Path) -> tuple[str, ...]:
            setup.query_one("#target", Input).value = str(t)
            setup.query_one("#draft", Input).value = str(d)
            await until(pilot, lambda: setup.offer_key == ("llama", str(t), str(d)), what="the offer to start")
            await app.workers.wait_for_complete()
            await pilot.pause()
            return setup.offered

        # A draft model: the plain methods only, and nothing to explain.
        assert await offered_for(target, tiny_ggufs[1]) == tui_models.plain_methods()
        assert text_of(note) == "" and not note.display
        # The head made for this target: eagle3 joins the list (the other families do not run yet).
        assert await offered_for(target, head) == (*tui_models.plain_methods(), "eagle3")
        method.value = "eagle3"
        await until(pilot, lambda: setup.check is not None and setup.check.key[3] == "eagle3", what="pair check")
        assert setup.check.ok  # type: ignore[union-attr]
        # The same head on a qwen2 target: held back with the reason, and the choice falls back to auto.
        assert await offered_for(qwen2, head) == tui_models.plain_methods()
        assert note.display and "eagle3 not offered" in text_of(note) and "'qwen2' model" in text_of(note)
        assert method.value == "auto"

        # Back on the fitting pair, eagle3 starts a chat whose drafter is the head.
        await offered_for(target, head)
        method.value = "eagle3"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.pipeline is not None, what="models to load")
        assert app.pipeline.drafter.method == "eagle3"  # type: ignore[union-attr]
        await send(pilot, "Hi")
        await settle(app, pilot)
        stats = app.chat.transcript.turns[0].stats
        assert stats is not None and stats.draft_method == "eagle3" and stats.n_drafted > 0
