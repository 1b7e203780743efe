"""The picker: a backend (unusable ones shown with the reason) and a pair (catalog, or local paths)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Button, Footer, Header, Input, Label, OptionList, ProgressBar, Select, Static
from textual.widgets.option_list import Option

from localspec.backends.registry import BACKENDS, backend_names
from localspec.errors import error_text
from localspec.options import DEFAULT_DRAFT_METHOD, ModelOptions
from localspec.tui import messages as msg
from localspec.tui.models import (
    BackendStatus,
    PairEntry,
    catalog_entries,
    check_pair,
    method_choices,
    plain_methods,
    pull_pair_with_progress,
)

if TYPE_CHECKING:
    from localspec.tui.app import ChatApp


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
        self.backend = backend_names()[0]  # until the probe says which can run
        self.entries: list[PairEntry] = []  # the catalog's pairs for the chosen backend
        self.pair_name: str | None = None
        self.check: msg.PairChecked | None = None
        self._check_timer: Timer | None = None
        self.pulling: str | None = None
        self.pull_cancel = threading.Event()
        self.offer_key: tuple[str, str, str] | None = None  # the files the method list was last offered for
        self.offered: tuple[str, ...] = ()  # what the draft-method list holds

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
                    yield Select(
                        [(m, m) for m in self._initial_methods()],
                        value=DEFAULT_DRAFT_METHOD,
                        allow_blank=False,
                        id="method",
                    )
                yield Static("", id="method-note", markup=False)
                yield Static("", id="pair-status", markup=False)
                yield ProgressBar(total=None, show_eta=False, id="pull-progress")
                with Horizontal(classes="buttons"):
                    yield Button("Start chat", variant="primary", id="start")
                    yield Button("Pull pair", id="pull")
        yield Footer()

    def _initial_methods(self) -> tuple[str, ...]:
        """The plain methods, and a head method asked for on the command line (checked once files are known)."""
        wanted = (self.app.options or self.app.load_defaults).draft_method
        plain = plain_methods()
        self.offered = plain if wanted in plain else (*plain, wanted)
        return self.offered

    def on_mount(self) -> None:
        self.sub_title = "choose a backend and a target/draft pair"
        self.query_one("#pull-progress").display = False
        self.query_one("#method-note").display = False
        opts = self.app.options
        self.query_one("#method", Select).value = (opts or self.app.load_defaults).draft_method
        if opts is not None:
            self.query_one("#target", Input).value = opts.target
            self.query_one("#draft", Input).value = opts.draft or ""
        self._probe()
        self.query_one("#backends", OptionList).focus()

    @work(thread=True, group="probe", exit_on_error=False)
    def _probe(self) -> None:
        try:
            found = self.app.probe()
        except Exception as e:
            found = [BackendStatus(spec.name, spec.label, False, error_text(e)) for spec in BACKENDS.values()]
        self.post_message(msg.BackendsProbed(found))

    def on_backends_probed(self, message: msg.BackendsProbed) -> None:
        self.backends = message.backends
        ol = self.query_one("#backends", OptionList)
        ol.clear_options()
        for b in self.backends:
            mark = ("✓ ", "green") if b.usable else ("✗ ", "red")
            prompt = Text.assemble(mark, (b.label, "bold"), "\n  ", (b.detail, "dim" if b.usable else "red"))
            ol.add_option(Option(prompt, id=b.name, disabled=not b.usable))
        wanted = self.app.options.backend if self.app.options is not None else backend_names()[0]
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
        ol = self.query_one("#pairs", OptionList)
        ol.clear_options()
        self.entries, problem = catalog_entries(self.backend)
        if problem:
            ol.add_option(Option(Text(problem, style="dim"), disabled=True))
        for e in self.entries:
            state = ("● downloaded", "green") if e.downloaded else ("○ not downloaded", "yellow")
            name = Text.assemble((e.name, "bold"), (" (default)", "bold cyan") if e.default else "")
            line = Text.assemble(name, "  ", state, "  ", (e.size_text, "dim"))
            if e.description:
                line.append("\n  " + e.description, "dim")
            ol.add_option(Option(line, id=e.name))
        default = next((i for i, e in enumerate(self.entries) if e.default), None)
        if default is not None and self.pair_name is None:
            ol.highlighted = default  # the pair `localspec chat` uses when none is given: offer it first

    def _downloaded_entry(self, option_id: str | None) -> PairEntry | None:
        """The pair an option names, once it is downloaded; a pair to pull first says so and gives None."""
        entry = next((e for e in self.entries if e.name == option_id), None)
        if entry is None:
            return None
        self.pair_name = entry.name
        if not entry.downloaded:
            self.set_pair_status(False, entry.pull_offer)
            return None
        return entry

    @on(OptionList.OptionHighlighted, "#pairs")
    def _pair_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        entry = self._downloaded_entry(event.option.id)
        if entry is not None and (entry.target_path, entry.draft_path) != self.current()[1:3]:
            self.set_pair_status(True, f"{entry.name} is downloaded: Enter picks it")

    @on(OptionList.OptionSelected, "#pairs")
    def _pair_selected(self, event: OptionList.OptionSelected) -> None:
        entry = self._downloaded_entry(event.option.id)
        if entry is None:
            return
        self.query_one("#target", Input).value = entry.target_path or ""
        self.query_one("#draft", Input).value = entry.draft_path or ""

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
        if key[:3] != self.offer_key:
            self.offer_key = key[:3]
            self._offer(key[:3])
        if not key[1] and not key[2]:
            return
        self._check(key, start=False)

    @work(thread=True, group="check", exit_on_error=False)
    def _check(self, key: tuple[str, str, str, str], start: bool) -> None:
        ok, text = check_pair(*key)
        self.post_message(msg.PairChecked(key, ok, text))
        if ok and start:
            backend, target, draft, method = key
            d = self.app.load_defaults
            options = ModelOptions(
                target=target,
                draft=draft or None,
                backend=backend,
                draft_method=method,
                n_ctx=d.n_ctx,
                threads=d.threads,
                n_gpu_layers=d.n_gpu_layers,
                suffix_memory=d.suffix_memory,
            )
            self.app.call_from_thread(self.app.load, options)

    @work(thread=True, group="offer", exit_on_error=False)
    def _offer(self, key: tuple[str, str, str]) -> None:
        try:
            methods, note = method_choices(*key)
        except Exception as e:  # a header the readers choke on: the plain methods still run
            methods, note = plain_methods(), error_text(e)
        self.post_message(msg.MethodsOffered(key, methods, note))

    def on_methods_offered(self, message: msg.MethodsOffered) -> None:
        """Offer the head methods that fit the files; a chosen one that no longer fits falls back to auto."""
        if message.key != self.current()[:3]:
            return  # the files changed since; their own offer follows
        note = self.query_one("#method-note", Static)
        note.update(message.note)
        note.display = bool(message.note)  # no room taken when nothing is held back
        select = self.query_one("#method", Select)
        if self.offered == message.methods:
            return
        chosen = str(select.value)
        self.offered = message.methods
        select.set_options([(m, m) for m in message.methods])
        select.value = chosen if chosen in message.methods else DEFAULT_DRAFT_METHOD

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
                self.notify(f"{message.pair} is downloaded: Ctrl+S starts the chat.")
