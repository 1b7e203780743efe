"""Stop strings over a streamed text: text goes out only once it cannot be the start of a stop string,
so a client never sees part of one (a stop string may span tokens and rounds)."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed text as it is generated; get back what is safe to send. `hit` once a stop string appeared:
    everything from it on is dropped."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.held = ""  # the tail that may still grow into a stop string
        self.hit = False
        self.matched: str | None = None  # the stop string that ended the text (Anthropic's stop_sequence)
        self.sent: list[str] = []

    def feed(self, text: str) -> str:
        if self.hit or not text:
            return ""
        if not self.stops:
            return self._send(text)
        buf = self.held + text
        found = [(i, s) for i, s in ((buf.find(s), s) for s in self.stops) if i >= 0]
        if found:
            at, self.matched = min(found, key=lambda f: f[0])
            self.hit, self.held = True, ""
            return self._send(buf[:at])
        keep = self._partial_tail(buf)
        self.held = buf[len(buf) - keep :]
        return self._send(buf[: len(buf) - keep])

    def flush(self) -> str:
        """At the end of the generation: the held tail never became a stop string, so it goes out."""
        out, self.held = ("" if self.hit else self.held), ""
        return self._send(out)

    @property
    def text(self) -> str:
        return "".join(self.sent)

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest tail of `buf` that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best

    def _send(self, text: str) -> str:
        if text:
            self.sent.append(text)
        return text
