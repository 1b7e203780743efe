"""The settings dialog (F2): k, rule, sampling, seed, max tokens, system prompt."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Select, Static

from localspec.errors import LocalspecError, error_text
from localspec.options import DEFAULT_DRAFT_METHOD
from localspec.tui.settings import ChatSettings


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

    def __init__(self, settings: ChatSettings, method: str | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.method = method  # the loaded pipeline's draft method: k is checked against it

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
        settings.generation_config(self.method or DEFAULT_DRAFT_METHOD)  # raises for values the engine refuses
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
