"""Screens: the chat (transcript, prompt, stats), the backend and pair picker, and the settings dialog."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.timer import Timer
from textual.widgets import Button, Footer, Header, Input, Label, OptionList, ProgressBar, Select, Static
from textual.widgets.option_list import Option

from localspec.backends.base import chat_prompt_tokens
from localspec.errors import LocalspecError
from localspec.loader import DRAFT_METHODS, LoadOptions, Pipeline
from localspec.spec.engine import Done, GenerationConfig, generate
from localspec.tui import messages as msg
from localspec.tui.session import (
    BackendStatus,
    ChatSettings,
    Chunk,
    LiveStats,
    PairEntry,
    RunInfo,
    Segment,
    StreamBuffer,
    Transcript,
    Turn,
    check_pair,
    error_text,
    split_by_origin,
)
from localspec.tui.widgets import ReplyMessage, StatsPanel, Transcript as TranscriptView, UserMessage, legend

if TYPE_CHECKING:
    from localspec.tui.app import ChatApp

# While a reply streams, the transcript and stats redraw at most every RENDER_MIN_INTERVAL, and less often
# when drawing is expensive: the UI thread may use about UI_CPU_BUDGET of one core, so a slow terminal or
# CPU-bound machine gets fewer, larger updates instead of a slower model (benchmarks/tui_overhead.py).
RENDER_MIN_INTERVAL = 0.1
RENDER_MAX_INTERVAL = 1.0
UI_CPU_BUDGET = 0.02
PANEL_INTERVAL = 1.0  # the live stats panel (sparklines, bars) redraws at most this often


# -- chat ------------------------------------------------------------------------------------------------


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
        self.buffer: StreamBuffer[Chunk] = StreamBuffer()
        self.stop_event = threading.Event()
        self.idle = threading.Event()  # set while no generation thread runs
        self.idle.set()
        self.generating = False
        self.colour = False
        self.live: LiveStats | None = None
        self.reply_view: ReplyMessage | None = None
        self.turn: Turn | None = None
        self._last_render = 0.0
        self._drain_timer: Timer | None = None
        self.renders = 0  # transcript/stats redraws while streaming (tests check that updates merge)
        self._render_gap = RENDER_MIN_INTERVAL
        self._cpu_mark = 0.0
        self._last_panel = 0.0

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
        self.query_one("#stat-advice").display = False
        self.transcript.system = self.app.settings.system
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

    def show_loading(self, options: LoadOptions) -> None:
        self.set_status(f"Loading {options.target} …")

    def show_load_error(self, error: str) -> None:
        self.set_status(Text("Could not load the models: " + error + " (f3: pick another pair)"), error=True)

    def pipeline_changed(self) -> None:
        self.set_status(self.pipeline_status())
        self.sub_title = self.pipeline_status()

    # -- sending -----------------------------------------------------------------------------------------

    @on(Input.Submitted, "#prompt")
    async def send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.app.pipeline is None:
            self.notify("No model loaded yet: press f3 to pick a backend and a pair.", severity="warning")
            return
        if self.generating:
            self.notify("A reply is still generating: Esc stops it.", severity="warning")
            return
        try:
            config = self.app.settings.generation_config()
        except LocalspecError as e:
            self.notify(error_text(e), severity="error", title="Settings")
            return
        event.input.value = ""
        await self.start_reply(text, config)

    async def start_reply(self, text: str, config: GenerationConfig) -> None:
        pipeline = self.app.pipeline
        assert pipeline is not None
        self.transcript.system = self.app.settings.system
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
        self._render_gap, self._cpu_mark, self._last_panel = RENDER_MIN_INTERVAL, time.thread_time(), 0.0
        self.set_status("Generating … (Esc stops)")
        self._generate(pipeline, messages, config)

    @work(thread=True, group="generate", exit_on_error=False)
    def _generate(self, pipeline: Pipeline, messages: Sequence, config: GenerationConfig) -> None:  # type: ignore[type-arg]
        """The engine loop, off the UI thread. Everything it tells the UI goes through messages."""
        clock = self.app.clock
        try:
            target = pipeline.target
            tokens = chat_prompt_tokens(target, messages)
            s = config.sampling
            self.post_message(
                msg.ReplyStarted(
                    RunInfo(
                        backend=target.info.backend,
                        device=target.info.device,
                        target=target.info.name,
                        draft=pipeline.drafter.name,
                        draft_method=pipeline.drafter.method,
                        rule="greedy" if s.greedy else config.rule,
                        num_draft=config.num_draft if pipeline.drafter.method != "none" else 0,
                        temperature=s.temperature,
                        seed=s.seed if s.seed is not None else -1,
                        n_prompt=len(tokens),
                    )
                )
            )
            detok = target.detokenizer()
            for event in generate(target, pipeline.drafter, tokens, config, stop=self.stop_event, clock=clock):
                if isinstance(event, Done):
                    tail = detok.flush()
                    if tail and self.buffer.push(Chunk(((tail, "target"),), 0, None, clock())):
                        self.post_message(msg.ChunksReady())
                    self.post_message(msg.ReplyDone(event))
                    break
                if not event.tokens:
                    continue  # the engine's own flush; ours comes with Done
                segments = split_by_origin(detok, event.tokens, event.origins)
                if self.buffer.push(Chunk(segments, len(event.tokens), event.round, clock())):
                    self.post_message(msg.ChunksReady())
        except Exception as e:  # shown in the app; the transcript stays
            self.post_message(msg.ReplyFailed(error_text(e)))
        finally:
            self.idle.set()

    def on_reply_started(self, message: msg.ReplyStarted) -> None:
        self.live = LiveStats(message.info)
        self.query_one(StatsPanel).clear(f"This reply: reading the prompt ({message.info.n_prompt} tokens) …")

    async def on_chunks_ready(self, message: msg.ChunksReady) -> None:
        wait = self._last_render + self._render_gap - time.monotonic()
        if wait > 0:
            if self._drain_timer is None:
                self._drain_timer = self.set_timer(wait, self._drain)
            return
        await self._drain()

    async def _drain(self) -> None:
        self._drain_timer = None
        chunks = self.buffer.drain()
        if not chunks or self.reply_view is None or self.turn is None:
            return
        self._last_render = time.monotonic()
        self.renders += 1
        cpu = time.thread_time()  # this (UI) thread's CPU since the last redraw, drawing included
        self._render_gap = min(max((cpu - self._cpu_mark) / UI_CPU_BUDGET, RENDER_MIN_INTERVAL), RENDER_MAX_INTERVAL)
        self._cpu_mark = cpu
        segments: list[Segment] = []
        for c in chunks:
            segments += c.segments
            if self.live is not None:
                self.live.add(c)
        self.turn.segments += segments
        self.turn.reply += "".join(s for s, _ in segments)
        await self.reply_view.add(segments)
        if self.live is not None and self._last_render - self._last_panel >= PANEL_INTERVAL:
            self._last_panel = self._last_render
            self.query_one(StatsPanel).show(
                self.live.snapshot(),
                live=True,
                rates=self.live.rate_series,
                lengths=self.live.length_series,
                note=self.live.note,
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

    def stop_and_wait(self, timeout: float = 60.0) -> bool:
        """Ask the engine thread to stop after its round; block until it has (used before closing models)."""
        self.stop_event.set()
        return self.idle.wait(timeout)

    # -- actions ----------------------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.generating:
            self.stop_event.set()
            self.set_status("Stopping after this round …")

    async def action_new_chat(self) -> None:
        if self.generating:
            self.stop_event.set()
            self.notify("Stopping the reply first; press Ctrl+N again for a new chat.")
            return
        self.transcript = Transcript(system=self.app.settings.system)
        self.turn, self.reply_view, self.live = None, None, None
        await self.query_one("#transcript", TranscriptView).remove_children()
        self.query_one(StatsPanel).clear()
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
        def apply(result: ChatSettings | None) -> None:
            if result is not None:
                self.app.settings = result
                self.transcript.system = result.system
                self.notify("Settings apply from the next message.")

        self.app.push_screen(SettingsScreen(self.app.settings), apply)

    def action_models(self) -> None:
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        self.app.push_screen(SetupScreen())


# -- settings ---------------------------------------------------------------------------------------------


class SettingsScreen(ModalScreen[ChatSettings | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Apply")]

    FIELDS = (
        ("num_draft", "k: draft tokens per round", int),
        ("temperature", "temperature (0: greedy)", float),
        ("top_p", "top-p (1: off)", float),
        ("top_k", "top-k (0: off)", int),
        ("min_p", "min-p (0: off)", float),
        ("seed", "seed (empty: fresh each reply)", int),
        ("max_tokens", "max tokens per reply", int),
    )

    def __init__(self, settings: ChatSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="settings-dialog"):
            yield Label("Settings", id="settings-title")
            for name, label, _ in self.FIELDS:
                value = getattr(self.settings, name)
                with Horizontal(classes="field"):
                    yield Label(label)
                    yield Input("" if value is None else str(value), id=f"set-{name}")
            with Horizontal(classes="field"):
                yield Label("verification rule")
                yield Select(
                    [("exact (rejection sampling)", "exact"), ("match (target sample = draft)", "match")],
                    value=self.settings.rule,
                    allow_blank=False,
                    id="set-rule",
                )
            with Horizontal(classes="field"):
                yield Label("system prompt")
                yield Input(self.settings.system, id="set-system", placeholder="(none)")
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="settings-apply")
                yield Button("Cancel", id="settings-cancel")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#set-num_draft", Input).focus()

    def read(self) -> ChatSettings:
        values: dict[str, object] = {}
        for name, label, kind in self.FIELDS:
            raw = self.query_one(f"#set-{name}", Input).value.strip()
            if name == "seed" and not raw:
                values[name] = None
                continue
            try:
                values[name] = kind(raw)
            except ValueError:
                raise LocalspecError(f"{label}: {raw!r} is not a number") from None
        rule = self.query_one("#set-rule", Select).value
        system = self.query_one("#set-system", Input).value
        settings = ChatSettings(rule=str(rule), system=system, **values)  # type: ignore[arg-type]
        settings.generation_config()  # raises for values the engine refuses
        return settings

    def action_save(self) -> None:
        try:
            self.dismiss(self.read())
        except LocalspecError as e:
            self.query_one("#settings-error", Static).update(Text(error_text(e), style="bold red"))

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#settings-apply")
    def _apply(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#settings-cancel")
    def _cancel(self) -> None:
        self.action_cancel()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_save()


# -- backend and pair picker -------------------------------------------------------------------------------


class SetupScreen(Screen[None]):
    """Pick a backend (unusable ones shown with the reason) and a pair (catalog, or local paths)."""

    BINDINGS = [
        Binding("ctrl+s", "start", "Start chat"),
        Binding("ctrl+d", "pull", "Pull pair"),
        Binding("escape", "back", "Back"),
    ]

    app: ChatApp

    def __init__(self) -> None:
        super().__init__()
        self.backends: list[BackendStatus] = []
        self.backend = "llama"
        self.entries: list[PairEntry] = []  # the catalog's pairs for the chosen backend
        self.pair_name: str | None = None
        self.check: msg.PairChecked | None = None
        self._check_timer: Timer | None = None
        self.pulling: str | None = None
        self.pull_cancel = threading.Event()

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="setup"):
            with Vertical(id="backend-box"):
                yield Label("Backend", classes="box-title")
                yield OptionList(Option("probing backends …", disabled=True), id="backends")
            with Vertical(id="pair-box"):
                yield Label("Catalog pairs (Enter picks a downloaded one, Ctrl+D pulls)", classes="box-title")
                yield OptionList(id="pairs")
                yield Label("Or models on disk (GGUF file for llama.cpp, directory or repo id for MLX)")
                yield Input(placeholder="target model path", id="target")
                yield Input(placeholder="draft model path (same tokenizer as the target)", id="draft")
                with Horizontal(classes="field"):
                    yield Label("draft method")
                    yield Select([(m, m) for m in DRAFT_METHODS], value="model", allow_blank=False, id="method")
                yield Static("", id="pair-status", markup=False)
                yield ProgressBar(total=None, show_eta=False, id="pull-progress")
                with Horizontal(classes="buttons"):
                    yield Button("Start chat", variant="primary", id="start")
                    yield Button("Pull pair", id="pull")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "choose a backend and a target/draft pair"
        self.query_one("#pull-progress").display = False
        opts = self.app.options
        if opts is not None:
            self.query_one("#target", Input).value = opts.target
            self.query_one("#draft", Input).value = opts.draft or ""
            self.query_one("#method", Select).value = opts.draft_method
        self._probe()
        self.query_one("#backends", OptionList).focus()

    @work(thread=True, group="probe", exit_on_error=False)
    def _probe(self) -> None:
        try:
            found = self.app.probe()
        except Exception as e:
            found = [BackendStatus("llama", "llama.cpp", False, error_text(e))]
        self.post_message(msg.BackendsProbed(found))

    def on_backends_probed(self, message: msg.BackendsProbed) -> None:
        self.backends = message.backends
        ol = self.query_one("#backends", OptionList)
        ol.clear_options()
        for b in self.backends:
            mark = ("✓ ", "green") if b.usable else ("✗ ", "red")
            prompt = Text.assemble(mark, (b.label, "bold"), "\n  ", (b.detail, "dim" if b.usable else "red"))
            ol.add_option(Option(prompt, id=b.name, disabled=not b.usable))
        wanted = self.app.options.backend if self.app.options is not None else "llama"
        usable = [b.name for b in self.backends if b.usable]
        choice = wanted if wanted in usable else (usable[0] if usable else None)
        if choice is not None:
            ol.highlighted = [b.name for b in self.backends].index(choice)
            self.choose_backend(choice)
        else:
            self.set_pair_status(False, "no backend can run here: see the reasons on the left")

    @on(OptionList.OptionHighlighted, "#backends")
    @on(OptionList.OptionSelected, "#backends")
    def _backend_picked(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id and not event.option.disabled:
            self.choose_backend(event.option.id)

    def choose_backend(self, name: str) -> None:
        if name == self.backend and self.entries:
            return
        self.backend = name
        self.refresh_pairs()
        self.schedule_check()

    def refresh_pairs(self) -> None:
        from localspec.tui.session import catalog_entries

        ol = self.query_one("#pairs", OptionList)
        ol.clear_options()
        self.entries, problem = catalog_entries(self.backend)
        if problem:
            ol.add_option(Option(Text(problem, style="dim"), disabled=True))
        for e in self.entries:
            state = ("● downloaded", "green") if e.downloaded else ("○ not downloaded", "yellow")
            line = Text.assemble((e.name, "bold"), "  ", state, "  ", (e.size_text, "dim"))
            if e.description:
                line.append("\n  " + e.description, "dim")
            ol.add_option(Option(line, id=e.name))

    @on(OptionList.OptionHighlighted, "#pairs")
    def _pair_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        entry = next((e for e in self.entries if e.name == event.option.id), None)
        if entry is None:
            return
        self.pair_name = entry.name
        if not entry.downloaded:
            self.set_pair_status(False, f"{entry.name} is not downloaded ({entry.size_text}): Ctrl+D pulls it")
        elif (entry.target_path, entry.draft_path) != self.current()[1:3]:
            self.set_pair_status(True, f"{entry.name} is downloaded: Enter picks it")

    @on(OptionList.OptionSelected, "#pairs")
    def _pair_selected(self, event: OptionList.OptionSelected) -> None:
        entry = next((e for e in self.entries if e.name == event.option.id), None)
        if entry is None:
            return
        self.pair_name = entry.name
        if not entry.downloaded:
            self.set_pair_status(False, f"{entry.name} is not downloaded ({entry.size_text}): Ctrl+D pulls it")
            return
        self.query_one("#target", Input).value = entry.target_path or ""
        self.query_one("#draft", Input).value = entry.draft_path or ""
        self.query_one("#method", Select).value = "model"

    @on(Input.Changed, "#target")
    @on(Input.Changed, "#draft")
    @on(Select.Changed, "#method")
    def _choice_changed(self) -> None:
        self.schedule_check()

    def schedule_check(self) -> None:
        if self._check_timer is not None:
            self._check_timer.stop()
        self._check_timer = self.set_timer(0.25, self._run_check)

    def current(self) -> tuple[str, str, str, str]:
        method = str(self.query_one("#method", Select).value)
        return (
            self.backend,
            self.query_one("#target", Input).value.strip(),
            self.query_one("#draft", Input).value.strip(),
            method,
        )

    def _run_check(self) -> None:
        self._check_timer = None
        key = self.current()
        if not key[1] and not key[2]:
            return
        self._check(key, start=False)

    @work(thread=True, group="check", exit_on_error=False)
    def _check(self, key: tuple[str, str, str, str], start: bool) -> None:
        ok, text = check_pair(*key)
        self.post_message(msg.PairChecked(key, ok, text))
        if ok and start:
            backend, target, draft, method = key
            options = LoadOptions(
                target=target,
                draft=draft if method in ("model", "auto") and draft else None,
                backend=backend,
                draft_method=method,
                max_draft=self.app.load_defaults.max_draft,
                n_ctx=self.app.load_defaults.n_ctx,
                threads=self.app.load_defaults.threads,
                n_gpu_layers=self.app.load_defaults.n_gpu_layers,
            )
            self.app.call_from_thread(self.app.load, options)

    def on_pair_checked(self, message: msg.PairChecked) -> None:
        if message.key != self.current():
            return  # the choice changed since; its own check follows
        self.check = message
        self.set_pair_status(message.ok, message.text)

    def set_pair_status(self, ok: bool, text: str) -> None:
        status = self.query_one("#pair-status", Static)
        status.update(Text(("✓ " if ok else "✗ ") + text))
        status.set_class(not ok, "-error")
        status.set_class(ok, "-ok")

    def show_load_error(self, error: str) -> None:
        self.set_pair_status(False, "could not load: " + error)

    def action_start(self) -> None:
        key = self.current()
        if not key[1]:
            self.set_pair_status(False, "choose a target model (a downloaded catalog pair, or a path) first")
            return
        self.set_pair_status(True, "checking the pair …")
        self._check(key, start=True)

    @on(Button.Pressed, "#start")
    def _start_pressed(self) -> None:
        self.action_start()

    @on(Button.Pressed, "#pull")
    def _pull_pressed(self) -> None:
        self.action_pull()

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()

    # -- pulling a catalog pair ---------------------------------------------------------------------------

    def action_pull(self) -> None:
        if self.pulling:
            self.notify(f"Already pulling {self.pulling}.")
            return
        entry = next((e for e in self.entries if e.name == self.pair_name), None)
        if entry is None:
            self.notify("Highlight a catalog pair to pull first.", severity="warning")
            return
        self.pulling = entry.name
        bar = self.query_one("#pull-progress", ProgressBar)
        bar.display = True
        bar.update(total=None, progress=0)
        self.set_pair_status(True, f"pulling {entry.name} …")
        self._pull(entry.name, self.backend)

    @work(thread=True, group="pull", exit_on_error=False)
    def _pull(self, name: str, backend: str) -> None:
        from localspec.tui.session import pull_pair_with_progress

        def report(fraction: float | None, text: str) -> None:
            self.post_message(msg.PullProgress(name, fraction, text))

        try:
            pull_pair_with_progress(name, backend, report, self.pull_cancel)
        except Exception as e:
            self.post_message(msg.PullFinished(name, error_text(e)))
            return
        self.post_message(msg.PullFinished(name, None))

    def on_unmount(self) -> None:
        self.pull_cancel.set()  # a pull in flight stops; a finished one stays in the cache

    def on_pull_progress(self, message: msg.PullProgress) -> None:
        bar = self.query_one("#pull-progress", ProgressBar)
        if message.fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=100, progress=round(message.fraction * 100, 1))
        self.set_pair_status(True, message.text)

    def on_pull_finished(self, message: msg.PullFinished) -> None:
        self.pulling = None
        self.query_one("#pull-progress").display = False
        if message.error:
            self.set_pair_status(False, f"pull of {message.pair} failed: {message.error}")
            return
        self.refresh_pairs()
        ol = self.query_one("#pairs", OptionList)
        ids = [e.name for e in self.entries]
        if message.pair in ids:
            ol.highlighted = ids.index(message.pair)
            entry = self.entries[ids.index(message.pair)]
            if entry.downloaded:
                self.query_one("#target", Input).value = entry.target_path or ""
                self.query_one("#draft", Input).value = entry.draft_path or ""
                self.query_one("#method", Select).value = "model"
        self.notify(f"{message.pair} is downloaded: Ctrl+S starts the chat.")
