"""huggingface_hub's tqdm-style progress for one file, turned into ProgressEvents."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from localspec.hub.types import ProgressEvent, ProgressFn, PullCancelled


class Tracker:
    """Turns huggingface_hub's tqdm-style updates for one file into ProgressEvents."""

    MIN_INTERVAL = 0.1  # seconds between events (the final one always goes out)
    WINDOW = 5.0  # seconds of history for the speed

    def __init__(
        self,
        file: str,
        repo: str,
        role: str,
        total: int | None,
        emit: ProgressFn | None,
        cancel: threading.Event | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.file, self.repo, self.role = file, repo, role
        self.total = total
        self.done = 0
        self.transferred = 0  # bytes received from the network by this pull
        self.emit = emit
        self.cancel = cancel
        self.clock = clock
        self.start = clock()
        self.samples: deque[tuple[float, int]] = deque([(self.start, 0)])
        self.last_emit = 0.0
        self.lock = threading.Lock()  # hf_xet reports from its own threads

    def bar_class(self) -> type:
        tracker = self

        class _Bar:
            """The tqdm subset huggingface_hub uses (http_get and the hf_xet reporter)."""

            def __init__(self, *args: Any, total: int | None = None, initial: int = 0, **kwargs: Any) -> None:
                self.n = initial
                if total:
                    tracker.total = total
                if initial:
                    tracker.update(initial, network=False)

            @property
            def total(self) -> int | None:
                return tracker.total

            @total.setter
            def total(self, value: int | None) -> None:
                if value:
                    tracker.total = value

            def update(self, n: int | float | None = 1) -> None:
                self.n += int(n or 0)
                tracker.update(int(n or 0), network=False)

            def update_transfer(self, n: int | float | None = 1) -> None:
                tracker.transferred += int(n or 0)

            def __enter__(self) -> _Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def close(self) -> None:
                return None

            def __getattr__(self, name: str) -> Callable[..., None]:
                if name.startswith("__"):
                    raise AttributeError(name)
                return lambda *a, **k: None  # set_postfix_str, refresh, set_description, ...

        return _Bar

    def update(self, n: int, *, network: bool) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise PullCancelled("download cancelled", "run the same pull again to continue; finished files are kept")
        with self.lock:
            self.done = max(0, self.done + n)
            now = self.clock()
            self.samples.append((now, self.done))
            while len(self.samples) > 2 and now - self.samples[0][0] > self.WINDOW:
                self.samples.popleft()
            if now - self.last_emit < self.MIN_INTERVAL:
                return
            self.last_emit = now
            ev = self._event(done=False)
        if self.emit:
            self.emit(ev)

    def finish(self, size: int) -> None:
        self.total = size
        self.done = size
        if self.transferred == 0:
            self.transferred = size  # a tqdm_class without update_transfer calls (older huggingface_hub)
        if self.emit:
            self.emit(self._event(done=True))

    def speed(self) -> float | None:
        t0, b0 = self.samples[0]
        t1, b1 = self.samples[-1]
        if t1 - t0 <= 0:
            return None
        return max(0.0, (b1 - b0) / (t1 - t0))

    def _event(self, *, done: bool) -> ProgressEvent:
        speed = self.speed() if not done else _avg(self.done, self.clock() - self.start)
        eta = None
        if not done and speed and self.total:
            eta = max(0.0, (self.total - self.done) / speed)
        return ProgressEvent(
            self.file,
            self.repo,
            self.role,
            self.done,
            self.total,
            speed,
            0.0 if done else eta,
            done,
            elapsed=self.clock() - self.start,
        )


def _avg(n: int, seconds: float) -> float | None:
    return n / seconds if seconds > 0 else None
