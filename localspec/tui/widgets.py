"""Widgets: transcript messages (Markdown, or text coloured by token origin) and the stats panel."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Sparkline, Static

from localspec.decoding.engine import Segment
from localspec.decoding.stats import SpecStats
from localspec.report import advice
from localspec.tui.live import fmt_acceptance, fmt_accepted_length, fmt_choices, fmt_tps, reply_summary

DRAFT_STYLE = "bold #5fd787"  # accepted draft token: the friend got it right
TARGET_STYLE = "#87afff"  # the target chose the token itself (first, recovered or bonus)
ORIGIN_STYLES = {"draft": DRAFT_STYLE, "target": TARGET_STYLE}
OPTIONAL_LINES = ("#stat-choices", "#stat-advice")  # lines only some replies have: hidden when empty
HISTOGRAM_ROWS = 8  # more distinct accepted lengths than this: grouped on a doubling scale (1, 2, 3-4, 5-8, ...)


def legend() -> Text:
    return Text.assemble(("■ ", DRAFT_STYLE), "accepted draft token   ", ("■ ", TARGET_STYLE), "token from the target")


def coloured(segments: Sequence[Segment]) -> Text:
    text = Text()
    for s, origin in segments:
        text.append(s, ORIGIN_STYLES[origin])
    return text


def bar(fraction: float, width: int) -> str:
    fraction = min(max(fraction, 0.0), 1.0)
    full = int(round(fraction * width))
    return "█" * full + "░" * (width - full)


def length_rows(lengths: Sequence[int]) -> list[tuple[str, int]]:
    """(label, rounds) for the accepted lengths that occur, shortest first; on a doubling scale when there
    are more than HISTOGRAM_ROWS of them (k goes up to 64: a row per possible length would fill the panel)."""
    counts = Counter(lengths)
    if len(counts) <= HISTOGRAM_ROWS:
        return [(str(n), counts[n]) for n in sorted(counts)]
    groups = Counter(length_group(n) for n in lengths)
    return [(f"{lo}" if lo == hi else f"{lo}-{hi}", groups[lo, hi]) for lo, hi in sorted(groups)]


def length_group(n: int) -> tuple[int, int]:
    """The doubling-scale group of an accepted length: 1, 2, 3-4, 5-8, 9-16, ..."""
    hi = 1 << (n - 1).bit_length()  # the power of two at or above n
    return (hi // 2 + 1, hi) if hi > 2 else (n, n)


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Text(text), classes="user-message", markup=False)
        self.border_title = "You"


class ReplyMessage(Vertical):
    """The assistant's reply: streamed as Markdown, or as plain text coloured by token origin."""

    def __init__(self, *, colour: bool) -> None:
        super().__init__(classes="reply")
        self.border_title = "Assistant"
        self.text = ""
        self.segments: list[Segment] = []
        self.colour = colour
        self._pending = ""  # text not yet handed to the Markdown widget

    def compose(self) -> ComposeResult:
        yield Markdown("", classes="reply-markdown")
        yield Static("", classes="reply-tokens", markup=False)
        yield Static("…", classes="reply-stats", markup=False)

    def on_mount(self) -> None:
        self.set_class(self.colour, "-colour")

    async def add(self, segments: Sequence[Segment]) -> None:
        new = "".join(s for s, _ in segments)
        if not new:
            return
        self.text += new
        self.segments += segments
        if self.colour:
            self._pending += new
            self.query_one(".reply-tokens", Static).update(coloured(self.segments))
        else:
            await self._flush_markdown(new)

    async def _flush_markdown(self, new: str = "") -> None:
        fragment, self._pending = self._pending + new, ""
        if fragment:
            await self.query_one(".reply-markdown", Markdown).append(fragment)

    async def set_colour(self, on: bool) -> None:
        self.colour = on
        self.set_class(on, "-colour")
        if on:
            self.query_one(".reply-tokens", Static).update(coloured(self.segments))
        else:
            await self._flush_markdown()

    def finish(self, stats: SpecStats) -> None:
        self.query_one(".reply-stats", Static).update(reply_summary(stats))
        self.set_class(stats.stop_reason == "stopped", "-stopped")

    def fail(self, error: str) -> None:
        self.add_class("-error")
        self.query_one(".reply-stats", Static).update(Text("error: " + error, style="bold red"))


class Transcript(VerticalScroll):
    """The conversation; follows the newest text unless the user scrolled up to read."""

    def follow(self) -> None:
        if self.max_scroll_y - self.scroll_y <= 3:
            self.scroll_end(animate=False, immediate=False)


class StatsPanel(Vertical):
    """Decode speed, acceptance, accepted length, per-position acceptance and time shares for one reply,
    live while it generates and final after (the final numbers are the engine's SpecStats)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.stats: SpecStats | None = None
        self.live = False
        self._shown: dict[str, str] = {}  # each line's content as last put (markup)

    def compose(self) -> ComposeResult:
        yield Static("No reply yet", id="stats-title", markup=False)
        yield Static("decode –", id="stat-tps", markup=False)
        yield Sparkline([], id="spark-tps")
        yield Static("acceptance –", id="stat-acceptance", markup=False)
        yield Static("", id="stat-choices", markup=False)
        yield Static("accepted length –", id="stat-length", markup=False)
        yield Sparkline([], id="spark-length")
        yield Static("", id="stat-advice", markup=False)  # above the details: why the numbers look so
        yield Static("", id="stat-histogram", markup=False)
        yield Static("", id="stat-positions", markup=False)
        yield Static("", id="stat-shares", markup=False)
        yield Static("", id="stat-run", markup=False)

    def on_mount(self) -> None:
        for name in OPTIONAL_LINES:
            self.query_one(name, Static).display = False

    def show(
        self, stats: SpecStats, *, live: bool, rates: Sequence[float] = (), lengths: Sequence[int] = (), note: str = ""
    ) -> None:
        self.stats, self.live = stats, live
        put = self._put
        put("#stats-title", "This reply (live)" if live else "Last reply")
        put("#stat-tps", Text.assemble(("decode ", "dim"), (fmt_tps(stats), "bold")))
        if rates:
            self.query_one("#spark-tps", Sparkline).data = list(rates)
        put("#stat-acceptance", Text.assemble(("acceptance ", "dim"), (fmt_acceptance(stats), "bold")))
        choices = fmt_choices(stats)
        put("#stat-choices", Text.assemble(("auto chose ", "dim"), (choices, "bold")) if choices else "")
        put("#stat-length", Text.assemble(("accepted length ", "dim"), (fmt_accepted_length(stats), "bold")))
        if lengths:
            self.query_one("#spark-length", Sparkline).data = [float(x) for x in lengths]
        put("#stat-histogram", self._histogram(lengths) if lengths else "")
        put("#stat-positions", self._positions(stats))
        put("#stat-shares", self._shares(stats))
        tip = advice(stats)  # below ~2 tokens per round: a better draft, not a larger k
        put("#stat-advice", Text("⚠ " + tip) if tip else "")
        run = self._run_line(stats, live)
        if note:
            run.append(f"\ndrafter: {note}")
        put("#stat-run", run)

    def _put(self, name: str, content: Text | str) -> None:
        """Update a line only when its content changed (each update lays the panel out again); a line that
        only some replies have (auto's choices, advice) shows only when it has content."""
        key = content.markup if isinstance(content, Text) else content
        if self._shown.get(name) == key:
            return
        self._shown[name] = key
        line = self.query_one(name, Static)
        line.update(content)
        if name in OPTIONAL_LINES:
            line.display = bool(key)

    def clear(self, title: str = "No reply yet") -> None:
        self.stats, self.live = None, False
        put = self._put
        put("#stats-title", title)
        for name in (
            "#stat-choices",
            "#stat-histogram",
            "#stat-positions",
            "#stat-shares",
            "#stat-advice",
            "#stat-run",
        ):
            put(name, "")
        put("#stat-tps", "decode –")
        put("#stat-acceptance", "acceptance –")
        put("#stat-length", "accepted length –")
        self.query_one("#spark-tps", Sparkline).data = []
        self.query_one("#spark-length", Sparkline).data = []

    @staticmethod
    def _histogram(lengths: Sequence[int]) -> Text:
        rows = length_rows(lengths)
        top = max((c for _, c in rows), default=1)
        width = max([2, *(len(label) for label, _ in rows)])  # as wide as the positions below, or the widest group
        text = Text("accepted length per round\n", style="dim")
        for label, c in rows:
            text.append(f"{label:>{width}} {bar(c / top, 14)} {c}\n")
        return text

    @staticmethod
    def _positions(stats: SpecStats) -> Text:
        if not stats.acceptance_by_position:
            return Text("")
        text = Text("acceptance by draft position\n", style="dim")
        for i, a in enumerate(stats.acceptance_by_position, 1):
            text.append(f"{i:>2} {bar(a, 14)} {a:4.0%}\n")
        return text

    @staticmethod
    def _shares(stats: SpecStats) -> Text:
        busy = stats.draft_s + stats.verify_s
        if busy <= 0:
            return Text("")
        d = stats.draft_s / busy
        return Text.assemble(
            ("time  ", "dim"),
            ("draft ", DRAFT_STYLE),
            f"{d:.0%}  ",
            ("verify ", TARGET_STYLE),
            f"{1 - d:.0%}\n",
            (bar(d, 20), DRAFT_STYLE),
        )

    @staticmethod
    def _run_line(stats: SpecStats, live: bool) -> Text:
        text = Text(style="dim")
        text.append(f"{stats.n_generated} tokens in {stats.decode_s:.2f} s")
        if not live:
            text.append(f" · stop: {(stats.stop_reason or 'running').replace('_', ' ')}")
            text.append(
                f"\nprompt {stats.prompt_tps:.0f} tok/s ({stats.n_prompt} tokens, {stats.n_prompt_cached} cached)"
            )
            text.append(f"\nrule {stats.rule} · k={stats.num_draft} · seed {stats.seed}")
        return text
