"""Live numbers for a reply in progress, from the engine's own running stats, and their wording."""

from __future__ import annotations

from collections import deque

from localspec.decoding.engine import Step
from localspec.decoding.stats import SpecStats


class LiveStats:
    """The latest SpecStats snapshot of a reply, plus the series behind the sparklines."""

    RATE_WINDOW = 8  # steps in the rolling tokens/s behind the sparkline
    SERIES_MAX = 240

    def __init__(self) -> None:
        self.stats: SpecStats | None = None
        self._marks: deque[tuple[float, int]] = deque(maxlen=self.RATE_WINDOW + 1)
        self.rate_series: list[float] = []
        self.length_series: list[int] = []
        self.note = ""  # the drafter's latest word on its choice (auto drafting explains itself)

    def add(self, step: Step) -> None:
        self.stats = step.stats
        if step.round is not None:
            self.note = step.round.note or self.note
            self.length_series.append(step.round.accepted_length)
            del self.length_series[: -self.SERIES_MAX]
        if not step.tokens:
            return  # a detokenizer flush: text but no tokens, not a point on the speed curve
        t, n = step.stats.decode_s, step.stats.n_generated
        self._marks.append((t, n))
        t0, n0 = self._marks[0]
        if t > t0:
            self.rate_series.append((n - n0) / (t - t0))
            del self.rate_series[: -self.SERIES_MAX]


def fmt_tps(stats: SpecStats) -> str:
    return f"{stats.decode_tps:.1f} tok/s"


def fmt_acceptance(stats: SpecStats) -> str:
    if stats.draft_method == "none":
        return "n/a (no draft)"
    if not stats.n_drafted:  # auto decoding plainly, or lookups that found nothing: a rate of 0/0 means nothing
        return "no drafts"
    return f"{stats.acceptance_rate:.1%} ({stats.n_accepted}/{stats.n_drafted})"


def fmt_choices(stats: SpecStats) -> str:
    """auto's choices: shares of rounds by draft source (`plain 70%, suffix 30%`); "" for a fixed method."""
    return stats.choices() if stats.draft_method == "auto" else ""


def fmt_accepted_length(stats: SpecStats) -> str:
    return f"{stats.mean_accepted_length:.2f} tokens/round ({stats.n_rounds} rounds)"


def reply_summary(stats: SpecStats) -> str:
    parts = [f"{stats.n_generated} tokens", fmt_tps(stats)]
    if stats.draft_method != "none":
        accepted = f"acceptance {stats.acceptance_rate:.0%}" if stats.n_drafted else "no drafts"
        parts += [accepted, f"{stats.mean_accepted_length:.2f} tokens/round"]
    if stats.n_prompt_cached:
        parts.append(f"{stats.n_prompt_cached}/{stats.n_prompt} prompt tokens cached")
    if stats.stop_reason == "stopped":
        parts.append("stopped")
    elif stats.stop_reason in ("max_tokens", "context"):
        parts.append(f"cut at {stats.stop_reason.replace('_', ' ')}")
    return " · ".join(parts)
