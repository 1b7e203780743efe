"""The suffix drafter's memory across sessions: earlier prompts with their answers, as token ids, on disk.

A repeated task (the same files the next day, a restarted server) then drafts from its first round. One
directory per tokenizer, under the user cache directory ($LOCALSPEC_CACHE_DIR, else $XDG_CACHE_HOME/localspec,
else ~/.cache/localspec) in suffix/<key>, the key a hash of the vocabulary, so another tokenizer never reads
them. One file per document: a prompt with its answer (a chat: the conversation so far), named by its
content's hash and length, its modification time the last time it was used.

- Bounded: at most LOCALSPEC_SUFFIX_MEMORY_TOKENS tokens (DEFAULT_TOKENS) and MAX_DOCS documents per
  tokenizer; the least recently used go first. A document seen again (the same text, or a beginning of a
  stored one) is touched; one that extends a stored document (the next turn of a chat) replaces it.
- Safe: a document is written to a temporary file and renamed into place, so a reader never sees half of
  one; changes (write, replace, evict) are made under a file lock, so two processes keep the bound; a file
  that does not read back (damaged, another version) is skipped with a warning and removed by the next
  change. The memory is a cache: any failure to read or write it costs drafts, never the answer.
- Cheap: the directory listing says the sizes; documents are read once per process and only those that
  share text with a prompt are indexed (`relevant`: GRAM-token windows the prompt holds, sampled every
  STRIDE tokens of a document). benchmarks/suffix_memory_load.py: a full store (2M tokens in 1,000 files)
  costs a new process's first prepare about 0.2 s on a busy 2-core CPU, a later prepare about 50 ms, and
  writing an answer about 30 ms.

LOCALSPEC_SUFFIX_MEMORY=0 turns it off everywhere; `localspec memory` shows it, `localspec memory clear`
deletes it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import time
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from localspec.decoding.cost_cache import cache_dir
from localspec.vocab import VocabInfo

VERSION = 1  # bump when the file format changes: files of another version are skipped
MAGIC = b"LSSM"
HEADER = struct.Struct("<4sIII")  # magic, version, tokens, crc32 of the token bytes
SUFFIX = ".tok"
DEFAULT_TOKENS = 2_000_000  # per tokenizer: 8 MB on disk
MAX_DOCS = 1024  # per tokenizer: a new process reads every document once, so their number is bounded too
MIN_DOC = 16  # tokens: a shorter text teaches nothing worth a file
GRAM = 8  # relevance: windows of this many tokens ...
STRIDE = 4  # ... sampled every STRIDE tokens of a stored document
MIN_SHARED = 8  # sampled windows a document must share with the prompt (about 32 tokens of text) to be seeded
LOCK_TIMEOUT_S = 10.0  # a change waits this long for another process's; then it is skipped
STALE_TMP_S = 3600.0  # a temporary file this old was left by a process that died while writing
ENV_SWITCH = "LOCALSPEC_SUFFIX_MEMORY"
ENV_TOKENS = "LOCALSPEC_SUFFIX_MEMORY_TOKENS"
_OFF = ("0", "false", "no", "off")
_HASH_BASE = np.uint64(0x100000001B3)


class SuffixMemoryWarning(UserWarning):
    """The memory could not be read or written (the run goes on without that part of it)."""


def enabled() -> bool:
    """False when LOCALSPEC_SUFFIX_MEMORY turns the memory off (0, false, no, off)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in _OFF


def token_limit() -> int:
    """Tokens kept per tokenizer: LOCALSPEC_SUFFIX_MEMORY_TOKENS, else DEFAULT_TOKENS."""
    raw = os.environ.get(ENV_TOKENS, "").strip().replace("_", "")
    if not raw:
        return DEFAULT_TOKENS
    try:
        value = int(float(raw))
    except ValueError:
        value = -1
    if value < 0:
        _warn(f"{ENV_TOKENS}={raw!r} is not a token count; keeping the default {DEFAULT_TOKENS:,}")
        return DEFAULT_TOKENS
    return value


def memory_root() -> Path:
    return cache_dir() / "suffix"


def vocab_key(info: VocabInfo) -> str:
    """A tokenizer's directory name: a hash of its type, special tokens and every token's text."""
    h = hashlib.sha256(f"v{VERSION} {info.vocab_type} {info.n_vocab} {info.bos_id} {info.eos_id}\n".encode())
    h.update("\x00".join(str(t) for t in info.tokens).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:20]


def _warn(text: str) -> None:
    warnings.warn(f"suffix memory: {text}", SuffixMemoryWarning, stacklevel=3)


# -- one document on disk ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredDoc:
    name: str  # file name: <content hash>-<tokens>.tok
    n_tokens: int
    used_ns: int  # last used (the file's modification time)
    n_bytes: int


def doc_name(tokens: np.ndarray) -> str:
    digest = hashlib.blake2b(tokens.astype("<u4").tobytes(), digest_size=12).hexdigest()
    return f"{digest}-{len(tokens)}{SUFFIX}"


def _tokens_in_name(name: str) -> int | None:
    if not name.endswith(SUFFIX) or "-" not in name:
        return None
    try:
        return int(name[: -len(SUFFIX)].rsplit("-", 1)[1])
    except ValueError:
        return None


def encode(tokens: np.ndarray) -> bytes:
    body = tokens.astype("<u4").tobytes()
    return HEADER.pack(MAGIC, VERSION, len(tokens), zlib.crc32(body)) + body


def decode(data: bytes) -> np.ndarray | None:
    """The tokens of a document file, or None when it does not read back whole."""
    if len(data) < HEADER.size:
        return None
    magic, version, n, crc = HEADER.unpack_from(data)
    body = data[HEADER.size :]
    if magic != MAGIC or version != VERSION or len(body) != 4 * n or zlib.crc32(body) != crc:
        return None
    return np.frombuffer(body, dtype="<u4").astype(np.int64)


def gram_hashes(tokens: np.ndarray) -> np.ndarray:
    """A 64-bit hash of every GRAM-token window (wrapping arithmetic: equal windows, equal hashes)."""
    t = np.asarray(tokens, dtype=np.uint64)
    n = len(t) - GRAM + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = t[:n].copy()
    for j in range(1, GRAM):
        h = h * _HASH_BASE + t[j : j + n]
    return h


# -- the store of one tokenizer ---------------------------------------------------------------------------


@dataclass
class _Loaded:
    tokens: np.ndarray
    sampled: np.ndarray  # gram_hashes(tokens)[::STRIDE]


class SuffixMemory:
    """The documents of one tokenizer: read (lazily, once per process), chosen for a prompt, written back.

    `vocab` is called the first time the directory is needed (a backend's vocab_info: hashing a large
    vocabulary costs a few milliseconds, paid only when a drafter uses the memory).
    """

    def __init__(
        self,
        vocab: Callable[[], VocabInfo],
        *,
        root: Path | None = None,
        max_tokens: int | None = None,
        max_docs: int = MAX_DOCS,
        label: str = "",
    ) -> None:
        self._vocab = vocab
        self._root = root
        self._path: Path | None = None
        self.max_tokens = token_limit() if max_tokens is None else max_tokens
        self.max_docs = max_docs
        self.label = label  # the model that wrote it, for `localspec memory`
        self._loaded: dict[str, _Loaded] = {}
        self._bad: set[str] = set()  # files that did not read back (warned once, removed by the next change)
        self._claim: Callable[[str], None] | None = None  # the drafter reading this generation (see claim)
        self._docs: list[tuple[str, np.ndarray]] | None = None  # documents() as last listed
        self._stamp = -1  # the directory's modification time then
        self._lookup: tuple[tuple[str, ...], np.ndarray, np.ndarray] | None = None  # see _table

    @classmethod
    def open(cls, vocab: Callable[[], VocabInfo], *, label: str = "") -> SuffixMemory | None:
        """The memory for a tokenizer, or None when LOCALSPEC_SUFFIX_MEMORY turns it off."""
        return cls(vocab, label=label) if enabled() else None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = (self._root or memory_root()) / vocab_key(self._vocab())
        return self._path

    # -- reading --------------------------------------------------------------------------------------

    def listing(self) -> list[StoredDoc]:
        """The stored documents, most recently used first (from the directory alone)."""
        return list_docs(self.path)

    def documents(self, *, fresh: bool = False) -> list[tuple[str, np.ndarray]]:
        """Every stored document that reads back, most recently used first (new files read now). The
        listing is kept while the directory's modification time stays (a file added, replaced or removed
        changes it; a touch does not, which only reorders ties); `fresh`: list it again regardless."""
        try:
            stamp = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            stamp = -1
        if fresh or self._docs is None or stamp != self._stamp:
            listed = self.listing()
            names = {d.name for d in listed}
            for gone in [n for n in self._loaded if n not in names]:
                del self._loaded[gone]
            docs = []
            for d in listed:
                doc = self._load(d.name)
                if doc is not None:
                    docs.append((d.name, doc.tokens))
            self._docs, self._stamp = docs, stamp
        return list(self._docs)

    def _table(self, docs: list[tuple[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """Every document's sampled window hashes in one array, and which document each belongs to."""
        key = tuple(n for n, _ in docs)
        if self._lookup is None or self._lookup[0] != key:
            parts = [self._loaded[n].sampled for n in key]
            sampled = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
            owner = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
            self._lookup = (key, sampled, owner)
        return self._lookup[1], self._lookup[2]

    def _load(self, name: str) -> _Loaded | None:
        doc = self._loaded.get(name)
        if doc is not None or name in self._bad:
            return doc
        try:
            tokens = decode((self.path / name).read_bytes())
        except FileNotFoundError:
            return None  # evicted by another process since the listing
        except OSError as e:
            self._bad.add(name)
            _warn(f"cannot read {self.path / name}: {e}; skipped")
            return None
        if tokens is None or len(tokens) != _tokens_in_name(name):
            self._bad.add(name)
            _warn(f"{self.path / name} is damaged or from another version; skipped (the next write removes it)")
            return None
        doc = _Loaded(tokens, gram_hashes(tokens)[::STRIDE])
        self._loaded[name] = doc
        return doc

    def relevant(
        self, prompt: Sequence[int], *, budget: int, exclude: set[str] | frozenset[str] = frozenset()
    ) -> list[tuple[str, np.ndarray]]:
        """Stored documents that share text with `prompt`, up to `budget` tokens in all, none of `exclude`.

        Greedy cover: each pick is the document sharing the most of the prompt's windows that the picks
        before it do not hold (ties: the most recently used), while that is at least MIN_SHARED sampled
        windows; so five copies of one file cost one document, and a repeated task gets its latest answer.
        """
        try:
            listed = self.documents()
        except OSError as e:
            _warn(f"cannot list {self.path}: {e}")
            return []
        q = np.unique(gram_hashes(np.asarray(prompt, dtype=np.int64)))
        if not q.size or not listed:
            return []
        sampled, owner = self._table(listed)
        at = np.minimum(np.searchsorted(q, sampled), q.size - 1)
        hit = q[at] == sampled
        owner, at = owner[hit], at[hit]  # (document, prompt window) for every sampled window the prompt holds
        covered = np.zeros(q.size, dtype=bool)
        open_ = np.array([n not in exclude and len(t) <= budget for n, t in listed], dtype=bool)
        out: list[tuple[str, np.ndarray]] = []
        used = 0
        while True:
            scores = np.bincount(owner[~covered[at]], minlength=len(listed)) * open_
            best = int(np.argmax(scores))  # ties: the first, i.e. the most recently used
            if scores[best] < MIN_SHARED:
                return out
            open_[best] = False
            name, tokens = listed[best]
            if used + len(tokens) > budget:
                continue
            out.append((name, tokens))
            used += len(tokens)
            covered |= np.isin(q, gram_hashes(tokens))  # every window it holds, not only the sampled ones

    # -- one generation's text (the pipeline and the drafter) ------------------------------------------

    def claim(self, seen: Callable[[str], None]) -> None:
        """A drafter reads the memory in this generation: its text is remembered at the end (end_of_answer),
        and `seen` hears the stored name (the drafter holds that text already, it is not seeded again)."""
        self._claim = seen

    def release(self) -> None:
        """A new generation starts: remember its text only if a drafter claims it."""
        self._claim = None

    def take_claim(self) -> Callable[[str], None] | None:
        """The claim made since release(), handed to the caller and cleared: with several generations at once
        (serve --parallel) each keeps its own and writes its text with `remember` when it ends."""
        seen, self._claim = self._claim, None
        return seen

    def end_of_answer(self, tokens: Sequence[int]) -> None:
        """The generation is over: its prompt and answer go to the memory if a drafter read it."""
        seen, self._claim = self._claim, None
        if seen is None:
            return
        name = self.remember(tokens)
        if name is not None:
            seen(name)

    # -- writing ----------------------------------------------------------------------------------------

    def remember(self, tokens: Sequence[int]) -> str | None:
        """Store a document (deduplicated, then the bound kept); its file name, or None when not stored."""
        doc = np.asarray(tokens, dtype=np.int64)
        if len(doc) < MIN_DOC or len(doc) > self.max_tokens or self.max_docs < 1:
            return None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.path / ".lock"), timeout=LOCK_TIMEOUT_S):
                return self._store(doc)
        except Timeout:
            _warn(f"{self.path} stayed locked for {LOCK_TIMEOUT_S:.0f} s; this answer is not remembered")
        except OSError as e:
            _warn(f"cannot write to {self.path}: {e}; this answer is not remembered")
        return None

    def _store(self, doc: np.ndarray) -> str:
        self._drop_bad()
        name = doc_name(doc)
        if (self.path / name).exists():
            _touch(self.path / name)
            return name
        replaced = []
        for stored, tokens in self.documents(fresh=True):
            if len(tokens) >= len(doc) and np.array_equal(tokens[: len(doc)], doc):
                _touch(self.path / stored)  # seen again (a beginning of it): it stays, as recently used
                return stored
            if len(tokens) < len(doc) and np.array_equal(doc[: len(tokens)], tokens):
                replaced.append(stored)
        _write_atomic(self.path / name, encode(doc))
        self._loaded[name] = _Loaded(doc, gram_hashes(doc)[::STRIDE])
        for stored in replaced:  # the new text extends them (a chat's next turn): one copy is enough
            _unlink(self.path / stored)
        self._evict(keep=name)
        self._write_about()
        return name

    def _evict(self, *, keep: str) -> None:
        docs = self.listing()
        total = sum(d.n_tokens for d in docs)
        count = len(docs)
        if total > self.max_tokens or count > self.max_docs:
            self._drop_stale_tmp()
        for d in reversed(docs):  # least recently used first
            if total <= self.max_tokens and count <= self.max_docs:
                break
            if d.name == keep:
                continue
            _unlink(self.path / d.name)
            self._loaded.pop(d.name, None)
            total -= d.n_tokens
            count -= 1

    def _drop_bad(self) -> None:
        for name in list(self._bad):
            _unlink(self.path / name)
            self._bad.discard(name)

    def _drop_stale_tmp(self) -> None:
        now = time.time()
        for p in self.path.glob("*.tmp"):
            try:
                if now - p.stat().st_mtime > STALE_TMP_S:
                    p.unlink()
            except OSError:
                pass

    def _write_about(self) -> None:
        """A line for people who look (and for `localspec memory`): which tokenizer, last written by what."""
        about = self.path / "about.txt"
        info = self._vocab()
        text = f"vocabulary: {info.vocab_type}, {info.n_vocab:,} tokens\nlast model: {self.label or '?'}\n"
        try:
            if not about.exists() or about.read_text(encoding="utf-8") != text:
                _write_atomic(about, text.encode())
        except OSError:
            pass

    def clear(self) -> int:
        """Delete this tokenizer's documents; how many there were."""
        return clear_dir(self.path)


# -- whole directories (`localspec memory`) ---------------------------------------------------------------


def list_docs(path: Path) -> list[StoredDoc]:
    """The documents in one tokenizer's directory, most recently used first; [] when it does not exist."""
    out = []
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return []
    for e in entries:
        n = _tokens_in_name(e.name)
        if n is None:
            continue
        try:
            st = e.stat()
        except FileNotFoundError:
            continue
        out.append(StoredDoc(e.name, n, st.st_mtime_ns, st.st_size))
    out.sort(key=lambda d: (d.used_ns, d.name), reverse=True)
    return out


@dataclass(frozen=True)
class TokenizerSummary:
    path: Path
    about: str  # about.txt's text ("" when missing)
    n_docs: int
    n_tokens: int
    n_bytes: int
    last_used_ns: int


def summaries(root: Path | None = None) -> list[TokenizerSummary]:
    """One summary per tokenizer directory under the memory's root, the most recently used first."""
    root = root or memory_root()
    out = []
    for d in _dirs(root):
        docs = list_docs(d)
        try:
            about = (d / "about.txt").read_text(encoding="utf-8").strip()
        except OSError:
            about = ""
        out.append(TokenizerSummary(
            d, about, len(docs), sum(x.n_tokens for x in docs), sum(x.n_bytes for x in docs),
            max((x.used_ns for x in docs), default=0),
        ))  # fmt: skip
    out.sort(key=lambda s: s.last_used_ns, reverse=True)
    return out


def _dirs(root: Path) -> Iterator[Path]:
    try:
        yield from (p for p in sorted(root.iterdir()) if p.is_dir())
    except FileNotFoundError:
        return


def clear_dir(path: Path) -> int:
    """Delete one tokenizer's directory (under its lock, so no writer is half way); its document count."""
    n = len(list_docs(path))
    if not path.exists():
        return 0
    try:
        with FileLock(str(path / ".lock"), timeout=LOCK_TIMEOUT_S):
            for p in path.iterdir():
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                elif p.name != ".lock":
                    p.unlink(missing_ok=True)
    except Timeout:
        pass  # a writer holds it: removing the directory below still takes every document
    shutil.rmtree(path, ignore_errors=True)
    return n


def clear_all(root: Path | None = None) -> int:
    """Delete every tokenizer's memory; the number of documents deleted."""
    return sum(clear_dir(d) for d in list(_dirs(root or memory_root())))


# -- files --------------------------------------------------------------------------------------------------


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # readers never see half a file
    except BaseException:
        _unlink(tmp)
        raise
    _touch(path)


def _touch(path: Path) -> None:
    """Mark a document as used now (the clock's nanoseconds: the file system's own stamp is coarser)."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except OSError:
        pass


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
