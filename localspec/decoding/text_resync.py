"""Resync in text: after an edit, resume copying the source, aligned byte by byte instead of token by token.

The token-level resync (localspec.decoding.resync) compares token ids, but a tokenizer splits the same
word by what follows it: `(intervals` is one token before `)` and two, `(int` `ervals`, before `:` (Qwen2.5).
So an edit changes the tokens around it, a rename made once is not the same tokens at its next
occurrence, and a type hint inserted after a parameter leaves the source's next token merged into a new
one. Compared as bytes, the text after an edit equals the source's again at once, and an edit is the same
bytes wherever it recurs.

Where the drafter has the model's tokenizer (a TextCodec), the suffix drafter keeps its anchor in bytes:
`follow` walks the anchor over the text while it copies the source, making the edits learnt so far (a
substitution, `intervals` -> `spans`, anywhere; an insertion, `: list[int]`, where the source bytes
around it recur); at a divergence `_align` seeks the one edit (EPS new bytes for DELTA source bytes) after
which the rest of the text, to its end, copies the source with the edits made; an edit confirmed by
LEARN_MIN bytes is learnt. The draft is the source's continuation from the anchor with the edits made,
tokenized by the model's tokenizer (only where the pieces of the tokens give back the bytes exactly).

Cost per round: the walk over the round's new bytes (slices compared in C, between the positions where an
edit recurs, found with bytes.find), and at a divergence at most MAX_INS + 1 finds of one byte plus a walk
per candidate whose first byte agrees; one tokenization of the draft's bytes (a few hundred at most).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from localspec.backends.base import Backend, ByteDetokenizer, common_prefix

MAX_INS = 64  # most bytes an edit writes (a type hint with a return type is about 50)
MAX_DEL = 32  # most source bytes an edit replaces
SUB_MAX = 24  # an edit this short on both sides is a substitution made wherever its old bytes recur (a rename)
SUB_MIN = 3  # ... and at least this long on the old side (a byte or two recurs inside every other word)
LEARN_MIN = 8  # bytes after an edit that confirm it: then it is learnt and the anchor moves past it
NEEDLE = 2  # bytes after an edit looked up in the source before a candidate is walked
GUESS_MIN = 4  # bytes after an edit before a draft resumes the copy on its strength (fewer match by chance)
WINDOW = MAX_INS + 32  # bytes after a divergence within which an edit is sought; after that the anchor is dropped
CONTEXT = 8  # source bytes before an insertion (and one after) that must recur for it to be made again
KEPT_INSIDE = 4  # an edit that keeps the source bytes it replaced inside its new ones is two insertions
MAX_KEPT = 16  # substitutions, and insertions, remembered per generation
MAX_STEPS = 8  # edits confirmed in one round's new text, at most


@dataclass(frozen=True)
class TextCodec:
    """The model's tokenizer as the text resync needs it: a token's bytes, and text to tokens (no specials)."""

    piece: Callable[[int], bytes]
    encode: Callable[[str], list[int]]

    def exact(self, data: bytes) -> list[int]:
        """`data` tokenized, where the tokens' pieces give back exactly `data` (else none: a tokenizer that
        adds a space prefix, or bytes cut inside a character)."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start < len(data) - 3:
                return []
            text = data[: e.start].decode("utf-8", errors="strict")
            data = data[: e.start]
        if not text:
            return []
        tokens = self.encode(text)
        return tokens if b"".join(self.piece(t) for t in tokens) == data else []


def text_codec(backend: Backend | None) -> TextCodec | None:
    """The backend's tokenizer as a TextCodec, where its detokenizer has byte pieces (llama.cpp's always; MLX's
    for byte-level BPE); None otherwise: the suffix drafter then resyncs token by token."""
    detok = backend.detokenizer() if backend is not None else None
    if not isinstance(detok, ByteDetokenizer):
        return None
    tokenize = backend.tokenize  # type: ignore[union-attr]
    return TextCodec(detok.piece, lambda text: tokenize(text, add_special=False, parse_special=False))


class DocBytes:
    """A token document's bytes, kept in step with its tokens, and where each token starts."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.tokens: list[int] = []
        self.starts: list[int] = []
        self.data = bytearray()

    def sync(self, tokens: list[int]) -> None:
        n = common_prefix(self.tokens, tokens, limit=len(tokens)) if self.tokens else 0
        if n < len(self.tokens):
            del self.data[self.starts[n] :]
            del self.starts[n:]
            del self.tokens[n:]
        piece = self.codec.piece
        for t in tokens[n:]:
            self.starts.append(len(self.data))
            self.data += piece(t)
        self.tokens.extend(tokens[n:])

    def token_from(self, offset: int) -> int:
        """The index of the first token that starts at or after byte `offset`."""
        lo, hi = 0, len(self.starts)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.starts[mid] < offset:
                lo = mid + 1
            else:
                hi = mid
        return lo


@dataclass
class TextAnchor:
    doc: int  # the source document
    src: int  # ... byte offset in it that
    cur: int  # ... the current document's byte offset `cur` copies
    since: int  # where (in the current document's bytes) this run of copying began: after the last edit


@dataclass(frozen=True)
class TextResync:
    doc: int
    resume: int  # the source byte where the draft continues (after `pending`)
    verified: int  # bytes since the last edit that copy the source
    new: int = 0  # EPS of the edit found this round
    skipped: int = 0  # DELTA
    pending: bytes = b""  # a known edit half written: its remaining bytes come first
    inserting: bool = False  # ... an insertion made again (a guess: the draft ends with it)
    tokens: int | None = None  # how many confirming tokens it counts as (None: those after `verified` bytes)


@dataclass
class TextEdits:
    """Edits the text made to its source this generation, as bytes."""

    subs: dict[bytes, bytes] = field(default_factory=dict)  # old -> new, made wherever old recurs
    inserts: dict[bytes, bytes] = field(default_factory=dict)  # CONTEXT source bytes before, one after -> new ones
    spans: set[bytes] = field(default_factory=set)  # what confirmed edits wrote, in any context

    def learn(self, src: bytes, q: int, delta: int, new: bytes) -> None:
        """The text wrote `new` in place of src[q : q + delta]: a substitution where both are short; an insertion
        where nothing was replaced, or where what was is kept inside (`)` -> `: int) -> str`: two insertions)."""
        old = bytes(src[q : q + delta])
        if new and len(self.spans) < 4 * MAX_KEPT:
            self.spans.add(new)
        if not old:
            self._insert(src, q, new)
        elif len(old) <= KEPT_INSIDE and old in new:
            i = new.index(old)
            self._insert(src, q, new[:i])
            self._insert(src, q + delta, new[i + delta :])
        elif new and len(self.subs) < MAX_KEPT:
            # Whole words: `ow` -> `ecord` inside `rows` is `rows` -> `records`, made only where that word recurs
            # (a rename of `amount` leaves `amounts` alone).
            left, right = _word_run(src, q, -1), _word_run(src, q + delta, 1)
            whole = bytes(src[q - left : q + delta + right])
            made = bytes(src[q - left : q]) + new + bytes(src[q + delta : q + delta + right])
            if SUB_MIN <= len(whole) <= SUB_MAX and len(made) <= SUB_MAX:
                self.subs.setdefault(whole, made)

    def _insert(self, src: bytes, q: int, new: bytes) -> None:
        key = bytes(src[q - CONTEXT : q + 1])
        if new and q >= CONTEXT and len(key) == CONTEXT + 1 and len(self.inserts) < MAX_KEPT:
            self.inserts.setdefault(key, new)

    def __bool__(self) -> bool:
        return bool(self.subs or self.inserts)

    def at(self, src: bytes, q: int, extra: tuple[bytes, bytes] | None, inserted: int) -> tuple[bytes, bytes] | None:
        """The edit that applies at source byte q: (old, new); an insertion has old b"" (not again at `inserted`)."""
        best = None
        for old, new, whole in self._subs(extra):
            if (
                src.startswith(old, q)
                and (not whole or _whole(src, q, old))
                and (best is None or len(old) > len(best[0]))
            ):
                best = (old, new)
        if best is None and q != inserted and q >= CONTEXT and self.inserts:
            new = self.inserts.get(bytes(src[q - CONTEXT : q + 1]))
            if new is not None:
                best = (b"", new)
        return best

    def next_at(self, src: bytes, q: int, hi: int, extra: tuple[bytes, bytes] | None, inserted: int) -> int:
        """The first source byte in [q, hi) where an edit may apply (hi if none)."""
        nxt = hi
        for old, _, whole in self._subs(extra):
            i = src.find(old, q, min(nxt + len(old), len(src)))
            while whole and 0 <= i < nxt and not _whole(src, i, old):
                i = src.find(old, i + 1, min(nxt + len(old), len(src)))
            if 0 <= i < nxt:
                nxt = i
        for key in self.inserts:
            i = src.find(key, max(q - CONTEXT, 0), min(nxt + 1, len(src)))
            while 0 <= i and i + CONTEXT < nxt:
                x = i + CONTEXT
                if x >= q and x != inserted:
                    nxt = x
                    break
                i = src.find(key, i + 1, min(nxt + 1, len(src)))
        return nxt

    def made(self, data: bytes) -> bool:
        """Whether some learnt edit writes `data`."""
        return any(data in new for new in (*self.subs.values(), *self.inserts.values()))

    def _subs(self, extra: tuple[bytes, bytes] | None) -> Sequence[tuple[bytes, bytes, bool]]:
        """(old, new, whole words only): the learnt substitutions, and an edit being tried (anywhere)."""
        items = [(old, new, True) for old, new in self.subs.items()]
        return [*items, (*extra, False)] if extra is not None else items

    def apply(self, src: bytes, start: int, end: int, inserted: int = -1) -> bytes:
        """src[start:end] with the substitutions made, up to where an insertion may recur: whether the text makes
        it again there is a guess either way (a type hint at a signature, none at a call), so a draft ends there;
        at `start` itself the insertion is drafted (a guess as good as any) and the draft ends after it. Not at
        `inserted`: the text is already writing the insertion there (a draft's pending bytes)."""
        out = bytearray()
        q = start
        while q < end:
            nxt = self.next_at(src, q, end, None, inserted)
            out += src[q:nxt]
            q = nxt
            if q >= end:
                break
            hit = self.at(src, q, None, inserted)
            if hit is None:
                out += src[q : q + 1]
                q += 1
                continue
            old, new = hit
            if not old:
                if not out:
                    out += new  # the copy is at the insertion: it is the guess, and the draft ends after it
                break
            out += new
            q += len(old)
        return bytes(out)


@dataclass(frozen=True)
class WalkEnd:
    p: int  # where the walk stopped in the text (its end: the whole text copies the source)
    q: int  # ... and in the source
    pending: bytes = b""  # the text stopped half way through this edit's new bytes
    resume: int = -1  # the source byte after that edit
    inserting: bool = False  # ... which is an insertion


def walk(src: bytes, q: int, cur: bytes, p: int, edits: TextEdits, extra: tuple[bytes, bytes] | None = None) -> WalkEnd:
    """Follow the text from (p, q) while it copies the source with the edits made."""
    inserted = -1
    while p < len(cur) and q < len(src):
        nxt = edits.next_at(src, q, min(q + len(cur) - p, len(src)), extra, inserted)
        n = _common(cur, p, src, q, nxt - q)
        p, q = p + n, q + n
        if q < nxt or p >= len(cur) or q >= len(src):
            break  # diverged, or the text (or the source) ends
        hit = edits.at(src, q, extra, inserted)
        if hit is None:
            if not _common(cur, p, src, q, 1):
                break
            p, q = p + 1, q + 1
            continue
        old, new = hit
        seen = cur[p : p + len(new)]
        if seen == new:
            p, q = p + len(new), q + len(old)
            inserted = q if not old else -1
        elif len(seen) < len(new) and new.startswith(seen) and p + len(seen) == len(cur):
            return WalkEnd(p, q, new[len(seen) :], q + len(old), not old)
        elif _common(cur, p, src, q, 1):  # the text did not make the edit here: it copies the source
            inserted = q
            p, q = p + 1, q + 1
        else:
            break
    return WalkEnd(p, q, b"", q)


def _word_byte(b: int) -> bool:
    return b == 95 or 48 <= b <= 57 or 65 <= b <= 90 or 97 <= b <= 122 or b >= 128  # _, digits, letters, UTF-8


def _word_run(src: bytes, i: int, step: int) -> int:
    """How many word bytes run from i (step 1) or before i (step -1), at most SUB_MAX."""
    n = 0
    j = i if step > 0 else i - 1
    while 0 <= j < len(src) and _word_byte(src[j]) and n < SUB_MAX:
        n += 1
        j += step
    return n


def _whole(src: bytes, i: int, old: bytes) -> bool:
    """Whether `old` at src[i] is not part of a longer word (where its ends are word bytes)."""
    if _word_byte(old[0]) and i > 0 and _word_byte(src[i - 1]):
        return False
    end = i + len(old)
    return not (_word_byte(old[-1]) and end < len(src) and _word_byte(src[end]))


def _common(a: bytes, i: int, b: bytes, j: int, n: int) -> int:
    """Length of the common prefix of a[i:i+n] and b[j:j+n] (slices compared in C, halving)."""
    n = max(min(n, len(a) - i, len(b) - j), 0)
    if a[i : i + n] == b[j : j + n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[i : i + mid] == b[j : j + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def follow(anchor: TextAnchor, src: bytes, cur: bytes, edits: TextEdits) -> TextResync | None:
    """Bring the anchor up to the end of the text and say where the source continues from there (None: the
    text left the source, or no edit explains it yet)."""
    for _ in range(MAX_STEPS):
        w = walk(src, anchor.src, cur, anchor.cur, edits)
        anchor.cur, anchor.src = w.p, w.q
        if w.p >= len(cur) or w.pending:
            resume = w.resume if w.pending else w.q
            if resume >= len(src):
                return None
            return TextResync(anchor.doc, resume, w.p - anchor.since, pending=w.pending, inserting=w.inserting)
        tail = bytes(cur[w.p :])
        if tail in edits.spans and w.q < len(src):
            # What an edit of this answer wrote before, complete: the copy resumes at once.
            return TextResync(anchor.doc, w.q, 1, len(tail), 0, tokens=1)
        found = _align(anchor, src, cur, edits)
        if found is None:
            return None
        eps, delta, end = found
        v = len(cur) - (anchor.cur + eps)
        if v < GUESS_MIN:
            return None
        if v < LEARN_MIN:
            resume = end.resume if end.pending else end.q
            if resume >= len(src):
                return None
            return TextResync(anchor.doc, resume, v, eps, delta, end.pending, inserting=end.inserting)
        p, q = anchor.cur, anchor.src
        edits.learn(src, q, delta, bytes(cur[p : p + eps]))
        anchor.cur, anchor.src = p + eps, q + delta
        anchor.since = anchor.cur
    return None


def _align(anchor: TextAnchor, src: bytes, cur: bytes, edits: TextEdits) -> tuple[int, int, WalkEnd] | None:
    """The edit at the anchor's divergence after which the rest of the text copies the source: the fewest new
    bytes (the longest confirmation), then the skipped length closest to the new one."""
    p, q = anchor.cur, anchor.src
    top = min(q + MAX_DEL + len(cur) - p, len(src))
    last = bytes(cur[-NEEDLE:])
    if src.find(last, q, top) < 0 and cur.find(last, p, len(cur) - NEEDLE) < 0 and not edits.made(last):
        return None  # the text's last bytes are nowhere in the source in reach, nor in an edit: it left the source
    for eps in range(min(MAX_INS, len(cur) - p - GUESS_MIN) + 1):  # GUESS_MIN bytes after the edit confirm it
        # Where the source holds the two bytes that follow the edit (finds in C, not a walk per byte; not all
        # GUESS_MIN of them: the edit itself may recur right after, `spans(sp` for `intervals(in`).
        needle = bytes(cur[p + eps : p + eps + NEEDLE])
        fits: list[tuple[int, WalkEnd]] = []
        d = src.find(needle, q, min(q + MAX_DEL + NEEDLE, len(src)))
        while d >= 0:
            delta = d - q
            if src is cur and d >= p + eps:
                break  # the text's own bytes after the edit are no source for themselves
            if eps or delta:
                extra = (bytes(src[q:d]), bytes(cur[p : p + eps])) if eps and delta else None
                end = walk(src, d, cur, p + eps, edits, extra)
                if end.p >= len(cur) or end.pending:
                    fits.append((delta, end))
            d = src.find(needle, d + 1, min(q + MAX_DEL + NEEDLE, len(src)))
        if fits:
            delta, end = min(fits, key=lambda f: (abs(f[0] - eps), f[0]))
            return eps, delta, end
    return None
