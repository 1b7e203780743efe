"""Suffix drafts: copy what followed the longest earlier occurrence of the text's current suffix.

After SuffixDecoding (Oliaro et al., arXiv 2411.04975; vLLM's `suffix` method). One SuffixIndex lives
as long as the drafter (the pipeline: chat turns, bench sessions, server requests), so it holds the
current prompt and generation and every earlier prompt and output of the session. A round:

1. match: the current text's longest suffix (up to MAX_MATCH tokens) that occurred before. Keys of
   KEY_LENGTHS tokens lead to candidate positions (the long key first, so a long copy is never lost
   among the many occurrences of a common pair); each candidate's match is extended backwards.
2. draft: among the occurrences of that longest match, follow the most frequent next token step by
   step (the others drop out); stop when the draft's empirical probability (the product of each
   step's share) falls below MIN_PROB, or at `limit` tokens, which grows with the match length.
3. resync (localspec.decoding.resync): right after an edit (the match shorter than ANCHOR_MIN), the copy
   the last long match followed is resumed after the edit when the text since confirms it; a confirmed
   rename is remembered for the generation and made in later drafts. Such drafts carry Draft.order
   RESYNC + the tokens copied since the edit (their own acceptance buckets in the policy and the gate,
   until policy.RESUMED tokens confirm the copy: from then on it counts as a plain match that long).
   With the model's tokenizer (`codec`), this is done in bytes (localspec.decoding.text_resync), where an
   edit is the same wherever it recurs, whatever the tokenizer made of the text around it.

Across sessions (localspec.decoding.suffix_memory): with a memory, `prepare` first adds the stored
texts that share text with the prompt (up to half of `max_tokens`) as earlier documents, and claims the
generation, whose prompt and answer the pipeline stores when it ends. A repeated task drafts from its
first round.

Memory is bounded: at most `max_tokens` tokens are kept (the oldest documents go first; the
current one always stays), each indexed once per key length, at most MAX_CANDIDATES positions per
key. Cost per round: indexing the new tokens (len(KEY_LENGTHS) dict updates per token) plus at most
MAX_CANDIDATES backward comparisons of at most MAX_MATCH tokens and `limit` counting steps over the
surviving candidates. benchmarks/suffix_cost.py measures it in CPython on a 65k-token session: a
median of about 0.15 ms per round with 32-token drafts (under 1% of a 1.5B target's 30-40 ms token on
a CPU); evicting an old document costs about 15 us per token of it, once. Resync adds one anchor and at
most MAX_KEPT renames of state, a walk over the round's new tokens and at most (MAX_NEW + 1)(MAX_EDIT + 1)
comparisons of at most VERIFY tokens per edit found (localspec.decoding.resync).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.backends.base import common_prefix
from localspec.decoding.drafters import Stateless
from localspec.decoding.policy import NGRAM_PRIOR, RESYNC, Acceptance, match_bucket
from localspec.decoding.resync import ANCHOR_MIN, WINDOW, Anchor, Edits, Resync, follow
from localspec.decoding.stats import RoundStats
from localspec.decoding.suffix_memory import SuffixMemory
from localspec.decoding.text_resync import WINDOW as TEXT_WINDOW
from localspec.decoding.text_resync import DocBytes, TextAnchor, TextCodec, TextEdits, TextResync
from localspec.decoding.text_resync import follow as follow_text
from localspec.draft import EMPTY_DRAFT, Draft
from localspec.sampling import SamplingParams

KEY_LENGTHS = (2, 8)  # index key lengths; a match shorter than the shortest is no match
MAX_MATCH = 64  # longest suffix compared
MAX_CANDIDATES = 64  # most recent positions kept per key
MIN_PROB = 0.1  # a draft stops where its empirical probability would fall below this
SPEC_FACTOR = 2  # a match of L tokens earns a draft of at most SPEC_FACTOR * L tokens
MAX_TOKENS = 1 << 16  # tokens kept in a session's index
MIN_ALPHA = 0.5  # standalone `suffix`: propose only where this match length's acceptance is at least this
SHADOWS = 8  # withheld proposals graded against the text that followed, at most this many pending
SHORT_ANCHOR_BYTES = 8  # a match shorter than ANCHOR_MIN sets a text anchor only if it occurred once, begins a line
# in both texts, and is this long
WHILE_EDITING = 4  # longest plain-match draft while an edit of a followed copy is being written (text resync)
RETOKENIZE_SLACK = 8  # a next chat turn holds the last answer re-tokenized: its last few tokens may differ

Position = tuple[int, int]  # (document id, end): a key occurrence ends at `end`; its continuation starts there


@dataclass(frozen=True)
class Match:
    length: int  # tokens of the current suffix matched (0: none)
    positions: tuple[Position, ...]  # where that longest match occurred, most recent first


class SuffixIndex:
    """Token documents (the session's earlier texts and the current one) and an index of their suffixes."""

    def __init__(self, *, max_tokens: int = MAX_TOKENS, key_lengths: Sequence[int] = KEY_LENGTHS) -> None:
        self.max_tokens = max_tokens
        self.key_lengths = tuple(sorted(set(key_lengths), reverse=True))
        self.docs: dict[int, list[int]] = {}  # insertion order = age
        self._indexed: dict[int, int] = {}  # doc id -> key occurrences ending before this are indexed
        self._keys: dict[tuple[int, ...], deque[Position]] = {}
        self._next_id = 0
        self.current = -1
        self.n_tokens = 0

    # -- documents --------------------------------------------------------------------------------

    def start(self, tokens: Sequence[int]) -> int:
        """Begin a new current document; the previous one stays in the session."""
        self.current = self._next_id
        self._next_id += 1
        self.docs[self.current] = []
        self._indexed[self.current] = 0
        self.extend(tokens)
        return self.current

    def add(self, tokens: Sequence[int]) -> int:
        """Add a finished text as an earlier document (the memory's): indexed, never the current one."""
        doc_id = self._next_id
        self._next_id += 1
        self.docs[doc_id] = [int(t) for t in tokens]
        self._indexed[doc_id] = 0
        self.n_tokens += len(tokens)
        self._index(doc_id, len(tokens) - 1)
        self._evict()
        return doc_id

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the current document and index what now has a continuation."""
        doc = self.docs[self.current]
        doc.extend(int(t) for t in tokens)
        self.n_tokens += len(tokens)
        self._index(self.current, len(doc) - 1)  # the last token has no continuation yet
        self._evict()

    def truncate(self, n: int) -> None:
        """Cut the current document to its first n tokens (its index entries beyond go too)."""
        doc = self.docs[self.current]
        if n >= len(doc):
            return
        done = self._indexed[self.current]
        for end in range(max(n, 1), done):
            self._unindex(self.current, doc, end)
        self._indexed[self.current] = min(done, n)
        self.n_tokens -= len(doc) - n
        del doc[n:]

    def _index(self, doc_id: int, upto: int) -> None:
        doc = self.docs[doc_id]
        keys = self._keys
        start = max(self._indexed[doc_id], 1)
        for m in self.key_lengths:  # each key has one length: its positions stay in order
            for end in range(max(start, m), upto + 1):
                key = tuple(doc[end - m : end])
                q = keys.get(key)
                if q is None:
                    q = keys[key] = deque(maxlen=MAX_CANDIDATES)
                q.appendleft((doc_id, end))
        self._indexed[doc_id] = max(self._indexed[doc_id], upto + 1)

    def _unindex(self, doc_id: int, doc: list[int], end: int) -> None:
        for m in self.key_lengths:
            if end >= m:
                key = tuple(doc[end - m : end])
                q = self._keys.get(key)
                if q is not None:
                    try:
                        q.remove((doc_id, end))
                    except ValueError:
                        pass  # already pushed out by newer occurrences
                    if not q:
                        del self._keys[key]

    def _evict(self) -> None:
        while self.n_tokens > self.max_tokens:
            oldest = next((d for d in self.docs if d != self.current), None)
            if oldest is None:
                return  # the current text always stays
            doc = self.docs.pop(oldest)
            for end in range(1, self._indexed.pop(oldest)):
                self._unindex(oldest, doc, end)
            self.n_tokens -= len(doc)

    @property
    def n_entries(self) -> int:
        return sum(len(q) for q in self._keys.values())

    # -- lookup -----------------------------------------------------------------------------------

    def match(self) -> Match:
        """The longest suffix of the current document that occurred earlier, and where."""
        cur = self.docs.get(self.current, [])
        for m in self.key_lengths:  # longest key first
            if len(cur) < m:
                continue
            q = self._keys.get(tuple(cur[-m:]))
            if not q:
                continue
            best, where = 0, []
            for pos, n in zip(q, self._match_lengths(cur, q, m)):
                if n > best:
                    best, where = n, [pos]
                elif n == best:
                    where.append(pos)
            if best:
                return Match(best, tuple(where))
        return Match(0, ())

    def _match_lengths(self, cur: list[int], positions: Iterable[Position], known: int) -> list[int]:
        """How far back each position's text agrees with the current document's end (`known` tokens are the key
        they share), at most MAX_MATCH. One loop without a call per position: a copy seen many times has up to
        MAX_CANDIDATES of them, every round."""
        n_cur = len(cur)
        span = min(MAX_MATCH, n_cur)
        tail = cur[n_cur - span : n_cur - known] if span > known else []  # compared in C with each position's
        out = []
        for d, end in positions:
            doc = self.docs.get(d)
            if doc is None or end >= len(doc) or (d == self.current and end >= n_cur):
                out.append(0)  # evicted, truncated, or the suffix itself
                continue
            limit = min(span, end)
            if limit > known and (
                doc[end - span : end - known] == tail if limit == span else
                doc[end - limit : end - known] == cur[n_cur - limit : n_cur - known]
            ):  # fmt: skip
                out.append(limit)  # the whole span agrees (a copy)
                continue
            n = known
            while n < limit and doc[end - 1 - n] == cur[-1 - n]:
                n += 1
            out.append(n)
        return out

    def draft(self, match: Match, limit: int, *, min_prob: float = MIN_PROB) -> list[int]:
        """Follow the most frequent continuation of the match's occurrences for at most `limit` tokens."""
        alive = [(self.docs[d], e) for d, e in match.positions if d in self.docs]
        out: list[int] = []
        prob = 1.0
        while len(out) < limit and alive:
            i = len(out)
            # One occurrence left, or all going on the same way (a copy seen several times, which the vote below
            # would take token by token): its continuation, at probability 1 from here.
            if len(alive) == 1 or _agree(alive, i, limit):
                doc, e = alive[0]
                out += doc[e + i : e + limit]
                break
            counts: dict[int, int] = {}
            n = 0
            for doc, e in alive:
                if e + i < len(doc):
                    t = doc[e + i]
                    counts[t] = counts.get(t, 0) + 1
                    n += 1
            if not n:
                break
            tok = max(counts, key=counts.__getitem__)  # ties: the first seen, i.e. the most recent occurrence
            prob *= counts[tok] / n
            if prob < min_prob:
                break
            out.append(tok)
            alive = [(doc, e) for doc, e in alive if e + i < len(doc) and doc[e + i] == tok]
        return out


def _agree(alive: list[tuple[list[int], int]], i: int, limit: int) -> bool:
    """Whether every occurrence has the same continuation from its i-th token on, all of it to `limit` (slices
    compared in C)."""
    doc, e = alive[0]
    ref = doc[e + i : e + limit]
    return len(ref) == limit - i and all(d[x + i : x + limit] == ref for d, x in alive[1:])


def _line_start(data: bytes, i: int) -> bool:
    """Whether byte i begins a line (the line's indentation before it allowed)."""
    j = i
    while j > 0 and data[j - 1] in b" \t":
        j -= 1
    return j == 0 or data[j - 1] == 10


class SuffixDrafter(Stateless):
    """The `suffix` draft method: suffix-match drafts over the session's texts (Drafter protocol).

    `prepare` starts a new current document, or continues the previous one when the new prompt
    extends it (a chat's next turn holds the last answer), so text is not indexed twice; a prompt that
    only shares a beginning with it (a regenerated answer) starts a new one and the old answer stays. Standalone, it
    proposes only where its match length has earned it: acceptance per match-length bucket, learned from
    verified drafts and, for free, by grading withheld proposals against the text that followed. Under
    `auto` the same proposals go to the cost-based policy instead (`gate=False`).
    """

    method = "suffix"
    name = "suffix"

    def __init__(
        self,
        *,
        max_tokens: int = MAX_TOKENS,
        spec_factor: int = SPEC_FACTOR,
        min_prob: float = MIN_PROB,
        gate: bool = True,
        resync: bool = True,
        memory: SuffixMemory | None = None,
        codec: TextCodec | None = None,
    ) -> None:
        self.index = SuffixIndex(max_tokens=max_tokens)
        self.memory = memory  # earlier sessions' texts (localspec.decoding.suffix_memory); None: this session only
        self._from_memory: set[str] = set()  # stored documents this index holds already (seeded or written)
        self.spec_factor = spec_factor
        self.min_prob = min_prob
        self.gate = gate
        self.resync = resync  # resume a copy after an edit (localspec.decoding.resync)
        self.accept = {b: Acceptance(p) for b, p in NGRAM_PRIOR.items()}
        self._last_bucket = 0
        self._shadows: list[tuple[list[int], int, int]] = []  # (proposal, bucket, context length then)
        self._anchor: Anchor | None = None  # where the last long match copied from (resync)
        self._edits = Edits()  # substitutions this generation made to what it copies
        # With the model's tokenizer, resync aligns bytes instead (localspec.decoding.text_resync).
        self.codec = codec
        self._views: dict[int, DocBytes] = {}  # documents' bytes, by id
        # Where the text copies from (newest last); a diverged one stays beside a newer one until it resumes or
        # falls WINDOW behind: an edit's own text may match elsewhere (a second `List[int]`) before it ends.
        self._text_anchors: list[TextAnchor] = []
        self._answer_from = 0
        self._text_edits = TextEdits()

    def acceptance(self, length: int) -> float:
        return self.accept[match_bucket(length)].alpha

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        idx = self.index
        if self.memory is not None:
            self._seed(context)
        prev = idx.docs.get(idx.current)
        keep = common_prefix(prev, context, limit=len(context)) if prev is not None else 0
        if prev is not None and keep > 0 and keep >= len(prev) - RETOKENIZE_SLACK:
            idx.truncate(keep)
            idx.extend(context[keep:])
        else:
            idx.start(context)
        self._shadows = []
        self._answer_from = len(context)  # where this generation's own text begins (in the current document)
        self._anchor = None
        self._edits = Edits()
        self._text_anchors = []
        self._text_edits = TextEdits()
        self._views = {}
        for a in self.accept.values():
            a.soften(0.5)

    def _seed(self, context: Sequence[int]) -> None:
        """Index the stored texts that share text with this prompt (up to half the index), and claim this
        generation's text for the memory (the pipeline writes it when the answer ends)."""
        memory = self.memory
        assert memory is not None
        memory.claim(self._from_memory.add)
        for name, tokens in memory.relevant(context, budget=self.index.max_tokens // 2, exclude=self._from_memory):
            self.index.add(tokens.tolist())
            self._from_memory.add(name)

    def _sync(self, context: Sequence[int]) -> None:
        cur = self.index.docs.get(self.index.current)
        if cur is None:
            self.index.start(context)
        elif len(cur) <= len(context) and (not cur or cur[-1] == context[len(cur) - 1]):
            self.index.extend(context[len(cur) :])
        else:
            keep = common_prefix(cur, context, limit=len(context))
            self.index.truncate(keep)
            self.index.extend(context[keep:])

    def lookup(self, context: Sequence[int], k: int) -> Draft:
        """The suffix draft for `context`, ungated: up to min(k, spec_factor * match length) tokens."""
        if k <= 0 or len(context) < 2:
            return EMPTY_DRAFT
        self._sync(context)
        m = self.index.match()
        cur = self.index.docs[self.index.current]
        if self.resync and self.codec is not None:
            return self._text_lookup(m, cur, k)
        r = self._resync(cur) if self.resync else None
        if r is not None and (m.length < ANCHOR_MIN or m.length < min(r.verified, MAX_MATCH)):
            # Right after an edit, or a copy with known renames made that runs further back than the match.
            limit = min(k, self.spec_factor * max(2, r.verified))  # the copy since the edit is its evidence
            src = self.index.docs[r.doc]
            tokens = [*r.pending, *self._edits.apply(src[r.start : r.start + limit])][:limit]
            if tokens:
                note = f"suffix resync +{r.new}/-{r.skipped} ({r.verified} verified)"
                return Draft(tokens, None, note, "suffix", RESYNC + r.verified)
        if self.resync and m.length >= ANCHOR_MIN:
            self._anchor = Anchor(m.positions[0][0], m.positions[0][1], len(cur), len(cur) - m.length)
        if m.length == 0:
            return EMPTY_DRAFT
        limit = min(k, self.spec_factor * m.length)
        tokens = self._edits.apply(self.index.draft(m, limit, min_prob=self.min_prob))[:limit]
        if not tokens:
            return EMPTY_DRAFT
        return Draft(tokens, None, f"suffix match {m.length}", "suffix", m.length)

    def _text_lookup(self, m: Match, cur: list[int], k: int) -> Draft:
        """lookup, with the copy followed in bytes across edits (localspec.decoding.text_resync)."""
        if not self._text_anchors and m.length < 2:
            return EMPTY_DRAFT  # no copy followed, none to begin: the bytes catch up when there is one
        view = self._view(self.index.current)
        r = self._text_resync(view)
        if r is not None:
            verified = r.tokens if r.tokens is not None else len(cur) - view.token_from(len(view.data) - r.verified)
            if (verified or not m.length) and (m.length < ANCHOR_MIN or m.length <= min(verified, MAX_MATCH)):
                tokens = self._text_draft(r, min(k, self.spec_factor * max(2, verified)))
                if tokens:
                    note = f"suffix resync +{r.new}/-{r.skipped} bytes ({verified} verified)"
                    return Draft(tokens, None, note, "suffix", RESYNC + verified)
        if self._anchors(m, view):
            doc, end = m.positions[0]
            src = self._view(doc)
            at = src.starts[end] if end < len(src.starts) else len(src.data)
            since = view.starts[len(cur) - m.length]
            if doc != self.index.current or at <= since:  # never the text's own suffix (it would follow itself)
                self._add_anchor(TextAnchor(doc, at, len(view.data), since))
        if m.length == 0:
            return EMPTY_DRAFT
        limit = min(k, self.spec_factor * m.length)
        if any(a.cur < len(view.data) for a in self._text_anchors):
            # An edit is being written (the copy left its source, and no edit explains it yet): a copy of other text
            # within it (an earlier type hint) ends where that text's own edit did, not where this one will.
            limit = min(limit, WHILE_EDITING)
        tokens = self._text_edited(m, self.index.draft(m, limit, min_prob=self.min_prob))[:limit]
        if not tokens:
            return EMPTY_DRAFT
        return Draft(tokens, None, f"suffix match {m.length}", "suffix", m.length)

    def _add_anchor(self, new: TextAnchor) -> None:
        """The new anchor, beside the old one that agreed with the text last (a copy of the prompt's file before one
        of this answer's own text), unless it is that one."""
        if any((a.doc, a.src, a.cur) == (new.doc, new.src, new.cur) for a in self._text_anchors):
            return
        view = self._view(self.index.current)
        home = max(self._text_anchors, key=lambda a: (self._is_source(a, view), a.cur), default=None)
        self._text_anchors = [home, new] if home is not None else [new]

    def _anchors(self, m: Match, view: DocBytes) -> bool:
        """Whether this match sets a text anchor: a long one, or where no copy is being followed a short one that
        occurred once (an edited file's first line, before a long match can form). Not a match within the text
        an edit is writing now."""
        if not self._text_anchors:
            if m.length >= ANCHOR_MIN:
                return True
            if m.length < 2 or len(m.positions) > 1:
                return False
            start = view.starts[len(view.starts) - m.length]
            doc, end = m.positions[0]
            src = self._view(doc)
            at = src.starts[end - m.length]
            # A line's first bytes, in both texts: how an edited file's copy begins (not a phrase of prose).
            line_start = _line_start(view.data, start) and _line_start(src.data, at)
            return line_start and len(view.data) - start >= SHORT_ANCHOR_BYTES
        if m.length < ANCHOR_MIN:
            return False
        doc, end = m.positions[0]
        start = view.starts[end - m.length] if doc == self.index.current else -1
        return not any(a.cur < len(view.data) and start >= a.cur for a in self._text_anchors)

    def _view(self, doc: int) -> DocBytes:
        """A document's bytes; the current one's brought up to date with its tokens."""
        assert self.codec is not None
        view = self._views.get(doc)
        if view is None:
            view = self._views[doc] = DocBytes(self.codec)
            view.sync(self.index.docs[doc])
        elif doc == self.index.current:
            view.sync(self.index.docs[doc])
        return view

    def _text_resync(self, view: DocBytes) -> TextResync | None:
        """The anchors followed to the end of the text: the resumed copy of a source (earlier text than this answer:
        the prompt's file) where one resumes, else the one with the most bytes confirming it (on a tie the older)."""
        best: tuple[bool, int] | None = None
        found: TextResync | None = None
        kept = []
        for a in self._text_anchors:
            if a.doc not in self.index.docs or a.cur > len(view.data):
                continue  # its source evicted, or the text cut back
            src = self._view(a.doc).data
            if a.doc == self.index.current and self._is_source(a, view):
                src = src[: self._answer_start(view)]  # a copy of the prompt stays in it (not this answer's text)
            r = follow_text(a, src, view.data, self._text_edits)
            if r is None and (len(view.data) - a.cur > TEXT_WINDOW or a.src >= len(src)):
                continue  # diverged too long ago (a plain match has had room to form), or its source ran out
            kept.append(a)
            rank = (self._is_source(a, view), r.verified) if r is not None else None
            if rank is not None and (best is None or rank > best):
                best, found = rank, r
        self._text_anchors = kept
        return found

    def _is_source(self, a: TextAnchor, view: DocBytes) -> bool:
        """Whether the anchor copies text from before this answer (the prompt, an earlier document), not the answer's
        own earlier text: an edit written twice (a type hint) matches itself, but the file goes on after it."""
        return a.doc != self.index.current or a.src < self._answer_start(view)

    def _answer_start(self, view: DocBytes) -> int:
        return view.starts[self._answer_from] if self._answer_from < len(view.starts) else len(view.data)

    def _text_draft(self, r: TextResync, limit: int) -> list[int]:
        """Up to `limit` tokens of the source's continuation at r.resume, edits made, in the model's tokens."""
        assert self.codec is not None
        src = self._view(r.doc)
        j = min(src.token_from(r.resume) + limit + 1, len(src.starts))
        end = src.starts[j] if j < len(src.starts) else len(src.data)
        if r.inserting:  # an insertion begun again is a guess (`-> int` where the last one was `-> list`): it alone
            return self.codec.exact(r.pending)[:limit]
        made = self._text_edits.apply(src.data, r.resume, end, inserted=r.resume if r.pending else -1)
        return self.codec.exact(r.pending + made)[:limit]

    def _text_edited(self, m: Match, tokens: list[int]) -> list[int]:
        """A match's draft with this answer's edits made, where it copies the match's latest occurrence."""
        if not tokens or not self._text_edits or self.codec is None:
            return tokens
        doc, end = m.positions[0]
        if self.index.docs[doc][end : end + len(tokens)] != tokens:
            return tokens
        src = self._view(doc)
        stop = end + len(tokens)
        a, b = src.starts[end], src.starts[stop] if stop < len(src.starts) else len(src.data)
        if self._text_edits.next_at(src.data, a, b, None, -1) >= b:
            return tokens
        return self.codec.exact(self._text_edits.apply(src.data, a, b)) or tokens

    def _resync(self, cur: list[int]) -> Resync | None:
        """Where the text resumes copying the anchor's source after an edit, if it does (see resync)."""
        a = self._anchor
        src = self.index.docs.get(a.doc) if a is not None else None
        if a is None or src is None or a.cur > len(cur):  # no anchor, its source evicted, or the text cut back
            self._anchor = None
            return None
        r = follow(a, src, cur, self._edits)
        if r is None and len(cur) - a.cur > WINDOW:
            self._anchor = None  # diverged too long ago: a plain match has had room to form
        return r

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        self._last_bucket = 0
        if self.gate:
            self._grade_shadows(context)
        d = self.lookup(context, k)
        if not d.tokens or not self.gate:
            return d
        bucket = match_bucket(d.order)
        if self.accept[bucket].alpha < MIN_ALPHA:
            self._shadows.append((list(d.tokens), bucket, len(context)))
            del self._shadows[:-SHADOWS]
            return EMPTY_DRAFT
        self._last_bucket = bucket
        return d

    def _grade_shadows(self, context: Sequence[int]) -> None:
        pending = []
        for tokens, bucket, start in self._shadows:
            seen = context[start : start + len(tokens)]
            n = common_prefix(seen, tokens, limit=len(seen))
            if n < len(seen) or len(seen) == len(tokens):
                self.accept[bucket].update(n, len(tokens))
            else:
                pending.append((tokens, bucket, start))
        self._shadows = pending

    def observe(self, stats: RoundStats) -> None:
        if self._last_bucket and stats.n_drafted:
            self.accept[self._last_bucket].update(stats.n_accepted, stats.n_drafted)
        self._last_bucket = 0
