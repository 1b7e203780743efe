"""The settings dialog (F2): k, rule, sampling, seed, max tokens, system prompt, as a GenerationSettings."""

from __future__ import annotations

from dataclasses import replace

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Select, Static

from localspec.errors import LocalspecError, error_text
from localspec.options import GenerationSettings


class SettingsScreen(ModalScreen[GenerationSettings | None]):
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

    def __init__(self, settings: GenerationSettings) -> None:
        super().__init__()
        self.settings = settings  # its method is the loaded pipeline's: k is checked against it

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
                yield Input(self.settings.system or "", id="set-system", placeholder="(none)")
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="settings-apply")
                yield Button("Cancel", id="settings-cancel")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#set-num_draft", Input).focus()

    def read(self) -> GenerationSettings:
        seed = self._int("seed") if self._raw("seed") else None
        settings = replace(
            self.settings,
            k=self._int("num_draft"),
            rule=str(self.query_one("#set-rule", Select).value),
            temperature=self._float("temperature"),
            top_k=self._int("top_k"),
            top_p=self._float("top_p"),
            min_p=self._float("min_p"),
            seed=seed,
            max_tokens=self._int("max_tokens"),
            system=self.query_one("#set-system", Input).value or None,
        )
        settings.config()  # raises for values the engine refuses, in the CLI's words
        return settings

    def _raw(self, name: str) -> str:
        return self.query_one(f"#set-{name}", Input).value.strip()

    def _int(self, name: str) -> int:
        try:
            return int(self._raw(name))
        except ValueError:
            raise self._not_a_number(name) from None

    def _float(self, name: str) -> float:
        try:
            return float(self._raw(name))
        except ValueError:
            raise self._not_a_number(name) from None

    def _not_a_number(self, name: str) -> LocalspecError:
        label = next(text for field, text, _ in self.FIELDS if field == name)
        return LocalspecError(f"{label}: {self._raw(name)!r} is not a number")

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
