"""SVG snapshots of the chat app's main screens (pytest-textual-snapshot), on deterministic fakes.

Update after an intended visual change: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeBackend, scripted
from test_tui import REPLY, TickClock, fake_loader, plain_auto_app, until
from textual.pilot import Pilot
from textual.widgets import Input

from localspec.options import GenerationSettings, ModelOptions
from localspec.tui import setup_screen
from localspec.tui.app import ChatApp
from localspec.tui.models import BackendStatus, PairEntry

SIZE = (130, 40)


def chat_app(tmp_path: Path) -> ChatApp:
    clock = TickClock()
    return ChatApp(
        options=ModelOptions(target="/fake/target", draft="/fake/draft", draft_method="model"),
        settings=GenerationSettings(seed=0, k=4),
        loader=fake_loader(FakeBackend(scripted(REPLY)), FakeBackend(scripted(REPLY, wrong_every=4)), clock),
        clock=clock,
        save_dir=tmp_path,
    )


async def chat_once(pilot: Pilot) -> None:
    app: ChatApp = pilot.app  # type: ignore[assignment]
    await until(pilot, lambda: app.pipeline is not None)
    app.chat.query_one("#prompt", Input).focus()
    await pilot.press(*"Show me some code", "enter")
    await app.workers.wait_for_complete()
    await until(pilot, lambda: not app.chat.generating)
    await pilot.pause()


def test_snapshot_setup_screen(snap_compare, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    entries = [
        PairEntry(
            "qwen2.5-coder-1.5b", "Qwen2.5-Coder 1.5B with the 0.5B as draft", True, "1.6 GB", "/m/t.gguf", "/m/d.gguf"
        ),
        PairEntry("llama-3.2-3b", "Llama 3.2 3B with the 1B as draft", False, "2.6 GB"),
    ]
    monkeypatch.setattr(setup_screen, "catalog_entries", lambda backend: (entries, None))
    probe = lambda: [
        BackendStatus("llama", "llama.cpp", True, "CPU build (this llama-cpp-python has no GPU offload)"),
        BackendStatus("mlx", "MLX", False, "not installed: pip install 'localspec[mlx]'"),
    ]

    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: pilot.app.screen.query_one("#backends").option_count == 2)  # type: ignore[attr-defined]
        await pilot.pause()

    app = ChatApp(probe=probe, save_dir=tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_snapshot_chat_after_a_reply(snap_compare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(chat_app(tmp_path), terminal_size=SIZE, run_before=chat_once)


def test_snapshot_chat_with_token_colours(snap_compare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot) -> None:
        await chat_once(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause()

    assert snap_compare(chat_app(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_snapshot_settings(snap_compare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: pilot.app.pipeline is not None)  # type: ignore[attr-defined]
        await pilot.press("f2")
        await pilot.pause()

    assert snap_compare(chat_app(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_snapshot_auto_decoding_plainly(snap_compare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """auto found no draft that pays: the panel says what it chose and why, above a one-row histogram."""
    assert snap_compare(plain_auto_app(tmp_path), terminal_size=SIZE, run_before=chat_once)
