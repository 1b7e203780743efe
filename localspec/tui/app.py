"""The chat App: owns the loaded pipeline, the settings and the screens.

The chat screen is always at the bottom of the stack; the picker is pushed over it when no models were
given on the command line (or on F3). Models load in a worker thread; the pipeline is only closed once
the generation thread has stopped, since llama.cpp must not free a context another thread is using.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from textual import work
from textual.app import App
from textual.binding import Binding

from localspec.backends.registry import releasing
from localspec.errors import error_text
from localspec.options import GenerationSettings, ModelOptions
from localspec.pipeline import Pipeline, load_pipeline
from localspec.tui import messages as msg
from localspec.tui.chat_screen import ChatScreen
from localspec.tui.models import BackendStatus, probe_backends
from localspec.tui.setup_screen import SetupScreen

Loader = Callable[[ModelOptions], Pipeline]


class ChatApp(App[None]):
    CSS_PATH = "chat.tcss"
    TITLE = "localspec chat"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(
        self,
        *,
        options: ModelOptions | None = None,
        settings: GenerationSettings | None = None,
        load_defaults: ModelOptions | None = None,
        loader: Loader | None = None,
        probe: Callable[[], list[BackendStatus]] = probe_backends,
        clock: Callable[[], float] = time.perf_counter,
        save_dir: Path | None = None,
        notice: str | None = None,
    ) -> None:
        """`options`: load these models at start and skip the picker. `load_defaults`: n_ctx, threads and
        GPU layers and draft method for models picked in the app. `loader`, `probe`, `clock`: injected by tests
        (the engine times the run with `clock`). `notice`: shown once at start (why the picker opened)."""
        super().__init__()
        self.options = options
        self.settings = settings or GenerationSettings()
        self.load_defaults = load_defaults or options or ModelOptions(target="")
        self.load_cancel = threading.Event()  # set on quit: a load in progress stops at once
        self.loader: Loader = loader or (lambda opts: load_pipeline(opts, clock=clock, cancel=self.load_cancel))
        self.probe = probe
        self.clock = clock
        self.save_dir = save_dir or Path.cwd()
        self.pipeline: Pipeline | None = None
        self.loading = False
        self.last_saved: Path | None = None
        self.chat = ChatScreen()
        self._shutting_down = False
        self.notice = notice

    async def on_mount(self) -> None:
        await self.push_screen(self.chat)
        if self.options is not None:
            self.load(self.options)
        else:
            self.push_screen(SetupScreen())
        if self.notice:
            self.notify(self.notice, timeout=10)

    # -- loading models --------------------------------------------------------------------------------

    def load(self, options: ModelOptions) -> None:
        if self.loading:
            self.notify("Already loading models.", severity="warning")
            return
        if self.chat.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        self.loading = True
        self.options = options
        self.chat.show_loading(options)
        if isinstance(self.screen, SetupScreen):
            self.screen.set_pair_status(True, f"loading {Path(options.target).name} …")
        self._load(options)

    @work(thread=True, group="load", exit_on_error=False)
    @releasing
    def _load(self, options: ModelOptions) -> None:
        try:
            pipeline = self.loader(options)
        except Exception as e:
            self.post_message(msg.PipelineFailed(options, error_text(e)))
            return
        if self._shutting_down:
            pipeline.close()
            return
        _warm_up_rendering()
        self.post_message(msg.PipelineLoaded(pipeline, options))

    def on_pipeline_loaded(self, message: msg.PipelineLoaded) -> None:
        self.loading = False
        if self._shutting_down:
            message.pipeline.close()
            return
        old, self.pipeline = self.pipeline, message.pipeline
        if old is not None:
            self.chat.stop_and_wait()
            old.close()
        self.chat.pipeline_changed()
        while isinstance(self.screen, SetupScreen):
            self.pop_screen()
        for note in message.pipeline.notes:
            self.notify(note, timeout=8)

    def on_pipeline_failed(self, message: msg.PipelineFailed) -> None:
        self.loading = False
        if isinstance(self.screen, SetupScreen):
            self.screen.show_load_error(message.error)
        else:
            self.chat.show_load_error(message.error)
        self.notify(message.error, title="Could not load the models", severity="error", timeout=8)

    # -- shutting down ----------------------------------------------------------------------------------

    async def action_quit(self) -> None:
        self._close_models()
        self.exit()

    def on_unmount(self) -> None:
        self._close_models()

    def _close_models(self) -> None:
        self._shutting_down = True
        self.load_cancel.set()
        if self.pipeline is not None:
            self.chat.stop_and_wait()
            self.pipeline.close()
            self.pipeline = None


def _warm_up_rendering() -> None:
    """Import the Markdown parser and code highlighter now, off the UI thread, rather than on the UI
    thread in the middle of the first reply (where the imports would take CPU from the model)."""
    try:
        from markdown_it import MarkdownIt
        from textual.highlight import highlight

        MarkdownIt("gfm-like").parse("# x\n\n```python\nx = 1\n```\n")
        for language in ("python", "bash", "json"):
            highlight("x = 1", language=language)
    except Exception:
        pass  # only a speed-up
