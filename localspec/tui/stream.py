"""From the engine thread to the screen: a buffer the UI drains in batches, and the pace of redraws.

While a reply streams, the transcript and stats redraw at most every RENDER_MIN_INTERVAL, and less often
when drawing is expensive: the UI thread may use about UI_CPU_BUDGET of one core, so a slow terminal or
CPU-bound machine gets fewer, larger updates instead of a slower model (benchmarks/tui_overhead.py).
"""

from __future__ import annotations

import threading
import time
from typing import Generic, TypeVar

RENDER_MIN_INTERVAL = 0.1
RENDER_MAX_INTERVAL = 1.0
UI_CPU_BUDGET = 0.02
PANEL_INTERVAL = 1.0  # the live stats panel (sparklines, bars) redraws at most this often

T = TypeVar("T")


class StreamBuffer(Generic[T]):
    """Items from a producer thread, drained in batches by the UI.

    `push` returns True only when the consumer has not been told about pending items yet, so the
    producer posts at most one wake-up message however fast it runs; `drain` takes everything.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._told = False

    def push(self, item: T) -> bool:
        with self._lock:
            self._items.append(item)
            if self._told:
                return False
            self._told = True
            return True

    def drain(self) -> list[T]:
        with self._lock:
            items, self._items = self._items, []
            self._told = False
            return items


class RenderPacer:
    """When the next redraw may happen, from the UI thread's own CPU time spent drawing."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.last = 0.0
        self.gap = RENDER_MIN_INTERVAL
        self._cpu_mark = time.thread_time()
        self._last_panel = 0.0

    def wait(self) -> float:
        """Seconds until a redraw is due (<= 0: now)."""
        return self.last + self.gap - time.monotonic()

    def rendered(self) -> bool:
        """Record a redraw starting now; True when the stats panel is due as well."""
        self.last = time.monotonic()
        cpu = time.thread_time()  # this (UI) thread's CPU since the last redraw, drawing included
        self.gap = min(max((cpu - self._cpu_mark) / UI_CPU_BUDGET, RENDER_MIN_INTERVAL), RENDER_MAX_INTERVAL)
        self._cpu_mark = cpu
        if self.last - self._last_panel >= PANEL_INTERVAL:
            self._last_panel = self.last
            return True
        return False
