"""The chat screen: transcript, prompt, live stats; the engine runs in a worker thread."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Input, Static

from localspec.backends.base import ChatMessage
from localspec.backends.registry import releasing
from localspec.decoding.auto import idle_work
from localspec.decoding.engine import Done, GenerationConfig, Segment, Step
from localspec.errors import LocalspecError, error_text
from localspec.options import GenerationSettings, ModelOptions
from localspec.pipeline import Pipeline
from localspec.tui import messages as msg
from localspec.tui.live import LiveStats
from localspec.tui.stream import RenderPacer, StreamBuffer
from localspec.tui.transcript import Transcript, Turn
from localspec.tui.widgets import ReplyMessage, StatsPanel, UserMessage, legend
from localspec.tui.widgets import Transcript as TranscriptView

if TYPE_CHECKING:
    from localspec.tui.app import ChatApp


class ChatScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+t", "toggle_colour", "Token colours"),
        Binding("ctrl+s", "save", "Save"),
        Binding("f2", "settings", "Settings"),
        Binding("f3", "models", "Models"),
    ]

    app: ChatApp

    def __init__(self) -> None:
        super().__init__()
        self.transcript = Transcript()
        self.buffer: StreamBuffer[Step] = StreamBuffer()
        self.stop_event = threading.Event()
        self.idle = threading.Event()  # set while no generation thread runs
        self.idle.set()
        self.turns_sent = 0  # replies started: a worker whose reply is no longer the latest stops timing
        self.engine = threading.Lock()  # one engine thread at a time (a new reply waits out a timing piece)
        self.idle_pieces = 0  # auto's idle pieces run before the first turn and between turns (tests read it)
        self.generating = False
        self.colour = False
        self.live: LiveStats | None = None
        self.reply_view: ReplyMessage | None = None
        self.turn: Turn | None = None
        self.pacer = RenderPacer()
        self._drain_timer: Timer | None = None
        self.renders = 0  # transcript/stats redraws while streaming (tests check that updates merge)

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield TranscriptView(id="transcript")
                yield Static(legend(), id="legend")
                yield Static("No model loaded: f3 picks a backend and a pair.", id="status", markup=False)
                yield Input(placeholder="Message (Enter sends)", id="prompt")
            yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#legend").display = False
        self.transcript.system = self.app.settings.system or ""
        self.query_one("#prompt", Input).focus()

    # -- status ----------------------------------------------------------------------------------------

    def set_status(self, text: str | Text, *, error: bool = False) -> None:
        status = self.query_one("#status", Static)
        status.update(text)
        status.set_class(error, "-error")

    def pipeline_status(self) -> str:
        p = self.app.pipeline
        if p is None:
            return "No model loaded: f3 picks a backend and a pair."
        info = p.target.info
        draft = f"draft {p.drafter.name}" if p.drafter.method == "model" else f"draft: {p.drafter.method}"
        return f"{info.backend} on {info.device} · target {info.name} · {draft}"

    def show_loading(self, options: ModelOptions) -> None:
        self.set_status(f"Loading {options.target} …")

    def show_load_error(self, error: str) -> None:
        self.set_status(Text("Could not load the models: " + error + " (f3: pick another pair)"), error=True)

    def pipeline_changed(self) -> None:
        self.set_status(self.pipeline_status())
        self.sub_title = self.pipeline_status()
        pipeline = self.app.pipeline
        if pipeline is not None and not self.generating and idle_work(pipeline.drafter) is not None:
            self.stop_event.clear()
            self.idle.clear()
            self._before_first_turn(pipeline, self.turns_sent)

    @work(thread=True, group="idle", exit_on_error=False)
    @releasing
    def _before_first_turn(self, pipeline: Pipeline, turn: int) -> None:
        """Models just loaded, no message yet: auto's idle work now (the draft model's load where a model draft
        may pay, the cost curve's timing), as between turns, so that the first reply does neither. A message sent
        meanwhile waits out the piece in flight only."""
        try:
            with self.engine:
                self._time_between_turns(pipeline, turn)
        finally:
            if self.turns_sent == turn:
                self.idle.set()

    # -- sending -----------------------------------------------------------------------------------------

    @on(Input.Submitted, "#prompt")
    async def send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        pipeline = self.app.pipeline
        if pipeline is None:
            self.notify("No model loaded yet: press f3 to pick a backend and a pair.", severity="warning")
            return
        if self.generating:
            self.notify("A reply is still generating: Esc stops it.", severity="warning")
            return
        try:
            config = replace(self.app.settings, method=pipeline.options.draft_method).config()
        except LocalspecError as e:
            self.notify(error_text(e), severity="error", title="Settings")
            return
        event.input.value = ""
        await self.start_reply(text, config)

    async def start_reply(self, text: str, config: GenerationConfig) -> None:
        pipeline = self.app.pipeline
        assert pipeline is not None
        self.transcript.system = self.app.settings.system or ""
        self.turn = Turn(user=text)
        self.transcript.turns.append(self.turn)
        messages = self.transcript.messages()
        view = self.query_one("#transcript", TranscriptView)
        self.reply_view = ReplyMessage(colour=self.colour)
        await view.mount_all([UserMessage(text), self.reply_view])
        view.scroll_end(animate=False)
        self.buffer.drain()
        self.stop_event.clear()
        self.idle.clear()
        self.generating = True
        self.live = None
        self.pacer.reset()
        self.set_status("Generating … (Esc stops)")
        self.turns_sent += 1  # the previous worker stops timing after its piece in flight
        pipeline.abort(False)  # re-arm after an Esc that stopped the last reply mid-pass
        self._generate(pipeline, messages, config, self.turns_sent)

    @work(thread=True, group="generate", exit_on_error=False)
    @releasing
    def _generate(
        self, pipeline: Pipeline, messages: Sequence[ChatMessage], config: GenerationConfig, turn: int
    ) -> None:
        """The engine loop, off the UI thread. Everything it tells the UI goes through messages. After the
        reply, while the user types, auto's cost curve is timed (when it has none yet) until the next message."""
        try:
            with self.engine:
                tokens = pipeline.prompt_tokens(messages)
                self.post_message(msg.ReplyStarted(len(tokens)))
                for event in pipeline.generate(tokens, config, stop=self.stop_event):
                    if isinstance(event, Done):
                        self.post_message(msg.ReplyDone(event))
                        break
                    if self.buffer.push(event):
                        self.post_message(msg.ChunksReady())
                self._time_between_turns(pipeline, turn)
        except Exception as e:  # shown in the app; the transcript stays
            self.post_message(msg.ReplyFailed(error_text(e)))
        finally:
            if self.turns_sent == turn:
                self.idle.set()

    def _time_between_turns(self, pipeline: Pipeline, turn: int) -> None:
        step = idle_work(pipeline.drafter)
        try:
            while step is not None and self.turns_sent == turn and not self.stop_event.is_set() and step():
                self.idle_pieces += 1
        except Exception:  # noqa: BLE001 - timing is optional: the next reply learns from its rounds anyway
            pass

    def on_reply_started(self, message: msg.ReplyStarted) -> None:
        self.live = LiveStats()
        self.query_one(StatsPanel).clear(f"This reply: reading the prompt ({message.n_prompt} tokens) …")

    async def on_chunks_ready(self, message: msg.ChunksReady) -> None:
        wait = self.pacer.wait()
        if wait > 0:
            if self._drain_timer is None:
                self._drain_timer = self.set_timer(wait, self._drain)
            return
        await self._drain()

    async def _drain(self) -> None:
        self._drain_timer = None
        steps = self.buffer.drain()
        if not steps or self.reply_view is None or self.turn is None:
            return
        self.renders += 1
        panel_due = self.pacer.rendered()
        segments: list[Segment] = []
        for step in steps:
            segments += step.segments
            if self.live is not None:
                self.live.add(step)
        self.turn.segments += segments
        self.turn.reply += "".join(s for s, _ in segments)
        await self.reply_view.add(segments)
        live = self.live
        if live is not None and live.stats is not None and panel_due:
            self.query_one(StatsPanel).show(
                live.stats, live=True, rates=live.rate_series, lengths=live.length_series, note=live.note
            )
        self.query_one("#transcript", TranscriptView).follow()

    async def on_reply_done(self, message: msg.ReplyDone) -> None:
        await self._finish_stream()
        stats = message.done.stats
        if self.turn is not None:
            self.turn.reply = message.done.text
            self.turn.stats = stats
        if self.reply_view is not None:
            self.reply_view.finish(stats)
        live = self.live
        self.query_one(StatsPanel).show(
            stats,
            live=False,
            rates=live.rate_series if live else (),
            lengths=live.length_series if live else (),
            note=live.note if live else "",
        )
        self.generating = False
        self.set_status(self.pipeline_status() + (" · stopped" if stats.stop_reason == "stopped" else ""))

    async def on_reply_failed(self, message: msg.ReplyFailed) -> None:
        await self._finish_stream()
        if self.turn is not None:
            self.turn.error = message.error
        if self.reply_view is not None:
            self.reply_view.fail(message.error)
        self.generating = False
        self.set_status(Text("The backend failed: " + message.error), error=True)
        self.notify(message.error, title="Generation failed", severity="error", timeout=8)

    async def _finish_stream(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.stop()
        await self._drain()
        self.query_one("#transcript", TranscriptView).scroll_end(animate=False)

    def stop_now(self) -> None:
        """Stop the reply at once: the forward pass in flight (prompt, drafter set-up or a round) is
        abandoned, and the engine ends the reply with what it had already shown."""
        self.stop_event.set()
        pipeline = self.app.pipeline
        if self.generating and pipeline is not None:
            pipeline.abort()

    def stop_and_wait(self, timeout: float = 60.0) -> bool:
        """Stop the engine thread now; block until it has (used before closing models)."""
        self.stop_now()
        return self.idle.wait(timeout)

    # -- actions ----------------------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.generating:
            self.stop_now()
            self.set_status("Stopping …")

    async def action_new_chat(self) -> None:
        if self.generating:
            self.stop_now()
            self.notify("Stopping the reply first; press Ctrl+N again for a new chat.")
            return
        self.transcript = Transcript(system=self.app.settings.system or "")
        self.turn, self.reply_view, self.live = None, None, None
        await self.query_one("#transcript", TranscriptView).remove_children()
        self.query_one(StatsPanel).clear()
        self.set_status(self.pipeline_status())
        self.query_one("#prompt", Input).focus()
        self.notify("New chat")

    async def action_toggle_colour(self) -> None:
        self.colour = not self.colour
        self.query_one("#legend").display = self.colour
        for reply in self.query(ReplyMessage):
            await reply.set_colour(self.colour)

    def action_save(self) -> None:
        if not self.transcript.turns:
            self.notify("Nothing to save yet.", severity="warning")
            return
        try:
            path = self.transcript.save(self.app.save_dir, header=self.pipeline_status())
        except OSError as e:
            self.notify(f"Could not save: {e}", severity="error")
            return
        self.app.last_saved = path
        self.notify(f"Saved to {path}", title="Transcript")

    def action_settings(self) -> None:
        from localspec.tui.settings_screen import SettingsScreen

        def apply(result: GenerationSettings | None) -> None:
            if result is not None:
                self.app.settings = result
                self.transcript.system = result.system or ""
                self.notify("Settings apply from the next message.")

        settings = self.app.settings
        if self.app.pipeline is not None:  # k is checked against the loaded method
            settings = replace(settings, method=self.app.pipeline.options.draft_method)
        self.app.push_screen(SettingsScreen(settings), apply)

    def action_models(self) -> None:
        from localspec.tui.setup_screen import SetupScreen

        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        self.app.push_screen(SetupScreen())
