"""Resync: after an edit, resume copying the source the text was copying right before it.

A suffix match collapses at an edit (a renamed identifier, a short insertion): for a few tokens the
text's suffix matches nothing, or only short common pieces elsewhere, although the text very likely
goes on copying its source right after the edit. So the suffix drafter remembers where its last long
match came from, as an alignment (an anchor: current position c copies source position e), walks it
forward while the two agree, and where they diverged tries small edits: ε new tokens in place of δ
source tokens (ε, δ <= MAX_EDIT). A hypothesis holds when the context tokens after the edit (its
verified tail, v tokens) equal the source there; the longest verified tail wins (then the edit whose
lengths are closest), and the draft is the source's continuation after it. With nothing verified
(v = 0) only one guess is made: right after the first differing token, that it replaced one source token.

Cost per round: the anchor's walk over the tokens added since the last round, plus at most
(MAX_EDIT + 1)**2 comparisons of at most WINDOW tokens; one anchor of state. Past WINDOW tokens after the
divergence the anchor is dropped (by then a plain suffix match has had room to form).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_EDIT = 4  # most tokens an edit inserts (ε) or replaces (δ)
WINDOW = 12  # tokens after a divergence within which a resync is tried
ANCHOR_MIN = 6  # a suffix match at least this long (re)sets the anchor


@dataclass
class Anchor:
    doc: int  # the source document
    src: int  # ... position in it that
    cur: int  # ... the current document's position `cur` copies


@dataclass(frozen=True)
class Resync:
    doc: int
    start: int  # where the source's continuation starts
    verified: int  # context tokens after the edit that equal the source (v)
    new: int  # ε
    skipped: int  # δ


def advance(anchor: Anchor, src: Sequence[int], cur: Sequence[int]) -> None:
    """Walk the anchor forward over the tokens where the current text still copies the source."""
    while anchor.cur < len(cur) and anchor.src < len(src) and cur[anchor.cur] == src[anchor.src]:
        anchor.cur += 1
        anchor.src += 1


def align(anchor: Anchor, src: Sequence[int], cur: Sequence[int]) -> Resync | None:
    """The best edit at the anchor's divergence that the text after it confirms (None: no edit fits,
    the text has not diverged, or it diverged more than WINDOW tokens ago)."""
    p, q = anchor.cur, anchor.src
    tail = len(cur) - p
    if tail <= 0 or tail > WINDOW:
        return None
    for new in range(min(MAX_EDIT, tail) + 1):  # fewest new tokens first: the longest verified tail
        v = tail - new
        if v == 0 and tail > 1:
            break  # unconfirmed: guessed only right after the first differing token (a one-token rename)
        fits = [d for d in range(MAX_EDIT + 1) if (new or d) and _agrees(cur, p + new, src, q + d, v)]
        if fits:
            skipped = min(fits, key=lambda d: (abs(d - new), d))
            return Resync(anchor.doc, q + skipped + v, v, new, skipped)
    return None


def _agrees(cur: Sequence[int], i: int, src: Sequence[int], j: int, n: int) -> bool:
    if j + n >= len(src):  # no continuation left to draft after it
        return False
    return all(cur[i + t] == src[j + t] for t in range(n))
