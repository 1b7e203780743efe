"""The chat's transcript: turns, the conversation the model sees, and the Markdown export (Ctrl+S)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from localspec.backends.base import ChatMessage
from localspec.decoding.engine import Segment
from localspec.decoding.stats import SpecStats
from localspec.tui.live import reply_summary


@dataclass
class Turn:
    """One user message and the reply to it (the reply may be partial, stopped or failed)."""

    user: str
    reply: str = ""
    segments: list[Segment] = field(default_factory=list)
    stats: SpecStats | None = None
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.stats is not None


@dataclass
class Transcript:
    system: str = ""
    turns: list[Turn] = field(default_factory=list)

    def messages(self, next_user: str | None = None) -> list[ChatMessage]:
        """The conversation as the model sees it: failed replies are left out, stopped ones kept."""
        out = [ChatMessage("system", self.system)] if self.system.strip() else []
        for turn in self.turns:
            if turn.error is not None:
                continue
            out.append(ChatMessage("user", turn.user))
            if turn.complete:
                out.append(ChatMessage("assistant", turn.reply))
        if next_user is not None:
            out.append(ChatMessage("user", next_user))
        return out

    def to_markdown(self, header: str = "") -> str:
        lines = [f"# localspec chat, {datetime.now():%Y-%m-%d %H:%M}", ""]
        if header:
            lines += [header, ""]
        if self.system.strip():
            lines += ["**System:** " + self.system, ""]
        for turn in self.turns:
            lines += [
                "## You",
                "",
                close_fences(turn.user),
                "",
                "## Assistant",
                "",
                close_fences(turn.reply) or "_(no text)_",
                "",
            ]
            if turn.stats is not None:
                lines += ["> " + reply_summary(turn.stats), ""]
            if turn.error is not None:
                lines += [f"> **error:** {turn.error}", ""]
        return "\n".join(lines)

    def save(self, directory: Path, header: str = "") -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"localspec-chat-{datetime.now():%Y%m%d-%H%M%S}.md"
        n = 1
        while path.exists():
            n += 1
            path = directory / f"localspec-chat-{datetime.now():%Y%m%d-%H%M%S}-{n}.md"
        path.write_text(self.to_markdown(header), encoding="utf-8")
        return path


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def close_fences(text: str) -> str:
    """`text` with any code fence it leaves open closed, so a cut reply cannot turn the rest of the file
    into code (CommonMark: a fence closes with the same character, at least as long, nothing after it)."""
    open_fence: str | None = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if not m:
            continue
        fence = m.group(1)
        if open_fence is None:
            open_fence = fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not line.strip()[len(fence) :].strip():
            open_fence = None
    if open_fence is None:
        return text
    return text + ("" if text.endswith("\n") else "\n") + open_fence
