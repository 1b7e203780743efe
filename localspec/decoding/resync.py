"""Resync: after an edit, resume copying the source the text was copying right before it.

A suffix match collapses at an edit (a renamed identifier, a short insertion): for a few tokens the
text's suffix matches nothing, or only short common pieces elsewhere, although the text very likely
goes on copying its source right after the edit. So the suffix drafter keeps an alignment with the
source of its last long match (an anchor: current position `cur` copies source position `src`) and
walks it forward while the two agree. Where they diverge it tries small edits: ε new tokens in place
of δ source tokens (ε <= MAX_NEW, δ <= MAX_EDIT). An edit holds when the context tokens after it (its
verified tail, v tokens) equal the source there; the longest verified tail wins (then the edit whose
lengths are closest). An edit verified by LEARN_MIN tokens moves the anchor past it, and a substitution (a
rename) is remembered for the rest of the generation (Edits): the walk steps over it, and drafts copied
from a source get it applied, so a rename does not collapse the match at every later occurrence. An
insertion (a type hint after a parameter) is remembered with the source token on each side as its
context, and made again only between those two tokens; what it wrote is remembered on its own too, so
that where the text writes the same span again after leaving its source (`: str` at the next parameter),
the copy resumes the moment the span is complete, as sure as one confirming token would make it. The
draft is the source's continuation from the anchor. With nothing verified (v = 0) one guess is made:
right after the first differing token, that it replaced one source token.

Cost per round: the anchor's walk over the tokens added since the last round (each step checks at most
MAX_KEPT remembered edits), plus at most (MAX_NEW + 1)(MAX_EDIT + 1) comparisons of at most VERIFY tokens
per edit found and one set lookup; state: one anchor, at most MAX_KEPT edits of at most MAX_NEW tokens a side
and MAX_SPANS inserted spans. An edit still
unconfirmed WINDOW tokens after a divergence drops the anchor (a plain match has had room to form).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_EDIT = 6  # most source tokens an edit replaces (δ)
# Most tokens an edit writes (ε): a type hint with a return type is about 6, but BPE merges its last token with
# the source's next (`]]:\n` for `):\n`), which makes it a replacement of ~8 tokens for one.
MAX_NEW = 12
WINDOW = 16  # tokens after a divergence within which an edit is sought
VERIFY = 6  # tokens after an edit compared with the source (enough to confirm it)
LEARN_MIN = 2  # an edit confirmed by this many tokens moves the anchor past it (a rename is remembered)
ANCHOR_MIN = 6  # a suffix match at least this long (re)sets the anchor
MAX_KEPT = 8  # substitutions remembered per generation
MAX_SPANS = 16  # inserted spans remembered per generation


@dataclass
class Anchor:
    doc: int  # the source document
    src: int  # ... position in it that
    cur: int  # ... the current document's position `cur` copies
    since: int  # where (in the current document) this run of copying began: after the last edit


@dataclass(frozen=True)
class Resync:
    doc: int
    start: int  # where the source's continuation starts
    verified: int  # context tokens since the edit that equal the source (v)
    new: int = 0  # ε
    skipped: int = 0  # δ
    pending: tuple[int, ...] = ()  # a known substitution half written: its remaining new tokens come first


class Edits:
    """Substitutions the text made to its source this generation (a rename: old tokens -> new ones)."""

    def __init__(self) -> None:
        self.subs: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.spans: set[tuple[int, ...]] = set()  # what confirmed insertions wrote (`: str`), in any context

    def inserted(self, new: Sequence[int]) -> None:
        if new and len(self.spans) < MAX_SPANS:
            self.spans.add(tuple(new))

    def learn(self, old: Sequence[int], new: Sequence[int]) -> None:
        if old and new and tuple(old) != tuple(new) and len(self.subs) < MAX_KEPT:
            self.subs.setdefault(tuple(old), tuple(new))

    def at(self, src: Sequence[int], j: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The substitution whose old tokens start at src[j], if any (the longest)."""
        best = None
        for old, new in self.subs.items():
            if tuple(src[j : j + len(old)]) == old and (best is None or len(old) > len(best[0])):
                best = (old, new)
        return best

    def apply(self, tokens: Sequence[int]) -> list[int]:
        """`tokens` (copied from a source) with the known substitutions made."""
        if not self.subs:
            return list(tokens)
        out: list[int] = []
        i = 0
        while i < len(tokens):
            hit = self.at(tokens, i)
            if hit is not None and i + len(hit[0]) <= len(tokens):
                out += hit[1]
                i += len(hit[0])
            else:
                out.append(tokens[i])
                i += 1
        return out


def follow(anchor: Anchor, src: Sequence[int], cur: Sequence[int], edits: Edits) -> Resync | None:
    """Bring the anchor up to the end of the current text and say where the source continues from there
    (None: the text left the source, or no edit explains it yet)."""
    for _ in range(MAX_EDIT):  # confirmed edits in this round's new tokens, a few at most
        _advance(anchor, src, cur, edits)
        tail = len(cur) - anchor.cur
        if tail == 0:
            v = anchor.cur - anchor.since
            return Resync(anchor.doc, anchor.src, v) if anchor.src < len(src) else None
        r = _known(anchor, src, cur, edits) or _align(anchor, src, cur)
        if (r is None or not r.verified) and tuple(cur[anchor.cur :]) in edits.spans and anchor.src < len(src):
            # The text since the divergence is what an insertion of this answer wrote before: it ends here, and
            # the copy resumes at once (as sure as one confirming token would make it).
            return Resync(anchor.doc, anchor.src, 1, tail, 0)
        if r is None or r.pending or r.verified < LEARN_MIN:
            return r if tail <= WINDOW else None
        if r.new and r.skipped:
            if r.new <= MAX_EDIT:  # a rename; a longer replacement (a merged type hint) is not made again
                edits.learn(src[anchor.src : anchor.src + r.skipped], cur[anchor.cur : anchor.cur + r.new])
        elif r.new:
            edits.inserted(cur[anchor.cur : anchor.cur + r.new])
            if anchor.src > 0 and anchor.cur > 0 and cur[anchor.cur - 1] == src[anchor.src - 1]:
                # An insertion after a copied token: kept with the source tokens on both sides as context.
                a, b = src[anchor.src - 1], src[anchor.src]
                edits.learn((a, b), (a, *cur[anchor.cur : anchor.cur + r.new], b))
        anchor.cur += r.new
        anchor.src += r.skipped
        anchor.since = anchor.cur
    return None


def _advance(anchor: Anchor, src: Sequence[int], cur: Sequence[int], edits: Edits) -> None:
    """Walk the anchor over the tokens where the current text copies the source (known substitutions made)."""
    while anchor.cur < len(cur) and anchor.src < len(src):
        hit = edits.at(src, anchor.src)
        if hit is not None:
            seen = tuple(cur[anchor.cur : anchor.cur + len(hit[1])])
            if seen == hit[1]:
                anchor.cur += len(hit[1])
                anchor.src += len(hit[0])
                continue
            if len(seen) < len(hit[1]) and seen == hit[1][: len(seen)]:
                return  # the text is half way through it: _known drafts the rest
        if cur[anchor.cur] != src[anchor.src]:
            return
        anchor.cur += 1
        anchor.src += 1


def _known(anchor: Anchor, src: Sequence[int], cur: Sequence[int], edits: Edits) -> Resync | None:
    """The text has begun a known substitution at the anchor: the rest of it, then the source."""
    p, q = anchor.cur, anchor.src
    hit = edits.at(src, q)
    tail = tuple(cur[p:])
    if hit is None or hit[1][: len(tail)] != tail or q + len(hit[0]) >= len(src):
        return None
    return Resync(anchor.doc, q + len(hit[0]), p - anchor.since, len(hit[1]), len(hit[0]), hit[1][len(tail) :])


def _align(anchor: Anchor, src: Sequence[int], cur: Sequence[int]) -> Resync | None:
    """The best edit at the anchor's divergence that the text after it confirms."""
    p, q = anchor.cur, anchor.src
    tail = len(cur) - p
    for new in range(min(MAX_NEW, tail) + 1):  # fewest new tokens first: the longest verified tail
        v = tail - new
        if v == 0 and tail > 1:
            break  # unconfirmed: guessed only right after the first differing token (a one-token rename)
        w = min(v, VERIFY)
        fits = [d for d in range(MAX_EDIT + 1) if (new or d) and _agrees(cur, p + new, src, q + d, w)]
        if fits:
            skipped = min(fits, key=lambda d: (abs(d - new), d))
            return Resync(anchor.doc, q + skipped + v, v, new, skipped)
    return None


def _agrees(cur: Sequence[int], i: int, src: Sequence[int], j: int, n: int) -> bool:
    if j + n >= len(src):  # no continuation left to draft after it
        return False
    return all(cur[i + t] == src[j + t] for t in range(n))
